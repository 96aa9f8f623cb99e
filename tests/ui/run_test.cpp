// A run of varying shapes in the interface, headless: the Data section, the run filled in over frames, the Run view,
// a link or a dropped lengths file with a mistake in it, and What helps and the fit explorer kept affordable.
#include <catch2/catch.hpp>
#include <imgui.h>
#include <imgui_internal.h>

#include <time.h>

#include <chrono>
#include <string>

#include "core/catalog.h"
#include "core/data_shape.h"
#include "core/serialize.h"
#include "headless.h"
#include "ui/app.h"
#include "ui/panels.h"

using namespace memsim;

namespace {

// The CLI example of the README: Llama-2-7B with LoRA on one GPU, a distribution of sample lengths.
Config lora_run(int64_t steps) {
  Config c;
  c.model = find_model_preset("llama-2-7b")->model;
  for (const char* s : {"training.framework=hf_trainer", "peft.method=lora", "parallel.data_parallel_size=1",
                        "parallel.zero_stage=0", "training.sequence_length=2048", "training.activation_checkpointing=none",
                        "data.lengths=samples", "data.sample_lengths=p0=20,p50=150,p90=350,p99=600,p100=1100"})
    REQUIRE(apply_setting(c, s).empty());
  c.data.steps = steps;
  return c;
}

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// Frames until the app's simulation is done; the number of frames it took.
int frames_until_simulated(HeadlessImGui& gui, ui::App& app, int limit = 2000) {
  int frames = 0;
  while (app.simulating() && frames < limit) gui.frame(app), ++frames;
  return frames;
}

}  // namespace

TEST_CASE("a run fills in over frames, with its progress, and an edit starts it again", "[ui][run]") {
  HeadlessImGui gui(1280, 720);
  std::string published;
  ui::PlatformHooks hooks;
  hooks.publish_fragment = [&](const std::string& f) { published = f; };
  ui::App app(hooks);
  const std::string fixed_fragment = published;
  const Config run = lora_run(1000);
  app.set_config(run);
  REQUIRE(app.simulating());  // a thousand steps take longer than one frame's share
  CHECK(app.simulation_progress().steps == 1000);
  CHECK(published == fixed_fragment);  // the link follows once the run is simulated
  const int64_t first = app.simulation_progress().step;
  CHECK(first < 1000);
  gui.frame(app);
  CHECK(app.simulation_progress().step > first);
  // An edit drops the run under way and starts the edited one.
  Config edited = run;
  edited.data.seed = 2;
  app.set_config(edited);
  CHECK(app.simulation_progress().step < 1000);
  const double start = thread_cpu_seconds();
  const int frames = frames_until_simulated(gui, app);
  const double seconds = thread_cpu_seconds() - start;
  INFO(frames << " frames in " << seconds << " s of CPU");
  CHECK(frames > 3);
  CHECK(seconds / frames < 0.05);  // each frame's share is about 8 ms, and the drawing is quick headless
  REQUIRE(!app.simulating());
  REQUIRE(app.result().ok);
  const RunTrace& trace = app.result().devices.at(0).run;
  CHECK(trace.steps == 1000);
  CHECK(trace.longest_tokens == 1100);
  CHECK(published == config_to_fragment(edited));
  // The same numbers as simulate() in one call.
  CHECK(app.result().devices[0].peak.device_bytes == simulate(edited).devices[0].peak.device_bytes);
}

TEST_CASE("the Run view draws the run's steps, and hovering it shows a step", "[ui][run]") {
  HeadlessImGui gui(1280, 720);
  ui::App app({});
  app.set_config(lora_run(200));
  frames_until_simulated(gui, app);
  REQUIRE(app.result().ok);
  CHECK(!app.run_view());
  const int step_view = gui.frame(app);
  CHECK(app.show_view("run"));
  CHECK(app.run_view());
  const int run_view = gui.frame(app);
  CHECK(run_view > 1000);
  CHECK(run_view != step_view);
  ImGui::GetIO().MousePos = ImVec2(900, 600);  // inside the run's chart
  gui.frame(app);
  CHECK(gui.frame(app) > run_view);  // the step's tooltip
  // The choice holds for the next run, and a fixed shape shows its step.
  app.set_config(Config{});
  CHECK(app.run_view());
  CHECK(gui.frame(app) > 1000);
  CHECK(app.show_view("step"));
  CHECK(!app.run_view());
}

TEST_CASE("the Data section draws every kind of lengths, and a bad one shows its field error", "[ui][run]") {
  HeadlessImGui gui(1280, 720);
  ui::App app({});
  for (const char* lengths : {"fixed", "micro_batches", "samples"}) {
    Config c = lora_run(50);
    c.data.lengths = lengths;
    c.data.micro_batch_lengths = "512,380,1024";
    c.data.padding = "none";
    app.set_config(c);
    frames_until_simulated(gui, app);
    INFO(lengths);
    CHECK(app.result().ok);
    CHECK(gui.frame(app) > 1000);
  }
  Config bad = lora_run(50);
  bad.data.sample_lengths = "p50=abc";
  app.set_config(bad);
  CHECK(!app.simulating());  // refused by validation at once
  REQUIRE(!app.result().ok);
  CHECK(app.result().errors.at(0).field == "data.sample_lengths");
  CHECK(gui.frame(app) > 1000);
  CHECK(app.config() == bad);  // the user's text stays, to be fixed
}

TEST_CASE("a link with a mistake in the data section opens with it shown, other broken links are still refused", "[ui][run]") {
  HeadlessImGui gui(1280, 720);
  ui::App app({});
  Config c = lora_run(50);
  c.data.sample_lengths = "p50=300,p90=nan";
  CHECK(app.load_fragment("#" + config_to_fragment(c)));
  CHECK(app.config() == c);  // the link's other settings are open
  REQUIRE(!app.result().ok);
  CHECK(app.result().errors.at(0).field == "data.sample_lengths");
  REQUIRE(!app.messages().empty());
  CHECK(app.messages().back().text.find("data.sample_lengths") != std::string::npos);
  gui.frame(app);
  const Config before = app.config();
  Config other = lora_run(50);
  other.training.precision = "fp5";
  CHECK(!app.load_fragment("#" + config_to_fragment(other)));
  CHECK(app.config() == before);
  // A good run link opens and fills in over the next frames.
  CHECK(app.load_fragment("#" + config_to_fragment(lora_run(300))));
  frames_until_simulated(gui, app);
  CHECK(app.result().ok);
  CHECK(app.result().devices.at(0).run.steps == 300);
}

TEST_CASE("a dropped file of sample lengths sets the data section, a bad one keeps the setup", "[ui][run]") {
  HeadlessImGui gui(1280, 720);
  ui::App app({});
  app.set_config(lora_run(100));
  frames_until_simulated(gui, app);
  const Config before = app.config();
  CHECK(!app.load_text("120\n300\n-4\n", "\"lengths.txt\""));
  CHECK(app.config() == before);
  CHECK(app.messages().back().kind == ui::Message::Kind::Error);
  CHECK(app.messages().back().text.find("line 3") != std::string::npos);
  std::string lengths;
  for (int i = 0; i < 5000; ++i) lengths += std::to_string(20 + (i * 7919) % 1500) + "\n";
  CHECK(app.load_text(lengths, "\"lengths.txt\""));
  CHECK(app.config().data.lengths == "samples");
  CHECK(app.config().data.dataset_samples == 5000);
  CHECK(app.config().data.sample_lengths.rfind("p0=20,", 0) == 0);
  CHECK(app.config().model == before.model);
  frames_until_simulated(gui, app);
  CHECK(app.result().ok);
  CHECK(app.result().devices.at(0).run.longest_tokens == 1519);
  // A config is still read as a config.
  CHECK(app.load_text(R"({"training": {"micro_batch_size": 2}})", "c.json"));
  CHECK(app.config().training.micro_batch_size == 2);
}

TEST_CASE("What helps and the fit explorer replay a long run over fewer steps, and wait for the setup's own", "[ui][run]") {
  HeadlessImGui gui(1280, 720);
  ui::App app({});
  const Config run = lora_run(1000);
  const int64_t steps = run_steps_within(run, ui::kVariantRunLayerPasses);
  REQUIRE(steps > 0);
  REQUIRE(steps < 1000);
  for (const char* view : {"advice", "explorer"}) {
    INFO(view);
    app.set_config(run);
    CHECK(app.show_view(view));
    // Every frame stays within its share while the setup, then its variants, are simulated (a whole run of the
    // setup is some 0.36 s here, far over). The thread's CPU time, not the clock's: on a loaded machine the test
    // may wait for a core between two frames.
    double slowest = 0;
    for (int i = 0; i < 200; ++i) {
      const double start = thread_cpu_seconds();
      gui.frame(app);
      slowest = std::max(slowest, thread_cpu_seconds() - start);
    }
    CHECK(!app.simulating());
    CHECK(slowest < 0.1);
  }
}

TEST_CASE("a phone-sized window stacks the results, the timeline and the inputs, and draws the Run view", "[ui][run]") {
  HeadlessImGui gui(390, 844);
  ui::App app({});
  app.set_config(lora_run(100));
  frames_until_simulated(gui, app);
  REQUIRE(app.result().ok);
  CHECK(gui.frame(app) > 1000);
  CHECK(app.show_view("run"));
  CHECK(gui.frame(app) > 1000);
  // Stacked: every child window spans the width, the results on top and the inputs at the bottom.
  ImGuiWindow* results = nullptr;
  ImGuiWindow* inputs = nullptr;
  for (ImGuiWindow* w : ImGui::GetCurrentContext()->Windows) {
    const std::string name = w->Name;
    if (name.find("/results_") != std::string::npos && name.rfind("/results_") + 9 + 8 == name.size()) results = w;
    if (name.find("/inputs_") != std::string::npos && name.rfind("/inputs_") + 8 + 8 == name.size()) inputs = w;
  }
  REQUIRE(results);
  REQUIRE(inputs);
  CHECK(results->Size.x > 350);
  CHECK(inputs->Size.x > 350);
  CHECK(results->Pos.y < inputs->Pos.y);
}
