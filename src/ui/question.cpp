#include "question.h"

#include <algorithm>
#include <vector>

#include "core/architecture.h"
#include "core/band.h"
#include "core/serialize.h"
#include "core/simulate.h"

namespace memsim::ui {

void note_hand_set(HandSet& hand, const Config& before, const Config& after) {
  for (const std::string& change : config_changes(before, after)) hand.insert(change.substr(0, change.find('=')));
  if (before.parallel.gpus != after.parallel.gpus) hand.insert("parallel.gpus");  // not a field of links or JSON
}

Method method_of(const PeftConfig& p) {
  if (p.method == "none") return p.base_quantization == "none" ? Method::Full : Method::Other;
  if (p.method == "lora" && p.base_quantization == "none") return Method::Lora;
  if (p.method == "lora" && p.base_quantization == "nf4" && p.double_quantization) return Method::Qlora;
  if (p.method == "dora" && p.base_quantization == "none") return Method::Dora;
  if (p.method == "ia3" && p.base_quantization == "none") return Method::Ia3;
  if (p.method == "ln_tuning" && p.base_quantization == "none") return Method::LnTuning;
  if (p.method == "prompt_tuning" && p.base_quantization == "none") return Method::PromptTuning;
  return Method::Other;
}

const char* method_label(Method m) {
  switch (m) {
    case Method::Full: return "Full fine-tuning";
    case Method::Lora: return "LoRA";
    case Method::Qlora: return "QLoRA (LoRA on a 4-bit base)";
    case Method::Dora: return "DoRA";
    case Method::Ia3: return "IA3";
    case Method::LnTuning: return "LayerNorm tuning";
    case Method::PromptTuning: return "Prompt tuning";
    case Method::Other: break;
  }
  return "Other (set under Details)";
}

void method_defaults(PeftConfig& p, const std::string& previous) {
  if (p.method == previous) return;
  if (p.method == "ia3") {
    p.target_modules = "k_proj,v_proj,down_proj";  // TRANSFORMERS_MODELS_TO_IA3_TARGET_MODULES_MAPPING["llama"]
    p.feedforward_modules = "down_proj";
  } else if (p.method == "ln_tuning") {
    p.target_modules = "input_layernorm,post_attention_layernorm,norm";  // ..._LNTUNING_TARGET_MODULES_MAPPING
  } else if ((p.method == "lora" || p.method == "dora") && previous != "lora" && previous != "dora") {
    p.target_modules = "q_proj,v_proj";  // TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING["llama"]
  }
}

void set_method(Config& c, Method m) {
  PeftConfig& p = c.peft;
  const std::string previous = p.method;
  switch (m) {
    case Method::Full: p.method = "none"; break;
    case Method::Lora: case Method::Qlora: p.method = "lora"; break;
    case Method::Dora: p.method = "dora"; break;
    case Method::Ia3: p.method = "ia3"; break;
    case Method::LnTuning: p.method = "ln_tuning"; break;
    case Method::PromptTuning: p.method = "prompt_tuning"; break;
    case Method::Other: return;
  }
  method_defaults(p, previous);
  // A model program names its family's LoRA targets (PEFT's mapping: ViT's query and value), not Llama's.
  if (const std::string targets = default_lora_targets(c.model); !targets.empty() && p.target_modules == "q_proj,v_proj")
    p.target_modules = targets;
  if (m == Method::Qlora) {
    // QLoRA (Dettmers et al. 2023, and its qlora.py): NF4 storage, double quantization, and adapters on every linear
    // layer, which the paper found necessary to match 16-bit fine-tuning.
    p.base_quantization = "nf4";
    p.double_quantization = true;
    p.target_modules = "all-linear";
  } else {
    p.base_quantization = "none";  // a quantized base is QLoRA's (or set under Details)
    if (previous == "lora" && p.method == "lora" && p.target_modules == "all-linear") p.target_modules = "q_proj,v_proj";
  }
}

void choose_framework(Config& c, const std::string& previous) {
  const bool now = c.training.framework == "unsloth", before = previous == "unsloth";
  if (now && !before) {
    c.parallel.zero_stage = 0;
    c.peft.prepare_kbit = "auto";  // Unsloth's loader calls no prepare_model_for_kbit_training (frameworks.cpp)
    // FastLanguageModel loads the model in bf16 (fp16 before Ampere) with no fp32 master copy, and its notebooks'
    // SFTTrainer runs with bf16=True, the Trainer's autocast over those 16-bit weights; a 4-bit base is NF4 with
    // double quantization (BitsAndBytesConfig bnb_4bit_use_double_quant=True).
    if (c.training.precision == "bf16_mixed" || c.training.precision == "amp_bf16" || c.training.precision == "bf16_pure")
      c.training.precision = "bf16_autocast";
    if (c.peft.base_quantization == "nf4") c.peft.double_quantization = true;
    c.training.activation_checkpointing = "full";
    c.training.activation_offload = true;
  } else if (before && !now) {
    c.training.activation_offload = false;
  }
}

void choose_objective(Config& c) {
  auto& t = c.training;
  // TRL's trainers run on the HF Trainer (its DeepSpeed or FSDP layout kept); torchtune has DPO recipes of its own.
  const bool torchtune_ok = t.preference() && t.goal() != Objective::Kto;
  if ((t.preference() || t.rollout()) && t.framework != "hf_trainer" && !(torchtune_ok && t.framework == "torchtune"))
    t.framework = "hf_trainer";
  if (t.ppo()) t.reward_model = "same_as_policy";
  else if (!t.rollout()) t.reward_model = "none";
  if (!t.ppo()) t.value_model = "full", t.use_cache = true;
}

int64_t default_micro_batch() { return Config{}.training.micro_batch_size; }

int64_t default_sequence_length(const ModelConfig& m) {
  const int64_t d = Config{}.training.sequence_length;
  return m.max_position_embeddings > 0 ? std::min(d, m.max_position_embeddings) : d;
}

void choose_model(Config& c, const ModelConfig& model, const HandSet& hand) {
  c.model = model;
  if (!hand.count("training.sequence_length") && c.model.max_position_embeddings > 0)
    c.training.sequence_length = std::min(c.training.sequence_length, c.model.max_position_embeddings);
  // A model program's tokens are its own arguments (Mamba-2's sequence_length, which refuses the field): a length
  // the page chose for the last model goes back to the default; one set by hand stays, and validation says why not.
  if (!hand.count("training.sequence_length") && !c.model.architecture.empty())
    c.training.sequence_length = Config{}.training.sequence_length;
  fit_shape(c, hand);
}

namespace {

bool fits(const Config& c) {
  const Result r = simulate(c);
  if (!r.ok || r.devices.empty()) return false;
  // A vLLM server's GPUs (fixed_share) and a vLLM engine's refusal to start do not depend on the shape: the shape is
  // judged by what the training GPUs' memory makes of it (device_verdict, from the band).
  for (const auto& d : r.devices)
    if (!d.fixed_share && (d.refusal.empty() ? d.verdict : device_verdict(d)) != Verdict::Fits) return false;
  return true;
}

}  // namespace

bool fit_shape(Config& c, const HandSet& hand) {
  if (c.data.varies()) return false;
  // A model program's rows per sample are its own (the sequence length does not apply): only the batch is searched.
  const bool own_mb = hand.count("training.micro_batch_size") > 0,
             own_seq = hand.count("training.sequence_length") > 0 || !c.model.architecture.empty();
  if (own_mb && own_seq) return false;
  std::vector<int64_t> seqs, mbs;
  if (own_seq) seqs = {c.training.sequence_length};
  else
    for (int64_t s = default_sequence_length(c.model); s >= 1; s /= 2) {
      seqs.push_back(s);
      if (s <= 512) break;
    }
  if (own_mb) mbs = {c.training.micro_batch_size};
  else
    for (int64_t b = default_micro_batch(); b >= 1; b /= 2) mbs.push_back(b);
  const Config before = c;
  auto with = [&](int64_t mb, int64_t seq) {
    Config t = c;
    t.training.micro_batch_size = mb;
    t.training.sequence_length = seq;
    return t;
  };
  // Memory grows with both, so when the smallest shape does not fit, none does: one simulation decides it.
  Config chosen = with(mbs.front(), seqs.front());
  if (fits(with(mbs.back(), seqs.back()))) {
    bool found = false;
    for (int64_t s : seqs) {
      for (int64_t b : mbs)
        if (fits(with(b, s))) {
          chosen = with(b, s);
          found = true;
          break;
        }
      if (found) break;
    }
  }
  c = chosen;
  return !(c == before);
}

}  // namespace memsim::ui
