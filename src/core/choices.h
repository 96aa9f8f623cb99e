// The allowed strings of every choice field, "auto" first where it applies. The field registry (fields.cpp) names
// each field's list; frameworks.cpp pairs the lists it resolves with their enums, in the same order.
#pragma once
#include <string_view>

namespace memsim::choice {

inline constexpr std::string_view kAttention[] = {"auto", "sdpa", "sdpa_repeat_kv", "flash_attention_2", "eager", "sdpa_math"};
inline constexpr std::string_view kNorm[] = {"auto", "eager_fp32", "fp32_scale", "fused"};
inline constexpr std::string_view kLoss[] = {"auto",           "hf_fp32_upcast",    "hf_shift_fp32",   "hf_fp32_logits",
                                             "hf_shift",       "full_fp32",         "chunked_fp32",    "chunked_bf16",
                                             "fused_linear",   "unsloth_logits",    "cut_cross_entropy", "unsloth_fused_ce",
                                             "vocab_chunked"};
inline constexpr std::string_view kOptImpl[] = {"auto", "foreach", "fused", "for_loop"};
inline constexpr std::string_view kCheckpointing[] = {"none", "full", "selective", "selective_op", "every_k"};
inline constexpr std::string_view kFrameworkIds[] = {"hf_trainer", "hf_loop",    "deepspeed", "torchtune",
                                                     "litgpt",     "megatron",   "torchtitan", "unsloth",
                                                     "prime_rl"};
inline constexpr std::string_view kSharding[] = {"auto", "deepspeed", "fsdp1", "fsdp2", "megatron"};
inline constexpr std::string_view kBackwardPrefetch[] = {"backward_pre", "backward_post", "none"};
inline constexpr std::string_view kSchedules[] = {"1f1b", "interleaved_1f1b", "gpipe"};
inline constexpr std::string_view kOffload[] = {"none", "cpu", "nvme"};
inline constexpr std::string_view kModuleLoading[] = {"auto", "lazy", "eager"};
inline constexpr std::string_view kTriState[] = {"auto", "true", "false"};
inline constexpr std::string_view kEma[] = {"none", "gpu", "gpu_foreach", "cpu"};
inline constexpr std::string_view kZeroGradAt[] = {"after_step", "before_backward"};
inline constexpr std::string_view kAdapterDtype[] = {"auto", "fp32", "bf16", "fp16"};
inline constexpr std::string_view kObjective[] = {"sft", "dpo", "orpo", "simpo", "grpo", "kto", "ppo"};
inline constexpr std::string_view kGenerationEngine[] = {"hf_generate", "vllm_colocate", "vllm_server"};
inline constexpr std::string_view kRewardModel[] = {"none", "same_as_policy"};
inline constexpr std::string_view kValueModel[] = {"full", "peft"};
inline constexpr std::string_view kReferenceModel[] = {"auto", "copy", "adapter_disabled", "precomputed", "none"};
inline constexpr std::string_view kCpRotate[] = {"auto", "allgather", "alltoall"};
// transformers' activations.py ACT2CLS keys: model.hidden_act names one of them (T5's feed_forward_proj "gated-X"
// names X). memsim's costs tell apart only gelu_new (eager, T5) and relu (saves its output); the rest save their input.
inline constexpr std::string_view kActivations[] = {"gelu",        "gelu_10",           "gelu_accurate", "gelu_fast",
                                                    "gelu_new",    "gelu_python",       "gelu_pytorch_tanh", "laplace",
                                                    "leaky_relu",  "linear",            "mish",          "prelu",
                                                    "quick_gelu",  "relu",              "relu2",         "relu6",
                                                    "sigmoid",     "silu",              "swish",         "tanh",
                                                    "xielu"};
// PEFT's methods (config.h PeftConfig); prefix_tuning is a known name that validate.cpp refuses with its reason.
inline constexpr std::string_view kPeftMethod[] = {"none", "lora", "dora", "ia3", "ln_tuning", "prompt_tuning", "prefix_tuning", "adapter", "adapter_v2", "adaption_prompt"};
inline constexpr std::string_view kBaseQuantization[] = {"none", "int8", "nf4", "fp4", "gptq", "awq"};
inline constexpr std::string_view kTaskHead[] = {"causal_lm", "sequence_classification"};
inline constexpr std::string_view kLengths[] = {"fixed", "micro_batches", "samples"};
inline constexpr std::string_view kPadding[] = {"longest", "max_length", "none"};
// config.h NormType and PositionType, in their enums' order.
inline constexpr std::string_view kNormType[] = {"rmsnorm", "layernorm"};
inline constexpr std::string_view kPositionType[] = {"rope", "absolute"};

}  // namespace memsim::choice
