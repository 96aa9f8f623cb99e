#include <imgui.h>

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

std::string bytes_text(int64_t bytes, Unit unit) { return format_bytes(bytes, unit, unit == Unit::MiB ? 0 : 2); }

}  // namespace memsim::ui
