// Published measurements expressed as memsim configs (tests/validation/cases/*.json), compared against the
// statistic each source measured. Used by the validation test and by `memsim-cli validate`, which writes
// docs/validation.md.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "band.h"
#include "config.h"
#include "validate.h"

namespace memsim {

struct ValidationCase {
  std::string id;           // the case id in ../shared/validation/cases.jsonl
  std::string confidence;   // high, medium, low
  std::string statistic;    // allocated, reserved, active, device
  int64_t measured_bytes = 0;
  std::string source;
  std::string notes;
  std::vector<std::pair<std::string, std::string>> inferred;  // field -> why this value
  std::string excluded;     // non-empty: a finding, kept out of the error statistics, with the reason
  bool lower_bound = false; // the source saw an OOM: the true peak is above measured_bytes (a pass/fail check)
  bool upper_bound = false; // the source says it fits: the true peak is at most measured_bytes (the card; pass/fail)
  bool bound() const { return lower_bound || upper_bound; }
  // The case's first score: memsim's error when the case was added, before any model change it motivated
  // (first_score in the case file). Kept so that the report shows what the model got right unaided.
  bool has_first_score = false;
  double first_error = 0;
  std::string first_score_memsim;  // the memsim commit that scored it
  Config config;
};

struct ValidationRow {
  ValidationCase vcase;
  bool ok = false;
  std::string error;        // why it could not be simulated
  int64_t predicted_bytes = 0;
  double relative_error = 0;  // (predicted - measured) / measured
  std::string peak_phase;
  bool bound_met = true;    // bound cases: predicted above a lower bound, at most an upper one
  // The uncertainty band of the statistic measured, as the nearest other cases give it (leave-one-out: the case is
  // left out of its own neighbours), and whether the measured value falls inside it. Not for lower bounds.
  bool band_ok = false;
  int64_t band_low_bytes = 0;
  int64_t band_high_bytes = 0;
  bool inside_band = false;
};

struct ValidationSummary {
  std::vector<ValidationRow> rows;
  // Single-GPU cases (the step-simulator issue's targets) and multi-GPU ones (the distributed issue's) apart.
  int counted = 0;                 // high + medium, not excluded
  double median_abs_error = 0;     // over the counted cases
  double worst_high_abs_error = 0; // over the high-confidence counted cases
  // The single-GPU cases that fine-tune with a PEFT method (the fine-tuning issue's 7% target), counted as above.
  int peft_counted = 0;
  double peft_median_abs_error = 0;
  double peft_worst_high_abs_error = 0;
  // The counted cases (single and several GPUs) of families written as model programs (model.architecture): the
  // families beyond decoder LLMs, reported apart.
  int program_counted = 0;
  double program_median_abs_error = 0;
  // The counted cases (single and several GPUs) of preference objectives (training.objective dpo, orpo, simpo, kto).
  int preference_counted = 0;
  double preference_median_abs_error = 0;
  int multi_counted = 0;
  double multi_median_abs_error = 0;
  double multi_worst_high_abs_error = 0;
  // Every high- and medium-confidence case, single and multi GPU, the excluded findings included (lower bounds,
  // which have no error, are not): how memsim does on everything published, not only on what it explains.
  int all_counted = 0;
  double all_median_abs_error = 0;
  double all_p90_abs_error = 0;
  double all_within_10pct = 0;  // fraction of those cases within 10%
  // The same cases with every version-derived switch that the case file sets by hand put back to auto, so that the
  // stated versions (or latest) decide it as they do for a user who knows only the versions (frameworks.h Switch).
  int auto_cases_changed = 0;  // of all_counted, the cases that set at least one switch by hand
  int auto_cases_dated = 0;    // of those, the ones that state a library version or a date (the rest take latest)
  double auto_median_abs_error = 0;
  double auto_p90_abs_error = 0;
  double auto_within_10pct = 0;
  // Leave-one-out coverage of the band: over every case with an error (all confidences, excluded ones included),
  // and over the counted ones (high and medium confidence, not excluded, single and multi GPU together).
  int band_cases = 0;
  int band_inside = 0;
  int band_counted_cases = 0;
  int band_counted_inside = 0;
  double band_median_width = 0;  // median of high / low - 1 over band_cases
};

bool is_multi_gpu(const Config& c);

// Parses one case file; errors name the field.
bool parse_validation_case(std::string_view text, ValidationCase& out, std::vector<FieldError>& errors);
ValidationSummary run_validation(const std::vector<ValidationCase>& cases);
// The residual table of a validation run (band.h): every case with an error, in the run's order.
std::vector<ResidualRow> residual_rows(const ValidationSummary& s);
std::string validation_markdown(const ValidationSummary& s);
// A section for memsim's own calibration runs (tools/calibrate), one folder of case files of one statistic.
std::string calibration_markdown(const ValidationSummary& s, std::string_view folder);

}  // namespace memsim
