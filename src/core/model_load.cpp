// transformers' load of a bitsandbytes-quantized base and what the trainer does to its dtypes (model_load.h), read from
// the transformers main-branch history (modeling_utils.py caching_allocator_warmup and _load_pretrained_model;
// quantizers/quantizer_bnb_4bit.py create_quantized_param), bitsandbytes nn/modules.py at 0.48.1, peft utils/other.py
// prepare_model_for_kbit_training and TRL's trainer at its tags (docs/versions.md section 16):
//   transformers 4b5cf5496d (2025-02-25, #36380): warmup for device-map loads; 8ede897c30 (#36428) only without a
//     quantizer, so 4.50 warms no quantized load;
//   eca74d1367 (2025-03-28, in 4.51.0): every device-map load, factor 2 unquantized and 4 quantized, capped at 0.95 of
//     the free memory: torch.empty(min(byte_count, cap) // 4, dtype=float16), half the empty model's 16-bit bytes;
//   7dafcd0077 (2025-04-16, #37550, in 4.52): capped at the free memory less 1.2 GiB;
//   dd8057afa6 (2025-12-18, #42818) and f5d9d808b2 (2025-12-22, #42996), in 5.0: the byte count is the quantized
//     size (param_element_size 0.5 for a 4-bit linear) and the whole of it is requested (byte_count // 2 fp16).
//   06c4a4d499 (2025-07-01, #39070, in 4.54): tied weights counted once; before, a tied head's key counted again.
//   A quantizer sets a device map ({"": current_device}), so every bitsandbytes load has one, FSDP/ZeRO-3 QLoRA too
//   (whose weights then move to the CPU to be sharded: that load is left unmodelled).
//   bitsandbytes Params4bit._quantize: w = self.data.contiguous().to(device), then quantize_4bit(w) (the packed
//     weight and its statistics), w freed; Int8Params._quantize the same with a 16-bit B and its int8 CB.
//   peft prepare_model_for_kbit_training: for each parameter in order, `param.data = param.data.to(torch.float32)`
//     where it is fp16/bf16 and not quantized (a new fp32 tensor, then the 16-bit one freed).
//   TRL f100ca34c (2023-12-19, first in 0.7.5) peft_module_casting_to_bf16 after get_peft_model, when args.bf16 and
//     the model is 4-bit and not sharded: embed_tokens / lm_head / wte / wpe weights that are fp32 to bf16, norms to
//     fp32 (trl/models/utils.py at v0.24.0), and until 99f2c94b2 (first in 0.9.3) every BaseTunerLayer too;
//     2af35fb0d (2025-12-04, #4577, in 0.26.0) drops prepare_peft_model from SFTTrainer: no
//     prepare_model_for_kbit_training, and the trainable parameters of a quantized model to bf16.
#include "model_load.h"

#include <algorithm>

#include "checked.h"
#include "step_builder.h"

namespace memsim {

namespace {
constexpr Version V(int major, int minor, int patch = 0) { return {major, minor, patch}; }
constexpr int64_t kWarmupMarginBytes = 1288490188;  // int(1.2 * 1024**3)
bool bitsandbytes(const PeftConfig& p) {
  const BaseQuantization q = p.quantization();
  return p.enabled() && (q == BaseQuantization::Nf4 || q == BaseQuantization::Fp4 || q == BaseQuantization::Int8);
}

// Which of memsim's tensors TRL's cast matches: modules whose transformers name contains embed_tokens, wte, wpe or
// lm_head. GPT-2-style models name the token and position tables wte and wpe; GPT-NeoX calls them embed_in and
// embed_out, Falcon and Bloom word_embeddings, Mamba embeddings, OPT its positions embed_positions; the rest of the
// decoders memsim knows use embed_tokens and lm_head.
void trl_bf16_targets(std::string_view model_type, TrlBf16Targets& t) {
  const bool gpt2 = model_type == "gpt2" || model_type == "gpt_bigcode" || model_type == "gptj" || model_type == "codegen";
  const bool own_names = model_type == "gpt_neox" || model_type == "falcon" || model_type == "bloom" ||
                         model_type == "mamba" || model_type == "mamba2";
  t.token_embedding = gpt2 || !own_names;
  t.position_embedding = gpt2;
  t.head = model_type != "gpt_neox";
}
std::string describe_targets(const TrlBf16Targets& t) {
  std::string out = t.token_embedding ? "embedding" : "";
  if (t.position_embedding) out += out.empty() ? "position table" : ", position table";
  if (t.head) out += out.empty() ? "lm_head" : " and lm_head";
  return out.empty() ? "nothing" : out;
}
}  // namespace

TrlPrep trl_prep(const Config& c, const StackVersions& v, bool hf_trainer) {
  const LibraryVersion& trl = v[Library::Trl];
  if (!hf_trainer || trl.latest || trl.from_date) return {};
  // SFTTrainer: f100ca34c (first in 0.7.5), 2af35fb0d (#4577, first in 0.26.0). DPOTrainer: 95ec8577d (2023-12-26,
  // first in 0.7.8), e3b7897c8 ("Refactor DPO", #3906, first in 0.29.0).
  if (c.training.goal() == Objective::Sft)
    return {true, V(0, 7, 5), V(0, 26), "SFTTrainer", "trl#4577, 0.26",
            "TRL's SFTTrainer no longer calls prepare_model_for_kbit_training from 0.26 (trl#4577)",
            "TRL's SFTTrainer casts a quantized model's trainable parameters to bf16 from 0.26 (trl#4577)"};
  if (c.training.goal() == Objective::Dpo)
    return {true, V(0, 7, 8), V(0, 29), "DPOTrainer", "trl#3906, 0.29",
            "TRL's DPOTrainer no longer calls prepare_model_for_kbit_training from 0.29 (trl#3906)",
            "TRL's DPOTrainer casts a quantized model's trainable parameters to bf16 from 0.29 (trl#3906)"};
  return {};
}

ModelLoad resolve_model_load(const Config& c, const StackVersions& v, const LoadFacts& f) {
  ModelLoad m;
  // TRL's SFTTrainer or DPOTrainer, whatever the sharding: from its new preparation (SFT 0.26, DPO 0.29) the
  // trainable parameters of a quantized model go to bf16.
  const TrlPrep prep = trl_prep(c, v, f.hf_trainer);
  const bool trl = prep.active && bitsandbytes(c.peft);  // is_loaded_in_4bit / is_loaded_in_8bit
  const std::string at = trl ? "TRL " + version_text(v[Library::Trl].version) + "'s " + prep.trainer + " " : "";
  if (trl && v.at_least(Library::Trl, prep.new_prep_from)) {
    m.trl_no_kbit_prep = true;
    m.note = at + "calls no prepare_model_for_kbit_training and casts the adapters to bf16 (" + prep.source + ")" +
             (f.kbit_cast ? "; peft.prepare_kbit true says the script calls it itself" : "") +
             (!f.kbit_cast && f.fp32_weights
                  ? "; the weights it does not quantize stay in the dtype they were loaded in, fp32 under this "
                    "training.precision: bf16_autocast is a 16-bit load under the Trainer's bf16=True"
                  : "");
  }
  if (!f.transformers_loader || !bitsandbytes(c.peft) || f.weights_sharded) return m;
  m.ordered = true;
  m.quantize_on_gpu = !f.prequantized;
  const Library tf = Library::Transformers;
  std::string warm;
  if (v.below(tf, V(4, 51))) {
    warm = "no caching_allocator_warmup for a quantized load before 4.51 (transformers#36428)";
  } else if (v.below(tf, V(5, 0))) {
    m.warmup = LoadWarmup::HalfOf16Bit;
    m.warmup_cap_095 = v.below(tf, V(4, 52));
    // The tied head's key counts again until transformers#39070 (2025-07-01, 4.54) skipped tied weights.
    m.warmup_counts_tied_twice = v.below(tf, V(4, 54)) && c.model.tie_word_embeddings;
    warm = std::string("caching_allocator_warmup reserves half the model's 16-bit size before the weights arrive, "
                       "capped at ") + (m.warmup_cap_095 ? "0.95 of" : "1.2 GiB under") +
           " the free memory and freed at once, so the block stays cached (modeling_utils.py, transformers#36380, "
           "factor 4 for a quantizer)";
  } else {
    m.warmup = LoadWarmup::QuantizedSize;
    warm = "caching_allocator_warmup reserves the model's quantized size before the weights arrive, capped at 1.2 GiB "
           "under the free memory (transformers#42818, #42996)";
  }
  const std::string load = describe_version(v, tf) + ": " + warm + "; " +
                           (m.quantize_on_gpu ? "each linear arrives in 16 bits and is quantized on the GPU, "
                                              : "the linears arrive quantized (a pre-quantized checkpoint), ") +
                           (f.kbit_cast || !f.fp32_weights ? "the other weights in 16 bits" : "the other weights in fp32") +
                           (f.kbit_cast ? ", cast to fp32 one by one by prepare_model_for_kbit_training" : "");
  m.note = m.note.empty() ? load : load + "; " + m.note;
  // 0.7.5-0.25, bf16 on an unsharded 4-bit model: peft_module_casting_to_bf16 after get_peft_model. It changes only
  // weights that are fp32, which TRL's own prepare_model_for_kbit_training has just made them.
  if (trl && v.below(Library::Trl, prep.new_prep_from) && v.at_least(Library::Trl, prep.cast_from) && f.bf16_autocast &&
      c.peft.four_bit() && f.kbit_cast) {
    trl_bf16_targets(c.model.model_type, m.trl_bf16);
    m.trl_adapters_bf16 = v.below(Library::Trl, V(0, 9, 3));
    m.note += "; " + at + "casts the fp32 " + describe_targets(m.trl_bf16) + " back to bf16 after "
              "prepare_model_for_kbit_training (peft_module_casting_to_bf16, bf16 on a 4-bit model; trl/models/utils.py "
              "at v0.24.0)" + (m.trl_adapters_bf16 ? ", and the adapters too (until trl 0.9.3)" : "");
  }
  return m;
}

int64_t load_warmup_bytes(const ModelLoad& m, int64_t bytes_16bit, int64_t bytes_quantized, int64_t free_bytes) {
  const int64_t cap = m.warmup_cap_095 ? static_cast<int64_t>(0.95 * static_cast<double>(free_bytes))
                                       : std::max<int64_t>(0, free_bytes - kWarmupMarginBytes);
  switch (m.warmup) {
    case LoadWarmup::None: return 0;
    // torch.empty(byte_count // 4, dtype=torch.float16): two bytes per element.
    case LoadWarmup::HalfOf16Bit: return mul(std::min(bytes_16bit, cap) / 4, 2);
    case LoadWarmup::QuantizedSize: return mul(std::min(bytes_quantized, cap) / 2, 2);
  }
  return 0;
}

// The model load of model_load.h, in transformers' order, for an unsharded base on this GPU. The adapters come last
// (get_peft_model runs after the load and prepare_model_for_kbit_training).
void StepBuilder::alloc_loaded_weights() {
  const ModelLoad& ml = resolved_.model_load;
  auto& p = program_;
  const bool kbit = resolved_.kbit_cast;
  const bool int8 = cfg_.peft.quantization() == BaseQuantization::Int8;
  // The load dtype: 16 bits where prepare_model_for_kbit_training casts to fp32 afterwards (bitsandbytes' loads
  // default to fp16), else the weights' own dtype.
  const auto load_bytes = [&](const ParamTensor& t) { return kbit ? mul(t.numel, 2) : states_of(t).weights; };
  int64_t bytes_16bit = 0, bytes_quantized = 0;
  for_each_param(ctx_, [&](const ParamTensor& t) {
    if (t.kind == ParamKind::Adapter) return;
    const int64_t full = t.quantized ? mul(t.numel, 2) : load_bytes(t);
    bytes_16bit = add(bytes_16bit, full);
    bytes_quantized = add(bytes_quantized, t.quantized ? (int8 ? t.numel : ceil_div(t.numel, 2)) : full);
  });
  if (ml.warmup_counts_tied_twice && ctx_.has_pre && !shape_.pre.empty()) bytes_16bit = add(bytes_16bit, load_bytes(shape_.pre.front()));
  const int64_t warmup = load_warmup_bytes(ml, bytes_16bit, bytes_quantized, free_at_load_bytes_);
  if (warmup > 0) {
    const uint32_t w = p.alloc(Component::Temporaries, warmup, p.label("caching_allocator_warmup (freed at once; its block stays cached)"));
    p.free(w);
  }
  const uint32_t sixteen = ml.quantize_on_gpu ? p.label("a linear's 16-bit weight before bitsandbytes quantizes it") : 0;
  std::vector<std::pair<uint32_t, const ParamTensor*>> to_cast;
  for_each_param(ctx_, [&](const ParamTensor& t) {
    if (t.kind == ParamKind::Adapter) return;
    if (t.quantized) {
      const uint32_t w16 = ml.quantize_on_gpu ? p.alloc(Component::Temporaries, mul(t.numel, 2), sixteen) : UINT32_MAX;
      p.alloc(Component::Weights, states_of(t).weights, labels_.weights);
      if (w16 != UINT32_MAX) p.free(w16);
    } else if (kbit) {
      to_cast.push_back({p.alloc(Component::Weights, load_bytes(t), labels_.weights), &t});
    } else {
      p.alloc(Component::Weights, states_of(t).weights, labels_.weights);
    }
  });
  std::vector<std::pair<uint32_t, const ParamTensor*>> to_bf16;
  if (!to_cast.empty()) {
    p.phase("prepare_model_for_kbit_training");
    // With TRL's cast back to bf16 the embedding and head end 16-bit (states_of), after a round through fp32.
    const uint32_t fp32 = ml.trl_bf16.any() ? p.label("an fp32 copy by prepare_model_for_kbit_training (TRL casts it back to bf16)") : labels_.weights;
    for (const auto& [id, t] : to_cast) {
      const bool back = ml.trl_bf16.any() && states_of(*t).weights < mul(t->numel, 4);
      const uint32_t f = p.alloc(Component::Weights, mul(t->numel, 4), back ? fp32 : labels_.weights);
      p.free(id);
      if (back) to_bf16.push_back({f, t});
    }
  }
  // get_peft_model: every adapter, in fp32 where peft autocasts them; TRL then casts them to bf16 (from 0.26, or with the
  // embedding and head before 0.9.3), one at a time.
  const bool adapters_cast = (ml.trl_no_kbit_prep || ml.trl_adapters_bf16) && adapter_bytes_ == 2;
  const uint32_t made_fp32 = adapters_cast ? p.label("an adapter's fp32 copy (get_peft_model; TRL casts it to bf16)") : labels_.weights;
  std::vector<std::pair<uint32_t, const ParamTensor*>> adapters;
  for_each_param(ctx_, [&](const ParamTensor& t) {
    if (t.kind != ParamKind::Adapter) return;
    adapters.push_back({p.alloc(Component::Weights, adapters_cast ? mul(t.numel, 4) : states_of(t).weights, made_fp32), &t});
  });
  if (!adapters_cast && to_bf16.empty()) return;
  p.phase(ml.trl_no_kbit_prep ? "TRL casts the trainable parameters to bf16" : "TRL peft_module_casting_to_bf16");
  if (adapters_cast)
    for (const auto& [id, t] : adapters) to_bf16.push_back({id, t});
  for (const auto& [id, t] : to_bf16) {
    p.alloc(Component::Weights, states_of(*t).weights, labels_.weights);
    p.free(id);
  }
}

}  // namespace memsim
