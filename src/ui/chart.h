// Charts as plain data. A panel describes the bulk geometry of a chart (the timeline's columns, the explorer's
// cells) and hands it to add_chart(). Where the platform registered a ChartRenderer, the chart is queued into the
// draw list as a callback and drawn by the platform's shaders (shaders/) when ImGui renders; elsewhere (unit
// tests, a shader that did not compile) the same data is drawn with ImGui's draw list, so a chart never blanks.
// Text, markers and hover stay with ImGui. This header knows nothing of GL: the dependency points from the
// platform to the UI.
#pragma once
#include <imgui.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/format.h"

namespace memsim::ui {

// ImGui screen coordinates (top-left origin), as ImGui's own rectangles.
struct ScreenRect {
  float x0 = 0, y0 = 0, x1 = 0, y1 = 0;
};

// A rectangle in chart units. rgba is ImGui's packed colour (IM_COL32), so its bytes in memory are R, G, B, A:
// the renderer reads them as a normalised vertex attribute.
struct ChartQuad {
  float x0, x1, y0, y1;
  ImU32 rgba;
};

// Quads in chart units with the window onto them: the view's (x_min, y_min) lands on the bottom-left corner of
// `rect` and (x_max, y_max) on its top-right. Quads that share an edge tile without overlap or gap, which is
// what lets translucent colours look the same drawn by either path.
struct QuadChart {
  ScreenRect rect;
  float x_min = 0, x_max = 1, y_min = 0, y_max = 1;
  std::vector<ChartQuad> quads;
  // Nonzero: names these quads. A chart with the key of an earlier one has the same quads, so a renderer may draw
  // the copy it already holds instead of uploading them again. 0: new quads every time.
  uint64_t key = 0;
};

// A piecewise-linear colour scale. Band i covers (hi of band i-1, hi] (the first starts at `lo`) and blends from
// lo_color to hi_color; values above the last band take its hi_color, values below `lo` mean "no value".
struct ColorBand {
  float hi;
  ImU32 lo_color, hi_color;
};
struct ColorScale {
  static constexpr int kBands = 3;  // the heatmap shader declares arrays of this size
  float lo = 0;
  std::array<ColorBand, kBands> bands{};
  ImU32 missing = 0;
};
ImU32 scale_color(const ColorScale& scale, float value);

// The one colour that, blended once over any opaque background (straight alpha, as ImGui's backends blend), looks
// like `top` blended over `bottom` blended over that background. Charts use it to draw stacked translucent layers as
// one layer of quads that do not overlap: a software rasteriser pays for every blended pixel.
ImU32 blend_over(ImU32 top, ImU32 bottom);

// A grid of values, row 0 on top. Each cell is the grid's rect divided by (w, h), less `gap` pixels on its right
// and bottom. Where two neighbouring cells lie on either side of `boundary` (one <= it, one above), the gap
// between them is drawn in boundary_color: the line where the setup stops fitting.
struct HeatmapChart {
  ScreenRect rect;
  int w = 0, h = 0;
  std::vector<float> values;
  float gap = 2;
  ColorScale scale;
  float boundary = 1;
  ImU32 boundary_color = 0;
};

// Where ImGui is rendering when a queued chart's turn comes: its display (the projection the backend uses), the
// framebuffer scale, and the clip rectangle of the draw command, all in ImGui coordinates.
struct ChartTarget {
  float display_x, display_y, display_w, display_h;
  float scale_x, scale_y;
  ScreenRect clip;
};

class ChartRenderer {
 public:
  virtual ~ChartRenderer() = default;
  virtual void draw(const QuadChart& chart, const ChartTarget& target) = 0;
  virtual void draw(const HeatmapChart& chart, const ChartTarget& target) = 0;
};

// The y-axis of a memory chart: ticks at round steps of `unit` (1, 2 or 5 times a power of ten: 10 GiB, 20 GiB, ...)
// above 0 and up to top_bytes, at most max_ticks of them, each with its bytes and its label ("20 GiB", "0.5 GiB").
struct AxisTick {
  int64_t bytes;
  std::string label;
};
std::vector<AxisTick> memory_axis(int64_t top_bytes, Unit unit, int max_ticks);

// A QuadChart key from the version of the data it shows and what else shapes its quads (size, colours, index):
// nonzero, and the same for the same inputs. A version of 0 means "unknown" and gives 0: upload every time.
uint64_t chart_key(uint64_t version, std::initializer_list<uint64_t> parts);

// The platform registers its renderer once its shaders have compiled; nullptr returns to the draw-list path.
void set_chart_renderer(ChartRenderer* renderer);
ChartRenderer* chart_renderer();

// Draws the chart at this point of the draw list's order: queued for the renderer, or drawn right away.
void add_chart(ImDrawList* dl, QuadChart chart);
void add_chart(ImDrawList* dl, HeatmapChart chart);

}  // namespace memsim::ui
