// The charts' path from the panels to a renderer, without GL: a recording renderer stands in for the platform's
// and the test plays the draw lists' callbacks as ImGui's GL backend would.
#include <catch2/catch.hpp>
#include <imgui.h>
#include <imgui_internal.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "headless.h"
#include "ui/app.h"
#include "ui/bench.h"
#include "ui/chart.h"
#include "ui/colors.h"

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

// The charts a frame drew with x_max == x_max (the timeline's: its events; the breakdown bars': 1).
std::vector<ui::QuadChart> charts_of(const std::vector<ui::QuadChart>& all, float x_max) {
  std::vector<ui::QuadChart> out;
  std::copy_if(all.begin(), all.end(), std::back_inserter(out), [&](const ui::QuadChart& c) { return c.x_max == x_max; });
  return out;
}

// Whether the quads cover the chart's units exactly once: none outside, no two overlapping, areas adding up.
void check_covers_once(const ui::QuadChart& c) {
  std::vector<ui::ChartQuad> q = c.quads;
  std::sort(q.begin(), q.end(), [](auto& a, auto& b) { return a.x0 < b.x0; });
  double area = 0;
  int overlaps = 0, outside = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    outside += !(q[i].x0 >= c.x_min && q[i].x1 <= c.x_max && q[i].y0 >= c.y_min && q[i].y1 <= c.y_max && q[i].x0 < q[i].x1 &&
                 q[i].y0 < q[i].y1);
    area += (static_cast<double>(q[i].x1) - q[i].x0) * (static_cast<double>(q[i].y1) - q[i].y0);
    for (size_t j = i + 1; j < q.size() && q[j].x0 < q[i].x1; ++j) overlaps += q[j].y0 < q[i].y1 && q[i].y0 < q[j].y1;
  }
  CHECK(outside == 0);
  CHECK(overlaps == 0);
  CHECK(area == Approx((static_cast<double>(c.x_max) - c.x_min) * (static_cast<double>(c.y_max) - c.y_min)).epsilon(1e-4));
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

TEST_CASE("with a renderer the timeline is one chart of columns that cover it once and keep every spike", "[ui][chart]") {
  Recorder rec;
  Registered on(&rec);
  HeadlessImGui gui(1280, 720);
  ui::App app({});
  app.show_result(ui::synthetic_step(50000));
  gui.frame(app);
  CHECK(play_callbacks() == 2);  // the breakdown's bar, then the timeline
  const auto timelines = charts_of(rec.quads, 50000.0f);
  REQUIRE(timelines.size() == 1);
  const ui::QuadChart& c = timelines[0];
  const DeviceResult& d = app.result().devices[0];
  CHECK(c.x_max == 50000.0f);
  CHECK(c.y_max > static_cast<float>(d.peak.reserved_bytes));
  // At most one column per pixel, of at most three quads (allocated, reserved above it, the empty frame above that),
  // however many events.
  CHECK(c.quads.size() <= 3 * static_cast<size_t>(c.rect.x1 - c.rect.x0));
  // The quads cover the chart exactly once, so that every pixel is blended once.
  check_covers_once(c);
  // The allocated memory runs from the first event to the last, and its tallest column is the peak itself, though
  // it lasts one event of the 50,000.
  const ImU32 allocated = ui::blend_over(ui::kTimelineAllocated, ui::blend_over(ui::kTimelineReserved, ImGui::GetColorU32(ImGuiCol_FrameBg)));
  const auto s = series(c, allocated);
  REQUIRE(!s.empty());
  CHECK(s.front().x0 == 0.0f);
  CHECK(s.back().x1 == c.x_max);
  for (size_t i = 1; i < s.size(); ++i) CHECK(s[i].x0 == s[i - 1].x1);  // no gap
  const float tallest = std::max_element(s.begin(), s.end(), [](auto& a, auto& b) { return a.y1 < b.y1; })->y1;
  CHECK(tallest == static_cast<float>(d.peak.allocated_bytes));
}

TEST_CASE("the timeline's chart keeps its key while nothing changes, so a renderer uploads it once", "[ui][chart]") {
  Recorder rec;
  Registered on(&rec);
  HeadlessImGui gui(1280, 720);
  ui::App app({});
  // Each frame draws the breakdown's bar (x_max 1) and then the timeline.
  auto frame = [&] {
    rec.quads.clear();
    gui.frame(app);
    play_callbacks();
    REQUIRE(rec.quads.size() == 2);
    return std::pair{rec.quads[0], rec.quads[1]};
  };
  frame();  // the first frame settles the layout: a panel whose content overflows gets its scrollbar in the next
  const auto [bar, timeline] = frame();
  CHECK(bar.key != 0);
  CHECK(timeline.key != 0);
  CHECK(bar.key != timeline.key);
  for (int i = 0; i < 2; ++i) {
    const auto [b, t] = frame();
    CHECK(b.key == bar.key);
    CHECK(t.key == timeline.key);
  }
  Config c = app.config();
  c.training.micro_batch_size = 2;  // a new result: new columns, new keys
  app.set_config(c);
  const auto [bar2, timeline2] = frame();
  CHECK(bar2.key != bar.key);
  CHECK(timeline2.key != timeline.key);
  CHECK(timeline2.y_max < timeline.y_max);  // and the new result's columns: a smaller micro-batch, a lower peak
  ImGui::StyleColorsLight();  // another theme: other colours, new keys
  const auto [bar3, timeline3] = frame();
  CHECK(bar3.key != bar2.key);
  CHECK(timeline3.key != timeline2.key);
  ImGui::StyleColorsDark();
}

TEST_CASE("with a renderer each breakdown bar is a chart of its components and the empty rest, in the slots' colours",
          "[ui][chart]") {
  Recorder rec;
  Registered on(&rec);
  HeadlessImGui gui(1280, 720);
  ui::App app({});
  gui.frame(app);
  play_callbacks();
  const auto bars = charts_of(rec.quads, 1.0f);
  const DeviceResult& d = app.result().devices.at(0);
  REQUIRE(bars.size() == app.result().devices.size());
  const ui::QuadChart& bar = bars[0];
  check_covers_once(bar);
  // Every component with bytes is a segment in its own colour, as wide as its share of the capacity; the NCCL
  // buffers (the slot after the components, the cache and the CUDA context, outside the allocator) have a colour of
  // their own.
  REQUIRE(d.breakdown.nccl_bytes > 0);
  const double scale = static_cast<double>(std::max(d.capacity_bytes, d.peak.device_bytes));
  const auto nccl = series(bar, ui::slot_color(kComponentCount + 2));
  REQUIRE(nccl.size() == 1);
  CHECK(nccl[0].x1 - nccl[0].x0 == Approx(static_cast<double>(d.breakdown.nccl_bytes) / scale).epsilon(1e-3));
  const auto weights = series(bar, ui::slot_color(0));
  REQUIRE(weights.size() == 1);
  CHECK(weights[0].x0 == 0.0f);
  CHECK(weights[0].x1 == Approx(static_cast<double>(d.breakdown.allocator[0]) / scale).epsilon(1e-3));
  for (int i = 0; i < ui::kSlotCount; ++i)
    for (int j = i + 1; j < ui::kSlotCount; ++j) CHECK(ui::slot_color(i) != ui::slot_color(j));
  // Hovering a segment still shows its details: a tooltip over the bar, none beside it.
  auto tooltip_at = [&](float x, float y) {
    ImGui::GetIO().MousePos = ImVec2(x, y);
    gui.frame(app);
    gui.frame(app);
    const ImGuiWindow* w = ImGui::FindWindowByName("##Tooltip_00");
    return w != nullptr && w->Active;
  };
  const float y = (bar.rect.y0 + bar.rect.y1) / 2;
  CHECK(tooltip_at(bar.rect.x0 + 3, y));
  CHECK(!tooltip_at(bar.rect.x0 + 3, bar.rect.y0 - 40));
}

TEST_CASE("blend_over folds two translucent layers into one", "[ui][chart]") {
  auto over = [](ImU32 top, ImU32 under) {  // what GL's SRC_ALPHA, ONE_MINUS_SRC_ALPHA blending does to an opaque colour
    ImU32 out = IM_COL32(0, 0, 0, 255);
    const float a = static_cast<float>((top >> IM_COL32_A_SHIFT) & 0xFF) / 255.0f;
    for (int shift : {IM_COL32_R_SHIFT, IM_COL32_G_SHIFT, IM_COL32_B_SHIFT}) {
      const float t = static_cast<float>((top >> shift) & 0xFF), u = static_cast<float>((under >> shift) & 0xFF);
      out |= static_cast<ImU32>(std::lround(t * a + u * (1 - a))) << shift;
    }
    return out;
  };
  auto near = [](ImU32 a, ImU32 b) {
    for (int shift : {IM_COL32_R_SHIFT, IM_COL32_G_SHIFT, IM_COL32_B_SHIFT})
      if (std::abs(static_cast<int>((a >> shift) & 0xFF) - static_cast<int>((b >> shift) & 0xFF)) > 1) return false;
    return true;
  };
  for (ImU32 bg : {IM_COL32(15, 15, 16, 255), IM_COL32(240, 240, 240, 255), IM_COL32(200, 30, 90, 255)}) {
    const ImU32 frame = IM_COL32(41, 74, 122, 138);
    INFO(bg);
    CHECK(near(over(ui::blend_over(ui::kTimelineReserved, frame), bg), over(ui::kTimelineReserved, over(frame, bg))));
    CHECK(near(over(ui::blend_over(ui::kTimelineAllocated, ui::blend_over(ui::kTimelineReserved, frame)), bg),
               over(ui::kTimelineAllocated, over(ui::kTimelineReserved, over(frame, bg)))));
  }
  CHECK(ui::blend_over(IM_COL32(1, 2, 3, 255), IM_COL32(9, 9, 9, 100)) == IM_COL32(1, 2, 3, 255));  // opaque on top
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
