// The wheel and touch, turned into Dear ImGui's mouse by rules of our own, for a platform whose own translation is
// wrong. On the web, Emscripten 3.1.6's GLFW hands ImGui the browser's WheelEvent deltaY as it comes: pixels (100 for
// one notch in Chromium) where ImGui counts notches, and with the sign reversed (the DOM's positive is down, ImGui's is
// up), so one notch down threw a panel to its top or bottom. And it turns a touch into a press of the left button at
// the last mouse position (a browser's TouchEvent has none of the fields it reads), so a swipe over a number dragged it.
// The web platform gives the DOM's wheel and touch events here instead (web/memsim-page.js stops them before GLFW sees
// them); the tests feed them directly. Knows ImGui only.
//
// - The wheel: a notch scrolls as the desktop's GLFW does, one ImGui wheel step, which ImGui makes five font heights
//   (75 px at the 15 px font: three rows of the inputs). The DOM's units are normalised to notches: 100 px (Chromium's
//   notch, and Emscripten's own convention), 3 lines (Firefox's), or 0.8 of the window's height per page; a trackpad's
//   small pixel deltas scroll in proportion.
// - One finger: a touch that ends within kTapSlop of where it started is a tap, a click of the left button there (the
//   press in one frame, the release in the next, as ImGui needs to see both). A touch that moves further pans: the
//   window under where it started (or the nearest parent that scrolls) follows the finger pixel for pixel, and no
//   button is ever pressed, so a swipe over a number field, a slider or a button scrolls and changes nothing.
// - After a touch, the pointer stays where the finger was (a tapped "(?)" keeps its help shown) until the mouse is used.
#pragma once
#include <imgui.h>

#include <cmath>
#include <deque>

namespace memsim::ui {

class PointerInput {
 public:
  // How far, in the interface's pixels, a finger may wander and still tap; beyond it the touch pans. Fingers wobble
  // a few pixels on a tap; a deliberate swipe passes this within its first frames.
  static constexpr float kTapSlop = 10.0f;
  // DOM WheelEvent.deltaMode's units, and how many of each make one notch.
  static constexpr double kPixelsPerNotch = 100.0, kLinesPerNotch = 3.0;
  static constexpr double kPageShare = 0.8;  // of the window's height, per page

  // One wheel event as the DOM reports it: deltas in `mode`'s unit (0 pixels, 1 lines, 2 pages), positive right and down.
  void wheel(double dx, double dy, int mode);
  // One finger, in the interface's pixels (CSS pixels on the web): the start, each move, and the end of a touch.
  // A cancelled touch (the browser took it over) neither taps nor pans further.
  void touch_start(float x, float y);
  void touch_move(float x, float y);
  void touch_end(float x, float y);
  void touch_cancel();
  // The mouse moved or was pressed: it is the pointer again, and the platform's mouse position stands.
  void mouse_used();

  // After the platform backend's NewFrame (which sets the mouse from the platform's), before ImGui::NewFrame():
  // the touch's position and button, and the frame's wheel, go into `io`.
  void before_new_frame(ImGuiIO& io);
  // Right after ImGui::NewFrame(), before any window: the frame's pan scrolls the window it started over.
  void after_new_frame();

  // Whether the next frame has something to do (a tap's release, a pan to apply): the platform draws it even if no
  // other input came. Reading it changes nothing.
  bool pending() const {
    return !steps_.empty() || std::abs(pan_x_) >= 1.0f || std::abs(pan_y_) >= 1.0f || wheel_x_ != 0.0 || wheel_y_ != 0.0 ||
           pages_x_ != 0.0 || pages_y_ != 0.0;
  }
  bool touching() const { return touch_mode_; }

 private:
  struct Step {  // a frame's state of the touch's button
    ImVec2 pos;
    bool down;
  };
  enum class Touch { None, Pending, Panning };
  Touch touch_ = Touch::None;
  ImVec2 start_, last_;           // where the touch started; where the pan last delivered from
  float pan_x_ = 0, pan_y_ = 0;   // finger movement not yet applied, in pixels (content follows: +y scrolls up);
                                  // under a pixel it waits for more, without asking for a frame
  bool pan_windows_chosen_ = false;
  ImGuiID pan_window_x_ = 0, pan_window_y_ = 0;  // the windows this pan scrolls, chosen on its first frame (0: none)
  double wheel_x_ = 0, wheel_y_ = 0;  // notches, the DOM's sign (positive right, down)
  double pages_x_ = 0, pages_y_ = 0;  // pages, made notches once the window's height is known
  std::deque<Step> steps_;            // a tap's press and release, one per frame
  bool touch_mode_ = false;           // the last pointer was a finger: its position overrides the platform's mouse
  ImVec2 touch_pos_;
  bool touch_down_ = false;
};

}  // namespace memsim::ui
