// The caching-allocator model against the rules of c10/cuda/CUDACachingAllocator.cpp (MEMORY_FORMULAS.md 5.4).
#include <catch2/catch.hpp>

#include "core/allocator.h"
#include "core/checked.h"

using namespace memsim;

TEST_CASE("round_size and allocation_size", "[allocator]") {
  CHECK(CachingAllocator::round_size(1) == 512);
  CHECK(CachingAllocator::round_size(512) == 512);
  CHECK(CachingAllocator::round_size(513) == 1024);
  CHECK(CachingAllocator::allocation_size(512) == 2 * kMiB);
  CHECK(CachingAllocator::allocation_size(kMiB) == 2 * kMiB);
  CHECK(CachingAllocator::allocation_size(kMiB + 512) == 20 * kMiB);
  CHECK(CachingAllocator::allocation_size(10 * kMiB) == 10 * kMiB);
  CHECK(CachingAllocator::allocation_size(11 * kMiB + 512) == 12 * kMiB);
}

TEST_CASE("a 1.5 MiB tensor reserves a 20 MiB segment, later 1-10 MiB tensors reuse it", "[allocator]") {
  CachingAllocator a(80 * kGiB);
  int32_t x = a.malloc(3 * kMiB / 2);
  CHECK(a.allocated_bytes() == 3 * kMiB / 2);
  CHECK(a.reserved_bytes() == 20 * kMiB);
  int32_t y = a.malloc(4 * kMiB);  // carved from the 18.5 MiB remainder
  CHECK(a.reserved_bytes() == 20 * kMiB);
  CHECK(a.segment_count() == 1);
  a.free(x);
  a.free(y);
  CHECK(a.allocated_bytes() == 0);
  CHECK(a.reserved_bytes() == 20 * kMiB);  // cached, still reserved
  int32_t z = a.malloc(20 * kMiB);        // coalesced back into one 20 MiB block
  CHECK(a.segment_count() == 1);
  CHECK(a.block_bytes(z) == 20 * kMiB);
}

TEST_CASE("an 11.5 MiB tensor is charged its whole 12 MiB block (remainder <= 1 MiB is not split)", "[allocator]") {
  CachingAllocator a(80 * kGiB);
  int32_t x = a.malloc(11 * kMiB + kMiB / 2);
  CHECK(a.reserved_bytes() == 12 * kMiB);
  CHECK(a.allocated_bytes() == 12 * kMiB);
  CHECK(a.block_bytes(x) == 12 * kMiB);
  CHECK(a.requested_bytes() == 11 * kMiB + kMiB / 2);
}

TEST_CASE("small requests share 2 MiB segments of the small pool", "[allocator]") {
  CachingAllocator a(80 * kGiB);
  for (int i = 0; i < 4096; ++i) a.malloc(512);
  CHECK(a.allocated_bytes() == 4096 * 512);
  CHECK(a.reserved_bytes() == 2 * kMiB);
  a.malloc(512);
  CHECK(a.reserved_bytes() == 4 * kMiB);
}

TEST_CASE("best fit picks the smallest cached block that fits", "[allocator]") {
  CachingAllocator a(80 * kGiB);
  int32_t big = a.malloc(100 * kMiB);
  int32_t sep1 = a.malloc(kMiB * 12);
  int32_t mid = a.malloc(40 * kMiB);
  int32_t sep2 = a.malloc(kMiB * 12);
  (void)sep1, (void)sep2;
  a.free(big);
  a.free(mid);
  int64_t reserved = a.reserved_bytes();
  a.malloc(30 * kMiB);  // fits in the 40 MiB block, not the 100 MiB one; no new segment
  CHECK(a.reserved_bytes() == reserved);
  int32_t again = a.malloc(90 * kMiB);  // the 100 MiB block is still whole
  CHECK(a.reserved_bytes() == reserved);
  CHECK(a.block_bytes(again) == 90 * kMiB);
}

TEST_CASE("cached segments are released before an out-of-memory error", "[allocator]") {
  CachingAllocator a(100 * kMiB);
  int32_t x = a.malloc(60 * kMiB);
  a.free(x);
  CHECK(a.reserved_bytes() == 60 * kMiB);
  int32_t y = a.malloc(80 * kMiB);  // needs the cached 60 MiB returned to the driver first
  CHECK(y >= 0);
  CHECK(a.reserved_bytes() == 80 * kMiB);
  CHECK(a.malloc(40 * kMiB) == -1);  // now truly out of memory
}
