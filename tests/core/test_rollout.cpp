// GRPO (training.objective grpo; src/core/rollout.cpp and rollout_step.cpp, docs/research/grpo.md): the generation
// batch by TRL version, generate's KV cache, the colocated vLLM engine and its sleep, the reference by beta's
// default, the loss's logits over the completion, and the refusals.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "core/advice.h"
#include "core/simulate.h"
#include "core/validate.h"
#include "test_util.h"

using namespace memsim;

namespace {

// Qwen2.5 0.5B (24 layers, 2 KV heads of 64, a 151,936-token vocabulary) as TRL's GRPOTrainer trains it: 4
// completions per micro-batch, 2 micro-batches per step, prompts of 384 and completions of 128 tokens.
constexpr int64_t kLayers = 24, kKvWidth = 2 * 64, kVocab = 151936, kPrompt = 384, kCompletion = 128;
Config grpo_config(const char* trl = "latest") {
  Config c = single_gpu_config("qwen2.5-0.5b.json", 4, kPrompt + kCompletion);
  c.training.objective = "grpo";
  c.training.num_generations = 4;
  c.training.completion_length = kCompletion;
  c.training.gradient_accumulation_steps = 2;
  c.versions.trl = trl;
  return c;
}

std::vector<int64_t> allocations(const StepProgram& p, const std::string& prefix) {
  std::vector<int64_t> out;
  for (const Event& e : p.events)
    if (e.op == Event::Op::Alloc && p.labels[p.tensors[e.tensor].label].rfind(prefix, 0) == 0)
      out.push_back(p.tensors[e.tensor].bytes);
  return out;
}

bool refused(const Config& c, const std::string& field) {
  for (const auto& e : validate(c))
    if (e.field == field) return true;
  return false;
}

}  // namespace

TEST_CASE("GRPO's generate keeps a KV cache of the whole generation batch, grown to prompt + completion - 1") {
  const DeviceResult d = simulate_valid(grpo_config());
  const auto kv = allocations(d.program, "KV cache");
  REQUIRE(!kv.empty());
  // TRL >= 0.17 generates a step's micro_batch_size x gradient_accumulation_steps = 8 completions at once; the
  // prefill's keys (and values) of each layer, then the cache one token longer at a time. The last token sampled is
  // never fed back, so the cache ends at prompt + completion - 1.
  const int64_t token = 8 * kKvWidth * 2;
  CHECK(kv.front() == token * kPrompt);
  CHECK(*std::max_element(kv.begin(), kv.end()) == token * (kPrompt + kCompletion - 1));
  CHECK(std::count(kv.begin(), kv.end(), token * (kPrompt + kCompletion - 1)) == 2 * 2 * kLayers);  // two steps
  CHECK(d.peak_phase.find("generation") == std::string::npos);  // 8 x 512 tokens of a 0.5B: training dominates
}

TEST_CASE("GRPO's generation batch follows TRL: a micro-batch before 0.17, the step's micro-batches after") {
  const int64_t token = kKvWidth * 2;
  Config old = grpo_config("0.16");
  old.training.gradient_accumulation_steps = 1;  // 0.16 checks micro_batch_size x GPUs against num_generations
  CHECK(allocations(simulate_valid(old).program, "KV cache").front() == 4 * token * kPrompt);
  CHECK(allocations(simulate_valid(grpo_config("0.17")).program, "KV cache").front() == 8 * token * kPrompt);
  // With gradient checkpointing on, TRL before 0.22 generated in train mode, where transformers turns the cache off.
  Config ckpt = grpo_config("0.21");
  ckpt.training.activation_checkpointing = "full";
  CHECK(allocations(simulate_valid(ckpt).program, "KV cache").empty());
  ckpt.versions.trl = "0.22";
  CHECK(allocations(simulate_valid(ckpt).program, "KV cache").front() == 8 * token * kPrompt);
}

TEST_CASE("GRPO's loss takes logits of the completion's tokens, and the reference follows beta's default") {
  const DeviceResult latest = simulate_valid(grpo_config());
  // bf16 logits of 4 rows x (completion + 1) positions; none of the whole sequence.
  const auto logits = allocations(latest.program, "logits");
  CHECK(std::find(logits.begin(), logits.end(), int64_t{2} * 4 * (kCompletion + 1) * kVocab) != logits.end());
  CHECK(std::find(logits.begin(), logits.end(), int64_t{2} * 4 * (kPrompt + kCompletion) * kVocab) == logits.end());
  // beta defaults to 0 from TRL 0.19: no reference. 0.18 (beta 0.04) loads a frozen copy of the weights.
  CHECK(latest.model_states.other_models_bytes == 0);
  const DeviceResult old = simulate_valid(grpo_config("0.18"));
  CHECK(old.model_states.other_models_bytes == latest.model_states.weights_bytes);
  CHECK(!allocations(old.program, "scoring logits").empty());
  Config none = grpo_config("0.18");
  none.training.reference_model = "none";  // beta = 0
  CHECK(simulate_valid(none).model_states.other_models_bytes == 0);
}

TEST_CASE("A colocated vLLM engine holds gpu_memory_utilization of the GPU, asleep, training does not see it") {
  Config c = grpo_config();
  c.training.generation_engine = "vllm_colocate";
  c.training.gpu_memory_utilization = 0.25;
  const DeviceResult awake = simulate_valid(c);
  const auto engine = allocations(awake.program, "vLLM");
  REQUIRE(engine.size() == 2);  // weights and KV cache, allocated once
  CHECK(engine[0] + engine[1] == static_cast<int64_t>(0.25 * static_cast<double>(awake.capacity_bytes)));
  const int64_t generation = awake.breakdown.allocator[static_cast<int>(Component::Generation)];
  CHECK(generation - (engine[0] + engine[1]) >= 0);  // the allocator's 512-byte rounding, and one token's sampling
  CHECK(generation - (engine[0] + engine[1]) < (int64_t{1} << 20));
  CHECK(allocations(awake.program, "KV cache").empty());  // vLLM's own cache, not generate's
  c.training.vllm_sleep = true;
  const DeviceResult asleep = simulate_valid(c);
  CHECK(asleep.peak.device_bytes < awake.peak.device_bytes);
  CHECK(asleep.peak_phase.find("generation") == 0);  // awake only to generate
}

TEST_CASE("GRPO under ZeRO-3 gathers the whole model for generate") {
  Config c = grpo_config();
  c.parallel.data_parallel_size = 2;
  c.parallel.zero_stage = 3;
  c.training.framework = "hf_trainer";
  c.training.num_generations = 8;  // 4 x 2 GPUs x 2 micro-batches = 16 completions at once
  const DeviceResult d = simulate_valid(c);
  const auto gathered = allocations(d.program, "parameters gathered for generation");
  int64_t sum = 0;
  for (size_t i = 0; i < gathered.size() / 2; ++i) sum += gathered[i];  // the first step's generation
  CHECK(sum >= 2 * 490'000'000);  // bf16: about the whole 494M-parameter model at once
}

TEST_CASE("GRPO's refusals name the field") {
  Config c = grpo_config();
  c.training.num_generations = 3;
  CHECK(refused(c, "training.num_generations"));  // 4 x 1 x 2 = 8 completions
  c = grpo_config();
  c.training.completion_length = kPrompt + kCompletion;
  CHECK(refused(c, "training.completion_length"));
  c = grpo_config();
  c.model.max_position_embeddings = 256;
  CHECK(refused(c, "training.completion_length"));
  c = grpo_config("0.17");
  c.training.generation_engine = "vllm_colocate";
  CHECK(refused(c, "training.generation_engine"));
  c = grpo_config("0.22");
  c.training.generation_engine = "vllm_colocate";
  c.training.vllm_sleep = true;
  CHECK(refused(c, "training.vllm_sleep"));
  CHECK(refused(grpo_config("0.14"), "versions.trl"));
  c = grpo_config();
  c.training.gpu_memory_utilization = 1.5;
  CHECK(refused(c, "training.gpu_memory_utilization"));
  c.training.gpu_memory_utilization = 0.0;
  CHECK(refused(c, "training.gpu_memory_utilization"));
  c = grpo_config();
  c.training.reference_model = "precomputed";
  CHECK(refused(c, "training.reference_model"));
  c = grpo_config();
  c.data.lengths = "samples";
  c.data.sample_lengths = "p0=100,p100=512";
  CHECK(refused(c, "data.lengths"));
  c = grpo_config();
  c.training.framework = "torchtune";
  CHECK(refused(c, "training.framework"));
}

TEST_CASE("Liger's GRPO loss: no logits of the batch, a zeroed [vocab, hidden] weight gradient and one per completion") {
  constexpr int64_t kHidden = 896;
  const int64_t weight = int64_t{2} * kVocab * kHidden;  // the tied embedding as lm_head.weight, bf16
  Config c = grpo_config("0.26");
  c.versions.liger = "0.6.4";
  c.training.loss = "fused_linear";
  c.training.gradient_accumulation_steps = 1;
  c.training.num_generations = 4;
  const DeviceResult liger = simulate_valid(c);
  // zeros_like(weight) whatever the head's requires_grad, then each completion's own before grad_weight.add_ (the
  // first two completions are replayed; the rest reuse their blocks).
  const auto grads = allocations(liger.program, "Liger GRPO loss: lm_head weight gradient");
  CHECK(std::count(grads.begin(), grads.end(), weight) == 2 * (1 + 2));  // two steps
  // One completion's bf16 logits at a time, never the micro-batch's.
  const auto chunk = allocations(liger.program, "Liger GRPO loss: one completion");
  CHECK(std::find(chunk.begin(), chunk.end(), int64_t{2} * kCompletion * kVocab) != chunk.end());
  CHECK(allocations(liger.program, "logits / temperature").empty());
  const auto input_grad = allocations(liger.program, "Liger GRPO loss: gradient of the last hidden state");
  CHECK(std::find(input_grad.begin(), input_grad.end(), int64_t{2} * 4 * kCompletion * kHidden) != input_grad.end());
  c.training.loss = "auto";
  CHECK(simulate_valid(c).peak.allocated_bytes > liger.peak.allocated_bytes);

  // liger-kernel 0.8 streams the vocabulary but builds each completion's weight gradient in fp32 and casts it.
  c.training.loss = "fused_linear";
  c.versions.liger = "0.8.0";
  const auto streamed = allocations(simulate_valid(c).program, "Liger GRPO loss: lm_head weight gradient");
  CHECK(std::count(streamed.begin(), streamed.end(), 2 * weight) == 2 * 2);
  CHECK(std::count(streamed.begin(), streamed.end(), weight) == 2 * (1 + 2));

  // Accumulation scales the loss: Liger's backward multiplies both saved gradients into new tensors.
  c.versions.liger = "0.6.4";
  c.training.gradient_accumulation_steps = 2;
  const DeviceResult accumulated = simulate_valid(c);
  const auto scaled = allocations(accumulated.program, "Liger GRPO loss: lm_head weight gradient");
  const auto scaled_input = allocations(accumulated.program, "Liger GRPO loss: gradient of the last hidden state");
  // Per micro-batch: the concatenated input gradient and its copy; zeros_like, two completions' and the copy.
  const int64_t whole_input = int64_t{2} * 4 * kCompletion * kHidden;
  const auto micro_batches = std::count(scaled_input.begin(), scaled_input.end(), whole_input) / 2;
  CHECK(micro_batches >= 2);
  CHECK(std::count(scaled.begin(), scaled.end(), weight) == 4 * micro_batches);
}

TEST_CASE("Liger's GRPO loss: refused before TRL 0.17 and liger-kernel 0.5.4, sharded, over fp32 weights, for ppo") {
  Config c = grpo_config("0.16");
  c.training.gradient_accumulation_steps = 1;
  c.training.loss = "fused_linear";
  CHECK(refused(c, "versions.trl"));
  c = grpo_config("0.17");
  c.training.loss = "fused_linear";
  CHECK_FALSE(refused(c, "versions.trl"));
  CHECK_FALSE(refused(c, "training.loss"));
  c.versions.liger = "0.5.3";
  CHECK(refused(c, "versions.liger"));
  c.versions.liger = "latest";
  c.training.precision = "amp_bf16";
  CHECK(refused(c, "training.precision"));
  c.training.precision = "bf16_pure";
  c.parallel.data_parallel_size = 2;
  c.parallel.zero_stage = 3;
  CHECK(refused(c, "parallel.zero_stage"));
  c.parallel.zero_stage = 2;
  CHECK_FALSE(refused(c, "parallel.zero_stage"));
  c = grpo_config();
  c.training.loss = "chunked_fp32";
  CHECK(refused(c, "training.loss"));
}

TEST_CASE("What helps offers GRPO's own changes: beta = 0, a smaller or sleeping vLLM engine, separate generation GPUs, Liger") {
  Config c = grpo_config();
  c.training.reference_model = "copy";  // beta != 0
  c.training.generation_engine = "vllm_colocate";
  std::vector<std::string> ids;
  for (const Suggestion& s : suggestion_candidates(c)) ids.push_back(s.id);
  for (const char* id : {"grpo_beta_zero", "grpo_fewer_generations", "vllm_memory_lower", "vllm_sleep", "vllm_server",
                         "grpo_liger_loss"})
    CHECK(std::find(ids.begin(), ids.end(), id) != ids.end());
  CHECK(std::find(ids.begin(), ids.end(), "loss_fused_linear") == ids.end());  // the SFT one: grpo has its own
  // Liger's loss over the 4 x 128 completion rows of a 151,936-token vocabulary saves memory here.
  c.training.generation_engine = "hf_generate";
  bool offered = false;
  for (const Suggestion& s : suggest(c))
    if (s.id == "grpo_liger_loss") {
      offered = true;
      CHECK(s.saved_bytes > 0);
    }
  CHECK(offered);
}

TEST_CASE("What helps: fewer completions per prompt halve num_generations with the micro-batch, and save memory") {
  const Config c = grpo_config();  // micro-batch 4, num_generations 4
  const auto candidates = suggestion_candidates(c);
  const auto it = std::find_if(candidates.begin(), candidates.end(),
                               [](const Suggestion& s) { return s.id == "grpo_fewer_generations"; });
  REQUIRE(it != candidates.end());
  CHECK(it->config.training.num_generations == 2);
  CHECK(it->config.training.micro_batch_size == 2);
  CHECK(validate(it->config).empty());
  CHECK(simulate_valid(it->config).peak.allocated_bytes < simulate_valid(c).peak.allocated_bytes);
  // num_generations alone changes no tensor: TRL's batch of completions is the same size.
  Config fewer = c;
  fewer.training.num_generations = 2;
  CHECK(simulate_valid(fewer).peak.allocated_bytes == simulate_valid(c).peak.allocated_bytes);
  Config odd = c;
  odd.training.micro_batch_size = 3;
  odd.training.num_generations = 3;
  for (const Suggestion& s : suggestion_candidates(odd)) CHECK(s.id != "grpo_fewer_generations");
}

TEST_CASE("GRPO's reward model: frozen weights without lm_head, one forward over the whole generation batch") {
  Config c = grpo_config();
  const DeviceResult rules = simulate_valid(c);
  c.training.reward_model = "same_as_policy";
  const DeviceResult model = simulate_valid(c);
  // Qwen2.5 0.5B ties lm_head to the embeddings, so the classifier keeps every bf16 weight of the policy.
  CHECK(model.model_states.other_models_bytes == rules.model_states.weights_bytes);
  const auto scores = allocations(model.program, "scoring logits");
  CHECK(std::find(scores.begin(), scores.end(), int64_t{4} * 8 * (kPrompt + kCompletion)) != scores.end());  // 8 rows
  c.training.objective = "sft";
  CHECK(refused(c, "training.reward_model"));
}

// The phases' names that start with `prefix`, in order.
static std::vector<std::string> phases_named(const DeviceResult& d, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& p : d.program.phases)
    if (p.name.rfind(prefix, 0) == 0) out.push_back(p.name);
  return out;
}

TEST_CASE("steps_per_generation sizes the generation batch, misaligned generations fall inside a step and score the "
          "policy first") {
  const int64_t token = kKvWidth * 2;
  Config c = grpo_config();  // 4 completions per micro-batch, 2 micro-batches per step
  c.training.gradient_accumulation_steps = 4;
  CHECK(phases_named(simulate_valid(c), "generation").size() == 2);  // once before each replayed step
  CHECK(allocations(simulate_valid(c).program, "scoring logits").empty());  // latest: beta 0, aligned: nothing scores
  // 2 micro-batches per generation: 8 completions, and a generation before the step's later micro-batches too.
  c.training.steps_per_generation = 2;
  const DeviceResult every2 = simulate_valid(c);
  CHECK(allocations(every2.program, "KV cache").front() == 8 * token * kPrompt);
  CHECK(phases_named(every2, "generation") ==
        std::vector<std::string>{"generation (step 1)", "generation (step 2)", "generation (step 2, micro-batches 2-4)"});
  CHECK(allocations(every2.program, "scoring logits").empty());  // 4 % 2 == 0: aligned with the optimizer steps
  // 3 micro-batches per generation: generations start anywhere in a step, and old_per_token_logps is scored.
  c.training.steps_per_generation = 3;
  const DeviceResult every3 = simulate_valid(c);
  CHECK(allocations(every3.program, "KV cache").front() == 12 * token * kPrompt);
  CHECK(phases_named(every3, "generation").size() == 3);
  CHECK(!allocations(every3.program, "scoring logits").empty());
  // 8 micro-batches per generation: every second step, at its start (aligned), but GAS % 8 != 0 from TRL 0.20.
  c.training.steps_per_generation = 8;
  const DeviceResult every8 = simulate_valid(c);
  CHECK(allocations(every8.program, "KV cache").front() == 32 * token * kPrompt);
  CHECK(phases_named(every8, "generation").size() == 2);
  CHECK(!allocations(every8.program, "scoring logits").empty());
}

TEST_CASE("num_iterations reuses a generation: the policy's old log-probabilities by TRL version") {
  Config c = grpo_config("0.19");
  c.training.reference_model = "none";
  c.training.gradient_accumulation_steps = 4, c.training.steps_per_generation = 2;
  CHECK(allocations(simulate_valid(c).program, "scoring logits").empty());
  c.training.num_iterations = 2;  // 0.18-0.19: any num_iterations > 1 scores old_per_token_logps
  CHECK(!allocations(simulate_valid(c).program, "scoring logits").empty());
  c.versions.trl = "0.20";  // 0.20+: only where GAS % (steps_per_generation x num_iterations) != 0; 4 % 4 == 0
  CHECK(allocations(simulate_valid(c).program, "scoring logits").empty());
  c.training.num_iterations = 3;
  CHECK(!allocations(simulate_valid(c).program, "scoring logits").empty());
}

TEST_CASE("steps_per_generation and num_iterations: refused before their TRL releases and outside grpo") {
  Config c = grpo_config("0.17");
  c.training.steps_per_generation = 2;
  CHECK(refused(c, "training.steps_per_generation"));
  c = grpo_config("0.15");
  c.training.gradient_accumulation_steps = 1;
  c.training.num_iterations = 2;
  CHECK(refused(c, "training.num_iterations"));
  c = single_gpu_config("qwen2.5-0.5b.json");
  c.training.num_iterations = 2;
  CHECK(refused(c, "training.num_iterations"));
  c.training.num_iterations = 1, c.training.steps_per_generation = 4;
  CHECK(refused(c, "training.steps_per_generation"));
  // num_generations must divide the generation batch steps_per_generation makes (GRPOConfig's check).
  c = grpo_config();
  c.training.num_generations = 8, c.training.steps_per_generation = 1;
  CHECK(refused(c, "training.num_generations"));
}

TEST_CASE("What helps offers smaller generation batches inside the step where num_generations' groups stay whole") {
  Config c = grpo_config();  // 4 completions per micro-batch, num_generations 4, 2 micro-batches: 8 at once
  auto offered = [](const Config& x) {
    for (const Suggestion& s : suggestion_candidates(x))
      if (s.id == "grpo_generation_smaller") return s.config.training.steps_per_generation;
    return int64_t{-1};
  };
  CHECK(offered(c) == 1);
  c.training.num_generations = 8;  // a group needs both micro-batches
  CHECK(offered(c) == -1);
  c = grpo_config("0.17");  // before steps_per_generation
  CHECK(offered(c) == -1);
}

TEST_CASE("vLLM 0.8.0-0.9.0 caps the whole process: the policy's weights at the engine's start come out of its share") {
  Config c = grpo_config();
  c.training.generation_engine = "vllm_colocate";
  c.training.gpu_memory_utilization = 0.25;
  auto engine_total = [](const DeviceResult& d) {
    const auto engine = allocations(d.program, "vLLM");
    int64_t sum = 0;
    for (int64_t b : engine) sum += b;
    return sum;
  };
  const DeviceResult own = simulate_valid(c);
  const int64_t share = static_cast<int64_t>(0.25 * static_cast<double>(own.capacity_bytes));
  CHECK(engine_total(own) == share);  // latest: the engine's own share
  c.versions.vllm = "0.8.5";
  const DeviceResult whole = simulate_valid(c);
  CHECK(engine_total(whole) == share - whole.model_states.weights_bytes);  // the Trainer placed the policy first
  c.training.reference_model = "copy";  // create_reference_model's deepcopy of the placed policy, before the engine
  CHECK(engine_total(simulate_valid(c)) == share - 2 * whole.model_states.weights_bytes);
  c.training.reference_model = "auto";
  c.versions.vllm = "0.9.1";
  CHECK(engine_total(simulate_valid(c)) == share);
  c.versions.vllm = "0.7.3";  // V0's worker measured from a baseline: the engine alone
  CHECK(engine_total(simulate_valid(c)) == share);
  // Under ZeRO-3 the policy is prepared after the engine starts: nothing of it counts yet.
  c.versions.vllm = "0.8.5";
  c.parallel.data_parallel_size = 2, c.parallel.zero_stage = 3, c.parallel.sharding = "deepspeed";
  c.training.num_generations = 2;
  CHECK(engine_total(simulate_valid(c)) == static_cast<int64_t>(0.25 * static_cast<double>(own.capacity_bytes)));
  // A share the trainer's weights leave too small for the engine's: vLLM would not start, and the result says so.
  Config small = grpo_config();
  small.training.generation_engine = "vllm_colocate";
  small.training.gpu_memory_utilization = 0.02;
  small.versions.vllm = "0.8.5";
  const Result r = simulate(small);
  REQUIRE(r.ok);
  bool said = false;
  for (const auto& n : r.notes) said = said || n.find("vLLM would refuse to start") != std::string::npos;
  CHECK(said);
}

namespace {

Config server_config(const char* trl = "latest") {
  Config c = grpo_config(trl);
  c.training.generation_engine = "vllm_server";
  return c;
}

int64_t sum_of(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t b : v) s += b;
  return s;
}

bool noted(const Result& r, const std::string& words) {
  for (const auto& n : r.notes)
    if (n.find(words) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("vllm_server: the server's GPUs are a device of their own, its 16-bit weights and a KV cache filling its share") {
  Config c = server_config();
  const Result r = simulate(c);
  REQUIRE(r.ok);
  REQUIRE(r.devices.size() == 2);
  const DeviceResult& train = r.devices[0];
  const DeviceResult& server = r.devices[1];
  CHECK(!train.fixed_share);
  CHECK(server.fixed_share);
  CHECK(server.role.find("trl vllm-serve, tensor parallel 1") != std::string::npos);
  CHECK(server.device_count == 1);
  CHECK(server.verdict == Verdict::Fits);
  // Qwen2.5 0.5B's tied vocabulary (151,936 = 64 x 2,374) needs no padding: the weights are the model's, in 16 bits.
  const int64_t weights = sum_of(allocations(server.program, "vLLM engine weights"));
  CHECK(weights == 2 * r.params_total);
  CHECK(server.model_states.weights_bytes == weights);
  // The KV cache: whole blocks of 16 tokens of every layer's 2 KV heads of 64, keys and values in 16 bits, filling
  // total x 0.9 less the weights to within one block of every layer.
  const int64_t page = 16 * 2 * kKvWidth * 2;
  const auto kv = allocations(server.program, "vLLM KV cache");
  REQUIRE(kv.size() == static_cast<size_t>(kLayers));
  CHECK(kv.front() % page == 0);
  const int64_t share = static_cast<int64_t>(static_cast<double>(server.capacity_bytes) * 0.9);
  CHECK(weights + sum_of(kv) <= share);
  CHECK(share - weights - sum_of(kv) < page * kLayers);
  // The band of a claimed share is the share itself; the training GPUs keep theirs.
  CHECK(server.band.of(BandStatistic::Device).low_bytes == server.peak.device_bytes);
  CHECK(server.band.of(BandStatistic::Device).high_bytes == server.peak.device_bytes);
  CHECK(server.usable_bytes == server.capacity_bytes);
}

TEST_CASE("vllm_server: tensor parallel splits the weights and the KV heads, data parallel adds engines") {
  Config c = server_config();
  const DeviceResult one = simulate(c).devices[1];
  c.training.vllm_server_tensor_parallel_size = 2;
  c.training.vllm_server_data_parallel_size = 3;
  const Result r = simulate(c);
  REQUIRE(r.ok);
  const DeviceResult& two = r.devices[1];
  CHECK(two.device_count == 6);
  CHECK(two.role.find("tensor parallel 2 x data parallel 3") != std::string::npos);
  const int64_t w1 = sum_of(allocations(one.program, "vLLM engine weights")),
                w2 = sum_of(allocations(two.program, "vLLM engine weights"));
  const int64_t norms = 2 * (kLayers * 2 * 896 + 896);  // two RMSNorm scales a layer and the final one, whole on each GPU
  CHECK(w2 == (w1 - norms) / 2 + norms);
  // One KV head of 64 per GPU: pages of 16 x 1 x 64 x 2 x 2 = 4 KiB, as many as the share less the weights holds.
  const int64_t page = 16 * 1 * 64 * 2 * 2;
  const int64_t share = static_cast<int64_t>(static_cast<double>(two.capacity_bytes) * 0.9);
  CHECK(allocations(two.program, "vLLM KV cache").front() == (share - w2) / page / kLayers * page);
}

TEST_CASE("vllm_server: vLLM refuses to start where one max_model_len request's KV cache or its share does not fit") {
  Config c = server_config();
  const DeviceResult fits = simulate(c).devices[1];
  const int64_t weights = sum_of(allocations(fits.program, "vLLM engine weights"));
  // A share that leaves the KV cache 100 MiB: 32,768 positions need 24 layers x 2,048 blocks of 8 KiB = 384 MiB.
  c.training.vllm_server_gpu_memory_utilization =
      static_cast<double>(weights + (int64_t{100} << 20)) / static_cast<double>(fits.capacity_bytes);
  Result r = simulate(c);
  REQUIRE(r.ok);
  CHECK(r.devices[1].verdict == Verdict::DoesNotFit);
  CHECK(noted(r, "one request of max_model_len 32768 tokens"));
  CHECK(r.devices[1].refusal == "vLLM would not start: its KV cache cannot hold one 32,768-token request (max_model_len)");
  CHECK(r.devices[0].refusal.empty());
  // What helps names the server's own fix, and it makes the setup fit.
  bool offered_len = false;
  for (const Suggestion& s : suggest(c))
    if (s.id == "vllm_max_model_len") offered_len = s.fits;
  CHECK(offered_len);
  c.training.vllm_max_model_len = kPrompt + kCompletion;  // TRL's longest request
  CHECK(simulate(c).devices[1].verdict == Verdict::Fits);
  // A share below the weights: no memory for the cache blocks.
  c.training.vllm_server_gpu_memory_utilization = static_cast<double>(weights / 2) / static_cast<double>(fits.capacity_bytes);
  r = simulate(c);
  CHECK(r.devices[1].verdict == Verdict::DoesNotFit);
  CHECK(noted(r, "No available memory for the cache blocks"));
  CHECK(r.devices[1].refusal.find("no KV cache") != std::string::npos);
  // The whole GPU: more than its free memory once the CUDA context is there (vLLM 0.9.1+ checks at start).
  c = server_config();
  c.training.vllm_server_gpu_memory_utilization = 1.0;
  r = simulate(c);
  CHECK(r.devices[1].verdict == Verdict::DoesNotFit);
  CHECK(noted(r, "more than the GPU's free memory"));
  // Up to 0.9.0 no such check: total x util less the process's peak, the CUDA context included (0.8.x), goes to the
  // KV cache.
  c.versions.vllm = "0.8.5";
  r = simulate(c);
  CHECK(!noted(r, "free memory"));
  CHECK(r.devices[1].peak.requested_bytes + r.devices[1].breakdown.cuda_context_bytes <= r.devices[1].capacity_bytes);
  c.versions.vllm = "0.7.3";  // V0's baseline is taken after the context: the share is the engine's own
  const DeviceResult v0 = simulate(c).devices[1];
  CHECK(v0.peak.requested_bytes + v0.breakdown.cuda_context_bytes > v0.capacity_bytes);
}

TEST_CASE("vllm_server: What helps pairs the server's fix with the training GPUs' own where both fail") {
  Config c = server_config();
  const Result fits = simulate(c);
  const int64_t weights = sum_of(allocations(fits.devices[1].program, "vLLM engine weights"));
  // The training GPU does not fit either: its memory cut to its peak, which the headroom then exceeds. The server's
  // share of that GPU leaves its KV cache 100 MiB, short of one 32,768-token request.
  c.hardware.gpu = "custom";
  c.hardware.gpu_memory_bytes = fits.devices[0].peak.device_bytes;
  c.training.vllm_server_gpu_memory_utilization =
      static_cast<double>(weights + (int64_t{100} << 20)) / static_cast<double>(c.hardware.gpu_memory_bytes);
  const Result both = simulate(c);
  REQUIRE(both.ok);
  REQUIRE(both.devices[0].verdict != Verdict::Fits);
  REQUIRE(!both.devices[1].refusal.empty());
  bool server_fix = false, training_fix = false, pair_fits = false;
  for (const Suggestion& s : suggest(c)) {
    server_fix = server_fix || (s.id == "vllm_max_model_len" && s.unblocks);
    training_fix = training_fix || (s.id.find('+') == std::string::npos && s.saved_bytes > 0 && !s.unblocks);
    pair_fits = pair_fits || (s.id.find("vllm_max_model_len") != std::string::npos && s.id.find('+') != std::string::npos && s.fits);
  }
  CHECK(server_fix);
  CHECK(training_fix);
  CHECK(pair_fits);
}

TEST_CASE("vllm_server's refusals name the field") {
  Config c = server_config();
  c.training.vllm_server_tensor_parallel_size = 4;  // 14 heads
  CHECK(refused(c, "training.vllm_server_tensor_parallel_size"));
  c = server_config("0.15");
  c.training.vllm_server_tensor_parallel_size = 2;  // one vllm_device
  CHECK(refused(c, "training.vllm_server_tensor_parallel_size"));
  c = server_config("0.16");
  c.training.vllm_server_data_parallel_size = 2;
  CHECK(refused(c, "training.vllm_server_data_parallel_size"));
  c = server_config();
  c.training.vllm_max_model_len = kPrompt;  // shorter than a prompt and its completion
  CHECK(refused(c, "training.vllm_max_model_len"));
  c.training.vllm_max_model_len = 65536;  // beyond 32,768 positions
  CHECK(refused(c, "training.vllm_max_model_len"));
  for (double util : {0.0, 1.5}) {
    c = server_config();
    c.training.vllm_server_gpu_memory_utilization = util;
    CHECK(refused(c, "training.vllm_server_gpu_memory_utilization"));
  }
  CHECK(!refused(server_config("0.15"), "training.vllm_server_tensor_parallel_size"));
  CHECK(simulate(server_config("0.15")).devices[1].role.find("vllm_device") != std::string::npos);
}

TEST_CASE("vllm_colocate: from TRL 0.26 vLLM takes the model's positions as max_model_len, and a share too small for one "
          "such request keeps it from starting: the training GPUs do not fit") {
  Config c = grpo_config("0.25");
  c.training.generation_engine = "vllm_colocate";
  const int64_t capacity = simulate_valid(c).capacity_bytes;
  // Qwen2.5 0.5B: 988 MB of weights; 32,768 positions need 24 layers x 2,048 blocks x 6 KiB = 288 MiB of KV cache.
  // A share that leaves the KV cache 100 MiB holds TRL 0.25's request of a prompt and completion (512 tokens) only.
  const int64_t weights = 2 * simulate(c).params_total;
  c.training.gpu_memory_utilization = static_cast<double>(weights + (int64_t{100} << 20)) / static_cast<double>(capacity);
  Result r = simulate(c);
  REQUIRE(r.ok);
  CHECK(r.devices[0].refusal.empty());
  c.versions.trl = "0.26";
  r = simulate(c);
  REQUIRE(r.ok);
  CHECK(r.devices[0].verdict == Verdict::DoesNotFit);
  CHECK(r.devices[0].refusal == "vLLM would not start: its KV cache cannot hold one 32,768-token request (max_model_len)");
  CHECK(noted(r, "passes vllm_max_model_length None"));
  // What helps offers TRL's vllm_max_model_length of a prompt and completion, and that fits again.
  bool offered_len = false;
  for (const Suggestion& s : suggest(c))
    if (s.id == "vllm_max_model_len") offered_len = s.fits;
  CHECK(offered_len);
  c.training.vllm_max_model_len = kPrompt + kCompletion;
  CHECK(simulate(c).devices[0].refusal.empty());
  // Before TRL 0.26 a colocated engine has no max_model_len of its own to set.
  c.versions.trl = "0.25";
  CHECK(refused(c, "training.vllm_max_model_len"));
  // A share below the weights: no memory for the cache blocks, in every version.
  c = grpo_config();
  c.training.generation_engine = "vllm_colocate";
  c.training.gpu_memory_utilization = static_cast<double>(weights / 2) / static_cast<double>(capacity);
  r = simulate(c);
  CHECK(r.devices[0].verdict == Verdict::DoesNotFit);
  CHECK(r.devices[0].refusal.find("no KV cache") != std::string::npos);
  CHECK(noted(r, "does not hold its bf16 weights"));
}

TEST_CASE("generate's KV cache under latent attention holds every head's keys and values, not the latent") {
  // transformers' DeepseekV3Attention caches key_states = cat(k_nope, k_rope) and value_states per head
  // (past_key_values.update after kv_b_proj), so a token costs heads x (qk_nope + qk_rope) for its keys and
  // heads x v_head_dim for its values in each layer.
  Config c = grpo_config();
  c.model.kv_lora_rank = 512;
  c.model.qk_nope_head_dim = 64;
  c.model.qk_rope_head_dim = 32;
  c.model.v_head_dim = 64;
  c.model.num_key_value_heads = c.model.num_attention_heads;
  INFO(validate(c).empty());
  const DeviceResult d = simulate_valid(c);
  const std::vector<int64_t> kv = allocations(d.program, "KV cache (model.generate");
  REQUIRE(kv.size() >= 2);
  const int64_t heads = c.model.num_attention_heads, rows = 8;  // a generation: 4 completions x 2 micro-batches
  CHECK(kv[0] == rows * kPrompt * heads * (64 + 32) * 2);
  CHECK(kv[1] == rows * kPrompt * heads * 64 * 2);
}
