#include "app.h"

#include <imgui.h>
#include <imgui_stdlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/data_shape.h"
#include "core/serialize.h"
#include "core/simulate.h"
#include "keyboard.h"
#include "panels.h"

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
  if (!link || !load_fragment(fragment)) recompute();
}

void App::set_config(const Config& c) {
  config_ = c;
  recompute();
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
  // Publish only configs that simulate, so that a shared link always opens on an answer.
  if (result_.ok) {
    std::string frag = config_to_fragment(config_);
    if (frag != last_fragment_ && hooks_.publish_fragment) hooks_.publish_fragment(frag);
    last_fragment_ = frag;
  }
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

bool App::load_fragment(const std::string& fragment) {
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
    result_ = sim->result();
    result_version_ = ++g_last_result_version;
    messages_.push_back({Message::Kind::Error, "This link's data section has a problem, shown under its field in Data; the "
                                               "link's other settings are open. " + p.errors[0].message + more()});
    reveal_data_ = true;
    return true;
  }
  if (!p.ok) {
    messages_.push_back({Message::Kind::Error, "This link could not be opened, so the current setup is kept. " +
                                                   p.errors[0].message + more()});
    return false;
  }
  config_ = p.config;
  running_ = std::move(sim);  // simulated above, in part or in full: no need to start again
  // Once simulated, the address bar gets the link as memsim writes it (short, without what a chat client appended),
  // even where the setup is the one already published.
  last_fragment_.clear();
  advance_simulation();
  return true;
}

bool App::load_text(const std::string& text, const std::string& origin) {
  // A file of per-sample token lengths starts with a number or '[', which no config does.
  if (looks_like_sample_lengths_file(text)) {
    SampleLengthsFile lengths;
    FieldError error;
    if (!sample_lengths_from_file(text, lengths, error)) {
      messages_.push_back({Message::Kind::Error, origin + " was read as a file of sample lengths and not loaded, so the "
                                                          "current setup is kept. " + error.message});
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
    messages_.push_back({Message::Kind::Info, info});
    set_config(c);
    reveal_data_ = true;
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
    messages_.push_back({Message::Kind::Error, msg});
    return false;
  }
  std::string info = "Loaded " + origin + (memsim_json ? " (memsim config)." : accelerate ? " (Accelerate config)."
                                           : deepspeed ? " (DeepSpeed config)." : " as the model (Hugging Face config.json).");
  for (const auto& n : p.notes) info += " " + n + ".";
  messages_.push_back({Message::Kind::Info, info});
  set_config(p.config);
  return true;
}

namespace {

std::string summary_markdown(const Config& c, const Result& r, Unit unit, const std::string& link) {
  std::string s = "**memsim** " + format_params(r.params_total) + " params, micro-batch " +
                  std::to_string(c.training.micro_batch_size) + " x seq " + std::to_string(c.training.sequence_length) +
                  (c.model.is_encoder_decoder ? " -> " + std::to_string(decoder_tokens_per_sequence(c)) : std::string()) +
                  ", " + c.training.precision + ", " + c.training.optimizer + ", DP " +
                  std::to_string(c.parallel.data_parallel_size) + " ZeRO-" + std::to_string(c.parallel.zero_stage) +
                  ", " + c.hardware.gpu + "\n\n| device | peak (nvidia-smi) | allocated | reserved | verdict (band) |\n|---|---|---|---|---|\n";
  for (const auto& d : r.devices) {
    const auto& band = d.band.of(BandStatistic::Device);  // the verdict's band (core/band.h)
    s += "| " + d.role + " x" + std::to_string(d.device_count) + " | " + bytes_text(d.peak.device_bytes, unit) + " of " +
         bytes_text(d.capacity_bytes, unit) + " | " + bytes_text(d.peak.allocated_bytes, unit) + " | " +
         bytes_text(d.peak.reserved_bytes, unit) + " | " +
         (d.verdict == Verdict::Fits ? std::string("fits") : "**" + std::string(verdict_id(d.verdict)) + "**") +
         (d.band.valid ? " (" + bytes_text(band.low_bytes, unit) + " - " + bytes_text(band.high_bytes, unit) + ")" : "") +
         " |\n";
  }
  return s + "\n" + link + "\n";
}

}  // namespace

void App::draw_toolbar() {
  // Buttons flow onto a second line when the window is narrow (800 px must stay usable).
  auto flow = [](const char* label) {
    const ImGuiStyle& st = ImGui::GetStyle();
    const float w = ImGui::CalcTextSize(label).x + st.FramePadding.x * 2 + st.ItemSpacing.x;
    const float right = ImGui::GetWindowPos().x + ImGui::GetWindowContentRegionMax().x;
    if (ImGui::GetItemRectMax().x + w < right) ImGui::SameLine();
  };
  ImGui::TextUnformatted("memsim");
  if (ImGui::GetContentRegionAvail().x > 1000) {
    ImGui::SameLine();
    ImGui::TextDisabled("training memory simulator");
  }
  ImGui::SameLine();
  // The link is made when it is copied, not every frame.
  auto link = [&] { return hooks_.page_url + "#" + config_to_fragment(config_); };
  const bool copy_link = ImGui::Button("Copy link");
  announce_focus("Copy link, button: copies a link that reopens this setup");
  if (copy_link && hooks_.copy_text) {
    hooks_.copy_text(link());
    messages_.push_back({Message::Kind::Info, "Link copied: it reopens exactly this setup."});
  }
  flow("Copy summary");
  const bool copy_summary = ImGui::Button("Copy summary");
  announce_focus("Copy summary, button: copies a Markdown table of the result for chat");
  if (copy_summary && running_) messages_.push_back({Message::Kind::Info, "The summary can be copied once the run is simulated."});
  if (copy_summary && hooks_.copy_text && result_.ok && !running_) {
    hooks_.copy_text(summary_markdown(config_, result_, unit_, link()));
    messages_.push_back({Message::Kind::Info, "Markdown summary copied."});
  }
  flow("Save JSON");
  const bool save = ImGui::Button("Save JSON");
  announce_focus("Save JSON, button: downloads this setup as a memsim config");
  if (save && hooks_.save_text)
    messages_.push_back({Message::Kind::Info, hooks_.save_text("memsim-config.json", config_to_json(config_))});
  flow("DeepSpeed JSON");
  const bool deepspeed = ImGui::Button("DeepSpeed JSON");
  announce_focus("DeepSpeed JSON, button: downloads the training part of this setup as a DeepSpeed config");
  if (deepspeed && hooks_.save_text)
    messages_.push_back({Message::Kind::Info, hooks_.save_text("ds_config.json", deepspeed_json(config_))});
  if (ImGui::IsItemHovered() || item_has_keyboard_focus())
    ImGui::SetTooltip("The training part of this setup as a DeepSpeed config to start from.");
  flow("Open JSON");
  const bool open = ImGui::Button("Open JSON");
  announce_focus("Open JSON, button: loads a memsim, Hugging Face, DeepSpeed or Accelerate config, or a file of sample "
                 "lengths, from a file");
  if (open) {
    if (hooks_.open_file) hooks_.open_file();
    else messages_.push_back({Message::Kind::Info, "Drop a memsim config, a config.json, a DeepSpeed or an Accelerate config, or a "
                                                   "file of sample lengths, onto the window, or pass it on the command line."});
  }
  flow("Paste JSON...");
  if (ImGui::Button("Paste JSON...")) ImGui::OpenPopup("paste");
  announce_focus("Paste JSON, button: opens a box to paste a config into");
  if (ImGui::BeginPopup("paste")) {
    static std::string text;
    ImGui::TextUnformatted("Paste a memsim config, a Hugging Face config.json, a DeepSpeed or an Accelerate config,");
    ImGui::TextUnformatted("or sample lengths in tokens (one per line, or a JSON array):");
    if (ImGui::IsWindowAppearing()) ImGui::SetKeyboardFocusHere();
    ImGui::InputTextMultiline("##json", &text, ImVec2(520, 260));
    announce_focus("Config text to paste");
    if (ImGui::Button("Load")) {
      load_text(text, "the pasted JSON");
      ImGui::CloseCurrentPopup();
    }
    announce_focus("Load, button: loads the pasted config");
    ImGui::EndPopup();
  }
  flow("GiB   ");
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 4.5f);
  int u = static_cast<int>(unit_);
  if (index_combo("##unit", u, {"GiB", "GB", "MiB"})) unit_ = static_cast<Unit>(u);
  announce_focus(std::string("Unit: ") + (unit_ == Unit::GiB ? "GiB" : unit_ == Unit::GB ? "GB" : "MiB"));
  flow("Light");
  if (ImGui::Button(dark_ ? "Light" : "Dark")) {
    dark_ = !dark_;
    dark_ ? ImGui::StyleColorsDark() : ImGui::StyleColorsLight();
  }
  announce_focus(dark_ ? "Light, button: switches to the light theme" : "Dark, button: switches to the dark theme");
}

void App::draw_messages() {
  if (messages_.size() > 4) messages_.erase(messages_.begin(), messages_.end() - 4);
  for (size_t i = 0; i < messages_.size(); ++i) {
    const auto& m = messages_[i];
    ImGui::PushID(static_cast<int>(i));
    const bool dismiss = ImGui::SmallButton("x");
    announce_focus("Dismiss the message: " + m.text);
    if (dismiss) {
      messages_.erase(messages_.begin() + static_cast<long>(i));
      ImGui::PopID();
      break;
    }
    ImGui::SameLine();
    ImGui::PushTextWrapPos(0.0f);
    if (m.kind == Message::Kind::Error) ImGui::TextColored(ImVec4(1.0f, 0.45f, 0.45f, 1), "%s", m.text.c_str());
    else ImGui::TextColored(ImVec4(0.55f, 0.8f, 1.0f, 1), "%s", m.text.c_str());
    ImGui::PopTextWrapPos();
    ImGui::PopID();
  }
}

void App::draw_simulation_progress() {
  const Simulation::RunProgress p = running_->run_progress();
  std::string text = "Simulating...";
  if (p.steps > 0 && p.pass == 1)
    text = "Simulating the run: step " + format_count(p.step) + " of " + format_count(p.steps);
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
  if (draw_inputs_panel(config_, running_ ? running_->result() : result_, reveal_data_)) recompute();
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
        recompute();
        messages_.push_back({Message::Kind::Info, "Applied the cell's setup."});
      }
      ImGui::EndTabItem();
    }
    if (tab("What helps", "advice")) {
      if (!ready) draw_simulation_progress();
      if (draw_advice_panel(config_, unit_, result_, ready)) {
        recompute();
        messages_.push_back({Message::Kind::Info, "Applied. The link now holds the changed setup."});
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
  advance_simulation();  // a run of varying shapes fills in a part per frame
  const ImGuiViewport* vp = ImGui::GetMainViewport();
  ImGui::SetNextWindowPos(vp->WorkPos);
  ImGui::SetNextWindowSize(vp->WorkSize);
  ImGui::Begin("memsim", nullptr,
               ImGuiWindowFlags_NoDecoration | ImGuiWindowFlags_NoMove | ImGuiWindowFlags_NoSavedSettings |
                   ImGuiWindowFlags_NoBringToFrontOnFocus | ImGuiWindowFlags_NoBackground);
  draw_toolbar();
  draw_messages();
  ImGui::Separator();

  // Side by side: the inputs on the left, the results over the timeline on the right. A window too narrow for that
  // (a phone) stacks them, the answer first: the results, the timeline, then the inputs, each scrolling on its own.
  // The panels are one space for the keyboard: the arrows and Tab cross from one to the next (ui/keyboard.h).
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  if (avail.x >= 700.0f) {
    draw_inputs(std::clamp(avail.x * 0.36f, 280.0f, 470.0f), 0);
    ImGui::SameLine();
    ImGui::BeginChild("outputs", ImVec2(0, 0), false, ImGuiWindowFlags_NavFlattened);
    draw_results(std::max(ImGui::GetContentRegionAvail().y * 0.58f, 260.0f));
    draw_timeline(0);
    ImGui::EndChild();
  } else {
    draw_results(std::floor(avail.y * 0.36f));
    draw_timeline(std::floor(avail.y * 0.3f));
    draw_inputs(0, 0);
  }
  ImGui::End();
  keyboard_frame_end();
  work_left_ = take_work_left();
}

}  // namespace memsim::ui
