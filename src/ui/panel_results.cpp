// The answer: per device role, whether it fits and by how much, then where the memory goes at the peak.
#include <imgui.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <string>

#include "band_view.h"
#include "chart.h"
#include "colors.h"
#include "core/format.h"
#include "core/step.h"
#include "keyboard.h"
#include "panels.h"

namespace memsim::ui {

namespace {

// The breakdown's rows, defined in the core (format.h breakdown_rows) so that the bar, the table, the header and the
// CLI show the same figures under the same words.
using Slot = BreakdownRow;
std::vector<Slot> slots_of(const DeviceResult& d) { return breakdown_rows(d); }

void verdict(const DeviceResult& d, Unit unit) {
  const int64_t left = d.usable_bytes - d.peak.device_bytes;
  ImGui::PushTextWrapPos(0.0f);  // a phone-sized window wraps the verdict rather than cutting it off
  ImGui::PushStyleColor(ImGuiCol_Text, verdict_color(d.verdict));
  ImGui::Text("%s", verdict_words(d.verdict));  // with the band: borderline where the usable line falls inside it
  ImGui::PopStyleColor();
  ImGui::SameLine();
  // The verdict's statistic (nvidia-smi) against the usable memory, the headroom named (core/format.h).
  ImGui::Text("%s (x%lld): %s", d.role.c_str(), static_cast<long long>(d.device_count),
              describe_usable(d, unit, unit == Unit::MiB ? 0 : 2).c_str());
  if (!d.refusal.empty())  // an engine that would not start (core/result.h): its check, not the usable line
    ImGui::TextColored(ImVec4(1.0f, 0.6f, 0.4f, 1), "%s", d.refusal.c_str());
  else if (left >= 0)
    ImGui::Text("%s left under the usable line", bytes_text(left, unit).c_str());
  else
    ImGui::TextColored(ImVec4(1.0f, 0.6f, 0.4f, 1), "%s over the usable %s", bytes_text(-left, unit).c_str(),
                       bytes_text(d.usable_bytes, unit).c_str());
  band_line(d, unit);
  if (d.oom) {
    const char* phase = "";
    for (const auto& p : d.program.phases)
      if (p.first_event <= d.oom_event) phase = p.name.c_str();
    ImGui::TextColored(ImVec4(1.0f, 0.6f, 0.4f, 1), "The step runs out of memory during %s; the numbers below are what it "
                       "would need.", phase);
  }
  ImGui::TextDisabled("peak during %s, at the allocation of: %s", d.peak_phase.c_str(), d.peak_label.c_str());
  // A run: where in it the peak is, and how far its cache grew (the Run view under the timeline shows every step).
  if (std::string where = describe_run(d.run, unit, unit == Unit::MiB ? 0 : 2); !where.empty()) {
    where[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(where[0])));
    ImGui::TextUnformatted((where + ".").c_str());
  }
  ImGui::PopTextWrapPos();
}

// Stacked bar of the breakdown against the GPU's capacity, with the usable line. The segments, and the empty frame
// after them, are quads for the chart renderer (chart.h) that do not overlap; the lines and the hover stay with ImGui.
void stacked_bar(const DeviceResult& d, Unit unit, uint64_t key) {
  const auto slots = slots_of(d);
  const float width = ImGui::GetContentRegionAvail().x;
  const float height = ImGui::GetFrameHeight() * 1.4f;
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const double scale_to = static_cast<double>(
      std::max({d.capacity_bytes, d.peak.device_bytes, d.band.valid ? d.band.of(BandStatistic::Device).high_bytes : 0}));
  ImGui::InvisibleButton("bar", ImVec2(width, height));
  const bool hovered = ImGui::IsItemHovered();
  const bool focused = item_has_keyboard_focus();
  const float mouse = (ImGui::GetIO().MousePos.x - p0.x) / width;  // where the mouse is, in the bar's units (0..1)
  QuadChart chart;  // x: share of scale_to, y: the bar's height
  chart.rect = {p0.x, p0.y, p0.x + width, p0.y + height};
  const ImU32 frame = ImGui::GetColorU32(ImGuiCol_FrameBg);
  chart.key = chart_key(key, {static_cast<uint64_t>(width), static_cast<uint64_t>(height), frame});
  double done = 0;
  for (int i = 0; i < static_cast<int>(slots.size()); ++i) {
    if (slots[i].at_peak_bytes <= 0) continue;
    const float x0 = static_cast<float>(done / scale_to);
    const float x1 = std::min(1.0f, static_cast<float>((done + static_cast<double>(slots[i].at_peak_bytes)) / scale_to));
    done += static_cast<double>(slots[i].at_peak_bytes);
    chart.quads.push_back({x0, x1, 0.0f, 1.0f, slot_color(i)});
    if (hovered && mouse >= x0 && mouse < x1) {
      ImGui::BeginTooltip();
      ImGui::Text("%s: %s (%.1f%% of the device peak)", slots[i].label, bytes_text(slots[i].at_peak_bytes, unit).c_str(),
                  100.0 * static_cast<double>(slots[i].at_peak_bytes) / static_cast<double>(std::max<int64_t>(1, d.peak.device_bytes)));
      ImGui::EndTooltip();
    }
  }
  const float filled = static_cast<float>(done / scale_to);
  if (filled < 1.0f) chart.quads.push_back({filled, 1.0f, 0.0f, 1.0f, frame});
  add_chart(dl, std::move(chart));
  const float usable_x = p0.x + static_cast<float>(static_cast<double>(d.usable_bytes) / scale_to * width);
  const float cap_x = p0.x + static_cast<float>(static_cast<double>(d.capacity_bytes) / scale_to * width);
  dl->AddLine(ImVec2(usable_x, p0.y - 3), ImVec2(usable_x, p0.y + height + 3), IM_COL32(255, 220, 80, 255), 2.0f);
  dl->AddLine(ImVec2(cap_x - 1, p0.y - 3), ImVec2(cap_x - 1, p0.y + height + 3), IM_COL32(255, 80, 80, 255), 2.0f);
  const std::string band_words = band_whisker(dl, d, p0, width, height, scale_to, unit, hovered, mouse);
  // The keyboard's focus on the bar shows every component at once (the table below has the same numbers).
  if (focused) {
    draw_focus_frame(p0.x, p0.y, p0.x + width, p0.y + height);
    std::string words = "Breakdown of " + d.role + " at the peak, " + bytes_text(d.peak.device_bytes, unit) + ":";
    ImGui::BeginTooltip();
    for (int i = 0; i < static_cast<int>(slots.size()); ++i) {
      if (slots[i].at_peak_bytes <= 0) continue;
      ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(slot_color(i)), "%s", "#");
      ImGui::SameLine();
      std::string figures = bytes_text(slots[i].at_peak_bytes, unit);
      if (slots[i].kept_bytes >= 0) figures += " (" + bytes_text(slots[i].kept_bytes, unit) + " " + kKeptWords + ")";
      ImGui::Text("%s: %s", slots[i].label, figures.c_str());
      words += std::string(" ") + slots[i].label + " " + figures + ",";
    }
    ImGui::EndTooltip();
    words.back() = '.';
    if (!band_words.empty()) {
      ImGui::BeginTooltip();
      ImGui::TextUnformatted(band_words.c_str());
      ImGui::EndTooltip();
      words += " " + band_words;
    }
    announce_focus(words, true);
  }
}

void breakdown_table(const DeviceResult& d, Unit unit) {
  const auto slots = slots_of(d);
  // Two figures for a model state, each under its own words (core/format.h): what is alive at the peak, and what the
  // GPU keeps between steps, the header's figure.
  if (!ImGui::BeginTable("breakdown", 4, ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_SizingStretchProp))
    return;
  ImGui::TableSetupColumn("component", ImGuiTableColumnFlags_WidthStretch, 3.0f);
  ImGui::TableSetupColumn(kAtPeakWords, ImGuiTableColumnFlags_WidthStretch, 1.3f);
  ImGui::TableSetupColumn("share", ImGuiTableColumnFlags_WidthStretch, 0.8f);
  ImGui::TableSetupColumn(kKeptWords, ImGuiTableColumnFlags_WidthStretch, 1.6f);
  ImGui::TableHeadersRow();
  for (int i = 0; i < static_cast<int>(slots.size()); ++i) {
    if (slots[i].absent) continue;
    ImGui::TableNextRow();
    ImGui::TableNextColumn();
    ImVec2 p = ImGui::GetCursorScreenPos();
    const float sz = ImGui::GetTextLineHeight() * 0.8f;
    ImGui::GetWindowDrawList()->AddRectFilled(ImVec2(p.x, p.y + 2), ImVec2(p.x + sz, p.y + 2 + sz), slot_color(i));
    ImGui::Dummy(ImVec2(sz, sz));
    ImGui::SameLine();
    ImGui::TextUnformatted(slots[i].label);
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(bytes_text(slots[i].at_peak_bytes, unit).c_str());
    ImGui::TableNextColumn();
    ImGui::Text("%.1f%%", 100.0 * static_cast<double>(slots[i].at_peak_bytes) / static_cast<double>(std::max<int64_t>(1, d.peak.device_bytes)));
    ImGui::TableNextColumn();
    if (slots[i].kept_bytes >= 0) ImGui::TextUnformatted(bytes_text(slots[i].kept_bytes, unit).c_str());
  }
  const std::pair<const char*, int64_t> totals[] = {
      {"max_memory_allocated", d.peak.allocated_bytes},
      {"max_memory_reserved", d.peak.reserved_bytes},
      {"device total (nvidia-smi)", d.peak.device_bytes},
  };
  for (const auto& [name, bytes] : totals) {
    ImGui::TableNextRow();
    ImGui::TableNextColumn();
    ImGui::TextDisabled("%s", name);
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(bytes_text(bytes, unit).c_str());
    ImGui::TableNextColumn();
    ImGui::TableNextColumn();
  }
  ImGui::EndTable();
}

}  // namespace

std::string verdict_line_text(const Result& r, Unit unit) {
  const DeviceResult* d = r.ok ? worst_device(r) : nullptr;
  if (!d) return "";
  std::string who = d->role;
  if (r.devices.size() > 1) who = "worst, " + who;
  return std::string(verdict_words(d->verdict)) + " - " + who + ": " + describe_usable(*d, unit, unit == Unit::MiB ? 0 : 2) +
         (d->refusal.empty() ? "" : "; " + d->refusal);
}

void draw_verdict_line(const Result& r, Unit unit, bool current) {
  const DeviceResult* d = r.ok ? worst_device(r) : nullptr;
  ImGui::PushTextWrapPos(0.0f);
  if (!d) {
    ImGui::TextDisabled("No verdict: the configuration has problems (see Breakdown).");
  } else {
    const std::string text = verdict_line_text(r, unit);
    const size_t cut = std::string(verdict_words(d->verdict)).size();
    ImGui::BeginDisabled(!current);  // the previous setup's verdict, greyed, while this one simulates
    ImGui::PushStyleColor(ImGuiCol_Text, verdict_color(d->verdict));
    ImGui::TextUnformatted(text.c_str(), text.c_str() + cut);
    ImGui::PopStyleColor();
    ImGui::SameLine();
    ImGui::TextUnformatted(text.c_str() + cut + 3);  // after " - "
    ImGui::EndDisabled();
  }
  ImGui::PopTextWrapPos();
}

void draw_results_panel(const Config& config, const Result& r, Unit unit, uint64_t version) {
  if (!r.ok) {
    ImGui::TextColored(ImVec4(1.0f, 0.4f, 0.4f, 1), "The configuration has problems:");
    for (const auto& e : r.errors) {  // wrapped: a field's message can be longer than the panel is wide
      ImGui::Bullet();
      ImGui::TextWrapped("%s", e.message.c_str());
    }
    return;
  }
  (void)config;
  ImGui::Text("%s parameters (%s)", format_count(r.params_total).c_str(), format_params(r.params_total).c_str());
  if (r.params_trainable != r.params_total) {
    ImGui::SameLine();
    ImGui::Text("| %s trainable (%.3f%%)", format_count(r.params_trainable).c_str(),
                100.0 * static_cast<double>(r.params_trainable) / static_cast<double>(std::max<int64_t>(1, r.params_total)));
  }
  // The model states each GPU keeps between steps: the breakdown table's kept column, the same figures. Pipeline
  // stages keep different ones, so the header then names whose they are (each stage's table has its own).
  std::string kept = describe_kept(r.model_states, unit, unit == Unit::MiB ? 0 : 2);
  if (r.devices.size() > 1) kept += " (" + r.devices.front().role + ")";
  ImGui::PushTextWrapPos(0.0f);
  ImGui::TextDisabled("%s", kept.c_str());
  ImGui::PopTextWrapPos();
  for (const auto& d : r.devices) {
    ImGui::PushID(&d);
    ImGui::Separator();
    verdict(d, unit);
    stacked_bar(d, unit, chart_key(version, {static_cast<uint64_t>(&d - r.devices.data())}));
    breakdown_table(d, unit);
    ImGui::PopID();
  }
  if (r.host.per_node_bytes > 0 || r.host.nvme_per_node_bytes > 0) {
    ImGui::Separator();
    const std::string need = bytes_text(r.host.per_node_bytes, unit);
    if (r.host.capacity_bytes > 0) {
      const ImVec4 col = r.host.fits ? ImVec4(0.3f, 0.8f, 0.4f, 1) : ImVec4(1.0f, 0.4f, 0.4f, 1);
      ImGui::TextColored(col, "Host RAM per node: %s of %s (%s)", need.c_str(), bytes_text(r.host.capacity_bytes, unit).c_str(),
                         r.host.fits ? "fits" : "does not fit");
    } else {
      ImGui::Text("Host RAM per node: %s (set the node's RAM under Hardware for a verdict)", need.c_str());
    }
    help_marker("Offloaded model states of every GPU on a node: the fp32 master, optimizer states and gradient shards "
                "(and parameter shards with parameter offload).");
    if (r.host.nvme_per_node_bytes > 0)
      ImGui::TextDisabled("on NVMe per node: %s", bytes_text(r.host.nvme_per_node_bytes, unit).c_str());
  }
  ImGui::PushTextWrapPos(0.0f);  // notes are sentences (the versions' name the rule and its source)
  for (const auto& n : r.notes) ImGui::TextDisabled("note: %s", n.c_str());
  ImGui::PopTextWrapPos();
}

}  // namespace memsim::ui
