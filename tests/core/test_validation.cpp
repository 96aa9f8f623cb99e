// Published measured peaks (tests/validation/cases, from ../shared/validation/cases.jsonl) against the
// simulator, each compared with the statistic its source measured.
//
// Targets of the step-simulator issue: median absolute error <= 5% over the high- and medium-confidence
// single-GPU cases, and no high-confidence case beyond 15%; fine-tuning cases (LoRA/QLoRA) 7%. Reached now
// (docs/validation.md): median 7.8% over all counted cases; two high-confidence torchtune rows with torch.compile
// and no checkpointing are over-predicted by about 25% (Inductor's recomputation inside the layers is not
// modelled), the BERT batch-4 runs are 10-14% under, and the litgpt NF4 runs about 20% under.
// The bounds below guard what is reached, so a regression fails; tighten them as the model improves.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>

#include "core/validation.h"
#include "test_util.h"

using namespace memsim;

static std::vector<ValidationCase> load_cases() {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(source_path("tests/validation/cases")))
    if (e.path().extension() == ".json") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  std::vector<ValidationCase> cases;
  for (const auto& f : files) {
    ValidationCase c;
    std::vector<FieldError> errors;
    INFO(f << ": " << (errors.empty() ? "" : errors[0].message));
    REQUIRE(parse_validation_case(read_file(f), c, errors));
    cases.push_back(c);
  }
  return cases;
}

TEST_CASE("every validation case parses and simulates", "[validation]") {
  auto cases = load_cases();
  REQUIRE(cases.size() >= 10);
  ValidationSummary s = run_validation(cases);
  for (const auto& r : s.rows) {
    INFO(r.vcase.id << ": " << r.error);
    CHECK(r.ok);
  }
}

TEST_CASE("single-GPU measured peaks: median and worst error", "[validation]") {
  ValidationSummary s = run_validation(load_cases());
  REQUIRE(s.counted >= 7);
  for (const auto& r : s.rows) {
    INFO(r.vcase.id);
    CHECK(r.bound_met);  // an OOM the source saw must come out above the card's memory
    if (!r.vcase.excluded.empty() || r.vcase.confidence == "low" || r.vcase.lower_bound) continue;
    INFO(r.vcase.id << ": " << 100 * r.relative_error << "%");
    CHECK(std::abs(r.relative_error) < 0.30);
  }
  CHECK(s.median_abs_error <= 0.08);
  CHECK(s.worst_high_abs_error < 0.30);
}

// Target of the distributed issue: median absolute error <= 8% over the high- and medium-confidence multi-GPU
// cases. Reached now (docs/validation.md): 14.1%, every torchtitan case under-predicted by 8-19% (reserved
// memory); see the findings there. The bounds guard what is reached.
TEST_CASE("multi-GPU measured peaks: median and worst error", "[validation][distributed]") {
  ValidationSummary s = run_validation(load_cases());
  REQUIRE(s.multi_counted >= 5);
  for (const auto& r : s.rows) {
    if (!is_multi_gpu(r.vcase.config) || !r.vcase.excluded.empty() || r.vcase.confidence == "low" || r.vcase.lower_bound) continue;
    INFO(r.vcase.id << ": " << 100 * r.relative_error << "%");
    CHECK(std::abs(r.relative_error) < 0.22);
  }
  CHECK(s.multi_median_abs_error <= 0.15);
}
