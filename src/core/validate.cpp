#include "validate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "architecture.h"
#include "data_shape.h"
#include "frameworks.h"
#include "gpu_count.h"
#include "model.h"
#include "rollout.h"
#include "tables.h"
#include "versions.h"

namespace memsim {

namespace {

// The errors of a value outside its registered range or list, worded the same for every field.
void out_of_range(std::vector<FieldError>& errs, const FieldSpec& f, int64_t v) {
  const std::string field(f.key);
  errs.push_back({field, field + " must be an integer from " + std::to_string(f.range.min) + " to " +
                             std::to_string(f.range.max) + "; got " + std::to_string(v)});
}
void not_a_choice(std::vector<FieldError>& errs, const FieldSpec& f, const std::string& value) {
  const std::string field(f.key);
  std::string allowed;
  for (std::string_view a : f.choices) allowed += (allowed.empty() ? "" : ", ") + std::string(a);
  errs.push_back({field, field + " must be one of: " + allowed + "; got \"" + value.substr(0, 40) + "\""});
}

template <typename Span>
std::string ids_of(Span table) {
  std::string s;
  for (const auto& e : table) s += (s.empty() ? "" : ", ") + std::string(e.id);
  return s;
}

std::string joined(const std::vector<std::string>& names) {
  std::string list;
  for (const auto& k : names) list += (list.empty() ? "" : ", ") + k;
  return list;
}

void validate_peft(const Config& c, std::vector<FieldError>& e) {
  const auto& p = c.peft;
  if (!p.enabled()) {
    if (p.base_quantization != "none")
      e.push_back({"peft.base_quantization", "peft.base_quantization needs a PEFT method (peft.method lora or dora): "
                                             "quantized weights cannot be trained, so full fine-tuning would have no "
                                             "trainable parameters"});
    return;
  }
  const auto& m = c.model;
  if (p.lora_like() && m.architecture.empty()) {
    // The smallest linear the adapters can sit on bounds the rank (a rank above it adds parameters, not capacity).
    const int64_t d = effective_head_dim(m);
    const int64_t smallest = std::min({m.hidden_size, m.num_key_value_heads * d, m.intermediate_size});
    if (p.lora_rank > smallest && smallest > 0)
      e.push_back({"peft.lora_rank", "peft.lora_rank must be at most the smallest adapted dimension (" +
                                         std::to_string(smallest) + "); got " + std::to_string(p.lora_rank)});
  }
  // Linear targets (LoRA, DoRA, IA3): every named module must exist in this architecture.
  if ((p.lora_like() || p.method == "ia3") && p.target_modules != "all-linear") {
    std::vector<std::string> known = {"q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj", "lm_head"};
    if (m.mlp_gated) known.push_back("gate_proj");
    if (m.kv_lora_rank > 0) known = {"q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj",
                                     "gate_proj", "up_proj", "down_proj", "lm_head"};
    // The router where it is an nn.Linear (all-linear adapts it too): transformers 4's, but for DeepSeek's MoEGate.
    if (m.num_experts > 0 && m.kv_lora_rank == 0 && m.architecture.empty() && !resolve(c).moe_experts_parameters)
      known.push_back("gate");
    // T5Attention q, k, v, o (self- and cross-attention alike) and T5DenseActDense wi/wo or T5DenseGatedActDense
    // wi_0/wi_1/wo; PEFT's default for T5 is q and v (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING).
    if (m.is_encoder_decoder) {
      known = {"q", "k", "v", "o", "wo", "lm_head"};
      if (m.mlp_gated) known.insert(known.end(), {"wi_0", "wi_1"});
      else known.push_back("wi");
    }
    // A model program: the modules of its linears and convolutions, by PEFT's short name.
    bool fused_mixer = false;
    if (!m.architecture.empty()) {
      std::shared_ptr<const Architecture> program;
      if (!decode_architecture(m.architecture, m.architecture_args, program).empty()) return;  // reported on its own
      known.clear();
      for (const ArchStage* st : program->stages())
        for (const auto& op : st->ops) {
          if ((op.kind == OpKind::Linear || op.kind == OpKind::Conv1d || op.kind == OpKind::Conv2d) &&
              std::find(known.begin(), known.end(), op.module) == known.end())
            known.push_back(op.module);
          fused_mixer |= op.kind == OpKind::SsdMixer;
        }
    }
    // Mamba-2's out_proj and conv1d are modules the fused kernel never calls: an adapter on them would never run,
    // and PEFT refuses them for mamba2 from 0.16 (peft#2562).
    for (const auto& item : list_items(p.target_modules))
      if (fused_mixer && (item == "out_proj" || item == "conv1d") && std::find(known.begin(), known.end(), item) == known.end()) {
        e.push_back({"peft.target_modules", "peft.target_modules names \"" + item + "\", which Mamba-2's fused kernel "
                                            "(mamba_split_conv1d_scan_combined) reads without calling it: an adapter there never runs, and PEFT "
                                            "refuses it from 0.16; target in_proj"});
        return;
      }
    // A fused q/k/v linear is targeted whole, under its family's name (model.cpp targets_fused_qkv).
    if (m.fused_qkv && p.lora_like()) known.insert(known.end(), {"qkv_proj", "c_attn", "query_key_value", "Wqkv"});
    if (p.method == "ia3") known.erase(std::remove(known.begin(), known.end(), "lm_head"), known.end());
    const auto items = list_items(p.target_modules);
    for (const auto& item : items)
      if (std::find(known.begin(), known.end(), item) == known.end())
        e.push_back({"peft.target_modules", "peft.target_modules names \"" + item.substr(0, 40) +
                                                "\", which this architecture lacks" +
                                                (p.method == "ia3" ? " (IA3 is modelled on the layers' linears)" : "") +
                                                "; it has: " + joined(known) + " (or all-linear)" +
                                                (!m.fused_qkv && (item == "c_attn" || item == "query_key_value" ||
                                                                  item == "qkv_proj" || item == "Wqkv")
                                                     ? "; set model.fused_qkv true if one linear computes q, k and v "
                                                       "(GPT-2, Falcon, GPT-NeoX, Bloom)"
                                                     : m.num_experts > 0 && (item == "w1" || item == "w2" || item == "w3")
                                                     ? "; memsim names Mixtral's expert linears w1, w3 and w2 gate_proj, "
                                                       "up_proj and down_proj"
                                                     : "")});
    if (items.empty()) e.push_back({"peft.target_modules", "peft.target_modules must name at least one module, or be all-linear"});
  }
  // GPTQ and AWQ bases (int4_forward in activations.cpp) as transformers loads them under PEFT's LoRA: dense
  // pre-norm decoder layers with separate linears, on one device or data parallel.
  if (p.packed_int4()) {
    const std::string q = p.base_quantization;
    if (p.kind() != PeftMethod::Lora)
      e.push_back({"peft.method", "peft.method must be lora over a " + q + " base (peft wraps GPTQ and AWQ linears for "
                                  "LoRA only)"});
    if (m.is_encoder_decoder || !m.architecture.empty() || m.kv_lora_rank > 0 || m.num_experts > 0 || m.post_layernorm ||
        m.fused_qkv)
      e.push_back({"peft.base_quantization", "peft.base_quantization " + q + " is modelled for dense decoder-only "
                                             "models with separate q/k/v linears (no encoder-decoder, program, latent "
                                             "attention, mixture of experts, post-LN or fused qkv)"});
    const std::string& f = c.training.framework;
    if (f != "hf_trainer" && f != "hf_loop" && f != "deepspeed")
      e.push_back({"training.framework", "training.framework must be hf_trainer, hf_loop or deepspeed with a " + q +
                                         " base (transformers loads it through " +
                                         (q == "gptq" ? std::string("optimum and auto-gptq") : std::string("AutoAWQ")) + ")"});
    if (c.parallel.zero_stage >= 3 && c.parallel.data_parallel_size > 1)
      e.push_back({"parallel.zero_stage", "parallel.zero_stage must be at most 2 with a " + q + " base: sharding its "
                                          "packed int32 buffers (ZeRO-3, FSDP FULL_SHARD) is not modelled"});
    const int64_t g = p.quant_group_size;
    if (g == 0 || (g > 0 && (m.hidden_size % g != 0 || m.intermediate_size % g != 0)))
      e.push_back({"peft.quant_group_size", "peft.quant_group_size must divide the hidden size (" +
                                                std::to_string(m.hidden_size) + ") and the intermediate size (" +
                                                std::to_string(m.intermediate_size) + "), or be -1; got " +
                                                std::to_string(g)});
  }
  if ((p.method == "ia3" || p.method == "ln_tuning" || p.method == "prompt_tuning") && m.is_encoder_decoder)
    e.push_back({"peft.method", "peft.method " + p.method + " is modelled for decoder-only models; with an "
                                "encoder-decoder use lora or dora"});
  if (p.method == "ia3") {
    // IA3 as PEFT runs it on separate linears of dense pre-norm layers (ia3_inputs in activations.cpp).
    if (resolve(c).fused_qkv)
      e.push_back({"peft.method", "peft.method ia3 is modelled as PEFT applies it, on separate q/k/v linears; the "
                                  "framework " + c.training.framework + " fuses them (use hf_trainer, hf_loop, deepspeed, "
                                  "torchtune or torchtitan)"});
    if (m.kv_lora_rank > 0 || m.num_experts > 0 || m.post_layernorm)
      e.push_back({"peft.method", "peft.method ia3 is modelled for dense decoder layers (no latent attention, mixture "
                                  "of experts or post-LN encoder)"});
    // IA3Config.__post_init__: "`feedforward_modules` should be a subset of `target_modules`".
    const auto targets = list_items(p.target_modules);
    for (const auto& item : list_items(p.feedforward_modules))
      if (p.target_modules != "all-linear" && std::find(targets.begin(), targets.end(), item) == targets.end())
        e.push_back({"peft.feedforward_modules", "peft.feedforward_modules must be a subset of peft.target_modules "
                                                 "(IA3Config); \"" + item.substr(0, 40) + "\" is not targeted"});
  }
  if (p.method == "ln_tuning") {
    // The norms whose saved tensors memsim models (norm_forward): the two per layer and the final one.
    std::vector<std::string> known = {"input_layernorm"};
    if (m.norms_per_layer >= 2) known.push_back("post_attention_layernorm");
    if (!m.post_layernorm) known.push_back("norm");
    const auto items = list_items(p.target_modules);
    for (const auto& item : items)
      if (std::find(known.begin(), known.end(), item) == known.end())
        e.push_back({"peft.target_modules", "with peft.method ln_tuning, peft.target_modules names norms; \"" +
                                                item.substr(0, 40) + "\" is not one memsim models here; it has: " +
                                                joined(known)});
    if (items.empty()) e.push_back({"peft.target_modules", "with peft.method ln_tuning, peft.target_modules must name at "
                                                           "least one norm: " + joined(known)});
    if (m.kv_lora_rank > 0)
      e.push_back({"peft.method", "peft.method ln_tuning is not modelled with latent attention (its inner norms)"});
  }
  if (p.llama_adapter() && c.training.framework != "litgpt")
    // litgpt's adapter.py / adapter_v2.py on its own GPT (adapter_step.cpp), under litgpt's finetune scripts.
    e.push_back({"peft.method", "peft.method " + p.method + " is litgpt's LLaMA-Adapter recipe (finetune adapter / "
                                "adapter_v2): set training.framework to litgpt; PEFT's LLaMA-Adapter is adaption_prompt"});
  if (p.method == "prefix_tuning") {
    // PrefixTuningConfig through PeftModelForCausalLM._prefix_tuning_forward (peft 0.19): a DynamicCache of the
    // prefix keys and values that each attention's cache update concatenates before its own, and the causal mask
    // masking_utils builds for the longer keys (adapter_step.cpp prefix_cat, attention_mask.cpp).
    const auto& f = c.training.framework;
    if (f != "hf_trainer" && f != "hf_loop" && f != "deepspeed")
      e.push_back({"peft.method", "peft.method prefix_tuning is PEFT's, on transformers' model code: set "
                                  "training.framework to hf_trainer, hf_loop or deepspeed"});
    const std::string& a = c.training.attention;
    if (a != "auto" && a != "sdpa" && a != "sdpa_repeat_kv")
      e.push_back({"training.attention", "peft.method prefix_tuning is modelled with SDPA (auto, sdpa or "
                                         "sdpa_repeat_kv): the prefix makes every call take a mask; got " + a});
    const StackVersions v = stack_versions(c.versions);
    if (v.stated(Library::Torch) && v.below(Library::Torch, Version{2, 1, 0}))
      e.push_back({"versions.torch", "peft.method prefix_tuning is modelled from torch 2.1, whose memory-efficient kernel "
                                     "takes the prefix's mask (2.0 runs the math kernel, not modelled with a prefix)"});
    if (v.stated(Library::Transformers) && v.below(Library::Transformers, Version{4, 56, 0}))
      e.push_back({"versions.transformers", "peft.method prefix_tuning is modelled from transformers 4.56 (PEFT hands "
                                            "it a DynamicCache of the prefix and masking_utils builds the mask); older "
                                            "caches and masks are not"});
    if (c.training.activation_checkpointing != "none")
      e.push_back({"training.activation_checkpointing", "peft.method prefix_tuning does not work with gradient "
                                                        "checkpointing (PEFT raises: its cache would be updated again "
                                                        "by the recomputation); set it to none"});
    if (c.training.objective != "sft")
      e.push_back({"training.objective", "peft.method prefix_tuning is modelled for training.objective sft"});
    if (m.is_encoder_decoder || m.kv_lora_rank > 0 || m.post_layernorm || !m.architecture.empty() || !m.vision_tower.empty() ||
        resolve(c).fused_qkv)
      e.push_back({"peft.method", "peft.method prefix_tuning is modelled for decoder models with separate k and v "
                                  "projections (no encoder-decoder, latent attention, vision tower or model program)"});
    if (c.parallel.pipeline_parallel_size > 1 || c.parallel.context_parallel_size > 1 || c.parallel.tensor_parallel_size > 1)
      e.push_back({"peft.method", "peft.method prefix_tuning is modelled without tensor, pipeline or context parallelism"});
    if (!p.modules_to_save.empty())
      e.push_back({"peft.modules_to_save", "peft.modules_to_save is not modelled with peft.method prefix_tuning: leave it empty"});
  }
  if (p.method == "adaption_prompt") {
    // PEFT's AdaptedAttention wraps a transformers attention module: TRANSFORMERS_MODEL_CONFIG has llama, mistral and
    // gpt2 (whose prompt output skips o_proj: not modelled).
    const auto& f = c.training.framework;
    if (f != "hf_trainer" && f != "hf_loop" && f != "deepspeed")
      e.push_back({"peft.method", "peft.method adaption_prompt is PEFT's, on transformers' model code: set "
                                  "training.framework to hf_trainer, hf_loop or deepspeed (litgpt's LLaMA-Adapter is "
                                  "adapter / adapter_v2)"});
    if (m.model_type != "llama" && m.model_type != "mistral")
      e.push_back({"peft.method", "peft.method adaption_prompt is modelled for model_type llama and mistral (PEFT's "
                                  "TRANSFORMERS_MODEL_CONFIG); got \"" + m.model_type.substr(0, 40) + "\""});
  }
  if (p.prompt_adapter()) {
    if (m.is_encoder_decoder || m.kv_lora_rank > 0 || m.num_experts > 0 || m.post_layernorm || !m.architecture.empty() ||
        !m.vision_tower.empty())
      e.push_back({"peft.method", "peft.method " + p.method + " is modelled for dense decoder models (no "
                                  "encoder-decoder, latent attention, mixture of experts, vision tower or model program)"});
    if (p.adapter_start_layer >= m.num_hidden_layers && m.num_hidden_layers > 0)
      e.push_back({"peft.adapter_start_layer", "peft.adapter_start_layer must be below the model's " +
                                                   std::to_string(m.num_hidden_layers) + " layers (0 to " +
                                                   std::to_string(m.num_hidden_layers - 1) + "); got " +
                                                   std::to_string(p.adapter_start_layer)});
    if (!p.modules_to_save.empty())
      e.push_back({"peft.modules_to_save", "peft.modules_to_save is not modelled with peft.method " + p.method +
                                               ", which trains the adaption prompts (and v2's biases, scales and "
                                               "norms) only: leave it empty"});
  }
  if (p.method == "prompt_tuning") {
    if (m.position_embedding_type == PositionType::Absolute &&
        c.training.sequence_length + p.num_virtual_tokens > m.max_position_embeddings)
      e.push_back({"peft.num_virtual_tokens", "training.sequence_length + peft.num_virtual_tokens must be at most "
                                              "model.max_position_embeddings (" + std::to_string(m.max_position_embeddings) +
                                              ") for learned absolute positions"});
    if (c.parallel.context_parallel_size > 1)
      e.push_back({"peft.method", "peft.method prompt_tuning is not modelled with context parallelism"});
  }
  if (c.training.optimizer_in_backward)
    e.push_back({"training.optimizer_in_backward", "training.optimizer_in_backward is not modelled with PEFT"});
}

// Megatron's constraints (megatron/training/arguments.py): heads and KV heads divide by TP, layers by PP; the
// world is DP x CP x TP x PP and must fit int64 (a million GPUs is fine).
void validate_layout(const Config& c, std::vector<FieldError>& e) {
  const auto& p = c.parallel;
  const auto& m = c.model;
  const int64_t t = p.tensor_parallel_size, pp = p.pipeline_parallel_size, cp = p.context_parallel_size;
  const int64_t ep = p.expert_parallel_size, dp = p.data_parallel_size;
  if (t < 1 || pp < 1 || cp < 1 || ep < 1 || dp < 1 || p.virtual_pipeline_stages < 1) return;
  auto err = [&](const char* f, const std::string& msg) { e.push_back({f, msg}); };
  const std::string T = std::to_string(t), PP = std::to_string(pp);
  if (m.num_attention_heads % t != 0)
    err("parallel.tensor_parallel_size", "parallel.tensor_parallel_size (" + T + ") must divide model.num_attention_heads (" +
                                             std::to_string(m.num_attention_heads) + "); try a divisor of it");
  else if (m.kv_lora_rank == 0 && m.num_key_value_heads % t != 0 && t % m.num_key_value_heads != 0)
    err("parallel.tensor_parallel_size", "parallel.tensor_parallel_size (" + T + ") must divide model.num_key_value_heads (" +
                                             std::to_string(m.num_key_value_heads) +
                                             ") or be a multiple of it (KV heads are then replicated)");
  if (t > 1 && m.intermediate_size % t != 0)
    err("parallel.tensor_parallel_size", "parallel.tensor_parallel_size must divide model.intermediate_size (" +
                                             std::to_string(m.intermediate_size) + ")");
  // Pipeline: every stage (every model chunk with interleaving) needs a layer; uneven splits give the first and
  // last stage their own count and share the rest evenly (Megatron transformer_block.py get_num_layers_to_build).
  const bool interleaved = p.pipeline_schedule == "interleaved_1f1b";
  const int64_t chunks = pp * (interleaved ? p.virtual_pipeline_stages : 1);
  const int64_t fixed = p.pipeline_first_stage_layers + p.pipeline_last_stage_layers;
  if (chunks > m.num_hidden_layers)
    err("parallel.pipeline_parallel_size", "parallel.pipeline_parallel_size (" + PP + ")" +
                                               (interleaved ? " x parallel.virtual_pipeline_stages" : "") +
                                               " must be at most model.num_hidden_layers (" +
                                               std::to_string(m.num_hidden_layers) + "): every stage needs a layer");
  if (interleaved && pp == 1)
    err("parallel.pipeline_schedule", "parallel.pipeline_schedule interleaved_1f1b needs parallel.pipeline_parallel_size above 1");
  if (interleaved && p.virtual_pipeline_stages < 2)
    err("parallel.virtual_pipeline_stages", "parallel.virtual_pipeline_stages must be at least 2 with interleaved_1f1b");
  if (fixed > 0 && (pp < 2 || interleaved))
    err("parallel.pipeline_first_stage_layers", "uneven pipeline splits need parallel.pipeline_parallel_size above 1 and the "
                                                "1f1b or gpipe schedule; set parallel.pipeline_first_stage_layers and "
                                                "parallel.pipeline_last_stage_layers to 0");
  else if (fixed > 0) {
    const int64_t middle = pp - (p.pipeline_first_stage_layers > 0) - (p.pipeline_last_stage_layers > 0);
    const int64_t rest = m.num_hidden_layers - fixed;
    if (rest < middle || (middle == 0 && rest != 0) || (middle > 0 && rest % middle != 0))
      err("parallel.pipeline_first_stage_layers",
          "the layers left after parallel.pipeline_first_stage_layers and parallel.pipeline_last_stage_layers (" +
              std::to_string(rest) + ") must split evenly over the other " + std::to_string(middle) + " stages");
  }
  if (p.sequence_parallel && t == 1)
    err("parallel.sequence_parallel", "parallel.sequence_parallel needs parallel.tensor_parallel_size above 1");
  if (p.sequence_parallel && c.training.sequence_length % t != 0)
    err("parallel.sequence_parallel", "with parallel.sequence_parallel, parallel.tensor_parallel_size must divide training.sequence_length");
  // Context parallel splits the sequence into 2 x cp chunks for load balancing (Megatron / TE, torchtitan).
  if (cp > 1 && c.training.sequence_length % (2 * cp) != 0)
    err("parallel.context_parallel_size", "parallel.context_parallel_size (" + std::to_string(cp) +
                                              "): training.sequence_length must be a multiple of 2 x cp = " +
                                              std::to_string(2 * cp) + " (ring attention splits it into 2 x cp chunks)");
  if (cp > 1 && (c.training.attention == "eager" || c.training.attention == "sdpa_math" || m.post_layernorm ||
                 m.kv_lora_rank > 0))
    err("parallel.context_parallel_size", "context parallelism is modelled for decoder models with SDPA/flash attention only");
  // Expert parallel: each rank of an EP group holds num_experts / ep experts; the group lies within the
  // data-parallel ranks (Megatron expert_model_parallel_size; expert-data-parallel = dp / ep).
  if (ep > 1 && m.num_experts == 0)
    err("parallel.expert_parallel_size", "parallel.expert_parallel_size needs a mixture-of-experts model (model.num_experts above 0)");
  else if (ep > 1 && m.num_experts % ep != 0)
    err("parallel.expert_parallel_size", "parallel.expert_parallel_size (" + std::to_string(ep) + ") must divide model.num_experts (" +
                                             std::to_string(m.num_experts) + ")");
  if (ep > 1 && (dp * cp) % ep != 0)
    err("parallel.expert_parallel_size", "parallel.expert_parallel_size (" + std::to_string(ep) +
                                             ") must divide parallel.data_parallel_size x parallel.context_parallel_size (" +
                                             std::to_string(dp * cp) + "): experts are split within the data-parallel ranks");
  // Sharding engines and what each can shard.
  const Resolved rs = resolve(c);
  const int64_t z = p.zero_stage;
  if ((rs.sharding == Sharding::Fsdp1 || rs.sharding == Sharding::Fsdp2) && z == 1)
    err("parallel.zero_stage", "FSDP has no optimizer-only sharding: use parallel.zero_stage 2 (SHARD_GRAD_OP / "
                               "reshard_after_forward=False), 3 (FULL_SHARD) or 0 (NO_SHARD)");
  if (rs.sharding == Sharding::Megatron && z >= 2)
    err("parallel.zero_stage", "Megatron shards only the optimizer (the distributed optimizer): use parallel.zero_stage 0 or 1");
  if (p.shard_group_size > 0 && (dp % p.shard_group_size != 0))
    err("parallel.shard_group_size", "parallel.shard_group_size (" + std::to_string(p.shard_group_size) +
                                         ") must divide parallel.data_parallel_size (" + std::to_string(dp) + ")");
  if (p.shard_group_size > 0 && rs.sharding != Sharding::Fsdp1 && rs.sharding != Sharding::Fsdp2)
    err("parallel.shard_group_size", "parallel.shard_group_size (hybrid sharding, HSDP) needs FSDP: set parallel.sharding to fsdp1 or fsdp2, or 0");
  if (z >= 2 && pp > 1 && rs.sharding == Sharding::DeepSpeed)
    err("parallel.zero_stage", "DeepSpeed ZeRO stage 2 and 3 do not combine with pipeline parallelism (its PipelineEngine "
                               "allows ZeRO-1); use parallel.zero_stage 0 or 1, or FSDP");
  if (p.fsdp_shard_embeddings && (rs.sharding != Sharding::Fsdp2 || z != 3 || pp > 1 || m.is_encoder_decoder))
    err("parallel.fsdp_shard_embeddings", "parallel.fsdp_shard_embeddings (the embedding and output layer as FSDP2 units "
                                          "of their own) needs parallel.sharding fsdp2 with zero_stage 3, no pipeline, "
                                          "and a decoder-only model");
  if (p.fsdp_forward_prefetch > 1 && rs.sharding == Sharding::Fsdp1)
    err("parallel.fsdp_forward_prefetch",
        "FSDP1's forward_prefetch all-gathers one unit ahead: parallel.fsdp_forward_prefetch must be 0 or 1 "
        "(FSDP2's set_modules_to_forward_prefetch takes more: set parallel.sharding to fsdp2)");
  // Offload engines (MEMORY_FORMULAS.md 2.2, 2.5): ZeRO-Offload needs ZeRO >= 1, parameter offload ZeRO-3;
  // FSDP's CPUOffload moves parameters and gradients together and steps on the CPU; NVMe is DeepSpeed's.
  const bool fsdp = rs.sharding == Sharding::Fsdp1 || rs.sharding == Sharding::Fsdp2;
  if (p.offload_optimizer != "none" && z == 0 && rs.sharding != Sharding::Megatron)
    err("parallel.offload_optimizer", "optimizer offload needs sharding: set parallel.zero_stage to 1 or more (FSDP: 3)");
  if (p.offload_params != "none" && z != 3)
    err("parallel.offload_params", "parameter offload needs parallel.zero_stage 3 (ZeRO-Infinity, FSDP FULL_SHARD)");
  if (fsdp && (p.offload_optimizer == "nvme" || p.offload_params == "nvme"))
    err("parallel.offload_params", "NVMe offload is DeepSpeed's (ZeRO-Infinity); FSDP offloads to cpu only");
  if (fsdp && (p.offload_optimizer != "none") != (p.offload_params != "none"))
    err("parallel.offload_params", "FSDP's CPUOffload(offload_params=True) moves parameters, gradients and the optimizer step "
                                   "together: set parallel.offload_params and parallel.offload_optimizer both to cpu, or both to none");
  if (rs.sharding == Sharding::Megatron && p.offload_params != "none")
    err("parallel.offload_params", "Megatron does not offload parameters; set parallel.offload_params to none");
  if ((t > 1 || pp > 1 || cp > 1) && c.model.post_layernorm)
    err("parallel.tensor_parallel_size", "tensor, pipeline and context parallelism are modelled for decoder models only");
  if (t > 1 && m.num_experts > 0)
    err("parallel.tensor_parallel_size", "tensor parallelism of mixture-of-experts layers is not modelled yet; use "
                                         "parallel.expert_parallel_size for the experts");
  // LoRA and DoRA split with their base linears (model.cpp apply_tensor_parallel); a bitsandbytes base and the
  // other PEFT methods have no tensor-parallel form in the frameworks modelled here.
  if (t > 1 && c.peft.enabled() && c.peft.method != "lora" && c.peft.method != "dora")
    err("peft.method", "with tensor parallelism only LoRA and DoRA are modelled (Megatron-Core / NeMo LoRA)");
  if (t > 1 && c.peft.enabled() && c.peft.base_quantization != "none")
    err("peft.base_quantization", "a quantized (bitsandbytes, GPTQ or AWQ) base has no tensor-parallel linears: set "
                                  "parallel.tensor_parallel_size to 1 or peft.base_quantization to none");
  const long double world = static_cast<long double>(dp) * static_cast<long double>(t) * static_cast<long double>(pp) *
                            static_cast<long double>(cp);
  if (world > 1e9L)
    err("parallel.data_parallel_size", "the world size (data x context x tensor x pipeline) must be at most 1e9 GPUs");
}

// What the encoder-decoder step (encoder_decoder.cpp) models: HF's T5ForConditionalGeneration trained on one
// device or with ZeRO data parallelism. Everything else is refused rather than guessed.
// Unsloth (FrameworkSpec::unsloth_kernels) as memsim models it: FastLanguageModel's patched decoder-only causal LM,
// trained on one GPU or under DDP (docs/research/unsloth.md). Encoder-decoder models are refused with the rest of
// validate_encoder_decoder's checks.
void validate_unsloth(const Config& c, std::vector<FieldError>& e) {
  if (c.training.framework != "unsloth" || c.model.is_encoder_decoder) return;
  const auto& m = c.model;
  const auto& p = c.parallel;
  if (m.post_layernorm || m.head() != TaskHead::CausalLm || m.kv_lora_rank > 0)
    e.push_back({"training.framework", "training.framework unsloth is modelled for decoder-only causal LMs with "
                                       "standard attention (FastLanguageModel's patched Llama-style forward)"});
  if (p.tensor_parallel_size > 1 || p.pipeline_parallel_size > 1 || p.context_parallel_size > 1 ||
      p.expert_parallel_size > 1 || p.zero_stage > 0)
    e.push_back({"training.framework", "training.framework unsloth trains on one GPU or under plain DDP: set "
                                       "parallel tensor, pipeline, context and expert sizes to 1 and zero_stage to 0"});
  if (c.training.activation_offload && c.training.activation_checkpointing != "full")
    e.push_back({"training.activation_offload", "under training.framework unsloth, activation_offload is "
                                                "use_gradient_checkpointing='unsloth' and needs "
                                                "training.activation_checkpointing full"});
}

// The vLLM server's GPUs (vllm_server.h): trl vllm-serve's arguments by TRL version (v0.15 ran one engine on one
// vllm_device; --tensor_parallel_size from v0.16, --data_parallel_size from v0.17), and vLLM's own refusal of a
// tensor-parallel size that does not divide the heads (ModelConfig.verify_with_parallel_config).
void validate_vllm_server(const Config& c, const StackVersions& v, std::vector<FieldError>& e) {
  const auto& t = c.training;
  const int64_t tp = t.vllm_server_tensor_parallel_size;
  if (tp > 1 && v.below(Library::Trl, Version{0, 16, 0}))
    e.push_back({"training.vllm_server_tensor_parallel_size", "before TRL 0.16 the vLLM engine ran on one GPU (vllm_device); with " +
                                                                  describe_version(v, Library::Trl) + " set 1"});
  if (t.vllm_server_data_parallel_size > 1 && v.below(Library::Trl, Version{0, 17, 0}))
    e.push_back({"training.vllm_server_data_parallel_size", "trl vllm-serve --data_parallel_size arrived in TRL 0.17; with " +
                                                                describe_version(v, Library::Trl) + " set 1"});
  if (c.model.num_attention_heads % tp != 0)
    e.push_back({"training.vllm_server_tensor_parallel_size", "vLLM splits the attention heads over its tensor-parallel GPUs: " +
                                                                  std::to_string(tp) + " must divide model.num_attention_heads (" +
                                                                  std::to_string(c.model.num_attention_heads) + ")"});
}

// max_model_len of a vLLM engine (vllm_server.h vllm_max_model_len): TRL passes a colocated engine its own from 0.26
// (vllm_max_model_length); vLLM refuses one beyond the model's positions (_get_and_verify_max_len), and TRL's
// requests of a prompt and its completion must fit in it.
void validate_vllm_max_model_len(const Config& c, const StackVersions& v, std::vector<FieldError>& e) {
  const auto& t = c.training;
  const int64_t len = t.vllm_max_model_len;
  if (len > 0 && t.engine() == GenerationEngine::VllmColocate && v.below(Library::Trl, Version{0, 26, 0}))
    e.push_back({"training.vllm_max_model_len", "a colocated engine's vllm_max_model_length arrived in TRL 0.26 (before "
                                                "it TRL passed max_prompt_length + max_completion_length); with " +
                                                    describe_version(v, Library::Trl) + " set 0"});
  else if (len > 0 && len < t.sequence_length)
    e.push_back({"training.vllm_max_model_len", "training.vllm_max_model_len (" + std::to_string(len) +
                                                           ") must hold a prompt and its completion, training.sequence_length (" +
                                                           std::to_string(t.sequence_length) + "), or 0 for the model's positions"});
  else if (len > c.model.max_position_embeddings)
    e.push_back({"training.vllm_max_model_len", "training.vllm_max_model_len (" + std::to_string(len) +
                                                           ") is beyond the model's " + std::to_string(c.model.max_position_embeddings) +
                                                           " positions (model.max_position_embeddings): vLLM refuses a "
                                                           "max_model_len above the one it derives from the model's config "
                                                           "(unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)"});
}

// Liger's GRPO loss (training.loss fused_linear; rollout.h RolloutFlow::liger, docs/research/liger-grpo.md).
void validate_liger_grpo(const Config& c, const StackVersions& v, std::vector<FieldError>& e) {
  if (v.below(Library::Trl, Version{0, 17, 0}))
    e.push_back({"versions.trl", "training.loss fused_linear under grpo is Liger's GRPO loss, which TRL's GRPOTrainer "
                                 "takes from 0.17 (use_liger_loss; use_liger_kernel from 0.25); got " +
                                     describe_version(v, Library::Trl)});
  if (v.below(Library::Liger, Version{0, 5, 4}))
    e.push_back({"versions.liger", "training.loss fused_linear under grpo needs LigerFusedLinearGRPOLoss, which arrived in "
                                   "liger-kernel 0.5.4; got " + describe_version(v, Library::Liger)});
  const auto& p = c.parallel;
  if (p.data_parallel_size > 1 && (p.zero_stage >= 3 || p.sharding == "fsdp1" || p.sharding == "fsdp2"))
    e.push_back({"parallel.zero_stage", "training.loss fused_linear under grpo: Liger reads lm_head.weight outside the "
                                        "head's call, where ZeRO-3 and FSDP keep only a shard; this is not modelled: use "
                                        "ZeRO 0-2, or training.loss auto"});
  const PrecisionRecipe* recipe = find_precision(c.training.precision);
  if (recipe && recipe->weight_bytes == 4 && recipe->autocast_copy_bytes > 0)
    e.push_back({"training.precision", "training.loss fused_linear under grpo: TRL runs the model's trunk for Liger's loss "
                                       "outside accelerate's autocast (unwrapped_model.model, through _ForwardRedirection "
                                       "from 0.18), so fp32 weights would train in fp32, which is not modelled: use 16-bit "
                                       "weights (bf16_autocast, fp16_autocast, bf16_pure, bf16_mixed)"});
}

// GRPO (rollout.h) as TRL's GRPOTrainer runs it, from v0.15 (per_device_train_batch_size counts completions), and PPO
// as its PPOTrainer does from v0.12 (the PPOv2 design: policy and value model in one wrapper, HF generate only).
void validate_rollout(const Config& c, std::vector<FieldError>& e) {
  const auto& t = c.training;
  const bool ppo = t.ppo();
  const std::string obj = "training.objective " + t.objective;
  if (t.reference() == ReferenceModel::Precomputed)
    e.push_back({"training.reference_model", obj + " scores each rollout as it is generated: training.reference_model must be auto, "
                                                   "copy, adapter_disabled" + std::string(ppo ? "" : " or none (beta = 0)")});
  if (ppo && t.reference() == ReferenceModel::None)
    e.push_back({"training.reference_model", "training.objective ppo takes its KL penalty from a reference model (PPOTrainer raises "
                                             "\"No reference model and model is not a Peft model\"): auto, copy or adapter_disabled"});
  if (ppo && !t.reward_model_on())
    e.push_back({"training.reward_model", "training.objective ppo scores with a reward model, and TRL's value model is initialised "
                                          "from it: training.reward_model must be same_as_policy"});
  if (ppo && t.zero_grad_at != "after_step")
    e.push_back({"training.zero_grad_at", "training.objective ppo: PPOTrainer zeroes the gradients after each optimizer step "
                                          "(accelerator.accumulate): training.zero_grad_at must be after_step"});
  if (ppo && t.value_model != "peft" && t.precision == "fp16_autocast")
    e.push_back({"training.value_model", "training.value_model full trains the value model's fp16 weights under "
                                         "fp16_autocast, whose gradients the GradScaler refuses to unscale: use peft, or amp_fp16"});
  if (ppo && t.value_model == "peft" && !c.peft.enabled())
    e.push_back({"training.value_model", "training.value_model peft puts the policy's PEFT method on the value model: set "
                                         "peft.method, or use full"});
  if (ppo && t.engine() != GenerationEngine::HfGenerate)
    e.push_back({"training.generation_engine", "training.objective ppo generates with the policy's model.generate (TRL's "
                                               "PPOTrainer has no vLLM path): training.generation_engine must be hf_generate"});
  if (t.reference() == ReferenceModel::AdapterDisabled && !c.peft.enabled())
    e.push_back({"training.reference_model", "training.reference_model adapter_disabled needs a PEFT method (the "
                                             "policy with its adapters off); without one use copy or none"});
  if (c.data.varies())
    e.push_back({"data.lengths", obj + " is modelled with every prompt and completion at its maximum length: data.lengths "
                                       "must be fixed"});
  if (t.completion_length >= t.sequence_length)
    e.push_back({"training.completion_length", "training.completion_length must be below training.sequence_length (" +
                                                   std::to_string(t.sequence_length) +
                                                   ", the prompt and its completion together); got " +
                                                   std::to_string(t.completion_length)});
  else if (t.sequence_length > c.model.max_position_embeddings)
    e.push_back({"training.completion_length", obj + " generates up to training.sequence_length (" +
                                                   std::to_string(t.sequence_length) +
                                                   " tokens, prompt and completion) but the model has " +
                                                   std::to_string(c.model.max_position_embeddings) +
                                                   " positions (model.max_position_embeddings): shorten the completion "
                                                   "or the prompt"});
  std::vector<FieldError> version_errors;
  validate_versions(c.versions, version_errors);
  if (!version_errors.empty()) return;  // reported by validate()
  const StackVersions v = stack_versions(c.versions);
  const auto at = [&](int major, int minor) { return v.at_least(Library::Trl, Version{major, minor, 0}); };
  if (ppo) {
    if (!at(0, 12))
      e.push_back({"versions.trl", "training.objective ppo is modelled from TRL 0.12, whose PPOTrainer is the PPOv2 design "
                                   "(before 0.12 PPOTrainer was the step-based trainer with a value head); got " +
                                       describe_version(v, Library::Trl)});
    return;
  }
  if (!at(0, 15))
    e.push_back({"versions.trl", "training.objective grpo is modelled from TRL 0.15, when per_device_train_batch_size "
                                 "began counting completions; got " + describe_version(v, Library::Trl)});
  if (t.steps_per_generation > 0 && !at(0, 18))
    e.push_back({"training.steps_per_generation", "steps_per_generation arrived in TRL 0.18 (before it a generation "
                                                  "covered gradient_accumulation_steps micro-batches); with " +
                                                      describe_version(v, Library::Trl) + " set 0"});
  if (t.num_iterations > 1 && !at(0, 16))
    e.push_back({"training.num_iterations", "num_iterations arrived in TRL 0.16; with " +
                                                describe_version(v, Library::Trl) + " set 1"});
  const GenerationBatch g = generation_batch(c, v);
  if (t.num_generations > 0 && g.global % t.num_generations != 0)
    e.push_back({"training.num_generations", "training.num_generations (" + std::to_string(t.num_generations) +
                                                 ") must divide the completions generated at once, " + g.formula +
                                                 " = " + std::to_string(g.global) + " (GRPOConfig's check)"});
  if (t.engine() == GenerationEngine::VllmColocate && !at(0, 18))
    e.push_back({"training.generation_engine", "vllm_colocate arrived in TRL 0.18 (vllm_mode=\"colocate\"); "
                                               "earlier versions ran vLLM on GPUs of its own: use vllm_server"});
  if (t.engine() == GenerationEngine::VllmServer) validate_vllm_server(c, v, e);
  if (t.engine() == GenerationEngine::VllmServer || t.engine() == GenerationEngine::VllmColocate)
    validate_vllm_max_model_len(c, v, e);
  if (t.loss == "fused_linear") validate_liger_grpo(c, v, e);
  if (t.engine() == GenerationEngine::VllmColocate && t.vllm_sleep && !at(0, 23))
    e.push_back({"training.vllm_sleep", "vllm_enable_sleep_mode arrived in TRL 0.23; with " +
                                            describe_version(v, Library::Trl) + " set training.vllm_sleep false"});
}

// KTO as TRL's KTOTrainer runs it (preference.cpp resolve_kto): from v0.8, where it arrived; its check of the batch
// the KL term is estimated from; padded batches (its collators pad every row; there is no padding-free path); no NLL
// term.
void validate_kto(const Config& c, std::vector<FieldError>& e) {
  const auto& t = c.training;
  if (t.nll_alpha > 0)
    e.push_back({"training.nll_alpha", "training.objective kto has no NLL term: training.nll_alpha must be 0"});
  if (c.data.varies() && c.data.pad() == Padding::None)
    e.push_back({"data.padding", "training.objective kto pads each batch (KTOTrainer has no padding-free path): "
                                 "data.padding must be longest or max_length"});
  std::vector<FieldError> version_errors;
  validate_versions(c.versions, version_errors);
  if (!version_errors.empty()) return;  // reported by validate()
  const StackVersions v = stack_versions(c.versions);
  if (v.below(Library::Trl, Version{0, 8, 0}))
    e.push_back({"versions.trl", "training.objective kto: KTOTrainer arrived in TRL 0.8; got " + describe_version(v, Library::Trl)});
  // TRL 0.12+ checks the per-device batch ("Actual (not effective) batch size must be > 1", f05c3fa8f); 0.8-0.11
  // checked device_count x per_device_train_batch_size x gradient_accumulation_steps.
  if (v.at_least(Library::Trl, Version{0, 12, 0}) && t.micro_batch_size < 2)
    e.push_back({"training.micro_batch_size", "training.objective kto estimates its KL term from the other rows of each "
                                              "micro-batch: KTOTrainer requires micro_batch_size (per_device_train_batch_size) "
                                              "of at least 2 (TRL 0.12+)"});
  else if (v.below(Library::Trl, Version{0, 12, 0}) && t.micro_batch_size < 2 && t.gradient_accumulation_steps < 2 &&
           c.parallel.data_parallel_size < 2)  // their product below 2, without multiplying
    e.push_back({"training.micro_batch_size", "training.objective kto estimates its KL term from other rows: before TRL "
                                              "0.12 KTOTrainer requires micro_batch_size x gradient_accumulation_steps x "
                                              "GPUs of at least 2"});
}

// Preference objectives (preference.h) as memsim models them: TRL's trainers over the HF Trainer, or torchtune's
// DPO recipes, on a decoder-only causal LM without a pipeline. Each refusal says what is modelled.
void validate_preference(const Config& c, std::vector<FieldError>& e) {
  const auto& t = c.training;
  const Objective o = t.goal();
  const bool rollout = o == Objective::Grpo || o == Objective::Ppo;
  if (o != Objective::Ppo && t.value_model != "full")
    e.push_back({"training.value_model", "training.value_model applies to training.objective ppo; with " + t.objective +
                                             " it must be full"});
  if (o != Objective::Ppo && !t.use_cache)
    e.push_back({"training.use_cache", "training.use_cache applies to training.objective ppo; with " + t.objective +
                                           " it must be true"});
  if (!rollout && t.reward_model_on())
    e.push_back({"training.reward_model", "training.reward_model applies to training.objective grpo and ppo; with " + t.objective +
                                              " it must be none"});
  if (o != Objective::Grpo && t.steps_per_generation != 0)
    e.push_back({"training.steps_per_generation", "training.steps_per_generation applies to training.objective grpo; "
                                                  "with " + t.objective + " it must be 0"});
  if (!rollout && t.num_iterations != 1)
    e.push_back({"training.num_iterations", "training.num_iterations applies to training.objective grpo and ppo; with " +
                                                t.objective + " it must be 1"});
  if (o == Objective::Sft || o == Objective::Unknown) {
    if (t.reference() != ReferenceModel::Auto && t.reference() != ReferenceModel::None && t.reference() != ReferenceModel::Unknown)
      e.push_back({"training.reference_model", "training.reference_model applies to training.objective dpo, kto, grpo and ppo; with sft "
                                               "it must be auto or none"});
    return;
  }
  const auto& m = c.model;
  const std::string obj = "training.objective " + t.objective;
  if (!m.architecture.empty() || m.is_encoder_decoder || m.head() != TaskHead::CausalLm || m.post_layernorm)
    e.push_back({"training.objective", obj + " is modelled for decoder-only causal LMs (the built-in families); "
                                             "use sft for this model"});
  if (rollout && t.framework != "hf_trainer")
    e.push_back({"training.framework", obj + " is modelled as TRL's " + (o == Objective::Ppo ? "PPOTrainer" : "GRPOTrainer") +
                                             " runs it (hf_trainer); got " + t.framework});
  else if (o == Objective::Kto && t.framework != "hf_trainer")
    e.push_back({"training.framework", obj + " is modelled as TRL's KTOTrainer runs it (hf_trainer; torchtune has no KTO "
                                             "recipe); got " + t.framework});
  else if (t.framework != "hf_trainer" && t.framework != "torchtune")
    e.push_back({"training.framework", obj + " is modelled as TRL's trainers run it (hf_trainer) and torchtune's DPO "
                                             "recipes (torchtune); got " + t.framework});
  if (c.parallel.pipeline_parallel_size > 1 || c.parallel.tensor_parallel_size > 1 || c.parallel.context_parallel_size > 1)
    e.push_back({"parallel.pipeline_parallel_size", obj + " is modelled with data parallelism and ZeRO / FSDP only: set "
                                                          "tensor, pipeline and context parallel sizes to 1"});
  if (t.loss != "auto" && !(o == Objective::Grpo && t.loss == "fused_linear"))
    e.push_back({"training.loss", obj + " takes log-probabilities of the whole vocabulary as its trainer does: "
                                        "training.loss must be auto (Liger's fused preference losses are not modelled; "
                                        "grpo also takes fused_linear, Liger's GRPO loss)"});
  if (t.activation_offload)
    e.push_back({"training.activation_offload", obj + ": activation offload is not modelled with a preference objective"});
  const ReferenceModel r = t.reference();
  if (rollout) return validate_rollout(c, e);
  const bool referenced = o == Objective::Dpo || o == Objective::Kto;
  if (referenced && r == ReferenceModel::None)
    e.push_back({"training.reference_model", obj + " needs reference log-probabilities: auto, copy, "
                                             "adapter_disabled or precomputed (orpo and simpo are reference-free)"});
  if (o == Objective::Kto) validate_kto(c, e);
  if (!referenced && r != ReferenceModel::Auto && r != ReferenceModel::None && r != ReferenceModel::Unknown)
    e.push_back({"training.reference_model", obj + " has no reference model: training.reference_model must be auto or none"});
  if (r == ReferenceModel::AdapterDisabled && !c.peft.enabled())
    e.push_back({"training.reference_model", "training.reference_model adapter_disabled needs a PEFT method (the "
                                             "policy with its adapters off); without one use copy or precomputed"});
}

void validate_attention(const Config& c, std::vector<FieldError>& e) {
  const auto& m = c.model;
  if (c.training.attention == "sdpa_math" && !m.is_encoder_decoder && (m.post_layernorm || m.kv_lora_rank > 0))
    e.push_back({"training.attention", "training.attention sdpa_math is modelled for pre-norm decoder layers with "
                                       "standard attention; use auto, sdpa or eager"});
}

void validate_encoder_decoder(const Config& c, std::vector<FieldError>& e) {
  const auto& m = c.model;
  const auto& t = c.training;
  if (!m.is_encoder_decoder) return;
  auto refuse = [&](const char* field, const std::string& why) { e.push_back({field, std::string(field) + " " + why}); };
  // Megatron has a T5 of its own, but how its tensor and pipeline parallel layouts split the encoder, the decoder
  // and the cross-attention has not been derived here; modelling it would be guesswork.
  if (c.parallel.tensor_parallel_size > 1)
    refuse("parallel.tensor_parallel_size", "must be 1 for encoder-decoder models: tensor parallelism of T5 is not modelled");
  if (c.parallel.pipeline_parallel_size > 1)
    refuse("parallel.pipeline_parallel_size", "must be 1 for encoder-decoder models: pipeline parallelism of T5 is not modelled");
  if (c.parallel.context_parallel_size > 1)
    refuse("parallel.context_parallel_size", "must be 1 for encoder-decoder models: ring attention over T5's "
                                             "position bias and cross-attention is not modelled");
  if (c.parallel.sharding == "megatron")
    refuse("parallel.sharding", "must be auto, deepspeed, fsdp1 or fsdp2 for encoder-decoder models (Megatron's "
                                "buffers are modelled for its own GPT layers)");
  if (t.precision.rfind("fp8", 0) == 0)
    refuse("training.precision", "fp8 recipes are modelled for decoder layers converted by Transformer Engine or "
                                 "torchao, not for T5; use fp32, amp_bf16, bf16_mixed or bf16_pure");
  if (t.framework != "hf_trainer" && t.framework != "hf_loop" && t.framework != "deepspeed")
    refuse("training.framework", "must be hf_trainer, hf_loop or deepspeed for encoder-decoder models: T5 is modelled "
                                 "as transformers' T5ForConditionalGeneration (torchtune and litgpt have no T5)");
  if (t.attention != "auto" && t.attention != "eager")
    refuse("training.attention", "must be auto or eager for encoder-decoder models: transformers' T5Attention adds "
                                 "the relative position bias to eagerly computed scores and has no SDPA or flash path");
  if (t.norm_impl != "auto" && t.norm_impl != "eager_fp32" && t.norm_impl != "fused")
    refuse("training.norm_impl", "must be auto, eager_fp32 (T5LayerNorm) or fused (apex FusedRMSNorm, which "
                                 "modeling_t5.py uses when apex is installed) for encoder-decoder models");
  if (t.loss != "auto")
    refuse("training.loss", "must be auto for encoder-decoder models: T5ForConditionalGeneration computes its own "
                            "CrossEntropyLoss on the logits");
  if (t.activation_checkpointing != "none" && t.activation_checkpointing != "full")
    refuse("training.activation_checkpointing", "must be none or full for encoder-decoder models: transformers' "
                                                "gradient checkpointing wraps every T5Block");
  if (t.activation_offload) refuse("training.activation_offload", "is not modelled for encoder-decoder models");
  if (t.optimizer_in_backward) refuse("training.optimizer_in_backward", "is not modelled for encoder-decoder models");
  if (m.num_key_value_heads != m.num_attention_heads)
    refuse("model.num_key_value_heads", "must equal model.num_attention_heads for encoder-decoder models (T5 "
                                        "attention has as many key/value heads as query heads)");
  if (m.num_experts > 0 || m.kv_lora_rank > 0 || m.post_layernorm || m.qk_norm || m.norms_per_layer != 2 ||
      m.type_vocab_size > 0 || m.position_embedding_type != PositionType::Rope)
    refuse("model.is_encoder_decoder", "is modelled for the T5 block only (pre-norm, two norms per block, relative "
                                       "position bias): no experts, latent attention, post-LayerNorm, qk_norm, "
                                       "token types or learned absolute positions");
  if (m.task_head != "causal_lm")
    refuse("model.task_head", "must be causal_lm for encoder-decoder models (T5ForConditionalGeneration's "
                              "language-model head)");
}

}  // namespace

// Every field's range or list of values, as the field registry declares them (fields.cpp), whether or not the rest of
// the config uses the field: a value outside them is wrong wherever it sits. Tables' ids (precision, optimizer, GPU)
// are checked below with their tables.
void check_registered(const Config& c, std::vector<FieldError>& e) {
  Config& readable = const_cast<Config&>(c);  // FieldSpec::ref hands out members for reading and writing; only read
  // Strings are made only for a problem: validate() runs before every simulation, the advice's many included.
  for (const FieldSpec& f : fields()) {
    const FieldRef member = f.ref(readable);
    switch (f.kind) {
      case FieldKind::Integer: {
        const int64_t v = *std::get<int64_t*>(member);
        if (v < f.range.min || v > f.range.max) out_of_range(e, f, v);
        break;
      }
      case FieldKind::Number: {
        const double v = *std::get<double*>(member);
        const NumberRange& r = f.number;
        const bool above_min = r.min_exclusive ? v > r.min : v >= r.min;
        const bool below_max = r.max_exclusive ? v < r.max : v <= r.max;
        if (r.bounded() && !(above_min && below_max)) {  // also refuses NaN
          const std::string key(f.key);
          char got[32];
          std::snprintf(got, sizeof got, "%.10g", v);  // 0, 1.5, nan: as the user wrote it, not 0.000000
          e.push_back({key, key + " must be a number " + r.words() + "; got " + got});
        }
        break;
      }
      case FieldKind::Choice:
      case FieldKind::TriState: {
        const std::string& v = *std::get<std::string*>(member);
        if (std::find(f.choices.begin(), f.choices.end(), v) == f.choices.end()) not_a_choice(e, f, v);
        break;
      }
      case FieldKind::Boolean:
      case FieldKind::Text:
      case FieldKind::Enum:
      case FieldKind::TableId: break;
    }
  }
}

// A model program (model.architecture): the program decodes, and the config asks only for what the program path
// models (program_step.cpp): one GPU or data parallelism (DDP, ZeRO 1-3, FSDP1/2), full or every-k checkpointing,
// LoRA on the program's linears, fixed shapes. Every field named here keeps its value; only the combination is refused.
void validate_architecture(const Config& c, std::vector<FieldError>& e) {
  const auto& m = c.model;
  if (m.architecture.empty() && m.is_encoder_decoder && (c.training.precision == "fp16_autocast" || c.training.precision == "bf16_autocast"))
    e.push_back({"training.precision", "training.precision " + c.training.precision + " (16-bit weights under autocast) is not modelled "
                                       "for encoder-decoder models (T5); use bf16_pure, amp_bf16 or amp_fp16"});
  // The recipes whose loop scales the loss with torch's GradScaler (accelerate's fp16, or a loop's own): it unscales
  // fp32 gradients only. fp16 ones raise "Attempting to unscale FP16 gradients" (torch/amp/grad_scaler.py
  // _unscale_grads_), and bf16 ones reach a CUDA kernel with no bf16 case ("_amp_foreach_non_finite_check_and_unscale_cuda"
  // not implemented for 'BFloat16': AmpKernels.cu dispatches floating types and half, pytorch#127176).
  const bool grad_scaler = c.training.precision == "fp16_autocast" || c.training.precision == "amp_fp16";
  if (grad_scaler && c.peft.enabled() && (c.peft.adapter_dtype == "fp16" || c.peft.adapter_dtype == "bf16"))
    e.push_back({"peft.adapter_dtype", "peft.adapter_dtype " + c.peft.adapter_dtype + " under " + c.training.precision + " gives " +
                                       c.peft.adapter_dtype + " gradients, which the GradScaler refuses to unscale (" +
                                       (c.peft.adapter_dtype == "fp16" ? "\"Attempting to unscale FP16 gradients\""
                                                                       : "its CUDA kernel has no bf16 case, pytorch#127176") +
                                       "): use auto or fp32"});
  if (c.training.precision == "fp16_autocast" && !c.peft.enabled())
    e.push_back({"training.precision", "training.precision fp16_autocast trains fp16 weights, whose fp16 gradients the GradScaler "
                                       "refuses to unscale (\"Attempting to unscale FP16 gradients\"); full fine-tuning keeps the trained "
                                       "weights in fp32: use amp_fp16, or a PEFT method (its adapters in fp32)"});
  if (m.architecture.empty()) {
    if (!m.architecture_args.empty())
      e.push_back({"model.architecture_args", "model.architecture_args needs model.architecture (a program); clear it or choose a program"});
    return;
  }
  std::shared_ptr<const Architecture> program;
  for (auto& err : decode_architecture(m.architecture, m.architecture_args, program)) e.push_back({err.field, err.message});
  if (program && program->frozen_forward) {
    e.push_back({"model.architecture", "model.architecture: " + program->name + " is a frozen module's forward (a diffusion model's VAE "
                                       "encoder), which trains nothing; it runs beside the model that names it in frozen_modules"});
    return;
  }
  if (program && program->head.ops.empty()) {  // a tower-only program (its "vision_tower" without a head)
    e.push_back({"model.architecture", "model.architecture: " + program->name + " is a vision tower without a head or loss; "
                                       "use it as model.vision_tower before a decoder"});
    return;
  }
  const auto& t = c.training;
  const auto& p = c.parallel;
  auto refuse = [&](const char* field, const std::string& why) { e.push_back({field, std::string(field) + " " + why}); };
  const char* for_programs = " for a model program (model.architecture)";
  if (p.tensor_parallel_size > 1) refuse("parallel.tensor_parallel_size", std::string("must be 1") + for_programs + ": its ops carry no tensor-parallel split yet");
  if (p.pipeline_parallel_size > 1) refuse("parallel.pipeline_parallel_size", std::string("must be 1") + for_programs + ": its blocks are not split into stages yet");
  if (p.context_parallel_size > 1) refuse("parallel.context_parallel_size", std::string("must be 1") + for_programs);
  if (p.expert_parallel_size > 1) refuse("parallel.expert_parallel_size", std::string("must be 1") + for_programs);
  if (p.sequence_parallel) refuse("parallel.sequence_parallel", std::string("must be off") + for_programs);
  if (p.sharding == "megatron") refuse("parallel.sharding", std::string("must be auto, deepspeed, fsdp1 or fsdp2") + for_programs);
  if (t.precision.rfind("fp8", 0) == 0) refuse("training.precision", std::string("must not be an fp8 recipe") + for_programs + ": use fp32, amp_bf16, amp_fp16, bf16_mixed or bf16_pure");
  if (t.activation_checkpointing != "none" && t.activation_checkpointing != "full" && t.activation_checkpointing != "every_k")
    refuse("training.activation_checkpointing", std::string("must be none, full or every_k") + for_programs + " (a checkpoint wraps each block)");
  if (t.activation_offload) refuse("training.activation_offload", std::string("is not modelled") + for_programs);
  if (t.framework == "unsloth" || t.framework == "megatron")
    refuse("training.framework", std::string("must be hf_trainer, hf_loop, deepspeed, torchtune or litgpt") + for_programs + " (the program says what the model does)");
  if (t.attention != "auto" && t.attention != "eager" && t.attention != "sdpa")
    refuse("training.attention", std::string("must be auto, sdpa or eager") + for_programs);
  if (t.compile) refuse("training.compile", std::string("must be off") + for_programs + ": what compiled blocks save is modelled for the built-in layers only");
  if (c.peft.enabled() && c.peft.kind() != PeftMethod::Lora) refuse("peft.method", std::string("must be none or lora") + for_programs);
  if (c.peft.enabled() && c.peft.packed_int4())
    refuse("peft.base_quantization", std::string("must be none, int8, nf4 or fp4 (bitsandbytes)") + for_programs + ": GPTQ and AWQ bases are modelled for the built-in decoders");
  if (c.data.varies()) refuse("data.lengths", std::string("must be fixed") + for_programs + ": its inputs have the shapes the program declares");
  if (m.tie_word_embeddings)
    refuse("model.tie_word_embeddings", std::string("must be false") + for_programs + ": a program ties its own weights (an embedding op's \"tied\")");
  // A program's tokens are its inputs' shapes: a language model written as a program says them in its arguments.
  if (program && t.sequence_length != Config{}.training.sequence_length)
    for (const auto& [name, value] : program->defaults)
      if (name == "sequence_length")
        refuse("training.sequence_length", std::string("is the built-in families'") + for_programs + ": set this program's " +
                                               "tokens per sample with model.architecture_args sequence_length (now " +
                                               std::to_string(static_cast<int64_t>(architecture_value(*program, "sequence_length"))) + ")");
  if (program && !program->tied_head.empty()) {
    if (p.fsdp_shard_embeddings)
      refuse("parallel.fsdp_shard_embeddings", std::string("must be off") + for_programs + " whose embedding is tied to its head (" +
                                                   program->tied_head + "): the shared weight is one FSDP unit's");
    // PEFT's ModulesToSaveWrapper of a tied module trains an untied copy; the program models the tied pair only.
    for (const auto& item : list_items(c.peft.modules_to_save))
      for (const ArchStage* st : program->stages())
        for (const auto& op : st->ops)
          if ((op.kind == OpKind::Embedding && op.tied && (item == op.module || item == op.name)) ||
              (op.name == program->tied_head && (item == op.module || item == op.name)))
            refuse("peft.modules_to_save", "names \"" + item + "\", which is tied to " + (op.kind == OpKind::Embedding ? program->tied_head : std::string("the embedding")) +
                                               " in this program: an untied trainable copy is not modelled; leave it out");
  }
}

// training.ema: diffusers' EMAModel keeps a whole copy on each process; memsim models it where each GPU holds whole
// parameters (one GPU, DDP, ZeRO without data parallelism).
void validate_ema(const Config& c, std::vector<FieldError>& e) {
  if (c.training.ema == "none") return;
  const auto& p = c.parallel;
  const bool sharded = p.tensor_parallel_size > 1 || p.pipeline_parallel_size > 1 || p.context_parallel_size > 1 ||
                       p.expert_parallel_size > 1 || (p.data_parallel_size > 1 && (p.zero_stage >= 1 || p.sharding == "fsdp1" || p.sharding == "fsdp2"));
  if (sharded)
    e.push_back({"training.ema", "training.ema " + c.training.ema + " is modelled where each GPU holds whole parameters (one GPU or DDP: "
                                 "parallel.zero_stage 0, no tensor, pipeline, context or expert parallelism); set it to none"});
}

// A vision-language model (model.vision_tower, vision_step.cpp): a CLIP tower program before a built-in decoder, with
// the layouts and loops the tower's splice is modelled in. Each refusal names its field; every value is kept.
void validate_vision(const Config& c, std::vector<FieldError>& e) {
  const auto& m = c.model;
  if (m.vision_tower.empty()) {
    if (!m.vision_tower_args.empty())
      e.push_back({"model.vision_tower_args", "model.vision_tower_args needs model.vision_tower (a tower program); clear it or choose clip_vision"});
    if (c.training.vit_gradient_checkpointing != "auto")
      e.push_back({"training.vit_gradient_checkpointing", "training.vit_gradient_checkpointing needs model.vision_tower; set it to auto"});
    return;
  }
  // A native-resolution tower's image sizes and pixel budgets are whole positive numbers of pixels: one line for the
  // argument, rather than the dims that cannot be computed from it.
  std::shared_ptr<const Architecture> plain;
  decode_architecture(m.vision_tower, "", plain);
  bool bad_size = false;
  if (plain)
    for (const auto& [name, fallback] : plain->defaults) {
      if (name != "image_height" && name != "image_width" && name != "min_pixels" && name != "max_pixels") continue;
      const double v = architecture_arg(m.vision_tower_args, name, fallback);
      if (v >= 1 && v == std::floor(v) && v < 1e12) continue;  // (1e12: beyond any image, and exact in a double)
      if (v == 0 && fallback == 0) continue;  // a CLIP tower's 0: its image_size (clip_vision.json, LLaVA-NeXT's anyres)
      char got[32];
      std::snprintf(got, sizeof got, "%g", v);
      e.push_back({"model.vision_tower_args", "model.vision_tower_args: " + name + " must be a whole number of pixels, 1 or more; got " + got});
      bad_size = true;
    }
  // LLaVA-NeXT's anyres (clip_vision.json): on or off.
  if (plain && std::any_of(plain->defaults.begin(), plain->defaults.end(), [](const auto& d) { return d.first == "anyres"; })) {
    const double anyres = architecture_arg(m.vision_tower_args, "anyres", 0);
    if (anyres != 0 && anyres != 1) {
      char got[32];
      std::snprintf(got, sizeof got, "%g", anyres);
      e.push_back({"model.vision_tower_args", std::string("model.vision_tower_args: anyres must be 0 (LLaVA-1.5: one view per "
                                                          "image) or 1 (LLaVA-NeXT's tiles); got ") + got});
      bad_size = true;
    }
  }
  if (bad_size) return;
  std::shared_ptr<const Architecture> tower;
  for (auto err : decode_architecture(m.vision_tower, m.vision_tower_args, tower)) {
    // The decoder names the program's own fields; here the program is the tower.
    const bool args = err.field == "model.architecture_args";
    const std::string field = args ? "model.vision_tower_args" : "model.vision_tower";
    std::string msg = err.message;
    // (the _args name first: after it, every "model.architecture" left is the program's own)
    for (auto [from, to] : {std::pair<std::string, std::string>{"model.architecture_args", "model.vision_tower_args"},
                            {"model.architecture", "model.vision_tower"}})
      for (size_t at = msg.find(from); at != std::string::npos; at = msg.find(from, at + to.size())) msg.replace(at, from.size(), to);
    e.push_back({field, msg});
  }
  if (!tower) return;
  // (A tower's blocks and head receive only what the stage before passes on: vision_step.cpp gives them no inputs.)
  bool reads_inputs = false;
  for (const ArchStage* st : tower->stages())
    if (st != &tower->embeddings)
      for (size_t t = 0; t < st->tensors.size(); ++t)
        reads_inputs |= st->tensors[t].producer < 0 && static_cast<int32_t>(t) != st->input && !st->tensors[t].is_parameter;
  if (!tower->carries.empty() || tower->label_bytes == 0 || !tower->frozen_modules.empty() || reads_inputs) {
    e.push_back({"model.vision_tower", "model.vision_tower: a tower's program passes one tensor from stage to stage, reads its inputs "
                                           "in its embeddings only, ends in no loss and has no frozen modules of its own; " + tower->name +
                                           " carries tensors between stages, reads an input after its embeddings, has an mse_loss head or "
                                           "frozen modules"});
    return;
  }
  const auto& types = tower->model_types;
  if (!tower->tower.declared && std::find(types.begin(), types.end(), "clip_vision_model") == types.end()) {
    e.push_back({"model.vision_tower", "model.vision_tower must be a vision tower program: clip_vision (LLaVA-1.5's), "
                                       "qwen2_vl_vision, qwen2_5_vl_vision, or one that declares \"vision_tower\"; got " + tower->name +
                                       " (SigLIP towers are not modelled yet)"});
    return;
  }
  // The merger maps to the decoder's width whatever the tower's default says; a width the arguments state must agree.
  const TowerSpec& spec = tower->tower;
  if (spec.projector == TowerSpec::Projector::PatchMerger && !spec.out_width_name.empty() &&
      architecture_arg(m.vision_tower_args, spec.out_width_name, -1) >= 0 && spec.out_width != m.hidden_size)
    e.push_back({"model.vision_tower_args", "model.vision_tower_args: " + spec.out_width_name + " (the merger's output width, " +
                                            std::to_string(spec.out_width) + ") must be the language model's model.hidden_size, " +
                                            std::to_string(m.hidden_size) + "; leave it out to follow model.hidden_size"});
  // The transformers release that added the model (Qwen2-VL in 4.45, Qwen2.5-VL in 4.49): an older one cannot run it.
  const StackVersions versions = stack_versions(c.versions);
  for (auto [name, since] : {std::pair<const char*, Version>{"qwen2_vl_vision", Version{4, 45, 0}}, {"qwen2_5_vl_vision", Version{4, 49, 0}}})
    if (tower->name == name && versions.below(Library::Transformers, since))
      e.push_back({"versions.transformers", "versions.transformers must be at least " + version_text(since) + " for " + name +
                                            " (the release that added the model); got " + describe_version(versions, Library::Transformers)});
  // smart_resize raised for a side under the factor until transformers 4.53, which grows small images instead
  // (image_processing_qwen2_vl.py: "height:{height} or width:{width} must be larger than factor:{factor}").
  if (const double factor = architecture_value(*tower, "factor"); factor > 0) {
    for (const char* side : {"image_height", "image_width"})
      if (architecture_value(*tower, side) < factor && (versions.below(Library::Transformers, Version{4, 53, 0}) || architecture_value(*tower, side) < 1))
        e.push_back({"model.vision_tower_args", std::string("model.vision_tower_args: ") + side + " must be at least " +
                                                std::to_string(static_cast<int64_t>(factor)) + " pixels (the resize factor, below which "
                                                "smart_resize raises before transformers 4.53); got " +
                                                std::to_string(static_cast<int64_t>(architecture_value(*tower, side)))});
    // smart_resize: "absolute aspect ratio must be smaller than 200".
    const double h = architecture_value(*tower, "image_height"), w = architecture_value(*tower, "image_width");
    if (h >= 1 && w >= 1 && std::max(h, w) / std::min(h, w) > 200)
      e.push_back({"model.vision_tower_args", "model.vision_tower_args: image_height and image_width must be within 200:1 of each "
                                              "other, as the processor's smart_resize requires"});
  }
  const auto& t = c.training;
  const auto& p = c.parallel;
  const std::string vlm = " with a vision tower (model.vision_tower)";
  if (!m.architecture.empty() || m.is_encoder_decoder || m.head() != TaskHead::CausalLm || m.post_layernorm)
    e.push_back({"model.vision_tower", "model.vision_tower goes before a built-in decoder language model (causal_lm; not a "
                                       "program, an encoder-decoder or an encoder)"});
  if (t.goal() != Objective::Sft)
    e.push_back({"training.objective", "training.objective must be sft" + vlm + ": preference and RL steps are modelled "
                                       "for text-only models"});
  if (p.tensor_parallel_size > 1 || p.pipeline_parallel_size > 1 || p.context_parallel_size > 1 || p.expert_parallel_size > 1 ||
      p.sequence_parallel)
    e.push_back({"parallel.tensor_parallel_size", "parallel: tensor, pipeline, context and expert parallel sizes must be 1 "
                                                  "and sequence_parallel off" + vlm + " (data parallelism, ZeRO and FSDP are modelled)"});
  if (t.framework != "hf_trainer" && t.framework != "hf_loop" && t.framework != "deepspeed")
    e.push_back({"training.framework", "training.framework must be hf_trainer, hf_loop or deepspeed" + vlm +
                                       " (transformers' LlavaForConditionalGeneration, as LLaVA, TRL, ms-swift and "
                                       "LLaMA-Factory train it); got " + t.framework});
  if (t.eval_batch_size > 0)
    e.push_back({"training.eval_batch_size", "training.eval_batch_size must be 0" + vlm + ": the evaluation pass does not "
                                             "run the tower yet"});
  if (c.data.varies() && c.data.pad() == Padding::None)
    e.push_back({"data.padding", "data.padding must be longest or max_length" + vlm + ": a padding-free batch (one "
                                 "flattened row) is not modelled with images"});
  if (t.train_vision_tower && c.peft.enabled())
    e.push_back({"training.train_vision_tower", "training.train_vision_tower is modelled for full fine-tuning (peft.method "
                                                "none): a tower trained beside adapters is not"});
  const int64_t image_tokens = vision_image_tokens(m);
  const int64_t needed = image_tokens > 0 && c.data.images_per_sample > 0 ? image_tokens * c.data.images_per_sample : 0;
  const std::string need = std::to_string(needed) + " (" + std::to_string(c.data.images_per_sample) + " x " +
                           std::to_string(image_tokens) + ")";
  if (needed > 0 && t.sequence_length <= needed)
    e.push_back({"training.sequence_length", "training.sequence_length counts the image tokens" + vlm + ": it must be above " +
                                             need + "; got " + std::to_string(t.sequence_length)});
  // Every sample holds its images' tokens: a listed micro-batch or a sample shorter than that cannot be.
  if (needed > 0 && c.data.source() == LengthsSource::MicroBatches) {
    std::vector<int64_t> lengths;
    if (parse_micro_batch_lengths(c.data.micro_batch_lengths, lengths).empty())
      for (int64_t n : lengths)
        if (n <= needed) {
          e.push_back({"data.micro_batch_lengths", "data.micro_batch_lengths count the image tokens" + vlm +
                                                   ": each must be above " + need + "; got " + std::to_string(n)});
          break;
        }
  }
  if (needed > 0 && c.data.source() == LengthsSource::Samples) {
    LengthDistribution d;
    if (parse_sample_lengths(c.data.sample_lengths, t.sequence_length, d).empty() && !d.points.empty() &&
        d.points.front().second <= static_cast<double>(needed))
      e.push_back({"data.sample_lengths", "data.sample_lengths count the image tokens" + vlm + ": the shortest sample (p0) "
                                          "must be above " + need + "; give p0"});
  }
}

// An evaluation pass (eval_step.cpp) runs the decoder's own no-grad forward and loss on one device's whole model.
void validate_evaluation(const Config& c, std::vector<FieldError>& e) {
  const auto& t = c.training;
  if (t.eval_batch_size > 0) {
    std::string why;
    if (c.model.is_encoder_decoder || !c.model.architecture.empty()) why = "decoder language models";
    else if (t.goal() != Objective::Sft) why = "training.objective sft";
    else if (c.parallel.pipeline_parallel_size > 1 || c.parallel.context_parallel_size > 1)
      why = "parallel.pipeline_parallel_size and parallel.context_parallel_size 1";
    if (!why.empty())
      e.push_back({"training.eval_batch_size", "training.eval_batch_size is modelled for " + why + "; set 0"});
  }
  if (t.eval_logits_batches > 0 && t.eval_batch_size == 0)
    e.push_back({"training.eval_logits_batches", "training.eval_logits_batches needs an evaluation: set "
                                                 "training.eval_batch_size above 0, or this to 0"});
  if (t.eval_logits_batches > 0 && t.framework != "hf_trainer" && t.framework != "unsloth")
    e.push_back({"training.eval_logits_batches", "training.eval_logits_batches is the HF Trainer's evaluation loop "
                                                 "(training.framework hf_trainer or unsloth); with " + t.framework + " set 0"});
}

std::vector<FieldError> validate(const Config& c) {
  std::vector<FieldError> e;
  check_registered(c, e);
  validate_preference(c, e);
  const auto& m = c.model;
  if (m.num_experts > 0 && (m.num_experts_per_tok < 1 || m.num_experts_per_tok > m.num_experts))
    e.push_back({"model.num_experts_per_tok", "model.num_experts_per_tok (top-k) must be from 1 to model.num_experts (" +
                                                  std::to_string(m.num_experts) + "); got " + std::to_string(m.num_experts_per_tok)});
  if (m.num_experts == 0 && m.num_experts_per_tok > 0)
    e.push_back({"model.num_experts", "model.num_experts must be set (above 0) when model.num_experts_per_tok is"});
  if (m.num_experts > 0 && m.first_k_dense_replace > m.num_hidden_layers)
    e.push_back({"model.first_k_dense_replace", "model.first_k_dense_replace must be at most model.num_hidden_layers"});
  if (m.moe_capacity_factor > 0.0 && m.moe_capacity_factor < 1.0)  // the registry bounds it to [0, 64]
    e.push_back({"model.moe_capacity_factor", "model.moe_capacity_factor must be 0 (dropless) or from 1 to 64; got " +
                                                  std::to_string(m.moe_capacity_factor)});
  if (m.kv_lora_rank > 0 && (m.qk_nope_head_dim <= 0 || m.qk_rope_head_dim <= 0 || m.v_head_dim <= 0))
    e.push_back({"model.kv_lora_rank", "multi-head latent attention (model.kv_lora_rank > 0) needs model.qk_nope_head_dim, "
                                        "model.qk_rope_head_dim and model.v_head_dim above 0"});
  if (m.num_attention_heads > 0 && m.num_key_value_heads > 0 && m.num_attention_heads % m.num_key_value_heads != 0)
    e.push_back({"model.num_key_value_heads",
                 "model.num_key_value_heads must divide model.num_attention_heads (" +
                     std::to_string(m.num_attention_heads) + "); got " + std::to_string(m.num_key_value_heads)});
  if (m.num_key_value_heads > m.num_attention_heads && m.num_attention_heads > 0)
    e.push_back({"model.num_key_value_heads", "model.num_key_value_heads must be at most model.num_attention_heads"});
  // Without an explicit head_dim, HF derives it as hidden_size / num_attention_heads, which must divide.
  if (m.head_dim == 0 && m.num_attention_heads > 0 && m.hidden_size % m.num_attention_heads != 0)
    e.push_back({"model.num_attention_heads",
                 "model.num_attention_heads must divide model.hidden_size (" + std::to_string(m.hidden_size) +
                     ") unless model.head_dim is set; got " + std::to_string(m.num_attention_heads)});

  const auto& t = c.training;
  if (m.position_embedding_type == PositionType::Absolute && t.sequence_length > m.max_position_embeddings)
    e.push_back({"training.sequence_length", "training.sequence_length must be at most model.max_position_embeddings (" +
                                                 std::to_string(m.max_position_embeddings) +
                                                 ") for learned absolute positions; got " +
                                                 std::to_string(t.sequence_length)});
  if (!find_precision(t.precision))
    e.push_back({"training.precision", "training.precision must be one of: " + ids_of(precision_recipes()) +
                                           "; got \"" + t.precision + "\""});
  if (!find_optimizer(t.optimizer))
    e.push_back({"training.optimizer",
                 "training.optimizer must be one of: " + ids_of(optimizers()) + "; got \"" + t.optimizer + "\""});

  validate_versions(c.versions, e);

  // A pipeline stage that receives activations keeps one input-gradient buffer per micro-batch of the step that the
  // replay leaves out (train_step.cpp step()), so its events grow with stages x micro-batches; 65,536 keeps every
  // layout under about 2 s natively (a 64-stage interleaved pipeline of 1,024 micro-batches takes about 1.5 s).
  // Published pipelines run tens to a few thousand micro-batches per step.
  constexpr int64_t kMaxPipelineMicroBatches = 65536;
  if (c.parallel.pipeline_parallel_size > 1 && t.gradient_accumulation_steps > 0 &&
      c.parallel.pipeline_parallel_size > kMaxPipelineMicroBatches / t.gradient_accumulation_steps)
    e.push_back({"training.gradient_accumulation_steps",
                 "training.gradient_accumulation_steps x parallel.pipeline_parallel_size must be at most 65,536 (" +
                     std::to_string(kMaxPipelineMicroBatches / c.parallel.pipeline_parallel_size) + " micro-batches with " +
                     std::to_string(c.parallel.pipeline_parallel_size) +
                     " stages): memsim replays every micro-batch's receive buffers per stage"});
  if (t.optimizer_in_backward && t.gradient_accumulation_steps != 1)
    e.push_back({"training.optimizer_in_backward",
                 "training.optimizer_in_backward needs training.gradient_accumulation_steps = 1: the step runs as "
                 "soon as each gradient is ready, so gradients cannot accumulate"});
  if (t.optimizer_in_backward && c.parallel.zero_stage != 0)
    e.push_back({"training.optimizer_in_backward",
                 "training.optimizer_in_backward needs parallel.zero_stage = 0 (ZeRO steps the optimizer itself)"});

  validate_peft(c, e);
  validate_encoder_decoder(c, e);
  validate_architecture(c, e);
  validate_vision(c, e);
  validate_ema(c, e);
  validate_unsloth(c, e);
  validate_attention(c, e);
  validate_evaluation(c, e);

  // A GPU count the layout does not divide (gpu_count.h): reported on its own field, the layout kept as it was.
  if (auto gpus = gpu_count_error(c.parallel)) e.push_back(*gpus);
  validate_layout(c, e);

  const auto& hw = c.hardware;
  if (!find_gpu(hw.gpu) && hw.gpu != "custom")
    e.push_back({"hardware.gpu", "hardware.gpu must be \"custom\" or one of: " + ids_of(gpus()) + "; got \"" + hw.gpu + "\""});
  if (hw.gpu == "custom" && hw.gpu_memory_bytes <= 0)
    e.push_back({"hardware.gpu_memory_bytes", "hardware.gpu_memory_bytes must be set (above 0) for a custom GPU"});
  if (e.empty()) validate_data(c, e);  // the run's bound uses the model's layers, valid by now
  return e;
}

}  // namespace memsim
