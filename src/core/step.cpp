#include "step.h"

#include <string_view>
#include <vector>

#include "allocator.h"
#include "checked.h"

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

int64_t forward_retained_bytes(const StepProgram& p) {
  // "forward (step 2)" or "forward (step 2, micro-batch 1)" (schedule.cpp's phase names), not step 20's
  auto of_step2 = [](const std::string& name, std::string_view pass) {
    const std::string head = std::string(pass) + " (step 2";
    return name.compare(0, head.size(), head) == 0 && name.size() > head.size() &&
           (name[head.size()] == ')' || name[head.size()] == ',');
  };
  size_t f = 0;
  while (f < p.phases.size() && !of_step2(p.phases[f].name, "forward")) ++f;
  size_t b = f;
  while (b < p.phases.size() && !of_step2(p.phases[b].name, "backward")) ++b;
  if (b >= p.phases.size()) return -1;
  std::vector<bool> live(p.tensors.size(), false);
  for (uint32_t i = p.phases[f].first_event; i < p.phases[b].first_event && i < p.events.size(); ++i) {
    const Event& e = p.events[i];
    if (e.op == Event::Op::Alloc) live[e.tensor] = true;
    else if (e.op == Event::Op::Free) live[e.tensor] = false;
  }
  int64_t total = 0;
  for (size_t t = 0; t < live.size(); ++t)
    if (live[t] && p.tensors[t].bytes > 0) total = add(total, CachingAllocator::round_size(p.tensors[t].bytes));
  return total;
}

uint32_t StepProgram::label(std::string text) {
  labels.push_back(label_prefix.empty() ? std::move(text) : label_prefix + text);
  return static_cast<uint32_t>(labels.size() - 1);
}

}  // namespace memsim
