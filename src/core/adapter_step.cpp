// The prompt-based PEFT methods in a decoder layer's step (docs/research/llama-adapter.md):
// - litgpt's LLaMA-Adapter (peft.method adapter and adapter_v2): what the adaption prompt's attention and
//   AdapterV2Linear keep for backward. Sources: lit-gpt 8641822 (2023-10, the resource tables' commit) and litgpt
//   0.5: lit_gpt/adapter.py CausalSelfAttention.scaled_dot_product_attention, lit_gpt/adapter_v2.py AdapterV2Linear,
//   finetune/adapter.py;
// - PEFT's adaption_prompt (AdaptedAttention) and prefix tuning (get_prompt and the cache's concatenation);
// - the no_grad layers below adapter_start_layer (litgpt's v1, PEFT's adaption_prompt).
// The parameters are model.cpp's add_llama_adapter and apply_peft's PrefixEncoder.
#include <algorithm>

#include "checked.h"
#include "step_builder.h"

namespace memsim {

// adapter_start_layer > 0 under litgpt's adapter (v1) or PEFT's adaption_prompt: the embedding is frozen and the
// layers below the start train nothing, so their outputs need no gradient and autograd records nothing for them (v2
// trains every layer's norms; first_grad_layer_ says which layers, train_step.cpp).
uint32_t StepBuilder::layer_forward_without_grad(int32_t layer, uint32_t res) {
  if (!casts_[layer].live()) {  // the cached ones go when the forward's autocast region exits
    autocast_casts(layer, false);
    if (casts_[layer].live()) ckpt_casts_.push_back(static_cast<uint32_t>(layer));
  }
  no_grad_ = true;
  SavedLayer scratch;
  const uint32_t next = layer_forward(layer, res, scratch, false, false);
  no_grad_ = false;
  no_grad_norm_out_ = UINT32_MAX;
  for (uint32_t t : scratch.attn) drop(t);
  for (uint32_t t : scratch.mlp) drop(t);
  drop(res);  // Block.forward's x: rebound to the layer's output
  return next;
}

// After the causal call, every token attends to the layer's adaption prompt: ay = SDPA(q, ak, av, amask) with a
// [T, aT] bool mask, and the layer's attention output becomes y + gating_factor * ay. The gate trains, so the
// product keeps ay for its gradient. ak and av are the prompt through the layer's qkv linear ([1, heads, aT,
// head_size], no size), taken from adapter_kv_cache: finetune/adapter.py's validate() fills it under no_grad before
// training ("the adapter kv cache cannot be initialized under inference_mode") and nothing resets it, so they need no
// gradient. The call has a mask: from torch 2.1 the memory-efficient kernel, which keeps q (kept already by the
// causal call), ak, av, its output (ay itself) and an fp32 logsumexp per head and row padded to 32; on torch 2.0 the
// math kernel, whose q @ k^T keeps only the scaled k (k needs no gradient, so the scaled q is not saved) and whose
// softmax keeps its [b, heads, T, aT] output. The product and the sum are transients; the sum is what the output
// projection reads (returned: the caller frees it once the projection has run). q_grad false: q needs no gradient
// (v1's first adapted layer), so the kernel saves nothing and only the gate keeps ay.
uint32_t StepBuilder::adapter_attention(int32_t layer, std::vector<uint32_t>& saved, bool q_grad) {
  if (adapter_label_ == UINT32_MAX) adapter_label_ = program_.label("adaption prompt attention output (kept by the gate)");
  const int64_t tq = mul(dims_.e, dims_.T, dims_.h_q);
  const bool keep = !no_grad_;
  uint32_t kernel_saved = UINT32_MAX;
  if (keep && q_grad) {
    kernel_saved = resolved_.masked_sdpa_math
                       ? act(mul(dims_.e, dims_.a, dims_.b, mul(dims_.s, cfg_.peft.adapter_prompt_length)), labels_.softmax, layer)
                       : act(mul(4, dims_.a, dims_.b, round_up(dims_.s, 32)), labels_.lse, layer);
  }
  const uint32_t ay = keep ? act(tq, adapter_label_, layer) : tmp(tq, adapter_label_, layer);
  const uint32_t gated = tmp(tq, labels_.attn_tmp, layer);
  const uint32_t sum = tmp(tq, labels_.attn_tmp, layer);
  drop(gated);
  if (kernel_saved != UINT32_MAX) saved.push_back(kernel_saved);
  if (keep) saved.push_back(ay);
  else drop(ay);
  return sum;
}

// adapter_v2.py AdapterV2Linear.forward: adapter_scale * (self.linear(x) + adapter_bias). The scale's gradient reads
// the biased output, so the product saves it ([tokens, out] in the compute dtype: Fabric's bf16-true makes the
// adapter parameters bf16); linear(x) goes once the bias is added. The frozen linear saves nothing of x. Call before
// the caller makes the product, and v2_keep after. chunk_tokens: the linear runs on chunks of this many rows (litgpt's
// lm_head_chunk_size), so its own output is one chunk's at a time.
uint32_t StepBuilder::v2_pre_scale(int32_t layer, int64_t tokens, int64_t out_features, int64_t chunk_tokens) {
  if (cfg_.peft.kind() != PeftMethod::AdapterV2) return UINT32_MAX;
  if (adapter_v2_label_ == UINT32_MAX) adapter_v2_label_ = program_.label("AdapterV2Linear output before its scale (saved)");
  const int64_t bytes = mul(dims_.e, tokens, out_features);
  const int64_t rows = chunk_tokens > 0 ? std::min(tokens, chunk_tokens) : tokens;
  const uint32_t linear = tmp(mul(dims_.e, rows, out_features), labels_.attn_tmp, layer);
  const uint32_t biased = no_grad_ ? tmp(bytes, adapter_v2_label_, layer) : act(bytes, adapter_v2_label_, layer);
  drop(linear);
  return biased;
}

void StepBuilder::v2_keep(uint32_t pre, std::vector<uint32_t>& saved) {
  if (pre == UINT32_MAX) return;
  if (no_grad_) drop(pre);
  else saved.push_back(pre);
}

// PEFT's AdaptedAttention.forward (peft/tuners/adaption_prompt/layer.py and utils.py llama_compute_query_states, at
// 5d602fd, 2026): the wrapped LlamaAttention runs whole, its o_proj included (`out`). Then
// - the prompt's keys and values: k_proj and v_proj of adaption_prompt [1, L, h], viewed per key/value head,
//   .repeat(bsz, ...) (a copy) and repeat_interleave'd to every query head ([b, heads, L, head_dim] each), which the
//   two matmuls keep: the keys for the query's gradient (where it needs one), the values for the gated scores';
// - the query again: q_proj of the layer's input, rotated as (q * cos) + (rotate_half(q) * sin); value_states =
//   v_proj(...) is computed too and goes unused. The scores' matmul keeps the rotated query for the prompt keys'
//   gradient, whether or not the query itself needs one;
// - eager scores over the prompt: matmul / sqrt(head_dim), softmax(dtype=fp32) (its output kept), .to(q's dtype)
//   (kept by the gate's product for the gate's gradient), gate * that (kept by the matmul with the prompt values);
// - the output [b, heads, T, head_dim], transposed and reshaped (a copy), through the frozen o_proj again, and added to
//   `out`: the sum replaces it as the attention's output.
uint32_t StepBuilder::adaption_prompt_attention(int32_t layer, std::vector<uint32_t>& saved, uint32_t out, bool q_grad) {
  if (prompt_query_label_ == UINT32_MAX) {
    prompt_query_label_ = program_.label("adaption prompt: the recomputed query (saved)");
    prompt_kv_label_ = program_.label("adaption prompt: keys and values per query head (saved)");
  }
  const int64_t e = dims_.e, prompt = cfg_.peft.adapter_prompt_length;
  const bool keep = !no_grad_;
  auto make = [&](int64_t bytes, uint32_t label, bool kept) { return kept ? act(bytes, label, layer) : tmp(bytes, label, layer); };
  std::vector<uint32_t> kept;
  auto hold = [&](uint32_t t, bool k) {
    if (k) kept.push_back(t);
    else drop(t);
  };
  const uint32_t k_batch = tmp(mul(e, dims_.b, prompt, dims_.h_kv), labels_.attn_tmp, layer);
  const uint32_t v_batch = tmp(mul(e, dims_.b, prompt, dims_.h_kv), labels_.attn_tmp, layer);
  const uint32_t k_heads = make(mul(e, dims_.b, prompt, dims_.h_q), prompt_kv_label_, keep && q_grad);
  const uint32_t v_heads = make(mul(e, dims_.b, prompt, dims_.h_q), prompt_kv_label_, keep);
  drop(k_batch), drop(v_batch);
  hold(k_heads, keep && q_grad);
  hold(v_heads, keep);
  const int64_t tq = mul(e, dims_.T, dims_.h_q);
  const uint32_t q = tmp(tq, labels_.q, layer);
  const uint32_t v = tmp(mul(e, dims_.T, dims_.h_kv), labels_.v, layer);
  const uint32_t cos_part = tmp(tq, labels_.q_rot, layer);
  const uint32_t half = tmp(tq, labels_.q_rot, layer);
  const uint32_t sin_part = tmp(tq, labels_.q_rot, layer);
  drop(half);
  const uint32_t q_rot = make(tq, prompt_query_label_, keep);
  drop(q), drop(v), drop(cos_part), drop(sin_part);
  hold(q_rot, keep);
  const int64_t s2 = mul(dims_.a, dims_.b, mul(dims_.s, prompt));
  const uint32_t scores = tmp(mul(e, s2), labels_.scores, layer);
  const uint32_t scaled = tmp(mul(e, s2), labels_.scores, layer);
  drop(scores);
  const uint32_t p32 = make(mul(4, s2), labels_.softmax, keep);
  drop(scaled);
  const uint32_t p16 = make(mul(e, s2), labels_.probs, keep);
  const uint32_t gated = make(mul(e, s2), labels_.probs, keep);
  for (uint32_t t : {p32, p16, gated}) hold(t, keep);
  const uint32_t context = tmp(tq, labels_.attn_tmp, layer);
  const uint32_t flat = tmp(tq, labels_.attn_tmp, layer);
  drop(context);
  // A bitsandbytes o_proj keeps what it reads (ctx.tensors) as long as the graph (bnb_keeps_input).
  bool int8_done = false;
  if (!no_grad_ && bnb_keeps_input(layer, "o_proj", module_info("o_proj"), mul(dims_.T, dims_.h_q), int8_done))
    program_.recategorize(flat, Component::Activations), hold_in_graph(flat);  // kept for backward: an activation
  const uint32_t projected = tmp(mul(e, dims_.Tn, dims_.h), labels_.o_out, layer);
  drop(flat);
  const uint32_t sum = tmp(mul(e, dims_.Tn, dims_.h), labels_.o_out, layer);
  drop(projected), drop(out);
  saved.insert(saved.end(), kept.begin(), kept.end());
  return sum;
}

// PEFT's prefix tuning (peft_model.py get_prompt and _prefix_tuning_forward at 5d602fd; transformers 4.56+
// DynamicCache and masking_utils). Before the model runs, get_prompt embeds the prefix, [b, P, layers x 2 x kv width]
// in fp32, casts it to the model's dtype and views it per layer as [2, b, kv heads, P, head_dim]; DynamicCache keeps
// those views until each layer's update replaces them, so the cast lives until the last layer has run.
void StepBuilder::prefix_forward_begin() {
  if (prefix_label_ == UINT32_MAX) prefix_label_ = program_.label("prefix tuning: the prefix keys and values of every layer");
  const int64_t n = mul(dims_.b, prefix_tokens_, mul(shape_.num_layers, 2, dims_.h_kv));
  const uint32_t fp32 = tmp(mul(4, n), prefix_label_, -1);
  prefix_kv_ = act(mul(dims_.e, n), prefix_label_, -1);
  drop(fp32);
}

void StepBuilder::prefix_forward_end() {
  if (prefix_kv_ != UINT32_MAX) drop(prefix_kv_), prefix_kv_ = UINT32_MAX;
}

// A layer's cache update (DynamicLayer.update): keys = torch.cat([prefix keys, k], dim=-2), the same for the values,
// [b, kv heads, P + s, head_dim] each; cat's backward keeps nothing, so the layer's own k and v go, and attention reads
// (and SDPA saves, or repeats for every query head first) the concatenated ones. The cache holds them too, as long as
// the model's outputs live: through backward where the loop keeps them (holds_logits), else to the loss.
void StepBuilder::prefix_cat(int32_t layer, std::vector<uint32_t>& saved, uint32_t& k, uint32_t& v) {
  const int64_t rows = mul(dims_.b, kv_len());
  const uint32_t kc = act(mul(dims_.e, rows, dims_.h_kv), labels_.k_rot, layer);
  const uint32_t vc = act(mul(dims_.e, rows, dims_.h_kv), labels_.v, layer);
  erase(saved, k), drop(k);
  erase(saved, v), drop(v);
  k = kc, v = vc;
  saved.push_back(kc), saved.push_back(vc);
  // No recomputation (prefix tuning is refused with checkpointing, as PEFT refuses it). A no_grad pass (an
  // evaluation) keeps nothing past the layer here: its cache's hold until its outputs go is not modelled.
  if (in_backward_ || no_grad_) return;
  for (uint32_t t : {kc, vc}) hold(t, resolved_.holds_logits ? graph_attrs_now_ : prefix_cache_);
}

// After the layers' backward: each layer's prefix key and value gradients ([b, P, 2 x kv width], kept as they came by
// the split's input buffer) are stacked back into the cast's gradient, which the cast's backward makes fp32 for the
// embedding's dense gradient (the parameter's .grad, allocated with the other gradients).
void StepBuilder::prefix_backward() {
  const int64_t n = mul(dims_.b, prefix_tokens_, mul(shape_.num_layers, 2, dims_.h_kv));
  const uint32_t stacked = tmp(mul(dims_.e, n), prefix_label_, -1);
  for (uint32_t t : prefix_grads_) drop(t);
  prefix_grads_.clear();
  const uint32_t fp32 = tmp(mul(4, n), prefix_label_, -1);
  drop(stacked);
  drop(fp32);
}

}  // namespace memsim
