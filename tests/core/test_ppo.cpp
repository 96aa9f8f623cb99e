// PPO (training.objective ppo; src/core/rollout.cpp resolve_ppo and ppo_step.cpp, docs/research/ppo.md): the
// generation's kept fp32 scores, the value model as a second trunk trained beside the policy, and the refusals.
#include <catch2/catch.hpp>

#include <string>

#include "core/simulate.h"
#include "core/validate.h"
#include "test_util.h"

using namespace memsim;

namespace {

// Qwen2.5 0.5B (24 layers, a 151,936-token vocabulary) as TRL's PPOTrainer trains it: one query per micro-batch, 2
// micro-batches per update, prompts of 384 and responses of 128 tokens, with a reward model of its shape.
constexpr int64_t kVocab = 151936, kPrompt = 384, kResponse = 128;
Config ppo_config() {
  Config c = single_gpu_config("qwen2.5-0.5b.json", 1, kPrompt + kResponse);
  c.training.objective = "ppo";
  c.training.reward_model = "same_as_policy";
  c.training.completion_length = kResponse;
  c.training.gradient_accumulation_steps = 2;
  return c;
}

bool refused(const Config& c, const std::string& field) {
  for (const auto& e : validate(c))
    if (e.field == field) return true;
  return false;
}

// Bytes of the live tensors of `c` whose label starts with `prefix` and that belong to a layer (or to anything, with
// `layers_only` false), just before the first phase named `phase...`.
int64_t live_layer_bytes(const StepProgram& p, const std::string& phase, const std::string& prefix, Component c,
                         bool layers_only = true) {
  uint32_t end = static_cast<uint32_t>(p.events.size());
  for (const auto& ph : p.phases)
    if (ph.name.rfind(phase, 0) == 0) {
      end = ph.first_event;
      break;
    }
  int64_t live = 0;
  for (uint32_t i = 0; i < end; ++i) {
    const Event& e = p.events[i];
    const Tensor& t = p.tensors[e.tensor];
    if (e.component != c || (layers_only && t.layer < 0) || p.labels[t.label].rfind(prefix, 0) != 0) continue;
    live += (e.op == Event::Op::Alloc ? 1 : -1) * t.bytes;
  }
  return live;
}

}  // namespace

TEST_CASE("PPO keeps the generation's fp32 scores (logitss) through the update") {
  const DeviceResult d = simulate_valid(ppo_config());
  // batch_generation pads the stacked scores of each chunk of local_rollout_forward_batch_size (64) queries into one
  // fp32 tensor: 2 queries (micro_batch_size x gradient_accumulation_steps), 128 tokens, the whole vocabulary.
  const int64_t logitss = int64_t{4} * 2 * kResponse * kVocab;
  CHECK(live(d.program, "backward (step 2", "logitss") == logitss);
  // While generate runs, every token's scores are kept (output_scores), then stacked beside them.
  CHECK(live(d.program, "scoring (step 1", "generation scores", true) >= 2 * logitss);
}

TEST_CASE("PPO's value model is a second, unchecked trunk trained in full beside the policy") {
  Config c = ppo_config();
  c.training.activation_checkpointing = "full";  // the policy's; the value model is never checkpointed
  c.peft.method = "lora";
  c.peft.target_modules = "q_proj,v_proj";
  const DeviceResult d = simulate_valid(c);
  // What the value model's forward keeps per layer for its backward, live when the policy's backward starts, is what
  // an SFT step of the same model in full, without checkpointing, keeps: the same trunk.
  Config sft = single_gpu_config("qwen2.5-0.5b.json", 1, kPrompt + kResponse);
  const DeviceResult s = simulate_valid(sft);
  const int64_t critic = live_layer_bytes(d.program, "backward (step 2", "value model: ", Component::Activations);
  CHECK(critic == live_layer_bytes(s.program, "backward (step 2", "", Component::Activations));
  // Its weights and gradients are whole (the policy's gradients are LoRA's): before step 1's optimizer step, the
  // value model's bf16 gradients are as large as its bf16 weights, which hold its embeddings and every layer (the
  // 0.5B's 494M parameters less its tied head: the embeddings are counted once).
  const int64_t weights = live_layer_bytes(d.program, "optimizer step 1", "value model: ", Component::Weights, false);
  const int64_t grads = live_layer_bytes(d.program, "optimizer step 1", "value model: ", Component::Gradients, false);
  CHECK(weights > 2 * int64_t{400'000'000});
  CHECK(grads == weights);
  const int64_t states = live_layer_bytes(d.program, "zero_grad 1", "value model: ", Component::OptimizerStates, false);
  CHECK(states == 2 * weights);  // AdamW's two bf16 states under pure bf16
  // value_model peft: ms-swift's LoRA on it too, so its optimizer states are the adapters' only.
  Config peft = c;
  peft.training.value_model = "peft";
  const DeviceResult p = simulate_valid(peft);
  CHECK(live_layer_bytes(p.program, "zero_grad 1", "value model: ", Component::OptimizerStates, false) < states / 100);
  CHECK(p.peak.allocated_bytes < d.peak.allocated_bytes);
}

TEST_CASE("PPO's phases name the value model, and the peak names its phase") {
  const DeviceResult d = simulate_valid(ppo_config());
  bool forward = false, backward = false, generation = false, scoring = false;
  for (const auto& ph : d.program.phases) {
    forward |= ph.name.rfind("value model: forward (step 2", 0) == 0;
    backward |= ph.name.rfind("value model: backward (step 2", 0) == 0;
    generation |= ph.name == "generation (step 2)";
    scoring |= ph.name == "scoring (step 2)";
  }
  CHECK(forward);
  CHECK(backward);
  CHECK(generation);
  CHECK(scoring);
  CHECK(!d.peak_phase.empty());
}

TEST_CASE("PPO refuses what TRL's PPOTrainer does not do, naming the field") {
  Config c = ppo_config();
  REQUIRE(validate(c).empty());
  Config r = c;
  r.training.reward_model = "none";
  CHECK(refused(r, "training.reward_model"));
  r = c;
  r.training.generation_engine = "vllm_colocate";
  CHECK(refused(r, "training.generation_engine"));
  r = c;
  r.training.reference_model = "none";
  CHECK(refused(r, "training.reference_model"));
  r.training.reference_model = "precomputed";
  CHECK(refused(r, "training.reference_model"));
  r = c;
  r.versions.trl = "0.11";
  CHECK(refused(r, "versions.trl"));
  r = c;
  r.training.value_model = "peft";  // no PEFT method to put on it
  CHECK(refused(r, "training.value_model"));
  r = c;
  r.training.completion_length = r.training.sequence_length;
  CHECK(refused(r, "training.completion_length"));
  r = c;
  r.training.zero_grad_at = "before_backward";  // PPOTrainer zeroes after the step
  CHECK(refused(r, "training.zero_grad_at"));
  r = c;
  r.training.precision = "fp16_autocast";  // a full value model's fp16 gradients: the GradScaler refuses them
  r.peft.method = "lora";
  CHECK(refused(r, "training.value_model"));
  r.training.value_model = "peft";
  CHECK(validate(r).empty());
  r.peft.adapter_dtype = "fp16";
  CHECK(refused(r, "peft.adapter_dtype"));
  Config sft = single_gpu_config("qwen2.5-0.5b.json", 1, 512);
  sft.training.value_model = "peft";
  CHECK(refused(sft, "training.value_model"));
  sft = single_gpu_config("qwen2.5-0.5b.json", 1, 512);
  sft.training.use_cache = false;  // only PPO's reference reads it
  CHECK(refused(sft, "training.use_cache"));
}

TEST_CASE("PPO under ZeRO-3 gathers the value model with the policy for generation, and shares one engine's buckets") {
  Config c = ppo_config();
  c.parallel.data_parallel_size = 4;
  c.parallel.zero_stage = 3;
  const DeviceResult d = simulate_valid(c);
  // unwrap_model_for_generation gathers every parameter of the policy-and-value wrapper: the policy (494M, its
  // embedding tied to its head) and the value model's trunk (the same 494M) in bf16, alive until pad() has run.
  const int64_t gathered = live(d.program, "scoring (step 1", "parameters gathered", true);
  CHECK(gathered >= 2 * 2 * int64_t{490'000'000});
  // One accelerator.prepare of the wrapper: one DeepSpeed engine, whose reduce bucket is the policy builder's.
  int64_t buckets = 0, value_buckets = 0;
  for (const Tensor& t : d.program.tensors) {
    const std::string& label = d.program.labels[t.label];
    if (label.find("reduce bucket") == std::string::npos) continue;
    ++buckets;
    value_buckets += label.rfind("value model: ", 0) == 0;
  }
  CHECK(buckets == 1);
  CHECK(value_buckets == 0);
}

TEST_CASE("PPO generates 64 queries at a time: a batch of 65 replays a full chunk and the one left over") {
  auto generation_peak = [](int64_t rows) {
    Config c = ppo_config();
    c.training.micro_batch_size = rows;
    c.training.gradient_accumulation_steps = 1;
    c.training.sequence_length = 256 + 64;
    c.training.completion_length = 64;
    const DeviceResult d = simulate_valid(c);
    return live(d.program, "scoring (step 2", "", true);
  };
  CHECK(generation_peak(65) > generation_peak(64));
  CHECK(generation_peak(129) > generation_peak(128));
}

TEST_CASE("PPO runs without dropout: LoRA's dropout keeps no mask or copy of its own") {
  // PPOTrainer calls disable_dropout_in_model on the policy after PEFT (and on the other models): every nn.Dropout
  // gets p 0, and dropout at p 0 returns its input (ATen Dropout.cpp _dropout_impl), so lora_dropout changes nothing.
  Config c = ppo_config();
  c.peft.method = "lora";
  c.peft.target_modules = "all-linear";
  c.peft.lora_dropout = 0.05;
  Config none = c;
  none.peft.lora_dropout = 0;
  CHECK(simulate_valid(c).peak.allocated_bytes == simulate_valid(none).peak.allocated_bytes);
}

TEST_CASE("PPO's reference scores with a KV cache where config.use_cache is on (TRL's forward() passes none)") {
  // forward() calls the reference with output_hidden_states and no use_cache: the config's True builds a
  // DynamicCache, every layer's keys and values [rows, kv heads, tokens, head dim] in bf16, held by ref_output until
  // its log-probabilities are taken. get_reward() passes use_cache=False, so the value and reward models keep none.
  auto most_cache = [](const StepProgram& p) {
    int64_t live = 0, most = 0;
    for (const Event& e : p.events) {
      const Tensor& t = p.tensors[e.tensor];
      if (p.labels[t.label].rfind("reference's KV cache", 0) != 0) continue;
      live += (e.op == Event::Op::Alloc ? 1 : -1) * t.bytes;
      most = std::max(most, live);
    }
    CHECK(live == 0);
    return most;
  };
  Config c = ppo_config();
  const DeviceResult d = simulate_valid(c);
  // Qwen2.5-0.5B: 24 layers, 2 key/value heads of 64; both queries of the update score in one chunk.
  CHECK(most_cache(d.program) == int64_t{2} * 24 * 2 * (kPrompt + kResponse) * (2 * 64) * 2);
  c.training.use_cache = false;  // ms-swift sets config.use_cache False on every model
  CHECK(most_cache(simulate_valid(c).program) == 0);
  // Under LoRA the reference is the policy with its adapters off, in train mode: gradient checkpointing turns the
  // cache off there, and only there.
  c.training.use_cache = true;
  c.peft.method = "lora";
  c.training.activation_checkpointing = "full";
  CHECK(most_cache(simulate_valid(c).program) == 0);
  c.training.activation_checkpointing = "none";
  CHECK(most_cache(simulate_valid(c).program) > 0);
}

TEST_CASE("PPO's training forward keeps its hidden states, and its KV cache without checkpointing, to the next micro-batch") {
  // forward() passes output_hidden_states=True: the embeddings' output and each layer's stay with `output` through
  // the backward and the optimizer step, until the next micro-batch's forward rebinds it (the policy's only: the
  // value model's backbone output is local to PolicyAndValueWrapper.forward). Under the HF Trainer without
  // DeepSpeed, accelerate converts them to fp32 copies; under DeepSpeed the 16-bit tensors themselves stay.
  const int64_t tokens = kPrompt + kResponse;
  Config c = ppo_config();
  const DeviceResult d = simulate_valid(c);
  CHECK(live_layer_bytes(d.program, "optimizer step 1", "hidden states in output", Component::Activations, false) ==
        25 * int64_t{4} * tokens * 896);
  // Without checkpointing, use_cache builds the policy's cache: each layer's rotated keys and values ([512, 2 x 64]
  // in bf16) stay too.
  c.training.activation_checkpointing = "none";
  const int64_t with_cache = live_layer_bytes(simulate_valid(c).program, "optimizer step 1", "", Component::Activations);
  c.training.use_cache = false;
  const int64_t without = live_layer_bytes(simulate_valid(c).program, "optimizer step 1", "", Component::Activations);
  CHECK(with_cache - without == 24 * 2 * int64_t{2} * tokens * 128);
}
