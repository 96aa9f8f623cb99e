// What each training framework does where frameworks differ, and the switches its settings and the library
// versions resolve to (the allowed values of every choice field are the field registry's, fields.h).
// A config names a framework; each of its "auto" fields takes that framework's choice, and any explicit
// value overrides it.
#pragma once
#include <array>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "config.h"
#include "fields.h"  // choices(field): the allowed strings of a choice field
#include "model_load.h"
#include "preference.h"
#include "rollout.h"
#include "sft_metrics.h"
#include "versions.h"

namespace memsim {

// SdpaMath: scaled_dot_product_attention's math kernel, chosen by hand where SDPA falls back to it (inputs no fused
// kernel takes, such as lit-gpt 2023's one unexpanded key/value head for Falcon's multi-query attention).
enum class Attention { Sdpa, SdpaRepeatKv, FlashAttention2, Eager, SdpaMath };
enum class NormImpl { EagerFp32, Fp32Scale, Fused };
// The HF variants are transformers' causal-LM loss across versions (docs/versions.md 6a, frameworks.cpp kLoss):
// HfFp32Upcast 4.49+, HfShiftFp32 4.46-4.48, HfFp32Logits 4.31-4.45, HfShift before 4.31.
enum class LossImpl {
  HfFp32Upcast, HfShiftFp32, HfFp32Logits, HfShift, FullFp32, ChunkedFp32, ChunkedBf16, FusedLinear,
  UnslothLogits,    // Unsloth fast_cross_entropy_loss on materialised 16-bit logits, its gradient written into them
  CutCrossEntropy,  // Apple's cut_cross_entropy (linear_cross_entropy), as Unsloth called it 2024-11 to 2025-08
  UnslothFusedCe,   // unsloth_zoo unsloth_fused_ce_loss: the input gradient made chunk by chunk in the forward
  VocabChunked,     // prime-rl's FusedOutputLinear: log-probabilities over 2,048-column chunks, recomputed in backward
};
// Unsloth's use_gradient_checkpointing="unsloth" (docs/research/unsloth.md 1), by its version.
enum class UnslothGc : uint8_t {
  Offload,       // up to 2025.2: Unsloth_Offloaded_Gradient_Checkpointer, every layer input to the host, a fresh copy back
  Smart,         // from 2025.3: UnslothCheckpointFunction, reloads into one persistent GPU buffer, the last layer kept
  SmartDouble,   // from 2026.6: the same with a second buffer (double buffering, unsloth-zoo 510d987f)
};
enum class OptimizerImpl { Foreach, Fused, ForLoop };
enum class Checkpointing { None, Full, Selective, SelectiveOp, EveryK };
// How context parallel's ring attention moves key/value chunks (parallel.cp_rotate_method).
enum class CpRotate { AllGather, AllToAll };
// Whose code shards the model states over the data-parallel ranks (ParallelConfig::zero_stage says how much).
enum class Sharding { DeepSpeed, Fsdp1, Fsdp2, Megatron };

struct FrameworkSpec {
  std::string_view id;
  std::string_view label;
  std::string_view attention, norm_impl, loss, optimizer_impl;
  int64_t param_groups;  // HF Trainer splits decay / no-decay; one group elsewhere
  bool holds_logits;     // the training loop keeps the model output (logits) alive through backward
  bool fused_qkv;        // one linear computes q, k and v (LoRA on it reads its input once)
  std::string_view sharding;  // deepspeed, fsdp1, fsdp2 or megatron: whose data-parallel sharding it uses
  bool loss_parallel;         // under TP the loss runs as DTensor's vocabulary-parallel cross-entropy
  // bitsandbytes layers come from Lightning's BitsandbytesPrecision, which replaces every nn.Linear (the output
  // head too) and quantizes an fp16 copy, so dequantize_4bit returns fp16 that the matmul casts to bf16.
  bool bnb_via_lightning;
  // Pipeline stages come from torch.distributed.pipelining, which allocates a receive buffer for every
  // micro-batch's input activation and output gradient on the first step and keeps them (stage.py
  // _prepare_forward_infra / _prepare_backward_infra); the input gradients stay in the buffers' .grad until the
  // next step() (clear_runtime_states).
  bool pp_persistent_recv;
  // FSDP2 without a pipeline: the last transformer block keeps reshard_after_forward=False, since backward would
  // all-gather it again at once (torchtitan parallelize_llama.py apply_fsdp).
  bool fsdp_last_block_kept;
  // Sequence parallel through DTensor: ColwiseParallel all-gathers the sequence-sharded norm output (redistribute
  // Shard(1) -> Replicate) and the linear saves that full [T, h] tensor, where Megatron saves its shard and
  // all-gathers again in backward (tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication).
  bool tp_saves_gathered_input;
  // FSDP gradient accumulation under no_sync(): the micro-batches before the last keep unsharded gradients and
  // reduce-scatter nothing (Accelerate's accumulate, Fabric's no_backward_sync); the others sync every backward.
  bool fsdp_no_sync_accumulation;
  // FSDP1 use_orig_params=True (Fabric's default for torch >= 2.0): a unit whose FlatParameter mixes frozen and
  // trainable tensors has a gradient for all of it, "equivalent to not freezing those parameters" (PyTorch FSDP
  // docs), so under PEFT every Block unit holds gradients for its frozen base weights too. HF Trainer: transformers
  // defaults use_orig_params to true (TrainingArguments: fsdp_config.get("use_orig_params", "true")), but with PEFT
  // it wraps the trainable LoRA modules as units of their own (Trainer._fsdp_qlora_plugin_updates installs peft's
  // fsdp_auto_wrap_policy), so Block units do not mix: false here. Other partial freezing under the Trainer mixes.
  bool fsdp_use_orig_params;
  std::string_view source;
  // The model code is transformers': its default attention and its loss path follow the transformers version.
  bool transformers_model = false;
  // The adapters are PEFT's (get_peft_model): their dtype follows the peft version.
  bool peft_library = false;
  // The launch script sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.
  bool launcher_expandable_segments = false;
  // A quantized base is bitsandbytes' (transformers' BitsAndBytesConfig, Lightning's plugin): what its 4-bit linears
  // save follows the bitsandbytes version.
  bool bitsandbytes_quantization = false;
  // Activation checkpointing is reentrant: the recomputed layer's output stays alive while backward runs through
  // the recomputed graph (torch.utils.checkpoint CheckpointFunction.backward calls torch.autograd.backward(outputs,
  // ...) holding `outputs`). transformers' gradient_checkpointing_enable passes use_reentrant=True by default
  // (modeling_utils.py, 4.35+); Megatron's tensor_parallel.checkpoint and DeepSpeed's checkpointing are
  // CheckpointFunction-style autograd Functions too. FSDP's apply_activation_checkpointing defaults to
  // CheckpointImpl.NO_REENTRANT (torch/distributed/algorithms/_checkpoint/checkpoint_wrapper.py), which torchtune
  // (training/_activation_checkpointing.py), torchtitan (checkpoint_wrapper) and Lightning's FSDPStrategy (litgpt)
  // use: the recomputation runs inside the saved-tensor unpack hooks and keeps only what the graph saved.
  bool checkpoint_reentrant = true;
  // How FSDP2 shards a routed expert's weights; memsim keeps each as one [experts, ...] tensor (rows = experts),
  // and fully_shard chunks dim 0 unless told otherwise (MEMORY_FORMULAS.md 2.6). It matters where a rank's shard
  // group is larger than its experts: on dim 0 a rank then holds a whole expert or only padding.
  //  PerExpertLinear: transformers' MoE blocks keep each expert as nn.Linear modules of its own (modeling_mixtral.py
  //    MixtralBlockSparseTop2MLP), each sharded on its out_features: no expert-sized padding.
  //  ExpertDim: torchtune's GroupedExperts is one [experts, dim, hidden] parameter (modules/moe/experts.py),
  //    sharded on dim 0 by shard_model's plain fully_shard.
  //  Dim1WhenShort: torchtitan's apply_fsdp shards the experts on dim 1 when the expert shard group times EP exceeds
  //    the experts (models/llama4/infra/parallelize.py: "efsdp_degree * ep_degree > num_experts" -> Shard(1)).
  enum class ExpertShard : uint8_t { PerExpertLinear, ExpertDim, Dim1WhenShort };
  ExpertShard fsdp2_expert_shard = ExpertShard::PerExpertLinear;
  // The training loop is the HF Trainer's (TRL's SFTTrainer subclasses it): its optim default and the 4.41
  // empty_cache follow the transformers version.
  bool hf_trainer_loop = false;
  // Unsloth's patched model code (FastLanguageModel, docs/research/unsloth.md): its Triton LoRA kernels, in-place
  // RoPE, fast RMSNorm, its checkpointing and its loss by the unsloth version; adapters always fp32.
  bool unsloth_kernels = false;
  // With training.compile the loss is compiled too, as one chunk (torchtitan components/loss.py
  // build_cross_entropy_loss: torch.compile(cross_entropy_loss) when compile is enabled, PR #1033).
  bool compiles_loss = false;
  // The framework's own adapters are created in the model's parameter dtype: torchtune builds the whole model under
  // set_default_dtype(the recipe's dtype), LoRA layers included (recipes' _setup_model); Lightning Fabric's
  // bf16-true/16-true precision creates every parameter in that dtype (litgpt). fp32 where the weights are fp32.
  bool adapters_in_model_dtype = false;
  // The recipes' loss and AdamW settings follow versions.torchtune (docs/versions.md 13, torchtune#1575).
  bool torchtune_recipes = false;
  // parallel.cp_rotate_method at auto: torchtitan's --experimental.context_parallel_rotate_method defaults to
  // allgather (config_manager.py, PR #728); Megatron-Core's and Transformer Engine's exchange chunks point to point.
  std::string_view cp_rotate = "alltoall";
  // Offers Megatron's --recompute-granularity selective (What helps suggests it in place of no checkpointing).
  bool selective_recompute = false;
  // The loop's variables hold the model's outputs until the next micro-batch rebinds them, after its forward:
  // litgpt's fit() (`logits = model(input_ids, ...)`, `loss = chunked_cross_entropy(...)` stay bound through the
  // backward, the optimizer step and the next forward). The logits, and through their grad_fn the whole graph with
  // what its nodes hold as attributes (bitsandbytes' ctx.tensors), live until then.
  bool outputs_live_to_next_forward = false;
  // The model's forward returns the fp32 upcast of the logits, so the outputs the loop holds are fp32 (prime-rl's
  // model.py forward(): cast_float_and_contiguous), where full_fp32 alone is torchtune's `del logits` after the loss.
  bool outputs_hold_fp32_logits = false;
  // fully_shard runs whatever the world size, so a single GPU trains over a one-rank mesh: fp32 DTensor shards that
  // are the whole parameters, a 16-bit copy of each unit while it runs, and the reduce-scatter's fp32 gradients
  // (prime-rl's model.py setup_model calls setup_fsdp unconditionally). torchtitan and torchtune's single-device
  // recipes apply no FSDP on one GPU (torchtitan: parallel_dims.fsdp_enabled needs dp_shard or cp above 1), and
  // Accelerate runs one process without a distributed type, so elsewhere one GPU stays unsharded.
  bool fsdp_on_one_gpu = false;
};

// The switches that derive from the versions when left at auto, and where each one's value came from.
enum class Switch {
  SoftmaxSavesInput,
  ZeroGradSetToNone,
  OptimizerImpl,
  Attention,
  Loss,
  BnbSavesInput,
  AdapterDtype,
  ExpandableSegments,
  CudaModuleLoading,
  EmptyCacheSteps,
  CheckpointReentrant,
  PrepareKbit,
};
constexpr size_t kSwitchCount = 12;
std::string_view switch_field(Switch s);  // "training.softmax_saves_input"

struct Origin {
  enum class Kind : uint8_t {
    Explicit,   // the config sets the field
    Default,    // auto, and no stated version decides it: today's behaviour (the framework's choice)
    Version,    // auto, and a stated version (or versions.date) decides it
  };
  Kind kind = Kind::Default;
  // The libraries whose versions decided it (one or two; only the stated ones are named in notes).
  Library lib = Library::Torch;
  Library lib2 = Library::Torch;
  bool two = false;
  const char* why = "";  // the rule and its source, for the note ("softmax kept its input until pytorch#66018, in 1.11")
};

enum class AdapterDtype { Fp32, Bf16, Fp16 };

// The 4-D attention mask that transformers builds for a decoder-only causal LM, by version (docs/versions.md 6b),
// and the kernel that takes it (5). It follows from a stated transformers version only: at latest memsim models no
// mask, as it did before versions were inputs.
enum class MaskBuild : uint8_t {
  None,          // no 4-D mask: transformers at latest, flash_attention_2 (it gets the 2-D mask), other model code
  Prepared,      // <= 4.37: _make_causal_mask and _expand_mask, a [b, 1, s, s] mask in the model dtype
  MaxPositions,  // 4.38.x: the [P, P] causal_mask buffer repeated to [b, 1, P, P], indexed again by every layer
  Updated,       // 4.39 on (eager), 4.39-4.52 (SDPA): _update_causal_mask, torch.full and triu, then a clone
  Boolean,       // SDPA from 4.53: masking_utils' boolean [b, 1, s, s] mask, which torch converts per call
  BooleanToFloat,  // eager from 4.53: the boolean mask made additive in the model dtype
};
enum class MaskKernel : uint8_t {
  Eager,         // the scores add the mask; nothing keeps it
  Math,          // SDPA before torch 2.1: the math kernel, the [b, h, s, s] softmax kept per layer
  MemEfficient,  // SDPA from torch 2.1: the memory-efficient kernel, which keeps the bias it is given
};
// Qwen2-VL's VisionAttention / VisionSdpaAttention over the micro-batch's patches as one sequence
// (docs/research/qwen2-vl.md section 2).
enum class PackedAttention : uint8_t {
  PerSample,          // flash_attention_2 (varlen over cu_seqlens), or transformers >= 4.54 (one call per image)
  EagerMask,          // eager before 4.54: a [1, N, N] mask in the compute dtype and [heads, N, N] scores
  SdpaMathMask,       // SDPA before 4.51: 3-D q, k, v take the math path, a [1, N, N] bool mask and [heads, N, N] scores
  SdpaEfficientMask,  // SDPA 4.51-4.53: 4-D inputs, the memory-efficient kernel over the mask made an additive bias
};

// The dtype of that mask: SDPA's bool before 4.53, a float in the compute dtype for eager and from 4.53 (4.53.0 builds
// it for flash_attention_2 too, which reads cu_seqlens instead).
enum class PackedMask : uint8_t { None, Bool, Float };

struct AttentionMask {
  MaskBuild build = MaskBuild::None;
  bool unpadded = false;   // built for micro-batches without padding too, not only where the 2-D mask has zeros
  bool to_4d = false;      // 4.36-4.37: AttentionMaskConverter.to_4d merges with masked_fill(mask.bool())
  MaskKernel kernel = MaskKernel::Eager;
  // Memory-efficient attention's alignment of the bias: a copy padded to a multiple of pad_align keys when the
  // mask is not aligned; pad_expanded: the copy is made after expanding the mask over the heads (torch 2.1.0-2.1.1).
  int64_t pad_align = 8;
  bool pad_expanded = false;
  std::string note;        // the rule and its sources, naming the stated versions; empty when build is None
};

// Every "auto" resolved.
struct Resolved {
  const FrameworkSpec* framework;
  Attention attention;
  NormImpl norm;
  LossImpl loss;
  int64_t loss_chunks;  // ChunkedFp32's chunks: training.loss_chunks, or 1 for a compiled whole loss (compiles_loss)
  OptimizerImpl optimizer_impl;
  Checkpointing checkpointing;
  bool checkpoint_reentrant;  // training.checkpoint_reentrant (Switch::CheckpointReentrant)
  int64_t param_groups;
  bool holds_logits;
  bool fused_qkv;
  Sharding sharding;
  bool loss_parallel;  // vocabulary-parallel cross-entropy through DTensor (the framework's choice, with TP on)
  CpRotate cp_rotate;  // auto: torchtitan's all-gather, a point-to-point ring elsewhere
  // The switches of Switch, with their origins (indexed by Switch).
  bool softmax_saves_input;
  bool zero_grad_set_to_none;
  // training.zero_grad_at before_backward where torch's .grad is what zero_grad frees: not under DeepSpeed's ZeRO
  // engine or Megatron, which clear their own gradient buffers inside their step whatever the loop calls.
  bool zero_grad_before_backward;
  bool bnb_saves_input;
  // An LLM.int8 base (MatMul8bitLt) keeps an int8 transposed copy of each input that requires grad beside the input
  // itself, before bitsandbytes 0.45.0 (docs/versions.md 4: ctx.tensors = (CAt, subA, A); #1401 skips CAt for a
  // frozen weight). A fact of the version, not a switch: no case measures it.
  bool bnb_int8_copy;
  // IA3 on a linear that scales its output (not a feedforward module) cast the base output to the vector's dtype
  // before multiplying, `result.to(dtype) * ia3_scaling`, so the product kept that cast copy (fp32), before peft
  // 0.11.0; from 0.11.0 (peft#1634) `(result * ia3_scaling).to(result_dtype)` keeps the output itself, in its own
  // dtype (docs/versions.md 10). A fact of the version, not a switch.
  bool ia3_casts_output;
  // FSDP1 reshards a unit whose FlatParameter needs no gradient (a frozen layer) through a hook on its forward's inputs
  // (_runtime_utils.py _register_post_backward_reshard_only_hook, torch 2.1+, pytorch#101982); StepBuilder::
  // fsdp_hook_holds_inputs_ says when that hook keeps tensors alive.
  bool fsdp1_reshard_hook;
  AdapterDtype adapter_dtype;
  bool prepare_kbit;  // peft.prepare_kbit (Switch::PrepareKbit)
  bool kbit_cast;     // ... and it casts something: every non-quantized parameter of a bitsandbytes or AWQ base to fp32
  bool expandable_segments;
  bool lazy_module_loading;   // hardware.cuda_module_loading lazy
  int64_t empty_cache_steps;  // 0: never
  // torch.optim's foreach Adam/AdamW before 2.1 kept two lists of full-size intermediates at its peak, not one:
  // denom = torch._foreach_add(exp_avg_sq_sqrt, eps) was out of place while exp_avg_sq_sqrt stayed referenced
  // (torch/optim/adamw.py _multi_tensor_adamw at v2.0.0); pytorch#104898 (AdamW) and #104780 (Adam), merged July
  // 2023 and first in 2.1.0, add eps in place. It follows from the torch version alone, so it is not a config field.
  bool foreach_keeps_denom;
  // FSDP2 over a one-rank mesh skips the all-gather from torch 2.9 (pytorch#160135, "skipping allgather when world size
  // is 1"): _fsdp_param_group.py wait_for_unshard casts each parameter's fp32 shard to the param dtype and copies it
  // into the unit's unsharded buffer on the current stream, with no copy-in buffer, and a prefetch allocates nothing.
  // Before 2.9 the one-rank all-gather runs as on several ranks. The reduce-scatter still runs in 2.9 (its skip,
  // pytorch#162021, came later). A fact of the version, not a switch.
  bool fsdp2_one_rank_skips_all_gather;
  // An SDPA call given an attn_mask runs on the math kernel (torch 2.0: no fused kernel took a mask before
  // pytorch#104310, 2.1), else on the memory-efficient one.
  bool masked_sdpa_math;
  // The attention mask of transformers' model code and what SDPA does with it; like foreach_keeps_denom it follows
  // from the versions and the config with no field of its own.
  AttentionMask mask;
  // A packed attention op (ops.cpp "packed": Qwen2-VL's tower over all the micro-batch's patches, cu_seqlens): what its
  // block-diagonal mask costs, by transformers' version and the kernel; like mask, no config field of its own.
  PackedAttention packed_attention = PackedAttention::PerSample;
  PackedMask packed_mask = PackedMask::None;  // the [1, N, N] mask built in every block (none from 4.54)
  std::string packed_note;  // the rule with its sources, where it is not PerSample
  // Unsloth (FrameworkSpec::unsloth_kernels), by the unsloth version; like mask, no config field of their own.
  UnslothGc unsloth_gc = UnslothGc::Offload;
  bool unsloth_weight_buffer = false;  // fast_dequantize into one persistent buffer (2025.2 on)
  int64_t unsloth_logits_max_tokens = 0;  // a micro-batch of at most this many tokens takes UnslothLogits instead
  int64_t unsloth_ce_target_bytes = int64_t{4} << 30;  // UnslothFusedCe: the fp32 logits a chunk aims at (get_chunk_size)
  std::string unsloth_note;               // the rules above with their sources, for the result's notes
  PreferenceFlow preference;              // training.objective dpo, orpo, simpo, kto (preference.h); objective Sft otherwise
  RolloutFlow rollout;                    // training.objective grpo (rollout.h); inactive otherwise
  SftMetrics sft_metrics;                 // TRL's SFTTrainer metrics after the loss (sft_metrics.h); inactive otherwise
  // transformers 5's MoE layers (PR #41580, v5.0): the routed experts are 3-D nn.Parameters of one experts module,
  // not nn.Linear modules, so PEFT's target_modules (before its 0.19 rewrite to target_parameters) and bitsandbytes'
  // replace_with_bnb_linear pass them by (docs/research/transformers5-moe.md sections 1, 4 and 5).
  bool moe_experts_parameters = false;
  ModelLoad model_load;                   // transformers' load of a bitsandbytes base and TRL's casts (model_load.h)
  std::array<Origin, kSwitchCount> origin;
  StackVersions versions;
  int64_t adapter_bytes() const { return adapter_dtype == AdapterDtype::Fp32 ? 4 : 2; }
  const Origin& origin_of(Switch s) const { return origin[static_cast<size_t>(s)]; }
};

std::span<const FrameworkSpec> frameworks();
const FrameworkSpec* find_framework(std::string_view id);


// Requires a validated config.
Resolved resolve(const Config& c);

// transformers' own causal-LM loss path at these versions (docs/versions.md 6a), as derive_loss picks it.
LossImpl transformers_loss(const StackVersions& v);
// Whether a loss is one of those paths (hf_fp32_upcast, hf_shift_fp32, hf_fp32_logits, hf_shift): the model's
// outputs hold the whole logits and transformers' cross-entropy reads them.
inline bool transformers_loss_path(LossImpl l) {
  return l == LossImpl::HfFp32Upcast || l == LossImpl::HfShiftFp32 || l == LossImpl::HfFp32Logits || l == LossImpl::HfShift;
}

// A resolved switch's value as the config would write it ("true", "for_loop", "bf16", "1").
std::string switch_value(const Resolved& r, Switch s);
// Whether the switch changes anything in this config (the adapters' dtype needs adapters, bnb_saves_input a 4-bit
// base, the attention and loss of transformers a decoder-only causal LM, ...).
bool switch_applies(const Config& c, const Resolved& r, Switch s);
// The stated versions that decided an auto switch, "transformers 4.36.0, torch 2.1.2"; empty when none did.
std::string switch_versions(const Resolved& r, Switch s);
// "auto" labels for the page: "true: torch 1.10.0", or the value alone when no stated version decides it.
std::string switch_auto_label(const Resolved& r, Switch s);
// One note per switch left at auto that a stated version decides and that applies to the config:
// "training.softmax_saves_input: true, from torch 1.10.0: softmax and log_softmax kept their input until
// pytorch#66018, in 1.11".
std::vector<std::string> version_notes(const Config& c);

}  // namespace memsim
