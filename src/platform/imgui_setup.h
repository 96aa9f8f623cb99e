// Shared by both main loops: fonts and style. Platform layer only (it knows where font files live).
#pragma once
#include <imgui.h>

#include <cstdio>

namespace memsim::platform {

// DejaVu Sans from Debian's fonts-dejavu-core; the web build embeds the same file at /fonts. The font is
// rasterised at the device pixel ratio so text stays crisp on HiDPI screens.
inline void setup_imgui(const char* font_path, float pixel_ratio) {
  ImGuiIO& io = ImGui::GetIO();
  io.IniFilename = nullptr;  // no imgui.ini next to the user's files
  io.ConfigFlags |= ImGuiConfigFlags_NavEnableKeyboard;
  // A steady caret: the loops draw only when something happens, and a blinking one would either be an animation that
  // keeps them drawing at full rate while a field is edited, or stop in whichever phase the last frame caught.
  io.ConfigInputTextCursorBlink = false;
  ImGui::StyleColorsDark();
  ImGuiStyle& style = ImGui::GetStyle();
  style.FrameRounding = 3.0f;
  style.ChildRounding = 4.0f;
  style.WindowPadding = ImVec2(10, 8);
  io.Fonts->Clear();
  ImFont* font = nullptr;
  if (FILE* f = std::fopen(font_path, "rb")) {
    std::fclose(f);
    font = io.Fonts->AddFontFromFileTTF(font_path, 15.0f * pixel_ratio);
  }
  if (!font) io.Fonts->AddFontDefault();
  io.FontGlobalScale = font ? 1.0f / pixel_ratio : 1.0f;
}

// Whether a key or a mouse button is held, as of the last frame: the loops keep drawing meanwhile. ImGui repeats a
// held key or + button by the time it has been held over frames, so a loop that slept in between would count the whole
// sleep at the next frame and repeat a press that was only slow to be released.
inline bool input_held() {
  const ImGuiIO& io = ImGui::GetIO();
  for (bool down : io.KeysDown)
    if (down) return true;
  return ImGui::IsAnyMouseDown();
}

// The colour to clear the frame with: the main window's background as it would look over the old clear colour.
// The app draws its full-window window without a background (ui/app.cpp), so a software rasteriser clears the
// frame instead of blending and texturing a quad the size of the window.
inline ImVec4 clear_color() {
  const ImVec4 bg = ImGui::GetStyleColorVec4(ImGuiCol_WindowBg);
  const float under[3] = {0.08f, 0.08f, 0.09f};
  return ImVec4(bg.x * bg.w + under[0] * (1 - bg.w), bg.y * bg.w + under[1] * (1 - bg.w), bg.z * bg.w + under[2] * (1 - bg.w), 1.0f);
}

}  // namespace memsim::platform
