// The clipboard of the text fields, for a platform whose clipboard comes as events (the page: the browser's copy, cut
// and paste events, web/memsim-page.js). The browser asks for the copied text while it handles the key, before the
// next frame has run ImGui's Ctrl+C: these read what that Ctrl+C will copy from the field's edit state. The desktop's
// GLFW clipboard needs none of this.
#pragma once
#include <string>

namespace memsim::ui {

// Whether a text field is being edited (its text cursor is shown): a paste or a copy is for it.
bool editing_text();

// What Ctrl+C or Ctrl+X in the text field being edited puts on the clipboard, as ImGui does it: the selection, or a
// one-line field's whole text when nothing is selected. False when it copies nothing: no field is being edited, or a
// multi-line field has no selection. (A cut then deletes it, by ImGui's Ctrl+X; in a read-only field it only copies.)
bool text_field_copy(std::string& out);

}  // namespace memsim::ui
