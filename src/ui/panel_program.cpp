// The Model section when the model is a program (core/architecture.h): which program, one input per hyperparameter
// it declares (written to model.architecture_args, which keeps only what differs from the program's defaults), the
// arguments as text, and a way back to the built-in families. The built-in families' fields do not apply to a
// program, so the section shows these instead of them.
#include <imgui.h>
#include <imgui_stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "core/architecture.h"
#include "panels.h"

namespace memsim::ui {

bool draw_program_model(ModelConfig& m) {
  bool changed = false;
  // Decoded once per change of the program or its arguments: the page redraws many frames of one setup. The program
  // with its defaults gives the inputs even while the user's values break it (the message says where).
  static std::string decoded_spec, decoded_args, summary;
  static std::shared_ptr<const Architecture> plain;
  if (decoded_spec != m.architecture || decoded_args != m.architecture_args) {
    decoded_spec = m.architecture, decoded_args = m.architecture_args;
    std::shared_ptr<const Architecture> a;
    decode_architecture(m.architecture, m.architecture_args, a);
    plain.reset();
    decode_architecture(m.architecture, "", plain);
    if (a) {
      const ArchStage& first = a->blocks.front();
      const auto& in = first.tensors[static_cast<size_t>(first.input)].shape;
      std::string over = std::to_string(a->tokens) + " rows of " + std::to_string(a->width);
      if (in.size() == 3) over = "a " + std::to_string(in[0]) + " x " + std::to_string(in[1]) + " x " + std::to_string(in[2]) + " map first";
      summary = (a->title.empty() ? a->name : a->title) + " (program \"" + a->name + "\"): " + std::to_string(a->repeat) +
                " blocks" + (a->blocks.size() > 1 ? " of " + std::to_string(a->blocks.size()) + " kinds" : "") + " over " + over + ".";
    }
    else
      summary = "A model program that does not hold with these values (the message below says where).";
  }
  ImGui::TextWrapped("%s", summary.c_str());
  field_error("model.architecture");
  if (plain) {
    for (const auto& [name, fallback] : plain->defaults) {
      const double current = architecture_arg(m.architecture_args, name, fallback);
      char default_text[32];
      std::snprintf(default_text, sizeof default_text, "%g", fallback);
      const std::string help = "A hyperparameter of the program (its config.json key); the program's default is " +
                               std::string(default_text) + ".";
      // Each input's own field: the arguments' message shows once, below them all.
      const std::string field = "model.architecture_args." + name;
      bool edited = false;
      double next = current;
      // Counts (widths, layers, sizes, labels) as integers; a default of 0 is a rate or probability (dropout), unless
      // its value is a whole number of 2 or more, which no probability is (Flux's height and width: 0 means the
      // resolution's).
      // A switch (an op's flag: a bias, a tied head, a model kept on the GPU) set to on or off: a checkbox.
      const bool is_switch = std::find(plain->switches.begin(), plain->switches.end(), name) != plain->switches.end();
      if (is_switch && (current == 0 || current == 1) && (fallback == 0 || fallback == 1)) {
        bool on = current != 0;
        edited = check_input(name.c_str(), field.c_str(), on, help.c_str());
        next = on ? 1 : 0;
      } else if (current == std::floor(current) && fallback == std::floor(fallback) && (fallback != 0 || current >= 2) && std::fabs(current) < 1e15) {
        int64_t v = static_cast<int64_t>(current);
        edited = int_input(name.c_str(), field.c_str(), v, 1, help.c_str());
        next = static_cast<double>(v);
      } else {
        edited = double_input(name.c_str(), field.c_str(), next, help.c_str());
      }
      if (edited && next != current) {
        m.architecture_args = set_architecture_arg(m.architecture_args, name, next, fallback);
        changed = true;
      }
    }
  }
  if (subsection("Arguments as text")) {
    const FieldSpec& args = field_spec("model.architecture_args");
    ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.55f);
    changed |= ImGui::InputText(args.label.data(), &m.architecture_args);
    announce_text_input(args.label.data(), m.architecture_args, args.help.data());
    help_marker(args.help.data(), item_has_keyboard_focus());
    ImGui::TreePop();
  }
  field_error("model.architecture_args");
  if (ImGui::SmallButton("Use a built-in family instead")) {
    m.architecture.clear(), m.architecture_args.clear();
    changed = true;
  }
  announce_focus("Use a built-in family instead, button: the model's fields below come back");
  return changed;
}

}  // namespace memsim::ui
