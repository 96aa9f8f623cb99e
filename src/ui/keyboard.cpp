#include "keyboard.h"

#include <imgui.h>
#include <imgui_internal.h>  // the navigation state of ImGui 1.86 (see keyboard_frame_start)

namespace memsim::ui {

namespace {
std::string g_building, g_announced;  // this frame's words, and the last completed frame's
// Where the focus was at the end of the last frame (checked against the current context and its windows before use:
// the tests make and destroy several contexts).
struct SavedFocus {
  ImGuiContext* context = nullptr;
  ImGuiID id = 0, scope = 0;
  ImGuiWindow* window = nullptr;
  ImRect rect;
} g_saved;
// Whether this frame's Tab request is one keyboard_frame_start() opened to every item (TabSkip closes it again for one).
bool g_tab_to_all = false;
}  // namespace

void keyboard_frame_start() {
  g_building.clear();
  g_tab_to_all = false;
#if IMGUI_VERSION_NUM < 18700
  ImGuiContext& g = *GImGui;
  const bool shown = g.NavId != 0 && !g.NavDisableHighlight;
  // Tab: NavUpdate() has just made a tabbing request that only text fields answer (ImGuiItemFlags_Inputable).
  // FocusApi lets every item answer, as SetKeyboardFocusHere() does; a text field still starts editing when Tab
  // lands on it. ImGui 1.86 also restarts at the first field when no item is being edited (direction 0): from a
  // focused button, go on from it instead.
  if (g.NavMoveSubmitted && (g.NavMoveFlags & ImGuiNavMoveFlags_Tabbing) && !(g.NavMoveFlags & ImGuiNavMoveFlags_FocusApi)) {
    g.NavMoveFlags |= ImGuiNavMoveFlags_FocusApi;
    g_tab_to_all = true;
    if (g.NavTabbingDir == 0 && shown) g.NavTabbingDir = +1;
  }
  // Escape on a control that is not being edited: ImGui leaves the child window the focus is in, and focuses the
  // child itself. The panels are flattened into one navigation space (ui/app.cpp), so that child is not a control:
  // the focus would vanish and Tab find nothing. Keep the focus on its control instead.
  ImGuiWindow* left = g_saved.context == &g && g.Windows.contains(g_saved.window) ? g_saved.window : nullptr;
  if (left && g.NavId != 0 && g.NavId == left->ChildId && (left->Flags & ImGuiWindowFlags_NavFlattened) &&
      left->ParentWindow == g.NavWindow) {
    ImGui::FocusWindow(left);
    ImGui::SetNavID(g_saved.id, ImGuiNavLayer_Main, g_saved.scope, g_saved.rect);
  }
  // Enter: ImGui 1.86 reads it as "edit the text of the focused item" only. Make it press the focused item as Space
  // does, unless a field is being edited (then Enter commits it, as before).
  const bool enter = ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Enter), false) ||
                     ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_KeyPadEnter), false);
  if (enter && shown && g.ActiveId == 0 && g.NavActivateId == 0 && g.NavWindow &&
      !(g.NavWindow->Flags & ImGuiWindowFlags_NoNavInputs) && (g.IO.ConfigFlags & ImGuiConfigFlags_NavEnableKeyboard)) {
    g.NavActivateId = g.NavActivateDownId = g.NavActivatePressedId = g.NavId;
    g.NavActivateFlags = ImGuiActivateFlags_None;
  }
#endif
}

void keyboard_frame_end() {
  g_announced = g_building;
#if IMGUI_VERSION_NUM < 18700
  ImGuiContext& g = *GImGui;
  g_saved = {};
  if (g.NavId != 0 && g.NavIdIsAlive && g.NavWindow)
    g_saved = {&g, g.NavId, g.NavFocusScopeId, g.NavWindow, g.NavWindow->NavRectRel[ImGuiNavLayer_Main]};
#endif
}

// ImGuiItemFlags_NoTabStop is what later ImGui versions skip; in 1.86 every item answers the Tab request that
// keyboard_frame_start() opened (FocusApi), so the request is closed to the one item, unless it holds the focus: the
// request counts from the focused item (NavProcessItemForTabbingRequest), so it must see it.
TabSkip::TabSkip(bool skip, unsigned id) : skip_(skip) {
  if (!skip_) return;
  ImGui::PushItemFlag(ImGuiItemFlags_NoTabStop, true);
#if IMGUI_VERSION_NUM < 18700
  ImGuiContext& g = *GImGui;
  if (g_tab_to_all && g.NavMoveScoringItems && (g.NavMoveFlags & ImGuiNavMoveFlags_FocusApi) && g.NavId != id) {
    g.NavMoveFlags &= ~ImGuiNavMoveFlags_FocusApi;
    cleared_ = true;
  }
#else
  (void)id;
#endif
}

TabSkip::~TabSkip() {
  if (!skip_) return;
  ImGui::PopItemFlag();
#if IMGUI_VERSION_NUM < 18700
  if (cleared_) GImGui->NavMoveFlags |= ImGuiNavMoveFlags_FocusApi;
#endif
}

bool item_has_keyboard_focus() { return ImGui::IsItemFocused() && ImGui::GetIO().NavVisible; }

// ImGui marks the focused item alive when it is submitted (NavProcessItem): whether that happened between the
// probe's construction and focused() says whether one of the widget's items has the focus.
FocusProbe::FocusProbe() {
  ImGuiContext& g = *GImGui;
  saved_ = g.NavIdIsAlive;
  g.NavIdIsAlive = false;
}

bool FocusProbe::focused() {
  ImGuiContext& g = *GImGui;
  const bool inside = g.NavIdIsAlive;
  g.NavIdIsAlive = g.NavIdIsAlive || saved_;
  return inside && ImGui::GetIO().NavVisible;
}

bool id_has_keyboard_focus(unsigned id) {
  const ImGuiContext& g = *GImGui;
  return id != 0 && g.NavId == id && g.IO.NavVisible;
}

unsigned edited_control() { return ImGui::GetActiveID(); }

void announce_focus(const std::string& words) { announce_focus(words, item_has_keyboard_focus()); }

void announce_focus(const std::string& words, bool focused) {
  if (focused) g_building = words;
}

void draw_focus_frame(float x0, float y0, float x1, float y1) {
  const float pad = 2.0f;
  ImGui::GetWindowDrawList()->AddRect(ImVec2(x0 - pad, y0 - pad), ImVec2(x1 + pad, y1 + pad),
                                      ImGui::GetColorU32(ImGuiCol_NavHighlight), ImGui::GetStyle().FrameRounding, 0, 2.0f);
}

const std::string& focus_announcement() { return g_announced; }

}  // namespace memsim::ui
