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

}  // namespace

uint32_t StepBuilder::embed_forward() {
  // The embedding output is the first residual; under autocast it is fp32 (embedding is not an autocast op).
  uint32_t res = act(mul(dims_.e_res, dims_.Tn, dims_.h), labels_.residual, -1);
  if (cfg_.model.position_embedding_type == PositionType::Absolute) {  // GPT-2: wte(ids) + wpe(pos)
    uint32_t pos = tmp(mul(dims_.e_res, dims_.Tn, dims_.h), labels_.residual, -1);
    uint32_t sum = act(mul(dims_.e_res, dims_.Tn, dims_.h), labels_.residual, -1);
    drop(pos);
    drop(res);
    res = sum;
  }
  if (!cfg_.model.post_layernorm && cfg_.model.hidden_dropout > 0) {
    // Embedding dropout (GPT-2 embd_pdrop, Megatron's embedding dropout; Korthikanti et al. 2022 sec. 4.3: sbhp / t
    // on the first stage).
    res = dropout(res, mul(dims_.Tn, dims_.h), dims_.e_res, true, labels_.residual, -1, embed_saved_);
  }
  if (cfg_.model.post_layernorm) {
    // BertEmbeddings: LayerNorm(sum) saves its input, mean and rstd; dropout saves a 1-byte mask.
    embed_saved_.push_back(res);
    embed_saved_.push_back(act(mul(8, dims_.T), labels_.norm_rstd, -1));
    uint32_t out = act(mul(dims_.e_res, dims_.T, dims_.h), labels_.residual, -1);
    if (cfg_.model.hidden_dropout > 0) out = dropout(out, mul(dims_.T, dims_.h), dims_.e_res, true, labels_.residual, -1, embed_saved_);
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
  const auto& m = cfg_.model;
  const int64_t e = dims_.e, th = mul(dims_.T, dims_.h);
  auto& A = saved.attn;
  autocast_casts(layer, !no_grad_);
  // q, k and v save their input: x itself, or under autocast one cast of it each.
  if (dims_.amp) for (int i = 0; i < 3; ++i) A.push_back(act(mul(2, th), labels_.norm_out_cast, layer));
  else if (free_input) A.push_back(x);
  for (uint32_t lbl : {labels_.q, labels_.k, labels_.v}) A.push_back(act(mul(e, dims_.T, dims_.h_q), lbl, layer));
  if (resolved_.attention != Attention::Eager) {
    // BertSdpaSelfAttention (transformers >= 4.41): scaled_dot_product_attention with the dropout inside the
    // kernel, and no mask when nothing is padded. The flash or memory-efficient kernel keeps q, k, v, its output
    // (whose transpose back is contiguous, so the dense reads it without a copy) and an fp32 logsumexp, as the
    // decoders' SDPA path.
    A.push_back(act(mul(e, dims_.T, dims_.h_q), labels_.attn_out, layer));
    const int64_t s_lse = e == 4 ? round_up(dims_.s, 32) : dims_.s;  // the efficient kernel pads the LSE to 32
    if (keep_s2) A.push_back(act(mul(4, dims_.a, dims_.b, s_lse), labels_.lse, layer));
  } else {
    // scores / sqrt(d) + mask -> softmax (fp32 under autocast: softmax is on its fp32 list) -> dropout -> the cast
    // for probs @ v under autocast.
    const int64_t s2 = mul(dims_.a, dims_.b, dims_.s, dims_.s);
    const int64_t sm_bytes = dims_.amp ? 4 : e;
    std::vector<uint32_t> s2_saved;
    uint32_t sc = tmp(mul(e, s2), labels_.scores, layer);
    uint32_t scaled = tmp(mul(e, s2), labels_.scores, layer);
    drop(sc);
    attention_probs(layer, s2, {sm_bytes, false, sm_bytes, true, m.attention_dropout > 0}, keep_s2, s2_saved, scaled);
    uint32_t ctx = tmp(mul(e, dims_.T, dims_.h_q), labels_.attn_tmp, layer);
    A.push_back(act(mul(e, dims_.T, dims_.h_q), labels_.attn_out, layer));  // permute(...).contiguous(), saved by dense
    drop(ctx);
    if (keep_s2) A.insert(A.end(), s2_saved.begin(), s2_saved.end());
    else for (uint32_t t : s2_saved) drop(t);
  }
  uint32_t o = tmp(mul(e, th), labels_.o_out, layer);
  if (m.hidden_dropout > 0) A.push_back(act(th, labels_.hidden_mask, layer));
  uint32_t sum = act(mul(dims_.e_res, th), labels_.residual, layer);  // saved by LayerNorm
  drop(o);
  if (dims_.amp && free_input) drop(x);
  A.push_back(sum);
  A.push_back(act(mul(8, dims_.T), labels_.norm_rstd, layer));
  uint32_t att = act(mul(dims_.e_res, th), labels_.residual, layer);  // LayerNorm output: the attention output

  // MLP: the intermediate dense saves its input (the attention output, or its cast), GELU its input, the output
  // dense its input.
  auto& M = saved.mlp;
  if (dims_.amp) M.push_back(act(mul(2, th), labels_.norm_out_cast, layer));
  else M.push_back(att);
  M.push_back(act(mul(e, dims_.T, dims_.f), labels_.mlp_fc1, layer));
  M.push_back(act(mul(e, dims_.T, dims_.f), labels_.mlp_gelu, layer));
  uint32_t out = tmp(mul(e, th), labels_.mlp_out, layer);
  if (m.hidden_dropout > 0) M.push_back(act(th, labels_.hidden_mask, layer));
  uint32_t sum2 = act(mul(dims_.e_res, th), labels_.residual, layer);
  drop(out);
  if (dims_.amp) drop(att);
  M.push_back(sum2);
  M.push_back(act(mul(8, dims_.T), labels_.norm_rstd, layer));
  return act(mul(dims_.e_res, th), labels_.residual, layer);
}

// What the linears reading one tensor (q/k/v, gate/up, o_proj, down_proj, lm_head) keep of it for backward.
// A trainable weight needs the input for its gradient: the tensor itself once, or under autocast one cast copy
// per matmul (cached_cast caches only leaf weights). A frozen weight needs nothing. A LoRA adapter's lora_A
// saves what it reads: the tensor itself when it reads it unchanged, else its own copy (cast to the adapter
// dtype, autocast's cast, or dropout's output and mask), and lora_B saves lora_A's output (peft
// tuners/lora/layer.py Linear.forward; MEMORY_FORMULAS.md 4.4). Returns whether the tensor itself is saved.
const StepBuilder::ModuleInfo& StepBuilder::module_info(const char* module) const {
  if (auto it = module_info_.find(module); it != module_info_.end()) return it->second;
  const std::string m(module);
  ModuleInfo info;
  info.qkv = m == "q_proj" || m == "k_proj" || m == "v_proj";
  info.targeted = peft_targets(cfg_.peft, m);
  info.trainable = !cfg_.peft.enabled() || trainable_module(module);
  if (m.starts_with("experts.")) {
    // A routed expert's projection ("experts.gate_proj"): adapted where the shape gave the experts adapters
    // (model.cpp adapt_experts), trainable where its stack has a gradient.
    info.targeted = false, info.trainable = !cfg_.peft.enabled();
    const std::string lora = "mlp." + m + ".lora_A.weight", stack = expert_stack(module);
    for (const auto& t : shape_.moe_layer) {
      info.targeted |= t.name == lora;
      info.trainable |= (t.name == stack || t.name == "modules_to_save." + stack) && has_grad(t);
    }
  }
  info.ia3 = cfg_.peft.kind() == PeftMethod::Ia3;
  info.dora = cfg_.peft.kind() == PeftMethod::Dora;
  return module_info_.emplace(std::string_view(module), info).first->second;
}

// Whether a bitsandbytes linear keeps its input as an attribute of its autograd node (ctx.tensors), which lives as
// long as the graph: the caller that keeps the input hands it to hold_in_graph. Old bitsandbytes keeps a 4-bit
// linear's input whenever the input requires grad: everywhere but the first layer's q/k/v, which read the frozen
// embedding's normalised output. LLM.int8's MatMul8bitLt keeps its input in every version (ctx.tensors = (CAt,
// subA, A) whenever the input requires grad), and before bitsandbytes 0.45 an int8 transposed copy of it, one per
// linear call (a fused qkv linear is one; `qkv_int8_done` remembers it), which nothing but the graph holds
// (docs/versions.md 4); subA, the outlier columns, is small. A non-reentrant checkpoint's recomputation builds a
// graph that goes as soon as it has run (torch/utils/checkpoint.py recompute_fn drops its outputs): backward reads
// the first forward's ctx.tensors, so the recomputation keeps nothing for them.
bool StepBuilder::bnb_keeps_input(int32_t layer, const char* module, const ModuleInfo& info, int64_t tw,
                                  bool& qkv_int8_done) {
  const auto& peft = cfg_.peft;
  // (Nor in the first adapted layer of litgpt's v1 or PEFT's adaption_prompt, whose q/k/v input needs no gradient.)
  // The versions first: module_quantized searches the layer's parameters, and most runs stop at this test.
  const bool int8 = peft.quantization() == BaseQuantization::Int8;
  if (!(int8 || (resolved_.bnb_saves_input && peft.four_bit()))) return false;
  if (!module_quantized(layer, module) || (layer == 0 && info.qkv) || (info.qkv && gate_only_layer(layer))) return false;
  const bool recomputing_without_graph = in_backward_ && !resolved_.checkpoint_reentrant;
  if (int8 && resolved_.bnb_int8_copy && !(resolved_.fused_qkv && info.qkv && qkv_int8_done)) {
    if (int8_copy_label_ == UINT32_MAX) int8_copy_label_ = program_.label("LLM.int8 copy of a linear's input (int8, kept by the graph)");
    const uint32_t copy = act(tw, int8_copy_label_, layer);
    hold_in_graph(copy);
    drop(copy);  // held by the node alone: it goes with the graph
  }
  qkv_int8_done |= int8 && info.qkv;
  return !recomputing_without_graph;
}

// The input of these linears kept by a non-reentrant checkpoint's first forward: it runs with grad, and its saved
// tensors go through the checkpoint's pack hook, which keeps none of them, but a bitsandbytes node's ctx.tensors
// is an attribute, not a saved tensor (docs/versions.md 4), so it stays with the graph. `input` is then held.
void StepBuilder::checkpoint_graph_inputs(int32_t layer, std::initializer_list<const char*> modules, int64_t width,
                                          int64_t tokens, uint32_t input) {
  if (!ckpt_graph_) return;
  bool keeps = false, qkv_int8_done = false;
  for (const char* mod : modules) {
    const ModuleInfo info = module_info(mod);
    keeps |= bnb_keeps_input(layer, mod, info, mul(tokens, width), qkv_int8_done);
  }
  if (keeps) hold_in_graph(input);
}

bool StepBuilder::linear_inputs(int32_t layer, std::initializer_list<const char*> modules, int64_t width,
                                std::vector<uint32_t>& saved, int64_t tokens, bool low_precision_input) {
  const int64_t tw = mul(tokens, width);
  const auto& peft = cfg_.peft;
  bool need_self = false;
  bool qkv_done = false;  // a fused qkv linear (litgpt, Megatron) carries one adapter for all of q, k, v
  bnb_input_in_graph_ = false;
  bool qkv_int8_done = false;
  for (const char* mod : modules) {
    const ModuleInfo info = module_info(mod);  // a copy: module_info may grow its cache below
    if (resolved_.fused_qkv && info.qkv && info.targeted) {
      if (qkv_done) continue;
      qkv_done = true;
    }
    if (info.trainable) {
      if (dims_.amp && !low_precision_input) saved.push_back(act(mul(2, tw), labels_.norm_out_cast, layer));
      else need_self = true;
    }
    if (bnb_keeps_input(layer, mod, info, tw, qkv_int8_done)) need_self = true, bnb_input_in_graph_ = true;
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
    if (lora_dropout_on()) {
      saved.push_back(act(tw, labels_.lora_in, layer));  // dropout mask
      saved.push_back(act(mul(dims_.amp ? 2 : ab, tw), labels_.lora_in, layer));
    } else if (dims_.amp && !(low_precision_input && ab == 2)) {  // a 16-bit input into 16-bit adapters: no cast
      saved.push_back(act(mul(2, tw), labels_.lora_in, layer));
    } else if (ab != dims_.e) {
      saved.push_back(act(mul(ab, tw), labels_.lora_in, layer));
    } else {
      need_self = true;
    }
    saved.push_back(act(mul(dims_.amp ? 2 : ab, tokens, peft.lora_rank), labels_.lora_in, layer));
    // A fused qkv linear adapted on some of q, k, v only: the adapter's [T, enabled width] delta is scattered into
    // zeros of the full width (litgpt lora.py LoRAQKVLinear.zero_pad: index_copy), whose backward keeps that source
    // (derivatives.yaml index_copy: grad.index_select(dim, index).expand_as(source)).
    if (resolved_.fused_qkv && info.qkv) {
      const bool q = module_info("q_proj").targeted, k = module_info("k_proj").targeted,
                 v = module_info("v_proj").targeted;
      const int64_t enabled = add(q ? dims_.h_q : 0, mul(dims_.h_kv, int64_t{k} + int64_t{v}));
      if (!(q && k && v)) saved.push_back(act(mul(dims_.amp ? 2 : ab, tokens, enabled), labels_.lora_in, layer));
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
  const int64_t cp = cfg_.parallel.context_parallel_size;
  const int64_t chunk = mul(2, dims_.e, dims_.T, kvw);  // this rank's keys and values
  return resolved_.cp_rotate == CpRotate::AllGather ? mul(cp + 1, chunk) : mul(2, chunk);
}

// Output width of a layer linear, by PEFT's module name.
int64_t StepBuilder::out_width(const std::string& module) const {
  if (module.starts_with("experts."))  // a routed expert's projection: up to the expert width, down to the hidden size
    return module == "experts.down_proj" ? dims_.h : cfg_.model.expert_width();
  return module == "q_proj"                           ? dims_.h_q
         : module == "k_proj" || module == "v_proj"    ? dims_.h_kv
         : module == "gate_proj" || module == "up_proj" ? dims_.f
                                                        : dims_.h;  // o_proj, down_proj
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
  const int64_t ab = dims_.amp ? 2 : adapter_bytes();  // under autocast the matmuls return bf16
  const int64_t out = out_width(module);
  uint32_t w = tmp(mul(adapter_bytes(), width, out), labels_.lora_in, layer);
  drop(tmp(mul(adapter_bytes(), width, out), labels_.lora_in, layer));
  if (cfg_.peft.lora_dropout > 0) {  // the module is nn.Dropout even at p 0 (PPO's disable_dropout): PEFT's path
    // The weight's cast, saved by F.linear: one per expert that runs, for a routed expert's projection.
    const int64_t copies = module.starts_with("experts.")
                               ? std::max<int64_t>(1, cfg_.model.num_experts / std::max<int64_t>(1, cfg_.parallel.expert_parallel_size))
                               : 1;
    saved.push_back(act(mul(ab, width, out, copies), labels_.lora_in, layer));
    saved.push_back(act(mul(ab, tokens, out), labels_.lora_in, layer));  // base_result
  } else {
    saved.push_back(act(mul(dims_.e, tokens, out), labels_.lora_in, layer));  // the base layer's output
  }
  drop(w);
  saved.push_back(act(mul(ab, tokens, out), labels_.lora_in, layer));  // lora_result
}

// IA3 (peft tuners/ia3/layer.py Linear.forward): the learned vector, in its own dtype (fp32: update_layer makes it
// with torch.randn), scales the base output or, for a feedforward module, the input,
// `(x.to(dtype) * ia3_scaling).to(previous_dtype)`. The product saves its tensor operand for the vector's gradient.
// For a feedforward module that is the input cast to the vector's dtype, a copy unless the input already has that
// dtype (then the input itself, and the function returns true). For the output: before peft 0.11 the output cast
// to the vector's dtype, `result.to(dtype) * ia3_scaling`, a new [tokens, out] fp32 tensor; from 0.11 (peft#1634,
// `(result * ia3_scaling).to(result_dtype)`) the base output itself in its own dtype, which nothing else keeps
// (type promotion happens inside the mul kernel; mul's backward saves its operands as they were passed), and the
// product in the promoted dtype is a transient. The bitsandbytes layers (ia3/bnb.py) instead upcast x to fp32 when
// autocast is off (`x = x.float()`) and multiply in that dtype, which saves the same fp32 tensors; under autocast
// they multiply x (or the output) as it is.
bool StepBuilder::ia3_inputs(int32_t layer, const std::string& module, int64_t width, std::vector<uint32_t>& saved,
                             int64_t tokens) {
  const int64_t ab = any_quantized_ ? (dims_.amp ? dims_.e : 4) : adapter_bytes();
  if (ia3_feedforward(cfg_.peft, module)) {
    if (ab == dims_.e) return true;
    saved.push_back(act(mul(ab, tokens, width), labels_.lora_in, layer));
    return false;
  }
  const int64_t out = out_width(module);
  if (!any_quantized_ && !resolved_.ia3_casts_output) {
    const int64_t out_bytes = dims_.amp ? 2 : dims_.e;  // the base linear's output dtype
    saved.push_back(act(mul(out_bytes, tokens, out), labels_.lora_in, layer));
    drop(tmp(mul(std::max(out_bytes, ab), tokens, out), labels_.lora_in, layer));  // the product, before its cast back
    return false;
  }
  saved.push_back(act(mul(ab, tokens, out), labels_.lora_in, layer));
  drop(tmp(mul(ab, tokens, out), labels_.lora_in, layer));  // the scaled product, cast back to the input's dtype
  return false;
}

// Whether the norm that feeds these consumers has a trainable weight: full fine-tuning, LN tuning's copy, or the
// norm named in modules_to_save.
bool StepBuilder::norm_trainable(int32_t layer, std::initializer_list<const char*> consumers) const {
  if (!cfg_.peft.enabled()) return true;
  // The answer depends on the layer's parameter list and the first consumer only: worked out once per pair.
  const std::vector<ParamTensor>* params = layer < 0 ? &shape_.post : &shape_.params_of(layer);
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
  const int64_t th = mul(dims_.Tn, dims_.h);  // sequence parallel: norms see T / t tokens
  const size_t mark = saved.size();
  res_retained = false;
  if (cfg_.model.norm_type == NormType::LayerNorm) {
    // aten native_layer_norm saves its input, mean and rstd (fp32, one per token). Under autocast a 16-bit input
    // is first cast to fp32 (layer_norm is on the fp32 list), and that copy is what it saves.
    if (dims_.amp && dims_.e_res < 4) saved.push_back(act(mul(4, th), labels_.norm_x32, layer));
    else res_retained = true;
    saved.push_back(act(mul(4, dims_.Tn), labels_.norm_rstd, layer));
    saved.push_back(act(mul(4, dims_.Tn), labels_.norm_rstd, layer));
  } else if (norm_impl(layer) == NormImpl::Fused) {
    // Fused RMSNorm kernels (Apex, TE, Liger) save their input and rstd, and so does a compiled layer's norm.
    res_retained = true;
    saved.push_back(act(mul(4, dims_.Tn), labels_.norm_rstd, layer));
  } else {
    // HF LlamaRMSNorm: x32 = x.to(fp32) is saved by pow and by x32 * rstd; under fp32 or autocast the residual
    // already is fp32, so x32 is the residual itself.
    if (dims_.e_res == 4) res_retained = true;
    else saved.push_back(act(mul(4, th), labels_.norm_x32, layer));
    saved.push_back(act(mul(4, dims_.Tn), labels_.norm_rstd, layer));
    // weight * normed saves normed for the weight's gradient: cast back to the input dtype in HF (eager_fp32),
    // kept in fp32 by torchtune and litgpt (fp32_scale: (x_normed * weight.float()).to(dtype)). A frozen norm
    // weight (PEFT) needs no gradient, so nothing is saved for it; LN tuning's trainable copy needs it again.
    const int64_t scaled = norm_impl(layer) == NormImpl::Fp32Scale ? 4 : dims_.e_res;
    if (norm_trainable(layer, consumers)) saved.push_back(act(mul(scaled, th), labels_.norm_scaled, layer));
  }
  if (res_retained && own_res) saved.push_back(res);  // else the caller (a checkpoint) keeps it
  const int64_t out_bytes = norm_out_bytes();
  uint32_t y = act(mul(out_bytes, th), labels_.norm_out, layer);
  int64_t tokens = dims_.Tn;
  if (gathered_inputs()) {  // DTensor sequence parallel: the linears read the all-gathered output
    tokens = dims_.T;
    const uint32_t g = act(mul(out_bytes, dims_.T, dims_.h), labels_.norm_out, layer);
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
    checkpoint_graph_inputs(layer, consumers, dims_.h, tokens, y);
    return;
  }
  if (linear_inputs(layer, consumers, dims_.h, saved, tokens, out_bytes < 4)) {
    saved.push_back(fp8_input(y, mul(tokens, dims_.h), layer));
    if (bnb_input_in_graph_) hold_in_graph(saved.back());
  } else {
    drop(y);
  }
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
  const ParamTensor* tied = tied_weight();
  return tied && has_grad(*tied) && !amp_fp32_weights() && !shard_grads_ && !shard_plan_.grad_buffer &&
         !cfg_.training.optimizer_in_backward && ctx_.has_pre && ctx_.has_post;
}

const ParamTensor* StepBuilder::tied_weight() const {
  if (shape_.program) {
    if (shape_.program->tied_head.empty()) return nullptr;
    const std::string name = shape_.program->tied_head + ".weight";
    for (const auto& t : shape_.post)
      if (t.name == name) return &t;
    return nullptr;
  }
  return cfg_.model.tie_word_embeddings && !shape_.pre.empty() ? &shape_.pre.front() : nullptr;
}

// The dense gradient is a temporary; outside autocast the sum is a new tensor: in the first micro-batch it becomes
// .grad (the head's share, made in the loss backward, goes), in a later one AccumulateGrad adds it into .grad in place
// and the head's share that waited in the engine (tied_pending_) goes.
void StepBuilder::tied_embedding_grad(int64_t bytes) {
  uint32_t dense = tmp(bytes, labels_.embed_grad_dense, -1);
  if (!tied_sum()) return drop(dense);
  const uint32_t sum = program_.alloc(Component::Gradients, bytes, labels_.tied_sum);
  auto& head = grads_[static_cast<size_t>(shape_.num_layers + 1)];
  if (tied_pending_ != UINT32_MAX) {
    drop(tied_pending_), tied_pending_ = UINT32_MAX;
    drop(dense), drop(sum);
  } else if (!head.empty()) {
    drop(head.back()), head.back() = sum;
    drop(dense);
  } else {
    drop(dense), drop(sum);
  }
}

// FrameworkSpec::tp_saves_gathered_input, with sequence parallelism on: each norm's output is all-gathered to the
// whole sequence for the column-parallel linears that read it, and they save that.
bool StepBuilder::gathered_inputs() const { return resolved_.framework->tp_saves_gathered_input && dims_.Tn < dims_.T; }

// The stack a routed expert's projection lives in (model.cpp build_model_shape): gate and up share one.
std::string StepBuilder::expert_stack(std::string_view module) {
  return module == "experts.down_proj" ? "mlp.experts.down_proj" : "mlp.experts.gate_up_proj";
}

bool StepBuilder::module_quantized(int32_t layer, std::string_view module) const {
  if (module.starts_with("experts.")) {
    const std::string stack = expert_stack(module);
    for (const auto& t : shape_.params_of(layer))
      if (t.quantized && t.name == stack) return true;
    return false;
  }
  // (A program's head runs as layer num_layers: its linears are in post.)
  const auto& ts = module == "lm_head" || (shape_.program && layer >= shape_.num_layers) ? shape_.post
                   : layer >= 0 && layer < shape_.num_layers                              ? shape_.params_of(layer)
                                                                                          : shape_.pre;
  for (const auto& t : ts)
    if (t.quantized && module_name_view(t.name) == module) return true;
  return false;
}

// Bytes per element of a dequantized weight on its way into the matmul: bitsandbytes returns the quantization
// state's dtype; Lightning's plugin quantized an fp16 copy, so under bf16 compute a cast copy follows.
int64_t StepBuilder::dequant_bytes() const {
  const bool fp16_compute = cfg_.training.precision.find("fp16") != std::string::npos;
  return resolved_.framework->bnb_via_lightning && !fp16_compute ? add(dims_.e, 2) : dims_.e;
}

// The quantized output head dequantized for one matmul (forward, or the input gradient in backward): alive
// while the matmul writes its output. UINT32_MAX when the head is not quantized.
uint32_t StepBuilder::head_dequant() {
  for (const auto& t : shape_.post)
    if (t.quantized && module_name(t.name) == "lm_head") return tmp(mul(dequant_bytes(), t.numel), labels_.dequant, -1);
  return UINT32_MAX;
}

void StepBuilder::drop_if(uint32_t t) {
  if (t != UINT32_MAX) drop(t);
}

// bitsandbytes MatMul4Bit / 8-bit matmuls dequantize the frozen weight for the GEMM, forward and backward
// (autograd/_functions.py: grad_A = grad_output @ dequantize_4bit(B)): one layer's largest weight at a time. A
// routed expert's weights are separate linears in transformers 4.x's MoE blocks (MixtralBlockSparseTop2MLP w1, w3,
// w2), each a Linear4bit of its own, so one expert's one projection is dequantized at a time, not the
// [experts, ...] tensor memsim keeps them in.
void StepBuilder::dequant(int32_t layer) {
  int64_t largest = 0;
  for (const auto& t : shape_.params_of(layer)) {
    if (t.quantized) largest = std::max(largest, one_linear_numel(t, cfg_.model.mlp_gated));
  }
  if (largest == 0) return;
  uint32_t w = tmp(mul(dequant_bytes(), largest), labels_.dequant, layer);
  drop(w);
}

// torch.autocast's low-precision copies of one layer's fp32 matmul weights. ATen caches a copy until the outermost
// autocast region exits only for a leaf that requires grad (autocast_mode.cpp cached_cast: `arg.requires_grad() &&
// arg.is_leaf()`); a frozen weight (PEFT's base) is cast again by every call, and only the graph keeps that copy
// (mm saves it for the input's gradient), so a forward without a graph (a checkpoint's first) holds one at a time.
// A quantized weight is not floating point and is never cast. fp32 LoRA matrices (PEFT's autocast_adapter_dtype
// keeps them fp32 on a 16-bit base) are trainable leaves that lora_A and lora_B run through F.linear: cached
// too, in the autocast dtype, whatever the base's dtype (Unsloth's kernels cast A and B themselves instead).
// `graph`: this forward records a graph.
void StepBuilder::autocast_casts(int32_t layer, bool graph) {
  LayerCasts& c = casts_[layer];
  if (!dims_.amp || c.live()) return;
  const int64_t adapter_copy_bytes = adapter_bytes() == 4 && !unsloth_lora_kernels() ? dims_.e : 0;  // autocast's dtype
  if (recipe_.autocast_copy_bytes == 0 && adapter_copy_bytes == 0) return;  // (16-bit weights and adapters: no copies)
  int64_t cached = 0, frozen = 0, largest_frozen = 0;
  for (const auto& t : shape_.params_of(layer)) {
    if (t.kind == ParamKind::Adapter) {
      if (adapter_copy_bytes > 0 && !t.frozen && (t.name.ends_with(".lora_A.weight") || t.name.ends_with(".lora_B.weight")))
        c.adapters.push_back(tmp(mul(t.numel, adapter_copy_bytes), labels_.cast, layer));
      continue;
    }
    // (a fused kernel casts its own, ssd_mixer's; transformers 5's grouped_mm casts nothing: not autocast-enabled)
    if (t.kind != ParamKind::Matmul || t.quantized || t.fused) continue;
    if (!t.frozen) cached = add(cached, t.numel);
    else frozen = add(frozen, t.numel), largest_frozen = std::max(largest_frozen, t.numel);
  }
  if (recipe_.autocast_copy_bytes == 0) return;
  const int64_t held = graph ? add(cached, frozen) : cached;
  if (held > 0) c.weights = tmp(mul(held, recipe_.autocast_copy_bytes), labels_.cast, layer);
  if (!graph && largest_frozen > 0) drop(tmp(mul(largest_frozen, recipe_.autocast_copy_bytes), labels_.cast, layer));
}

void StepBuilder::drop_casts(LayerCasts& c) {
  drop_if(c.weights);
  c.weights = UINT32_MAX;
  for (uint32_t t : c.adapters) drop(t);
  c.adapters.clear();
}

uint32_t StepBuilder::int4_label(uint32_t& label, const char* text) {
  if (label == UINT32_MAX) label = program_.label(text);
  return label;
}

// A GPTQ or AWQ base's 4-bit linears of one half of a layer (parameters under `prefix`) in a forward with LoRA
// (docs/research/gptq-awq-lora.md 3-4). GPTQ as transformers trains it (GPTQConfig(use_exllama=False), as its docs
// ask for PEFT: exllama has no backward) runs auto-gptq's qlinear_cuda_old torch path whenever batch x sequence >=
// 128 (kernel_switch_threshold; below it a CUDA kernel runs that saves nothing, which memsim does not model): it unpacks qweight into int32 [in/8, 8, out] (4 bytes an element), casts to int8, subtracts the zeros and
// multiplies by the fp16 scales into an fp16 [in, out] weight, then torch.matmul(x, weight). No custom autograd
// Function: the matmul saves that fp16 weight for the input's gradient whenever x requires grad (not x: the weight
// needs no gradient), so a forward that keeps its graph keeps a dequantized copy of every linear, 2 bytes a weight.
// AWQ (AutoAWQ >= 0.2.0, WQLinear_GEMM, WQLinearMMFunction) saves x as passed after `x.half()`, a new fp16 copy
// unless the input is fp16 already (prepare_model_for_kbit_training makes the norms' outputs fp32 on an AWQ model),
// and dequantizes the fp16 weight as a transient when batch x sequence >= 1024 (FP16_MATMUL_HEURISTIC_CONDITION).
// The first layer's q/k/v read the frozen embedding's normalised output, which needs no gradient (as in
// bnb_keeps_input): nothing is saved for them.
void StepBuilder::int4_forward(int32_t layer, const char* prefix, std::vector<uint32_t>& saved) {
  const bool gptq = cfg_.peft.quantization() == BaseQuantization::Gptq;
  for (const auto& t : shape_.params_of(layer)) {
    if (!t.quantized || t.name.rfind(prefix, 0) != 0) continue;
    const std::string mod = module_name(t.name);
    const bool qkv = mod == "q_proj" || mod == "k_proj" || mod == "v_proj";
    const bool input_grad = !no_grad_ && !(layer == 0 && qkv);
    if (gptq) {
      const uint32_t shifted = tmp(mul(4, t.numel), int4_label(int4_labels_.unpack, "GPTQ weight unpacked (int32, then int8)"), layer);
      const uint32_t bytes = tmp(t.numel, int4_labels_.unpack, layer);
      drop(shifted);
      const uint32_t label = int4_label(int4_labels_.weight, "GPTQ weight dequantized to fp16 (saved by the matmul)");
      const uint32_t w = input_grad ? act(mul(2, t.numel), label, layer) : tmp(mul(2, t.numel), label, layer);
      drop(bytes);
      if (input_grad) saved.push_back(w);
      else drop(w);
      continue;
    }
    const int64_t in = t.numel / std::max<int64_t>(t.rows, 1);
    const bool reads_norm = qkv || mod == "gate_proj" || mod == "up_proj";
    const int64_t in_bytes = reads_norm ? dims_.e_res : dims_.e;
    uint32_t x16 = UINT32_MAX;
    if (in_bytes != 2 || !recipe_.fp16) {  // x.half(): a new fp16 copy, saved by the Function when it records a graph
      x16 = act(mul(2, dims_.T, in), int4_label(int4_labels_.input, "fp16 copy of an AWQ linear's input (x.half(), saved)"), layer);
      if (input_grad) saved.push_back(x16), x16 = UINT32_MAX;
    }
    if (mul(dims_.b, dims_.s) >= 1024) drop(tmp(mul(2, t.numel), labels_.dequant, layer));
    drop_if(x16);  // not saved: it goes after the matmul
  }
}

// The backward of those linears, for the largest of the half: GPTQ's saved weight serves grad_x = grad @ W^T with
// nothing new. AWQ's WQLinearMMFunction.backward dequantizes again (fp16 [in, out]; from 0.2.1 `.to(grad dtype)`,
// a copy under bf16) and multiplies by `weights.transpose(0, 1).unsqueeze(0).repeat(batch_size, 1, 1)`, a copy of
// the weight per row of the batch (AutoAWQ PR #338). Returns the transient, alive beside the half's gradients, or
// UINT32_MAX.
uint32_t StepBuilder::int4_backward(int32_t layer, const char* prefix) {
  if (cfg_.peft.quantization() != BaseQuantization::Awq) return UINT32_MAX;
  int64_t largest = 0;
  for (const auto& t : shape_.params_of(layer))
    if (t.quantized && t.name.rfind(prefix, 0) == 0) largest = std::max(largest, t.numel);
  if (largest == 0) return UINT32_MAX;
  // The dequantized fp16 weight and its repeat per row, and the cast to the gradient's dtype where that is not fp16.
  const int64_t bytes = add(mul(2, largest, add(1, dims_.b)), recipe_.fp16 ? 0 : mul(dims_.e, largest));
  return tmp(bytes, int4_label(int4_labels_.backward, "AWQ weight dequantized and repeated per row (backward)"), layer);
}

// q_norm / k_norm on the projection outputs (Qwen3RMSNorm and Gemma3's per head, OLMo 2's over the whole width;
// modeling_qwen3.py Qwen3Attention.forward): the same RMSNorm as norm_forward's, at the projection's width, with
// one rstd per head (or per token). Returns the normalised output, which RoPE (or attention) consumes. Under
// autocast the fp32 weight times the 16-bit normed tensor promotes the output to fp32.
uint32_t StepBuilder::qk_norm_forward(int32_t layer, uint32_t x, int64_t width, int64_t heads, const char* name,
                                      std::vector<uint32_t>& saved, bool out_saved) {
  const int64_t e = dims_.e, T = dims_.T;
  const int64_t rstd = mul(4, T, cfg_.model.qk_norm_per_head ? heads : 1);
  bool trainable = false;
  for (const auto& t : shape_.params_of(layer))
    if (t.kind == ParamKind::Norm && has_grad(t) && t.name.find(name) != std::string::npos) trainable = true;
  if (norm_impl(layer) == NormImpl::Fused) {
    saved.push_back(x);  // fused kernels (and compiled layers) save their input and rstd
    saved.push_back(act(rstd, labels_.norm_rstd, layer));
  } else {
    // x.to(fp32) is saved by pow and by x32 * rstd; in fp32 it is x itself.
    if (e == 4) saved.push_back(x);
    else saved.push_back(act(mul(4, T, width), labels_.norm_x32, layer)), drop(x);
    saved.push_back(act(rstd, labels_.norm_rstd, layer));
    // weight * normed saves normed (cast back to the input dtype, or kept in fp32) for the weight's gradient.
    const int64_t scaled = norm_impl(layer) == NormImpl::Fp32Scale ? 4 : e;
    if (trainable && scaled == 4) {
      saved.push_back(act(mul(4, T, width), labels_.norm_scaled, layer));  // x32 * rstd itself
    } else {
      uint32_t n32 = tmp(mul(4, T, width), labels_.attn_tmp, layer);
      if (trainable) saved.push_back(act(mul(scaled, T, width), labels_.norm_scaled, layer));
      drop(n32);
    }
  }
  const int64_t out = mul(rms_out_bytes(), T, width);
  return out_saved ? act(out, labels_.norm_out, layer) : tmp(out, labels_.norm_out, layer);
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
  return cfg_.training.compile && layer >= 0 && layer < shape_.num_layers ? NormImpl::Fused : resolved_.norm;
}

// Outside autocast a norm's output is the compute dtype (memsim's rule for every recipe). Under autocast an RMSNorm
// returns weight * normed in the dtype they promote to (HF LlamaRMSNorm: self.weight * hidden_states.to(input_dtype)):
// fp32 where the weight is fp32 (amp_* recipes, or prepare_model_for_kbit_training's cast of the norm weights, peft
// utils/other.py), the 16-bit dtype over 16-bit weights (bf16_autocast: transformers' Trainer with bf16=True over a
// model loaded with torch_dtype=bfloat16). layer_norm is on autocast's fp32 list (aten/src/ATen/autocast_mode.cpp
// KERNEL_CUDA(layer_norm, fp32)): fp32 out whatever its weights.
int64_t StepBuilder::rms_out_bytes() const {
  if (!dims_.amp) return dims_.e;
  return amp_fp32_weights() || resolved_.kbit_cast ? 4 : dims_.e;
}

int64_t StepBuilder::norm_out_bytes() const {
  if (dims_.amp && cfg_.model.norm_type == NormType::LayerNorm) return 4;
  return rms_out_bytes();
}

void StepBuilder::norm_backward(int32_t layer, uint32_t& dres) {
  // The gathered input's gradient is whole-sequence (in the gathered output's dtype) until the all-gather's
  // backward reduce-scatters it into this rank's tokens, which the norm's backward then reads.
  uint32_t scattered = UINT32_MAX;
  if (gathered_inputs()) {
    const int64_t eb = norm_out_bytes();
    const uint32_t whole = tmp(mul(eb, dims_.T, dims_.h), labels_.dres, layer);
    scattered = tmp(mul(eb, dims_.Tn, dims_.h), labels_.dres, layer);
    drop(whole);
  }
  // HF eager RMSNorm backward holds about three fp32 [b, s, h] temporaries (pow/mean/mul backward and the
  // cast back); a fused or native LayerNorm kernel about one.
  const bool eager = cfg_.model.norm_type == NormType::RMSNorm && norm_impl(layer) != NormImpl::Fused;
  uint32_t t = tmp(mul(eager ? 12 : 4, dims_.Tn, dims_.h), labels_.bwd_norm, layer);
  uint32_t nd = tmp(mul(dims_.e_res, dims_.Tn, dims_.h), labels_.dres, layer);
  drop(dres);
  dres = nd;
  drop(t);
  drop_if(scattered);
}

// A linear's saved input: the 16-bit tensor itself, or under Transformer Engine's fp8 its 1-byte cast
// (linear.py saved_inputmat / saved_inputmat_t), the 16-bit one going once the matmul is done.
uint32_t StepBuilder::fp8_input(uint32_t t, int64_t elements, int32_t layer) {
  if (!recipe_.fp8_saved_inputs) return t;
  uint32_t q = act(elements, labels_.fp8_input, layer);
  drop(t);
  return q;
}

// torchao float8 casts each linear's weight to fp8 for the matmul and drops it after: one layer's largest weight
// at a time, forward and backward.
void StepBuilder::fp8_cast(int32_t layer) {
  if (!recipe_.fp8_transient_casts) return;
  int64_t largest = 0;
  for (const auto& t : shape_.params_of(layer))
    if (t.kind == ParamKind::Matmul && !t.quantized) largest = std::max(largest, t.numel);
  if (largest > 0) drop(tmp(largest, labels_.fp8_cast, layer));
}

void StepBuilder::attention_probs(int32_t layer, int64_t s2, const SoftmaxFlow& flow, bool keep,
                                  std::vector<uint32_t>& saved, uint32_t from) {
  const int64_t e = dims_.e;
  auto alloc = [&](int64_t bytes, uint32_t label) {
    const uint32_t t = keep ? act(bytes, label, layer) : tmp(bytes, label, layer);
    saved.push_back(t);
    return t;
  };
  // torch <= 1.10's _softmax kept its input for backward too (training.softmax_saves_input, resolved): the fp32
  // conversion, or the scores themselves when they are its input.
  const bool keep_input = keep && resolved_.softmax_saves_input;
  const bool convert = flow.convert;
  const uint32_t scores = softmax_input(mul(flow.input_bytes, s2), labels_.scores, layer, keep_input && !convert);
  if (from != UINT32_MAX) drop(from);
  const uint32_t conv = convert ? softmax_input(mul(4, s2), labels_.attn_tmp, layer, keep_input) : UINT32_MAX;
  alloc(mul(flow.output_bytes, s2), labels_.softmax);  // _softmax saves its output
  if (keep_input) {
    saved.push_back(conv != UINT32_MAX ? conv : scores);
    if (conv != UINT32_MAX) drop(scores);
  } else {
    if (conv != UINT32_MAX) drop(conv);
    drop(scores);
  }
  // The cast back to the compute dtype for attn @ v (none where softmax wrote that dtype: the matmul reads its
  // output itself). With attention dropout after the cast, the cast is the dropout's input, gone once its output
  // exists: the matmul saves that output instead. Dropout before the cast (BERT) reads the softmax output, and the
  // cast of its output is what the matmul saves.
  const bool dropout = flow.dropout;
  const bool cast_needed = flow.output_bytes > e;
  if (dropout && flow.dropout_before_cast) {
    alloc(s2, labels_.attn_mask);
    const int64_t bytes = mul(flow.output_bytes, s2);
    const uint32_t out = cast_needed ? tmp(bytes, labels_.probs, layer) : alloc(bytes, labels_.probs);
    if (cast_needed) alloc(mul(e, s2), labels_.probs), drop(out);
    return;
  }
  uint32_t cast = UINT32_MAX;
  if (cast_needed) cast = dropout ? tmp(mul(e, s2), labels_.probs, layer) : alloc(mul(e, s2), labels_.probs);
  if (dropout) {
    alloc(s2, labels_.attn_mask);
    alloc(mul(e, s2), labels_.probs);
    if (cast != UINT32_MAX) drop(cast);
  }
}

uint32_t StepBuilder::layer_forward(int32_t layer, uint32_t res, SavedLayer& saved, bool keep_s2, bool free_input) {
  const auto& m = cfg_.model;
  const int64_t e = dims_.e;
  fp8_cast(layer);
  const bool gqa = dims_.g < dims_.a;
  // Autocast's cached low-precision weights: saved by the matmuls until this layer's backward.
  autocast_casts(layer, !no_grad_);

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
  const bool int4 = cfg_.peft.packed_int4();
  const bool dequant_here = any_quantized_ && !int4 && !(unsloth() && resolved_.unsloth_weight_buffer);
  if (dequant_here) dequant(layer);
  if (int4) int4_forward(layer, "self_attn.", saved.attn);
  auto& A = saved.attn;
  if (mla) {
    mla_forward(layer, A);
  } else {
    const bool rope = m.position_embedding_type == PositionType::Rope;
    uint32_t q, k, v;
    const uint32_t qkv_pre = v2_pre_scale(layer, dims_.T, add(dims_.h_q, mul(2, dims_.h_kv)));  // adapter_v2's attn
    if (resolved_.fused_qkv && rope) {
      // One linear makes q, k and v (litgpt, Megatron): v is a view of its output, so whatever keeps v keeps the
      // whole [T, h_q + 2 h_kv] output; q and k are views that RoPE copies.
      v = act(mul(e, dims_.T, add(dims_.h_q, mul(2, dims_.h_kv))), labels_.v, layer);
      q = k = UINT32_MAX;  // views: nothing allocated until RoPE copies them
    } else {
      // Under a q/k norm the projection output is what the norm saves when it needs no fp32 copy of it.
      // Unsloth's Fast_RoPE_Embedding rotates q and k in place: the projections are what attention saves.
      const bool norm_keeps = (m.qk_norm && (e == 4 || norm_impl(layer) == NormImpl::Fused)) || unsloth();
      q = rope && !norm_keeps ? tmp(mul(e, dims_.T, dims_.h_q), labels_.q, layer) : act(mul(e, dims_.T, dims_.h_q), labels_.q, layer);
      k = rope && !norm_keeps ? tmp(mul(e, dims_.T, dims_.h_kv), labels_.k, layer) : act(mul(e, dims_.T, dims_.h_kv), labels_.k, layer);
      v = act(mul(e, dims_.T, dims_.h_kv), labels_.v, layer);
      if (m.qk_norm) {
        q = qk_norm_forward(layer, q, dims_.h_q, dims_.a, "self_attn.q_norm.", A, !rope);
        k = qk_norm_forward(layer, k, dims_.h_kv, dims_.g, "self_attn.k_norm.", A, !rope);
      }
    }
    A.push_back(v);
    v2_keep(qkv_pre, A);
    // q, k and v are projected: the norm's output has no reader left, unless the MLP reads it too (parallel).
    if (!parallel) no_grad_release(A, {no_grad_norm_out_});
    if (rope && !unsloth()) {
      // RoPE saves nothing sized (cos/sin need no grad); its outputs are what attention saves. Under autocast
      // over fp32 weights HF computes cos/sin in fp32, so the rotated q/k are fp32 transients and SDPA saves their
      // casts; a model loaded in 16 bits builds them in its dtype (cos.to(x.dtype)).
      uint32_t qt = UINT32_MAX, kt = UINT32_MAX;
      const bool fp32_rotary = amp_fp32_weights();
      if (fp32_rotary) qt = tmp(mul(4, dims_.T, dims_.h_q), labels_.q_rot, layer), kt = tmp(mul(4, dims_.T, dims_.h_kv), labels_.k_rot, layer);
      if (q != UINT32_MAX) drop(q);
      q = act(mul(e, dims_.T, dims_.h_q), labels_.q_rot, layer);
      if (k != UINT32_MAX) drop(k);
      k = act(mul(e, dims_.T, dims_.h_kv), labels_.k_rot, layer);
      if (fp32_rotary) drop(qt), drop(kt);
    }
    A.push_back(q);
    A.push_back(k);
    // PPO's policy forward with its KV cache (RolloutFlow::policy_kv_cache): the cache keeps the rotated keys and the
    // values, before any repeat for GQA, with the output past the backward.
    if (ppo() && resolved_.rollout.policy_kv_cache && !no_grad_ && !in_backward_) {
      if (k != UINT32_MAX) hold(k, ppo_outputs_);
      hold(v, ppo_outputs_);
    }
    if (prefix_tokens_ > 0) prefix_cat(layer, A, k, v);
    const int64_t kv_rows = prefix_tokens_ > 0 ? mul(dims_.b, kv_len()) : dims_.T;
    const bool repeat = kv_repeated();
    if (repeat) {
      const uint32_t kr = act(mul(e, kv_rows, dims_.h_q), labels_.kv_rep, layer);
      const uint32_t vr = act(mul(e, kv_rows, dims_.h_q), labels_.kv_rep, layer);
      A.push_back(kr), A.push_back(vr);
      erase(A, k), drop(k);
      erase(A, v), drop(v);
      k = kr, v = vr;  // what attention reads from here on
    }
    const int64_t s2 = mul(dims_.a, dims_.b, dims_.s, dims_.s);
    if (resolved_.attention == Attention::Eager) {
      // scores (compute dtype) -> softmax(dtype=fp32) saves its fp32 result -> cast for attn @ V (saved) ->
      // dropout saves a 1-byte mask and its output. transpose(1, 2).contiguous() copies the output for o_proj.
      std::vector<uint32_t> s2_tensors;
      // softmax(x, dtype=fp32) (ATen SoftMax.cpp softmax): a CUDA fp16 tensor goes to _softmax(x, half_to_float)
      // as it is; any other is converted to fp32 first. Under autocast the fp32 mask has already promoted the
      // scores, so the 4-byte tensor is their masked sum rather than a conversion. torch <= 1.10 kept _softmax's
      // input for backward too.
      const bool half_to_float = e == 2 && !(dims_.amp && dims_.e_res == 4) && recipe_.fp16;
      // transformers 4.38 indexes the layer's mask with cache_position (attention_mask[:, :, cache_position, :kv]),
      // a [b, 1, s, s] copy in the model dtype that the addition reads and nothing keeps.
      const uint32_t indexed = mask_.on && resolved_.mask.build == MaskBuild::MaxPositions
                                   ? tmp(mul(dims_.e_res, dims_.b, dims_.s, dims_.s), mask_labels_.copy, layer)
                                   : UINT32_MAX;
      attention_probs(layer, s2, {e, e < 4 && !half_to_float, 4, false, cfg_.model.attention_dropout > 0}, keep_s2, s2_tensors);
      if (indexed != UINT32_MAX) drop(indexed);
      uint32_t o_pre = tmp(mul(e, dims_.T, dims_.h_q), labels_.attn_tmp, layer);
      A.push_back(act(mul(e, dims_.T, dims_.h_q), labels_.attn_out, layer));
      drop(o_pre);
      no_grad_release(A, {q, k, v});
      // Selective recomputation (Megatron) recomputes the core attention instead of keeping these.
      if (keep_s2) A.insert(A.end(), s2_tensors.begin(), s2_tensors.end());
      else for (uint32_t t : s2_tensors) drop(t);
    } else {
      // SDPA in fp32 cannot use flash; with native GQA (enable_gqa) the efficient kernel refuses and SDPA falls
      // back to the math kernel, which saves the fp32 softmax (HF PR #46960).
      if (e == 4 && resolved_.attention == Attention::Sdpa && gqa && !repeat && keep_s2)
        A.push_back(act(mul(4, s2), labels_.softmax, layer));
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
        const int64_t kw = repeat ? dims_.h_q : dims_.h_kv;
        mask_kept.push_back(act(mul(e, dims_.T, dims_.h_q), mask_labels_.math_qk, layer));
        mask_kept.push_back(act(mul(e, dims_.T, kw), mask_labels_.math_qk, layer));
        const uint32_t scores = tmp(mul(e, s2), mask_labels_.math_scores, layer);
        mask_kept.push_back(act(mul(e, s2), mask_labels_.math_softmax, layer));
        drop(scores);
        if (m.attention_dropout > 0) {
          mask_kept.push_back(act(s2, labels_.attn_mask, layer));
          mask_kept.push_back(act(mul(e, s2), labels_.probs, layer));
        }
      }
      // Ring attention (context parallel), for the duration of the op: ring_kv_bytes' key/value buffers, and the
      // partial outputs merged in fp32 (_SDPAMerger with convert_to_f32: the fp32 output and about three
      // temporaries of its size for out - sigmoid(lse delta) * (out - block_out)).
      uint32_t ring = UINT32_MAX;
      if (cfg_.parallel.context_parallel_size > 1) {
        const int64_t kvw = repeat ? dims_.h_q : dims_.h_kv;
        ring = tmp(add(ring_kv_bytes(kvw), mul(4 * 4, dims_.T, dims_.h_q)), labels_.ring, layer);
      }
      A.push_back(act(mul(e, dims_.T, dims_.h_q), labels_.attn_out, layer));  // one storage for the kernel and o_proj
      for (uint32_t t : mask_gone) drop(t);
      if (keep) A.insert(A.end(), mask_kept.begin(), mask_kept.end());
      else for (uint32_t t : mask_kept) drop(t);
      no_grad_release(A, {q, k, v});
      // Selective recomputation checkpoints the core attention, so its logsumexp is recomputed, not kept
      // (Megatron transformer/attention.py _checkpointed_attention_forward). The efficient kernel pads the LSE to
      // 32; it runs in fp32 and wherever a mask keeps flash out. The math kernel keeps no LSE.
      const int64_t s_lse = e == 4 || mask_.on ? round_up(dims_.s, 32) : dims_.s;
      if (keep_s2 && !math) A.push_back(act(mul(4, dims_.a, dims_.b, s_lse), labels_.lse, layer));
      if (ring != UINT32_MAX) drop(ring);
    }
  }
  // litgpt's LLaMA-Adapter: the adaption prompt's attention, gated in; o_proj then reads the sum. In v1's first
  // adapted layer nothing before the gate needs a gradient (the input is the frozen layers' output, the norm and qkv
  // are frozen, and the prompt's keys and values are cached without one), so what the attention saved goes.
  // PEFT's adaption_prompt likewise: its first adapted layer's own attention has no gradient to pass, and only the
  // prompt's scores (after o_proj, adaption_prompt_attention) need one.
  const bool grad_from_gate = gate_only_layer(layer) && !no_grad_;
  const uint32_t adapter_sum = adapter_layer(layer) ? adapter_attention(layer, A, !grad_from_gate) : UINT32_MAX;
  std::vector<uint32_t> attention_gone;  // freed once o_proj has run
  bool input_after_residual = false;  // a LayerNorm's input: freed once the residual add has read it
  if (grad_from_gate) {
    std::vector<uint32_t> gate_only;
    for (uint32_t t : A) {
      if (t == res) input_after_residual = true;
      else (program_.tensors[t].label == adapter_label_ ? gate_only : attention_gone).push_back(t);
    }
    A.swap(gate_only);
  }
  // o_proj reads the attention output, which the kernel keeps already; adapters may add their own copies. It is
  // 16-bit under autocast (the kernel's output), as down_proj's input is (the product of two matmul outputs).
  // (litgpt's adapter: o_proj reads the gated sum, which a bitsandbytes linear then keeps, not the kernel's output.)
  if (cfg_.peft.enabled() && !no_grad_ &&
      linear_inputs(layer, {"o_proj"}, mla ? mul(dims_.a, m.v_head_dim) : dims_.h_q, A, dims_.T, true) && bnb_input_in_graph_) {
    if (adapter_sum != UINT32_MAX) program_.recategorize(adapter_sum, Component::Activations), hold_in_graph(adapter_sum);
    else
      for (auto it = A.rbegin(); it != A.rend(); ++it)
        if (program_.tensors[*it].label == labels_.attn_out) {
          hold_in_graph(*it);
          break;
        }
  }
  if (cfg_.peft.enabled() && ckpt_graph_) {
    if (adapter_sum != UINT32_MAX) checkpoint_graph_inputs(layer, {"o_proj"}, dims_.h_q, dims_.T, adapter_sum);
    else
      for (auto it = A.rbegin(); it != A.rend(); ++it)
        if (program_.tensors[*it].label == labels_.attn_out) {
          checkpoint_graph_inputs(layer, {"o_proj"}, mla ? mul(dims_.a, m.v_head_dim) : dims_.h_q, dims_.T, *it);
          break;
        }
  }
  // An fp8 o_proj saves its own fp8 copy of the attention output, which the kernel keeps in 16 bits.
  if (recipe_.fp8_saved_inputs) A.push_back(act(mul(dims_.T, mla ? mul(dims_.a, m.v_head_dim) : dims_.h_q), labels_.fp8_input, layer));
  // Row-parallel output: all-reduced (TP) or reduce-scattered to T / t tokens (sequence parallel).
  const uint32_t o_pre = v2_pre_scale(layer, dims_.Tn, dims_.h);
  uint32_t o = tmp(mul(e, dims_.Tn, dims_.h), labels_.o_out, layer);
  v2_keep(o_pre, A);
  drop_if(adapter_sum);
  for (uint32_t t : attention_gone) drop(t);
  if (peft_prompt_layer(layer)) o = adaption_prompt_attention(layer, A, o, !grad_from_gate);
  if (no_grad_) {  // o_proj has run: the attention half has no reader left but the shared norm's output
    const bool keep = parallel && erase(A, no_grad_norm_out_);
    no_grad_release_all(A);
    if (keep) A.push_back(no_grad_norm_out_);
  }
  if (m.hidden_dropout > 0) o = dropout(o, mul(dims_.Tn, dims_.h), e, false, labels_.o_out, layer, A);
  const bool retained_in = retained;
  uint32_t mid = UINT32_MAX;
  if (!parallel) {
    mid = act(mul(dims_.e_res, dims_.Tn, dims_.h), labels_.residual, layer);
    drop(o);
    if (!retained && free_input) drop(res);
    if (input_after_residual) drop(res);
  }

  // ---- MLP half
  const bool moe = shape_.is_moe(layer);
  auto& M = saved.mlp;
  if (!parallel) {
    if (moe && m.shared_expert_intermediate_size > 0) norm_forward(layer, mid, retained, saved.mlp, {"gate", "gate_proj", "up_proj"}, true);
    else if (moe) norm_forward(layer, mid, retained, saved.mlp, {"gate"}, true);
    else if (m.mlp_gated) norm_forward(layer, mid, retained, saved.mlp, {"gate_proj", "up_proj"}, true);
    else norm_forward(layer, mid, retained, saved.mlp, {"up_proj"}, true);
  } else {
    if (!no_grad_) linear_inputs(layer, {"gate_proj", "up_proj"}, dims_.h, M, dims_.Tn);  // norm 1's output is kept already
  }
  if (dequant_here) dequant(layer);
  if (int4) int4_forward(layer, "mlp.", saved.mlp);
  const int64_t tf = mul(e, dims_.T, dims_.f);
  uint32_t prod_transient = UINT32_MAX;  // the down projection's input when a frozen weight does not keep it
  if (moe) {
    moe_forward(layer, M);
  } else if (m.mlp_gated && unsloth_lora_kernels()) {
    // LoRA_MLP: e = X W_gate, g = X W_up, h = swiglu_fg_kernel(e, g), then down; it saves X, e and g, and backward
    // rebuilds h in place (swiglu_DWf_DW_dfg_kernel), so h goes after the down projection.
    const uint32_t gate = act(tf, labels_.mlp_gate, layer);
    const uint32_t up = act(tf, labels_.mlp_up, layer);
    M.push_back(gate), M.push_back(up);
    no_grad_release(M, {no_grad_norm_out_});
    no_grad_release(A, {no_grad_norm_out_});
    prod_transient = tmp(tf, labels_.mlp_prod, layer);
    no_grad_release(M, {gate, up});
  } else if (m.mlp_gated) {
    const uint32_t gate_pre = v2_pre_scale(layer, dims_.T, dims_.f);
    const uint32_t gate = act(tf, labels_.mlp_gate, layer);  // saved by silu
    v2_keep(gate_pre, M);
    const uint32_t up_pre = v2_pre_scale(layer, dims_.T, dims_.f);
    const uint32_t up = act(tf, labels_.mlp_up, layer);      // saved by act * up
    v2_keep(up_pre, M);
    M.push_back(gate), M.push_back(up);
    no_grad_release(M, {no_grad_norm_out_});
    no_grad_release(A, {no_grad_norm_out_});  // parallel attention's shared norm output
    // A compiled layer recomputes silu(gate) in backward (a pointwise op on the saved gate: see norm_impl).
    const uint32_t a = act(tf, labels_.mlp_act, layer);      // saved by act * up
    M.push_back(a);
    no_grad_release(M, {gate});
    uint32_t prod = act(tf, labels_.mlp_prod, layer);
    no_grad_release(M, {up, a});
    if (cfg_.training.compile && !no_grad_) erase(M, a), drop(a);
    if (!no_grad_ && linear_inputs(layer, {"down_proj"}, dims_.f, M, dims_.T, true)) {
      M.push_back(fp8_input(prod, mul(dims_.T, dims_.f), layer));
      if (bnb_input_in_graph_) hold_in_graph(M.back());
    } else {
      checkpoint_graph_inputs(layer, {"down_proj"}, dims_.f, dims_.T, prod);
      prod_transient = prod;
    }
  } else {
    const uint32_t fc1_pre = v2_pre_scale(layer, dims_.T, dims_.f);
    const uint32_t fc1 = act(tf, labels_.mlp_fc1, layer);  // saved by gelu
    v2_keep(fc1_pre, M);
    M.push_back(fc1);
    no_grad_release(M, {no_grad_norm_out_});
    no_grad_release(A, {no_grad_norm_out_});  // parallel attention's shared norm output
    uint32_t g = act(tf, labels_.mlp_gelu, layer);
    no_grad_release(M, {fc1});
    // NewGELUActivation (gelu_new: GPT-2, Phi) computes through torch.pow, on autocast's fp32 list: its output is
    // fp32 there, and the down projection saves a cast of it.
    const bool gelu_fp32 = dims_.amp && m.activation() == HiddenAct::GeluNew;
    if (!no_grad_ && linear_inputs(layer, {"down_proj"}, dims_.f, M, dims_.T, !gelu_fp32)) {
      M.push_back(fp8_input(g, mul(dims_.T, dims_.f), layer));
      if (bnb_input_in_graph_) hold_in_graph(M.back());
    } else {
      checkpoint_graph_inputs(layer, {"down_proj"}, dims_.f, dims_.T, g);
      prod_transient = g;
    }
  }
  const uint32_t down_pre = v2_pre_scale(layer, dims_.Tn, dims_.h);
  uint32_t out = tmp(mul(e, dims_.Tn, dims_.h), labels_.mlp_out, layer);
  v2_keep(down_pre, M);
  if (prod_transient != UINT32_MAX) drop(prod_transient);
  if (m.hidden_dropout > 0) out = dropout(out, mul(dims_.Tn, dims_.h), e, false, labels_.mlp_out, layer, M);
  // The layer's output is saved by the next layer (or the next checkpoint) even when this forward is no_grad's.
  uint32_t next = program_.alloc(Component::Activations, mul(dims_.e_res, dims_.Tn, dims_.h), labels_.residual, layer);
  drop(out);
  if (no_grad_) no_grad_release_all(A), no_grad_release_all(M);
  if (parallel) {
    drop(o);
    if (!retained_in && free_input) drop(res);
    if (input_after_residual) drop(res);
  } else if (!retained) {
    drop(mid);
  }
  return next;
}

// torch.utils.checkpoint: the layer runs under no_grad and keeps only its input; its intermediates exist one at
// a time. The largest moment is the MLP (gate, up and their product) or, in eager attention, the softmax.
uint32_t StepBuilder::layer_forward_checkpointed(int32_t layer, uint32_t res, SavedLayer& saved) {
  saved.attn.push_back(res);
  if (!casts_[layer].live()) {  // the cached ones go when the forward's autocast region exits
    autocast_casts(layer, false);
    if (casts_[layer].live()) ckpt_casts_.push_back(static_cast<uint32_t>(layer));
  }
  if (cfg_.model.post_layernorm || cfg_.model.kv_lora_rank > 0) {
    // Post-LN and MLA layers: their largest moment only (gate, up and their product; in eager attention
    // the softmax), not yet op by op.
    int64_t peak = mul(3, dims_.e, dims_.T, dims_.f);
    if (resolved_.attention == Attention::Eager) peak = std::max(peak, mul(4 + dims_.e, dims_.a, dims_.b, mul(dims_.s, dims_.s)));
    uint32_t t = tmp(peak, labels_.ckpt_tmp, layer);
    uint32_t next = act(mul(dims_.e_res, dims_.Tn, dims_.h), labels_.residual, layer);
    drop(t);
    return next;
  }
  // The same ops as a saving forward, each result freed once its last reader has run (the caching allocator
  // sees every one of them: the no_grad forward of one decoder layer in a recorded H200 trace,
  // tests/validation/measured/h200-2026-11-30/traces, allocates and frees its norms, q/k/v, RoPE, attention and
  // MLP tensors one by one). keep_s2 = false: eager attention's softmax is not kept either.
  no_grad_ = true;
  ckpt_graph_ = !resolved_.checkpoint_reentrant;
  SavedLayer scratch;
  const uint32_t next = layer_forward(layer, res, scratch, false, false);
  no_grad_ = false;
  ckpt_graph_ = false;
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
  const auto& m = cfg_.model;
  const int64_t e = dims_.e;
  saved.attn.push_back(res);
  if (!casts_[layer].live()) {  // the cached ones go when the forward's autocast region exits
    autocast_casts(layer, false);
    if (casts_[layer].live()) ckpt_casts_.push_back(static_cast<uint32_t>(layer));
  }
  auto& A = saved.attn;
  if (resolved_.fused_qkv) {
    A.push_back(act(mul(e, dims_.T, add(dims_.h_q, mul(2, dims_.h_kv))), labels_.v, layer));  // one mm: its output is saved
  } else {
    A.push_back(act(mul(e, dims_.T, dims_.h_q), labels_.q, layer));   // mm 1 (wq)
    A.push_back(act(mul(e, dims_.T, dims_.h_kv), labels_.v, layer));  // mm 3 (wv)
  }
  A.push_back(act(mul(e, dims_.T, dims_.h_q), labels_.attn_out, layer));
  A.push_back(act(mul(4, dims_.a, dims_.b, dims_.s), labels_.lse, layer));
  // The block's other intermediates exist one at a time, as in a checkpointed forward.
  uint32_t t = tmp(mul(3, e, dims_.T, dims_.f), labels_.ckpt_tmp, layer);
  if (!shape_.is_moe(layer)) A.push_back(act(mul(e, dims_.T, dims_.f), m.mlp_gated ? labels_.mlp_gate : labels_.mlp_fc1, layer));  // mm 5 (w1)
  if (m.mlp_gated && !shape_.is_moe(layer)) A.push_back(act(mul(e, dims_.T, dims_.h), labels_.mlp_out, layer));  // mm 7 (w2)
  drop(t);
  return act(mul(dims_.e_res, dims_.Tn, dims_.h), labels_.residual, layer);
}

void StepBuilder::layer_backward(int32_t layer, uint32_t& dres, SavedLayer& saved) {
  alloc_layer_grads(layer);
  fp8_cast(layer);
  const int64_t e = dims_.e;
  // MLP: grad(prod), grad(act) and grad(up) alive together, then the saved set of the half goes. In an MoE
  // layer the experts run one after another (one expert's share of the tokens) beside the full-size gradient
  // of the gathered output, and shared experts like a dense MLP.
  int64_t mlp_t = mul(3, e, dims_.T, dims_.f);
  if (shape_.is_moe(layer)) {
    const auto& m = cfg_.model;
    const int64_t fe = m.expert_width();
    const int64_t per_expert = ceil_div(mul(m.num_experts_per_tok, dims_.T), m.num_experts);
    mlp_t = add(mul(3, e, per_expert, fe), mul(e, dims_.T, dims_.h));
    if (m.shared_expert_intermediate_size > 0)
      mlp_t = std::max(mlp_t, mul(3, e, dims_.T, m.shared_expert_intermediate_size));
  }
  // IA3 on a feedforward down_proj (ia3_inputs): the input's gradient comes back in the base dtype, is cast to the
  // vector's dtype, and the product's backward makes grad * vector and grad * saved input (summed for the vector's
  // gradient) beside it: three [tokens, f] tensors in the vector's dtype at once.
  if (cfg_.peft.kind() == PeftMethod::Ia3 && !shape_.is_moe(layer) && ia3_feedforward(cfg_.peft, "down_proj")) {
    const int64_t ab = any_quantized_ ? (dims_.amp ? dims_.e : 4) : adapter_bytes();
    if (ab != e) mlp_t = std::max(mlp_t, mul(3, ab, dims_.T, dims_.f));
  }
  // LoRA_MLP.backward: DW = dY W_down^T (a new [tokens, f]) takes h, df and de in place over DW, e and g; then dX.
  if (unsloth_lora_kernels() && cfg_.model.mlp_gated && !shape_.is_moe(layer)) mlp_t = add(mul(e, dims_.T, dims_.f), mul(e, dims_.T, dims_.h));
  // AdapterV2Linear's backward: grad * scale for the linear and grad * the saved output for the scale's gradient.
  const bool v2 = cfg_.peft.kind() == PeftMethod::AdapterV2;
  if (v2) mlp_t = add(mlp_t, mul(2, e, dims_.T, dims_.f));
  if (any_quantized_ && !cfg_.peft.packed_int4()) dequant(layer);
  const uint32_t mlp_int4 = int4_backward(layer, "mlp.");
  uint32_t t = tmp(mlp_t, labels_.bwd_mlp, layer);
  drop_if(mlp_int4);
  for (auto it = saved.mlp.rbegin(); it != saved.mlp.rend(); ++it) drop(*it);
  saved.mlp.clear();
  drop(t);
  norm_backward(layer, dres);
  // Attention: dO, dq, dk, dv and flash's fp32 dq accumulator; native GQA also expands dk/dv to all heads
  // (flash-attention mha_bwd: dq_accum, dk_expanded). Eager: gradients of the probabilities and the softmax.
  int64_t at = 0;
  const bool repeat = kv_repeated();
  const bool mla = cfg_.model.kv_lora_rank > 0;  // q and k at nope + rope width per head
  const int64_t hq = mla ? mul(dims_.a, add(cfg_.model.qk_nope_head_dim, cfg_.model.qk_rope_head_dim)) : dims_.h_q;
  const int64_t kvw = mla ? hq : repeat ? dims_.h_q : dims_.h_kv;
  if (resolved_.attention == Attention::Eager) {
    at = add(mul(10, dims_.a, dims_.b, mul(dims_.s, dims_.s)), mul(4, e, dims_.T, dims_.h_q));
  } else if (math_kernel() && !mla) {
    // The math kernel's autograd graph: the gradient of the softmax output and of the scores ([b, h, s, s] in the
    // input dtype) beside dO, dq, dk and dv; no fp32 accumulator.
    at = add(add(mul(2, e, dims_.T, hq), mul(2, e, dims_.T, kvw)), mul(2, e, dims_.a, dims_.b, mul(dims_.s, dims_.s)));
  } else {
    at = add(add(mul(2, e, dims_.T, hq), mul(2, e, dims_.T, kvw)), mul(4, dims_.T, hq));
    // Prefix tuning: dk and dv over the prefix's keys too, and the prefix's share kept for get_prompt's backward.
    if (prefix_tokens_ > 0) {
      at = add(at, mul(2, e, mul(dims_.b, prefix_tokens_), kvw));
      prefix_grads_.push_back(act(mul(e, mul(dims_.b, prefix_tokens_), mul(2, dims_.h_kv)), labels_.bwd_attn, layer));
    }
    if (dims_.g < dims_.a && !repeat && !mla) at = add(at, mul(2, e, dims_.T, dims_.h_q));
    // Ring attention backward (_attention.py _templated_ring_attention_backward) accumulates dq, dk and dv in
    // fp32 (zeros_like(..., dtype=fp32)), gathers or rotates the key/value chunks again (ring_kv_bytes), and
    // rotates the partial dk/dv in fp32 all-to-all (next_grad_kv = cat(dk, dv) and its permuted copy).
    if (cfg_.parallel.context_parallel_size > 1)
      at = add(at, add(add(mul(4, dims_.T, add(hq, mul(2, kvw))), ring_kv_bytes(kvw)), mul(2 * 2 * 4, dims_.T, kvw)));
  }
  // The adaption prompt's call: the gate's product gives ay's gradient, whose kernel backward makes a second dq.
  if (adapter_layer(layer)) at = add(at, mul(2, e, dims_.T, dims_.h_q));
  // PEFT's: the gradients of the gated scores, the fp32 softmax and the scores ([heads, T, adapter_len]), then dq.
  if (peft_prompt_layer(layer))
    at = add(at, add(mul(2, e, dims_.T, dims_.h_q), mul(4 + 2 * e, dims_.a, dims_.b, mul(dims_.s, cfg_.peft.adapter_prompt_length))));
  if (v2) at = add(at, mul(2, e, dims_.T, add(dims_.h_q, mul(2, dims_.h_kv))));
  const uint32_t attn_int4 = int4_backward(layer, "self_attn.");
  t = tmp(at, labels_.bwd_attn, layer);
  drop_if(attn_int4);
  for (auto it = saved.attn.rbegin(); it != saved.attn.rend(); ++it) drop(*it);
  saved.attn.clear();
  drop(t);
  norm_backward(layer, dres);
  drop_casts(casts_[layer]);
}

// Multi-head latent attention, HF DeepseekV3Attention: the low-rank q and kv paths each pass an RMSNorm (saved
// as any HF RMSNorm), q and k are rebuilt at the full head width (nope + rope) and saved by the kernel, v stays a
// view of kv_b_proj's output (so that whole output is kept), plus the output and logsumexp.
void StepBuilder::mla_forward(int32_t layer, std::vector<uint32_t>& A) {
  const auto& m = cfg_.model;
  const int64_t e = dims_.e, T = dims_.T, a = dims_.a;
  const int64_t qk = add(m.qk_nope_head_dim, m.qk_rope_head_dim);
  auto low_rank_norm = [&](int64_t r) {
    uint32_t x = tmp(mul(e, T, r), labels_.attn_tmp, layer);  // projection output, normalised next
    A.push_back(act(mul(4, T, r), labels_.norm_x32, layer));
    A.push_back(act(mul(4, T), labels_.norm_rstd, layer));
    A.push_back(act(mul(e, T, r), labels_.norm_scaled, layer));
    A.push_back(act(mul(e, T, r), labels_.norm_out, layer));  // saved by the up-projection
    drop(x);
  };
  if (m.q_lora_rank > 0) low_rank_norm(m.q_lora_rank);
  uint32_t q = tmp(mul(e, T, a, qk), labels_.q, layer);
  uint32_t kv_a = tmp(mul(e, T, add(m.kv_lora_rank, m.qk_rope_head_dim)), labels_.k, layer);
  low_rank_norm(m.kv_lora_rank);
  A.push_back(act(mul(e, T, a, add(m.qk_nope_head_dim, m.v_head_dim)), labels_.v, layer));  // kv_b_proj output (v is a view)
  A.push_back(act(mul(e, T, a, qk), labels_.q_rot, layer));  // cat(q_nope, rope(q_pe))
  A.push_back(act(mul(e, T, a, qk), labels_.k_rot, layer));  // cat(k_nope, rope(k_pe) expanded to every head)
  drop(q);
  drop(kv_a);
  A.push_back(act(mul(e, T, a, m.v_head_dim), labels_.attn_out, layer));
  A.push_back(act(mul(4, a, T), labels_.lse, layer));
}

// A mixture-of-experts MLP as HF runs it (MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock, DeepseekV3MoE): the
// router's fp32 softmax, then each expert gathers its tokens (hidden_states[top_x], a copy in the norm output's
// dtype), runs its MLP on them and scales its output by the routing weight, which saves that output. What the
// expert's linears keep is what a dense MLP's keep (linear_inputs, under the names "experts.gate_proj", ...): the
// gathered tokens and the product where the weights train or an adapter reads them unchanged, autocast's casts and
// LoRA's dropout copies and lora_A outputs, nothing for a frozen, unadapted expert. Dropless routing sends k x tokens
// through the experts; with a capacity factor c every expert holds c * k * tokens / E (padded, Megatron/GShard style).
void StepBuilder::moe_forward(int32_t layer, std::vector<uint32_t>& M) {
  const auto& m = cfg_.model;
  const int64_t e = dims_.e, T = dims_.T, E = m.num_experts, k = m.num_experts_per_tok;
  const int64_t fe = m.expert_width();
  if (no_grad_) return moe_forward_no_grad(layer);
  uint32_t logits = tmp(mul(e, T, E), labels_.attn_tmp, layer);
  M.push_back(act(mul(4, T, E), labels_.router, layer));        // softmax(dtype=fp32) saves its output
  M.push_back(act(mul(4 + 8, T, k), labels_.router, layer));    // top-k weights (fp32) and indices (int64)
  drop(logits);
  const int64_t n = m.moe_capacity_factor > 0
                        ? mul(E, static_cast<int64_t>(std::ceil(m.moe_capacity_factor * static_cast<double>(mul(k, T)) /
                                                                static_cast<double>(E))))
                        : mul(k, T);
  // Expert parallel: the permuted tokens go out in an all-to-all and arrive from the other ranks for this rank's
  // experts, k x tokens on average (Megatron token_dispatcher.py MoEAlltoAllTokenDispatcher: permute, then
  // all_to_all into a new tensor); the received tokens are the experts' input.
  uint32_t send = cfg_.parallel.expert_parallel_size > 1 ? tmp(mul(e, n, dims_.h), labels_.a2a, layer) : UINT32_MAX;
  const int64_t xb = norm_out_bytes();
  const uint32_t x = act(mul(xb, n, dims_.h), labels_.expert_in, layer);
  drop_if(send);
  const bool keep_x = m.mlp_gated ? linear_inputs(layer, {"experts.gate_proj", "experts.up_proj"}, dims_.h, M, n, xb < 4)
                                  : linear_inputs(layer, {"experts.up_proj"}, dims_.h, M, n, xb < 4);
  const bool x_in_graph = bnb_input_in_graph_;
  uint32_t prod = UINT32_MAX;
  if (m.mlp_gated) {
    for (uint32_t lbl : {labels_.mlp_gate, labels_.mlp_up, labels_.mlp_act}) M.push_back(act(mul(e, n, fe), lbl, layer));
    prod = act(mul(e, n, fe), labels_.mlp_prod, layer);
  } else {
    M.push_back(act(mul(e, n, fe), labels_.mlp_up, layer));  // saved by the activation
    prod = act(mul(e, n, fe), labels_.mlp_act, layer);
  }
  if (keep_x) {
    M.push_back(x);
    if (x_in_graph) hold_in_graph(x);
  } else {
    checkpoint_graph_inputs(layer, {"experts.gate_proj", "experts.up_proj"}, dims_.h, n, x);
    drop(x);
  }
  const bool keep_prod = linear_inputs(layer, {"experts.down_proj"}, fe, M, n, true);
  const bool prod_in_graph = bnb_input_in_graph_;
  M.push_back(act(mul(e, n, dims_.h), labels_.expert_out, layer));  // saved by the multiplication with the routing weight
  if (keep_prod) {
    M.push_back(prod);
    if (prod_in_graph) hold_in_graph(prod);
  } else {
    checkpoint_graph_inputs(layer, {"experts.down_proj"}, fe, n, prod);
    drop(prod);
  }
  if (cfg_.parallel.expert_parallel_size > 1) drop(tmp(mul(e, n, dims_.h), labels_.a2a, layer));  // combine all-to-all
  if (m.shared_expert_intermediate_size > 0) {
    // The shared experts read the norm output, whose keeping norm_forward decided with the router.
    const int64_t ts = mul(e, T, m.shared_expert_intermediate_size);
    for (uint32_t lbl : {labels_.mlp_gate, labels_.mlp_up, labels_.mlp_act}) M.push_back(act(ts, lbl, layer));
    const uint32_t sp = act(ts, labels_.mlp_prod, layer);
    if (linear_inputs(layer, {"down_proj"}, m.shared_expert_intermediate_size, M, T, true)) {
      M.push_back(sp);
      if (bnb_input_in_graph_) hold_in_graph(sp);
    } else {
      checkpoint_graph_inputs(layer, {"down_proj"}, m.shared_expert_intermediate_size, T, sp);
      drop(sp);
    }
  }
}

// The same MoE block under a checkpoint's no_grad (HF MixtralSparseMoeBlock.forward): the router's logits, fp32
// softmax and top-k, the int64 one-hot expert mask (E x k x tokens), then one expert at a time: its gathered
// tokens, gate, silu, up and their product, the down projection scaled by the routing weight and added into the
// output (index_add_), each freed as the next op has read it. An expert sees k x tokens / E tokens on average.
void StepBuilder::moe_forward_no_grad(int32_t layer) {
  const auto& m = cfg_.model;
  const int64_t e = dims_.e, T = dims_.T, E = m.num_experts, k = m.num_experts_per_tok, h = dims_.h;
  const int64_t fe = m.expert_width();
  const int64_t ep = std::max<int64_t>(1, cfg_.parallel.expert_parallel_size);
  // Each of this rank's E / ep experts gets its share of the k x T token copies (all of them arrive under EP).
  const int64_t per = ceil_div(mul(k, T), std::max<int64_t>(1, E / ep));
  uint32_t logits = tmp(mul(e, T, E), labels_.attn_tmp, layer);
  uint32_t probs = tmp(mul(4, T, E), labels_.router, layer);
  uint32_t top = tmp(mul(4 + 8, T, k), labels_.router, layer);
  drop(logits), drop(probs);
  uint32_t mask = tmp(mul(8, E, k, T), labels_.router, layer);
  uint32_t acc = tmp(mul(e, T, h), labels_.expert_out, layer);  // final_hidden_states = zeros: the experts add into it
  if (ep > 1) drop(tmp(mul(e, k, T, h), labels_.a2a, layer));  // the dispatch all-to-all's send buffer
  auto mlp = [&](int64_t tokens, int64_t f) {
    uint32_t g = tmp(mul(e, tokens, f), labels_.mlp_gate, layer);
    uint32_t a = tmp(mul(e, tokens, f), labels_.mlp_act, layer);
    drop(g);
    uint32_t u = tmp(mul(e, tokens, f), labels_.mlp_up, layer);
    uint32_t p = tmp(mul(e, tokens, f), labels_.mlp_prod, layer);
    drop(a), drop(u);
    uint32_t o = tmp(mul(e, tokens, h), labels_.expert_out, layer);
    drop(p);
    return o;
  };
  uint32_t x = tmp(mul(norm_out_bytes(), per, h), labels_.expert_in, layer);
  uint32_t o = mlp(per, fe);
  drop(x);
  drop(tmp(mul(e, per, h), labels_.expert_out, layer));  // scaled by the routing weight, then index_add_ into the output
  drop(o);
  if (ep > 1) drop(tmp(mul(e, k, T, h), labels_.a2a, layer));  // the combine all-to-all
  drop(mask), drop(top);
  if (m.shared_expert_intermediate_size > 0) drop(mlp(T, m.shared_expert_intermediate_size));
  drop(acc);  // (it is the block's output, which the layer allocates next as the MLP output)
}

}  // namespace memsim
