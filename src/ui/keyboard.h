// Keyboard use of the interface, on Dear ImGui's keyboard navigation (ImGuiConfigFlags_NavEnableKeyboard):
// - the arrows move the focus to the nearest control in that direction, anywhere in the window (the panels are
//   one navigation space: ui/app.cpp flattens them);
// - Tab and Shift+Tab visit every control in reading order;
// - Space or Enter presses the focused button, toggles a checkbox or a section, opens a combo and picks its item,
//   selects a tab, applies a "What helps" change or a Fit explorer cell; on a number or text field Enter starts
//   editing (the text is selected, so typing replaces it) and Enter again commits it; Escape cancels an edit or
//   closes a combo;
// - the focused control is outlined, and what it is and holds is put into words (focus_announcement()), which the
//   page reads out through an ARIA live region and the tests read back.
#pragma once
#include <string>

namespace memsim::ui {

// Called once per frame right after ImGui::NewFrame(), before any item. ImGui 1.86 maps Enter only to text input
// and moves Tab only between text fields; this makes Enter press the focused control as Space does, and Tab visit
// every control (ImGui's internals of 1.86: later versions keep their own behaviour).
void keyboard_frame_start();
// Called once per frame after the last item (before ImGui::Render()): the frame's announcement becomes current.
void keyboard_frame_end();

// True when the last item has the keyboard focus and the focus is shown (the keyboard was used last).
bool item_has_keyboard_focus();

// For a widget made of several items (a number field with its - and + buttons): construct it before the widget,
// ask focused() after it.
class FocusProbe {
 public:
  FocusProbe();
  bool focused();

 private:
  bool saved_ = false;
};

// Keeps Tab and Shift+Tab from stopping on the next item while `skip` (a toolbar button greyed out because it would do
// nothing: Undo with nothing to undo). The arrows pass over it already, as over any disabled item. `id` is the item's
// (ImGui::GetID(label) of a button): where it has the focus already (Reset, just pressed), Tab goes on from it.
// Construct it right before the item, and let it go out of scope right after.
class TabSkip {
 public:
  TabSkip(bool skip, unsigned id);
  ~TabSkip();
  TabSkip(const TabSkip&) = delete;
  TabSkip& operator=(const TabSkip&) = delete;

 private:
  bool skip_ = false, cleared_ = false;
};

// Whether the item `id` has the keyboard focus and the focus is shown: for one item of a widget made of several (the -
// and + buttons of a number field).
bool id_has_keyboard_focus(unsigned id);

// The control being edited now (ImGui's active item: a text field typed into, a button held), 0 when none: the app
// makes one undo entry of a continuous edit of one control (ui/history.h), and leaves Ctrl+Z to a text field.
unsigned edited_control();

// Records `words` as this frame's announcement when `focused` (by default: the last item has the keyboard focus).
void announce_focus(const std::string& words);
void announce_focus(const std::string& words, bool focused);

// Outlines a rectangle as ImGui outlines a focused button: for items that draw nothing themselves (an
// InvisibleButton over a chart or a heatmap cell). Call it after the chart, so that the outline is on top.
void draw_focus_frame(float x0, float y0, float x1, float y1);

// What the focused control is, in words, from the last completed frame; "" while the focus is not shown.
const std::string& focus_announcement();

}  // namespace memsim::ui
