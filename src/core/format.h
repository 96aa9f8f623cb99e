// Formatting numbers for people, used only at the edges (CLI table, interface labels).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace memsim {

enum class Unit { GiB, GB, MiB };
std::string format_bytes(int64_t bytes, Unit unit = Unit::GiB, int decimals = 2);
std::string format_count(int64_t n);  // 8,030,261,248
std::string format_params(int64_t n); // 8.03B

struct RunTrace;
struct ModelStates;
struct DeviceResult;
struct Result;

// The words of the two figures a model state has (result.h at_peak_bytes, kept_bytes), the same in every view.
inline constexpr const char* kAtPeakWords = "at the peak";
inline constexpr const char* kKeptWords = "kept between steps";
// The header's model states: "kept between steps, per GPU: weights 3.03 GiB, gradients 3.03 GiB, optimizer 18.18 GiB"
// (the same figures as the breakdown table's kept column).
std::string describe_kept(const ModelStates& m, Unit unit = Unit::GiB, int decimals = 2);
// The rows of a device's breakdown, in the stacked bar's order: each component, then the allocator's cache, the CUDA
// context and NCCL's buffers (when there are any); their at_peak_bytes add up to the nvidia-smi peak. kept_bytes is
// the model state kept between steps (describe_kept's figure), -1 for a row that is not a model state.
struct BreakdownRow {
  const char* label;
  int64_t at_peak_bytes;
  int64_t kept_bytes;
  // A component only some setups have (the reference model, generation) that this one has none of: the tables
  // leave it out; the row keeps its place, so that each component keeps its colour.
  bool absent = false;
};
std::vector<BreakdownRow> breakdown_rows(const DeviceResult& d);
// The verdict's statistic against the usable memory, naming the headroom: "48.62 GiB (nvidia-smi) of 72.00 GiB usable
// (80.00 GiB less 10% headroom)".
std::string describe_usable(const DeviceResult& d, Unit unit = Unit::GiB, int decimals = 2);
// Its second half: "72.00 GiB usable (80.00 GiB less 10% headroom)".
std::string describe_headroom(const DeviceResult& d, Unit unit = Unit::GiB, int decimals = 2);
// Each statistic's peak, the verdict's named: "allocated peak 39.05 GiB | reserved peak 48.09 GiB | nvidia-smi peak
// 48.62 GiB (the verdict's)".
std::string describe_peaks(const DeviceResult& d, Unit unit = Unit::GiB, int decimals = 2);
// The device whose verdict is worst (out of memory, does not fit, borderline, fits), the largest peak over its usable
// memory among equals; nullptr when there is none.
const DeviceResult* worst_device(const Result& r);
// Where a run of varying shapes (result.h RunTrace) has its peak, in one line for the verdict and the CLI's table:
// "peak at step 170 of 1,000, the longest batch (1,100 tokens); reserved grew from 20.10 GiB after step 1 to
// 24.30 GiB (step 512)". "" for a fixed shape.
std::string describe_run(const RunTrace& run, Unit unit = Unit::GiB, int decimals = 2);

}  // namespace memsim
