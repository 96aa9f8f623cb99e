// "What helps": each single change that lowers the peak, ranked by the memory it saves, with its cost; one click
// applies it. The suggestions are simulated in full (core/advice.h) and cached until the setup changes; like the
// fit explorer, a frame simulates only for about 8 ms, so that a large layout (a 405B pipeline is some 20 ms a
// simulation in wasm) or a long run does not freeze the page while the list fills in.
//
// A run of varying shapes costs its steps: a thousand-step run of a 7B model is about 0.3 s natively and twice that
// in wasm, and the list has some 25 changes. Where one replay of the run passes kVariantRunLayerPasses, every change
// and the setup itself are simulated over the same fewer steps (the run's first draws, its longest sample among
// them): the memory a change saves is compared like with like, the list fills in within seconds, and the panel says
// so. Apply simulates the changed setup's own run in full.
#include <imgui.h>

#include <chrono>
#include <memory>

#include "core/advice.h"
#include "core/data_shape.h"
#include "core/serialize.h"
#include "keyboard.h"
#include "panels.h"

namespace memsim::ui {

bool draw_advice_panel(Config& config, Unit unit, const Result& current, bool ready) {
  static Config cached_for;
  static bool started = false;
  static int64_t peak_now = -1;
  static std::vector<Suggestion> pending, evaluated, cached;
  static std::vector<std::string> cached_sets;  // per row: the fields Apply changes, as --set would write them
  static size_t next = 0;
  static int64_t run_steps = 0;      // the setup's run, in optimizer steps (0: a fixed shape)
  static int64_t variant_steps = 0;  // the fewer steps every variant replays (0: the whole run, or a fixed shape)
  static std::unique_ptr<Simulation> in_flight;  // the setup over variant_steps, or candidate `next`, under way
  if (!started || !(config == cached_for)) {
    cached_for = config;
    started = true;
    peak_now = -2;  // not simulated yet
    pending = suggestion_candidates(config);
    evaluated.clear();
    cached.clear();
    cached_sets.clear();
    next = 0;
    run_steps = planned_run_steps(config);
    variant_steps = run_steps_within(config, kVariantRunLayerPasses);
    in_flight.reset();
  }
  if (!ready) {  // the setup's own simulation goes first
    ImGui::TextDisabled("The changes are simulated once this setup is.");
    return false;
  }
  auto variant = [&](Config c) {
    if (variant_steps > 0) c.data.steps = variant_steps;
    return c;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(8);
  // The peak to compare with: the setup's own result, or its replay over the variants' fewer steps.
  if (peak_now == -2 && variant_steps == 0) peak_now = worst_device_peak(current);
  bool grew = false;
  while (std::chrono::steady_clock::now() < deadline) {
    if (peak_now == -2) {
      if (!in_flight) in_flight = std::make_unique<Simulation>(variant(config));
      if (!advance_until(*in_flight, deadline)) break;
      peak_now = worst_device_peak(in_flight->result());
      in_flight.reset();
      continue;
    }
    if (peak_now < 0 || next >= pending.size()) break;
    if (!in_flight) in_flight = std::make_unique<Simulation>(variant(pending[next].config));
    if (!advance_until(*in_flight, deadline)) break;
    Suggestion& s = pending[next++];
    if (score_suggestion(s, peak_now, in_flight->result())) evaluated.push_back(s), grew = true;
    in_flight.reset();
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
  if (variant_steps > 0) {
    ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
    ImGui::TextWrapped("A long run: each change, and this setup, are replayed over the same %s of its %s steps (its "
                       "longest sample among them), so that the list comes within seconds. What a change saves compares "
                       "like with like; over the whole run reserved memory can grow further. Apply replays the changed "
                       "run in full.",
                       format_count(variant_steps).c_str(), format_count(run_steps).c_str());
    ImGui::PopStyleColor();
  }
  const bool working = peak_now != -1 && next < pending.size();
  if (working) {
    note_work_left();
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
  ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
  ImGui::TextWrapped("Hover a change, or focus its Apply, for its cost and the fields it sets. Each row is a %s",
                     variant_steps > 0 ? "simulation of the changed setup over the same steps." : "full simulation of the changed setup.");
  ImGui::PopStyleColor();
  return changed;
}

}  // namespace memsim::ui
