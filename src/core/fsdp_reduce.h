// FSDP's gradient side as an engine of its own: each unit's gradients reduce-scattered into a gradient shard that
// lives until zero_grad, FSDP2's reduce-scatter input held until the next unit's reduce, and the unsharded
// gradients that accumulate over micro-batches where nothing is reduced until the last one (no_sync). The parameter
// side is FsdpUnshard (fsdp_unshard.h); when a unit reduces or accumulates is the step's to say (sharding.cpp
// release_layer_grads), and the step is this engine's Host. Internal to the core.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace memsim {

class FsdpReduce {
 public:
  // The buffers the engine makes, each of which the host allocates with its component, label and stream.
  enum class Buffer {
    ReduceInput,   // FSDP2: the gradients copied into one flat input in the reduce dtype (compute stream)
    ReduceOutput,  // a reduce-scatter's output that is added into the shard at once (reduce-scatter stream)
    GradShard,     // the first reduce's output, which becomes the unit's gradient shard (reduce-scatter stream)
    Accumulated,   // no_sync: the unit's unsharded gradients, accumulated in the reduce dtype (compute stream)
  };
  // What the engine asks of the step. Slots are -1 (the embeddings), the layers, and num_layers (the head).
  class Host {
   public:
    struct Gradients {
      int64_t numel = 0;        // elements of the slot's trainable parameters
      int64_t shard_bytes = 0;  // this rank's shard of their gradients
    };
    // `tied_head`: the head's slot also reduces the embedding matrix it is tied to.
    virtual Gradients slot_gradients(int64_t slot, bool tied_head) const = 0;
    virtual uint32_t alloc(Buffer buffer, int64_t bytes, int64_t slot) = 0;
    virtual void release(uint32_t tensor) = 0;
    // The slot's .grad tensors go: reduced, or added into the accumulated gradients (the next backward makes new
    // ones).
    virtual void release_slot_grads(int64_t slot) = 0;

   protected:
    ~Host() = default;
  };

  // `slots`: the model's slots (num_layers + 2). `fsdp2`: FSDP2's reduce-scatter input. `accumulate_no_sync`: the
  // framework accumulates micro-batches under no_sync (FrameworkSpec::fsdp_no_sync_accumulation).
  void configure(size_t slots, bool fsdp2, bool accumulate_no_sync);
  bool accumulate_no_sync() const { return accumulate_no_sync_; }
  // A micro-batch before the last under no_sync: the slot's .grad tensors are added into its unsharded gradients
  // in the reduce dtype (`reduce_bytes` per element), made at the first.
  void accumulate(Host& host, int64_t slot, int64_t reduce_bytes);
  // Whether the slot holds accumulated gradients that its reduce will take.
  bool accumulated(int64_t slot) const { return accumulated_[index(slot)] != UINT32_MAX; }
  // The slot's gradients are reduce-scattered: FSDP2 first copies them into the flat input (the previous one goes),
  // the .grad tensors and any accumulated ones go, and the output becomes the gradient shard at the first reduce
  // of a step, or is added into it later (or copied to the host where the optimizer is offloaded: `shard_on_host`).
  void reduce(Host& host, int64_t slot, int64_t reduce_bytes, bool shard_on_host);
  // The backward is over: FSDP2's last reduce-scatter input goes.
  void end_backward(Host& host);
  // zero_grad: the gradient shards go.
  void release_shards(Host& host);

 private:
  static size_t index(int64_t slot) { return static_cast<size_t>(slot + 1); }
  std::vector<uint32_t> shards_;       // gradient shards, until zero_grad
  std::vector<bool> shard_made_;       // per slot: its shard exists this step
  std::vector<uint32_t> accumulated_;  // per slot: no_sync's unsharded gradients
  uint32_t pending_input_ = UINT32_MAX;
  bool fsdp2_ = false;
  bool accumulate_no_sync_ = false;
};

}  // namespace memsim
