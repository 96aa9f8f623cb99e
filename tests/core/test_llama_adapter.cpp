// litgpt's LLaMA-Adapter, v1 (peft.method adapter) and v2 (adapter_v2): the published trainable counts, what each
// layer keeps for backward, the layers below adapter_start_layer that record nothing, and the field errors.
#include <catch2/catch.hpp>

#include "core/frameworks.h"
#include "core/simulate.h"
#include "core/validate.h"
#include "core/validation.h"
#include "test_util.h"

using namespace memsim;

namespace {

// Llama 2 7B as litgpt's finetune scripts run it: bf16-true, SDPA, one micro-batch of `tokens`.
Config litgpt_llama(const char* method, int64_t tokens = 1304) {
  Config c = single_gpu_config("llama-2-7b.json", 1, tokens);
  c.training.framework = "litgpt";
  c.training.optimizer = "adamw";
  c.peft.method = method;
  c.peft.adapter_dtype = "bf16";
  c.peft.prepare_kbit = "false";
  return c;
}

Config case_config(const char* id) {
  ValidationCase vc;
  std::vector<FieldError> errors;
  REQUIRE(parse_validation_case(read_file(source_path(std::string("tests/validation/cases/") + id + ".json")), vc, errors));
  return vc.config;
}

int64_t saved_before_backward(const Config& c) {
  Result r = simulate(c);
  INFO((r.errors.empty() ? "" : r.errors[0].message));
  REQUIRE(r.ok);
  return live_bytes_before_phase(r.devices[0].program, "backward", Component::Activations);
}

}  // namespace

TEST_CASE("LLaMA-Adapter trainable counts match lit-gpt's resource tables", "[peft][adapter]") {
  // tutorials/resource-tables.md "Finetuning with Adapter on 1 GPU": Llama 2 7B 1,229,760 (adapter.py) and 4,279,744
  // (adapter_v2.py). v1: layers 2-31 each have adapter_wte [10, 4096] and gating_factor [32]: 30 x 40,992. v2 adds
  // an adapter_bias and adapter_scale per linear output (12,288 + 4,096 + 2 x 11,008 + 4,096 per layer, 32,000 for
  // lm_head) and trains the two RMSNorms of every layer and ln_f.
  Result r = simulate(litgpt_llama("adapter"));
  REQUIRE(r.ok);
  CHECK(r.params_trainable == 30 * (10 * 4096 + 32));
  CHECK(r.params_trainable == 1229760);
  CHECK(r.params_total == 6738415616 + 1229760);
  r = simulate(litgpt_llama("adapter_v2"));
  REQUIRE(r.ok);
  CHECK(r.params_trainable == 1229760 + 32 * 2 * (12288 + 4096 + 11008 + 11008 + 4096) + 2 * 32000 + 33 * 4096 * 2 - 4096);
  CHECK(r.params_trainable == 4279744);
  // StableLM-Alpha 3B (GPT-NeoX blocks, LayerNorms with biases): 573,888 and 2,125,248.
  r = simulate(case_config("litgpt-rt-stablelm-alpha-3b-adapter-mb1-bf16"));
  REQUIRE(r.ok);
  CHECK(r.params_trainable == 573888);
  r = simulate(case_config("litgpt-rt-stablelm-alpha-3b-adapter_v2-mb1-bf16"));
  REQUIRE(r.ok);
  CHECK(r.params_trainable == 2125248);
}

TEST_CASE("LLaMA-Adapter's saved tensors, derived by hand", "[peft][adapter][activations]") {
  const int64_t T = 1024, h = 4096, f = 11008, a = 32;
  // Two layers, both adapted (adapter_start_layer 0), against one: one layer's saved set. The adapter layer keeps
  // what a frozen litgpt layer keeps plus the prompt attention's output ay (bf16, for the gate's gradient) and the
  // memory-efficient kernel's fp32 logsumexp, [heads, T padded to 32].
  Config c = litgpt_llama("adapter", T);
  c.peft.adapter_start_layer = 0;
  const int64_t v1 = per_layer_activations(c);
  Result r = simulate(c);
  REQUIRE(r.ok);
  CHECK(live(r.devices[0].program, "backward", "adaption prompt attention output") == 32 * 2 * T * h);
  // v2: every linear also keeps its output before the scale, [T, out] in bf16 (fused qkv 3h, proj h, fc_1 and fc_2
  // f, proj h), and the trainable RMSNorms keep their fp32 normalised input for the weight's gradient (litgpt
  // scales in fp32).
  c.peft.method = "adapter_v2";
  const int64_t v2 = per_layer_activations(c);
  CHECK(v2 - v1 == 2 * T * (3 * h + h + f + f + h) + 2 * 4 * T * h);
  r = simulate(c);
  REQUIRE(r.ok);
  // The head's AdapterV2Linear keeps the pre-scale logits as well: [T, 32,000] bf16.
  CHECK(live(r.devices[0].program, "backward", "AdapterV2Linear output before its scale") ==
        32 * 2 * T * (3 * h + h + f + f + h) + 2 * T * 32000);
  (void)a;
}

TEST_CASE("LLaMA-Adapter v1: the layers below adapter_start_layer keep nothing and have no backward", "[peft][adapter]") {
  // The embedding is frozen and layers 0 and 1 train nothing, so nothing in them needs a gradient: moving the start
  // from 1 to 2 removes one whole layer's saved set.
  Config c = litgpt_llama("adapter", 1024);
  c.model.num_hidden_layers = 4;
  c.peft.adapter_start_layer = 1;
  const int64_t from1 = saved_before_backward(c);
  c.peft.adapter_start_layer = 2;
  const int64_t from2 = saved_before_backward(c);
  c.peft.adapter_start_layer = 0;
  const int64_t from0 = saved_before_backward(c);
  CHECK(from0 - from1 == from1 - from2);
  CHECK(from1 - from2 > 2 * 1024 * 4096);
  // v2 trains every layer's norms: no layer is without a gradient, so the start moves only the prompt's tensors.
  c.peft.method = "adapter_v2";
  c.peft.adapter_start_layer = 1;
  const int64_t v2_from1 = saved_before_backward(c);
  c.peft.adapter_start_layer = 2;
  CHECK(v2_from1 - saved_before_backward(c) == 2 * 1024 * 4096 + 4 * 32 * 1024);
}

TEST_CASE("LLaMA-Adapter's bad settings name the field", "[peft][adapter][bad-input]") {
  Config c = litgpt_llama("adapter");
  c.training.framework = "hf_trainer";
  auto errors = validate(c);
  REQUIRE(!errors.empty());
  CHECK(errors[0].field == "peft.method");
  CHECK(errors[0].message.find("litgpt") != std::string::npos);
  c = litgpt_llama("adapter_v2");
  c.peft.adapter_start_layer = 32;
  errors = validate(c);
  REQUIRE(errors.size() == 1);
  CHECK(errors[0].field == "peft.adapter_start_layer");
  CHECK(errors[0].message.find("0 to 31") != std::string::npos);
  c.peft.adapter_start_layer = -1;
  CHECK(!validate(c).empty());
  c.peft.adapter_start_layer = 2;
  c.peft.adapter_prompt_length = 0;
  errors = validate(c);
  REQUIRE(!errors.empty());
  CHECK(errors[0].field == "peft.adapter_prompt_length");
  c.peft.adapter_prompt_length = 10;
  c.model.num_experts = 8;
  c.model.num_experts_per_tok = 2;
  errors = validate(c);
  bool refused = false;
  for (const auto& e : errors) refused |= e.field == "peft.method";
  CHECK(refused);
}

TEST_CASE("PEFT's adaption_prompt: the benchmark's trainable count and what each layer keeps", "[peft][adapter]") {
  // method_comparison/MetaMathQA adaptionprompt--llama-3.2-3B: adapter_len 100 on all 28 layers reports 8,601,628
  // trainable parameters = 28 x (100 x 3072 + 1) (adaption_prompt [1, 100, 3072] and adaption_gate [1]).
  Config c = single_gpu_config("llama-3.2-3b.json", 1, 1024);
  c.training.framework = "hf_loop";
  c.peft.method = "adaption_prompt";
  c.peft.adapter_prompt_length = 100;
  c.peft.adapter_start_layer = 0;
  Result r = simulate(c);
  INFO((r.errors.empty() ? "" : r.errors[0].message));
  REQUIRE(r.ok);
  CHECK(r.params_trainable == 8601628);
  // The prompt and gate take q_proj's dtype (bf16) whatever autocast_adapter_dtype says: 2 bytes each.
  CHECK(resolve(c).adapter_bytes() == 2);
  // Per adapted layer beyond a frozen one: the recomputed, rotated query [T, 3072] bf16, the fp32 softmax and its
  // bf16 cast and gated product over the prompt ([24 heads, T, 100] each), and the prompt's keys and values
  // repeated to every query head ([24, 100, 128] bf16 each).
  const int64_t T = 1024, h = 3072, hq = 3072, hkv = 1024, f = 8192, a = 24, L = 100;
  // A frozen layer with a graph (test_peft.cpp's closed form): the RMSNorms' fp32 copies and rstd, v, the rotated q
  // and k, the attention output and logsumexp, the MLP's gate, up and activation.
  const int64_t frozen = 2 * (4 * T * h + 4 * T) + 2 * T * hkv + 2 * T * hq + 2 * T * hkv + 2 * T * hq + 4 * a * T + 3 * 2 * T * f;
  CHECK(per_layer_activations(c) - frozen == 2 * T * hq + (4 + 2 + 2) * a * T * L + 2 * 2 * a * L * 128);
  // Layers below the start record nothing: one more of them costs no activation memory.
  c.model.num_hidden_layers = 4;
  c.peft.adapter_start_layer = 3;
  const int64_t four = saved_before_backward(c);
  c.model.num_hidden_layers = 5;
  c.peft.adapter_start_layer = 4;
  CHECK(saved_before_backward(c) == four);
}

TEST_CASE("PEFT's adaption_prompt refuses what PEFT does not wrap", "[peft][adapter][bad-input]") {
  Config c = single_gpu_config("llama-3.2-3b.json", 1, 1024);
  c.peft.method = "adaption_prompt";
  c.peft.adapter_start_layer = 0;
  CHECK(validate(c).empty());
  c.training.framework = "litgpt";
  auto errors = validate(c);
  REQUIRE(!errors.empty());
  CHECK(errors[0].field == "peft.method");
  c.training.framework = "hf_trainer";
  c.model.model_type = "qwen2";
  errors = validate(c);
  REQUIRE(errors.size() == 1);
  CHECK(errors[0].message.find("llama and mistral") != std::string::npos);
}

TEST_CASE("LLaMA-Adapter over an old bitsandbytes base: each 4-bit linear keeps what it reads, the gated sum for proj", "[peft][adapter][bnb]") {
  // bitsandbytes before 0.43.2 keeps a 4-bit linear's input in ctx.tensors while the graph lives (peft.bnb_saves_input).
  // In an adapted layer (two layers, both adapted, minus one: layer 1, whose input needs a gradient) that is the
  // attention norm's output (qkv), the gated sum y + gate * ay that proj reads, the MLP norm's output (fc_1 and
  // fc_2) and the SwiGLU product (proj): none of them saved otherwise under a frozen base.
  const int64_t T = 1024, h = 4096, f = 11008;
  Config c = litgpt_llama("adapter", T);
  c.peft.adapter_start_layer = 0;
  c.peft.base_quantization = "nf4";
  c.versions.bitsandbytes = "0.44.0";
  const int64_t without = per_layer_activations(c);
  c.versions.bitsandbytes = "0.42.0";
  CHECK(per_layer_activations(c) - without == 2 * T * (h + h + h + f));
}
