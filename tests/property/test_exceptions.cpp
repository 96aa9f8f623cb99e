// The named mechanisms behind exceptions to the relations of test_relations.cpp, each shown on one setup.
#include <catch2/catch.hpp>

#include <utility>

#include "core/catalog.h"
#include "core/serialize.h"
#include "core/simulate.h"

using namespace memsim;

namespace {
int64_t optimizer_bytes(const Config& c) {
  Result r = simulate(c);
  REQUIRE(r.ok);
  return r.devices[0].model_states.optimizer_bytes;
}

// `c` trained in fp32 (no master copy, so the optimizer states alone differ) with `optimizer` under DeepSpeed on two
// GPUs, unsharded and under ZeRO-1.
std::pair<Config, Config> zero0_and_zero1(Config c, const char* optimizer) {
  c.training.precision = "fp32";
  c.training.optimizer = optimizer;
  c.parallel.sharding = "deepspeed";
  c.parallel.data_parallel_size = 2;
  c.peft.method = "none";
  Config z0 = c, z1 = c;
  z0.parallel.zero_stage = 0;
  z1.parallel.zero_stage = 1;
  return {z0, z1};
}
}  // namespace

// DeepSpeed ZeRO-1/2 hand the optimizer one flat 1-D fp32 partition per parameter group (stage_1_and_2.py
// single_partition_of_fp32_groups), and Adafactor factors only tensors of two or more dimensions (transformers
// Adafactor._get_options: factored = len(param_shape) >= 2; torch.optim.Adafactor the same), so the partition gets a
// full second moment: N/dp elements instead of rows + columns per matrix. With few GPUs that is more than unsharded.
TEST_CASE("exception: ZeRO-1 with Adafactor keeps an unfactored second moment of its flat partition", "[property]") {
  const auto [z0, z1] = zero0_and_zero1(Config{}, "adafactor");  // the defaults: a Llama-2-13B shape
  const int64_t unsharded = optimizer_bytes(z0), flat = optimizer_bytes(z1);
  // Unsharded: rows + columns per matrix, a sliver of the weights. Flat: one fp32 per element of half the model.
  Result r0 = simulate(z0);
  REQUIRE(r0.ok);
  const int64_t weights = r0.devices[0].model_states.weights_bytes;  // fp32, whole under ZeRO-1
  CHECK(unsharded < weights / 100);
  CHECK(flat == Approx(weights / 2).epsilon(1e-6));
}

// The same flat partition under torchao's 8-bit AdamW: torchao quantizes a state only for a tensor of at least 4,096
// elements whose size is a multiple of its 256-element block (torchao/optim/adam.py _new_buffer: p.numel() >= 4096 and
// p.numel() % block_size == 0, else torch.zeros_like(p)); DeepSpeed pads the flat group to a multiple of 2 x dp only
// (stage_1_and_2.py nccl_start_alignment_factor = 2), so a partition that is not a multiple of 256 keeps two fp32
// states: 8 bytes per element of 1/dp of the model, against about 2 bytes per element of all of it unsharded.
TEST_CASE("exception: ZeRO-1 with torchao's 8-bit AdamW keeps fp32 states when its partition is off the block", "[property]") {
  const ModelPreset* gpt2 = find_model_preset("gpt2");  // 124,439,808 parameters: half is 62,219,904, not / 256
  REQUIRE(gpt2);
  Config c;
  c.model = gpt2->model;
  c.training.sequence_length = 1024;
  const auto [z0, z1] = zero0_and_zero1(c, "adamw_8bit_torchao");
  Result r0 = simulate(z0);
  REQUIRE(r0.ok);
  const int64_t params = r0.params_trainable;
  REQUIRE(params % 2 == 0);
  REQUIRE((params / 2) % 256 != 0);
  const int64_t unsharded = optimizer_bytes(z0), flat = optimizer_bytes(z1);
  CHECK(unsharded < params * 3);             // the large matrices quantized: about 2 bytes per element
  CHECK(flat == Approx(params / 2 * 8).epsilon(1e-4));  // the partition's two fp32 states
  CHECK(flat > unsharded);
}
