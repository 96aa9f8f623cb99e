#include "pointer.h"

#include <imgui_internal.h>

namespace memsim::ui {

namespace {

// The font height ImGui's wheel step is made of, before NewFrame has set the frame's font.
float font_height(const ImGuiIO& io) {
  const ImFont* font = io.FontDefault ? io.FontDefault : (io.Fonts->Fonts.Size > 0 ? io.Fonts->Fonts[0] : nullptr);
  return (font ? font->FontSize : 13.0f) * io.FontGlobalScale;
}

// The window that a pan along one axis scrolls: the one under the pointer, or its nearest parent that scrolls along it,
// as ImGui picks the window for the wheel (imgui.cpp UpdateMouseWheel), or none.
ImGuiID scrolling_window(ImGuiWindow* w, bool vertical) {
  for (; w; w = w->ParentWindow) {
    const float max = vertical ? w->ScrollMax.y : w->ScrollMax.x;
    if (max > 0.0f && !(w->Flags & (ImGuiWindowFlags_NoScrollWithMouse | ImGuiWindowFlags_NoMouseInputs))) return w->ID;
    if (!(w->Flags & ImGuiWindowFlags_ChildWindow)) break;
  }
  return 0;
}

}  // namespace

void PointerInput::wheel(double dx, double dy, int mode) {
  if (mode == 2) {
    pages_x_ += dx, pages_y_ += dy;
    return;
  }
  const double per_notch = mode == 1 ? kLinesPerNotch : kPixelsPerNotch;
  wheel_x_ += dx / per_notch;
  wheel_y_ += dy / per_notch;
}

void PointerInput::touch_start(float x, float y) {
  touch_ = Touch::Pending;
  start_ = last_ = ImVec2(x, y);
  pan_x_ = pan_y_ = 0;
  pan_windows_chosen_ = false;
  // The pointer goes to the finger without a press: what is under it shows hovered, and a pan scrolls the window there.
  touch_mode_ = true;
  touch_pos_ = start_;
  touch_down_ = false;
}

void PointerInput::touch_move(float x, float y) {
  if (touch_ == Touch::None) return;
  if (touch_ == Touch::Pending) {
    const float dx = x - start_.x, dy = y - start_.y;
    if (dx * dx + dy * dy <= kTapSlop * kTapSlop) return;
    touch_ = Touch::Panning;  // from here on it only scrolls, from where it started, so the content keeps up
  }
  pan_x_ += x - last_.x;
  pan_y_ += y - last_.y;
  last_ = ImVec2(x, y);
}

void PointerInput::touch_end(float x, float y) {
  if (touch_ == Touch::Pending) {
    // A tap: press and release where the touch started (where it showed hovered), in two frames.
    steps_.push_back({start_, true});
    steps_.push_back({start_, false});
  } else if (touch_ == Touch::Panning) {
    touch_move(x, y);
  }
  touch_ = Touch::None;
}

void PointerInput::touch_cancel() {
  touch_ = Touch::None;
  pan_x_ = pan_y_ = 0;
}

void PointerInput::mouse_used() {
  touch_mode_ = false;
  touch_down_ = false;
}

void PointerInput::before_new_frame(ImGuiIO& io) {
  if (!steps_.empty()) {
    touch_mode_ = true;
    touch_pos_ = steps_.front().pos;
    touch_down_ = steps_.front().down;
    steps_.pop_front();
  }
  if (touch_mode_) {
    io.MousePos = touch_pos_;
    io.MouseDown[0] = touch_down_;
  }
  // A page is a share of the window's height, in ImGui's wheel steps of five font heights.
  const double step = 5.0 * font_height(io);
  const double page = kPageShare * io.DisplaySize.y / step;
  const double x = wheel_x_ + pages_x_ * page, y = wheel_y_ + pages_y_ * page;
  wheel_x_ = wheel_y_ = pages_x_ = pages_y_ = 0;
  // ImGui's wheel is positive up and left, the DOM's down and right.
  if (io.KeyShift && y == 0.0 && x != 0.0) {
    // Shift+wheel: the browser has turned it sideways already, and ImGui turns a vertical wheel sideways itself when
    // Shift is down (and ignores the horizontal one then): hand it over as vertical so that it is turned back.
    io.MouseWheel -= static_cast<float>(x);
  } else {
    io.MouseWheel -= static_cast<float>(y);
    io.MouseWheelH -= static_cast<float>(x);
  }
}

void PointerInput::after_new_frame() {
  if (std::abs(pan_x_) < 1.0f && std::abs(pan_y_) < 1.0f) return;
  ImGuiContext& g = *GImGui;
  if (!pan_windows_chosen_) {  // the window under the finger now, at the pan's first frame (the pointer is at its start)
    pan_windows_chosen_ = true;
    pan_window_x_ = scrolling_window(g.HoveredWindow, false);
    pan_window_y_ = scrolling_window(g.HoveredWindow, true);
  }
  // Whole pixels: ImGui floors the scroll position, so fractions would be lost a frame at a time; they wait for more.
  const float px = std::trunc(pan_x_), py = std::trunc(pan_y_);
  pan_x_ -= px, pan_y_ -= py;
  if (ImGuiWindow* w = pan_window_x_ ? ImGui::FindWindowByID(pan_window_x_) : nullptr; w && px != 0.0f)
    ImGui::SetScrollX(w, w->Scroll.x - px);
  if (ImGuiWindow* w = pan_window_y_ ? ImGui::FindWindowByID(pan_window_y_) : nullptr; w && py != 0.0f)
    ImGui::SetScrollY(w, w->Scroll.y - py);
}

}  // namespace memsim::ui
