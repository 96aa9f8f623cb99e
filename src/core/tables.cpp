#include "tables.h"

#include "checked.h"

namespace memsim {

namespace {

constexpr PrecisionRecipe kPrecisions[] = {
    {"fp32", "fp32", 4, 4, 0, 4, 0,
     "DeepSpeed docs/code-docs/source/memory.rst: 16 B/param for fp32 Adam (4 params, 4 grads, 8 states)"},
    {"bf16_mixed", "bf16 + fp32 master (DeepSpeed/ZeRO)", 2, 2, 4, 4, 0,
     "ZeRO paper sec. 3.1: 2+2+K with K=12 (fp32 master, m, v); DeepSpeed engine.py get_data_types: "
     "grad_accum_dtype = model dtype when ZeRO is on"},
    {"amp_bf16", "bf16 autocast over fp32 weights (torch AMP)", 4, 4, 0, 4, 2,
     "aten/src/ATen/autocast_mode.cpp cached_cast: bf16 copies of fp32 leaf weights cached per forward"},
    {"bf16_pure", "pure bf16 (bf16 weights, grads and states)", 2, 2, 0, 2, 0,
     "torch/optim/adam.py _init_group: state = zeros_like(p), i.e. the param dtype"},
};

constexpr OptimizerSpec kOptimizers[] = {
    {"adamw", "AdamW", 2, 1, "torch/optim/adam.py _init_group (exp_avg, exp_avg_sq); _multi_tensor_adam _foreach_sqrt"},
    {"adam", "Adam", 2, 1, "torch/optim/adam.py _init_group; _multi_tensor_adam _foreach_sqrt"},
    {"sgd", "SGD (no momentum)", 0, 0, "torch/optim/sgd.py: no state without momentum"},
    {"sgd_momentum", "SGD with momentum", 1, 0, "torch/optim/sgd.py: momentum_buffer = clone(grad)"},
    {"lion", "Lion", 1, 0, "Chen et al. 2023 (Lion): one momentum buffer"},
};

// Capacities as nvidia-smi reports "Total" (MiB), the memory a process can address including the context.
constexpr GpuSpec kGpus[] = {
    {"a100-80gb", "NVIDIA A100 80GB", "nvidia", 81920 * kMiB, 80, "nvidia-smi: 81920MiB (A100-SXM4-80GB)"},
    {"a100-40gb", "NVIDIA A100 40GB", "nvidia", 40960 * kMiB, 80, "nvidia-smi: 40960MiB (A100-SXM4-40GB)"},
    {"h100-sxm", "NVIDIA H100 SXM 80GB", "nvidia", 81559 * kMiB, 90, "nvidia-smi: 81559MiB (H100 80GB HBM3)"},
    {"h100-pcie", "NVIDIA H100 PCIe 80GB", "nvidia", 81559 * kMiB, 90, "nvidia-smi: 81559MiB (H100 PCIe)"},
    {"h200", "NVIDIA H200 141GB", "nvidia", 143771 * kMiB, 90, "nvidia-smi: 143771MiB (H200)"},
    {"l4", "NVIDIA L4 24GB", "nvidia", 23034 * kMiB, 89, "nvidia-smi: 23034MiB (L4)"},
    {"a10g", "NVIDIA A10G 24GB", "nvidia", 23028 * kMiB, 86, "nvidia-smi: 23028MiB (A10G)"},
    {"t4", "NVIDIA T4 16GB", "nvidia", 15360 * kMiB, 75, "nvidia-smi: 15360MiB (Tesla T4)"},
    {"v100-32gb", "NVIDIA V100 32GB", "nvidia", 32510 * kMiB, 70, "nvidia-smi: 32510MiB (Tesla V100-SXM2-32GB)"},
    {"rtx-3090", "NVIDIA RTX 3090 24GB", "nvidia", 24576 * kMiB, 86, "nvidia-smi: 24576MiB (GeForce RTX 3090)"},
    {"rtx-4090", "NVIDIA RTX 4090 24GB", "nvidia", 24564 * kMiB, 89, "nvidia-smi: 24564MiB (GeForce RTX 4090)"},
    {"l40s", "NVIDIA L40S 48GB", "nvidia", 46068 * kMiB, 89, "nvidia-smi: 46068MiB (L40S)"},
};

template <typename T>
const T* find_by_id(std::span<const T> table, std::string_view id) {
  for (const auto& e : table)
    if (e.id == id) return &e;
  return nullptr;
}

}  // namespace

std::span<const PrecisionRecipe> precision_recipes() { return kPrecisions; }
std::span<const OptimizerSpec> optimizers() { return kOptimizers; }
std::span<const GpuSpec> gpus() { return kGpus; }

const PrecisionRecipe* find_precision(std::string_view id) { return find_by_id(precision_recipes(), id); }
const OptimizerSpec* find_optimizer(std::string_view id) { return find_by_id(optimizers(), id); }
const GpuSpec* find_gpu(std::string_view id) { return find_by_id(gpus(), id); }

}  // namespace memsim
