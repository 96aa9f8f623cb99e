#include "step.h"

namespace memsim {

namespace {
struct ComponentName {
  const char* id;
  const char* label;
};
constexpr ComponentName kComponentNames[kComponentCount] = {
    {"weights", "Weights"},           {"gradients", "Gradients"},         {"optimizer_states", "Optimizer states"},
    {"activations", "Activations"},   {"temporaries", "Temporaries"},     {"communication", "Communication"},
    {"overhead", "Framework overhead"},
};
}  // namespace

const char* component_id(Component c) { return kComponentNames[static_cast<int>(c)].id; }
const char* component_label(Component c) { return kComponentNames[static_cast<int>(c)].label; }

uint32_t StepProgram::label(const std::string& text) {
  labels.push_back(text);
  return static_cast<uint32_t>(labels.size() - 1);
}

uint32_t StepProgram::alloc(Component c, int64_t bytes, uint32_t label_id, int32_t layer) {
  tensors.push_back({bytes, c, static_cast<uint16_t>(label_id), static_cast<int16_t>(layer)});
  uint32_t t = static_cast<uint32_t>(tensors.size() - 1);
  events.push_back({Event::Op::Alloc, c, t});
  return t;
}

void StepProgram::free(uint32_t tensor) { events.push_back({Event::Op::Free, tensors[tensor].component, tensor}); }

}  // namespace memsim
