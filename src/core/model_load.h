// How transformers' from_pretrained brings a bitsandbytes-quantized base onto the GPU, and what the trainer does to its
// dtypes before the first step (the HF Trainer, TRL, axolotl, Unsloth). memsim otherwise allocates each parameter once,
// in its final dtype; this load leaves blocks in PyTorch's cache that the training steps then reuse or step around:
//   1. caching_allocator_warmup (transformers 4.51 on for a quantized load) reserves one block before any weight
//      arrives and frees it at once, so the weights are carved out of it and the rest stays cached;
//   2. each quantized linear arrives in 16 bits and bitsandbytes quantizes it on the GPU (Params4bit._quantize,
//      Int8Params._quantize), the 16-bit copy freed after;
//   3. the other parameters arrive in the load dtype (16 bits), and prepare_model_for_kbit_training casts them to fp32
//      one by one afterwards (a new fp32 tensor, then the 16-bit one freed);
//   4. TRL's SFTTrainer or DPOTrainer then changes dtypes again, by its version (TrlPrep, below).
// Steps 1-3 follow the loader, for an unsharded base; TRL's rules apply whatever the sharding.
// This file resolves, by the versions, which of these happen; StepBuilder::alloc_loaded_weights (model_load.cpp)
// replays them. The sources and the version boundaries are in docs/versions.md section 16.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "config.h"
#include "versions.h"

namespace memsim {

// caching_allocator_warmup's request (transformers modeling_utils.py), by release.
enum class LoadWarmup {
  None,          // before 4.51 (4.50 warmed only unquantized loads), or no load on the GPU with a device map
  HalfOf16Bit,   // 4.51-4.57: byte_count = the empty model's 16-bit bytes, capped; torch.empty(byte_count // 4, fp16)
  QuantizedSize, // 5.0 on: byte_count = the quantized bytes (param_element_size 0.5 for 4-bit), capped; all of it
};

// The parameters TRL's peft_module_casting_to_bf16 matches by module name (model_load.cpp trl_bf16_targets).
struct TrlBf16Targets {
  bool token_embedding = false, position_embedding = false, head = false;
  bool any() const { return token_embedding || position_embedding || head; }
};

struct ModelLoad {
  bool ordered = false;          // the load is replayed in transformers' order (steps 1-3 above)
  bool quantize_on_gpu = false;  // 16-bit linears quantized on the GPU (not a pre-quantized checkpoint, as Unsloth's)
  LoadWarmup warmup = LoadWarmup::None;
  bool warmup_cap_095 = false;   // 4.51: capped at 0.95 of the free memory; later releases at the free memory - 1.2 GiB
  bool warmup_counts_tied_twice = false;  // before 4.54 the byte count took a tied head's key as a tensor of its own
  // TRL's SFTTrainer or DPOTrainer (TrlPrep) on a bitsandbytes base, from cast_from to new_prep_from, with bf16 and a
  // 4-bit base that prepare_model_for_kbit_training made fp32: peft_module_casting_to_bf16 casts the embedding and
  // lm_head back to bf16 (the norms stay fp32), and before 0.9.3 the adapters too.
  TrlBf16Targets trl_bf16;
  bool trl_adapters_bf16 = false;
  // From new_prep_from (SFT 0.26, DPO 0.29): prepare_model_for_kbit_training is no longer called and the adapters go
  // to bf16 (both derived through peft.prepare_kbit and peft.adapter_dtype, frameworks.cpp).
  bool trl_no_kbit_prep = false;
  std::string note;  // the rules above with their sources, for the result's notes
};

// What resolve_model_load needs of the resolved config.
struct LoadFacts {
  bool transformers_loader = false;  // from_pretrained with a BitsAndBytesConfig (the HF Trainer, Unsloth)
  bool prequantized = false;         // the checkpoints are already 4-bit (Unsloth's)
  bool weights_sharded = false;      // FSDP or ZeRO-3 shard the weights (memsim leaves that load unmodelled)
  bool hf_trainer = false;           // the HF Trainer, which a stated versions.trl makes TRL's (SFT, DPO)
  bool bf16_autocast = false;        // the Trainer's bf16 flag (the recipe's 16-bit dtype is bf16)
  bool kbit_cast = false;            // prepare_model_for_kbit_training runs (Resolved::kbit_cast)
  bool fp32_weights = false;         // the recipe stores the weights it does not quantize in fp32 (amp_*)
};

// A stated versions.trl (not a date) with objective sft or dpo under the HF Trainer: the Trainer is TRL's SFTTrainer
// or DPOTrainer, whose model preparation changed at these releases.
struct TrlPrep {
  bool active = false;
  Version cast_from;      // peft_module_casting_to_bf16 after get_peft_model, from this release
  Version new_prep_from;  // no prepare_model_for_kbit_training, the trainable parameters to bf16, from this release
  const char* trainer = "";
  const char* source = "";
  const char* no_kbit_why = "";  // the origins of peft.prepare_kbit and peft.adapter_dtype from new_prep_from on
  const char* bf16_why = "";
};
TrlPrep trl_prep(const Config& c, const StackVersions& v, bool hf_trainer);

// Requires a validated config.
ModelLoad resolve_model_load(const Config& c, const StackVersions& v, const LoadFacts& f);

// The bytes caching_allocator_warmup requests: `bytes_16bit` is the empty model's byte count (every parameter in the
// load dtype, a quantized linear at its full shape; tied weights once), `bytes_quantized` the same with quantized
// linears at their packed size, `free_bytes` what cudaMemGetInfo reports before the load.
int64_t load_warmup_bytes(const ModelLoad& m, int64_t bytes_16bit, int64_t bytes_quantized, int64_t free_bytes);

}  // namespace memsim
