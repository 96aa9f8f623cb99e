// The step as a timeline: allocated and reserved bytes after every event, phases and the peak marked.
// The columns are quads for the chart renderer (chart.h); the phase labels, the usable line, the peak and the
// hover stay with ImGui.
#include <imgui.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>
#include <string>

#include "chart.h"
#include "colors.h"
#include "keyboard.h"
#include "panels.h"

namespace memsim::ui {

namespace {

const char* phase_of(const DeviceResult& d, uint32_t ev) {
  const char* name = "";
  for (const auto& p : d.program.phases)
    if (p.first_event <= ev) name = p.name.c_str();
  return name;
}

// The chart's columns: one per event, or, when events outnumber pixels, one per pixel holding the largest value of
// the events it covers, so a one-event spike still shows at its full height and a 100k-event step costs the GPU no
// more than a small one. Each column is up to three quads stacked without overlap: allocated from 0, the reserved
// rest above it, the empty frame above that; their colours are the translucent layers (frame, reserved over it,
// allocated over both) folded into one, so every pixel of the chart is blended once (chart.h, blend_over).
// Neighbouring columns of the same heights merge into one quad: a software rasteriser pays per triangle as much as
// per pixel.
QuadChart timeline_chart(const DeviceResult& d, ScreenRect rect, bool every_event) {
  const auto& tl = d.timeline;
  const size_t n = tl.size();
  const float width = rect.x1 - rect.x0;
  QuadChart chart;
  chart.rect = rect;
  chart.x_max = static_cast<float>(n);
  chart.y_max = static_cast<float>(static_cast<double>(std::max<int64_t>(1, d.peak.reserved_bytes)) * 1.08);
  const ImU32 frame = ImGui::GetColorU32(ImGuiCol_FrameBg);
  const ImU32 reserved = blend_over(kTimelineReserved, frame), allocated = blend_over(kTimelineAllocated, reserved);
  std::array<std::vector<ChartQuad>, 3> series;  // allocated, reserved above it, the frame above that
  auto add = [&](std::vector<ChartQuad>& s, float x0, float x1, float y0, float y1, ImU32 color) {
    if (y1 <= y0) return;
    const bool merge = !every_event || &s == &series[2];  // one column per event keeps its two data quads apart
    if (merge && !s.empty() && s.back().y0 == y0 && s.back().y1 == y1 && s.back().x1 == x0) s.back().x1 = x1;
    else s.push_back({x0, x1, y0, y1, color});
  };
  const size_t cols = every_event ? n : std::min(n, static_cast<size_t>(std::max(1, static_cast<int>(width))));
  for (size_t c = 0; c < cols; ++c) {
    const size_t a = c * n / cols, b = std::max(a + 1, (c + 1) * n / cols);
    int64_t alloc = 0, res = 0;
    for (size_t i = a; i < b; ++i) alloc = std::max(alloc, tl[i].allocated_bytes), res = std::max(res, tl[i].reserved_bytes);
    const float x0 = static_cast<float>(static_cast<double>(c) * static_cast<double>(n) / static_cast<double>(cols));
    const float x1 = static_cast<float>(static_cast<double>(c + 1) * static_cast<double>(n) / static_cast<double>(cols));
    const float ya = static_cast<float>(alloc), yr = std::max(ya, static_cast<float>(res));
    add(series[0], x0, x1, 0.0f, ya, allocated);
    add(series[1], x0, x1, ya, yr, reserved);
    add(series[2], x0, x1, yr, chart.y_max, frame);
  }
  for (auto& s : series) chart.quads.insert(chart.quads.end(), s.begin(), s.end());
  return chart;
}

}  // namespace

void draw_timeline_panel(const Result& r, Unit unit, uint64_t version, bool every_event) {
  if (!r.ok || r.devices.empty() || r.devices[0].timeline.empty()) {
    ImGui::TextDisabled("No timeline: fix the configuration first.");
    return;
  }
  const DeviceResult& d = r.devices[0];
  const auto& tl = d.timeline;
  const float width = ImGui::GetContentRegionAvail().x;
  const float height = std::max(120.0f, ImGui::GetContentRegionAvail().y - ImGui::GetTextLineHeightWithSpacing());
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  ImDrawList* dl = ImGui::GetWindowDrawList();
  ImGui::InvisibleButton("timeline", ImVec2(width, height));
  const bool hovered = ImGui::IsItemHovered();
  const bool focused = item_has_keyboard_focus();  // the keyboard shows the peak's moment
  announce_focus("Timeline of one step, " + std::to_string(tl.size()) + " events: the peak, " +
                     bytes_text(d.peak.allocated_bytes, unit) + " allocated, comes during " + d.peak_phase + ", at the allocation of " +
                     d.peak_label,
                 focused);

  const double top = static_cast<double>(std::max<int64_t>(1, d.peak.reserved_bytes)) * 1.08;
  const size_t n = tl.size();
  auto y_of = [&](int64_t b) { return p0.y + height - static_cast<float>(static_cast<double>(b) / top * height); };
  auto x_of = [&](size_t ev) { return p0.x + static_cast<float>(static_cast<double>(ev) / static_cast<double>(n) * width); };

  // The columns are rebuilt only when the result, the chart's size or the theme changed; the same key lets the
  // renderer keep them uploaded (chart.h).
  static QuadChart cached;
  static uint64_t cached_key = 0;
  const ScreenRect rect{p0.x, p0.y, p0.x + width, p0.y + height};
  const uint64_t key = chart_key(version, {static_cast<uint64_t>(width), static_cast<uint64_t>(height), every_event ? 1u : 0u,
                                           ImGui::GetColorU32(ImGuiCol_FrameBg)});
  if (key == 0 || key != cached_key) {
    cached = timeline_chart(d, rect, every_event);
    cached.key = key;
    cached_key = key;
  }
  QuadChart chart = cached;
  chart.rect = rect;  // the same size, possibly moved (the quads are in chart units)
  add_chart(dl, std::move(chart));

  // Phase boundaries and their names, over the columns.
  float last_label_x = -1e9f;
  for (const auto& ph : d.program.phases) {
    const float x = x_of(ph.first_event);
    dl->AddLine(ImVec2(x, p0.y), ImVec2(x, p0.y + height), IM_COL32(128, 128, 128, 60));
    if (x - last_label_x > 90.0f) {
      std::string short_name = ph.name.substr(0, ph.name.find(' '));
      dl->AddText(ImVec2(x + 3, p0.y + 2), IM_COL32(170, 170, 170, 200), short_name.c_str());
      last_label_x = x;
    }
  }
  // Usable line and the peak.
  if (static_cast<double>(d.usable_bytes) < top) {
    const float y = y_of(d.usable_bytes);
    dl->AddLine(ImVec2(p0.x, y), ImVec2(p0.x + width, y), IM_COL32(255, 220, 80, 200), 1.5f);
  }
  const ImVec2 peak(x_of(d.peak_event), y_of(d.peak.allocated_bytes));
  dl->AddCircleFilled(peak, 4.0f, IM_COL32(255, 90, 90, 255));
  dl->AddText(ImVec2(std::min(peak.x + 6, p0.x + width - 140), peak.y - 2), IM_COL32(255, 120, 120, 255),
              ("peak " + bytes_text(d.peak.allocated_bytes, unit)).c_str());

  if (focused) draw_focus_frame(p0.x, p0.y, p0.x + width, p0.y + height);
  if (hovered || focused) {
    const float mx = ImGui::GetIO().MousePos.x - p0.x;
    const size_t ev = hovered ? std::min(n - 1, static_cast<size_t>(std::max(0.0f, mx) / width * static_cast<float>(n)))
                              : std::min<size_t>(n - 1, d.peak_event);
    dl->AddLine(ImVec2(x_of(ev), p0.y), ImVec2(x_of(ev), p0.y + height), IM_COL32(255, 255, 255, 120));
    const Event& e = d.program.events[ev];
    const Tensor& t = d.program.tensors[e.tensor];
    // What is alive right after this event: replay the program up to it (a few microseconds per thousand
    // events), by component and the largest tensors.
    std::array<int64_t, kComponentCount> by_comp{};
    std::vector<uint8_t> alive(d.program.tensors.size(), 0);
    for (size_t i = 0; i <= ev; ++i) {
      const Event& x = d.program.events[i];
      alive[x.tensor] = x.op == Event::Op::Alloc;
      by_comp[static_cast<int>(x.component)] += (x.op == Event::Op::Alloc ? 1 : -1) * d.program.tensors[x.tensor].bytes;
    }
    std::vector<uint32_t> largest;
    for (uint32_t i = 0; i < alive.size(); ++i)
      if (alive[i]) largest.push_back(i);
    const size_t top = std::min<size_t>(6, largest.size());
    std::partial_sort(largest.begin(), largest.begin() + static_cast<long>(top), largest.end(),
                      [&](uint32_t a, uint32_t b) { return d.program.tensors[a].bytes > d.program.tensors[b].bytes; });
    ImGui::BeginTooltip();
    ImGui::Text("event %zu of %zu, %s", ev + 1, n, phase_of(d, static_cast<uint32_t>(ev)));
    ImGui::Text("%s %s: %s", e.op == Event::Op::Alloc ? "allocate" : "free", d.program.labels[t.label].c_str(),
                bytes_text(t.bytes, unit).c_str());
    ImGui::Text("allocated %s, reserved %s", bytes_text(tl[ev].allocated_bytes, unit).c_str(),
                bytes_text(tl[ev].reserved_bytes, unit).c_str());
    ImGui::Separator();
    ImGui::TextDisabled("alive now, by component (bytes requested):");
    for (int c = 0; c < kComponentCount; ++c)
      if (by_comp[c] > 0) ImGui::Text("  %-20s %s", component_label(static_cast<Component>(c)), bytes_text(by_comp[c], unit).c_str());
    ImGui::TextDisabled("largest live tensors:");
    for (size_t i = 0; i < top; ++i) {
      const Tensor& lt = d.program.tensors[largest[i]];
      if (lt.layer >= 0) ImGui::Text("  %s  layer %d: %s", bytes_text(lt.bytes, unit).c_str(), lt.layer, d.program.labels[lt.label].c_str());
      else ImGui::Text("  %s  %s", bytes_text(lt.bytes, unit).c_str(), d.program.labels[lt.label].c_str());
    }
    ImGui::EndTooltip();
  }
  ImGui::TextDisabled("blue: allocated   grey: reserved   yellow: usable   %zu events", n);
}

}  // namespace memsim::ui
