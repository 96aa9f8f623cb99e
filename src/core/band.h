// The uncertainty band of a prediction, and the verdict that uses it.
//
// memsim's error is known where it has been measured: tests/validation/cases holds published peaks expressed as
// memsim configs, and `memsim-cli validate --residuals` writes each case's relative error with the features that
// describe it (src/core/catalog/residuals.tsv, embedded at build time like the model catalogue). A config's band
// comes from the cases nearest to it: for each statistic, the nearest kBandNeighbours cases by a points score
// (the statistic's kind counts most, then framework, PEFT method, base quantization and layout), whose smallest
// and largest errors turn the prediction p into [p / (1 + e_max), p / (1 + e_min)], since measured =
// predicted / (1 + e). The band is never narrower than one command measured on two machines (kNoiseFloor). What
// the config leaves unknown widens it by mechanism: an HF-style fine-tune that does not say its batches are of one
// length is replayed as a short run of varying lengths (simulate.cpp), whose reserved peak can raise the top.
//
// Nothing here is fitted: the points only order the cases, the band takes the neighbours' errors as they are, and
// docs/validation.md prints how often a case's measured value falls inside the band its neighbours give it
// (leave-one-out), so the figure can be checked, not tuned.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "config.h"

namespace memsim {

struct DeviceResult;
struct Result;

// The statistics a band covers, in the order of the JSON's keys. memsim's active equals its allocated (one stream,
// no record_stream), and device is reserved plus what sits outside the allocator: each pair shares its errors'
// causes, so a statistic's kind (what the tensors hold, or what the allocator holds) decides nearness first.
enum class BandStatistic { Allocated, Reserved, Active, Device };
constexpr int kBandStatistics = 4;
const char* band_statistic_id(BandStatistic s);  // "allocated", "reserved", "active", "device"
bool parse_band_statistic(std::string_view id, BandStatistic& out);

// What nearness compares: the features of a config that decide how memsim's error behaves.
struct BandFeatures {
  std::string framework;     // training.framework
  std::string peft;          // peft.method
  std::string quantization;  // peft.base_quantization
  std::string gpus;          // "single" or "multi"
  std::string sharding;      // none (zero_stage 0), deepspeed, fsdp1, fsdp2 or megatron; "+offload" when offloading
  std::string data;          // fixed or varying (data.lengths)
  std::string precision;     // training.precision
};
// Requires a validated config.
BandFeatures band_features(const Config& c);

// One row of the residual table: a published case, its error and its features.
struct ResidualRow {
  std::string id;
  BandStatistic statistic = BandStatistic::Allocated;
  std::string confidence;  // high, medium, low
  bool excluded = false;   // a finding the model cannot explain (kept in the band: see band.cpp)
  double relative_error = 0;  // (predicted - measured) / measured
  BandFeatures features;
};

// The table as text (tab-separated, one header line, '#' comments) and back. parse_residual_table skips nothing
// silently: a malformed line is an error naming the line, and the rows before it are kept.
std::string residual_table_text(const std::vector<ResidualRow>& rows);
std::vector<ResidualRow> parse_residual_table(std::string_view text, std::string* error = nullptr);
// The table embedded at build time (generated/residuals_data.cpp from src/core/catalog/residuals.tsv).
const std::vector<ResidualRow>& residual_table();
std::string_view residual_table_file();

// Enough neighbours for a stable band: under exchangeability a new measurement falls between the smallest and the
// largest of n earlier ones with probability (n - 1) / (n + 1) (the order-statistics argument behind conformal
// prediction), so the nearest 9 make a band that aims at 80%: a measurement falls outside it about one time in
// five. Cases tied with the 9th are all taken, so the band does not depend on the cases' order.
constexpr int kBandNeighbours = 9;
// The band is never narrower than measurement noise: torchtune PR #961 ran one command twice, 20.2 GB on one
// machine and 22.3 GB on a reviewer's A100 (tests/validation/cases/torchtune-llama2-7b-full-lowmem-bs4-pr961.json;
// ../shared/validation/README.md: "run-to-run spread is about +-10%"). A prediction between the two, at their
// geometric mean, is within a factor sqrt(22.3 / 20.2) = 1.0507 of either, so the band reaches at least
// p / 1.0507 below and p * 1.0507 above.
constexpr double kNoiseFloorRatio = 1.05070;  // sqrt(22.3 / 20.2) = 1.050695, rounded up

// An unstated data shape is replayed as a run of this many micro-batches (simulate.cpp replay_unstated_data). The
// bound is cost, not accuracy: a run of 8 micro-batches costs a few simulations of the fixed shape (which replays
// two steps and leaves out the second's repeated micro-batches), so the page can still simulate on every edit. A
// longer run can reserve more; the note says so.
constexpr int64_t kUnsetDataMicroBatches = 8;

struct BandNeighbour {
  std::string id;
  BandStatistic statistic = BandStatistic::Allocated;
  double relative_error = 0;
  bool excluded = false;
  int points = 0;
};

struct StatisticBand {
  int64_t low_bytes = 0;
  int64_t high_bytes = 0;
  double error_low = 0;   // the smallest neighbour error after the floor (measured = predicted / (1 + error))
  double error_high = 0;  // the largest
  std::vector<BandNeighbour> neighbours;
  int borrowed = 0;       // neighbours that measured the other statistic of the same kind
};

struct Band {
  bool valid = false;  // false: no table or no prediction (a band of [p, p] is not claimed)
  std::array<StatisticBand, kBandStatistics> stats{};
  // The unstated data shape's run (0: not replayed), or the highest of a run's orders of the data: its reserved and
  // device peaks, which raise the band's top.
  int64_t data_run_reserved_bytes = 0;
  int64_t data_run_device_bytes = 0;
  bool data_run_oom = false;
  // A run replayed in several orders of the data (simulate.cpp advance_run): the lowest order's peaks; 0: none.
  int64_t data_run_reserved_low_bytes = 0;
  int64_t data_run_device_low_bytes = 0;
  const StatisticBand& of(BandStatistic s) const { return stats[static_cast<size_t>(s)]; }
  StatisticBand& of(BandStatistic s) { return stats[static_cast<size_t>(s)]; }
};

// The verdict, with the band: fits only when the band's top of the device statistic is within the usable memory;
// borderline when the usable line falls inside the band; does not fit when the band's bottom is above it.
enum class Verdict { Fits, Borderline, DoesNotFit, OutOfMemory };
const char* verdict_id(Verdict v);     // fits, borderline, does_not_fit, out_of_memory
const char* verdict_words(Verdict v);  // FITS, BORDERLINE, DOES NOT FIT, OUT OF MEMORY

// Points of nearness between a config's features (and the statistic asked for) and one case.
int band_points(const BandFeatures& f, BandStatistic s, const ResidualRow& row);
// The nearest cases to `f` for statistic `s` (at least kBandNeighbours, all ties of the last one), leaving out the
// case `exclude_id` (leave-one-out), nearest first.
std::vector<BandNeighbour> nearest_cases(const BandFeatures& f, BandStatistic s, const std::vector<ResidualRow>& table,
                                         std::string_view exclude_id = {});
// The band of one device from the table (leaving out `exclude_id`), with its data-shape run already recorded in
// d.band (data_run_*). Does not change the peaks.
Band device_band(const BandFeatures& f, const DeviceResult& d, const std::vector<ResidualRow>& table,
                 std::string_view exclude_id = {});
Verdict device_verdict(const DeviceResult& d);  // from d.band and d.usable_bytes, d.oom
// The figure that replaces the 10-15% rule: the share of the GPU between the prediction and the band's top.
double keep_free_fraction(const DeviceResult& d);

// Every device's band and verdict, and the notes that say where the bands come from.
void apply_bands(Result& r, const Config& c, const std::vector<ResidualRow>& table, std::string_view exclude_id = {});

// Whether the config leaves its data shape unstated: an HF-style fine-tune (the HF Trainer or a plain loop over a
// transformers model, whose collators pad each batch to its longest sample) with data.lengths fixed and
// data.padding left at "longest". data.padding = max_length states that every batch is padded or packed to
// training.sequence_length.
bool data_shape_unstated(const Config& c);
// The run that stands for the unstated shape: kUnsetDataMicroBatches micro-batches of samples whose lengths are
// uniform from 1 to training.sequence_length (knowing only the longest, the least committal shape).
Config unstated_data_run(const Config& c);
// The shortest sample of that run: 1 token, or a vision-language model's image tokens and one more.
int64_t unstated_shortest_sample(const Config& c);

}  // namespace memsim
