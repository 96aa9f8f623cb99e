// FSDP's all-gathers and reshards (fsdp_unshard.h).
#include "fsdp_unshard.h"

namespace memsim {

void FsdpUnshard::configure(size_t slots, bool fsdp2, bool no_sync, bool copy_only) {
  kept_.resize(slots);
  fsdp2_ = fsdp2;
  no_sync_ = no_sync;
  copy_only_ = copy_only;
}

// FSDP2 all-gathers into one flat buffer on its all-gather copy-in stream and copies out into per-parameter tensors
// on the compute stream (_fsdp_collectives.py foreach_all_gather, foreach_all_gather_copy_out). In forward the buffer
// waits for the next group's unshard ("Defer free to allow for overlap of this copy-out with next all-gather",
// _fsdp_param_group.py wait_for_unshard); in backward it goes after the copy-out. FSDP1 all-gathers straight into
// the flat parameter's padded storage on its unshard stream.
void FsdpUnshard::unshard_one(Host& host, int64_t slot, bool backward, std::vector<uint32_t>& into) {
  const int64_t bytes = host.unsharded_bytes(slot);
  if (bytes == 0) return;
  // One rank from torch 2.9: each parameter's shard is cast into the unit's buffer on the compute stream (one
  // parameter's 16-bit cast at a time beside it, left out).
  const uint32_t flat = fsdp2_ && !copy_only_ ? host.alloc(bytes, true, slot, Stream::AllGather) : UINT32_MAX;
  if (fsdp2_ && !backward) release_all_gather(host);
  into.push_back(host.alloc(bytes, false, slot, fsdp2_ ? Stream::Compute : Stream::AllGather));
  if (flat != UINT32_MAX) {
    if (backward) host.release(flat);
    else pending_all_gather_ = flat;
  }
}

// Backward prefetch: FSDP2 unshards the next group in backward order (_fsdp_param_group.py _prefetch_unshard), or the
// k set by set_modules_to_backward_prefetch; FSDP1 does with BACKWARD_PRE (the default), holding "the current set of
// parameters, next set of parameters, and current set of gradients". In forward, FSDP1's forward_prefetch and
// FSDP2's set_modules_to_forward_prefetch all-gather the next unit(s) during this one; neither prefetches in forward
// by default. A prefetched unit's parameters are held with this one's; a unit kept already is not gathered again.
void FsdpUnshard::unshard(Host& host, int64_t slot, const Call& call, std::vector<uint32_t>& out) {
  auto& kept = kept_[static_cast<size_t>(slot + 1)];
  if (call.keep) {
    if (kept.empty()) unshard_one(host, slot, call.backward, kept);  // in backward too: e.g. a later micro-batch
  } else {
    unshard_one(host, slot, call.backward, out);
  }
  const int64_t step = call.backward ? -1 : 1;
  for (int64_t j = 1; j <= (copy_only_ ? 0 : call.prefetch_depth); ++j) {
    const int64_t next = slot + step * j;
    if (next < call.first_layer || next >= call.end_layer) break;
    if (!kept_[static_cast<size_t>(next + 1)].empty()) continue;
    unshard_one(host, next, call.backward, out);
  }
}

void FsdpUnshard::reshard_after_backward(Host& host, int64_t slot) {
  if (no_sync_) return;
  auto& k = kept_[static_cast<size_t>(slot + 1)];
  for (uint32_t t : k) host.release(t);
  k.clear();
}

void FsdpUnshard::release_all_gather(Host& host) {
  if (pending_all_gather_ != UINT32_MAX) host.release(pending_all_gather_), pending_all_gather_ = UINT32_MAX;
}

void FsdpUnshard::release_kept(Host& host) {
  for (auto& k : kept_) {
    for (uint32_t t : k) host.release(t);
    k.clear();
  }
}

}  // namespace memsim
