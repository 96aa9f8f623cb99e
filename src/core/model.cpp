#include "model.h"

#include <algorithm>

#include "architecture.h"
#include "checked.h"

namespace memsim {

int64_t sum_numel(const std::vector<ParamTensor>& tensors) {
  int64_t n = 0;
  for (const auto& t : tensors) n = add(n, t.numel);
  return n;
}

int64_t matmul_numel(const std::vector<ParamTensor>& tensors) {
  int64_t n = 0;
  for (const auto& t : tensors)
    if (t.kind == ParamKind::Matmul) n = add(n, t.numel);
  return n;
}

namespace {

void norm(std::vector<ParamTensor>& out, const std::string& name, int64_t width, NormType type) {
  // RMSNorm has a scale only; LayerNorm a scale and a shift. Megatron theoretical_memory_usage.py:
  // norm_size = 1 if RMSNorm else 2.
  out.push_back({name + ".weight", width, ParamKind::Norm, width});
  if (type == NormType::LayerNorm) out.push_back({name + ".bias", width, ParamKind::Norm, width});
}

void linear(std::vector<ParamTensor>& out, const std::string& name, int64_t in, int64_t outw, bool bias) {
  out.push_back({name + ".weight", mul(in, outw), ParamKind::Matmul, outw});  // nn.Linear weight: [out, in]
  if (bias) out.push_back({name + ".bias", outw, ParamKind::Bias, outw});
}

// params_per_layer / params_total after the layer lists changed (PEFT adapters, a tensor-parallel rank's share).
void recount(ModelShape& s) {
  s.params_per_layer = sum_numel(s.layer);
  s.params_per_moe_layer = sum_numel(s.moe_layer);
  int64_t total = add(sum_numel(s.pre), sum_numel(s.post));
  s.for_each_layer_kind([&](const std::vector<ParamTensor>& ts, int64_t n) { total = add(total, mul(sum_numel(ts), n)); });
  s.params_total = total;
}

// T5ForConditionalGeneration (transformers modeling_t5.py): `shared` Embedding(vocab, d_model) feeds both stacks;
// each T5Block has T5LayerSelfAttention (layer_norm, q/k/v/o of d_model x heads*d_kv, no biases), in the decoder
// T5LayerCrossAttention (the same four projections, k and v reading the encoder output), and T5LayerFF
// (T5DenseActDense wi/wo, or T5DenseGatedActDense wi_0/wi_1/wo). Only block 0 of each stack has
// has_relative_attention_bias: Embedding(relative_attention_num_buckets, heads). Each stack ends in a
// final_layer_norm; lm_head (d_model -> vocab, no bias) is the shared matrix itself when tie_word_embeddings.
ModelShape build_encoder_decoder_shape(const ModelConfig& m) {
  ModelShape s;
  const int64_t h = m.hidden_size;
  const int64_t inner = mul(m.num_attention_heads, effective_head_dim(m));
  s.pre.push_back({"shared.weight", mul(m.vocab_size, h), ParamKind::Embedding, m.vocab_size});
  auto attention = [&](std::vector<ParamTensor>& L, const std::string& p) {
    norm(L, p + ".layer_norm", h, m.norm_type);
    for (const char* w : {"q", "k", "v"}) linear(L, p + "." + w, h, inner, m.attention_bias);
    linear(L, p + ".o", inner, h, m.attention_bias);
  };
  auto ff = [&](std::vector<ParamTensor>& L, const std::string& p) {
    norm(L, p + ".layer_norm", h, m.norm_type);
    if (m.mlp_gated) {
      linear(L, p + ".DenseReluDense.wi_0", h, m.intermediate_size, m.mlp_bias);
      linear(L, p + ".DenseReluDense.wi_1", h, m.intermediate_size, m.mlp_bias);
    } else {
      linear(L, p + ".DenseReluDense.wi", h, m.intermediate_size, m.mlp_bias);
    }
    linear(L, p + ".DenseReluDense.wo", m.intermediate_size, h, m.mlp_bias);
  };
  auto bias = [&](std::vector<ParamTensor>& L, const std::string& stack) {
    const int64_t n = mul(m.relative_attention_num_buckets, m.num_attention_heads);
    L.push_back({stack + ".block.0.layer.0.SelfAttention.relative_attention_bias.weight", n, ParamKind::Embedding,
                 m.relative_attention_num_buckets});
  };
  attention(s.layer, "encoder.layer.0.SelfAttention");
  ff(s.layer, "encoder.layer.1");
  attention(s.decoder_layer, "decoder.layer.0.SelfAttention");
  attention(s.decoder_layer, "decoder.layer.1.EncDecAttention");
  ff(s.decoder_layer, "decoder.layer.2");
  s.first_encoder_layer = s.layer;
  bias(s.first_encoder_layer, "encoder");
  s.first_decoder_layer = s.decoder_layer;
  bias(s.first_decoder_layer, "decoder");
  s.num_encoder_layers = m.num_hidden_layers;
  s.num_layers = add(m.num_hidden_layers, decoder_layers(m));
  s.num_dense_layers = s.num_layers;
  norm(s.post, "encoder.final_layer_norm", h, m.norm_type);
  norm(s.post, "decoder.final_layer_norm", h, m.norm_type);
  if (!m.tie_word_embeddings) s.post.push_back({"lm_head.weight", mul(m.vocab_size, h), ParamKind::Matmul, m.vocab_size});
  recount(s);
  s.params_active_per_token = s.params_total;
  return s;
}

}  // namespace

// Shapes follow HF modeling_llama.py (LlamaAttention, LlamaMLP, LlamaDecoderLayer) and modeling_gpt2.py;
// the totals equal Megatron's compute_weight_and_optimizer_memory formulas plus the biases and router
// weights Megatron leaves out (MEMORY_FORMULAS.md 1.1).
ModelShape build_model_shape(const ModelConfig& m) {
  if (m.is_encoder_decoder) return build_encoder_decoder_shape(m);
  ModelShape s;
  const int64_t h = m.hidden_size;
  const int64_t d = effective_head_dim(m);
  const int64_t q_width = mul(m.num_attention_heads, d);
  const int64_t kv_width = mul(m.num_key_value_heads, d);
  const bool qkv_b = m.attention_bias || m.qkv_bias;

  s.pre.push_back({"embed_tokens.weight", mul(m.vocab_size, h), ParamKind::Embedding, m.vocab_size});
  if (m.position_embedding_type == PositionType::Absolute)
    s.pre.push_back({"embed_positions.weight", mul(m.max_position_embeddings, h), ParamKind::Embedding,
                     m.max_position_embeddings});
  if (m.type_vocab_size > 0)  // BertEmbeddings.token_type_embeddings
    s.pre.push_back({"token_type_embeddings.weight", mul(m.type_vocab_size, h), ParamKind::Embedding, m.type_vocab_size});
  if (m.post_layernorm) norm(s.pre, "embeddings.LayerNorm", h, m.norm_type);  // BertEmbeddings.LayerNorm

  // Attention and the norms around it, shared by dense and MoE layers.
  std::vector<ParamTensor> attn;
  norm(attn, "input_layernorm", h, m.norm_type);
  if (m.kv_lora_rank > 0) {
    // Multi-head latent attention, HF DeepseekV3Attention; equals Megatron's MLA term (MEMORY_FORMULAS.md 1.1).
    const int64_t qk = add(m.qk_nope_head_dim, m.qk_rope_head_dim);
    if (m.q_lora_rank > 0) {
      linear(attn, "self_attn.q_a_proj", h, m.q_lora_rank, false);
      norm(attn, "self_attn.q_a_layernorm", m.q_lora_rank, NormType::RMSNorm);
      linear(attn, "self_attn.q_b_proj", m.q_lora_rank, mul(m.num_attention_heads, qk), false);
    } else {
      linear(attn, "self_attn.q_proj", h, mul(m.num_attention_heads, qk), false);
    }
    linear(attn, "self_attn.kv_a_proj_with_mqa", h, add(m.kv_lora_rank, m.qk_rope_head_dim), false);
    norm(attn, "self_attn.kv_a_layernorm", m.kv_lora_rank, NormType::RMSNorm);
    linear(attn, "self_attn.kv_b_proj", m.kv_lora_rank, mul(m.num_attention_heads, add(m.qk_nope_head_dim, m.v_head_dim)), false);
    linear(attn, "self_attn.o_proj", mul(m.num_attention_heads, m.v_head_dim), h, m.attention_bias);
  } else {
    linear(attn, "self_attn.q_proj", h, q_width, qkv_b);
    linear(attn, "self_attn.k_proj", h, kv_width, qkv_b);
    linear(attn, "self_attn.v_proj", h, kv_width, qkv_b);
    if (m.qk_norm) {  // Qwen3Attention: RMSNorm(head_dim) shared by the heads; Olmo2Attention: over q and k widths
      norm(attn, "self_attn.q_norm", m.qk_norm_per_head ? d : q_width, NormType::RMSNorm);
      norm(attn, "self_attn.k_norm", m.qk_norm_per_head ? d : kv_width, NormType::RMSNorm);
    }
    linear(attn, "self_attn.o_proj", q_width, h, m.attention_bias);
  }
  if (m.norms_per_layer >= 2) norm(attn, "post_attention_layernorm", h, m.norm_type);  // none with parallel attention
  // Gemma 2/3 add pre_feedforward_layernorm and post_feedforward_layernorm (modeling_gemma2.py).
  for (int64_t i = 2; i < m.norms_per_layer; ++i) norm(attn, "extra_layernorm_" + std::to_string(i), h, m.norm_type);

  auto mlp = [&](std::vector<ParamTensor>& L, const std::string& prefix, int64_t f) {
    if (m.mlp_gated) linear(L, prefix + ".gate_proj", h, f, m.mlp_bias);
    linear(L, prefix + ".up_proj", h, f, m.mlp_bias);
    linear(L, prefix + ".down_proj", f, h, m.mlp_bias);
  };
  s.layer = attn;
  mlp(s.layer, "mlp", m.intermediate_size);
  s.num_layers = m.num_hidden_layers;
  s.num_dense_layers = m.num_hidden_layers;
  s.num_attention_heads = m.num_attention_heads;
  const int64_t fe = m.expert_width();
  const int64_t per_expert = m.mlp_gated ? mul(3, h, fe) : mul(2, h, fe);
  if (m.num_experts > 0) {
    // Experts as the grouped 3-D parameters of current transformers (gate_up_proj [E, 2f, h], down_proj
    // [E, h, f]); the count equals E separate expert MLPs. Router: gate [E, h] (+ DeepSeek's score bias).
    const int64_t e = m.num_experts;
    s.moe_layer = attn;
    s.moe_layer.push_back({"mlp.gate.weight", mul(e, h), ParamKind::Matmul, e});
    // DeepSeek's router (MoEGate in its remote code, DeepseekV3TopkRouter in transformers) holds a bare parameter
    // and casts it to fp32 itself: no nn.Linear that PEFT could wrap or autocast cache.
    if (m.kv_lora_rank > 0) s.moe_layer.back().fused = true;
    if (m.router_bias) s.moe_layer.push_back({"mlp.gate.e_score_correction_bias", e, ParamKind::Bias, e});
    s.moe_layer.push_back({"mlp.experts.gate_up_proj", mul(e, sub(per_expert, mul(h, fe))), ParamKind::Matmul, e});
    s.moe_layer.push_back({"mlp.experts.down_proj", mul(e, h, fe), ParamKind::Matmul, e});
    if (m.shared_expert_intermediate_size > 0) mlp(s.moe_layer, "mlp.shared_experts", m.shared_expert_intermediate_size);
    s.num_dense_layers = std::min(m.first_k_dense_replace, m.num_hidden_layers);
  }

  if (!m.post_layernorm) norm(s.post, "norm", h, m.norm_type);  // post-LN layers end normalised already
  if (m.head() == TaskHead::SequenceClassification) {
    // BertForSequenceClassification: BertPooler (dense h x h + tanh on the first token) and the classifier.
    if (m.post_layernorm) linear(s.post, "pooler.dense", h, h, true);
    linear(s.post, "classifier", h, m.num_labels, true);
  } else if (!m.tie_word_embeddings) {
    s.post.push_back({"lm_head.weight", mul(m.vocab_size, h), ParamKind::Matmul, m.vocab_size});
  }
  if (m.lm_head_bias && m.head() != TaskHead::SequenceClassification)
    s.post.push_back({"lm_head.bias", m.vocab_size, ParamKind::Bias, m.vocab_size});

  s.params_per_layer = sum_numel(s.layer);
  s.params_per_moe_layer = sum_numel(s.moe_layer);
  const int64_t moe_layers = s.num_layers - s.num_dense_layers;
  const int64_t ends = add(sum_numel(s.pre), sum_numel(s.post));
  s.params_total = add(add(ends, mul(s.params_per_layer, s.num_dense_layers)), mul(s.params_per_moe_layer, moe_layers));
  // A token passes through top-k of the routed experts of each MoE layer.
  s.params_active_per_token = sub(s.params_total, mul(moe_layers, per_expert, m.num_experts - m.num_experts_per_tok));
  return s;
}

// Megatron's tensor parallelism (core/tensor_parallel/layers.py): column-parallel linears (q, k, v, gate, up)
// split their outputs and biases, row-parallel ones (o, down) their inputs; the embedding and the output head
// split the vocabulary (VocabParallelEmbedding); norms and row-parallel biases are replicated. KV heads fewer
// than t are replicated, so each rank holds at least one.
void apply_tensor_parallel(ModelShape& s, const ModelConfig& m, int64_t t) {
  if (t <= 1) return;
  const int64_t d = effective_head_dim(m);
  // LoRA on a parallel linear (Megatron-Core / NeMo LoRA, ParallelLinearAdapter): on a column-parallel base
  // lora_B splits its outputs and lora_A stays whole; on a row-parallel base lora_A splits its inputs and lora_B
  // stays whole. DoRA's magnitude follows the base's outputs.
  auto split_adapter = [&](ParamTensor& p) {
    const std::string n = p.name;
    const auto cut = n.find(".lora_");
    if (cut == std::string::npos) return;
    const std::string base = module_name(n.substr(0, cut));
    const std::string kind = n.substr(cut + 1);
    const bool column = base == "q_proj" || base == "k_proj" || base == "v_proj" || base == "gate_proj" || base == "up_proj";
    const bool row = base == "o_proj" || base == "down_proj";
    if ((column && (kind.rfind("lora_B", 0) == 0 || kind.rfind("lora_magnitude", 0) == 0)) ||
        (row && kind.rfind("lora_A", 0) == 0)) {
      p.numel = ceil_div(p.numel, t);
      if (column) p.rows = ceil_div(p.rows, t);
    }
  };
  auto split = [&](std::vector<ParamTensor>& ts) {
    for (auto& p : ts) {
      if (p.kind == ParamKind::Adapter) {
        split_adapter(p);
        continue;
      }
      const std::string mod = module_name(p.name);
      const bool bias = p.kind == ParamKind::Bias;
      const bool kv = mod == "k_proj" || mod == "v_proj";
      if (kv && m.num_key_value_heads < t) {
        const int64_t per_rank = mul(d, 1);
        p.numel = bias ? per_rank : mul(p.numel / p.rows, per_rank);
        p.rows = per_rank;
      } else if (mod == "q_proj" || kv || mod == "gate_proj" || mod == "up_proj" || mod == "q_b_proj" ||
                 mod == "kv_b_proj" || mod == "embed_tokens" || mod == "lm_head") {
        p.numel = ceil_div(p.numel, t);
        p.rows = ceil_div(p.rows, t);
      } else if ((mod == "o_proj" || mod == "down_proj") && !bias) {
        p.numel = ceil_div(p.numel, t);
      }
    }
  };
  split(s.pre);
  split(s.post);
  s.for_each_layer_kind([&](std::vector<ParamTensor>& ts, int64_t) { split(ts); });
  recount(s);
}

void apply_expert_parallel(ModelShape& s, int64_t ep) {
  if (ep <= 1) return;
  for (auto& p : s.moe_layer)
    if (p.name.rfind("mlp.experts.", 0) == 0) p.numel = p.numel / ep, p.rows = std::max<int64_t>(1, p.rows / ep);
  s.params_per_moe_layer = sum_numel(s.moe_layer);
  s.params_total = add(add(add(sum_numel(s.pre), sum_numel(s.post)), mul(s.params_per_layer, s.num_dense_layers)),
                       mul(s.params_per_moe_layer, s.num_layers - s.num_dense_layers));
}

std::string module_name(const std::string& param_name) { return std::string(module_name_view(param_name)); }

std::string_view module_name_view(std::string_view n) {
  for (std::string_view suffix : {".weight", ".bias", ".lambda1"})  // lambda1: Dinov2LayerScale's one parameter
    if (n.size() > suffix.size() && n.ends_with(suffix)) n.remove_suffix(suffix.size());
  auto dot = n.rfind('.');
  // PEFT matches target_modules as a suffix of the module path: an nn.Sequential's member (diffusers' "to_out.0")
  // is named with its parent, as its targets name it.
  const bool index = dot != std::string_view::npos && dot + 1 < n.size() &&
                     std::all_of(n.begin() + static_cast<std::ptrdiff_t>(dot) + 1, n.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (index && dot > 0) dot = n.rfind('.', dot - 1);
  return dot == std::string_view::npos ? n : n.substr(dot + 1);
}

namespace {
// Calls f(item) for each comma-separated item of a list field, trimmed of spaces, empty items skipped, until f
// returns true; returns whether it did. The one reading of a list: list_items copies the items, in_list looks for one
// in place (the shape's PEFT pass asks it for every parameter).
template <class F>
bool any_list_item(std::string_view list, F&& f) {
  while (true) {
    const size_t end = std::min(list.find(','), list.size());
    std::string_view item = list.substr(0, end);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (!item.empty() && f(item)) return true;
    if (end == list.size()) return false;
    list.remove_prefix(end + 1);
  }
}

bool in_list(std::string_view list, std::string_view name) {
  return any_list_item(list, [&](std::string_view item) { return item == name; });
}
}  // namespace

std::vector<std::string> list_items(const std::string& list) {
  std::vector<std::string> items;
  any_list_item(list, [&](std::string_view item) {
    items.emplace_back(item);
    return false;
  });
  return items;
}

// PEFT's target_modules: names, or "all-linear" = every linear layer but the output head
// (peft/tuners/tuners_utils.py::_maybe_include_all_linear_layers). Only LoRA, DoRA and IA3 put something on
// linears; LN tuning's target_modules name norms, and prompt tuning has no target modules.
bool peft_targets(const PeftConfig& peft, const std::string& module) {
  if (!peft.lora_like() && peft.kind() != PeftMethod::Ia3) return false;
  if (peft.target_modules == "all-linear") return module != "lm_head" && module != "embed_tokens";
  if ((module == "q_proj" || module == "k_proj" || module == "v_proj") && targets_fused_qkv(peft)) return true;
  return in_list(peft.target_modules, module);
}

// The names a fused q/k/v linear has in the model families that have one (GPT-2 and Qwen-1 c_attn, Falcon,
// GPT-NeoX and Bloom query_key_value, MPT Wqkv); memsim's own name for it is qkv_proj.
bool targets_fused_qkv(const PeftConfig& peft) {
  if (!peft.lora_like()) return false;
  for (const char* name : {"qkv_proj", "c_attn", "query_key_value", "Wqkv"})
    if (in_list(peft.target_modules, name)) return true;
  return false;
}

// IA3Config.feedforward_modules: targeted modules whose input, not output, the learned vector scales
// (peft/tuners/ia3/model.py: is_feedforward = any(key.endswith(m) for m in feedforward_modules)).
bool ia3_feedforward(const PeftConfig& peft, const std::string& module) {
  return peft.kind() == PeftMethod::Ia3 && peft_targets(peft, module) && in_list(peft.feedforward_modules, module);
}

// LNTuningConfig.target_modules: the norms that get a trainable copy.
bool ln_tuning_targets(const PeftConfig& peft, const std::string& module) {
  return peft.kind() == PeftMethod::LnTuning && in_list(peft.target_modules, module);
}

// PromptTuningConfig: PeftModelForCausalLM.forward concatenates num_virtual_tokens prompt embeddings before the
// input embeddings (torch.cat((prompts, inputs_embeds), dim=1)) and pads the labels with -100 to match, so every
// layer and the loss see sequence_length + num_virtual_tokens positions.
int64_t virtual_tokens(const PeftConfig& peft) {
  return peft.kind() == PeftMethod::PromptTuning ? peft.num_virtual_tokens : 0;
}

int64_t trainable_numel(const ModelShape& s) {
  int64_t n = 0;
  auto count = [&](const std::vector<ParamTensor>& ts, int64_t times) {
    for (const auto& t : ts)
      if (!t.frozen) n = add(n, mul(t.numel, times));
  };
  count(s.pre, 1);
  count(s.post, 1);
  s.for_each_layer_kind([&](const std::vector<ParamTensor>& ts, int64_t k) { count(ts, k); });
  return n;
}

bool projector_trains(const TrainingConfig& t, const PeftConfig& peft) {
  const TriState trains = t.projector_training();
  return trains == TriState::True || (trains == TriState::Auto && !peft.enabled());
}

void apply_vision_training(ModelShape& s, bool projector, bool tower) {
  for (auto& t : s.pre) {
    if (t.part == ParamTensor::Part::Projector) t.frozen = !projector;
    if (t.part == ParamTensor::Part::VisionTower) t.frozen = !tower;
  }
  for (auto* list : {&s.tower_embeddings, &s.tower_block, &s.tower_head})
    for (auto& t : *list) t.frozen = !tower;
}

void mark_unit_gradients(ModelShape& s) {
  auto mark = [](std::vector<std::vector<ParamTensor>*> unit) {
    bool trains = false;
    for (const auto* ts : unit)
      for (const auto& t : *ts) trains |= !t.frozen;
    for (auto* ts : unit)
      for (auto& t : *ts) t.unit_grad = trains && t.frozen && !t.quantized && t.part != ParamTensor::Part::VisionTower;
  };
  mark({&s.pre, &s.post});  // the root unit
  s.for_each_layer_kind([&](std::vector<ParamTensor>& ts, int64_t) { mark({&ts}); });
}

// litgpt's LLaMA-Adapter (lit_gpt/adapter.py at 8641822 and litgpt 0.5's litgpt/adapter.py alike): each layer from
// adapter_start_layer gets adapter_wte = nn.Embedding(adapter_prompt_length, n_embd) and gating_factor
// [1, 1, n_head, 1]; the layers before it get nothing, so the layers come in two kinds. adapter_v2.py also makes
// every linear an AdapterV2Linear (the fused attn, proj, the MLP's fc / fc_1, fc_2, proj, and lm_head), each with an
// adapter_bias and an adapter_scale of out_features, and mark_only_adapter_v2_as_trainable trains what has "norm_1",
// "norm_2" or "ln_f" in its name: memsim's input_layernorm, post_attention_layernorm and norm, weights and biases.
// The published trainable counts check it: Llama 2 7B 1,229,760 (v1) and 4,279,744 (v2), StableLM-Alpha 3B 573,888
// and 2,125,248 (lit-gpt tutorials/resource-tables.md).
//
// PEFT's AdaptionPromptConfig (peft/tuners/adaption_prompt/layer.py AdaptedAttention, at 5d602fd) wraps the attention of
// the top adapter_layers layers: adaption_prompt [1, adapter_len, hidden_size] and adaption_gate [1], in q_proj's dtype.
static void add_llama_adapter(ModelShape& s, const PeftConfig& peft) {
  const bool v2 = peft.kind() == PeftMethod::AdapterV2;
  const bool peft_prompt = peft.kind() == PeftMethod::AdaptionPrompt;
  auto wrap = [&](std::vector<ParamTensor>& ts) {
    if (!v2) return;
    std::vector<ParamTensor> out;
    for (auto t : ts) {
      const std::string mod = module_name(t.name);
      if (t.kind == ParamKind::Norm && (mod == "input_layernorm" || mod == "post_attention_layernorm" || mod == "norm"))
        t.frozen = false;
      out.push_back(t);
      const bool weight = t.name.size() > 7 && t.name.compare(t.name.size() - 7, 7, ".weight") == 0;
      if (t.kind == ParamKind::Matmul && weight && t.part == ParamTensor::Part::Model) {
        const std::string base = t.name.substr(0, t.name.size() - 7);
        out.push_back({base + ".adapter_bias", t.rows, ParamKind::Adapter, t.rows});
        out.push_back({base + ".adapter_scale", t.rows, ParamKind::Adapter, t.rows});
      }
    }
    ts = std::move(out);
  };
  wrap(s.post);
  wrap(s.layer);
  int64_t width = 0;
  for (const auto& t : s.layer)
    if (t.kind == ParamKind::Norm && module_name(t.name) == "input_layernorm") width = t.rows;
  std::vector<ParamTensor> adapted = s.layer;
  if (peft_prompt) {
    adapted.push_back({"self_attn.adaption_prompt", mul(peft.adapter_prompt_length, width), ParamKind::Adapter,
                       peft.adapter_prompt_length});
    adapted.push_back({"self_attn.adaption_gate", 1, ParamKind::Adapter, 1});
  } else {
    adapted.push_back({"self_attn.adapter_wte.weight", mul(peft.adapter_prompt_length, width), ParamKind::Adapter,
                       peft.adapter_prompt_length});
    adapted.push_back({"self_attn.gating_factor", s.num_attention_heads, ParamKind::Adapter, s.num_attention_heads});
  }
  s.block_kinds = {s.layer, adapted};
  s.kind_of_layer.assign(static_cast<size_t>(s.num_layers), 0);
  for (int64_t l = std::max<int64_t>(peft.adapter_start_layer, 0); l < s.num_layers; ++l) s.kind_of_layer[static_cast<size_t>(l)] = 1;
}

// replace_with_bnb_linear's test (diffusers quantizers/bitsandbytes/utils.py, transformers integrations/
// bitsandbytes.py): `(key + "." in current_key_name_str) or (key == current_key_name_str)`, the module's path.
static bool program_keeps_unquantized(const Architecture& a, const std::string& weight) {
  const size_t dot = weight.rfind('.');
  const std::string path = dot == std::string::npos ? weight : weight.substr(0, dot);
  for (const auto& key : a.not_quantized)
    if (path == key || path.find(key + ".") != std::string::npos) return true;
  return false;
}

// transformers 4's MoE blocks keep each routed expert's projections as nn.Linear modules of its own
// (modeling_mixtral.py MixtralBlockSparseTop2MLP w1, w3, w2; modeling_qwen2_moe.py and modeling_qwen3_moe.py
// experts[i].gate_proj, up_proj, down_proj), which PEFT matches by suffix like any linear, all-linear included: one
// lora_A / lora_B pair (and DoRA's magnitude) per expert and projection, the same as a dense MLP's at the expert's
// width, times the experts. memsim keeps the experts as [experts, ...] stacks (model.cpp build_shape), so their
// adapters are stacks too, named mlp.experts.<projection>.lora_A.weight. (transformers 5's 3-D experts are
// `fused`, and get none; IA3 is modelled on the dense linears only.)
static void adapt_experts(std::vector<ParamTensor>& out, const ParamTensor& stack, const std::vector<ParamTensor>& layer,
                          const PeftConfig& peft) {
  const int64_t experts = stack.rows;
  int64_t down_numel = 0;
  for (const auto& o : layer)
    if (o.name == "mlp.experts.down_proj") down_numel = o.numel;
  int64_t h = 0;  // the hidden size: the router is [experts, h]
  for (const auto& o : layer)
    if (o.name == "mlp.gate.weight") h = o.numel / experts;
  if (h <= 0 || down_numel <= 0) return;
  const int64_t fe = down_numel / experts / h;  // one expert's down_proj is [h, fe]
  auto pair = [&](const char* projection, int64_t in_f, int64_t out_f) {
    if (!peft_targets(peft, projection)) return;
    const std::string base = std::string("mlp.experts.") + projection;
    out.push_back({base + ".lora_A.weight", mul(experts, peft.lora_rank, in_f), ParamKind::Adapter, experts});
    out.push_back({base + ".lora_B.weight", mul(experts, out_f, peft.lora_rank), ParamKind::Adapter, experts});
    if (peft.kind() == PeftMethod::Dora) out.push_back({base + ".lora_magnitude_vector", mul(experts, out_f), ParamKind::Adapter, experts});
  };
  if (stack.name == "mlp.experts.gate_up_proj") {
    if (stack.numel == mul(2, down_numel)) pair("gate_proj", h, fe);  // gated experts: gate and up
    pair("up_proj", h, fe);
  } else if (stack.name == "mlp.experts.down_proj") {
    pair("down_proj", fe, h);
  }
}

void mark_expert_parameters(ModelShape& s) {
  s.for_each_layer_kind([](std::vector<ParamTensor>& ts, int64_t) {
    for (auto& t : ts)
      if (is_expert_param(t)) t.fused = true;
  });
}

void apply_peft(ModelShape& s, const PeftConfig& peft, bool quantize_head) {
  if (!peft.enabled()) return;
  // PEFT on a fused q/k/v linear: one adapter on the whole of it (lora_A [r, in], lora_B [q + k + v width, r]),
  // which memsim hangs on q_proj (the first of the three it models as separate tensors).
  const bool fused = targets_fused_qkv(peft);
  const bool quant = peft.quantized();
  auto adapt = [&](std::vector<ParamTensor>& ts, bool in_layers) {
    std::vector<ParamTensor> out;
    for (auto t : ts) {
      if (t.part != ParamTensor::Part::Model) {  // a VLM's tower (frozen) and projector (trained): PEFT leaves them be
        out.push_back(t);
        continue;
      }
      const std::string mod = module_name(t.name);
      t.frozen = true;
      // bitsandbytes replaces the nn.Linear modules of the layers; the head, embeddings and norms stay
      // (transformers integrations/bitsandbytes.py get_keys_to_not_convert). Lightning's plugin converts the
      // (untied) head as well.
      const bool head = quantize_head && mod == "lm_head";  // present in post only when untied
      t.quantized = quant && (in_layers || head) && t.kind == ParamKind::Matmul && mod != "gate" && !t.fused &&
                    !in_list(peft.modules_to_save, mod);
      // A model program: bitsandbytes replaces each nn.Linear of every stage (not a convolution) but those the
      // program names in not_quantized (diffusers' and transformers' replace_with_bnb_linear).
      if (s.program) t.quantized = quant && t.kind == ParamKind::Matmul && !t.conv && !t.fused && t.name.ends_with(".weight") &&
                                   !program_keeps_unquantized(*s.program, t.name) && !in_list(peft.modules_to_save, mod);
      out.push_back(t);
      // modules_to_save: ModulesToSaveWrapper (peft/utils/other.py) keeps the original module, frozen, and trains
      // a deepcopy of it (modules_to_save[adapter_name] = copy.deepcopy(original_module)).
      // (3-D expert stacks, a program's or transformers 5's, are parameters of their experts module, not modules
      // PEFT can wrap: "up_proj" in a program names the shared expert's linear only.)
      const bool stack = t.fused && !t.name.ends_with(".weight") && !t.name.ends_with(".bias");
      if (in_list(peft.modules_to_save, mod) && !stack) {
        ParamTensor copy = t;
        copy.name = "modules_to_save." + t.name;  // module_name() still gives the module PEFT wraps
        copy.frozen = false;
        copy.quantized = false;
        out.push_back(copy);
      }
      const bool weight = t.name.size() > 7 && t.name.compare(t.name.size() - 7, 7, ".weight") == 0;
      const bool fused_part = fused && (mod == "k_proj" || mod == "v_proj") && !in_list(peft.target_modules, mod);
      // all-linear matches nn.Linear modules only (peft tuners_utils _maybe_include_all_linear_layers), not a conv.
      // It leaves out the output layer too (get_output_embeddings), a program's tied head (Whisper's proj_out).
      const bool conv_skipped = peft.target_modules == "all-linear" &&
                                (t.conv || t.fused || (s.program && !s.program->tied_head.empty() && t.name == s.program->tied_head + ".weight"));
      // transformers 5's routers (MixtralTopKRouter, ...) hold a bare parameter beside the 3-D experts (`fused`): PEFT
      // cannot wrap them (it raises for a named target, and all-linear collects nn.Linear only).
      const bool bare_router = mod == "gate" && std::any_of(ts.begin(), ts.end(), [](const ParamTensor& o) {
                                 return is_expert_param(o) && o.fused;
                               });
      if (t.kind == ParamKind::Matmul && weight && peft_targets(peft, mod) && !fused_part && !conv_skipped && !t.fused &&
          !bare_router) {
        int64_t out_f = t.rows;
        const int64_t in_f = t.numel / t.rows;
        if (fused && mod == "q_proj" && !in_list(peft.target_modules, mod))  // the fused linear's whole width
          for (const auto& o : ts)
            if (o.name.size() > 7 && (module_name(o.name) == "k_proj" || module_name(o.name) == "v_proj") &&
                o.kind == ParamKind::Matmul && o.name.compare(o.name.size() - 7, 7, ".weight") == 0)
              out_f += o.rows;
        const std::string base = t.name.substr(0, t.name.size() - 7);
        if (peft.kind() == PeftMethod::Ia3) {
          // peft/tuners/ia3/layer.py IA3Layer.update_layer: one vector, (1, in_features) for a feedforward
          // module, else (out_features, 1), created by torch.randn (fp32).
          const int64_t n = ia3_feedforward(peft, mod) ? in_f : out_f;
          out.push_back({base + ".ia3_l.default", n, ParamKind::Adapter, n});
        } else {
          // peft/tuners/lora/layer.py update_layer: lora_A = Linear(in, r), lora_B = Linear(r, out);
          // DoRA adds a magnitude vector of out_features (tuners/lora/dora.py).
          out.push_back({base + ".lora_A.weight", mul(peft.lora_rank, in_f), ParamKind::Adapter, peft.lora_rank});
          out.push_back({base + ".lora_B.weight", mul(out_f, peft.lora_rank), ParamKind::Adapter, out_f});
          if (peft.kind() == PeftMethod::Dora) out.push_back({base + ".lora_magnitude_vector", out_f, ParamKind::Adapter, out_f});
        }
      }
      if (in_layers && peft.lora_like() && is_expert_param(t) && !t.fused && t.kind == ParamKind::Matmul && t.rows > 0)
        adapt_experts(out, t, ts, peft);
      if (t.kind == ParamKind::Norm && ln_tuning_targets(peft, mod)) {
        // peft/tuners/ln_tuning/layer.py LNTuningLayer.update_layer: ln_tuning_layers[adapter] = deepcopy(layer).
        // The copy trains, in the base's dtype (LNTuningModel._cast_adapter_dtype is a no-op); the original
        // stays, frozen.
        ParamTensor copy = t;
        const size_t dot = t.name.rfind('.');
        copy.name = t.name.substr(0, dot) + ".ln_tuning_layers.default" + t.name.substr(dot);
        copy.frozen = false;
        copy.quantized = false;
        out.push_back(copy);
      }
    }
    ts = std::move(out);
  };
  adapt(s.pre, false);
  // PromptEmbedding (peft/tuners/prompt_tuning/model.py): nn.Embedding(num_virtual_tokens, token_dim), created in
  // the default dtype (fp32) beside the frozen model; token_dim is the hidden size (the word embeddings' width).
  if (peft.kind() == PeftMethod::PromptTuning && !s.pre.empty()) {
    const int64_t h = s.pre.front().numel / s.pre.front().rows;
    s.pre.push_back({"prompt_encoder.embedding.weight", mul(peft.num_virtual_tokens, h), ParamKind::Adapter,
                     peft.num_virtual_tokens});
  }
  adapt(s.post, false);
  s.for_each_layer_kind([&](std::vector<ParamTensor>& ts, int64_t) { adapt(ts, true); });
  if (peft.prompt_adapter()) add_llama_adapter(s, peft);
  // PrefixEncoder without prefix_projection (peft/tuners/prefix_tuning/model.py): nn.Embedding(num_virtual_tokens,
  // num_layers * 2 * token_dim), fp32; _prepare_prompt_learning_config makes token_dim the key/value width under
  // grouped-query attention (num_key_value_heads x head_dim).
  if (peft.kind() == PeftMethod::PrefixTuning) {
    int64_t kv_width = 0;
    for (const auto& t : s.layer)
      if (t.kind == ParamKind::Matmul && t.name == "self_attn.k_proj.weight") kv_width = t.rows;
    s.pre.push_back({"prompt_encoder.embedding.weight", mul(peft.num_virtual_tokens, mul(s.num_layers, 2, kv_width)),
                     ParamKind::Adapter, peft.num_virtual_tokens});
  }
  recount(s);
}

}  // namespace memsim
