#include "clipboard.h"

#include <imgui.h>
#include <imgui_internal.h>  // the edit state of the active text field (ImGuiInputTextState), as of ImGui 1.86

namespace memsim::ui {

namespace {
const ImGuiInputTextState* edited_field() {
  const ImGuiContext& g = *GImGui;
  return g.ActiveId != 0 && g.InputTextState.ID == g.ActiveId ? &g.InputTextState : nullptr;
}
}  // namespace

bool editing_text() { return edited_field() != nullptr; }

bool text_field_copy(std::string& out) {
  const ImGuiInputTextState* state = edited_field();
  if (!state) return false;
  // ImGui copies nothing from a multi-line field without a selection. Its flags are cleared between frames, so a
  // multi-line field is known by the child window it draws in, which bears its id.
  const ImGuiContext& g = *GImGui;
  if (!state->HasSelection())
    for (const ImGuiWindow* w : g.Windows)
      if ((w->Flags & ImGuiWindowFlags_ChildWindow) && w->ChildId == state->ID) return false;
  const int b = state->HasSelection() ? ImMin(state->Stb.select_start, state->Stb.select_end) : 0;
  const int e = state->HasSelection() ? ImMax(state->Stb.select_start, state->Stb.select_end) : state->CurLenW;
  const ImWchar* text = state->TextW.Data;
  out.assign(static_cast<size_t>(ImTextCountUtf8BytesFromStr(text + b, text + e)) + 1, '\0');
  ImTextStrToUtf8(out.data(), static_cast<int>(out.size()), text + b, text + e);
  out.pop_back();  // the terminating zero
  return true;
}

}  // namespace memsim::ui
