// The output of one simulation: per distinct device role, the peak under each statistic, the breakdown at
// the peak, the timeline of the step, and the fit verdict. Everything here comes from one replay.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "band.h"
#include "step.h"
#include "validate.h"

namespace memsim {

struct Peak {
  int64_t allocated_bytes = 0;  // torch.cuda.max_memory_allocated
  int64_t reserved_bytes = 0;   // torch.cuda.max_memory_reserved
  int64_t active_bytes = 0;     // memory_stats()["active_bytes.all.peak"]
  int64_t requested_bytes = 0;  // memory_stats()["requested_bytes.all.peak"]: before 512-byte rounding
  int64_t device_bytes = 0;     // what nvidia-smi shows: reserved + CUDA context + other non-allocator memory
};

// One sample per event: what the allocator holds right after it.
struct TimelinePoint {
  int64_t allocated_bytes;
  int64_t reserved_bytes;
};

struct Breakdown {
  std::array<int64_t, kComponentCount> allocator{};  // live bytes per component at the allocated peak
  int64_t fragmentation_bytes = 0;  // max reserved - max allocated: cached but unused
  int64_t cuda_context_bytes = 0;   // outside the allocator
  int64_t nccl_bytes = 0;           // NCCL's own buffers, also outside the allocator (cudaMalloc by NCCL)
  int64_t total() const;            // equals Peak::device_bytes
};

struct ModelStates {  // per device, bytes of the persistent model states (before allocator rounding)
  int64_t weights_bytes = 0;
  int64_t gradients_bytes = 0;
  int64_t optimizer_bytes = 0;  // states plus the fp32 master copy
  int64_t other_models_bytes = 0;  // frozen models beside the policy: the reference copy (Component::OtherModels)
};

// A run of varying shapes (DataConfig), step by step: what the allocator held as the run went on.
struct RunStepPoint {
  int64_t tokens = 0;           // the step's longest micro-batch, in tokens per row
  int64_t allocated_bytes = 0;  // the step's allocated peak
  int64_t reserved_bytes = 0;   // the step's reserved peak (the cache carried over from earlier steps included)
};
struct RunTrace {
  int64_t steps = 0;                   // optimizer steps replayed; 0: a fixed shape (two steps replayed, no run)
  std::vector<RunStepPoint> per_step;  // one per step
  int64_t allocated_peak_step = 0;     // steps count from 1
  int64_t reserved_peak_step = 0;      // the first step whose reserved peak is the run's
  int64_t longest_step = 0;            // the step holding the run's longest sample
  int64_t longest_tokens = 0;
  int64_t first_step_reserved_bytes = 0;  // reserved peak of step 1: the run's growth is measured from it
  int64_t empty_cache_calls = 0;       // torch.cuda.empty_cache() calls replayed (training.empty_cache_steps)
  // The orders of the data replayed (data_shape.h run_shuffles; the result is the median's), and the lowest and
  // highest reserved peak among them (each without a capacity limit).
  int64_t shuffles = 0;
  int64_t shuffle_reserved_low_bytes = 0, shuffle_reserved_high_bytes = 0;
  int64_t shuffle_allocated_high_bytes = 0;  // the highest allocated peak among them (padding-free runs differ most)
};

struct DeviceResult {
  std::string role;       // "every GPU" for symmetric layouts; pipeline stages etc. later
  int64_t device_count = 1;
  // The GPU's memory is an engine's share, claimed by design (the vLLM server's GPUs, vllm_server.h): its band is that
  // share, it keeps no headroom, and it is the worst device, the one a verdict line names, only where its verdict is
  // worse than the training GPUs'; What helps counts it for the verdict, not the peak.
  bool fixed_share = false;
  // A vLLM engine on this GPU that would not start (the server's, or one colocated with training): its failing start
  // check in a few words ("" when it starts); the verdict is then does-not-fit.
  std::string refusal;
  ModelStates model_states;
  Peak peak;
  Breakdown breakdown;
  uint32_t peak_event = 0;           // event index of the allocated peak
  std::string peak_phase;            // phase containing it
  std::string peak_label;            // tensor whose allocation made the peak
  int64_t capacity_bytes = 0;        // the GPU's total memory
  int64_t usable_bytes = 0;          // capacity minus headroom
  bool fits = false;                 // device peak within usable memory and no OOM in the replay
  // The uncertainty band of every statistic (band.h) and the verdict that uses it: fits only when the band's top fits.
  Band band;
  Verdict verdict = Verdict::DoesNotFit;
  bool oom = false;                  // the step runs out of memory even after the allocator frees its cache
  uint32_t oom_event = 0;            // where it does (the peak and breakdown then show the unlimited demand)
  int64_t host_bytes = 0;            // offloaded model states this GPU keeps in host RAM
  int64_t nvme_bytes = 0;            // ... and on NVMe (ZeRO-Infinity)
  // The timeline of the step (a run: of the step that holds the allocated peak, after one event per tensor that
  // the earlier steps left alive) and the events behind it (labels, phases, tensors).
  std::vector<TimelinePoint> timeline;
  StepProgram program;
  RunTrace run;                      // a run of varying shapes, step by step
};

// The figures the views show, defined once so that every place agrees (the results header and table, the bar, the
// timeline, the verdict, the CLI's table). Two figures per model state, each with its own words:
// - "at the peak": a component's bytes alive at the allocated peak (Breakdown::allocator, what the bar stacks);
// - "kept between steps": the model states a GPU holds from one step to the next (ModelStates, before the
//   allocator's rounding). At the peak a component can hold more (the full gradients of the layers in backward before
//   they are reduced into the shard) or less (a peak in the first forward, before any gradient exists).
inline int64_t at_peak_bytes(const DeviceResult& d, Component c) {
  return d.breakdown.allocator[static_cast<size_t>(c)];
}
// The model state a component keeps between steps; -1 for a component that is not a model state.
inline int64_t kept_bytes(const ModelStates& m, Component c) {
  switch (c) {
    case Component::Weights: return m.weights_bytes;
    case Component::Gradients: return m.gradients_bytes;
    case Component::OptimizerStates: return m.optimizer_bytes;
    case Component::OtherModels: return m.other_models_bytes > 0 ? m.other_models_bytes : -1;  // a setup without one
    default: return -1;
  }
}
// The share of the GPU kept free (hardware.headroom_fraction), as the replay applied it: usable = capacity * (1 - it).
inline double headroom_fraction(const DeviceResult& d) {
  return d.capacity_bytes > 0 ? 1.0 - static_cast<double>(d.usable_bytes) / static_cast<double>(d.capacity_bytes) : 0.0;
}

// Host RAM that offload needs on each node, next to the node's RAM when the config gives it.
struct HostMemory {
  int64_t per_node_bytes = 0;        // sum over the GPUs of one node (the node with the largest need)
  int64_t nvme_per_node_bytes = 0;
  int64_t capacity_bytes = 0;        // hardware.host_memory_bytes; 0: not given, no verdict
  int64_t gpus_per_node = 0;
  int64_t nodes = 0;
  bool fits = true;
};

struct Result {
  bool ok = false;
  std::vector<FieldError> errors;  // non-empty when !ok
  int64_t params_total = 0;
  int64_t params_trainable = 0;
  ModelStates model_states;  // of the first device (every device's is in devices[i].model_states)
  std::vector<DeviceResult> devices;
  HostMemory host;
  std::vector<std::string> notes;  // assumptions the user should know about
};

}  // namespace memsim
