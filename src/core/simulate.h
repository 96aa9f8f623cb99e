// The one entry point of the core: a pure function from a config to a result.
#pragma once
#include <cstdint>
#include <memory>

#include "config.h"
#include "result.h"

namespace memsim {

struct GpuSpec;

// Never throws for any input: invalid or out-of-range configs come back with ok == false and errors set.
// run_orders: the orders of the data a run of drawn samples is replayed in, at most data_shape.h run_shuffles
// (0: all of them; the band's short run of unstated lengths takes 1).
Result simulate(const Config& config, int64_t run_orders = 0);

// simulate(), a part at a time, for an interface that must stay responsive: a run of varying shapes advances a
// few optimizer steps per call; a fixed shape is done in its first call. result() is complete once done().
class Simulation {
 public:
  explicit Simulation(const Config& config, int64_t run_orders = 0);  // run_orders: as simulate()'s
  ~Simulation();
  Simulation(Simulation&&) noexcept;
  Simulation& operator=(Simulation&&) noexcept;
  bool advance(int64_t steps = INT64_MAX);  // true once the result is complete
  bool done() const;
  double progress() const;  // from 0 to 1
  // Where a run's replay is, in optimizer steps, for a progress line: `steps` is 0 for a fixed shape. A run is
  // replayed once per order of the data (`order` of `orders`, data_shape.h run_shuffles); a run whose allocator
  // cache outgrows the GPU is then replayed again against its real capacity (pass 2).
  struct RunProgress {
    int64_t step = 0, steps = 0;
    int pass = 1;
    int64_t order = 1, orders = 1;
  };
  RunProgress run_progress() const;
  const Result& result() const;
  Result take_result() &&;  // the result, moved out (simulate() returns it without a copy of every timeline)

  struct State;

 private:
  std::unique_ptr<State> state_;
};

// CUDA context, outside the caching allocator: PyTorch PR #86509 measured cudaMemGetInfo's total - free at
// 287,047,680 B with CUDA_MODULE_LOADING=LAZY (PyTorch's default since 1.13) (MEMORY_FORMULAS.md 5.1), after
// `torch.randn(20, 16, 50, 100).cuda()`: that 6.4 MB tensor sits in a 20 MiB segment of the caching allocator
// (1-10 MiB requests get 20 MiB segments), which is counted here as reserved memory, so the context is the rest.
constexpr int64_t kCudaContextLazyBytes = 287047680 - 20971520;
// ... and 666,632,192 B with eager loading, less the same segment: CUDA before 11.7 (which has no lazy loading),
// PyTorch before 1.13, or CUDA_MODULE_LOADING=EAGER (same PR's test; CUDA Programming Guide, "Lazy Loading").
constexpr int64_t kCudaContextEagerBytes = 666632192 - 20971520;
// Hopper (sm_90) with lazy loading, after real training steps rather than a bare init: NVML used memory minus its
// idle reading minus max_memory_reserved, median of 27 runs of tools/calibrate/sweep.json on an H200 (driver
// 580.159.04, CUDA 13.0, torch 2.11.0; spread 751-769 MiB): tests/validation/measured/h200-2026-11-30.jsonl.
// It holds the context and the kernels those steps loaded (cuBLAS/cuBLASLt, attention, optimizer kernels).
constexpr int64_t kCudaContextHopperLazyBytes = 804061184;  // 766.8 MiB

// The context a GPU's process holds outside the caching allocator, with the module loading named
// (hardware.cuda_module_loading): measured per GPU generation where a measurement exists, else PR #86509's.
int64_t cuda_context_bytes(int compute_capability, bool eager);
// The GPU's memory (hardware.gpu_memory_bytes, else the catalogue's), and the context its process holds outside the
// allocator (hardware.cuda_context_bytes, else cuda_context_bytes by the module loading).
int64_t gpu_total_bytes(const Config& c, const GpuSpec* gpu);
int64_t context_bytes(const Config& c, const GpuSpec* gpu, bool lazy_module_loading);

}  // namespace memsim
