#include "app.h"

#include <imgui.h>
#include <imgui_stdlib.h>

#include <algorithm>

#include "core/serialize.h"
#include "core/simulate.h"
#include "keyboard.h"
#include "panels.h"

namespace memsim::ui {

namespace {
uint64_t g_last_result_version = 0;  // versions are unique across App instances (the panels' caches are shared)
}  // namespace

App::App(PlatformHooks hooks, const std::string& fragment) : hooks_(std::move(hooks)) {
  const bool link = !fragment.empty() && fragment != "#";
  if (!link || !load_fragment(fragment)) recompute();
}

void App::set_config(const Config& c) {
  config_ = c;
  recompute();
}

void App::show_result(Result r) {
  result_ = std::move(r);
  result_version_ = ++g_last_result_version;
}

void App::recompute() {
  result_ = simulate(config_);
  result_version_ = ++g_last_result_version;
  publish();
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
  if (name != "breakdown" && name != "explorer" && name != "advice") return false;
  view_to_show_ = name;
  return true;
}

bool App::load_fragment(const std::string& fragment) {
  std::string f = fragment;
  if (!f.empty() && f[0] == '#') f.erase(0, 1);
  if (f.empty()) return true;  // no link state: keep the current setup
  Parsed p = config_from_fragment(f, Config{});
  Result r;
  if (p.ok) {
    r = simulate(p.config);
    if (!r.ok) {
      p.ok = false;
      p.errors = r.errors;
    }
  }
  if (!p.ok) {
    std::string text = "This link could not be opened, so the current setup is kept. " + p.errors[0].message;
    if (p.errors.size() > 1) text += " (and " + std::to_string(p.errors.size() - 1) + " more problems)";
    messages_.push_back({Message::Kind::Error, text});
    return false;
  }
  config_ = p.config;
  result_ = std::move(r);  // simulated above: no need to run it twice
  result_version_ = ++g_last_result_version;
  publish();
  return true;
}

bool App::load_text(const std::string& text, const std::string& origin) {
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
  if (copy_summary && hooks_.copy_text && result_.ok) {
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
  announce_focus("Open JSON, button: loads a memsim, Hugging Face, DeepSpeed or Accelerate config from a file");
  if (open) {
    if (hooks_.open_file) hooks_.open_file();
    else messages_.push_back({Message::Kind::Info, "Drop a memsim config, a config.json, a DeepSpeed or an Accelerate config onto the "
                                                   "window, or pass it on the command line."});
  }
  flow("Paste JSON...");
  if (ImGui::Button("Paste JSON...")) ImGui::OpenPopup("paste");
  announce_focus("Paste JSON, button: opens a box to paste a config into");
  if (ImGui::BeginPopup("paste")) {
    static std::string text;
    ImGui::TextUnformatted("Paste a memsim config, a Hugging Face config.json, a DeepSpeed or an Accelerate config:");
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

void App::frame() {
  keyboard_frame_start();
  const ImGuiViewport* vp = ImGui::GetMainViewport();
  ImGui::SetNextWindowPos(vp->WorkPos);
  ImGui::SetNextWindowSize(vp->WorkSize);
  ImGui::Begin("memsim", nullptr,
               ImGuiWindowFlags_NoDecoration | ImGuiWindowFlags_NoMove | ImGuiWindowFlags_NoSavedSettings |
                   ImGuiWindowFlags_NoBringToFrontOnFocus | ImGuiWindowFlags_NoBackground);
  draw_toolbar();
  draw_messages();
  ImGui::Separator();

  const float avail = ImGui::GetContentRegionAvail().x;
  const float left = std::clamp(avail * 0.36f, 280.0f, 470.0f);
  // The panels are one space for the keyboard: the arrows and Tab cross from one to the next (ui/keyboard.h).
  ImGui::BeginChild("inputs", ImVec2(left, 0), true, ImGuiWindowFlags_NavFlattened);
  if (draw_inputs_panel(config_, result_)) recompute();
  ImGui::EndChild();
  ImGui::SameLine();
  ImGui::BeginChild("outputs", ImVec2(0, 0), false, ImGuiWindowFlags_NavFlattened);
  const float results_h = std::max(ImGui::GetContentRegionAvail().y * 0.58f, 260.0f);
  ImGui::BeginChild("results", ImVec2(0, results_h), true, ImGuiWindowFlags_NavFlattened);
  if (ImGui::BeginTabBar("views")) {
    auto tab = [&](const char* label, const char* view) {
      const bool open = ImGui::BeginTabItem(label, nullptr, view_to_show_ == view ? ImGuiTabItemFlags_SetSelected : 0);
      announce_focus(std::string(label) + (open ? ", tab, shown" : ", tab: Space or Enter shows it"));
      return open;
    };
    if (tab("Breakdown", "breakdown")) {
      draw_results_panel(config_, result_, unit_, result_version_);
      ImGui::EndTabItem();
    }
    if (tab("Fit explorer", "explorer")) {
      if (draw_explorer_panel(config_, unit_)) {
        recompute();
        messages_.push_back({Message::Kind::Info, "Applied the cell's setup."});
      }
      ImGui::EndTabItem();
    }
    if (tab("What helps", "advice")) {
      if (draw_advice_panel(config_, unit_)) {
        recompute();
        messages_.push_back({Message::Kind::Info, "Applied. The link now holds the changed setup."});
      }
      ImGui::EndTabItem();
    }
    ImGui::EndTabBar();
    view_to_show_.clear();
  }
  ImGui::EndChild();
  ImGui::BeginChild("timeline", ImVec2(0, 0), true, ImGuiWindowFlags_NavFlattened);
  ImGui::TextUnformatted("One training step (two iterations: the optimizer state appears in the first)");
  draw_timeline_panel(result_, unit_, result_version_);
  ImGui::EndChild();
  ImGui::EndChild();
  ImGui::End();
  keyboard_frame_end();
}

}  // namespace memsim::ui
