// FSDP's gradient side on its own (fsdp_reduce.cpp), against a host that records what is allocated and released:
// the first reduce of a step makes the unit's gradient shard and later ones add into it through a transient output,
// FSDP2's reduce-scatter input waits for the next reduce (or the end of the backward), no_sync accumulates each
// unit's gradients once per step in the reduce dtype until its reduce takes them, an offloaded optimizer keeps no
// shard on the GPU, and zero_grad lets the shards go.
#include <catch2/catch.hpp>

#include <map>

#include "core/fsdp_reduce.h"

using namespace memsim;

namespace {

using Buffer = FsdpReduce::Buffer;

class FakeHost final : public FsdpReduce::Host {
 public:
  // Every slot: 10 elements trained, a shard of 5 bytes; the head's tied embedding adds 100 and 50.
  Gradients slot_gradients(int64_t slot, bool tied_head) const override {
    Gradients g{10, 5};
    if (tied_head && slot == 8) g.numel += 100, g.shard_bytes += 50;
    return g;
  }
  uint32_t alloc(Buffer buffer, int64_t bytes, int64_t slot) override {
    live[next_] = {buffer, bytes, slot};
    ++made[buffer];
    return next_++;
  }
  void release(uint32_t tensor) override { live.erase(tensor); }
  void release_slot_grads(int64_t slot) override { ++grads_released[slot]; }
  int count(Buffer b) const {
    int n = 0;
    for (const auto& [id, t] : live) n += t.buffer == b;
    return n;
  }
  int64_t bytes(Buffer b) const {
    int64_t n = 0;
    for (const auto& [id, t] : live) n += t.buffer == b ? t.bytes : 0;
    return n;
  }
  struct Tensor {
    Buffer buffer;
    int64_t bytes, slot;
  };
  std::map<uint32_t, Tensor> live;
  std::map<Buffer, int> made;
  std::map<int64_t, int> grads_released;

 private:
  uint32_t next_ = 0;
};

}  // namespace

TEST_CASE("FSDP1: the first reduce of a step makes the shard, later ones add into it, zero_grad lets it go") {
  FakeHost host;
  FsdpReduce f;
  f.configure(10, false, false);
  f.reduce(host, 3, 4, false);
  CHECK(host.count(Buffer::GradShard) == 1);
  CHECK(host.count(Buffer::ReduceInput) == 0);  // FSDP1 reduce-scatters the flat gradient itself
  CHECK(host.grads_released[3] == 1);
  f.reduce(host, 3, 4, false);  // the next micro-batch: a transient output added into the shard
  CHECK(host.count(Buffer::GradShard) == 1);
  CHECK(host.made[Buffer::ReduceOutput] == 1);
  CHECK(host.count(Buffer::ReduceOutput) == 0);
  f.reduce(host, 8, 4, false);  // the head reduces its tied embedding with it
  CHECK(host.bytes(Buffer::GradShard) == 5 + 55);
  f.release_shards(host);
  CHECK(host.live.empty());
  f.reduce(host, 3, 4, false);  // a new step makes the shard again
  CHECK(host.count(Buffer::GradShard) == 1);
}

TEST_CASE("FSDP2: the reduce-scatter input in the reduce dtype waits for the next reduce or the backward's end") {
  FakeHost host;
  FsdpReduce f;
  f.configure(10, true, false);
  f.reduce(host, 7, 4, false);
  CHECK(host.count(Buffer::ReduceInput) == 1);
  CHECK(host.bytes(Buffer::ReduceInput) == 40);  // 10 elements in fp32
  f.reduce(host, 6, 4, false);
  CHECK(host.count(Buffer::ReduceInput) == 1);  // layer 6's replaced layer 7's
  f.end_backward(host);
  CHECK(host.count(Buffer::ReduceInput) == 0);
  CHECK(host.count(Buffer::GradShard) == 2);
}

TEST_CASE("no_sync: gradients accumulate once per unit in the reduce dtype until the unit's reduce takes them") {
  FakeHost host;
  FsdpReduce f;
  f.configure(10, true, true);
  CHECK(f.accumulate_no_sync());
  f.accumulate(host, 2, 4);
  f.accumulate(host, 2, 4);  // the second micro-batch adds into the same buffer
  CHECK(host.count(Buffer::Accumulated) == 1);
  CHECK(host.bytes(Buffer::Accumulated) == 40);
  CHECK(host.grads_released[2] == 2);
  CHECK(f.accumulated(2));
  f.accumulate(host, 8, 4);  // the head's accumulation leaves out the tied embedding
  CHECK(host.bytes(Buffer::Accumulated) == 80);
  f.reduce(host, 2, 4, false);  // the last micro-batch reduces
  CHECK_FALSE(f.accumulated(2));
  CHECK(host.count(Buffer::Accumulated) == 1);
  CHECK(host.count(Buffer::GradShard) == 1);
}

TEST_CASE("an optimizer offloaded to the host keeps no gradient shard on the GPU") {
  FakeHost host;
  FsdpReduce f;
  f.configure(10, false, false);
  f.reduce(host, 1, 4, true);
  f.reduce(host, 1, 4, true);
  CHECK(host.made[Buffer::GradShard] == 0);
  CHECK(host.made[Buffer::ReduceOutput] == 2);
  CHECK(host.live.empty());
}
