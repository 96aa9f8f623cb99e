// A preference objective's step (training.objective dpo, orpo, simpo, kto; preference.h resolves the flow): the
// policy's log-probabilities over the whole vocabulary for 2 x micro_batch_size rows (chosen and rejected
// concatenated, one forward; KTO: micro_batch_size unpaired rows, after a no-grad forward of its KL batch), the chosen
// half's cross-entropy, the reference model's forward under no_grad on top of the policy's saved activations, and
// the backward of the log-probabilities down to the final norm. TRL's trainers run the policy first and the reference
// after it in every version (dpo_trainer.py get_batch_loss_metrics / _compute_loss; torchtune's
// recipes likewise), so the reference's logits meet the policy's saved graph; what else is alive then is the
// version's (PreferenceFlow). Sources: docs/research/preference.md.
#include "checked.h"
#include "step_builder.h"

namespace memsim {

void StepBuilder::preference_labels() {
  if (pref_labels_.ref_weights != UINT32_MAX) return;
  pref_labels_.ref_weights = program_.label("reference model weights (frozen copy)");
  pref_labels_.ref_logits = program_.label("reference logits (no grad)");
  pref_labels_.logps = program_.label("log-probabilities: the log-softmax of the logits (saved)");
  pref_labels_.nll = program_.label("chosen half's cross-entropy: log-softmax (saved)");
  pref_labels_.copy = program_.label("logits copy (slice made contiguous)");
  pref_labels_.ref_gathered = program_.label("reference layer's gathered parameters");
  pref_labels_.entropy = program_.label("entropy metric: a flattened copy of the logits");
  pref_labels_.row_tmp = program_.label("log-probabilities: one row's logsumexp temporary");
}

// The frozen copy (reference_model copy): every parameter of the base in the policy's storage dtype (TRL's
// create_reference_model deep-copies the policy; torchtune's full DPO loads a second model), sharded like the
// policy's parameters where the flow says so (ZeRO-3 prepare_deepspeed, FSDP from TRL 0.29). 0 without a copy.
int64_t reference_copy_bytes(const StepContext& ctx) {
  const PreferenceFlow p = resolve(ctx.config).preference;
  if (p.reference != ReferenceModel::Copy) return 0;
  return frozen_model_bytes(ctx, p.reference_sharded, false);
}

// A frozen second model of the policy's architecture on this device: every base parameter (lm_head left out for a
// classifier) in the policy's storage dtype, or its shard where the policy's parameters are sharded.
int64_t frozen_model_bytes(const StepContext& ctx, bool sharded, bool without_lm_head) {
  const ShardPlan sp = shard_plan(ctx);
  int64_t bytes = 0;
  for_each_param(ctx, [&](const ParamTensor& t) {
    if (t.kind == ParamKind::Adapter || (without_lm_head && t.name.rfind("lm_head", 0) == 0)) return;
    bytes = add(bytes, sharded ? param_states(sp, ctx, t).weights
                               : param_storage_bytes(t, ctx.precision, ctx.config.peft, sp.dtypes));
  });
  return bytes;
}

void StepBuilder::alloc_reference_weights() {
  const int64_t bytes = reference_copy_bytes(ctx_);
  if (bytes == 0) return;
  preference_labels();
  program_.alloc(Component::OtherModels, bytes, pref_labels_.ref_weights);
}

// The policy's head and loss: `saved` holds the final norm's saved tensors (loss_forward made them).
void StepBuilder::preference_loss_forward(std::vector<uint32_t>& saved) {
  preference_labels();
  const PreferenceFlow& p = resolved_.preference;
  const int32_t post = -1;
  const int64_t tv = mul(dims_.T, dims_.V), e = dims_.e;
  const int64_t el = p.logits_fp32 ? 4 : e;  // the logits the loss reads
  const int64_t row = mul(dims_.s, dims_.V);
  uint32_t hd = head_dequant();
  uint32_t lg16 = p.logits_fp32 && e < 4 ? tmp(mul(e, tv), labels_.logits, post) : UINT32_MAX;
  drop_if(hd);
  // Selective log-softmax of fp32 logits saves the logits themselves (gather and each row's logsumexp).
  const bool logits_saved = p.logps == Logps::Selective && el == 4 && !p.shift_copy_kept;
  uint32_t logits = logits_saved ? act(mul(el, tv), lg16 != UINT32_MAX ? labels_.logits_fp32 : labels_.logits, post)
                                 : tmp(mul(el, tv), lg16 != UINT32_MAX ? labels_.logits_fp32 : labels_.logits, post);
  drop_if(lg16);  // the compute-dtype logits: nothing saves them once upcast
  // TRL 0.29-1.5: shift_logits = logits[..., :-1, :].contiguous(), the tensor the log-probabilities read.
  uint32_t shift = UINT32_MAX;
  if (p.shift_copy_kept) {
    const bool shift_saved = p.logps == Logps::Selective && el == 4;
    shift = shift_saved ? act(mul(el, tv), pref_labels_.copy, post) : tmp(mul(el, tv), pref_labels_.copy, post);
  }
  switch (p.logps) {
    case Logps::FullLogSoftmax: {
      // TRL < 0.14: log_softmax of the slice logits[:, :-1] makes it contiguous first (SoftMax.cu host_softmax);
      // torchtune: log_softmax(logits / 1.0), the quotient an fp32 tensor of its own.
      uint32_t copy = p.slice_copy ? tmp(mul(el, tv), pref_labels_.copy, post)
                      : p.scaled_copy ? tmp(mul(4, tv), pref_labels_.copy, post) : UINT32_MAX;
      saved.push_back(act(mul(p.scaled_copy ? 4 : el, tv), pref_labels_.logps, post));
      drop_if(copy);
      break;
    }
    case Logps::Selective:
      // trl/trainer/utils.py selective_log_softmax: fp32 rows go through logsumexp ((row - max).exp_() one row at a
      // time); 16-bit rows each get a log_softmax, saved, one (sequence x vocabulary) block per row.
      if (el == 4) drop(tmp(mul(4, row), pref_labels_.row_tmp, post));
      else
        for (int64_t k = 0, blocks = std::min(dims_.b, kMaxLogpsRows); k < blocks; ++k)
          saved.push_back(act(mul(el, logps_rows(k, blocks, dims_.b), row), pref_labels_.logps, post));
      break;
  }
  // KTO 0.8-0.9: forward() takes the KL batch's log-probabilities after the batch's, the batch's graph alive.
  if (p.kl_logps_after_batch) logps_temporaries();
  // KTO 0.8-1.8: forward() (later _compute_loss) copies the logits' desirable and undesirable rows for its metrics,
  // kept to the end of the loss.
  if (p.label_copies == LabelCopies::BeforeReference) {
    kto_labels();
    pref_until_loss_.push_back(tmp(mul(el, tv), kto_labels_.label_copies, post));
  }
  // The chosen half's cross-entropy (ORPO, nll_alpha, TRL 0.9-0.11): logits[:B][..., :-1, :].contiguous(), then
  // cross_entropy saves its log-softmax of half the rows.
  if (p.nll) {
    uint32_t half = tmp(mul(el, tv / 2), pref_labels_.copy, post);
    saved.push_back(act(mul(el, tv / 2), pref_labels_.nll, post));
    drop(half);
  }
  // TRL 0.19-0.28 under accelerate's wrapper: an fp32 copy of every returned hidden state, held with the outputs.
  if (p.hidden_states_returned && p.outputs_to_fp32) {
    std::vector<uint32_t> copies;  // alive together until concatenated_forward returns
    for (int64_t l = 0; l <= shape_.num_layers; ++l) copies.push_back(tmp(mul(4, dims_.Tn, dims_.h), labels_.residual, post));
    if (p.logits_live_through_reference) pref_until_loss_.insert(pref_until_loss_.end(), copies.begin(), copies.end());
    else for (uint32_t t : copies) drop(t);
  }
  if (logits_saved) saved.push_back(logits);
  else if (p.logits_live_through_reference) pref_until_loss_.push_back(logits);
  else drop(logits);
  if (shift != UINT32_MAX) {
    if (p.logps == Logps::Selective && el == 4) saved.push_back(shift);
    else pref_until_loss_.push_back(shift);
  }
}

// One frozen forward under no_grad and its log-probabilities (the reference's; KTO's KL batch): every layer's
// tensors are temporaries, the log-probabilities' temporaries go once the small per-sequence log-probabilities exist.
// Returns the logits, for the caller to keep or drop before end_no_grad(pass). `gather_label`: each unit's
// all-gathered parameters (UINT32_MAX: none). `logps` false leaves the log-probabilities for later (KTO 0.8-0.9).
uint32_t StepBuilder::logps_pass(NoGradPass& pass, uint32_t gather_label, uint32_t logits_label, bool logps,
                                 bool own_engine) {
  const PreferenceFlow& p = resolved_.preference;
  const int32_t post = -1;
  const int64_t tv = mul(dims_.T, dims_.V), e = dims_.e;
  const int64_t el = p.logits_fp32 ? 4 : e;
  std::vector<uint32_t> hidden;  // output_hidden_states: each layer's input stays with the outputs
  std::vector<uint32_t> norm;
  pass = begin_no_grad(gather_label, own_engine);
  uint32_t g = no_grad_trunk(pass, p.hidden_states_returned ? &hidden : nullptr, norm, nullptr);
  uint32_t hd = head_dequant();
  uint32_t lg16 = el != e ? tmp(mul(e, tv), logits_label, post) : UINT32_MAX;
  drop_if(hd);
  for (uint32_t t : norm) drop(t);
  release_head_gathered(pass, g);
  uint32_t logits = tmp(mul(el, tv), logits_label, post);
  drop_if(lg16);
  if (p.hidden_states_returned && p.outputs_to_fp32)  // the wrapper's fp32 copies of the returned hidden states
    for (int64_t l = 0; l <= shape_.num_layers; ++l) hidden.push_back(tmp(mul(4, dims_.Tn, dims_.h), labels_.residual, post));
  if (logps) logps_temporaries();
  for (uint32_t t : hidden) drop(t);
  return logits;
}

// The temporaries of one no-grad pass's log-probabilities, gone once the per-sequence log-probabilities exist: the
// shift copy (TRL 0.29-1.5, KTO 1.6), the slice's contiguous copy or torchtune's quotient, the log-softmax, or one
// row's at a time (selective_log_softmax).
void StepBuilder::logps_temporaries() {
  const PreferenceFlow& p = resolved_.preference;
  const int32_t post = -1;
  const int64_t tv = mul(dims_.T, dims_.V);
  const int64_t el = p.logits_fp32 ? 4 : dims_.e;
  uint32_t shift = p.shift_copy_kept ? tmp(mul(el, tv), pref_labels_.copy, post) : UINT32_MAX;
  if (p.logps == Logps::FullLogSoftmax) {
    uint32_t copy = p.slice_copy ? tmp(mul(el, tv), pref_labels_.copy, post)
                    : p.scaled_copy ? tmp(mul(4, tv), pref_labels_.copy, post) : UINT32_MAX;
    uint32_t ls = tmp(mul(p.scaled_copy ? 4 : el, tv), pref_labels_.logps, post);
    drop_if(copy);
    drop(ls);
  } else {
    drop(tmp(mul(el, mul(dims_.s, dims_.V)), pref_labels_.logps, post));  // one row at a time
  }
  drop_if(shift);
}

// The reference's forward under no_grad, after the policy's (for KTO its KL batch's first). Then what the loss
// function held through it goes.
void StepBuilder::reference_forward(const std::string& phase) {
  const PreferenceFlow& p = resolved_.preference;
  drop_if(kl_logits_);  // KTO 0.8-0.16: forward() returned, and the policy's KL logits with it
  kl_logits_ = UINT32_MAX;
  const bool runs = p.reference == ReferenceModel::Copy || p.reference == ReferenceModel::AdapterDisabled;
  const int64_t el = p.logits_fp32 ? 4 : dims_.e;
  if (runs) {
    program_.phase(phase);
    // ZeRO-3 / FSDP all-gather each layer of a sharded reference (or of the policy, for adapter_disabled) for its
    // forward and free it after; a replicated copy has its weights already.
    const bool gathers = (p.reference != ReferenceModel::Copy || p.reference_sharded) && unshards_units();
    const uint32_t gather_label = gathers ? pref_labels_.ref_gathered : UINT32_MAX;
    const bool own_engine = reference_own_engine();
    uint32_t kl = UINT32_MAX;  // KTO: the reference's KL batch first; before 0.17 its logits live through the batch's
    if (p.kl_pass || p.reference_label_copies) kto_labels();
    if (p.kl_pass) {
      NoGradPass kp;
      kl = logps_pass(kp, gather_label, kto_labels_.kl_logits, !p.kl_logps_after_batch, own_engine);
      if (!p.kl_logits_held) drop(kl), kl = UINT32_MAX;
      end_no_grad(kp);
    }
    NoGradPass pass;
    uint32_t logits = logps_pass(pass, gather_label, pref_labels_.ref_logits, true, own_engine);
    if (p.kl_logps_after_batch) logps_temporaries();  // KTO 0.8-0.9: the KL batch's, after the batch's
    // KTO before 1.6: the reference's forward() also returns copies of the labelled rows, dropped with the tuple.
    if (p.reference_label_copies) drop(tmp(mul(el, mul(dims_.T, dims_.V)), kto_labels_.label_copies, -1));
    drop_if(kl);
    // torchtune's LoRA recipes never delete the reference's logits: they live to the micro-batch's backward. TRL
    // 0.29+ keeps ref_outputs to the end of _compute_loss.
    if (p.reference_logits_kept && resolved_.framework->torchtune_recipes) held_logits_ = logits;
    else if (p.reference_logits_kept) pref_until_loss_.push_back(logits);
    else drop(logits);
    end_no_grad(pass);
  }
  // The entropy metric's flattened copy of the policy's logits, after the loss (in the pass before it: a phase of its
  // own, two events wide, would take the timeline's label from the backward).
  if (p.entropy_copy) drop(tmp(mul(el, mul(dims_.T, dims_.V)), pref_labels_.entropy, -1));
  // KTO 1.9+: the labelled rows' copies of the (shifted) logits for the metrics, after the entropy.
  if (p.label_copies == LabelCopies::AfterReference) {
    kto_labels();
    drop(tmp(mul(el, mul(dims_.T, dims_.V)), kto_labels_.label_copies, -1));
  }
  for (uint32_t t : pref_until_loss_) drop(t);
  pref_until_loss_.clear();
}

void StepBuilder::kto_labels() {
  if (kto_labels_.kl_logits != UINT32_MAX) return;
  kto_labels_.kl_logits = program_.label("KL batch logits (no grad)");
  kto_labels_.kl_gathered = program_.label("KL batch forward: layer's gathered parameters");
  kto_labels_.label_copies = program_.label("logits copies of the desirable and undesirable rows (metrics)");
}

// KTO's KL batch through the policy under no_grad, before the batch's forward (KTOTrainer forward() before 0.17,
// _compute_kl_logps after): each prompt with another row's completion, micro_batch_size rows. ZeRO-3 / FSDP gather
// the policy's units as for any forward.
void StepBuilder::kl_forward() {
  preference_labels();
  kto_labels();
  const bool gathers = unshards_units();
  NoGradPass pass;
  uint32_t logits = logps_pass(pass, gathers ? kto_labels_.kl_gathered : UINT32_MAX, kto_labels_.kl_logits,
                               !resolved_.preference.kl_logps_after_batch);
  if (resolved_.preference.kl_logits_held) kl_logits_ = logits;
  else drop(logits);
  end_no_grad(pass);
}

// A frozen model's forward under no_grad (the reference's, generate's prefill, GRPO's scoring passes): an autocast
// region of its own, and whatever the embeddings keep goes at its end.
StepBuilder::NoGradPass StepBuilder::begin_no_grad(uint32_t gather_label, bool own_engine) {
  NoGradPass pass;
  pass.gather_label = gather_label;
  pass.own_engine = own_engine && gather_label != UINT32_MAX;
  pass.casts.assign(static_cast<size_t>(shape_.num_layers), LayerCasts{});
  casts_.swap(pass.casts);
  pass.embed_before = embed_saved_.size();
  no_grad_ = true;
  return pass;
}

void StepBuilder::end_no_grad(NoGradPass& pass) {
  for (size_t i = embed_saved_.size(); i > pass.embed_before; --i) drop(embed_saved_.back()), embed_saved_.pop_back();
  if (pass.own_engine) {
    release_head_gathered(pass, UINT32_MAX);  // where the caller has not already
    reference_ds_pass_done();
  }
  no_grad_ = false;
  no_grad_norm_out_ = UINT32_MAX;
  casts_.swap(pass.casts);
  for (LayerCasts& c : pass.casts) drop_casts(c);
}

// The embeddings, every layer (each one's tensors gone with it) and the final norm of a no-grad pass, each unit's
// parameters all-gathered around it where the pass gathers. `hidden` (output_hidden_states) keeps each layer's
// input; `after_layer` runs once a layer is done (generate's prefill keeps its keys and values). The final norm's
// tensors go to `norm`; returns the head's gathered parameters, for the caller to drop after its matmul.
uint32_t StepBuilder::no_grad_trunk(NoGradPass& pass, std::vector<uint32_t>* hidden, std::vector<uint32_t>& norm,
                                    const std::function<void(int64_t)>* after_layer) {
  const int32_t post = -1;
  uint32_t res = no_grad_layers(pass, hidden, after_layer);
  uint32_t g = UINT32_MAX;
  if (pass.own_engine) reference_ds_fetch(shape_.num_layers, pass.gather_label, pass.head_gathered);
  else g = no_grad_gathered(pass, shape_.num_layers);
  bool retained = false;
  norm_forward(post, res, retained, norm, {"lm_head"}, true);
  if (!retained) drop(res);
  return g;
}

// The head's parameters, once its matmul is done: `gathered` (one all-gathered unit) or the own engine's.
void StepBuilder::release_head_gathered(NoGradPass& pass, uint32_t gathered) {
  drop_if(gathered);
  for (uint32_t t : pass.head_gathered) drop(t);
  pass.head_gathered.clear();
}

// Whether the reference copy runs on its own DeepSpeed ZeRO-3 engine (TRL's prepare_deepspeed, ms-swift's
// RLHFTrainerMixin): a sharded copy under DeepSpeed rather than FSDP.
bool StepBuilder::reference_own_engine() const {
  const PreferenceFlow& p = resolved_.preference;
  return p.reference == ReferenceModel::Copy && p.reference_sharded && unshards_units() && !shard_plan_.fsdp;
}

// Unit l's all-gathered parameters for a no-grad pass that gathers (l = -1: the embeddings, num_layers: the head).
uint32_t StepBuilder::no_grad_gathered(const NoGradPass& pass, int64_t l) {
  return pass.gather_label != UINT32_MAX ? tmp(gathered_bytes(l), pass.gather_label, static_cast<int32_t>(l)) : UINT32_MAX;
}

// The embeddings and every layer of a no-grad pass; returns the last layer's output.
uint32_t StepBuilder::no_grad_layers(NoGradPass& pass, std::vector<uint32_t>* hidden,
                                     const std::function<void(int64_t)>* after_layer) {
  std::vector<uint32_t> g;
  auto gather = [&](int64_t l) {
    if (pass.own_engine) reference_ds_fetch(l, pass.gather_label, g);
    else if (const uint32_t unit = no_grad_gathered(pass, l); unit != UINT32_MAX) g.push_back(unit);
  };
  auto release = [&] {
    for (uint32_t t : g) drop(t);
    g.clear();
  };
  gather(-1);
  uint32_t res = embed_forward();
  release();
  mask_forward();
  for (int64_t l = 0; l < shape_.num_layers; ++l) {
    gather(l);
    SavedLayer scratch;
    if (hidden) hidden->push_back(res);
    res = forward_layer(static_cast<int32_t>(l), res, scratch, hidden == nullptr);
    for (uint32_t t : scratch.attn) drop(t);
    for (uint32_t t : scratch.mlp) drop(t);
    release();
    if (after_layer) (*after_layer)(l);
  }
  if (mask_.tensor != UINT32_MAX) drop(mask_.tensor);
  mask_ = {};
  return res;
}

// From the loss down to the final norm's output: the gradients of the log-probabilities (gather's zero-filled
// scatter, log_softmax's backward), of the chosen half's cross-entropy added in, the cast back from fp32, and the
// head's matmul.
uint32_t StepBuilder::preference_loss_backward(std::vector<uint32_t>& saved) {
  const PreferenceFlow& p = resolved_.preference;
  const int32_t post = -1;
  const int64_t tv = mul(dims_.T, dims_.V), e = dims_.e;
  const int64_t el = p.logits_fp32 ? 4 : e;
  uint32_t nll_grad = UINT32_MAX;
  if (p.nll) {  // nll_loss and log_softmax backward of the chosen half, then into zeros of the full logits
    uint32_t g1 = tmp(mul(el, tv / 2), labels_.loss_grad, post);
    uint32_t g2 = tmp(mul(el, tv / 2), labels_.loss_grad, post);
    drop(g1);
    release_saved(saved, pref_labels_.nll);
    nll_grad = tmp(mul(el, tv), labels_.loss_grad, post);
    drop(g2);
  }
  uint32_t grad = UINT32_MAX;
  if (p.logps == Logps::FullLogSoftmax) {
    const int64_t ls = p.scaled_copy ? 4 : el;
    uint32_t g1 = tmp(mul(ls, tv), labels_.loss_grad, post);  // gather_backward: zeros, scattered
    grad = tmp(mul(ls, tv), labels_.loss_grad, post);          // _log_softmax_backward_data
    drop(g1);
    release_saved(saved, pref_labels_.logps);
    if (p.slice_copy) {  // SliceBackward: zeros of the unsliced logits
      uint32_t g = tmp(mul(el, tv), labels_.loss_grad, post);
      drop(grad), grad = g;
    }
  } else if (el == 4) {
    // gather's zero-filled scatter and each row's logsumexp backward (grad * exp(x - lse)), summed into the logits'
    // gradient.
    uint32_t g1 = tmp(mul(4, tv), labels_.loss_grad, post);
    grad = tmp(mul(4, tv), labels_.loss_grad, post);
    drop(g1);
  } else {
    // Each row's gather and log_softmax backward make a row's gradient; the loop's unbind stacks them into one.
    std::vector<uint32_t> rows;
    const int64_t row = mul(dims_.s, dims_.V);
    const int64_t blocks = std::min(dims_.b, kMaxLogpsRows);
    for (int64_t k = blocks - 1; k >= 0; --k) {  // release_saved takes the latest: the blocks in reverse
      const int64_t n = logps_rows(k, blocks, dims_.b);
      uint32_t g1 = tmp(mul(el, n, row), labels_.loss_grad, post);
      rows.push_back(tmp(mul(el, n, row), labels_.loss_grad, post));
      drop(g1);
      release_saved(saved, pref_labels_.logps);
    }
    grad = tmp(mul(el, tv), labels_.loss_grad, post);
    for (uint32_t t : rows) drop(t);
  }
  drop_if(nll_grad);  // added into the gradient in place
  if (el == 4 && e < 4) {  // the upcast's backward: the gradient cast back for lm_head
    uint32_t g = tmp(mul(e, tv), labels_.loss_grad_bf16, post);
    drop(grad), grad = g;
  }
  alloc_layer_grads(shape_.num_layers);  // lm_head's matmul backward: its .grad, then the hidden state's gradient
  uint32_t dy;
  { uint32_t hd = head_dequant(); dy = tmp(mul(e, dims_.Tn, dims_.h), labels_.dres, post); drop_if(hd); }
  drop(grad);
  for (auto it = saved.rbegin(); it != saved.rend(); ++it) drop(*it);
  saved.clear();
  norm_backward(post, dy);
  return dy;
}

}  // namespace memsim
