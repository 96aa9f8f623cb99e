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
  int64_t activation_bytes;    // element size of matmul inputs/outputs saved for backward
  int64_t residual_bytes;      // element size of the residual stream (fp32 under autocast over fp32 weights)
  bool fp16;                   // the 16-bit dtype is fp16, not bf16 (its range and kernels differ)
  std::string_view source;
  // fp8 matmuls. Transformer Engine keeps an fp8 copy of every linear weight and its transpose (1 byte each) and
  // saves the linears' inputs in fp8; torchao's float8 saves the 16-bit inputs and casts transiently, and can
  // all-gather the FSDP shards in fp8.
  int64_t fp8_weight_copy_bytes = 0;  // persistent bytes per linear-weight element
  bool fp8_saved_inputs = false;      // linears save their inputs in fp8 (1 byte)
  bool fp8_transient_casts = false;   // each linear casts its weight to fp8 for the matmul (1 byte, transient)
  bool fp8_allgather = false;         // FSDP all-gathers linear weights in fp8 (1 byte per element)
  // torch.autocast over weights already in the 16-bit dtype (diffusers' LoRA scripts: unet.to(weight_dtype) inside
  // accelerate's autocast): no weight copies, but the fp32-list ops (norms, the loss) upcast and the matmuls cast
  // fp32 inputs down, as under amp_*.
  bool autocast_16bit = false;
};

// Adam8bit is bitsandbytes' (CUDA kernels, no full-size temporaries); Adam8bitTorchao is torchao.optim's, a
// torch.compile'd Python step per parameter over a tensor subclass of 8-bit codes.
enum class OptimizerKind { Adam, Sgd, SgdMomentum, Lion, Adafactor, Adam8bit, Adam8bitTorchao };

// torchao.optim quantizes a state only when the tensor has this many elements and whole blocks of kTorchaoBlock
// (adam.py _AdamBase._new_buffer: `numel() >= 4096 and numel() % self.block_size == 0`, block_size=256 for
// AdamW8bit); other tensors get torch.zeros_like(p), in the parameter's dtype.
constexpr int64_t kTorchaoMinNumel = 4096;
constexpr int64_t kTorchaoBlock = 256;

// bitsandbytes pages a tensor's optimizer state (CUDA unified memory) only from this many elements on
// (optim/optimizer.py Optimizer8bit.get_state_buffer: `if not self.is_paged or A.numel() < 1e5`).
constexpr int64_t kPagedMinNumel = 100000;

struct OptimizerSpec {
  std::string_view id;
  std::string_view label;
  OptimizerKind kind;
  bool paged;  // bitsandbytes paged state: CUDA unified memory, outside PyTorch's allocator
  std::string_view source;
};

// Bytes of optimizer state for one parameter tensor of `numel` elements laid out as rows x (numel / rows),
// with full-precision states of `state_bytes` each. MEMORY_FORMULAS.md 1.3.
int64_t optimizer_state_bytes(const OptimizerSpec& opt, int64_t numel, int64_t rows, int64_t state_bytes);
// Number of full-size state tensors (for the foreach temporary and the UI): Adam 2, SGD+momentum 1, ...
int64_t optimizer_full_states(const OptimizerSpec& opt);

struct GpuSpec {
  std::string_view id;
  std::string_view label;
  std::string_view vendor;
  int64_t memory_bytes;  // total as the process sees it (nvidia-smi "Total", rocm-smi VRAM total)
  int compute_capability;  // 80 = sm_80; 0 for non-NVIDIA
  std::string_view source;
  // torch.cuda.get_device_properties().multi_processor_count: NVIDIA's SMs, AMD's compute units (per GCD), which
  // Triton kernels size their grids and split buffers by (tables.cpp cites each).
  int multiprocessors;
};

std::span<const PrecisionRecipe> precision_recipes();
std::span<const OptimizerSpec> optimizers();
std::span<const GpuSpec> gpus();

const PrecisionRecipe* find_precision(std::string_view id);
const OptimizerSpec* find_optimizer(std::string_view id);
const GpuSpec* find_gpu(std::string_view id);

}  // namespace memsim
