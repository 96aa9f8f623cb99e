// Invariants over thousands of random valid configs (seeded, so a failure reproduces): no negative or
// overflowing byte count, the breakdown adds up to the peak, allocator statistics are ordered, both encodings
// round-trip exactly, and the requested-bytes peak never falls when the batch or the sequence grows.
#include <catch2/catch.hpp>
#include <random>

#include "core/frameworks.h"
#include "core/serialize.h"
#include "core/simulate.h"
#include "core/tables.h"
#include "random_config.h"

using namespace memsim;
using memsim_test::random_config;

TEST_CASE("invariants over 1500 random valid configs", "[property]") {
  std::mt19937_64 rng(20261130);
  int simulated = 0;
  for (int i = 0; i < 1500; ++i) {
    const Config c = random_config(rng);
    INFO("config " << i << ": " << config_to_fragment(c));
    Parsed j = config_from_json(config_to_json(c));
    REQUIRE(j.ok);
    CHECK(j.config == c);
    Parsed f = config_from_fragment(config_to_fragment(c));
    REQUIRE(f.ok);
    CHECK(f.config == c);
    Result r = simulate(c);
    if (!r.ok) {  // the generator can combine settings the validator refuses; each refusal names its field
      CHECK(!r.errors.empty());
      CHECK(!r.errors[0].field.empty());
      continue;
    }
    ++simulated;
    for (const auto& d : r.devices) {
      CHECK(d.breakdown.total() == d.peak.device_bytes);
      for (int64_t b : d.breakdown.allocator) CHECK(b >= 0);
      CHECK(d.breakdown.fragmentation_bytes >= 0);
      CHECK(d.peak.requested_bytes <= d.peak.allocated_bytes);
      CHECK(d.peak.allocated_bytes <= d.peak.reserved_bytes);
      CHECK(d.host_bytes >= 0);
    }
    CHECK(r.host.per_node_bytes >= 0);
    if (i % 5 == 0) {  // monotonic in batch and sequence: the exact bytes live at the peak never fall
      for (auto grow : {0, 1}) {
        Config bigger = c;
        if (grow == 0) bigger.training.micro_batch_size += 1;
        else bigger.training.sequence_length += 16;
        Result rb = simulate(bigger);
        if (!rb.ok) continue;
        for (size_t k = 0; k < r.devices.size() && k < rb.devices.size(); ++k)
          CHECK(rb.devices[k].peak.requested_bytes >= r.devices[k].peak.requested_bytes);
      }
    }
  }
  CHECK(simulated > 1000);
}
