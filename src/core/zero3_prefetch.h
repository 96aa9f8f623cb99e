// DeepSpeed ZeRO-3's parameter fetching, as an engine of its own: which parameters are all-gathered when a module
// runs, which are prefetched ahead of it along the recorded module trace, and when the prefetched ones go. The step
// builder (sharding.cpp) is its Host: it names each slot's parameters and makes and frees the gathered buffers.
// Internal to the core.
#pragma once
#include <cstdint>
#include <deque>
#include <vector>

#include "model.h"

namespace memsim {

class Zero3Prefetch {
 public:
  // What the fetch asks of the step it runs in. Slots are -1 (the embeddings), the layers, and num_layers (the head).
  class Host {
   public:
    virtual const std::vector<ParamTensor>& params(int64_t slot) const = 0;
    virtual bool persistent(const ParamTensor& t) const = 0;  // stage3_param_persistence_threshold: never released
    virtual uint32_t gather(const ParamTensor& t, int64_t slot) = 0;  // the all-gathered buffer of one parameter
    virtual void release(uint32_t buffer) = 0;

   protected:
    ~Host() = default;
  };
  // The module trace this device follows: its layers [first_layer, end_layer), and in forward the head where the
  // device has it (the slot num_layers). Where it has the head (the whole model), the recorded trace is one forward
  // and then its backward, layers end_layer - 1 down to first_layer (the head's backward reuses its forward's
  // parameters, which the step keeps).
  struct Trace {
    int64_t first_layer = 0, end_layer = 0, num_layers = 0;
    bool has_post = false;
    bool forward_only = false;  // an engine that only runs forwards (a TRL reference model): its trace ends at the head
    // The lowest layer whose backward runs (layers below a LLaMA-Adapter's first trained one have none): the
    // backward half of the trace stops there.
    int64_t backward_first_layer = 0;
  };

  // A module of `slot` runs (`backward`: its backward): its own parameters go to `out`, those prefetched already
  // taken over, the rest gathered now; then, once the trace is recorded, parameters further along it are prefetched
  // while fewer than `max_live_elements` are gathered.
  void fetch(Host& host, int64_t slot, bool backward, int64_t max_live_elements, const Trace& trace,
             std::vector<uint32_t>& out);
  // Frees every prefetched parameter (a pass ended, or another one starts).
  void release_window(Host& host);
  // The first forward and backward are done: the coordinator has the module trace, and prefetches from now on.
  void trace_recorded() { trace_complete_ = true; }
  int64_t prefetched_elements() const { return ahead_elems_; }

 private:
  // Parameters prefetched ahead of the module computing, slot by slot in trace order (the last slot may be partly
  // gathered: next_param is its first parameter not yet gathered).
  struct Slot {
    int64_t slot = 0;
    bool backward = false;  // the slot's backward (its use in the trace's backward half)
    // A backward use reached while the slot's forward parameters are still gathered (this fetch's own, or ahead in
    // the window): DeepSpeed only marks them (AVAILABLE: do_prefetch false) and keeps them to this use, so nothing is
    // gathered for it; the forward's buffers move in once that forward is done.
    bool kept = false;
    size_t next_param = 0;
    std::vector<uint32_t> tensors;
    int64_t elems = 0;
  };
  // The slot after (slot, backward) along the trace, false where the trace ends there.
  static bool next_in_trace(const Trace& trace, int64_t& slot, bool& backward);
  std::deque<Slot> window_;
  int64_t ahead_elems_ = 0;      // elements gathered ahead
  bool trace_complete_ = false;
};

}  // namespace memsim
