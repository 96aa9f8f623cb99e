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

}  // namespace memsim
