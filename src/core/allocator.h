// A model of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp at 001074d,
// MEMORY_FORMULAS.md 5.4): 512-byte rounding, a small pool (<= 1 MiB, 2 MiB segments) and a large pool
// (20 MiB segments for 1-10 MiB requests, 2 MiB-rounded segments above), best-fit reuse of cached blocks,
// block splitting, coalescing on free, and the release of cached segments before an out-of-memory error.
// One stream, default PYTORCH_CUDA_ALLOC_CONF (max_split_size unlimited, no expandable segments).
#pragma once
#include <cstdint>
#include <algorithm>
#include <vector>

namespace memsim {

class CachingAllocator {
 public:
  // capacity_bytes: what cudaMalloc can hand out (GPU total minus context and other non-allocator memory).
  explicit CachingAllocator(int64_t capacity_bytes);

  // Returns a handle, or -1 if the request fails even after releasing cached segments (an OOM).
  // segment_address places a segment this request creates, for replaying a recorded trace: on a GPU cudaMalloc
  // picks it, and the lowest address wins ties between cached blocks of one size. -1 puts segments end to end.
  int32_t malloc(int64_t requested_bytes, int64_t segment_address = -1);
  void free(int32_t handle);

  // Bytes charged for a live handle: the rounded or unsplit block size, as memory_allocated counts it.
  int64_t block_bytes(int32_t handle) const { return blocks_[handle].size; }

  int64_t allocated_bytes() const { return allocated_; }
  int64_t reserved_bytes() const { return reserved_; }
  int64_t requested_bytes() const { return requested_; }
  int64_t segment_count() const { return segments_; }
  int64_t cached_block_count() const { return free_small_.count + free_large_.count; }

  // round_size and get_allocation_size of CUDACachingAllocator.cpp (roundup_power2_divisions off).
  static int64_t round_size(int64_t size);
  static int64_t allocation_size(int64_t rounded);

 private:
  struct Block {
    int64_t addr = 0;
    int64_t size = 0;
    int64_t requested = 0;
    int32_t prev = -1, next = -1;  // neighbours within the same segment
    int32_t free_prev = -1, free_next = -1;  // neighbours in the bucket of cached blocks of this size
    bool allocated = false;
    bool small = false;
  };
  // Best fit: smallest size first, then lowest address (BlockComparatorSize). The cached blocks of one size sit
  // in a bucket ordered by address, found by hashing the size: most requests reuse a block of exactly their size
  // (every layer asks for the same sizes), so they never search. A sorted list of the sizes that have cached
  // blocks answers the other requests by binary search.
  struct Bucket {
    int64_t size = -1;  // -1: an empty slot of the hash table
    int32_t head = -1;  // lowest-address cached block of this size; the rest follow through Block::free_next
  };
  struct FreeSet {
    std::vector<Bucket> table;   // open addressing, linear probing; sizes are never removed, only emptied
    std::vector<int64_t> sizes;  // ascending: the sizes whose bucket is non-empty
    int64_t count = 0;
    int64_t used_slots = 0;
  };

  FreeSet& pool(bool small) { return small ? free_small_ : free_large_; }
  static Bucket& bucket(FreeSet& set, int64_t size);  // creates it if absent
  static Bucket* find_bucket(FreeSet& set, int64_t size);
  void insert_free(int32_t b);
  void erase_free(int32_t b);
  int32_t take_best_fit(FreeSet& set, int64_t size);  // -1 if no cached block is large enough
  int32_t new_block();
  void release_cached_segments();

  int64_t capacity_;
  int64_t allocated_ = 0, reserved_ = 0, requested_ = 0, segments_ = 0;
  int64_t next_addr_ = 0;
  std::vector<Block> blocks_;
  std::vector<int32_t> spare_;  // recycled block slots
  FreeSet free_small_, free_large_;
};

}  // namespace memsim
