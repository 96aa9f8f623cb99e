// The one entry point of the core: a pure function from a config to a result.
#pragma once
#include "config.h"
#include "result.h"

namespace memsim {

// Never throws for any input: invalid or out-of-range configs come back with ok == false and errors set.
Result simulate(const Config& config);

// CUDA context, outside the caching allocator: PyTorch PR #86509 measured 287,047,680 B with
// CUDA_MODULE_LOADING=LAZY (PyTorch's default since 1.13) (MEMORY_FORMULAS.md 5.1).
constexpr int64_t kCudaContextLazyBytes = 287047680;
// ... and 666,632,192 B with eager loading: CUDA before 11.7 (which has no lazy loading), PyTorch before 1.13, or
// CUDA_MODULE_LOADING=EAGER (same PR's test; CUDA Programming Guide, "Lazy Loading").
constexpr int64_t kCudaContextEagerBytes = 666632192;

}  // namespace memsim
