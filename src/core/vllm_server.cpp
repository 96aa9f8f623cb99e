// The vLLM server's GPUs (vllm_server.h). Sources, docs/research/grpo.md "vLLM server GPUs": TRL's
// trl/scripts/vllm_serve.py (ScriptArguments: tensor_parallel_size 1, data_parallel_size 1 from v0.17,
// gpu_memory_utilization 0.9, dtype auto, max_model_len None; v0.16.0:184-258, v1.9.0:229-355) and GRPOTrainer v0.15's
// LLM(device=vllm_device, gpu_memory_utilization=0.9); vLLM's v1/worker/gpu_worker.py (v0.9.1:135-148 requested
// memory and the free-memory check; v0.10.1:222-280 determine_available_memory), v1/core/kv_cache_utils.py
// (v0.10.1:661-705 check_enough_kv_cache_memory; get_num_blocks), v1/kv_cache_interface.py (page sizes,
// FullAttentionSpec.max_memory_usage_bytes at v0.10.1:86-88), config.py (get_num_kv_heads, the 16-bit dtype of
// "auto") and model_executor/layers/vocab_parallel_embedding.py (vocabularies padded to a multiple of 64).
#include "vllm_server.h"

#include <algorithm>
#include <cmath>

#include "architecture.h"
#include "checked.h"
#include "format.h"
#include "model.h"
#include "versions.h"

namespace memsim {

namespace {

constexpr int64_t kVocabPadding = 64;  // DEFAULT_VOCAB_PADDING_SIZE

// The model on one of `tp` GPUs as vLLM shards it: VocabParallelEmbedding and ParallelLMHead pad the vocabulary to a
// multiple of 64 and split it; the column- and row-parallel linears split as Megatron's do (apply_tensor_parallel:
// q, k and v, with key/value heads replicated below one per GPU, gate/up, o/down, MLA's q_b and kv_b), while norms,
// MLA's q_a and kv_a projections (ReplicatedLinear) and the MoE router stay whole on every GPU.
ModelShape engine_shard(const ModelConfig& m, int64_t tp) {
  ModelShape shape = model_shape_of(m);
  for (auto* list : {&shape.pre, &shape.post})
    for (auto& p : *list) {
      const std::string mod = module_name(p.name);
      if ((mod == "embed_tokens" || mod == "lm_head") && p.kind != ParamKind::Bias && p.rows > 0) {
        const int64_t padded = ceil_div(p.rows, kVocabPadding) * kVocabPadding;
        p.numel = mul(p.numel / p.rows, padded);
        p.rows = padded;
      }
    }
  apply_tensor_parallel(shape, m, tp);
  return shape;
}

// 16-bit bytes of parameters; TRL syncs merged weights, so the engine holds no adapters.
int64_t engine_bytes_of(const std::vector<ParamTensor>& ts) {
  int64_t bytes = 0;
  for (const auto& p : ts)
    if (p.kind != ParamKind::Adapter) bytes = add(bytes, mul(2, p.numel));
  return bytes;
}

}  // namespace

int64_t vllm_max_model_len(const Config& c) {
  const auto& t = c.training;
  if (t.vllm_max_model_len > 0) return t.vllm_max_model_len;
  // GRPOTrainer's colocated LLM(...): max_model_len = max_prompt_length + max_completion_length up to v0.25
  // (v0.18.0:T:654, v0.25.0:T:594-604), args.vllm_max_model_length (None: vLLM derives it) from v0.26 (T:667).
  if (t.engine() == GenerationEngine::VllmColocate && stack_versions(c.versions).below(Library::Trl, Version{0, 26, 0}))
    return t.sequence_length;
  return c.model.max_position_embeddings;
}

VllmKvCache vllm_kv_cache(const Config& c, int64_t tensor_parallel) {
  // One token of one layer: keys and values of this GPU's heads (get_num_kv_heads: max(1, heads // tp)), 16-bit;
  // multi-head latent attention keeps one compressed latent and its rotary part, whole on every GPU (MLAAttentionSpec).
  const auto& m = c.model;
  const int64_t per_layer_token =
      m.kv_lora_rank > 0 ? mul(2, m.kv_lora_rank + m.qk_rope_head_dim)
                         : mul(mul(2, 2), mul(std::max<int64_t>(1, m.num_key_value_heads / tensor_parallel), effective_head_dim(m)));
  VllmKvCache k;
  k.page_bytes = mul(per_layer_token, kVllmBlockTokens);
  k.layers = m.num_hidden_layers;
  k.max_model_len = vllm_max_model_len(c);
  k.needed_bytes = mul(mul(ceil_div(k.max_model_len, kVllmBlockTokens), k.page_bytes), k.layers);
  return k;
}

namespace {

// vLLM's two KV-cache start checks (check_enough_kv_cache_memory, kv_cache_utils.py:661-705 at v0.10.1) for `available`
// bytes: "No available memory for the cache blocks" only where nothing is left, else one max_model_len request must
// fit in whole blocks (get_num_blocks: available // page_size // num_layers). Returns the refusal in a few words, ""
// where vLLM starts; `cache_bytes` gets the KV cache the share holds.
std::string kv_cache_refusal(const VllmKvCache& kv, int64_t available, int64_t& cache_bytes) {
  cache_bytes = available > 0 ? mul(available / kv.page_bytes / kv.layers, mul(kv.page_bytes, kv.layers)) : 0;
  if (available <= 0) return "vLLM would not start: its weights leave no KV cache in its share";
  if (kv.needed_bytes > cache_bytes)
    return "vLLM would not start: its KV cache cannot hold one " + format_count(kv.max_model_len) +
           "-token request (max_model_len)";
  return "";
}

}  // namespace

int64_t vllm_weight_bytes(const ModelConfig& m, int64_t tensor_parallel) {
  const ModelShape shape = engine_shard(m, tensor_parallel);
  int64_t bytes = add(engine_bytes_of(shape.pre), engine_bytes_of(shape.post));
  for (int64_t l = 0; l < shape.num_layers; ++l) bytes = add(bytes, engine_bytes_of(shape.params_of(l)));
  return bytes;
}

VllmRefusal colocated_vllm_refusal(const Config& c, int64_t engine_total_bytes, int64_t engine_weights_bytes) {
  VllmRefusal r;
  const VllmKvCache kv = vllm_kv_cache(c, 1);
  const int64_t available = engine_total_bytes - engine_weights_bytes;
  int64_t cache = 0;
  r.refusal = kv_cache_refusal(kv, available, cache);
  if (r.refusal.empty()) return r;
  if (available <= 0) {
    r.note = "training.gpu_memory_utilization: the colocated vLLM engine's share, " + format_bytes(engine_total_bytes) +
             ", does not hold its bf16 weights (" + format_bytes(engine_weights_bytes) +
             "): vLLM would refuse to start with no memory left for the KV cache; raise it";
  } else {
    const bool own = c.training.vllm_max_model_len > 0;
    r.note = "training.generation_engine vllm_colocate: vLLM refuses to start: one request of max_model_len " +
             std::to_string(kv.max_model_len) + " tokens" +
             (own ? std::string() : " (" + describe_version(stack_versions(c.versions), Library::Trl) +
                                        " passes vllm_max_model_length None, so vLLM takes the model's positions)") +
             " needs " + format_bytes(kv.needed_bytes) + " of KV cache and the engine's share leaves " +
             format_bytes(cache) + ": set training.vllm_max_model_len (vllm_max_model_length) to the prompt and "
             "completion's " + std::to_string(c.training.sequence_length) + " tokens, or raise training.gpu_memory_utilization";
  }
  return r;
}

VllmServerPlan plan_vllm_server(const Config& c, int64_t capacity_bytes, int64_t context_bytes) {
  VllmServerPlan p;
  const auto& t = c.training;
  if (!t.rollout() || t.engine() != GenerationEngine::VllmServer) return p;
  const StackVersions v = stack_versions(c.versions);
  p.tensor_parallel = t.vllm_server_tensor_parallel_size;
  p.data_parallel = t.vllm_server_data_parallel_size;
  const int64_t tp = p.tensor_parallel;
  // requested_memory = total_memory x gpu_memory_utilization (gpu_worker.py:135-137 at v0.9.1).
  const int64_t requested = static_cast<int64_t>(static_cast<double>(capacity_bytes) * t.vllm_server_gpu_memory_utilization);
  const ModelShape shape = engine_shard(c.model, tp);
  for (int64_t l = 0; l < shape.num_layers; ++l) p.layer_weight_bytes.push_back(engine_bytes_of(shape.params_of(l)));
  p.layer_weight_bytes.push_back(add(engine_bytes_of(shape.pre), engine_bytes_of(shape.post)));
  for (int64_t b : p.layer_weight_bytes) p.weights_bytes = add(p.weights_bytes, b);
  const VllmKvCache kv = vllm_kv_cache(c, tp);
  // From vLLM 0.9.1, available_kv_cache_memory = requested - non_kv_cache_memory (determine_available_memory), where
  // the non-torch memory counts from the start-up snapshot, after the CUDA context; the V1 worker of 0.8.0-0.9.0 took
  // total x util less the peak with every non-torch allocation, the context included (gpu_worker.py:178-210 at
  // v0.8.5); V0 before 0.8 measured from a baseline taken after the context (worker.py:161, 233-235 at v0.7.2), as
  // rollout.cpp's engine_budget_whole_process does. memsim counts the weights and that context, not the profile run's
  // activation peak, so the KV cache comes out larger than vLLM's by it.
  const bool checks_free_memory = v.at_least(Library::Vllm, Version{0, 9, 1});
  const bool context_counted = v.at_least(Library::Vllm, Version{0, 8, 0}) && !checks_free_memory;
  const int64_t available = requested - p.weights_bytes - (context_counted ? context_bytes : 0);
  int64_t cache = 0;
  const std::string kv_refusal = kv_cache_refusal(kv, available, cache);
  p.kv_layer_bytes = cache / kv.layers;
  const double util = t.vllm_server_gpu_memory_utilization;
  const std::string share = format_bytes(requested) + " (gpu_memory_utilization " +
                            std::to_string(static_cast<int>(std::lround(util * 100))) + "%)";
  if (checks_free_memory && requested > capacity_bytes - context_bytes) {
    p.refusal = "vLLM would not start: its share is more than the GPU's free memory";
    p.failure = "vLLM refuses to start: its requested share, " + share + ", is more than the GPU's free memory (" +
                format_bytes(capacity_bytes - context_bytes) + " after the CUDA context): lower "
                "training.vllm_server_gpu_memory_utilization";
  } else if (available <= 0) {
    p.refusal = kv_refusal;
    p.failure = "vLLM refuses to start: its weights (" + format_bytes(p.weights_bytes) + " per GPU) leave none of its share, " +
                share + ", for the KV cache (\"No available memory for the cache blocks\"): raise "
                "training.vllm_server_tensor_parallel_size or the share";
  } else if (!kv_refusal.empty()) {
    p.refusal = kv_refusal;
    p.failure = "vLLM refuses to start: one request of max_model_len " + std::to_string(kv.max_model_len) + " tokens needs " +
                format_bytes(kv.needed_bytes) + " of KV cache per GPU and the share leaves " + format_bytes(cache) +
                ": set training.vllm_max_model_len (trl vllm-serve --max_model_len) to the prompt and completion's " +
                std::to_string(t.sequence_length) + " tokens, or raise the tensor parallel size or the share";
  }
  const bool trl15 = v.below(Library::Trl, Version{0, 16, 0});
  p.role = trl15 ? std::string("vLLM engine (vllm_device: a GPU of its own)")
                 : "vLLM server (trl vllm-serve, tensor parallel " + std::to_string(tp) +
                       (p.data_parallel > 1 ? " x data parallel " + std::to_string(p.data_parallel) : std::string()) + ")";
  const int64_t kv_tokens = mul(cache / kv.page_bytes / kv.layers, kVllmBlockTokens);
  const int64_t gpus = mul(tp, p.data_parallel);
  p.note = "training.generation_engine vllm_server: the engine runs on " + std::to_string(gpus) + " more GPU" +
           (gpus > 1 ? "s" : "") + " of hardware.gpu's kind (" + p.role + "), each claiming " + share + ": " +
           format_bytes(p.weights_bytes) + " of 16-bit weights and a KV cache of " + format_count(kv_tokens) +
           " tokens (room for " + format_count(kv_tokens / std::max<int64_t>(1, t.sequence_length)) + " sequences of " +
           format_count(t.sequence_length) + " tokens; max_model_len " + format_count(kv.max_model_len) +
           "). Not modelled: the profile run's activation peak and the non-torch memory, which vLLM takes out of the KV "
           "cache; outside the share, the CUDA graphs captured after it and each weight sync's full parameter "
           "(update_named_param); checkpoints stored in fewer than 16 bits (FP8) are counted in 16";
  return p;
}

StepProgram vllm_server_program(const VllmServerPlan& p) {
  StepProgram prog;
  prog.phase("vLLM loads the weights");
  const uint32_t weights = prog.label("vLLM engine weights (16-bit, this GPU's tensor-parallel share)");
  const int64_t layers = static_cast<int64_t>(p.layer_weight_bytes.size()) - 1;
  for (int64_t l = 0; l <= layers; ++l)
    prog.alloc(Component::Weights, p.layer_weight_bytes[static_cast<size_t>(l)], weights,
               l < layers ? static_cast<int32_t>(l) : -1);
  if (p.kv_layer_bytes == 0) return prog;
  // initialize_kv_cache: one int8 tensor of whole pages per attention layer (_allocate_kv_cache_tensors).
  prog.phase("vLLM allocates its KV cache");
  const uint32_t kv = prog.label("vLLM KV cache (the share less the weights)");
  for (int64_t l = 0; l < layers; ++l) prog.alloc(Component::Generation, p.kv_layer_bytes, kv, static_cast<int32_t>(l));
  return prog;
}

}  // namespace memsim
