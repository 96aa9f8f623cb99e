// Dear ImGui without a window (like its example_null): frames are built but not rendered, so the UI code runs
// in the native test suite.
#pragma once
#include <imgui.h>

#include "ui/app.h"

struct HeadlessImGui {
  HeadlessImGui(float w, float h) {
    ImGui::CreateContext();
    ImGuiIO& io = ImGui::GetIO();
    io.IniFilename = nullptr;
    io.DisplaySize = ImVec2(w, h);
    unsigned char* px;
    int tw, th;
    io.Fonts->GetTexDataAsRGBA32(&px, &tw, &th);
  }
  ~HeadlessImGui() { ImGui::DestroyContext(); }
  int frame(memsim::ui::App& app) {
    ImGui::GetIO().DeltaTime = 1.0f / 60.0f;
    ImGui::NewFrame();
    app.frame();
    ImGui::Render();
    return ImGui::GetDrawData()->TotalVtxCount;
  }
};
