// GRPO (training.objective grpo) as TRL's GRPOTrainer runs it: completions are generated for each prompt, scored
// (the reference's log-probabilities, and the policy's own where an update reuses them), and trained on. This file
// resolves what each TRL version and generation engine keeps on the GPU; rollout_step.cpp builds the phases.
// Sources: docs/research/grpo.md (huggingface/trl trl/trainer/grpo_trainer.py at the tags named, transformers'
// generate, vLLM's worker).
#pragma once
#include <cstdint>
#include <string>

#include "config.h"
#include "versions.h"

namespace memsim {

struct RolloutFlow {
  bool active = false;  // training.objective grpo
  GenerationEngine engine = GenerationEngine::HfGenerate;
  int64_t prompt_tokens = 0;      // sequence_length - completion_length
  int64_t completion_tokens = 0;  // completion_length
  // Completions one generate call makes on a device (generation_batch): P before v0.17, P x GAS from v0.17.
  int64_t generation_rows = 0;
  bool per_micro_batch = false;       // generation and scoring run before every micro-batch (TRL 0.15-0.16)
  // Generations also fall inside optimizer steps (TRL 0.18+: steps_per_generation x num_iterations micro-batches
  // apart, not a multiple of gradient_accumulation_steps): one then runs with the step's gradients alive.
  bool mid_step_generation = false;
  bool gathers_whole_model = false;   // hf_generate under ZeRO-3: unwrap_model_for_generation gathers every parameter
  bool kv_cache = true;               // generate keeps a KV cache (not under gradient checkpointing before TRL 0.22)
  bool legacy_cache = false;          // transformers < 4.42: the previous token's whole cache lives through the next
  bool prefill_all_logits = false;    // transformers < 4.45: the prefill computes logits for every prompt token
  bool generate_logits_fp32 = false;  // transformers < 4.46: the model upcasts its logits
  bool temperature_copy = false;      // logits / temperature makes a new tensor (TRL 0.16-0.29)
  int64_t entropy_rows = 0;           // rows of the logits entropy_from_logits takes at a time; 0: no entropy
  bool policy_logps_pass = false;     // a no-grad pass of the policy for old_per_token_logps (vLLM, TRL >= 0.23)
  bool reference_after_policy = false;  // the reference's forward runs after the policy's (TRL 0.18.x)
  bool reference_unchunked = false;   // the reference scores the whole generation batch in one forward (TRL 0.19)
  bool engine_sleeps = false;         // vllm_colocate with vllm_sleep: freed while the policy trains
  // vLLM 0.8.0-0.9.0 (the V1 engine before 0.9.1): gpu_memory_utilization caps the whole process, so what the trainer
  // holds when the engine starts comes out of the engine's share.
  bool engine_budget_whole_process = false;
  bool sync_gathers_whole = false;    // the weight sync gathers the whole model at once (ZeRO-3: PEFT, or TRL < 0.16)
  bool engine_wakes_whole = false;    // sleep mode wakes weights and KV cache together, before the sync (TRL 0.23-0.24)
  bool reward_sharded = false;        // the reward model is ZeRO-3 sharded (prepare_deepspeed, TRL 0.17+)
  // training.loss fused_linear: Liger's LigerFusedLinearGRPOLoss over the trunk's last hidden state in place of the
  // training forward's logits (TRL use_liger_loss 0.17-0.24, use_liger_kernel from 0.25; docs/research/liger-grpo.md).
  // It computes the gradients inside its forward, one completion at a time: Chunked (Liger 0.5.4-0.7.x) through
  // torch.func.grad_and_value over the chunk's [C, vocab] logits, its weight gradient in the weight's dtype;
  // Streaming (0.8+) over 4,096-column vocabulary slices, its weight gradient in fp32 and then cast.
  enum class LigerGrpo { None, Chunked, Streaming } liger = LigerGrpo::None;
  bool liger_scaled = false;  // the loss is divided by gradient_accumulation_steps: backward copies both gradients
  // PPO (training.objective ppo, TRL's PPOTrainer; ppo_step.cpp): generate keeps every token's fp32 scores
  // (output_scores) and returns them stacked; batch_generation pads them into logitss, which lives through the whole
  // update. Generation and scoring take chunk_rows (local_rollout_forward_batch_size) rows at a time, and every
  // scoring forward returns all its hidden states. A value model of the policy's shape trains beside it.
  bool ppo = false;
  int64_t chunk_rows = 0;
  // The reference's scoring forward builds a KV cache (training.use_cache): DynamicCache holds each layer's keys and
  // values, [rows, kv heads, tokens, head dim] each, in the output until `del ref_output`.
  bool reference_kv_cache = false;
  // The policy's training forward builds one too where nothing turns it off (use_cache without gradient
  // checkpointing): `output.past_key_values` holds each layer's keys and values, which backward saved anyway, until
  // the next micro-batch rebinds `output`. The value model's goes when PolicyAndValueWrapper.forward returns.
  bool policy_kv_cache = false;
  std::string note;                   // the rules above with their versions, for the result's notes
};

// The completions per device that one generation makes (RolloutFlow::generation_rows) and the global count TRL
// checks num_generations against; both from the config and the TRL version.
struct GenerationBatch {
  int64_t per_device = 0;
  int64_t global = 0;
  std::string formula;  // "micro_batch_size x data-parallel GPUs x gradient_accumulation_steps", for the error
  int64_t steps = 1;    // micro-batches per generation (steps_per_generation; 1 before TRL 0.17)
};
GenerationBatch generation_batch(const Config& c, const StackVersions& v);

// PPO's value model as memsim builds it (ppo_step.cpp): the policy's config, its model untied (a score head, no
// lm_head), without PEFT unless training.value_model is peft, never checkpointed, trained with a plain objective.
Config value_model_config(const Config& policy);

// PPOConfig.local_rollout_forward_batch_size's default (trl/trainer/ppo_config.py, v0.12 on).
constexpr int64_t kPpoRolloutChunkRows = 64;

// Requires a validated config; `deepspeed_zero3` says the policy's parameters are ZeRO-3 partitions.
RolloutFlow resolve_rollout(const Config& c, const StackVersions& v, bool deepspeed_zero3);

}  // namespace memsim
