// The chart renderer of both apps: GL 3.3 core on the desktop and WebGL2 in the page, from this one source and
// the shaders in shaders/ (embedded at build time). Platform layer: the UI sees only ui::ChartRenderer.
#pragma once
#include <string>

#include "ui/chart.h"

namespace memsim::platform {

class GlChartRenderer final : public ui::ChartRenderer {
 public:
  GlChartRenderer() = default;
  ~GlChartRenderer() override;  // needs the context it was made in still current
  GlChartRenderer(const GlChartRenderer&) = delete;
  GlChartRenderer& operator=(const GlChartRenderer&) = delete;

  // Compiles and links the shaders in the current context. False, with error() saying why, when this GL cannot
  // build them; the caller then keeps the draw-list fallback.
  bool init();
  const std::string& error() const { return error_; }
  static const char* api();  // "GL 3.3 core" or "WebGL2"
  long quad_draws() const { return quad_draws_; }
  long heatmap_draws() const { return heatmap_draws_; }

  void draw(const ui::QuadChart& chart, const ui::ChartTarget& target) override;
  void draw(const ui::HeatmapChart& chart, const ui::ChartTarget& target) override;

 private:
  unsigned quad_program_ = 0, heat_program_ = 0;
  unsigned quad_vao_ = 0, quad_vbo_ = 0, heat_vao_ = 0, texture_ = 0;
  struct QuadUniforms {
    int view, rect, display, scale;
  } qu_{};
  struct HeatUniforms {
    int values, grid, cell, gap, lo, band_hi, band_lo_color, band_hi_color, missing, boundary, boundary_color, rect, display;
  } hu_{};
  std::string error_;
  long quad_draws_ = 0, heatmap_draws_ = 0;
};

}  // namespace memsim::platform
