// A seeded generator of valid-looking configs over every engine, shared by the property tests.
#pragma once
#include <random>
#include <string>
#include <vector>

#include "core/frameworks.h"
#include "core/serialize.h"
#include "core/tables.h"

namespace memsim_test {

using namespace memsim;

// Any source of 64-bit draws: a seeded std::mt19937_64, or rapidcheck's shrinkable tape (tests/property/), whose
// draws shrink towards 0 and so towards each list's first choice.
template <typename Rng, typename T>
const T& pick(Rng& rng, const std::vector<T>& v) {
  return v[rng() % v.size()];
}

template <typename Rng>
Config random_config(Rng& rng) {
  Config c;
  auto& m = c.model;
  const std::vector<int64_t> heads = {1, 2, 4, 8, 16};
  m.num_attention_heads = pick(rng, heads);
  std::vector<int64_t> kv;
  for (int64_t g : heads)
    if (m.num_attention_heads % g == 0) kv.push_back(g);
  m.num_key_value_heads = pick(rng, kv);
  m.head_dim = pick(rng, std::vector<int64_t>{0, 16, 32, 64});
  m.hidden_size = m.num_attention_heads * pick(rng, std::vector<int64_t>{16, 32, 64, 96});
  m.num_hidden_layers = 1 + static_cast<int64_t>(rng() % 6);
  m.intermediate_size = 64 * (1 + static_cast<int64_t>(rng() % 32));
  m.vocab_size = 100 + static_cast<int64_t>(rng() % 5000);
  m.tie_word_embeddings = rng() % 2;
  m.norm_type = rng() % 2 ? NormType::RMSNorm : NormType::LayerNorm;
  m.mlp_gated = rng() % 2;
  m.attention_bias = rng() % 4 == 0;
  m.attention_dropout = rng() % 4 == 0 ? 0.1 : 0.0;
  m.hidden_dropout = rng() % 4 == 0 ? 0.1 : 0.0;
  if (rng() % 5 == 0) {
    m.num_experts = 2 + static_cast<int64_t>(rng() % 6);
    m.num_experts_per_tok = 1 + static_cast<int64_t>(rng() % m.num_experts);
    m.first_k_dense_replace = static_cast<int64_t>(rng() % 2);
  }
  auto& t = c.training;
  t.micro_batch_size = 1 + static_cast<int64_t>(rng() % 4);
  t.sequence_length = 16 * (1 + static_cast<int64_t>(rng() % 32));
  t.gradient_accumulation_steps = 1 + static_cast<int64_t>(rng() % 4);
  std::vector<std::string> ids;
  for (const auto& f : frameworks()) ids.emplace_back(f.id);
  t.framework = pick(rng, ids);
  ids.clear();
  for (const auto& p : precision_recipes())
    if (!p.autocast_16bit) ids.emplace_back(p.id);  // (16-bit weights under autocast: model programs only)
  t.precision = pick(rng, ids);
  ids.clear();
  for (const auto& o : optimizers()) ids.emplace_back(o.id);
  t.optimizer = pick(rng, ids);
  for (auto* field : {"training.attention", "training.norm_impl", "training.loss", "training.optimizer_impl",
                      "training.activation_checkpointing"}) {
    auto choices_of = choices(field);
    std::string v(choices_of[rng() % choices_of.size()]);
    apply_setting(c, std::string(field) + "=" + v);
  }
  t.activation_offload = rng() % 6 == 0;
  t.compile = rng() % 4 == 0;
  c.parallel.data_parallel_size = pick(rng, std::vector<int64_t>{1, 2, 8, 64});
  c.parallel.zero_stage = static_cast<int64_t>(rng() % 4);
  if (rng() % 4 == 0 && m.num_experts == 0) {
    c.parallel.pipeline_parallel_size = 1 + static_cast<int64_t>(rng() % m.num_hidden_layers);
    c.parallel.zero_stage = std::min<int64_t>(c.parallel.zero_stage, 1);
  }
  if (rng() % 4 == 0) {
    c.peft.method = pick(rng, std::vector<std::string>{"lora", "dora", "ia3", "ln_tuning", "prompt_tuning"});
    c.peft.lora_rank = 1 + static_cast<int64_t>(rng() % 8);
    c.peft.target_modules = pick(rng, std::vector<std::string>{"q_proj,v_proj", "all-linear", "o_proj,down_proj"});
    if (c.peft.method == "ia3") c.peft.feedforward_modules = rng() % 2 ? "down_proj" : "";
    if (c.peft.method == "ln_tuning")
      c.peft.target_modules = pick(rng, std::vector<std::string>{"input_layernorm,post_attention_layernorm,norm", "norm"});
    c.peft.num_virtual_tokens = 1 + static_cast<int64_t>(rng() % 32);
    c.peft.base_quantization = pick(rng, std::vector<std::string>{"none", "int8", "nf4"});
    c.peft.lora_dropout = rng() % 2 ? 0.05 : 0.0;
  }
  // The distributed layout: the sharding engine, context and expert parallelism, interleaving, offload.
  auto& p = c.parallel;
  p.sharding = pick(rng, std::vector<std::string>{"auto", "deepspeed", "fsdp1", "fsdp2", "megatron"});
  const Sharding engine = resolve(c).sharding;  // a stage the engine offers (FSDP has no 1, Megatron no 2 or 3)
  if ((engine == Sharding::Fsdp1 || engine == Sharding::Fsdp2) && p.zero_stage == 1) p.zero_stage = 2;
  if (engine == Sharding::Megatron && p.zero_stage >= 2) p.zero_stage = 1;
  if (rng() % 6 == 0 && t.sequence_length % 4 == 0) p.context_parallel_size = 2;
  if (m.num_experts > 0 && rng() % 3 == 0 && m.num_experts % 2 == 0) p.expert_parallel_size = 2;
  if (p.pipeline_parallel_size > 1 && rng() % 3 == 0) p.pipeline_schedule = "interleaved_1f1b";
  if (rng() % 8 == 0) p.offload_optimizer = "cpu";
  if (rng() % 8 == 0) c.hardware.host_memory_bytes = int64_t(1) << 34;
  c.hardware.gpu = pick(rng, std::vector<std::string>{"a100-80gb", "h100-sxm", "rtx-4090", "t4"});
  // A preference objective where memsim models one (validate.cpp validate_preference): drawn last, so that the
  // draws above are what they were before objectives existed.
  const bool eligible = (t.framework == "hf_trainer" || t.framework == "torchtune") && p.pipeline_parallel_size == 1 &&
                        p.tensor_parallel_size == 1 && p.context_parallel_size == 1 && !t.activation_offload &&
                        t.loss == "auto" && m.architecture.empty() && !m.is_encoder_decoder;
  if (eligible && rng() % 4 == 0) {
    t.objective = pick(rng, std::vector<std::string>{"dpo", "orpo", "simpo"});
    if (t.objective == "dpo") t.reference_model = pick(rng, std::vector<std::string>{"auto", "precomputed", "copy"});
    t.nll_alpha = rng() % 2 ? 0.0 : 1.0;
    c.versions.trl = pick(rng, std::vector<std::string>{"latest", "0.11", "0.13", "0.16", "0.20", "1.5"});
  }
  // GRPO (validate.cpp validate_rollout), drawn after the preference objectives for the same reason: every
  // completion count a step generates at once, one prompt's worth, and TRL versions on both sides of each rule.
  const int64_t completions = t.micro_batch_size * p.data_parallel_size * t.gradient_accumulation_steps;
  if (eligible && t.objective == "sft" && t.framework == "hf_trainer" && !c.data.varies() && t.sequence_length >= 2 &&
      t.sequence_length <= m.max_position_embeddings && completions >= 2 && completions <= 4096 && rng() % 6 == 0) {
    t.objective = "grpo";
    t.num_generations = completions;
    t.completion_length = std::max<int64_t>(1, t.sequence_length / 4);
    c.versions.trl = pick(rng, std::vector<std::string>{"latest", "0.17", "0.18", "0.19", "0.21", "0.25", "1.0"});
    const bool colocate_ok = c.versions.trl != "0.17";
    t.generation_engine = pick(rng, std::vector<std::string>{"hf_generate", colocate_ok ? "vllm_colocate" : "hf_generate", "vllm_server"});
    t.gpu_memory_utilization = rng() % 2 ? 0.3 : 0.6;
    t.vllm_sleep = t.generation_engine == "vllm_colocate" && (c.versions.trl == "latest" || c.versions.trl == "0.25" ||
                                                              c.versions.trl == "1.0") && rng() % 2;
    t.reference_model = pick(rng, std::vector<std::string>{"auto", "none", c.peft.enabled() ? "adapter_disabled" : "copy"});
  }
  // Later additions, drawn after everything above so that earlier draws stay what they were. KTO (validate_kto): its
  // unpaired rows need a second row in the micro-batch and padded data.
  if (eligible && t.objective == "sft" && t.framework == "hf_trainer" && t.micro_batch_size >= 2 &&
      !(c.data.varies() && c.data.padding == "none") && rng() % 8 == 0) {
    t.objective = "kto";
    c.versions.trl = pick(rng, std::vector<std::string>{"latest", "0.11", "0.16", "0.17", "1.5", "1.6", "1.8"});
    t.reference_model = pick(rng, std::vector<std::string>{"auto", "precomputed", c.peft.enabled() ? "adapter_disabled" : "copy"});
  }
  // GRPO's generation cadence: steps_per_generation (TRL 0.18+; num_generations then one micro-batch's worth so that
  // every cadence keeps its groups whole) and num_iterations.
  if (t.objective == "grpo" && rng() % 3 == 0) {
    const int64_t per_micro_batch = t.micro_batch_size * p.data_parallel_size;
    if (c.versions.trl != "0.17" && per_micro_batch >= 2 && per_micro_batch <= 4096) {
      t.num_generations = per_micro_batch;
      t.steps_per_generation = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(t.gradient_accumulation_steps + 1));
    }
    t.num_iterations = 1 + static_cast<int64_t>(rng() % 3);
  }
  // The vLLM server's own GPUs (validate_vllm_server): a tensor-parallel size that divides the heads, a smaller share,
  // and max_model_len cut to the prompt and completion.
  if (t.objective == "grpo" && t.generation_engine == "vllm_server" && rng() % 2 == 0) {
    if (m.num_attention_heads % 2 == 0) t.vllm_server_tensor_parallel_size = pick(rng, std::vector<int64_t>{1, 2});
    t.vllm_server_gpu_memory_utilization = rng() % 2 ? 0.9 : 0.5;
    if (rng() % 2) t.vllm_max_model_len = t.sequence_length;
  }
  return c;
}

}  // namespace memsim_test
