#include <imgui.h>

#include <imgui_stdlib.h>

#include <cstdio>
#include <string>

#include "core/frameworks.h"
#include "keyboard.h"
#include "panels.h"

namespace memsim::ui {

void help_marker(const char* text, bool focused) {
  ImGui::SameLine();
  ImGui::TextDisabled("(?)");
  // Hovering the mark shows the help, and so does the keyboard focus on the input it explains (while the input is
  // not being edited: the tooltip would cover what is typed).
  if (ImGui::IsItemHovered() || (focused && !ImGui::GetIO().WantTextInput)) {
    ImGui::BeginTooltip();
    ImGui::PushTextWrapPos(ImGui::GetFontSize() * 32.0f);
    ImGui::TextUnformatted(text);
    ImGui::PopTextWrapPos();
    ImGui::EndTooltip();
  }
}

namespace {
const Result* g_result = nullptr;  // the last result, for per-field errors while the inputs are drawn
}  // namespace

void set_field_errors(const Result* r) { g_result = r; }


void field_error(const char* field) {
  if (!g_result) return;
  for (const auto& e : g_result->errors)
    if (e.field == field) {
      ImGui::PushStyleColor(ImGuiCol_Text, IM_COL32(255, 110, 110, 255));
      ImGui::PushTextWrapPos(0.0f);
      ImGui::TextUnformatted(e.message.c_str());
      ImGui::PopTextWrapPos();
      ImGui::PopStyleColor();
    }
}

// "label: value. help", or with the field's error, for the announcement of a focused input.
std::string focus_words(const char* label, const std::string& value, const char* field, const char* help) {
  std::string words = std::string(label) + ": " + value + ". " + help;
  if (g_result)
    for (const auto& e : g_result->errors)
      if (e.field == field) words += " Problem: " + e.message;
  return words;
}

namespace {

// The - and + buttons of a number field (ImGui::InputScalar with a step), known by their ids before it is drawn: a
// screen reader hears "decrease micro_batch_size" on the - button, not the field's own words.
struct StepButtons {
  ImGuiID minus = 0, plus = 0;
  explicit StepButtons(const char* label) {
    ImGui::PushID(label);  // as InputScalar names its buttons
    minus = ImGui::GetID("-");
    plus = ImGui::GetID("+");
    ImGui::PopID();
  }
  // The words of the focused part: a button's, or the field's (`field_words`).
  std::string words(const char* label, const std::string& value, std::string field_words) const {
    if (id_has_keyboard_focus(minus)) return std::string("decrease ") + label + ", button: " + value;
    if (id_has_keyboard_focus(plus)) return std::string("increase ") + label + ", button: " + value;
    return field_words;
  }
};

}  // namespace

bool int_input(const char* label, const char* field, int64_t& v, int64_t step, const char* help) {
  ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.55f);
  const int64_t fast = step * 8;
  const StepButtons buttons(label);
  FocusProbe probe;  // the field and its - and + buttons
  bool changed = ImGui::InputScalar(label, ImGuiDataType_S64, &v, &step, &fast, "%lld");
  const bool focused = probe.focused();
  const std::string value = std::to_string(v);
  announce_focus(buttons.words(label, value, focus_words(label, value, field, help)), focused);
  help_marker(help, focused);
  field_error(field);
  return changed;
}

bool check_input(const char* label, const char* field, bool& v, const char* help) {
  bool changed = ImGui::Checkbox(label, &v);
  const bool focused = item_has_keyboard_focus();
  announce_focus(focus_words(label, v ? "on, checkbox" : "off, checkbox", field, help), focused);
  help_marker(help, focused);
  field_error(field);
  return changed;
}

bool choice_combo(const char* label, const char* field, std::string& value, const char* auto_means, const char* help) {
  ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.55f);
  bool changed = false;
  std::string preview = value == "auto" ? std::string("auto (") + auto_means + ")" : value;
  const bool open = ImGui::BeginCombo(label, preview.c_str());
  const bool focused = item_has_keyboard_focus();
  announce_focus(focus_words(label, preview + ", list", field, help), focused);
  if (open) {
    for (auto v : choices(field)) {
      const bool selected = v == value;
      std::string text = v == "auto" ? std::string("auto (") + auto_means + ")" : std::string(v);
      if (ImGui::Selectable(text.c_str(), selected)) value = std::string(v), changed = true;
      if (selected && ImGui::IsWindowAppearing()) ImGui::SetItemDefaultFocus();
      announce_focus(text + (selected ? ", chosen" : ""));
    }
    ImGui::EndCombo();
  }
  help_marker(help, focused);
  field_error(field);
  return changed;
}

bool double_input(const char* label, const char* field, double& v, const char* help) {
  ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.55f);
  const StepButtons buttons(label);
  FocusProbe probe;
  bool changed = ImGui::InputDouble(label, &v, 0.05, 0.1, "%.2f");
  const bool focused = probe.focused();
  char value[32];
  std::snprintf(value, sizeof value, "%.2f", v);
  announce_focus(buttons.words(label, value, focus_words(label, value, field, help)), focused);
  help_marker(help, focused);
  field_error(field);
  return changed;
}


bool index_combo(const char* label, int& index, std::initializer_list<const char*> items) {
  return index_combo(label, index, items.begin(), static_cast<int>(items.size()));
}

bool index_combo(const char* label, int& index, const char* const* begin, int count) {
  bool changed = false;
  if (ImGui::BeginCombo(label, index >= 0 && index < count ? begin[index] : "")) {
    for (int i = 0; i < count; ++i) {
      if (ImGui::Selectable(begin[i], i == index) && i != index) index = i, changed = true;
      if (i == index && ImGui::IsWindowAppearing()) ImGui::SetItemDefaultFocus();
      announce_focus(std::string(begin[i]) + (i == index ? ", chosen" : ""));
    }
    ImGui::EndCombo();
  }
  return changed;
}

bool section(const char* label) {
  const bool open = ImGui::CollapsingHeader(label, ImGuiTreeNodeFlags_DefaultOpen);
  announce_focus(std::string(label) + (open ? " section, open" : " section, closed: Space or Enter opens it"));
  return open;
}

bool subsection(const char* label) {
  const bool open = ImGui::TreeNode(label);
  announce_focus(std::string(label) + (open ? ", open" : ", closed: Space, Enter or the right arrow opens it"));
  return open;
}

void announce_text_input(const char* label, const std::string& value, const char* help) {
  announce_focus(std::string(label) + ": " + (value.empty() ? "empty" : value) + ", text. " + help);
}

bool advance_until(Simulation& sim, std::chrono::steady_clock::time_point deadline) {
  // A fixed shape is done in its first call; a run advances a step per call, so a frame stops close to its budget.
  while (!sim.advance(1))
    if (std::chrono::steady_clock::now() >= deadline) return false;
  return true;
}

namespace {
bool g_work_left = false;
}  // namespace

void note_work_left() { g_work_left = true; }

bool take_work_left() {
  const bool left = g_work_left;
  g_work_left = false;
  return left;
}

std::string bytes_text(int64_t bytes, Unit unit) { return format_bytes(bytes, unit, unit == Unit::MiB ? 0 : 2); }

bool string_combo(const char* label, const char* field, std::string& value, std::initializer_list<const char*> values,
                  const char* help) {
  ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.55f);
  bool changed = false;
  const bool open = ImGui::BeginCombo(label, value.c_str());
  const bool focused = item_has_keyboard_focus();
  announce_focus(focus_words(label, value + ", list", field, help), focused);
  if (open) {
    for (const char* v : values) {
      if (ImGui::Selectable(v, value == v)) value = v, changed = true;
      if (value == v && ImGui::IsWindowAppearing()) ImGui::SetItemDefaultFocus();
      announce_focus(std::string(v) + (value == v ? ", chosen" : ""));
    }
    ImGui::EndCombo();
  }
  help_marker(help, focused);
  field_error(field);
  return changed;
}

// The registry's strings are literals (core/fields.cpp), so their data() ends in a NUL.
const FieldSpec& field_spec(const char* field) {
  static const FieldSpec kUnknown{"", nullptr, FieldKind::Text, kNoRange, {}, 0, "", ""};
  const FieldSpec* f = find_field(field);
  return f ? *f : kUnknown;
}

bool int_input(const char* field, int64_t& v, int64_t step) {
  const FieldSpec& f = field_spec(field);
  return int_input(f.label.data(), field, v, step, f.help.data());
}

bool check_input(const char* field, bool& v) {
  const FieldSpec& f = field_spec(field);
  return check_input(f.label.data(), field, v, f.help.data());
}

bool double_input(const char* field, double& v) {
  const FieldSpec& f = field_spec(field);
  return double_input(f.label.data(), field, v, f.help.data());
}

bool choice_combo(const char* field, std::string& value, const char* auto_means) {
  const FieldSpec& f = field_spec(field);
  return choice_combo(f.label.data(), field, value, auto_means, f.help.data());
}

bool switch_combo(const char* field, std::string& value, const Resolved& resolved, Switch s) {
  const FieldSpec& f = field_spec(field);
  return switch_combo(f.label.data(), field, value, resolved, s, f.help.data());
}

bool string_combo(const char* field, std::string& value, std::initializer_list<const char*> values) {
  const FieldSpec& f = field_spec(field);
  return string_combo(f.label.data(), field, value, values, f.help.data());
}

}  // namespace memsim::ui
