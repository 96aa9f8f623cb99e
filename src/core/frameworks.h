// What each training framework does where frameworks differ, and the allowed values of every choice field.
// A config names a framework; each of its "auto" fields takes that framework's choice, and any explicit
// value overrides it.
#pragma once
#include <span>
#include <string>
#include <string_view>

#include "config.h"

namespace memsim {

enum class Attention { Sdpa, SdpaRepeatKv, FlashAttention2, Eager };
enum class NormImpl { EagerFp32, Fp32Scale, Fused };
enum class LossImpl { HfFp32Upcast, FullFp32, ChunkedFp32, ChunkedBf16, FusedLinear };
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
};

// Every "auto" resolved.
struct Resolved {
  const FrameworkSpec* framework;
  Attention attention;
  NormImpl norm;
  LossImpl loss;
  OptimizerImpl optimizer_impl;
  Checkpointing checkpointing;
  int64_t param_groups;
  bool holds_logits;
  bool fused_qkv;
  Sharding sharding;
  bool loss_parallel;  // vocabulary-parallel cross-entropy through DTensor (the framework's choice, with TP on)
  CpRotate cp_rotate;  // auto: torchtitan's all-gather, a point-to-point ring elsewhere
};

std::span<const FrameworkSpec> frameworks();
const FrameworkSpec* find_framework(std::string_view id);

// Allowed string values of a choice field ("training.attention", ...), "auto" first where it applies.
std::span<const std::string_view> choices(std::string_view field);

// Requires a validated config.
Resolved resolve(const Config& c);

}  // namespace memsim
