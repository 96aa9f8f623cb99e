// Optimizer state sizes and step temporaries from the table (core/tables.h), for the 8-bit optimizers whose rules
// are their libraries' own: bitsandbytes (CUDA kernels) and torchao (a compiled Python step over a tensor subclass).
#include <catch2/catch.hpp>

#include "core/simulate.h"
#include "core/tables.h"
#include "test_util.h"

using namespace memsim;

TEST_CASE("torchao's AdamW8bit: 8-bit codes with an fp32 scale per 256, and zeros_like for the rest", "[optimizer]") {
  const OptimizerSpec* ao = find_optimizer("adamw_8bit_torchao");
  REQUIRE(ao);
  // A 4096 x 4096 matrix: two states of 16 Mi codes and 64 Ki fp32 scales each.
  CHECK(optimizer_state_bytes(*ao, 4096 * 4096, 4096, 4) == 2 * (4096 * 4096 + 4096 * 4096 / 256 * 4));
  // Under 4096 elements, or not whole blocks of 256: torch.zeros_like(p), two states in the parameter's dtype.
  CHECK(optimizer_state_bytes(*ao, 4095, 1, 2) == 2 * 4095 * 2);
  CHECK(optimizer_state_bytes(*ao, 4096 + 100, 1, 2) == 2 * 4196 * 2);
  // bitsandbytes keeps fp32 states under its min_8bit_size whatever the parameter's dtype.
  CHECK(optimizer_state_bytes(*find_optimizer("adamw_8bit"), 4095, 1, 2) == 2 * 4095 * 4);
}

TEST_CASE("torchao's AdamW8bit step holds two fp32 copies of the largest state, bitsandbytes' none", "[optimizer]") {
  Config c = single_gpu_config("llama-3.2-1b.json", 1, 256);
  auto temporaries_at_step = [&](const char* optimizer) {
    Config v = c;
    v.training.optimizer = optimizer;
    REQUIRE(validate(v).empty());
    const Result r = simulate(v);
    REQUIRE(r.ok);
    return peak_live_in_phase(r.devices[0].program, "optimizer step 2", Component::Temporaries);
  };
  // Llama-3.2-1B's largest tensor is its tied embedding, 128256 x 2048 (a whole number of 256-blocks).
  CHECK(temporaries_at_step("adamw_8bit_torchao") == 2 * int64_t{128256} * 2048 * 4);
  CHECK(temporaries_at_step("adamw_8bit") == 0);
}

TEST_CASE("DeepSpeed steps the HF Trainer's torch AdamW on each group's flat fp32 partition: one sqrt of it at a time, "
          "its own FusedAdam none", "[optimizer][zero]") {
  Config c = single_gpu_config("llama-3.2-1b.json", 1, 256);
  c.parallel.data_parallel_size = 4;
  c.parallel.sharding = "deepspeed";
  c.training.precision = "bf16_mixed";
  c.versions.torch = "2.5";
  c.versions.transformers = "4.46";
  auto temporaries_at_step = [&](const char* framework, int64_t stage) {
    Config v = c;
    v.training.framework = framework;
    v.parallel.zero_stage = stage;
    REQUIRE(validate(v).empty());
    const Result r = simulate(v);
    REQUIRE(r.ok);
    return peak_live_in_phase(r.devices[0].program, "optimizer step 2", Component::Temporaries);
  };
  const int64_t part = int64_t{1235814400} / 4;  // Llama-3.2-1B's parameters over 4 ranks
  // The bf16 gradient upcast to fp32, and (the Trainer's adamw_torch, foreach) exp_avg_sq.sqrt() of the partition.
  CHECK(temporaries_at_step("hf_trainer", 2) == Approx(2 * 4 * part).epsilon(0.001));
  CHECK(temporaries_at_step("deepspeed", 2) == Approx(4 * part).epsilon(0.001));  // FusedAdam: the upcast only
  CHECK(temporaries_at_step("hf_trainer", 3) == Approx(2 * 4 * part).epsilon(0.001));  // one sub-group (under 1e9)
  CHECK(temporaries_at_step("deepspeed", 3) == Approx(4 * part).epsilon(0.001));
  // The Trainer's adamw_torch_fused (transformers 4.54+ on torch 2.8+): no sqrt either.
  c.versions.torch = "2.8";
  c.versions.transformers = "4.55";
  CHECK(temporaries_at_step("hf_trainer", 3) == Approx(4 * part).epsilon(0.001));
}
