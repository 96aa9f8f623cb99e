// The charts' path from the panels to a renderer, without GL: a recording renderer stands in for the platform's
// and the test plays the draw lists' callbacks as ImGui's GL backend would.
#include <catch2/catch.hpp>
#include <imgui.h>

#include <algorithm>
#include <vector>

#include "headless.h"
#include "ui/app.h"
#include "ui/bench.h"
#include "ui/chart.h"

using namespace memsim;

namespace {

struct Recorder final : ui::ChartRenderer {
  std::vector<ui::QuadChart> quads;
  std::vector<ui::HeatmapChart> heatmaps;
  void draw(const ui::QuadChart& c, const ui::ChartTarget&) override { quads.push_back(c); }
  void draw(const ui::HeatmapChart& c, const ui::ChartTarget&) override { heatmaps.push_back(c); }
};

// Registers the recorder for its lifetime, so a failing check cannot leave it behind for later tests.
struct Registered {
  explicit Registered(ui::ChartRenderer* r) { ui::set_chart_renderer(r); }
  ~Registered() { ui::set_chart_renderer(nullptr); }
};

// What ImGui_ImplOpenGL3_RenderDrawData does with callbacks; returns how many it ran and checks that each chart
// is followed by the request to reset the backend's state.
int play_callbacks() {
  int played = 0;
  const ImDrawData* dd = ImGui::GetDrawData();
  for (int n = 0; n < dd->CmdListsCount; ++n) {
    const ImDrawList* list = dd->CmdLists[n];
    for (int i = 0; i < list->CmdBuffer.Size; ++i) {
      const ImDrawCmd& cmd = list->CmdBuffer[i];
      if (!cmd.UserCallback || cmd.UserCallback == ImDrawCallback_ResetRenderState) continue;
      cmd.UserCallback(list, &cmd);
      ++played;
      REQUIRE(i + 1 < list->CmdBuffer.Size);
      CHECK(list->CmdBuffer[i + 1].UserCallback == ImDrawCallback_ResetRenderState);
    }
  }
  return played;
}

std::vector<ui::ChartQuad> series(const ui::QuadChart& c, ImU32 color) {
  std::vector<ui::ChartQuad> out;
  std::copy_if(c.quads.begin(), c.quads.end(), std::back_inserter(out), [&](const ui::ChartQuad& q) { return q.rgba == color; });
  return out;
}

}  // namespace

TEST_CASE("without a renderer the charts are drawn by the draw list", "[ui][chart]") {
  REQUIRE(ui::chart_renderer() == nullptr);
  HeadlessImGui gui(1280, 720);
  ui::App app({});
  CHECK(gui.frame(app) > 1000);
  CHECK(play_callbacks() == 0);
}

TEST_CASE("with a renderer the timeline is one chart of tiling columns that keep every spike", "[ui][chart]") {
  Recorder rec;
  Registered on(&rec);
  HeadlessImGui gui(1280, 720);
  ui::App app({});
  app.show_result(ui::synthetic_step(50000));
  gui.frame(app);
  CHECK(play_callbacks() == 1);
  REQUIRE(rec.quads.size() == 1);
  const ui::QuadChart& c = rec.quads[0];
  const DeviceResult& d = app.result().devices[0];
  CHECK(c.x_max == 50000.0f);
  CHECK(c.y_max > static_cast<float>(d.peak.reserved_bytes));
  // At most one column per pixel for each series, however many events.
  CHECK(c.quads.size() <= 2 * static_cast<size_t>(c.rect.x1 - c.rect.x0));
  for (ImU32 color : {IM_COL32(140, 140, 140, 90), IM_COL32(76, 150, 230, 200)}) {
    const auto s = series(c, color);
    REQUIRE(!s.empty());
    CHECK(s.front().x0 == 0.0f);
    CHECK(s.back().x1 == c.x_max);
    for (size_t i = 1; i < s.size(); ++i) CHECK(s[i].x0 == s[i - 1].x1);  // no gap, no overlap
  }
  // The tallest allocated column is the peak itself, though it lasts one event of the 50,000.
  const auto allocated = series(c, IM_COL32(76, 150, 230, 200));
  const float tallest = std::max_element(allocated.begin(), allocated.end(), [](auto& a, auto& b) { return a.y1 < b.y1; })->y1;
  CHECK(tallest == static_cast<float>(d.peak.allocated_bytes));
}

TEST_CASE("the fit explorer hands its cells to the renderer as one grid", "[ui][chart]") {
  Recorder rec;
  Registered on(&rec);
  HeadlessImGui gui(1280, 720);
  ui::App app({});
  REQUIRE(app.show_view("explorer"));
  bool computed = false;
  for (int i = 0; i < 200 && !computed; ++i) {  // the tab opens on the next frame, then fills a few cells a frame
    rec.heatmaps.clear();
    gui.frame(app);
    play_callbacks();
    REQUIRE(rec.heatmaps.size() <= 1);
    const auto& v = rec.heatmaps.empty() ? std::vector<float>{-1} : rec.heatmaps[0].values;
    computed = std::none_of(v.begin(), v.end(), [](float x) { return x < 0; });
  }
  REQUIRE(computed);
  const ui::HeatmapChart& h = rec.heatmaps[0];
  CHECK(h.w * h.h == static_cast<int>(h.values.size()));
  CHECK(h.boundary == 1.0f);
  // The default setup fits at micro-batch 1 x sequence 512 (top left) and not at 32 x 32768 (bottom right).
  CHECK(h.values.front() <= 1.0f);
  CHECK(h.values.back() > 1.0f);
}

TEST_CASE("the heatmap's colour scale keeps the explorer's colours", "[ui][chart]") {
  ui::ColorScale s;
  s.bands = {{{0.8f, IM_COL32(50, 204, 70, 255), IM_COL32(50, 140, 70, 255)},
              {1.0f, IM_COL32(200, 170, 50, 255), IM_COL32(200, 170, 50, 255)},
              {1.5f, IM_COL32(190, 60, 60, 255), IM_COL32(190, 40, 60, 255)}}};
  s.missing = IM_COL32(60, 60, 60, 255);
  CHECK(ui::scale_color(s, 0.0f) == IM_COL32(50, 204, 70, 255));
  CHECK(ui::scale_color(s, 0.4f) == IM_COL32(50, 172, 70, 255));
  CHECK(ui::scale_color(s, 0.9f) == IM_COL32(200, 170, 50, 255));
  CHECK(ui::scale_color(s, 1.0f) == IM_COL32(200, 170, 50, 255));  // exactly the usable memory still fits
  CHECK(ui::scale_color(s, 1.25f) == IM_COL32(190, 50, 60, 255));
  CHECK(ui::scale_color(s, 9.0f) == IM_COL32(190, 40, 60, 255));
  CHECK(ui::scale_color(s, -1.0f) == s.missing);
}
