// transformers' load of a bitsandbytes base (src/core/model_load.cpp): caching_allocator_warmup's block by release,
// the 16-bit linears quantized on the GPU, prepare_model_for_kbit_training's casts leaving the 16-bit copies' blocks
// cached, and TRL's SFTTrainer's dtype changes by release.
#include <catch2/catch.hpp>

#include <string>

#include "core/frameworks.h"
#include "core/model_load.h"
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
  const DeviceResult warm = simulate_valid(qlora("4.57.1"));
  const DeviceResult cold = simulate_valid(qlora("4.48.1"));
  // The warmup is the program's first event: kParams * 2 bytes // 4 fp16 elements = kParams bytes.
  REQUIRE(warm.program.events.size() > 1);
  CHECK(warm.program.tensors[warm.program.events[0].tensor].bytes == kParams);
  CHECK(warm.program.labels[warm.program.tensors[warm.program.events[0].tensor].label].rfind("caching_allocator_warmup", 0) == 0);
  CHECK(after_load(warm).reserved_bytes >= kParams);
  CHECK(after_load(cold).reserved_bytes < after_load(warm).reserved_bytes);
  // The same weights either way.
  CHECK(after_load(warm).allocated_bytes == after_load(cold).allocated_bytes);
  CHECK(warm.model_states.weights_bytes == cold.model_states.weights_bytes);
}

TEST_CASE("model load: prepare_model_for_kbit_training's fp32 copies leave the 16-bit ones' blocks cached") {
  const auto cached = [](bool prepare) {  // no warmup (4.48): each block is a segment of its own
    Config c = qlora("4.48.1");
    c.peft.prepare_kbit = prepare;
    const TimelinePoint p = after_load(simulate_valid(c));
    return p.reserved_bytes - p.allocated_bytes;
  };
  // Without the casts the cache holds the linears' 16-bit copies that bitsandbytes quantized; with them, also the
  // 16-bit embedding and head, freed once their fp32 copies exist and too small to hold the next copy.
  CHECK(cached(true) - cached(false) == 2 * 2 * kTable);
}

TEST_CASE("model load: TRL's SFTTrainer changes the dtypes it is given, by release") {
  const int64_t plain = simulate_valid(qlora("4.57.1")).model_states.weights_bytes;
  SECTION("0.7.5-0.25 with bf16: the embedding and head go back to bf16 after their round through fp32") {
    const Config c = qlora("4.57.1", "0.24.0");
    CHECK(resolve(c).model_load.trl_embed_head_bf16);
    const DeviceResult d = simulate_valid(c);
    CHECK(plain - d.model_states.weights_bytes == 2 * 2 * kTable);
    CHECK(has_label(d.program, "an fp32 copy by prepare_model_for_kbit_training"));
  }
  SECTION("not without bf16, before 0.7.5, or when the version comes from a date only") {
    Config fp16 = qlora("4.57.1", "0.24.0");
    fp16.training.precision = "amp_fp16";
    CHECK_FALSE(resolve(fp16).model_load.trl_embed_head_bf16);
    CHECK_FALSE(resolve(qlora("4.57.1", "0.7.4")).model_load.trl_embed_head_bf16);
    Config dated = qlora("latest");
    dated.versions.date = "2025-10-20";
    CHECK_FALSE(resolve(dated).model_load.trl_embed_head_bf16);
  }
  SECTION("0.26 on: no kbit preparation from TRL, and the adapters in bf16") {
    const Resolved r = resolve(qlora("4.57.1", "0.26.0"));
    CHECK(r.model_load.trl_no_kbit_prep);
    CHECK_FALSE(r.model_load.trl_embed_head_bf16);
    CHECK(r.adapter_dtype == AdapterDtype::Bf16);
    CHECK(r.model_load.note.find("peft.prepare_kbit true says the script calls it itself") != std::string::npos);
    Config chosen = qlora("4.57.1", "0.26.0");
    chosen.peft.adapter_dtype = "fp32";  // a stated dtype wins
    CHECK(resolve(chosen).adapter_dtype == AdapterDtype::Fp32);
  }
}
