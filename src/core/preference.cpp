// Preference objectives: the flow of the logits and the reference model, by framework and version (preference.h).
// Sources: huggingface/trl trl/trainer/dpo_trainer.py at the tags named, pytorch/torchtune recipes/lora_dpo_*.py and
// full_dpo_distributed.py, accelerate's convert_outputs_to_fp32; the quotes are in docs/research/preference.md.
#include "preference.h"

#include "frameworks.h"

namespace memsim {

namespace {
constexpr Version V(int major, int minor, int patch = 0) { return {major, minor, patch}; }
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
