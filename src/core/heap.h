// How a native process that simulates again and again keeps its heap.
#pragma once

namespace memsim {

// glibc gives memory at the top of its heap back to the kernel once more than M_TRIM_THRESHOLD (128 KiB at first)
// is free there, and serves requests above M_MMAP_THRESHOLD with mmap. A simulation's event list, tensor table and
// timeline run to a few MiB each, so every simulation after the first took fresh pages from the kernel and faulted
// them in: 7-9% of a FLUX.1 step's simulation (perf, session 31). This keeps freed memory in the process, as the
// web page's wasm heap always does (its linear memory never shrinks). For the desktop app, the CLI (validate and
// --suggest simulate hundreds of times) and the benchmark; a no-op where the C library is not glibc.
void keep_freed_heap_memory();

}  // namespace memsim
