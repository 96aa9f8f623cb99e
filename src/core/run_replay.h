// A run of varying shapes replayed step by step through one allocator model: the allocator's cache is carried from
// step to step, as on the GPU, and only one step's events are held at a time.
#pragma once
#include <cstdint>
#include <memory>

#include "data_shape.h"
#include "result.h"
#include "train_step.h"

namespace memsim {

// One pass of a run through one allocator model, a few steps at a time (the page fills a run in over frames).
// result() holds d.peak (allocated, reserved, requested, active), d.breakdown.allocator at the allocated peak,
// d.timeline and d.program (the step holding the allocated peak, after one event per tensor earlier steps left
// alive), the peak's event, phase and label, d.run, and d.oom when a request fails even after the cache is
// released (the pass ends there). allocator_capacity: what cudaMalloc can hand out; gpu_total_bytes sizes
// expandable segments' address space. `ctx` and `plan` must outlive the pass.
class RunReplay {
 public:
  RunReplay(const StepContext& ctx, const RunPlan& plan, int64_t allocator_capacity, bool expandable,
            int64_t gpu_total_bytes);
  ~RunReplay();
  bool advance(int64_t max_steps);  // true once the pass is over: every step replayed, or an OOM
  int64_t steps_done() const;
  DeviceResult& result();

  struct Pass;  // the pass over one allocator model (run_replay.cpp)

 private:
  std::unique_ptr<Pass> pass_;
};

}  // namespace memsim
