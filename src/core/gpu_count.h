// The number of GPUs, as users state their question ("QLoRA of a 70B on one A100"), over the layout memsim
// simulates: data parallel follows from GPUs / (tensor x pipeline x context parallel). The config stores
// data_parallel_size, as every link and config file has; the count a user asked for is kept apart
// (ParallelConfig::gpus) only while the layout cannot run on it, so that the page shows the problem under the field
// and keeps every other setting.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "config.h"
#include "validate.h"

namespace memsim {

// GPUs of one data-parallel replica: tensor x pipeline x context parallel.
int64_t replica_gpus(const ParallelConfig& p);
// The GPUs the setup asks for: the pending count when there is one, otherwise data x tensor x pipeline x context.
int64_t gpu_count(const ParallelConfig& p);
// Puts the layout on `gpus` GPUs: data parallel = gpus / replica_gpus and no pending count; when the replica does
// not divide `gpus` (or it is below 1), data parallel is kept and the count is held as pending (gpu_count_error).
void set_gpu_count(ParallelConfig& p, int64_t gpus);
// After an edit of the layout from `before` to `after`: a changed data parallel is a new GPU count (any pending one
// is dropped); a changed tensor, pipeline or context parallel keeps the GPU count of `before`, so data parallel
// follows (or the count becomes pending when they do not divide it).
void keep_gpu_count(const ParallelConfig& before, ParallelConfig& after);
// The problem with a pending count, on the field "parallel.gpus", naming what is allowed; empty when there is none.
std::optional<FieldError> gpu_count_error(const ParallelConfig& p);
// Nodes the GPUs take: ceil(gpus / hardware.gpus_per_node).
int64_t node_count(const Config& c);

// ---- definitions (header-only: small, and the core's file list stays as it is) ----

namespace gpu_count_detail {
constexpr int64_t kMaxGpus = int64_t(1) << 30;  // validate.cpp caps the world at 1e9 GPUs

// a x b, or kMaxGpus + 1 when it is larger: the layout's fields are validated elsewhere; this must only not overflow.
inline int64_t capped_mul(int64_t a, int64_t b) {
  if (a <= 0 || b <= 0) return 0;
  return a > (kMaxGpus + 1) / b ? kMaxGpus + 1 : a * b;
}
}  // namespace gpu_count_detail

inline int64_t replica_gpus(const ParallelConfig& p) {
  return gpu_count_detail::capped_mul(gpu_count_detail::capped_mul(p.tensor_parallel_size, p.pipeline_parallel_size), p.context_parallel_size);
}

inline int64_t gpu_count(const ParallelConfig& p) {
  return p.gpus ? *p.gpus : gpu_count_detail::capped_mul(p.data_parallel_size, replica_gpus(p));
}

inline void set_gpu_count(ParallelConfig& p, int64_t gpus) {
  const int64_t replica = replica_gpus(p);
  if (gpus >= 1 && gpus <= gpu_count_detail::kMaxGpus && replica >= 1 && gpus % replica == 0) {
    p.data_parallel_size = gpus / replica;
    p.gpus.reset();
  } else {
    p.gpus = gpus;
  }
}

inline void keep_gpu_count(const ParallelConfig& before, ParallelConfig& after) {
  if (after.data_parallel_size != before.data_parallel_size) {
    after.gpus.reset();
    return;
  }
  if (after.gpus != before.gpus) return;  // the count itself was set (set_gpu_count)
  if (replica_gpus(after) != replica_gpus(before)) set_gpu_count(after, gpu_count(before));
}

inline std::optional<FieldError> gpu_count_error(const ParallelConfig& p) {
  if (!p.gpus) return std::nullopt;
  const int64_t g = *p.gpus, r = replica_gpus(p);
  const std::string G = std::to_string(g), R = std::to_string(r);
  if (g < 1 || g > gpu_count_detail::kMaxGpus)
    return FieldError{"parallel.gpus", "parallel.gpus (GPUs) must be an integer from 1 to " + std::to_string(gpu_count_detail::kMaxGpus) +
                                           "; got " + G};
  if (r < 1) return std::nullopt;  // the parallel sizes have their own errors
  // The nearest counts the layout runs on, below and above.
  const int64_t below = g / r * r, above = below + r;
  std::string allowed = below >= 1 ? std::to_string(below) + " or " + std::to_string(above) : std::to_string(above);
  return FieldError{"parallel.gpus",
                    "parallel.gpus (GPUs): " + G + " GPUs do not split into data-parallel replicas of tensor x pipeline "
                    "x context parallel = " + R + " GPUs; allowed: a multiple of " + R + " (" + allowed +
                    "), or a layout whose product divides " + G};
}

inline int64_t node_count(const Config& c) {
  const int64_t g = gpu_count(c.parallel), per = c.hardware.gpus_per_node;
  return g < 1 || per < 1 ? 0 : (g + per - 1) / per;
}

}  // namespace memsim
