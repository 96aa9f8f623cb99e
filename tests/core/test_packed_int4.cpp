// GPTQ and AWQ 4-bit bases under LoRA (docs/research/gptq-awq-lora.md): their packed storage (model_states.cpp
// packed_int4_bytes), no fp32 cast for GPTQ in prepare_model_for_kbit_training (PeftConfig::kbit_cast), what the
// training path keeps (activations.cpp int4_forward, int4_backward), and the field errors.
#include <catch2/catch.hpp>

#include "core/checked.h"
#include "core/step_builder.h"
#include "core/tables.h"
#include "core/validate.h"
#include "test_util.h"

using namespace memsim;

namespace {

// Llama-2-7B (32 layers, h 4096, f 11008) at one row of 512 tokens, LoRA on q and v over a quantized base.
Config int4_config(const char* quantization, const char* checkpointing = "none") {
  Config c = single_gpu_config("llama-2-7b.json", 1, 512);
  c.peft.method = "lora";
  c.peft.base_quantization = quantization;
  c.training.activation_checkpointing = checkpointing;
  REQUIRE(validate(c).empty());
  return c;
}

const StepProgram& program(const Result& r) { return r.devices[0].program; }

constexpr int64_t kH = 4096, kF = 11008, kLayers = 32;
constexpr int64_t kLayerLinears = 4 * kH * kH + 3 * kH * kF;  // q, k, v, o, gate, up, down: 202,375,168

bool has_error(const Config& c, const std::string& field) {
  for (const auto& e : validate(c))
    if (e.field == field) return true;
  return false;
}

}  // namespace

TEST_CASE("GPTQ and AWQ linears store packed int4 with fp16 scales per group", "[peft][int4]") {
  ParamTensor q{"self_attn.q_proj.weight", kH * kH, ParamKind::Matmul, kH};
  q.quantized = q.frozen = true;
  const PrecisionRecipe& pr = *find_precision("bf16_pure");
  PeftConfig p;
  p.method = "lora";
  // qweight in x out / 2, qzeros (in / 128) x out / 2, scales 2 (in / 128) out, and GPTQ's int32 g_idx per input.
  p.base_quantization = "gptq";
  CHECK(param_storage_bytes(q, pr, p, {}) == kH * kH / 2 + 32 * kH / 2 + 2 * 32 * kH + 4 * kH);
  p.base_quantization = "awq";
  CHECK(param_storage_bytes(q, pr, p, {}) == kH * kH / 2 + 32 * kH / 2 + 2 * 32 * kH);
  p.base_quantization = "gptq", p.quant_group_size = -1;  // one group per row
  CHECK(param_storage_bytes(q, pr, p, {}) == kH * kH / 2 + kH / 2 + 2 * kH + 4 * kH);
  // prepare_model_for_kbit_training casts the other parameters to fp32, but not on a GPTQ model.
  const ParamTensor norm{"input_layernorm.weight", kH, ParamKind::Norm, kH};
  const auto stored = [&](const char* quantization, const char* prepare) {
    Config c;
    c.peft = p;
    c.peft.base_quantization = quantization;
    c.peft.prepare_kbit = prepare;
    return param_storage_bytes(norm, pr, c.peft, {4, resolve(c).kbit_cast, {}});
  };
  CHECK(stored("gptq", "auto") == 2 * kH);
  CHECK(stored("awq", "auto") == 4 * kH);
  CHECK(stored("awq", "false") == 2 * kH);
}

TEST_CASE("GPTQ's torch path keeps every linear's dequantized fp16 weight until backward", "[peft][int4]") {
  // Without checkpointing: 2 bytes per weight of every quantized linear but the first layer's q/k/v, whose input
  // (the frozen embedding's normalised output) needs no gradient.
  const Result none = simulate(int4_config("gptq"));
  CHECK(live(program(none), "backward", "GPTQ weight dequantized") == 2 * (kLayers * kLayerLinears - 3 * kH * kH));
  // With checkpointing the first forward keeps none; the recomputation keeps one layer's until its backward.
  const Result full = simulate(int4_config("gptq", "full"));
  CHECK(live(program(full), "backward", "GPTQ weight dequantized") == 0);
  CHECK(live(program(full), "end of everything", "GPTQ weight dequantized", true) == 2 * kLayerLinears);
  // The unpacking's int32 and int8 tensors of the largest linear exist one at a time.
  CHECK(live(program(full), "end of everything", "GPTQ weight unpacked", true) == 5 * kH * kF);
}

TEST_CASE("AWQ saves an fp16 copy of each linear's input and repeats the weight per row in backward", "[peft][int4]") {
  // prepare_model_for_kbit_training makes the norms' outputs fp32 and the model computes in bf16: every
  // WQLinear_GEMM call makes x.half(), saved by WQLinearMMFunction (q, k, v, o, gate, up at h; down at f).
  const int64_t T = 512;
  const Result r = simulate(int4_config("awq"));
  CHECK(live(program(r), "backward", "fp16 copy of an AWQ linear's input") ==
        kLayers * 2 * T * (6 * kH + kF) - 3 * 2 * T * kH);
  // Backward: the dequantized weight, its cast to the gradient's bf16 and one repeat per row (batch 1).
  CHECK(live(program(r), "end of everything", "AWQ weight dequantized and repeated", true) == 2 * kH * kF * 3);
  // Nothing of GPTQ's.
  CHECK_FALSE(has_label(program(r), "GPTQ weight"));
}

TEST_CASE("GPTQ and AWQ bases: field errors", "[peft][int4][validate]") {
  Config c = int4_config("gptq");
  c.peft.method = "ia3";
  CHECK(has_error(c, "peft.method"));
  c = int4_config("awq");
  c.peft.quant_group_size = 100;
  CHECK(has_error(c, "peft.quant_group_size"));
  c.peft.quant_group_size = 0;
  CHECK(has_error(c, "peft.quant_group_size"));
  c = int4_config("gptq");
  c.parallel.data_parallel_size = 2, c.parallel.zero_stage = 3;
  CHECK(has_error(c, "parallel.zero_stage"));
  c = int4_config("gptq");
  c.training.framework = "unsloth";
  CHECK(has_error(c, "training.framework"));
  c = int4_config("gptq");
  c.model.num_experts = 8, c.model.num_experts_per_tok = 2;
  CHECK(has_error(c, "peft.base_quantization"));
}

TEST_CASE("autocast caches the copies of weights that require grad, a frozen base's copy lives with the graph", "[peft][autocast]") {
  // Llama-2-7B with LoRA over an fp32 base under bf16 autocast, checkpointed: the first forward has no graph, so the
  // frozen weights' bf16 copies exist one at a time (the largest, 2 x h x f), and the recomputation keeps one layer's
  // until its backward. Full fine-tuning's weights require grad: autocast caches every layer's copy until the
  // forward's autocast region exits.
  Config c = single_gpu_config("llama-2-7b.json", 1, 512);
  c.training.precision = "amp_bf16";
  c.training.activation_checkpointing = "full";
  c.peft.method = "lora";
  c.model.vocab_size = 1000;  // the head's copy (saved by the loss's matmul, 2 V h) below one linear's
  const int64_t head = 2 * 1000 * kH;
  const std::string copies = "autocast low-precision weight copies";
  REQUIRE(validate(c).empty());
  const Result lora = simulate(c);
  // The fp32 adapters are trainable leaves: their bf16 copies are cached too, every layer's in the first forward
  // until its autocast region exits, and a layer's in its recomputation.
  const int64_t adapters = 2 * lora.params_trainable / kLayers;
  CHECK(live(program(lora), "backward", copies, true) == 2 * kH * kF + kLayers * adapters);
  const int64_t most = live(program(lora), "end of everything", copies, true);
  INFO(most << " " << adapters);
  CHECK(most >= 2 * kLayerLinears);
  CHECK(most <= 2 * kLayerLinears + head + kLayers * adapters);
  c.peft.method = "none";
  CHECK(live(program(simulate(c)), "backward", copies, true) == kLayers * 2 * kLayerLinears + head);
  // A quantized weight is not floating point: nothing to cast but the head (fp32 after prepare_model_for_kbit).
  c.peft.method = "lora", c.peft.base_quantization = "nf4";
  CHECK(live(program(simulate(c)), "end of everything", copies, true) == head + kLayers * adapters);
}

TEST_CASE("a quantized checkpoint's config.json sets the PEFT base", "[peft][int4][hf_config]") {
  const std::string model = R"("model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32, "num_hidden_layers": 32, "vocab_size": 32000)";
  auto import = [&](const std::string& quantization) {
    const Parsed p = model_from_hf_json("{" + model + ", \"quantization_config\": " + quantization + "}");
    REQUIRE(p.ok);
    return p;
  };
  Parsed p = import(R"({"bits": 4, "group_size": 128, "desc_act": true, "quant_method": "gptq"})");
  CHECK(p.config.peft.base_quantization == "gptq");
  CHECK(p.config.peft.quant_group_size == 128);
  CHECK(p.config.peft.method == "lora");  // a quantized base trains only through adapters
  p = import(R"({"bits": 4, "group_size": 64, "quant_method": "awq", "version": "gemm", "zero_point": true})");
  CHECK(p.config.peft.base_quantization == "awq");
  CHECK(p.config.peft.quant_group_size == 64);
  p = import(R"({"quant_method": "bitsandbytes", "load_in_4bit": true, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": true})");
  CHECK(p.config.peft.base_quantization == "nf4");
  CHECK(p.config.peft.double_quantization);
  // An 8-bit GPTQ checkpoint is not modelled: the base stays, and a note says so.
  p = import(R"({"bits": 8, "group_size": 128, "quant_method": "gptq"})");
  CHECK(p.config.peft.base_quantization == "none");
  CHECK(p.config.peft.method == "none");
  REQUIRE_FALSE(p.notes.empty());
  CHECK(p.notes.back().find("8-bit gptq") != std::string::npos);
}
