// Builds the allocation/free program of a training step on one device from a validated config.
#pragma once
#include <cstdint>

#include "config.h"
#include "model.h"
#include "result.h"
#include "step.h"
#include "tables.h"

namespace memsim {

struct StepContext {
  const Config& config;
  const ModelShape& shape;
  const PrecisionRecipe& precision;
  const OptimizerSpec& optimizer;
  const GpuSpec* gpu;  // null for a custom GPU
  // The device's share of the model: pipeline stage `stage` holds layers [first_layer, end_layer), the
  // embeddings if has_pre and the final norm, head and loss if has_post. Defaults: the whole model.
  int64_t stage = 0;
  int64_t first_layer = 0;
  int64_t end_layer = INT64_MAX;
  bool has_pre = true;
  bool has_post = true;
};

// Persistent model-state bytes per device, before allocator rounding (ZeRO paper sec. 5, Table 1).
ModelStates model_state_bytes(const StepContext& ctx);

// Two iterations, so that the lazily created optimizer state (first step) and the steady state (second
// step, where the forward already carries that state) are both replayed.
StepProgram build_train_step(const StepContext& ctx);

}  // namespace memsim
