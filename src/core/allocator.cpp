#include "allocator.h"

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

int32_t CachingAllocator::new_block() {
  if (!spare_.empty()) {
    int32_t b = spare_.back();
    spare_.pop_back();
    blocks_[b] = Block{};
    return b;
  }
  blocks_.push_back(Block{});
  return static_cast<int32_t>(blocks_.size() - 1);
}

CachingAllocator::Bucket* CachingAllocator::find_bucket(FreeSet& set, int64_t size) {
  if (set.table.empty()) return nullptr;
  const size_t mask = set.table.size() - 1;
  for (size_t i = static_cast<size_t>(static_cast<uint64_t>(size / 512) * 0x9E3779B97F4A7C15ull >> 20) & mask;;
       i = (i + 1) & mask) {
    if (set.table[i].size == size) return &set.table[i];
    if (set.table[i].size == -1) return nullptr;
  }
}

CachingAllocator::Bucket& CachingAllocator::bucket(FreeSet& set, int64_t size) {
  if (Bucket* b = find_bucket(set, size)) return *b;
  if ((set.used_slots + 1) * 2 > static_cast<int64_t>(set.table.size())) {  // keep the table at most half full
    std::vector<Bucket> old = std::move(set.table);
    set.table.assign(std::max<size_t>(64, old.size() * 2), Bucket{});
    set.used_slots = 0;
    for (const auto& b : old)
      if (b.size != -1) bucket(set, b.size).head = b.head;
  }
  const size_t mask = set.table.size() - 1;
  size_t i = static_cast<size_t>(static_cast<uint64_t>(size / 512) * 0x9E3779B97F4A7C15ull >> 20) & mask;
  while (set.table[i].size != -1) i = (i + 1) & mask;
  set.table[i].size = size;
  ++set.used_slots;
  return set.table[i];
}

void CachingAllocator::insert_free(int32_t b) {
  FreeSet& set = pool(blocks_[b].small);
  Bucket& bk = bucket(set, blocks_[b].size);
  if (bk.head == -1) set.sizes.insert(std::lower_bound(set.sizes.begin(), set.sizes.end(), bk.size), bk.size);
  // Keep the bucket in address order: walk to the first block above this one (buckets are short).
  const int64_t addr = blocks_[b].addr;
  int32_t prev = -1, cur = bk.head;
  while (cur != -1 && blocks_[cur].addr < addr) prev = cur, cur = blocks_[cur].free_next;
  blocks_[b].free_prev = prev;
  blocks_[b].free_next = cur;
  if (cur != -1) blocks_[cur].free_prev = b;
  if (prev != -1) blocks_[prev].free_next = b;
  else bk.head = b;
  ++set.count;
}

void CachingAllocator::erase_free(int32_t b) {
  FreeSet& set = pool(blocks_[b].small);
  Bucket* bk = find_bucket(set, blocks_[b].size);
  if (!bk) return;
  Block& blk = blocks_[b];
  if (blk.free_prev == -1 && bk->head != b) return;  // not cached
  if (blk.free_prev != -1) blocks_[blk.free_prev].free_next = blk.free_next;
  else bk->head = blk.free_next;
  if (blk.free_next != -1) blocks_[blk.free_next].free_prev = blk.free_prev;
  blk.free_prev = blk.free_next = -1;
  --set.count;
  if (bk->head == -1) set.sizes.erase(std::lower_bound(set.sizes.begin(), set.sizes.end(), bk->size));
}

int32_t CachingAllocator::take_best_fit(FreeSet& set, int64_t size) {
  Bucket* bk = find_bucket(set, size);
  if (!bk || bk->head == -1) {
    auto it = std::lower_bound(set.sizes.begin(), set.sizes.end(), size);
    if (it == set.sizes.end()) return -1;
    bk = find_bucket(set, *it);
  }
  const int32_t b = bk->head;
  erase_free(b);
  return b;
}

// release_cached_blocks: every cached segment that is entirely free goes back to the driver.
void CachingAllocator::release_cached_segments() {
  for (FreeSet* set : {&free_small_, &free_large_}) {
    for (size_t i = 0; i < set->table.size(); ++i) {
      for (int32_t b = set->table[i].head; b != -1;) {
        const int32_t next = blocks_[b].free_next;
        if (blocks_[b].prev == -1 && blocks_[b].next == -1) {
          erase_free(b);
          reserved_ -= blocks_[b].size;
          --segments_;
          spare_.push_back(b);
        }
        b = next;
      }
    }
  }
}

int32_t CachingAllocator::malloc(int64_t requested_bytes, int64_t segment_address) {
  const int64_t size = round_size(requested_bytes);
  const bool small = size <= kSmallSize;
  FreeSet& set = pool(small);
  int32_t b = take_best_fit(set, size);
  if (b < 0) {
    const int64_t seg = allocation_size(size);
    if (reserved_ + seg > capacity_) release_cached_segments();
    if (reserved_ + seg > capacity_) return -1;
    b = new_block();
    blocks_[b].addr = segment_address >= 0 ? segment_address : next_addr_;
    blocks_[b].size = seg;
    blocks_[b].small = small;
    next_addr_ = add(next_addr_, seg);
    reserved_ += seg;
    ++segments_;
  }
  // should_split: the small pool splits on any remainder >= 512 B; the large pool only if > 1 MiB remains.
  const int64_t remaining = blocks_[b].size - size;
  const bool split = small ? remaining >= kMinBlockSize : remaining > kSmallSize;
  if (split) {
    int32_t r = new_block();
    Block& blk = blocks_[b];
    Block& rest = blocks_[r];
    rest.addr = blk.addr + size;
    rest.size = remaining;
    rest.small = blk.small;
    rest.prev = b;
    rest.next = blk.next;
    if (blk.next != -1) blocks_[blk.next].prev = r;
    blk.next = r;
    blk.size = size;
    insert_free(r);
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
  blk->allocated = false;
  allocated_ -= blk->size;
  requested_ -= blk->requested;
  // try_merge_blocks: coalesce with free neighbours of the same segment.
  for (int32_t nb : {blk->prev, blk->next}) {
    if (nb == -1 || blocks_[nb].allocated) continue;
    erase_free(nb);
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
  insert_free(handle);
}

}  // namespace memsim
