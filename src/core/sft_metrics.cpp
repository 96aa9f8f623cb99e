// TRL's SFTTrainer metrics after the loss (sft_metrics.h). Each release's compute_loss, in train mode without Liger:
//   0.15.0: shift_logits = outputs.logits[..., :-1, :].contiguous(); shift_logits = gather_for_metrics(shift_logits)
//         (all_gather into a [world x rows, ...] tensor while the local copy is still bound); argmax on the main
//         process (trl/trainer/sft_trainer.py:443-453 at v0.15.0).
//   0.15.1-0.21: the same copy, argmax locally, only the counts gathered (trl#2890 "Don't gather logits in SFT to
//         avoid hanging", in 0.15.1; v0.16.0 :514-518).
//   0.22: entropy_from_logits(outputs.logits) first, chunk_size=1 over the batch dimension: log_softmax of one whole
//         sequence, its exp and their product alive together (utils.py at v0.22.0); then the accuracy copy.
//   0.23-1.2: the entropy in chunks of 128 flattened rows (utils.py at v0.23.0), then the accuracy copy.
//   1.3-1.5: a shifted copy for the entropy, then a second for the accuracy while the first is still bound
//         (sft_trainer.py at v1.3.0; #5897 merged the two in 1.6).
//   1.6 on: one no_grad block over the view logits[..., :-1, :] (#5930 dropped the .contiguous()); entropy_from_logits
//         reshapes it to [rows, vocabulary], a copy when the micro-batch has more than one sequence.
#include "sft_metrics.h"

#include <algorithm>

#include "checked.h"
#include "gpu_count.h"
#include "step_builder.h"

namespace memsim {

namespace {
constexpr Version V(int major, int minor, int patch = 0) { return {major, minor, patch}; }
constexpr int64_t kEntropyChunkRows = 128;  // entropy_from_logits' chunk_size from TRL 0.23
}  // namespace

SftMetrics resolve_sft_metrics(const Config& c, const StackVersions& v, bool hf_trainer, bool logits_materialised) {
  SftMetrics m;
  const LibraryVersion& trl = v[Library::Trl];
  // Only a version the user states says the Trainer is TRL's: a date alone dates the libraries of a plain Trainer too.
  if (c.training.goal() != Objective::Sft || !hf_trainer || !logits_materialised || trl.latest || trl.from_date) return m;
  if (v.below(Library::Trl, V(0, 15))) return m;
  m.active = true;
  const std::string at = "TRL " + version_text(trl.version) + "'s SFTTrainer.compute_loss: ";
  if (v.below(Library::Trl, V(0, 15, 1))) {
    m.copies = 1;
    m.gathers_copy = true;
    m.note = at + "the token accuracy copies the shifted logits and gathers every rank's copy onto each "
                  "(gather_for_metrics, sft_trainer.py at v0.15.0; trl#2890 gathers only the counts from 0.15.1)";
  } else if (v.below(Library::Trl, V(0, 22))) {
    m.copies = 1;
    m.note = at + "the token accuracy copies the shifted logits (logits[..., :-1, :].contiguous(), at v0.16.0)";
  } else if (v.below(Library::Trl, V(0, 23))) {
    m.copies = 1;
    m.entropy_rows = -1;
    m.note = at + "the entropy takes a whole sequence's log-softmax at a time (entropy_from_logits chunk_size 1, "
                  "utils.py at v0.22.0), then the token accuracy copies the shifted logits";
  } else if (v.below(Library::Trl, V(1, 3))) {
    m.copies = 1;
    m.entropy_rows = kEntropyChunkRows;
    m.note = at + "the entropy in 128-row chunks (utils.py at v0.23.0), then the token accuracy copies the shifted logits";
  } else if (v.below(Library::Trl, V(1, 6))) {
    m.copies = 2;
    m.entropy_rows = kEntropyChunkRows;
    m.note = at + "the entropy and the token accuracy each copy the shifted logits, both copies alive at once "
                  "(sft_trainer.py at v1.3.0; one from 1.6, trl#5897)";
  } else {
    m.reshape_copies_rows = true;
    m.entropy_rows = kEntropyChunkRows;
    m.note = at + "the entropy and the token accuracy read the shifted logits as a view; the entropy's reshape copies "
                  "them when a micro-batch has more than one sequence (trl#5930, in 1.6)";
  }
  return m;
}

// At the end of a micro-batch's forward, after the loss, while the outputs hold the logits (`logits_bytes` per element:
// their dtype). Everything made here goes before backward starts.
void StepBuilder::sft_metrics(int64_t logits_bytes) {
  const SftMetrics& m = resolved_.sft_metrics;
  if (!m.active) return;
  auto& p = program_;
  if (sft_labels_.copy == UINT32_MAX) {
    sft_labels_.copy = p.label("token accuracy / entropy: the shifted logits' copy (TRL SFTTrainer, no grad)");
    sft_labels_.gathered = p.label("token accuracy: every rank's shifted logits, gathered (TRL 0.15.0 gather_for_metrics)");
    sft_labels_.entropy = p.label("entropy: log-softmax, exp and their product of a chunk (TRL SFTTrainer, no grad)");
    sft_labels_.argmax = p.label("token accuracy: argmax of the logits (int64)");
  }
  const int32_t post = -1;
  const int64_t el = logits_bytes;
  const int64_t rows = dims_.b, shifted = mul(rows, std::max<int64_t>(dims_.s - 1, 1));
  const int64_t copy_bytes = mul(el, shifted, dims_.V);
  std::vector<uint32_t> live;
  const auto entropy = [&] {
    if (m.entropy_rows == 0) return;
    const int64_t chunk = m.entropy_rows < 0 ? dims_.s : std::min<int64_t>(m.entropy_rows, shifted);
    const uint32_t a = tmp(mul(el, chunk, dims_.V), sft_labels_.entropy, post);
    const uint32_t b = tmp(mul(el, chunk, dims_.V), sft_labels_.entropy, post);
    const uint32_t c = tmp(mul(el, chunk, dims_.V), sft_labels_.entropy, post);
    drop(a), drop(b), drop(c);
  };
  if (m.copies == 2) live.push_back(tmp(copy_bytes, sft_labels_.copy, post));  // the entropy's own copy (1.3-1.5)
  if (m.reshape_copies_rows && rows > 1) live.push_back(tmp(copy_bytes, sft_labels_.copy, post));
  entropy();
  if (m.copies >= 1) live.push_back(tmp(copy_bytes, sft_labels_.copy, post));  // the accuracy's copy
  const int64_t world = gpu_count(cfg_.parallel);
  if (m.gathers_copy && world > 1) {
    const uint32_t gathered = tmp(mul(world, copy_bytes), sft_labels_.gathered, post);
    for (uint32_t t : live) drop(t);  // shift_logits is rebound to the gathered tensor
    live = {gathered};
    live.push_back(tmp(mul(8, world, shifted), sft_labels_.argmax, post));
  } else {
    live.push_back(tmp(mul(8, shifted), sft_labels_.argmax, post));
  }
  for (uint32_t t : live) drop(t);
}

}  // namespace memsim
