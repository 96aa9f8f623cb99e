// The gradient side of data parallelism outside FSDP, as an engine of its own: DDP's flat bucket copy of every
// gradient (and, from the second step, .grad tensors that are views into it), and DeepSpeed ZeRO's buffers: ZeRO-3's
// ipg bucket, made with the optimizer; ZeRO-1/2's ipg buffers, made at the run's first backward and kept; ZeRO-2/3's
// flat gradient partition, from each step's first backward to zero_grad. Which ones a run has is the step's to say
// (configure); the step (sharding.cpp) is this engine's Host. Internal to the core.
#pragma once
#include <cstdint>
#include <vector>

namespace memsim {

class DataParallelGradients {
 public:
  enum class Buffer {
    DdpBucket,     // DDP's flat copy of every gradient (communication)
    ReduceBucket,  // a ZeRO ipg bucket of reduce_bucket_size elements (communication)
    Partition,     // ZeRO-2/3's flat partition of the gradients on this rank (gradients)
  };
  class Host {
   public:
    virtual int64_t whole_gradient_bytes() const = 0;  // every gradient this device makes, unsharded
    virtual int64_t partition_bytes() const = 0;       // this rank's partition of them
    virtual uint32_t alloc(Buffer buffer, int64_t bytes) = 0;
    virtual void release(uint32_t tensor) = 0;

   protected:
    ~Host() = default;
  };
  struct Plan {
    bool ddp_bucket = false;         // DDP over several ranks: the bucket, allocated when the model is wrapped
    bool ddp_views = false;          // gradient_as_bucket_view: from the second step .grad is a view of the bucket
    bool zero3_bucket = false;       // ZeRO-3's ipg bucket, allocated with the optimizer
    bool partition = false;          // ZeRO-2/3's flat partition on the GPU (not with the optimizer offloaded)
    int reduce_buckets = 0;          // ZeRO-1/2's ipg buffers: 1, or 2 with overlap_comm
    int64_t bucket_bytes = 0;        // one ipg bucket (ZeRO-1/2/3): reduce_bucket_size in the model dtype
  };

  void configure(const Plan& plan) { plan_ = plan; }
  void with_model(Host& host);      // the model is wrapped: DDP's bucket
  void with_optimizer(Host& host);  // the optimizer is built: ZeRO-3's bucket
  // A step's first gradient is about to be made: the partition, and at the run's first the ZeRO-1/2 buffers.
  void gradients_begin(Host& host);
  bool gradients_live() const { return live_; }
  // The step `iter` begins: DDP's .grad tensors are views of the bucket from the second (rebuild_buckets after the
  // first iteration). share_step takes another engine's state, one DDP over two models (PPO's value model).
  void step_begins(int iter) { views_ = plan_.ddp_views && iter >= 2; }
  bool bucket_views() const { return views_; }
  void share_step(const DataParallelGradients& other) { views_ = other.views_; }
  void zero_grad(Host& host);  // the partition goes

 private:
  Plan plan_;
  std::vector<uint32_t> partitions_;
  bool live_ = false, buffers_made_ = false, views_ = false;
};

}  // namespace memsim
