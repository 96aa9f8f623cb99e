// TRL's SFTTrainer metrics after the loss (src/core/sft_metrics.cpp): the token accuracy's and the entropy's copies of
// the logits by TRL release, only where a stated versions.trl says the HF Trainer is TRL's, TRL 0.15.0's gather of
// every rank's copy, and What helps' answer to it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "core/advice.h"
#include "core/simulate.h"
#include "core/validate.h"
#include "test_util.h"

using namespace memsim;

namespace {

// Qwen2.5 0.5B (a 151,936-token vocabulary), 2 sequences of 512 tokens, bf16: the outputs' logits are bf16.
constexpr int64_t kVocab = 151936, kRows = 2, kSeq = 512;
constexpr int64_t kCopy = 2 * kRows * (kSeq - 1) * kVocab;  // logits[..., :-1, :].contiguous()

Config sft_config(const char* trl, int64_t rows = kRows) {
  Config c = single_gpu_config("qwen2.5-0.5b.json", rows, kSeq);
  c.versions.trl = trl;
  return c;
}

// The most bytes of `label`'s tensors alive at once before step 2's backward.
int64_t most(const Config& c, const std::string& label) {
  return live(simulate_valid(c).program, "backward (step 2)", label, true);
}

}  // namespace

TEST_CASE("TRL's SFTTrainer: each release's token accuracy and entropy copy the logits after the loss") {
  const std::string copy = "token accuracy / entropy: the shifted logits' copy", entropy = "entropy: log-softmax";
  SECTION("nothing before 0.15, and nothing unless versions.trl is stated") {
    CHECK(most(sft_config("0.14.0"), copy) == 0);
    CHECK(most(sft_config("latest"), copy) == 0);
    Config dated = sft_config("latest");
    dated.versions.date = "2025-06-01";  // a date dates a plain Trainer's libraries too: no TRL assumed
    CHECK(most(dated, copy) == 0);
    Config loop = sft_config("0.16.0");
    loop.training.framework = "hf_loop";  // not a Trainer
    CHECK(most(loop, copy) == 0);
    Config dpo = sft_config("0.16.0");
    dpo.training.objective = "dpo";  // the DPO trainer's own compute_loss
    CHECK(most(dpo, copy) == 0);
  }
  SECTION("0.16-0.21: one copy, no entropy") {
    CHECK(most(sft_config("0.16.0"), copy) == kCopy);
    CHECK(most(sft_config("0.21.0"), entropy) == 0);
  }
  SECTION("0.22: a whole sequence's log-softmax, exp and product at a time, then the copy") {
    CHECK(most(sft_config("0.22.0"), entropy) == 3 * 2 * kSeq * kVocab);
    CHECK(most(sft_config("0.22.0"), copy) == kCopy);
  }
  SECTION("0.23-1.2: 128-row chunks") {
    CHECK(most(sft_config("0.24.0"), entropy) == 3 * 2 * 128 * kVocab);
    CHECK(most(sft_config("1.2.0"), copy) == kCopy);
  }
  SECTION("1.3-1.5: the entropy's copy is still bound when the accuracy makes its own") {
    CHECK(most(sft_config("1.4.0"), copy) == 2 * kCopy);
  }
  SECTION("1.6 on: views, but the entropy's reshape copies a micro-batch of several sequences") {
    CHECK(most(sft_config("1.9.0"), copy) == kCopy);
    CHECK(most(sft_config("1.9.0", 1), copy) == 0);
  }
  SECTION("a fused loss gives the outputs no logits: nothing to copy") {
    Config liger = sft_config("0.16.0");
    liger.training.loss = "fused_linear";
    CHECK(most(liger, copy) == 0);
  }
}

TEST_CASE("TRL 0.15.0's SFTTrainer gathers every rank's logits copy onto each: the forward's end can become the peak") {
  Config c = sft_config("0.15.0");
  c.parallel.data_parallel_size = 4;
  const DeviceResult gathered = simulate_valid(c);
  CHECK(live(gathered.program, "backward (step 2)", "token accuracy: every rank's shifted logits", true) == 4 * kCopy);
  c.versions.trl = "0.15.1";  // trl#2890: only the counts gathered
  const DeviceResult local = simulate_valid(c);
  CHECK(gathered.peak.allocated_bytes > local.peak.allocated_bytes);
  CHECK(gathered.peak_phase.rfind("forward", 0) == 0);
  // One GPU: accelerate's gather returns the tensor itself.
  c.parallel.data_parallel_size = 1;
  c.versions.trl = "0.15.0";
  CHECK(live(simulate_valid(c).program, "backward (step 2)", "token accuracy: every rank's shifted logits", true) == 0);
}

TEST_CASE("What helps: TRL 0.15.0's gather on several GPUs is answered by 0.15.1, the same training") {
  Config c = sft_config("0.15.0");
  c.parallel.data_parallel_size = 4;
  const std::vector<Suggestion> all = suggest(c);
  const auto it = std::find_if(all.begin(), all.end(), [](const Suggestion& s) { return s.id == "trl_no_logits_gather"; });
  REQUIRE(it != all.end());
  CHECK(it->config.versions.trl == "0.15.1");
  CHECK(it->group == SuggestionGroup::SameJob);
  CHECK(it->saved_bytes > 2 * kCopy);  // most of the three other ranks' gathered copies (the peak moves to backward)
  // Not offered where the release gathers nothing.
  c.versions.trl = "0.16.0";
  std::vector<std::string> ids;
  for (const Suggestion& s : suggestion_candidates(c)) ids.push_back(s.id);
  CHECK(std::find(ids.begin(), ids.end(), "trl_no_logits_gather") == ids.end());
}
