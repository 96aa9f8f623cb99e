#include "model.h"

#include "checked.h"

namespace memsim {

int64_t sum_numel(const std::vector<ParamTensor>& tensors) {
  int64_t n = 0;
  for (const auto& t : tensors) n = add(n, t.numel);
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

}  // namespace

// Shapes follow HF modeling_llama.py (LlamaAttention, LlamaMLP, LlamaDecoderLayer) and modeling_gpt2.py;
// the totals equal Megatron's compute_weight_and_optimizer_memory formulas plus the biases and router
// weights Megatron leaves out (MEMORY_FORMULAS.md 1.1).
ModelShape build_model_shape(const ModelConfig& m) {
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

  auto& L = s.layer;
  norm(L, "input_layernorm", h, m.norm_type);
  linear(L, "self_attn.q_proj", h, q_width, qkv_b);
  linear(L, "self_attn.k_proj", h, kv_width, qkv_b);
  linear(L, "self_attn.v_proj", h, kv_width, qkv_b);
  if (m.qk_norm) {  // Qwen3Attention: q_norm and k_norm are RMSNorm(head_dim), shared across heads
    norm(L, "self_attn.q_norm", d, NormType::RMSNorm);
    norm(L, "self_attn.k_norm", d, NormType::RMSNorm);
  }
  linear(L, "self_attn.o_proj", q_width, h, m.attention_bias);
  norm(L, "post_attention_layernorm", h, m.norm_type);
  if (m.mlp_gated) linear(L, "mlp.gate_proj", h, m.intermediate_size, m.mlp_bias);
  linear(L, "mlp.up_proj", h, m.intermediate_size, m.mlp_bias);
  linear(L, "mlp.down_proj", m.intermediate_size, h, m.mlp_bias);
  // Gemma 2/3 add pre_feedforward_layernorm and post_feedforward_layernorm (modeling_gemma2.py).
  for (int64_t i = 2; i < m.norms_per_layer; ++i) norm(L, "extra_layernorm_" + std::to_string(i), h, m.norm_type);

  if (!m.post_layernorm) norm(s.post, "norm", h, m.norm_type);  // post-LN layers end normalised already
  if (m.task_head == "sequence_classification") {
    // BertForSequenceClassification: BertPooler (dense h x h + tanh on the first token) and the classifier.
    if (m.post_layernorm) linear(s.post, "pooler.dense", h, h, true);
    linear(s.post, "classifier", h, m.num_labels, true);
  } else if (!m.tie_word_embeddings) {
    s.post.push_back({"lm_head.weight", mul(m.vocab_size, h), ParamKind::Matmul, m.vocab_size});
  }

  s.num_layers = m.num_hidden_layers;
  s.params_per_layer = sum_numel(s.layer);
  s.params_total = add(add(sum_numel(s.pre), mul(s.params_per_layer, s.num_layers)), sum_numel(s.post));
  return s;
}

}  // namespace memsim
