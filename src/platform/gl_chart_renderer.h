// The chart renderer of both apps: GL 3.3 core on the desktop and WebGL2 in the page, from this one source and
// the shaders in shaders/ (embedded at build time). Platform layer: the UI sees only ui::ChartRenderer.
#pragma once
#include <array>
#include <cstdint>
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
  long quad_draws() const { return quad_draws_; }      // quad charts: the timeline and the breakdown bars
  long quad_uploads() const { return quad_uploads_; }  // instance data sent to the GPU; a keyed chart only once
  long heatmap_draws() const { return heatmap_draws_; }

  void draw(const ui::QuadChart& chart, const ui::ChartTarget& target) override;
  void draw(const ui::HeatmapChart& chart, const ui::ChartTarget& target) override;

 private:
  unsigned quad_program_ = 0, heat_program_ = 0;
  unsigned heat_vao_ = 0, texture_ = 0;
  // The instances of the last few charts, each in a buffer of its own with its VAO: a chart whose key matches one
  // of them is drawn from it without uploading (ui::QuadChart::key).
  struct QuadBuffer {
    uint64_t key = 0;
    unsigned vao = 0, vbo = 0;
    long used = 0;  // when it was last drawn, for reuse of the least recent
  };
  std::array<QuadBuffer, 8> quad_buffers_{};
  struct QuadUniforms {
    int view, rect, display, scale;
  } qu_{};
  struct HeatUniforms {
    int values, grid, cell, gap, lo, band_hi, band_lo_color, band_hi_color, missing, boundary, boundary_color, rect, display;
  } hu_{};
  std::string error_;
  long quad_draws_ = 0, quad_uploads_ = 0, heatmap_draws_ = 0;
};

}  // namespace memsim::platform
