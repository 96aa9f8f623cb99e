#include "allocator.h"

#include <climits>
#include <iterator>
#include <vector>

#include "checked.h"

namespace memsim {

namespace {
// CUDACachingAllocator.cpp constants.
constexpr int64_t kMinBlockSize = 512;
constexpr int64_t kSmallSize = 1 * kMiB;
constexpr int64_t kSmallBuffer = 2 * kMiB;
constexpr int64_t kMinLargeAlloc = 10 * kMiB;
constexpr int64_t kRoundLarge = 2 * kMiB;
constexpr int64_t kLargeBuffer = 20 * kMiB;

// A block slot for either allocator's list: a recycled one, reset, or a new one at the end.
template <class B>
int32_t take_slot(std::vector<B>& blocks, std::vector<int32_t>& spare) {
  if (!spare.empty()) {
    const int32_t b = spare.back();
    spare.pop_back();
    blocks[b] = B{};
    return b;
  }
  blocks.push_back(B{});
  return static_cast<int32_t>(blocks.size() - 1);
}

// Block b keeps its first `size` bytes; the fresh slot r takes the rest of its range and follows it in the
// segment's list (Block::splitting in CUDACachingAllocator.cpp). The caller copies r's other fields and files it.
template <class B>
void split_block(std::vector<B>& blocks, int32_t b, int32_t r, int64_t size) {
  B& blk = blocks[b];
  B& rest = blocks[r];
  rest.addr = blk.addr + size;
  rest.size = blk.size - size;
  rest.prev = b;
  rest.next = blk.next;
  if (blk.next != -1) blocks[blk.next].prev = r;
  blk.next = r;
  blk.size = size;
}
}  // namespace

CachingAllocator::CachingAllocator(int64_t capacity_bytes) : capacity_(capacity_bytes) {}

int64_t CachingAllocator::round_size(int64_t size) {
  if (size < kMinBlockSize) return kMinBlockSize;
  return round_up(size, kMinBlockSize);
}

int64_t CachingAllocator::allocation_size(int64_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return round_up(rounded, kRoundLarge);
}

int32_t CachingAllocator::new_block() { return take_slot(blocks_, spare_); }

// The first entry not above c. Blocks come and go near one end or the other (new segments' at the front, reused
// ones at the back), so the search gallops in from the end the middle entry points to, then bisects what is left:
// a few steps where a bisection of a pipeline stage's thousands of cached blocks took a dozen. A pipeline stage also
// frees a micro-batch's activations one after another, each cached just after the one before, in the middle of
// such a list: there the search gallops out from where the last insert went.
size_t CachingAllocator::CachedList::position(const Cached& c) const {
  const Cached* list = begin();
  const size_t n = size();
  if (n == 0) return 0;
  const bool from_hint = n >= kHintMin && hint_ < n;
  const size_t h = from_hint ? hint_ : n / 2;
  // The answer lies in [a, b]: every entry before a is above c, and b is n or an entry not above it. Gallop
  // upwards from a or downwards from b until the step crosses the answer.
  size_t a, b;
  auto up = [&] {
    for (size_t step = 1; a + step - 1 < b; step *= 2) {
      if (!(list[a + step - 1] > c)) {
        b = a + step - 1;
        return;
      }
      a += step;
    }
  };
  auto down = [&] {
    for (size_t step = 1; b >= a + step; step *= 2) {
      if (list[b - step] > c) {
        a = b - step + 1;
        return;
      }
      b -= step;
    }
  };
  if (list[h] > c) {
    a = h + 1, b = n;
    from_hint ? up() : down();
  } else {
    a = 0, b = h;
    from_hint ? down() : up();
  }
  while (a < b) {
    const size_t mid = a + (b - a) / 2;
    if (list[mid] > c) a = mid + 1;
    else b = mid;
  }
  return a;
}

void CachingAllocator::CachedList::insert_inside(const Cached& c) {
  const size_t p = front() > c ? position(c) : 0, n = size();  // blocks of new segments come in at the front
  hint_ = p + 1;
  if (p >= n / 2) {  // the back half moves up one
    buf_.insert(buf_.begin() + static_cast<std::ptrdiff_t>(head_ + p), c);
    return;
  }
  if (head_ == 0) {  // room at the front, as much as the list holds
    const size_t room = std::max<size_t>(8, n);
    buf_.insert(buf_.begin(), room, Cached{});
    head_ = room;
  }
  // the front half moves down one
  std::copy(buf_.begin() + static_cast<std::ptrdiff_t>(head_), buf_.begin() + static_cast<std::ptrdiff_t>(head_ + p),
            buf_.begin() + static_cast<std::ptrdiff_t>(head_ - 1));
  --head_;
  buf_[head_ + p] = c;
}

void CachingAllocator::CachedList::erase_inside(const Cached& c) {
  const size_t p = position(c), n = size();
  if (p >= n / 2) {
    buf_.erase(buf_.begin() + static_cast<std::ptrdiff_t>(head_ + p));
  } else {
    std::copy_backward(buf_.begin() + static_cast<std::ptrdiff_t>(head_), buf_.begin() + static_cast<std::ptrdiff_t>(head_ + p),
                       buf_.begin() + static_cast<std::ptrdiff_t>(head_ + p + 1));
    ++head_;
  }
  if (empty()) buf_.clear(), head_ = 0;
}

void CachingAllocator::CachedList::pop_back() {
  buf_.pop_back();
  if (empty()) buf_.clear(), head_ = 0;
}

void CachingAllocator::CachedList::drop_front(size_t n) {
  head_ += n;
  if (empty()) buf_.clear(), head_ = 0;
}

// Inline: it runs for every cached block and request, and a call cost as much as the lookup.
[[gnu::always_inline]] inline size_t CachingAllocator::rank_of_size(FreeSet& set, int64_t size) {
  // Sizes are multiples of 512 bytes: the bits above those pick the entry (Fibonacci hashing).
  FreeSet::RankMemo& m = set.memo[(static_cast<uint64_t>(size >> 9) * 0x9E3779B97F4A7C15ull) >> (64 - FreeSet::kMemoBits)];
  if (m.size == size && m.generation == set.generation) return m.rank;
  const size_t rank = static_cast<size_t>(std::upper_bound(set.bounds.begin(), set.bounds.end(), size) - set.bounds.begin() - 1);
  m = {size, static_cast<uint32_t>(rank), set.generation};
  return rank;
}

// A request of a size not seen before: a new class bound at `rank`, taking from the class below it the cached
// blocks that are at least that large (a prefix of its list), and the classes above move up a rank. Happens once
// per distinct request size.
int32_t CachingAllocator::add_bound(FreeSet& set, int64_t size, size_t rank) {
  set.bounds.insert(set.bounds.begin() + static_cast<std::ptrdiff_t>(rank), size);
  ++set.generation;
  set.classes.insert(set.classes.begin() + static_cast<std::ptrdiff_t>(rank), CachedList{});
  for (size_t r = rank + 1; r < set.classes.size(); ++r)
    for (const Cached& c : set.classes[r]) blocks_[c.block].cls = static_cast<int32_t>(r);
  CachedList& below = set.classes[rank - 1];
  CachedList& above = set.classes[rank];
  size_t moved = 0;
  for (const Cached* c = below.begin(); c != below.end() && c->size >= size; ++c, ++moved) {
    blocks_[c->block].cls = static_cast<int32_t>(rank);
    above.push_back(*c);
  }
  below.drop_front(moved);
  // The ranks from rank - 1 up have moved or changed: rebuild their bits.
  set.nonempty.resize((set.bounds.size() + 63) / 64, 0);
  for (size_t r = rank - 1; r < set.bounds.size(); ++r) {
    const uint64_t bit = uint64_t{1} << (r % 64);
    if (set.classes[r].empty()) set.nonempty[r / 64] &= ~bit;
    else set.nonempty[r / 64] |= bit;
  }
  return static_cast<int32_t>(rank);
}

void CachingAllocator::insert_free(FreeSet& set, int32_t b) {
  Block& blk = blocks_[b];
  const size_t rank = rank_of_size(set, blk.size);
  set.classes[rank].insert(Cached{blk.size, blk.addr, b});
  blk.cls = static_cast<int32_t>(rank);
  set.nonempty[rank / 64] |= uint64_t{1} << (rank % 64);
  ++set.count;
}

void CachingAllocator::erase_free(FreeSet& set, int32_t b) {
  Block& blk = blocks_[b];
  if (blk.cls < 0) return;  // not cached
  CachedList& list = set.classes[static_cast<size_t>(blk.cls)];
  list.erase(Cached{blk.size, blk.addr, b});
  if (list.empty()) set.nonempty[static_cast<size_t>(blk.cls) / 64] &= ~(uint64_t{1} << (blk.cls % 64));
  blk.cls = -1;
  --set.count;
}

int32_t CachingAllocator::best_fit_class(FreeSet& set, int64_t size) {
  size_t rank = rank_of_size(set, size);
  fit_index_ = kFitAtBack;
  if (set.bounds[rank] != size) {
    if (set.bounds.size() < kMaxBounds) {
      rank = static_cast<size_t>(add_bound(set, size, rank + 1));
    } else {
      // No class of its own (a run of varying lengths asks for thousands of sizes): the blocks of its class that
      // fit are a prefix of the list, which runs from the largest down, and the best fit is the last of them, the
      // smallest and, among equal sizes, the lowest address. None fit: the classes above, as for any size.
      const size_t fitting = set.classes[rank].position(Cached{size, -1, -1});
      if (fitting > 0) {
        fit_index_ = fitting - 1;
        return static_cast<int32_t>(rank);
      }
      if (++rank == set.bounds.size()) return -1;
    }
  }
  // Usually the request's own class has a block: a branch the CPU predicts, so that it reads the class without
  // waiting for the bit scan.
  if (set.nonempty[rank / 64] >> (rank % 64) & 1) return static_cast<int32_t>(rank);
  size_t w = rank / 64;
  uint64_t word = set.nonempty[w] & (~uint64_t{0} << (rank % 64));
  while (word == 0) {
    if (++w == set.nonempty.size()) return -1;
    word = set.nonempty[w];
  }
  return static_cast<int32_t>(w * 64 + static_cast<size_t>(__builtin_ctzll(word)));
}

void CachingAllocator::pop_best_fit(FreeSet& set, int32_t rank) {
  CachedList& list = set.classes[static_cast<size_t>(rank)];
  blocks_[list.back().block].cls = -1;
  list.pop_back();
  if (list.empty()) set.nonempty[static_cast<size_t>(rank) / 64] &= ~(uint64_t{1} << (rank % 64));
  --set.count;
}

// release_cached_blocks: every cached segment that is entirely free goes back to the driver.
void CachingAllocator::release_cached_segments() {
  for (FreeSet& pool_set : pools_) {
    FreeSet* set = &pool_set;
    std::vector<int32_t> whole;
    for (const auto& list : set->classes)
      for (const Cached& c : list)
        if (blocks_[c.block].prev == -1 && blocks_[c.block].next == -1)
          whole.push_back(static_cast<int32_t>(c.block));
    for (int32_t b : whole) {
      erase_free(*set, b);
      reserved_ -= blocks_[b].size;
      --segments_;
      spare_.push_back(b);
    }
  }
}

int32_t CachingAllocator::malloc(int64_t requested_bytes, int64_t segment_address, int stream) {
  const int64_t size = round_size(requested_bytes);
  const bool small = size <= kSmallSize;
  stream = std::clamp(stream, 0, kMaxStreams - 1);
  FreeSet& set = pool(stream, small);
  const int32_t found = best_fit_class(set, size);  // -1: no cached block fits
  // The best fit, the smallest, lowest-address block of that class, stays in its list until the split is known.
  // It is the list's last entry, unless the size has no class bound of its own (fit_index_).
  const bool mid_class = found >= 0 && fit_index_ != kFitAtBack;
  const CachedList* fit_list = found >= 0 ? &set.classes[static_cast<size_t>(found)] : nullptr;
  int32_t b = !fit_list ? -1 : static_cast<int32_t>(mid_class ? fit_list->begin()[fit_index_].block : fit_list->back().block);
  if (b < 0) {
    const int64_t seg = allocation_size(size);
    if (reserved_ + seg > capacity_) release_cached_segments();
    if (reserved_ + seg > capacity_) return -1;
    b = new_block();
    blocks_[b].addr = segment_address >= 0 ? segment_address : next_addr_;
    blocks_[b].size = seg;
    blocks_[b].small = small;
    blocks_[b].stream = static_cast<uint8_t>(stream);
    next_addr_ = add(next_addr_, seg);
    reserved_ += seg;
    ++segments_;
  }
  // should_split: the small pool splits on any remainder >= 512 B; the large pool only if > 1 MiB remains.
  const int64_t remaining = blocks_[b].size - size;
  const bool split = small ? remaining >= kMinBlockSize : remaining > kSmallSize;
  // The remainder is smaller than every other block of b's class; if it is still large enough for the class, it
  // takes b's place at the back of its list, with no search and no move.
  const bool in_place = found >= 0 && !mid_class && split && remaining >= set.bounds[static_cast<size_t>(found)];
  if (mid_class) erase_free(set, b);
  else if (found >= 0 && !in_place) pop_best_fit(set, found);
  if (split) {
    const int32_t r = new_block();
    split_block(blocks_, b, r, size);
    blocks_[r].small = blocks_[b].small;
    blocks_[r].stream = blocks_[b].stream;
    if (in_place) {
      set.classes[static_cast<size_t>(found)].replace_back(Cached{remaining, blocks_[r].addr, r});
      blocks_[r].cls = found;
      blocks_[b].cls = -1;
    } else {
      insert_free(set, r);
    }
  }
  Block& blk = blocks_[b];
  blk.allocated = true;
  blk.requested = requested_bytes;
  allocated_ += blk.size;
  requested_ += requested_bytes;
  return b;
}

void CachingAllocator::free(int32_t handle) {
  Block* blk = &blocks_[handle];
  FreeSet& set = pool(blk->stream, blk->small);  // its neighbours', too: one segment
  blk->allocated = false;
  allocated_ -= blk->size;
  requested_ -= blk->requested;
  // try_merge_blocks: coalesce with free neighbours of the same segment.
  for (int32_t nb : {blk->prev, blk->next}) {
    if (nb == -1 || blocks_[nb].allocated) continue;
    erase_free(set, nb);
    Block& n = blocks_[nb];
    blk = &blocks_[handle];
    if (nb == blk->prev) {
      blk->addr = n.addr;
      blk->prev = n.prev;
      if (n.prev != -1) blocks_[n.prev].next = handle;
    } else {
      blk->next = n.next;
      if (n.next != -1) blocks_[n.next].prev = handle;
    }
    blk->size += n.size;
    spare_.push_back(nb);
  }
  insert_free(set, handle);
}

}  // namespace memsim

// ---------------------------------------------------------------------------------------------------------
// ExpandableSegmentsAllocator: DeviceCachingAllocator with CUDAAllocatorConfig::expandable_segments() true.
// ---------------------------------------------------------------------------------------------------------

namespace memsim {

// ExpandableSegment's constructor reserves max_handles_ = numSegments(totalGlobalMem + totalGlobalMem / 8) pages.
ExpandableSegmentsAllocator::ExpandableSegmentsAllocator(int64_t capacity_bytes, int64_t gpu_total_bytes)
    : capacity_(capacity_bytes) {
  const int64_t space = std::max<int64_t>(1, add(gpu_total_bytes, gpu_total_bytes / 8));
  // Pages are kLargeBuffer for the large pool and kSmallBuffer for the small one (find_expandable_block).
  segment_bytes_large_ = round_up(space, kLargeBuffer);
  segment_bytes_small_ = round_up(space, kSmallBuffer);
  for (int i = 0; i < 2 * CachingAllocator::kMaxStreams; ++i) pools_[i].page = i % 2 ? kSmallBuffer : kLargeBuffer;
}

int32_t ExpandableSegmentsAllocator::new_block() { return take_slot(blocks_, spare_); }

void ExpandableSegmentsAllocator::drop_block(int32_t b) { spare_.push_back(b); }

int64_t ExpandableSegmentsAllocator::mapped_bytes(int stream, bool small) const {
  return pools_[2 * std::clamp(stream, 0, CachingAllocator::kMaxStreams - 1) + (small ? 1 : 0)].mapped;
}

// get_free_block: "for the purposes of best fit we consider its size to be the size it can expand to".
int64_t ExpandableSegmentsAllocator::expandable_size(int32_t b) const {
  const Block& blk = blocks_[b];
  return blk.size + (blk.next != -1 && !blocks_[blk.next].mapped ? blocks_[blk.next].size : 0);
}

// get_free_block: from the smallest block of at least `size` (lower_bound in size, address order), move on to the
// next one while that one's expandable size is smaller.
int32_t ExpandableSegmentsAllocator::get_free_block(Pool& p, int64_t size) {
  auto it = p.free.lower_bound(Key{size, INT64_MIN, -1});
  if (it == p.free.end()) return -1;
  for (auto next = std::next(it); next != p.free.end() && expandable_size(next->block) < expandable_size(it->block);
       ++next)
    it = next;
  const int32_t b = it->block;
  p.free.erase(it);
  return b;
}

// try_merge_blocks: free neighbours of the same mapped state coalesce; `dst` is in neither set.
void ExpandableSegmentsAllocator::try_merge(int32_t dst, int32_t src) {
  if (src == -1 || blocks_[src].allocated || blocks_[src].mapped != blocks_[dst].mapped) return;
  Pool& p = pools_[blocks_[src].pool];
  Block& s = blocks_[src];
  Block& d = blocks_[dst];
  if (s.mapped) p.free.erase(key(src));
  else p.unmapped.erase({s.addr, src});
  if (d.prev == src) {
    d.addr = s.addr;
    d.prev = s.prev;
    if (d.prev != -1) blocks_[d.prev].next = dst;
  } else {
    d.next = s.next;
    if (d.next != -1) blocks_[d.next].prev = dst;
  }
  d.size += s.size;
  drop_block(src);
}

// find_expandable_block: the lowest-address unmapped range of this stream's pool, together with the free block
// just before it, that has room for `size`; else a new segment (all of it unmapped).
int32_t ExpandableSegmentsAllocator::find_expandable_block(Pool& p, int pool, int64_t size) {
  for (const auto& [addr, u] : p.unmapped) {
    int32_t c = u;
    if (blocks_[u].prev != -1 && !blocks_[blocks_[u].prev].allocated) c = blocks_[u].prev;
    int64_t bytes = 0;  // has_available_address_space
    for (int32_t x = c; bytes < size && x != -1 && !blocks_[x].allocated; x = blocks_[x].next) bytes += blocks_[x].size;
    if (bytes >= size) return c;
  }
  const int64_t bytes = pool % 2 ? segment_bytes_small_ : segment_bytes_large_;
  if (size > bytes) return -1;  // beyond one segment's address space: the mapping fails (an OOM)
  segment_info_.push_back({next_addr_});
  const int32_t b = new_block();
  Block& blk = blocks_[b];
  blk.addr = next_addr_;
  blk.size = bytes;
  blk.mapped = false;
  blk.segment = static_cast<int32_t>(segment_info_.size() - 1);
  blk.pool = static_cast<uint8_t>(pool);
  next_addr_ = add(next_addr_, bytes);
  p.unmapped.insert({blk.addr, b});
  ++segments_;
  return b;
}

// map_block: ExpandableSegment::map maps whole pages from the block's start (segmentRight rounds the end up), and
// fails as a whole when cuMemCreate runs out of memory. The mapped part merges with free mapped neighbours.
bool ExpandableSegmentsAllocator::map_block(int32_t b, int64_t size) {
  const int pool = blocks_[b].pool;
  Pool& p = pools_[pool];
  const int64_t mapped = round_up(size, p.page);
  if (size <= 0 || mapped > capacity_ - reserved_) return false;
  p.unmapped.erase({blocks_[b].addr, b});
  blocks_[b].mapped = true;
  if (mapped < blocks_[b].size) {  // to_map -> remaining (unmapped) -> to_map->next
    const int32_t r = new_block();
    split_block(blocks_, b, r, mapped);
    blocks_[r].mapped = false;
    blocks_[r].segment = blocks_[b].segment;
    blocks_[r].pool = blocks_[b].pool;
    p.unmapped.insert({blocks_[r].addr, r});
  }
  try_merge(b, blocks_[b].prev);
  try_merge(b, blocks_[b].next);
  p.free.insert(key(b));
  reserved_ += mapped;
  p.mapped += mapped;
  return true;
}

// try_allocate_expandable_block: map the candidate if it is unmapped, then map the unmapped ranges after it until
// the merged free block holds `size`.
int32_t ExpandableSegmentsAllocator::try_allocate_expandable_block(Pool& p, int pool, int64_t size) {
  int32_t c = find_expandable_block(p, pool, size);
  if (c < 0) return -1;
  if (!blocks_[c].mapped && !map_block(c, std::min(blocks_[c].size, size))) return -1;
  while (blocks_[c].size < size) {  // free -> unmapped -> ...: map some of the next and merge the free one into it
    const int32_t next = blocks_[c].next;
    if (next < 0 || !map_block(next, std::min(size - blocks_[c].size, blocks_[next].size))) return -1;
    c = next;
  }
  p.free.erase(key(c));
  return c;
}

// unmap_block: the whole pages inside a free block go back to the driver; the partial pages at either end stay
// mapped as free blocks of their own (before_free, after_free).
void ExpandableSegmentsAllocator::unmap_block(int32_t b) {
  const int pool = blocks_[b].pool;
  Pool& p = pools_[pool];
  const int64_t base = segment_info_[static_cast<size_t>(blocks_[b].segment)].base;
  const int64_t off = blocks_[b].addr - base, size = blocks_[b].size;
  const int64_t begin = round_up(off, p.page), end = (off + size) / p.page * p.page;
  if (begin >= end) return;
  p.free.erase(key(b));
  const int64_t before = begin - off, after = size - (before + (end - begin));
  if (before > 0) {  // prev? -> before_free -> block
    const int32_t f = new_block();
    Block& blk = blocks_[b];
    Block& nb = blocks_[f];
    nb.addr = blk.addr;
    nb.size = before;
    nb.segment = blk.segment;
    nb.pool = blk.pool;
    nb.prev = blk.prev;
    nb.next = b;
    if (blk.prev != -1) blocks_[blk.prev].next = f;
    blk.prev = f;
    p.free.insert(key(f));
  }
  if (after > 0) {  // block -> after_free -> next?
    const int32_t f = new_block();
    Block& blk = blocks_[b];
    Block& na = blocks_[f];
    na.addr = base + end;
    na.size = after;
    na.segment = blk.segment;
    na.pool = blk.pool;
    na.prev = b;
    na.next = blk.next;
    if (blk.next != -1) blocks_[blk.next].prev = f;
    blk.next = f;
    p.free.insert(key(f));
  }
  Block& blk = blocks_[b];
  blk.addr = base + begin;
  blk.size = end - begin;
  blk.mapped = false;
  try_merge(b, blocks_[b].prev);
  try_merge(b, blocks_[b].next);
  p.unmapped.insert({blocks_[b].addr, b});
  reserved_ -= end - begin;
  p.mapped -= end - begin;
}

// release_cached_blocks -> release_blocks: unmap every free block's whole pages, then release a segment whose one
// remaining block is unmapped (release_expandable_segment).
void ExpandableSegmentsAllocator::empty_cache() {
  for (Pool& p : pools_) {
    std::vector<int32_t> to_unmap;
    for (const Key& k : p.free) to_unmap.push_back(k.block);
    for (int32_t b : to_unmap) {
      unmap_block(b);
      const Block& blk = blocks_[b];
      if (!blk.mapped && blk.prev == -1 && blk.next == -1) {
        p.unmapped.erase({blk.addr, b});
        --segments_;
        drop_block(b);
      }
    }
  }
}

// malloc: get_free_block, else alloc_block (try_allocate_expandable_block), else release_cached_blocks and
// alloc_block again (release_available_cached_blocks does nothing with max_split_size unlimited). should_split
// under expandable segments: any remainder of kMinBlockSize or more.
int32_t ExpandableSegmentsAllocator::malloc(int64_t requested_bytes, int stream) {
  const int64_t size = CachingAllocator::round_size(requested_bytes);
  const bool small = size <= kSmallSize;
  const int pool = 2 * std::clamp(stream, 0, CachingAllocator::kMaxStreams - 1) + (small ? 1 : 0);
  Pool& p = pools_[pool];
  int32_t b = get_free_block(p, size);
  if (b < 0) b = try_allocate_expandable_block(p, pool, size);
  if (b < 0) {
    empty_cache();
    b = try_allocate_expandable_block(p, pool, size);
  }
  if (b < 0) return -1;
  const int64_t remaining = blocks_[b].size - size;
  if (remaining >= kMinBlockSize) {
    const int32_t r = new_block();
    split_block(blocks_, b, r, size);
    blocks_[r].segment = blocks_[b].segment;
    blocks_[r].pool = blocks_[b].pool;
    p.free.insert(key(r));
  }
  Block& blk = blocks_[b];
  blk.allocated = true;
  blk.requested = requested_bytes;
  allocated_ += blk.size;
  requested_ += requested_bytes;
  return b;
}

// free -> free_block: merge with free mapped neighbours (an unmapped neighbour differs in mapped state), back to the
// pool. Nothing is unmapped here.
void ExpandableSegmentsAllocator::free(int32_t handle) {
  Block& blk = blocks_[handle];
  blk.allocated = false;
  allocated_ -= blk.size;
  requested_ -= blk.requested;
  const int32_t prev = blk.prev, next = blk.next;
  try_merge(handle, prev);
  try_merge(handle, next);
  pools_[blocks_[handle].pool].free.insert(key(handle));
}

}  // namespace memsim
