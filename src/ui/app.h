// The interface: one App drawn once per frame by the platform loop. Knows the core and ImGui only.
// State flows once per frame: panels edit `config` in place; when it changed, the app re-runs the simulator
// and publishes the new URL fragment through the platform hooks.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/format.h"
#include "core/result.h"
#include "core/simulate.h"
#include "history.h"

namespace memsim::ui {

// What the platform layer provides (desktop: GLFW clipboard, files; web: history.pushState, navigator).
struct PlatformHooks {
  std::function<void(const std::string&)> publish_fragment;  // keep the address bar current, in place
  // An applied change (App::publish says which): a new entry in the browser's history (history.pushState), so that
  // Back returns to the setup before it. Where it is not given, publish_fragment stands in.
  std::function<void(const std::string&)> push_fragment;
  std::function<void(const std::string&)> copy_text;  // clipboard
  // True where copy_text only starts the copy and the platform tells its outcome later, through App::copy_finished
  // (the page: the browser's clipboard API answers with a promise, or is not there at all on plain HTTP). The app says
  // "copied" only then. False: copy_text has put the text on the clipboard when it returns (desktop: GLFW).
  bool copy_reports_later = false;
  // Hands a file to the user (web: a download; desktop: written beside the app). Returns a message for the UI.
  std::function<std::string(const std::string& name, const std::string& text)> save_text;
  // Asks the user for a file; its text comes back through App::load_text (web: a file picker).
  std::function<void()> open_file;
  std::string page_url = "http://127.0.0.1:8080/";          // base of shared links
};

// A line for the status line (ui/status_line.cpp), and the log of earlier ones it opens.
struct Message {
  enum class Kind { Info, Error } kind = Kind::Info;
  std::string text;
  // What an import read, assumed and ignored, one note a line: folded into the log, where the status line names how
  // many there are.
  std::vector<std::string> details = {};
  std::string full() const;  // text and details, as one paragraph
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
  // `navigated`: the browser went to this link (Back, Forward, an edited address): the address bar already holds it,
  // so it becomes no new history entry. Otherwise (a pasted link) it is an applied change like any other.
  bool load_fragment(const std::string& fragment, bool navigated = false);
  // Dropped or pasted text: a memsim, Hugging Face, DeepSpeed or Accelerate config, or a file of sample lengths.
  bool load_text(const std::string& text, const std::string& origin);

  const Config& config() const { return config_; }
  const Result& result() const { return result_; }
  const std::vector<Message>& messages() const { return messages_; }
  // The control the keyboard focus is on, in words ("micro_batch_size: 4, ..."), "" when the focus is not shown:
  // for screen readers (the page's live region) and the tests. ui/keyboard.h describes the keys.
  const std::string& focus_announcement() const;
  void set_config(const Config& c);  // an applied change (undoable)
  // The undo history (ui/history.h): Ctrl+Z, Ctrl+Shift+Z or Ctrl+Y, and the toolbar's Undo, Redo and Reset (back to the
  // defaults, undoable itself). Each returns whether the setup changed.
  bool undo();
  bool redo();
  bool reset();
  const History& history() const { return history_; }
  // The outcome of a copy started where PlatformHooks::copy_reports_later: copied, or not, and then the text is shown
  // in a read-only field to copy by hand, with a message that it was NOT copied.
  void copy_finished(bool copied);
  // The fit verdict in one short line for screen readers ("Fits: 61.2 GiB of 72.0 GiB usable"), as of the last frame:
  // it changes once a setup is simulated and no control is being edited (typing a number is not read out digit by
  // digit). The page puts it into an ARIA live region of its own.
  const std::string& verdict_announcement() const { return verdict_announcement_; }
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
  // config_ changed: recorded in the undo history and simulated. `control`: the control being edited, whose continuous
  // edit (typing, a held + button) is one entry; 0: a change of its own. Once simulated it is published, in a new
  // browser history entry when it made a new undo entry.
  void changed(uint64_t control = 0);
  void show_present();  // config_ = history_.present(), after undo or redo
  void history_keys();
  void draw_toolbar();
  void draw_history_buttons();
  void draw_copy_by_hand();
  void copy(const std::string& what, const std::string& text);
  void draw_status_line();  // ui/status_line.cpp
  void message(Message::Kind kind, std::string text, std::vector<std::string> details = {});

  PlatformHooks hooks_;
  Config config_;
  Result result_;
  uint64_t result_version_ = 0;  // changes with result_: the charts rebuild their data only then
  std::vector<Message> messages_;  // the log, oldest first; the status line shows the last
  size_t messages_seen_ = 0;       // the status line's x clears it: messages up to here are only in the log
  History history_;
  bool push_next_ = false;          // the next published fragment is a new browser history entry
  uint64_t control_at_start_ = 0;   // the control being edited when the frame began
  std::string verdict_announcement_;
  struct Copy {
    std::string what, text;  // "link" or "summary", and what was to be copied
  };
  std::deque<Copy> copies_;  // started, their outcome not yet told (copy_reports_later)
  Copy by_hand_;             // shown to copy by hand once the clipboard refused it
  bool show_by_hand_ = false;
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
