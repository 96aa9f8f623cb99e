// The single changes "What helps" knows (advice.h), each with its group, how much it slows a step, and its price in
// words. A change that keeps the job keeps the global batch (micro-batch x gradient accumulation x data parallel):
// where it lowers the micro-batch or the data-parallel size, it raises the gradient accumulation to match.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "advice.h"
#include "architecture.h"
#include "catalog.h"
#include "frameworks.h"
#include "tables.h"
#include "versions.h"

namespace memsim {

namespace {

using G = SuggestionGroup;

struct Adder {
  std::vector<Suggestion>& out;
  bool same_job_only;
  void operator()(G group, int slowdown, std::string id, std::string change, std::string cost, Config c) {
    if (same_job_only && group != G::SameJob && group != G::SameJobNumerics) return;
    Suggestion s;
    s.id = std::move(id);
    s.change = std::move(change);
    s.cost = std::move(cost);
    s.group = group;
    s.slowdown = slowdown;
    s.config = std::move(c);
    out.push_back(std::move(s));
  }
};

// The per-GPU sequences of one optimizer step (micro-batch x accumulation) spread over k times the data-parallel
// ranks: the largest micro-batch up to today's that divides them, and the accumulation that makes up the rest.
// False where the global batch cannot stay the same.
bool spread_over(Config& c, int64_t k) {
  const int64_t per_gpu = c.training.micro_batch_size * c.training.gradient_accumulation_steps;
  if (per_gpu % k != 0) return false;
  const int64_t left = per_gpu / k;
  int64_t mb = std::min(c.training.micro_batch_size, left);
  while (left % mb != 0) --mb;
  c.training.micro_batch_size = mb;
  c.training.gradient_accumulation_steps = left / mb;
  c.parallel.data_parallel_size *= k;
  return true;
}

// Halving the data-parallel ranks (to make room for tensor or context parallelism on the same GPUs) doubles the
// gradient accumulation, so that the global batch stays.
void halve_data_parallel(Config& c) {
  c.parallel.data_parallel_size /= 2;
  c.training.gradient_accumulation_steps *= 2;
}

std::string count(int64_t n) { return std::to_string(n); }

void activation_changes(const Config& base, const Resolved& rs, Adder& add) {
  const auto& t = base.training;
  if (t.activation_checkpointing == "none" && rs.framework && rs.framework->selective_recompute) {
    Config c = base;
    c.training.activation_checkpointing = "selective";
    add(G::SameJob, 1, "checkpointing_selective", "Selective activation checkpointing",
        "a few percent more compute: only the attention core (softmax, dropout) is recomputed in backward "
        "(Megatron's --recompute-granularity selective; Korthikanti et al. 2022)", c);
  }
  if (t.activation_checkpointing != "full") {
    Config c = base;
    c.training.activation_checkpointing = "full";
    add(G::SameJob, 2, "checkpointing_full", "Full activation checkpointing",
        "about 33% more compute: every layer's forward runs again in backward (Korthikanti et al. 2022)", c);
  }
  if (t.micro_batch_size > 1) {
    // Batch norm's statistics are over the micro-batch (torch.nn.BatchNorm2d in training mode), so accumulation
    // over smaller micro-batches is not the same training: the advice says so for a program with batch norm.
    std::string bn_note;
    if (!base.model.architecture.empty()) {
      std::shared_ptr<const Architecture> a;
      if (decode_architecture(base.model.architecture, base.model.architecture_args, a).empty()) {
        bool bn = false;
        for (const ArchStage* st : a->stages())
          for (const auto& op : st->ops) bn |= op.kind == OpKind::BatchNorm2d;
        if (bn) bn_note = "; batch norm's statistics then come from fewer samples, which changes training";
      }
    }
    // The largest proper divisor, so that the accumulation makes up the same global batch exactly.
    int64_t mb = t.micro_batch_size / 2;
    while (t.micro_batch_size % mb != 0) --mb;
    Config c = base;
    c.training.micro_batch_size = mb;
    c.training.gradient_accumulation_steps = t.gradient_accumulation_steps * (t.micro_batch_size / mb);
    add(G::SameJob, 1, "micro_batch_smaller",
        "Micro-batch " + count(mb) + ", gradient accumulation " + count(c.training.gradient_accumulation_steps),
        "same global batch; smaller matmuls run less efficiently" + bn_note, c);
    if (mb > 1) {
      c.training.micro_batch_size = 1;
      c.training.gradient_accumulation_steps = t.gradient_accumulation_steps * t.micro_batch_size;
      add(G::SameJob, 1, "micro_batch_one",
          "Micro-batch 1, gradient accumulation " + count(c.training.gradient_accumulation_steps),
          t.preference() && t.goal() != Objective::Kto
              ? "same global batch; one pair (its chosen and rejected sequences) per forward runs least efficiently"
                         : "same global batch; one sequence per matmul runs least efficiently" + bn_note, c);
    }
  }
  if (!t.activation_offload && t.activation_checkpointing == "none") {
    Config c = base;
    c.training.activation_offload = true;
    add(G::SameJob, 2, "activation_offload", "CPU activation offloading",
        "the saved activations cross PCIe every step; slower unless overlapped", c);
  }
}

// The evaluation between steps (training.eval_batch_size): a smaller eval batch, and the logits the HF Trainer's
// loop keeps for compute_metrics sent to the host after every batch, or reduced before they are kept. None changes
// the training.
void evaluation_changes(const Config& base, Adder& add) {
  const auto& t = base.training;
  if (t.eval_batch_size > t.micro_batch_size) {
    Config c = base;
    c.training.eval_batch_size = std::max<int64_t>(t.micro_batch_size, t.eval_batch_size / 2);
    add(G::SameJob, 0, "eval_batch_smaller", "Eval batch " + count(c.training.eval_batch_size),
        "the same training; the evaluation runs more, smaller batches (per_device_eval_batch_size)", c);
  }
  if (t.eval_logits_batches > 1) {
    Config c = base;
    c.training.eval_logits_batches = 1;
    add(G::SameJob, 0, "eval_accumulation_one", "eval_accumulation_steps 1",
        "the same training and metrics; each eval batch's logits go to the host at once, a copy per batch", c);
  }
  if (t.eval_logits_batches > 0) {
    Config c = base;
    c.training.eval_logits_batches = 0;
    add(G::SameJob, 0, "eval_logits_reduced", "preprocess_logits_for_metrics (e.g. argmax) before the logits are kept",
        "the same training; compute_metrics receives what the function returns (token ids), not the logits", c);
  }
}

void sharding_changes(const Config& base, const Resolved& rs, Adder& add) {
  const auto& p = base.parallel;
  const bool fsdp = rs.sharding == Sharding::Fsdp1 || rs.sharding == Sharding::Fsdp2;
  const bool megatron = rs.sharding == Sharding::Megatron;
  // Sharding over the data-parallel ranks: the next stage the engine has, and stage 3 as well where that is further.
  if (p.data_parallel_size > 1) {
    std::vector<int64_t> stages;
    if (megatron) {
      if (p.zero_stage == 0) stages = {1};
    } else if (p.pipeline_parallel_size == 1 || fsdp) {
      for (int64_t z = p.zero_stage + 1; z <= 3; ++z)
        if (!(fsdp && z == 1) && (stages.empty() || z == 3)) stages.push_back(z);
    } else if (p.zero_stage == 0) {
      stages = {1};  // DeepSpeed's pipeline engine takes ZeRO-1 only
    }
    for (int64_t z : stages) {
      Config c = base;
      c.parallel.zero_stage = z;
      std::string name = megatron ? "Distributed optimizer (Megatron's ZeRO-1)"
                         : fsdp   ? (z == 3 ? "FSDP FULL_SHARD (ZeRO-3's sharding)" : "FSDP SHARD_GRAD_OP (ZeRO-2's sharding)")
                                  : "ZeRO stage " + count(z);
      add(G::SameJob, z == 3 ? 1 : 0, "zero_" + count(z), name,
          z == 3 ? "weights are all-gathered per layer in forward and backward: 1.5x the data-parallel traffic "
                   "(ZeRO paper sec. 7)"
                 : "no extra traffic: a reduce-scatter and all-gather replace the all-reduce (ZeRO paper sec. 7)",
          c);
    }
  }
  // Offload to host RAM, also on one GPU: DeepSpeed's ZeRO-Offload and ZeRO-3 offload run on a single GPU (the
  // ZeRO-Offload paper trains a 13B model on one V100), and so does FSDP's CPUOffload.
  const std::string host = "needs host RAM (shown below the devices)";
  // The offloaded step is the engine's own CPU Adam (DeepSpeedCPUAdam, or torch's on CPU tensors): bitsandbytes'
  // 8-bit optimizers run on the GPU only, so they are not offloaded.
  if (base.training.optimizer.find("8bit") != std::string::npos) return;
  if (fsdp) {
    if (p.offload_optimizer == "none" && p.offload_params == "none") {
      Config c = base;
      c.parallel.zero_stage = 3;
      c.parallel.offload_optimizer = c.parallel.offload_params = "cpu";
      add(G::SameJob, 4, "offload_optimizer_params", "CPU offload of parameters and optimizer (FSDP CPUOffload)",
          "FSDP's CPUOffload(offload_params=True) keeps parameters, gradients and the optimizer step on the CPU: "
          "every layer's weights and gradients cross PCIe each step, often 2-3x slower; " + host, c);
    }
    return;
  }
  if (p.offload_optimizer == "none") {
    Config c = base;
    if (!megatron && c.parallel.zero_stage == 0) c.parallel.zero_stage = 2;  // ZeRO-Offload is built on ZeRO-2
    c.parallel.offload_optimizer = "cpu";
    add(G::SameJob, 3, "offload_optimizer",
        megatron ? "Optimizer offload to CPU (--optimizer-cpu-offload)"
                 : std::string("Optimizer offload to CPU (ZeRO-Offload") + (c.parallel.zero_stage != p.zero_stage ? ", ZeRO-2)" : ")"),
        "the optimizer step runs on the CPU and the gradients cross PCIe every step: often 1.5-3x slower; " + host, c);
  }
  if (!megatron && p.offload_params == "none" && p.pipeline_parallel_size == 1) {
    Config c = base;
    c.parallel.zero_stage = 3;
    c.parallel.offload_params = "cpu";
    const bool both = p.offload_optimizer == "none";
    if (both) c.parallel.offload_optimizer = "cpu";
    add(G::SameJob, 4, both ? "offload_optimizer_params" : "offload_params",
        both ? "CPU offload of optimizer and parameters (ZeRO-3 Offload)" : "Parameter offload to CPU (ZeRO-3 Offload)",
        "ZeRO-Infinity's offload_param: every layer's weights are fetched over PCIe in forward and backward, on top "
        "of the optimizer step on the CPU: often 2-3x slower; " + host, c);
  }
}

void layout_changes(const Config& base, const Resolved& rs, Adder& add) {
  const auto& t = base.training;
  const auto& p = base.parallel;
  if (p.context_parallel_size == 1 && t.sequence_length >= 16384 && t.sequence_length % 4 == 0 &&
      p.data_parallel_size % 2 == 0 && !base.model.post_layernorm && base.model.kv_lora_rank == 0 && t.attention != "eager") {
    Config c = base;
    c.parallel.context_parallel_size = 2;
    halve_data_parallel(c);
    add(G::SameJob, 1, "context_parallel_2", "Context parallel 2 (ring attention), same GPUs",
        "each GPU holds half of every sequence; key/value chunks circulate between the pair every layer; twice the "
        "gradient accumulation keeps the global batch", c);
  }
  if (p.tensor_parallel_size == 1 && base.model.num_attention_heads % 2 == 0 && base.model.num_experts == 0 &&
      !base.model.post_layernorm && !base.peft.enabled() && p.data_parallel_size % 2 == 0) {
    Config c = base;
    c.parallel.tensor_parallel_size = 2;
    halve_data_parallel(c);
    c.parallel.sequence_parallel = t.sequence_length % 2 == 0;
    add(G::SameJob, 1, "tensor_parallel_2", "Tensor parallel 2 (with sequence parallel), same GPUs",
        "all-reduces inside every layer: fine within an NVLink node; twice the gradient accumulation keeps the "
        "global batch", c);
  }
  // A 1F1B pipeline's first stage keeps the most micro-batches' activations in flight (the stage count, against
  // one on the last): giving it fewer layers and the others more evens the devices out (Megatron
  // --decoder-first-pipeline-num-layers; transformer_block.py get_num_layers_to_build). The first split that keeps
  // the other stages even is offered.
  if (p.pipeline_parallel_size > 1 && p.pipeline_schedule != "interleaved_1f1b" && p.pipeline_first_stage_layers == 0 &&
      p.pipeline_last_stage_layers == 0) {
    const int64_t layers = base.model.num_hidden_layers, stages = p.pipeline_parallel_size;
    for (int64_t first = layers / stages - 1; first >= 1; --first)
      if ((layers - first) % (stages - 1) == 0) {
        Config c = base;
        c.parallel.pipeline_first_stage_layers = first;
        add(G::SameJob, 1, "pipeline_first_stage",
            "Fewer layers on the first pipeline stage (" + count(first) + ", the others " +
                count((layers - first) / (stages - 1)) + " each)",
            "Megatron's --decoder-first-pipeline-num-layers: the first stage holds the most micro-batches in flight; "
            "the other stages then compute more, so the step can take a little longer", c);
        break;
      }
  }
  if (base.parallel.fsdp_no_sync != "false" && (rs.sharding == Sharding::Fsdp1 || rs.sharding == Sharding::Fsdp2) &&
      t.gradient_accumulation_steps > 1 && p.pipeline_parallel_size == 1) {
    Config c = base;
    c.parallel.fsdp_no_sync = "false";
    add(G::SameJob, 1, "fsdp_sync_each_batch", "Sync gradients every micro-batch",
        "Accelerate's sync_each_batch=True (in Fabric, no_backward_sync(enabled=False)): a reduce-scatter per "
        "micro-batch instead of one per step, where FSDP's no_sync() holds the whole model's unsharded gradients", c);
  }
}

// A preference objective's reference (preference.h): precomputed log-probabilities take it off the GPU during training
// (TRL's precompute_ref_log_probs: one no-grad pass before the first step); under PEFT the policy with its adapters off
// is the reference without a second model.
void preference_changes(const Config& base, const Resolved& rs, Adder& add) {
  const ReferenceModel ref = rs.preference.reference;
  const Objective o = rs.preference.objective;
  if ((o != Objective::Dpo && o != Objective::Kto) || (ref != ReferenceModel::Copy && ref != ReferenceModel::AdapterDisabled)) return;
  Config c = base;
  c.training.reference_model = "precomputed";
  add(G::SameJob, 0, "reference_precomputed", "Precompute the reference log-probabilities (precompute_ref_log_probs)",
      "the same loss: one no-grad pass over the data before training, then no reference model or forward in a step", c);
  if (ref == ReferenceModel::Copy && base.peft.enabled()) {
    c.training.reference_model = "adapter_disabled";
    add(G::SameJob, 0, "reference_adapter_disabled", "The policy with its adapters off as the reference",
        "the same reference (the frozen base): TRL's default under PEFT, no second model", c);
  }
}

// PPO's value model (ppo_step.cpp): under PEFT, the policy's adapters on it too (ms-swift's preparation) instead of
// training it in full, which drops its gradients and optimizer states to the adapters'.
void ppo_changes(const Config& base, Adder& add) {
  const auto& t = base.training;
  if (!base.peft.enabled() || t.value_model == "peft") return;
  Config c = base;
  c.training.value_model = "peft";
  add(G::ChangesJob, 0, "ppo_value_model_peft", "The policy's PEFT method on the value model too (training.value_model peft)",
      "the value model trains adapters only, as ms-swift prepares it: its full gradients and optimizer states go", c);
}

// GRPO's rollouts (rollout.h): beta = 0 drops the reference; fewer completions per prompt; a colocated engine can claim
// less of the GPU, sleep while the policy trains, or move to GPUs of its own; generate's KV cache can give way to vLLM's.
void rollout_changes(const Config& base, const Resolved& rs, Adder& add) {
  const RolloutFlow& r = rs.rollout;
  if (!r.active) return;
  if (r.ppo) return ppo_changes(base, add);
  const auto& t = base.training;
  const ReferenceModel ref = rs.preference.reference;
  if (ref == ReferenceModel::Copy || ref == ReferenceModel::AdapterDisabled) {
    Config c = base;
    c.training.reference_model = "none";
    add(G::ChangesJob, 0, "grpo_beta_zero", "beta = 0: no reference model",
        "no KL penalty (TRL's default from 0.19): no reference forward and, for a copy, no second model", c);
  }
  // Liger's GRPO loss (TRL 0.17+; rollout.h RolloutFlow::liger): configs it cannot take fail validation and drop out.
  if (t.loss != "fused_linear" && stack_versions(base.versions).at_least(Library::Trl, Version{0, 17, 0})) {
    Config c = base;
    c.training.loss = "fused_linear";
    add(G::SameJob, 0, "grpo_liger_loss", "Liger's GRPO loss (use_liger_kernel)",
        "pip install liger-kernel: the same loss one completion at a time, without the batch's logits; it holds two "
        "[vocab, hidden] weight gradients instead", c);
  }
  // Fewer completions per prompt: TRL repeats each prompt num_generations times inside the batch of completions
  // (RepeatSampler), so num_generations alone changes no tensor; halved with the micro-batch, each step sees the same
  // prompts with half the completions, and the generation batch stays divisible by num_generations.
  if (t.num_generations >= 4 && t.num_generations % 2 == 0 && t.micro_batch_size % 2 == 0) {
    Config c = base;
    c.training.num_generations = t.num_generations / 2;
    c.training.micro_batch_size = t.micro_batch_size / 2;
    add(G::ChangesJob, 0, "grpo_fewer_generations",
        "num_generations " + std::to_string(c.training.num_generations) + " (micro-batch " +
            std::to_string(c.training.micro_batch_size) + ")",
        "the same prompts per step with half the completions each: fewer samples per group, a noisier group-relative "
        "advantage", c);
  }
  if (r.engine == GenerationEngine::VllmColocate) {
    if (t.gpu_memory_utilization > 0.15) {
      Config c = base;
      c.training.gpu_memory_utilization = std::max(0.1, t.gpu_memory_utilization - 0.1);
      char fraction[16];
      std::snprintf(fraction, sizeof fraction, "%.2g", c.training.gpu_memory_utilization);
      add(G::SameJob, 1, "vllm_memory_lower", std::string("vLLM's gpu_memory_utilization ") + fraction,
          "the same generations with a smaller KV cache: fewer sequences decoded at once, slower generation", c);
    }
    if (!t.vllm_sleep && stack_versions(base.versions).at_least(Library::Trl, Version{0, 23, 0})) {
      Config c = base;
      c.training.vllm_sleep = true;
      add(G::SameJob, 1, "vllm_sleep", "vLLM sleep mode (vllm_enable_sleep_mode)",
          "the engine frees its weights and KV cache while the policy trains and reloads them to generate (TRL 0.23+)", c);
    }
  }
  // Smaller generation batches with the same completions per optimizer step (TRL 0.18+): the fewest micro-batches per
  // generation that divides the step and keeps num_generations' groups whole. Generation then runs inside the step
  // on the same weights (no optimizer step between), so the samples are those of one large generation.
  if (r.engine == GenerationEngine::HfGenerate && !r.per_micro_batch &&
      stack_versions(base.versions).at_least(Library::Trl, Version{0, 18, 0})) {
    const int64_t gas = t.gradient_accumulation_steps, now = t.steps_per_generation > 0 ? t.steps_per_generation : gas;
    const int64_t per_step = t.micro_batch_size * base.parallel.data_parallel_size;
    for (int64_t s = 1; s < now && s < gas; ++s) {
      if (gas % s != 0 || (per_step * s) % std::max<int64_t>(1, t.num_generations) != 0) continue;
      Config c = base;
      c.training.steps_per_generation = s;
      add(G::SameJob, 1, "grpo_generation_smaller",
          (s == 1 ? std::string("Generate before every micro-batch") : "Generate every " + std::to_string(s) + " micro-batches") +
              " (steps_per_generation " + std::to_string(s) + ")",
          "the same completions per optimizer step, generated in smaller batches inside the step: a smaller KV cache, slower generation", c);
      break;
    }
  }
  // An engine vLLM may refuse to start (vllm_server.h): its max_model_len cut to the longest request TRL sends (a
  // smaller KV cache check; a colocated engine takes its own from TRL 0.26), or the server's model over twice the GPUs.
  const bool colocated_own_len = r.engine == GenerationEngine::VllmColocate &&
                                 stack_versions(base.versions).at_least(Library::Trl, Version{0, 26, 0});
  if ((r.engine == GenerationEngine::VllmServer || colocated_own_len) && t.vllm_max_model_len == 0 &&
      base.model.max_position_embeddings > t.sequence_length) {
    Config c = base;
    c.training.vllm_max_model_len = t.sequence_length;
    add(G::SameJob, 0, "vllm_max_model_len", "vLLM's max_model_len " + std::to_string(t.sequence_length),
        std::string(r.engine == GenerationEngine::VllmServer ? "trl vllm-serve --max_model_len" : "vllm_max_model_length") +
            ": vLLM then needs a KV cache for one prompt and completion, not the model's whole context", c);
  }
  if (r.engine == GenerationEngine::VllmServer) {
    const int64_t tp = t.vllm_server_tensor_parallel_size;
    if (stack_versions(base.versions).at_least(Library::Trl, Version{0, 16, 0}) && base.model.num_attention_heads % (2 * tp) == 0) {
      Config c = base;
      c.training.vllm_server_tensor_parallel_size = 2 * tp;
      add(G::MoreHardware, 0, "vllm_server_tensor_parallel", "vLLM server over " + std::to_string(2 * tp) + " GPUs (tensor parallel)",
          "more GPUs: trl vllm-serve --tensor_parallel_size " + std::to_string(2 * tp) + " splits the weights and the KV cache", c);
    }
  }
  if (r.engine != GenerationEngine::VllmServer) {
    Config c = base;
    c.training.generation_engine = "vllm_server";
    // The server's own max_model_len check (vllm_server.h) set as a user would: TRL's longest request.
    if (c.training.vllm_max_model_len == 0 && base.model.max_position_embeddings > t.sequence_length)
      c.training.vllm_max_model_len = t.sequence_length;
    add(G::MoreHardware, 0, "vllm_server", "Generate on separate GPUs (trl vllm-serve)",
        "more GPUs: a vLLM server generates the completions, the training GPUs hold no engine or KV cache", c);
  }
}

// TRL's SFTTrainer metrics (sft_metrics.h): 0.15.0 all-gathers every rank's copy of the logits for the token accuracy,
// 0.15.1 gathers only the counts (trl#2890); 1.3-1.5 keep two copies at once, 1.6 none (views, trl#5897 and #5930).
void sft_metrics_changes(const Config& base, const Resolved& rs, Adder& add) {
  const SftMetrics& m = rs.sft_metrics;
  if (!m.active || !(m.gathers_copy || m.copies == 2)) return;
  Config c = base;
  c.versions.trl = m.gathers_copy ? "0.15.1" : "1.6.0";
  add(G::SameJob, 0, m.gathers_copy ? "trl_no_logits_gather" : "trl_one_logits_copy",
      m.gathers_copy ? "TRL 0.15.1 or later" : "TRL 1.6 or later",
      m.gathers_copy ? "the same training: the token accuracy is computed on each GPU and only its counts are gathered "
                       "(trl#2890), not every GPU's copy of the logits"
                     : "the same training: the entropy and the token accuracy read the logits as views (trl#5897, #5930)",
      c);
}

void kernel_and_stack_changes(const Config& base, const Resolved& rs, Adder& add) {
  const auto& t = base.training;
  preference_changes(base, rs, add);
  rollout_changes(base, rs, add);
  sft_metrics_changes(base, rs, add);
  if (t.loss != "fused_linear" && !base.model.post_layernorm && !t.preference() && !t.rollout()) {
    Config c = base;
    c.training.loss = "fused_linear";
    add(G::SameJob, 0, "loss_fused_linear", "Fused linear cross-entropy (Liger)",
        "the loss is computed in chunks without the full logits: about as fast, the same loss", c);
  }
  if (!t.compile && t.activation_checkpointing != "full") {
    Config c = base;
    c.training.compile = true;
    add(G::SameJob, 0, "compile", "torch.compile the layers",
        "compile time at start-up; Inductor recomputes the norms' fp32 copies and SwiGLU's activation in backward "
        "instead of saving them (usually faster, not slower)", c);
  }
  if (rs.attention == Attention::Eager) {
    Config c = base;
    c.training.attention = "sdpa";
    add(G::SameJob, 0, "attention_sdpa", "SDPA / FlashAttention instead of eager attention",
        "faster as well; the same attention, computed in tiles", c);
  }
  if (!rs.expandable_segments) {
    Config c = base;
    c.hardware.expandable_segments = "true";
    add(G::SameJob, 0, "expandable_segments", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        "no change to the training itself: the allocator grows one segment per stream in 20 MiB pages instead of "
        "caching whole cudaMalloc blocks (PyTorch CUDA semantics docs: it helps where fragmentation wastes memory); "
        "mapped pages are kept until empty_cache", c);
  }
  if (rs.softmax_saves_input) {
    Config c = base;
    c.training.softmax_saves_input = "false";
    add(G::SameJob, 0, "torch_1_11", "PyTorch 1.11 or newer",
        "its softmax keeps only its output for backward, not its input as well (pytorch/pytorch#66018); check the "
        "rest of the stack supports it", c);
  }
  if (!rs.zero_grad_set_to_none) {
    Config c = base;
    c.training.zero_grad_set_to_none = "true";
    add(G::SameJob, 0, "zero_grad_set_to_none", "zero_grad(set_to_none=True)",
        "the default since PyTorch 2.0: gradients are freed after the step instead of zeroed in place, so they are "
        "not held through the next forward", c);
  }
  if (rs.zero_grad_set_to_none && rs.zero_grad_before_backward) {
    Config c = base;
    c.training.zero_grad_at = "after_step";
    add(G::SameJob, 0, "zero_grad_after_step", "zero_grad() right after optimizer.step()",
        "instead of between the loss and backward (Lightning's default order): the last step's gradients are then "
        "gone before the next forward", c);
  }
  // The same job with slightly different arithmetic: the update or the forward is computed at lower precision.
  if ((t.optimizer == "adamw" || t.optimizer == "adam") && base.parallel.offload_optimizer == "none") {
    Config c = base;
    c.training.optimizer = "adamw_8bit";
    add(G::SameJobNumerics, 0, "optimizer_8bit", "8-bit AdamW (bitsandbytes)",
        "changes the numerics slightly: block-wise quantized optimizer states; usually matches 32-bit AdamW's "
        "quality (Dettmers et al. 2021)", c);
  }
  if (t.precision == "fp32") {
    // bf16 needs Ampere (sm_80) or newer; older GPUs get fp16 autocast, with its loss scaling.
    const GpuSpec* gpu = find_gpu(base.hardware.gpu);
    const bool bf16 = !gpu || gpu->compute_capability >= 80;
    Config c = base;
    c.training.precision = bf16 ? "amp_bf16" : "amp_fp16";
    if (bf16)
      add(G::SameJobNumerics, 0, "autocast_bf16", "bf16 autocast instead of fp32",
          "changes the numerics slightly: matmuls in bf16, weights and optimizer still fp32; faster on tensor cores "
          "(Ampere or newer)", c);
    else
      add(G::SameJobNumerics, 0, "autocast_fp16", "fp16 autocast instead of fp32",
          "changes the numerics slightly: matmuls in fp16 with loss scaling (torch.cuda.amp.GradScaler), as this GPU "
          "has no bf16; faster on tensor cores", c);
  }
}

// More GPUs of the same kind, the global batch kept: the states shard over more ranks where the setup shards them.
// A setup that does not shard yet gets ZeRO-3 (FSDP FULL_SHARD) with them, as more GPUs alone would not help it.
void hardware_changes(const Config& base, const Resolved& rs, Adder& add) {
  for (int64_t k : {2, 4}) {
    Config c = base;
    if (!spread_over(c, k)) continue;
    std::string extra;
    if (c.parallel.zero_stage == 0 && rs.sharding != Sharding::Megatron && c.parallel.pipeline_parallel_size == 1) {
      c.parallel.zero_stage = 3;
      extra = rs.sharding == Sharding::DeepSpeed ? " with ZeRO-3" : " with FSDP FULL_SHARD";
    }
    const int64_t gpus = c.parallel.data_parallel_size * c.parallel.tensor_parallel_size *
                         c.parallel.pipeline_parallel_size * c.parallel.context_parallel_size;
    add(G::MoreHardware, 0, "gpus_x" + count(k),
        count(gpus) + " GPUs (data parallel " + count(c.parallel.data_parallel_size) + ")" + extra,
        count(k) + "x the GPUs; micro-batch " + count(c.training.micro_batch_size) + " x accumulation " +
            count(c.training.gradient_accumulation_steps) + " keeps the global batch; gradients are reduced "
            "across the GPUs every step", c);
  }
}

// Changes that make it another job: another training method, shorter samples, a smaller model.
void job_changes(const Config& base, Adder& add) {
  const auto& t = base.training;
  if (!base.peft.enabled()) {
    Config c = base;
    c.peft.method = "lora";
    c.peft.lora_rank = 16;
    c.peft.target_modules = "all-linear";
    add(G::ChangesJob, 0, "lora", "LoRA (rank 16, all linears) instead of full fine-tuning",
        "a different method: trains 0.1-1% of the parameters, often somewhat below full fine-tuning's quality", c);
  }
  if ((!base.peft.enabled() || base.peft.lora_like()) && base.peft.base_quantization == "none") {
    Config c = base;
    if (!c.peft.enabled()) {
      c.peft.method = "lora";
      c.peft.lora_rank = 16;
      c.peft.target_modules = "all-linear";
    }
    c.peft.base_quantization = "nf4";
    c.peft.double_quantization = true;
    if (c.training.precision == "fp32") c.training.precision = "bf16_pure";
    add(G::ChangesJob, 0, "qlora", base.peft.enabled() ? "QLoRA: a 4-bit NF4 base under the same adapters"
                                                       : "QLoRA (4-bit NF4 base, LoRA rank 16)",
        "a different method: 4-bit weights cost some quality and dequantization time (Dettmers et al. 2023)", c);
  }
  if (t.sequence_length >= 512) {
    Config c = base;
    c.training.sequence_length = t.sequence_length / 2;
    add(G::ChangesJob, 0, "sequence_half", "Sequence length " + count(c.training.sequence_length),
        "a different job: samples longer than this are cut or split, and the model sees less context", c);
  }
  // A native-resolution tower (Qwen2-VL's, whose program takes max_pixels): half each image's resized area as the
  // processor's budget (ms-swift's MAX_PIXELS, LLaMA-Factory's image_max_pixels), which about halves its tokens; the
  // samples are that much shorter (their text is the same), where the data has one fixed length.
  if (!base.model.vision_tower.empty() && base.data.images_per_sample > 0 && !base.data.varies()) {
    std::shared_ptr<const Architecture> plain, now_tower;
    decode_architecture(base.model.vision_tower, "", plain);
    decode_architecture(base.model.vision_tower, base.model.vision_tower_args, now_tower);
    double fallback = -1;
    if (plain)
      for (const auto& [name, value] : plain->defaults)
        if (name == "max_pixels") fallback = value;
    if (now_tower && fallback > 0) {
      const double area = architecture_value(*now_tower, "resized_height") * architecture_value(*now_tower, "resized_width");
      const double budget = std::floor(area / 2);
      // smart_resize keeps at least one factor x factor cell (28 x 28: one image token) and min_pixels.
      const double cell = architecture_value(*now_tower, "factor") * architecture_value(*now_tower, "factor");
      if (budget >= architecture_value(*now_tower, "min_pixels") && budget >= cell) {
        Config c = base;
        c.model.vision_tower_args = set_architecture_arg(base.model.vision_tower_args, "max_pixels", budget, fallback);
        const int64_t before = vision_image_tokens(base.model), after = vision_image_tokens(c.model);
        c.training.sequence_length -= base.data.images_per_sample * (before - after);
        if (after < before)
          add(G::ChangesJob, 0, "max_pixels_half",
              "max_pixels " + count(static_cast<int64_t>(budget)) + ": each image " + count(after) + " tokens instead of " + count(before) +
                  " (sequence length " + count(c.training.sequence_length) + ")",
              "a different job: the processor downscales the images further, and fine detail is lost", c);
      }
    }
  }
  // The largest model of the same catalogue family with at most three quarters of the parameters, whose positions
  // hold the sequence.
  const ModelPreset* now = nullptr;
  for (const auto& p : model_presets())
    if (p.model == base.model) now = &p;
  if (now && now->params_expected > 0) {
    const ModelPreset* best = nullptr;
    for (const auto& p : model_presets())
      if (p.supported && p.family == now->family && p.params_expected > 0 && p.params_expected * 4 <= now->params_expected * 3 &&
          p.model.max_position_embeddings >= t.sequence_length && (!best || p.params_expected > best->params_expected))
        best = &p;
    if (best) {
      Config c = base;
      c.model = best->model;
      add(G::ChangesJob, 0, "smaller_model", "A smaller model: " + best->name,
          "a different model, with less capacity than " + now->name, c);
    }
  }
}

}  // namespace

// A model program's frozen modules (a diffusion model's VAE and text encoders) whose outputs the scripts can cache
// before training (diffusers' --cache_latents, precomputed embeddings), and training.ema kept off the GPU.
void program_changes(const Config& base, Adder& add) {
  const auto& t = base.training;
  if (t.ema == "gpu" || t.ema == "gpu_foreach") {
    Config c = base;
    c.training.ema = "cpu";
    add(G::SameJob, 1, "ema_cpu", "EMA copy in host memory (--offload_ema)",
        "the same training; the copy moves to the GPU for each update and back, a transfer of the whole copy per step", c);
  }
  if (t.ema == "gpu_foreach") {
    Config c = base;
    c.training.ema = "gpu";
    add(G::SameJob, 0, "ema_per_parameter", "EMA updated one parameter at a time (no --foreach_ema)",
        "the same training; the update loops over the parameters, a little slower", c);
  }
  if (base.model.architecture.empty()) return;
  std::shared_ptr<const Architecture> a;
  if (!decode_architecture(base.model.architecture, base.model.architecture_args, a).empty() || !a) return;
  for (const auto& f : a->frozen_modules) {
    if (f.when.empty()) continue;
    double fallback = 1;
    for (const auto& [k, v] : a->defaults)
      if (k == f.when) fallback = v;
    Config c = base;
    c.model.architecture_args = set_architecture_arg(base.model.architecture_args, f.when, 0, fallback);
    const bool vae = f.name.find("vae") != std::string::npos;
    add(G::SameJob, 0, "frozen_off_" + f.name, std::string(vae ? "Cache the latents" : "Precompute the text embeddings") + " (" + f.name + " off the GPU)",
        std::string("the same training on ") + (vae ? "latents" : "embeddings") + " made once before it (diffusers' " +
            (vae ? "--cache_latents" : "precomputed embeddings") + "): the " + f.name +
            " leaves the GPU; " + (vae ? "a random crop or flip no longer varies per epoch" : "captions no longer vary per step (caption dropout, shuffled tags)") +
            ", and the cache needs host memory or disk", c);
  }
}

std::vector<Suggestion> suggestion_candidates(const Config& base, bool same_job_only) {
  std::vector<Suggestion> out;
  Adder add{out, same_job_only};
  const Resolved rs = resolve(base);
  activation_changes(base, rs, add);
  evaluation_changes(base, add);
  sharding_changes(base, rs, add);
  layout_changes(base, rs, add);
  kernel_and_stack_changes(base, rs, add);
  program_changes(base, add);
  if (!same_job_only) {
    hardware_changes(base, rs, add);
    job_changes(base, add);
  }
  return out;
}

std::vector<Suggestion> suggestion_candidates(const Config& base) { return suggestion_candidates(base, false); }

}  // namespace memsim
