// Preference objectives: the flow of the logits and the reference model, by framework and version (preference.h).
// Sources: huggingface/trl trl/trainer/dpo_trainer.py at the tags named, pytorch/torchtune recipes/lora_dpo_*.py and
// full_dpo_distributed.py, accelerate's convert_outputs_to_fp32; the quotes are in docs/research/preference.md.
#include "preference.h"

#include "frameworks.h"

namespace memsim {

namespace {
constexpr Version V(int major, int minor, int patch = 0) { return {major, minor, patch}; }

// TRL's KTOTrainer (trl/trainer/kto_trainer.py v0.8-v0.26, trl/experimental/kto/ v0.27-v1.7, trl/trainer/ again
// from v1.8; quotes in docs/research/preference.md 1f and 5). Every version: unpaired rows (no concatenation), and
// with calculate_KL (loss_type "kto", the default) a no-grad forward of the KL batch before each model's forward of
// the batch; the policy first, then the reference on both batches under no_grad.
PreferenceFlow resolve_kto(PreferenceFlow p, const StackVersions& v, bool logits_fp32, bool outputs_to_fp32, bool deepspeed) {
  const Library trl = Library::Trl;
  p.paired = false;
  p.kl_pass = true;
  // get_batch_logps: gather(logits[:, :-1, :].log_softmax(-1)) before v0.15 (a contiguous copy of the slice first,
  // aten SoftMax.cu), selective_log_softmax from v0.15.
  const bool selective = v.at_least(trl, V(0, 15));
  p.logps = selective ? Logps::Selective : Logps::FullLogSoftmax;
  p.slice_copy = !selective;
  // v0.8-v0.16 forward(): `with torch.no_grad(): KL_logits = model(...).logits` is a local of the same function as the
  // batch's forward, so it lives until forward() returns; v0.17 moved it into _compute_kl_logps.
  p.kl_logits_held = v.below(trl, V(0, 17));
  // v0.8-v0.9 forward() took get_batch_logps(KL_logits) after the batch's; v0.10 moved it right after the KL forward.
  p.kl_logps_after_batch = v.below(trl, V(0, 10));
  // forward() returns `chosen_logits = completion_logits[chosen_idx, ...]` (advanced indexing, later index_select: copies),
  // kept to the end of get_batch_loss_metrics for its logits/chosen metric; the reference's own call of forward()
  // (v0.8-v1.5) makes them too and drops them with the tuple. v1.6 inlined the reference (_compute_loss) and keeps
  // `outputs` and `ref_outputs` as locals to its end; v1.6 made `.contiguous()` shift copies (gone in v1.7); v1.8
  // added entropy_from_logits(shift_logits.detach()); v1.9 takes the copies after the entropy, from shift_logits.
  p.label_copies = v.at_least(trl, V(1, 9)) ? LabelCopies::AfterReference : LabelCopies::BeforeReference;
  p.reference_label_copies = v.below(trl, V(1, 6));
  p.logits_live_through_reference = v.at_least(trl, V(1, 6));
  p.reference_logits_kept = p.logits_live_through_reference && p.reference != ReferenceModel::Precomputed;
  p.shift_copy_kept = v.at_least(trl, V(1, 6)) && v.below(trl, V(1, 7));
  p.entropy_copy = v.at_least(trl, V(1, 8));
  p.logits_fp32 = logits_fp32;
  p.outputs_to_fp32 = outputs_to_fp32;
  // The copy: prepare_deepspeed in every version; prepare_fsdp from v1.3 (accelerate's evaluation-mode prepare,
  // whole, before).
  p.reference_sharded = deepspeed || v.at_least(trl, V(1, 3));
  p.note = describe_version(v, trl) + " KTOTrainer: " + (selective ? "selective_log_softmax per row" : "the whole log_softmax(-1) saved") +
           "; a no-grad forward of the KL batch before each model's forward" +
           (p.kl_logits_held ? ", its logits kept through the batch's forward" : "") +
           (p.label_copies == LabelCopies::AfterReference ? "; copies of the logits' desirable and undesirable rows after the loss"
                                                          : "; copies of the logits' desirable and undesirable rows kept through the reference") +
           (p.logits_live_through_reference ? "; the policy's and the reference's logits kept to the end of the loss" : "") +
           (p.entropy_copy ? "; the entropy metric copies the policy's logits" : "") +
           (logits_fp32 ? "; fp32 logits" : "");
  return p;
}
}  // namespace

ReferenceModel auto_reference(const Config& c, const StackVersions& v) {
  const Objective o = c.training.goal();
  if (o == Objective::Orpo || o == Objective::Simpo) return ReferenceModel::None;
  // GRPOConfig.beta: 0.04 up to v0.18, 0.0 from v0.19 (commit 7359ddcc6 "New default: beta=0.0"); beta 0 loads no
  // reference model (grpo_trainer.py: `if self.beta == 0.0: self.ref_model = None`).
  if (o == Objective::Grpo && v.at_least(Library::Trl, V(0, 19))) return ReferenceModel::None;
  return c.peft.enabled() ? ReferenceModel::AdapterDisabled : ReferenceModel::Copy;
}

PreferenceFlow resolve_preference(const Config& c, const FrameworkSpec& f, const StackVersions& v, bool deepspeed) {
  PreferenceFlow p;
  p.objective = c.training.goal();
  if (p.objective == Objective::Sft || p.objective == Objective::Unknown) return p;
  p.reference = c.training.reference() == ReferenceModel::Auto ? auto_reference(c, v) : c.training.reference();
  if (p.objective == Objective::Orpo || p.objective == Objective::Simpo) p.reference = ReferenceModel::None;  // ORPOTrainer, CPOTrainer
  const Library trl = Library::Trl, tf = Library::Transformers;
  const bool model_upcasts = v.below(tf, V(4, 46));
  const bool accelerate_upcasts = f.transformers_model && !deepspeed;
  if (p.objective == Objective::Ppo) {
    // PPOTrainer (v0.12+; trl/trainer/ppo_trainer.py, trl/experimental/ppo from v0.26): selective_log_softmax of the
    // policy's and the reference's logits (v0.13+; a log_softmax and gather before). accelerator.prepare wraps the
    // PolicyAndValueWrapper, whose outputs (logits and every hidden state, output_hidden_states=True) accelerate
    // converts to fp32 under mixed precision; the reference is the bare module (ref_model.to(device), or the policy
    // unwrapped with its adapters off), prepare_deepspeed'd under DeepSpeed (sharded under ZeRO-3).
    p.logps = Logps::Selective;
    p.logits_fp32 = model_upcasts || accelerate_upcasts;
    p.outputs_to_fp32 = accelerate_upcasts;
    p.reference_logits_fp32 = model_upcasts;
    p.reference_sharded = deepspeed;
    return p;
  }
  if (p.objective == Objective::Grpo) {
    // GRPOTrainer's log-probabilities: selective_log_softmax from v0.15 (T:478-487); its logits are whatever the
    // model returns (TRL never upcasts them), accelerate's fp32 outputs under the Trainer's AMP included. The
    // reference: a deepcopy or from_pretrained of the policy, prepare_deepspeed (ZeRO-3 sharded, a replica under
    // ZeRO-1/2) or from v0.18 prepare_fsdp (sharded); without either, prepare_model(evaluation_mode=True), whole.
    p.logps = Logps::Selective;
    p.logits_fp32 = model_upcasts || accelerate_upcasts;
    p.outputs_to_fp32 = accelerate_upcasts;
    p.reference_sharded = deepspeed || v.at_least(trl, V(0, 18));
    return p;
  }
  if (p.objective == Objective::Kto) return resolve_kto(p, v, model_upcasts || accelerate_upcasts, accelerate_upcasts, deepspeed);
  p.nll = p.objective == Objective::Orpo || c.training.nll_alpha > 0;
  if (f.torchtune_recipes) {
    // torchtune recipes/lora_dpo_single_device.py (v0.3+): logits = self._model(...) with the output's .float();
    // get_batch_log_probs takes log_softmax(logits / 1.0) (an fp32 quotient, then its fp32 log-softmax saved); the
    // policy's logits are deleted before the reference forward (#1243), the reference's (under no_grad, with
    // disable_adapter) never are, so they live through the backward. full_dpo_distributed.py shards a bf16 reference
    // with FSDP and deletes its logits.
    p.logps = Logps::FullLogSoftmax;
    p.logits_fp32 = true;
    p.scaled_copy = true;
    p.reference_logits_kept = p.reference == ReferenceModel::AdapterDisabled;
    p.reference_sharded = true;
    p.note = "torchtune's DPO recipes: fp32 logits, log_softmax(logits / 1.0) saved";
    if (p.reference_logits_kept) p.note += ", the reference's fp32 logits kept to the backward (lora_dpo recipes)";
    return p;
  }
  // TRL's trainers on a transformers model.
  const bool selective = v.at_least(trl, V(0, 15));
  p.logps = selective ? Logps::Selective : Logps::FullLogSoftmax;
  p.slice_copy = v.below(trl, V(0, 14));
  p.logits_live_through_reference = v.below(trl, V(0, 12)) || v.at_least(trl, V(0, 29));
  p.shift_copy_kept = v.at_least(trl, V(0, 29)) && v.below(trl, V(1, 6));
  p.reference_logits_kept = v.at_least(trl, V(0, 29)) && p.reference != ReferenceModel::Precomputed;
  // DPOTrainer 1.6+ logs the entropy of the policy's logits after the loss, before the backward:
  // entropy_from_logits(shift_logits.detach()) flattens logits[..., :-1, :], which c3f21ede9 left a view, so reshape
  // copies it whole (trl/trainer/utils.py entropy_from_logits; the 128-row chunks after it are small).
  p.entropy_copy = p.objective == Objective::Dpo && v.at_least(trl, V(1, 6));
  // TRL 0.9-0.11 computed the chosen half's cross-entropy whatever rpo_alpha was (get_batch_loss_metrics).
  if (v.at_least(trl, V(0, 9)) && v.below(trl, V(0, 12))) p.nll = true;
  // The logits are fp32 when the model upcasts them (transformers <= 4.45: logits = logits.float(), removed by #33902
  // in 4.46) or when accelerate's native AMP wraps the forward in convert_outputs_to_fp32: the Trainer with bf16 or
  // fp16 set (TRL's configs set bf16 by default) and not under DeepSpeed, whose engine has no such wrapper.
  p.logits_fp32 = model_upcasts || accelerate_upcasts;
  p.outputs_to_fp32 = accelerate_upcasts;
  // TRL 0.19-0.28 asked the model for its hidden states in every concatenated_forward ("[Liger] liger DPO support",
  // #2568, 53c4a7c2b; dropped by the v0.29 refactor): the tuple holds every layer's output until the call returns,
  // which under no_grad (the reference) keeps what would have gone layer by layer, and accelerate's wrapper makes an
  // fp32 copy of each.
  p.hidden_states_returned = v.at_least(trl, V(0, 19)) && v.below(trl, V(0, 29));
  // The copy: DeepSpeed shards it with the policy's config (prepare_deepspeed: stage 3 under ZeRO-3, stage 0, whole,
  // under ZeRO-1/2); FSDP shards it from TRL 0.29 (prepare_fsdp), before which accelerate's
  // prepare_model(evaluation_mode=True) left it whole.
  p.reference_sharded = deepspeed || v.at_least(trl, V(0, 29));
  p.note = describe_version(v, trl) + ": " +
           (selective ? "selective_log_softmax per row" : "the whole log_softmax(-1) saved") +
           (p.slice_copy ? ", of a contiguous copy of logits[:, :-1]" : "") +
           (p.logits_live_through_reference ? "; the policy's logits live through the reference forward" : "") +
           (p.shift_copy_kept ? "; shift_logits .contiguous() kept to the loss" : "") +
           (p.entropy_copy ? "; the entropy metric copies the policy's logits after the loss" : "") +
           (p.hidden_states_returned ? "; output_hidden_states=True keeps every layer's output to the end of each forward" : "") +
           (p.logits_fp32 ? (model_upcasts ? "; fp32 logits (" + describe_version(v, tf) + " upcasts them)"
                                           : std::string("; fp32 logits (accelerate's convert_outputs_to_fp32 under the Trainer's bf16/fp16)"))
                          : "");
  return p;
}

}  // namespace memsim
