// The interface: one App drawn once per frame by the platform loop. Knows the core and ImGui only.
// State flows once per frame: panels edit `config` in place; when it changed, the app re-runs the simulator
// and publishes the new URL fragment through the platform hooks.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/format.h"
#include "core/result.h"
#include "core/simulate.h"

namespace memsim::ui {

// What the platform layer provides (desktop: GLFW clipboard, files; web: history.replaceState, navigator).
struct PlatformHooks {
  std::function<void(const std::string&)> publish_fragment;  // keep the address bar current
  std::function<void(const std::string&)> copy_text;         // clipboard
  // Hands a file to the user (web: a download; desktop: written beside the app). Returns a message for the UI.
  std::function<std::string(const std::string& name, const std::string& text)> save_text;
  // Asks the user for a file; its text comes back through App::load_text (web: a file picker).
  std::function<void()> open_file;
  std::string page_url = "http://127.0.0.1:8080/";          // base of shared links
};

struct Message {
  enum class Kind { Info, Error } kind = Kind::Info;
  std::string text;
};

// What the timeline shows: the step (with its events), or a run's steps one column each. Kept by the app, so
// that the choice holds from one result to the next.
struct TimelineView {
  bool run = false;
};

class App {
 public:
  // Opens on the setup of `fragment` (a link's "#..." or bare fragment) when it is given and valid, otherwise on the
  // defaults (with a message when the link was broken). Either way it simulates once and publishes the fragment.
  explicit App(PlatformHooks hooks, const std::string& fragment = "");

  void frame();  // draws one frame into the current ImGui context, full window

  // Inputs from outside the UI. Each keeps the current setup untouched when the input is bad, and says why, but for
  // one case: a link (opened on load, or the hash changed) whose only problems are in the data section's fields opens
  // with them shown under the fields (true).
  bool load_fragment(const std::string& fragment);
  // Dropped or pasted text: a memsim, Hugging Face, DeepSpeed or Accelerate config, or a file of sample lengths.
  bool load_text(const std::string& text, const std::string& origin);

  const Config& config() const { return config_; }
  const Result& result() const { return result_; }
  const std::vector<Message>& messages() const { return messages_; }
  // The control the keyboard focus is on, in words ("micro_batch_size: 4, ..."), "" when the focus is not shown:
  // for screen readers (the page's live region) and the tests. ui/keyboard.h describes the keys.
  const std::string& focus_announcement() const;
  void set_config(const Config& c);
  // Opens a tab of the results on the next frame: "breakdown", "explorer" or "advice"; or sets the timeline's view:
  // "step" or "run" (a run's steps, once a run is shown). False for other names.
  bool show_view(const std::string& name);
  // Shows a result made elsewhere (the desktop's timeline benchmark) until the config changes.
  void show_result(Result r);
  // True while the setup's result is being simulated: a run of varying shapes fills in over frames, a part per
  // frame (result() is the previous setup's until then). The platform keeps frames coming meanwhile.
  bool simulating() const { return running_ != nullptr; }
  Simulation::RunProgress simulation_progress() const;
  // The timeline shows the step (false) or, for a run of varying shapes, the run step by step (true).
  bool run_view() const { return timeline_.run; }
  // Names result()'s content, unique in the process: it changes whenever the result does.
  uint64_t result_version() const { return result_version_; }
  // Whether the next frame has work of its own, input or not: the setup still simulating, or What helps or the Fit
  // explorer still filling in (as of the last frame). Otherwise a frame only redraws what is there, and the platform
  // draws one on input alone, so that an idle window costs no CPU.
  bool wants_frames() const { return running_ != nullptr || work_left_; }
  // Where the inputs panel is scrolled, how far it can scroll, and the height of a row of its controls, in pixels, as
  // of the last frame: for the tests of the wheel and touch.
  struct Scroll {
    float y = 0, max = 0, row = 0;
  };
  const Scroll& inputs_scroll() const { return inputs_scroll_; }

 private:
  void recompute();                // starts simulating config_, dropping a simulation under way
  void advance_simulation();       // a frame's share of it; result_ once it is complete
  void draw_simulation_progress();
  void draw_inputs(float width, float height);  // the child windows of the frame's layout (0: the rest)
  void draw_results(float height);
  void draw_timeline(float height);
  void publish();
  void draw_toolbar();
  void draw_messages();

  PlatformHooks hooks_;
  Config config_;
  Result result_;
  uint64_t result_version_ = 0;  // changes with result_: the charts rebuild their data only then
  std::vector<Message> messages_;
  std::unique_ptr<Simulation> running_;  // the simulation of config_ while it is under way
  TimelineView timeline_;
  bool reveal_data_ = false;  // scroll the Data section into view on the next frame
  Unit unit_ = Unit::GiB;
  bool dark_ = true;
  std::string last_fragment_;
  std::string view_to_show_;
  bool work_left_ = false;  // a panel said it has work for the next frame (note_work_left)
  Scroll inputs_scroll_;
};

}  // namespace memsim::ui
