// "What helps": each single change that lowers the peak, ranked by the memory it saves, with its cost; one click
// applies it. The suggestions are simulated in full (core/advice.h) and cached until the setup changes; like the
// fit explorer, a frame simulates only as many as fit in about 8 ms, so that a large layout (a 405B pipeline is
// some 20 ms a simulation in wasm) does not freeze the page while the list fills in.
#include <imgui.h>

#include <chrono>

#include "core/advice.h"
#include "core/serialize.h"
#include "keyboard.h"
#include "panels.h"

namespace memsim::ui {

bool draw_advice_panel(Config& config, Unit unit) {
  static Config cached_for;
  static bool started = false;
  static int64_t peak_now = -1;
  static std::vector<Suggestion> pending, evaluated, cached;
  static std::vector<std::string> cached_sets;  // per row: the fields Apply changes, as --set would write them
  static size_t next = 0;
  if (!started || !(config == cached_for)) {
    cached_for = config;
    started = true;
    peak_now = -2;  // not simulated yet
    pending = suggestion_candidates(config);
    evaluated.clear();
    cached.clear();
    cached_sets.clear();
    next = 0;
  }
  const auto start = std::chrono::steady_clock::now();
  const auto budget = std::chrono::milliseconds(8);
  if (peak_now == -2) peak_now = worst_device_peak(config);
  bool grew = false;
  while (peak_now >= 0 && next < pending.size() && std::chrono::steady_clock::now() - start < budget) {
    Suggestion& s = pending[next++];
    if (evaluate_suggestion(s, peak_now)) evaluated.push_back(s), grew = true;
  }
  if (grew) {
    cached = rank_suggestions(evaluated);
    cached_sets.clear();
    for (const auto& sg : cached) {
      std::string sets;
      for (const auto& kv : config_changes(config, sg.config)) sets += "\n  " + kv;
      cached_sets.push_back(sets);
    }
  }
  const bool working = peak_now >= 0 && next < pending.size();
  if (working) {
    ImGui::TextDisabled("Simulating the changes: %zu of %zu...", next, pending.size());
  }
  if (cached.empty()) {
    if (!working) ImGui::TextDisabled("No single change from the list lowers this setup's peak.");
    return false;
  }
  bool changed = false;
  if (!ImGui::BeginTable("advice", 4, ImGuiTableFlags_RowBg | ImGuiTableFlags_SizingStretchProp | ImGuiTableFlags_BordersInnerV))
    return false;
  ImGui::TableSetupColumn("change", ImGuiTableColumnFlags_WidthStretch, 2.6f);
  ImGui::TableSetupColumn("saves", ImGuiTableColumnFlags_WidthStretch, 0.9f);
  ImGui::TableSetupColumn("peak after", ImGuiTableColumnFlags_WidthStretch, 1.1f);
  ImGui::TableSetupColumn("", ImGuiTableColumnFlags_WidthFixed, ImGui::GetFontSize() * 3.5f);
  ImGui::TableHeadersRow();
  for (size_t i = 0; i < cached.size(); ++i) {
    const Suggestion& s = cached[i];
    ImGui::PushID(static_cast<int>(i));
    ImGui::TableNextRow();
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(s.change.c_str());
    if (ImGui::IsItemHovered()) {
      ImGui::BeginTooltip();
      ImGui::PushTextWrapPos(ImGui::GetFontSize() * 30.0f);
      ImGui::TextUnformatted(("Cost: " + s.cost + "\nSets:" + cached_sets[i]).c_str());
      ImGui::PopTextWrapPos();
      ImGui::EndTooltip();
    }
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(bytes_text(s.saved_bytes, unit).c_str());
    ImGui::TableNextColumn();
    // The same verdict as the results panel's: a change that leaves the band across the usable line is borderline.
    if (s.fits) ImGui::TextColored(ImVec4(0.35f, 0.85f, 0.45f, 1), "%s fits", bytes_text(s.peak_bytes, unit).c_str());
    else if (s.verdict == Verdict::Borderline)
      ImGui::TextColored(ImVec4(0.95f, 0.8f, 0.3f, 1), "%s borderline", bytes_text(s.peak_bytes, unit).c_str());
    else ImGui::TextUnformatted(bytes_text(s.peak_bytes, unit).c_str());
    ImGui::TableNextColumn();
    if (ImGui::SmallButton("Apply")) {
      config = s.config;
      changed = true;
    }
    // The keyboard reaches the row through its button: the cost shows as the hover over the change would show it.
    if (item_has_keyboard_focus()) {
      ImGui::BeginTooltip();
      ImGui::PushTextWrapPos(ImGui::GetFontSize() * 30.0f);
      ImGui::TextUnformatted((s.change + "\nCost: " + s.cost + "\nSets:" + cached_sets[i]).c_str());
      ImGui::PopTextWrapPos();
      ImGui::EndTooltip();
    }
    announce_focus("Apply, button: " + s.change + ". Saves " + bytes_text(s.saved_bytes, unit) + ", peak after " +
                   bytes_text(s.peak_bytes, unit) +
                   (s.fits ? ", fits" : s.verdict == Verdict::Borderline ? ", borderline" : ", does not fit") +
                   ". Cost: " + s.cost);
    ImGui::PopID();
  }
  ImGui::EndTable();
  ImGui::TextDisabled("Hover a change, or focus its Apply, for its cost and the fields it sets. Each row is a full simulation of the changed setup.");
  return changed;
}

}  // namespace memsim::ui
