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

// release_cached_blocks: every cached segment that is entirely free goes back to the driver.
void CachingAllocator::release_cached_segments() {
  for (FreeSet* set : {&free_small_, &free_large_}) {
    set->erase(std::remove_if(set->begin(), set->end(),
                              [&](const Key& k) {
                                const int32_t b = k.block;
                                if (blocks_[b].prev != -1 || blocks_[b].next != -1) return false;
                                reserved_ -= blocks_[b].size;
                                --segments_;
                                spare_.push_back(b);
                                return true;
                              }),
               set->end());
  }
}

int32_t CachingAllocator::malloc(int64_t requested_bytes) {
  const int64_t size = round_size(requested_bytes);
  const bool small = size <= kSmallSize;
  FreeSet& set = pool(small);
  int32_t b = -1;
  auto it = std::lower_bound(set.begin(), set.end(), Key{size, INT64_MIN, -1});
  if (it != set.end()) {
    b = it->block;
    set.erase(it);
  } else {
    const int64_t seg = allocation_size(size);
    if (reserved_ + seg > capacity_) release_cached_segments();
    if (reserved_ + seg > capacity_) return -1;
    b = new_block();
    blocks_[b].addr = next_addr_;
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
