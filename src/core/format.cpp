#include "format.h"

#include <cstdio>

#include "result.h"

namespace memsim {

std::string format_bytes(int64_t bytes, Unit unit, int decimals) {
  double v = static_cast<double>(bytes);
  const char* name = "GiB";
  switch (unit) {
    case Unit::GiB: v /= 1024.0 * 1024.0 * 1024.0; name = "GiB"; break;
    case Unit::GB: v /= 1e9; name = "GB"; break;
    case Unit::MiB: v /= 1024.0 * 1024.0; name = "MiB"; break;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f %s", decimals, v, name);
  return buf;
}

std::string format_count(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string format_params(int64_t n) {
  char buf[64];
  double v = static_cast<double>(n);
  if (v >= 1e12) std::snprintf(buf, sizeof buf, "%.2fT", v / 1e12);
  else if (v >= 1e9) std::snprintf(buf, sizeof buf, "%.2fB", v / 1e9);
  else if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.1fM", v / 1e6);
  else std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(n));
  return buf;
}

std::string describe_run(const RunTrace& run, Unit unit, int decimals) {
  const auto at = [&](int64_t step) -> const RunStepPoint& { return run.per_step[static_cast<size_t>(step - 1)]; };
  auto valid = [&](int64_t step) { return step >= 1 && step <= static_cast<int64_t>(run.per_step.size()); };
  if (run.steps <= 0 || !valid(run.allocated_peak_step) || !valid(run.reserved_peak_step)) return "";
  std::string s = "peak at step " + format_count(run.allocated_peak_step) + " of " + format_count(run.steps) + ", ";
  const int64_t tokens = at(run.allocated_peak_step).tokens;
  if (run.allocated_peak_step == run.longest_step)
    s += "the longest batch (" + format_count(tokens) + " tokens)";
  else if (tokens >= run.longest_tokens)  // truncation or padding to max length makes many batches as long
    s += "a batch as long as the longest (" + format_count(tokens) + " tokens; the longest sample is in step " +
         format_count(run.longest_step) + ")";
  else
    s += "a batch of " + format_count(tokens) + " tokens (the longest, " + format_count(run.longest_tokens) +
         " tokens, is in step " + format_count(run.longest_step) + ")";
  const int64_t reserved = at(run.reserved_peak_step).reserved_bytes;
  if (reserved > run.first_step_reserved_bytes)
    s += "; reserved grew from " + format_bytes(run.first_step_reserved_bytes, unit, decimals) + " after step 1 to " +
         format_bytes(reserved, unit, decimals) + " (step " + format_count(run.reserved_peak_step) + ")";
  else
    s += "; reserved stayed at " + format_bytes(reserved, unit, decimals) + " from step 1";
  if (run.empty_cache_calls > 0)
    s += "; torch.cuda.empty_cache() ran " + format_count(run.empty_cache_calls) + (run.empty_cache_calls == 1 ? " time" : " times");
  return s;
}

}  // namespace memsim
