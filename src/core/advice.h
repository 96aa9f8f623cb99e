// "What helps": single changes to a setup that lower its peak, each simulated in full, with the memory it saves
// and what it costs in speed or quality. The interface lists them ranked and applies one with a click.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config.h"

namespace memsim {

struct Suggestion {
  std::string change;       // what to change, in words ("Full activation checkpointing")
  std::string cost;         // its known price ("about 33% more compute: each layer's forward runs twice")
  Config config;            // the setup with the change applied
  int64_t peak_bytes = 0;   // device peak of the most loaded GPU after the change
  int64_t saved_bytes = 0;  // against the current setup (positive: less memory)
  bool fits = false;        // every GPU fits after the change
};

// Ranked by memory saved, largest first; only changes that simulate and save memory are returned.
std::vector<Suggestion> suggest(const Config& config);

}  // namespace memsim
