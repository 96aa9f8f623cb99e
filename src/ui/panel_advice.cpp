// "What helps": the changes that lower the peak, in groups (core/advice.h): first those that keep the job as given
// (same model, method, global batch and sequence), then those that keep it with slightly different numerics, the
// pairs that fit together where no single same-job change does, more GPUs, and last the changes that make it
// another job. Each row shows what it saves and what it costs; one click applies it. The suggestions are simulated
// in full and cached until the setup changes; like the fit explorer, a frame simulates only for about 8 ms, so that
// a large layout (a 405B pipeline is some 20 ms a simulation in wasm) or a long run does not freeze the page while
// the list fills in. The pairs are simulated after the single changes, as they are made of the best of them.
//
// A run of varying shapes costs its steps: a thousand-step run of a 7B model is about 0.3 s natively and twice that
// in wasm, and the list has some 25 changes. Where one replay of the run passes kVariantRunLayerPasses, every change
// and the setup itself are simulated over the same fewer steps (the run's first draws, its longest sample among
// them): the memory a change saves is compared like with like, the list fills in within seconds, and the panel says
// so. Apply simulates the changed setup's own run in full.
#include <imgui.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <memory>

#include "core/advice.h"
#include "core/data_shape.h"
#include "core/serialize.h"
#include "keyboard.h"
#include "panels.h"

namespace memsim::ui {

namespace {

// The interface's words for each group (advice.h's order): the heading of its table.
const char* group_heading(SuggestionGroup g, bool pairs_fit) {
  switch (g) {
    case SuggestionGroup::SameJob: return "Same job: same model, method, global batch and sequence";
    case SuggestionGroup::SameJobNumerics: return "Same job, slightly different numerics";
    case SuggestionGroup::Pair:
      return pairs_fit ? "Together they fit: two same-job changes" : "Together, borderline: two same-job changes";
    case SuggestionGroup::MoreHardware: return "More hardware: more GPUs of the same kind";
    case SuggestionGroup::ChangesJob: return "Changes the job: another method, sequence or model";
  }
  return "";
}

const char* verdict_words_after(const Suggestion& s) {
  return s.fits ? "fits" : s.verdict == Verdict::Borderline ? "borderline" : "does not fit";
}

// The width, in font heights, below which the four columns (change, saves, peak after, Apply) cut their text: the
// headings and the "saves" column on a phone. A 1280-pixel page's results panel is some 50.
constexpr float kFourColumnsEm = 34.0f;

float apply_column_width() { return ImGui::GetFontSize() * 3.5f; }

// "105.88 GiB (74%)": what a change saves, and its share of the setup's peak.
std::string saved_text(const Suggestion& s, Unit unit, float peak_before) {
  char share[16];
  std::snprintf(share, sizeof share, " (%.0f%%)",
                peak_before > 0 ? 100.0f * static_cast<float>(s.saved_bytes) / peak_before : 0.0f);
  return bytes_text(s.saved_bytes, unit) + share;
}

// The verdict's word after the peak, where it is not "does not fit" (the results panel's verdicts).
const char* verdict_suffix(const Suggestion& s) {
  return s.fits ? " fits" : s.verdict == Verdict::Borderline ? " borderline" : "";
}

// The peak after the change, coloured as the results panel colours its verdict: a change that leaves the band across
// the usable line is borderline.
void draw_peak_after(const Suggestion& s, const std::string& text) {
  if (s.fits) ImGui::TextColored(ImVec4(0.35f, 0.85f, 0.45f, 1), "%s", text.c_str());
  else if (s.verdict == Verdict::Borderline) ImGui::TextColored(ImVec4(0.95f, 0.8f, 0.3f, 1), "%s", text.c_str());
  else ImGui::TextUnformatted(text.c_str());
}

// The fields a row sets, shown while its change or its cost is hovered.
void sets_tooltip(const std::string& sets) {
  ImGui::BeginTooltip();
  ImGui::PushTextWrapPos(ImGui::GetFontSize() * 30.0f);
  ImGui::TextUnformatted(("Sets:" + sets).c_str());
  ImGui::PopTextWrapPos();
  ImGui::EndTooltip();
}

// A greyed line that wraps: the progress lines are longer than a phone's column, and a cut one reads as a list cut off.
void disabled_wrapped(const char* fmt, ...) IM_FMTARGS(1);
void disabled_wrapped(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
  ImGui::TextWrappedV(fmt, args);
  ImGui::PopStyleColor();
  va_end(args);
}

// The change (a pair: its two parts, one a line), wrapped to its cell.
void draw_change(const Suggestion& s, const std::string& sets) {
  if (s.part_changes.size() == 2) ImGui::TextWrapped("%s\n+ %s", s.part_changes[0].c_str(), s.part_changes[1].c_str());
  else ImGui::TextWrapped("%s", s.change.c_str());
  if (ImGui::IsItemHovered()) sets_tooltip(sets);
}

// What the change costs, greyed, on every row.
void draw_cost(const Suggestion& s, const std::string& sets) {
  ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
  ImGui::TextWrapped("%s", s.cost.c_str());
  ImGui::PopStyleColor();
  if (ImGui::IsItemHovered()) sets_tooltip(sets);
}

}  // namespace

bool draw_advice_panel(Config& config, Unit unit, const Result& current, bool ready) {
  static Config cached_for;
  static bool started = false, pairs_added = false;
  static int64_t peak_now = -1;
  static int refusals_now = 0;  // GPUs where a vLLM engine would not start (core/advice.h refusal_count)
  static std::vector<Suggestion> pending, evaluated, cached;
  static std::vector<std::string> cached_sets;  // per row: the fields Apply changes, as --set would write them
  static size_t next = 0, singles = 0;
  static int64_t run_steps = 0;      // the setup's run, in optimizer steps (0: a fixed shape)
  static int64_t variant_steps = 0;  // the fewer steps every variant replays (0: the whole run, or a fixed shape)
  static std::unique_ptr<Simulation> in_flight;  // the setup over variant_steps, or candidate `next`, under way
  if (!started || !(config == cached_for)) {
    cached_for = config;
    started = true;
    peak_now = -2;  // not simulated yet
    pending = suggestion_candidates(config);
    singles = pending.size();
    pairs_added = false;
    evaluated.clear();
    cached.clear();
    cached_sets.clear();
    next = 0;
    run_steps = planned_run_steps(config);
    variant_steps = run_steps_within(config, kVariantRunLayerPasses);
    in_flight.reset();
  }
  if (!ready) {  // the setup's own simulation goes first
    disabled_wrapped("The changes are simulated once this setup is.");
    return false;
  }
  auto variant = [&](Config c) {
    if (variant_steps > 0) c.data.steps = variant_steps;
    return c;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(8);
  // The peak to compare with: the setup's own result, or its replay over the variants' fewer steps.
  if (peak_now == -2 && variant_steps == 0) peak_now = worst_device_peak(current), refusals_now = refusal_count(current);
  bool grew = false;
  while (std::chrono::steady_clock::now() < deadline) {
    if (peak_now == -2) {
      if (!in_flight) in_flight = std::make_unique<Simulation>(variant(config));
      if (!advance_until(*in_flight, deadline)) break;
      peak_now = worst_device_peak(in_flight->result());
      refusals_now = refusal_count(in_flight->result());
      in_flight.reset();
      continue;
    }
    if (peak_now < 0) break;
    if (next >= pending.size()) {
      // Every single change is scored: the pairs of the best same-job ones, where none of them fits alone.
      if (pairs_added) break;
      pairs_added = true;
      for (auto& p : pair_candidates(config, evaluated)) pending.push_back(std::move(p));
      continue;
    }
    if (!in_flight) in_flight = std::make_unique<Simulation>(variant(pending[next].config));
    if (!advance_until(*in_flight, deadline)) break;
    Suggestion& s = pending[next++];
    if (score_suggestion(s, peak_now, in_flight->result(), refusals_now)) evaluated.push_back(s), grew = true;
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
  const bool working = peak_now != -1 && (next < pending.size() || !pairs_added);
  if (working) {
    note_work_left();
    if (next < singles) disabled_wrapped("Simulating the changes: %zu of %zu...", next, singles);
    else if (pending.size() > singles) disabled_wrapped("No single same-job change fits: simulating pairs, %zu of %zu...", next - singles, pending.size() - singles);
  }
  if (cached.empty()) {
    if (!working) disabled_wrapped("No change from the list lowers this setup's peak by 1%% or more.");
    return false;
  }
  bool changed = false, pairs_shown = false;
  const bool pairs_fit = std::any_of(cached.begin(), cached.end(), [](const Suggestion& s) { return s.group == SuggestionGroup::Pair && s.fits; });
  const float peak_before = static_cast<float>(cached.front().peak_bytes + cached.front().saved_bytes);
  // Where the four columns do not fit (a phone's one column: a group's heading and "saves" were cut), each row stacks
  // its numbers under its change, beside its Apply.
  const bool narrow = ImGui::GetContentRegionAvail().x < ImGui::GetFontSize() * kFourColumnsEm;
  // One table per group, its heading in the header of the first column (narrow: a row of its own), so that a group's
  // rows line up with it.
  for (size_t i = 0; i < cached.size();) {
    const SuggestionGroup g = cached[i].group;
    size_t end = i;
    while (end < cached.size() && cached[end].group == g) ++end;
    pairs_shown |= g == SuggestionGroup::Pair;
    ImGui::PushID(static_cast<int>(g));
    const char* heading = group_heading(g, pairs_fit);
    const ImGuiTableFlags flags = ImGuiTableFlags_RowBg | ImGuiTableFlags_SizingStretchProp | ImGuiTableFlags_BordersInnerV;
    if (ImGui::BeginTable("advice", narrow ? 2 : 4, flags)) {
      if (narrow) {
        ImGui::TableSetupColumn("change", ImGuiTableColumnFlags_WidthStretch);
        ImGui::TableSetupColumn("", ImGuiTableColumnFlags_WidthFixed, apply_column_width());
        // The heading wraps in a row of the header's colour: no header cell can wrap.
        ImGui::TableNextRow(ImGuiTableRowFlags_Headers);
        ImGui::TableSetBgColor(ImGuiTableBgTarget_RowBg0, ImGui::GetColorU32(ImGuiCol_TableHeaderBg));
        ImGui::TableNextColumn();
        ImGui::TextWrapped("%s", heading);
      } else {
        ImGui::TableSetupColumn(heading, ImGuiTableColumnFlags_WidthStretch, 2.6f);
        ImGui::TableSetupColumn("saves", ImGuiTableColumnFlags_WidthStretch, 0.9f);
        ImGui::TableSetupColumn("peak after", ImGuiTableColumnFlags_WidthStretch, 1.1f);
        ImGui::TableSetupColumn("", ImGuiTableColumnFlags_WidthFixed, apply_column_width());
        ImGui::TableHeadersRow();
      }
      for (; i < end; ++i) {
        const Suggestion& s = cached[i];
        ImGui::PushID(static_cast<int>(i));
        ImGui::TableNextRow();
        ImGui::TableNextColumn();
        draw_change(s, cached_sets[i]);
        if (narrow) {
          // "saves 105.88 GiB (74%)", and "peak after 38.01 GiB fits" beside it where there is room, else under it.
          const std::string saves = "saves " + saved_text(s, unit, peak_before);
          ImGui::TextUnformatted(saves.c_str());
          const std::string after = "peak after " + bytes_text(s.peak_bytes, unit) + verdict_suffix(s);
          const float room = ImGui::GetContentRegionAvail().x - ImGui::GetItemRectSize().x - ImGui::GetStyle().ItemSpacing.x;
          if (ImGui::CalcTextSize(after.c_str()).x <= room) ImGui::SameLine();
          draw_peak_after(s, after);
          draw_cost(s, cached_sets[i]);
        } else {
          draw_cost(s, cached_sets[i]);
          ImGui::TableNextColumn();
          ImGui::TextUnformatted(saved_text(s, unit, peak_before).c_str());
          ImGui::TableNextColumn();
          draw_peak_after(s, bytes_text(s.peak_bytes, unit) + verdict_suffix(s));
        }
        ImGui::TableNextColumn();
        if (ImGui::SmallButton("Apply")) {
          config = s.config;
          changed = true;
        }
        // The keyboard reaches the row through its button: the fields it sets show as the hover would show them.
        if (item_has_keyboard_focus()) {
          ImGui::BeginTooltip();
          ImGui::PushTextWrapPos(ImGui::GetFontSize() * 30.0f);
          ImGui::TextUnformatted((s.change + "\nCost: " + s.cost + "\nSets:" + cached_sets[i]).c_str());
          ImGui::PopTextWrapPos();
          ImGui::EndTooltip();
        }
        announce_focus(std::string("Apply, button: ") + heading + ": " + s.change + ". Saves " +
                       bytes_text(s.saved_bytes, unit) + ", peak after " + bytes_text(s.peak_bytes, unit) + ", " +
                       verdict_words_after(s) + ". Cost: " + s.cost);
        ImGui::PopID();
      }
      ImGui::EndTable();
    }
    i = end;
    ImGui::PopID();
  }
  // Where no same-job change fits alone and the pairs are done, say so when no pair fits either.
  if (pairs_added && next >= pending.size() && pending.size() > singles && !pairs_shown)
    disabled_wrapped("No pair of the %d same-job changes that save the most fits either.", kMaxPairedChanges);
  ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
  ImGui::TextWrapped("Hover a change for the fields it sets (or focus its Apply). Rows that save under 1%% of the peak "
                     "are left out. Each row is a %s",
                     variant_steps > 0 ? "simulation of the changed setup over the same steps." : "full simulation of the changed setup.");
  ImGui::PopStyleColor();
  return changed;
}

}  // namespace memsim::ui
