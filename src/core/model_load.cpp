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
//   A quantizer sets a device map, so every bitsandbytes load has one; FSDP/ZeRO-3 QLoRA loads through the CPU.
//   bitsandbytes Params4bit._quantize: w = self.data.contiguous().to(device), then quantize_4bit(w) (the packed
//     weight and its statistics), w freed; Int8Params._quantize the same with a 16-bit B and its int8 CB.
//   peft prepare_model_for_kbit_training: for each parameter in order, `param.data = param.data.to(torch.float32)`
//     where it is fp16/bf16 and not quantized (a new fp32 tensor, then the 16-bit one freed).
//   TRL f100ca34c (2023-12-19, first in 0.7.5) peft_module_casting_to_bf16 after get_peft_model, when args.bf16 and
//     the model is 4-bit and not sharded: embed_tokens / lm_head / wte / wpe weights that are fp32 to bf16, norms to
//     fp32 (trl/models/utils.py at v0.24.0); 2af35fb0d (2025-12-04, #4577, in 0.26.0) drops prepare_peft_model from
//     SFTTrainer: no prepare_model_for_kbit_training, and the trainable parameters of a quantized model to bf16.
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
}  // namespace

ModelLoad resolve_model_load(const Config& c, const StackVersions& v, bool transformers_loader, bool prequantized,
                             bool weights_sharded, bool bf16_autocast) {
  ModelLoad m;
  if (!transformers_loader || !bitsandbytes(c.peft) || weights_sharded) return m;
  m.ordered = true;
  m.quantize_on_gpu = !prequantized;
  const Library tf = Library::Transformers;
  std::string warm;
  if (v.below(tf, V(4, 51))) {
    warm = "no caching_allocator_warmup for a quantized load before 4.51 (transformers#36428)";
  } else if (v.below(tf, V(5, 0))) {
    m.warmup = LoadWarmup::HalfOf16Bit;
    m.warmup_cap_095 = v.below(tf, V(4, 52));
    warm = std::string("caching_allocator_warmup reserves half the model's 16-bit size before the weights arrive, "
                       "capped at ") + (m.warmup_cap_095 ? "0.95 of" : "1.2 GiB under") +
           " the free memory and freed at once, so the block stays cached (modeling_utils.py, transformers#36380, "
           "factor 4 for a quantizer)";
  } else {
    m.warmup = LoadWarmup::QuantizedSize;
    warm = "caching_allocator_warmup reserves the model's quantized size before the weights arrive, capped at 1.2 GiB "
           "under the free memory (transformers#42818, #42996)";
  }
  m.note = describe_version(v, tf) + ": " + warm + "; " +
           (m.quantize_on_gpu ? "each linear arrives in 16 bits and is quantized on the GPU, "
                              : "the linears arrive quantized (a pre-quantized checkpoint), ") +
           "the other weights in 16 bits" + (c.peft.kbit_cast() ? ", cast to fp32 one by one by prepare_model_for_kbit_training" : "");
  // TRL's SFTTrainer: only a stated version says the Trainer is TRL's (a date alone dates a plain Trainer too).
  const LibraryVersion& trl = v[Library::Trl];
  if (c.training.goal() != Objective::Sft || trl.latest || trl.from_date || prequantized) return m;
  const std::string at = "; TRL " + version_text(trl.version) + "'s SFTTrainer ";
  if (v.at_least(Library::Trl, V(0, 26))) {
    m.trl_no_kbit_prep = true;
    m.note += at + "calls no prepare_model_for_kbit_training (trl#4577, 0.26)" +
              (c.peft.prepare_kbit ? ": peft.prepare_kbit true says the script calls it itself" : "") +
              ", and casts the adapters to bf16";
  } else if (v.at_least(Library::Trl, V(0, 7, 5)) && bf16_autocast && c.peft.four_bit() && c.peft.kbit_cast()) {
    m.trl_embed_head_bf16 = true;
    m.note += at + "casts the fp32 embedding and lm_head back to bf16 after prepare_model_for_kbit_training "
                   "(peft_module_casting_to_bf16, bf16 on a 4-bit model; trl/models/utils.py at v0.24.0)";
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
  const bool kbit = cfg_.peft.kbit_cast();
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
  const int64_t warmup = load_warmup_bytes(ml, bytes_16bit, bytes_quantized, free_at_load_bytes_);
  if (warmup > 0) {
    const uint32_t w = p.alloc(Component::Temporaries, warmup, p.label("caching_allocator_warmup (freed at once; its block stays cached)"));
    p.free(w);
  }
  const uint32_t sixteen = p.label("a linear's 16-bit weight before bitsandbytes quantizes it");
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
    const uint32_t fp32 = ml.trl_embed_head_bf16 ? p.label("an fp32 copy by prepare_model_for_kbit_training (TRL casts it back to bf16)") : labels_.weights;
    for (const auto& [id, t] : to_cast) {
      const bool back = ml.trl_embed_head_bf16 && states_of(*t).weights < mul(t->numel, 4);
      const uint32_t f = p.alloc(Component::Weights, mul(t->numel, 4), back ? fp32 : labels_.weights);
      p.free(id);
      if (back) to_bf16.push_back({f, t});
    }
  }
  // get_peft_model: the adapters, created in fp32 where peft autocasts them; TRL 0.26 then casts them to bf16.
  const bool adapters_cast = ml.trl_no_kbit_prep && adapter_bytes_ == 2;
  const uint32_t made_fp32 = adapters_cast ? p.label("an adapter's fp32 copy (get_peft_model; TRL casts it to bf16)") : labels_.weights;
  for_each_param(ctx_, [&](const ParamTensor& t) {
    if (t.kind != ParamKind::Adapter) return;
    const uint32_t made = adapters_cast ? p.alloc(Component::Weights, mul(t.numel, 4), made_fp32) : UINT32_MAX;
    p.alloc(Component::Weights, states_of(t).weights, labels_.weights);
    if (made != UINT32_MAX) p.free(made);
  });
  if (to_bf16.empty()) return;
  p.phase("TRL peft_module_casting_to_bf16");
  for (const auto& [id, t] : to_bf16) {
    p.alloc(Component::Weights, states_of(*t).weights, labels_.weights);
    p.free(id);
  }
}

}  // namespace memsim
