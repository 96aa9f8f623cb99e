// What autograd keeps between forward and backward, tensor by tensor, and the temporaries of both passes.
//
// The saved set of a decoder layer follows the autograd rules of each op (a linear saves its input, silu its
// input, a product both operands, RMSNorm in HF's eager form an fp32 copy of its input, SDPA/flash q, k, v, the
// output and an fp32 logsumexp): MEMORY_FORMULAS.md 3.3, with the variants of attention kernel, norm
// implementation, precision and checkpointing derived in the project's research notes on HF modeling_llama.py,
// torchtune and litgpt. Backward temporaries are the activation gradients alive at once inside one layer.
#include <algorithm>
#include <cmath>
#include <tuple>

#include "checked.h"
#include "step_builder.h"

namespace memsim {

namespace {

bool erase(std::vector<uint32_t>& v, uint32_t t) {
  const auto it = std::remove(v.begin(), v.end(), t);
  const bool found = it != v.end();
  v.erase(it, v.end());
  return found;
}

int64_t next_pow2(int64_t x) {
  int64_t p = 1;
  while (p < x) p *= 2;
  return p;
}

}  // namespace

uint32_t StepBuilder::embed_forward() {
  // The embedding output is the first residual; under autocast it is fp32 (embedding is not an autocast op).
  uint32_t res = act(mul(d_.e_res, d_.Tn, d_.h), L_.residual, -1);
  if (c_.model.position_embedding_type == PositionType::Absolute) {  // GPT-2: wte(ids) + wpe(pos)
    uint32_t pos = tmp(mul(d_.e_res, d_.Tn, d_.h), L_.residual, -1);
    uint32_t sum = act(mul(d_.e_res, d_.Tn, d_.h), L_.residual, -1);
    drop(pos);
    drop(res);
    res = sum;
  }
  if (!c_.model.post_layernorm && c_.model.hidden_dropout > 0) {
    // Embedding dropout (GPT-2 embd_pdrop, Megatron's embedding dropout; Korthikanti et al. 2022 sec. 4.3: sbhp / t
    // on the first stage).
    res = dropout(res, mul(d_.Tn, d_.h), d_.e_res, true, L_.residual, -1, embed_saved_);
  }
  if (c_.model.post_layernorm) {
    // BertEmbeddings: LayerNorm(sum) saves its input, mean and rstd; dropout saves a 1-byte mask.
    embed_saved_.push_back(res);
    embed_saved_.push_back(act(mul(8, d_.T), L_.norm_rstd, -1));
    uint32_t out = act(mul(d_.e_res, d_.T, d_.h), L_.residual, -1);
    if (c_.model.hidden_dropout > 0) out = dropout(out, mul(d_.T, d_.h), d_.e_res, true, L_.residual, -1, embed_saved_);
    res = out;
  }
  return res;
}

// A post-LN encoder layer (HF BertLayer): attention (eager softmax and dropout, or SDPA), then
// LayerNorm(attention + x), the GELU MLP, and LayerNorm(mlp + that). Autograd saves, per token and hidden unit
// in fp32: x, q, k, v, the context copy, two LayerNorm inputs, the attention output, both MLP tensors and the
// dropout masks (66 bsh + 9 a s^2 b + 16 bs, Korthikanti et al. 2022 sec. 4.1 counted for fp32); under fp16
// autocast 42 bsh + 7 a s^2 b + 16 bs.
uint32_t StepBuilder::layer_forward_post_ln(int32_t layer, uint32_t x, SavedLayer& saved, bool keep_s2, bool free_input) {
  const auto& m = c_.model;
  const int64_t e = d_.e, th = mul(d_.T, d_.h);
  auto& A = saved.attn;
  if (d_.amp && casts_[layer] == UINT32_MAX) {
    casts_[layer] = tmp(mul(matmul_numel(s_.params_of(layer)), pr_.autocast_copy_bytes), L_.cast, layer);
  }
  // q, k and v save their input: x itself, or under autocast one cast of it each.
  if (d_.amp) for (int i = 0; i < 3; ++i) A.push_back(act(mul(2, th), L_.norm_out_cast, layer));
  else if (free_input) A.push_back(x);
  for (uint32_t lbl : {L_.q, L_.k, L_.v}) A.push_back(act(mul(e, d_.T, d_.h_q), lbl, layer));
  if (rs_.attention != Attention::Eager) {
    // BertSdpaSelfAttention (transformers >= 4.41): scaled_dot_product_attention with the dropout inside the
    // kernel, and no mask when nothing is padded. The flash or memory-efficient kernel keeps q, k, v, its output
    // (whose transpose back is contiguous, so the dense reads it without a copy) and an fp32 logsumexp, as the
    // decoders' SDPA path.
    A.push_back(act(mul(e, d_.T, d_.h_q), L_.attn_out, layer));
    const int64_t s_lse = e == 4 ? round_up(d_.s, 32) : d_.s;  // the efficient kernel pads the LSE to 32
    if (keep_s2) A.push_back(act(mul(4, d_.a, d_.b, s_lse), L_.lse, layer));
  } else {
    // scores / sqrt(d) + mask -> softmax (fp32 under autocast: softmax is on its fp32 list) -> dropout
    const int64_t s2 = mul(d_.a, d_.b, d_.s, d_.s);
    const int64_t sm_bytes = d_.amp ? 4 : e;
    std::vector<uint32_t> s2_saved;
    uint32_t sc = tmp(mul(e, s2), L_.scores, layer);
    uint32_t scaled = tmp(mul(e, s2), L_.scores, layer);
    drop(sc);
    // torch <= 1.10's softmax kept its input for backward as well (training.softmax_saves_input, resolved).
    const bool keep_input = keep_s2 && rs_.softmax_saves_input;
    uint32_t masked = softmax_input(mul(sm_bytes, s2), L_.scores, layer, keep_input);
    drop(scaled);
    uint32_t sm = keep_s2 ? act(mul(sm_bytes, s2), L_.softmax, layer) : tmp(mul(sm_bytes, s2), L_.softmax, layer);
    s2_saved.push_back(sm);
    if (keep_input) s2_saved.push_back(masked);
    else drop(masked);
    auto s2_alloc = [&](int64_t bytes, uint32_t label) { return keep_s2 ? act(bytes, label, layer) : tmp(bytes, label, layer); };
    uint32_t probs = sm;
    if (m.attention_dropout > 0) {
      s2_saved.push_back(s2_alloc(s2, L_.attn_mask));
      // the dropout output feeds probs @ v directly, or through a cast under autocast
      probs = d_.amp ? tmp(mul(sm_bytes, s2), L_.probs, layer) : s2_alloc(mul(sm_bytes, s2), L_.probs);
      if (!d_.amp) s2_saved.push_back(probs);
    }
    if (d_.amp) {  // probs @ v saves the low-precision cast
      s2_saved.push_back(s2_alloc(mul(e, s2), L_.probs));
      if (probs != sm) drop(probs);
    }
    uint32_t ctx = tmp(mul(e, d_.T, d_.h_q), L_.attn_tmp, layer);
    A.push_back(act(mul(e, d_.T, d_.h_q), L_.attn_out, layer));  // permute(...).contiguous(), saved by dense
    drop(ctx);
    if (keep_s2) A.insert(A.end(), s2_saved.begin(), s2_saved.end());
    else for (uint32_t t : s2_saved) drop(t);
  }
  uint32_t o = tmp(mul(e, th), L_.o_out, layer);
  if (m.hidden_dropout > 0) A.push_back(act(th, L_.hidden_mask, layer));
  uint32_t sum = act(mul(d_.e_res, th), L_.residual, layer);  // saved by LayerNorm
  drop(o);
  if (d_.amp && free_input) drop(x);
  A.push_back(sum);
  A.push_back(act(mul(8, d_.T), L_.norm_rstd, layer));
  uint32_t att = act(mul(d_.e_res, th), L_.residual, layer);  // LayerNorm output: the attention output

  // MLP: the intermediate dense saves its input (the attention output, or its cast), GELU its input, the output
  // dense its input.
  auto& M = saved.mlp;
  if (d_.amp) M.push_back(act(mul(2, th), L_.norm_out_cast, layer));
  else M.push_back(att);
  M.push_back(act(mul(e, d_.T, d_.f), L_.mlp_fc1, layer));
  M.push_back(act(mul(e, d_.T, d_.f), L_.mlp_gelu, layer));
  uint32_t out = tmp(mul(e, th), L_.mlp_out, layer);
  if (m.hidden_dropout > 0) M.push_back(act(th, L_.hidden_mask, layer));
  uint32_t sum2 = act(mul(d_.e_res, th), L_.residual, layer);
  drop(out);
  if (d_.amp) drop(att);
  M.push_back(sum2);
  M.push_back(act(mul(8, d_.T), L_.norm_rstd, layer));
  return act(mul(d_.e_res, th), L_.residual, layer);
}

// What the linears reading one tensor (q/k/v, gate/up, o_proj, down_proj, lm_head) keep of it for backward.
// A trainable weight needs the input for its gradient: the tensor itself once, or under autocast one cast copy
// per matmul (cached_cast caches only leaf weights). A frozen weight needs nothing. A LoRA adapter's lora_A
// saves what it reads: the tensor itself when it reads it unchanged, else its own copy (cast to the adapter
// dtype, autocast's cast, or dropout's output and mask), and lora_B saves lora_A's output (peft
// tuners/lora/layer.py Linear.forward; MEMORY_FORMULAS.md 4.4). Returns whether the tensor itself is saved.
const StepBuilder::ModuleInfo& StepBuilder::module_info(const char* module) const {
  for (const auto& [name, info] : module_info_)
    if (name == module) return info;
  const std::string m(module);
  ModuleInfo info;
  info.qkv = m == "q_proj" || m == "k_proj" || m == "v_proj";
  info.targeted = peft_targets(c_.peft, m);
  info.trainable = !c_.peft.enabled() || trainable_module(module);
  info.ia3 = c_.peft.kind() == PeftMethod::Ia3;
  info.dora = c_.peft.kind() == PeftMethod::Dora;
  module_info_.push_back({module, info});
  return module_info_.back().second;
}

bool StepBuilder::linear_inputs(int32_t layer, std::initializer_list<const char*> modules, int64_t width,
                                std::vector<uint32_t>& saved, int64_t tokens, bool low_precision_input) {
  const int64_t tw = mul(tokens, width);
  const auto& peft = c_.peft;
  bool need_self = false;
  bool qkv_done = false;  // a fused qkv linear (litgpt, Megatron) carries one adapter for all of q, k, v
  for (const char* mod : modules) {
    const ModuleInfo info = module_info(mod);  // a copy: module_info may grow its cache below
    if (rs_.fused_qkv && info.qkv && info.targeted) {
      if (qkv_done) continue;
      qkv_done = true;
    }
    if (info.trainable) {
      if (d_.amp && !low_precision_input) saved.push_back(act(mul(2, tw), L_.norm_out_cast, layer));
      else need_self = true;
    }
    // Old bitsandbytes keeps a 4-bit linear's input whenever the input requires grad: everywhere but the first
    // layer's q/k/v, which read the frozen embedding's normalised output.
    if (rs_.bnb_saves_input && peft.four_bit() &&
        module_quantized(layer, mod) && !(layer == 0 && info.qkv))
      need_self = true;
    if (!info.targeted) continue;
    if (info.ia3) {
      need_self |= ia3_inputs(layer, mod, width, saved, tokens);
      continue;
    }
    // Unsloth's kernels cast A and B to the activation dtype (A.to(dtype)) and save only X: X @ A is recomputed in
    // backward (fast_lora.py LoRA_QKV / LoRA_W / LoRA_MLP save_for_backward).
    if (unsloth_lora_kernels()) {
      need_self = true;
      continue;
    }
    const int64_t ab = adapter_bytes();
    if (peft.lora_dropout > 0) {
      saved.push_back(act(tw, L_.lora_in, layer));  // dropout mask
      saved.push_back(act(mul(d_.amp ? 2 : ab, tw), L_.lora_in, layer));
    } else if (d_.amp) {
      saved.push_back(act(mul(2, tw), L_.lora_in, layer));
    } else if (ab != d_.e) {
      saved.push_back(act(mul(ab, tw), L_.lora_in, layer));
    } else {
      need_self = true;
    }
    saved.push_back(act(mul(d_.amp ? 2 : ab, tokens, peft.lora_rank), L_.lora_in, layer));
    // A fused qkv linear adapted on some of q, k, v only: the adapter's [T, enabled width] delta is scattered into
    // zeros of the full width (litgpt lora.py LoRAQKVLinear.zero_pad: index_copy), whose backward keeps that source
    // (derivatives.yaml index_copy: grad.index_select(dim, index).expand_as(source)).
    if (rs_.fused_qkv && info.qkv) {
      const bool q = module_info("q_proj").targeted, k = module_info("k_proj").targeted,
                 v = module_info("v_proj").targeted;
      const int64_t enabled = add(q ? d_.h_q : 0, mul(d_.h_kv, int64_t{k} + int64_t{v}));
      if (!(q && k && v)) saved.push_back(act(mul(d_.amp ? 2 : ab, tokens, enabled), L_.lora_in, layer));
    }
    if (info.dora) dora_inputs(layer, mod, width, saved, tokens);
  }
  return need_self;
}

// Context parallel's key/value buffers during one attention op, for keys and values of `kvw` per token. The
// all-gather rotater (torch _attention.py _AllGatherRotater, torchtitan's default rotate method since its PR #728,
// 2024-12) gathers every rank's chunk into one buffer of cp x the local keys and values, alive for the whole ring
// loop; next_kv = cat(k, v) is made each iteration besides. The all-to-all rotater (torchtitan before, and the
// point-to-point ring of Megatron-Core and Transformer Engine) holds the chunk it computes on and the one it
// receives. Only the gathered buffer grows with cp at a fixed length per rank.
int64_t StepBuilder::ring_kv_bytes(int64_t kvw) const {
  const int64_t cp = c_.parallel.context_parallel_size;
  const int64_t chunk = mul(2, d_.e, d_.T, kvw);  // this rank's keys and values
  return rs_.cp_rotate == CpRotate::AllGather ? mul(cp + 1, chunk) : mul(2, chunk);
}

// Output width of a layer linear, by PEFT's module name.
int64_t StepBuilder::out_width(const std::string& module) const {
  return module == "q_proj"                           ? d_.h_q
         : module == "k_proj" || module == "v_proj"    ? d_.h_kv
         : module == "gate_proj" || module == "up_proj" ? d_.f
                                                        : d_.h;  // o_proj, down_proj
}

// DoRA (peft tuners/lora/dora.py DoraLinearLayer.forward) on top of the LoRA terms: lora_result = lora_B(lora_A(x))
// is kept by `mag_norm_scale * lora_result` for the magnitude's gradient, and `(mag_norm_scale - 1) * base_result`
// keeps base_result. Without dropout (lora/layer.py passes base_result = result when dropout is nn.Identity) that
// is the base layer's own output; with dropout it is F.linear(x, weight.to(x.dtype)) on the dropped-out input,
// which saves the frozen weight's cast for x's gradient. Every forward also casts the weight to x's dtype and adds
// scaling * lora_weight to it for the detached column norm: two weight-sized transients. (x_eye's graph is
// detached at once, so nothing of it stays.)
void StepBuilder::dora_inputs(int32_t layer, const std::string& module, int64_t width, std::vector<uint32_t>& saved,
                              int64_t tokens) {
  const int64_t ab = d_.amp ? 2 : adapter_bytes();  // under autocast the matmuls return bf16
  const int64_t out = out_width(module);
  uint32_t w = tmp(mul(adapter_bytes(), width, out), L_.lora_in, layer);
  drop(tmp(mul(adapter_bytes(), width, out), L_.lora_in, layer));
  if (c_.peft.lora_dropout > 0) {
    saved.push_back(act(mul(ab, width, out), L_.lora_in, layer));   // the weight's cast, saved by F.linear
    saved.push_back(act(mul(ab, tokens, out), L_.lora_in, layer));  // base_result
  } else {
    saved.push_back(act(mul(d_.e, tokens, out), L_.lora_in, layer));  // the base layer's output
  }
  drop(w);
  saved.push_back(act(mul(ab, tokens, out), L_.lora_in, layer));  // lora_result
}

// IA3 (peft tuners/ia3/layer.py Linear.forward): the learned vector, in its own dtype (fp32: update_layer makes it
// with torch.randn), scales the base output, `result.to(dtype) * ia3_scaling`, or for a feedforward module the
// input, `(x.to(dtype) * ia3_scaling).to(weight.dtype)`. The product saves its tensor operand for the vector's
// gradient: the pre-scale output cast to the vector's dtype, a new [tokens, out] tensor; or the input cast to it,
// a copy unless the input already has that dtype (then the input itself, and the function returns true). The
// bitsandbytes layers (ia3/bnb.py) instead upcast x to fp32 when autocast is off (`x = x.float()`) and multiply
// in that dtype, which saves the same fp32 tensors; under autocast they multiply x (or the output) as it is.
bool StepBuilder::ia3_inputs(int32_t layer, const std::string& module, int64_t width, std::vector<uint32_t>& saved,
                             int64_t tokens) {
  const int64_t ab = any_quantized_ ? (d_.amp ? d_.e : 4) : adapter_bytes();
  if (ia3_feedforward(c_.peft, module)) {
    if (ab == d_.e) return true;
    saved.push_back(act(mul(ab, tokens, width), L_.lora_in, layer));
    return false;
  }
  const int64_t out = out_width(module);
  saved.push_back(act(mul(ab, tokens, out), L_.lora_in, layer));
  drop(tmp(mul(ab, tokens, out), L_.lora_in, layer));  // the scaled product, cast back to the input's dtype
  return false;
}

// Whether the norm that feeds these consumers has a trainable weight: full fine-tuning, LN tuning's copy, or the
// norm named in modules_to_save.
bool StepBuilder::norm_trainable(int32_t layer, std::initializer_list<const char*> consumers) const {
  if (!c_.peft.enabled()) return true;
  // The answer depends on the layer's parameter list and the first consumer only: worked out once per pair.
  const std::vector<ParamTensor>* params = layer < 0 ? &s_.post : &s_.params_of(layer);
  for (const auto& [key, trainable] : norm_trainable_)
    if (key.first == params && key.second == *consumers.begin()) return trainable;
  const std::string first = *consumers.begin();
  const std::string norm = first == "lm_head"                          ? "norm."
                           : first == "q_proj" || first == "q_a_proj" ? "input_layernorm."
                                                                      : "post_attention_layernorm.";
  bool trainable = false;
  for (const auto& t : *params)
    if (t.kind == ParamKind::Norm && has_grad(t) &&
        (t.name.rfind(norm, 0) == 0 || t.name.rfind("modules_to_save." + norm, 0) == 0)) {
      trainable = true;
      break;
    }
  norm_trainable_.push_back({{params, *consumers.begin()}, trainable});
  return trainable;
}

// Saves what the norm's backward needs and writes its output, kept as linear_inputs decides.
void StepBuilder::norm_forward(int32_t layer, uint32_t res, bool& res_retained, std::vector<uint32_t>& saved,
                               std::initializer_list<const char*> consumers, bool own_res) {
  const int64_t th = mul(d_.Tn, d_.h);  // sequence parallel: norms see T / t tokens
  const size_t mark = saved.size();
  res_retained = false;
  if (c_.model.norm_type == NormType::LayerNorm) {
    // aten native_layer_norm saves its input, mean and rstd (fp32, one per token).
    res_retained = true;
    saved.push_back(act(mul(4, d_.Tn), L_.norm_rstd, layer));
    saved.push_back(act(mul(4, d_.Tn), L_.norm_rstd, layer));
  } else if (norm_impl(layer) == NormImpl::Fused) {
    // Fused RMSNorm kernels (Apex, TE, Liger) save their input and rstd, and so does a compiled layer's norm.
    res_retained = true;
    saved.push_back(act(mul(4, d_.Tn), L_.norm_rstd, layer));
  } else {
    // HF LlamaRMSNorm: x32 = x.to(fp32) is saved by pow and by x32 * rstd; under fp32 or autocast the residual
    // already is fp32, so x32 is the residual itself.
    if (d_.e_res == 4) res_retained = true;
    else saved.push_back(act(mul(4, th), L_.norm_x32, layer));
    saved.push_back(act(mul(4, d_.Tn), L_.norm_rstd, layer));
    // weight * normed saves normed for the weight's gradient: cast back to the input dtype in HF (eager_fp32),
    // kept in fp32 by torchtune and litgpt (fp32_scale: (x_normed * weight.float()).to(dtype)). A frozen norm
    // weight (PEFT) needs no gradient, so nothing is saved for it; LN tuning's trainable copy needs it again.
    const int64_t scaled = norm_impl(layer) == NormImpl::Fp32Scale ? 4 : d_.e_res;
    if (norm_trainable(layer, consumers)) saved.push_back(act(mul(scaled, th), L_.norm_scaled, layer));
  }
  if (res_retained && own_res) saved.push_back(res);  // else the caller (a checkpoint) keeps it
  uint32_t y = act(mul(d_.amp ? 4 : d_.e, th), L_.norm_out, layer);
  int64_t tokens = d_.Tn;
  if (gathered_inputs()) {  // DTensor sequence parallel: the linears read the all-gathered output
    tokens = d_.T;
    const uint32_t g = act(mul(d_.amp ? 4 : d_.e, d_.T, d_.h), L_.norm_out, layer);
    drop(y);
    y = g;
  }
  if (no_grad_) {
    // Under no_grad the norm's own intermediates go as soon as its output exists (the input stays with its
    // owner), and the output lives until its consumers' projections have run: no_grad_norm_out_.
    for (size_t i = mark; i < saved.size(); ++i)
      if (saved[i] != res) drop(saved[i]);
    saved.resize(mark);
    if (res_retained && own_res) saved.push_back(res);
    saved.push_back(y);
    no_grad_norm_out_ = y;
    return;
  }
  if (linear_inputs(layer, consumers, d_.h, saved, tokens)) saved.push_back(fp8_input(y, mul(tokens, d_.h), layer));
  else drop(y);
}

// Tied embeddings: lm_head and the embedding are one parameter, whose AccumulateGrad node has two inputs, so the
// autograd engine holds lm_head's gradient in the node's input buffer until the embedding's backward adds its own
// (torch/csrc/autograd/input_buffer.cpp InputBuffer::add). Two recorded H200 traces of Llama 3.2 1B, in bf16 and in
// fp32, show the dense embedding gradient, a third [V, h] block, then both addends freed: the result is a new
// tensor (an out-of-place sum, or AccumulateGrad's copy of one whose strides do not match the weight's). It becomes
// .grad, or is added into it in a later micro-batch. Under autocast lm_head's gradient comes through the weight
// cast's backward as a fresh fp32 tensor, which the buffer can add into in place: the H200 run of Llama 3.2 3B
// under amp_bf16 peaks at the end of backward without a third block (its allocated peak is 0.1% off without it,
// 2.9% over with it). Modelled where the gradients are plain tensors (not sharded, in Megatron's buffer, or stepped
// in backward).
bool StepBuilder::tied_sum() const {
  return c_.model.tie_word_embeddings && has_grad(s_.pre.front()) && !d_.amp && !shard_grads_ && !sp_.grad_buffer &&
         !c_.training.optimizer_in_backward && ctx_.has_pre && ctx_.has_post;
}

// FrameworkSpec::tp_saves_gathered_input, with sequence parallelism on: each norm's output is all-gathered to the
// whole sequence for the column-parallel linears that read it, and they save that.
bool StepBuilder::gathered_inputs() const { return rs_.framework->tp_saves_gathered_input && d_.Tn < d_.T; }

bool StepBuilder::module_quantized(int32_t layer, const std::string& module) const {
  const auto& ts = module == "lm_head" ? s_.post : layer >= 0 && layer < s_.num_layers ? s_.params_of(layer) : s_.pre;
  for (const auto& t : ts)
    if (t.quantized && module_name(t.name) == module) return true;
  return false;
}

// Bytes per element of a dequantized weight on its way into the matmul: bitsandbytes returns the quantization
// state's dtype; Lightning's plugin quantized an fp16 copy, so under bf16 compute a cast copy follows.
int64_t StepBuilder::dequant_bytes() const {
  const bool fp16_compute = c_.training.precision.find("fp16") != std::string::npos;
  return rs_.framework->bnb_via_lightning && !fp16_compute ? add(d_.e, 2) : d_.e;
}

// The quantized output head dequantized for one matmul (forward, or the input gradient in backward): alive
// while the matmul writes its output. UINT32_MAX when the head is not quantized.
uint32_t StepBuilder::head_dequant() {
  for (const auto& t : s_.post)
    if (t.quantized && module_name(t.name) == "lm_head") return tmp(mul(dequant_bytes(), t.numel), L_.dequant, -1);
  return UINT32_MAX;
}

void StepBuilder::drop_if(uint32_t t) {
  if (t != UINT32_MAX) drop(t);
}

// bitsandbytes MatMul4Bit / 8-bit matmuls dequantize the frozen weight for the GEMM, forward and backward
// (autograd/_functions.py: grad_A = grad_output @ dequantize_4bit(B)): one layer's largest weight at a time.
void StepBuilder::dequant(int32_t layer) {
  int64_t largest = 0;
  for (const auto& t : s_.params_of(layer))
    if (t.quantized) largest = std::max(largest, t.numel);
  if (largest == 0) return;
  uint32_t w = tmp(mul(dequant_bytes(), largest), L_.dequant, layer);
  drop(w);
}

// q_norm / k_norm on the projection outputs (Qwen3RMSNorm and Gemma3's per head, OLMo 2's over the whole width;
// modeling_qwen3.py Qwen3Attention.forward): the same RMSNorm as norm_forward's, at the projection's width, with
// one rstd per head (or per token). Returns the normalised output, which RoPE (or attention) consumes. Under
// autocast the fp32 weight times the 16-bit normed tensor promotes the output to fp32.
uint32_t StepBuilder::qk_norm_forward(int32_t layer, uint32_t x, int64_t width, int64_t heads, const char* name,
                                      std::vector<uint32_t>& saved, bool out_saved) {
  const int64_t e = d_.e, T = d_.T;
  const int64_t rstd = mul(4, T, c_.model.qk_norm_per_head ? heads : 1);
  bool trainable = false;
  for (const auto& t : s_.params_of(layer))
    if (t.kind == ParamKind::Norm && has_grad(t) && t.name.find(name) != std::string::npos) trainable = true;
  if (norm_impl(layer) == NormImpl::Fused) {
    saved.push_back(x);  // fused kernels (and compiled layers) save their input and rstd
    saved.push_back(act(rstd, L_.norm_rstd, layer));
  } else {
    // x.to(fp32) is saved by pow and by x32 * rstd; in fp32 it is x itself.
    if (e == 4) saved.push_back(x);
    else saved.push_back(act(mul(4, T, width), L_.norm_x32, layer)), drop(x);
    saved.push_back(act(rstd, L_.norm_rstd, layer));
    // weight * normed saves normed (cast back to the input dtype, or kept in fp32) for the weight's gradient.
    const int64_t scaled = norm_impl(layer) == NormImpl::Fp32Scale ? 4 : e;
    if (trainable && scaled == 4) {
      saved.push_back(act(mul(4, T, width), L_.norm_scaled, layer));  // x32 * rstd itself
    } else {
      uint32_t n32 = tmp(mul(4, T, width), L_.attn_tmp, layer);
      if (trainable) saved.push_back(act(mul(scaled, T, width), L_.norm_scaled, layer));
      drop(n32);
    }
  }
  const int64_t out = mul(d_.amp ? 4 : e, T, width);
  return out_saved ? act(out, L_.norm_out, layer) : tmp(out, L_.norm_out, layer);
}

// torch.compile of the decoder layers (torchtune training/_compile.py compile_model, torchtitan apply_compile: per
// block; HF Trainer: the whole model) with Inductor's default min-cut partitioner (torch/_functorch/
// partitioners.py): matmul and attention inputs and outputs must be saved (ban_recompute_materialized_backward,
// and mm/attention are not in recomputable_ops), a reduction's small output is saved (ban_recompute_reductions),
// and the pointwise ops between them are recomputed in backward. An RMSNorm thus keeps its input and rstd, like a
// fused kernel, instead of the fp32 copy and the normed tensor. Only the decoder layers are treated as compiled:
// torchtune and torchtitan compile per layer and leave the final norm before the head eager (HF Trainer's
// torch_compile wraps the whole model, whose final norm would be compiled too; that one norm is not modelled).
// Per layer this is 8 s b h + 2 s b f less (the SwiGLU's silu output too): 8.75 GiB over Llama 3.2 3B's 28 layers
// at 2 x 4096 tokens, against the 9.0 GiB drop of torchtune's README
// 'Optimization flags' table from '+ Packed' to '+ Compile' (PR #2003; tests/validation/cases/
// torchtune-flags-llama3.2-3b-packed+compile.json).
NormImpl StepBuilder::norm_impl(int32_t layer) const {
  return c_.training.compile && layer >= 0 && layer < s_.num_layers ? NormImpl::Fused : rs_.norm;
}

void StepBuilder::norm_backward(int32_t layer, uint32_t& dres) {
  // The gathered input's gradient is whole-sequence (in the gathered output's dtype) until the all-gather's
  // backward reduce-scatters it into this rank's tokens, which the norm's backward then reads.
  uint32_t scattered = UINT32_MAX;
  if (gathered_inputs()) {
    const int64_t eb = d_.amp ? 4 : d_.e;
    const uint32_t whole = tmp(mul(eb, d_.T, d_.h), L_.dres, layer);
    scattered = tmp(mul(eb, d_.Tn, d_.h), L_.dres, layer);
    drop(whole);
  }
  // HF eager RMSNorm backward holds about three fp32 [b, s, h] temporaries (pow/mean/mul backward and the
  // cast back); a fused or native LayerNorm kernel about one.
  const bool eager = c_.model.norm_type == NormType::RMSNorm && norm_impl(layer) != NormImpl::Fused;
  uint32_t t = tmp(mul(eager ? 12 : 4, d_.Tn, d_.h), L_.bwd_norm, layer);
  uint32_t nd = tmp(mul(d_.e_res, d_.Tn, d_.h), L_.dres, layer);
  drop(dres);
  dres = nd;
  drop(t);
  drop_if(scattered);
}

// A linear's saved input: the 16-bit tensor itself, or under Transformer Engine's fp8 its 1-byte cast
// (linear.py saved_inputmat / saved_inputmat_t), the 16-bit one going once the matmul is done.
uint32_t StepBuilder::fp8_input(uint32_t t, int64_t elements, int32_t layer) {
  if (!pr_.fp8_saved_inputs) return t;
  uint32_t q = act(elements, L_.fp8_input, layer);
  drop(t);
  return q;
}

// torchao float8 casts each linear's weight to fp8 for the matmul and drops it after: one layer's largest weight
// at a time, forward and backward.
void StepBuilder::fp8_cast(int32_t layer) {
  if (!pr_.fp8_transient_casts) return;
  int64_t largest = 0;
  for (const auto& t : s_.params_of(layer))
    if (t.kind == ParamKind::Matmul && !t.quantized) largest = std::max(largest, t.numel);
  if (largest > 0) drop(tmp(largest, L_.fp8_cast, layer));
}

void StepBuilder::attention_probs(int32_t layer, int64_t s2, bool convert, bool keep, std::vector<uint32_t>& saved) {
  const int64_t e = d_.e;
  auto alloc = [&](int64_t bytes, uint32_t label) {
    const uint32_t t = keep ? act(bytes, label, layer) : tmp(bytes, label, layer);
    saved.push_back(t);
    return t;
  };
  // torch <= 1.10's _softmax kept its input for backward too (training.softmax_saves_input, resolved): the fp32
  // conversion, or the scores themselves when they are its input.
  const bool keep_input = keep && rs_.softmax_saves_input;
  const uint32_t scores = softmax_input(mul(e, s2), L_.scores, layer, keep_input && !convert);
  const uint32_t conv = convert ? softmax_input(mul(4, s2), L_.attn_tmp, layer, keep_input) : UINT32_MAX;
  alloc(mul(4, s2), L_.softmax);  // _softmax saves its fp32 output
  if (keep_input) {
    saved.push_back(conv != UINT32_MAX ? conv : scores);
    if (conv != UINT32_MAX) drop(scores);
  } else {
    if (conv != UINT32_MAX) drop(conv);
    drop(scores);
  }
  // The cast back to the compute dtype for attn @ v (none in fp32: the matmul reads the softmax output itself). With
  // attention dropout it is the dropout's input, gone once its output exists: the matmul saves that output instead.
  const bool dropout = c_.model.attention_dropout > 0;
  uint32_t cast = UINT32_MAX;
  if (e < 4) cast = dropout ? tmp(mul(e, s2), L_.probs, layer) : alloc(mul(e, s2), L_.probs);
  if (dropout) {
    alloc(s2, L_.attn_mask);
    alloc(mul(e, s2), L_.probs);
    if (cast != UINT32_MAX) drop(cast);
  }
}

uint32_t StepBuilder::layer_forward(int32_t layer, uint32_t res, SavedLayer& saved, bool keep_s2, bool free_input) {
  const auto& m = c_.model;
  const int64_t e = d_.e;
  fp8_cast(layer);
  const bool gqa = d_.g < d_.a;
  // Autocast's cached low-precision weights: saved by the matmuls until this layer's backward.
  if (d_.amp && casts_[layer] == UINT32_MAX) {
    casts_[layer] = tmp(mul(matmul_numel(s_.params_of(layer)), pr_.autocast_copy_bytes), L_.cast, layer);
  }

  // ---- attention half
  bool retained = false;
  const bool mla = m.kv_lora_rank > 0;
  // Parallel attention (one norm per layer, Falcon): the MLP reads the same norm output and both results are
  // added to the input at the end, so no middle residual exists.
  const bool parallel = m.norms_per_layer == 1;
  if (mla) norm_forward(layer, res, retained, saved.attn, {"q_a_proj", "q_proj", "kv_a_proj_with_mqa"}, free_input);
  else norm_forward(layer, res, retained, saved.attn, {"q_proj", "k_proj", "v_proj"}, free_input);
  // Unsloth from 2025.2: matmul_lora dequantizes into its persistent buffer (unsloth_weight_buffer) in the forward
  // and the recomputation; only the backward's explicit fast_dequantize calls make new tensors.
  const bool dequant_here = any_quantized_ && !(unsloth() && rs_.unsloth_weight_buffer);
  if (dequant_here) dequant(layer);
  auto& A = saved.attn;
  if (mla) {
    mla_forward(layer, A);
  } else {
    const bool rope = m.position_embedding_type == PositionType::Rope;
    uint32_t q, k, v;
    if (rs_.fused_qkv && rope) {
      // One linear makes q, k and v (litgpt, Megatron): v is a view of its output, so whatever keeps v keeps the
      // whole [T, h_q + 2 h_kv] output; q and k are views that RoPE copies.
      v = act(mul(e, d_.T, add(d_.h_q, mul(2, d_.h_kv))), L_.v, layer);
      q = k = UINT32_MAX;  // views: nothing allocated until RoPE copies them
    } else {
      // Under a q/k norm the projection output is what the norm saves when it needs no fp32 copy of it.
      // Unsloth's Fast_RoPE_Embedding rotates q and k in place: the projections are what attention saves.
      const bool norm_keeps = (m.qk_norm && (e == 4 || norm_impl(layer) == NormImpl::Fused)) || unsloth();
      q = rope && !norm_keeps ? tmp(mul(e, d_.T, d_.h_q), L_.q, layer) : act(mul(e, d_.T, d_.h_q), L_.q, layer);
      k = rope && !norm_keeps ? tmp(mul(e, d_.T, d_.h_kv), L_.k, layer) : act(mul(e, d_.T, d_.h_kv), L_.k, layer);
      v = act(mul(e, d_.T, d_.h_kv), L_.v, layer);
      if (m.qk_norm) {
        q = qk_norm_forward(layer, q, d_.h_q, d_.a, "self_attn.q_norm.", A, !rope);
        k = qk_norm_forward(layer, k, d_.h_kv, d_.g, "self_attn.k_norm.", A, !rope);
      }
    }
    A.push_back(v);
    // q, k and v are projected: the norm's output has no reader left, unless the MLP reads it too (parallel).
    if (!parallel) no_grad_release(A, {no_grad_norm_out_});
    if (rope && !unsloth()) {
      // RoPE saves nothing sized (cos/sin need no grad); its outputs are what attention saves. Under autocast
      // HF computes cos/sin in fp32, so the rotated q/k are fp32 transients and SDPA saves their casts.
      uint32_t qt = UINT32_MAX, kt = UINT32_MAX;
      if (d_.amp) qt = tmp(mul(4, d_.T, d_.h_q), L_.q_rot, layer), kt = tmp(mul(4, d_.T, d_.h_kv), L_.k_rot, layer);
      if (q != UINT32_MAX) drop(q);
      q = act(mul(e, d_.T, d_.h_q), L_.q_rot, layer);
      if (k != UINT32_MAX) drop(k);
      k = act(mul(e, d_.T, d_.h_kv), L_.k_rot, layer);
      if (d_.amp) drop(qt), drop(kt);
    }
    A.push_back(q);
    A.push_back(k);
    const bool repeat = kv_repeated();
    if (repeat) {
      const uint32_t kr = act(mul(e, d_.T, d_.h_q), L_.kv_rep, layer);
      const uint32_t vr = act(mul(e, d_.T, d_.h_q), L_.kv_rep, layer);
      A.push_back(kr), A.push_back(vr);
      erase(A, k), drop(k);
      erase(A, v), drop(v);
      k = kr, v = vr;  // what attention reads from here on
    }
    const int64_t s2 = mul(d_.a, d_.b, d_.s, d_.s);
    if (rs_.attention == Attention::Eager) {
      // scores (compute dtype) -> softmax(dtype=fp32) saves its fp32 result -> cast for attn @ V (saved) ->
      // dropout saves a 1-byte mask and its output. transpose(1, 2).contiguous() copies the output for o_proj.
      std::vector<uint32_t> s2_tensors;
      // softmax(x, dtype=fp32) (ATen SoftMax.cpp softmax): a CUDA fp16 tensor goes to _softmax(x, half_to_float)
      // as it is; any other is converted to fp32 first. Under autocast the fp32 mask has already promoted the
      // scores, so the 4-byte tensor is their masked sum rather than a conversion. torch <= 1.10 kept _softmax's
      // input for backward too.
      const bool half_to_float = e == 2 && !d_.amp && pr_.id.find("fp16") != std::string_view::npos;
      // transformers 4.38 indexes the layer's mask with cache_position (attention_mask[:, :, cache_position, :kv]),
      // a [b, 1, s, s] copy in the model dtype that the addition reads and nothing keeps.
      const uint32_t indexed = mask_.on && rs_.mask.build == MaskBuild::MaxPositions
                                   ? tmp(mul(d_.e_res, d_.b, d_.s, d_.s), LM_.copy, layer)
                                   : UINT32_MAX;
      attention_probs(layer, s2, e < 4 && !half_to_float, keep_s2, s2_tensors);
      if (indexed != UINT32_MAX) drop(indexed);
      uint32_t o_pre = tmp(mul(e, d_.T, d_.h_q), L_.attn_tmp, layer);
      A.push_back(act(mul(e, d_.T, d_.h_q), L_.attn_out, layer));
      drop(o_pre);
      no_grad_release(A, {q, k, v});
      // Selective recomputation (Megatron) recomputes the core attention instead of keeping these.
      if (keep_s2) A.insert(A.end(), s2_tensors.begin(), s2_tensors.end());
      else for (uint32_t t : s2_tensors) drop(t);
    } else {
      // SDPA in fp32 cannot use flash; with native GQA (enable_gqa) the efficient kernel refuses and SDPA falls
      // back to the math kernel, which saves the fp32 softmax (HF PR #46960).
      if (e == 4 && rs_.attention == Attention::Sdpa && gqa && !repeat && keep_s2)
        A.push_back(act(mul(4, s2), L_.softmax, layer));
      // transformers' mask (docs/versions.md 5): its per-call copies, and what the kernel keeps of it. The kept ones
      // (and the math kernel's) go once the call is done where nothing is saved: a checkpointed forward under
      // no_grad, or Megatron's selective recomputation of the core attention.
      const bool keep = keep_s2 && !no_grad_;
      std::vector<uint32_t> mask_kept, mask_gone;
      const bool math = math_kernel();
      if (mask_.on) sdpa_mask_inputs(layer, mask_kept, mask_gone, keep);
      if (math) {
        mask_labels();
        // _scaled_dot_product_attention_math (aten attention.cpp, torch 2.0-2.1): q * sqrt(scale) and
        // k.transpose(-2, -1) * sqrt(scale) are new tensors that the first matmul keeps; the scores take the mask
        // in place (attn.add_) and softmax keeps its output in the input dtype, which attn @ v keeps too; with
        // dropout, its mask and output.
        const int64_t kw = repeat ? d_.h_q : d_.h_kv;
        mask_kept.push_back(act(mul(e, d_.T, d_.h_q), LM_.math_qk, layer));
        mask_kept.push_back(act(mul(e, d_.T, kw), LM_.math_qk, layer));
        const uint32_t scores = tmp(mul(e, s2), LM_.math_scores, layer);
        mask_kept.push_back(act(mul(e, s2), LM_.math_softmax, layer));
        drop(scores);
        if (m.attention_dropout > 0) {
          mask_kept.push_back(act(s2, L_.attn_mask, layer));
          mask_kept.push_back(act(mul(e, s2), L_.probs, layer));
        }
      }
      // Ring attention (context parallel), for the duration of the op: ring_kv_bytes' key/value buffers, and the
      // partial outputs merged in fp32 (_SDPAMerger with convert_to_f32: the fp32 output and about three
      // temporaries of its size for out - sigmoid(lse delta) * (out - block_out)).
      uint32_t ring = UINT32_MAX;
      if (c_.parallel.context_parallel_size > 1) {
        const int64_t kvw = repeat ? d_.h_q : d_.h_kv;
        ring = tmp(add(ring_kv_bytes(kvw), mul(4 * 4, d_.T, d_.h_q)), L_.ring, layer);
      }
      A.push_back(act(mul(e, d_.T, d_.h_q), L_.attn_out, layer));  // one storage for the kernel and o_proj
      for (uint32_t t : mask_gone) drop(t);
      if (keep) A.insert(A.end(), mask_kept.begin(), mask_kept.end());
      else for (uint32_t t : mask_kept) drop(t);
      no_grad_release(A, {q, k, v});
      // Selective recomputation checkpoints the core attention, so its logsumexp is recomputed, not kept
      // (Megatron transformer/attention.py _checkpointed_attention_forward). The efficient kernel pads the LSE to
      // 32; it runs in fp32 and wherever a mask keeps flash out. The math kernel keeps no LSE.
      const int64_t s_lse = e == 4 || mask_.on ? round_up(d_.s, 32) : d_.s;
      if (keep_s2 && !math) A.push_back(act(mul(4, d_.a, d_.b, s_lse), L_.lse, layer));
      if (ring != UINT32_MAX) drop(ring);
    }
  }
  // o_proj reads the attention output, which the kernel keeps already; adapters may add their own copies.
  if (c_.peft.enabled() && !no_grad_) linear_inputs(layer, {"o_proj"}, mla ? mul(d_.a, m.v_head_dim) : d_.h_q, A, d_.T);
  // An fp8 o_proj saves its own fp8 copy of the attention output, which the kernel keeps in 16 bits.
  if (pr_.fp8_saved_inputs) A.push_back(act(mul(d_.T, mla ? mul(d_.a, m.v_head_dim) : d_.h_q), L_.fp8_input, layer));
  // Row-parallel output: all-reduced (TP) or reduce-scattered to T / t tokens (sequence parallel).
  uint32_t o = tmp(mul(e, d_.Tn, d_.h), L_.o_out, layer);
  if (no_grad_) {  // o_proj has run: the attention half has no reader left but the shared norm's output
    const bool keep = parallel && erase(A, no_grad_norm_out_);
    no_grad_release_all(A);
    if (keep) A.push_back(no_grad_norm_out_);
  }
  if (m.hidden_dropout > 0) o = dropout(o, mul(d_.Tn, d_.h), e, false, L_.o_out, layer, A);
  const bool retained_in = retained;
  uint32_t mid = UINT32_MAX;
  if (!parallel) {
    mid = act(mul(d_.e_res, d_.Tn, d_.h), L_.residual, layer);
    drop(o);
    if (!retained && free_input) drop(res);
  }

  // ---- MLP half
  const bool moe = s_.is_moe(layer);
  auto& M = saved.mlp;
  if (!parallel) {
    if (moe) norm_forward(layer, mid, retained, saved.mlp, {"gate", "gate_proj", "up_proj"}, true);
    else if (m.mlp_gated) norm_forward(layer, mid, retained, saved.mlp, {"gate_proj", "up_proj"}, true);
    else norm_forward(layer, mid, retained, saved.mlp, {"up_proj"}, true);
  } else {
    if (!no_grad_) linear_inputs(layer, {"gate_proj", "up_proj"}, d_.h, M, d_.Tn);  // norm 1's output is kept already
  }
  if (dequant_here) dequant(layer);
  const int64_t tf = mul(e, d_.T, d_.f);
  uint32_t prod_transient = UINT32_MAX;  // the down projection's input when a frozen weight does not keep it
  if (moe) {
    moe_forward(layer, M);
  } else if (m.mlp_gated && unsloth_lora_kernels()) {
    // LoRA_MLP: e = X W_gate, g = X W_up, h = swiglu_fg_kernel(e, g), then down; it saves X, e and g, and backward
    // rebuilds h in place (swiglu_DWf_DW_dfg_kernel), so h goes after the down projection.
    const uint32_t gate = act(tf, L_.mlp_gate, layer);
    const uint32_t up = act(tf, L_.mlp_up, layer);
    M.push_back(gate), M.push_back(up);
    no_grad_release(M, {no_grad_norm_out_});
    no_grad_release(A, {no_grad_norm_out_});
    prod_transient = tmp(tf, L_.mlp_prod, layer);
    no_grad_release(M, {gate, up});
  } else if (m.mlp_gated) {
    const uint32_t gate = act(tf, L_.mlp_gate, layer);  // saved by silu
    const uint32_t up = act(tf, L_.mlp_up, layer);      // saved by act * up
    M.push_back(gate), M.push_back(up);
    no_grad_release(M, {no_grad_norm_out_});
    no_grad_release(A, {no_grad_norm_out_});  // parallel attention's shared norm output
    // A compiled layer recomputes silu(gate) in backward (a pointwise op on the saved gate: see norm_impl).
    const uint32_t a = act(tf, L_.mlp_act, layer);      // saved by act * up
    M.push_back(a);
    no_grad_release(M, {gate});
    uint32_t prod = act(tf, L_.mlp_prod, layer);
    no_grad_release(M, {up, a});
    if (c_.training.compile && !no_grad_) erase(M, a), drop(a);
    if (!no_grad_ && linear_inputs(layer, {"down_proj"}, d_.f, M, d_.T))
      M.push_back(fp8_input(prod, mul(d_.T, d_.f), layer));
    else prod_transient = prod;
  } else {
    const uint32_t fc1 = act(tf, L_.mlp_fc1, layer);  // saved by gelu
    M.push_back(fc1);
    no_grad_release(M, {no_grad_norm_out_});
    no_grad_release(A, {no_grad_norm_out_});  // parallel attention's shared norm output
    uint32_t g = act(tf, L_.mlp_gelu, layer);
    no_grad_release(M, {fc1});
    if (!no_grad_ && linear_inputs(layer, {"down_proj"}, d_.f, M, d_.T))
      M.push_back(fp8_input(g, mul(d_.T, d_.f), layer));
    else prod_transient = g;
  }
  uint32_t out = tmp(mul(e, d_.Tn, d_.h), L_.mlp_out, layer);
  if (prod_transient != UINT32_MAX) drop(prod_transient);
  if (m.hidden_dropout > 0) out = dropout(out, mul(d_.Tn, d_.h), e, false, L_.mlp_out, layer, M);
  // The layer's output is saved by the next layer (or the next checkpoint) even when this forward is no_grad's.
  uint32_t next = p_.alloc(Component::Activations, mul(d_.e_res, d_.Tn, d_.h), L_.residual, layer);
  drop(out);
  if (no_grad_) no_grad_release_all(A), no_grad_release_all(M);
  if (parallel) {
    drop(o);
    if (!retained_in && free_input) drop(res);
  } else if (!retained) {
    drop(mid);
  }
  return next;
}

// torch.utils.checkpoint: the layer runs under no_grad and keeps only its input; its intermediates exist one at
// a time. The largest moment is the MLP (gate, up and their product) or, in eager attention, the softmax.
uint32_t StepBuilder::layer_forward_checkpointed(int32_t layer, uint32_t res, SavedLayer& saved) {
  saved.attn.push_back(res);
  if (d_.amp && casts_[layer] == UINT32_MAX) {  // cached by autocast until the forward's autocast region exits
    casts_[layer] = tmp(mul(matmul_numel(s_.params_of(layer)), pr_.autocast_copy_bytes), L_.cast, layer);
    ckpt_casts_.push_back(static_cast<uint32_t>(layer));
  }
  if (c_.model.post_layernorm || c_.model.kv_lora_rank > 0) {
    // Post-LN and MLA layers: their largest moment only (gate, up and their product; in eager attention
    // the softmax), not yet op by op.
    int64_t peak = mul(3, d_.e, d_.T, d_.f);
    if (rs_.attention == Attention::Eager) peak = std::max(peak, mul(4 + d_.e, d_.a, d_.b, mul(d_.s, d_.s)));
    uint32_t t = tmp(peak, L_.ckpt_tmp, layer);
    uint32_t next = act(mul(d_.e_res, d_.Tn, d_.h), L_.residual, layer);
    drop(t);
    return next;
  }
  // The same ops as a saving forward, each result freed once its last reader has run (the caching allocator
  // sees every one of them: the no_grad forward of one decoder layer in a recorded H200 trace,
  // tests/validation/measured/h200-2026-11-30/traces, allocates and frees its norms, q/k/v, RoPE, attention and
  // MLP tensors one by one). keep_s2 = false: eager attention's softmax is not kept either.
  no_grad_ = true;
  SavedLayer scratch;
  const uint32_t next = layer_forward(layer, res, scratch, false, false);
  no_grad_ = false;
  no_grad_norm_out_ = UINT32_MAX;
  return next;
}

// Under no_grad: frees these tensors of `saved` (a checkpointed forward's scratch), in the order given.
void StepBuilder::no_grad_release(std::vector<uint32_t>& saved, std::initializer_list<uint32_t> tensors) {
  if (!no_grad_) return;
  for (uint32_t t : tensors)
    if (t != UINT32_MAX && erase(saved, t)) drop(t);
}

void StepBuilder::no_grad_release_all(std::vector<uint32_t>& saved) {
  for (uint32_t t : saved) drop(t);
  saved.clear();
}

// torchtitan's op-level selective checkpointing (torchtitan/models/llama/parallelize_llama.py _apply_ac_to_
// transformer_block, "selective" + "op"): the block is checkpointed, but the outputs of the ops in _save_list
// are kept: SDPA (flash/efficient: output and logsumexp) and every other aten.mm, counted per block forward
// (`not (func == mm and mm_count % 2 == 0)`), i.e. wq, wv, w1 and w2 of wq, wk, wv, wo, w1, w3, w2.
uint32_t StepBuilder::layer_forward_selective_op(int32_t layer, uint32_t res, SavedLayer& saved) {
  const auto& m = c_.model;
  const int64_t e = d_.e;
  saved.attn.push_back(res);
  if (d_.amp && casts_[layer] == UINT32_MAX) {
    casts_[layer] = tmp(mul(matmul_numel(s_.params_of(layer)), pr_.autocast_copy_bytes), L_.cast, layer);
    ckpt_casts_.push_back(static_cast<uint32_t>(layer));
  }
  auto& A = saved.attn;
  if (rs_.fused_qkv) {
    A.push_back(act(mul(e, d_.T, add(d_.h_q, mul(2, d_.h_kv))), L_.v, layer));  // one mm: its output is saved
  } else {
    A.push_back(act(mul(e, d_.T, d_.h_q), L_.q, layer));   // mm 1 (wq)
    A.push_back(act(mul(e, d_.T, d_.h_kv), L_.v, layer));  // mm 3 (wv)
  }
  A.push_back(act(mul(e, d_.T, d_.h_q), L_.attn_out, layer));
  A.push_back(act(mul(4, d_.a, d_.b, d_.s), L_.lse, layer));
  // The block's other intermediates exist one at a time, as in a checkpointed forward.
  uint32_t t = tmp(mul(3, e, d_.T, d_.f), L_.ckpt_tmp, layer);
  if (!s_.is_moe(layer)) A.push_back(act(mul(e, d_.T, d_.f), m.mlp_gated ? L_.mlp_gate : L_.mlp_fc1, layer));  // mm 5 (w1)
  if (m.mlp_gated && !s_.is_moe(layer)) A.push_back(act(mul(e, d_.T, d_.h), L_.mlp_out, layer));  // mm 7 (w2)
  drop(t);
  return act(mul(d_.e_res, d_.Tn, d_.h), L_.residual, layer);
}

void StepBuilder::layer_backward(int32_t layer, uint32_t& dres, SavedLayer& saved) {
  alloc_layer_grads(layer);
  fp8_cast(layer);
  const int64_t e = d_.e;
  // MLP: grad(prod), grad(act) and grad(up) alive together, then the saved set of the half goes. In an MoE
  // layer the experts run one after another (one expert's share of the tokens) beside the full-size gradient
  // of the gathered output, and shared experts like a dense MLP.
  int64_t mlp_t = mul(3, e, d_.T, d_.f);
  if (s_.is_moe(layer)) {
    const auto& m = c_.model;
    const int64_t fe = m.moe_intermediate_size > 0 ? m.moe_intermediate_size : m.intermediate_size;
    const int64_t per_expert = ceil_div(mul(m.num_experts_per_tok, d_.T), m.num_experts);
    mlp_t = add(mul(3, e, per_expert, fe), mul(e, d_.T, d_.h));
    if (m.shared_expert_intermediate_size > 0)
      mlp_t = std::max(mlp_t, mul(3, e, d_.T, m.shared_expert_intermediate_size));
  }
  // IA3 on a feedforward down_proj (ia3_inputs): the input's gradient comes back in the base dtype, is cast to the
  // vector's dtype, and the product's backward makes grad * vector and grad * saved input (summed for the vector's
  // gradient) beside it: three [tokens, f] tensors in the vector's dtype at once.
  if (c_.peft.kind() == PeftMethod::Ia3 && !s_.is_moe(layer) && ia3_feedforward(c_.peft, "down_proj")) {
    const int64_t ab = any_quantized_ ? (d_.amp ? d_.e : 4) : adapter_bytes();
    if (ab != e) mlp_t = std::max(mlp_t, mul(3, ab, d_.T, d_.f));
  }
  // LoRA_MLP.backward: DW = dY W_down^T (a new [tokens, f]) takes h, df and de in place over DW, e and g; then dX.
  if (unsloth_lora_kernels() && c_.model.mlp_gated && !s_.is_moe(layer)) mlp_t = add(mul(e, d_.T, d_.f), mul(e, d_.T, d_.h));
  if (any_quantized_) dequant(layer);
  uint32_t t = tmp(mlp_t, L_.bwd_mlp, layer);
  for (auto it = saved.mlp.rbegin(); it != saved.mlp.rend(); ++it) drop(*it);
  saved.mlp.clear();
  drop(t);
  norm_backward(layer, dres);
  // Attention: dO, dq, dk, dv and flash's fp32 dq accumulator; native GQA also expands dk/dv to all heads
  // (flash-attention mha_bwd: dq_accum, dk_expanded). Eager: gradients of the probabilities and the softmax.
  int64_t at = 0;
  const bool repeat = kv_repeated();
  const bool mla = c_.model.kv_lora_rank > 0;  // q and k at nope + rope width per head
  const int64_t hq = mla ? mul(d_.a, add(c_.model.qk_nope_head_dim, c_.model.qk_rope_head_dim)) : d_.h_q;
  const int64_t kvw = mla ? hq : repeat ? d_.h_q : d_.h_kv;
  if (rs_.attention == Attention::Eager) {
    at = add(mul(10, d_.a, d_.b, mul(d_.s, d_.s)), mul(4, e, d_.T, d_.h_q));
  } else if (math_kernel() && !mla) {
    // The math kernel's autograd graph: the gradient of the softmax output and of the scores ([b, h, s, s] in the
    // input dtype) beside dO, dq, dk and dv; no fp32 accumulator.
    at = add(add(mul(2, e, d_.T, hq), mul(2, e, d_.T, kvw)), mul(2, e, d_.a, d_.b, mul(d_.s, d_.s)));
  } else {
    at = add(add(mul(2, e, d_.T, hq), mul(2, e, d_.T, kvw)), mul(4, d_.T, hq));
    if (d_.g < d_.a && !repeat && !mla) at = add(at, mul(2, e, d_.T, d_.h_q));
    // Ring attention backward (_attention.py _templated_ring_attention_backward) accumulates dq, dk and dv in
    // fp32 (zeros_like(..., dtype=fp32)), gathers or rotates the key/value chunks again (ring_kv_bytes), and
    // rotates the partial dk/dv in fp32 all-to-all (next_grad_kv = cat(dk, dv) and its permuted copy).
    if (c_.parallel.context_parallel_size > 1)
      at = add(at, add(add(mul(4, d_.T, add(hq, mul(2, kvw))), ring_kv_bytes(kvw)), mul(2 * 2 * 4, d_.T, kvw)));
  }
  t = tmp(at, L_.bwd_attn, layer);
  for (auto it = saved.attn.rbegin(); it != saved.attn.rend(); ++it) drop(*it);
  saved.attn.clear();
  drop(t);
  norm_backward(layer, dres);
  if (casts_[layer] != UINT32_MAX) drop(casts_[layer]), casts_[layer] = UINT32_MAX;
}

// Multi-head latent attention, HF DeepseekV3Attention: the low-rank q and kv paths each pass an RMSNorm (saved
// as any HF RMSNorm), q and k are rebuilt at the full head width (nope + rope) and saved by the kernel, v stays a
// view of kv_b_proj's output (so that whole output is kept), plus the output and logsumexp.
void StepBuilder::mla_forward(int32_t layer, std::vector<uint32_t>& A) {
  const auto& m = c_.model;
  const int64_t e = d_.e, T = d_.T, a = d_.a;
  const int64_t qk = add(m.qk_nope_head_dim, m.qk_rope_head_dim);
  auto low_rank_norm = [&](int64_t r) {
    uint32_t x = tmp(mul(e, T, r), L_.attn_tmp, layer);  // projection output, normalised next
    A.push_back(act(mul(4, T, r), L_.norm_x32, layer));
    A.push_back(act(mul(4, T), L_.norm_rstd, layer));
    A.push_back(act(mul(e, T, r), L_.norm_scaled, layer));
    A.push_back(act(mul(e, T, r), L_.norm_out, layer));  // saved by the up-projection
    drop(x);
  };
  if (m.q_lora_rank > 0) low_rank_norm(m.q_lora_rank);
  uint32_t q = tmp(mul(e, T, a, qk), L_.q, layer);
  uint32_t kv_a = tmp(mul(e, T, add(m.kv_lora_rank, m.qk_rope_head_dim)), L_.k, layer);
  low_rank_norm(m.kv_lora_rank);
  A.push_back(act(mul(e, T, a, add(m.qk_nope_head_dim, m.v_head_dim)), L_.v, layer));  // kv_b_proj output (v is a view)
  A.push_back(act(mul(e, T, a, qk), L_.q_rot, layer));  // cat(q_nope, rope(q_pe))
  A.push_back(act(mul(e, T, a, qk), L_.k_rot, layer));  // cat(k_nope, rope(k_pe) expanded to every head)
  drop(q);
  drop(kv_a);
  A.push_back(act(mul(e, T, a, m.v_head_dim), L_.attn_out, layer));
  A.push_back(act(mul(4, a, T), L_.lse, layer));
}

// A mixture-of-experts MLP as HF runs it (MixtralSparseMoeBlock, DeepseekV3MoE): the router's fp32 softmax,
// then each expert gathers its tokens (a copy), runs a gated MLP on them and scales its output by the routing
// weight, which saves that output. Dropless routing sends k x tokens through the experts; with a capacity
// factor c every expert holds c * k * tokens / E (padded, Megatron/GShard style).
void StepBuilder::moe_forward(int32_t layer, std::vector<uint32_t>& M) {
  const auto& m = c_.model;
  const int64_t e = d_.e, T = d_.T, E = m.num_experts, k = m.num_experts_per_tok;
  const int64_t fe = m.moe_intermediate_size > 0 ? m.moe_intermediate_size : m.intermediate_size;
  if (no_grad_) return moe_forward_no_grad(layer);
  uint32_t logits = tmp(mul(e, T, E), L_.attn_tmp, layer);
  M.push_back(act(mul(4, T, E), L_.router, layer));        // softmax(dtype=fp32) saves its output
  M.push_back(act(mul(4 + 8, T, k), L_.router, layer));    // top-k weights (fp32) and indices (int64)
  drop(logits);
  const int64_t n = m.moe_capacity_factor > 0
                        ? mul(E, static_cast<int64_t>(std::ceil(m.moe_capacity_factor * static_cast<double>(mul(k, T)) /
                                                                static_cast<double>(E))))
                        : mul(k, T);
  // Expert parallel: the permuted tokens go out in an all-to-all and arrive from the other ranks for this rank's
  // experts, k x tokens on average (Megatron token_dispatcher.py MoEAlltoAllTokenDispatcher: permute, then
  // all_to_all into a new tensor); the received tokens are the experts' input.
  uint32_t send = c_.parallel.expert_parallel_size > 1 ? tmp(mul(e, n, d_.h), L_.a2a, layer) : UINT32_MAX;
  M.push_back(act(mul(d_.amp ? 4 : e, n, d_.h), L_.expert_in, layer));  // gathered tokens (casts under autocast)
  if (send != UINT32_MAX) drop(send);
  for (uint32_t lbl : {L_.mlp_gate, L_.mlp_up, L_.mlp_act, L_.mlp_prod}) M.push_back(act(mul(e, n, fe), lbl, layer));
  M.push_back(act(mul(e, n, d_.h), L_.expert_out, layer));  // saved by the multiplication with the routing weight
  if (c_.parallel.expert_parallel_size > 1) drop(tmp(mul(e, n, d_.h), L_.a2a, layer));  // combine all-to-all
  if (m.shared_expert_intermediate_size > 0) {
    const int64_t ts = mul(e, T, m.shared_expert_intermediate_size);
    for (uint32_t lbl : {L_.mlp_gate, L_.mlp_up, L_.mlp_act, L_.mlp_prod}) M.push_back(act(ts, lbl, layer));
  }
}

// The same MoE block under a checkpoint's no_grad (HF MixtralSparseMoeBlock.forward): the router's logits, fp32
// softmax and top-k, the int64 one-hot expert mask (E x k x tokens), then one expert at a time: its gathered
// tokens, gate, silu, up and their product, the down projection scaled by the routing weight and added into the
// output (index_add_), each freed as the next op has read it. An expert sees k x tokens / E tokens on average.
void StepBuilder::moe_forward_no_grad(int32_t layer) {
  const auto& m = c_.model;
  const int64_t e = d_.e, T = d_.T, E = m.num_experts, k = m.num_experts_per_tok, h = d_.h;
  const int64_t fe = m.moe_intermediate_size > 0 ? m.moe_intermediate_size : m.intermediate_size;
  const int64_t ep = std::max<int64_t>(1, c_.parallel.expert_parallel_size);
  // Each of this rank's E / ep experts gets its share of the k x T token copies (all of them arrive under EP).
  const int64_t per = ceil_div(mul(k, T), std::max<int64_t>(1, E / ep));
  uint32_t logits = tmp(mul(e, T, E), L_.attn_tmp, layer);
  uint32_t probs = tmp(mul(4, T, E), L_.router, layer);
  uint32_t top = tmp(mul(4 + 8, T, k), L_.router, layer);
  drop(logits), drop(probs);
  uint32_t mask = tmp(mul(8, E, k, T), L_.router, layer);
  uint32_t acc = tmp(mul(e, T, h), L_.expert_out, layer);  // final_hidden_states = zeros: the experts add into it
  if (ep > 1) drop(tmp(mul(e, k, T, h), L_.a2a, layer));  // the dispatch all-to-all's send buffer
  auto mlp = [&](int64_t tokens, int64_t f) {
    uint32_t g = tmp(mul(e, tokens, f), L_.mlp_gate, layer);
    uint32_t a = tmp(mul(e, tokens, f), L_.mlp_act, layer);
    drop(g);
    uint32_t u = tmp(mul(e, tokens, f), L_.mlp_up, layer);
    uint32_t p = tmp(mul(e, tokens, f), L_.mlp_prod, layer);
    drop(a), drop(u);
    uint32_t o = tmp(mul(e, tokens, h), L_.expert_out, layer);
    drop(p);
    return o;
  };
  uint32_t x = tmp(mul(d_.amp ? 4 : e, per, h), L_.expert_in, layer);
  uint32_t o = mlp(per, fe);
  drop(x);
  drop(tmp(mul(e, per, h), L_.expert_out, layer));  // scaled by the routing weight, then index_add_ into the output
  drop(o);
  if (ep > 1) drop(tmp(mul(e, k, T, h), L_.a2a, layer));  // the combine all-to-all
  drop(mask), drop(top);
  if (m.shared_expert_intermediate_size > 0) drop(mlp(T, m.shared_expert_intermediate_size));
  drop(acc);  // (it is the block's output, which the layer allocates next as the MLP output)
}

void StepBuilder::loss_forward(uint32_t res, std::vector<uint32_t>& saved) {
  const int32_t post = -1;  // the head belongs to no layer (the timeline shows its tensors unnumbered)
  if (c_.model.head() == TaskHead::SequenceClassification) {
    // The pooler's dense reads hidden[:, 0], a view, so the whole last hidden state stays saved; the rest of the
    // head (tanh output, dropout mask, classifier input, logits) is batch x hidden at most.
    saved.push_back(res);
    const int64_t bh = mul(d_.b, d_.h);
    for (int i = 0; i < 3; ++i) saved.push_back(act(mul(d_.e_res, bh), L_.logits, post));
    saved.push_back(act(mul(4, d_.b, c_.model.num_labels), L_.lse_loss, post));
    return;
  }
  bool retained = false;
  if (!c_.model.post_layernorm) norm_forward(post, res, retained, saved, {"lm_head"}, true);
  else saved.push_back(res), retained = true;
  if (!retained) drop(res);
  // Autocast caches a low-precision copy of every fp32 leaf weight a matmul reads, lm_head's included
  // (autocast_mode.cpp cached_cast); the linear saves it for the input's gradient until the head's backward.
  // cached_cast caches only weights that require grad: a frozen head is cast again at every call, and litgpt
  // calls it on each 128-token chunk (model.py GPT.forward lm_head_chunk_size), each cast saved by its matmul.
  if (d_.amp) {
    const bool per_chunk = rs_.loss == LossImpl::ChunkedBf16 && !module_info("lm_head").trainable && !any_quantized_;
    const int64_t casts = per_chunk ? ceil_div(d_.s, 128) : 1;
    for (int64_t i = 0; i < casts; ++i) saved.push_back(tmp(mul(pr_.autocast_copy_bytes, d_.V, d_.h), L_.cast, post));
  }
  const int64_t tv = mul(d_.T, d_.V);
  const int64_t e = d_.e;
  const LossImpl loss = loss_now();
  switch (loss) {
    case LossImpl::UnslothLogits:
    case LossImpl::CutCrossEntropy:
    case LossImpl::UnslothFusedCe:
      unsloth_loss_forward(loss, saved);
      break;
    case LossImpl::HfFp32Upcast: {
      // transformers >= 4.49 ForCausalLMLoss: logits (compute dtype) -> .float() -> cross_entropy saves its
      // log-softmax (fp32). The Trainer drops the model outputs before backward; a plain loop holds them.
      // torch <= 1.10's log_softmax also kept its input: the fp32 upcast, or the fp32 logits themselves.
      const bool keep_input = rs_.softmax_saves_input;
      uint32_t hd = head_dequant();
      uint32_t lg = rs_.holds_logits ? act(mul(e, tv), L_.logits, post)
                                     : softmax_input(mul(e, tv), L_.logits, post, keep_input && e == 4);
      drop_if(hd);
      uint32_t up = e < 4 ? softmax_input(mul(4, tv), L_.logits_fp32, post, keep_input) : UINT32_MAX;
      saved.push_back(act(mul(4, tv), L_.lse_loss, post));
      if (up != UINT32_MAX) keep_input ? saved.push_back(up) : drop(up);
      if (rs_.holds_logits) held_logits_ = lg;  // freed when the loop lets go of the outputs
      else if (keep_input && e == 4) saved.push_back(lg);
      else drop(lg);
      break;
    }
    case LossImpl::HfShiftFp32:
    case LossImpl::HfFp32Logits:
    case LossImpl::HfShift:
      hf_shifted_loss_forward(saved);
      break;
    case LossImpl::FullFp32: {
      // torchtune unembed: output(h).float(), the low-precision logits go at once; `del logits` after the loss.
      uint32_t hd = head_dequant();
      uint32_t lg = tmp(mul(e, tv), L_.logits, post);
      drop_if(hd);
      uint32_t up = UINT32_MAX;
      if (e < 4) up = tmp(mul(4, tv), L_.logits_fp32, post), drop(lg), lg = up;
      // Vocabulary-parallel cross-entropy through DTensor (torchtitan's loss_parallel under TP,
      // torch/distributed/tensor/parallel/loss.py _log_softmax): shifted = x - max and exp(shifted) are
      // full-size fp32 tensors beside the input before the result exists.
      uint32_t shifted = UINT32_MAX, ex = UINT32_MAX;
      if (rs_.loss_parallel) shifted = tmp(mul(4, tv), L_.loss_grad, post), ex = tmp(mul(4, tv), L_.loss_grad, post), drop(ex);
      saved.push_back(act(mul(4, tv), L_.lse_loss, post));
      if (shifted != UINT32_MAX) drop(shifted);
      drop(lg);
      break;
    }
    case LossImpl::ChunkedFp32: {
      // torchtune CEWithChunkedOutputLoss: the output layer runs per chunk (compute dtype, kept until
      // `del logits`); each chunk is upcast and its log-softmax saved. With compile, torchtune compiles
      // compute_cross_entropy alone, and AOTAutograd's min-cut partitioner recomputes the pointwise upcast and
      // log-softmax in backward: it saves the chunk itself (an input) and a per-token fp32 logsumexp. Inductor
      // fuses the upcast and the log-softmax into the max and sum-exp reductions over the vocabulary, which read
      // the bf16 chunk directly, so no fp32 [tokens, vocab] tensor is written in the forward; in the backward the
      // recomputed softmax, the one-hot subtraction and the cast back fuse into one kernel that writes the chunk's
      // gradient in the compute dtype.
      const int64_t n = rs_.loss_chunks;
      const bool compiled = c_.training.compile;
      uint32_t hd = head_dequant();  // once per chunk's matmul; the chunks' logits are one size
      uint32_t chunks = compiled ? act(mul(e, tv), L_.logits, post) : tmp(mul(e, tv), L_.logits, post);
      drop_if(hd);
      for (int64_t i = 0; i < n; ++i) {
        if (compiled) {
          saved.push_back(act(mul(4, ceil_div(d_.T, n)), L_.lse_loss, post));
          continue;
        }
        uint32_t up = tmp(mul(4, ceil_div(tv, n)), L_.logits_fp32, post);
        saved.push_back(act(mul(4, ceil_div(tv, n)), L_.lse_loss, post));
        drop(up);
      }
      if (compiled) saved.push_back(chunks);  // held by autograd after `del logits`
      else drop(chunks);
      break;
    }
    case LossImpl::ChunkedBf16: {
      // litgpt chunked_cross_entropy: 128-row chunks in the compute dtype, no upcast; fit() keeps `logits`
      // through backward, and b > 1 makes reshape copy the shifted slice.
      uint32_t hd = head_dequant();
      held_logits_ = act(mul(e, tv), L_.logits, post);
      drop_if(hd);
      uint32_t copy = d_.b > 1 ? tmp(mul(e, tv), L_.logits, post) : UINT32_MAX;
      saved.push_back(act(mul(e, tv), L_.lse_loss, post));
      if (copy != UINT32_MAX) drop(copy);
      break;
    }
    case LossImpl::FusedLinear: {
      // Liger fused_linear_cross_entropy_forward: grad_input [T, h], grad_weight [V, h] and an fp32 loss per
      // token, all made in forward; logits exist one chunk at a time, chunk = next_pow2(ceil(T / ceil(V / h))).
      // grad_weight is `torch.zeros_like(weight) if weight.requires_grad else None`: none for a frozen head (PEFT).
      saved.push_back(act(mul(e, d_.T, d_.h), L_.flce_buffers, post));
      if (head_grad_bytes() > 0) saved.push_back(act(mul(pr_.weight_bytes, d_.V, d_.h), L_.flce_buffers, post));
      saved.push_back(act(mul(4, d_.T), L_.flce_buffers, post));
      const int64_t chunk = std::min(d_.T, next_pow2(ceil_div(d_.T, ceil_div(d_.V, d_.h))));
      uint32_t lg = tmp(mul(e, chunk, d_.V), L_.logits, post);
      drop(lg);
      break;
    }
  }
}

// transformers' causal-LM loss before 4.49 (docs/versions.md 6a, with the 4.31 tensors' bytes at
// each moment under "Memory consequences"): the loss shifts the logits by one token with logits[..., :-1, :].contiguous(), a copy, before
// cross_entropy. Where the logits live differs by version:
//  HfFp32Logits (4.31-4.45): LlamaForCausalLM returns fp32 logits (logits = logits.float(), transformers#24891); the
//    compute-dtype ones go at once (nothing saves them), the fp32 copy is shifted, and the outputs hold the fp32
//    logits (the Trainer drops them before backward, a plain loop keeps them).
//  HfShiftFp32 (4.46-4.48): the outputs hold compute-dtype logits (#33902); ForCausalLMLoss (#34191) upcasts them and
//    shifts the fp32 copy, both freed when the loss returns.
//  HfShift (before 4.31): the logits stay in the compute dtype and are shifted as they are; under autocast
//    log_softmax (an fp32 op of autocast) casts the shifted copy to fp32 first.
// The loss saves log_softmax's output; torch <= 1.10 also kept its input (training.softmax_saves_input). Backward
// adds slice_backward's zero-filled gradient of the unshifted logits (the shift is a view, its copy's backward
// passes the gradient through).
void StepBuilder::hf_shifted_loss_forward(std::vector<uint32_t>& saved) {
  const int32_t post = -1;
  const int64_t tv = mul(d_.T, d_.V), e = d_.e;
  const bool keep_input = rs_.softmax_saves_input;
  const bool keep_output = rs_.holds_logits;
  uint32_t hd = head_dequant();
  uint32_t out = UINT32_MAX;  // what the model's outputs hold
  uint32_t local = UINT32_MAX;  // the loss's own fp32 upcast (4.46-4.48)
  uint32_t shifted = UINT32_MAX, cast = UINT32_MAX;
  const bool fp32_loss = rs_.loss != LossImpl::HfShift || e == 4;
  if (rs_.loss == LossImpl::HfFp32Logits && e < 4) {
    uint32_t lg = tmp(mul(e, tv), L_.logits, post);
    drop_if(hd);
    out = keep_output ? act(mul(4, tv), L_.logits_fp32, post) : tmp(mul(4, tv), L_.logits_fp32, post);
    drop(lg);
  } else {
    out = keep_output ? act(mul(e, tv), L_.logits, post) : tmp(mul(e, tv), L_.logits, post);
    drop_if(hd);
    if (rs_.loss == LossImpl::HfShiftFp32 && e < 4) local = tmp(mul(4, tv), L_.logits_fp32, post);
  }
  if (fp32_loss) {
    shifted = softmax_input(mul(4, tv), L_.logits_shifted, post, keep_input);
  } else {
    shifted = softmax_input(mul(e, tv), L_.logits_shifted, post, keep_input && !d_.amp);
    if (d_.amp) cast = softmax_input(mul(4, tv), L_.logits_fp32, post, keep_input);
  }
  const int64_t ls = fp32_loss || d_.amp ? 4 : e;  // log_softmax's dtype
  saved.push_back(act(mul(ls, tv), L_.lse_loss, post));
  if (cast != UINT32_MAX) keep_input ? saved.push_back(cast) : drop(cast);
  if (keep_input && cast == UINT32_MAX) saved.push_back(shifted);
  else drop(shifted);
  if (local != UINT32_MAX) drop(local);
  if (keep_output) held_logits_ = out;  // freed when the loop lets go of the outputs
  else drop(out);
}

uint32_t StepBuilder::hf_shifted_loss_backward(std::vector<uint32_t>& saved) {
  const int32_t post = -1;
  const int64_t tv = mul(d_.T, d_.V), e = d_.e;
  const bool fp32_loss = rs_.loss != LossImpl::HfShift || e == 4;
  const int64_t ls = fp32_loss || d_.amp ? 4 : e;
  // nll_loss backward and log_softmax backward, in log_softmax's dtype.
  uint32_t g1 = tmp(mul(ls, tv), L_.loss_grad, post);
  uint32_t g2 = tmp(mul(ls, tv), L_.loss_grad, post);
  drop(g1);
  release_saved(saved, L_.lse_loss);  // LogSoftmaxBackward has run
  if (rs_.softmax_saves_input) release_saved(saved, L_.softmax_in);
  // HfShift under autocast: the cast to fp32 goes back to the compute dtype before the slice.
  if (!fp32_loss && d_.amp) {
    uint32_t g = tmp(mul(e, tv), L_.loss_grad_bf16, post);
    drop(g2);
    g2 = g;
  }
  // slice_backward: zeros of the unshifted logits' shape, the gradient copied in.
  const int64_t sb = fp32_loss ? 4 : e;
  uint32_t full = tmp(mul(sb, tv), L_.loss_grad, post);
  drop(g2);
  // .float() backward (4.31-4.48): the gradient cast back to the compute dtype for lm_head.
  if (sb == 4 && e < 4) {
    uint32_t g = tmp(mul(e, tv), L_.loss_grad_bf16, post);
    drop(full);
    full = g;
  }
  alloc_layer_grads(s_.num_layers);  // lm_head's matmul backward: its .grad, then the hidden state's gradient
  uint32_t dy;
  { uint32_t hd = head_dequant(); dy = tmp(mul(e, d_.Tn, d_.h), L_.dres, post); drop_if(hd); }
  drop(full);
  return dy;
}

// The bytes of the output head's weight gradient, 0 when the head (or the embedding it is tied to) is frozen.
int64_t StepBuilder::head_grad_bytes() const {
  if (c_.model.tie_word_embeddings) return has_grad(s_.pre.front()) ? grad_bytes_of(s_.pre.front()) : 0;
  for (const auto& t : s_.post)
    if (module_name(t.name) == "lm_head" && t.kind == ParamKind::Matmul) return has_grad(t) ? grad_bytes_of(t) : 0;
  return 0;
}

// Drops the newest saved tensor with this label: autograd frees a node's saved tensors once the node has run,
// before the engine moves on (torch/csrc/autograd/engine.cpp: fn.release_variables() after call_function).
void StepBuilder::release_saved(std::vector<uint32_t>& saved, uint32_t label) {
  for (auto it = saved.rbegin(); it != saved.rend(); ++it)
    if (p_.tensors[*it].label == label) {
      drop(*it);
      saved.erase(std::next(it).base());
      return;
    }
}

uint32_t StepBuilder::loss_backward(std::vector<uint32_t>& saved) {
  const int32_t post = -1;  // the head belongs to no layer (the timeline shows its tensors unnumbered)
  // The head's .grad appears when its matmul's backward runs, after the loss's nodes (allocator traces of the H200
  // calibration runs, tests/validation/measured/traces); the losses below that follow the traces create it there.
  const bool late_head_grad = (rs_.loss == LossImpl::HfFp32Upcast || rs_.loss == LossImpl::HfShiftFp32 ||
                               rs_.loss == LossImpl::HfFp32Logits || rs_.loss == LossImpl::HfShift ||
                               rs_.loss == LossImpl::FullFp32 ||
                               (rs_.loss == LossImpl::ChunkedFp32 && !c_.training.compile)) &&
                              c_.model.head() != TaskHead::SequenceClassification;
  if (!late_head_grad) alloc_layer_grads(s_.num_layers);
  if (c_.model.head() == TaskHead::SequenceClassification) {
    uint32_t dy = tmp(mul(d_.e_res, d_.T, d_.h), L_.dres, post);  // grad of the last hidden state (first token)
    for (auto it = saved.rbegin(); it != saved.rend(); ++it) drop(*it);
    saved.clear();
    return dy;
  }
  const int64_t tv = mul(d_.T, d_.V);
  const int64_t e = d_.e;
  uint32_t dy = UINT32_MAX;
  const LossImpl loss = loss_now();
  switch (loss) {
    case LossImpl::UnslothLogits:
    case LossImpl::CutCrossEntropy:
    case LossImpl::UnslothFusedCe:
      dy = unsloth_loss_backward(loss);
      break;
    case LossImpl::HfFp32Upcast:
    case LossImpl::FullFp32: {
      // nll_loss backward and log_softmax backward (fp32, [T, V] each), then the cast back for lm_head. The
      // loss-parallel version fuses both as (zeros_like(x) + exp(x)) * grad_output: four full-size fp32
      // tensors at once (loss.py _nll_loss_and_log_softmax_backward).
      uint32_t g1 = tmp(mul(4, tv), L_.loss_grad, post);
      if (rs_.loss_parallel) {
        uint32_t ex = tmp(mul(4, tv), L_.loss_grad, post);
        uint32_t sum = tmp(mul(4, tv), L_.loss_grad, post);
        drop(ex);
        uint32_t prod = tmp(mul(4, tv), L_.loss_grad, post);
        drop(sum);
        drop(g1);
        g1 = prod;
      }
      uint32_t g2 = tmp(mul(4, tv), L_.loss_grad, post);
      drop(g1);
      release_saved(saved, L_.lse_loss);  // LogSoftmaxBackward has run
      if (rs_.softmax_saves_input) release_saved(saved, L_.softmax_in);
      uint32_t g3 = e < 4 ? tmp(mul(e, tv), L_.loss_grad_bf16, post) : UINT32_MAX;
      if (g3 != UINT32_MAX) drop(g2), g2 = g3;
      alloc_layer_grads(s_.num_layers);  // lm_head's matmul backward: its .grad, then the hidden state's gradient
      { uint32_t hd = head_dequant(); dy = tmp(mul(e, d_.Tn, d_.h), L_.dres, post); drop_if(hd); }
      drop(g2);
      break;
    }
    case LossImpl::HfShiftFp32:
    case LossImpl::HfFp32Logits:
    case LossImpl::HfShift:
      dy = hf_shifted_loss_backward(saved);
      break;
    case LossImpl::ChunkedFp32: {
      const int64_t n = rs_.loss_chunks;
      if (c_.training.compile) {
        { uint32_t hd = head_dequant(); dy = tmp(mul(e, d_.Tn, d_.h), L_.dres, post); drop_if(hd); }
        for (int64_t i = 0; i < n; ++i) drop(tmp(mul(e, ceil_div(tv, n)), L_.loss_grad_bf16, post));
        break;
      }
      // The chunks' loss nodes were created after every chunk's matmul, so the engine runs them all first
      // (highest sequence number first): each chunk's logits gradient, cast back, waits for its matmul.
      const int64_t c = ceil_div(tv, n);
      std::vector<uint32_t> chunk_grads;
      for (int64_t i = 0; i < n; ++i) {
        uint32_t g1 = tmp(mul(4, c), L_.loss_grad, post);
        uint32_t g2 = tmp(mul(4, c), L_.loss_grad, post);
        drop(g1);
        release_saved(saved, L_.lse_loss);
        if (e < 4) {
          chunk_grads.push_back(tmp(mul(e, c), L_.loss_grad_bf16, post));
          drop(g2);
        } else {
          chunk_grads.push_back(g2);
        }
      }
      // Then one matmul backward per chunk. The engine sums the chunks' weight gradients in the head's input
      // buffer (input_buffer.cpp): the first is kept, the second added out of place, the rest in place. On the
      // first micro-batch the sum becomes the .grad; later ones add it into .grad and free it.
      const bool had_grad = grad_created_[static_cast<size_t>(s_.num_layers + 1)];
      alloc_layer_grads(s_.num_layers);
      { uint32_t hd = head_dequant(); dy = tmp(mul(e, d_.Tn, d_.h), L_.dres, post); drop_if(hd); }
      const int64_t gw = head_grad_bytes();
      uint32_t buffer = UINT32_MAX;
      for (int64_t i = 0; i < n; ++i) {
        if (gw > 0 && (i > 0 || had_grad)) {
          uint32_t w = tmp(gw, L_.loss_grad, post);
          if (buffer == UINT32_MAX && had_grad) buffer = w;
          else if (i == 1) drop(tmp(gw, L_.loss_grad, post)), drop(w);  // old + new, then both go
          else drop(w);
        }
        drop(chunk_grads[static_cast<size_t>(n - 1 - i)]);
      }
      if (buffer != UINT32_MAX) drop(buffer);
      break;
    }
    case LossImpl::ChunkedBf16: {
      // chunk gradients are concatenated, then the slice backward writes them into zeros of the full shape
      uint32_t g = tmp(mul(e, tv), L_.loss_grad, post);
      uint32_t z = tmp(mul(e, tv), L_.loss_grad, post);
      drop(g);
      { uint32_t hd = head_dequant(); dy = tmp(mul(e, d_.Tn, d_.h), L_.dres, post); drop_if(hd); }
      drop(z);
      break;
    }
    case LossImpl::FusedLinear:
      dy = tmp(mul(e, d_.Tn, d_.h), L_.dres, post);  // grad_input scaled; grad_weight becomes lm_head's grad
      break;
  }
  // What remains saved (final norm, log-softmax, litgpt's logits) goes with the backward of the head.
  for (auto it = saved.rbegin(); it != saved.rend(); ++it) drop(*it);
  saved.clear();
  if (!c_.model.post_layernorm) norm_backward(post, dy);
  return dy;
}

// ---------------------------------------------------------------------------------------------------------
// transformers' 4-D attention mask (Resolved::mask; docs/versions.md 6b for the builders, 5 for SDPA)
// ---------------------------------------------------------------------------------------------------------

void StepBuilder::mask_labels() {
  if (mask_labels_) return;
  mask_labels_ = true;
  LM_.mask = p_.label("attention mask, [batch, 1, seq, seq] (transformers; one tensor every layer reads)");
  LM_.build = p_.label("attention mask: temporaries while transformers builds it");
  LM_.buffer = p_.label("causal_mask buffer, max_position_embeddings^2 booleans (transformers 4.38)");
  LM_.copy = p_.label("attention mask: one layer's copy (indexed, cast or converted for its attention call)");
  LM_.padded = p_.label("attention mask padded for the memory-efficient kernel (saved)");
  LM_.math_qk = p_.label("SDPA math kernel: scaled q and k (saved)");
  LM_.math_scores = p_.label("SDPA math kernel: scores");
  LM_.math_softmax = p_.label("SDPA math kernel: softmax (saved)");
}

// After the embeddings, once per micro-batch: the mask LlamaModel.forward builds before its first layer, where
// the version builds one for this micro-batch (for every one, or for one with padding), with the temporaries of
// its builder. The model dtype is inputs_embeds.dtype, the residual stream's (e_res); P is max_position_embeddings.
// The builders' code: 4.31-4.35 and 4.36-4.37 read in stored copies of modeling_llama.py and
// modeling_attn_mask_utils.py; 4.38 in copies of its _update_causal_mask (and issue #29484); 4.39-4.52 and
// masking_utils (4.53+) from memory of the code, the shapes in docs/versions.md 6b.
void StepBuilder::mask_forward() {
  mask_ = {};
  const auto& mk = rs_.mask;
  if (mk.build == MaskBuild::None || !(mk.unpadded || d_.padded)) return;
  mask_labels();
  const int64_t e = d_.e_res;
  const int64_t ss = mul(d_.s, d_.s), bss = mul(d_.b, ss);
  auto t = [&](int64_t bytes) { return tmp(bytes, LM_.build, -1); };
  auto keep = [&](int64_t bytes) { return p_.alloc(Component::Activations, bytes, LM_.mask, -1); };
  uint32_t mask = UINT32_MAX;
  int64_t mask_elems = bss;
  switch (mk.build) {
    case MaskBuild::Prepared: {
      // _make_causal_mask: torch.full((s, s), finfo(dtype).min) in the default fp32, masked_fill_ by a boolean
      // comparison (mask_cond < (mask_cond + 1).view(s, 1)), .to(dtype); expanded to [b, 1, s, s] as a view.
      const uint32_t full = t(mul(4, ss)), cond = t(ss);
      drop(cond);
      const uint32_t causal = t(mul(e, ss));
      drop(full);
      // _expand_mask: mask[:, None, None, :].expand(b, 1, s, s).to(dtype), 1.0 - that, and masked_fill by its
      // .to(torch.bool), the first two alive until it returns.
      const uint32_t expanded = t(mul(e, bss)), inverted = t(mul(e, bss)), flags = t(bss), filled = t(mul(e, bss));
      drop(flags), drop(expanded), drop(inverted);
      // <= 4.35: expanded_attn_mask + combined_attention_mask; 4.36-4.37 (to_4d):
      // causal_4d_mask.masked_fill(expanded_attn_mask.bool(), min).
      const uint32_t flags2 = mk.to_4d ? t(bss) : UINT32_MAX;
      mask = keep(mul(e, bss));
      if (flags2 != UINT32_MAX) drop(flags2);
      drop(filled), drop(causal);
      break;
    }
    case MaskBuild::MaxPositions: {
      const int64_t P = c_.model.max_position_embeddings;
      const int64_t bpp = mul(d_.b, P, P), bps = mul(d_.b, P, d_.s);
      mask_elems = bpp;
      // self.causal_mask[None, None, :, :].repeat(b, 1, 1, 1) (booleans), .to(dtype), then * min_dtype.
      const uint32_t rep = t(bpp), conv = t(mul(e, bpp));
      drop(rep);
      mask = keep(mul(e, bpp));
      drop(conv);
      // The padding merge: causal_mask[..., :s].eq(0.0) * attention_mask[:, None, None, :].eq(0.0), and
      // masked_fill of that slice into a copy written back.
      const uint32_t eq = t(bps), pm = t(bps);
      drop(eq);
      const uint32_t fill = t(mul(e, bps));
      drop(pm), drop(fill);
      break;
    }
    case MaskBuild::Updated: {
      // torch.full((s, s), min_dtype, dtype), torch.triu(diagonal=1) (a new tensor), *= arange > cache_position.
      const uint32_t full = t(mul(e, ss)), tri = t(mul(e, ss));
      drop(full);
      drop(t(ss));
      // .expand(b, 1, -1, -1).clone(), made because an attention_mask is passed, then the padding merge as in 4.38.
      mask = keep(mul(e, bss));
      drop(tri);
      const uint32_t eq = t(bss), pm = t(bss);
      drop(eq);
      const uint32_t fill = t(mul(e, bss));
      drop(pm), drop(fill);
      break;
    }
    case MaskBuild::Boolean:
      // masking_utils.sdpa_mask: the causal and padding mask functions evaluated into one boolean [b, 1, s, s].
      mask = keep(bss);
      break;
    case MaskBuild::BooleanToFloat: {
      // eager_mask: sdpa_mask's booleans, then torch.where(mask, 0.0, min_dtype) in the model dtype.
      const uint32_t flags = t(bss);
      mask = keep(mul(e, bss));
      drop(flags);
      break;
    }
    case MaskBuild::None:
      return;
  }
  // SDPA and padding, 4.38-4.52: rows that attend to no key are let attend to all, which the memory-efficient
  // kernel needs (pytorch#110213): causal_mask.mul(~torch.all(causal_mask == min, dim=-1)[..., None]), a new mask
  // (4.40+: AttentionMaskConverter._unmask_unattended). 4.36-4.37's _unmask_unattended writes in place.
  const bool sdpa = mk.kernel != MaskKernel::Eager;
  if (sdpa && d_.padded && (mk.build == MaskBuild::MaxPositions || mk.build == MaskBuild::Updated)) {
    const uint32_t eq = t(mask_elems);
    const uint32_t unmasked = keep(mul(e, mask_elems));
    drop(eq), drop(mask);
    mask = unmasked;
  }
  mask_.on = true;
  mask_.tensor = mask;
}

// One layer's SDPA call given the micro-batch's mask (docs/versions.md 5). What reaches the kernel may be a copy of
// the shared mask: 4.38's cache_position index (a copy in the model dtype), the additive copy torch makes of a
// boolean mask (convert_boolean_attn_mask, in q's dtype), or autocast's cast of a float mask of the model dtype to
// q's 16 bits (scaled_dot_product_attention is lower_precision_fp in autocast_mode.cpp). The math kernel adds it
// into the scores and keeps none of it. The memory-efficient kernel keeps the bias it is given until backward: a
// padded copy when it is not aligned (pad_bias: [b, 1, s, round_up(s, 8)] from 2.1.2, or [b, h, s, round_up(s, 16)]
// after expanding it over the heads in 2.1.0-2.1.1), else the copy, else the shared mask itself by reference, which
// makes this layer hold it. `keep`: the call's graph is saved (not a no_grad forward).
void StepBuilder::sdpa_mask_inputs(int32_t layer, std::vector<uint32_t>& kept, std::vector<uint32_t>& gone, bool keep) {
  const auto& mk = rs_.mask;
  const int64_t e = d_.e, s = d_.s;
  const int64_t bss = mul(d_.b, s, s);
  std::vector<int64_t> copies;  // bytes of each copy, in order; the last is what the kernel gets
  if (mk.build == MaskBuild::MaxPositions) copies.push_back(mul(d_.e_res, bss));
  if (mk.build == MaskBuild::Boolean) copies.push_back(mul(e, bss));
  else if (d_.e_res != e) copies.push_back(mul(e, bss));
  const bool mem_eff = mk.kernel == MaskKernel::MemEfficient;
  const bool aligned = s % mk.pad_align == 0;
  // The last copy is saved when the memory-efficient kernel takes it as it is.
  for (size_t i = 0; i < copies.size(); ++i) {
    const bool saved = mem_eff && aligned && i + 1 == copies.size();
    const uint32_t c = saved ? act(copies[i], LM_.copy, layer) : tmp(copies[i], LM_.copy, layer);
    (saved ? kept : gone).push_back(c);
  }
  if (!mem_eff) return;
  if (!aligned) {
    const int64_t rows = mk.pad_expanded ? mul(d_.b, d_.a, s) : mul(d_.b, s);
    kept.push_back(act(mul(e, rows, round_up(s, mk.pad_align)), LM_.padded, layer));
  } else if (copies.empty() && keep && !in_backward_ && mask_.holder < 0) {
    mask_.holder = layer;  // the shared mask, kept by reference; layers run upward, so this is the lowest
  }
}

bool StepBuilder::checkpointed(int64_t l) const {
  switch (rs_.checkpointing) {
    case Checkpointing::Full:
    case Checkpointing::SelectiveOp: return true;
    case Checkpointing::EveryK: return l % c_.training.checkpoint_every_k_layers == 0;
    default: return false;
  }
}

uint32_t StepBuilder::forward_layer(int32_t l, uint32_t in, SavedLayer& sv, bool own) {
  const bool keep_s2 = rs_.checkpointing != Checkpointing::Selective;
  return c_.model.post_layernorm ? layer_forward_post_ln(l, in, sv, keep_s2, own) : layer_forward(l, in, sv, keep_s2, own);
}

// The forward of one micro-batch on this device's layers [first_layer_, end_layer_). A pipeline stage other
// than the first receives its input; one other than the last sends its output, whose memory Megatron frees at
// once (schedules.py deallocate_output_tensor).
void StepBuilder::forward_mb(InFlight& f, std::string phase) {
  p_.phase(std::move(phase));
  reuse(f);
  if (run_shapes_ && f.owns_inputs) use_shape((*run_shapes_)[next_shape_++]);
  f.dims = d_;
  if (c_.model.is_encoder_decoder) return forward_encdec(f);
  f.casts.assign(static_cast<size_t>(s_.num_layers), UINT32_MAX);  // autocast's cache lives per forward
  casts_.swap(f.casts);
  const int64_t first = f.first, end = f.end;
  const size_t n = static_cast<size_t>(end - first);
  f.saved.resize(n);
  f.host.resize(n);
  for (size_t i = 0; i < n; ++i) {
    f.saved[i].attn.clear(), f.saved[i].mlp.clear(), f.saved[i].cross.clear();
    f.saved[i].attn.reserve(16), f.saved[i].mlp.reserve(12);
    f.host[i].clear();
  }
  if (f.owns_inputs)  // once per micro-batch: int64 ids and/or labels
    f.inputs = act(mul(ctx_.has_pre && ctx_.has_post ? 2 : 1, 8, d_.T), L_.inputs, -1);
  std::vector<uint32_t> gathered;
  uint32_t res;
  mask_ = {};
  if (f.pre) {
    gather(-1, gathered);
    res = embed_forward();
    for (uint32_t g : gathered) drop(g);
    gathered.clear();
    mask_forward();
  } else if (rs_.framework->pp_persistent_recv) {
    recv_buffers(first, false);
    res = act(0, L_.p2p, static_cast<int32_t>(first));  // a view of this micro-batch's receive buffer
  } else {
    res = act(mul(d_.e_res, d_.Tn, d_.h), L_.p2p, static_cast<int32_t>(first));
  }
  const bool offload = c_.training.activation_offload && !unsloth_gc();
  const bool unsloth_offload = unsloth_gc();
  if (unsloth_offload) unsloth_gc_buffers(true);
  auto offload_layer = [&](int64_t i) {
    for (auto* part : {&f.saved[i].attn, &f.saved[i].mlp}) {
      for (uint32_t t : *part) f.host[i].push_back({p_.tensors[t].bytes, p_.tensors[t].label}), drop(t);
      part->clear();
    }
  };
  for (int64_t l = first; l < end; ++l) {
    gather(l, gathered);
    const int32_t li = static_cast<int32_t>(l);
    SavedLayer& sv = f.saved[l - first];
    // A checkpointed layer's saved inputs hold the mask until its backward (reentrant: ctx.save_for_backward of
    // every tensor argument; non-reentrant: the arguments kept for the recomputation).
    if (mask_.tensor != UINT32_MAX && mask_.holder < 0 && checkpointed(l)) mask_.holder = l;
    res = rs_.checkpointing == Checkpointing::SelectiveOp && !c_.model.post_layernorm && c_.model.kv_lora_rank == 0
              ? layer_forward_selective_op(li, res, sv)
          : checkpointed(l) ? layer_forward_checkpointed(li, res, sv)
                            : forward_layer(li, res, sv, true);
    for (uint32_t g : gathered) drop(g);
    gathered.clear();
    // CPU activation offloading keeps one layer in flight: the previous layer's saved tensors leave the GPU.
    if (offload && l > first) offload_layer(l - 1 - first);
    // Unsloth's checkpointer copies the layer's input to the host inside the layer's forward and saves no GPU copy:
    // the input goes when the decoder loop moves on to the layer's output.
    if (unsloth_offload && unsloth_offloads(l)) offload_layer(l - first);
  }
  // No layer keeps the mask: it goes when LlamaModel.forward returns, before the head (its final norm, a small
  // tensor, is taken to run after).
  if (mask_.tensor != UINT32_MAX && mask_.holder < 0) drop(mask_.tensor), mask_.tensor = UINT32_MAX;
  f.mask = mask_;
  mask_ = {};
  // The top layer's saved tensors leave the GPU before the head: the head's own saves (the final norm's, the
  // logits') go through the same pack hook, which frees what earlier copies have finished (torchtune
  // OffloadActivations keeps a few tensors in flight, not a layer). Offloaded after the loss, the whole top layer
  // was on the GPU at the loss's peak, so one more layer could lower the peak (docs/robustness.md).
  if (offload && end > first && f.post) offload_layer(end - 1 - first);
  if (f.post) {
    gather(s_.num_layers, gathered);
    loss_forward(res, f.loss_saved);
    // The output layer as a unit of its own reshards after its forward and is all-gathered again for backward.
    if (embedding_units()) for (uint32_t g : gathered) drop(g);
    else f.gathered_post = gathered;
  } else {
    drop(res);  // sent to the next stage
  }
  release_all_gather();  // the root's post_forward frees the last all-gather output
  if (offload && end > first && !f.post) offload_layer(end - 1 - first);
  // The outermost autocast region exits here: weight copies cached in checkpointed (no_grad) forwards are
  // held by no graph and go.
  for (uint32_t l : ckpt_casts_) drop(casts_[l]), casts_[l] = UINT32_MAX;
  ckpt_casts_.clear();
  casts_.swap(f.casts);
  f.embed_saved.swap(embed_saved_);
  f.held_logits = held_logits_;
  held_logits_ = UINT32_MAX;
}

void StepBuilder::backward_mb(InFlight& f, std::string phase) {
  p_.phase(std::move(phase));
  if (run_shapes_) d_ = f.dims;
  if (c_.model.is_encoder_decoder) return backward_encdec(f);
  begin_backward();
  casts_.swap(f.casts);
  embed_saved_.swap(f.embed_saved);
  mask_ = f.mask;
  const int64_t first = f.first, end = f.end;
  std::vector<uint32_t> gathered;
  uint32_t dres;
  if (f.post) {
    if (embedding_units()) gather(s_.num_layers, f.gathered_post);
    dres = loss_backward(f.loss_saved);
    release_layer_grads(s_.num_layers);
    if (!f.pre && !ctx_.has_pre) reshard_after_backward(s_.num_layers);
    step_in_backward(s_.num_layers);
    for (uint32_t g : f.gathered_post) drop(g);
    f.gathered_post.clear();
  } else if (rs_.framework->pp_persistent_recv) {
    recv_buffers(end - 1, true);
    dres = tmp(0, L_.p2p, static_cast<int32_t>(end - 1));  // a view of this micro-batch's gradient buffer
  } else {
    dres = tmp(mul(d_.e_res, d_.Tn, d_.h), L_.p2p, static_cast<int32_t>(end - 1));  // received from the next stage
  }
  for (int64_t l = end - 1; l >= first; --l) {
    const int32_t li = static_cast<int32_t>(l);
    SavedLayer& sv = f.saved[l - first];
    gather(l, gathered);
    // Back from the host: a new tensor, or under Unsloth's smart checkpointing a view of its persistent buffer.
    const bool into_buffer = unsloth_gc() && rs_.unsloth_gc != UnslothGc::Offload;
    if (!f.host[l - first].empty())
      for (auto [bytes, label] : f.host[l - first]) sv.attn.push_back(act(into_buffer ? 0 : bytes, label, li));
    if (checkpointed(l)) {
      // Recompute with grad on the kept input, then backward through the recomputed graph. Outputs that selective
      // checkpointing kept are handed to the recomputed graph instead of being computed again.
      const uint32_t in = sv.attn.front();
      for (size_t i = 1; i < sv.attn.size(); ++i) drop(sv.attn[i]);
      sv.attn.resize(1);
      SavedLayer& re = recompute_;
      re.attn.clear(), re.mlp.clear();
      uint32_t out = forward_layer(li, in, re, false);
      // Reentrant checkpointing holds the recomputed output through the layer's backward; non-reentrant keeps only
      // what the recomputed graph saved (training.checkpoint_reentrant, auto: FrameworkSpec::checkpoint_reentrant).
      const bool reentrant = rs_.checkpoint_reentrant;
      if (!reentrant) drop(out);
      layer_backward(li, dres, re);
      if (reentrant) drop(out);
      for (uint32_t t : sv.attn) drop(t);
      sv.attn.clear();
    } else {
      layer_backward(li, dres, sv);
    }
    if (mask_.tensor != UINT32_MAX && l == mask_.holder) drop(mask_.tensor), mask_.tensor = UINT32_MAX;
    release_layer_grads(l);
    reshard_after_backward(l);
    step_in_backward(l);
    for (uint32_t g : gathered) drop(g);
    gathered.clear();
  }
  if (f.pre) {
    for (auto it = embed_saved_.rbegin(); it != embed_saved_.rend(); ++it) drop(*it);
    embed_saved_.clear();
    // The embedding as a unit of its own: FSDP2's pre-backward hook all-gathers it again (though its backward reads
    // only the output's gradient and the ids).
    if (embedding_units()) gather(-1, gathered);
    // Embedding backward: a dense [V, h] gradient. Untied, it is the embedding's .grad; tied, see tied_sum.
    alloc_layer_grads(-1);
    // A frozen embedding (PEFT) has no backward: its input is token ids and its weight needs no gradient.
    if (c_.model.tie_word_embeddings && has_grad(s_.pre.front())) {
      const int64_t bytes = mul(pr_.grad_bytes, d_.V, d_.h);
      uint32_t dense = tmp(bytes, L_.embed_grad_dense, -1);
      if (tied_sum()) {
        const uint32_t sum = p_.alloc(Component::Gradients, bytes, L_.tied_sum);
        auto& head = grads_[static_cast<size_t>(s_.num_layers + 1)];
        if (tied_pending_ != UINT32_MAX) {  // AccumulateGrad adds the sum into the existing .grad in place
          drop(tied_pending_), tied_pending_ = UINT32_MAX;
          drop(dense), drop(sum);
        } else if (!head.empty()) {  // the first micro-batch: the sum becomes .grad
          drop(head.back()), head.back() = sum;
          drop(dense);
        } else {
          drop(dense), drop(sum);
        }
      } else {
        drop(dense);
      }
    }
    release_layer_grads(-1);
    reshard_after_backward(-1);
    reshard_after_backward(s_.num_layers);
    step_in_backward(-1);
    for (uint32_t g : gathered) drop(g);
    gathered.clear();
  }
  if (f.held_logits != UINT32_MAX) drop(f.held_logits), f.held_logits = UINT32_MAX;
  // The input's gradient is sent to the previous stage; under torch.distributed.pipelining it is also the
  // receive buffer's .grad, which stays until the next step() clears it.
  if (!f.pre && rs_.framework->pp_persistent_recv) input_grads_.push_back(dres);
  else drop(dres);
  if (f.inputs != UINT32_MAX) drop(f.inputs);
  if (mask_.tensor != UINT32_MAX) drop(mask_.tensor);  // a holder outside this chunk's layers (not expected)
  mask_ = {};
  f.mask = {};
  casts_.swap(f.casts);
  end_backward();
}

// A finished micro-batch's per-layer vectors wait in a pool for the next forward, which clears them: a pipeline
// stage runs dozens of short chunk forwards, and allocating their vectors anew cost more than filling them.
void StepBuilder::recycle(InFlight& f) {
  spare_.push_back({std::move(f.saved), std::move(f.host), std::move(f.casts)});
  f = InFlight{};
}

void StepBuilder::reuse(InFlight& f) {
  if (spare_.empty()) return;
  f.saved = std::move(spare_.back().saved);
  f.host = std::move(spare_.back().host);
  f.casts = std::move(spare_.back().casts);
  spare_.pop_back();
}

// The micro-batches of one step in the order this device runs them (Megatron schedules.py): without a
// pipeline, forward and backward alternate; GPipe runs every forward, then every backward; 1F1B warms up with
// (stages - stage - 1) forwards, then alternates, so at most (stages - stage) micro-batches are in flight.
// Interleaved 1F1B (forward_backward_pipelining_with_interleaving) runs each micro-batch through v model chunks
// per device: it warms up with (stages - stage - 1) x 2 + (v - 1) x stages chunk forwards, chunk
// (k / stages) % v of micro-batch (k / (stages v)) stages + k % stages for the k-th, and backwards in the
// reverse chunk order; the in-flight activations come out of that order (Korthikanti et al. 2022 eq. 5 puts
// the first stage at 1 + (p - 1) / (p v) of 1F1B's).
void StepBuilder::run_schedule(int iter, int64_t mbs, int64_t gas) {
  iter_ = iter;
  const int64_t p = c_.parallel.pipeline_parallel_size, i = ctx_.stage;
  const bool interleaved = p > 1 && c_.parallel.schedule() == PipelineSchedule::Interleaved1F1B;
  const int64_t v = interleaved ? c_.parallel.virtual_pipeline_stages : 1;
  // "forward (step 2, micro-batch 3)": the phase's name, built in one string.
  auto phase_name = [&](const char* pass, int64_t mb) {
    std::string t;
    t.reserve(64);
    t += pass;
    t += " (step ";
    t += std::to_string(iter);
    if (gas > 1 && (iter == 2 || run_shapes_)) {
      if (mb == mbs && gas > mbs) t += ", micro-batches ", t += std::to_string(mb), t += '-', t += std::to_string(gas);
      else t += ", micro-batch ", t += std::to_string(mb);
    }
    t += ')';
    return t;
  };
  auto chunk_of = [&](InFlight& f, int64_t chunk) {
    if (!interleaved) {
      f.first = ctx_.first_layer, f.end = std::min(ctx_.end_layer, s_.num_layers);
      f.pre = ctx_.has_pre, f.post = ctx_.has_post;
      return;
    }
    const int64_t model_chunk = chunk * p + i;
    std::tie(f.first, f.end) = interleaved_chunk(s_.num_layers, p * v, model_chunk);
    f.pre = model_chunk == 0, f.post = model_chunk == p * v - 1;
    f.owns_inputs = chunk == 0;
  };
  if (!interleaved) {
    std::vector<InFlight> flights(static_cast<size_t>(mbs));
    for (auto& f : flights) chunk_of(f, 0);
    int64_t next_f = 0, next_b = 0;
    auto F = [&]() { forward_mb(flights[next_f], phase_name("forward", next_f + 1)), ++next_f; };
    auto B = [&]() {
      InFlight& f = flights[next_b];
      last_backward_ = next_b == mbs - 1;
      backward_mb(f, phase_name("backward", next_b + 1));
      recycle(f), chunk_of(f, 0), ++next_b;
    };
    if (p > 1 && c_.parallel.schedule() == PipelineSchedule::GPipe) {
      while (next_f < mbs) F();
      while (next_b < mbs) B();
      return;
    }
    const int64_t warmup = p > 1 ? std::min(p - i - 1, mbs) : 0;
    for (int64_t k = 0; k < warmup; ++k) F();
    while (next_f < mbs) F(), B();
    while (next_b < mbs) B();
    return;
  }
  const int64_t total = mbs * v;
  std::vector<InFlight> flights(static_cast<size_t>(total));  // indexed by micro-batch * v + chunk
  auto mb_of = [&](int64_t k) { return (k / (p * v)) * p + k % p; };
  auto slot = [&](int64_t k, bool forward) {
    const int64_t c = (k / p) % v;
    return mb_of(k) * v + (forward ? c : v - 1 - c);
  };
  int64_t next_f = 0, next_b = 0;
  auto F = [&]() {
    const int64_t k = next_f++;
    if (mb_of(k) >= mbs) return;  // a partial last round (micro-batches not a multiple of the stages)
    InFlight& f = flights[static_cast<size_t>(slot(k, true))];
    chunk_of(f, (k / p) % v);
    forward_mb(f, phase_name("forward", mb_of(k) + 1));
  };
  auto B = [&]() {
    const int64_t k = next_b++;
    if (mb_of(k) >= mbs) return;
    InFlight& f = flights[static_cast<size_t>(slot(k, false))];
    last_backward_ = mb_of(k) == mbs - 1;
    backward_mb(f, phase_name("backward", mb_of(k) + 1));
    recycle(f);
  };
  const int64_t rounds = ceil_div(mbs, p) * p * v;  // virtual micro-batches, padded to whole rounds
  const int64_t warmup = std::min((p - i - 1) * 2 + (v - 1) * p, rounds);
  for (int64_t k = 0; k < warmup; ++k) F();
  while (next_f < rounds) F(), B();
  while (next_b < rounds) B();
}

}  // namespace memsim
