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

}  // namespace memsim::platform
