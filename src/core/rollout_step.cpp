// GRPO's step (training.objective grpo; rollout.h resolves the flow): the completions are generated (the policy's
// model.generate with its KV cache, or a colocated vLLM engine that wakes for it), scored by no-grad forwards (the
// reference's log-probabilities, and the policy's own for vLLM's importance-sampling correction), then trained on a
// micro-batch at a time with logits over the completion's tokens only. Sources: docs/research/grpo.md.
#include <algorithm>

#include "checked.h"
#include "step_builder.h"
#include "vllm_server.h"

namespace memsim {

namespace {
// Decoding replays at most this many KV-cache growths per layer and generation: past it, each replayed token stands
// for several (the cache grows by their sum), so a long completion stays a bounded number of events.
constexpr int64_t kMaxDecodeSteps = 256;
// Without a KV cache every token re-runs the whole sequence; the replay runs this many of those forwards, at evenly
// spaced lengths up to the last.
constexpr int64_t kNoCacheForwards = 4;
}  // namespace

void StepBuilder::rollout_labels() {
  if (rollout_labels_.kv != UINT32_MAX) return;
  auto& p = program_;
  rollout_labels_.kv = p.label("KV cache (model.generate, keys and values of every layer)");
  rollout_labels_.kv_rep = p.label("keys/values repeated for GQA (generate's SDPA, one layer)");
  rollout_labels_.gathered = p.label("parameters gathered for generation or the weight sync");
  rollout_labels_.logits = p.label("generation logits");
  rollout_labels_.sampling = p.label("sampling: fp32 scores, probabilities and sort (one token)");
  rollout_labels_.engine_weights = p.label("vLLM engine weights");
  rollout_labels_.engine_kv = p.label("vLLM KV cache (gpu_memory_utilization less the engine's weights)");
  rollout_labels_.score_logits = p.label("scoring logits (no grad, completion tokens)");
  rollout_labels_.scaled = p.label("logits / temperature (a new tensor)");
  rollout_labels_.logps = p.label("per-token log-probabilities: log-softmax of a row");
  rollout_labels_.entropy = p.label("entropy of the logits (no grad, one chunk)");
  rollout_labels_.ids = p.label("prompt and completion ids");
  rollout_labels_.reward_weights = p.label("reward model weights (frozen)");
}

// vLLM loads the checkpoint in its config's dtype (dtype "auto": bf16 for today's checkpoints), the whole base
// whatever PEFT or quantization the policy trains with: TRL syncs merged full weights into it. A colocated engine is
// one GPU's (vllm_tensor_parallel_size 1), sharded as a server's would be at tensor parallel 1 (vllm_server.h).
EngineBytes engine_bytes(const StepContext& ctx) {
  const auto& t = ctx.config.training;
  if (!t.rollout() || t.engine() != GenerationEngine::VllmColocate) return {};
  EngineBytes e;
  const int64_t capacity = ctx.config.hardware.gpu_memory_bytes > 0 ? ctx.config.hardware.gpu_memory_bytes : ctx.gpu->memory_bytes;
  e.active = true;
  e.total = static_cast<int64_t>(static_cast<double>(capacity) * t.gpu_memory_utilization);
  e.weights = vllm_weight_bytes(ctx.config.model, 1);
  // vLLM 0.8.0-0.9.0 caps the whole process: GRPOTrainer starts the engine after Trainer.__init__, which has moved the
  // policy to the GPU unless DeepSpeed or FSDP prepares it later (trainer.py place_model_on_device; grpo_trainer.py
  // LLM(...) at T:647 of v0.18, after super().__init__ at T:541). A reference copy is create_reference_model's
  // deepcopy of that policy (T:565), on the GPU too; under ZeRO-3 or FSDP it is loaded on the CPU (T:558).
  if (const Resolved rs = resolve(ctx.config); rs.rollout.engine_budget_whole_process) {
    const ShardPlan sp = shard_plan(ctx);
    const bool prepared_later = (sp.sharding == Sharding::DeepSpeed && ctx.config.parallel.zero_stage > 0) || sp.fsdp;
    if (!prepared_later) {
      const int64_t policy = frozen_model_bytes(ctx, false, false);
      const bool copy = rs.preference.reference == ReferenceModel::Copy;
      e.trainer_at_start = copy ? mul(2, policy) : policy;
    }
    e.total = std::max<int64_t>(0, e.total - e.trainer_at_start);
  }
  return e;
}

// The colocated engine's memory (vllm_colocate): vLLM >= 0.9.1 requests total_memory x gpu_memory_utilization for
// itself (v1/worker/gpu_worker.py:135-137 at v0.9.1) and gives the KV cache what its weights leave
// (requested_memory - non_kv_cache_memory, :218). Under sleep mode both live in CuMemAllocator's pool; TRL puts the
// engine to sleep as soon as it exists (vllm_generation.py:354-370), so the policy's load finds the GPU free.
void StepBuilder::alloc_engine() {
  const RolloutFlow& r = resolved_.rollout;
  if (const int64_t reward = reward_model_bytes(ctx_); reward > 0) {
    rollout_labels();
    program_.alloc(Component::OtherModels, reward, rollout_labels_.reward_weights);
  }
  if (!r.active || r.engine != GenerationEngine::VllmColocate) return;
  rollout_labels();
  engine_ = engine_bytes(ctx_);
  engine_wake(true);
  if (r.engine_sleeps) engine_sleep();
}

// The reward model: the policy's architecture as AutoModelForSequenceClassification (num_labels 1: its score head is
// hidden x 1, no lm_head), loaded with the policy's model_init_kwargs; prepare_deepspeed shards it under ZeRO-3 from
// TRL 0.17 (T:681-686), accelerate's prepare_model(evaluation_mode=True) keeps it whole otherwise (T:353-355).
int64_t reward_model_bytes(const StepContext& ctx) {
  if (!ctx.config.training.rollout() || !ctx.config.training.reward_model_on()) return 0;
  return frozen_model_bytes(ctx, resolve(ctx.config).rollout.reward_sharded, true);
}

void StepBuilder::engine_wake(bool kv) {
  const Stream s = resolved_.rollout.engine_sleeps ? Stream::Engine : Stream::Compute;
  if (engine_weights_ == UINT32_MAX)
    engine_weights_ = program_.alloc(Component::Generation, engine_.weights, rollout_labels_.engine_weights, -1, s);
  if (kv && engine_kv_ == UINT32_MAX && engine_.total > engine_.weights)  // else vLLM refuses to start (simulate.cpp)
    engine_kv_ = program_.alloc(Component::Generation, engine_.total - engine_.weights, rollout_labels_.engine_kv, -1, s);
}

// sleep(level=1 or 2): the pool's pages are unmapped (weights offloaded or discarded, the KV cache discarded) and
// the sleep ends in gc.collect() and torch.cuda.empty_cache() (cumem.py sleep). The device gets the memory back;
// torch's own counters keep the pool's blocks (vLLM issue #17117), which memsim does not follow.
void StepBuilder::engine_sleep() {
  if (engine_kv_ != UINT32_MAX) drop(engine_kv_), engine_kv_ = UINT32_MAX;
  if (engine_weights_ != UINT32_MAX) drop(engine_weights_), engine_weights_ = UINT32_MAX;
  program_.empty_cache();
}

// _move_model_to_vllm / sync_weights, once per optimizer step (when global_step has changed): under ZeRO-3 a PEFT
// policy is gathered whole to merge its adapters (gather_if_zero3(list(model.parameters()))), and before TRL 0.16 any
// policy (the state_dict was taken inside unwrap_model_for_generation); otherwise a parameter at a time, FSDP a unit
// at a time (memsim gathers a layer at a time: the largest unit).
void StepBuilder::weight_sync(int iter) {
  if (!shard_weights_ || shard_ranks_ <= 1 || iter == synced_iter_) return;
  synced_iter_ = iter;
  std::vector<uint32_t> gathered;
  const bool whole = resolved_.rollout.sync_gathers_whole;
  for (int64_t l = -1; l <= shape_.num_layers; ++l) {
    gathered.push_back(tmp(gathered_bytes(l), rollout_labels_.gathered, static_cast<int32_t>(l)));
    if (!whole) drop(gathered.back()), gathered.pop_back();
  }
  for (uint32_t g : gathered) drop(g);
}

// Generation and scoring before a step's micro-batches (before each micro-batch in TRL 0.15-0.16).
void StepBuilder::rollout(const std::string& when, int iter) {
  if (ppo()) return ppo_rollout(when);
  const RolloutFlow& r = resolved_.rollout;
  rollout_labels();
  program_.phase("generation (" + when + ")");
  const ActDims training = dims_;
  const int64_t rows = r.generation_rows;
  const int64_t P = r.prompt_tokens, C = r.completion_tokens;
  uint32_t ids = tmp(mul(8, rows, P + C), rollout_labels_.ids, -1);
  switch (r.engine) {
    case GenerationEngine::HfGenerate: hf_generate(rows); break;
    case GenerationEngine::VllmColocate:
      // TRL 0.25+: empty_cache, wake the weights, sync them, wake the KV cache, generate, sleep (level 2); 0.23-0.24
      // woke both before the sync (T:1144-1147 at v0.23) and slept at level 1.
      if (r.engine_sleeps) program_.empty_cache(), engine_wake(r.engine_wakes_whole);
      weight_sync(iter);
      if (r.engine_sleeps) engine_wake(true), engine_sleep();
      break;
    case GenerationEngine::VllmServer:
    case GenerationEngine::Unknown: weight_sync(iter); break;
  }
  const bool scores = r.policy_logps_pass || (!r.reference_after_policy && reference_runs()) || cfg_.training.reward_model_on();
  if (scores) program_.phase("scoring (" + when + ")");
  const int64_t mbs = cfg_.training.micro_batch_size;
  const int64_t chunks = std::min<int64_t>(rows / std::max<int64_t>(1, mbs), 2);  // the second stands for the rest
  if (r.policy_logps_pass)  // the policy's own layers, all-gathered where they are sharded
    for (int64_t k = 0; k < chunks; ++k) score_pass(mbs, unshards_units());
  if (!r.reference_after_policy && reference_runs()) {
    if (r.reference_unchunked) score_pass(rows, reference_gathers(), false, true);
    else for (int64_t k = 0; k < chunks; ++k) score_pass(mbs, reference_gathers(), false, true);
  }
  // The reward model scores the whole generation batch in one forward under inference_mode (T:481-486 at v0.14 ...
  // T:1648-1653 at v1.9), its head a score per position.
  if (cfg_.training.reward_model_on()) score_pass(rows, r.reward_sharded && unshards_units(), true);
  dims_ = training;
  rollout_ids_.push_back(ids);  // the batch's ids live until its last micro-batch has trained (step())
}

bool StepBuilder::reference_runs() const {
  const ReferenceModel ref = resolved_.preference.reference;
  return ref == ReferenceModel::Copy || ref == ReferenceModel::AdapterDisabled;
}
bool StepBuilder::reference_gathers() const {
  const PreferenceFlow& p = resolved_.preference;
  return (p.reference != ReferenceModel::Copy || p.reference_sharded) && unshards_units();
}

// A no-grad forward of `rows` completions with their prompts, the head over the completion's tokens
// (_get_per_token_logps: logits_to_keep = completion + 1, logits[:, :-1], / temperature, selective_log_softmax).
void StepBuilder::score_pass(int64_t rows, bool gathers, bool reward, bool reference) {
  const RolloutFlow& r = resolved_.rollout;
  const PreferenceFlow& p = resolved_.preference;
  const int32_t post = -1;
  const ActDims before = dims_;
  use_shape({rows, r.prompt_tokens + r.completion_tokens});
  NoGradPass pass = begin_no_grad(gathers ? rollout_labels_.gathered : UINT32_MAX, reference && reference_own_engine());
  std::vector<uint32_t> norm;
  uint32_t g = no_grad_trunk(pass, nullptr, norm, nullptr);
  if (reward) {  // the score head: one logit per position
    drop(tmp(mul(4, dims_.T), rollout_labels_.score_logits, post));
    for (uint32_t t : norm) drop(t);
    release_head_gathered(pass, g);
    end_no_grad(pass);
    dims_ = before;
    return;
  }
  const int64_t e = dims_.e, el = p.logits_fp32 ? 4 : e;
  const int64_t C = r.completion_tokens;
  const int64_t kept = mul(rows, C + 1, dims_.V), scored = mul(rows, C, dims_.V);
  uint32_t hd = head_dequant();
  uint32_t lg16 = el != e ? tmp(mul(e, kept), rollout_labels_.score_logits, post) : UINT32_MAX;
  drop_if(hd);
  for (uint32_t t : norm) drop(t);
  release_head_gathered(pass, g);
  uint32_t logits = tmp(mul(el, kept), rollout_labels_.score_logits, post);
  drop_if(lg16);
  uint32_t scaled = r.temperature_copy ? tmp(mul(el, scored), rollout_labels_.scaled, post) : UINT32_MAX;
  if (scaled != UINT32_MAX) drop(logits), logits = UINT32_MAX;
  // selective_log_softmax, one row at a time: fp32 rows through logsumexp, 16-bit rows through log_softmax.
  drop(tmp(mul(el, mul(C, dims_.V)), rollout_labels_.logps, post));
  drop_if(scaled);
  drop_if(logits);
  end_no_grad(pass);
  dims_ = before;
}

// model.generate under no_grad: the prefill over the prompts, then a token at a time. With a KV cache each layer's
// keys and values grow by torch.cat (DynamicCache / DynamicLayer.update): a new tensor one token longer, then the
// old one goes; transformers < 4.42 kept the previous token's whole legacy cache alive until the step ended (PR
// #30536). SDPA with a padding mask repeats the grouped keys and values for every query head, a layer at a time.
// Without a cache (gradient checkpointing in train mode before TRL 0.22) every token re-runs the whole sequence.
void StepBuilder::hf_generate(int64_t rows, GenerateKept* kept) {
  const RolloutFlow& r = resolved_.rollout;
  const int32_t post = -1;
  const int64_t P = r.prompt_tokens, C = r.completion_tokens;
  std::vector<uint32_t> whole;  // ZeRO-3: GatheredParameters(model.parameters()) around the whole call
  if (r.gathers_whole_model && !kept)
    for (int64_t l = -1; l <= shape_.num_layers; ++l) whole.push_back(tmp(gathered_bytes(l), rollout_labels_.gathered, static_cast<int32_t>(l)));
  const uint32_t gather_label = !r.gathers_whole_model && unshards_units() ? rollout_labels_.gathered : UINT32_MAX;
  // (PPO's caller gathers the whole model itself, the value model's parameters with the policy's.)
  const int64_t e = dims_.e;
  // One token's logits: [rows, V] in the model's dtype (fp32 before 4.46), their fp32 copy in _sample, and the
  // logits processors' fp32 scores, probabilities and a top-k/top-p sort's values and int64 indices
  // (docs/research/grpo.md B.Q2: _sample's copy and the warpers' temporaries; its 1-byte masks are left out).
  // transformers < 4.42 kept the previous step's outputs, the prefill's logits among them, alive into the next step
  // (PR #30536: "2*past_KV + first_iteration_logits").
  // PPO's generation (output_scores, top_k 0 and top_p 1: the temperature is its only warper) keeps each token's
  // processed scores in the output's tuple, and sorts nothing: `tokens` is how many tokens the replayed one stands for.
  uint32_t leaked = UINT32_MAX;
  auto sample = [&](uint32_t logits, int64_t tokens) {
    std::vector<uint32_t> t;
    if (kept) {
      t.push_back(tmp(mul(4, rows, dims_.V), rollout_labels_.sampling, post));  // the fp32 copy of the last logits
      kept->scores.push_back(program_.alloc(Component::Generation, mul(4, rows, tokens, dims_.V), ppo_labels_.scores, post));
      t.push_back(tmp(mul(4, rows, dims_.V), rollout_labels_.sampling, post));  // softmax's probabilities
    } else {
      for (int i = 0; i < 3; ++i) t.push_back(tmp(mul(4, rows, dims_.V), rollout_labels_.sampling, post));
      t.push_back(tmp(mul(8, rows, dims_.V), rollout_labels_.sampling, post));
    }
    drop_if(leaked);
    leaked = UINT32_MAX;
    if (r.legacy_cache) leaked = logits;
    else drop(logits);
    for (uint32_t x : t) drop(x);
  };
  auto head = [&](int64_t positions, std::vector<uint32_t>& norm, uint32_t g, int64_t tokens) {
    uint32_t hd = head_dequant();
    uint32_t lg = tmp(mul(e, rows, positions, dims_.V), rollout_labels_.logits, post);
    drop_if(hd);
    for (uint32_t t : norm) drop(t);
    drop_if(g);
    if (r.generate_logits_fp32) {
      uint32_t up = tmp(mul(4, rows, positions, dims_.V), rollout_labels_.logits, post);
      drop(lg), lg = up;
    }
    sample(lg, tokens);
  };
  if (!r.kv_cache) {
    for (int64_t k = 1; k <= kNoCacheForwards; ++k) {
      use_shape({rows, P + (C - 1) * k / kNoCacheForwards});
      NoGradPass pass = begin_no_grad(gather_label);
      std::vector<uint32_t> norm;
      uint32_t g = no_grad_trunk(pass, nullptr, norm, nullptr);
      head(r.prefill_all_logits ? dims_.s : 1, norm, g, C * k / kNoCacheForwards - C * (k - 1) / kNoCacheForwards);
      end_no_grad(pass);
    }
  } else {
    use_shape({rows, P});
    const int64_t kv_token[2] = {mul(rows, kv_cache_width(0), e), mul(rows, kv_cache_width(1), e)};  // one token, one layer
    std::vector<uint32_t> cache;                                                                    // per layer: keys, values
    const std::function<void(int64_t)> keep = [&](int64_t l) {
      for (int kv = 0; kv < 2; ++kv)
        cache.push_back(program_.alloc(Component::Generation, mul(kv_token[kv], P), rollout_labels_.kv, static_cast<int32_t>(l)));
    };
    NoGradPass pass = begin_no_grad(gather_label);
    std::vector<uint32_t> norm;
    uint32_t g = no_grad_trunk(pass, nullptr, norm, &keep);
    head(r.prefill_all_logits ? P : 1, norm, g, 1);
    end_no_grad(pass);
    const bool repeat = (resolved_.attention == Attention::Sdpa || resolved_.attention == Attention::SdpaRepeatKv ||
                         resolved_.attention == Attention::Eager || resolved_.attention == Attention::SdpaMath) &&
                        dims_.a != dims_.g;
    const int64_t steps = std::min<int64_t>(C - 1, kMaxDecodeSteps);
    int64_t previous_len = P;
    for (int64_t s = 1; s <= steps; ++s) {
      const int64_t len = P + (C - 1) * s / steps;
      const int64_t tokens = len - previous_len;
      previous_len = len;
      std::vector<uint32_t> old;
      for (int64_t l = 0; l < shape_.num_layers; ++l) {
        const int32_t li = static_cast<int32_t>(l);
        // FSDP unshards each unit for every token's forward; the last token's, over the whole cache, stands for them.
        const uint32_t unit = gather_label != UINT32_MAX && s == steps ? tmp(gathered_bytes(l), gather_label, li) : UINT32_MAX;
        for (int kv = 0; kv < 2; ++kv) {
          uint32_t& slot = cache[static_cast<size_t>(2 * l + kv)];
          const uint32_t grown = program_.alloc(Component::Generation, mul(kv_token[kv], len), rollout_labels_.kv, li);
          if (r.legacy_cache) old.push_back(slot);
          else drop(slot);
          slot = grown;
        }
        if (repeat) {
          const int64_t rep = mul(rows, dims_.h_q, e, len);
          uint32_t k = tmp(rep, rollout_labels_.kv_rep, li), v = tmp(rep, rollout_labels_.kv_rep, li);
          drop(k), drop(v);
        }
        drop_if(unit);
      }
      for (uint32_t t : old) drop(t);
      sample(tmp(mul(r.generate_logits_fp32 ? 4 : e, rows, dims_.V), rollout_labels_.logits, post), tokens);
    }
    if (kept) kept->cache.insert(kept->cache.end(), cache.begin(), cache.end());  // output.past_key_values
    else for (uint32_t t : cache) drop(t);
  }
  drop_if(leaked);
  for (uint32_t t : whole) drop(t);
}

// The training forward's head and loss (_get_per_token_logps with grad): logits over the completion's C + 1
// positions, logits[:, :-1] / temperature, selective_log_softmax; the entropy metric under no_grad (v0.20+).
StepBuilder::GrpoLogits StepBuilder::grpo_logits() const {
  GrpoLogits g;
  g.e = dims_.e;
  g.el = resolved_.preference.logits_fp32 ? 4 : g.e;
  g.C = resolved_.rollout.completion_tokens;
  // TRL's PPO forward() asks for no logits_to_keep: the logits of every position, sliced to the response after.
  g.kept = mul(dims_.b, ppo() ? dims_.s : g.C + 1, dims_.V);
  g.scored = mul(dims_.b, g.C, dims_.V);
  return g;
}

void StepBuilder::grpo_loss_forward(std::vector<uint32_t>& saved) {
  rollout_labels();
  if (liger_grpo()) return grpo_liger_forward(saved);
  const RolloutFlow& r = resolved_.rollout;
  const int32_t post = -1;
  const auto [e, el, C, kept, scored] = grpo_logits();
  uint32_t hd = head_dequant();
  uint32_t lg16 = el != e ? tmp(mul(e, kept), labels_.logits, post) : UINT32_MAX;
  drop_if(hd);
  // The tensor the log-probabilities read: the temperature's quotient, or (without a copy) the logits themselves.
  // fp32 logits: gather and each row's logsumexp save the tensor they read.
  const bool read_saved = el == 4;
  const uint32_t logits_label = lg16 != UINT32_MAX ? labels_.logits_fp32 : labels_.logits;
  uint32_t read;
  if (r.temperature_copy) {
    uint32_t logits = tmp(mul(el, kept), logits_label, post);
    drop_if(lg16);
    read = read_saved ? act(mul(el, scored), rollout_labels_.scaled, post) : tmp(mul(el, scored), rollout_labels_.scaled, post);
    drop(logits);
  } else {
    read = read_saved ? act(mul(el, kept), logits_label, post) : tmp(mul(el, kept), logits_label, post);
    drop_if(lg16);
  }
  if (ppo()) ppo_hold_outputs(read);  // `output` and `logits` hold it past the backward, for the entropy
  if (read_saved) {
    drop(tmp(mul(4, mul(C, dims_.V)), rollout_labels_.logps, post));  // (row - max).exp_(), one row at a time
    saved.push_back(read);
  } else {
    const int64_t blocks = std::min(dims_.b, kMaxLogpsRows);
    for (int64_t k = 0; k < blocks; ++k) {
      saved.push_back(act(mul(e, logps_rows(k, blocks, dims_.b), C, dims_.V), rollout_labels_.logps, post));
    }
  }
  // entropy_from_logits (trl/trainer/utils.py, grpo.md A.5): a chunk's log_softmax, its exp and their product.
  if (r.entropy_rows > 0) {
    const int64_t chunk = mul(el, r.entropy_rows, dims_.V);
    uint32_t a = tmp(chunk, rollout_labels_.entropy, post), b = tmp(chunk, rollout_labels_.entropy, post),
             c = tmp(chunk, rollout_labels_.entropy, post);
    drop(a), drop(b), drop(c);
  }
  if (!read_saved) drop(read);
}

// Down to the final norm's output: the log-probabilities' backward (per row for 16-bit logits), the temperature's
// division, the slice's zero-filled gradient of the C + 1 positions, the cast back from fp32, lm_head.
uint32_t StepBuilder::grpo_loss_backward(std::vector<uint32_t>& saved) {
  if (liger_grpo()) return grpo_liger_backward(saved);
  const RolloutFlow& r = resolved_.rollout;
  const int32_t post = -1;
  const auto [e, el, C, kept, scored] = grpo_logits();
  uint32_t grad;
  if (el == 4) {
    uint32_t g1 = tmp(mul(4, scored), labels_.loss_grad, post);  // gather's zero-filled scatter
    grad = tmp(mul(4, scored), labels_.loss_grad, post);         // logsumexp's backward, summed in
    drop(g1);
  } else {
    std::vector<uint32_t> rows;
    const int64_t blocks = std::min(dims_.b, kMaxLogpsRows);
    for (int64_t k = blocks - 1; k >= 0; --k) {  // release_saved takes the latest: the rows in reverse
      const int64_t n = logps_rows(k, blocks, dims_.b);
      uint32_t g1 = tmp(mul(e, n, C, dims_.V), labels_.loss_grad, post);
      rows.push_back(tmp(mul(e, n, C, dims_.V), labels_.loss_grad, post));
      drop(g1);
      release_saved(saved, rollout_labels_.logps);
    }
    grad = tmp(mul(e, scored), labels_.loss_grad, post);  // the loop's unbind stacks them
    for (uint32_t t : rows) drop(t);
  }
  if (r.temperature_copy) {  // DivBackward: grad / temperature
    uint32_t g = tmp(mul(el, scored), labels_.loss_grad, post);
    drop(grad), grad = g;
  }
  {  // SliceBackward: zeros of the C + 1 positions
    uint32_t g = tmp(mul(el, kept), labels_.loss_grad, post);
    drop(grad), grad = g;
  }
  if (el == 4 && e < 4) {
    uint32_t g = tmp(mul(e, kept), labels_.loss_grad_bf16, post);
    drop(grad), grad = g;
  }
  alloc_layer_grads(shape_.num_layers);
  uint32_t dy;
  { uint32_t hd = head_dequant(); dy = tmp(mul(e, dims_.Tn, dims_.h), labels_.dres, post); drop_if(hd); }
  drop(grad);
  for (auto it = saved.rbegin(); it != saved.rend(); ++it) drop(*it);
  saved.clear();
  norm_backward(post, dy);
  return dy;
}

// Liger's LigerFusedLinearGRPOLoss (RolloutFlow::liger; liger-kernel src/liger_kernel/chunked_loss/fused_linear_ppo.py
// at v0.6.4 and v0.8.0, docs/research/liger-grpo.md), called by TRL's compute_liger_loss on the trunk's last hidden
// state sliced to the completion ([:, :-1][:, -C:], views). Its forward makes the gradients:
//  - grad_weight = torch.zeros_like(weight), [vocab, hidden] in the head's dtype, whatever the head's requires_grad
//    (the chunk's gradient is always taken with respect to the weight), saved for the backward;
//  - one completion at a time (chunk_size 1), the chunk's loss and its gradients, added into grad_weight, the input's
//    appended to a list:
//    Chunked (0.5.4-0.7.x): torch.func.grad_and_value of the compiled chunk loss: logits = input @ weight.t() ([C,
//      vocab] in the compute dtype), log_softmax(logits.float()) (fp32), the gradient of the logits written back in
//      the compute dtype, then the input's [C, hidden] and the weight's [vocab, hidden] gradient in its dtype;
//    Streaming (0.8+): _ChunkedSelectiveLogProbFunction's backward zero-fills an fp32 grad_hidden [C, hidden] and an
//      fp32 grad_weight [vocab, hidden], streams 4,096-column slices of the vocabulary into them, and returns both
//      cast to the input's and the weight's dtypes;
//  - the list concatenated into grad_input [rows, C, hidden], saved with grad_weight.
// No logits of the batch exist. Where the loss was scaled (RolloutFlow::liger_scaled) the backward multiplies both
// saved gradients by grad_output, new tensors.
void StepBuilder::grpo_liger_forward(std::vector<uint32_t>& saved) {
  const RolloutFlow& r = resolved_.rollout;
  auto& L = rollout_labels_;
  if (L.liger_weight_grad == UINT32_MAX) {
    L.liger_weight_grad = program_.label("Liger GRPO loss: lm_head weight gradient (zeros_like(weight), and each completion's)");
    L.liger_chunk = program_.label("Liger GRPO loss: one completion's logits, log-probabilities and their gradient");
    L.liger_input_grad = program_.label("Liger GRPO loss: gradient of the last hidden state (per completion, concatenated)");
  }
  const int32_t post = -1;
  const int64_t e = dims_.e, C = r.completion_tokens, V = dims_.V, H = dims_.h;
  const ParamTensor* head = head_weight();  // lm_head.weight as Liger reads it (the embedding where tied)
  const int64_t w = head ? weight_bytes_of(*head) : 0;
  saved.push_back(act(w, L.liger_weight_grad, post));
  const bool streaming = r.liger == RolloutFlow::LigerGrpo::Streaming;
  // Each completion allocates and frees the same chunk tensors: the first two are replayed (the second reuses the
  // first's cached blocks as every later one would); the input gradients are kept per block of rows.
  const int64_t blocks = std::min(dims_.b, kMaxLogpsRows);
  std::vector<uint32_t> inputs;
  for (int64_t k = 0; k < blocks; ++k) {
    const int64_t rows = logps_rows(k, blocks, dims_.b);
    const bool replay = k < 2;
    if (replay && !streaming) {
      uint32_t logits = tmp(mul(e, C, V), L.liger_chunk, post);
      uint32_t logps = tmp(mul(4, C, V), L.liger_chunk, post);
      uint32_t grad = tmp(mul(e, C, V), L.liger_chunk, post);
      drop(logps), drop(logits);
      inputs.push_back(act(mul(e, rows, C, H), L.liger_input_grad, post));
      uint32_t gw = tmp(w, L.liger_weight_grad, post);
      drop(grad), drop(gw);  // grad_weight.add_(chunk_grad_weight)
    } else if (replay) {
      uint32_t gh32 = tmp(mul(4, C, H), L.liger_input_grad, post);
      uint32_t gw32 = tmp(mul(4, V, H), L.liger_weight_grad, post);
      const int64_t slice = std::min<int64_t>(V, kLigerVocabSlice);
      uint32_t logits = tmp(mul(4, C, slice), L.liger_chunk, post), probs = tmp(mul(4, C, slice), L.liger_chunk, post);
      drop(logits);
      uint32_t grad = tmp(mul(4, C, slice), L.liger_chunk, post);
      drop(probs), drop(grad);
      inputs.push_back(act(mul(e, rows, C, H), L.liger_input_grad, post));
      uint32_t gw = tmp(w, L.liger_weight_grad, post);
      drop(gh32), drop(gw32);
      drop(gw);
    } else {
      inputs.push_back(act(mul(e, rows, C, H), L.liger_input_grad, post));
    }
  }
  saved.push_back(act(mul(e, dims_.b, C, H), L.liger_input_grad, post));  // torch.cat(grad_inputs)
  for (uint32_t t : inputs) drop(t);
}

// The saved gradients returned (copies where the loss was scaled), lm_head's gradient only where the head trains,
// then the two slices' zero-filled gradients of the trunk's output, down to the final norm.
uint32_t StepBuilder::grpo_liger_backward(std::vector<uint32_t>& saved) {
  const RolloutFlow& r = resolved_.rollout;
  const auto& L = rollout_labels_;
  const int32_t post = -1;
  const int64_t e = dims_.e, C = r.completion_tokens, H = dims_.h;
  uint32_t grad_in = saved.back(), weight_grad = saved[saved.size() - 2];
  saved.pop_back(), saved.pop_back();
  uint32_t grad_w = UINT32_MAX;
  if (r.liger_scaled) {
    const int64_t w = program_.tensors[weight_grad].bytes;
    uint32_t gi = tmp(mul(e, dims_.b, C, H), L.liger_input_grad, post);
    grad_w = tmp(w, L.liger_weight_grad, post);
    drop(grad_in), grad_in = gi;
  }
  drop(weight_grad);  // the node's saved tensors go once it has run
  drop_if(grad_w);    // a frozen head's is discarded; a trained head's becomes its .grad, allocated below
  alloc_layer_grads(shape_.num_layers);
  uint32_t g1 = tmp(mul(e, dims_.b, dims_.s - 1, H), labels_.loss_grad, post);  // SliceBackward of [:, -C:]
  drop(grad_in);
  uint32_t dy = tmp(mul(e, dims_.Tn, dims_.h), labels_.dres, post);              // SliceBackward of [:, :-1]
  drop(g1);
  for (auto it = saved.rbegin(); it != saved.rend(); ++it) drop(*it);
  saved.clear();
  norm_backward(post, dy);
  return dy;
}

}  // namespace memsim
