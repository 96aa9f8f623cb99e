// Formatting numbers for people, used only at the edges (CLI table, interface labels).
#pragma once
#include <cstdint>
#include <string>

namespace memsim {

enum class Unit { GiB, GB, MiB };
std::string format_bytes(int64_t bytes, Unit unit = Unit::GiB, int decimals = 2);
std::string format_count(int64_t n);  // 8,030,261,248
std::string format_params(int64_t n); // 8.03B

struct RunTrace;
// Where a run of varying shapes (result.h RunTrace) has its peak, in one line for the verdict and the CLI's table:
// "peak at step 170 of 1,000, the longest batch (1,100 tokens); reserved grew from 20.10 GiB after step 1 to
// 24.30 GiB (step 512)". "" for a fixed shape.
std::string describe_run(const RunTrace& run, Unit unit = Unit::GiB, int decimals = 2);

}  // namespace memsim
