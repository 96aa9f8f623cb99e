// Numbers that agree: the results' header and the breakdown show one figure per model state under the same words, the
// timeline's axis, and the pinned verdict line.
#include <catch2/catch.hpp>
#include <imgui.h>

#include <string>

#include "core/format.h"
#include "headless.h"
#include "ui/app.h"
#include "ui/chart.h"
#include "ui/panels.h"

using namespace memsim;

TEST_CASE("the memory axis ticks at round steps of the unit, up to the top", "[ui][numbers]") {
  const int64_t gib = int64_t(1) << 30;
  auto ticks = ui::memory_axis(52 * gib, Unit::GiB, 6);
  REQUIRE(ticks.size() == 5);  // 10, 20, ... 50 GiB: a step of 5 would need 10 ticks
  CHECK(ticks.front().label == "10 GiB");
  CHECK(ticks.front().bytes == 10 * gib);
  CHECK(ticks.back().label == "50 GiB");
  ticks = ui::memory_axis(gib * 7 / 10, Unit::GiB, 4);  // 0.7 GiB: 0.2, 0.4, 0.6
  REQUIRE(ticks.size() == 3);
  CHECK(ticks[0].label == "0.2 GiB");
  CHECK(ticks[2].label == "0.6 GiB");
  ticks = ui::memory_axis(int64_t(85) * 1000 * 1000 * 1000, Unit::GB, 4);  // 20, 40, 60, 80 GB
  REQUIRE(ticks.size() == 4);
  CHECK(ticks[3].label == "80 GB");
  CHECK(ticks[3].bytes == int64_t(80) * 1000 * 1000 * 1000);
  for (int max : {1, 3, 8}) CHECK(ui::memory_axis(48 * gib, Unit::MiB, max).size() <= static_cast<size_t>(max));
  CHECK(ui::memory_axis(0, Unit::GiB, 5).empty());
}

TEST_CASE("the breakdown bar reads out each model state at the peak and kept between steps, the header's figure",
          "[ui][numbers]") {
  HeadlessImGui gui(1280, 720);
  ImGuiIO& io = ImGui::GetIO();
  io.ConfigFlags |= ImGuiConfigFlags_NavEnableKeyboard;
  for (int k = 0; k < ImGuiKey_COUNT; ++k) io.KeyMap[k] = k;
  ui::App app({});
  gui.frame(app);
  gui.frame(app);
  bool found = false;
  for (int i = 0; i < 400 && !found; ++i) {
    io.KeysDown[ImGuiKey_Tab] = true;
    gui.frame(app);
    io.KeysDown[ImGuiKey_Tab] = false;
    gui.frame(app);
    found = app.focus_announcement().rfind("Breakdown of ", 0) == 0;
  }
  REQUIRE(found);
  const std::string words = app.focus_announcement();
  INFO(words);
  const Result& r = app.result();
  const std::string header = describe_kept(r.model_states);  // the results panel's header line
  const auto rows = breakdown_rows(r.devices.front());
  for (Component c : {Component::Weights, Component::Gradients, Component::OptimizerStates}) {
    const auto& row = rows[static_cast<size_t>(c)];
    const std::string kept = format_bytes(row.kept_bytes);
    CHECK(header.find(kept) != std::string::npos);
    CHECK(words.find(std::string(row.label) + " " + format_bytes(row.at_peak_bytes) + " (" + kept + " " + kKeptWords + ")") !=
          std::string::npos);
  }
}

TEST_CASE("the pinned verdict line names the worst device's peak, the usable memory and the headroom", "[ui][numbers]") {
  HeadlessImGui gui(1280, 720);
  ui::App app({});
  gui.frame(app);
  const Result& r = app.result();
  REQUIRE(r.ok);
  const std::string line = ui::verdict_line_text(r, Unit::GiB);
  INFO(line);
  CHECK(line.rfind(verdict_words(r.devices.front().verdict), 0) == 0);
  CHECK(line.find(describe_usable(r.devices.front())) != std::string::npos);
  CHECK(line.find("less 10% headroom") != std::string::npos);
  Result broken;
  CHECK(ui::verdict_line_text(broken, Unit::GiB).empty());
}
