// The toolbar: Undo, Redo and Reset; the link, the summary and the config files; the unit and the theme. And the box
// that shows a link to copy by hand where the browser's clipboard refused it.
#include <imgui.h>
#include <imgui_stdlib.h>

#include <algorithm>

#include "app.h"
#include "core/serialize.h"
#include "keyboard.h"
#include "panels.h"

namespace memsim::ui {

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

// Buttons flow onto a further line when the window is narrow (800 px, and a phone, must stay usable).
void flow(const char* label) {
  const ImGuiStyle& st = ImGui::GetStyle();
  const float w = ImGui::CalcTextSize(label).x + st.FramePadding.x * 2 + st.ItemSpacing.x;
  const float right = ImGui::GetWindowPos().x + ImGui::GetWindowContentRegionMax().x;
  if (ImGui::GetItemRectMax().x + w < right) ImGui::SameLine();
}

// A toolbar button that is greyed out while it would do nothing. Tab passes it by (a stop that does nothing only
// slows the keyboard down); where it has the focus already (Reset, just pressed) it is announced as unavailable,
// saying why, and the hover says what it would do.
bool tool_button(const char* label, bool enabled, const std::string& does, const char* why_not, const char* tooltip) {
  ImGui::BeginDisabled(!enabled);
  bool pressed = false;
  {
    const TabSkip skip(!enabled, ImGui::GetID(label));
    pressed = ImGui::Button(label);
  }
  ImGui::EndDisabled();
  announce_focus(std::string(label) + (enabled ? ", button: " + does : ", button, unavailable: " + std::string(why_not)));
  if (ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled) || item_has_keyboard_focus()) ImGui::SetTooltip("%s", tooltip);
  return pressed;
}

}  // namespace

void App::draw_history_buttons() {
  if (tool_button("Undo", history_.can_undo(), "brings back the setup before the last change (Ctrl+Z)", "no change to undo",
                  "Brings back the setup before the last change (Ctrl+Z)."))
    undo();
  flow("Redo");
  if (tool_button("Redo", history_.can_redo(), "applies the undone change again (Ctrl+Shift+Z)", "no undone change",
                  "Applies the undone change again (Ctrl+Shift+Z or Ctrl+Y)."))
    redo();
  flow("Reset");
  if (tool_button("Reset", !(config_ == Config{}), "brings back the default setup; Undo brings yours back",
                  "this is the default setup", "Brings back the default setup. Undo (Ctrl+Z) brings yours back."))
    reset();
}

void App::copy(const std::string& what, const std::string& text) {
  if (!hooks_.copy_text) {
    copies_.push_back({what, text});
    copy_finished(false);
    return;
  }
  hooks_.copy_text(text);
  copies_.push_back({what, text});
  if (!hooks_.copy_reports_later) copy_finished(true);
}

void App::copy_finished(bool copied) {
  if (copies_.empty()) return;
  const Copy c = copies_.front();
  copies_.pop_front();
  if (copied) {
    message(Message::Kind::Info, c.what == "link" ? "Link copied: it reopens exactly this setup." : "Markdown summary copied.");
    return;
  }
  by_hand_ = c;
  show_by_hand_ = true;
  message(Message::Kind::Error, "The " + c.what + " was NOT copied: this browser gives the page no clipboard here (it "
                                "does over HTTPS and on localhost). It is shown under the toolbar: select it and copy it by hand.");
}

void App::draw_copy_by_hand() {
  if (show_by_hand_) {
    ImGui::OpenPopup("copy by hand");
    show_by_hand_ = false;
  }
  const ImGuiViewport* vp = ImGui::GetMainViewport();
  ImGui::SetNextWindowPos(ImVec2(ImGui::GetWindowPos().x + 8, ImGui::GetCursorScreenPos().y), ImGuiCond_Appearing);
  if (!ImGui::BeginPopup("copy by hand")) return;
  const float width = std::min(vp->WorkSize.x - 40.0f, 760.0f);
  ImGui::PushTextWrapPos(width);
  ImGui::TextUnformatted(("The " + by_hand_.what + " was NOT copied: this browser gives the page no clipboard here. Copy it "
                          "from this box: it is selected, so Ctrl+C copies it.").c_str());
  ImGui::PopTextWrapPos();
  if (ImGui::IsWindowAppearing()) ImGui::SetKeyboardFocusHere();
  const ImGuiInputTextFlags flags = ImGuiInputTextFlags_ReadOnly | ImGuiInputTextFlags_AutoSelectAll;
  if (by_hand_.what == "link") {
    ImGui::SetNextItemWidth(width);
    ImGui::InputText("##by hand", &by_hand_.text, flags);
  } else {
    ImGui::InputTextMultiline("##by hand", &by_hand_.text, ImVec2(width, ImGui::GetTextLineHeight() * 12), flags);
  }
  announce_focus("The " + by_hand_.what + " to copy by hand, read-only text, selected: " + by_hand_.text);
  if (ImGui::Button("Close")) ImGui::CloseCurrentPopup();
  announce_focus("Close, button: closes the box");
  ImGui::EndPopup();
}

void App::draw_toolbar() {
  ImGui::TextUnformatted("memsim");
  if (ImGui::GetContentRegionAvail().x > 1150) {
    ImGui::SameLine();
    ImGui::TextDisabled("training memory simulator");
  }
  ImGui::SameLine();
  // The link is made when it is copied, not every frame.
  auto link = [&] { return hooks_.page_url + "#" + config_to_fragment(config_); };
  const bool copy_link = ImGui::Button("Copy link");
  announce_focus("Copy link, button: copies a link that reopens this setup");
  if (copy_link) copy("link", link());
  flow("Copy summary");
  const bool copy_summary = ImGui::Button("Copy summary");
  announce_focus("Copy summary, button: copies a Markdown table of the result for chat");
  if (copy_summary && running_) message(Message::Kind::Info, "The summary can be copied once the run is simulated.");
  if (copy_summary && result_.ok && !running_) copy("summary", summary_markdown(config_, result_, unit_, link()));
  flow("Save JSON");
  const bool save = ImGui::Button("Save JSON");
  announce_focus("Save JSON, button: downloads this setup as a memsim config");
  if (save && hooks_.save_text) message(Message::Kind::Info, hooks_.save_text("memsim-config.json", config_to_json(config_)));
  flow("DeepSpeed JSON");
  const bool deepspeed = ImGui::Button("DeepSpeed JSON");
  announce_focus("DeepSpeed JSON, button: downloads the training part of this setup as a DeepSpeed config");
  if (deepspeed && hooks_.save_text) message(Message::Kind::Info, hooks_.save_text("ds_config.json", deepspeed_json(config_)));
  if (ImGui::IsItemHovered() || item_has_keyboard_focus())
    ImGui::SetTooltip("The training part of this setup as a DeepSpeed config to start from.");
  flow("Open JSON");
  const bool open = ImGui::Button("Open JSON");
  announce_focus("Open JSON, button: loads a memsim, Hugging Face, DeepSpeed or Accelerate config, or a file of sample "
                 "lengths, from a file");
  if (open) {
    if (hooks_.open_file) hooks_.open_file();
    else message(Message::Kind::Info, "Drop a memsim config, a config.json, a DeepSpeed or an Accelerate config, or a file of "
                                      "sample lengths, onto the window, or pass it on the command line.");
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
  flow("Undo");
  draw_history_buttons();
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
  draw_copy_by_hand();
}

}  // namespace memsim::ui
