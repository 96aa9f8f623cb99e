// "What helps": single changes to a setup that lower its peak, each simulated in full, with the memory it saves
// and what it costs in speed or quality. The interface lists them ranked and applies one with a click.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "band.h"
#include "config.h"
#include "result.h"

namespace memsim {

struct Suggestion {
  std::string change;       // what to change, in words ("Full activation checkpointing")
  std::string cost;         // its known price ("about 33% more compute: each layer's forward runs twice")
  Config config;            // the setup with the change applied
  int64_t peak_bytes = 0;   // device peak of the most loaded GPU after the change
  int64_t saved_bytes = 0;  // against the current setup (positive: less memory)
  bool fits = false;        // every GPU's verdict is fits after the change (the band's top fits, core/band.h)
  Verdict verdict = Verdict::DoesNotFit;  // the worst GPU's verdict after the change
};

// Ranked by memory saved, largest first; only changes that simulate and save memory are returned.
std::vector<Suggestion> suggest(const Config& config);

// The same in steps, for a caller that spreads the simulations over time (the interface, a few per frame):
// the candidate changes, not yet simulated; the current setup's peak (the most loaded GPU's device bytes);
// one candidate simulated against it (false where the changed setup does not simulate); and the ranking.
std::vector<Suggestion> suggestion_candidates(const Config& config);
int64_t worst_device_peak(const Config& config);  // -1 if the setup does not simulate
bool evaluate_suggestion(Suggestion& s, int64_t peak_now);
// The same two for a caller that simulates itself (a part at a time, or a run over fewer steps): the result's
// peak, and a candidate scored from the result of its setup.
int64_t worst_device_peak(const Result& r);  // -1 if the result is not ok
bool score_suggestion(Suggestion& s, int64_t peak_now, const Result& after);
std::vector<Suggestion> rank_suggestions(std::vector<Suggestion> evaluated);

}  // namespace memsim
