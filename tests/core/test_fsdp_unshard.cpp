// FSDP's unsharded parameters on their own (fsdp_unshard.cpp), against a host that records what is allocated and
// released: FSDP2's all-gather buffer waits for the next unshard in forward and goes at once in backward, FSDP1 has
// none, kept units are gathered once and resharded after their backward (never under no_sync), and a prefetch
// skips units that are kept already and stops at the layers' end.
#include <catch2/catch.hpp>

#include <map>

#include "core/fsdp_unshard.h"

using namespace memsim;

namespace {

class FakeHost final : public FsdpUnshard::Host {
 public:
  int64_t unsharded_bytes(int64_t slot) const override { return slot < 0 ? 1000 : 100; }
  uint32_t alloc(int64_t bytes, bool all_gather_buffer, int64_t slot, Stream) override {
    live[next_] = {bytes, all_gather_buffer, slot};
    return next_++;
  }
  void release(uint32_t tensor) override { live.erase(tensor); }
  int count(bool buffers) const {
    int n = 0;
    for (const auto& [id, t] : live) n += t.buffer == buffers;
    return n;
  }
  struct Tensor {
    int64_t bytes;
    bool buffer;
    int64_t slot;
  };
  std::map<uint32_t, Tensor> live;

 private:
  uint32_t next_ = 0;
};

FsdpUnshard::Call forward(int64_t depth = 0) { return {false, false, depth, 0, 8}; }

}  // namespace

TEST_CASE("FSDP2's forward all-gather buffer waits for the next unshard, in backward it goes after the copy-out") {
  FakeHost host;
  FsdpUnshard f;
  f.configure(10, true, false);
  std::vector<uint32_t> out;
  f.unshard(host, 0, forward(), out);
  CHECK(out.size() == 1);
  CHECK(host.count(true) == 1);  // layer 0's buffer, deferred
  f.unshard(host, 1, forward(), out);
  CHECK(host.count(true) == 1);  // layer 1's replaced it
  f.release_all_gather(host);
  CHECK(host.count(true) == 0);
  FsdpUnshard::Call back = forward();
  back.backward = true;
  f.unshard(host, 7, back, out);
  CHECK(host.count(true) == 0);
}

TEST_CASE("FSDP1 all-gathers into the flat parameter itself, with no separate buffer") {
  FakeHost host;
  FsdpUnshard f;
  f.configure(10, false, false);
  std::vector<uint32_t> out;
  f.unshard(host, 3, forward(), out);
  CHECK(out.size() == 1);
  CHECK(host.count(true) == 0);
}

TEST_CASE("FSDP keeps a unit unsharded once until its backward, and not at all past it under no_sync") {
  FakeHost host;
  FsdpUnshard f;
  f.configure(10, false, false);
  std::vector<uint32_t> out;
  FsdpUnshard::Call keep = forward();
  keep.keep = true;
  f.unshard(host, -1, keep, out);
  f.unshard(host, -1, keep, out);  // a later micro-batch: still there, not gathered again
  CHECK(out.empty());
  CHECK(host.live.size() == 1);
  CHECK(f.kept(-1));
  f.reshard_after_backward(host, -1);
  CHECK(host.live.empty());

  FsdpUnshard nosync;
  nosync.configure(10, false, true);
  nosync.unshard(host, 2, keep, out);
  nosync.reshard_after_backward(host, 2);
  CHECK(host.live.size() == 1);  // stays to the last backward
  nosync.release_kept(host);
  CHECK(host.live.empty());
}

TEST_CASE("FSDP's prefetch gathers the next units in the pass's order, skipping kept ones, within the layers") {
  FakeHost host;
  FsdpUnshard f;
  f.configure(10, false, false);
  std::vector<uint32_t> out;
  FsdpUnshard::Call keep = forward();
  keep.keep = true;
  f.unshard(host, 5, keep, out);  // layer 5 kept
  FsdpUnshard::Call back{true, false, 2, 0, 8};
  f.unshard(host, 6, back, out);  // itself, then 5 (kept: skipped) and 4
  REQUIRE(out.size() == 2);
  CHECK(host.live.at(out[0]).slot == 6);
  CHECK(host.live.at(out[1]).slot == 4);
  out.clear();
  f.unshard(host, 7, forward(3), out);  // forward from the last layer: nothing beyond layer 7
  CHECK(out.size() == 1);
}
