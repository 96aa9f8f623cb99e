#include "heap.h"

#if defined(__GLIBC__) && !defined(__EMSCRIPTEN__)
#include <malloc.h>
#endif

namespace memsim {

void keep_freed_heap_memory() {
#if defined(__GLIBC__) && !defined(__EMSCRIPTEN__)
  // Setting either threshold also turns off glibc's own adjustment of both (mallopt(3)). 32 MiB, the largest
  // mmap threshold mallopt(3) documents for 64-bit systems, covers the largest simulation's buffers (the 1M-GPU
  // extremes benchmark's 514k events: 4 MiB of events, 8 MiB each of tensors and timeline).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
}

}  // namespace memsim
