// GRPO's rollouts by TRL version and generation engine (rollout.h). Sources (docs/research/grpo.md): huggingface/trl
// trl/trainer/grpo_trainer.py (T), grpo_config.py (C), trl/models/utils.py (MU) at the tags named; transformers'
// generate and cache_utils.py; vLLM's v1 gpu_worker.py and device_allocator/cumem.py.
#include "rollout.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "checked.h"
#include "preference.h"
#include "tables.h"

namespace memsim {

namespace {
constexpr Version V(int major, int minor, int patch = 0) { return {major, minor, patch}; }
}  // namespace

GenerationBatch generation_batch(const Config& c, const StackVersions& v) {
  const auto& t = c.training;
  const int64_t dp = c.parallel.data_parallel_size;
  GenerationBatch g;
  // v0.15-v0.16 generated each micro-step's P completions (T:463-468, the check on P x num_processes at T:341-349);
  // v0.17 a whole step's P x GAS (T:894-903); from v0.18 P x steps_per_generation, which defaults to GAS
  // (C:517-529).
  if (v.below(Library::Trl, V(0, 17))) {
    g.per_device = t.micro_batch_size;
    g.formula = "micro_batch_size x data-parallel GPUs";
  } else if (v.at_least(Library::Trl, V(0, 18)) && t.steps_per_generation > 0) {
    g.steps = t.steps_per_generation;
    g.per_device = mul(t.micro_batch_size, t.steps_per_generation);
    g.formula = "micro_batch_size x data-parallel GPUs x steps_per_generation";
  } else {
    g.steps = t.gradient_accumulation_steps;
    g.per_device = mul(t.micro_batch_size, t.gradient_accumulation_steps);
    g.formula = "micro_batch_size x data-parallel GPUs x gradient_accumulation_steps";
  }
  g.global = mul(g.per_device, dp);
  return g;
}

namespace {
// What generate() keeps, by version, for GRPO and PPO alike (both generate through TRL's unwrap_model_for_generation
// with the policy in train mode). Up to v0.21 generate ran with gradient checkpointing on, where transformers sets
// use_cache=False: every new token re-ran the whole sequence; from v0.22 unwrap_model_for_generation turns
// checkpointing off around generate (MU:336-352, commit 65d7894b6), so the KV cache is used. transformers < 4.42
// round-tripped the legacy tuple cache, so the previous step's whole cache stayed alive while every layer's new one
// was built (PR #30536). The prefill's logits: every prompt position before 4.45 (num_logits_to_keep=1, PR #31292),
// upcast to fp32 up to 4.45 (logits.float(), removed by #33902 in 4.46).
void generate_rules(RolloutFlow& r, const Config& c, const StackVersions& v) {
  r.kv_cache = !(v.below(Library::Trl, V(0, 22)) && c.training.checkpointing_on());
  r.legacy_cache = v.below(Library::Transformers, V(4, 42));
  r.prefill_all_logits = v.below(Library::Transformers, V(4, 45));
  r.generate_logits_fp32 = v.below(Library::Transformers, V(4, 46));
}

// TRL's PPOTrainer (trl/trainer/ppo_trainer.py v0.12-v0.25, trl/experimental/ppo/ppo_trainer.py from v0.26; P below
// is v0.17's file, U its trainer/utils.py): one generation of local_batch_size = per_device_train_batch_size x
// gradient_accumulation_steps x num_mini_batches (1) queries per update (P:422-430), then num_ppo_epochs passes of
// optimizer steps over it. docs/research/ppo.md.
RolloutFlow resolve_ppo(const Config& c, const StackVersions& v, bool deepspeed_zero3) {
  RolloutFlow r;
  const auto& t = c.training;
  const Library trl = Library::Trl;
  r.active = true;
  r.ppo = true;
  r.engine = GenerationEngine::HfGenerate;
  r.completion_tokens = t.completion_length;
  r.prompt_tokens = t.sequence_length - t.completion_length;
  r.generation_rows = mul(t.micro_batch_size, t.gradient_accumulation_steps);
  r.chunk_rows = std::min(r.generation_rows, kPpoRolloutChunkRows);
  // unwrap_model_for_generation(gather_deepspeed3_params=ds3_gather_for_generation, True) as for GRPO, and its
  // generate rules: PPOTrainer runs model.train() (P:379) too.
  r.gathers_whole_model = deepspeed_zero3;
  generate_rules(r, c, v);
  // The reward model: prepare_deepspeed under DeepSpeed (P:291; sharded at stage 3), else .to(device) (P:308).
  r.reward_sharded = deepspeed_zero3;
  // forward() (P:191-220 at trl f2cd577, trl/experimental/ppo/ppo_trainer.py) calls the model with
  // output_hidden_states and no use_cache, so the config decides; get_reward() passes use_cache=False ("otherwise
  // mistral-based RM would error out", trl/experimental/utils.py): the value and reward models keep no cache. A PEFT
  // reference is the policy with its adapters off, in train mode (P:639), where transformers turns the cache off
  // under gradient checkpointing ("use_cache=True is incompatible with gradient checkpointing"); a separate
  // reference model has no checkpointing enabled.
  const ReferenceModel ref = t.reference() == ReferenceModel::Auto ? auto_reference(c, v) : t.reference();
  r.reference_kv_cache = t.use_cache && !(ref == ReferenceModel::AdapterDisabled && t.checkpointing_on());
  r.policy_kv_cache = t.use_cache && !t.checkpointing_on();
  r.note = describe_version(v, trl) + "'s PPOTrainer: " + std::to_string(r.generation_rows) +
           " responses per GPU generated before each update, " + std::to_string(r.chunk_rows) +
           " at a time, with the fp32 scores of every token kept (output_scores) and held through the update" +
           (r.gathers_whole_model ? "; generate gathers the whole model (ZeRO-3)" : "") +
           (r.kv_cache ? "" : "; no KV cache (gradient checkpointing in train mode: every token re-runs the sequence)") +
           "; the reference, the value model and the reward model score each chunk with all their hidden states" +
           (r.reference_kv_cache ? ", the reference with its KV cache (config.use_cache)" : "") + "; the "
           "value model (the policy's shape, " + std::string(t.value_model_peft() ? "with the policy's PEFT method" : "trained in full") +
           ", not checkpointed) runs its forward before the policy's and its backward after it";
  return r;
}
}  // namespace

RolloutFlow resolve_rollout(const Config& c, const StackVersions& v, bool deepspeed_zero3) {
  RolloutFlow r;
  const auto& t = c.training;
  if (!t.rollout()) return r;
  if (t.ppo()) return resolve_ppo(c, v, deepspeed_zero3);
  const Library trl = Library::Trl;
  r.active = true;
  r.engine = t.engine();
  r.completion_tokens = t.completion_length;
  r.prompt_tokens = t.sequence_length - t.completion_length;
  const GenerationBatch batch = generation_batch(c, v);
  r.generation_rows = batch.per_device;
  r.per_micro_batch = v.below(trl, V(0, 17));
  // From v0.17 a generation every generate_every = steps_per_generation x num_iterations micro-batches (T:896-903 at
  // v0.17, T:969-975 at v0.18). Over a run they start at every micro-batch index that is a multiple of
  // gcd(generate_every, GAS) within a step; below GAS, some start mid-step.
  const int64_t gas = t.gradient_accumulation_steps;
  const int64_t generate_every = mul(batch.steps, std::max<int64_t>(1, t.num_iterations));
  r.mid_step_generation = !r.per_micro_batch && std::gcd(generate_every, gas) < gas;
  const bool hf = r.engine == GenerationEngine::HfGenerate;
  // unwrap_model_for_generation gathers every parameter at once under ZeRO-3 (GatheredParameters(model.parameters()),
  // MU:187-194 at v0.14 ... MU:139-148 at v1.9; ds3_gather_for_generation defaults to True).
  r.gathers_whole_model = hf && deepspeed_zero3;
  generate_rules(r, c, v);
  // logits / self.temperature: none before v0.16, a new tensor v0.16-v0.29 (T:598 ... T:1078), in place (div_)
  // from v1.0 (T:1068, #5254).
  r.temperature_copy = v.at_least(trl, V(0, 16)) && v.below(trl, V(1, 0));
  // The entropy of the training forward's logits (v0.20+, under no_grad): entropy_from_logits one sequence at a time
  // up to v0.25, 128 flattened rows from v0.26 (TU:1464 at v0.20, TU:1544 at v0.26).
  r.entropy_rows = v.below(trl, V(0, 20)) ? 0 : v.below(trl, V(0, 26)) ? t.completion_length : 128;
  // old_per_token_logps, a no-grad pass of the policy over the generation batch: always with vLLM from v0.23
  // (vllm_importance_sampling_correction, default True, C:601); otherwise for num_iterations > 1 (v0.16-v0.17,
  // T:743 at v0.16), or steps_per_generation > GAS too (v0.18-v0.19, T:1132 at v0.18), and from v0.20 where
  // generations and optimizer steps do not align: GAS % generate_every != 0 (T:1618-1619 at v0.20).
  const int64_t iterations = std::max<int64_t>(1, t.num_iterations);
  const bool misaligned = v.below(trl, V(0, 18))   ? iterations > 1
                          : v.below(trl, V(0, 20)) ? iterations > 1 || batch.steps > gas
                                                   : gas % generate_every != 0;
  r.policy_logps_pass = (!hf && v.at_least(trl, V(0, 23))) || (v.at_least(trl, V(0, 16)) && misaligned);
  // Where the reference's no-grad forward runs: in _compute_loss after the policy's forward in v0.18.x (T:1333-1345),
  // in _generate_and_score_completions otherwise; v0.19 over the whole generation batch at once (T:1213-1222).
  r.reference_after_policy = v.at_least(trl, V(0, 18)) && v.below(trl, V(0, 19));
  r.reference_unchunked = v.at_least(trl, V(0, 19)) && v.below(trl, V(0, 20));
  r.engine_sleeps = r.engine == GenerationEngine::VllmColocate && t.vllm_sleep;
  // vLLM's V1 worker from 0.8.0 (V1 the default) to 0.9.0: reset_peak_memory_stats, profile_run, then
  // available = total x util - allocated_bytes.all.peak (whole process) - non-torch (gpu_worker.py:178-210 at v0.8.5,
  // :197-212 at v0.9.0); 0.9.1 requests total x util for the engine alone (gpu_worker.py:135-137, :218). 0.7.x's
  // default V0 worker measured from a baseline snapshot, the engine alone. docs/research/grpo.md C.1.
  r.engine_budget_whole_process = r.engine == GenerationEngine::VllmColocate && v.at_least(Library::Vllm, V(0, 8)) &&
                                  v.below(Library::Vllm, V(0, 9, 1));
  r.reward_sharded = deepspeed_zero3 && v.at_least(trl, V(0, 17));
  // Liger's GRPO loss: compute_liger_loss returns loss / current_gradient_accumulation_steps (T:2095 at v0.26.2), so
  // the backward's grad_output is 1.0 only without accumulation; Liger's backward multiplies both saved gradients
  // by anything else (fused_linear_ppo.py backward: grad_input * grad_output, grad_weight * grad_output).
  if (t.loss == "fused_linear") {
    r.liger = v.below(Library::Liger, V(0, 8)) ? RolloutFlow::LigerGrpo::Chunked : RolloutFlow::LigerGrpo::Streaming;
    // Every TRL version divides by the accumulation steps (TRL itself from 0.22, the Trainer's training_step with
    // model_accepts_loss_kwargs False before), and fp16's loss scaler multiplies.
    const PrecisionRecipe* recipe = find_precision(t.precision);
    r.liger_scaled = t.gradient_accumulation_steps > 1 || (recipe && recipe->fp16);
    r.temperature_copy = false;  // Liger divides the chunk's logits only for a temperature other than 1 (the default)
    r.entropy_rows = 0;          // no logits: compute_liger_loss logs no entropy
  }
  r.sync_gathers_whole = (c.peft.enabled() && deepspeed_zero3) || (deepspeed_zero3 && v.below(trl, V(0, 16)));
  r.engine_wakes_whole = v.below(trl, V(0, 25));
  r.note = describe_version(v, trl) + ": " + std::to_string(r.generation_rows) + " completions per GPU generated at once" +
           (r.per_micro_batch       ? " before each micro-batch"
            : r.mid_step_generation ? " every " + std::to_string(generate_every) + " micro-batches, some inside an optimizer step"
            : generate_every > gas  ? " every " + std::to_string(generate_every / gas) + " optimizer steps, before the step"
                                    : " before each optimizer step") +
           (hf ? (r.gathers_whole_model ? "; generate gathers the whole model (ZeRO-3)" : "") +
                     std::string(r.kv_cache ? (r.legacy_cache ? "; the KV cache doubles at each token (transformers < 4.42)"
                                                              : "; a KV cache grown a token at a time")
                                            : "; no KV cache (gradient checkpointing in train mode: every token re-runs the sequence)")
               : r.engine == GenerationEngine::VllmColocate
                   ? "; a colocated vLLM engine holds " + std::to_string(static_cast<int>(std::lround(t.gpu_memory_utilization * 100))) + "% of the GPU" +
                         (r.engine_sleeps ? " while it generates (asleep during training)" : "")
                   : std::string("; vLLM on other GPUs")) +
           (r.policy_logps_pass ? (hf || misaligned ? "; a no-grad policy pass for old_per_token_logps (generations not aligned with optimizer steps)"
                                                    : "; a no-grad policy pass for the importance-sampling correction")
                                : "") +
           (r.temperature_copy ? "; logits / temperature copied" : "") +
           (r.liger == RolloutFlow::LigerGrpo::None ? ""
            : "; Liger's fused GRPO loss (" + describe_version(v, Library::Liger) + "): no logits in the training forward, " +
                  (r.liger == RolloutFlow::LigerGrpo::Chunked
                       ? "each completion's [vocab, hidden] weight gradient in the weight's dtype (0.5.4-0.7.x)"
                       : "each completion's [vocab, hidden] weight gradient in fp32, then cast (0.8+)") +
                  ", beside a zeroed one of the whole step");
  return r;
}

}  // namespace memsim
