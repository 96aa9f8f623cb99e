// TRL's SFTTrainer: after the loss of every micro-batch, compute_loss logs the mean token accuracy (from TRL 0.15) and
// the entropy (from 0.22) of the model's logits under no_grad. Neither changes what backward needs, but both make
// logits-sized temporaries while the outputs still hold the logits, at the end of each forward: a copy of the logits
// shifted by one token, sometimes two, and in TRL 0.15.0 the copies of every rank gathered onto each. This file resolves,
// by the TRL version, what each release makes; StepBuilder::sft_metrics (sft_metrics.cpp) replays it.
// Sources: huggingface/trl trl/trainer/sft_trainer.py compute_loss and trl/trainer/utils.py entropy_from_logits at the
// tags named below (docs/versions.md section 15).
#pragma once
#include <cstdint>
#include <string>

#include "config.h"
#include "versions.h"

namespace memsim {

struct SftMetrics {
  bool active = false;  // the loop is TRL's SFTTrainer: objective sft under the HF Trainer with versions.trl stated
  // Contiguous copies of logits[..., :-1, :] alive at once (in the logits' dtype): 1 for the accuracy (0.15-1.2), 2 in
  // 1.3-1.5 (the entropy's copy is still bound when the accuracy makes its own), 0 from 1.6 (views).
  int copies = 0;
  // From 1.6 the entropy reshapes the shifted view, which copies it when the micro-batch has more than one row.
  bool reshape_copies_rows = false;
  bool gathers_copy = false;   // 0.15.0: gather_for_metrics(shift_logits) all-gathers every rank's copy onto each
  // entropy_from_logits: rows of [., vocabulary] per chunk (log_softmax, exp and their product alive together);
  // 0: no entropy (before 0.22); -1: a whole sequence at a time (0.22: chunk_size 1 over the batch dimension).
  int64_t entropy_rows = 0;
  std::string note;  // the rule with its source, for the result's notes
};

// Requires a validated config. `logits_materialised`: the loss path gives the model's outputs their logits (not
// Liger's or Unsloth's fused losses, whose SFTTrainer path skips the metrics).
SftMetrics resolve_sft_metrics(const Config& c, const StackVersions& v, bool hf_trainer, bool logits_materialised);

}  // namespace memsim
