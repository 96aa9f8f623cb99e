// Preference objectives (training.objective dpo, orpo, simpo, kto): what TRL's trainers and torchtune's DPO recipes keep of
// the logits, and the reference model, resolved from the config and the versions. The step's side is
// preference_step.cpp. Sources: docs/research/preference.md (huggingface/trl and pytorch/torchtune at the tags named).
#pragma once
#include <cstdint>
#include <string>

#include "config.h"
#include "versions.h"

namespace memsim {

struct FrameworkSpec;

// How the per-token log-probabilities are taken from the logits.
enum class Logps {
  FullLogSoftmax,  // gather(logits.log_softmax(-1)): the whole log-softmax is saved (TRL < 0.15, torchtune)
  Selective,       // TRL >= 0.15 selective_log_softmax: per row; fp32 logits save themselves, 16-bit ones each row's
                   // log-softmax
};

// KTO's copies of the logits' desirable and undesirable rows (index_select for the logits/chosen and logits/rejected
// metrics): none, made after the policy's log-probabilities and alive through the reference (TRL 0.8-1.8), or made
// after the reference and the entropy metric (1.9+).
enum class LabelCopies { None, BeforeReference, AfterReference };

struct PreferenceFlow {
  Objective objective = Objective::Sft;
  ReferenceModel reference = ReferenceModel::None;  // resolved: never Auto
  Logps logps = Logps::Selective;
  bool logits_fp32 = false;       // the logits the loss reads are fp32 (transformers <= 4.45, accelerate's
                                  // convert_outputs_to_fp32, torchtune's .float())
  bool slice_copy = false;        // log_softmax of logits[:, :-1]: a contiguous copy first (TRL 0.7-0.13)
  bool scaled_copy = false;       // torchtune: log_softmax(logits / 1.0), an fp32 quotient first
  bool logits_live_through_reference = false;  // the policy's logits outlive its log-probs (TRL 0.7-0.11, >= 0.29)
  bool shift_copy_kept = false;   // TRL 0.29-1.5: shift_logits = logits[..., :-1, :].contiguous(), kept to the loss
  bool entropy_copy = false;      // TRL >= 1.6: entropy_from_logits(shift_logits) reshapes the unshifted slice, a copy
  bool reference_logits_kept = false;  // the reference's logits live to the backward (torchtune LoRA, TRL >= 0.29)
  bool nll = false;               // a cross-entropy over the chosen half (ORPO; nll_alpha; TRL 0.9-0.11 always)
  bool outputs_to_fp32 = false;   // accelerate's convert_outputs_to_fp32 wraps the forwards (the Trainer's AMP)
  // PPO: the reference's scoring logits are fp32 only where the model upcasts them (transformers < 4.46): it is not
  // the module accelerate prepared, whose outputs it converts.
  bool reference_logits_fp32 = false;
  bool hidden_states_returned = false;  // TRL 0.19-0.28: output_hidden_states=True, every layer's output kept
                                        // until concatenated_forward returns
  bool reference_sharded = false; // the copy is sharded wherever the policy's parameters are (ShardPlan::shard_weights)
  // KTO (KTOTrainer): micro_batch_size unpaired rows, not pairs; each model also runs a no-grad forward over the KL
  // batch (every prompt with another row's completion) before its forward of the batch.
  bool paired = true;             // chosen and rejected concatenated: twice the rows (not KTO)
  bool kl_pass = false;           // calculate_KL (the default loss_type kto): the KL batch's no-grad forwards
  bool kl_logits_held = false;    // TRL 0.8-0.16: forward() keeps the KL batch's logits through the batch's forward
  bool kl_logps_after_batch = false;  // TRL 0.8-0.9: forward() takes the KL batch's log-probabilities after the batch's
  LabelCopies label_copies = LabelCopies::None;
  bool reference_label_copies = false;  // TRL 0.8-1.5: the reference's forward() makes (and drops) its own copies
  std::string note;               // the rules above with their versions, for the result's notes
};

// Requires a validated config. `framework`: the resolved framework; `deepspeed`: the sharding engine is DeepSpeed.
PreferenceFlow resolve_preference(const Config& c, const FrameworkSpec& framework, const StackVersions& v, bool deepspeed);

// The reference training.reference_model = auto stands for: none for orpo and simpo, and for grpo from TRL 0.19
// (beta 0 by default); adapter_disabled under PEFT (TRL's null_ref_context, torchtune's disable_adapter), a copy
// otherwise.
ReferenceModel auto_reference(const Config& c, const StackVersions& v);

}  // namespace memsim
