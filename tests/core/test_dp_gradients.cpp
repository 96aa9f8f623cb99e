// DDP's and DeepSpeed ZeRO's gradient buffers on their own (dp_gradients.cpp), against a host that records what is
// allocated and released: DDP's bucket comes with the model and its views from the second step, ZeRO-3's ipg bucket
// with the optimizer, ZeRO-1/2's ipg buffers once per run at the first backward, and ZeRO-2/3's partition at each
// step's first backward until zero_grad; a plan without them makes nothing.
#include <catch2/catch.hpp>

#include <map>

#include "core/dp_gradients.h"

using namespace memsim;

namespace {

using Buffer = DataParallelGradients::Buffer;

class FakeHost final : public DataParallelGradients::Host {
 public:
  int64_t whole_gradient_bytes() const override { return 1000; }
  int64_t partition_bytes() const override { return 125; }
  uint32_t alloc(Buffer buffer, int64_t bytes) override {
    live[next_] = {buffer, bytes};
    return next_++;
  }
  void release(uint32_t tensor) override { live.erase(tensor); }
  int count(Buffer b) const {
    int n = 0;
    for (const auto& [id, t] : live) n += t.buffer == b;
    return n;
  }
  struct Tensor {
    Buffer buffer;
    int64_t bytes;
  };
  std::map<uint32_t, Tensor> live;

 private:
  uint32_t next_ = 0;
};

}  // namespace

TEST_CASE("DDP: the bucket copy of every gradient comes with the model, and .grad views it from the second step") {
  FakeHost host;
  DataParallelGradients d;
  DataParallelGradients::Plan p;
  p.ddp_bucket = p.ddp_views = true;
  d.configure(p);
  d.with_model(host);
  d.with_optimizer(host);
  REQUIRE(host.live.size() == 1);
  CHECK(host.live.begin()->second.bytes == 1000);
  d.step_begins(1);
  CHECK_FALSE(d.bucket_views());
  d.gradients_begin(host);
  CHECK(host.live.size() == 1);  // DDP keeps no partition
  d.zero_grad(host);
  d.step_begins(2);
  CHECK(d.bucket_views());
  DataParallelGradients value_model;  // PPO's value model shares the policy's DDP wrapper
  value_model.share_step(d);
  CHECK(value_model.bucket_views());
  CHECK(host.count(Buffer::DdpBucket) == 1);  // kept for the run
}

TEST_CASE("ZeRO-2: the partition lives from each step's first backward to zero_grad, the ipg buffers once a run") {
  FakeHost host;
  DataParallelGradients d;
  DataParallelGradients::Plan p;
  p.partition = true;
  p.reduce_buckets = 2;  // overlap_comm
  p.bucket_bytes = 40;
  d.configure(p);
  d.with_model(host);
  d.with_optimizer(host);
  CHECK(host.live.empty());
  for (int step = 1; step <= 2; ++step) {
    d.gradients_begin(host);
    d.gradients_begin(host);  // later layers and micro-batches of the step make nothing more
    CHECK(d.gradients_live());
    CHECK(host.count(Buffer::Partition) == 1);
    CHECK(host.count(Buffer::ReduceBucket) == 2);
    d.zero_grad(host);
    CHECK_FALSE(d.gradients_live());
    CHECK(host.count(Buffer::Partition) == 0);
    CHECK(host.count(Buffer::ReduceBucket) == 2);  // kept
  }
}

TEST_CASE("ZeRO-3: one ipg bucket with the optimizer, and the partition per step") {
  FakeHost host;
  DataParallelGradients d;
  DataParallelGradients::Plan p;
  p.zero3_bucket = p.partition = true;
  p.bucket_bytes = 40;
  d.configure(p);
  d.with_optimizer(host);
  CHECK(host.count(Buffer::ReduceBucket) == 1);
  d.gradients_begin(host);
  CHECK(host.count(Buffer::Partition) == 1);
  CHECK(host.count(Buffer::ReduceBucket) == 1);
  DataParallelGradients none;  // one GPU without ZeRO: nothing
  none.configure({});
  FakeHost other;
  none.with_model(other);
  none.with_optimizer(other);
  none.gradients_begin(other);
  CHECK(other.live.empty());
}
