// The named mechanisms behind exceptions to the relations of test_relations.cpp, each shown on one setup.
#include <catch2/catch.hpp>

#include "core/serialize.h"
#include "core/simulate.h"

using namespace memsim;

namespace {
int64_t optimizer_bytes(const Config& c) {
  Result r = simulate(c);
  REQUIRE(r.ok);
  return r.devices[0].model_states.optimizer_bytes;
}
}  // namespace

// DeepSpeed ZeRO-1/2 hand the optimizer one flat 1-D fp32 partition per parameter group (stage_1_and_2.py
// single_partition_of_fp32_groups), and Adafactor factors only tensors of two or more dimensions (transformers
// Adafactor._get_options: factored = len(param_shape) >= 2; torch.optim.Adafactor the same), so the partition gets a
// full second moment: N/dp elements instead of rows + columns per matrix. With few GPUs that is more than unsharded.
TEST_CASE("exception: ZeRO-1 with Adafactor keeps an unfactored second moment of its flat partition", "[property]") {
  Config c;  // the defaults: a Llama-2-13B shape, here in fp32 (no master copy, so the states alone differ)
  c.training.precision = "fp32";
  c.training.optimizer = "adafactor";
  c.parallel.sharding = "deepspeed";
  c.parallel.data_parallel_size = 2;
  c.peft.method = "none";
  Config z0 = c, z1 = c;
  z0.parallel.zero_stage = 0;
  z1.parallel.zero_stage = 1;
  const int64_t unsharded = optimizer_bytes(z0), flat = optimizer_bytes(z1);
  // Unsharded: rows + columns per matrix, a sliver of the weights. Flat: one fp32 per element of half the model.
  Result r0 = simulate(z0);
  REQUIRE(r0.ok);
  const int64_t weights = r0.devices[0].model_states.weights_bytes;  // fp32, whole under ZeRO-1
  CHECK(unsharded < weights / 100);
  CHECK(flat == Approx(weights / 2).epsilon(1e-6));
}
