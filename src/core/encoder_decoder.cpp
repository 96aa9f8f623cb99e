// The training step of an encoder-decoder model as transformers' T5ForConditionalGeneration runs it
// (models/t5/modeling_t5.py at 6b8b757): the encoder on the source tokens, the decoder on the target tokens with
// cross-attention to the encoder output, and the loss over the target tokens.
//
// What autograd keeps follows the op rules of activations.cpp (MEMORY_FORMULAS.md 3.3: a linear saves its input,
// relu its result, pow its input, rsqrt its result, a product both operands, bmm both operands, dropout a 1-byte
// mask), applied to T5's own modules, which differ from the Llama code in ways that matter for memory:
//  - T5LayerNorm multiplies the residual itself (not its fp32 copy) by rsqrt(variance), so the residual stays
//    saved besides the fp32 copy that pow saves;
//  - T5Attention is eager only: matmul(q, k^T) and matmul(weights, v) reshape transposed head views, which copies
//    them, and bmm saves the copies; softmax runs on scores.float() and saves its fp32 result; one dropout_rate
//    applies to the probabilities, every residual branch, the MLP's inside, the embeddings and the stack outputs;
//  - the relative position bias is computed once per stack (block 0) as [batch, heads, q, k] and added to the
//    scores of every block, so its gradient accumulates over the whole stack's backward;
//  - the encoder output is read by k and v of every decoder block, so it and its accumulated gradient live
//    through the decoder's backward;
//  - T5Config.use_cache is true, and transformers builds the decoder's cache in training unless gradient
//    checkpointing is on (T5Stack.forward): the cache keeps every decoder block's k and v projections (self and
//    cross) until the model outputs go;
//  - with fp16 weights T5Block clamps the hidden states after every sublayer, which saves the unclamped sum.
// Only one device's whole model is simulated (no tensor or pipeline parallelism; validate.cpp refuses them).
#include <algorithm>

#include "checked.h"
#include "step_builder.h"

namespace memsim {

void StepBuilder::use_stack(bool decoder) {
  dims_.s = decoder ? dec_s_ : enc_s_;
  dims_.T = dims_.Tn = mul(dims_.b, dims_.s);
}

// T5Stack.forward: inputs_embeds = embed_tokens(ids); hidden_states = dropout(inputs_embeds). The embedding saves
// only the ids and dropout its mask, so the embedding output itself goes once dropped out.
uint32_t StepBuilder::t5_embed(std::vector<uint32_t>& saved) {
  const int64_t th = mul(dims_.T, dims_.h);
  uint32_t x = act(mul(dims_.e_res, th), encdec_labels_.embed_out, -1);
  if (cfg_.model.hidden_dropout > 0) x = dropout(x, th, dims_.e_res, true, labels_.residual, -1, saved);
  return x;
}

// T5LayerNorm.forward: variance = x.to(fp32).pow(2).mean(-1); h = x * rsqrt(variance + eps); h.to(weight dtype)
// when the weight is half; return weight * h. pow saves the fp32 copy of x (x itself when x is fp32), rsqrt its
// result, x * rsqrt both operands, so x stays saved; weight * h saves h for the weight's gradient (not for a frozen
// weight). h is fp32 by type promotion until the cast. apex's FusedRMSNorm, which modeling_t5.py puts in
// T5LayerNorm's place when apex is installed, saves its input and rstd. Returns the output, which the caller keeps
// or lets go.
uint32_t StepBuilder::t5_norm(int32_t layer, uint32_t x, std::vector<uint32_t>& saved, bool own_x) {
  const int64_t th = mul(dims_.T, dims_.h);
  // prepare_model_for_kbit_training casts the norm weights to fp32, which keeps h and the output fp32.
  const bool kbit = resolved_.kbit_cast;
  const int64_t wb = kbit ? 4 : recipe_.weight_bytes;
  saved.push_back(act(mul(4, dims_.T), labels_.norm_rstd, layer));
  uint32_t h = UINT32_MAX;
  if (resolved_.norm != NormImpl::Fused) {
    if (dims_.e_res < 4) saved.push_back(act(mul(4, th), labels_.norm_x32, layer));
    const bool keep_h = !cfg_.peft.enabled();
    uint32_t h32 = wb < 4 || !keep_h ? tmp(mul(4, th), labels_.norm_scaled, layer) : act(mul(4, th), labels_.norm_scaled, layer);
    h = h32;
    if (wb < 4) {
      h = keep_h ? act(mul(wb, th), labels_.norm_scaled, layer) : tmp(mul(wb, th), labels_.norm_scaled, layer);
      drop(h32);
    }
    if (keep_h) saved.push_back(h), h = UINT32_MAX;
  }
  uint32_t y = act(mul(wb, th), labels_.norm_out, layer);
  if (h != UINT32_MAX) drop(h);
  if (own_x) saved.push_back(x);  // else a checkpoint holds it
  return y;
}

// One T5Attention after its projections' inputs are accounted for: queries from sq tokens per sequence, keys and
// values from sk. `release` (the norm output when no matmul saves it) goes once the projections exist; `cache`, if
// given, takes the k and v projections. Returns o's output after the residual branch's dropout.
uint32_t StepBuilder::t5_attention(int32_t layer, std::vector<uint32_t>& A, int64_t sq, int64_t sk, uint32_t release,
                                   std::vector<uint32_t>* cache) {
  const auto& m = cfg_.model;
  const int64_t e = dims_.e, hq = dims_.h_q;
  const int64_t tq = mul(dims_.b, sq), tk = mul(dims_.b, sk);
  const int64_t s2 = mul(dims_.a, dims_.b, sq, sk);
  uint32_t q = tmp(mul(e, tq, hq), labels_.q, layer);
  // Projections the decoder's cache keeps outlive the attention: they count as activations.
  uint32_t k = cache ? act(mul(e, tk, hq), encdec_labels_.kv_cache, layer) : tmp(mul(e, tk, hq), labels_.k, layer);
  uint32_t v = cache ? act(mul(e, tk, hq), encdec_labels_.kv_cache, layer) : tmp(mul(e, tk, hq), labels_.v, layer);
  if (release != UINT32_MAX) drop(release);
  // matmul(q, k.transpose(3, 2)) reshapes both [b, heads, len, d_kv] views for bmm, a copy each, and bmm saves them.
  A.push_back(act(mul(e, tq, hq), labels_.q, layer));
  A.push_back(act(mul(e, tk, hq), labels_.k, layer));
  // softmax(scores.float()) saves its fp32 result; .type_as(scores) casts back when the scores are half; dropout on
  // the weights. (The position bias is added to the scores in place.)
  attention_probs(layer, s2, {e, e < 4, 4, false, cfg_.model.attention_dropout > 0}, true, A);
  A.push_back(act(mul(e, tk, hq), labels_.v, layer));  // v's reshape copy, saved by the second bmm
  uint32_t o_pre = tmp(mul(e, tq, hq), labels_.attn_tmp, layer);
  uint32_t ctx = act(mul(e, tq, hq), labels_.attn_out, layer);  // transpose(1, 2).contiguous(), read by o
  drop(o_pre);
  drop(q);
  if (cache) cache->push_back(k), cache->push_back(v);
  else drop(k), drop(v);
  const bool keep_ctx = linear_inputs(layer, {"o"}, hq, A, tq, true);
  uint32_t o = tmp(mul(e, tq, dims_.h), labels_.o_out, layer);
  if (keep_ctx) A.push_back(ctx);
  else drop(ctx);
  if (m.hidden_dropout > 0) o = dropout(o, mul(tq, dims_.h), e, false, labels_.o_out, layer, A);
  return o;
}

// One T5Block: T5LayerSelfAttention, in the decoder T5LayerCrossAttention, then T5LayerFF, each
// `hidden_states + dropout(sublayer(layer_norm(hidden_states)))`. own_x: the block owns its input (false when a
// checkpoint's recomputation runs it on the input the checkpoint keeps).
uint32_t StepBuilder::t5_block_forward(int32_t layer, uint32_t x, SavedLayer& sv, bool own_x,
                                       std::vector<uint32_t>* cache) {
  const auto& m = cfg_.model;
  const int64_t E = shape_.num_encoder_layers;
  const bool dec = layer >= E;
  const int64_t e = dims_.e, er = dims_.e_res, th = mul(dims_.T, dims_.h);
  autocast_casts(layer, !no_grad_);  // autocast's bf16 weights, saved by the matmuls
  // T5Block clamps fp16 hidden states after every sublayer ("clamp inf values to enable fp16 training"):
  // clamp with tensor bounds saves its input, so the unclamped sum stays too. Autocast keeps the residual fp32.
  const bool fp16 = recipe_.fp16 && !dims_.amp;
  auto add_branch = [&](uint32_t o, std::vector<uint32_t>& part) {  // the branch's norm saved the old residual
    uint32_t out = act(mul(er, th), labels_.residual, layer);
    drop(o);
    if (fp16) {
      part.push_back(out);
      uint32_t inf = tmp(th, labels_.attn_tmp, layer);  // torch.isinf(hidden_states)
      drop(inf);
      out = act(mul(er, th), labels_.residual, layer);
    }
    return out;
  };

  // ---- self-attention
  auto& A = sv.attn;
  uint32_t y = t5_norm(layer, x, A, own_x);
  if (any_quantized_) dequant(layer);
  const bool keep_y = linear_inputs(layer, {"q", "k", "v"}, dims_.h, A, dims_.T);
  if (keep_y) A.push_back(y);
  if (layer == 0 || layer == E) {
    // compute_bias: Embedding(relative_position_bucket) saves the int64 [len, len] buckets; inside a checkpoint's
    // recomputation the position bias itself is made again as well.
    A.push_back(act(mul(8, dims_.s, dims_.s), encdec_labels_.buckets, layer));
    if (!own_x) A.push_back(act(mul(er, dims_.a, dims_.b, mul(dims_.s, dims_.s)), encdec_labels_.bias, layer));
  }
  uint32_t x2 = add_branch(t5_attention(layer, A, dims_.s, dims_.s, keep_y ? UINT32_MAX : y, dec ? cache : nullptr), A);

  // ---- cross-attention: queries from the decoder, keys and values from the encoder output
  uint32_t ff_in = x2;
  if (dec) {
    auto& C = sv.cross;
    uint32_t yc = t5_norm(layer, x2, C, true);
    const bool keep_yc = linear_inputs(layer, {"q"}, dims_.h, C, dims_.T);
    if (keep_yc) C.push_back(yc);
    // k and v read the encoder output, which forward_encdec holds for the whole decoder; under autocast each keeps
    // its own low-precision copy (autocast caches casts of weights only).
    linear_inputs(layer, {"k", "v"}, dims_.h, C, mul(dims_.b, enc_s_));
    if (layer == E && !own_x)  // recomputed cross bias: zeros [1, heads, t, s] + encoder mask
      C.push_back(act(mul(er, dims_.a, dims_.b, mul(dec_s_, enc_s_)), encdec_labels_.bias, layer));
    ff_in = add_branch(t5_attention(layer, C, dec_s_, enc_s_, keep_yc ? UINT32_MAX : yc, cache), C);
  }

  // ---- feed-forward: T5DenseActDense (wi, act, dropout, wo) or T5DenseGatedActDense (act(wi_0) * wi_1, ...)
  auto& M = sv.mlp;
  uint32_t y2 = t5_norm(layer, ff_in, M, true);
  const bool keep_y2 = m.mlp_gated ? linear_inputs(layer, {"wi_0", "wi_1"}, dims_.h, M, dims_.T)
                                   : linear_inputs(layer, {"wi"}, dims_.h, M, dims_.T);
  if (keep_y2) M.push_back(y2);
  const int64_t tf = mul(dims_.T, dims_.f);
  const bool gelu_new = m.activation() == HiddenAct::GeluNew, relu = m.activation() == HiddenAct::Relu;
  // NewGELUActivation (activations.py) runs eagerly: 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * pow(x, 3)))).
  // pow saves x, tanh its result, the last product both factors (0.5 x and 1 + tanh). Under autocast pow is an fp32
  // op (what it saves is an fp32 copy of x) and type promotion makes tanh, 1 + tanh and the product fp32.
  const int64_t f32 = gelu_new && dims_.amp ? 4 : e;
  const bool x0_saved = !relu && !(gelu_new && dims_.amp);  // relu saves its result; other activations their input
  uint32_t x0 = x0_saved ? act(mul(e, tf), labels_.mlp_gate, layer) : tmp(mul(e, tf), labels_.mlp_gate, layer);  // wi / wi_0
  if (x0_saved) M.push_back(x0);
  uint32_t g;  // the activation's output
  if (gelu_new) {
    if (dims_.amp) M.push_back(act(mul(4, tf), labels_.mlp_gate, layer));
    uint32_t inner = tmp(mul(f32, tf), labels_.attn_tmp, layer);
    M.push_back(act(mul(f32, tf), labels_.mlp_act, layer));  // tanh result
    drop(inner);
    M.push_back(act(mul(e, tf), labels_.mlp_act, layer));    // 0.5 * x
    M.push_back(act(mul(f32, tf), labels_.mlp_act, layer));  // 1 + tanh
    g = act(mul(f32, tf), labels_.mlp_act, layer);
  } else {
    g = act(mul(e, tf), labels_.mlp_act, layer);
    if (relu) M.push_back(g);
  }
  if (!x0_saved) drop(x0);
  uint32_t p = g;        // what the dropout before wo reads
  bool p_saved = relu;   // relu's result is saved already
  int64_t pd = f32;      // p's bytes per element
  if (m.mlp_gated) {
    // hidden_gelu * hidden_linear saves both factors; the product is fp32 if hidden_gelu is.
    const uint32_t x1 = act(mul(e, tf), labels_.mlp_up, layer);  // wi_1
    if (!relu) M.push_back(g);
    M.push_back(x1);
    p = act(mul(f32, tf), labels_.mlp_prod, layer);
    p_saved = false;
  }
  if (!keep_y2) drop(y2);
  uint32_t d = p;
  if (m.hidden_dropout > 0) d = dropout(p, tf, pd, true, labels_.mlp_prod, layer, M, !p_saved);
  const bool d_held = d == p && p_saved;
  // hidden_states.to(wo.weight.dtype): under autocast the weights are fp32, so a half input is upcast (a copy)
  // and wo's matmul saves its own bf16 cast of that.
  const uint32_t up = dims_.amp && pd < 4 ? tmp(mul(4, tf), encdec_labels_.ff_upcast, layer) : UINT32_MAX;
  const bool keep_d = linear_inputs(layer, {"wo"}, dims_.f, M, dims_.T, !dims_.amp);
  uint32_t out = tmp(mul(e, th), labels_.mlp_out, layer);
  if (up != UINT32_MAX) drop(up);
  if (!d_held) {
    if (keep_d) M.push_back(d);
    else drop(d);
  }
  if (m.hidden_dropout > 0) out = dropout(out, th, e, false, labels_.mlp_out, layer, M);
  return add_branch(out, M);
}

// transformers' gradient checkpointing wraps every T5Block (T5Stack.forward, _gradient_checkpointing_func): the
// block runs under no_grad and keeps only its input; its intermediates exist one at a time, the largest being the
// MLP's or the fp32 softmax of the scores.
uint32_t StepBuilder::t5_block_checkpointed(int32_t layer, uint32_t x, SavedLayer& sv) {
  sv.attn.push_back(x);
  if (!casts_[layer].live()) {  // the cached ones go when the forward's autocast region exits
    autocast_casts(layer, false);
    if (casts_[layer].live()) ckpt_casts_.push_back(static_cast<uint32_t>(layer));
  }
  int64_t peak = mul(3, dims_.e, dims_.T, dims_.f);
  peak = std::max(peak, mul(4 + dims_.e, dims_.a, dims_.b, mul(dims_.s, dims_.s)));
  if (layer >= shape_.num_encoder_layers) peak = std::max(peak, mul(4 + dims_.e, dims_.a, dims_.b, mul(dec_s_, enc_s_)));
  uint32_t t = tmp(peak, labels_.ckpt_tmp, layer);
  uint32_t next = act(mul(dims_.e_res, dims_.T, dims_.h), labels_.residual, layer);
  drop(t);
  return next;
}

// Backward of one block, last sublayer first. The activation-gradient temporaries are those of
// StepBuilder::layer_backward with eager attention. bias_grad and cross_grad: the position biases' gradients,
// accumulated over the stack (made by the first block whose backward runs); enc_out_grad: the encoder output's,
// accumulated over the decoder's cross-attentions.
void StepBuilder::t5_block_backward(int32_t layer, uint32_t& dres, SavedLayer& sv, uint32_t& bias_grad,
                                    uint32_t& cross_grad, uint32_t& enc_out_grad) {
  alloc_layer_grads(layer);
  const int64_t e = dims_.e, er = dims_.e_res;
  auto release = [&](std::vector<uint32_t>& part) {
    for (auto it = part.rbegin(); it != part.rend(); ++it) drop(*it);
    part.clear();
  };
  if (any_quantized_) dequant(layer);
  uint32_t t = tmp(mul(3, e, dims_.T, dims_.f), labels_.bwd_mlp, layer);
  release(sv.mlp);
  drop(t);
  norm_backward(layer, dres);
  if (layer >= shape_.num_encoder_layers) {
    const int64_t tk = mul(dims_.b, enc_s_);
    const int64_t s2 = mul(dims_.a, dims_.b, mul(dec_s_, enc_s_));
    if (enc_out_grad == UINT32_MAX) enc_out_grad = tmp(mul(er, tk, dims_.h), encdec_labels_.enc_out_grad, -1);
    // With gradient checkpointing the zero cross bias is made with requires_grad=True (T5Attention.forward), so its
    // gradient accumulates over the decoder like the self-attention bias's.
    if (resolved_.checkpointing == Checkpointing::Full && cross_grad == UINT32_MAX)
      cross_grad = tmp(mul(er, s2), encdec_labels_.bias_grad, -1);
    t = tmp(add(mul(10, s2), mul(2, e, add(dims_.T, tk), dims_.h_q)), labels_.bwd_attn, layer);
    release(sv.cross);
    drop(t);
    norm_backward(layer, dres);
  }
  const int64_t s2 = mul(dims_.a, dims_.b, mul(dims_.s, dims_.s));
  if (bias_grad == UINT32_MAX && !cfg_.peft.enabled()) bias_grad = tmp(mul(er, s2), encdec_labels_.bias_grad, -1);
  t = tmp(add(mul(10, s2), mul(4, e, dims_.T, dims_.h_q)), labels_.bwd_attn, layer);
  release(sv.attn);
  drop(t);
  norm_backward(layer, dres);
  drop_casts(casts_[layer]);
}

// The decoder's final_layer_norm and dropout, then T5ForConditionalGeneration's head: with tied embeddings the
// output is rescaled by d_model**-0.5 (Mesh TensorFlow's convention) before lm_head, and the loss is
// CrossEntropyLoss on the logits as they are, no fp32 upcast: log_softmax saves its output in the logits' dtype,
// except under autocast, where log_softmax is an fp32 op. `transient` gets what the forward's locals hold until it
// returns (the decoder output the rescale read).
void StepBuilder::t5_head_forward(uint32_t res, std::vector<uint32_t>& saved, std::vector<uint32_t>& transient) {
  const int32_t post = -1;
  const auto& m = cfg_.model;
  const int64_t th = mul(dims_.T, dims_.h);
  uint32_t y = t5_norm(post, res, saved, true);
  uint32_t out = y;
  if (m.hidden_dropout > 0) out = dropout(y, th, dims_.e_res, true, labels_.residual, post, saved);
  uint32_t in = out;
  if (m.tie_word_embeddings) in = act(mul(dims_.e_res, th), encdec_labels_.head_scaled, post);
  const bool keep_in = linear_inputs(post, {"lm_head"}, dims_.h, saved, dims_.T);
  // Autocast's low-precision copy of lm_head's fp32 weight (the shared matrix when tied), saved by the linear for
  // its input's gradient until the head's backward (autocast_mode.cpp cached_cast; as loss_forward).
  if (dims_.amp) saved.push_back(tmp(mul(recipe_.autocast_copy_bytes, dims_.V, dims_.h), labels_.cast, post));
  const int64_t tv = mul(dims_.T, dims_.V), e = dims_.e;
  uint32_t lg = resolved_.holds_logits ? act(mul(e, tv), labels_.logits, post) : tmp(mul(e, tv), labels_.logits, post);
  if (keep_in) saved.push_back(in);
  else if (in != out) drop(in);
  if (in != out || !keep_in) transient.push_back(out);
  if (dims_.amp) {
    uint32_t up = tmp(mul(4, tv), labels_.logits_fp32, post);
    saved.push_back(act(mul(4, tv), labels_.lse_loss, post));
    drop(up);
  } else {
    saved.push_back(act(mul(e, tv), labels_.lse_loss, post));
  }
  if (resolved_.holds_logits) held_logits_ = lg;  // the loop keeps the outputs through backward
  else drop(lg);
}

uint32_t StepBuilder::t5_head_backward(std::vector<uint32_t>& saved) {
  const int32_t post = -1;
  alloc_layer_grads(shape_.num_layers);
  const int64_t tv = mul(dims_.T, dims_.V), e = dims_.e;
  const int64_t ls = dims_.amp ? 4 : e;  // log_softmax's dtype
  // nll_loss backward and log_softmax backward ([T, V] each), then the cast back to the logits' dtype.
  uint32_t g1 = tmp(mul(ls, tv), labels_.loss_grad, post);
  uint32_t g2 = tmp(mul(ls, tv), labels_.loss_grad, post);
  drop(g1);
  if (ls != e) {
    uint32_t g3 = tmp(mul(e, tv), labels_.loss_grad_bf16, post);
    drop(g2), g2 = g3;
  }
  uint32_t dy = tmp(mul(dims_.e_res, dims_.T, dims_.h), labels_.dres, post);
  drop(g2);
  for (auto it = saved.rbegin(); it != saved.rend(); ++it) drop(*it);
  saved.clear();
  if (cfg_.model.tie_word_embeddings || cfg_.model.hidden_dropout > 0) {  // the rescale's and dropout's backward
    uint32_t d2 = tmp(mul(dims_.e_res, dims_.T, dims_.h), labels_.dres, post);
    drop(dy), dy = d2;
  }
  norm_backward(post, dy);
  return dy;
}

void StepBuilder::forward_encdec(InFlight& f) {
  if (!encdec_labels_made_) {
    encdec_labels_made_ = true;
    encdec_labels_.bias = program_.label("relative position bias plus attention mask (one per stack, shared by its blocks)");
    encdec_labels_.bias_grad = program_.label("position-bias gradient, accumulated over the stack's blocks");
    encdec_labels_.buckets = program_.label("relative position buckets, int64 (saved by the bias embedding)");
    encdec_labels_.causal_mask = program_.label("decoder causal mask");
    encdec_labels_.enc_out = program_.label("encoder output (read by every cross-attention)");
    encdec_labels_.enc_out_grad = program_.label("encoder-output gradient, accumulated over the cross-attentions");
    encdec_labels_.kv_cache = program_.label("k and v projections held by the decoder's cache (use_cache)");
    encdec_labels_.ff_upcast = program_.label("MLP activation upcast to wo's fp32 dtype (autocast)");
    encdec_labels_.head_scaled = program_.label("decoder output rescaled by d_model^-0.5 (tied head)");
    encdec_labels_.embed_out = program_.label("token embeddings");
    encdec_labels_.embed_grad = program_.label("dense gradient of the shared embedding, added into its .grad");
  }
  enc_s_ = cfg_.training.sequence_length;
  dec_s_ = decoder_tokens_per_sequence(cfg_);
  const int64_t E = shape_.num_encoder_layers, L = shape_.num_layers;
  const bool ckpt = resolved_.checkpointing == Checkpointing::Full;
  const int64_t er = dims_.e_res, b = dims_.b, a = dims_.a;
  f.casts.assign(static_cast<size_t>(L), LayerCasts{});  // autocast's cache lives per forward
  casts_.swap(f.casts);
  f.saved.assign(static_cast<size_t>(L), SavedLayer{});
  f.host.assign(static_cast<size_t>(L), {});
  // input_ids, labels and decoder_input_ids (the labels shifted right: T5ForConditionalGeneration._shift_right)
  f.inputs = act(mul(8, add(mul(b, enc_s_), mul(2, b, dec_s_))), labels_.inputs, -1);
  std::vector<uint32_t> gathered;
  auto run_block = [&](int64_t l, uint32_t res, std::vector<uint32_t>* cache) {
    gather(l, gathered);
    const int32_t li = static_cast<int32_t>(l);
    SavedLayer& sv = f.saved[static_cast<size_t>(l)];
    res = ckpt ? t5_block_checkpointed(li, res, sv) : t5_block_forward(li, res, sv, true, cache);
    for (uint32_t g : gathered) drop(g);
    gathered.clear();
    return res;
  };

  // ---- encoder over the source tokens
  use_stack(false);
  gather(-1, gathered);
  uint32_t res = t5_embed(f.embed_saved);
  for (uint32_t g : gathered) drop(g);
  gathered.clear();
  // Block 0's compute_bias plus the [b, 1, 1, s] padding mask: [b, heads, s, s], passed to every block.
  const uint32_t enc_bias = act(mul(er, a, b, mul(enc_s_, enc_s_)), encdec_labels_.bias, 0);
  for (int64_t l = 0; l < E; ++l) res = run_block(l, res, nullptr);
  // Checkpoints keep their inputs, the bias among them, until their backward; otherwise the stack's locals go.
  if (ckpt) f.enc_keep.push_back(enc_bias);
  else drop(enc_bias);
  uint32_t enc_out = t5_norm(-1, res, f.enc_final_saved, true);
  if (cfg_.model.hidden_dropout > 0) enc_out = dropout(enc_out, mul(dims_.T, dims_.h), er, true, encdec_labels_.enc_out, -1, f.enc_final_saved);
  f.enc_out = enc_out;

  // ---- decoder over the target tokens
  use_stack(true);
  gather(-1, gathered);
  res = t5_embed(f.dec_embed_saved);
  for (uint32_t g : gathered) drop(g);
  gathered.clear();
  // _update_causal_mask's [b, 1, t, t] mask, block 0's self-attention bias [b, heads, t, t] and its cross-attention
  // bias (zeros [1, heads, t, s] plus the encoder mask [b, 1, 1, s]), all passed on to every block.
  std::vector<uint32_t> dec_shared = {act(mul(er, b, mul(dec_s_, dec_s_)), encdec_labels_.causal_mask, -1),
                                      act(mul(er, a, b, mul(dec_s_, dec_s_)), encdec_labels_.bias, static_cast<int32_t>(E)),
                                      act(mul(er, a, b, mul(dec_s_, enc_s_)), encdec_labels_.bias, static_cast<int32_t>(E))};
  std::vector<uint32_t> cache;
  for (int64_t l = E; l < L; ++l) res = run_block(l, res, &cache);
  if (ckpt) f.dec_keep = dec_shared;
  else for (uint32_t t : dec_shared) drop(t);

  // ---- head and loss over the target tokens
  gather(L, gathered);
  std::vector<uint32_t> transient;
  t5_head_forward(res, f.loss_saved, transient);
  f.gathered_post = gathered;
  // T5ForConditionalGeneration.forward returns: its locals (the decoder output) go; the model outputs (logits,
  // the cache, the encoder output) go too unless the training loop holds them (hf_loop) until after backward.
  for (uint32_t t : transient) drop(t);
  if (resolved_.holds_logits) f.out_keep = cache;
  else for (uint32_t t : cache) drop(t);
  // The outermost autocast region exits: weight copies cached under a checkpoint's no_grad go.
  for (uint32_t l : ckpt_casts_) drop_casts(casts_[l]);
  ckpt_casts_.clear();
  casts_.swap(f.casts);
  f.held_logits = held_logits_;
  held_logits_ = UINT32_MAX;
  use_stack(false);
}

void StepBuilder::backward_encdec(InFlight& f) {
  begin_backward();
  casts_.swap(f.casts);
  const int64_t E = shape_.num_encoder_layers, L = shape_.num_layers;
  const bool ckpt = resolved_.checkpointing == Checkpointing::Full;
  std::vector<uint32_t> gathered;
  uint32_t bias_grad = UINT32_MAX, cross_grad = UINT32_MAX, enc_out_grad = UINT32_MAX;
  auto block_backward = [&](int64_t l, uint32_t& dres) {
    const int32_t li = static_cast<int32_t>(l);
    SavedLayer& sv = f.saved[static_cast<size_t>(l)];
    gather(l, gathered);
    if (ckpt) {
      // Recompute with grad on the kept input, then backward through the recomputed graph.
      const uint32_t in = sv.attn.front();
      SavedLayer& re = recompute_;
      re.attn.clear(), re.mlp.clear(), re.cross.clear();
      uint32_t out = t5_block_forward(li, in, re, false, nullptr);
      t5_block_backward(li, dres, re, bias_grad, cross_grad, enc_out_grad);
      drop(out);
      for (uint32_t t : sv.attn) drop(t);
      sv.attn.clear();
    } else {
      t5_block_backward(li, dres, sv, bias_grad, cross_grad, enc_out_grad);
    }
    release_layer_grads(l);
    reshard_after_backward(l);
    step_in_backward(l);
    for (uint32_t g : gathered) drop(g);
    gathered.clear();
  };
  // The shared embedding's backward: a dense [vocab, d_model] gradient, the .grad itself at its first use in
  // backward (untied), else added into the .grad that exists.
  auto embedding_backward = [&](bool last) {
    gather(-1, gathered);
    const bool exists = cfg_.model.tie_word_embeddings || grad_created_[0];
    if (exists && !shape_.pre.front().frozen) {
      uint32_t dense = tmp(mul(recipe_.grad_bytes, dims_.V, dims_.h), encdec_labels_.embed_grad, -1);
      drop(dense);
    }
    alloc_layer_grads(-1);
    if (last) {  // FSDP's root unit (embedding, final norms, head) reshards after its last backward
      release_layer_grads(-1);
      reshard_after_backward(-1);
      reshard_after_backward(shape_.num_layers);
      step_in_backward(-1);
    }
    for (uint32_t g : gathered) drop(g);
    gathered.clear();
  };
  auto release = [&](std::vector<uint32_t>& v) {
    for (auto it = v.rbegin(); it != v.rend(); ++it) drop(*it);
    v.clear();
  };

  // ---- head and decoder
  use_stack(true);
  uint32_t dres = t5_head_backward(f.loss_saved);
  release_layer_grads(L);
  step_in_backward(L);
  release(f.gathered_post);
  for (int64_t l = L - 1; l >= E; --l) block_backward(l, dres);
  for (uint32_t* g : {&bias_grad, &cross_grad})  // complete: they flow into relative_attention_bias
    if (*g != UINT32_MAX) drop(*g), *g = UINT32_MAX;
  release(f.dec_keep);
  release(f.dec_embed_saved);
  embedding_backward(false);
  drop(dres);
  // No decoder block reads the encoder output any more; the loop may still hold it in the outputs.
  if (resolved_.holds_logits) f.out_keep.push_back(f.enc_out);
  else drop(f.enc_out);
  f.enc_out = UINT32_MAX;

  // ---- encoder: its output's accumulated gradient flows back through final_layer_norm and the blocks
  use_stack(false);
  dres = enc_out_grad != UINT32_MAX ? enc_out_grad : tmp(mul(dims_.e_res, dims_.T, dims_.h), encdec_labels_.enc_out_grad, -1);
  release(f.enc_final_saved);
  norm_backward(-1, dres);
  for (int64_t l = E - 1; l >= 0; --l) block_backward(l, dres);
  if (bias_grad != UINT32_MAX) drop(bias_grad);
  release(f.enc_keep);
  release(f.embed_saved);
  embedding_backward(true);
  if (f.held_logits != UINT32_MAX) drop(f.held_logits), f.held_logits = UINT32_MAX;
  release(f.out_keep);
  drop(dres);
  drop(f.inputs);
  casts_.swap(f.casts);
  end_backward();
}

}  // namespace memsim
