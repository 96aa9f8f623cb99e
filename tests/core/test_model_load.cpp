// transformers' load of a bitsandbytes base (src/core/model_load.cpp): caching_allocator_warmup's block by release,
// the 16-bit linears quantized on the GPU, prepare_model_for_kbit_training's casts leaving the 16-bit copies' blocks
// cached, and TRL's SFTTrainer's dtype changes by release.
#include <catch2/catch.hpp>

#include <string>

#include "core/frameworks.h"
#include "core/model_load.h"
#include "core/serialize.h"
#include "core/simulate.h"
#include "test_util.h"

using namespace memsim;

namespace {

constexpr int64_t kGiB = int64_t{1} << 30;
// Llama-2-7B: 6,738,415,616 parameters, an untied 32,000 x 4,096 embedding and head.
constexpr int64_t kParams = 6738415616, kTable = int64_t{32000} * 4096;

Config qlora(const char* transformers, const char* trl = "latest") {
  Config c = single_gpu_config("llama-2-7b.json", 1, 256);
  c.training.precision = "amp_bf16";
  c.training.activation_checkpointing = "full";
  c.peft.method = "lora";
  c.peft.base_quantization = "nf4";
  c.peft.double_quantization = true;
  c.hardware.gpu = "a100-40gb";
  c.versions.transformers = transformers;
  c.versions.trl = trl;
  return c;
}

// What the allocator holds when the first forward begins: the load's outcome.
TimelinePoint after_load(const DeviceResult& d) {
  for (const auto& ph : d.program.phases)
    if (ph.name.rfind("forward", 0) == 0) return d.timeline.at(ph.first_event - 1);
  FAIL("no forward phase");
  return {};
}

}  // namespace

TEST_CASE("model load: caching_allocator_warmup's request by transformers release") {
  const auto rule = [](const char* transformers) { return resolve(qlora(transformers)).model_load; };
  CHECK(rule("4.50.3").warmup == LoadWarmup::None);  // transformers#36428: unquantized loads only
  CHECK(rule("4.51.3").warmup == LoadWarmup::HalfOf16Bit);
  CHECK(rule("4.51.3").warmup_cap_095);
  CHECK(rule("4.57.1").warmup == LoadWarmup::HalfOf16Bit);
  CHECK_FALSE(rule("4.57.1").warmup_cap_095);
  CHECK(rule("5.0.0").warmup == LoadWarmup::QuantizedSize);
  CHECK(rule("latest").warmup == LoadWarmup::QuantizedSize);
  CHECK(rule("4.57.1").quantize_on_gpu);

  ModelLoad half;
  half.warmup = LoadWarmup::HalfOf16Bit;
  CHECK(load_warmup_bytes(half, 16 * kGiB, 5 * kGiB, 40 * kGiB) == 8 * kGiB);
  // Capped before the factor: half of the free memory less 1.2 GiB, however large the model.
  CHECK(load_warmup_bytes(half, 140 * kGiB, 40 * kGiB, 78 * kGiB) == (78 * kGiB - 1288490188) / 4 * 2);
  half.warmup_cap_095 = true;
  CHECK(load_warmup_bytes(half, 140 * kGiB, 40 * kGiB, 80 * kGiB) == static_cast<int64_t>(0.95 * 80 * kGiB) / 4 * 2);
  ModelLoad quantized;
  quantized.warmup = LoadWarmup::QuantizedSize;
  CHECK(load_warmup_bytes(quantized, 16 * kGiB, 5 * kGiB, 40 * kGiB) == 5 * kGiB);
  CHECK(load_warmup_bytes(quantized, 16 * kGiB, 5 * kGiB, 4 * kGiB) == 4 * kGiB - 1288490188);
  CHECK(load_warmup_bytes(ModelLoad{}, 16 * kGiB, 5 * kGiB, 40 * kGiB) == 0);
}

TEST_CASE("model load: only transformers' own load of an unsharded bitsandbytes base is replayed in its order") {
  CHECK(resolve(qlora("4.57.1")).model_load.ordered);
  Config loop = qlora("4.57.1");
  loop.training.framework = "hf_loop";  // a loop of one's own loads as it likes
  CHECK_FALSE(resolve(loop).model_load.ordered);
  Config unsloth = qlora("4.57.1");
  unsloth.training.framework = "unsloth";  // from_pretrained of a pre-quantized checkpoint
  CHECK(resolve(unsloth).model_load.ordered);
  CHECK_FALSE(resolve(unsloth).model_load.quantize_on_gpu);
  Config gptq = qlora("4.57.1");
  gptq.peft.base_quantization = "gptq";
  CHECK_FALSE(resolve(gptq).model_load.ordered);
  Config zero3 = qlora("4.57.1");
  zero3.parallel.data_parallel_size = 2;
  zero3.parallel.zero_stage = 3;  // loads through the CPU, no device map
  CHECK_FALSE(resolve(zero3).model_load.ordered);
}

TEST_CASE("model load: 4.51-4.57 reserve half the 16-bit model first, and the weights are carved out of it") {
  Config c = qlora("4.57.1");
  c.peft.prepare_kbit = "false";  // no fp32 copies: everything the load keeps fits in the block ...
  c.training.precision = "bf16_pure";  // ... and the weights stay in the 16-bit load dtype
  const DeviceResult warm = simulate_valid(c);
  // The warmup is the program's first event: kParams * 2 bytes // 4 fp16 elements = kParams bytes.
  REQUIRE(warm.program.events.size() > 1);
  const Tensor& first = warm.program.tensors[warm.program.events[0].tensor];
  CHECK(first.bytes == kParams);
  CHECK(warm.program.labels[first.label].rfind("caching_allocator_warmup", 0) == 0);
  // The block (rounded to 2 MiB) and the small pool's segments for the adapters: no other large segment.
  const int64_t block = (kParams + (2 << 20) - 1) / (2 << 20) * (2 << 20);
  CHECK(after_load(warm).reserved_bytes >= block);
  CHECK(after_load(warm).reserved_bytes < block + (64 << 20));
  c.versions.transformers = "4.48.1";
  const DeviceResult cold = simulate_valid(c);
  CHECK(after_load(cold).reserved_bytes < after_load(warm).reserved_bytes);
  CHECK(warm.model_states.weights_bytes == cold.model_states.weights_bytes);
}

TEST_CASE("model load: 5.0 reserves the quantized size, and int8, Unsloth and a tied head before 4.54") {
  // 4-bit linears at half a byte per weight, the rest (embedding, head, norms) in 16 bits.
  const int64_t norms = (2 * 32 + 1) * 4096, linears = kParams - 2 * kTable - norms;
  const DeviceResult v5 = simulate_valid(qlora("5.0.0"));
  CHECK(v5.program.tensors[v5.program.events[0].tensor].bytes == linears / 2 + (2 * kTable + norms) * 2);
  Config int8 = qlora("4.57.1");
  int8.peft.base_quantization = "int8";
  const DeviceResult i8 = simulate_valid(int8);
  CHECK(i8.program.tensors[i8.program.events[0].tensor].bytes == kParams);
  CHECK(has_label(i8.program, "a linear's 16-bit weight before bitsandbytes quantizes it"));
  Config unsloth = qlora("4.55.4");
  unsloth.training.framework = "unsloth";
  unsloth.training.precision = "bf16_pure";  // Unsloth keeps the weights it does not quantize in 16 bits
  const DeviceResult u = simulate_valid(unsloth);
  CHECK(u.program.tensors[u.program.events[0].tensor].bytes == kParams);
  CHECK_FALSE(has_label(u.program, "a linear's 16-bit weight"));  // a pre-quantized checkpoint
  // Qwen2.5-0.5B ties its head: before 4.54 the warmup counted the 151,936 x 896 table twice.
  const auto first_bytes = [](const char* transformers) {
    Config c = single_gpu_config("qwen2.5-0.5b.json", 1, 256);
    c.peft.method = "lora";
    c.peft.base_quantization = "nf4";
    c.hardware.gpu = "a100-40gb";
    c.versions.transformers = transformers;
    const DeviceResult d = simulate_valid(c);
    return d.program.tensors[d.program.events[0].tensor].bytes;
  };
  CHECK(first_bytes("4.53.3") - first_bytes("4.54.0") == int64_t{151936} * 896 * 2 / 2);
}

TEST_CASE("model load: prepare_model_for_kbit_training's fp32 copies leave the 16-bit ones' blocks cached") {
  const auto cached = [](bool prepare) {  // no warmup (4.48): each block is a segment of its own
    Config c = qlora("4.48.1");
    c.peft.prepare_kbit = prepare ? "true" : "false";
    const TimelinePoint p = after_load(simulate_valid(c));
    return p.reserved_bytes - p.allocated_bytes;
  };
  // Without the casts the cache holds the linears' 16-bit copies that bitsandbytes quantized; with them, also the
  // 16-bit embedding and head, freed once their fp32 copies exist and too small to hold the next copy.
  CHECK(cached(true) - cached(false) == 2 * 2 * kTable);
}

TEST_CASE("model load: peft.prepare_kbit at auto follows the framework and TRL's version") {
  CHECK(resolve(qlora("4.57.1")).kbit_cast);  // the HF Trainer with PEFT: the user's script calls it
  Config unsloth = qlora("4.57.1");
  unsloth.training.framework = "unsloth";
  CHECK_FALSE(resolve(unsloth).kbit_cast);
  CHECK_FALSE(resolve(qlora("4.57.1", "0.26.0")).kbit_cast);
  CHECK(resolve(qlora("4.57.1", "0.25.1")).kbit_cast);
  Config stated = qlora("4.57.1", "0.26.0");
  stated.peft.prepare_kbit = "true";  // the script calls it itself
  CHECK(resolve(stated).kbit_cast);
  Config gptq = qlora("4.57.1");
  gptq.peft.base_quantization = "gptq";  // peft skips the cast on a GPTQ model
  CHECK_FALSE(resolve(gptq).kbit_cast);
  // --set takes 1 and 0 as it did while the field was a boolean.
  Config set = qlora("4.57.1");
  CHECK(apply_setting(set, "peft.prepare_kbit=0").empty());
  CHECK(set.peft.prepare_kbit == "false");
  CHECK(apply_setting(set, "prepare_kbit=1").empty());
  CHECK(set.peft.prepare_kbit == "true");
}

TEST_CASE("model load: TRL's SFTTrainer changes the dtypes it is given, by release") {
  const DeviceResult plain = simulate_valid(qlora("4.57.1"));
  SECTION("0.7.5-0.25 with bf16: the embedding and head go back to bf16 after their round through fp32") {
    const Config c = qlora("4.57.1", "0.24.0");
    CHECK(resolve(c).model_load.trl_bf16.any());
    CHECK(resolve(c).adapter_dtype == AdapterDtype::Fp32);
    const DeviceResult d = simulate_valid(c);
    CHECK(plain.model_states.weights_bytes - d.model_states.weights_bytes == 2 * 2 * kTable);
    CHECK(has_label(d.program, "an fp32 copy by prepare_model_for_kbit_training"));
    // inputs_embeds, and so the residual stream that each checkpoint keeps, is bf16 instead of fp32.
    CHECK(live_bytes_before_phase(d.program, "backward", Component::Activations) <
          live_bytes_before_phase(plain.program, "backward", Component::Activations));
  }
  SECTION("before 0.9.3 the adapters went to bf16 too") {
    CHECK(resolve(qlora("4.38.2", "0.8.6")).adapter_dtype == AdapterDtype::Bf16);
    CHECK(resolve(qlora("4.38.2", "0.9.3")).adapter_dtype == AdapterDtype::Fp32);
  }
  SECTION("only what TRL's names match: GPT-NeoX's embed_in and embed_out are not cast") {
    Config neox = qlora("4.57.1", "0.24.0");
    neox.model.model_type = "gpt_neox";
    CHECK_FALSE(resolve(neox).model_load.trl_bf16.any());
    Config gpt2 = qlora("4.57.1", "0.24.0");
    gpt2.model.model_type = "gpt2";
    CHECK(resolve(gpt2).model_load.trl_bf16.position_embedding);
  }
  SECTION("not without bf16, before 0.7.5, or when the version comes from a date only") {
    Config fp16 = qlora("4.57.1", "0.24.0");
    fp16.training.precision = "amp_fp16";
    CHECK_FALSE(resolve(fp16).model_load.trl_bf16.any());
    CHECK_FALSE(resolve(qlora("4.57.1", "0.7.4")).model_load.trl_bf16.any());
    Config dated = qlora("latest");
    dated.versions.date = "2025-10-20";
    CHECK_FALSE(resolve(dated).model_load.trl_bf16.any());
  }
  SECTION("DPOTrainer: the same cast from 0.7.8, until its refactor of 0.29 took SFT's new preparation") {
    Config dpo = qlora("4.57.1", "0.26.0");
    dpo.training.objective = "dpo";
    CHECK(resolve(dpo).model_load.trl_bf16.any());  // 0.26 changed the SFTTrainer only
    CHECK(resolve(dpo).kbit_cast);
    dpo.versions.trl = "0.7.7";
    CHECK_FALSE(resolve(dpo).model_load.trl_bf16.any());
    dpo.versions.trl = "0.29.0";
    const Resolved r = resolve(dpo);
    CHECK_FALSE(r.kbit_cast);
    CHECK(r.adapter_dtype == AdapterDtype::Bf16);
    CHECK(r.model_load.note.find("DPOTrainer") != std::string::npos);
  }
  SECTION("0.26 on: no kbit preparation, and the adapters in bf16, sharded or not") {
    const Config c = qlora("4.57.1", "0.26.0");
    const Resolved r = resolve(c);
    CHECK(r.model_load.trl_no_kbit_prep);
    CHECK_FALSE(r.model_load.trl_bf16.any());
    CHECK(r.adapter_dtype == AdapterDtype::Bf16);
    const DeviceResult d = simulate_valid(c);
    Config no_prep = qlora("4.57.1");
    no_prep.peft.prepare_kbit = "false";
    no_prep.peft.adapter_dtype = "bf16";
    CHECK(d.model_states.weights_bytes == simulate_valid(no_prep).model_states.weights_bytes);
    CHECK(has_label(d.program, "an adapter's fp32 copy"));
    Config chosen = c;
    chosen.peft.adapter_dtype = "fp32";  // a stated dtype wins
    CHECK(resolve(chosen).adapter_dtype == AdapterDtype::Fp32);
    Config zero3 = c;
    zero3.parallel.data_parallel_size = 2;
    zero3.parallel.zero_stage = 3;
    CHECK(resolve(zero3).adapter_dtype == AdapterDtype::Bf16);
  }
}
