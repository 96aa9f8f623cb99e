// A model of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp at 001074d,
// MEMORY_FORMULAS.md 5.4): 512-byte rounding, a small pool (<= 1 MiB, 2 MiB segments) and a large pool
// (20 MiB segments for 1-10 MiB requests, 2 MiB-rounded segments above), best-fit reuse of cached blocks,
// block splitting, coalescing on free, and the release of cached segments before an out-of-memory error.
// Per-stream pools: a cached block serves only requests on the stream that allocated it. Default
// PYTORCH_CUDA_ALLOC_CONF (max_split_size unlimited, no expandable segments).
#pragma once
#include <cstdint>
#include <cstddef>
#include <algorithm>
#include <array>
#include <set>
#include <vector>

namespace memsim {

class CachingAllocator {
 public:
  // capacity_bytes: what cudaMalloc can hand out (GPU total minus context and other non-allocator memory).
  explicit CachingAllocator(int64_t capacity_bytes);

  // Returns a handle, or -1 if the request fails even after releasing cached segments (an OOM).
  // segment_address places a segment this request creates, for replaying a recorded trace: on a GPU cudaMalloc
  // picks it, and the lowest address wins ties between cached blocks of one size. -1 puts segments end to end.
  // stream: the CUDA stream the request runs on (0 = the compute stream), below kMaxStreams.
  int32_t malloc(int64_t requested_bytes, int64_t segment_address = -1, int stream = 0);
  static constexpr int kMaxStreams = 4;
  void free(int32_t handle);
  // torch.cuda.empty_cache(): release_cached_blocks, as before an out-of-memory error.
  void empty_cache() { release_cached_segments(); }

  // Bytes charged for a live handle: the rounded or unsplit block size, as memory_allocated counts it.
  int64_t block_bytes(int32_t handle) const { return blocks_[handle].size; }

  int64_t allocated_bytes() const { return allocated_; }
  int64_t reserved_bytes() const { return reserved_; }
  int64_t requested_bytes() const { return requested_; }
  int64_t segment_count() const { return segments_; }
  int64_t cached_block_count() const {
    int64_t n = 0;
    for (const auto& set : pools_) n += set.count;
    return n;
  }

  // round_size and get_allocation_size of CUDACachingAllocator.cpp (roundup_power2_divisions off).
  static int64_t round_size(int64_t size);
  static int64_t allocation_size(int64_t rounded);

 private:
  struct Block {
    int64_t addr = 0;
    int64_t size = 0;
    int64_t requested = 0;
    int32_t prev = -1, next = -1;  // neighbours within the same segment
    int32_t cls = -1;              // cached: the rank of the class holding it; -1 while allocated
    bool allocated = false;
    bool small = false;
    uint8_t stream = 0;
  };
  // Best fit: smallest size first, then lowest address (BlockComparatorSize). A training step asks for a few dozen
  // distinct sizes, so the cached blocks are kept in classes bounded by the request sizes seen so far: the class
  // of bound b holds the cached blocks of sizes in [b, next bound). A request of a seen size s can take a block
  // of any class from s's own upwards, and every block of a lower class is smaller than every block of a higher
  // one, so the best fit is the smallest block of the first non-empty class at or above s: one bit scan, then the
  // last entry of that class's list, which is sorted by descending (size, address). A request of an unseen size
  // first adds its bound, splitting the class it falls in.
  struct Cached {  // one cached block in its class's list, with the sort key beside its index
    int64_t size = 0, addr = 0;
    // 8 bytes, as wide as the copy of an entry reads it: with an int32_t, the copy read the index and its 4 bytes of
    // padding as one 8-byte load, which the CPU cannot forward from the 4-byte store that had just made the entry
    // (perf put insert_free's samples there; the measured gain was within noise).
    int64_t block = -1;
    bool operator>(const Cached& o) const { return size != o.size ? size > o.size : addr > o.addr; }
  };
  // One class's list. Best fits leave from the back (lowest address), and blocks freed in segments made later
  // (higher addresses) come in at the front, so the list keeps room at both ends and an insert or erase shifts
  // the shorter side: a pipeline stage caches thousands of blocks of one size.
  class CachedList {
   public:
    size_t size() const { return buf_.size() - head_; }
    bool empty() const { return buf_.size() == head_; }
    const Cached* begin() const { return buf_.data() + head_; }
    const Cached* end() const { return buf_.data() + buf_.size(); }
    const Cached& front() const { return buf_[head_]; }
    const Cached& back() const { return buf_.back(); }
    void pop_back();
    void push_back(const Cached& c) { buf_.push_back(c); }
    void replace_back(const Cached& c) { buf_.back() = c; }  // c must not be above the entry before
    void drop_front(size_t n);
    size_t position(const Cached& c) const;  // index of the first entry not above c
    // Most blocks come in as their class's new smallest (a split's remainder, a block freed in the segment that is
    // reused first): no search, no move. Inline, so that such an entry goes from registers into the list.
    void insert(const Cached& c) {
      if (empty() || back() > c) return buf_.push_back(c);
      insert_inside(c);
    }
    void erase(const Cached& c) {
      if (back().block == c.block) return pop_back();  // often the block a split just left there
      erase_inside(c);
    }

   private:
    void insert_inside(const Cached& c);
    void erase_inside(const Cached& c);
    std::vector<Cached> buf_;
    size_t head_ = 0;  // entries are buf_[head_, size)
    size_t hint_ = 0;  // just after the entry the last insert placed
    // A list this long searches from hint_; shorter ones from their ends, which measured faster for them (the 70B
    // benchmark's lists stay under 32 entries, a pipeline stage's reach about 1,000).
    static constexpr size_t kHintMin = 64;
  };
  struct FreeSet {
    std::vector<int64_t> bounds{0};      // ascending lower bounds of the classes; 0 takes the rest
    std::vector<CachedList> classes{1};  // by rank, as bounds
    std::vector<uint64_t> nonempty{0};   // bit per rank: that class has a cached block
    int64_t count = 0;
    // Sizes rank_of_size has looked up, with their ranks, in a table indexed by the size: a step frees and splits
    // blocks of a few hundred sizes in no order a branch predictor learns, and the bisection of the bounds took a
    // tenth of a FLUX.1 replay. An entry holds while its generation is the set's; add_bound, which renumbers the
    // ranks, starts a new generation.
    struct RankMemo {
      int64_t size = -1;
      uint32_t rank = 0, generation = 0;
    };
    static constexpr int kMemoBits = 8;
    std::array<RankMemo, size_t{1} << kMemoBits> memo{};
    uint32_t generation = 1;
  };

  // Large blocks of the compute stream, most of the traffic, by a predicted branch: an index computed from the
  // stream and size (or a conditional move) makes every read of the pool wait for them.
  FreeSet& pool(int stream, bool small) {
    if (stream == 0 && !small) [[likely]] return pools_[0];
    return pools_[static_cast<size_t>(2 * stream + (small ? 1 : 0))];
  }
  static size_t rank_of_size(FreeSet& set, int64_t size);  // the class a block of this size belongs to
  int32_t add_bound(FreeSet& set, int64_t size, size_t rank);  // returns the new class's rank
  // The pool is the caller's: malloc knows it from the request, free from the block, and a block's neighbours
  // share its segment's pool. Working it out again from each block it touches (a load, then an index) delayed
  // every read of the pool and made whole replays 15-25% slower.
  void insert_free(FreeSet& set, int32_t b);
  void erase_free(FreeSet& set, int32_t b);
  // The rank of the class holding the best fit (its list's last entry), or -1 if no cached block is large enough.
  // With fit_index_ kFitAtBack, the best fit is that list's last entry; otherwise it is entry fit_index_.
  int32_t best_fit_class(FreeSet& set, int64_t size);
  void pop_best_fit(FreeSet& set, int32_t rank);  // takes that block out of the cache
  int32_t new_block();
  void release_cached_segments();

  // Class bounds a pool adds for request sizes, at most: a step asks for a few dozen sizes (a pipeline stage a few
  // hundred), a run of varying lengths for thousands, and every new bound renumbers the classes above it. Past the
  // limit a size shares the class it falls in, and best_fit_class searches that class's list.
  static constexpr size_t kMaxBounds = 512;
  static constexpr size_t kFitAtBack = SIZE_MAX;
  size_t fit_index_ = kFitAtBack;

  int64_t capacity_;
  int64_t allocated_ = 0, reserved_ = 0, requested_ = 0, segments_ = 0;
  int64_t next_addr_ = 0;
  std::vector<Block> blocks_;
  std::vector<int32_t> spare_;  // recycled block slots
  FreeSet pools_[2 * kMaxStreams];  // per stream: large, small
};

// PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (CUDACachingAllocator.cpp, Note [Expandable Segments]): instead
// of one cudaMalloc per segment, each (stream, pool) reserves virtual address space once (ExpandableSegment: 9/8 of
// the GPU's memory) and maps physical pages into it on demand, 20 MiB pages for the large pool and 2 MiB for the
// small (find_expandable_block: kLargeBuffer / kSmallBuffer). memory_reserved counts the mapped pages (map_block,
// unmap_block). Requests are not rounded to a segment size, any remainder of 512 B or more is split off
// (should_split), and a free block that ends where unmapped space begins counts as that much larger for best fit
// (get_free_block's expandable_size), so every other fitting block is used first. Pages are unmapped only when the
// cache is released: torch.cuda.empty_cache, or before an out-of-memory error (release_cached_blocks ->
// release_blocks -> unmap_block). A class of its own, so that the default allocator's replay does not pay for it.
class ExpandableSegmentsAllocator {
 public:
  // capacity_bytes: physical memory the driver can map (as CachingAllocator's). gpu_total_bytes: the GPU's whole
  // memory (cudaDeviceProp::totalGlobalMem), which sizes each segment's address space.
  ExpandableSegmentsAllocator(int64_t capacity_bytes, int64_t gpu_total_bytes);

  // Returns a handle, or -1 if the request fails even after unmapping every free page (an OOM).
  int32_t malloc(int64_t requested_bytes, int stream = 0);
  void free(int32_t handle);
  // release_cached_blocks (torch.cuda.empty_cache; also the OOM path): unmaps every page no live block touches,
  // and releases a segment left with nothing mapped.
  void empty_cache();

  int64_t block_bytes(int32_t handle) const { return blocks_[handle].size; }
  int64_t block_address(int32_t handle) const { return blocks_[handle].addr; }  // segments lie end to end from 0
  int64_t allocated_bytes() const { return allocated_; }
  int64_t reserved_bytes() const { return reserved_; }  // mapped pages
  int64_t requested_bytes() const { return requested_; }
  int64_t segment_count() const { return segments_; }   // live ExpandableSegments (address-space reservations)
  int64_t mapped_bytes(int stream, bool small) const;   // one (stream, pool)'s mapped pages

 private:
  struct Block {
    int64_t addr = 0, size = 0, requested = 0;
    int32_t prev = -1, next = -1;  // neighbours in the segment's address range, mapped or not
    int32_t segment = -1;
    bool allocated = false;
    bool mapped = true;  // backed by physical pages; unmapped blocks are whole pages
    uint8_t pool = 0;    // 2 * stream + small
  };
  struct Key {  // BlockComparatorSize within one stream's pool: size, then address
    int64_t size, addr;
    int32_t block;
    bool operator<(const Key& o) const { return size != o.size ? size < o.size : addr < o.addr; }
  };
  struct Pool {
    std::set<Key> free;                              // BlockPool::blocks: free, mapped
    std::set<std::pair<int64_t, int32_t>> unmapped;  // BlockPool::unmapped, by address
    int64_t page = 0, mapped = 0;
  };
  struct Segment {
    int64_t base = 0;
  };

  int32_t new_block();
  void drop_block(int32_t b);
  Key key(int32_t b) const { return {blocks_[b].size, blocks_[b].addr, b}; }
  int64_t expandable_size(int32_t b) const;
  int32_t get_free_block(Pool& p, int64_t size);
  int32_t find_expandable_block(Pool& p, int pool, int64_t size);
  bool map_block(int32_t b, int64_t size);
  int32_t try_allocate_expandable_block(Pool& p, int pool, int64_t size);
  void try_merge(int32_t dst, int32_t src);
  void unmap_block(int32_t b);

  int64_t capacity_, segment_bytes_large_, segment_bytes_small_;
  int64_t allocated_ = 0, reserved_ = 0, requested_ = 0, segments_ = 0;
  int64_t next_addr_ = 0;
  std::vector<Block> blocks_;
  std::vector<int32_t> spare_;
  std::vector<Segment> segment_info_;
  Pool pools_[2 * CachingAllocator::kMaxStreams];
};

}  // namespace memsim
