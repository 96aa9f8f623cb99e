// What helps (core/advice.h): the changes that keep the job come first, offload is offered on one GPU, pairs are
// offered where no single same-job change fits, and rows that save under 1% of the peak are left out.
#include <catch2/catch.hpp>

#include <algorithm>

#include "core/advice.h"
#include "core/catalog.h"
#include "test_util.h"

using namespace memsim;

namespace {

// A catalogue model, fully fine-tuned on `gpus` GPUs of one kind; everything else is the page's opening setup
// (DeepSpeed ZeRO-3, full checkpointing, bf16 mixed precision, micro-batch 4 x 4096).
Config catalogue_setup(const std::string& model_id, const std::string& gpu, int64_t gpus) {
  const ModelPreset* preset = find_model_preset(model_id);
  REQUIRE(preset != nullptr);
  Config c;
  c.model = preset->model;
  c.hardware.gpu = gpu;
  c.parallel.data_parallel_size = gpus;
  return c;
}

int64_t global_batch(const Config& c) {
  return c.training.micro_batch_size * c.training.gradient_accumulation_steps * c.parallel.data_parallel_size;
}

// What "the same job" means: the same model, method (and its adapters and base quantization), global batch and
// sequence length.
bool same_job(const Config& a, const Config& b) {
  return a.model == b.model && a.peft == b.peft && global_batch(a) == global_batch(b) &&
         a.training.sequence_length == b.training.sequence_length;
}

const Suggestion* find_id(const std::vector<Suggestion>& s, const std::string& id) {
  for (const auto& x : s)
    if (x.id == id) return &x;
  return nullptr;
}

// The ranking's promises, checked on any list: groups in order, within a group what fits first (cheapest first),
// the rest by saving; every row saves at least 1% of the peak; every group's changes keep what the group says.
void check_ranked(const Config& base, const std::vector<Suggestion>& s) {
  const int64_t peak_now = worst_device_peak(base);
  REQUIRE(peak_now > 0);
  for (size_t i = 0; i < s.size(); ++i) {
    INFO(s[i].change);
    CHECK(s[i].saved_bytes * 100 >= peak_now);
    CHECK(s[i].peak_bytes + s[i].saved_bytes == peak_now);
    CHECK(!s[i].cost.empty());
    const bool keeps = s[i].group != SuggestionGroup::ChangesJob;
    CHECK(same_job(base, s[i].config) == keeps);
    if (s[i].group != SuggestionGroup::MoreHardware && keeps)
      CHECK(s[i].config.parallel.data_parallel_size * s[i].config.parallel.tensor_parallel_size *
                s[i].config.parallel.context_parallel_size * s[i].config.parallel.pipeline_parallel_size ==
            base.parallel.data_parallel_size * base.parallel.tensor_parallel_size * base.parallel.context_parallel_size *
                base.parallel.pipeline_parallel_size);
    if (i == 0) continue;
    const Suggestion& a = s[i - 1];
    const Suggestion& b = s[i];
    CHECK(a.group <= b.group);
    if (a.group != b.group) continue;
    CHECK((a.fits || !b.fits));
    if (a.fits && b.fits) CHECK((a.slowdown < b.slowdown || (a.slowdown == b.slowdown && a.saved_bytes >= b.saved_bytes)));
    if (!a.fits && !b.fits) CHECK(a.saved_bytes >= b.saved_bytes);
  }
}

}  // namespace

TEST_CASE("what helps: Llama-3.1-8B full fine-tuning on one RTX 4090 is offered CPU offload as the same job",
          "[advice]") {
  // The case, as the page opens it with the model and GPU chosen: ZeRO-3 on one GPU, micro-batch 4 x 4096.
  const Config c = catalogue_setup("llama-3.1-8b", "rtx-4090", 1);
  const Result now = simulate(c);
  REQUIRE(now.ok);
  REQUIRE(now.devices[0].verdict != Verdict::Fits);
  const auto s = suggest(c);
  REQUIRE(!s.empty());
  check_ranked(c, s);
  // The same job first: the list does not open with LoRA or QLoRA, which come last, under "changes the job".
  CHECK(s.front().group == SuggestionGroup::SameJob);
  CHECK(!s.front().config.peft.enabled());
  const Suggestion* lora = find_id(s, "lora");
  const Suggestion* qlora = find_id(s, "qlora");
  REQUIRE(lora != nullptr);
  REQUIRE(qlora != nullptr);
  CHECK(lora->group == SuggestionGroup::ChangesJob);
  CHECK(qlora->group == SuggestionGroup::ChangesJob);
  // Offload of the optimizer and the parameters on this one GPU (DeepSpeed ZeRO-3 offload), full fine-tuning still.
  const Suggestion* offload = find_id(s, "offload_optimizer_params");
  REQUIRE(offload != nullptr);
  CHECK(offload->group == SuggestionGroup::SameJob);
  CHECK(offload->config.parallel.data_parallel_size == 1);
  CHECK(offload->config.parallel.offload_optimizer == "cpu");
  CHECK(offload->config.parallel.offload_params == "cpu");
  CHECK(offload->config.parallel.zero_stage == 3);
  CHECK(offload->config.peft.method == "none");
  CHECK(offload->saved_bytes > 0);
  // Micro-batch 4 of 4096 tokens still needs more than the GPU alone: no single same-job change fits, so pairs are
  // offered, and the best of them fit while keeping the job; the 8-bit optimizer is in its own group.
  bool single_fits = false;
  for (const auto& x : s) single_fits |= (x.group == SuggestionGroup::SameJob || x.group == SuggestionGroup::SameJobNumerics) && x.fits;
  CHECK(!single_fits);
  std::vector<const Suggestion*> pairs;
  for (const auto& x : s)
    if (x.group == SuggestionGroup::Pair) pairs.push_back(&x);
  REQUIRE(!pairs.empty());
  CHECK(pairs.size() <= static_cast<size_t>(kMaxPairsShown));
  for (const Suggestion* p : pairs) {
    INFO(p->change);
    CHECK(p->fits);
    CHECK(p->part_changes.size() == 2);
    CHECK(p->config.peft.method == "none");
    CHECK(worst_device_peak(p->config) == p->peak_bytes);  // its config is what was simulated
  }
  bool offload_pair = false;
  for (const Suggestion* p : pairs) offload_pair |= p->config.parallel.offload_params == "cpu";
  CHECK(offload_pair);
  const Suggestion* adam8 = find_id(s, "optimizer_8bit");
  REQUIRE(adam8 != nullptr);
  CHECK(adam8->group == SuggestionGroup::SameJobNumerics);
}

TEST_CASE("what helps: with micro-batch 1 the 8B on one RTX 4090 fits by offload alone, and no pair is offered",
          "[advice]") {
  Config c = catalogue_setup("llama-3.1-8b", "rtx-4090", 1);
  c.training.micro_batch_size = 1;
  const auto s = suggest(c);
  check_ranked(c, s);
  const Suggestion* offload = find_id(s, "offload_optimizer_params");
  REQUIRE(offload != nullptr);
  CHECK(offload->group == SuggestionGroup::SameJob);
  CHECK(offload->fits);
  CHECK(s.front().fits);  // a change that fits leads the list
  CHECK(s.front().group == SuggestionGroup::SameJob);
  for (const auto& x : s) CHECK(x.group != SuggestionGroup::Pair);
  CHECK(pair_candidates(c, s).empty());
}

TEST_CASE("what helps: FSDP frameworks offload parameters and optimizer together, also on one GPU", "[advice]") {
  for (const char* framework : {"torchtune", "litgpt"}) {
    Config c = catalogue_setup("llama-3.1-8b", "rtx-4090", 1);
    c.training.framework = framework;
    const auto candidates = suggestion_candidates(c);
    INFO(framework);
    CHECK(find_id(candidates, "offload_optimizer") == nullptr);  // FSDP's CPUOffload has no optimizer-only form
    const Suggestion* both = find_id(candidates, "offload_optimizer_params");
    REQUIRE(both != nullptr);
    Suggestion scored = *both;
    CHECK(evaluate_suggestion(scored, worst_device_peak(c)));  // validates and simulates on one GPU
    CHECK(scored.saved_bytes > 0);
  }
}

TEST_CASE("what helps: changes that lower the micro-batch or the data-parallel size keep the global batch", "[advice]") {
  Config c;  // 8 GPUs, micro-batch 4; a sequence long enough for context parallel
  c.training.micro_batch_size = 6;
  c.training.gradient_accumulation_steps = 3;
  c.training.sequence_length = 16384;
  c.training.activation_checkpointing = "none";
  c.parallel.zero_stage = 1;
  for (const auto& s : suggestion_candidates(c)) {
    INFO(s.id);
    if (s.group == SuggestionGroup::ChangesJob) {
      CHECK(!same_job(c, s.config));
      continue;
    }
    CHECK(same_job(c, s.config));
  }
  const auto cands = suggestion_candidates(c);
  const Suggestion* smaller = find_id(cands, "micro_batch_smaller");
  REQUIRE(smaller != nullptr);
  CHECK(smaller->config.training.micro_batch_size == 3);  // 6 halves to 3, accumulation 3 -> 6
  CHECK(smaller->config.training.gradient_accumulation_steps == 6);
  const Suggestion* tp = find_id(cands, "tensor_parallel_2");
  REQUIRE(tp != nullptr);
  CHECK(tp->config.training.gradient_accumulation_steps == 6);
  const Suggestion* more = find_id(cands, "gpus_x2");
  REQUIRE(more != nullptr);
  CHECK(more->group == SuggestionGroup::MoreHardware);
  CHECK(more->config.parallel.data_parallel_size == 16);
}

TEST_CASE("what helps: pairs are bounded, made of same-job changes, and none is made where one change fits", "[advice]") {
  const Config c = catalogue_setup("llama-3.1-8b", "rtx-4090", 1);
  const int64_t peak = worst_device_peak(c);
  std::vector<Suggestion> scored;
  for (auto& s : suggestion_candidates(c))
    if (evaluate_suggestion(s, peak)) scored.push_back(std::move(s));
  const auto pairs = pair_candidates(c, scored);
  REQUIRE(!pairs.empty());
  CHECK(pairs.size() <= static_cast<size_t>(kMaxPairedChanges * (kMaxPairedChanges - 1) / 2));
  for (const auto& p : pairs) {
    INFO(p.id);
    CHECK(p.group == SuggestionGroup::Pair);
    CHECK(same_job(c, p.config));
    CHECK(p.part_changes.size() == 2);
  }
  // One same-job change that fits is enough: no pairs then.
  std::vector<Suggestion> one_fits = scored;
  for (auto& s : one_fits)
    if (s.group == SuggestionGroup::SameJob) {
      s.fits = true;
      break;
    }
  CHECK(pair_candidates(c, one_fits).empty());
}

TEST_CASE("what helps: rows that save under 1% of the peak are left out, and the ranking puts the cheapest fit first",
          "[advice]") {
  auto row = [](std::string id, SuggestionGroup g, int slowdown, int64_t saved_mib, bool fits) {
    Suggestion s;
    s.change = id;
    s.cost = "cost of " + id;
    s.id = std::move(id);
    s.group = g;
    s.slowdown = slowdown;
    s.saved_bytes = saved_mib << 20;
    s.peak_bytes = (int64_t{10000} << 20) - s.saved_bytes;  // 10,000 MiB before every change
    s.fits = fits;
    s.verdict = fits ? Verdict::Fits : Verdict::DoesNotFit;
    return s;
  };
  using G = SuggestionGroup;
  const auto ranked = rank_suggestions({row("tiny", G::SameJob, 0, 99, false), row("lora", G::ChangesJob, 0, 5000, true),
                                        row("offload", G::SameJob, 4, 6000, true), row("loss", G::SameJob, 0, 3000, true),
                                        row("half", G::SameJob, 1, 2000, false), row("ckpt", G::SameJob, 2, 2500, false),
                                        row("adam8", G::SameJobNumerics, 0, 4000, false), row("gpus", G::MoreHardware, 0, 7000, true),
                                        row("pair_no", G::Pair, 3, 7000, false), row("pair_yes", G::Pair, 5, 6500, true)});
  std::vector<std::string> ids;
  for (const auto& s : ranked) ids.push_back(s.id);
  // "tiny" saves 0.99%: gone. The fitting pair is shown; the pair that does not fit is not.
  CHECK(ids == std::vector<std::string>{"loss", "offload", "ckpt", "half", "adam8", "pair_yes", "gpus", "lora"});
}

TEST_CASE("what helps: where an evaluation sets the peak, a smaller eval batch and logits off the GPU", "[advice][evaluation]") {
  // Llama-3-8B LoRA on one GPU, trained at micro-batch 1 under checkpointing, evaluated at batch 8 with
  // compute_metrics keeping four batches' logits: the evaluation holds the peak, and the changes that shrink it
  // leave the training as it is.
  Config c = single_gpu_config("llama-3-8b.json", 1, 1024);
  c.peft.method = "lora";
  c.training.activation_checkpointing = "full";
  c.training.eval_batch_size = 8;
  c.training.eval_logits_batches = 4;
  const std::vector<Suggestion> s = suggest(c);
  for (const char* id : {"eval_batch_smaller", "eval_accumulation_one", "eval_logits_reduced"}) {
    INFO(id);
    const Suggestion* x = find_id(s, id);
    REQUIRE(x != nullptr);
    CHECK(x->group == SuggestionGroup::SameJob);
    CHECK(x->saved_bytes > 0);
    CHECK(same_job(x->config, c));
  }
  CHECK(find_id(s, "eval_batch_smaller")->config.training.eval_batch_size == 4);
}
