// PEFT's prefix tuning (peft.method prefix_tuning): the PrefixEncoder's count, what each layer's cache update and its
// longer keys add, how long the cache holds them, and the settings it is not modelled with.
#include <catch2/catch.hpp>

#include "core/simulate.h"
#include "core/validate.h"
#include "test_util.h"

using namespace memsim;

namespace {

Config prefix_config(int64_t virtual_tokens, const char* framework = "hf_trainer") {
  Config c = single_gpu_config("llama-3.2-3b.json", 1, 1024);
  c.training.framework = framework;
  c.peft.method = "prefix_tuning";
  c.peft.num_virtual_tokens = virtual_tokens;
  return c;
}

}  // namespace

TEST_CASE("prefix tuning: PEFT's trainable count under grouped-query attention", "[peft][prefix]") {
  // method_comparison/MetaMathQA prefixtuning--llama-3.2-3B: 200 virtual tokens, token_dim 1024 (8 key/value heads x
  // 128), 28 layers x 2: 11,468,800 trainable parameters, as the result file reports.
  Result r = simulate(prefix_config(200));
  INFO((r.errors.empty() ? "" : r.errors[0].message));
  REQUIRE(r.ok);
  CHECK(r.params_trainable == 11468800);
}

TEST_CASE("prefix tuning: each layer's keys grow by the prefix, and the cache holds them as the outputs live", "[peft][prefix][activations]") {
  // One layer's saved set at 200 virtual tokens against 8, one sequence of 1024 (1224 and 1032 keys, both multiples of
  // 8, so the memory-efficient kernel keeps the converted mask as it is). With the mask transformers repeats k and v
  // for all 24 query heads, which SDPA keeps: 2 x [192 more keys, 3072] bf16; the layer's converted mask, [1024, 192
  // more keys] bf16.
  const int64_t s = 1024, dp = 192, hq = 3072, hkv = 1024;
  const int64_t trainer = per_layer_activations(prefix_config(200)) - per_layer_activations(prefix_config(8));
  CHECK(trainer == 2 * 2 * dp * hq + 2 * s * dp);
  // A plain loop keeps the model's outputs, and with them the DynamicCache's concatenated keys and values of every
  // layer, [prefix + s, 1024] each, through backward; the HF Trainer's compute_loss drops them with the outputs.
  const int64_t loop = per_layer_activations(prefix_config(200, "hf_loop")) - per_layer_activations(prefix_config(8, "hf_loop"));
  CHECK(loop == trainer + 2 * 2 * dp * hkv);
}

TEST_CASE("prefix tuning: what it is not modelled with is refused with the field", "[peft][prefix][bad-input]") {
  Config c = prefix_config(20);
  CHECK(validate(c).empty());
  c.training.attention = "eager";
  auto errors = validate(c);
  REQUIRE(errors.size() == 1);
  CHECK(errors[0].field == "training.attention");
  c = prefix_config(20);
  c.training.activation_checkpointing = "full";
  errors = validate(c);
  REQUIRE(errors.size() == 1);
  CHECK(errors[0].field == "training.activation_checkpointing");
  c = prefix_config(20);
  c.versions.transformers = "4.55.0";
  errors = validate(c);
  REQUIRE(errors.size() == 1);
  CHECK(errors[0].field == "versions.transformers");
  c = prefix_config(20, "litgpt");
  CHECK(!validate(c).empty());
}
