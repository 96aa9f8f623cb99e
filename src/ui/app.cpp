#include "app.h"

#include <imgui.h>
#include <imgui_stdlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/architecture.h"
#include "core/data_shape.h"
#include "core/serialize.h"
#include "core/simulate.h"
#include "keyboard.h"
#include "panels.h"
#include "status_line.h"

namespace memsim::ui {

namespace {
uint64_t g_last_result_version = 0;  // versions are unique across App instances (the panels' caches are shared)

// A frame's time for the setup's own simulation, as What helps and the fit explorer take theirs: a run of varying
// shapes advances a step at a time until it is spent, leaving the rest of a 60 Hz frame to drawing.
constexpr auto kSimulationBudget = std::chrono::milliseconds(8);

// Advances `sim` for at most the frame's budget (a fixed shape: all of it, in its one call). True once done.
bool advance_for_a_frame(Simulation& sim) { return advance_until(sim, std::chrono::steady_clock::now() + kSimulationBudget); }

// The fields of the Data section (panel_data.cpp): text a user writes by hand, so a link with a mistake in them opens
// with the mistake shown under its field, rather than being refused as a broken link is.
bool data_fields_only(const std::vector<FieldError>& errors) {
  for (const auto& e : errors)
    if (e.field.rfind("data.", 0) != 0 && e.field != "training.empty_cache_steps") return false;
  return !errors.empty();
}

}  // namespace

App::App(PlatformHooks hooks, const std::string& fragment) : hooks_(std::move(hooks)) {
  const bool link = !link_fragment(fragment).empty();  // "#", or only what a chat client appended: no link
  if (!link || !load_fragment(fragment, true)) recompute();
  history_ = History(config_);  // the setup it opens on is where undo stops
}

void App::set_config(const Config& c) {
  config_ = c;
  changed();
}

void App::changed(uint64_t control) {
  if (history_.record(config_, control) == History::Recorded::NewEntry) push_next_ = true;
  recompute();
}

void App::show_present() {
  config_ = history_.present();
  push_next_ = true;  // an undo is a change like any other: Back returns to the setup before it
  recompute();
}

bool App::undo() {
  if (!history_.can_undo()) return false;
  history_.undo();
  show_present();
  message(Message::Kind::Info, "Undone: the setup before the last change (Ctrl+Shift+Z redoes it).");
  return true;
}

bool App::redo() {
  if (!history_.can_redo()) return false;
  history_.redo();
  show_present();
  message(Message::Kind::Info, "Redone (Ctrl+Z undoes it again).");
  return true;
}

bool App::reset() {
  if (config_ == Config{}) return false;
  config_ = Config{};
  changed();
  message(Message::Kind::Info, "Reset to the default setup; Undo (Ctrl+Z) brings yours back.");
  return true;
}

// Ctrl+Z undoes, Ctrl+Shift+Z or Ctrl+Y redoes (Cmd on a Mac keyboard) unless a control is being edited: a text field
// being typed into undoes its own typing, as ImGui does.
void App::history_keys() {
  const ImGuiIO& io = ImGui::GetIO();
  if (edited_control() != 0 || io.WantTextInput || !(io.KeyCtrl || io.KeySuper) || io.KeyAlt) return;
  if (ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Z))) io.KeyShift ? redo() : undo();
  else if (ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Y)) && !io.KeyShift) redo();
}

void App::show_result(Result r) {
  running_.reset();
  result_ = std::move(r);
  result_version_ = ++g_last_result_version;
}

void App::recompute() {
  running_ = std::make_unique<Simulation>(config_);
  advance_simulation();
}

void App::advance_simulation() {
  if (!running_ || !advance_for_a_frame(*running_)) return;
  result_ = running_->result();
  running_.reset();
  result_version_ = ++g_last_result_version;
  publish();
}

Simulation::RunProgress App::simulation_progress() const {
  return running_ ? running_->run_progress() : Simulation::RunProgress{};
}

void App::publish() {
  // Publish only configs that simulate, so that a shared link always opens on an answer. An applied change (one that
  // made an undo entry: a continuous edit, such as typing a number, makes one) is a new browser history entry; the
  // rest of its edit, and a link the browser went to, replace the current one.
  if (!result_.ok) return;
  std::string frag = config_to_fragment(config_);
  if (frag != last_fragment_) {
    if (push_next_ && hooks_.push_fragment) hooks_.push_fragment(frag);
    else if (hooks_.publish_fragment) hooks_.publish_fragment(frag);
  }
  last_fragment_ = frag;
  push_next_ = false;
}

const std::string& App::focus_announcement() const { return ui::focus_announcement(); }

bool App::show_view(const std::string& name) {
  if (name == "step" || name == "run") {
    timeline_.run = name == "run";
    return true;
  }
  if (name != "breakdown" && name != "explorer" && name != "advice") return false;
  view_to_show_ = name;
  return true;
}

bool App::load_fragment(const std::string& fragment, bool navigated) {
  // The fragment as links are read: after its '#', without what a chat client appended (".", ")", ...).
  const std::string f(link_fragment(fragment));
  if (f.empty()) return true;  // no link state: keep the current setup
  Parsed p = config_from_fragment(f, Config{});
  // The link's setup is checked before it replaces the current one: its fields, and a fixed shape's whole
  // simulation; a run's replay goes on over the next frames.
  std::unique_ptr<Simulation> sim;
  if (p.ok) {
    sim = std::make_unique<Simulation>(p.config);
    if (advance_for_a_frame(*sim) && !sim->result().ok) {
      p.ok = false;
      p.errors = sim->result().errors;
    }
  }
  auto more = [&] { return p.errors.size() > 1 ? " (and " + std::to_string(p.errors.size() - 1) + " more problems)" : std::string(); };
  if (!p.ok && sim && data_fields_only(p.errors)) {
    // Opened with the problem under its field; the address bar keeps the link until the setup simulates.
    running_.reset();
    config_ = p.config;
    if (history_.record(config_) == History::Recorded::NewEntry) push_next_ = !navigated;
    result_ = sim->result();
    result_version_ = ++g_last_result_version;
    message(Message::Kind::Error, "This link's data section has a problem, shown under its field in Data; the link's other "
                                  "settings are open. " + p.errors[0].message + more());
    reveal_data_ = true;
    return true;
  }
  if (!p.ok) {
    message(Message::Kind::Error, "This link could not be opened, so the current setup is kept. " + p.errors[0].message + more());
    return false;
  }
  config_ = p.config;
  // A pasted link is an applied change, a new browser history entry; one the browser went to is already its entry.
  push_next_ = history_.record(config_) == History::Recorded::NewEntry && !navigated;
  running_ = std::move(sim);  // simulated above, in part or in full: no need to start again
  // Once simulated, the address bar gets the link as memsim writes it (short, without what a chat client appended),
  // even where the setup is the one already published.
  last_fragment_.clear();
  advance_simulation();
  return true;
}

bool App::load_text(const std::string& text, const std::string& origin) {
  // Nothing to read (an empty file, or one the page did not read: too large, binary); the origin says which.
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) {
    message(Message::Kind::Error, origin + " was not loaded, so the current setup is kept.");
    return false;
  }
  // A file of per-sample token lengths starts with a number or '[', which no config does.
  if (looks_like_sample_lengths_file(text)) {
    SampleLengthsFile lengths;
    FieldError error;
    if (!sample_lengths_from_file(text, lengths, error)) {
      message(Message::Kind::Error, origin + " was read as a file of sample lengths and not loaded, so the current setup "
                                             "is kept. " + error.message);
      return false;
    }
    Config c = config_;
    c.data.lengths = "samples";
    c.data.sample_lengths = lengths.sample_lengths;
    c.data.dataset_samples = lengths.samples;
    std::string info = "Loaded " + origin + ": " + format_count(lengths.samples) + " sample lengths from " +
                       format_count(lengths.shortest) + " to " + format_count(lengths.longest) + " tokens (median " +
                       format_count(lengths.median) + "), as the Data section's distribution and dataset size.";
    if (lengths.longest > c.training.sequence_length)
      info += " Samples longer than training.sequence_length (" + format_count(c.training.sequence_length) +
              ") are truncated to it.";
    message(Message::Kind::Info, info);
    set_config(c);
    reveal_data_ = true;
    return true;
  }
  // A model program (core/architecture.h) names its format; it replaces the model section, the rest is kept.
  if (looks_like_architecture(text)) {
    const std::string program = compact_architecture(text);
    std::shared_ptr<const Architecture> a;
    const auto errors = decode_architecture(program, "", a);
    if (!errors.empty()) {
      std::string msg = origin + " was read as a model program and not loaded, so the current setup is kept. " + errors[0].message;
      if (errors.size() > 1) msg += " (and " + std::to_string(errors.size() - 1) + " more problems)";
      message(Message::Kind::Error, msg);
      return false;
    }
    Config c = config_;
    c.model = ModelConfig{};
    c.model.name = a->title.empty() ? a->name : a->title;
    c.model.model_type = a->model_types.empty() ? a->name : a->model_types.front();
    c.model.architecture = program;
    message(Message::Kind::Info, "Loaded " + origin + " as the model: the program \"" + a->name + "\", " +
                                     std::to_string(a->repeat) + " blocks. Its hyperparameters are set under Model.");
    set_config(c);
    return true;
  }
  // A memsim config has sections, an Accelerate config (YAML or JSON) distributed_type or fsdp_config, a DeepSpeed
  // config ZeRO or batch keys; anything else is read as a Hugging Face config.json for the model section.
  const bool memsim_json = text.find("\"training\"") != std::string::npos || text.find("\"schema\"") != std::string::npos ||
                           text.find("\"hardware\"") != std::string::npos || text.find("\"parallel\"") != std::string::npos;
  const bool accelerate = !memsim_json && looks_like_accelerate_config(text);
  const bool deepspeed = !memsim_json && !accelerate && (text.find("\"zero_optimization\"") != std::string::npos ||
                                                         text.find("\"train_micro_batch_size_per_gpu\"") != std::string::npos);
  Parsed p = memsim_json  ? config_from_json(text, config_)
             : accelerate ? config_from_accelerate(text, config_)
             : deepspeed  ? config_from_deepspeed_json(text, config_)
                          : model_from_hf_json(text, config_);
  if (!p.ok) {
    std::string msg = origin + " was not loaded, so the current setup is kept. " + p.errors[0].message;
    if (p.errors.size() > 1) msg += " (and " + std::to_string(p.errors.size() - 1) + " more problems)";
    message(Message::Kind::Error, msg);
    return false;
  }
  // A timm config.json (its model's name in "architecture", with a pretrained_cfg) imports as a model program.
  const bool timm = !memsim_json && !accelerate && !deepspeed && !p.config.model.architecture.empty() &&
                    std::any_of(p.notes.begin(), p.notes.end(), [](const std::string& n) { return n.rfind("model: the timm model", 0) == 0; });
  std::string info = "Loaded " + origin + (memsim_json ? " (memsim config)." : accelerate ? " (Accelerate config)."
                                           : deepspeed ? " (DeepSpeed config)."
                                           : timm ? " as the model: timm's " + p.config.model.name + ", the program \"" +
                                                        p.config.model.architecture + "\"; its hyperparameters are set under Model."
                                                  : " as the model (Hugging Face config.json).");
  message(Message::Kind::Info, info, p.notes);  // the notes fold away into the log
  set_config(p.config);
  return true;
}

void App::draw_simulation_progress() {
  const Simulation::RunProgress p = running_->run_progress();
  std::string text = "Simulating...";
  if (p.steps > 0 && p.pass == 1)
    text = "Simulating the run" + (p.orders > 1 ? " in order " + format_count(p.order) + " of " + format_count(p.orders) : std::string()) +
           ": step " + format_count(p.step) + " of " + format_count(p.steps);
  else if (p.steps > 0)  // the cache outgrew the GPU: the second pass decides between its releases and an OOM
    text = "Replaying the run against the GPU's memory (its cache outgrew it): step " + format_count(p.step) + " of " +
           format_count(p.steps);
  ImGui::ProgressBar(static_cast<float>(running_->progress()), ImVec2(-1, 0), text.c_str());
}

namespace {

// Greys out what a child window shows from `top` down: the previous setup's numbers while the new one simulates.
// A translucent layer over the draw list, so it covers the charts the renderer draws as well.
void dim_below(float top) {
  const ImVec2 pos = ImGui::GetWindowPos(), size = ImGui::GetWindowSize();
  ImVec4 bg = ImGui::GetStyleColorVec4(ImGuiCol_WindowBg);
  bg.w = 0.7f;
  ImGui::GetWindowDrawList()->AddRectFilled(ImVec2(pos.x, top), ImVec2(pos.x + size.x, pos.y + size.y),
                                            ImGui::ColorConvertFloat4ToU32(bg));
}

// A segment of the Step | Run switch: a button that looks pressed while its view is shown.
bool view_button(const char* label, bool shown, const char* what) {
  if (shown) ImGui::PushStyleColor(ImGuiCol_Button, ImGui::GetStyleColorVec4(ImGuiCol_ButtonActive));
  const bool pressed = ImGui::SmallButton(label);
  if (shown) ImGui::PopStyleColor();
  announce_focus(std::string(label) + " view, button" + (shown ? ", shown: " : ": Space or Enter shows ") + what);
  return pressed;
}

}  // namespace

void App::draw_inputs(float width, float height) {
  ImGui::BeginChild("inputs", ImVec2(width, height), true, ImGuiWindowFlags_NavFlattened);
  // While the setup simulates, its field errors are the new setup's (none: it validated), not the previous result's.
  if (draw_inputs_panel(config_, running_ ? running_->result() : result_, reveal_data_))
    changed(control_at_start_ != 0 ? control_at_start_ : edited_control());
  reveal_data_ = false;
  inputs_scroll_ = {ImGui::GetScrollY(), ImGui::GetScrollMaxY(), ImGui::GetFrameHeightWithSpacing()};
  ImGui::EndChild();
}

void App::draw_results(float height) {
  ImGui::BeginChild("results", ImVec2(0, height), true, ImGuiWindowFlags_NavFlattened);
  const bool ready = running_ == nullptr;
  draw_verdict_line(result_, unit_, ready);  // pinned above the tabs: visible whichever is open
  if (ImGui::BeginTabBar("views")) {
    auto tab = [&](const char* label, const char* view) {
      const bool open = ImGui::BeginTabItem(label, nullptr, view_to_show_ == view ? ImGuiTabItemFlags_SetSelected : 0);
      announce_focus(std::string(label) + (open ? ", tab, shown" : ", tab: Space or Enter shows it"));
      return open;
    };
    if (tab("Breakdown", "breakdown")) {
      if (!ready) {
        draw_simulation_progress();
        if (result_.ok) {
          ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
          ImGui::TextWrapped("Below: the previous setup's result, until this one is simulated.");
          ImGui::PopStyleColor();
          const float top = ImGui::GetCursorScreenPos().y;
          ImGui::BeginDisabled();  // no hover over numbers that are about to change
          draw_results_panel(config_, result_, unit_, result_version_);
          ImGui::EndDisabled();
          dim_below(top);
        }
      } else {
        draw_results_panel(config_, result_, unit_, result_version_);
      }
      ImGui::EndTabItem();
    }
    if (tab("Fit explorer", "explorer")) {
      if (!ready) draw_simulation_progress();
      if (draw_explorer_panel(config_, unit_, ready)) {
        changed();
        message(Message::Kind::Info, "Applied the cell's setup (Ctrl+Z undoes it).");
      }
      ImGui::EndTabItem();
    }
    if (tab("What helps", "advice")) {
      if (!ready) draw_simulation_progress();
      if (draw_advice_panel(config_, unit_, result_, ready)) {
        changed();
        message(Message::Kind::Info, "Applied. The link now holds the changed setup (Ctrl+Z undoes it).");
      }
      ImGui::EndTabItem();
    }
    ImGui::EndTabBar();
    view_to_show_.clear();
  }
  ImGui::EndChild();
}

void App::draw_timeline(float height) {
  ImGui::BeginChild("timeline", ImVec2(0, height), true, ImGuiWindowFlags_NavFlattened);
  const bool ready = running_ == nullptr;
  const RunTrace* run = result_.ok && !result_.devices.empty() && result_.devices[0].run.steps > 0 ? &result_.devices[0].run
                                                                                                    : nullptr;
  if (run) {
    // A run's timeline is one of its steps; the Run view shows every step.
    if (view_button("Step", !timeline_.run, "the events of the step that holds the run's allocated peak"))
      timeline_.run = false;
    ImGui::SameLine(0, 2);
    if (view_button("Run", timeline_.run, "every step of the run: its longest micro-batch, allocated and reserved peak"))
      timeline_.run = true;
    ImGui::SameLine();
    ImGui::PushTextWrapPos(0.0f);
    if (timeline_.run)
      ImGui::TextUnformatted("The run: each step's memory peaks and longest micro-batch");
    else
      ImGui::Text("Step %s of %s, which holds the run's allocated peak (it opens on what earlier steps left alive)",
                  format_count(run->allocated_peak_step).c_str(), format_count(run->steps).c_str());
    ImGui::PopTextWrapPos();
  } else {
    ImGui::TextUnformatted("One training step (two iterations: the optimizer state appears in the first)");
  }
  const float chart_top = ImGui::GetCursorScreenPos().y;
  ImGui::BeginDisabled(!ready);  // the previous result's chart, greyed and without its hover, until this one is done
  if (!ready && !result_.ok) ImGui::TextDisabled("The timeline follows once the setup is simulated.");
  else if (run && timeline_.run) draw_run_panel(result_, unit_, result_version_);
  else draw_timeline_panel(result_, unit_, result_version_);
  ImGui::EndDisabled();
  if (!ready) dim_below(chart_top);
  ImGui::EndChild();
}

void App::frame() {
  keyboard_frame_start();
  // A continuous edit is one undo entry until its control is no longer being edited (ui/history.h).
  control_at_start_ = edited_control();
  if (history_.group() != control_at_start_) history_.end_group();
  history_keys();
  advance_simulation();  // a run of varying shapes fills in a part per frame
  const ImGuiViewport* vp = ImGui::GetMainViewport();
  ImGui::SetNextWindowPos(vp->WorkPos);
  ImGui::SetNextWindowSize(vp->WorkSize);
  ImGui::Begin("memsim", nullptr,
               ImGuiWindowFlags_NoDecoration | ImGuiWindowFlags_NoMove | ImGuiWindowFlags_NoSavedSettings |
                   ImGuiWindowFlags_NoBringToFrontOnFocus | ImGuiWindowFlags_NoBackground);
  draw_toolbar();
  ImGui::Separator();

  // Side by side: the inputs on the left, the results over the timeline on the right. A window too narrow for that
  // (a phone) stacks them, the answer first: the results, the timeline, then the inputs, each scrolling on its own.
  // The panels are one space for the keyboard: the arrows and Tab cross from one to the next (ui/keyboard.h).
  // The status line keeps one row at the bottom, whatever the messages say (ui/status_line.cpp).
  const float status = ImGui::GetFrameHeightWithSpacing();
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  if (avail.x >= 700.0f) {
    // A wide window (1920 px) gives the inputs up to 620 px: at 470 their lists cut their values ("bf16 + fp32 master
    // (DeepSpeed", "fixed (packed, or padded to max") while the results spread over 1400 px. As before below 1470 px.
    draw_inputs(std::clamp(avail.x * 0.36f, 280.0f, std::max(470.0f, avail.x * 0.32f)), -status);
    ImGui::SameLine();
    ImGui::BeginChild("outputs", ImVec2(0, -status), false, ImGuiWindowFlags_NavFlattened);
    draw_results(std::max(ImGui::GetContentRegionAvail().y * 0.58f, 260.0f));
    draw_timeline(0);
    ImGui::EndChild();
  } else {
    draw_results(std::floor((avail.y - status) * 0.36f));
    draw_timeline(std::floor((avail.y - status) * 0.3f));
    draw_inputs(0, -status);
  }
  draw_status_line();
  ImGui::End();
  keyboard_frame_end();
  work_left_ = take_work_left();
  // The verdict is read out once the setup is simulated and no control is being edited (not at every digit typed).
  if (!running_ && edited_control() == 0) verdict_announcement_ = verdict_sentence(result_, unit_);
}

}  // namespace memsim::ui
