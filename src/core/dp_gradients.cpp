#include "dp_gradients.h"

namespace memsim {

// PyTorch DDP: a flat bucket copy of every gradient, allocated when the model is wrapped and kept for the run
// (reducer.cpp Reducer::initialize_buckets: bucket.gradients = at::empty(...), from the constructor, and again of
// the same size when rebuild_buckets reorders them after the first iteration); zero_grad frees only .grad.
void DataParallelGradients::with_model(Host& host) {
  if (plan_.ddp_bucket) host.alloc(Buffer::DdpBucket, host.whole_gradient_bytes());
}

// ZeRO-3 allocates its gradient bucket with the optimizer (stage3.py _setup_for_real_optimizer:
// __ipg_bucket_flat_buffer of reduce_bucket_size elements in the model dtype, contiguous_gradients on).
void DataParallelGradients::with_optimizer(Host& host) {
  if (plan_.zero3_bucket) host.alloc(Buffer::ReduceBucket, plan_.bucket_bytes);
}

// ZeRO-2/3 reduce each layer's full gradients into the flat partition and free them (stage_1_and_2.py, stage3.py:
// grad_partitions_flat_buffer). ZeRO-1/2 reduce gradients through ipg buffers of reduce_bucket_size elements in the
// model dtype, two with overlap_comm (stage_1_and_2.py backward: buf_0, buf_1). They stay allocated from the first
// backward on.
void DataParallelGradients::gradients_begin(Host& host) {
  if (live_) return;
  live_ = true;
  if (plan_.partition) partitions_.push_back(host.alloc(Buffer::Partition, host.partition_bytes()));
  if (plan_.reduce_buckets > 0 && !buffers_made_) {
    buffers_made_ = true;
    for (int i = 0; i < plan_.reduce_buckets; ++i) host.alloc(Buffer::ReduceBucket, plan_.bucket_bytes);
  }
}

void DataParallelGradients::zero_grad(Host& host) {
  for (uint32_t p : partitions_) host.release(p);
  partitions_.clear();
  live_ = false;
}

}  // namespace memsim
