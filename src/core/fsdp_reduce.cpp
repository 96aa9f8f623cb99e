#include "fsdp_reduce.h"

#include "checked.h"

namespace memsim {

void FsdpReduce::configure(size_t slots, bool fsdp2, bool accumulate_no_sync) {
  shards_.clear();
  shard_made_.assign(slots, false);
  accumulated_.assign(slots, UINT32_MAX);
  pending_input_ = UINT32_MAX;
  fsdp2_ = fsdp2;
  accumulate_no_sync_ = accumulate_no_sync;
}

// Pipeline stages under FSDP accumulate unsharded gradients and reduce once after the last micro-batch
// (torch/distributed/pipelining/stage.py backward_maybe_with_nosync: set_requires_gradient_sync(False), then
// post_backward of every group); FSDP2 accumulates them in the reduce dtype (_fsdp_param.py
// to_accumulated_grad_if_needed).
void FsdpReduce::accumulate(Host& host, int64_t slot, int64_t reduce_bytes) {
  uint32_t& acc = accumulated_[index(slot)];
  if (acc == UINT32_MAX) acc = host.alloc(Buffer::Accumulated, mul(host.slot_gradients(slot, false).numel, reduce_bytes), slot);
  host.release_slot_grads(slot);
}

// FSDP2 copies the gradients into one flat input in the reduce dtype (fp32 under torchtitan's MixedPrecisionPolicy)
// that lives until the next group's reduce (_fsdp_collectives.py foreach_reduce, _fsdp_param_group.py post_backward:
// reduce_scatter_state), on the compute stream (PR #129721, torch 2.5); FSDP1 reduce-scatters the flat gradient
// itself (_runtime_utils.py _reduce_grad). The reduce-scatter output is allocated on the reduce-scatter stream and
// becomes the sharded gradient (FSDP2 foreach_reduce: reduce_output under reduce_scatter_stream; FSDP1
// _post_backward_hook: new_sharded_grad = torch.empty_like(...) under the post-backward stream), so the gradients
// live in that stream's pool until zero_grad. The first micro-batch's output becomes the shard; later ones add into
// it.
void FsdpReduce::reduce(Host& host, int64_t slot, int64_t reduce_bytes, bool shard_on_host) {
  const Host::Gradients g = host.slot_gradients(slot, true);
  uint32_t input = UINT32_MAX;
  if (fsdp2_) {
    if (pending_input_ != UINT32_MAX) host.release(pending_input_), pending_input_ = UINT32_MAX;
    input = host.alloc(Buffer::ReduceInput, mul(g.numel, reduce_bytes), slot);
  }
  host.release_slot_grads(slot);
  uint32_t& acc = accumulated_[index(slot)];
  if (acc != UINT32_MAX) host.release(acc), acc = UINT32_MAX;
  if (!shard_made_[index(slot)] && !shard_on_host) {
    shard_made_[index(slot)] = true;
    shards_.push_back(host.alloc(Buffer::GradShard, g.shard_bytes, slot));
  } else {
    host.release(host.alloc(Buffer::ReduceOutput, g.shard_bytes, slot));  // added into the shard, or sent to the host
  }
  if (input != UINT32_MAX) pending_input_ = input;
}

void FsdpReduce::end_backward(Host& host) {
  if (pending_input_ != UINT32_MAX) host.release(pending_input_), pending_input_ = UINT32_MAX;
}

void FsdpReduce::release_shards(Host& host) {
  for (uint32_t s : shards_) host.release(s);
  shards_.clear();
  shard_made_.assign(shard_made_.size(), false);
}

}  // namespace memsim
