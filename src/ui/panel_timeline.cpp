// The step as a timeline: allocated and reserved bytes after every event, phases and the peak marked; and a run of
// varying shapes step by step (the Run view). The columns are quads for the chart renderer (chart.h); the labels,
// the usable line, the markers and the hover stay with ImGui.
#include <imgui.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>
#include <string>

#include "chart.h"
#include "colors.h"
#include "core/format.h"
#include "keyboard.h"
#include "panels.h"

namespace memsim::ui {

namespace {

// The timeline's scale: above the reserved peak and the verdict's nvidia-smi peak, whose line it draws too.
double timeline_top(const DeviceResult& d) {
  return static_cast<double>(std::max<int64_t>({1, d.peak.reserved_bytes, d.peak.device_bytes})) * 1.08;
}

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
  chart.y_max = static_cast<float>(timeline_top(d));
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

// The run's colour for tokens, over the frame like the memory series.
constexpr ImU32 kRunTokens = IM_COL32(235, 150, 60, 210);

// Columns over `n` values in `width` pixels: one per value, or one per pixel covering several (its largest value
// stands for them, as the step's timeline does). Calls column(x0, x1, first, end) in chart units (values).
template <typename Column>
void for_each_column(size_t n, float width, Column column) {
  const size_t cols = std::min(n, static_cast<size_t>(std::max(1, static_cast<int>(width))));
  for (size_t c = 0; c < cols; ++c) {
    const size_t a = c * n / cols, b = std::max(a + 1, (c + 1) * n / cols);
    column(static_cast<float>(static_cast<double>(c) * static_cast<double>(n) / static_cast<double>(cols)),
           static_cast<float>(static_cast<double>(c + 1) * static_cast<double>(n) / static_cast<double>(cols)), a, b);
  }
}

// Appends a quad, merged into the last one when it continues it at the same heights (fewer quads to rasterise).
void add_merged(std::vector<ChartQuad>& s, float x0, float x1, float y0, float y1, ImU32 color) {
  if (y1 <= y0) return;
  if (!s.empty() && s.back().y0 == y0 && s.back().y1 == y1 && s.back().x1 == x0) s.back().x1 = x1;
  else s.push_back({x0, x1, y0, y1, color});
}

// Each step's allocated peak over its reserved peak, on a scale from `lo` to `hi` bytes: chart units are bytes above
// `lo`, so that float keeps its precision where the steps differ by megabytes over tens of gigabytes.
QuadChart run_memory_chart(const RunTrace& run, ScreenRect rect, int64_t lo, int64_t hi) {
  QuadChart chart;
  chart.rect = rect;
  const size_t n = run.per_step.size();
  chart.x_max = static_cast<float>(n);
  chart.y_max = static_cast<float>(hi - lo);
  const ImU32 frame = ImGui::GetColorU32(ImGuiCol_FrameBg);
  const ImU32 reserved = blend_over(kTimelineReserved, frame), allocated = blend_over(kTimelineAllocated, reserved);
  std::array<std::vector<ChartQuad>, 3> series;
  for_each_column(n, rect.x1 - rect.x0, [&](float x0, float x1, size_t a, size_t b) {
    int64_t alloc = 0, res = 0;
    for (size_t i = a; i < b; ++i)
      alloc = std::max(alloc, run.per_step[i].allocated_bytes), res = std::max(res, run.per_step[i].reserved_bytes);
    const float ya = static_cast<float>(std::max<int64_t>(0, alloc - lo)), yr = std::max(ya, static_cast<float>(res - lo));
    add_merged(series[0], x0, x1, 0.0f, ya, allocated);
    add_merged(series[1], x0, x1, ya, yr, reserved);
    add_merged(series[2], x0, x1, yr, chart.y_max, frame);
  });
  for (auto& s : series) chart.quads.insert(chart.quads.end(), s.begin(), s.end());
  return chart;
}

// Each step's longest micro-batch, in tokens per row, from 0 to `top`.
QuadChart run_tokens_chart(const RunTrace& run, ScreenRect rect, int64_t top) {
  QuadChart chart;
  chart.rect = rect;
  const size_t n = run.per_step.size();
  chart.x_max = static_cast<float>(n);
  chart.y_max = static_cast<float>(top);
  const ImU32 frame = ImGui::GetColorU32(ImGuiCol_FrameBg), tokens = blend_over(kRunTokens, frame);
  std::array<std::vector<ChartQuad>, 2> series;
  for_each_column(n, rect.x1 - rect.x0, [&](float x0, float x1, size_t a, size_t b) {
    int64_t t = 0;
    for (size_t i = a; i < b; ++i) t = std::max(t, run.per_step[i].tokens);
    add_merged(series[0], x0, x1, 0.0f, static_cast<float>(t), tokens);
    add_merged(series[1], x0, x1, static_cast<float>(t), chart.y_max, frame);
  });
  for (auto& s : series) chart.quads.insert(chart.quads.end(), s.begin(), s.end());
  return chart;
}

}  // namespace

void draw_run_panel(const Result& r, Unit unit, uint64_t version) {
  if (!r.ok || r.devices.empty() || r.devices[0].run.per_step.empty()) {
    ImGui::TextDisabled("No run: the data section's lengths are fixed.");
    return;
  }
  const DeviceResult& d = r.devices[0];
  const RunTrace& run = d.run;
  const auto& steps = run.per_step;
  const size_t n = steps.size();
  const float width = ImGui::GetContentRegionAvail().x;
  // The legend under the chart wraps in a narrow window: the chart leaves it the lines it needs.
  const std::string legend = "blue: each step's allocated peak   grey: reserved   orange: its longest micro-batch   " +
                             format_count(run.steps) + " steps";
  const float legend_h = ImGui::CalcTextSize(legend.c_str(), nullptr, false, width).y + ImGui::GetStyle().ItemSpacing.y;
  const float height = std::max(120.0f, ImGui::GetContentRegionAvail().y - legend_h);
  const float gap = 6.0f, mem_h = std::floor((height - gap) * 0.7f), tok_h = height - gap - mem_h;
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  const ScreenRect mem_rect{p0.x, p0.y, p0.x + width, p0.y + mem_h};
  const ScreenRect tok_rect{p0.x, p0.y + mem_h + gap, p0.x + width, p0.y + height};
  ImDrawList* dl = ImGui::GetWindowDrawList();
  ImGui::InvisibleButton("run", ImVec2(width, height));
  const bool hovered = ImGui::IsItemHovered();
  const bool focused = item_has_keyboard_focus();
  const std::string summary = describe_run(run, unit, unit == Unit::MiB ? 0 : 2);
  announce_focus("Run of " + format_count(run.steps) + " steps, one column each: " + summary, focused);

  // The memory scale starts below the smallest allocated peak rather than at 0: the steps differ by far less than
  // the weights and states they share, and the axis labels say where it starts.
  int64_t min_alloc = INT64_MAX, max_res = 0, max_tokens = 1;
  for (const auto& s : steps)
    min_alloc = std::min(min_alloc, s.allocated_bytes), max_res = std::max(max_res, s.reserved_bytes),
    max_tokens = std::max(max_tokens, s.tokens);
  max_res = std::max(max_res, min_alloc + 1);
  const int64_t span = max_res - min_alloc;
  int64_t lo = std::max<int64_t>(0, min_alloc - std::max<int64_t>(span / 4, min_alloc / 50));
  if (lo < min_alloc / 2) lo = 0;  // a scale that would start low anyway starts at 0
  const int64_t hi = max_res + std::max<int64_t>(1, (max_res - lo) / 12);
  const int64_t tok_top = max_tokens + std::max<int64_t>(1, max_tokens / 12);

  static QuadChart cached_mem, cached_tok;
  static uint64_t cached_key = 0;
  const uint64_t key = chart_key(version, {static_cast<uint64_t>(width), static_cast<uint64_t>(height), 0x52554eu,
                                           ImGui::GetColorU32(ImGuiCol_FrameBg)});
  if (key == 0 || key != cached_key) {
    cached_mem = run_memory_chart(run, mem_rect, lo, hi);
    cached_tok = run_tokens_chart(run, tok_rect, tok_top);
    cached_mem.key = key;
    cached_tok.key = chart_key(key, {2});
    cached_key = key;
  }
  QuadChart mem = cached_mem, tok = cached_tok;
  mem.rect = mem_rect;  // the same size, possibly moved
  tok.rect = tok_rect;
  add_chart(dl, std::move(mem));
  add_chart(dl, std::move(tok));

  auto x_of = [&](int64_t step) {  // the middle of a step's column (steps count from 1)
    return p0.x + static_cast<float>((static_cast<double>(step) - 0.5) / static_cast<double>(n) * width);
  };
  auto y_mem = [&](int64_t bytes) {
    return mem_rect.y1 - static_cast<float>(static_cast<double>(bytes - lo) / static_cast<double>(hi - lo) * mem_h);
  };
  auto y_tok = [&](int64_t t) { return tok_rect.y1 - static_cast<float>(static_cast<double>(t) / static_cast<double>(tok_top) * tok_h); };
  const ImU32 label = IM_COL32(170, 170, 170, 220);
  const std::string hi_text = bytes_text(hi, unit), lo_text = bytes_text(lo, unit), tok_text = format_count(tok_top) + " tokens";
  dl->AddText(ImVec2(p0.x + 3, mem_rect.y0 + 2), label, hi_text.c_str());
  dl->AddText(ImVec2(p0.x + 3, mem_rect.y1 - ImGui::GetTextLineHeight() - 1), label, lo_text.c_str());
  dl->AddText(ImVec2(p0.x + 3, tok_rect.y0 + 1), label, tok_text.c_str());
  // The markers' labels keep clear of the axis labels on the left and of the chart's right edge.
  const float left = p0.x + 10 + std::max(ImGui::CalcTextSize(hi_text.c_str()).x, ImGui::CalcTextSize(tok_text.c_str()).x);
  auto label_x = [&](float want, const std::string& text) {
    return std::max(left, std::min(want, p0.x + width - ImGui::CalcTextSize(text.c_str()).x - 2));
  };
  if (d.usable_bytes > lo && d.usable_bytes < hi) {
    const float y = y_mem(d.usable_bytes);
    dl->AddLine(ImVec2(p0.x, y), ImVec2(p0.x + width, y), IM_COL32(255, 220, 80, 200), 1.5f);
  }
  // The markers: where the run's reserved peak is first reached, the allocated peak, and the longest sample.
  const bool valid_step = [&] {
    for (int64_t s : {run.allocated_peak_step, run.reserved_peak_step})
      if (s < 1 || s > static_cast<int64_t>(n)) return false;
    return true;
  }();
  if (valid_step) {
    const float xr = x_of(run.reserved_peak_step);
    dl->AddLine(ImVec2(xr, mem_rect.y0), ImVec2(xr, mem_rect.y1), IM_COL32(220, 220, 220, 150), 1.0f);
    const std::string res_text = "reserved peak, step " + format_count(run.reserved_peak_step);
    dl->AddText(ImVec2(label_x(xr + 4, res_text), mem_rect.y0 + 2), IM_COL32(220, 220, 220, 230), res_text.c_str());
    const float xa = x_of(run.allocated_peak_step);
    dl->AddLine(ImVec2(xa, mem_rect.y0), ImVec2(xa, tok_rect.y1), IM_COL32(255, 90, 90, 170), 1.0f);
    const ImVec2 peak(xa, y_mem(steps[static_cast<size_t>(run.allocated_peak_step - 1)].allocated_bytes));
    dl->AddCircleFilled(peak, 4.0f, IM_COL32(255, 90, 90, 255));
    const std::string peak_text = "allocated peak " + bytes_text(d.peak.allocated_bytes, unit) + ", step " + format_count(run.allocated_peak_step);
    dl->AddText(ImVec2(label_x(peak.x + 6, peak_text), std::max(peak.y - 2, mem_rect.y0 + ImGui::GetTextLineHeight() + 4)),
                IM_COL32(255, 120, 120, 255), peak_text.c_str());
  }
  if (run.longest_step >= 1 && run.longest_step <= static_cast<int64_t>(n)) {
    const float xl = x_of(run.longest_step);
    const ImVec2 top(xl, y_tok(steps[static_cast<size_t>(run.longest_step - 1)].tokens));
    dl->AddTriangleFilled(ImVec2(top.x - 5, top.y - 8), ImVec2(top.x + 5, top.y - 8), top, IM_COL32(255, 220, 80, 255));
    const std::string longest = "longest sample (" + format_count(run.longest_tokens) + "), step " + format_count(run.longest_step);
    dl->AddText(ImVec2(label_x(top.x + 8, longest), tok_rect.y0 + 1), IM_COL32(255, 220, 80, 255), longest.c_str());
  }

  if (focused) draw_focus_frame(p0.x, p0.y, p0.x + width, p0.y + height);
  if (hovered || focused) {
    const float mx = ImGui::GetIO().MousePos.x - p0.x;
    const int64_t step = hovered ? 1 + std::min<int64_t>(static_cast<int64_t>(n) - 1,
                                                         static_cast<int64_t>(std::max(0.0f, mx) / width * static_cast<float>(n)))
                                 : std::clamp<int64_t>(run.allocated_peak_step, 1, static_cast<int64_t>(n));
    const float x = x_of(step);
    dl->AddLine(ImVec2(x, p0.y), ImVec2(x, p0.y + height), IM_COL32(255, 255, 255, 120));
    const RunStepPoint& s = steps[static_cast<size_t>(step - 1)];
    ImGui::BeginTooltip();
    ImGui::Text("step %s of %s", format_count(step).c_str(), format_count(run.steps).c_str());
    ImGui::Text("longest micro-batch: %s tokens a row", format_count(s.tokens).c_str());
    ImGui::Text("allocated peak %s, reserved %s", bytes_text(s.allocated_bytes, unit).c_str(), bytes_text(s.reserved_bytes, unit).c_str());
    if (step == run.allocated_peak_step) ImGui::TextColored(ImVec4(1.0f, 0.5f, 0.5f, 1), "the run's allocated peak");
    if (step == run.reserved_peak_step) ImGui::TextDisabled("the run's reserved peak is first reached here");
    if (step == run.longest_step)
      ImGui::TextColored(ImVec4(1.0f, 0.86f, 0.3f, 1), "holds the run's longest sample (%s tokens)", format_count(run.longest_tokens).c_str());
    if (focused) {
      ImGui::Separator();
      ImGui::PushTextWrapPos(ImGui::GetFontSize() * 30.0f);
      ImGui::TextUnformatted(summary.c_str());
      ImGui::PopTextWrapPos();
    }
    ImGui::EndTooltip();
  }
  ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
  ImGui::TextWrapped("%s", legend.c_str());
  ImGui::PopStyleColor();
}

void draw_timeline_panel(const Result& r, Unit unit, uint64_t version, bool every_event) {
  if (!r.ok || r.devices.empty() || r.devices[0].timeline.empty()) {
    ImGui::TextDisabled("No timeline: fix the configuration first.");
    return;
  }
  const DeviceResult& d = r.devices[0];
  const auto& tl = d.timeline;
  const size_t n = tl.size();
  const float width = ImGui::GetContentRegionAvail().x;
  // The legend names each statistic and its peak, the verdict's among them (core/format.h), and wraps in a narrow
  // window: the chart leaves it the lines it needs.
  const std::string legend = "blue: allocated   grey: reserved   white: nvidia-smi (the verdict's)   yellow: usable   " +
                             std::to_string(n) + " events\n" + describe_peaks(d, unit, unit == Unit::MiB ? 0 : 2);
  const float legend_h = ImGui::CalcTextSize(legend.c_str(), nullptr, false, width).y + ImGui::GetStyle().ItemSpacing.y;
  const float height = std::max(120.0f, ImGui::GetContentRegionAvail().y - legend_h);
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  ImDrawList* dl = ImGui::GetWindowDrawList();
  ImGui::InvisibleButton("timeline", ImVec2(width, height));
  const bool hovered = ImGui::IsItemHovered();
  const bool focused = item_has_keyboard_focus();  // the keyboard shows the peak's moment
  announce_focus("Timeline of one step, " + std::to_string(tl.size()) + " events: the peak, " +
                     bytes_text(d.peak.allocated_bytes, unit) + " allocated, comes during " + d.peak_phase + ", at the allocation of " +
                     d.peak_label + ". " + describe_peaks(d, unit, unit == Unit::MiB ? 0 : 2) + ".",
                 focused);

  const double top = timeline_top(d);
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

  // The y-axis: a faint line and its label at round steps of the unit, under the phase names along the top.
  const float line_h = ImGui::GetTextLineHeight();
  for (const AxisTick& t : memory_axis(static_cast<int64_t>(top), unit, std::clamp(static_cast<int>(height / (2.5f * line_h)), 1, 8))) {
    const float y = y_of(t.bytes);
    dl->AddLine(ImVec2(p0.x, y), ImVec2(p0.x + width, y), IM_COL32(200, 200, 200, 40));
    if (y - line_h * 0.5f > p0.y + line_h + 2) dl->AddText(ImVec2(p0.x + 3, y - line_h * 0.5f), IM_COL32(190, 190, 190, 220), t.label.c_str());
  }
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
  // Usable line, the verdict's statistic (nvidia-smi: reserved plus what lives outside the allocator) and the peak.
  if (static_cast<double>(d.usable_bytes) < top) {
    const float y = y_of(d.usable_bytes);
    dl->AddLine(ImVec2(p0.x, y), ImVec2(p0.x + width, y), IM_COL32(255, 220, 80, 200), 1.5f);
  }
  ImVec2 device_at, device_size;  // the nvidia-smi label's place, which the allocated peak's label keeps clear of
  {
    const float y = y_of(d.peak.device_bytes);
    dl->AddLine(ImVec2(p0.x, y), ImVec2(p0.x + width, y), IM_COL32(235, 235, 235, 170), 1.0f);
    const std::string text = "nvidia-smi peak " + bytes_text(d.peak.device_bytes, unit) + " (the verdict's)";
    device_size = ImGui::CalcTextSize(text.c_str());
    // Under the line, at the right: the phase names run along the top.
    device_at = ImVec2(std::max(p0.x + 3, p0.x + width - device_size.x - 4), y + 2);
    dl->AddText(device_at, IM_COL32(235, 235, 235, 230), text.c_str());
  }
  const ImVec2 peak(x_of(d.peak_event), y_of(d.peak.allocated_bytes));
  dl->AddCircleFilled(peak, 4.0f, IM_COL32(255, 90, 90, 255));
  {
    const std::string text = "allocated peak " + bytes_text(d.peak.allocated_bytes, unit);
    const ImVec2 size = ImGui::CalcTextSize(text.c_str());
    ImVec2 at(std::max(p0.x + 3, std::min(peak.x + 6, p0.x + width - size.x - 4)), peak.y - 2);
    // The two peaks are often a few pixels apart: where the labels would overlap, this one goes under the other.
    const bool overlap = at.x < device_at.x + device_size.x && device_at.x < at.x + size.x && at.y < device_at.y + device_size.y &&
                         device_at.y < at.y + size.y;
    if (overlap) at.y = device_at.y + device_size.y + 1;
    dl->AddText(at, IM_COL32(255, 120, 120, 255), text.c_str());
  }

  if (focused) draw_focus_frame(p0.x, p0.y, p0.x + width, p0.y + height);
  if (hovered || focused) {
    const float mx = ImGui::GetIO().MousePos.x - p0.x;
    const size_t ev = hovered ? std::min(n - 1, static_cast<size_t>(std::max(0.0f, mx) / width * static_cast<float>(n)))
                              : std::min<size_t>(n - 1, d.peak_event);
    dl->AddLine(ImVec2(x_of(ev), p0.y), ImVec2(x_of(ev), p0.y + height), IM_COL32(255, 255, 255, 120));
    const Event& e = d.program.events[ev];
    const bool release = e.op == Event::Op::EmptyCache;  // names no tensor
    const Tensor& t = d.program.tensors[release ? 0 : e.tensor];
    // What is alive right after this event: replay the program up to it (a few microseconds per thousand
    // events), by component and the largest tensors.
    std::array<int64_t, kComponentCount> by_comp{};
    std::vector<uint8_t> alive(d.program.tensors.size(), 0);
    for (size_t i = 0; i <= ev; ++i) {
      const Event& x = d.program.events[i];
      if (x.op == Event::Op::EmptyCache) continue;
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
    if (release) ImGui::TextUnformatted("torch.cuda.empty_cache(): the cached segments go back to the driver");
    else ImGui::Text("%s %s: %s", e.op == Event::Op::Alloc ? "allocate" : "free", d.program.labels[t.label].c_str(),
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
  ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
  ImGui::TextWrapped("%s", legend.c_str());
  ImGui::PopStyleColor();
}

}  // namespace memsim::ui
