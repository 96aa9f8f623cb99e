// "What helps": changes to a setup that lower its peak, each simulated in full, with the memory it saves and what it
// costs in speed or quality. They come in groups, because a user asks first how to run *this* job (this model, this
// method, this global batch and sequence length) on *these* GPUs: the changes that keep the job come first, those
// that keep it but change its numerics a little next, then more GPUs of the same kind, and last the changes that
// make it a different job (LoRA, QLoRA, a shorter sequence, a smaller model). When no single change that keeps the
// job fits, pairs of the most effective ones are simulated as well ("together they fit").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "band.h"
#include "config.h"
#include "result.h"

namespace memsim {

// In the order the list shows them. The words for each group belong to the interface (panel_advice.cpp, the CLI).
enum class SuggestionGroup {
  SameJob,          // same model, method, global batch, sequence length and numerics: only memory and speed change
  SameJobNumerics,  // the same job, but the arithmetic differs slightly (8-bit optimizer states, fp32 -> bf16 autocast)
  Pair,             // two changes of the groups above, together; offered only when no single one of them fits
  MoreHardware,     // more GPUs of the same kind, same global batch
  ChangesJob,       // a different job: another method (LoRA, QLoRA), a shorter sequence, a smaller model
};
constexpr int kSuggestionGroups = 5;

// How much a change slows a step, roughly, for ordering the changes that fit (the cheapest first) and the pairs.
// 0: nothing or faster; 1: a few percent; 2: about a third more compute; 3: PCIe traffic every step (often 1.5-3x
// slower); 4: parameters over PCIe as well.
constexpr int kSlowdownClasses = 5;

struct Suggestion {
  std::string id;           // stable across setups ("offload_optimizer_params"); a pair: "first+second"
  std::string change;       // what to change, in words ("Full activation checkpointing"); a pair: both, joined
  std::string cost;         // its known price ("about 33% more compute: each layer's forward runs twice")
  SuggestionGroup group = SuggestionGroup::SameJob;
  int slowdown = 0;         // 0..kSlowdownClasses-1 (a pair: the sum of its parts')
  std::vector<std::string> part_changes, part_costs;  // a pair: the first and the second change's own words
  int64_t parts_saved_bytes = 0;  // a pair: what the better of its two changes saves alone
  Config config;            // the setup with the change applied
  int64_t peak_bytes = 0;   // device peak of the most loaded GPU after the change
  int64_t saved_bytes = 0;  // against the current setup (positive: less memory)
  bool fits = false;        // every GPU's verdict is fits after the change (the band's top fits, core/band.h)
  Verdict verdict = Verdict::DoesNotFit;  // the worst GPU's verdict after the change
  // A vLLM engine that would not start does after the change (fewer GPUs with a refusal, core/result.h): a row even
  // where it saves nothing, as the setup could not run before.
  bool unblocks = false;
};

// Ranked (see rank_suggestions), pairs included where no single change that keeps the job fits; only changes that
// simulate and save at least 1% of the peak are returned.
std::vector<Suggestion> suggest(const Config& config);

// The same in steps, for a caller that spreads the simulations over time (the interface, a few per frame):
// the single changes, not yet simulated; the current setup's peak (the most loaded GPU's device bytes);
// one candidate simulated against it (false where the changed setup does not simulate); and the ranking.
std::vector<Suggestion> suggestion_candidates(const Config& config);
// Only the changes that keep the job (the groups SameJob and SameJobNumerics): what pairs are made of.
std::vector<Suggestion> suggestion_candidates(const Config& config, bool same_job_only);
int64_t worst_device_peak(const Config& config);  // -1 if the setup does not simulate
bool evaluate_suggestion(Suggestion& s, int64_t peak_now, int refusals_now = 0);
// The same two for a caller that simulates itself (a part at a time, or a run over fewer steps): the result's
// peak, and a candidate scored from the result of its setup.
int64_t worst_device_peak(const Result& r);  // -1 if the result is not ok
// The GPUs where a vLLM engine would not start (DeviceResult::refusal); `refusals_now` below is the current setup's.
int refusal_count(const Result& r);
bool score_suggestion(Suggestion& s, int64_t peak_now, const Result& after, int refusals_now = 0);
// The pairs to simulate next, from the single changes already scored: none where one of them that keeps the job
// fits; otherwise each pair of the kMaxPairedChanges same-job changes (the numerics group included) that save the
// most, the second applied to the setup the first makes.
constexpr int kMaxPairedChanges = 6;  // at most 15 pairs
std::vector<Suggestion> pair_candidates(const Config& config, const std::vector<Suggestion>& scored_singles);
// Groups in their order; within a group the changes that fit first, the cheapest (slowdown) first and then the
// largest saving, then the rest by saving. A change that saves less than 1% of the peak is left out, so is a pair
// that saves less than 1% of the peak more than its better change alone, and of the other pairs only the
// kMaxPairsShown best that fit (or, where none fits, that are borderline).
constexpr int kMaxPairsShown = 3;
std::vector<Suggestion> rank_suggestions(std::vector<Suggestion> evaluated);

}  // namespace memsim
