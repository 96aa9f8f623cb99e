// The Model section when the model is a program (core/architecture.h): which program, its hyperparameters that differ
// from the program's defaults (model.architecture_args), and a way back to the built-in families. The built-in
// families' fields do not apply to a program, so the section shows these instead of them.
#include <imgui.h>
#include <imgui_stdlib.h>

#include <memory>
#include <string>

#include "core/architecture.h"
#include "panels.h"

namespace memsim::ui {

bool draw_program_model(ModelConfig& m) {
  bool changed = false;
  // Decoded once per change of the program or its arguments: the page redraws many frames of one setup.
  static std::string decoded_spec, decoded_args, summary;
  if (decoded_spec != m.architecture || decoded_args != m.architecture_args) {
    decoded_spec = m.architecture, decoded_args = m.architecture_args;
    std::shared_ptr<const Architecture> a;
    const auto errors = decode_architecture(m.architecture, m.architecture_args, a);
    if (a)
      summary = (a->title.empty() ? a->name : a->title) + " (program \"" + a->name + "\"): " + std::to_string(a->repeat) +
                " blocks over " + std::to_string(a->tokens) + " rows of " + std::to_string(a->width) + ".";
    else
      summary = "A model program that does not decode (the message below says where).";
  }
  ImGui::TextWrapped("%s", summary.c_str());
  field_error("model.architecture");
  const FieldSpec& args = field_spec("model.architecture_args");
  ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.55f);
  changed |= ImGui::InputText(args.label.data(), &m.architecture_args);
  announce_text_input(args.label.data(), m.architecture_args, args.help.data());
  help_marker(args.help.data(), item_has_keyboard_focus());
  field_error("model.architecture_args");
  if (ImGui::SmallButton("Use a built-in family instead")) {
    m.architecture.clear(), m.architecture_args.clear();
    changed = true;
  }
  announce_focus("Use a built-in family instead, button: the model's fields below come back");
  return changed;
}

}  // namespace memsim::ui
