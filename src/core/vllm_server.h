// The GPUs of a vLLM server that generates GRPO's completions on GPUs of their own (training.generation_engine
// vllm_server: `trl vllm-serve` from TRL 0.16, the in-process engine on its own vllm_device in TRL 0.15). They are a
// device role of their own in the result: what the engine claims there (gpu_memory_utilization of the GPU), its
// weights, its KV cache, and whether vLLM starts at all. Sources: docs/research/grpo.md "vLLM server GPUs"
// (trl/scripts/vllm_serve.py; vllm/v1/worker/gpu_worker.py, vllm/v1/core/kv_cache_utils.py,
// vllm/v1/kv_cache_interface.py at the tags named there).
#pragma once
#include <cstdint>
#include <string>

#include "config.h"
#include "step.h"

namespace memsim {

struct VllmServerPlan {
  int64_t tensor_parallel = 1;      // vllm-serve --tensor_parallel_size
  int64_t data_parallel = 1;        // vllm-serve --data_parallel_size (TRL 0.17+): engines, each on its own GPUs
  int64_t weights_bytes = 0;        // the checkpoint in 16 bits, this GPU's tensor-parallel share
  std::vector<int64_t> layer_weight_bytes;  // per layer, then the embeddings and head (for the replay's tensors)
  int64_t kv_layer_bytes = 0;       // one layer's KV tensor: whole blocks of kVllmBlockTokens tokens (0: none)
  std::string failure;              // why vLLM would not start, and what to change; empty when it does
  std::string refusal;              // the same in a few words, for the verdict line
  std::string role;                 // "vLLM server (trl vllm-serve, ...)"
  std::string note;                 // what the device holds, for the result's notes
};

// vLLM's KV block: CacheConfig.block_size defaults to 16 tokens on CUDA.
constexpr int64_t kVllmBlockTokens = 16;

// vLLM's KV cache on one GPU of an engine: a page (kVllmBlockTokens tokens of one layer's keys and values), the
// layers, and the engine's max_model_len with the KV cache one such request needs (vLLM's start check).
struct VllmKvCache {
  int64_t page_bytes = 0;
  int64_t layers = 0;
  int64_t max_model_len = 0;
  int64_t needed_bytes = 0;
};
VllmKvCache vllm_kv_cache(const Config& c, int64_t tensor_parallel);
// The engine's max_model_len: training.vllm_max_model_len where set, else what TRL passes: the model's positions
// (vLLM's default) for the server and, from TRL 0.26 (vllm_max_model_length None), for a colocated engine; a prompt
// and its completion (training.sequence_length) for a colocated engine before 0.26.
int64_t vllm_max_model_len(const Config& c);
// A colocated engine (vllm_colocate) that vLLM would not start, given the share `engine_total_bytes` of which
// `engine_weights_bytes` are its weights: the refusal in a few words and the note with what to change; both empty
// when it starts.
struct VllmRefusal {
  std::string refusal;
  std::string note;
};
VllmRefusal colocated_vllm_refusal(const Config& c, int64_t engine_total_bytes, int64_t engine_weights_bytes);

// The 16-bit weights an engine holds on one of `tensor_parallel` GPUs (a colocated engine: 1), as vLLM shards them.
int64_t vllm_weight_bytes(const ModelConfig& m, int64_t tensor_parallel);

// `capacity_bytes` is the GPU's memory, `context_bytes` what its CUDA context takes before the engine starts.
VllmServerPlan plan_vllm_server(const Config& c, int64_t capacity_bytes, int64_t context_bytes);
// The server GPU's allocations as vLLM makes them: the weights, then the KV cache, one tensor per layer.
StepProgram vllm_server_program(const VllmServerPlan& p);

}  // namespace memsim
