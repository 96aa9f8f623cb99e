#include <imgui.h>

#include <imgui_stdlib.h>

#include "core/frameworks.h"
#include "panels.h"

namespace memsim::ui {

void help_marker(const char* text) {
  ImGui::SameLine();
  ImGui::TextDisabled("(?)");
  if (ImGui::IsItemHovered()) {
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

bool int_input(const char* label, const char* field, int64_t& v, int64_t step, const char* help) {
  ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.55f);
  const int64_t fast = step * 8;
  bool changed = ImGui::InputScalar(label, ImGuiDataType_S64, &v, &step, &fast, "%lld");
  help_marker(help);
  field_error(field);
  return changed;
}

bool check_input(const char* label, const char* field, bool& v, const char* help) {
  bool changed = ImGui::Checkbox(label, &v);
  help_marker(help);
  field_error(field);
  return changed;
}

bool choice_combo(const char* label, const char* field, std::string& value, const char* auto_means, const char* help) {
  ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.55f);
  bool changed = false;
  std::string preview = value == "auto" ? std::string("auto (") + auto_means + ")" : value;
  if (ImGui::BeginCombo(label, preview.c_str())) {
    for (auto v : choices(field)) {
      const bool selected = v == value;
      std::string text = v == "auto" ? std::string("auto (") + auto_means + ")" : std::string(v);
      if (ImGui::Selectable(text.c_str(), selected)) value = std::string(v), changed = true;
    }
    ImGui::EndCombo();
  }
  help_marker(help);
  field_error(field);
  return changed;
}

bool double_input(const char* label, const char* field, double& v, const char* help) {
  ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.55f);
  bool changed = ImGui::InputDouble(label, &v, 0.05, 0.1, "%.2f");
  help_marker(help);
  field_error(field);
  return changed;
}


std::string bytes_text(int64_t bytes, Unit unit) { return format_bytes(bytes, unit, unit == Unit::MiB ? 0 : 2); }

bool string_combo(const char* label, const char* field, std::string& value, std::initializer_list<const char*> values,
                  const char* help) {
  ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.55f);
  bool changed = false;
  if (ImGui::BeginCombo(label, value.c_str())) {
    for (const char* v : values)
      if (ImGui::Selectable(v, value == v)) value = v, changed = true;
    ImGui::EndCombo();
  }
  help_marker(help);
  field_error(field);
  return changed;
}

}  // namespace memsim::ui
