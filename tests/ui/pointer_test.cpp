// The wheel and touch rules (ui/pointer.h), headless, on a small window of the widgets they must not disturb: a drag
// number, a slider and a number field with its - and + buttons, a button and a checkbox, in a child that scrolls, and a
// combo whose list scrolls. The
// DOM's events go in as the web page hands them over; ImGui's frames run as the platform loop runs them.
#include <catch2/catch.hpp>
#include <imgui.h>

#include <cfloat>
#include <string>

#include "headless.h"
#include "ui/pointer.h"

using memsim::ui::PointerInput;

namespace {

struct Widgets {
  HeadlessImGui gui{400, 300};
  PointerInput pointer;
  int drag = 50, field = 7, clicks = 0, picked = 0;
  bool list_open = false;
  float list_scroll = 0, list_max = 0;
  ImVec2 at_combo, at_list;
  float slider = 10.0f;
  bool box = false;
  float scroll = 0, scroll_max = 0, step = 0;
  ImVec2 at_drag, at_slider, at_field_plus, at_button, at_box;  // centres, as drawn in the last frame

  Widgets() { frames(2); }

  void frame() {
    ImGuiIO& io = ImGui::GetIO();
    io.DeltaTime = 1.0f / 60.0f;
    pointer.before_new_frame(io);
    ImGui::NewFrame();
    pointer.after_new_frame();
    ImGui::SetNextWindowPos(ImVec2(0, 0));
    ImGui::SetNextWindowSize(ImVec2(400, 300));
    ImGui::Begin("window", nullptr, ImGuiWindowFlags_NoDecoration | ImGuiWindowFlags_NoMove);
    auto centre = [] { return ImVec2((ImGui::GetItemRectMin().x + ImGui::GetItemRectMax().x) / 2,
                                     (ImGui::GetItemRectMin().y + ImGui::GetItemRectMax().y) / 2); };
    ImGui::SetNextItemWidth(150);
    list_open = ImGui::BeginCombo("combo", "item 0");
    at_combo = centre();
    if (list_open) {
      for (int i = 0; i < 50; ++i)
        if (ImGui::Selectable(("item " + std::to_string(i)).c_str(), picked == i)) picked = i;
      list_scroll = ImGui::GetScrollY();
      list_max = ImGui::GetScrollMaxY();
      at_list = ImVec2(ImGui::GetWindowPos().x + ImGui::GetWindowSize().x / 2, ImGui::GetWindowPos().y + ImGui::GetWindowSize().y / 2);
      ImGui::EndCombo();
    }
    ImGui::BeginChild("list", ImVec2(0, 200), true);
    ImGui::DragInt("drag", &drag);
    at_drag = centre();
    ImGui::SliderFloat("slider", &slider, 0.0f, 100.0f);
    at_slider = centre();
    const float field_w = ImGui::CalcItemWidth();  // the field with its - and + buttons, + at the right end
    ImGui::InputInt("field", &field);
    at_field_plus = ImVec2(ImGui::GetItemRectMin().x + field_w - ImGui::GetFrameHeight() / 2, centre().y);
    if (ImGui::Button("button")) ++clicks;
    at_button = centre();
    ImGui::Checkbox("box", &box);
    at_box = centre();
    for (int i = 0; i < 40; ++i) ImGui::Text("line %d", i);
    scroll = ImGui::GetScrollY();
    scroll_max = ImGui::GetScrollMaxY();
    ImGui::EndChild();
    ImGui::End();
    ImGui::Render();
    step = 5 * ImGui::GetFontSize();  // ImGui's wheel step (imgui.cpp UpdateMouseWheel)
  }
  void frames(int n) {
    for (int i = 0; i < n; ++i) frame();
  }
  // A finger from `from` moved by (dx, dy) in `moves` even moves, a frame after each, then lifted.
  void swipe(ImVec2 from, float dx, float dy, int moves = 12) {
    pointer.touch_start(from.x, from.y);
    frame();
    for (int i = 1; i <= moves; ++i) {
      pointer.touch_move(from.x + dx * i / moves, from.y + dy * i / moves);
      frame();
    }
    pointer.touch_end(from.x + dx, from.y + dy);
    frames(3);
  }
  void tap(ImVec2 at, float wobble = 0) {
    pointer.touch_start(at.x, at.y);
    frame();
    if (wobble != 0) pointer.touch_move(at.x + wobble, at.y - wobble), frame();
    pointer.touch_end(at.x + wobble, at.y - wobble);
    frames(3);
  }
};

}  // namespace

TEST_CASE("pointer: a wheel notch scrolls one ImGui step down, in every unit the DOM reports it in", "[pointer]") {
  Widgets w;
  REQUIRE(w.scroll_max > 4 * w.step);  // room to scroll
  ImGui::GetIO().MousePos = ImVec2(200, 100);  // the platform's mouse, over the list
  w.frame();
  w.pointer.wheel(0, 100, 0);  // one notch as Chromium reports it: 100 px down
  REQUIRE(w.pointer.pending());
  w.frames(2);
  CHECK_FALSE(w.pointer.pending());
  CHECK(w.scroll == Approx(w.step));  // down, and by one step (not ~100 of them, as GLFW's raw delta made it)
  w.pointer.wheel(0, 3, 1);  // one notch in lines (Firefox)
  w.frames(2);
  CHECK(w.scroll == Approx(2 * w.step));
  w.pointer.wheel(0, -100, 0);  // and back up
  w.frames(2);
  CHECK(w.scroll == Approx(w.step));
  // A trackpad's small deltas scroll in proportion (ImGui keeps whole pixels).
  w.pointer.wheel(0, 20, 0);
  w.frames(2);
  CHECK(w.scroll == Approx(w.step + 0.2f * w.step).margin(1));
  // A page is most of the window's height.
  const float before = w.scroll;
  w.pointer.wheel(0, 1, 2);
  w.frames(2);
  CHECK(w.scroll - before == Approx(std::min(0.8f * 300, w.scroll_max - before)).margin(1));
  CHECK(w.drag == 50);
}

TEST_CASE("pointer: a swipe over a drag number, a slider or a + button scrolls and changes nothing", "[pointer]") {
  Widgets w;
  for (ImVec2 from : {w.at_drag, w.at_slider, w.at_field_plus}) {
    const float before = w.scroll;
    w.swipe(from, 0, -60);  // the finger goes up 60 px: the content follows it, 60 px down the list
    CHECK(w.scroll - before == Approx(60));
    w.swipe(ImVec2(200, 100), 0, 60);  // and back, from whatever is under the finger now
    CHECK(w.scroll == Approx(before));
  }
  CHECK(w.drag == 50);
  CHECK(w.slider == 10.0f);
  CHECK(w.field == 7);
  CHECK(ImGui::GetIO().MouseDown[0] == false);
  // Sideways, over a drag number: nothing scrolls sideways here, and the number stays.
  w.swipe(w.at_drag, 80, 0);
  CHECK(w.drag == 50);
}

TEST_CASE("pointer: a tap clicks a button, a checkbox and a + button, even with a finger's wobble", "[pointer]") {
  Widgets w;
  w.tap(w.at_button);
  CHECK(w.clicks == 1);
  w.tap(w.at_box, 4);  // within the slop
  CHECK(w.box);
  w.tap(w.at_field_plus);
  CHECK(w.field == 8);
  w.tap(w.at_box);
  CHECK_FALSE(w.box);
  CHECK(w.scroll == 0);
  CHECK(w.drag == 50);
}

TEST_CASE("pointer: the finger's position stands in for the mouse until the mouse is used", "[pointer]") {
  Widgets w;
  w.tap(w.at_button);
  CHECK(w.pointer.touching());
  ImGui::GetIO().MousePos = ImVec2(-FLT_MAX, -FLT_MAX);  // the platform's stale mouse, as the backend sets it
  w.frame();
  CHECK(ImGui::GetIO().MousePos.x == Approx(w.at_button.x));
  w.pointer.mouse_used();
  ImGui::GetIO().MousePos = ImVec2(5, 5);
  w.frame();
  CHECK(ImGui::GetIO().MousePos.x == 5);
  CHECK_FALSE(w.pointer.touching());
}

TEST_CASE("pointer: a cancelled touch neither taps nor pans on", "[pointer]") {
  Widgets w;
  w.pointer.touch_start(w.at_button.x, w.at_button.y);
  w.frame();
  w.pointer.touch_cancel();
  w.pointer.touch_end(w.at_button.x, w.at_button.y);
  w.frames(3);
  CHECK(w.clicks == 0);
  CHECK_FALSE(w.pointer.pending());
}

TEST_CASE("pointer: a tap opens a list, the wheel and a swipe scroll the list as they do a panel", "[pointer]") {
  Widgets w;
  w.tap(w.at_combo);
  REQUIRE(w.list_open);
  REQUIRE(w.list_max > 100);
  w.pointer.mouse_used();  // the mouse moves over the open list
  ImGui::GetIO().MousePos = w.at_list;
  w.frame();
  w.pointer.wheel(0, 100, 0);
  w.frames(2);
  CHECK(w.list_scroll > 0.5f * w.step);  // one step, or less where ImGui caps it at two thirds of a short list
  CHECK(w.list_scroll <= w.step);
  const float after_wheel = w.list_scroll;
  w.swipe(w.at_list, 0, -40);  // a finger over the list: it follows, and nothing is picked
  CHECK(w.list_scroll == Approx(after_wheel + 40));
  CHECK(w.list_open);
  CHECK(w.picked == 0);
  w.tap(w.at_list);  // a tap picks the item under it, and the list closes
  CHECK(w.picked > 0);
  CHECK_FALSE(w.list_open);
}
