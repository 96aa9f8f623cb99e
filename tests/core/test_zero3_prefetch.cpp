// DeepSpeed ZeRO-3's fetch window on its own (zero3_prefetch.cpp), against a host that records what is gathered and
// released: the first pass gathers only each module's own parameters, later passes prefetch along the trace up to
// stage3_max_live_parameters elements (the last one overshooting) and on from the forward's end into the backward,
// persistent parameters are never gathered, and a module off the window releases what was prefetched.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>

#include "core/zero3_prefetch.h"

using namespace memsim;

namespace {

// Slots -1 (embeddings), 0..layers-1 (two 100-element linears and a 10-element norm each), layers (the head).
class FakeHost final : public Zero3Prefetch::Host {
 public:
  explicit FakeHost(int64_t layers) : layers_(layers) {
    pre_ = {{"embed_tokens.weight", 1000}};
    layer_ = {{"q_proj.weight", 100}, {"o_proj.weight", 100}, {"input_layernorm.weight", 10}};
    post_ = {{"lm_head.weight", 1000}};
  }
  const std::vector<ParamTensor>& params(int64_t slot) const override {
    return slot < 0 ? pre_ : slot >= layers_ ? post_ : layer_;
  }
  bool persistent(const ParamTensor& t) const override { return t.numel <= 10; }
  uint32_t gather(const ParamTensor& t, int64_t slot) override {
    live[next_] = t.numel;
    slots[next_] = slot;
    return next_++;
  }
  void release(uint32_t buffer) override { live.erase(buffer), slots.erase(buffer); }
  int64_t live_elements() const {
    int64_t n = 0;
    for (const auto& [id, numel] : live) n += numel;
    return n;
  }
  std::map<uint32_t, int64_t> live;   // gathered buffers alive: id -> elements
  std::map<uint32_t, int64_t> slots;  // id -> the slot it belongs to

 private:
  int64_t layers_;
  std::vector<ParamTensor> pre_, layer_, post_;
  uint32_t next_ = 0;
};

}  // namespace

TEST_CASE("ZeRO-3 gathers only a module's own parameters until the trace is recorded") {
  FakeHost host(8);
  Zero3Prefetch z;
  const Zero3Prefetch::Trace trace{0, 8, 8, true};
  std::vector<uint32_t> out;
  z.fetch(host, 3, false, 1000000000, trace, out);
  CHECK(out.size() == 2);  // the norm persists
  CHECK(host.live_elements() == 200);
  CHECK(z.prefetched_elements() == 0);
}

TEST_CASE("ZeRO-3 prefetches along the trace up to max_live elements, the last parameter overshooting") {
  FakeHost host(8);
  Zero3Prefetch z;
  z.trace_recorded();
  const Zero3Prefetch::Trace trace{0, 8, 8, true};
  std::vector<uint32_t> out;
  z.fetch(host, 0, false, 450, trace, out);
  // Own 200, then 100 + 100 of layer 1 and 100 of layer 2: 500 >= 450 stops it.
  CHECK(out.size() == 2);
  CHECK(z.prefetched_elements() == 300);
  CHECK(host.live_elements() == 500);
  // Layer 1 takes over what was prefetched for it, and the window moves on by what that frees.
  std::vector<uint32_t> next;
  z.fetch(host, 1, false, 450, trace, next);
  CHECK(next.size() == 2);
  CHECK(std::all_of(next.begin(), next.end(), [&](uint32_t t) { return host.slots.at(t) == 1; }));
  for (uint32_t t : out) host.release(t);  // release_sub_module after layer 0
  // The window counts from the running module: its own 200, the rest of layer 2 and one linear of layer 3.
  CHECK(z.prefetched_elements() == 300);
  CHECK(host.live_elements() == 500);
}

TEST_CASE("ZeRO-3's window runs from the forward's end into the backward, which takes it over") {
  FakeHost host(4);
  Zero3Prefetch z;
  z.trace_recorded();
  const Zero3Prefetch::Trace trace{0, 4, 4, true};
  std::vector<uint32_t> out;
  z.fetch(host, 3, false, 1000000000, trace, out);
  // The head, then the backward's layers 3 down to 0 (DeepSpeed's trace is one forward and its backward; the
  // parameters the prefetch scans past stay gathered to that use).
  CHECK(z.prefetched_elements() == 1000 + 4 * 200);
  // Layer 3's own parameters are still gathered when the scan reaches its backward: DeepSpeed marks them and keeps
  // them (nothing is gathered twice), so they move into the window and the module frees none of them.
  CHECK(out.empty());
  CHECK(host.live_elements() == 1000 + 4 * 200);
  for (uint32_t t : out) host.release(t);  // layer 3's forward is done
  std::vector<uint32_t> head;
  z.fetch(host, 4, false, 1000000000, trace, head);
  CHECK(head.size() == 1);
  CHECK(z.prefetched_elements() == 4 * 200);  // kept through the loss
  std::vector<uint32_t> back;
  z.fetch(host, 3, true, 1000000000, trace, back);
  CHECK(back.size() == 2);
  CHECK(std::all_of(back.begin(), back.end(), [&](uint32_t t) { return host.slots.at(t) == 3; }));
  CHECK(z.prefetched_elements() == 3 * 200);
  // The embedding is not in the backward trace: from layer 0 nothing is left to prefetch.
  for (int64_t l = 2; l >= 0; --l) {
    std::vector<uint32_t> b;
    z.fetch(host, l, true, 1000000000, trace, b);
  }
  CHECK(z.prefetched_elements() == 0);
  // Layers below the first that trains (a LLaMA-Adapter's) have no backward: the trace's backward half stops there.
  FakeHost adapter_host(4);
  Zero3Prefetch adapter;
  adapter.trace_recorded();
  std::vector<uint32_t> a;
  adapter.fetch(adapter_host, 3, false, 1000000000, Zero3Prefetch::Trace{0, 4, 4, true, false, 2}, a);
  CHECK(adapter.prefetched_elements() == 1000 + 2 * 200);  // the head, then layers 3 and 2
  // Where the model fits in max_live, each layer is gathered once: every forward fetch hands its parameters on.
  FakeHost small_host(4);
  Zero3Prefetch small;
  small.trace_recorded();
  for (int64_t l = 0; l <= 4; ++l) {
    std::vector<uint32_t> own;
    small.fetch(small_host, l, false, 1000000000, trace, own);
    CHECK(small_host.live_elements() <= 1000 + 4 * 200);
    for (uint32_t t : own) if (l < 4) small_host.release(t);
  }
  // A pipeline stage without the head: its forward window ends at its last layer.
  FakeHost stage_host(8);
  Zero3Prefetch stage;
  stage.trace_recorded();
  std::vector<uint32_t> s;
  stage.fetch(stage_host, 3, false, 1000000000, Zero3Prefetch::Trace{0, 4, 8, false}, s);
  CHECK(stage.prefetched_elements() == 0);
}

TEST_CASE("ZeRO-3 releases the prefetched parameters when the direction changes or a module is off the window") {
  FakeHost host(8);
  Zero3Prefetch z;
  z.trace_recorded();
  const Zero3Prefetch::Trace trace{0, 8, 8, false};
  std::vector<uint32_t> out;
  z.fetch(host, 2, false, 600, trace, out);
  CHECK(z.prefetched_elements() == 400);
  std::vector<uint32_t> back;
  z.fetch(host, 7, true, 600, trace, back);  // the backward starts: forward's window goes, backward's prefetch begins
  CHECK(std::none_of(host.slots.begin(), host.slots.end(), [](const auto& s) { return s.second == 3; }));
  CHECK(z.prefetched_elements() == 400);  // layers 6 and 5
  std::vector<uint32_t> other;
  z.fetch(host, 1, true, 200, trace, other);  // not the window's next slot: all of it goes
  CHECK(std::none_of(host.slots.begin(), host.slots.end(), [](const auto& s) { return s.second == 6; }));
}
