// The lookup tables a config refers to by id: precision recipes, optimizers and GPUs. Adding an entry is a
// one-line change here plus its test; everything else (validation, UI combos, CLI) reads these tables.
#pragma once
#include <cstdint>
#include <span>
#include <string_view>

namespace memsim {

// Bytes per parameter element of each persistent model-state tensor (MEMORY_FORMULAS.md 1.2).
struct PrecisionRecipe {
  std::string_view id;
  std::string_view label;
  int64_t weight_bytes;        // the model's own parameters
  int64_t grad_bytes;          // .grad (or the framework's gradient buffer)
  int64_t master_bytes;        // separate fp32 master copy held by the optimizer, 0 if none
  int64_t state_bytes;         // dtype of optimizer states (torch: same dtype as the param they track)
  int64_t autocast_copy_bytes; // low-precision copy of each matmul weight made by torch.autocast, 0 if none
  std::string_view source;
};

struct OptimizerSpec {
  std::string_view id;
  std::string_view label;
  int64_t states_per_param;  // full-size state tensors per parameter tensor (Adam: exp_avg, exp_avg_sq)
  // Full-size temporary of the foreach implementation, in state-sized tensors over the whole param group
  // (Adam: the _foreach_sqrt list); 0 where there is none.
  int64_t foreach_temp_states;
  std::string_view source;
};

struct GpuSpec {
  std::string_view id;
  std::string_view label;
  std::string_view vendor;
  int64_t memory_bytes;  // total as the process sees it (nvidia-smi "Total", rocm-smi VRAM total)
  int compute_capability;  // 80 = sm_80; 0 for non-NVIDIA
  std::string_view source;
};

std::span<const PrecisionRecipe> precision_recipes();
std::span<const OptimizerSpec> optimizers();
std::span<const GpuSpec> gpus();

const PrecisionRecipe* find_precision(std::string_view id);
const OptimizerSpec* find_optimizer(std::string_view id);
const GpuSpec* find_gpu(std::string_view id);

}  // namespace memsim
