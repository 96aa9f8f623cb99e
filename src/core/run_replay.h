// A run of varying shapes replayed step by step through one allocator model: the allocator's cache is carried from
// step to step, as on the GPU, and only one step's events are held at a time.
#pragma once
#include <cstdint>

#include "data_shape.h"
#include "result.h"
#include "train_step.h"

namespace memsim {

// Fills d.peak (allocated, reserved, requested, active), d.breakdown.allocator at the allocated peak, d.timeline and
// d.program (the step holding the allocated peak, after one event per tensor earlier steps left alive), the peak's
// event, phase and label, d.run, and d.oom when a request fails even after the cache is released.
// allocator_capacity: what cudaMalloc can hand out; gpu_total_bytes sizes expandable segments' address space.
void replay_run(const StepContext& ctx, const RunPlan& plan, DeviceResult& d, int64_t allocator_capacity,
                bool expandable, int64_t gpu_total_bytes);

}  // namespace memsim
