#include "frameworks.h"

#include <array>
#include <iterator>
#include <optional>

#include "architecture.h"
#include "choices.h"
#include "data_shape.h"
#include "model.h"
#include "tables.h"
#include "train_step.h"

namespace memsim {

namespace {

// id, label, attention, norm, loss, optimizer implementation, param groups, holds logits, fused qkv, sharding,
// loss parallel under TP, ..., source; then: transformers' model code (its attention and loss follow the
// transformers version), PEFT's adapters (their dtype follows the peft version), whether the launcher sets
// expandable segments, and whether a quantized base is bitsandbytes' (its saved inputs follow the bitsandbytes
// version; torchtune quantizes with torchao's NF4Tensor). The choices here are those of the newest versions
// ("latest").
constexpr FrameworkSpec kFrameworks[] = {
    {"hf_trainer", "Hugging Face Trainer", "sdpa", "eager_fp32", "hf_fp32_upcast", "fused", 2, false, false, "deepspeed", false, false, false, false, false, true, false,
     "transformers: SDPA default attention (4.36+), LlamaRMSNorm upcasts to fp32, loss_utils.py ForCausalLMLoss "
     "upcasts logits (4.49+), default optim adamw_torch_fused on torch >= 2.8 (PR #37358), "
     "Trainer.create_optimizer: decay and no-decay groups; compute_loss returns only the loss, so the outputs "
     "(logits) are dropped before backward; gradient accumulation through Accelerator.accumulate, which runs the "
     "micro-batches that do not sync under model.no_sync() (accelerator.py no_sync: getattr(model, 'no_sync'))", true, true, false, true,
     true, FrameworkSpec::ExpertShard::PerExpertLinear, true},
    {"hf_loop", "transformers model in a plain PyTorch loop", "sdpa", "eager_fp32", "hf_fp32_upcast", "foreach", 1, true, false, "deepspeed", false, false, false, false, false, false, false,
     "out = model(**batch); out.loss.backward(): `out` keeps the logits alive through backward; "
     "torch.optim.AdamW(model.parameters()) is one group, foreach on CUDA", true, true, false, true},
    {"deepspeed", "DeepSpeed (HF model code)", "sdpa", "eager_fp32", "hf_fp32_upcast", "fused", 2, false, false, "deepspeed", false, false, false, false, false, false, false,
     "DeepSpeed engine with FusedAdam (ops/adam/fused_adam.py: multi_tensor_apply, no full-size temporaries) "
     "around transformers model code", true, true, false, true},
    {"torchtune", "torchtune", "sdpa_repeat_kv", "eager_fp32", "chunked_fp32", "fused", 1, false, false, "fsdp2", false, false, false, false, false, false, false,
     "torchtune modules/attention.py expands k/v for GQA; modules/rms_norm.py normalises in fp32 and casts back "
     "before the scale (x_normed = (x_fp32 * rsqrt(...)).type_as(x); return x_normed * self.scale); "
     "CEWithChunkedOutputLoss (8 chunks); AdamW configs set fused: True (PR #1575); "
     "training/_distributed.py shard_model: FSDP2 fully_shard per layer", false, false, false, false, false,
     FrameworkSpec::ExpertShard::ExpertDim, false, false, false, true, true},
    {"litgpt", "LitGPT", "sdpa_repeat_kv", "fp32_scale", "chunked_bf16", "foreach", 1, true, true, "fsdp1", false, true, false, false, false, true, true,
     "litgpt model.py CausalSelfAttention.attn (one fused qkv linear; LoRAQKVLinear adapts it once);  model.py CausalSelfAttention expands k/v; RMSNorm scales in fp32; utils.py chunked_cross_entropy "
     "(128-row chunks, no fp32 upcast); instantiate_torch_optimizer: one group, torch default foreach; "
     "Fabric FSDPStrategy: FSDP1 with one unit per Block and use_orig_params=True (torch >= 2.0), accumulating "
     "micro-batches under fabric.no_backward_sync (FSDP no_sync); quantize bnb.*: Lightning plugins/precision/bitsandbytes.py "
     "_Linear4bit quantizes weight.to(dtype=torch.half) of every nn.Linear, lm_head included; finetune/*.py fit(): "
     "`logits` and `loss` stay bound until the next micro-batch rebinds them after its forward", false, false, false, true, false,
     FrameworkSpec::ExpertShard::PerExpertLinear, false, false, false, true, false, "alltoall", false, true},
    {"megatron", "Megatron-LM", "flash_attention_2", "fused", "full_fp32", "fused", 2, false, true, "megatron", false, false, false, false, false, false, false,
     "Megatron-Core: TE fused attention and fused norms, vocab_parallel_cross_entropy on fp32 logits, "
     "Apex/TE FusedAdam", false, false, false, false, true, FrameworkSpec::ExpertShard::PerExpertLinear, false, false,
     false, false, false, "alltoall", true},
    {"torchtitan", "torchtitan", "sdpa_repeat_kv", "eager_fp32", "full_fp32", "foreach", 1, false, false, "fsdp2", true, false, true, true, true, false, false,
     "torchtitan models/llama/model.py (repeat_kv before SDPA; RMSNorm: _norm(x.float()).type_as(x) * weight), "
     "train.py: loss = F.cross_entropy(pred.flatten(0, 1).float(), ...) then `del pred` before backward; "
     "optimizer.py: foreach = not --optimizer.fused (default False); parallelize_llama.py apply_fsdp: "
     "fully_shard per TransformerBlock and the root, the last block with reshard_after_forward=False (\"FSDP would "
     "prefetch it immediately\"); the loss runs under loss_parallel() whenever TP is on "
     "(parallel_dims.loss_parallel_enabled); TP through DTensor (ColwiseParallel/SequenceParallel: the linear saves "
     "the all-gathered input); pipeline stages from torch.distributed.pipelining; run_train.sh sets "
     "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (torchtitan#643, in every release: docs/versions.md 11)", false, false, true, false, false,
     FrameworkSpec::ExpertShard::Dim1WhenShort, false, false, true, false, false, "allgather"},
    {"prime_rl", "prime-rl (its SFT trainer)", "flash_attention_2", "eager_fp32", "full_fp32", "foreach", 1, true, false, "fsdp2", false, false, false, false, false, false, false,
     "PrimeIntellect-ai/prime-rl at d8f290ef0 (docs/research/preference-ground-truth.md R2): transformers' model code "
     "with --model.attn as attn_implementation (flash_attention_2 by default); model.py setup_fsdp: fully_shard per "
     "decoder layer and the root, reshard_after_forward=True, MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) "
     "over fp32 parameters; checkpoint_wrapper (non-reentrant) on every layer, each layer compiled on its own; "
     "optim.py: torch.optim.AdamW with no foreach/fused flag (foreach on CUDA), one group; lm_head.py "
     "VanillaOutputLinear returns the logits and forward() makes them fp32 (cast_float_and_contiguous), which "
     "CrossEntropyLoss reads unshifted; sft/train.py `del logits` leaves `out` holding them through backward, the "
     "optimizer step and the next micro-batch's forward; the benchmarks workflow sets expandable_segments", false, false, true, false, false,
     FrameworkSpec::ExpertShard::PerExpertLinear, false, false, false, false, false, "alltoall", false, true, true, true},
    {"unsloth", "Unsloth (FastLanguageModel under TRL/HF Trainer)", "sdpa_repeat_kv", "fused", "unsloth_fused_ce", "fused", 2, false, false, "deepspeed", false, false, false, false, false, true, false,
     "unslothai/unsloth at HEAD 015bdef0 with unsloth-zoo ce232d6c (docs/research/unsloth.md): xformers attention "
     "(the notebooks install xformers, not flash-attn) expands k and v to every query head in training; "
     "Fast_RMS_Layernorm saves its input and an fp32 rstd; Fast_RoPE_Embedding rotates q and k in place; "
     "LoRA_MLP saves X, e and g (not silu(e) * g), LoRA_QKV reads X once, LoRA A/B are fp32 and cast to the "
     "activation dtype inside the kernels; the loss and use_gradient_checkpointing='unsloth' follow the unsloth "
     "version; `import unsloth` sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (docs/versions.md 11); the "
     "loop is TRL's SFTTrainer, an HF Trainer", false, false, true, false, true,
     FrameworkSpec::ExpertShard::PerExpertLinear, true, true},
};

// The choice lists (choices.h) this file resolves; each enum list below pairs with its names after "auto".
using choice::kAdapterDtype, choice::kAttention, choice::kCheckpointing, choice::kCpRotate,
    choice::kLoss, choice::kNorm, choice::kOptImpl, choice::kSharding;
constexpr Attention kAttentionValues[] = {Attention::Sdpa, Attention::SdpaRepeatKv, Attention::FlashAttention2,
                                          Attention::Eager, Attention::SdpaMath};
constexpr NormImpl kNormValues[] = {NormImpl::EagerFp32, NormImpl::Fp32Scale, NormImpl::Fused};
constexpr LossImpl kLossValues[] = {LossImpl::HfFp32Upcast,  LossImpl::HfShiftFp32,     LossImpl::HfFp32Logits,
                                    LossImpl::HfShift,       LossImpl::FullFp32,        LossImpl::ChunkedFp32,
                                    LossImpl::ChunkedBf16,   LossImpl::FusedLinear,     LossImpl::UnslothLogits,
                                    LossImpl::CutCrossEntropy, LossImpl::UnslothFusedCe, LossImpl::VocabChunked};
constexpr OptimizerImpl kOptImplValues[] = {OptimizerImpl::Foreach, OptimizerImpl::Fused, OptimizerImpl::ForLoop};
constexpr Sharding kShardingValues[] = {Sharding::DeepSpeed, Sharding::Fsdp1, Sharding::Fsdp2, Sharding::Megatron};
constexpr AdapterDtype kAdapterDtypeValues[] = {AdapterDtype::Fp32, AdapterDtype::Bf16, AdapterDtype::Fp16};
constexpr CpRotate kCpRotateValues[] = {CpRotate::AllGather, CpRotate::AllToAll};

constexpr std::string_view kSwitchFields[] = {
    "training.softmax_saves_input", "training.zero_grad_set_to_none", "training.optimizer_impl",
    "training.attention",           "training.loss",                  "peft.bnb_saves_input",
    "peft.adapter_dtype",           "hardware.expandable_segments",   "hardware.cuda_module_loading",
    "training.empty_cache_steps",   "training.checkpoint_reentrant",  "peft.prepare_kbit"};
static_assert(std::size(kSwitchFields) == kSwitchCount);

// The value named `text` among names[1..] ("auto" is names[0]); values[0] for an unknown name (validated away).
template <typename E, size_t N>
E named(std::string_view text, const std::string_view (&names)[N], const E (&values)[N - 1]) {
  for (size_t i = 1; i < N; ++i)
    if (names[i] == text) return values[i - 1];
  return values[0];
}
template <typename E, size_t N>
std::string_view name_of(E value, const std::string_view (&names)[N], const E (&values)[N - 1]) {
  for (size_t i = 1; i < N; ++i)
    if (values[i - 1] == value) return names[i];
  return names[1];
}

constexpr Version V(int major, int minor, int patch = 0) { return {major, minor, patch}; }

// Records where an auto switch's value came from: a stated version of `a` (or `b`), else today's behaviour.
struct Deriving {
  const StackVersions& v;
  Resolved& r;
  void from(Switch s, const char* why, Library a) {
    Origin& o = r.origin[static_cast<size_t>(s)];
    o = {v.stated(a) ? Origin::Kind::Version : Origin::Kind::Default, a, a, false, why};
  }
  void from(Switch s, const char* why, Library a, Library b) {
    Origin& o = r.origin[static_cast<size_t>(s)];
    o = {v.stated(a) || v.stated(b) ? Origin::Kind::Version : Origin::Kind::Default, a, b, true, why};
  }
  void framework(Switch s) { r.origin[static_cast<size_t>(s)] = {Origin::Kind::Default, Library::Torch, Library::Torch, false, ""}; }
  void given(Switch s) { r.origin[static_cast<size_t>(s)] = {Origin::Kind::Explicit, Library::Torch, Library::Torch, false, ""}; }
};

bool decoder_causal_lm(const ModelConfig& m) { return !m.is_encoder_decoder && m.head() == TaskHead::CausalLm; }

// A switch of auto / true / false: the explicit value, or `derive()` with its origin recorded.
template <typename F>
bool tri_state(const std::string& field, Switch s, Deriving& d, F&& derive) {
  if (field == "auto") return derive();
  d.given(s);
  return field == "true";
}

// ---------------------------------------------------------------------------------------------------------
// [SECTION] The rules: each auto switch from the versions (docs/versions.md, "Summary of rules").
// ---------------------------------------------------------------------------------------------------------

// docs/versions.md 2: torch.optim's default on CUDA, and what the HF Trainer passes.
OptimizerImpl derive_optimizer_impl(const FrameworkSpec& f, const StackVersions& v, Deriving& d) {
  const OptimizerImpl spec = named(f.optimizer_impl, kOptImpl, kOptImplValues);
  const bool torch2 = v.at_least(Library::Torch, V(2, 0));
  if (f.hf_trainer_loop) {
    if (v.below(Library::Transformers, V(4, 32))) {
      d.from(Switch::OptimizerImpl, "the Trainer's default optim was adamw_hf, transformers' own AdamW with a "
                                    "per-parameter loop, until transformers#25109 made it adamw_torch in 4.32",
             Library::Transformers);
      return OptimizerImpl::ForLoop;
    }
    // transformers#37358 "Defaults to adamw_torch_fused for Pytorch>=2.8", merged about 2025-07-10: first released
    // in 4.54 (inferred from the dates, not verified), and only with torch >= 2.8 (training_args.py default_optim).
    if (v.at_least(Library::Transformers, V(4, 54)) && v.at_least(Library::Torch, V(2, 8))) {
      d.from(Switch::OptimizerImpl, "the Trainer defaults to adamw_torch_fused on torch >= 2.8 from transformers#37358 "
                                    "(4.54, inferred from its merge date)",
             Library::Transformers, Library::Torch);
      return OptimizerImpl::Fused;
    }
    d.from(Switch::OptimizerImpl, torch2 ? "the Trainer's adamw_torch (transformers#25109, 4.32; fused only from #37358, "
                                           "4.54, with torch >= 2.8) is torch.optim.AdamW, foreach by default on CUDA "
                                           "from torch 2.0 (pytorch#95862)"
                                         : "the Trainer's adamw_torch (transformers#25109, 4.32) is torch.optim.AdamW, "
                                           "which had no foreach default before torch 2.0 (pytorch#95862)",
           Library::Transformers, Library::Torch);
    return torch2 ? OptimizerImpl::Foreach : OptimizerImpl::ForLoop;
  }
  if (f.torchtune_recipes) {
    // pytorch/torchtune#1575 (commit cca50f02, 2024-09-14) added fused: True to the AdamW configs: 93 of 120 recipe
    // configs in v0.4.0, 2 of 70 in v0.3.0 (git grep at the tags). Before, torch.optim.AdamW took torch's default.
    if (v.below(Library::Torchtune, V(0, 4))) {
      d.from(Switch::OptimizerImpl, torch2 ? "torchtune's AdamW configs set fused: True only from 0.4 (torchtune#1575); "
                                             "before, torch.optim.AdamW defaulted to foreach (torch >= 2.0, pytorch#95862)"
                                           : "torchtune's AdamW configs set fused: True only from 0.4 (torchtune#1575); "
                                             "torch.optim had no foreach default before 2.0",
             Library::Torchtune, Library::Torch);
      return torch2 ? OptimizerImpl::Foreach : OptimizerImpl::ForLoop;
    }
    d.from(Switch::OptimizerImpl, "torchtune's AdamW configs set fused: True from 0.4 (torchtune#1575)", Library::Torchtune);
    return OptimizerImpl::Fused;
  }
  if (spec != OptimizerImpl::Foreach) {  // fused kernels the framework asks for itself (FusedAdam, fused: True)
    d.framework(Switch::OptimizerImpl);
    return spec;
  }
  // torch.optim picks foreach when the user passes neither flag only from 2.0 (pytorch#92305 _default_to_foreach,
  // #95862 "[optim] _actually_ default to foreach"); fused is never the default (#95415).
  d.from(Switch::OptimizerImpl, torch2 ? "torch.optim defaults to foreach on CUDA from 2.0 (pytorch#95862)"
                                       : "torch.optim had no foreach default before 2.0 (pytorch#95862 made it one)",
         Library::Torch);
  return torch2 ? OptimizerImpl::Foreach : OptimizerImpl::ForLoop;
}

// A model program with grouped-query attention (an attention op with fewer kv_heads than heads).
bool program_groups_kv(const Config& c) {
  if (c.model.architecture.empty()) return false;
  std::shared_ptr<const Architecture> a;
  if (!decode_architecture(c.model.architecture, c.model.architecture_args, a).empty() || !a) return false;
  auto grouped = [](const ArchStage& s) {
    for (const ArchOp& op : s.ops)
      if (op.kind == OpKind::Attention && op.kv_heads > 0 && op.kv_heads < op.heads) return true;
    return false;
  };
  for (const ArchStage& s : a->blocks)
    if (grouped(s)) return true;
  return grouped(a->embeddings) || grouped(a->head);
}

// docs/versions.md 7a: attention that the model's own code picks, not transformers' attn_implementation: a program's
// "attention_code" (torchvision's nn.MultiheadAttention, timm, diffusers), and Qwen-1's remote code. nullopt where
// transformers' rule (or the framework's) decides.
std::optional<Attention> own_code_attention(const Config& c, const Architecture* program, const FrameworkSpec& f,
                                            const StackVersions& v, Deriving& d) {
  const auto& m = c.model;
  const bool torch2 = v.at_least(Library::Torch, V(2, 0));
  if (!m.architecture.empty()) {
    if (!program) return std::nullopt;
    using Code = Architecture::AttentionCode;
    if (program->attention_code == Code::Eager) {
      d.framework(Switch::Attention);
      return Attention::Eager;
    }
    if (program->attention_code != Code::TorchSdpa) return std::nullopt;
    d.from(Switch::Attention, torch2 ? "the model program's own attention calls F.scaled_dot_product_attention from torch 2.0 "
                                       "(nn.MultiheadAttention with need_weights=False, diffusers' AttnProcessor2_0, timm's fused_attn)"
                                     : "the model program's own attention materialises the scores before torch 2.0, which "
                                       "has no F.scaled_dot_product_attention",
           Library::Torch);
    return torch2 ? Attention::Sdpa : Attention::Eager;
  }
  if (!m.qwen1_remote_code() || !f.transformers_model) return std::nullopt;  // Megatron, torchtune: their own code
  // Qwen-1's modeling_qwen.py (remote code, Qwen/Qwen-1_8B-Chat and the other Qwen-1 repositories, late 2023):
  // _import_flash_attn() takes flash_attn_func when flash-attn 2.1+ imports, and QWenAttention calls it for a
  // half-precision model (config.json's bf16/fp16 "auto" is set from the GPU); otherwise, with torch 2, it calls
  // F.scaled_dot_product_attention with its own mask (a boolean tril, merged into the padding mask), and _attn's
  // matmul and softmax before. flash-attn is an optional package: only a stated versions.flash_attn counts as installed.
  if (v.stated(Library::FlashAttn)) {
    d.from(Switch::Attention, "Qwen-1's remote code (modeling_qwen.py) calls flash-attn's kernels when flash-attn imports",
           Library::FlashAttn);
    return Attention::FlashAttention2;
  }
  d.from(Switch::Attention, torch2 ? "Qwen-1's remote code without flash-attn (versions.flash_attn unstated) calls "
                                     "F.scaled_dot_product_attention with its own mask on torch 2"
                                   : "Qwen-1's remote code without flash-attn materialises the scores before torch 2",
         Library::Torch);
  return torch2 ? Attention::Sdpa : Attention::Eager;
}

// docs/versions.md 7: transformers' default attn_implementation, and repeat_kv before SDPA.
Attention derive_attention(const Config& c, const FrameworkSpec& f, const StackVersions& v, Deriving& d) {
  const auto& m = c.model;
  std::shared_ptr<const Architecture> program;  // the model program, where the config has one that decodes
  if (!m.architecture.empty() && !decode_architecture(m.architecture, m.architecture_args, program).empty()) program.reset();
  if (const std::optional<Attention> own = own_code_attention(c, program.get(), f, v, d)) return *own;
  if (!f.transformers_model || m.is_encoder_decoder) {  // T5's attention is its own eager code in every version
    d.framework(Switch::Attention);
    return named(f.attention, kAttention, kAttentionValues);
  }
  // SDPA is the default for models that support it from 4.36 (transformers#26572) and only with torch >= 2.1.1
  // (#27940); BERT's BertSdpaSelfAttention arrived in 4.41 (activations.cpp layer_forward_post_ln), and a model
  // program names its family's release (transformers_sdpa_since: ViT's in 4.41, CLIP's in 4.43, ...).
  Version sdpa_since = m.post_layernorm ? V(4, 41) : V(4, 36);
  // never before 4.36, when SDPA became transformers' default
  const bool family_release = program && program->transformers_sdpa_since > sdpa_since;
  if (family_release) sdpa_since = program->transformers_sdpa_since;
  if (v.below(Library::Transformers, sdpa_since) || v.below(Library::Torch, V(2, 1, 1))) {
    d.from(Switch::Attention, family_release ? "the model program's family supports SDPA from the transformers release "
                                               "it names (transformers_sdpa_since), with torch >= 2.1.1; eager before"
                              : m.post_layernorm ? "BERT's SDPA attention is the default from transformers 4.41 with "
                                                   "torch >= 2.1.1 (transformers#27940); eager before"
                                                 : "SDPA is transformers' default from 4.36 (transformers#26572) with "
                                                   "torch >= 2.1.1 (#27940); eager before",
           Library::Transformers, Library::Torch);
    return Attention::Eager;
  }
  // transformers#39412 passes enable_gqa (torch >= 2.5) instead of repeating k and v for every query head. Its
  // release is 4.54 to 4.56, not verified: 4.56 is taken, which keeps the repeated copies for 4.54 and 4.55.
  const bool gqa = program_groups_kv(c) || (m.architecture.empty() && m.num_key_value_heads < m.num_attention_heads);
  if (gqa && (v.below(Library::Transformers, V(4, 56)) || v.below(Library::Torch, V(2, 5)))) {
    d.from(Switch::Attention, "transformers repeats k and v for every query head before SDPA until transformers#39412 "
                              "(4.54-4.56, not verified: 4.56 taken) passes enable_gqa, which needs torch >= 2.5",
           Library::Transformers, Library::Torch);
    return Attention::SdpaRepeatKv;
  }
  d.from(Switch::Attention, gqa ? "SDPA by default (transformers#26572, 4.36), with enable_gqa instead of repeated k "
                                  "and v from transformers#39412 (4.56 taken) on torch >= 2.5"
                            : family_release
                                ? "the model program's family supports SDPA, transformers' default, from the release it "
                                  "names (transformers_sdpa_since), with torch >= 2.1.1"
                                : "SDPA is transformers' default from 4.36 (transformers#26572) with torch >= 2.1.1",
         Library::Transformers, Library::Torch);
  return Attention::Sdpa;
}

// docs/research/qwen2-vl.md section 2: Qwen2-VL's tower attends over every patch of the micro-batch with cu_seqlens.
// Until transformers#37363 (25343aafee, released in 4.54) eager and SDPA build a block-diagonal [1, N, N] mask in
// every block; SDPA got 3-D q, k and v until #36891 (064cd7cd, 4.51), which PyTorch's fused kernels refuse, so it ran
// the math path. flash_attention_2 takes cu_seqlens (varlen) in every version. "latest" is 4.54 on: one call per image.
// 4.53.0 built a [1, 1, N, N] float mask in every block for every implementation, flash_attention_2 included;
// 4.53.1-4.53.3 build it for eager and SDPA only (3c5f9108, transformers#39121), so SDPA gets a float bias from 4.53.
PackedAttention derive_packed_attention(Attention attention, const StackVersions& v, PackedMask& mask, std::string& note) {
  const Library tf = Library::Transformers;
  mask = PackedMask::None;
  if (v.at_least(tf, V(4, 54))) return PackedAttention::PerSample;
  const std::string stated = " (transformers " + version_text(v[tf].version) + ")";
  const bool float_mask = v.at_least(tf, V(4, 53));
  if (attention == Attention::FlashAttention2) {
    if (v.at_least(tf, V(4, 53)) && v.below(tf, V(4, 53, 1))) {
      mask = PackedMask::Float;
      note = "packed attention (Qwen2-VL's tower): transformers 4.53.0 builds a [1, 1, N, N] float mask over all N "
             "patches of the micro-batch in every block, which flash_attention_2 does not read" + stated;
    }
    return PackedAttention::PerSample;
  }
  if (attention == Attention::Eager) {
    mask = PackedMask::Float;
    note = "packed attention (Qwen2-VL's tower): eager builds a [1, N, N] mask over all N patches of the micro-batch "
           "in every block and scores over all of them until transformers#37363 (4.54)" + stated;
    return PackedAttention::EagerMask;
  }
  mask = float_mask ? PackedMask::Float : PackedMask::Bool;
  if (v.below(tf, V(4, 51)) || attention == Attention::SdpaMath) {
    note = "packed attention (Qwen2-VL's tower): SDPA runs its math path (3-D q, k, v until transformers#36891, 4.51, "
           "which PyTorch's fused kernels refuse; or training.attention sdpa_math) over a [1, N, N] mask of all N "
           "patches of the micro-batch" + stated;
    return PackedAttention::SdpaMathMask;
  }
  note = "packed attention (Qwen2-VL's tower): SDPA's memory-efficient kernel over a [1, N, N] mask of all N patches "
         "of the micro-batch, made an additive bias, until transformers#37363 (4.54)" + stated;
  return PackedAttention::SdpaEfficientMask;
}

// docs/versions.md 6a: LlamaForCausalLM's logits and loss (Mistral, Qwen2 and the other "Copied from" Llama classes
// follow it; transformers#30860 says almost every ModelForCausalLM had the 4.31 upcast, so all decoder-only causal LMs
// are taken to: a class that never upcast, such as GPT-2's, is overestimated in 4.31-4.45).
LossImpl hf_loss_path(const StackVersions& v) {
  const Library tf = Library::Transformers;
  return v.below(tf, V(4, 31))   ? LossImpl::HfShift
         : v.below(tf, V(4, 46)) ? LossImpl::HfFp32Logits
         : v.below(tf, V(4, 49)) ? LossImpl::HfShiftFp32
                                 : LossImpl::HfFp32Upcast;
}

LossImpl derive_loss(const Config& c, const FrameworkSpec& f, const StackVersions& v, Deriving& d, int64_t& chunks) {
  const LossImpl spec = named(f.loss, kLoss, kLossValues);
  if (f.compiles_loss && c.training.compile && decoder_causal_lm(c.model) && spec == LossImpl::FullFp32) {
    // torchtitan PR #1033 (merged 2025-04-01) compiles cross_entropy_loss when compile is enabled: Inductor fuses the
    // fp32 upcast and the log-softmax into its reductions, saving the logits and a per-token logsumexp, the same
    // as a compiled chunked loss of one chunk. torchtitan has no version here: versions.date decides where it is
    // given (torchtitan runs on torch nightlies, whose 2.7.0a0 predates the PR), else torch 2.7 (2025-04-23), the
    // release current when it landed (not verified against torchtitan's requirements).
    const bool before = v.has_date ? v.date < Date{2025, 4, 1} : v.below(Library::Torch, V(2, 7));
    if (before) {
      d.from(Switch::Loss, "torchtitan compiled its loss with the model only from PR #1033 (2025-04-01), taken from "
                           "torch 2.7: before, the fp32 logits and their log-softmax stay eager",
             Library::Torch);
      return spec;
    }
    chunks = 1;
    d.from(Switch::Loss, "torchtitan compiles its cross-entropy with the model (PR #1033, 2025-04-01, taken from torch "
                         "2.7): the loss keeps the logits and a logsumexp per token, as a compiled chunk",
           Library::Torch);
    return LossImpl::ChunkedFp32;
  }
  if (f.unsloth_kernels && decoder_causal_lm(c.model)) {
    // docs/research/unsloth.md 2b: CausalLM_fast_forward's loss by release. Each change is taken from the first
    // month whose releases all have it: CCE (fa8e59eb, 2024-11-17; in tag December-2024), the N <= 1024 rule
    // (b9fe2588, 2024-12-10), unsloth_fused_ce_loss (806bee24, 2025-08-13; in tag August-2025-v2) and fused for
    // every N (0ede099e, 2025-10-16). The N <= 1024 rule is Resolved::unsloth_logits_max_tokens.
    const Library u = Library::Unsloth;
    if (v.below(u, V(2024, 12))) {
      d.from(Switch::Loss, "Unsloth's fast_cross_entropy_loss on materialised 16-bit logits until it called "
                           "cut_cross_entropy (unsloth fa8e59eb, 2024-11-17)", u);
      return LossImpl::UnslothLogits;
    }
    if (v.below(u, V(2025, 8))) {
      d.from(Switch::Loss, "Unsloth called Apple's cut_cross_entropy (unsloth fa8e59eb, 2024-11-17; from b9fe2588, "
                           "2024-12-10, only above 1024 tokens per micro-batch) until unsloth_fused_ce_loss (806bee24, "
                           "2025-08-13)", u);
      return LossImpl::CutCrossEntropy;
    }
    d.from(Switch::Loss, v.below(u, V(2025, 11))
                             ? "unsloth_fused_ce_loss above 1024 tokens per micro-batch from unsloth 806bee24 "
                               "(2025-08-13), materialised logits below until 0ede099e (2025-10-16)"
                             : "unsloth_fused_ce_loss for every micro-batch from unsloth 0ede099e (2025-10-16)",
           u);
    return LossImpl::UnslothFusedCe;
  }
  if (f.torchtune_recipes && decoder_causal_lm(c.model)) {
    // docs/versions.md 13: CEWithChunkedOutputLoss is in 61 of 70 recipe configs from torchtune v0.3.0 and in none of
    // v0.2.1, whose TransformerDecoder returned self.output(h).float() to nn.CrossEntropyLoss (modules/transformer.py).
    if (v.below(Library::Torchtune, V(0, 3))) {
      d.from(Switch::Loss, "torchtune's recipes applied nn.CrossEntropyLoss to the full fp32 logits "
                           "(self.output(h).float()) until CEWithChunkedOutputLoss in 0.3", Library::Torchtune);
      return LossImpl::FullFp32;
    }
    d.from(Switch::Loss, "torchtune's recipe configs use CEWithChunkedOutputLoss from 0.3", Library::Torchtune);
    return LossImpl::ChunkedFp32;
  }
  if (!f.transformers_model || spec != LossImpl::HfFp32Upcast || !decoder_causal_lm(c.model)) {
    d.framework(Switch::Loss);
    return spec;
  }
  if (c.model.qwen1_remote_code()) {
    // Qwen-1's remote code has its own loss in every transformers version (modeling_qwen.py QWenLMHeadModel.forward):
    // lm_head's 16-bit logits, a shifted .contiguous() copy, and CrossEntropyLoss, whose log_softmax autocast runs in
    // fp32: transformers' own path before 4.31 (hf_shift).
    d.framework(Switch::Loss);
    return LossImpl::HfShift;
  }
  const LossImpl loss = hf_loss_path(v);
  switch (loss) {
    case LossImpl::HfShift:
      d.from(Switch::Loss, "before transformers 4.31 the logits stayed in the model dtype and the loss shifted a copy of "
                           "them (docs/versions.md 6a, from memory)", Library::Transformers);
      break;
    case LossImpl::HfFp32Logits:
      d.from(Switch::Loss, "from transformers#24891 (4.31) the model returned fp32 logits (logits.float()) and the loss "
                           "shifted an fp32 copy of them, until #33902 (4.46)", Library::Transformers);
      break;
    case LossImpl::HfShiftFp32:
      d.from(Switch::Loss, "from transformers#33902 (4.46) the logits stay in the model dtype and ForCausalLMLoss "
                           "(#34191) upcasts them and shifts an fp32 copy, until #35646 (4.49, inferred)", Library::Transformers);
      break;
    default:
      d.from(Switch::Loss, "ForCausalLMLoss upcasts the logits to fp32 with no shifted copy from transformers#35646 (4.49, "
                           "inferred)", Library::Transformers);
  }
  return loss;
}

// docs/versions.md 6b and 5: the 4-D attention mask that transformers builds for a decoder-only causal LM, and the
// SDPA kernel that takes it. Only a stated transformers version (or versions.date) decides it: at latest memsim keeps
// what it modelled before versions were inputs, no mask at all (eager attention and padded SDPA batches of the newest
// transformers build one; that gap stays so that latest is unchanged). The builders are Llama's (Mistral, Qwen2 and
// the "Copied from" models moved to _update_causal_mask later than Llama; not verified per model), taken for every
// decoder-only causal LM as derive_loss does. Pipeline and context parallelism are not transformers' model code.
AttentionMask derive_attention_mask(const Config& c, const FrameworkSpec& f, Attention attention,
                                    const StackVersions& v) {
  AttentionMask mk;
  const auto& m = c.model;
  const Library tf = Library::Transformers, torch = Library::Torch;
  // Prefix tuning always has a mask (a past length rules out is_causal), so it is built at latest too.
  const bool prefix = c.peft.kind() == PeftMethod::PrefixTuning;
  // Qwen-1's remote code builds its own mask whatever transformers' version (own_code_attention), so at latest too.
  const bool qwen1 = m.qwen1_remote_code();
  if (!f.transformers_model || !decoder_causal_lm(m) || m.post_layernorm || attention == Attention::FlashAttention2 ||
      (!v.stated(tf) && !prefix && !qwen1) || c.parallel.pipeline_parallel_size > 1 || c.parallel.context_parallel_size > 1)
    return mk;
  const bool eager = attention == Attention::Eager;
  // Llama's cache_position rework for the static cache (4.38: "we've recently retouched the llama architecture code
  // to make it compatible with static caches", transformers#29484) reached Gemma (added in 4.38 as its copy) and
  // Cohere (4.39), not Mistral, Mixtral, Qwen2 or the other "Copied from Mistral" models, whose 4.38-4.39 forward
  // still calls _prepare_4d_causal_attention_mask(_for_sdpa). Those take the 4.36-4.37 builders until 4.40, after
  // which both paths hand SDPA no mask when nothing is padded.
  const bool llama_rework = m.model_type == "llama" || m.model_type == "gemma" || m.model_type == "cohere";
  const bool prepare_4d = v.below(tf, V(4, 38)) || (!llama_rework && v.below(tf, V(4, 40)));
  const char* built = "";
  if (qwen1) {
    // modeling_qwen.py QWenModel.forward: attention_mask[:, None, None, :] made additive in the model dtype; each
    // QWenAttention expands it over the queries and merges a boolean tril with masked_fill (a new [b, 1, s, s]),
    // which reaches F.scaled_dot_product_attention, or _attn's scores.
    mk.build = MaskBuild::Prepared, mk.unpadded = true;
    built = "Qwen-1's remote code (modeling_qwen.py) builds its own [batch, 1, seq, seq] mask in the model dtype for "
            "every micro-batch, whatever the transformers version, and hands it to SDPA";
  } else if (v.below(tf, V(4, 36))) {
    // LlamaModel.forward makes an all-ones attention_mask when none is passed, then _prepare_decoder_attention_mask:
    // eager attention needs the causal mask, so it is built whether or not anything is padded.
    mk.build = MaskBuild::Prepared, mk.unpadded = true;
    built = "transformers up to 4.35 builds a [batch, 1, seq, seq] mask in the model dtype for every micro-batch, padded "
            "or not (LlamaModel._prepare_decoder_attention_mask: _make_causal_mask and _expand_mask), one tensor that "
            "every layer reads";
  } else if (prepare_4d) {
    mk.build = MaskBuild::Prepared, mk.to_4d = true, mk.unpadded = eager;
    built = eager ? "transformers 4.36-4.37 (to 4.39 outside Llama, Gemma and Cohere) builds a [batch, 1, seq, seq] mask "
                    "in the model dtype for every micro-batch (_prepare_4d_causal_attention_mask, AttentionMaskConverter.to_4d)"
                  : "transformers 4.36-4.37 (to 4.39 outside Llama, Gemma and Cohere) hands SDPA no mask when nothing is "
                    "padded (is_causal, so flash) and a [batch, 1, seq, seq] mask in the model dtype otherwise "
                    "(_prepare_4d_causal_attention_mask_for_sdpa)";
  } else if (v.below(tf, V(4, 39))) {
    mk.build = MaskBuild::MaxPositions, mk.unpadded = true;
    built = "transformers 4.38 keeps a causal_mask buffer of max_position_embeddings^2 booleans, repeats it into a "
            "[batch, 1, P, P] mask in the model dtype for every micro-batch and indexes a [batch, 1, seq, seq] copy of "
            "it in every layer (_update_causal_mask; transformers#29484 reports the OOM on 4.38.2, #29753 dropped the "
            "buffer in 4.39)";
  } else if (eager) {
    mk.build = v.below(tf, V(4, 53)) ? MaskBuild::Updated : MaskBuild::BooleanToFloat, mk.unpadded = true;
    built = "eager attention gets a [batch, 1, seq, seq] mask in the model dtype for every micro-batch "
            "(_update_causal_mask; from 4.53 masking_utils' eager_mask)";
  } else if (v.below(tf, V(4, 40))) {
    mk.build = MaskBuild::Updated, mk.unpadded = true;
    built = "transformers 4.39 hands SDPA a [batch, 1, seq, seq] mask in the model dtype even when nothing is padded "
            "(_update_causal_mask), so never flash, until transformers#30070 (4.40)";
  } else if (v.below(tf, V(4, 53))) {
    // _ignore_causal_mask_sdpa skips the mask only when not tracing or compiling (is_torchdynamo_compiling), so under
    // torch.compile every micro-batch gets one (docs/versions.md 6b).
    mk.build = MaskBuild::Updated, mk.unpadded = c.training.compile;
    built = c.training.compile
                ? "from transformers#30070 (4.40) SDPA gets no mask when nothing is padded, but not under torch.compile "
                  "(_ignore_causal_mask_sdpa keeps the mask while compiling): a [batch, 1, seq, seq] mask in the model "
                  "dtype for every micro-batch"
                : "from transformers#30070 (4.40) SDPA gets no mask when nothing is padded (_ignore_causal_mask_sdpa: "
                  "is_causal, so flash) and a [batch, 1, seq, seq] mask in the model dtype for a padded micro-batch";
  } else {
    mk.build = MaskBuild::Boolean, mk.unpadded = c.training.compile || prefix;
    built = c.training.compile
                ? "from transformers 4.53 SDPA gets a boolean [batch, 1, seq, seq] mask (masking_utils.sdpa_mask) for "
                  "every micro-batch under torch.compile (the causal skip is off while compiling), which torch converts "
                  "to an additive copy in every layer's call (convert_boolean_attn_mask)"
                : "SDPA gets no mask when nothing is padded (is_causal, so flash) and, from transformers 4.53, a boolean "
                  "[batch, 1, seq, seq] mask for a padded micro-batch (masking_utils.sdpa_mask), which torch converts to "
                  "an additive copy in every layer's call (convert_boolean_attn_mask)";
  }
  const char* kernel = "";
  if (eager) {
    mk.kernel = MaskKernel::Eager;
  } else if (v.below(torch, V(2, 1))) {
    // pytorch#97514: on 2.0 the fused kernels refuse any attn_mask ("No available kernel" with only mem-efficient on).
    mk.kernel = MaskKernel::Math;
    kernel = "; torch 2.0 runs an SDPA call with a mask on the math kernel, which keeps the [batch, heads, seq, seq] "
             "softmax and scaled copies of q and k in every layer (no fused kernel took a mask before pytorch#104310, "
             "2.1)";
  } else if (v.below(torch, V(2, 1, 2))) {
    // attention.cpp at #104310: expand to [b, h, s, s], then pad_bias to a multiple of 16 keys (a full copy); the
    // interim preprocess_mask kept that order. #114173 pads the unexpanded mask to 8 instead ("un-needed memory
    // regressions"); cherry-picked as #114837, listed in the v2.1.2 release tracker (pytorch#113962).
    mk.kernel = MaskKernel::MemEfficient, mk.pad_align = 16, mk.pad_expanded = true;
    kernel = "; torch 2.1.0-2.1.1 runs it on the memory-efficient kernel (pytorch#104310), which keeps the mask it is "
             "given in every layer, and when the keys are not a multiple of 16 a copy padded after expanding it over "
             "the heads (fixed by #114173, 2.1.2)";
  } else {
    mk.kernel = MaskKernel::MemEfficient;
    kernel = "; torch runs it on the memory-efficient kernel (pytorch#104310, 2.1), which keeps the mask it is given "
             "in every layer, a copy padded to a multiple of 8 keys when its rows are not (preprocess_mask, "
             "pytorch#114173, 2.1.2)";
  }
  mk.note = "from " + describe_version(v, tf) + (eager ? "" : " and " + describe_version(v, torch)) + ": " + built + kernel;
  if (prefix)
    mk.note += "; prefix tuning: the cache's prefix is a past length, which rules out is_causal, so every micro-batch "
               "gets the mask, [batch, 1, seq, num_virtual_tokens + seq]";
  if (attention == Attention::SdpaMath) {  // chosen by hand: the math kernel adds the mask to its scores itself
    mk.kernel = MaskKernel::Math;
    mk.note += "; training.attention sdpa_math: the math kernel adds it to the scores";
  }
  // transformers#39412's use_gqa_in_sdpa passes enable_gqa only when attention_mask is None: a call with a mask
  // repeats k and v for every query head (activations.cpp layer_forward).
  if (attention == Attention::Sdpa && m.num_key_value_heads < m.num_attention_heads)
    mk.note += "; a call with a mask repeats k and v for every query head, since transformers passes enable_gqa only "
               "without one (use_gqa_in_sdpa, transformers#39412)";
  return mk;
}

// docs/versions.md 10: PEFT's adapter dtype over a bf16/fp16 base.
AdapterDtype derive_adapter_dtype(const Config& c, const FrameworkSpec& f, const PrecisionRecipe* pr,
                                  const StackVersions& v, Deriving& d) {
  if (f.adapters_in_model_dtype && pr && pr->weight_bytes == 2) {  // torchtune, litgpt: the model's dtype
    d.framework(Switch::AdapterDtype);
    return std::string_view(pr->id).find("fp16") != std::string_view::npos ? AdapterDtype::Fp16 : AdapterDtype::Bf16;
  }
  if (!f.peft_library) {  // other frameworks' own adapters: fp32 (Unsloth upcasts them; not derived from a version)
    d.framework(Switch::AdapterDtype);
    return AdapterDtype::Fp32;
  }
  const Library peft = Library::Peft;
  if (c.peft.kind() == PeftMethod::AdaptionPrompt) {
    // AdaptedAttention creates adaption_prompt and adaption_gate in q_proj's weight dtype (fp32 over bitsandbytes'
    // int8/uint8 storage), and AdaptionPromptModel has no _cast_adapter_dtype for get_peft_model's autocast to call
    // (peft/tuners/adaption_prompt/layer.py, model.py at 5d602fd).
    d.from(Switch::AdapterDtype, "PEFT's adaption prompt takes q_proj's weight dtype, which autocast_adapter_dtype "
                                 "does not change (AdaptionPromptModel has no _cast_adapter_dtype)", peft);
    if (c.peft.quantized() || !pr || pr->weight_bytes == 4) return AdapterDtype::Fp32;
    return std::string_view(pr->id).find("fp16") != std::string_view::npos ? AdapterDtype::Fp16 : AdapterDtype::Bf16;
  }
  if (v.below(peft, V(0, 6))) {
    d.from(Switch::AdapterDtype, "peft before 0.6 created the adapters in fp32 and only moved them to the device", peft);
    return AdapterDtype::Fp32;
  }
  if (v.at_least(peft, V(0, 12))) {
    d.from(Switch::AdapterDtype, "get_peft_model autocasts bf16/fp16 adapters to fp32 from peft 0.12 "
                                 "(autocast_adapter_dtype, peft#1706)", peft);
    return AdapterDtype::Fp32;
  }
  // peft 0.6-0.11 (peft#928, commit 5bdbf2bc, lora/layer.py update_layer): the adapters take the base weight's dtype
  // when it is a float; bitsandbytes' int8/uint8 storage is not, so over a quantized base they stay fp32. That cast
  // is LoRA's (and DoRA's, the same layer); IA3's update_layer only moves its vectors to the device (ia3/layer.py at
  // v0.10.0), and for prompt embeddings no such cast was read, so they keep fp32, the dtype they are created in.
  if (!c.peft.lora_like()) {
    d.from(Switch::AdapterDtype, "peft 0.6 to 0.11 cast only LoRA layers to the base's dtype (peft#928); other "
                                 "methods' modules are created in fp32 (IA3's update_layer moves them to the device only)",
           peft);
    return AdapterDtype::Fp32;
  }
  if (c.peft.quantized() || !pr || pr->weight_bytes == 4) {
    d.from(Switch::AdapterDtype, "peft 0.6 to 0.11 cast the adapters to the base weight's dtype when it is a float "
                                 "(peft#928); an fp32 or quantized base leaves them in fp32", peft);
    return AdapterDtype::Fp32;
  }
  d.from(Switch::AdapterDtype, "peft 0.6 to 0.11 cast the adapters to the base weight's dtype (peft#928), until "
                               "peft#1706 (0.12) autocast them to fp32", peft);
  return std::string_view(pr->id).find("fp16") != std::string_view::npos ? AdapterDtype::Fp16 : AdapterDtype::Bf16;
}

// docs/research/unsloth.md 1 and 3: Unsloth's gradient-checkpointing buffers and its dequantization buffer, and the
// micro-batches small enough for materialised logits (2b), by the unsloth version.
void derive_unsloth(const Config& c, const StackVersions& v, Resolved& r) {
  const Library u = Library::Unsloth;
  std::string note;  // the rules that apply to this config, "; "-separated
  auto add = [&](const char* part) { note += note.empty() ? part : std::string("; ") + part; };
  r.unsloth_gc = v.below(u, V(2025, 3)) ? UnslothGc::Offload : v.below(u, V(2026, 6)) ? UnslothGc::Smart : UnslothGc::SmartDouble;
  if (c.training.activation_offload && r.checkpointing == Checkpointing::Full) {
    if (r.unsloth_gc == UnslothGc::Offload)
      add("use_gradient_checkpointing='unsloth' (full checkpointing with activation_offload): "
          "Unsloth_Offloaded_Gradient_Checkpointer copies every layer's input to the host and back into a new GPU "
          "tensor, up to unsloth 2025.2");
    else
      add("use_gradient_checkpointing='unsloth' (full checkpointing with activation_offload): UnslothCheckpointFunction "
          "(unsloth-zoo gradient_checkpointing.py, Llama from unsloth 3e5f0611, 2025-03-04) reloads each offloaded "
          "input into one persistent GPU buffer of the largest micro-batch's tokens x hidden, keeps the last layer's "
          "input on the GPU from the second step, does not offload inputs of at most 2^20 elements, and is plain "
          "checkpointing below a 512-token max_seq_length");
    if (r.unsloth_gc == UnslothGc::SmartDouble)
      add("with a second buffer of that size from unsloth-zoo 510d987f (2026-05-04, taken from unsloth 2026.6), "
          "assuming more than 512 MiB free at the next forward");
  }
  r.unsloth_weight_buffer = c.peft.enabled() && c.peft.quantized() && v.at_least(u, V(2025, 2));
  if (r.unsloth_weight_buffer)
    add("matmul_lora dequantizes into one persistent buffer of the largest 4-bit linear (16-bit) and its fp32 "
            "absmax (fast_dequantize use_global_buffer, unsloth 144190bd, in tag 2025-02); the backward's explicit "
            "dequantizations stay temporaries");
  const bool ce_rule = v.at_least(u, V(2025, 1)) && v.below(u, V(2025, 11));
  if (ce_rule && c.training.loss == "auto") {
    r.unsloth_logits_max_tokens = 1024;
    add("a micro-batch of at most 1024 tokens takes the materialised 16-bit logits (CausalLM_fast_forward: if "
        "bsz * q_len <= 1024: RETURN_LOGITS = True, unsloth b9fe2588 to 0ede099e)");
  }
  // unsloth_zoo fused_losses get_chunk_size: n_chunks = ceil(fp32 logits GB / target_gb / 4) * 4, with target_gb 1
  // in the first version (fc29e051, 2025-08-13) and half the free memory from 770de251 (2025-09-04; at most 4 GB from
  // d9fe1f43, 2026-07-06). The free memory at the first call is not known here: 4 GB stands for it (not pinned).
  r.unsloth_ce_target_bytes = v.below(u, V(2025, 9)) ? int64_t{1} << 30 : int64_t{4} << 30;
  if (!note.empty()) r.unsloth_note = note + ", from " + describe_version(v, u);
}

}  // namespace

std::span<const FrameworkSpec> frameworks() { return kFrameworks; }

const FrameworkSpec* find_framework(std::string_view id) {
  for (const auto& f : kFrameworks)
    if (f.id == id) return &f;
  return nullptr;
}

std::string_view switch_field(Switch s) { return kSwitchFields[static_cast<size_t>(s)]; }

Resolved resolve(const Config& c) {
  const auto& t = c.training;
  Resolved r;
  r.framework = find_framework(t.framework);
  if (!r.framework) r.framework = &kFrameworks[0];
  const FrameworkSpec& f = *r.framework;
  r.versions = stack_versions(c.versions);
  const StackVersions& v = r.versions;
  Deriving d{v, r};

  if (t.attention == "auto") r.attention = derive_attention(c, f, v, d);
  else r.attention = named(t.attention, kAttention, kAttentionValues), d.given(Switch::Attention);
  r.norm = named(t.norm_impl == "auto" ? f.norm_impl : std::string_view(t.norm_impl), kNorm, kNormValues);
  r.loss_chunks = t.loss_chunks;
  if (t.loss == "auto") r.loss = derive_loss(c, f, v, d, r.loss_chunks);
  else r.loss = named(t.loss, kLoss, kLossValues), d.given(Switch::Loss);
  if (t.optimizer_impl == "auto") r.optimizer_impl = derive_optimizer_impl(f, v, d);
  else r.optimizer_impl = named(t.optimizer_impl, kOptImpl, kOptImplValues), d.given(Switch::OptimizerImpl);
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
  r.sharding = named(c.parallel.sharding == "auto" ? f.sharding : std::string_view(c.parallel.sharding), kSharding,
                     kShardingValues);
  const std::string_view cp_auto = f.cp_rotate;  // FrameworkSpec::cp_rotate
  r.cp_rotate = named(c.parallel.cp_rotate_method == "auto" ? cp_auto : std::string_view(c.parallel.cp_rotate_method),
                      kCpRotate, kCpRotateValues);

  const Library torch = Library::Torch;
  // docs/versions.md 1: softmax and log_softmax saved their input as well as their output until pytorch#66018 (landed
  // after the 1.10 branch cut, first in 1.11.0; transformers' pytorch_utils.py branches on the same 1.11).
  r.softmax_saves_input = tri_state(t.softmax_saves_input, Switch::SoftmaxSavesInput, d, [&] {
    const bool old = v.below(torch, V(1, 11));
    d.from(Switch::SoftmaxSavesInput, old ? "softmax and log_softmax kept their input until pytorch#66018, in 1.11"
                                          : "softmax and log_softmax keep only their output from 1.11 (pytorch#66018)",
           torch);
    return old;
  });
  // docs/versions.md 3: Optimizer.zero_grad() and Module.zero_grad() set the gradients to None by default from 2.0
  // (pytorch#92731); the HF Trainer calls model.zero_grad() with no argument, so it follows torch.
  r.zero_grad_set_to_none = tri_state(t.zero_grad_set_to_none, Switch::ZeroGradSetToNone, d, [&] {
    const bool none = v.at_least(torch, V(2, 0));
    d.from(Switch::ZeroGradSetToNone, none ? "zero_grad() sets the gradients to None by default from 2.0 (pytorch#92731)"
                                           : "zero_grad() zeroed the gradients in place, keeping them, before 2.0 "
                                             "(pytorch#92731)",
           torch);
    return none;
  });
  // docs/versions.md 4: MatMul4Bit kept its input, ctx.tensors = (A, B), until bitsandbytes#1270 (commit 9e753741,
  // first tagged in 0.43.2).
  // docs/versions.md 8: transformers' gradient_checkpointing_enable passed use_reentrant=True when given no kwargs
  // in every 4.x (#28538 only made torch's default explicit); #43203 (merged January 2026, first in v5.0.0 as
  // snowflakedb/ArcticTraining#373 reads it) makes use_reentrant=False the default. Other frameworks: their own.
  r.checkpoint_reentrant = tri_state(t.checkpoint_reentrant, Switch::CheckpointReentrant, d, [&] {
    // A model program whose family checkpoints itself (diffusers' models call torch.utils.checkpoint with
    // use_reentrant=False: modeling_utils.py _gradient_checkpointing_func from v0.33, ckpt_kwargs on torch >= 1.11
    // before), whatever the training loop.
    if (!c.model.architecture.empty()) {
      std::shared_ptr<const Architecture> program;
      if (decode_architecture(c.model.architecture, c.model.architecture_args, program).empty() && program && program->checkpoint_reentrant >= 0) {
        d.from(Switch::CheckpointReentrant, program->checkpoint_reentrant ? "the model program's own checkpoint call is reentrant"
                                                                          : "the model program's own checkpoint call is non-reentrant (diffusers: use_reentrant=False)",
               Library::Torch);
        return program->checkpoint_reentrant == 1;
      }
    }
    if (!f.transformers_model) {
      d.framework(Switch::CheckpointReentrant);
      return f.checkpoint_reentrant;
    }
    const bool v4 = v.below(Library::Transformers, V(5, 0));
    d.from(Switch::CheckpointReentrant, v4 ? "gradient checkpointing was reentrant by default before transformers 5.0 (#43203)"
                                           : "gradient checkpointing is non-reentrant by default from transformers 5.0 (#43203)",
           Library::Transformers);
    return v4;
  });
  r.bnb_saves_input = tri_state(c.peft.bnb_saves_input, Switch::BnbSavesInput, d, [&] {
    if (!f.bitsandbytes_quantization) {  // not bitsandbytes' layers (torchtune's NF4 is torchao's)
      d.framework(Switch::BnbSavesInput);
      return false;
    }
    const bool old = v.below(Library::Bitsandbytes, V(0, 43, 2));
    d.from(Switch::BnbSavesInput, old ? "4-bit linears kept their input for backward (MatMul4Bit ctx.tensors = (A, B)) "
                                        "until bitsandbytes#1270, in 0.43.2"
                                      : "4-bit linears keep only the packed weight from 0.43.2 (bitsandbytes#1270)",
           Library::Bitsandbytes);
    return old;
  });
  r.bnb_int8_copy = f.bitsandbytes_quantization && v.below(Library::Bitsandbytes, V(0, 45, 0));
  r.ia3_casts_output = v.below(Library::Peft, V(0, 11));
  r.fsdp1_reshard_hook = r.sharding == Sharding::Fsdp1 && v.at_least(torch, V(2, 1));
  r.zero_grad_before_backward = t.zero_grad_before_backward() &&
                                !((r.sharding == Sharding::DeepSpeed && c.parallel.zero_stage >= 1) || r.sharding == Sharding::Megatron);
  const PrecisionRecipe* recipe = find_precision(t.precision);
  // peft.prepare_kbit: PEFT's helper, which the frameworks built on PEFT call for a quantized base (TRL's SFTTrainer
  // itself up to 0.25); Unsloth's loader, torchtune and litgpt do not.
  const bool hf_trainer = f.id == "hf_trainer";
  r.prepare_kbit = tri_state(c.peft.prepare_kbit, Switch::PrepareKbit, d, [&] {
    const TrlPrep prep = trl_prep(c, v, hf_trainer);
    if (prep.active && v.at_least(Library::Trl, prep.new_prep_from)) {
      d.from(Switch::PrepareKbit, prep.no_kbit_why, Library::Trl);
      return false;
    }
    d.framework(Switch::PrepareKbit);
    return f.peft_library && !f.unsloth_kernels;
  });
  r.kbit_cast = r.prepare_kbit && c.peft.kbit_castable();
  LoadFacts load;
  load.weights_sharded = shards_weights(c, r.sharding) || c.parallel.params_offload() != Offload::None;
  load.transformers_loader = hf_trainer || f.unsloth_kernels;
  load.prequantized = f.unsloth_kernels;
  load.hf_trainer = hf_trainer;
  load.bf16_autocast = recipe && recipe->activation_bytes == 2 && !recipe->fp16;
  load.kbit_cast = r.kbit_cast;
  load.fp32_weights = recipe && recipe->weight_bytes == 4;
  r.model_load = resolve_model_load(c, v, load);
  if (c.peft.adapter_dtype == "auto" && r.model_load.trl_no_kbit_prep) {
    d.from(Switch::AdapterDtype, trl_prep(c, v, hf_trainer).bf16_why, Library::Trl);
    r.adapter_dtype = AdapterDtype::Bf16;
  } else if (c.peft.adapter_dtype == "auto" && r.model_load.trl_adapters_bf16) {
    d.from(Switch::AdapterDtype, "TRL's trainers cast the adapters to bf16 with the embedding and head before 0.9.3 "
                                 "(peft_module_casting_to_bf16's BaseTunerLayer branch)", Library::Trl);
    r.adapter_dtype = AdapterDtype::Bf16;
  } else if (c.peft.adapter_dtype == "auto") {
    r.adapter_dtype = derive_adapter_dtype(c, f, recipe, v, d);
  } else {
    r.adapter_dtype = named(c.peft.adapter_dtype, kAdapterDtype, kAdapterDtypeValues);
    d.given(Switch::AdapterDtype);
  }
  // docs/versions.md 11: launchers that set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True. Of memsim's frameworks
  // only torchtitan's run_train.sh does (axolotl and unsloth, which also do, are not frameworks here). Its
  // multi-node multinode_trainer.slurm does not: the validation cases of multi-node torchtitan runs set false.
  r.expandable_segments = tri_state(c.hardware.expandable_segments, Switch::ExpandableSegments, d, [&] {
    if (f.unsloth_kernels) {
      // docs/versions.md 11: `import unsloth` overwrites PYTORCH_CUDA_ALLOC_CONF with expandable_segments:True from
      // unsloth#249 (c599ae0f, 2024-03-17) and deletes it again for torch < 2.2.
      const bool on = v.at_least(Library::Unsloth, V(2024, 4)) && v.at_least(torch, V(2, 2));
      d.from(Switch::ExpandableSegments, on ? "`import unsloth` sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
                                              "(unsloth#249, 2024-03) with torch >= 2.2"
                                            : "`import unsloth` sets expandable segments only from unsloth#249 "
                                              "(2024-03) and only with torch >= 2.2",
             Library::Unsloth, torch);
      return on;
    }
    d.framework(Switch::ExpandableSegments);
    return f.launcher_expandable_segments;
  });
  // docs/versions.md 13: torch sets CUDA_MODULE_LOADING=LAZY when the user has not, from 1.13 (pytorch#85692,
  // cherry-picked as #86509). It takes effect with a CUDA >= 11.7 runtime, which memsim does not ask for.
  if (c.hardware.cuda_module_loading == "auto") {
    r.lazy_module_loading = v.at_least(torch, V(1, 13));
    d.from(Switch::CudaModuleLoading, r.lazy_module_loading ? "torch sets CUDA_MODULE_LOADING=LAZY from 1.13 "
                                                              "(pytorch#85692, #86509), with CUDA >= 11.7"
                                                            : "CUDA modules loaded eagerly before torch 1.13 set "
                                                              "CUDA_MODULE_LOADING=LAZY (pytorch#85692)",
           torch);
  } else {
    r.lazy_module_loading = c.hardware.cuda_module_loading == "lazy";
    d.given(Switch::CudaModuleLoading);
  }
  // docs/versions.md 9: transformers 4.41's Trainer called torch.cuda.empty_cache() in every training_step
  // (transformers#28769; #31530 removed it for 4.42). It ran between the forward and the backward of every
  // micro-batch; memsim's replay empties the cache at the end of each optimizer step, the nearest it models.
  if (t.empty_cache_steps == kEmptyCacheAuto) {
    const bool tf441 = f.hf_trainer_loop && v.at_least(Library::Transformers, V(4, 41)) &&
                       v.below(Library::Transformers, V(4, 42));
    r.empty_cache_steps = tf441 ? 1 : 0;
    if (f.hf_trainer_loop)
      d.from(Switch::EmptyCacheSteps, tf441 ? "the Trainer of transformers 4.41 emptied the cache in every "
                                              "training_step (transformers#28769, removed by #31530 in 4.42); memsim "
                                              "empties it after each optimizer step"
                                            : "the Trainer empties the cache only in transformers 4.41 "
                                              "(transformers#28769 to #31530), or when torch_empty_cache_steps is set",
             Library::Transformers);
    else
      d.framework(Switch::EmptyCacheSteps);
  } else {
    r.empty_cache_steps = t.empty_cache_steps;
    d.given(Switch::EmptyCacheSteps);
  }
  r.foreach_keeps_denom = v.below(torch, V(2, 1));
  r.fsdp2_one_rank_skips_all_gather = v.at_least(torch, V(2, 9));
  r.masked_sdpa_math = v.below(torch, V(2, 1));
  r.mask = derive_attention_mask(c, f, r.attention, v);
  r.packed_attention = derive_packed_attention(r.attention, v, r.packed_mask, r.packed_note);
  if (f.unsloth_kernels) derive_unsloth(c, v, r);
  r.preference = resolve_preference(c, f, v, r.sharding == Sharding::DeepSpeed && c.parallel.zero_stage > 0);
  r.rollout = resolve_rollout(c, v, r.sharding == Sharding::DeepSpeed && c.parallel.zero_stage == 3);
  r.sft_metrics = resolve_sft_metrics(c, v, f.id == "hf_trainer", transformers_loss_path(r.loss));
  // Some families kept their experts as 3-D parameters in transformers 4 already (gpt-oss's GptOssExperts from 4.55,
  // Llama4TextExperts, DBRX's DbrxExperts, GraniteMoeParallelExperts): no per-expert nn.Linear there either.
  const std::string& type = c.model.model_type;
  const bool stacked_in_4 = type == "gpt_oss" || type == "llama4" || type == "llama4_text" || type == "dbrx" ||
                            type == "granitemoe" || type == "granitemoeshared";
  r.moe_experts_parameters = f.transformers_model && c.model.num_experts > 0 && c.model.architecture.empty() &&
                             (stacked_in_4 || v.at_least(Library::Transformers, V(5, 0)));
  return r;
}

std::string switch_value(const Resolved& r, Switch s) {
  auto yes = [](bool b) { return std::string(b ? "true" : "false"); };
  switch (s) {
    case Switch::SoftmaxSavesInput: return yes(r.softmax_saves_input);
    case Switch::ZeroGradSetToNone: return yes(r.zero_grad_set_to_none);
    case Switch::OptimizerImpl: return std::string(name_of(r.optimizer_impl, kOptImpl, kOptImplValues));
    case Switch::Attention: return std::string(name_of(r.attention, kAttention, kAttentionValues));
    case Switch::Loss: return std::string(name_of(r.loss, kLoss, kLossValues));
    case Switch::BnbSavesInput: return yes(r.bnb_saves_input);
    case Switch::AdapterDtype: return std::string(name_of(r.adapter_dtype, kAdapterDtype, kAdapterDtypeValues));
    case Switch::ExpandableSegments: return yes(r.expandable_segments);
    case Switch::CudaModuleLoading: return r.lazy_module_loading ? "lazy" : "eager";
    case Switch::EmptyCacheSteps: return std::to_string(r.empty_cache_steps);
    case Switch::CheckpointReentrant: return yes(r.checkpoint_reentrant);
    case Switch::PrepareKbit: return yes(r.prepare_kbit);
  }
  return "";
}

bool switch_applies(const Config& c, const Resolved& r, Switch s) {
  const FrameworkSpec& f = *r.framework;
  switch (s) {
    case Switch::Attention:  // own_code_attention: a program's own attention code decides under any loop
      return (f.transformers_model && !c.model.is_encoder_decoder) || !c.model.architecture.empty();
    case Switch::Loss:
      return (f.transformers_model || f.torchtune_recipes || f.unsloth_kernels || (f.compiles_loss && c.training.compile)) &&
             decoder_causal_lm(c.model);
    case Switch::BnbSavesInput:
      return f.bitsandbytes_quantization && c.peft.enabled() && c.peft.four_bit();
    case Switch::AdapterDtype: return c.peft.enabled() && f.peft_library;
    case Switch::CudaModuleLoading: return c.hardware.cuda_context_bytes == 0;
    case Switch::EmptyCacheSteps: return f.hf_trainer_loop && c.data.varies();  // only a run replay empties it
    case Switch::CheckpointReentrant: return c.training.checkpointing_on();
    case Switch::PrepareKbit: return c.peft.kbit_castable();
    default: return true;
  }
}

namespace {
// The stated libraries an origin names: "torch 1.10.0", "transformers 4.36.0 and torch 2.1.0".
std::string origin_versions(const Resolved& r, const Origin& o) {
  std::string out = describe_version(r.versions, o.lib);
  if (o.two) out += " and " + describe_version(r.versions, o.lib2);
  return out;
}
}  // namespace

std::string switch_versions(const Resolved& r, Switch s) {
  const Origin& o = r.origin_of(s);
  if (o.kind != Origin::Kind::Version) return "";
  auto named = [&](Library lib) {
    const LibraryVersion& v = r.versions[lib];
    return std::string(library_info(lib).name) + " " + (v.latest ? "latest" : version_text(v.version));
  };
  return o.two ? named(o.lib) + ", " + named(o.lib2) : named(o.lib);
}

std::string switch_auto_label(const Resolved& r, Switch s) {
  const std::string from = switch_versions(r, s);
  return from.empty() ? switch_value(r, s) : switch_value(r, s) + ": " + from;
}

std::vector<std::string> version_notes(const Config& c) {
  const Resolved r = resolve(c);
  std::vector<std::string> notes;
  for (size_t i = 0; i < kSwitchCount; ++i) {
    const Switch s = static_cast<Switch>(i);
    const Origin& o = r.origin[i];
    if (o.kind != Origin::Kind::Version || !switch_applies(c, r, s)) continue;
    notes.push_back(std::string(switch_field(s)) + ": " + switch_value(r, s) + ", from " + origin_versions(r, o) + ": " +
                    o.why);
  }
  // The attention mask, where some micro-batch gets one: every one, or one with padding in a run that can pad
  // (data_shape.h run_may_pad; a fixed shape counts as unpadded).
  if (r.mask.build != MaskBuild::None && (r.mask.unpadded || run_may_pad(c)))
    notes.push_back("attention mask: " + r.mask.note);
  if (!r.packed_note.empty() && tower_packs_attention(c.model)) notes.push_back(r.packed_note);
  if (!r.unsloth_note.empty()) notes.push_back("unsloth: " + r.unsloth_note);
  if (!r.preference.note.empty()) notes.push_back("training.objective " + c.training.objective + ": " + r.preference.note);
  if (!r.rollout.note.empty()) notes.push_back("training.objective " + c.training.objective + ": " + r.rollout.note);
  if (!r.sft_metrics.note.empty()) notes.push_back("versions.trl: " + r.sft_metrics.note);
  if (!r.model_load.note.empty()) notes.push_back("model load: " + r.model_load.note);
  if (r.moe_experts_parameters && c.peft.enabled())
    notes.push_back(describe_version(r.versions, Library::Transformers) +
                    ": the routed experts are 3-D parameters of one module (transformers#41580 from 5.0; gpt-oss, Llama 4, "
                    "DBRX and Granite-MoE before it), not nn.Linear: "
                    "peft.target_modules adapts the attention, shared experts and dense layers only (PEFT 0.19 maps "
                    "some families' names to target_parameters instead, which memsim does not model), and a "
                    "bitsandbytes base leaves the experts in the load dtype (replace_with_bnb_linear replaces "
                    "nn.Linear only; bitsandbytes#1849). The experts' grouped GEMMs of transformers 5 are not "
                    "modelled: their activations follow transformers 4's per-expert loop");
  if (!r.moe_experts_parameters && r.framework->transformers_model && c.model.num_experts > 0 &&
      c.model.architecture.empty() && c.peft.lora_like() &&
      (peft_targets(c.peft, "gate_proj") || peft_targets(c.peft, "up_proj") || peft_targets(c.peft, "down_proj")))
    notes.push_back("peft.target_modules reaches the routed experts: transformers 4's MoE blocks keep each expert's "
                    "projections as nn.Linear modules (Mixtral's w1, w3, w2, which memsim names gate_proj, up_proj, "
                    "down_proj; Qwen-MoE's and DeepSeek's gate_proj, up_proj, down_proj), so PEFT adds an adapter to "
                    "each of the " + std::to_string(c.model.num_experts) +
                    " experts of every MoE layer, with its gradient, optimizer states and saved activations");
  if (r.framework->unsloth_kernels && r.kbit_cast)
    notes.push_back("peft.prepare_kbit: true makes every weight that is not quantized fp32, as PEFT's "
                    "prepare_model_for_kbit_training does; Unsloth's loader keeps them 16-bit (its own "
                    "prepare_model_for_training upcasts only the adapters): set false for an Unsloth run");
  const OptimizerSpec* opt = find_optimizer(c.training.optimizer);
  if (r.foreach_keeps_denom && r.optimizer_impl == OptimizerImpl::Foreach && opt && opt->kind == OptimizerKind::Adam &&
      !opt->paged)
    notes.push_back("optimizer: torch.optim's foreach Adam/AdamW keeps two full-size intermediates at its peak, from " +
                    describe_version(r.versions, Library::Torch) +
                    ": denom = _foreach_add(exp_avg_sq_sqrt, eps) was out of place until pytorch#104898 (AdamW) and "
                    "#104780 (Adam), in 2.1");
  return notes;
}

LossImpl transformers_loss(const StackVersions& v) { return hf_loss_path(v); }

}  // namespace memsim
