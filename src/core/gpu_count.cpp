#include "gpu_count.h"

#include <string>

namespace memsim {

namespace {
constexpr int64_t kMaxGpus = int64_t(1) << 30;  // validate.cpp caps the world at 1e9 GPUs

// a x b, or kMaxGpus + 1 when it is larger: the layouts' fields are validated elsewhere, this must only not overflow.
int64_t capped_mul(int64_t a, int64_t b) {
  if (a <= 0 || b <= 0) return 0;
  return a > (kMaxGpus + 1) / b ? kMaxGpus + 1 : a * b;
}
}  // namespace

int64_t replica_gpus(const ParallelConfig& p) {
  return capped_mul(capped_mul(p.tensor_parallel_size, p.pipeline_parallel_size), p.context_parallel_size);
}

int64_t gpu_count(const ParallelConfig& p) {
  return p.gpus ? *p.gpus : capped_mul(p.data_parallel_size, replica_gpus(p));
}

void set_gpu_count(ParallelConfig& p, int64_t gpus) {
  const int64_t replica = replica_gpus(p);
  if (gpus >= 1 && gpus <= kMaxGpus && replica >= 1 && gpus % replica == 0) {
    p.data_parallel_size = gpus / replica;
    p.gpus.reset();
  } else {
    p.gpus = gpus;
  }
}

void keep_gpu_count(const ParallelConfig& before, ParallelConfig& after) {
  if (after.data_parallel_size != before.data_parallel_size) {
    after.gpus.reset();
    return;
  }
  if (after.gpus != before.gpus) return;  // the count itself was set (set_gpu_count)
  if (replica_gpus(after) != replica_gpus(before)) set_gpu_count(after, gpu_count(before));
}

std::optional<FieldError> gpu_count_error(const ParallelConfig& p) {
  if (!p.gpus) return std::nullopt;
  const int64_t g = *p.gpus, r = replica_gpus(p);
  const std::string G = std::to_string(g), R = std::to_string(r);
  if (g < 1 || g > kMaxGpus)
    return FieldError{"parallel.gpus", "parallel.gpus (GPUs) must be an integer from 1 to " + std::to_string(kMaxGpus) +
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

int64_t node_count(const Config& c) {
  const int64_t g = gpu_count(c.parallel), per = c.hardware.gpus_per_node;
  return g < 1 || per < 1 ? 0 : (g + per - 1) / per;
}

}  // namespace memsim
