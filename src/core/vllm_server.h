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
  bool active = false;              // grpo with generation_engine vllm_server
  int64_t tensor_parallel = 1;      // vllm-serve --tensor_parallel_size
  int64_t data_parallel = 1;        // vllm-serve --data_parallel_size (TRL 0.17+): engines, each on its own GPUs
  int64_t requested_bytes = 0;      // total memory x gpu_memory_utilization, per GPU
  int64_t weights_bytes = 0;        // the checkpoint in 16 bits, this GPU's tensor-parallel share
  std::vector<int64_t> layer_weight_bytes;  // per layer, then the embeddings and head (for the replay's tensors)
  int64_t kv_token_bytes = 0;       // one token's keys and values over every layer, on one GPU
  int64_t kv_blocks = 0;            // blocks of kBlockTokens tokens the KV cache holds
  int64_t kv_layer_bytes = 0;       // one layer's KV tensor (kv_blocks x the layer's page)
  int64_t max_model_len = 0;        // --max_model_len, or the model's positions
  int64_t needed_kv_bytes = 0;      // the KV cache one max_model_len request needs (vLLM's start check)
  bool checks_free_memory = false;  // vLLM >= 0.9.1 refuses a requested share above the GPU's free memory
  std::string failure;              // why vLLM would not start, and what to change; empty when it does
  std::string refusal;              // the same in a few words, for the verdict line
  std::string role;                 // "vLLM server (trl vllm-serve, ...)"
  std::string note;                 // what the device holds, for the result's notes
};

// vLLM's KV block: CacheConfig.block_size defaults to 16 tokens on CUDA.
constexpr int64_t kVllmBlockTokens = 16;

// `capacity_bytes` is the GPU's memory, `context_bytes` what its CUDA context takes before the engine starts.
VllmServerPlan plan_vllm_server(const Config& c, int64_t capacity_bytes, int64_t context_bytes);
// The server GPU's allocations as vLLM makes them: the weights, then the KV cache, one tensor per layer.
StepProgram vllm_server_program(const VllmServerPlan& p);

}  // namespace memsim
