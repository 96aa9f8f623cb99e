// Preference objectives (training.objective dpo, orpo, simpo, kto; src/core/preference.cpp and preference_step.cpp,
// docs/research/preference.md): the pair's rows, the log-probabilities each TRL version keeps, the reference model
// and its forward, and the refusals.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "core/simulate.h"
#include "core/validate.h"
#include "test_util.h"

using namespace memsim;

namespace {

// Qwen2.5 0.5B (a 151,936-token vocabulary, so the logits dominate) trained as TRL's DPOTrainer runs it.
Config dpo_config(const char* trl = "latest", int64_t pairs = 2, int64_t sequence = 512) {
  Config c = single_gpu_config("qwen2.5-0.5b.json", pairs, sequence);
  c.training.objective = "dpo";
  c.versions.trl = trl;
  return c;
}

uint32_t label_of(const StepProgram& p, const std::string& prefix) {
  for (size_t i = 0; i < p.labels.size(); ++i)
    if (p.labels[i].rfind(prefix, 0) == 0) return static_cast<uint32_t>(i);
  return UINT32_MAX;
}

// Every allocation's bytes under a label, in order.
std::vector<int64_t> allocations(const StepProgram& p, const std::string& prefix) {
  const uint32_t l = label_of(p, prefix);
  std::vector<int64_t> out;
  for (const Event& e : p.events)
    if (e.op == Event::Op::Alloc && p.tensors[e.tensor].label == l) out.push_back(p.tensors[e.tensor].bytes);
  return out;
}

// The sum of what the layers (not the embeddings, head or loss) save for backward over the step, leaving out the
// phases whose names start with `skip` (KTO's no-grad KL forwards).
int64_t layer_activation_bytes(const StepProgram& p, const std::string& skip = "") {
  int64_t sum = 0;
  size_t phase = 0;
  bool skipped = false;
  for (uint32_t i = 0; i < p.events.size(); ++i) {
    while (phase < p.phases.size() && p.phases[phase].first_event <= i)
      skipped = !skip.empty() && p.phases[phase].name.rfind(skip, 0) == 0, ++phase;
    const Event& e = p.events[i];
    const Tensor& t = p.tensors[e.tensor];
    if (!skipped && e.op == Event::Op::Alloc && t.component == Component::Activations && t.layer >= 0) sum += t.bytes;
  }
  return sum;
}

// The largest allocated bytes within the phases named `name` (prefix), and the allocated bytes where each began.
struct PhaseBytes {
  int64_t peak = -1, start = -1;
};
PhaseBytes phase_bytes(const DeviceResult& d, const std::string& name) {
  PhaseBytes out;
  const auto& phases = d.program.phases;
  for (size_t i = 0; i < phases.size(); ++i) {
    if (phases[i].name.rfind(name, 0) != 0) continue;
    const uint32_t end = i + 1 < phases.size() ? phases[i + 1].first_event : static_cast<uint32_t>(d.timeline.size());
    for (uint32_t k = phases[i].first_event; k < end && k < d.timeline.size(); ++k)
      out.peak = std::max(out.peak, d.timeline[k].allocated_bytes);
    if (phases[i].first_event > 0 && phases[i].first_event <= d.timeline.size())
      out.start = d.timeline[phases[i].first_event - 1].allocated_bytes;
  }
  return out;
}

constexpr int64_t kVocab = 151936;

}  // namespace

TEST_CASE("a preference micro-batch runs its chosen and rejected sequences as one forward of twice the rows") {
  Config dpo = dpo_config();
  dpo.training.reference_model = "precomputed";
  Config sft = single_gpu_config("qwen2.5-0.5b.json", 4, 512);
  CHECK(layer_activation_bytes(simulate_valid(dpo).program) == layer_activation_bytes(simulate_valid(sft).program));
  // Padding-free (data.padding none) flattens the pairs' rows into one: twice the tokens of the row.
  Config flat = dpo;
  flat.data.lengths = "micro_batches", flat.data.micro_batch_lengths = "512", flat.data.padding = "none";
  flat.training.micro_batch_size = 1;
  Config flat_sft = single_gpu_config("qwen2.5-0.5b.json", 1, 1024);
  flat_sft.data.lengths = "micro_batches", flat_sft.data.micro_batch_lengths = "1024", flat_sft.data.padding = "none";
  CHECK(layer_activation_bytes(simulate_valid(flat).program) == layer_activation_bytes(simulate_valid(flat_sft).program));
}

TEST_CASE("the log-probabilities keep what each TRL version's code saves") {
  const int64_t rows = 4, s = 512, tv = rows * s * kVocab;
  // Single GPU under the Trainer's bf16: accelerate's convert_outputs_to_fp32 makes the logits fp32.
  SECTION("TRL < 0.15: the whole log_softmax(-1) of the fp32 logits, after a contiguous copy of the slice (< 0.14)") {
    const DeviceResult d = simulate_valid(dpo_config("0.13"));
    CHECK(allocations(d.program, "log-probabilities: the log-softmax") == std::vector<int64_t>(4, 4 * tv));  // 2 steps x (policy, reference)
    CHECK(allocations(d.program, "logits copy").size() == 4);
    CHECK(allocations(simulate_valid(dpo_config("0.14")).program, "logits copy").empty());
  }
  SECTION("TRL >= 0.15, fp32 logits: selective_log_softmax saves the logits themselves, nothing of vocabulary size more") {
    const DeviceResult d = simulate_valid(dpo_config("0.16"));
    CHECK(allocations(d.program, "log-probabilities: the log-softmax") == std::vector<int64_t>(2, 4 * s * kVocab));  // the reference's one row at a time
  }
  SECTION("TRL >= 0.15, 16-bit logits (DeepSpeed has no fp32 output wrapper): one saved log-softmax per row") {
    Config c = dpo_config("0.16");
    c.parallel.data_parallel_size = 2, c.parallel.zero_stage = 2, c.parallel.sharding = "deepspeed";
    c.versions.transformers = "4.50";
    const auto logps = allocations(simulate_valid(c).program, "log-probabilities: the log-softmax");
    // Per step: the policy's 4 rows saved, and the reference's row that exists at a time (each goes before the next).
    CHECK(logps == std::vector<int64_t>(10, 2 * s * kVocab));
    // transformers <= 4.45 upcasts the logits itself.
    c.versions.transformers = "4.45";
    CHECK(allocations(simulate_valid(c).program, "log-probabilities: the log-softmax").size() == 2);
  }
}

// The most bytes alive under a label (prefix) within the phases named `phase` (prefix).
int64_t label_peak_in(const StepProgram& p, const std::string& phase, const std::string& label) {
  std::vector<int64_t> now(p.events.size() + 1, 0);  // now[i]: alive before event i
  for (size_t i = 0; i < p.events.size(); ++i) {
    const Tensor& t = p.tensors[p.events[i].tensor];
    const bool mine = p.labels[t.label].rfind(label, 0) == 0;
    now[i + 1] = now[i] + (mine ? (p.events[i].op == Event::Op::Alloc ? 1 : -1) * t.bytes : 0);
  }
  int64_t top = 0;
  for (size_t k = 0; k < p.phases.size(); ++k) {
    if (p.phases[k].name.rfind(phase, 0) != 0) continue;
    const size_t end = k + 1 < p.phases.size() ? p.phases[k + 1].first_event : p.events.size();
    for (size_t i = p.phases[k].first_event; i <= end && i < now.size(); ++i) top = std::max(top, now[i]);
  }
  return top;
}

TEST_CASE("ZeRO-3 under DPO: the policy's last layers stay gathered to their backward, and the reference's own engine "
          "prefetches", "[preference]") {
  // docs/research/zero3-reference.md section 2: the policy's recorded trace runs on from the forward into the
  // backward, so the parameters its prefetch scans past stay gathered through the loss and the reference forward; the
  // reference copy is a DeepSpeed engine of its own whose coordinator prefetches up to max_live from its second forward.
  Config z3 = dpo_config();
  z3.training.precision = "bf16_mixed";
  z3.parallel.data_parallel_size = 4, z3.parallel.zero_stage = 3, z3.parallel.sharding = "deepspeed";
  const std::string policy = "DeepSpeed ZeRO-3 all-gathered layer parameters";
  const std::string reference = "reference layer's gathered parameters";
  const DeviceResult wide = simulate_valid(z3);  // max_live 1e9: the whole 0.5B model
  Config narrow_config = z3;
  narrow_config.parallel.zero_max_live_parameters = 1;  // nothing ahead of the module that runs
  const DeviceResult narrow = simulate_valid(narrow_config);
  // Through the reference forward of step 2 the policy keeps far more than its head where max_live allows it.
  const int64_t kept_wide = label_peak_in(wide.program, "reference forward (step 2)", policy);
  const int64_t kept_narrow = label_peak_in(narrow.program, "reference forward (step 2)", policy);
  CHECK(kept_wide > kept_narrow);
  // Step 1's forward records the trace and prefetches nothing, neither engine.
  CHECK(label_peak_in(wide.program, "reference forward (step 1)", policy) ==
        label_peak_in(narrow.program, "reference forward (step 1)", policy));
  // The reference's own window: one unit at a time in its first forward, max_live (here every layer) from its second.
  const int64_t ref_first = label_peak_in(wide.program, "reference forward (step 1)", reference);
  const int64_t ref_second = label_peak_in(wide.program, "reference forward (step 2)", reference);
  CHECK(ref_first > 0);
  CHECK(ref_second > 3 * ref_first);  // the embedding alone, then the embedding with every layer ahead of it
  CHECK(label_peak_in(narrow.program, "reference forward (step 2)", reference) <= ref_first);
}

TEST_CASE("the reference model: a frozen copy's weights, sharded under ZeRO-3, none with PEFT's adapters off") {
  Config full = dpo_config();
  const DeviceResult copy = simulate_valid(full);
  full.training.reference_model = "precomputed";
  const DeviceResult none = simulate_valid(full);
  CHECK(copy.model_states.other_models_bytes == none.model_states.weights_bytes);
  CHECK(copy.model_states.weights_bytes == none.model_states.weights_bytes);
  CHECK(allocations(copy.program, "reference model weights") == std::vector<int64_t>{none.model_states.weights_bytes});

  Config z3 = dpo_config();
  z3.training.precision = "bf16_mixed";
  z3.parallel.data_parallel_size = 4, z3.parallel.zero_stage = 3, z3.parallel.sharding = "deepspeed";
  const DeviceResult sharded = simulate_valid(z3);
  const int64_t ref = allocations(sharded.program, "reference model weights").at(0);
  CHECK(ref == sharded.model_states.weights_bytes);  // the policy's shard and the copy's, the same size
  CHECK(ref == sharded.model_states.other_models_bytes);
  CHECK(allocations(sharded.program, "reference layer's gathered parameters").size() >= 2u * 24);
  // ZeRO-2 under DeepSpeed: prepare_deepspeed makes the reference stage 0, a whole copy of the (whole) policy; FSDP
  // under TRL 0.29+: prepare_fsdp wraps it with the policy's strategy, so it holds what the policy's weights hold.
  z3.parallel.zero_stage = 2;
  for (const char* engine : {"deepspeed", "fsdp1", "fsdp2"}) {
    z3.parallel.sharding = engine;
    INFO(engine);
    const DeviceResult d = simulate_valid(z3);
    CHECK(allocations(d.program, "reference model weights").at(0) == d.model_states.weights_bytes);
  }

  Config lora = dpo_config();
  lora.peft.method = "lora";
  const DeviceResult adapters = simulate_valid(lora);
  CHECK(allocations(adapters.program, "reference model weights").empty());
  CHECK(phase_bytes(adapters, "reference forward (step 2)").peak > 0);
}

TEST_CASE("the reference's forward runs on top of the policy's saved graph and leaves nothing behind") {
  Config lora = dpo_config("0.16");
  lora.peft.method = "lora";
  const DeviceResult with_ref = simulate_valid(lora);
  lora.training.reference_model = "precomputed";
  const DeviceResult precomputed = simulate_valid(lora);
  CHECK(phase_bytes(precomputed, "reference forward").peak == -1);
  const PhaseBytes ref = phase_bytes(with_ref, "reference forward (step 2)");
  const int64_t fp32_logits = int64_t{4} * 4 * 512 * kVocab;
  CHECK(ref.peak >= ref.start + fp32_logits);
  CHECK(with_ref.timeline.back().allocated_bytes == precomputed.timeline.back().allocated_bytes);
  // TRL 0.7-0.11 keeps the policy's logits (the views it returns) through the reference forward; 0.12-0.14 do not.
  Config old = dpo_config("0.11"), newer = dpo_config("0.13");
  old.peft.method = newer.peft.method = "lora";
  old.training.nll_alpha = 0;  // 0.9-0.11 computed the chosen half's cross-entropy anyway
  const PhaseBytes held = phase_bytes(simulate_valid(old), "reference forward (step 2)");
  const PhaseBytes freed = phase_bytes(simulate_valid(newer), "reference forward (step 2)");
  CHECK(held.start - freed.start >= fp32_logits);
}

TEST_CASE("TRL 0.19-0.28 return every hidden state: the reference's layer outputs live to the end of its forward") {
  Config c = dpo_config("0.18");
  c.parallel.data_parallel_size = 2, c.parallel.zero_stage = 2, c.parallel.sharding = "deepspeed";  // no fp32 wrapper
  const PhaseBytes before = phase_bytes(simulate_valid(c), "reference forward (step 2)");
  c.versions.trl = "0.20";
  const PhaseBytes with_hidden = phase_bytes(simulate_valid(c), "reference forward (step 2)");
  const int64_t layers = 24, hidden = int64_t{2} * 4 * 512 * 896;  // Qwen2.5 0.5B: 24 layers, hidden 896, bf16
  CHECK(with_hidden.peak - before.peak >= (layers - 1) * hidden);
  CHECK(with_hidden.peak - before.peak <= (layers + 1) * hidden);
}

TEST_CASE("TRL 0.29-1.5 keep a contiguous shift copy, 1.6+ copy the logits once more for the entropy metric") {
  Config c = dpo_config("0.28");
  c.training.reference_model = "precomputed";
  const int64_t fp32_logits = int64_t{4} * 4 * 512 * kVocab;
  CHECK(allocations(simulate_valid(c).program, "logits copy").empty());
  c.versions.trl = "1.5";
  CHECK(allocations(simulate_valid(c).program, "logits copy") == std::vector<int64_t>(2, fp32_logits));  // the shift copy
  c.versions.trl = "latest";
  CHECK(allocations(simulate_valid(c).program, "logits copy").empty());
  CHECK(allocations(simulate_valid(c).program, "entropy metric") == std::vector<int64_t>(2, fp32_logits));
  c.training.objective = "orpo", c.training.reference_model = "auto";
  CHECK(allocations(simulate_valid(c).program, "logits copy") == std::vector<int64_t>(2, fp32_logits / 2));  // its CE's half
}

TEST_CASE("orpo and simpo have no reference, the chosen half's cross-entropy saves half the logits' log-softmax") {
  Config orpo = dpo_config("0.16");
  orpo.training.objective = "orpo";
  const DeviceResult d = simulate_valid(orpo);
  CHECK(phase_bytes(d, "reference forward").peak == -1);
  CHECK(allocations(d.program, "chosen half's cross-entropy") == std::vector<int64_t>(2, int64_t{4} * 2 * 512 * kVocab));
  Config simpo = orpo;
  simpo.training.objective = "simpo";
  CHECK(allocations(simulate_valid(simpo).program, "chosen half's cross-entropy").empty());
  simpo.training.nll_alpha = 1.0;  // CPOTrainer's cpo_alpha
  CHECK(allocations(simulate_valid(simpo).program, "chosen half's cross-entropy").size() == 2);
}

TEST_CASE("torchtune's LoRA DPO keeps the reference's fp32 logits to the backward") {
  Config c = dpo_config();
  c.training.framework = "torchtune";
  c.peft.method = "lora";
  const DeviceResult d = simulate_valid(c);
  const auto& p = d.program;
  const uint32_t ref = label_of(p, "reference logits");
  // The last reference-logits tensor made is freed in a backward phase.
  uint32_t made = UINT32_MAX;
  size_t freed_at = 0;
  for (size_t i = 0; i < p.events.size(); ++i) {
    const Event& e = p.events[i];
    if (p.tensors[e.tensor].label != ref) continue;
    if (e.op == Event::Op::Alloc && p.tensors[e.tensor].bytes == int64_t{4} * 4 * 512 * kVocab) made = e.tensor;
    if (e.op == Event::Op::Free && e.tensor == made) freed_at = i;
  }
  REQUIRE(freed_at > 0);
  std::string phase;
  for (const Phase& ph : p.phases)
    if (ph.first_event <= freed_at) phase = ph.name;
  CHECK(phase.rfind("backward", 0) == 0);
}

TEST_CASE("preference objectives refuse what is not modelled, one line naming the field") {
  auto first_error = [](const Config& c) {
    const auto e = validate(c);
    return e.empty() ? std::string() : e[0].field;
  };
  Config c = dpo_config();
  c.training.reference_model = "none";
  CHECK(first_error(c) == "training.reference_model");
  c.training.reference_model = "adapter_disabled";  // without PEFT
  CHECK(first_error(c) == "training.reference_model");
  c = dpo_config();
  c.training.objective = "orpo", c.training.reference_model = "copy";
  CHECK(first_error(c) == "training.reference_model");
  c = dpo_config();
  c.training.framework = "megatron";
  CHECK(first_error(c) == "training.framework");
  c = dpo_config();
  c.training.loss = "fused_linear";
  CHECK(first_error(c) == "training.loss");
  c = dpo_config();
  c.training.objective = "rloo";  // not an objective memsim models
  CHECK(first_error(c) == "training.objective");
  c = dpo_config();
  c.model.architecture = "vit";
  CHECK(!validate(c).empty());
  c = single_gpu_config("qwen2.5-0.5b.json");
  c.training.reference_model = "copy";  // sft
  CHECK(first_error(c) == "training.reference_model");
}

// KTO (TRL's KTOTrainer; preference.cpp resolve_kto, docs/research/preference.md 1f and 5).
TEST_CASE("kto runs micro_batch_size unpaired rows and a no-grad forward of the KL batch before each model's") {
  Config kto = dpo_config("latest", 4);
  kto.training.objective = "kto";
  kto.training.reference_model = "precomputed";
  Config sft = single_gpu_config("qwen2.5-0.5b.json", 4, 512);
  CHECK(layer_activation_bytes(simulate_valid(kto).program, "KL ") == layer_activation_bytes(simulate_valid(sft).program));
  CHECK(layer_activation_bytes(simulate_valid(kto).program) > layer_activation_bytes(simulate_valid(sft).program));
  const int64_t fp32_logits = int64_t{4} * 4 * 512 * kVocab;  // 4 rows, fp32 under the Trainer's bf16 (accelerate)
  // Each pass's bf16 logits, then accelerate's fp32 copy of them.
  auto passes = [&](size_t n) {
    std::vector<int64_t> v;
    for (size_t i = 0; i < n; ++i) v.push_back(fp32_logits / 2), v.push_back(fp32_logits);
    return v;
  };
  // Precomputed reference log-probabilities (ref_KL_logps too): only the policy's KL forward, once per micro-batch.
  CHECK(allocations(simulate_valid(kto).program, "KL batch logits") == passes(2));
  kto.training.reference_model = "auto";  // a copy without PEFT: its KL forward and its forward of the batch
  const DeviceResult d = simulate_valid(kto);
  CHECK(allocations(d.program, "KL batch logits") == passes(4));
  CHECK(allocations(d.program, "reference logits") == passes(2));
  const PhaseBytes kl = phase_bytes(d, "KL forward (step 2)");
  CHECK(kl.peak >= kl.start + fp32_logits);
}

TEST_CASE("kto before TRL 0.17 keeps the KL batch's logits through the batch's forward") {
  Config c = dpo_config("0.16", 4);
  c.training.objective = "kto";
  c.peft.method = "lora";
  const PhaseBytes held = phase_bytes(simulate_valid(c), "forward (step 2)");
  c.versions.trl = "0.17";
  const PhaseBytes freed = phase_bytes(simulate_valid(c), "forward (step 2)");
  const int64_t fp32_logits = int64_t{4} * 4 * 512 * kVocab;
  CHECK(held.start - freed.start >= fp32_logits);
  CHECK(held.start - freed.start <= fp32_logits + (int64_t{2} << 20));  // the allocator's 2 MiB rounding
}

TEST_CASE("kto before TRL 0.10 takes the KL batch's log-probabilities after the batch's, inside its forward") {
  Config c = dpo_config("0.9", 4);
  c.training.objective = "kto";
  c.training.reference_model = "precomputed";
  const PhaseBytes late = phase_bytes(simulate_valid(c), "forward (step 2)");
  c.versions.trl = "0.10";
  const PhaseBytes early = phase_bytes(simulate_valid(c), "forward (step 2)");
  CHECK(late.peak - early.peak >= int64_t{4} * 4 * 512 * kVocab);  // the slice's copy and the log-softmax, fp32
}

TEST_CASE("kto copies the logits' labelled rows for its metrics: before the reference up to TRL 1.8, after from 1.9") {
  Config c = dpo_config("1.5", 4);
  c.training.objective = "kto";
  const int64_t fp32_logits = int64_t{4} * 4 * 512 * kVocab;
  // 1.5: the policy's copies and the reference's own (its forward() call makes them too), per micro-batch.
  CHECK(allocations(simulate_valid(c).program, "logits copies of the desirable") == std::vector<int64_t>(4, fp32_logits));
  c.versions.trl = "1.8";
  const DeviceResult before = simulate_valid(c);
  CHECK(allocations(before.program, "logits copies of the desirable") == std::vector<int64_t>(2, fp32_logits));
  CHECK(allocations(before.program, "entropy metric") == std::vector<int64_t>(2, fp32_logits));
  // Kept through the reference forward, the policy's copies raise what it starts from.
  c.versions.trl = "latest";
  const DeviceResult after = simulate_valid(c);
  CHECK(allocations(after.program, "logits copies of the desirable") == std::vector<int64_t>(2, fp32_logits));
  const int64_t held = phase_bytes(before, "reference forward (step 2)").start - phase_bytes(after, "reference forward (step 2)").start;
  CHECK(held >= fp32_logits);
  CHECK(held <= fp32_logits + (int64_t{2} << 20));  // the allocator's 2 MiB rounding
}

TEST_CASE("kto refuses what KTOTrainer refuses or memsim does not model, one line naming the field") {
  auto first_error = [](const Config& c) {
    const auto e = validate(c);
    return e.empty() ? std::string() : e[0].field;
  };
  Config c = dpo_config("latest", 4);
  c.training.objective = "kto";
  CHECK(first_error(c).empty());
  Config bad = c;
  bad.training.reference_model = "none";
  CHECK(first_error(bad) == "training.reference_model");
  bad = c, bad.training.micro_batch_size = 1;  // the KL term needs another row in the micro-batch (TRL 0.12+)
  CHECK(first_error(bad) == "training.micro_batch_size");
  bad.versions.trl = "0.11";  // before 0.12: in the accumulated batch across the GPUs
  CHECK(first_error(bad) == "training.micro_batch_size");
  bad.training.gradient_accumulation_steps = 2;
  CHECK(first_error(bad).empty());
  bad = c, bad.versions.trl = "0.7";
  CHECK(first_error(bad) == "versions.trl");
  bad = c, bad.training.nll_alpha = 1;
  CHECK(first_error(bad) == "training.nll_alpha");
  bad = c, bad.training.framework = "torchtune";
  CHECK(first_error(bad) == "training.framework");
  bad = c, bad.data.lengths = "micro_batches", bad.data.micro_batch_lengths = "512", bad.data.padding = "none";
  CHECK(first_error(bad) == "data.padding");
}
