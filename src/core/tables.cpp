#include "tables.h"

#include "checked.h"

namespace memsim {

namespace {

// weight, grad, master, state, autocast copy, activation, residual (bytes per element), fp16 (not bf16).
constexpr PrecisionRecipe kPrecisions[] = {
    {"fp32", "fp32", 4, 4, 0, 4, 0, 4, 4, false,
     "DeepSpeed docs/code-docs/source/memory.rst: 16 B/param for fp32 Adam (4 params, 4 grads, 8 states)"},
    {"bf16_mixed", "bf16 + fp32 master (DeepSpeed/ZeRO)", 2, 2, 4, 4, 0, 2, 2, false,
     "ZeRO paper sec. 3.1: 2+2+K with K=12 (fp32 master, m, v); DeepSpeed engine.py get_data_types: "
     "grad_accum_dtype = model dtype when ZeRO is on"},
    {"bf16_fp32_grads", "bf16 + fp32 main grads and master (Megatron)", 2, 4, 4, 4, 0, 2, 2, false,
     "Megatron distrib_optimizer.md: bf16 params, fp32 main grads = 18 B/param (6 + 12/d distributed)"},
    {"fp16_mixed", "fp16 + fp32 master (DeepSpeed fp16, loss scaling)", 2, 2, 4, 4, 0, 2, 2, true,
     "ZeRO paper sec. 3.1: 2+2+12 = 16 B/param"},
    {"amp_bf16", "bf16 autocast over fp32 weights (torch AMP)", 4, 4, 0, 4, 2, 2, 4, false,
     "aten/src/ATen/autocast_mode.cpp cached_cast: bf16 copies of fp32 leaf weights cached per forward; "
     "the residual stream stays fp32 (embedding and add are not autocast ops)"},
    {"amp_fp16", "fp16 autocast over fp32 weights (torch AMP)", 4, 4, 0, 4, 2, 2, 4, true,
     "aten/src/ATen/autocast_mode.cpp cached_cast (fp16 as lower_precision_fp)"},
    {"bf16_pure", "pure bf16 (bf16 weights, grads and states)", 2, 2, 0, 2, 0, 2, 2, false,
     "torch/optim/adam.py _init_group: state = zeros_like(p), i.e. the param dtype"},
    {"fp16_autocast", "fp16 weights under fp16 autocast (HF Trainer fp16=True over an fp16 load, with PEFT; diffusers LoRA)", 2, 2, 0, 2, 0, 2, 2, true,
     "transformers trainer.py compute_loss_context_manager / accelerate prepare_model: forward under torch.autocast "
     "over a model loaded with torch_dtype=float16; diffusers examples/text_to_image/train_text_to_image_lora.py: "
     "unet.to(accelerator.device, dtype=weight_dtype) inside accelerate's autocast",
     0, false, false, false, true},
    {"bf16_autocast", "bf16 weights under bf16 autocast (HF Trainer bf16=True over a bf16 load; diffusers LoRA)", 2, 2, 0, 2, 0, 2, 2, false,
     "transformers trainer.py: with bf16=True the forward runs under accelerate's torch.autocast(bfloat16), over a "
     "model loaded with torch_dtype=bfloat16; diffusers train_text_to_image_lora.py --mixed_precision bf16",
     0, false, false, false, true},
    {"fp8_te", "fp8 matmuls, Transformer Engine (bf16 + fp32 main grads and master)", 2, 4, 4, 4, 0, 2, 2, false,
     "TransformerEngine pytorch/module/linear.py _Linear.forward: weight_fp8 and weight_t_fp8 buffers filled by "
     "fp8_cast_transpose_fused, ctx.save_for_backward(saved_inputmat or saved_inputmat_t in fp8, ...)",
     2, true, false, false},
    {"fp8_torchao", "fp8 matmuls, torchao float8 (bf16 + fp32 master; 16-bit all-gather)", 2, 2, 4, 4, 0, 2, 2, false,
     "torchao float8/float8_linear.py matmul_with_hp_or_float8_args: save_for_backward(input_hp, weight_hp_t), "
     "casts to float8 inside forward and backward",
     0, false, true, false},
    {"fp8_torchao_fp8_allgather", "fp8 matmuls, torchao float8 with fp8 FSDP all-gather", 2, 2, 4, 4, 0, 2, 2, false,
     "torchao float8 enable_fsdp_float8_all_gather: WeightWithDynamicFloat8CastTensor fsdp_pre_all_gather casts "
     "the shard to float8, so the unsharded weight is 1 byte per element",
     0, false, true, true},
};

constexpr OptimizerSpec kOptimizers[] = {
    {"adamw", "AdamW", OptimizerKind::Adam, false,
     "torch/optim/adam.py _init_group (exp_avg, exp_avg_sq); _multi_tensor_adam _foreach_sqrt"},
    {"adam", "Adam", OptimizerKind::Adam, false, "torch/optim/adam.py _init_group; _multi_tensor_adam _foreach_sqrt"},
    {"adamw_8bit", "AdamW 8-bit (bitsandbytes)", OptimizerKind::Adam8bit, false,
     "bitsandbytes optim/optimizer.py Optimizer2State.init_state: uint8 states + fp32 absmax per 256 elements; "
     "tensors under min_8bit_size = 4096 elements keep fp32 states"},
    {"adamw_8bit_torchao", "AdamW 8-bit (torchao)", OptimizerKind::Adam8bitTorchao, false,
     "torchao optim/adam.py AdamW8bit (block_size 256) and subclass_8bit.py OptimState8bit.zeros: uint8 codes + an "
     "fp32 scale per block for each state; single_param_adam (torch.compile'd) computes exp_avg and exp_avg_sq in fp32"},
    {"paged_adamw", "Paged AdamW 32-bit (bitsandbytes)", OptimizerKind::Adam, true,
     "bitsandbytes Optimizer8bit.get_state_buffer: paged (unified memory) when numel >= 1e5"},
    {"paged_adamw_8bit", "Paged AdamW 8-bit (bitsandbytes)", OptimizerKind::Adam8bit, true,
     "bitsandbytes Optimizer8bit.get_state_buffer + Optimizer2State.init_state"},
    {"adafactor", "Adafactor (factored second moment)", OptimizerKind::Adafactor, false,
     "torch/optim/_adafactor.py _init_group: row_var (n,1) + col_var (1,m) for matrices, full variance for vectors"},
    {"lion", "Lion", OptimizerKind::Lion, false, "Chen et al. 2023 (Lion): one momentum buffer"},
    {"sgd", "SGD (no momentum)", OptimizerKind::Sgd, false, "torch/optim/sgd.py: no state without momentum"},
    {"sgd_momentum", "SGD with momentum", OptimizerKind::SgdMomentum, false,
     "torch/optim/sgd.py: momentum_buffer = clone(grad)"},
};

// Capacities as nvidia-smi reports "Total" (MiB), the memory a process can address including the context;
// each quoted from a pasted nvidia-smi/rocm-smi table (src/core/catalog/gpus.json and SOURCES.md list them).
// The figure moves a little with driver and ECC settings (T4: 15360 or 15109 MiB).
// multiprocessors: NVIDIA's SM counts as each architecture's whitepaper gives them for the product (A100 108; H100
// SXM5 132, PCIe 114, H200 the SXM5 die's 132; T4 40; V100 80; P100 56; the GeForce and RTX/L-series datasheets: L4
// 58, L40S and RTX 6000 Ada 142, A10G 80, RTX 3090 82, RTX 4090 128, RTX 5090 170, RTX A6000 84), B200 and GB200 148
// as torch reports a compute-capability-10.0 device (Inductor's DeviceProperties in compiled kernels); AMD's compute
// units per GCD from the CDNA 2 and CDNA 3 whitepapers (MI250X 110, MI300X and MI325X 304).
constexpr GpuSpec kGpus[] = {
    {"a100-80gb", "NVIDIA A100 80GB (SXM4 or PCIe)", "nvidia", 81920 * kMiB, 80, "nvidia-smi: 0MiB / 81920MiB (A100-SXM4-80GB, A100 80GB PCIe)", 108},
    {"a100-40gb", "NVIDIA A100 40GB (SXM4 or PCIe)", "nvidia", 40960 * kMiB, 80, "nvidia-smi: 0MiB / 40960MiB (A100-SXM4-40GB)", 108},
    {"h100-sxm", "NVIDIA H100 SXM 80GB", "nvidia", 81559 * kMiB, 90, "nvidia-smi: 72790MiB / 81559MiB (H100 80GB HBM3, gpu-burn#114)", 132},
    {"h100-pcie", "NVIDIA H100 PCIe 80GB", "nvidia", 81559 * kMiB, 90, "TensorRT-LLM report: NVIDIA H100 PCIe (81559 MiB)", 114},
    {"h200", "NVIDIA H200 141GB", "nvidia", 143771 * kMiB, 90, "nvidia-smi: 0MiB / 143771MiB (H200)", 132},
    {"b200", "NVIDIA B200 180GB", "nvidia", 183359 * kMiB, 100, "nvidia-smi: 0MiB / 183359MiB (B200)", 148},
    {"gb200", "NVIDIA GB200 (one GPU)", "nvidia", 189471 * kMiB, 100, "nvidia-smi: 0MiB / 189471MiB (GB200)", 148},
    {"l4", "NVIDIA L4 24GB", "nvidia", 23034 * kMiB, 89, "nvidia-smi: 0MiB / 23034MiB (L4)", 58},
    {"l40s", "NVIDIA L40S 48GB", "nvidia", 46068 * kMiB, 89, "nvidia-smi: 0MiB / 46068MiB (L40S)", 142},
    {"a10g", "NVIDIA A10G 24GB", "nvidia", 23028 * kMiB, 86, "nvidia-smi: 0MiB / 23028MiB (A10G)", 80},
    {"t4", "NVIDIA T4 16GB", "nvidia", 15360 * kMiB, 75, "nvidia-smi: 0MiB / 15360MiB (Tesla T4)", 40},
    {"v100-16gb", "NVIDIA V100 16GB", "nvidia", 16160 * kMiB, 70, "nvidia-smi: 0MiB / 16160MiB (Tesla V100-SXM2-16GB)", 80},
    {"v100-32gb", "NVIDIA V100 32GB", "nvidia", 32510 * kMiB, 70, "nvidia-smi: 0MiB / 32510MiB (Tesla V100-SXM2-32GB)", 80},
    {"rtx-3090", "NVIDIA RTX 3090 24GB", "nvidia", 24576 * kMiB, 86, "nvidia-smi: 24576MiB (GeForce RTX 3090)", 82},
    {"rtx-4090", "NVIDIA RTX 4090 24GB", "nvidia", 24564 * kMiB, 89, "nvidia-smi: 0MiB / 24564MiB (GeForce RTX 4090)", 128},
    {"rtx-5090", "NVIDIA RTX 5090 32GB", "nvidia", 32607 * kMiB, 120, "nvidia-smi: 2MiB / 32607MiB (GeForce RTX 5090)", 170},
    {"rtx-a6000", "NVIDIA RTX A6000 48GB", "nvidia", 49140 * kMiB, 86, "nvidia-smi: 49140MiB (RTX A6000, ECC off; 46068MiB with ECC)", 84},
    {"rtx-6000-ada", "NVIDIA RTX 6000 Ada 48GB", "nvidia", 49140 * kMiB, 89, "nvidia-smi: 44578MiB / 49140MiB (RTX 6000 Ada)", 142},
    {"mi250x", "AMD Instinct MI250X (one GCD, 64GB)", "amd", 65520 * kMiB, 0, "ROCm runtime on gfx90a: 68702699520 B per GCD", 110},
    {"mi300x", "AMD Instinct MI300X 192GB", "amd", 196608 * kMiB, 0, "rocm-smi: VRAM Total Memory (B): 206158430208", 304},
    {"mi325x", "AMD Instinct MI325X 256GB", "amd", 262144 * kMiB, 0,
     "ROCm GPU specifications table: MI325X VRAM 256 GiB (its MI300X row, 192 GiB, equals that card's rocm-smi total)", 304},
    // Last, so that the indices of the cards before it stay as links and saved setups know them.
    {"p100-16gb", "NVIDIA P100 16GB", "nvidia", 16280 * kMiB, 60, "torch: _CudaDeviceProperties(name='Tesla P100-PCIE-16GB', total_memory=16280MB)", 56},
};

}  // namespace

int64_t optimizer_full_states(const OptimizerSpec& opt) {
  switch (opt.kind) {
    case OptimizerKind::Adam: case OptimizerKind::Adam8bit: case OptimizerKind::Adam8bitTorchao: return 2;
    case OptimizerKind::SgdMomentum: case OptimizerKind::Lion: return 1;
    case OptimizerKind::Sgd: case OptimizerKind::Adafactor: return 0;
  }
  return 0;
}

int64_t optimizer_state_bytes(const OptimizerSpec& opt, int64_t numel, int64_t rows, int64_t state_bytes) {
  switch (opt.kind) {
    case OptimizerKind::Adam8bit: {
      // Optimizer2State: two uint8 states plus one fp32 absmax per 256-element block for each.
      if (numel < 4096) return mul(numel, 2 * 4);  // min_8bit_size: small tensors keep two fp32 states
      return mul(2, add(numel, mul(ceil_div(numel, 256), 4)));
    }
    case OptimizerKind::Adam8bitTorchao: {
      // OptimState8bit.zeros: codes (uint8, numel) and scale (torch.zeros(numel // block_size), fp32) per state.
      if (numel < kTorchaoMinNumel || numel % kTorchaoBlock != 0) return mul(numel, 2 * state_bytes);
      return mul(2, add(numel, mul(numel / kTorchaoBlock, 4)));
    }
    case OptimizerKind::Adafactor: {
      // Factored second moment for matrices (rows + cols), a full one for vectors; no first moment (beta1=None).
      const int64_t cols = rows > 0 ? numel / rows : 1;
      if (rows <= 1 || cols <= 1) return mul(numel, state_bytes);
      return mul(add(rows, cols), state_bytes);
    }
    default:
      return mul(numel, optimizer_full_states(opt), state_bytes);
  }
}

namespace {

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
