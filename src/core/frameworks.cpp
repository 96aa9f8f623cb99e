#include "frameworks.h"

#include <array>

#include "model.h"

namespace memsim {

namespace {

// id, label, attention, norm, loss, optimizer implementation, param groups, holds logits, fused qkv, sharding,
// loss parallel under TP, source.
constexpr FrameworkSpec kFrameworks[] = {
    {"hf_trainer", "Hugging Face Trainer", "sdpa", "eager_fp32", "hf_fp32_upcast", "fused", 2, false, false, "deepspeed", false, false, false, false, false, true, false,
     "transformers: SDPA default attention (4.36+), LlamaRMSNorm upcasts to fp32, loss_utils.py ForCausalLMLoss "
     "upcasts logits (4.49+), default optim adamw_torch_fused on torch >= 2.8 (PR #37358), "
     "Trainer.create_optimizer: decay and no-decay groups; compute_loss returns only the loss, so the outputs "
     "(logits) are dropped before backward; gradient accumulation through Accelerator.accumulate, which runs the "
     "micro-batches that do not sync under model.no_sync() (accelerator.py no_sync: getattr(model, 'no_sync'))"},
    {"hf_loop", "transformers model in a plain PyTorch loop", "sdpa", "eager_fp32", "hf_fp32_upcast", "foreach", 1, true, false, "deepspeed", false, false, false, false, false, false, false,
     "out = model(**batch); out.loss.backward(): `out` keeps the logits alive through backward; "
     "torch.optim.AdamW(model.parameters()) is one group, foreach on CUDA"},
    {"deepspeed", "DeepSpeed (HF model code)", "sdpa", "eager_fp32", "hf_fp32_upcast", "fused", 2, false, false, "deepspeed", false, false, false, false, false, false, false,
     "DeepSpeed engine with FusedAdam (ops/adam/fused_adam.py: multi_tensor_apply, no full-size temporaries) "
     "around transformers model code"},
    {"torchtune", "torchtune", "sdpa_repeat_kv", "eager_fp32", "chunked_fp32", "fused", 1, false, false, "fsdp2", false, false, false, false, false, false, false,
     "torchtune modules/attention.py expands k/v for GQA; modules/rms_norm.py normalises in fp32 and casts back "
     "before the scale (x_normed = (x_fp32 * rsqrt(...)).type_as(x); return x_normed * self.scale); "
     "CEWithChunkedOutputLoss (8 chunks); AdamW configs set fused: True (PR #1575); "
     "training/_distributed.py shard_model: FSDP2 fully_shard per layer"},
    {"litgpt", "LitGPT", "sdpa_repeat_kv", "fp32_scale", "chunked_bf16", "foreach", 1, true, true, "fsdp1", false, true, false, false, false, true, true,
     "litgpt model.py CausalSelfAttention.attn (one fused qkv linear; LoRAQKVLinear adapts it once);  model.py CausalSelfAttention expands k/v; RMSNorm scales in fp32; utils.py chunked_cross_entropy "
     "(128-row chunks, no fp32 upcast); instantiate_torch_optimizer: one group, torch default foreach; "
     "Fabric FSDPStrategy: FSDP1 with one unit per Block and use_orig_params=True (torch >= 2.0), accumulating "
     "micro-batches under fabric.no_backward_sync (FSDP no_sync); quantize bnb.*: Lightning plugins/precision/bitsandbytes.py "
     "_Linear4bit quantizes weight.to(dtype=torch.half) of every nn.Linear, lm_head included"},
    {"megatron", "Megatron-LM", "flash_attention_2", "fused", "full_fp32", "fused", 2, false, true, "megatron", false, false, false, false, false, false, false,
     "Megatron-Core: TE fused attention and fused norms, vocab_parallel_cross_entropy on fp32 logits, "
     "Apex/TE FusedAdam"},
    {"torchtitan", "torchtitan", "sdpa_repeat_kv", "eager_fp32", "full_fp32", "foreach", 1, false, false, "fsdp2", true, false, true, true, true, false, false,
     "torchtitan models/llama/model.py (repeat_kv before SDPA; RMSNorm: _norm(x.float()).type_as(x) * weight), "
     "train.py: loss = F.cross_entropy(pred.flatten(0, 1).float(), ...) then `del pred` before backward; "
     "optimizer.py: foreach = not --optimizer.fused (default False); parallelize_llama.py apply_fsdp: "
     "fully_shard per TransformerBlock and the root, the last block with reshard_after_forward=False (\"FSDP would "
     "prefetch it immediately\"); the loss runs under loss_parallel() whenever TP is on "
     "(parallel_dims.loss_parallel_enabled); TP through DTensor (ColwiseParallel/SequenceParallel: the linear saves "
     "the all-gathered input); pipeline stages from torch.distributed.pipelining"},
};

constexpr std::string_view kAttention[] = {"auto", "sdpa", "sdpa_repeat_kv", "flash_attention_2", "eager"};
constexpr std::string_view kNorm[] = {"auto", "eager_fp32", "fp32_scale", "fused"};
constexpr std::string_view kLoss[] = {"auto", "hf_fp32_upcast", "full_fp32", "chunked_fp32", "chunked_bf16", "fused_linear"};
constexpr std::string_view kOptImpl[] = {"auto", "foreach", "fused", "for_loop"};
constexpr std::string_view kCheckpointing[] = {"none", "full", "selective", "selective_op", "every_k"};
constexpr std::string_view kFrameworkIds[] = {"hf_trainer", "hf_loop", "deepspeed", "torchtune", "litgpt", "megatron", "torchtitan"};
constexpr std::string_view kSharding[] = {"auto", "deepspeed", "fsdp1", "fsdp2", "megatron"};
constexpr std::string_view kBackwardPrefetch[] = {"backward_pre", "backward_post", "none"};
constexpr std::string_view kSchedules[] = {"1f1b", "interleaved_1f1b", "gpipe"};
constexpr std::string_view kOffload[] = {"none", "cpu", "nvme"};
constexpr std::string_view kModuleLoading[] = {"lazy", "eager"};
constexpr std::string_view kCpRotate[] = {"auto", "allgather", "alltoall"};

template <typename E, size_t N>
E pick(std::string_view value, std::string_view fallback, const std::string_view (&names)[N], const std::array<E, N - 1>& values) {
  std::string_view v = value == "auto" ? fallback : value;
  for (size_t i = 1; i < N; ++i)
    if (names[i] == v) return values[i - 1];
  return values[0];
}

}  // namespace

std::span<const FrameworkSpec> frameworks() { return kFrameworks; }

const FrameworkSpec* find_framework(std::string_view id) {
  for (const auto& f : kFrameworks)
    if (f.id == id) return &f;
  return nullptr;
}

std::span<const std::string_view> choices(std::string_view field) {
  if (field == "training.attention") return kAttention;
  if (field == "training.norm_impl") return kNorm;
  if (field == "training.loss") return kLoss;
  if (field == "training.optimizer_impl") return kOptImpl;
  if (field == "training.activation_checkpointing") return kCheckpointing;
  if (field == "training.framework") return kFrameworkIds;
  if (field == "parallel.sharding") return kSharding;
  if (field == "parallel.fsdp_backward_prefetch") return kBackwardPrefetch;
  if (field == "parallel.pipeline_schedule") return kSchedules;
  if (field == "parallel.offload_optimizer" || field == "parallel.offload_params") return kOffload;
  if (field == "hardware.cuda_module_loading") return kModuleLoading;
  if (field == "parallel.cp_rotate_method") return kCpRotate;
  return {};
}

Resolved resolve(const Config& c) {
  const auto& t = c.training;
  Resolved r;
  r.framework = find_framework(t.framework);
  if (!r.framework) r.framework = &kFrameworks[0];
  const FrameworkSpec& f = *r.framework;
  r.attention = pick<Attention>(t.attention, f.attention, kAttention,
                                {Attention::Sdpa, Attention::SdpaRepeatKv, Attention::FlashAttention2, Attention::Eager});
  r.norm = pick<NormImpl>(t.norm_impl, f.norm_impl, kNorm, {NormImpl::EagerFp32, NormImpl::Fp32Scale, NormImpl::Fused});
  r.loss = pick<LossImpl>(t.loss, f.loss, kLoss,
                          {LossImpl::HfFp32Upcast, LossImpl::FullFp32, LossImpl::ChunkedFp32, LossImpl::ChunkedBf16,
                           LossImpl::FusedLinear});
  r.optimizer_impl = pick<OptimizerImpl>(t.optimizer_impl, f.optimizer_impl, kOptImpl,
                                         {OptimizerImpl::Foreach, OptimizerImpl::Fused, OptimizerImpl::ForLoop});
  const std::array<Checkpointing, 5> ck = {Checkpointing::None, Checkpointing::Full, Checkpointing::Selective,
                                           Checkpointing::SelectiveOp, Checkpointing::EveryK};
  r.checkpointing = Checkpointing::None;
  for (size_t i = 0; i < ck.size(); ++i)
    if (kCheckpointing[i] == t.activation_checkpointing) r.checkpointing = ck[i];
  r.param_groups = f.param_groups;
  r.holds_logits = f.holds_logits;
  // litgpt's LoRAQKVLinear, or PEFT's one adapter on a fused q/k/v linear (model.fused_qkv, targets_fused_qkv).
  r.fused_qkv = f.fused_qkv || (c.model.fused_qkv && targets_fused_qkv(c.peft));
  r.loss_parallel = f.loss_parallel && c.parallel.tensor_parallel_size > 1;
  // torchtitan's --experimental.context_parallel_rotate_method defaults to allgather (config_manager.py, PR #728);
  // Megatron-Core's and Transformer Engine's context parallel exchange chunks point to point.
  r.cp_rotate = pick<CpRotate>(c.parallel.cp_rotate_method, f.id == "torchtitan" ? "allgather" : "alltoall", kCpRotate,
                               {CpRotate::AllGather, CpRotate::AllToAll});
  r.sharding = pick<Sharding>(c.parallel.sharding, f.sharding, kSharding,
                              {Sharding::DeepSpeed, Sharding::Fsdp1, Sharding::Fsdp2, Sharding::Megatron});
  return r;
}

}  // namespace memsim
