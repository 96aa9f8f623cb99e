// Published measured peaks (tests/validation/cases, from ../shared/validation/cases.jsonl) against the
// simulator, each compared with the statistic its source measured.
//
// Targets of the step-simulator issue: median absolute error <= 5% over the high- and medium-confidence
// single-GPU cases, and no high-confidence case beyond 15%; fine-tuning cases (LoRA/QLoRA/DoRA/IA3/LN tuning) 7%.
// Reached now (docs/validation.md): median 2.5% over 66 counted single-GPU cases, 2.8% over the 49 that use a PEFT
// method. Cases from sources added in later sessions (tests/validation/cases with a first_score) keep the error memsim
// had when they were added, before the model changes they motivated.
// The bounds below guard what is reached plus a small margin, so a regression fails; tighten them as the model
// improves (each names what it guards).
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>

#include "core/band.h"
#include "core/validation.h"
#include "test_util.h"

using namespace memsim;

// The case files of these folders, in name order.
static std::vector<ValidationCase> parse_cases(const std::vector<std::filesystem::path>& folders) {
  std::vector<std::string> files;
  for (const auto& dir : folders)
    for (const auto& e : std::filesystem::directory_iterator(dir))
      if (e.path().extension() == ".json") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  std::vector<ValidationCase> cases;
  for (const auto& f : files) {
    ValidationCase c;
    std::vector<FieldError> errors;
    const bool ok = parse_validation_case(read_file(f), c, errors);
    INFO(f << ": " << (errors.empty() ? "" : errors[0].message));
    REQUIRE(ok);
    cases.push_back(c);
  }
  return cases;
}

static std::vector<ValidationCase> load_cases() { return parse_cases({source_path("tests/validation/cases")}); }

// Every case file parses and simulates. Runs of varying lengths are cut to a few steps here (data.steps): this is
// the test the wasm build and the sanitizers run over every case (CMakeLists.txt, scripts/sanitize.sh), where the code
// each case reaches matters, not the length of its run; the test case below runs every case whole, natively.
TEST_CASE("every validation case parses and simulates", "[validation]") {
  auto cases = load_cases();
  REQUIRE(cases.size() >= 10);
  for (auto& c : cases)
    if (c.config.data.varies() && (c.config.data.steps == 0 || c.config.data.steps > 12)) c.config.data.steps = 12;
  ValidationSummary s = run_validation(cases);
  for (const auto& r : s.rows) {
    INFO(r.vcase.id << ": " << r.error);
    CHECK(r.ok);
  }
}

// The published cases simulated once for the sections below (each case replays its whole run, in every order of its
// data): one test case whose sections share them, so that ctest's one process per test case replays them once.
static const ValidationSummary& published() {
  static const ValidationSummary s = run_validation(load_cases());
  return s;
}

TEST_CASE("the published cases against memsim: every case whole, the summaries, the band and the residual table", "[validation]") {
  SECTION("every case simulates whole") {
    for (const auto& r : published().rows) {
      INFO(r.vcase.id << ": " << r.error);
      CHECK(r.ok);
    }
  }
  // The table in the build is what the validation cases give today (scripts/validation_report.sh --check says the
  // same for the file): a change of the model that moves an error must regenerate it.
  SECTION("the residual table is current") {
    CHECK(residual_table_text(residual_rows(published())) == std::string(residual_table_file()));
  }
  SECTION("single-GPU measured peaks: median and worst error") {
    const ValidationSummary& s = published();
    REQUIRE(s.counted >= 7);
    for (const auto& r : s.rows) {
      INFO(r.vcase.id);
      if (!r.vcase.excluded.empty()) continue;
      CHECK(r.bound_met);  // an OOM the source saw must come out above the card's memory
      if (r.vcase.confidence == "low" || r.vcase.bound()) continue;
      INFO(r.vcase.id << ": " << 100 * r.relative_error << "%");
      CHECK(std::abs(r.relative_error) < 0.25);  // worst counted case: torchtune's 2024 QLoRA on a 4090, 23.4% under
    }
    // The step simulator issue's targets: median <= 5%, no high-confidence case beyond 15%. Reached: 2.5% over 102
    // cases (2.8% before fms-acceleration's cases stated their versions, which give transformers 4.48's fp32 shifted
    // logits; 2.5% over the 66 before Qwen-1's README table came in at 4.6% on its first score; 3.4% before torch 2.0's
    // second foreach intermediate), 7.5%; 12.5% since prime-rl's RL benchmark rows for Qwen3-0.6B on one GPU came in
    // 10-12.5% under (a finding in their notes), within the target; 2.5% and 7.9% since FSDP2 over a one-rank mesh
    // (prime-rl shards on one GPU too: its fp32 gradients in the reduce-scatter stream's pool).
    CHECK(s.median_abs_error <= 0.027);
    CHECK(s.worst_high_abs_error < 0.085);
  }
  // The fine-tuning issue's target: median absolute error <= 7% over the high- and medium-confidence single-GPU cases
  // that use a PEFT method. Reached now: 2.7% over 108 cases (2.5% over 85; 3.4% before fms-acceleration's cases
  // stated their versions), the worst high-confidence one 7.5%. (2.70% with Nemotron-3-Nano's TRL run, 3.7% under.)
  SECTION("single-GPU fine-tuning (PEFT) peaks: median error") {
    const ValidationSummary& s = published();
    REQUIRE(s.peft_counted >= 80);
    CHECK(s.peft_median_abs_error <= 0.0275);
    CHECK(s.peft_worst_high_abs_error < 0.08);
  }
  // Target of the distributed issue: median absolute error <= 8% over the high- and medium-confidence multi-GPU
  // cases. Reached now (docs/validation.md): 3.3% over 24 cases, from 11% under to 9% over (14.1% over 6 before FSDP2's
  // side-stream pools, pipelining's receive buffers, op-by-op no_grad forwards, torchtitan's kept last block, DTensor's
  // gathered inputs and expandable segments for the single-node runs were modelled; lit-gpt's FSDP rows came in with
  // FSDP1's use_orig_params gradients and no_sync accumulation). The bounds guard it.
  SECTION("multi-GPU measured peaks: median and worst error") {
    const ValidationSummary& s = published();
    REQUIRE(s.multi_counted >= 5);
    for (const auto& r : s.rows) {
      if (!is_multi_gpu(r.vcase.config) || !r.vcase.excluded.empty() || r.vcase.confidence == "low" || r.vcase.bound()) continue;
      INFO(r.vcase.id << ": " << 100 * r.relative_error << "%");
      // Worst counted: torchtitan's Llama 3.1 405B interleaved 3D, 12.4% under (fms-acceleration's Mistral-7B QLoRA
      // under FSDP on 2 GPUs was 15.0% under before the fms cases stated their versions, 8.5% since, 3.2% over with
      // FSDP1's reshard-only hook).
      CHECK(std::abs(r.relative_error) < 0.13);
    }
    // The distributed issue's target is 8%; reached: 1.9% over 43 cases (3.4% before lit-gpt's FSDP rows described
    // their data, the longest Alpaca sample in the first micro-batch only; 2.8% before FSDP1's reshard-only hook held
    // the recomputed layers' inputs under PEFT, which also explained two excluded 70B QLoRA rows); 2.5% over 57 with
    // Answer.AI's FSDP-QLoRA rows, scored first at up to 22% over before fsdp_checkpoint_in_units said where their
    // checkpoint sits, now within 8.6% (their 70B CPU-offload row, low confidence, 21% under: a finding); 1.7% over 64
    // once a run of drawn samples shows the median of three orders of its data (lit-gpt's FSDP rows moved by up to 5
    // points, both ways: which samples share the longest one's micro-batch differs between orders).
    CHECK(s.multi_median_abs_error <= 0.018);
  }
  // The real-runs issue's targets count every high- and medium-confidence public case, the excluded findings too:
  // median <= 2.5% and p90 <= 8%. Reached: median 2.9% over the 154 decoder-family cases (3.4% before fms-acceleration's
  // cases stated their versions, 3.1% before SDPA's math kernel, FSDP2's embedding units and Unsloth), p90 13.0% (the
  // excluded rows are the ones the model cannot explain yet); 3.0-3.1% over 157-158 with the first families written
  // as programs (three DeiT cases 4-6% under, a finding in their notes; MMPretrain's ViT-L 0.2% under); 2.8% over 161,
  // p90 12.4%, since bitsandbytes' inputs live with litgpt's graph into the next forward and lit-gpt's rows describe
  // their data; 2.6% over 161, p90 11.6%, with FSDP1's reshard-only hook and its backward prefetch under reentrant
  // checkpointing; p90 11.3% with IA3's output scaling by the peft version; 2.8% over 177, p90 11.6%, with Answer.AI's
  // FSDP-QLoRA benchmark rows (15 counted, within 8.6% but for two excluded rows whose peak is set while the model
  // loads); 2.4% over 205, p90 11.0%, after autocast over 16-bit weights and the GRPO and PPO cases; p90 9.4% over
  // 211 with prime-rl's six SFT benchmark rows (within 6.1%; 11-20% under before its held fp32 logits), which also
  // add to the count; median 2.6%, p90 11.1% over 218 with its seven RL rows (3.4-12.5% under; +223% to +878% on
  // their first score, with the SFT head); median 2.5%, p90 9.4% once prime-rl's one-GPU rows shard over a one-rank
  // mesh as its setup_fsdp does (their RL rows 3-8% under, the SFT rows within 1.7%); unchanged (2.5%, 9.4%) once a run
  // of drawn samples shows the median of three orders of its data. The bounds guard what is reached. With every switch that a case file sets by
  // hand back at auto (the versions decide; Liger's fused_linear and prime-rl's vocab_chunked head kept, choices no
  // version implies): median 2.7%, p90 17.2%; median 2.4%, p90 11.4% once the attention, mask and loss that a model's
  // own code picks follow torch and flash-attn (torchvision's and MMPretrain's ViTs, Qwen-1's remote code; docs/versions.md 7a).
  SECTION("every public case, excluded findings included: median and p90") {
    const ValidationSummary& s = published();
    REQUIRE(s.all_counted >= 218);
    CHECK(s.all_median_abs_error <= 0.026);
    CHECK(s.all_p90_abs_error <= 0.10);
    CHECK(s.auto_median_abs_error <= 0.027);
    CHECK(s.auto_p90_abs_error <= 0.12);
  }
  // The uncertainty band (core/band.h) is scored as the held-out cases will score it: each published case's measured
  // value against the band its nearest *other* cases give it (leave-one-out), on the statistic the source measured.
  // Reached (docs/validation.md): 192 of 213 cases (90%), excluded and low-confidence ones included; 136 of the 143
  // counted cases (95%); median width (top over bottom) 35%. The band aims at 80% (kBandNeighbours). The floors are what is
  // reached less about five points, and the width may not grow past what is reached plus a few points, so that coverage
  // cannot be bought by widening every band.
  SECTION("uncertainty band: leave-one-out coverage of the published cases") {
    const ValidationSummary& s = published();
    REQUIRE(s.band_cases >= 85);
    REQUIRE(s.band_counted_cases >= 70);
    INFO(s.band_inside << " of " << s.band_cases << "; counted " << s.band_counted_inside << " of " << s.band_counted_cases
                       << "; median width " << s.band_median_width);
    CHECK(s.band_inside >= 0.85 * s.band_cases);
    CHECK(s.band_counted_inside >= 0.90 * s.band_counted_cases);
    CHECK(s.band_median_width <= 0.40);
    for (const auto& r : s.rows)
      if (r.band_ok) {
        INFO(r.vcase.id);
        CHECK(r.band_low_bytes <= r.predicted_bytes);
        CHECK(r.predicted_bytes <= r.band_high_bytes);
      }
  }
}

// memsim's own calibration runs (tools/calibrate on an H200, tests/validation/measured/): every statistic of
// every config is known, so the bounds are tight. Reached: allocated median 0.2%, worst 2.4%; reserved median
// 1.0%, worst 17.9% (four configs off by 6-18%, each on whether a multi-GiB request finds a cached block; see
// tests/validation/measured/README.md).
static std::vector<ValidationCase> load_measured(const std::string& statistic) {
  std::vector<std::filesystem::path> folders;
  for (const auto& run : std::filesystem::directory_iterator(source_path("tests/validation/measured")))
    if (run.is_directory() && std::filesystem::is_directory(run.path() / statistic)) folders.push_back(run.path() / statistic);
  return parse_cases(folders);
}

TEST_CASE("calibration runs: allocated and reserved against memsim", "[validation][calibration]") {
  ValidationSummary a = run_validation(load_measured("allocated"));
  REQUIRE(a.counted >= 24);
  for (const auto& r : a.rows) {
    INFO(r.vcase.id << ": " << 100 * r.relative_error << "%");
    CHECK(r.ok);
    CHECK(std::abs(r.relative_error) < 0.04);
  }
  CHECK(a.median_abs_error <= 0.01);
  ValidationSummary res = run_validation(load_measured("reserved"));
  REQUIRE(res.counted >= 24);
  for (const auto& r : res.rows) {
    INFO(r.vcase.id << ": " << 100 * r.relative_error << "%");
    CHECK(std::abs(r.relative_error) < 0.20);
  }
  CHECK(res.median_abs_error <= 0.013);
}

// A case file is input like any other: bounded before it is parsed (an 80,000-level nesting crashed nlohmann's dump),
// and its measurement must be a positive, finite number of GiB.
TEST_CASE("a hostile or nonsensical case file is refused with the field named, never a crash", "[validation]") {
  auto refused = [](const std::string& text, const std::string& field) {
    ValidationCase vc;
    std::vector<FieldError> errors;
    CHECK_FALSE(parse_validation_case(text, vc, errors));
    bool named = false;
    for (const auto& e : errors) named = named || e.field == field;
    INFO(text.substr(0, 120));
    CHECK(named);
  };
  const std::string deep = std::string(80000, '[') + std::string(80000, ']');
  refused(deep, "case");
  refused(R"({"id":"x","confidence":"high","statistic":"allocated","source":"s","measured_gib":1,"config":)" +
              std::string(80000, '[') + std::string(80000, ']') + "}",
          "case");
  const std::string head = R"({"id":"x","confidence":"high","statistic":"allocated","source":"s","config":{},)";
  for (const char* gib : {"0", "-5", "1e308", "\"12\""}) refused(head + R"("measured_gib":)" + gib + "}", "measured_gib");
  refused(R"({"id":"x","confidence":"sure","statistic":"allocated","source":"s","config":{},"measured_gib":1})",
          "confidence");
}
