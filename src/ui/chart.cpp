#include "chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <initializer_list>

namespace memsim::ui {

namespace {

ChartRenderer* g_renderer = nullptr;

// The draw list keeps only a pointer to a queued chart, and ImGui renders after the panels have returned, so the
// charts live here until the next frame starts queueing (rendering always happens in between). A deque, because
// growing it must not move the charts already pointed to.
struct Queued {
  int frame = -1;
  std::deque<QuadChart> quads;
  std::deque<HeatmapChart> heatmaps;
};
Queued g_queued;

Queued& queued() {
  if (ImGui::GetFrameCount() != g_queued.frame) {
    g_queued.quads.clear();
    g_queued.heatmaps.clear();
    g_queued.frame = ImGui::GetFrameCount();
  }
  return g_queued;
}

bool target_of(const ImDrawCmd* cmd, ChartTarget& t) {
  const ImDrawData* dd = ImGui::GetDrawData();
  if (!dd) return false;
  t = {dd->DisplayPos.x, dd->DisplayPos.y, dd->DisplaySize.x, dd->DisplaySize.y, dd->FramebufferScale.x,
       dd->FramebufferScale.y, {cmd->ClipRect.x, cmd->ClipRect.y, cmd->ClipRect.z, cmd->ClipRect.w}};
  return true;
}

void render_quads(const ImDrawList*, const ImDrawCmd* cmd) {
  ChartTarget t;
  if (g_renderer && target_of(cmd, t)) g_renderer->draw(*static_cast<const QuadChart*>(cmd->UserCallbackData), t);
}

void render_heatmap(const ImDrawList*, const ImDrawCmd* cmd) {
  ChartTarget t;
  if (g_renderer && target_of(cmd, t)) g_renderer->draw(*static_cast<const HeatmapChart*>(cmd->UserCallbackData), t);
}

ImU32 mix(ImU32 a, ImU32 b, float t) {
  ImU32 out = 0;
  for (int shift = 0; shift < 32; shift += 8) {
    const float ca = static_cast<float>((a >> shift) & 0xFF), cb = static_cast<float>((b >> shift) & 0xFF);
    out |= static_cast<ImU32>(std::lround(ca + (cb - ca) * t)) << shift;
  }
  return out;
}

void draw_quads_now(ImDrawList* dl, const QuadChart& c) {
  const float sx = (c.rect.x1 - c.rect.x0) / (c.x_max - c.x_min), sy = (c.rect.y1 - c.rect.y0) / (c.y_max - c.y_min);
  for (const ChartQuad& q : c.quads)
    dl->AddRectFilled(ImVec2(c.rect.x0 + (q.x0 - c.x_min) * sx, c.rect.y1 - (q.y1 - c.y_min) * sy),
                      ImVec2(c.rect.x0 + (q.x1 - c.x_min) * sx, c.rect.y1 - (q.y0 - c.y_min) * sy), q.rgba);
}

// Mirrors shaders/heatmap.frag: cells, then the gaps that lie on the boundary.
void draw_heatmap_now(ImDrawList* dl, const HeatmapChart& c) {
  const float cw = (c.rect.x1 - c.rect.x0) / static_cast<float>(c.w), ch = (c.rect.y1 - c.rect.y0) / static_cast<float>(c.h);
  auto side = [&](int x, int y) {  // -1: no cell or no value, 0: within the boundary, 1: over it
    if (x >= c.w || y >= c.h) return -1;
    const float v = c.values[static_cast<size_t>(y * c.w + x)];
    return !(v >= c.scale.lo) ? -1 : v > c.boundary ? 1 : 0;
  };
  auto crosses = [](std::initializer_list<int> sides) {
    return std::find(sides.begin(), sides.end(), 0) != sides.end() && std::find(sides.begin(), sides.end(), 1) != sides.end();
  };
  for (int y = 0; y < c.h; ++y)
    for (int x = 0; x < c.w; ++x) {
      const float ax = c.rect.x0 + static_cast<float>(x) * cw, ay = c.rect.y0 + static_cast<float>(y) * ch;
      const float gx = ax + cw - c.gap, gy = ay + ch - c.gap;  // where the gaps start
      dl->AddRectFilled(ImVec2(ax, ay), ImVec2(gx, gy), scale_color(c.scale, c.values[static_cast<size_t>(y * c.w + x)]));
      if (crosses({side(x, y), side(x + 1, y)})) dl->AddRectFilled(ImVec2(gx, ay), ImVec2(ax + cw, gy), c.boundary_color);
      if (crosses({side(x, y), side(x, y + 1)})) dl->AddRectFilled(ImVec2(ax, gy), ImVec2(gx, ay + ch), c.boundary_color);
      if (crosses({side(x, y), side(x + 1, y), side(x, y + 1), side(x + 1, y + 1)}))
        dl->AddRectFilled(ImVec2(gx, gy), ImVec2(ax + cw, ay + ch), c.boundary_color);
    }
}

}  // namespace

ImU32 scale_color(const ColorScale& scale, float value) {
  if (!(value >= scale.lo)) return scale.missing;  // NaN too
  float lo = scale.lo;
  for (const ColorBand& b : scale.bands) {
    if (value <= b.hi) return mix(b.lo_color, b.hi_color, b.hi > lo ? (value - lo) / (b.hi - lo) : 0.0f);
    lo = b.hi;
  }
  return scale.bands.back().hi_color;
}

ImU32 blend_over(ImU32 top, ImU32 bottom) {
  auto channel = [](ImU32 c, int shift) { return static_cast<float>((c >> shift) & 0xFF) / 255.0f; };
  const float ta = channel(top, IM_COL32_A_SHIFT), ba = channel(bottom, IM_COL32_A_SHIFT);
  const float a = ta + ba - ta * ba;  // what the background keeps: (1 - ta) * (1 - ba) = 1 - a
  if (a <= 0) return 0;
  ImU32 out = static_cast<ImU32>(std::lround(a * 255.0f)) << IM_COL32_A_SHIFT;
  for (int shift : {IM_COL32_R_SHIFT, IM_COL32_G_SHIFT, IM_COL32_B_SHIFT}) {
    const float c = (channel(top, shift) * ta + channel(bottom, shift) * ba * (1 - ta)) / a;
    out |= static_cast<ImU32>(std::lround(std::clamp(c, 0.0f, 1.0f) * 255.0f)) << shift;
  }
  return out;
}

uint64_t chart_key(uint64_t version, std::initializer_list<uint64_t> parts) {
  if (version == 0) return 0;
  uint64_t key = 0xCBF29CE484222325ull ^ version;
  for (uint64_t part : parts) key = (key ^ part) * 0x100000001B3ull;  // FNV-1a over whole words
  return key | 1;
}

void set_chart_renderer(ChartRenderer* renderer) { g_renderer = renderer; }
ChartRenderer* chart_renderer() { return g_renderer; }

void add_chart(ImDrawList* dl, QuadChart chart) {
  if (!g_renderer) return draw_quads_now(dl, chart);
  Queued& q = queued();
  q.quads.push_back(std::move(chart));
  dl->AddCallback(render_quads, &q.quads.back());
  dl->AddCallback(ImDrawCallback_ResetRenderState, nullptr);  // the backend's own GL state again
}

void add_chart(ImDrawList* dl, HeatmapChart chart) {
  if (chart.w <= 0 || chart.h <= 0 || chart.values.size() != static_cast<size_t>(chart.w) * static_cast<size_t>(chart.h)) return;
  if (!g_renderer) return draw_heatmap_now(dl, chart);
  Queued& q = queued();
  q.heatmaps.push_back(std::move(chart));
  dl->AddCallback(render_heatmap, &q.heatmaps.back());
  dl->AddCallback(ImDrawCallback_ResetRenderState, nullptr);
}

std::vector<AxisTick> memory_axis(int64_t top_bytes, Unit unit, int max_ticks) {
  std::vector<AxisTick> ticks;
  if (top_bytes <= 0 || max_ticks < 1) return ticks;
  const double size = unit == Unit::GB ? 1e9 : unit == Unit::MiB ? 1024.0 * 1024.0 : 1024.0 * 1024.0 * 1024.0;
  const char* name = unit == Unit::GB ? "GB" : unit == Unit::MiB ? "MiB" : "GiB";
  const double top = static_cast<double>(top_bytes) / size;
  // The smallest round step that keeps the ticks within max_ticks.
  const double power = std::pow(10.0, std::floor(std::log10(top / max_ticks)));
  double step = 10 * power;
  for (double m : {1.0, 2.0, 5.0})
    if (std::floor(top / (m * power) + 1e-9) <= max_ticks) {
      step = m * power;
      break;
    }
  const int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  for (int k = 1; k * step <= top * (1 + 1e-12); ++k) {
    char label[48];
    std::snprintf(label, sizeof label, "%.*f %s", decimals, k * step, name);
    ticks.push_back({static_cast<int64_t>(std::llround(k * step * size)), label});
  }
  return ticks;
}

}  // namespace memsim::ui
