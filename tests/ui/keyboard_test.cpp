// The interface with the keyboard alone (ui/keyboard.h), headless: keys go in through ImGui's io as a backend sends
// them, one press per frame, and the tests follow the focus through the app's announcements of it.
#include <catch2/catch.hpp>
#include <imgui.h>

#include <string>
#include <vector>

#include "core/architecture.h"
#include "core/catalog.h"
#include "core/simulate.h"
#include "headless.h"
#include "ui/app.h"

using namespace memsim;

namespace {

struct Keyboard {
  HeadlessImGui gui{1280, 720};
  std::string copied, published;
  ui::App app;

  Keyboard() : app(hooks()) {
    ImGuiIO& io = ImGui::GetIO();
    io.ConfigFlags |= ImGuiConfigFlags_NavEnableKeyboard;
    for (int k = 0; k < ImGuiKey_COUNT; ++k) io.KeyMap[k] = k;  // key indices as a backend maps them
    frames(2);
  }
  ui::PlatformHooks hooks() {
    ui::PlatformHooks h;
    h.copy_text = [this](const std::string& s) { copied = s; };
    h.publish_fragment = [this](const std::string& f) { published = f; };
    return h;
  }
  void frames(int n) {
    for (int i = 0; i < n; ++i) gui.frame(app);
  }
  void press(int key, bool shift = false) {  // down for one frame, up for the next
    ImGuiIO& io = ImGui::GetIO();
    io.KeyShift = shift;
    io.KeysDown[key] = true;
    gui.frame(app);
    io.KeysDown[key] = false;
    io.KeyShift = false;
    gui.frame(app);
  }
  void type(const char* text) {
    ImGui::GetIO().AddInputCharactersUTF8(text);
    frames(2);
  }
  const std::string& focus() const { return app.focus_announcement(); }
  // Presses Tab until the focus is on a control whose words start with `prefix`.
  bool tab_to(const std::string& prefix, bool shift = false, int limit = 400) {
    for (int i = 0; i < limit; ++i) {
      press(ImGuiKey_Tab, shift);
      if (focus().rfind(prefix, 0) == 0) return true;
    }
    return false;
  }
  int64_t peak() const { return app.result().devices.at(0).peak.device_bytes; }
};

}  // namespace

TEST_CASE("keyboard: Tab reaches the toolbar, every input group, the results tabs and the timeline", "[ui][keyboard]") {
  Keyboard k;
  CHECK(k.focus().empty());  // nothing is outlined before a key is pressed
  k.press(ImGuiKey_Tab);
  CHECK(k.focus().rfind("Copy link", 0) == 0);  // the first control
  std::vector<std::string> seen;
  for (int i = 0; i < 400 && (seen.empty() || seen.back().rfind("Copy link", 0) != 0); ++i) {
    k.press(ImGuiKey_Tab);
    seen.push_back(k.focus());
  }
  auto has = [&](const std::string& prefix) {
    for (const auto& s : seen)
      if (s.rfind(prefix, 0) == 0) return true;
    return false;
  };
  INFO("Tab stops: " << seen.size());
  for (const char* control : {"Copy summary", "Save JSON", "preset: ", "hidden_size: ", "Model section", "micro_batch_size: ",
                              "precision: ", "data_parallel: ", "sharding stage: ", "GPU: ", "headroom: ", "method: ",
                              "Breakdown, tab", "Fit explorer, tab", "What helps, tab", "Breakdown of ", "Timeline of one step"})
    CHECK(has(control));
  CHECK(seen.back().rfind("Copy link", 0) == 0);  // and round again
  // Shift+Tab goes back: from Copy link to the last control, the timeline (the status line's message log is greyed
  // out with no messages yet, and Tab passes greyed-out buttons).
  k.press(ImGuiKey_Tab, true);
  CHECK(k.focus().rfind("Timeline of one step", 0) == 0);
}

TEST_CASE("keyboard: Enter presses Copy link, Space presses Copy summary", "[ui][keyboard]") {
  Keyboard k;
  REQUIRE(k.tab_to("Copy link"));
  k.press(ImGuiKey_Enter);
  CHECK(k.copied.find("#memsim=3&") != std::string::npos);
  REQUIRE(k.tab_to("Copy summary"));
  k.press(ImGuiKey_Space);
  CHECK(k.copied.find("| device | peak") != std::string::npos);
}

TEST_CASE("keyboard: a number is typed into its field and the fragment follows", "[ui][keyboard]") {
  Keyboard k;
  REQUIRE(k.tab_to("micro_batch_size: 4"));  // Tab lands in the field, ready to type over its text
  k.type("2");
  k.press(ImGuiKey_Enter);
  CHECK(k.app.config().training.micro_batch_size == 2);
  CHECK(k.published.find("&micro_batch_size=2&") != std::string::npos);
}

TEST_CASE("keyboard: Escape leaves a field unchanged and Enter edits it again", "[ui][keyboard]") {
  Keyboard k;
  REQUIRE(k.tab_to("hidden_size: 5120"));
  k.type("1");
  k.press(ImGuiKey_Escape);  // cancels the edit that Tab started; the field keeps the focus
  CHECK(k.app.config().model.hidden_size == 5120);
  CHECK(k.focus().rfind("hidden_size: 5120", 0) == 0);
  k.press(ImGuiKey_Enter);  // edits it again, its text selected
  k.type("4096");
  k.press(ImGuiKey_Enter);
  CHECK(k.app.config().model.hidden_size == 4096);
}

TEST_CASE("keyboard: Space on a field's + button steps it", "[ui][keyboard]") {
  Keyboard k;
  REQUIRE(k.tab_to("micro_batch_size: 4"));
  k.press(ImGuiKey_Tab);  // the - button
  k.press(ImGuiKey_Tab);  // the + button
  k.press(ImGuiKey_Space);
  CHECK(k.app.config().training.micro_batch_size == 5);
  k.press(ImGuiKey_LeftArrow);  // the - button, by arrow
  k.press(ImGuiKey_Space);
  k.press(ImGuiKey_Space);
  CHECK(k.app.config().training.micro_batch_size == 3);
}

TEST_CASE("keyboard: a list opens with Space, the arrows pick and Enter chooses", "[ui][keyboard]") {
  Keyboard k;
  const std::string before = k.app.config().hardware.gpu;
  REQUIRE(k.tab_to("GPU: "));
  k.press(ImGuiKey_Space);
  CHECK(k.focus().find(", chosen") != std::string::npos);  // the open list starts on the current GPU
  k.press(ImGuiKey_DownArrow);
  const std::string next = k.focus();
  k.press(ImGuiKey_Enter);
  CHECK(k.app.config().hardware.gpu != before);
  CHECK(k.published.find("&gpu=" + k.app.config().hardware.gpu + "&") != std::string::npos);
  INFO(next);
  // Parallelism: the sharding stage list.
  REQUIRE(k.tab_to("sharding stage: 3"));
  k.press(ImGuiKey_Enter);
  k.press(ImGuiKey_UpArrow);
  k.press(ImGuiKey_Space);
  CHECK(k.app.config().parallel.zero_stage == 2);
}

TEST_CASE("keyboard: What helps opens with Enter and its first change applies with Enter", "[ui][keyboard]") {
  Keyboard k;
  const int64_t before = k.peak();
  REQUIRE(k.tab_to("What helps, tab"));
  k.press(ImGuiKey_Enter);
  CHECK(k.focus() == "What helps, tab, shown");
  REQUIRE(k.tab_to("Apply, button: "));
  const Config config = k.app.config();
  k.press(ImGuiKey_Enter);
  CHECK(!(k.app.config() == config));
  CHECK(k.peak() < before);
}

TEST_CASE("keyboard: a Fit explorer cell is reached by Tab and the arrows and applied with Space", "[ui][keyboard]") {
  Keyboard k;
  REQUIRE(k.tab_to("Fit explorer, tab"));
  k.press(ImGuiKey_Space);
  k.frames(200);  // the sweep fills a few cells a frame
  REQUIRE(k.tab_to("micro-batch 1, sequence 512: "));
  CHECK(k.focus().find("fits") != std::string::npos);
  k.press(ImGuiKey_RightArrow);
  CHECK(k.focus().rfind("micro-batch 2, sequence 512: ", 0) == 0);
  k.press(ImGuiKey_DownArrow);
  CHECK(k.focus().rfind("micro-batch 2, sequence 1024: ", 0) == 0);
  k.press(ImGuiKey_Space);
  CHECK(k.app.config().training.micro_batch_size == 2);
  CHECK(k.app.config().training.sequence_length == 1024);
}

TEST_CASE("keyboard: for a model program with an image size, the Fit explorer's axes are micro-batch x image size", "[ui][keyboard]") {
  Keyboard k;
  REQUIRE(k.app.load_text(std::string(builtin_architecture("vit")), "vit.json"));
  k.frames(5);
  REQUIRE(k.tab_to("Fit explorer, tab"));
  k.press(ImGuiKey_Space);
  k.frames(200);
  REQUIRE(k.tab_to("micro-batch 1, image size 128: "));
  k.press(ImGuiKey_DownArrow);
  CHECK(k.focus().rfind("micro-batch 1, image size 224: ", 0) == 0);
  k.press(ImGuiKey_DownArrow);
  k.press(ImGuiKey_Space);
  CHECK(k.app.config().model.architecture_args == "image_size=256");
  CHECK(k.app.config().training.micro_batch_size == 1);
}

TEST_CASE("keyboard: for a vision-language model that sizes its images, the Fit explorer's axes are micro-batch x image side", "[ui][keyboard][vision]") {
  Keyboard k;
  Config c = k.app.config();
  c.model = find_model_preset("qwen2-vl-2b")->model;
  c.peft.method = "lora";
  c.training.sequence_length = 4096;
  k.app.set_config(c);
  k.frames(5);
  REQUIRE(k.tab_to("Fit explorer, tab"));
  k.press(ImGuiKey_Space);
  k.frames(300);
  REQUIRE(k.tab_to("micro-batch 1, image side 224: "));
  k.press(ImGuiKey_DownArrow);
  CHECK(k.focus().rfind("micro-batch 1, image side 336: ", 0) == 0);
  k.press(ImGuiKey_DownArrow);
  k.press(ImGuiKey_Space);
  // 448 x 448: 256 image tokens where the default 448 x 448 had as many, so the text around it keeps the length.
  CHECK(architecture_arg(k.app.config().model.vision_tower_args, "image_height", 0) == 448);
  CHECK(architecture_arg(k.app.config().model.vision_tower_args, "image_width", 0) == 448);
  CHECK(k.app.config().training.sequence_length == 4096);
  CHECK(k.app.config().training.micro_batch_size == 1);
}

TEST_CASE("keyboard: Escape on a control that is not being edited keeps the focus where it is", "[ui][keyboard]") {
  Keyboard k;
  REQUIRE(k.tab_to("tie_word_embeddings: "));  // a checkbox inside the inputs panel
  const std::string here = k.focus();
  k.press(ImGuiKey_Escape);
  k.press(ImGuiKey_Tab);
  CHECK(!k.focus().empty());
  CHECK(k.focus() != here);
  k.press(ImGuiKey_Tab, true);
  CHECK(k.focus() == here);
}

TEST_CASE("keyboard: the Data section's lengths are picked and typed, and the Run view is shown with Space", "[ui][keyboard][run]") {
  Keyboard k;
  REQUIRE(k.tab_to("sequence lengths: fixed"));
  k.press(ImGuiKey_Space);
  k.press(ImGuiKey_DownArrow);
  k.press(ImGuiKey_DownArrow);
  CHECK(k.focus().rfind("a distribution of sample lengths", 0) == 0);
  k.press(ImGuiKey_Enter);
  CHECK(k.app.config().data.lengths == "samples");
  REQUIRE(k.tab_to("sample lengths: empty, text"));
  CHECK(k.focus().find("Problem: data.sample_lengths") != std::string::npos);  // the field's error is read out
  k.type("p0=20,p50=150,p100=1100");
  k.press(ImGuiKey_Enter);
  CHECK(k.app.config().data.sample_lengths == "p0=20,p50=150,p100=1100");
  REQUIRE(k.tab_to("steps to replay: 0"));
  k.type("50");
  k.press(ImGuiKey_Enter);
  CHECK(k.app.config().data.steps == 50);
  for (int i = 0; i < 500 && k.app.simulating(); ++i) k.frames(1);
  REQUIRE(k.app.result().ok);
  REQUIRE(k.tab_to("Run view, button: "));
  k.press(ImGuiKey_Space);
  CHECK(k.app.run_view());
  CHECK(k.focus().rfind("Run view, button, shown", 0) == 0);
  REQUIRE(k.tab_to("Run of 50 steps"));  // the chart, read out as the verdict's run line
  CHECK(k.focus().find("peak at step") != std::string::npos);
}

TEST_CASE("keyboard: the device bar reads out its uncertainty band and the verdict", "[ui][keyboard][band]") {
  Keyboard k;
  REQUIRE(k.tab_to("Breakdown of "));
  const std::string& words = k.focus();
  INFO(words);
  CHECK(words.find("Band of the device peak: ") != std::string::npos);
  CHECK(words.find(", verdict FITS.") != std::string::npos);  // the default setup's band top is under the usable line
}
