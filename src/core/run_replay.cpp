#include "run_replay.h"

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "allocator.h"

namespace memsim {

namespace {

int32_t request(CachingAllocator& a, int64_t bytes, int stream) { return a.malloc(bytes, -1, stream); }
int32_t request(ExpandableSegmentsAllocator& a, int64_t bytes, int stream) { return a.malloc(bytes, stream); }

struct StopRun {};  // the replay ran out of memory: the run ends there, as the real one would

template <class Allocator>
class RunReplayer {
 public:
  RunReplayer(Allocator& alloc, const RunPlan& plan, DeviceResult& d, int64_t empty_cache_steps)
      : alloc_(alloc), plan_(plan), device_(d), empty_cache_steps_(empty_cache_steps) {
    device_.run.steps = plan.steps;
    device_.run.per_step.reserve(static_cast<size_t>(plan.steps));
    device_.run.longest_step = plan.longest_step;
    device_.run.longest_tokens = plan.longest_tokens;
  }

  void on_step(StepProgram& p, int64_t step) {
    handle_.resize(p.tensors.size(), -1);
    const int64_t start_allocated = alloc_.allocated_bytes(), start_reserved = alloc_.reserved_bytes();
    timeline_.clear();
    int64_t step_allocated = 0, step_reserved = 0;
    int64_t peak_in_step = -1;
    const uint32_t n = static_cast<uint32_t>(p.events.size());
    for (uint32_t i = 0; i < n; ++i) {
      const Event& e = p.events[i];
      const int comp = static_cast<int>(e.component);
      if (e.op == Event::Op::Alloc) {
        const Tensor& t = p.tensors[e.tensor];
        const int32_t h = request(alloc_, t.bytes, static_cast<int>(t.stream));
        if (h < 0) {  // out of memory even after the cache went back to the driver
          device_.oom = true;
          peak_in_step = i;
          device_.peak_label = p.labels[t.label];
          timeline_.push_back({alloc_.allocated_bytes(), alloc_.reserved_bytes()});
          finish_step(p, step, std::max(step_allocated, alloc_.allocated_bytes()), step_reserved, peak_in_step,
                      start_allocated, start_reserved);
          throw StopRun{};
        }
        handle_[e.tensor] = h;
        live_[comp] += alloc_.block_bytes(h);
      } else if (e.op == Event::Op::EmptyCache) [[unlikely]] {
        alloc_.empty_cache();
      } else if (handle_[e.tensor] >= 0) {
        live_[comp] -= alloc_.block_bytes(handle_[e.tensor]);
        alloc_.free(handle_[e.tensor]);
        handle_[e.tensor] = -1;
      }
      const int64_t allocated = alloc_.allocated_bytes(), reserved = alloc_.reserved_bytes();
      timeline_.push_back({allocated, reserved});
      step_allocated = std::max(step_allocated, allocated);
      step_reserved = std::max(step_reserved, reserved);
      if (allocated > device_.peak.allocated_bytes) {
        device_.peak.allocated_bytes = allocated;
        device_.breakdown.allocator = live_;
        device_.run.allocated_peak_step = step;
        peak_in_step = i;
        device_.peak_label = p.labels[p.tensors[e.tensor].label];  // now: the id may name another tensor next step
      }
      device_.peak.requested_bytes = std::max(device_.peak.requested_bytes, alloc_.requested_bytes());
    }
    finish_step(p, step, step_allocated, step_reserved, peak_in_step, start_allocated, start_reserved);
    if (empty_cache_steps_ > 0 && step % empty_cache_steps_ == 0) {
      alloc_.empty_cache();
      ++device_.run.empty_cache_calls;
    }
    p.events.clear();
    p.phases.clear();
    p.recycle_freed_ids();
  }

 private:
  // The step's point of the run, and, if it holds the allocated peak so far, its timeline and program.
  void finish_step(const StepProgram& p, int64_t step, int64_t step_allocated, int64_t step_reserved,
                   int64_t peak_in_step, int64_t start_allocated, int64_t start_reserved) {
    int64_t tokens = 0;
    for (int64_t k = (step - 1) * plan_.gas; k < step * plan_.gas; ++k)
      tokens = std::max(tokens, plan_.micro_batches[static_cast<size_t>(k)].tokens);
    device_.run.per_step.push_back({tokens, step_allocated, step_reserved});
    if (step == 1) device_.run.first_step_reserved_bytes = step_reserved;
    if (step_reserved > device_.peak.reserved_bytes) device_.peak.reserved_bytes = step_reserved, device_.run.reserved_peak_step = step;
    if (peak_in_step >= 0) snapshot(p, step, static_cast<uint32_t>(peak_in_step), start_allocated, start_reserved);
  }

  // The peak step as a program of its own: first an allocation for every tensor the earlier steps left alive
  // (flat on the timeline at what the step began with), then the step's events.
  void snapshot(const StepProgram& p, int64_t step, uint32_t peak_in_step, int64_t start_allocated, int64_t start_reserved) {
    StepProgram& out = device_.program;
    out.tensors = p.tensors;
    out.labels = p.labels;
    out.events.clear();
    out.phases.clear();
    device_.timeline.clear();
    if (step > 1) {
      // Alive at the step's start: not allocated in the step, and alive at its end or freed in it.
      std::vector<uint8_t> made(p.tensors.size(), 0), carried(p.tensors.size(), 0);
      for (const Event& e : p.events) {
        if (e.op == Event::Op::Alloc) made[e.tensor] = 1;
        else if (e.op == Event::Op::Free && !made[e.tensor]) carried[e.tensor] = 1;
      }
      for (uint32_t id = 0; id < handle_.size(); ++id)
        if (handle_[id] >= 0 && !made[id]) carried[id] = 1;
      out.phases.push_back({"alive from steps 1-" + std::to_string(step - 1), 0});
      for (uint32_t id = 0; id < carried.size(); ++id)
        if (carried[id]) {
          out.events.push_back({Event::Op::Alloc, p.tensors[id].component, id});
          device_.timeline.push_back({start_allocated, start_reserved});
        }
    }
    const uint32_t prefix = static_cast<uint32_t>(out.events.size());
    out.events.insert(out.events.end(), p.events.begin(), p.events.end());
    for (const Phase& ph : p.phases) out.phases.push_back({ph.name, ph.first_event + prefix});
    device_.timeline.insert(device_.timeline.end(), timeline_.begin(), timeline_.end());
    device_.peak_event = prefix + peak_in_step;
    device_.peak_phase.clear();
    for (auto ph = out.phases.rbegin(); ph != out.phases.rend(); ++ph)
      if (ph->first_event <= device_.peak_event) {
        device_.peak_phase = ph->name;
        break;
      }
  }

  Allocator& alloc_;
  const RunPlan& plan_;
  DeviceResult& device_;
  int64_t empty_cache_steps_;
  std::vector<int32_t> handle_;
  std::array<int64_t, kComponentCount> live_{};
  std::vector<TimelinePoint> timeline_;
};

}  // namespace

// The pass behind RunReplay, over either allocator model.
struct RunReplay::Pass {
  virtual ~Pass() = default;
  virtual bool advance(int64_t max_steps) = 0;
  DeviceResult d;
  int64_t steps = 0;
};

namespace {

template <class Allocator>
struct PassWith : RunReplay::Pass {
  template <class... Args>
  PassWith(const StepContext& ctx, const RunPlan& plan, Args... args)
      : alloc(args...), replayer(alloc, plan, d, resolve(ctx.config).empty_cache_steps), builder(ctx, plan) {}
  bool advance(int64_t max_steps) override {
    if (over) return true;
    for (int64_t k = 0; k < max_steps; ++k) {
      if (!builder.next_step()) return over = true;
      ++steps;
      try {
        replayer.on_step(builder.program(), builder.steps_built());
      } catch (const StopRun&) {
        return over = true;
      }
    }
    return over = builder.steps_built() >= d.run.steps;
  }
  Allocator alloc;
  RunReplayer<Allocator> replayer;
  RunBuilder builder;
  bool over = false;
};

}  // namespace

RunReplay::RunReplay(const StepContext& ctx, const RunPlan& plan, int64_t allocator_capacity, bool expandable,
                     int64_t gpu_total_bytes) {
  if (expandable) pass_ = std::make_unique<PassWith<ExpandableSegmentsAllocator>>(ctx, plan, allocator_capacity, gpu_total_bytes);
  else pass_ = std::make_unique<PassWith<CachingAllocator>>(ctx, plan, allocator_capacity);
}
RunReplay::~RunReplay() = default;
bool RunReplay::advance(int64_t max_steps) {
  const bool over = pass_->advance(max_steps);
  pass_->d.peak.active_bytes = pass_->d.peak.allocated_bytes;  // one stream, no record_stream: active == allocated
  return over;
}
int64_t RunReplay::steps_done() const { return pass_->steps; }
DeviceResult& RunReplay::result() { return pass_->d; }

}  // namespace memsim
