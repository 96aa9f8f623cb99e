// The number of GPUs, as users state their question ("QLoRA of a 70B on one A100"), over the layout memsim
// simulates: data parallel follows from GPUs / (tensor x pipeline x context parallel). The config stores
// data_parallel_size, as every link and config file has; the count a user asked for is kept apart
// (ParallelConfig::gpus) only while the layout cannot run on it, so that the page shows the problem under the field
// and keeps every other setting.
#pragma once
#include <cstdint>
#include <optional>

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

}  // namespace memsim
