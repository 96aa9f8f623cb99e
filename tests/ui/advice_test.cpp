// What helps in the interface (ui/panel_advice.cpp), headless: the list fills in over frames, pairs included, its
// groups reach the announcements, and Apply on a pair makes the 8B-on-one-RTX-4090 setup fit while it stays
// full fine-tuning.
#include <catch2/catch.hpp>
#include <imgui.h>

#include <string>

#include "core/catalog.h"
#include "core/simulate.h"
#include "headless.h"
#include "ui/app.h"

using namespace memsim;

TEST_CASE("What helps: the 8B on one RTX 4090 is made to fit by a pair that keeps full fine-tuning, with the keyboard",
          "[ui][advice]") {
  HeadlessImGui gui(1280, 720);
  ui::App app({});
  ImGuiIO& io = ImGui::GetIO();
  io.ConfigFlags |= ImGuiConfigFlags_NavEnableKeyboard;
  for (int k = 0; k < ImGuiKey_COUNT; ++k) io.KeyMap[k] = k;
  const ModelPreset* preset = find_model_preset("llama-3.1-8b");
  REQUIRE(preset != nullptr);
  Config c;
  c.model = preset->model;
  c.hardware.gpu = "rtx-4090";
  c.parallel.data_parallel_size = 1;
  app.set_config(c);
  CHECK(app.show_view("advice"));
  // The single changes, then the pairs, a few per frame.
  for (int i = 0; i < 600 && (app.simulating() || app.wants_frames() || i < 3); ++i) gui.frame(app);
  REQUIRE(!app.wants_frames());
  REQUIRE(app.result().devices.at(0).verdict != Verdict::Fits);
  auto press = [&](int key) {
    io.KeysDown[key] = true;
    gui.frame(app);
    io.KeysDown[key] = false;
    gui.frame(app);
  };
  // The first Apply reached is the same job's; a pair's announcement says the pair fits.
  std::string first;
  bool on_pair = false;
  for (int i = 0; i < 400 && !on_pair; ++i) {
    press(ImGuiKey_Tab);
    const std::string& f = app.focus_announcement();
    if (first.empty() && f.rfind("Apply, button: ", 0) == 0) first = f;
    on_pair = f.rfind("Apply, button: Together they fit", 0) == 0;
  }
  CHECK(first.rfind("Apply, button: Same job", 0) == 0);
  REQUIRE(on_pair);
  CHECK(app.focus_announcement().find(", fits.") != std::string::npos);
  press(ImGuiKey_Enter);
  for (int i = 0; i < 50 && app.simulating(); ++i) gui.frame(app);
  const Config& after = app.config();
  CHECK(after.peft.method == "none");
  CHECK(after.model == c.model);
  CHECK(after.training.micro_batch_size * after.training.gradient_accumulation_steps ==
        c.training.micro_batch_size * c.training.gradient_accumulation_steps);
  CHECK(after.parallel.data_parallel_size == 1);
  REQUIRE(app.result().ok);
  CHECK(app.result().devices.at(0).verdict == Verdict::Fits);
}
