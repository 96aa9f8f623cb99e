#include "format.h"

#include <cmath>
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

std::string describe_kept(const ModelStates& m, Unit unit, int decimals) {
  return std::string(kKeptWords) + ", per GPU: weights " + format_bytes(m.weights_bytes, unit, decimals) + ", gradients " +
         format_bytes(m.gradients_bytes, unit, decimals) + ", optimizer " + format_bytes(m.optimizer_bytes, unit, decimals) +
         (m.other_models_bytes > 0 ? ", other models " + format_bytes(m.other_models_bytes, unit, decimals) : std::string());
}

std::vector<BreakdownRow> breakdown_rows(const DeviceResult& d) {
  std::vector<BreakdownRow> rows;
  for (int i = 0; i < kComponentCount; ++i) {
    const auto c = static_cast<Component>(i);
    const bool optional = c == Component::OtherModels || c == Component::Generation;
    const int64_t kept = kept_bytes(d.model_states, c);
    rows.push_back({component_label(c), at_peak_bytes(d, c), kept, optional && at_peak_bytes(d, c) == 0 && kept <= 0});
  }
  rows.push_back({"Allocator cache (reserved, unused)", d.breakdown.fragmentation_bytes, -1});
  rows.push_back({"CUDA context (outside the allocator)", d.breakdown.cuda_context_bytes, -1});
  if (d.breakdown.nccl_bytes > 0) rows.push_back({"NCCL buffers (outside the allocator)", d.breakdown.nccl_bytes, -1});
  return rows;
}

std::string describe_headroom(const DeviceResult& d, Unit unit, int decimals) {
  // An engine's claimed share (core/result.h fixed_share) keeps no headroom: the engine sizes itself to the GPU.
  if (d.fixed_share) return format_bytes(d.usable_bytes, unit, decimals) + " (the whole GPU: vLLM sizes its share to it)";
  // The headroom as a person set it (10%, 12.5%): at most one decimal, none when it is whole.
  const double pct = std::round(headroom_fraction(d) * 1000.0) / 10.0;
  char headroom[32];
  std::snprintf(headroom, sizeof headroom, pct == std::floor(pct) ? "%.0f%%" : "%.1f%%", pct);
  return format_bytes(d.usable_bytes, unit, decimals) + " usable (" + format_bytes(d.capacity_bytes, unit, decimals) + " less " +
         headroom + " headroom)";
}

std::string describe_usable(const DeviceResult& d, Unit unit, int decimals) {
  return format_bytes(d.peak.device_bytes, unit, decimals) + " (nvidia-smi) of " + describe_headroom(d, unit, decimals);
}

std::string describe_peaks(const DeviceResult& d, Unit unit, int decimals) {
  return "allocated peak " + format_bytes(d.peak.allocated_bytes, unit, decimals) + " | reserved peak " +
         format_bytes(d.peak.reserved_bytes, unit, decimals) + " | nvidia-smi peak " +
         format_bytes(d.peak.device_bytes, unit, decimals) + " (the verdict's)";
}

const DeviceResult* worst_device(const Result& r) {
  const DeviceResult* worst = nullptr;
  for (const auto& d : r.devices) {
    if (!worst || d.verdict > worst->verdict ||
        (d.verdict == worst->verdict && !d.fixed_share &&
         (worst->fixed_share || d.peak.device_bytes - d.usable_bytes > worst->peak.device_bytes - worst->usable_bytes)))
      worst = &d;
  }
  return worst;
}

}  // namespace memsim
