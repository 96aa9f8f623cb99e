// The loss and the head: the logits and what each loss implementation keeps of them between its forward and its
// backward (LossImpl: HF's shifted fp32 copies, torchtune's chunked cross-entropy, Liger's and Cut Cross-Entropy's
// fused losses, Unsloth's own in unsloth.cpp), the classification heads, and the head's backward down to the final
// norm. Split from activations.cpp (code moved, not changed).
#include <algorithm>
#include <cmath>

#include "checked.h"
#include "step_builder.h"

namespace memsim {

namespace {

int64_t next_pow2(int64_t x) {
  int64_t p = 1;
  while (p < x) p *= 2;
  return p;
}

}  // namespace

void StepBuilder::loss_forward(uint32_t res, std::vector<uint32_t>& saved) {
  const int32_t post = -1;  // the head belongs to no layer (the timeline shows its tensors unnumbered)
  if (cfg_.model.head() == TaskHead::SequenceClassification) {
    // The pooler's dense reads hidden[:, 0], a view, so the whole last hidden state stays saved; the rest of the
    // head (tanh output, dropout mask, classifier input, logits) is batch x hidden at most.
    saved.push_back(res);
    const int64_t bh = mul(dims_.b, dims_.h);
    for (int i = 0; i < 3; ++i) saved.push_back(act(mul(dims_.e_res, bh), labels_.logits, post));
    saved.push_back(act(mul(4, dims_.b, cfg_.model.num_labels), labels_.lse_loss, post));
    return;
  }
  bool retained = false;
  if (!cfg_.model.post_layernorm) norm_forward(post, res, retained, saved, {"lm_head"}, true);
  else saved.push_back(res), retained = true;
  if (!retained) drop(res);
  // Autocast caches a low-precision copy of every fp32 leaf weight a matmul reads, lm_head's included
  // (autocast_mode.cpp cached_cast); the linear saves it for the input's gradient until the head's backward.
  // cached_cast caches only weights that require grad: a frozen head is cast again at every call, and litgpt
  // calls it on each 128-token chunk (model.py GPT.forward lm_head_chunk_size), each cast saved by its matmul.
  // The head is fp32 under the amp_* recipes and after prepare_model_for_kbit_training, unless TRL cast it back to
  // bf16 (peft_module_casting_to_bf16, model_load.h): a bf16 head is read as it is.
  // Liger's GRPO loss reads lm_head.weight itself, outside autocast (rollout_step.cpp grpo_liger_forward).
  if (dims_.amp && (recipe_.weight_bytes == 4 || resolved_.kbit_cast) && !shard_plan_.dtypes.trl_bf16.head && !liger_grpo()) {
    const bool per_chunk = resolved_.loss == LossImpl::ChunkedBf16 && !module_info("lm_head").trainable && !any_quantized_;
    const int64_t casts = per_chunk ? ceil_div(dims_.s, 128) : 1;
    const int64_t copy = recipe_.autocast_copy_bytes > 0 ? recipe_.autocast_copy_bytes : dims_.e;
    for (int64_t i = 0; i < casts; ++i) saved.push_back(tmp(mul(copy, dims_.V, dims_.h), labels_.cast, post));
  }
  if (preference()) return preference_loss_forward(saved);
  if (grpo()) return grpo_loss_forward(saved);
  const int64_t tv = mul(dims_.T, dims_.V);
  const int64_t e = dims_.e;
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
      const bool keep_input = resolved_.softmax_saves_input;
      uint32_t hd = head_dequant();
      uint32_t lg = resolved_.holds_logits ? act(mul(e, tv), labels_.logits, post)
                                     : softmax_input(mul(e, tv), labels_.logits, post, keep_input && e == 4);
      drop_if(hd);
      uint32_t up = e < 4 ? softmax_input(mul(4, tv), labels_.logits_fp32, post, keep_input) : UINT32_MAX;
      saved.push_back(act(mul(4, tv), labels_.lse_loss, post));
      if (up != UINT32_MAX) keep_input ? saved.push_back(up) : drop(up);
      sft_metrics(e);  // TRL's SFTTrainer, while its outputs hold the logits
      if (resolved_.holds_logits) held_logits_ = lg;  // freed when the loop lets go of the outputs
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
      uint32_t lg = tmp(mul(e, tv), labels_.logits, post);
      drop_if(hd);
      uint32_t up = UINT32_MAX;
      if (e < 4) up = tmp(mul(4, tv), labels_.logits_fp32, post), drop(lg), lg = up;
      // Vocabulary-parallel cross-entropy through DTensor (torchtitan's loss_parallel under TP,
      // torch/distributed/tensor/parallel/loss.py _log_softmax): shifted = x - max and exp(shifted) are
      // full-size fp32 tensors beside the input before the result exists.
      uint32_t shifted = UINT32_MAX, ex = UINT32_MAX;
      if (resolved_.loss_parallel) shifted = tmp(mul(4, tv), labels_.loss_grad, post), ex = tmp(mul(4, tv), labels_.loss_grad, post), drop(ex);
      saved.push_back(act(mul(4, tv), labels_.lse_loss, post));
      if (shifted != UINT32_MAX) drop(shifted);
      // Where the model's output is the fp32 upcast, the loop's outputs keep it (prime-rl: `del logits` leaves `out`
      // holding it).
      if (resolved_.framework->outputs_hold_fp32_logits) held_logits_ = lg;
      else drop(lg);
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
      const int64_t n = resolved_.loss_chunks;
      const bool compiled = cfg_.training.compile;
      uint32_t hd = head_dequant();  // once per chunk's matmul; the chunks' logits are one size
      uint32_t chunks = compiled ? act(mul(e, tv), labels_.logits, post) : tmp(mul(e, tv), labels_.logits, post);
      drop_if(hd);
      for (int64_t i = 0; i < n; ++i) {
        if (compiled) {
          saved.push_back(act(mul(4, ceil_div(dims_.T, n)), labels_.lse_loss, post));
          continue;
        }
        uint32_t up = tmp(mul(4, ceil_div(tv, n)), labels_.logits_fp32, post);
        saved.push_back(act(mul(4, ceil_div(tv, n)), labels_.lse_loss, post));
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
      // adapter_v2's lm_head is an AdapterV2Linear, called per 128-row chunk (lm_head_chunk_size): each chunk's
      // biased logits stay for the scale's gradient (v2_pre_scale), its linear output one chunk at a time.
      const uint32_t head_pre = v2_pre_scale(post, dims_.T, dims_.V, mul(dims_.b, 128));
      held_logits_ = act(mul(e, tv), labels_.logits, post);
      v2_keep(head_pre, saved);
      drop_if(hd);
      release_previous_outputs();  // model() has returned: `logits` lets go of the last micro-batch's
      uint32_t copy = dims_.b > 1 ? tmp(mul(e, tv), labels_.logits, post) : UINT32_MAX;
      saved.push_back(act(mul(e, tv), labels_.lse_loss, post));
      if (copy != UINT32_MAX) drop(copy);
      break;
    }
    case LossImpl::VocabChunked: {
      // prime-rl's FusedOutputLinear (src/prime_rl/trainer/models/layers/lm_head.py at d8f290ef0,
      // _ChunkedLogProbEntropyFn.forward), per 2,048-column slice of the vocabulary: the 16-bit logits and their fp32
      // copy, each bound to its name until the next slice rebinds it, and inside _online_logsumexp_and_weighted_update
      // the fp32 (chunk - max), its exp and exp * chunk. Saved: the hidden state (the final norm's output, counted
      // through the final norm's save for a trained lm_head; not counted for a frozen one), the weight, the labels
      // and an fp32 logsumexp per token; the log-probabilities and entropy are fp32 per token.
      const int64_t tc = mul(dims_.T, std::min<int64_t>(dims_.V, kVocabChunkColumns));
      uint32_t lg = UINT32_MAX, lf = UINT32_MAX;
      for (int k = 0; k < 2; ++k) {  // the second slice stands for every later one
        const uint32_t new_lg = tmp(mul(e, tc), labels_.logits, post);
        drop_if(lg), lg = new_lg;
        const uint32_t new_lf = tmp(mul(4, tc), labels_.logits_fp32, post);
        drop_if(lf), lf = new_lf;
        const uint32_t shifted = tmp(mul(4, tc), labels_.loss_grad, post);
        const uint32_t ex = tmp(mul(4, tc), labels_.loss_grad, post);
        drop(shifted);
        drop(tmp(mul(4, tc), labels_.loss_grad, post));  // chunk_exp * chunk_logits, summed
        drop(ex);
      }
      drop(lg), drop(lf);
      saved.push_back(act(mul(4, dims_.T), labels_.lse_loss, post));
      break;
    }
    case LossImpl::FusedLinear: {
      // Liger fused_linear_cross_entropy_forward: grad_input [T, h], grad_weight [V, h] and an fp32 loss per
      // token, all made in forward; logits exist one chunk at a time, chunk = next_pow2(ceil(T / ceil(V / h))).
      // grad_weight is `torch.zeros_like(weight) if weight.requires_grad else None`: none for a frozen head (PEFT).
      saved.push_back(act(mul(e, dims_.T, dims_.h), labels_.flce_buffers, post));
      if (head_grad_bytes() > 0) saved.push_back(act(mul(recipe_.weight_bytes, dims_.V, dims_.h), labels_.flce_buffers, post));
      saved.push_back(act(mul(4, dims_.T), labels_.flce_buffers, post));
      const int64_t chunk = std::min(dims_.T, next_pow2(ceil_div(dims_.T, ceil_div(dims_.V, dims_.h))));
      uint32_t lg = tmp(mul(e, chunk, dims_.V), labels_.logits, post);
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
  const int64_t tv = mul(dims_.T, dims_.V), e = dims_.e;
  const bool keep_input = resolved_.softmax_saves_input;
  const bool keep_output = resolved_.holds_logits;
  uint32_t hd = head_dequant();
  uint32_t out = UINT32_MAX;  // what the model's outputs hold
  uint32_t local = UINT32_MAX;  // the loss's own fp32 upcast (4.46-4.48)
  uint32_t shifted = UINT32_MAX, cast = UINT32_MAX;
  const bool fp32_loss = resolved_.loss != LossImpl::HfShift || e == 4;
  if (resolved_.loss == LossImpl::HfFp32Logits && e < 4) {
    uint32_t lg = tmp(mul(e, tv), labels_.logits, post);
    drop_if(hd);
    out = keep_output ? act(mul(4, tv), labels_.logits_fp32, post) : tmp(mul(4, tv), labels_.logits_fp32, post);
    drop(lg);
  } else {
    out = keep_output ? act(mul(e, tv), labels_.logits, post) : tmp(mul(e, tv), labels_.logits, post);
    drop_if(hd);
    if (resolved_.loss == LossImpl::HfShiftFp32 && e < 4) local = tmp(mul(4, tv), labels_.logits_fp32, post);
  }
  if (fp32_loss) {
    shifted = softmax_input(mul(4, tv), labels_.logits_shifted, post, keep_input);
  } else {
    shifted = softmax_input(mul(e, tv), labels_.logits_shifted, post, keep_input && !dims_.amp);
    if (dims_.amp) cast = softmax_input(mul(4, tv), labels_.logits_fp32, post, keep_input);
  }
  const int64_t ls = fp32_loss || dims_.amp ? 4 : e;  // log_softmax's dtype
  saved.push_back(act(mul(ls, tv), labels_.lse_loss, post));
  if (cast != UINT32_MAX) keep_input ? saved.push_back(cast) : drop(cast);
  if (keep_input && cast == UINT32_MAX) saved.push_back(shifted);
  else drop(shifted);
  if (local != UINT32_MAX) drop(local);
  sft_metrics(resolved_.loss == LossImpl::HfFp32Logits ? 4 : e);  // TRL's SFTTrainer, while its outputs hold the logits
  if (keep_output) held_logits_ = out;  // freed when the loop lets go of the outputs
  else drop(out);
}

uint32_t StepBuilder::hf_shifted_loss_backward(std::vector<uint32_t>& saved) {
  const int32_t post = -1;
  const int64_t tv = mul(dims_.T, dims_.V), e = dims_.e;
  const bool fp32_loss = resolved_.loss != LossImpl::HfShift || e == 4;
  const int64_t ls = fp32_loss || dims_.amp ? 4 : e;
  // nll_loss backward and log_softmax backward, in log_softmax's dtype.
  uint32_t g1 = tmp(mul(ls, tv), labels_.loss_grad, post);
  uint32_t g2 = tmp(mul(ls, tv), labels_.loss_grad, post);
  drop(g1);
  release_saved(saved, labels_.lse_loss);  // LogSoftmaxBackward has run
  if (resolved_.softmax_saves_input) release_saved(saved, labels_.softmax_in);
  // HfShift under autocast: the cast to fp32 goes back to the compute dtype before the slice.
  if (!fp32_loss && dims_.amp) {
    uint32_t g = tmp(mul(e, tv), labels_.loss_grad_bf16, post);
    drop(g2);
    g2 = g;
  }
  // slice_backward: zeros of the unshifted logits' shape, the gradient copied in.
  const int64_t sb = fp32_loss ? 4 : e;
  uint32_t full = tmp(mul(sb, tv), labels_.loss_grad, post);
  drop(g2);
  // .float() backward (4.31-4.48): the gradient cast back to the compute dtype for lm_head.
  if (sb == 4 && e < 4) {
    uint32_t g = tmp(mul(e, tv), labels_.loss_grad_bf16, post);
    drop(full);
    full = g;
  }
  alloc_layer_grads(shape_.num_layers);  // lm_head's matmul backward: its .grad, then the hidden state's gradient
  uint32_t dy;
  { uint32_t hd = head_dequant(); dy = tmp(mul(e, dims_.Tn, dims_.h), labels_.dres, post); drop_if(hd); }
  drop(full);
  return dy;
}

// The bytes of the output head's weight gradient, 0 when the head (or the embedding it is tied to) is frozen.
const ParamTensor* StepBuilder::head_weight() const {
  if (cfg_.model.tie_word_embeddings) return &shape_.pre.front();
  for (const auto& t : shape_.post)
    if (module_name(t.name) == "lm_head" && t.kind == ParamKind::Matmul) return &t;
  return nullptr;
}

int64_t StepBuilder::head_grad_bytes() const {
  const ParamTensor* t = head_weight();
  return t && has_grad(*t) ? grad_bytes_of(*t) : 0;
}

// Drops the newest saved tensor with this label: autograd frees a node's saved tensors once the node has run,
// before the engine moves on (torch/csrc/autograd/engine.cpp: fn.release_variables() after call_function).
void StepBuilder::release_saved(std::vector<uint32_t>& saved, uint32_t label) {
  for (auto it = saved.rbegin(); it != saved.rend(); ++it)
    if (program_.tensors[*it].label == label) {
      drop(*it);
      saved.erase(std::next(it).base());
      return;
    }
}

uint32_t StepBuilder::loss_backward(std::vector<uint32_t>& saved) {
  const int32_t post = -1;  // the head belongs to no layer (the timeline shows its tensors unnumbered)
  if (preference()) return preference_loss_backward(saved);
  if (grpo()) return grpo_loss_backward(saved);
  // The head's .grad appears when its matmul's backward runs, after the loss's nodes (allocator traces of the H200
  // calibration runs, tests/validation/measured/traces); the losses below that follow the traces create it there.
  const bool late_head_grad = (transformers_loss_path(resolved_.loss) || resolved_.loss == LossImpl::FullFp32 ||
                               resolved_.loss == LossImpl::VocabChunked ||
                               (resolved_.loss == LossImpl::ChunkedFp32 && !cfg_.training.compile)) &&
                              cfg_.model.head() != TaskHead::SequenceClassification;
  if (!late_head_grad) alloc_layer_grads(shape_.num_layers);
  if (cfg_.model.head() == TaskHead::SequenceClassification) {
    uint32_t dy = tmp(mul(dims_.e_res, dims_.T, dims_.h), labels_.dres, post);  // grad of the last hidden state (first token)
    for (auto it = saved.rbegin(); it != saved.rend(); ++it) drop(*it);
    saved.clear();
    return dy;
  }
  const int64_t tv = mul(dims_.T, dims_.V);
  const int64_t e = dims_.e;
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
      uint32_t g1 = tmp(mul(4, tv), labels_.loss_grad, post);
      if (resolved_.loss_parallel) {
        uint32_t ex = tmp(mul(4, tv), labels_.loss_grad, post);
        uint32_t sum = tmp(mul(4, tv), labels_.loss_grad, post);
        drop(ex);
        uint32_t prod = tmp(mul(4, tv), labels_.loss_grad, post);
        drop(sum);
        drop(g1);
        g1 = prod;
      }
      uint32_t g2 = tmp(mul(4, tv), labels_.loss_grad, post);
      drop(g1);
      release_saved(saved, labels_.lse_loss);  // LogSoftmaxBackward has run
      if (resolved_.softmax_saves_input) release_saved(saved, labels_.softmax_in);
      uint32_t g3 = e < 4 ? tmp(mul(e, tv), labels_.loss_grad_bf16, post) : UINT32_MAX;
      if (g3 != UINT32_MAX) drop(g2), g2 = g3;
      alloc_layer_grads(shape_.num_layers);  // lm_head's matmul backward: its .grad, then the hidden state's gradient
      { uint32_t hd = head_dequant(); dy = tmp(mul(e, dims_.Tn, dims_.h), labels_.dres, post); drop_if(hd); }
      drop(g2);
      break;
    }
    case LossImpl::HfShiftFp32:
    case LossImpl::HfFp32Logits:
    case LossImpl::HfShift:
      dy = hf_shifted_loss_backward(saved);
      break;
    case LossImpl::ChunkedFp32: {
      const int64_t n = resolved_.loss_chunks;
      if (cfg_.training.compile) {
        { uint32_t hd = head_dequant(); dy = tmp(mul(e, dims_.Tn, dims_.h), labels_.dres, post); drop_if(hd); }
        for (int64_t i = 0; i < n; ++i) drop(tmp(mul(e, ceil_div(tv, n)), labels_.loss_grad_bf16, post));
        break;
      }
      // The chunks' loss nodes were created after every chunk's matmul, so the engine runs them all first
      // (highest sequence number first): each chunk's logits gradient, cast back, waits for its matmul.
      const int64_t c = ceil_div(tv, n);
      std::vector<uint32_t> chunk_grads;
      for (int64_t i = 0; i < n; ++i) {
        uint32_t g1 = tmp(mul(4, c), labels_.loss_grad, post);
        uint32_t g2 = tmp(mul(4, c), labels_.loss_grad, post);
        drop(g1);
        release_saved(saved, labels_.lse_loss);
        if (e < 4) {
          chunk_grads.push_back(tmp(mul(e, c), labels_.loss_grad_bf16, post));
          drop(g2);
        } else {
          chunk_grads.push_back(g2);
        }
      }
      // Then one matmul backward per chunk. The engine sums the chunks' weight gradients in the head's input
      // buffer (input_buffer.cpp): the first is kept, the second added out of place, the rest in place. On the
      // first micro-batch the sum becomes the .grad; later ones add it into .grad and free it.
      const bool had_grad = grad_created_[static_cast<size_t>(shape_.num_layers + 1)];
      alloc_layer_grads(shape_.num_layers);
      { uint32_t hd = head_dequant(); dy = tmp(mul(e, dims_.Tn, dims_.h), labels_.dres, post); drop_if(hd); }
      const int64_t gw = head_grad_bytes();
      uint32_t buffer = UINT32_MAX;
      for (int64_t i = 0; i < n; ++i) {
        if (gw > 0 && (i > 0 || had_grad)) {
          uint32_t w = tmp(gw, labels_.loss_grad, post);
          if (buffer == UINT32_MAX && had_grad) buffer = w;
          else if (i == 1) drop(tmp(gw, labels_.loss_grad, post)), drop(w);  // old + new, then both go
          else drop(w);
        }
        drop(chunk_grads[static_cast<size_t>(n - 1 - i)]);
      }
      if (buffer != UINT32_MAX) drop(buffer);
      break;
    }
    case LossImpl::ChunkedBf16: {
      // chunk gradients are concatenated, then the slice backward writes them into zeros of the full shape
      uint32_t g = tmp(mul(e, tv), labels_.loss_grad, post);
      uint32_t z = tmp(mul(e, tv), labels_.loss_grad, post);
      drop(g);
      // adapter_v2's lm_head: the logits' gradient times the scale, for the linear's input gradient.
      if (cfg_.peft.kind() == PeftMethod::AdapterV2) drop(tmp(mul(e, tv), labels_.loss_grad, post));
      { uint32_t hd = head_dequant(); dy = tmp(mul(e, dims_.Tn, dims_.h), labels_.dres, post); drop_if(hd); }
      drop(z);
      break;
    }
    case LossImpl::FusedLinear:
      dy = tmp(mul(e, dims_.Tn, dims_.h), labels_.dres, post);  // grad_input scaled; grad_weight becomes lm_head's grad
      break;
    case LossImpl::VocabChunked: {
      // _ChunkedLogProbEntropyFn.backward: grad_hidden = zeros_like(hidden) and grad_weight = zeros_like(weight),
      // both in the compute dtype (the whole unsharded [V, H] under FSDP, whatever the head's requires_grad). Per
      // slice, each name rebound only as its new value exists: the 16-bit logits, their fp32 copy, p = exp(logits_f -
      // logz) (with its fp32 temporary), the fp32 grad_logits; then each matmul's 16-bit cast of grad_logits, the
      // [T, H] product added into grad_hidden, and grad_w_chunk [slice, H]. grad_weight becomes the head's gradient.
      const int64_t cols = std::min<int64_t>(dims_.V, kVocabChunkColumns), tc = mul(dims_.T, cols);
      dy = tmp(mul(e, dims_.Tn, dims_.h), labels_.dres, post);
      const uint32_t gw = tmp(mul(e, dims_.V, dims_.h), labels_.loss_grad, post);
      uint32_t lg = UINT32_MAX, lf = UINT32_MAX, p = UINT32_MAX, g = UINT32_MAX, gwc = UINT32_MAX;
      auto rebind = [&](uint32_t& name, uint32_t value) { drop_if(name), name = value; };
      for (int k = 0; k < 2; ++k) {
        rebind(lg, tmp(mul(e, tc), labels_.logits, post));
        rebind(lf, tmp(mul(4, tc), labels_.logits_fp32, post));
        const uint32_t shifted = tmp(mul(4, tc), labels_.loss_grad, post);
        const uint32_t new_p = tmp(mul(4, tc), labels_.loss_grad, post);
        drop(shifted);
        rebind(p, new_p);
        rebind(g, tmp(mul(4, tc), labels_.loss_grad, post));
        uint32_t cast = tmp(mul(e, tc), labels_.loss_grad_bf16, post);
        const uint32_t product = tmp(mul(e, dims_.T, dims_.h), labels_.loss_grad, post);
        drop(cast), drop(product);
        cast = tmp(mul(e, tc), labels_.loss_grad_bf16, post);
        const uint32_t new_gwc = tmp(mul(e, cols, dims_.h), labels_.loss_grad, post);
        drop(cast);
        rebind(gwc, new_gwc);
      }
      drop(lg), drop(lf), drop(p), drop(g), drop(gwc);
      release_saved(saved, labels_.lse_loss);
      drop(gw);  // returned: it becomes the head's gradient
      alloc_layer_grads(shape_.num_layers);
      break;
    }
  }
  // What remains saved (final norm, log-softmax, litgpt's logits) goes with the backward of the head.
  for (auto it = saved.rbegin(); it != saved.rend(); ++it) drop(*it);
  saved.clear();
  if (!cfg_.model.post_layernorm) norm_backward(post, dy);
  return dy;
}

}  // namespace memsim
