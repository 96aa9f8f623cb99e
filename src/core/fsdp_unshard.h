// FSDP's unsharded parameters as an engine of their own: which units are all-gathered before a module runs, which
// stay unsharded from forward to backward, which are prefetched, and when they are resharded. FSDP1 all-gathers
// into the flat parameter's storage; FSDP2 into one flat buffer that it copies out of. The gradient side (the
// reduce-scatters into gradient shards) is FsdpReduce (fsdp_reduce.h); the step builder (sharding.cpp) is both
// engines' Host. Internal to the core.
#pragma once
#include <cstdint>
#include <vector>

#include "step.h"

namespace memsim {

class FsdpUnshard {
 public:
  // What the engine asks of the step. Slots are -1 (the embeddings), the layers, and num_layers (the head).
  class Host {
   public:
    virtual int64_t unsharded_bytes(int64_t slot) const = 0;  // a unit's parameters, all-gathered
    // FSDP2's all-gather buffer (all_gather_buffer) or the unsharded parameters, on `stream`.
    virtual uint32_t alloc(int64_t bytes, bool all_gather_buffer, int64_t slot, Stream stream) = 0;
    virtual void release(uint32_t tensor) = 0;

   protected:
    ~Host() = default;
  };
  // How a unit is unsharded for one module call.
  struct Call {
    bool backward = false;
    bool keep = false;            // the parameters stay unsharded until the unit's backward (reshard_after_backward)
    int64_t prefetch_depth = 0;   // further units all-gathered with this one, in the pass's order
    int64_t first_layer = 0, end_layer = 0;  // the layers a prefetch may reach
  };

  // `slots`: the model's slots (num_layers + 2). `fsdp2`: FSDP2's flat all-gather buffer and copy-out.
  // `copy_only`: FSDP2 over one rank without the all-gather (Resolved::fsdp2_one_rank_skips_all_gather): no flat
  // buffer, and a prefetch allocates nothing, since unshard() only records an empty result and each unit's buffer is
  // made in its own wait_for_unshard.
  void configure(size_t slots, bool fsdp2, bool no_sync, bool copy_only = false);
  // A module of `slot` is about to run: its parameters, and any prefetched, go to `out` unless kept.
  void unshard(Host& host, int64_t slot, const Call& call, std::vector<uint32_t>& out);
  // The unit's backward is done: parameters kept since forward go (nothing under no_sync: they stay to the end).
  void reshard_after_backward(Host& host, int64_t slot);
  // FSDP2's forward all-gather buffer waits for the next unshard; the root's post_forward frees the last one.
  void release_all_gather(Host& host);
  // A step's backward is over: anything still unsharded (a stage without its backward) is freed.
  void release_kept(Host& host);
  // Pipeline stages under FSDP: parameters stay unsharded and gradients accumulate to the last backward.
  bool no_sync() const { return no_sync_; }
  bool kept(int64_t slot) const { return !kept_[static_cast<size_t>(slot + 1)].empty(); }

 private:
  void unshard_one(Host& host, int64_t slot, bool backward, std::vector<uint32_t>& into);
  std::vector<std::vector<uint32_t>> kept_;  // per slot: parameters kept from forward to backward
  uint32_t pending_all_gather_ = UINT32_MAX;
  bool fsdp2_ = false;
  bool no_sync_ = false;
  bool copy_only_ = false;
};

}  // namespace memsim
