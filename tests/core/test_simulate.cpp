// The simulator end to end: model-state bytes, the replay's invariants, and bad input.
#include <catch2/catch.hpp>

#include "core/advice.h"
#include "core/catalog.h"
#include "core/checked.h"
#include "core/frameworks.h"
#include "core/simulate.h"
#include "core/tables.h"
#include "core/train_step.h"
#include "core/validation.h"
#include "test_util.h"

using namespace memsim;

TEST_CASE("ZeRO paper Table 1 model states (7.5B, N_d = 64, K = 12)", "[zero]") {
  // Rajbhandari et al., SC'20, Table 1: 120 / 31.4 / 16.6 / 1.88 GB per device for stages 0 (DP), 1, 2, 3.
  ModelShape shape;
  shape.params_total = 7'500'000'000;
  shape.pre = {ParamTensor{"all parameters", shape.params_total, ParamKind::Matmul, 4096}};
  const double expected_gb[] = {120.0, 31.4, 16.6, 1.88};
  for (int stage = 0; stage <= 3; ++stage) {
    Config c;
    c.parallel.zero_stage = stage;
    c.parallel.data_parallel_size = 64;
    c.training.precision = "bf16_mixed";
    StepContext ctx{c, shape, *find_precision("bf16_mixed"), *find_optimizer("adamw"), nullptr};
    ModelStates m = model_state_bytes(ctx);
    double gb = static_cast<double>(m.weights_bytes + m.gradients_bytes + m.optimizer_bytes) / 1e9;
    INFO("stage " << stage << ": " << gb);
    CHECK(gb == Approx(expected_gb[stage]).margin(0.05));
  }
}

TEST_CASE("fp32 and bf16 mixed AdamW bytes per parameter on one GPU", "[model_states]") {
  ModelShape shape;
  shape.params_total = 1000;
  shape.pre = {ParamTensor{"all parameters", 1000, ParamKind::Matmul, 10}};
  Config c;
  c.parallel.zero_stage = 0;
  c.parallel.data_parallel_size = 1;
  // fp32: 4 + 4 + 8 = 16 B/param (DeepSpeed memory.rst)
  StepContext f32{c, shape, *find_precision("fp32"), *find_optimizer("adamw"), nullptr};
  ModelStates a = model_state_bytes(f32);
  CHECK(a.weights_bytes == 4000);
  CHECK(a.gradients_bytes == 4000);
  CHECK(a.optimizer_bytes == 8000);
  // bf16 + fp32 master: 2 + 2 + 12 = 16 B/param (ZeRO sec. 3.1)
  StepContext mixed{c, shape, *find_precision("bf16_mixed"), *find_optimizer("adamw"), nullptr};
  ModelStates b = model_state_bytes(mixed);
  CHECK(b.weights_bytes == 2000);
  CHECK(b.gradients_bytes == 2000);
  CHECK(b.optimizer_bytes == 12000);
}

TEST_CASE("the default scenario simulates, and its breakdown adds up to the device peak", "[simulate]") {
  Result r = simulate(Config{});
  REQUIRE(r.ok);
  REQUIRE(r.devices.size() == 1);
  const DeviceResult& d = r.devices[0];
  CHECK(d.breakdown.total() == d.peak.device_bytes);
  int64_t alloc_sum = 0;
  for (int64_t b : d.breakdown.allocator) alloc_sum += b;
  CHECK(alloc_sum == d.peak.allocated_bytes);
  CHECK(d.peak.reserved_bytes >= d.peak.allocated_bytes);
  CHECK(d.peak.allocated_bytes >= d.peak.requested_bytes);
  CHECK(d.timeline.size() == d.program.events.size());
  CHECK(!d.peak_phase.empty());
  // Llama-2-13B shape: 13,015,864,320 parameters (5120 hidden, 40 layers, 13824 MLP, 32000 vocab)
  CHECK(r.params_total == 13015864320);
}

// 1 layer, hidden 8, MHA 2 heads, MLP 16, vocab 10, untied, fp32, SGD without momentum, one GPU.
static Config tiny_config() {
  Config c;
  c.model = ModelConfig{};
  c.model.hidden_size = 8;
  c.model.num_hidden_layers = 1;
  c.model.num_attention_heads = 2;
  c.model.num_key_value_heads = 2;
  c.model.head_dim = 0;
  c.model.intermediate_size = 16;
  c.model.vocab_size = 10;
  c.training.micro_batch_size = 1;
  c.training.sequence_length = 4;
  c.training.precision = "fp32";
  c.training.optimizer = "sgd";
  c.parallel.data_parallel_size = 1;
  c.parallel.zero_stage = 0;
  return c;
}

TEST_CASE("a hand-derived tiny case: allocator rounding of the weights", "[simulate]") {
  Config c = tiny_config();
  Result r = simulate(c);
  REQUIRE(r.ok);
  const auto& d = r.devices[0];
  // 12 parameter tensors (embed, 2 norms, q, k, v, o, gate, up, down, final norm, lm_head), each at most
  // 512 fp32 elements, so each rounds up to one 512-byte block: weights 12*512 B at any moment.
  CHECK(d.breakdown.allocator[static_cast<int>(Component::Weights)] == 12 * 512);
  // cuBLAS workspace on sm80: 2*4 MiB + 8*16 KiB = 8,519,680 B (large pool); cuBLASLt 1 MiB (small pool).
  CHECK(d.breakdown.allocator[static_cast<int>(Component::Overhead)] == 8519680 + 1024 * 1024);
  // Every other tensor is tiny (at most 4 tokens x 16 x 4 B), so it costs one 512-byte block: the peak is the
  // workspaces plus a whole number of blocks, and everything fits in one 2 MiB and one 20 MiB segment.
  CHECK((d.peak.allocated_bytes - 8519680 - 1024 * 1024) % 512 == 0);
  CHECK(d.peak.reserved_bytes == 22 * kMiB);
  CHECK(d.peak.device_bytes == 22 * kMiB + kCudaContextLazyBytes);
  CHECK(d.fits);
}

TEST_CASE("more sharding never raises a device's model-state bytes", "[simulate][property]") {
  Config c;
  int64_t prev = INT64_MAX;
  for (int stage = 0; stage <= 3; ++stage) {
    c.parallel.zero_stage = stage;
    Result r = simulate(c);
    REQUIRE(r.ok);
    int64_t states = r.model_states.weights_bytes + r.model_states.gradients_bytes + r.model_states.optimizer_bytes;
    CHECK(states <= prev);
    prev = states;
  }
  for (int64_t dp : {1, 2, 4, 8, 16}) {
    c.parallel.data_parallel_size = dp;
    Result r = simulate(c);
    REQUIRE(r.ok);
  }
  // Every sharding engine, at every stage it offers, and more ranks: the states never grow.
  for (const char* engine : {"deepspeed", "fsdp1", "fsdp2", "megatron"}) {
    Config e;
    e.parallel.sharding = engine;
    int64_t last = INT64_MAX;
    for (int stage = 0; stage <= 3; ++stage) {
      e.parallel.zero_stage = stage;
      Result r = simulate(e);
      if (!r.ok) continue;  // FSDP has no stage 1, Megatron no stage 2 or 3
      const int64_t states = r.model_states.weights_bytes + r.model_states.gradients_bytes + r.model_states.optimizer_bytes;
      INFO(engine << " stage " << stage);
      CHECK(states <= last);
      last = states;
      Config more = e;
      more.parallel.data_parallel_size *= 2;
      Result rm = simulate(more);
      REQUIRE(rm.ok);
      CHECK(rm.model_states.weights_bytes + rm.model_states.gradients_bytes + rm.model_states.optimizer_bytes <= states);
    }
  }
}

TEST_CASE("inconsistent shapes come back as a list of field errors", "[simulate][bad-input]") {
  Config c;
  c.model.head_dim = 0;
  c.model.num_attention_heads = 7;  // does not divide 5120
  c.model.num_key_value_heads = 3;  // does not divide 7
  c.training.micro_batch_size = 0;
  c.training.optimizer = "adamw9000";
  Result r = simulate(c);
  REQUIRE(!r.ok);
  std::vector<std::string> fields;
  for (const auto& e : r.errors) fields.push_back(e.field);
  CHECK(std::count(fields.begin(), fields.end(), "model.num_attention_heads") == 1);
  CHECK(std::count(fields.begin(), fields.end(), "model.num_key_value_heads") == 1);
  CHECK(std::count(fields.begin(), fields.end(), "training.micro_batch_size") == 1);
  CHECK(std::count(fields.begin(), fields.end(), "training.optimizer") == 1);
}

TEST_CASE("extreme sizes give an answer or a clear error, never an overflow", "[simulate][extreme]") {
  Config c;
  c.model.hidden_size = 1 << 20;
  c.model.intermediate_size = 1 << 24;
  c.model.num_hidden_layers = 4096;
  c.model.num_attention_heads = 1 << 13;
  c.model.num_key_value_heads = 1 << 13;
  c.model.head_dim = 0;
  c.model.vocab_size = 1 << 26;
  Result r = simulate(c);
  if (r.ok) {
    CHECK(r.params_total > 0);
    CHECK(!r.devices[0].fits);
  } else {
    CHECK(r.errors[0].message.find("out of range") != std::string::npos);
  }
}

TEST_CASE("what helps: every suggestion lowers the peak, ranked by group and then by saving", "[advice]") {
  Config c;  // the default scenario: ZeRO-3 with checkpointing already, so the list is about the rest
  c.training.activation_checkpointing = "none";
  auto s = suggest(c);
  REQUIRE(!s.empty());
  for (size_t i = 0; i < s.size(); ++i) {
    INFO(s[i].change);
    CHECK(s[i].saved_bytes > 0);
    CHECK(!s[i].cost.empty());
    CHECK(simulate(s[i].config).ok);
    // Within a group (advice.h), the changes that fit come first; the others by the memory they save.
    if (i > 0) CHECK(s[i - 1].group <= s[i].group);
    if (i > 0 && s[i - 1].group == s[i].group && s[i - 1].fits == s[i].fits && !s[i].fits)
      CHECK(s[i - 1].saved_bytes >= s[i].saved_bytes);
  }
  bool has_checkpointing = false;
  for (const auto& x : s) has_checkpointing |= x.change.find("checkpointing") != std::string::npos;
  CHECK(has_checkpointing);
}

TEST_CASE("what helps: an early-2022 BERT run on torch 1.10 is told what a newer PyTorch saves", "[advice]") {
  ValidationCase vc;
  std::vector<FieldError> errors;
  REQUIRE(parse_validation_case(read_file(source_path("tests/validation/cases/hf-docs-bert-large-bs4-fp32-adamw.json")),
                                vc, errors));
  REQUIRE(resolve(vc.config).softmax_saves_input);
  const auto s = suggest(vc.config);
  auto saving = [&](const std::string& change) {
    for (const auto& x : s)
      if (x.change == change) return x.saved_bytes;
    return int64_t{0};
  };
  // 24 layers of the fp32 softmax input, 4 x 16 x 512^2 x 4 B = 64 MiB each, are gone with torch 1.11.
  CHECK(saving("PyTorch 1.11 or newer") >= 24 * (int64_t{64} << 20) * 9 / 10);
  CHECK(saving("zero_grad(set_to_none=True)") > 0);
}

TEST_CASE("what helps: a 1F1B pipeline is offered fewer layers on its first stage", "[advice][pipeline]") {
  Config c;  // 13B shape, 40 layers, on 4 pipeline stages of 10: the first holds 4 micro-batches in flight
  c.training.activation_checkpointing = "none";
  c.training.gradient_accumulation_steps = 8;
  c.parallel.zero_stage = 1;
  c.parallel.data_parallel_size = 2;
  c.parallel.pipeline_parallel_size = 4;
  const Result now = simulate(c);
  REQUIRE(now.ok);
  REQUIRE(now.devices.front().peak.device_bytes > now.devices.back().peak.device_bytes);
  const auto s = suggest(c);
  const Suggestion* split = nullptr;
  for (const auto& x : s)
    if (x.config.parallel.pipeline_first_stage_layers > 0) split = &x;
  REQUIRE(split != nullptr);
  // 40 layers: the first stage 7, the other three 11 each (the first split below 10 that keeps them even).
  CHECK(split->config.parallel.pipeline_first_stage_layers == 7);
  CHECK(split->saved_bytes > 0);
}

TEST_CASE("the extremes of the hardening issue answer or refuse clearly", "[simulate][extreme]") {
  // 100T parameters: hidden 65536, 2000 layers, MLP 4x -> 12 * 65536^2 * 2000 = 1.03e14. Needs ZeRO-3 over many
  // GPUs; the answer is a number (it does not fit 80 GB), never an overflow.
  Config big;
  big.model.hidden_size = 65536;
  big.model.num_hidden_layers = 2000;
  big.model.num_attention_heads = 512;
  big.model.num_key_value_heads = 512;
  big.model.head_dim = 0;
  big.model.intermediate_size = 4 * 65536;
  big.training.micro_batch_size = 1;
  big.training.sequence_length = 2048;
  Result r = simulate(big);
  REQUIRE(r.ok);
  CHECK(r.params_total > 100'000'000'000'000LL);
  CHECK(!r.devices[0].fits);
  // A 1M-token sequence: activations of terabytes, reported as such.
  Config seq;
  seq.training.sequence_length = 1 << 20;
  seq.training.micro_batch_size = 1;
  r = simulate(seq);
  REQUIRE(r.ok);
  CHECK(r.devices[0].peak.allocated_bytes > kGiB * 100);
  // A million GPUs: 1024 x 1024 data parallel with ZeRO-3.
  Config gpus;
  gpus.parallel.data_parallel_size = 1 << 20;
  r = simulate(gpus);
  REQUIRE(r.ok);
  CHECK(r.devices[0].device_count == (1 << 20));
  // A 10M vocabulary.
  Config vocab;
  vocab.model.vocab_size = 10'000'000;
  vocab.training.sequence_length = 512;
  r = simulate(vocab);
  REQUIRE(r.ok);
  CHECK(r.params_total > 2 * 10'000'000LL * 5120);
  // Past the validator's ranges: a clear refusal naming the field.
  Config worse = big;
  worse.model.num_hidden_layers = 1'000'000;
  r = simulate(worse);
  REQUIRE(!r.ok);
  CHECK(r.errors[0].field == "model.num_hidden_layers");
}

// A pipeline stage's events grow with the step's micro-batches (one receive buffer each): a million of them on
// 16 stages took 11-14 s and 3 GB, 262,144 took minutes. Validation bounds stages x micro-batches instead.
TEST_CASE("a pipeline of more than 65,536 stage micro-batches is refused with the limit named", "[simulate]") {
  Config c;
  c.training.framework = "torchtitan";
  c.parallel.pipeline_parallel_size = 16;
  c.parallel.zero_stage = 3;
  c.model.num_hidden_layers = 16;
  c.training.gradient_accumulation_steps = 4097;
  const auto errors = validate(c);
  REQUIRE(!errors.empty());
  CHECK(errors[0].field == "training.gradient_accumulation_steps");
  CHECK(errors[0].message.find("4096 micro-batches with 16 stages") != std::string::npos);
  c.training.gradient_accumulation_steps = 4096;
  CHECK(validate(c).empty());
}

TEST_CASE("the CUDA context follows the GPU generation and the module loading", "[simulate]") {
  Config c = tiny_config();
  auto context = [&](const char* gpu, const char* loading, int64_t override_bytes = 0) {
    c.hardware.gpu = gpu;
    c.hardware.cuda_module_loading = loading;
    c.hardware.cuda_context_bytes = override_bytes;
    Result r = simulate(c);
    REQUIRE(r.ok);
    const auto& d = r.devices[0];
    CHECK(d.peak.device_bytes == d.peak.reserved_bytes + d.breakdown.cuda_context_bytes + d.breakdown.nccl_bytes);
    return d.breakdown.cuda_context_bytes;
  };
  CHECK(context("a100-80gb", "lazy") == kCudaContextLazyBytes);           // PR #86509's bare context
  CHECK(context("h200", "lazy") == kCudaContextHopperLazyBytes);          // measured after training steps
  CHECK(context("h100-sxm", "lazy") == kCudaContextHopperLazyBytes);      // the same sm_90 kernels
  CHECK(context("h200", "eager") == kCudaContextEagerBytes);
  CHECK(context("h200", "lazy", 123 << 20) == (123 << 20));               // the user's own reading wins
}

TEST_CASE("tied embeddings: lm_head's and the embedding's gradients are summed into a new block", "[simulate]") {
  // Llama 3.2 1B ties lm_head to the embedding: one parameter whose AccumulateGrad node waits for both gradients.
  // The H200 traces (bf16 and fp32) show the dense embedding gradient, a third [V, h] block for their sum, then
  // both addends freed; the sum is the new .grad, so the gradients' total is unchanged after the step's backward.
  Config c = single_gpu_config("llama-3.2-1b.json", 1, 512);
  c.training.optimizer = "sgd";  // no state: the gradients are all that the Gradients component holds
  Result r = simulate(c);
  REQUIRE(r.ok);
  const StepProgram& p = r.devices[0].program;
  const int64_t vh2 = 2 * 128256LL * 2048;
  int64_t live = 0, at_sum = -1;
  for (const Event& e : p.events) {
    if (e.component != Component::Gradients) continue;
    live += (e.op == Event::Op::Alloc ? 1 : -1) * p.tensors[e.tensor].bytes;
    const std::string& label = p.labels[p.tensors[e.tensor].label];
    if (e.op == Event::Op::Alloc && label.rfind("tied weights: lm_head's and", 0) == 0) {
      at_sum = live;
      break;
    }
  }
  const int64_t after = live_bytes_before_phase(p, "optimizer step 1", Component::Gradients);
  REQUIRE(at_sum > 0);
  CHECK(at_sum - after == vh2);  // the sum beside lm_head's gradient, which goes next
  CHECK(after == 2 * r.params_trainable);  // every .grad once, in bf16
  c.training.precision = "amp_bf16";  // through the cast's backward: added in place (tied_sum)
  Result amp = simulate(c);
  REQUIRE(amp.ok);
  for (const Tensor& t : amp.devices[0].program.tensors)
    CHECK(amp.devices[0].program.labels[t.label].rfind("tied weights: lm_head's and", 0) != 0);
}

TEST_CASE("expandable segments: pages instead of segments, and a tight GPU replays with free pages unmapped",
          "[simulate][expandable]") {
  Config c;  // the default scenario: ZeRO-3, 13B-shaped, 8 x A100 80GB
  const Result native = simulate(c);
  c.hardware.expandable_segments = "true";
  const Result r = simulate(c);
  REQUIRE(native.ok);
  REQUIRE(r.ok);
  const auto& n = native.devices[0];
  const auto& d = r.devices[0];
  CHECK(d.peak.reserved_bytes % (2 * kMiB) == 0);  // whole pages
  CHECK(d.peak.reserved_bytes >= d.peak.allocated_bytes);
  CHECK(d.peak.device_bytes == d.peak.reserved_bytes + d.breakdown.cuda_context_bytes + d.breakdown.nccl_bytes);
  CHECK(d.program.events.size() == n.program.events.size());  // the same step, another allocator
  CHECK(d.peak.reserved_bytes != n.peak.reserved_bytes);
  // A GPU one large page short of the reserved peak (162 MiB above the allocated one here): the replay against the
  // real capacity unmaps free pages when a page cannot be mapped, and the step fits with less reserved. (With room
  // for only 100 MiB above the allocated peak it runs out of memory: pages partly in use cannot be unmapped.)
  const int64_t outside = d.breakdown.cuda_context_bytes + d.breakdown.nccl_bytes;
  c.hardware.gpu_memory_bytes = outside + d.peak.reserved_bytes - 20 * kMiB;
  const Result t = simulate(c);
  REQUIRE(t.ok);
  const auto& td = t.devices[0];
  INFO("allocated " << d.peak.allocated_bytes << " reserved " << d.peak.reserved_bytes << " -> " << td.peak.reserved_bytes
                    << (td.oom ? " OOM" : ""));
  CHECK(td.oom == false);
  CHECK(td.peak.reserved_bytes <= td.capacity_bytes - outside);
  CHECK(td.peak.reserved_bytes < d.peak.reserved_bytes);
}

TEST_CASE("expandable segments: a tensor larger than the GPU's address space is an OOM, not a crash", "[simulate][expandable][bad-input]") {
  // The default 13B shape's weight shards alone exceed a 1 GB card, and an expandable segment holds 9/8 of the card:
  // the unlimited replay still finds the whole allocated peak, and the replay against the card reports the OOM.
  Config c;
  c.hardware.gpu = "custom";
  c.hardware.gpu_memory_bytes = 1000000000;  // 0.93 GiB: the default 13B shape's first weights do not fit
  c.hardware.expandable_segments = "true";
  Result r = simulate(c);
  REQUIRE(r.ok);
  CHECK(r.devices[0].oom);
  CHECK(r.devices[0].peak.allocated_bytes > c.hardware.gpu_memory_bytes);
}

// simulate() keeps the last few layouts' model shapes (simulate.cpp layout_shape): every field that shapes the model
// must be in the cache's key. Each pair below differs in one such field; the second, simulated right after the first
// (whose shape is then cached), must give what it gives with the cache full of other shapes.
TEST_CASE("the cached model shape follows every field that shapes it", "[simulate][cache]") {
  Config lora;
  lora.model = find_model_preset("mistral-7b-v0.1")->model;
  lora.training.framework = "hf_trainer";
  lora.training.sequence_length = 512;
  lora.training.micro_batch_size = 1;
  lora.parallel.data_parallel_size = 2;
  lora.parallel.zero_stage = 0;
  lora.peft.method = "lora";
  std::vector<std::tuple<std::string, Config, Config>> pairs;
  auto pair = [&](const char* name, const Config& first, auto&& change) {
    Config second = first;
    change(second);
    pairs.emplace_back(name, first, second);
  };
  pair("lora rank", lora, [](Config& c) { c.peft.lora_rank = 64; });
  pair("targets", lora, [](Config& c) { c.peft.target_modules = "all-linear"; });
  pair("modules to save", lora, [](Config& c) { c.peft.modules_to_save = "lm_head"; });
  pair("no PEFT", lora, [](Config& c) { c.peft.method = "none"; });
  pair("NF4 base", lora, [](Config& c) { c.peft.base_quantization = "nf4"; });
  Config nf4 = lora;
  nf4.peft.base_quantization = "nf4";
  pair("litgpt quantizes the head too", nf4, [](Config& c) { c.training.framework = "litgpt"; });
  pair("layers", lora, [](Config& c) { c.model.num_hidden_layers = 8; });
  Config megatron = lora;
  megatron.training.framework = "megatron";
  megatron.peft.method = "none";
  megatron.parallel.data_parallel_size = 1;
  pair("tensor parallel", megatron, [](Config& c) { c.parallel.tensor_parallel_size = 2; });
  Config fsdp = lora;
  fsdp.parallel.sharding = "fsdp1";
  fsdp.parallel.zero_stage = 3;
  pair("FSDP1 units", fsdp, [](Config& c) { c.parallel.fsdp_use_orig_params = "true"; });
  Config vlm = lora;
  vlm.model = find_model_preset("qwen2-vl-2b")->model;
  pair("projector trained", vlm, [](Config& c) { c.training.train_projector = "true"; });
  Config vlm_full = vlm;
  vlm_full.peft.method = "none";
  pair("vision tower trained", vlm_full, [](Config& c) { c.training.train_vision_tower = true; });
  Config experts = megatron;
  experts.model = find_model_preset("mixtral-8x7b")->model;
  experts.parallel.data_parallel_size = 8;
  experts.parallel.zero_stage = 1;
  pair("expert parallel", experts, [](Config& c) { c.parallel.expert_parallel_size = 8; });

  auto flush = [&lora] {  // four other shapes fill the cache
    for (int64_t layers = 1; layers <= 4; ++layers) {
      Config other = lora;
      other.model.num_hidden_layers = layers;
      REQUIRE(simulate(other).errors.empty());
    }
  };
  auto summary = [](const Result& r) {
    REQUIRE(r.errors.empty());
    std::string s = std::to_string(r.params_total) + " " + std::to_string(r.params_trainable);
    for (const auto& d : r.devices)
      s += " " + std::to_string(d.peak.allocated_bytes) + " " + std::to_string(d.peak.reserved_bytes) + " " +
           std::to_string(d.model_states.weights_bytes) + " " + std::to_string(d.model_states.optimizer_bytes);
    return s;
  };
  for (const auto& [name, first, second] : pairs) {
    INFO(name);
    const std::string first_summary = summary(simulate(first));
    const std::string after_first = summary(simulate(second));
    CHECK(after_first != first_summary);  // the field changes the result: the pair tests something
    flush();
    CHECK(summary(simulate(second)) == after_first);
  }
}

// prime-rl's SFT trainer (training.framework prime_rl): the model's forward returns fp32 logits, and `out` keeps them
// after `del logits`, through backward, the optimizer step and the next micro-batch's forward (sft/train.py at
// d8f290ef0). A plain loop lets go of its outputs after the backward.
TEST_CASE("prime_rl keeps each micro-batch's fp32 logits until the next forward returns") {
  Config c = single_gpu_config("qwen2.5-0.5b.json", 1, 2048);
  c.training.framework = "prime_rl";
  c.training.precision = "bf16_mixed";
  c.training.gradient_accumulation_steps = 2;
  c.parallel.sharding = "fsdp2";
  c.parallel.zero_stage = 3;
  c.training.attention = "auto";
  const DeviceResult prime = simulate_valid(c);
  const int64_t fp32_logits = int64_t{4} * 2048 * 151936;
  // Before the second micro-batch's forward: the first's fp32 logits are still held.
  CHECK(live(prime.program, "forward (step 1, micro-batch 2)", "logits upcast to fp32") == fp32_logits);
  c.training.framework = "hf_loop";
  c.training.loss = "full_fp32";
  c.training.checkpoint_reentrant = "false";
  c.training.optimizer_impl = "foreach";
  c.training.attention = "flash_attention_2";
  const DeviceResult loop = simulate_valid(c);
  CHECK(live(loop.program, "forward (step 1, micro-batch 2)", "logits upcast to fp32") == 0);
  // A plain loop's `out` holds them too, through its backward only (hf_loop holds_logits); prime-rl's last
  // micro-batch's stay through the optimizer step.
  CHECK(live(prime.program, "optimizer step 1", "logits upcast to fp32") == fp32_logits);
  CHECK(live(loop.program, "optimizer step 1", "logits upcast to fp32") == 0);
}

// prime-rl's RL head (training.loss vocab_chunked, FusedOutputLinear at d8f290ef0): log-probabilities over 2,048-column
// slices of the vocabulary, never a [tokens, vocab] tensor; backward recomputes each slice and fills 16-bit
// zeros_like(hidden) and zeros_like(weight).
TEST_CASE("vocab_chunked: no [tokens, vocab] logits, slices of 2,048 columns and a [vocab, hidden] weight gradient") {
  Config c = single_gpu_config("qwen2.5-0.5b.json", 1, 4096);
  c.training.framework = "prime_rl";
  c.training.precision = "bf16_mixed";
  c.parallel.sharding = "fsdp2";
  c.parallel.zero_stage = 3;
  c.training.loss = "vocab_chunked";
  const DeviceResult chunked = simulate_valid(c);
  int64_t largest_logits = 0;
  for (const Event& e : chunked.program.events) {
    const Tensor& t = chunked.program.tensors[e.tensor];
    const std::string& label = chunked.program.labels[t.label];
    if (e.op == Event::Op::Alloc && label.rfind("logits", 0) == 0) largest_logits = std::max(largest_logits, t.bytes);
  }
  CHECK(largest_logits == int64_t{4} * 4096 * 2048);  // one slice's fp32 copy
  bool weight_grad = false;
  for (const Event& e : chunked.program.events)
    weight_grad = weight_grad || (e.op == Event::Op::Alloc && chunked.program.tensors[e.tensor].bytes == int64_t{2} * 151936 * 896);
  CHECK(weight_grad);
  c.training.loss = "auto";  // prime-rl's SFT head: the fp32 logits of every token
  CHECK(simulate_valid(c).peak.allocated_bytes > chunked.peak.allocated_bytes + int64_t{4} * 4096 * 151936);
}

