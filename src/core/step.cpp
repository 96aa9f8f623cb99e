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
    {"overhead", "Framework overhead"},      {"other_models", "Other models (reference, reward, frozen encoders)"},   {"generation", "Generation (KV cache, vLLM)"},
};
}  // namespace

const char* component_id(Component c) { return kComponentNames[static_cast<int>(c)].id; }
const char* component_label(Component c) { return kComponentNames[static_cast<int>(c)].label; }

uint32_t StepProgram::label(std::string text) {
  labels.push_back(std::move(text));
  return static_cast<uint32_t>(labels.size() - 1);
}

}  // namespace memsim
