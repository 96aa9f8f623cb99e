// Library versions: one text field per library ("latest" by default) and a date. The switches left at auto derive from
// them (core/frameworks.cpp resolve()); each switch's own input shows what it resolved to, and this section lists the
// ones a stated version decides.
#include <imgui.h>
#include <imgui_stdlib.h>

#include <string>

#include "core/frameworks.h"
#include "core/versions.h"
#include "panels.h"

namespace memsim::ui {

namespace {

// A text field with its announcement, help and error, as the other text inputs have.
bool text_field(const char* label, const char* field, std::string& value, const std::string& help) {
  ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.35f);
  const bool changed = ImGui::InputText(label, &value);
  announce_text_input(label, value, help.c_str());
  help_marker(help.c_str(), item_has_keyboard_focus());
  field_error(field);
  return changed;
}

}  // namespace

bool switch_combo(const char* label, const char* field, std::string& value, const Resolved& resolved, Switch s,
                  const char* help) {
  const std::string from = switch_versions(resolved, s);
  const std::string resolved_value = switch_value(resolved, s);
  const std::string words = from.empty() ? std::string(help) : "auto is " + resolved_value + ", from " + from + ". " + help;
  const bool changed = choice_combo(label, field, value, resolved_value.c_str(), words.c_str());
  if (value == "auto" && !from.empty()) {  // the preview has room for the value only
    ImGui::Indent();
    ImGui::PushTextWrapPos(0.0f);
    ImGui::TextDisabled("from %s", from.c_str());
    ImGui::PopTextWrapPos();
    ImGui::Unindent();
  }
  return changed;
}

bool draw_versions_inputs(Config& c) {
  if (!section("Library versions")) return false;
  bool changed = false;
  ImGui::PushTextWrapPos(0.0f);
  ImGui::TextDisabled("latest: today's releases. A version (2.1, 2.1.2) or a date sets every switch left at auto.");
  ImGui::PopTextWrapPos();
  const StackVersions before = stack_versions(c.versions);
  for (const LibraryInfo& lib : libraries()) {
    const std::string help =
        std::string(lib.name) + "'s version: latest, or a release such as 2.1 or 2.1.2. " +
        (lib.sets.empty() ? std::string("No switch of memsim depends on it yet; it is kept with the config.")
                          : "It decides " + std::string(lib.sets) + ".");
    changed |= text_field(std::string(lib.name).c_str(), std::string(lib.field).c_str(), version_field(c.versions, lib.library),
                          help);
    const LibraryVersion& v = before[lib.library];
    if (v.from_date) {  // what the date picked, under the field it stands for
      ImGui::Indent();
      ImGui::PushTextWrapPos(0.0f);
      if (v.before_table)
        ImGui::TextDisabled("%s: the date is before the first release memsim knows", version_text(v.version).c_str());
      else
        ImGui::TextDisabled("%s, current at the date", version_text(v.version).c_str());
      ImGui::PopTextWrapPos();
      ImGui::Unindent();
    }
  }
  changed |= text_field("date", "versions.date", c.versions.date,
                        "The date of the run, 2023-10 or 2023-10-15 (a month is its first day); empty for none. Each "
                        "library left at latest takes its newest release on or before that day.");
  // The switches a stated version decides, as the result's notes name them.
  const Resolved rs = resolve(c);
  bool any = false;
  for (size_t i = 0; i < kSwitchCount; ++i) {
    const Switch s = static_cast<Switch>(i);
    if (rs.origin[i].kind != Origin::Kind::Version || !switch_applies(c, rs, s)) continue;
    if (!any) ImGui::TextDisabled("Switches these versions set (each input shows it as auto):");
    any = true;
    ImGui::BulletText("%s = %s", std::string(switch_field(s)).c_str(), switch_auto_label(rs, s).c_str());
  }
  return changed;
}

}  // namespace memsim::ui
