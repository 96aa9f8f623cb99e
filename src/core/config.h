// The whole input of a simulation: plain structs with defaults. The defaults are the page's opening
// scenario (a Llama-2-13B-shaped model, ZeRO-3, full checkpointing, bf16 mixed precision, micro-batch 4,
// sequence 4096, 8 x A100-80GB).
//
// The model section uses Hugging Face config.json key names, so a real config.json is valid input.
// A few structural facts that HF encodes in the model class rather than in config.json (norm type, gated
// MLP, ...) are explicit fields here; serialize.cpp fills them from `model_type` when a config omits them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace memsim {

// Choices the modelling code reads as enums: the config holds their strings (its edge: JSON, links, --set, the page),
// and the accessors below are the one place each is compared. An unknown string (refused by validate() before
// anything is simulated) reads as Unknown.
enum class PeftMethod { None, Lora, Dora, Ia3, LnTuning, PromptTuning, Adapter, AdapterV2, AdaptionPrompt, PrefixTuning, Unknown };
// bitsandbytes (LLM.int8, 4-bit NF4 and FP4), and packed int4 bases: GPTQ (auto-gptq via optimum) and AWQ (AutoAWQ)
enum class BaseQuantization { None, Int8, Nf4, Fp4, Gptq, Awq, Unknown };
enum class TaskHead { CausalLm, SequenceClassification, Unknown };
enum class PipelineSchedule { OneFOneB, Interleaved1F1B, GPipe, Unknown };
enum class Offload { None, Cpu, Nvme, Unknown };  // ZeRO-Offload / ZeRO-Infinity targets
enum class LengthsSource { Fixed, MicroBatches, Samples, Unknown };  // data.lengths
enum class Padding { Longest, MaxLength, None, Unknown };             // data.padding
enum class TriState { Auto, True, False, Unknown };                  // auto / true / false switches
enum class BackwardPrefetch { Pre, Post, None, Unknown };             // parallel.fsdp_backward_prefetch
enum class Objective { Sft, Dpo, Orpo, Simpo, Grpo, Kto, Ppo, Unknown };  // training.objective
// training.reference_model: where a preference objective's reference log-probabilities come from.
enum class ReferenceModel { Auto, Copy, AdapterDisabled, Precomputed, None, Unknown };
// training.generation_engine: what generates GRPO's completions (rollout.h).
enum class GenerationEngine { HfGenerate, VllmColocate, VllmServer, Unknown };
// training.ema: where an EMA copy of the trainable weights lives and how it is updated (optimizer_step.cpp).
enum class EmaMode { None, Gpu, GpuForeach, Cpu, Unknown };

// The enum of `text` in `names`, Unknown when none matches.
template <typename E, size_t N>
constexpr E choice_of(std::string_view text, const std::pair<std::string_view, E> (&names)[N]) {
  for (const auto& [name, value] : names)
    if (text == name) return value;
  return E::Unknown;
}

// An auto / true / false field's value.
constexpr TriState tri_state_of(std::string_view value) {
  constexpr std::pair<std::string_view, TriState> kNames[] = {
      {"auto", TriState::Auto}, {"true", TriState::True}, {"false", TriState::False}};
  return choice_of(value, kNames);
}

enum class NormType { RMSNorm, LayerNorm };
// model.hidden_act where the saved tensors depend on it (encoder_decoder.cpp: T5's feed-forward); any other name is
// Other.
enum class HiddenAct { GeluNew, Relu, Other, Unknown };
enum class PositionType { Rope, Absolute };  // "absolute" = learned position embeddings (GPT-2, BERT)

struct ModelConfig {
  std::string name = "Llama-2-13B shape";  // for display only (HF _name_or_path, or the preset's name)
  std::string model_type = "llama";
  int64_t hidden_size = 5120;
  int64_t num_hidden_layers = 40;
  int64_t num_attention_heads = 40;
  int64_t num_key_value_heads = 40;  // HF: absent means = num_attention_heads
  int64_t head_dim = 128;            // HF: absent or null means hidden_size / num_attention_heads
  int64_t intermediate_size = 13824;
  int64_t vocab_size = 32000;
  int64_t max_position_embeddings = 4096;
  bool tie_word_embeddings = false;
  std::string hidden_act = "silu";
  bool attention_bias = false;  // HF Llama semantics: bias on q, k, v and o
  bool mlp_bias = false;
  bool lm_head_bias = false;    // HF PhiMoE: the output head has a bias
  // Structural fields not in HF config.json (defaults per model_type, see serialize.cpp):
  NormType norm_type = NormType::RMSNorm;
  bool mlp_gated = true;        // SwiGLU/GeGLU: gate, up and down projections
  bool qkv_bias = false;        // bias on q, k, v only (Qwen2)
  // One linear computes q, k and v (GPT-2 and Qwen-1 c_attn, Falcon, GPT-NeoX and Bloom query_key_value): PEFT can
  // target it only whole, as one adapter (peft.target_modules names it c_attn, query_key_value or qkv_proj). The
  // Qwen-1 import sets it; for the families memsim read before it existed it stays an explicit choice, so that a
  // link and a JSON config of the same model always mean the same.
  bool fused_qkv = false;
  bool qk_norm = false;         // RMSNorm on q and k (Qwen3, Gemma 3: per head; OLMo 2: over the whole projection)
  bool qk_norm_per_head = true;
  int64_t norms_per_layer = 2;  // Gemma 2/3 use 4 (pre and post norms); 1 = parallel attention and MLP (Falcon)
  PositionType position_embedding_type = PositionType::Rope;
  // Dropout probabilities (HF: attention_dropout / attention_probs_dropout_prob, hidden_dropout_prob /
  // resid_pdrop). Above 0 they add 1-byte masks to the saved activations.
  double attention_dropout = 0.0;
  double hidden_dropout = 0.0;
  // Mixture of experts (HF Mixtral/Qwen3-MoE/DeepSeek-V3 keys; num_experts 0 = dense). Experts use
  // moe_intermediate_size (0: intermediate_size, as Mixtral); the first first_k_dense_replace layers are dense.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t shared_expert_intermediate_size = 0;  // all shared experts together (DeepSeek: n_shared_experts x moe size)
  int64_t first_k_dense_replace = 0;
  bool router_bias = false;                     // DeepSeek-V3 e_score_correction_bias
  double moe_capacity_factor = 0.0;             // 0: dropless (HF); > 0: each expert's buffer holds c * k * tokens / E
  // Multi-head latent attention (DeepSeek-V2/V3; kv_lora_rank 0 = standard attention).
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  // Encoders in the BERT style: LayerNorm after each residual add (and on the embeddings), token-type
  // embeddings, and a classification head instead of the language-model head.
  bool post_layernorm = false;
  int64_t type_vocab_size = 0;               // HF key; 0: no token-type embeddings
  std::string task_head = "causal_lm";       // causal_lm or sequence_classification
  int64_t num_labels = 2;                    // HF: len(id2label)
  // Encoder-decoder models (T5, mT5; HF T5Config). The encoder has num_hidden_layers blocks (HF num_layers), the
  // decoder num_decoder_layers (0: as many as the encoder, T5Config's default); each decoder block adds
  // cross-attention to the encoder output. d_model, d_kv, d_ff, num_heads and feed_forward_proj are read into
  // hidden_size, head_dim, intermediate_size, num_attention_heads, mlp_gated and hidden_act. Positions are T5's
  // relative attention bias, an Embedding(relative_attention_num_buckets, heads) in the first block of each
  // stack; position_embedding_type does not apply.
  bool is_encoder_decoder = false;
  int64_t num_decoder_layers = 0;
  int64_t relative_attention_num_buckets = 32;  // T5Config default
  // A model program (architecture.h) instead of the built-in families: empty, a built-in program's name ("vit"), or
  // a program as JSON text. The program declares its own hyperparameters with defaults; architecture_args
  // overrides them ("image_size=384, num_labels=10"), and the fields above do not apply to it.
  std::string architecture;
  std::string architecture_args;
  // A vision-language model in LLaVA's layout (transformers LlavaForConditionalGeneration; haotian-liu/LLaVA): a
  // frozen vision tower, a built-in program's name ("clip_vision") with its own arguments, runs under no_grad on the
  // images of each sample; a trained MLP projector of projector_depth linears with GELU between (LLaVA's
  // mlp{depth}x_gelu: Linear(tower width, hidden_size), then GELU and Linear(hidden_size, hidden_size)) maps its patch
  // features into the decoder above, whose sequence holds them as image tokens. Empty: a text-only model.
  std::string vision_tower;
  std::string vision_tower_args;
  int64_t projector_depth = 2;

  bool operator==(const ModelConfig&) const = default;
  // One routed expert's MLP width: moe_intermediate_size, or the dense width where a config (Mixtral's) has none.
  int64_t expert_width() const { return moe_intermediate_size > 0 ? moe_intermediate_size : intermediate_size; }
  TaskHead head() const {
    constexpr std::pair<std::string_view, TaskHead> kNames[] = {
        {"causal_lm", TaskHead::CausalLm}, {"sequence_classification", TaskHead::SequenceClassification}};
    return choice_of(task_head, kNames);
  }
  HiddenAct activation() const {
    constexpr std::pair<std::string_view, HiddenAct> kNames[] = {{"gelu_new", HiddenAct::GeluNew}, {"relu", HiddenAct::Relu}};
    const HiddenAct a = choice_of(hidden_act, kNames);
    return a == HiddenAct::Unknown ? HiddenAct::Other : a;
  }
  // Qwen-1 runs its own remote code (modeling_qwen.py), which picks its attention and computes its loss itself,
  // whatever transformers' rules (frameworks.cpp own_code_attention).
  bool qwen1_remote_code() const { return model_type == "qwen"; }
};

// training.empty_cache_steps: derived from the framework and the versions.
constexpr int64_t kEmptyCacheAuto = -1;

// Choices that frameworks make differently. "auto" means: what training.framework does (frameworks.cpp);
// any other value overrides the framework's choice.
struct TrainingConfig {
  int64_t micro_batch_size = 4;
  int64_t sequence_length = 4096;
  int64_t decoder_sequence_length = 0;   // encoder-decoder: target (decoder) tokens; 0 = sequence_length
  int64_t gradient_accumulation_steps = 1;
  std::string framework = "deepspeed";   // hf_trainer, torchtune, litgpt, megatron, deepspeed (frameworks.h)
  std::string precision = "bf16_mixed";  // id in the precision table (tables.h)
  std::string optimizer = "adamw";       // id in the optimizer table (tables.h)
  std::string optimizer_impl = "auto";   // auto (the framework's, by the versions), foreach, fused, for_loop
  // An exponential moving average of the trainable weights (diffusers' --use_ema: EMAModel, an fp32 shadow copy):
  // none, gpu (updated parameter by parameter), gpu_foreach (--foreach_ema), cpu (--offload_ema: pinned host memory,
  // moved to the GPU for each update).
  std::string ema = "none";
  std::string activation_checkpointing = "full";  // none, full, selective, every_k
  int64_t checkpoint_every_k_layers = 2;          // with every_k: layers 0, k, 2k, ... are checkpointed
  // auto (the framework's: FrameworkSpec::checkpoint_reentrant), true or false: torch.utils.checkpoint's
  // use_reentrant, as HF's gradient_checkpointing_kwargs={"use_reentrant": False} sets it.
  std::string checkpoint_reentrant = "auto";
  std::string attention = "auto";        // auto (the framework's, by the versions), sdpa, sdpa_repeat_kv, flash_attention_2, eager
  std::string norm_impl = "auto";        // auto, eager_fp32, fused, litgpt
  // auto (the framework's, by the versions), hf_fp32_upcast, hf_shift_fp32, hf_fp32_logits, hf_shift, full_fp32,
  // chunked_fp32, chunked_bf16, fused_linear
  std::string loss = "auto";
  int64_t loss_chunks = 8;               // chunks of chunked_fp32 (torchtune CEWithChunkedOutputLoss default)
  bool activation_offload = false;       // saved activations go to host memory (torchtune/Megatron offloading)
  bool optimizer_in_backward = false;    // step each parameter in a post-accumulate-grad hook (torchtune)
  bool compile = false;                  // torch.compile: the layers' saved set (norm_impl) and the chunked loss
  // The switches below are auto (derived from the versions section, frameworks.cpp resolve()), true or false.
  std::string zero_grad_set_to_none = "auto";  // torch >= 2.0 default; torch 1.x zeroed gradients in place (kept them)
  // Where the loop calls zero_grad: after_step (the HF Trainer, accelerate, torchtune, LitGPT) or before_backward
  // (PyTorch Lightning's automatic optimization: training_step, then zero_grad, then backward), which keeps the
  // previous step's gradients through the next forward.
  std::string zero_grad_at = "after_step";
  std::string softmax_saves_input = "auto";    // torch <= 1.10: softmax and log_softmax also saved their input
                                               // (eager attention, T5 attention, the HF loss)
  // torch.cuda.empty_cache() every k optimizer steps (HF TrainingArguments.torch_empty_cache_steps, PEFT's
  // method_comparison run.py after every step); 0: never; -1: auto (the HF Trainer of transformers 4.41 emptied
  // the cache at every training step). Matters only in a run replay (DataConfig).
  int64_t empty_cache_steps = kEmptyCacheAuto;
  // What the step optimises (preference.cpp): sft (next-token cross-entropy), or a preference objective over pairs
  // of chosen and rejected completions as TRL's trainers and torchtune's DPO recipes run them: dpo (DPOTrainer, any
  // loss_type: sigmoid, ipo, hinge, ...), orpo (ORPOTrainer) and simpo (CPOTrainer, loss_type simpo). A preference
  // micro-batch of micro_batch_size pairs runs as one forward of 2 x micro_batch_size sequences of sequence_length
  // (each pair padded to its longer sequence, prompt included).
  std::string objective = "sft";
  // A vision-language model's projector (ModelConfig::vision_tower): auto (trained without PEFT; frozen under PEFT,
  // which freezes the whole base model unless modules_to_save names it, as TRL's and ms-swift's LoRA runs leave it),
  // true (LLaVA's own scripts build the projector after get_peft_model and train it in every stage) or false.
  std::string train_projector = "auto";
  // ... and whether its vision tower trains in full (TRL's full fine-tuning of llava-hf freezes nothing unless told;
  // LLaVA, ms-swift's freeze_vit and LLaMA-Factory's freeze_vision_tower keep it frozen: the default).
  bool train_vision_tower = false;
  // ... and ms-swift's vit_gradient_checkpointing (its own argument; default true from ms-swift 3.5): auto (the tower
  // is checkpointed with the decoder where it trains, and a frozen one records nothing: transformers' Trainer, TRL,
  // LLaMA-Factory), true (its blocks checkpointed, and a frozen tower's patch embeddings made to require grad
  // (enable_input_require_grads), so it records a checkpointed graph that backward runs through), false (a trained
  // tower not checkpointed).
  std::string vit_gradient_checkpointing = "auto";
  // auto (copy for full fine-tuning, adapter_disabled under PEFT, none for orpo and simpo), copy (a frozen second
  // model), adapter_disabled (the policy with its adapters off), precomputed (precompute_ref_log_probs: no
  // reference during training) or none (reference-free).
  std::string reference_model = "auto";
  // DPO's rpo_alpha / CPO's cpo_alpha: above 0 a cross-entropy over the chosen half is added (ORPO always has one).
  double nll_alpha = 0.0;
  // grpo (TRL's GRPOTrainer, rollout.h): completions are generated for every prompt, scored, and trained on.
  // micro_batch_size counts completions (TRL's per_device_train_batch_size), sequence_length is a prompt and its
  // completion together (max_prompt_length + max_completion_length).
  int64_t num_generations = 8;       // completions per prompt (GRPOConfig.num_generations)
  int64_t completion_length = 256;   // GRPOConfig.max_completion_length: generated tokens per completion
  // hf_generate (use_vllm false: the policy's model.generate with a KV cache), vllm_colocate (a vLLM engine in the
  // training process, holding gpu_memory_utilization of each GPU), vllm_server (an engine on other GPUs).
  std::string generation_engine = "hf_generate";
  double gpu_memory_utilization = 0.3;  // vllm_colocate: GRPOConfig.vllm_gpu_memory_utilization
  bool vllm_sleep = false;              // vllm_colocate: vllm_enable_sleep_mode (the engine sleeps through training)
  // grpo's rewards: none (reward functions, rules: nothing on the GPU) or same_as_policy (a reward model of the
  // policy's architecture: AutoModelForSequenceClassification with num_labels 1, frozen, scoring every completion).
  std::string reward_model = "none";
  // ppo's value model (ppo_step.cpp): full (TRL's PPOTrainer wraps only the policy with PEFT: the value model trains
  // in full) or peft (ms-swift prepares it like the policy: the same PEFT method and quantization).
  std::string value_model = "full";
  // ppo: the models' config.use_cache, which TRL's forward() helper leaves to the config (true in transformers'
  // configs), so the reference's scoring forward, and the policy's training forward without checkpointing, return
  // every layer's keys and values; ms-swift sets it false.
  bool use_cache = true;
  // grpo: micro-batches per generation (GRPOConfig.steps_per_generation, TRL 0.18+; 0 = its default,
  // gradient_accumulation_steps) and the optimization passes over each generation (num_iterations, TRL 0.16+).
  int64_t steps_per_generation = 0;
  int64_t num_iterations = 1;
  // vllm_server: the server's own GPUs (vllm_server.h), as trl vllm-serve's arguments: tensor_parallel_size,
  // data_parallel_size (TRL 0.17+), gpu_memory_utilization and max_model_len (0: the model's positions, vLLM's default).
  int64_t vllm_server_tensor_parallel_size = 1;
  int64_t vllm_server_data_parallel_size = 1;
  double vllm_server_gpu_memory_utilization = 0.9;
  int64_t vllm_max_model_len = 0;
  // An evaluation between training steps (eval_step.cpp): eval_batch_size sequences of sequence_length through the
  // model under no_grad, with the loss, once after the first optimizer step; 0: none. eval_logits_batches: the eval
  // batches whose logits the HF Trainer's evaluation loop holds on the GPU at once (0: the loss only).
  int64_t eval_batch_size = 0;
  int64_t eval_logits_batches = 0;

  bool operator==(const TrainingConfig&) const = default;
  Objective goal() const {
    constexpr std::pair<std::string_view, Objective> kNames[] = {
        {"sft", Objective::Sft}, {"dpo", Objective::Dpo}, {"orpo", Objective::Orpo}, {"simpo", Objective::Simpo},
        {"grpo", Objective::Grpo}, {"kto", Objective::Kto}, {"ppo", Objective::Ppo}};
    return choice_of(objective, kNames);
  }
  // The DPO family (pairs of chosen and rejected sequences) and KTO (unpaired, labelled rows): preference.h.
  bool preference() const {
    const Objective o = goal();
    return o == Objective::Dpo || o == Objective::Orpo || o == Objective::Simpo || o == Objective::Kto;
  }
  // grpo and ppo generate their completions in the step (rollout.h).
  bool rollout() const { return goal() == Objective::Grpo || goal() == Objective::Ppo; }
  bool ppo() const { return goal() == Objective::Ppo; }
  bool zero_grad_before_backward() const { return zero_grad_at == "before_backward"; }
  bool reward_model_on() const { return reward_model == "same_as_policy"; }
  bool checkpointing_on() const { return activation_checkpointing != "none"; }
  bool value_model_peft() const { return value_model == "peft"; }
  TriState projector_training() const { return tri_state_of(train_projector); }
  TriState vit_checkpointing() const { return tri_state_of(vit_gradient_checkpointing); }
  EmaMode ema_mode() const {
    constexpr std::pair<std::string_view, EmaMode> kNames[] = {
        {"none", EmaMode::None}, {"", EmaMode::None}, {"gpu", EmaMode::Gpu}, {"gpu_foreach", EmaMode::GpuForeach},
        {"cpu", EmaMode::Cpu}};
    return choice_of(ema, kNames);
  }
  GenerationEngine engine() const {
    constexpr std::pair<std::string_view, GenerationEngine> kNames[] = {
        {"hf_generate", GenerationEngine::HfGenerate}, {"vllm_colocate", GenerationEngine::VllmColocate},
        {"vllm_server", GenerationEngine::VllmServer}};
    return choice_of(generation_engine, kNames);
  }
  ReferenceModel reference() const {
    constexpr std::pair<std::string_view, ReferenceModel> kNames[] = {
        {"auto", ReferenceModel::Auto}, {"copy", ReferenceModel::Copy}, {"adapter_disabled", ReferenceModel::AdapterDisabled},
        {"precomputed", ReferenceModel::Precomputed}, {"none", ReferenceModel::None}};
    return choice_of(reference_model, kNames);
  }
};

// Parameter-efficient fine-tuning (PEFT's names). With a method the base model is frozen: only the adapters
// (and modules_to_save) have gradients and optimizer states, and the base may be stored quantized.
// Methods: lora, dora (LoraConfig, use_dora), ia3 (IA3Config), ln_tuning (LNTuningConfig: target_modules name
// norms) and prompt_tuning (PromptTuningConfig). prefix_tuning is a known name that validate.cpp refuses.
struct PeftConfig {
  std::string method = "none";              // none, lora, dora, ia3, ln_tuning, prompt_tuning, adapter, adapter_v2, adaption_prompt
  int64_t lora_rank = 8;
  double lora_alpha = 16.0;
  double lora_dropout = 0.0;
  std::string target_modules = "q_proj,v_proj";  // comma-separated module names, or all-linear
  std::string feedforward_modules = "down_proj";  // IA3Config.feedforward_modules: scale the input, not the output
  int64_t num_virtual_tokens = 20;                // PromptTuningConfig / PrefixTuningConfig num_virtual_tokens
  // LLaMA-Adapter: the adaption prompt's length, and the first layer that has one (litgpt/adapter.py Config
  // adapter_prompt_length and adapter_start_layer; PEFT's AdaptionPromptConfig adapter_len, and adapter_layers counted
  // from the top: adapter_start_layer = num_hidden_layers - adapter_layers).
  int64_t adapter_prompt_length = 10;
  int64_t adapter_start_layer = 2;
  // auto (by the peft version: autocast_adapter_dtype=True keeps adapters in fp32 since 0.12), fp32, bf16, fp16
  std::string adapter_dtype = "auto";
  std::string base_quantization = "none";   // none, int8 (LLM.int8), nf4, fp4 (bitsandbytes), gptq, awq (4-bit)
  bool double_quantization = false;         // bnb_4bit_use_double_quant
  // GPTQConfig / AwqConfig group_size: input features that share one scale and zero (-1: the whole row).
  int64_t quant_group_size = 128;
  // prepare_model_for_kbit_training (non-quantized params to fp32): auto (true where the framework uses PEFT, except
  // under TRL's SFTTrainer from 0.26 and Unsloth, which do not call it), true, false
  std::string prepare_kbit = "auto";
  // bitsandbytes before 0.43.2 keeps each 4-bit linear's input for backward even though the frozen weight needs no
  // gradient (autograd/_functions.py MatMul4Bit.forward: ctx.tensors = (A, B); PR #1270 made it (None, B)).
  // auto (by the bitsandbytes version), true or false.
  std::string bnb_saves_input = "auto";
  std::string modules_to_save;              // comma-separated modules trained in full (e.g. lm_head)

  bool operator==(const PeftConfig&) const = default;
  // The method and the base's quantization as the modelling code reads them (choice_of above).
  PeftMethod kind() const {
    constexpr std::pair<std::string_view, PeftMethod> kNames[] = {
        {"none", PeftMethod::None}, {"lora", PeftMethod::Lora}, {"dora", PeftMethod::Dora}, {"ia3", PeftMethod::Ia3},
        {"ln_tuning", PeftMethod::LnTuning}, {"prompt_tuning", PeftMethod::PromptTuning},
        {"adapter", PeftMethod::Adapter}, {"adapter_v2", PeftMethod::AdapterV2},
        {"adaption_prompt", PeftMethod::AdaptionPrompt}, {"prefix_tuning", PeftMethod::PrefixTuning}};
    return choice_of(method, kNames);
  }
  BaseQuantization quantization() const {
    constexpr std::pair<std::string_view, BaseQuantization> kNames[] = {
        {"none", BaseQuantization::None}, {"int8", BaseQuantization::Int8}, {"nf4", BaseQuantization::Nf4},
        {"fp4", BaseQuantization::Fp4}, {"gptq", BaseQuantization::Gptq}, {"awq", BaseQuantization::Awq}};
    return choice_of(base_quantization, kNames);
  }
  bool enabled() const { return kind() != PeftMethod::None; }
  bool lora_like() const { return kind() == PeftMethod::Lora || kind() == PeftMethod::Dora; }  // low-rank adapters on linears
  // litgpt's LLaMA-Adapter v1 (adapter.py) or v2 (adapter_v2.py): an adaption prompt per layer from adapter_start_layer.
  bool llama_adapter() const { return kind() == PeftMethod::Adapter || kind() == PeftMethod::AdapterV2; }
  // An adaption prompt per layer from adapter_start_layer: litgpt's recipes or PEFT's AdaptionPromptConfig.
  bool prompt_adapter() const { return llama_adapter() || kind() == PeftMethod::AdaptionPrompt; }
  bool quantized() const { return quantization() != BaseQuantization::None; }  // a bitsandbytes, GPTQ or AWQ base
  bool four_bit() const { return quantization() == BaseQuantization::Nf4 || quantization() == BaseQuantization::Fp4; }  // bitsandbytes'
  // GPTQ or AWQ: int4 packed in int32 buffers, with per-group scales and zeros (model_states.cpp).
  bool packed_int4() const { return quantization() == BaseQuantization::Gptq || quantization() == BaseQuantization::Awq; }
  // prepare_model_for_kbit_training casts every fp16/bf16 parameter to fp32, except on a GPTQ model: peft skips
  // the cast there (utils/other.py, v0.6-v0.17: `if not is_gptq_quantized and ...: # cast all non INT8 parameters
  // to fp32`); AWQ is in none of its lists, so its embeddings, norms and head are cast. Whether it runs is the
  // resolved peft.prepare_kbit (Resolved::kbit_cast).
  bool kbit_castable() const { return enabled() && quantized() && quantization() != BaseQuantization::Gptq; }
};

// The world is data x context x tensor x pipeline parallel (Megatron's layout). Sharding of model states runs
// over the data-parallel ranks (or a shard group of them, HSDP); expert parallel splits the experts within them.
struct ParallelConfig {
  int64_t data_parallel_size = 8;
  // The GPU count a user asked for that the layout cannot run on: data parallel follows from GPUs / (tensor x
  // pipeline x context parallel), and this holds a count they do not divide (validate.cpp reports it under the
  // field, the other settings kept). Empty whenever the layout is whole: the count is then data x tensor x pipeline
  // x context parallel (gpu_count.h), so links and JSON, which carry only data_parallel_size, never need it.
  std::optional<int64_t> gpus;
  // What is sharded over the data-parallel ranks, in ZeRO's terms: 0 nothing (DDP, FSDP NO_SHARD), 1 optimizer
  // states (ZeRO-1, Megatron's distributed optimizer), 2 + gradients (ZeRO-2, FSDP SHARD_GRAD_OP, FSDP2
  // reshard_after_forward=False), 3 + parameters (ZeRO-3, FSDP FULL_SHARD, FSDP2 reshard_after_forward=True).
  int64_t zero_stage = 3;
  // Whose implementation does the sharding: auto (the framework's), deepspeed, fsdp1, fsdp2, megatron.
  std::string sharding = "auto";
  int64_t shard_group_size = 0;  // HSDP / FSDP HYBRID_SHARD: ranks one shard spans (0: all data-parallel ranks)
  std::string fsdp_backward_prefetch = "backward_pre";  // FSDP1: backward_pre, backward_post, none
  // Units all-gathered ahead of the one computing in forward: FSDP1 forward_prefetch=True is 1, FSDP2
  // set_modules_to_forward_prefetch(next k blocks) is k; 0 is both defaults.
  int64_t fsdp_forward_prefetch = 0;
  // FSDP2 in backward: 1 is its implicit prefetch of the next block, k set_modules_to_backward_prefetch of k.
  int64_t fsdp2_backward_prefetch = 1;
  // FSDP2: the token embedding and the output layer are units of their own, resharded after their forward and
  // all-gathered again in backward (torchtune's custom_sharded_layers: ['tok_embeddings', 'output']); false keeps
  // them in the root unit, which FSDP2 never reshards between forward and backward.
  bool fsdp_shard_embeddings = false;
  // FSDP1 use_orig_params: auto (the framework's: Fabric sets it, FSDP1's own default is false), true or false.
  std::string fsdp_use_orig_params = "auto";
  // FSDP gradient accumulation under no_sync() (unsharded gradients until the last micro-batch): auto (the
  // framework's: HF Trainer and Fabric do), true, or false (Accelerate's sync_each_batch=True, or syncing every
  // micro-batch by hand).
  std::string fsdp_no_sync = "auto";
  // FSDP1 with checkpointing: the checkpoint wrapper sits inside each unit, FSDP(CheckpointWrapper(layer)) (torch's
  // apply_activation_checkpointing after the FSDP wrap: Accelerate's fsdp_activation_checkpointing, fsdp_qlora,
  // llama-recipes), not around it (transformers' gradient_checkpointing_enable calls each wrapped layer through
  // checkpoint). Inside, FSDP's forward runs with grad: its hooks see the real activations.
  bool fsdp_checkpoint_in_units = false;
  int64_t tensor_parallel_size = 1;
  bool sequence_parallel = false;      // with TP: norms, dropout and residuals split along the sequence too
  int64_t context_parallel_size = 1;   // ring attention: each rank holds sequence_length / cp tokens
  std::string cp_rotate_method = "auto";  // auto (the framework's), allgather or alltoall (frameworks.cpp)
  int64_t expert_parallel_size = 1;    // MoE: each rank of an expert-parallel group holds num_experts / ep experts
  int64_t pipeline_parallel_size = 1;
  std::string pipeline_schedule = "1f1b";  // 1f1b, interleaved_1f1b or gpipe
  int64_t virtual_pipeline_stages = 2;     // interleaved_1f1b: model chunks per device (Megatron's vp size)
  // Uneven pipeline splits (Megatron decoder_first/last_pipeline_num_layers): 0 = an even share.
  int64_t pipeline_first_stage_layers = 0;
  int64_t pipeline_last_stage_layers = 0;
  // Offload (ZeRO-Offload / ZeRO-Infinity / FSDP CPUOffload): none, cpu or nvme (nvme: DeepSpeed only).
  std::string offload_optimizer = "none";
  std::string offload_params = "none";
  // DeepSpeed ZeRO buffers (deepspeed/runtime/zero/config.py), in elements; 0 = DeepSpeed's code default.
  // HF Trainer's "auto" sets reduce_bucket_size = hidden^2, prefetch = 0.9 hidden^2, persistence = 10 hidden.
  int64_t zero_reduce_bucket_size = 0;          // default 5e8
  std::string zero_overlap_comm = "auto";       // auto (true for stage 3 only, as the code's validator), true, false
  int64_t zero_prefetch_bucket_size = 0;        // stage3_prefetch_bucket_size, default 5e7
  int64_t zero_param_persistence_threshold = 0; // stage3_param_persistence_threshold, default 1e5
  int64_t zero_max_live_parameters = 0;         // stage3_max_live_parameters, default 1e9
  bool ddp_gradient_as_bucket_view = false;     // torch DDP: .grad are views into the buckets (from iteration 2)

  bool operator==(const ParallelConfig&) const = default;
  PipelineSchedule schedule() const {
    constexpr std::pair<std::string_view, PipelineSchedule> kNames[] = {
        {"1f1b", PipelineSchedule::OneFOneB}, {"interleaved_1f1b", PipelineSchedule::Interleaved1F1B},
        {"gpipe", PipelineSchedule::GPipe}};
    return choice_of(pipeline_schedule, kNames);
  }
  static Offload offload_of(std::string_view target) {
    constexpr std::pair<std::string_view, Offload> kNames[] = {
        {"none", Offload::None}, {"cpu", Offload::Cpu}, {"nvme", Offload::Nvme}};
    return choice_of(target, kNames);
  }
  TriState overlap_comm() const { return tri_state_of(zero_overlap_comm); }
  TriState use_orig_params() const { return tri_state_of(fsdp_use_orig_params); }
  TriState no_sync() const { return tri_state_of(fsdp_no_sync); }
  BackwardPrefetch backward_prefetch() const {
    constexpr std::pair<std::string_view, BackwardPrefetch> kNames[] = {
        {"backward_pre", BackwardPrefetch::Pre}, {"backward_post", BackwardPrefetch::Post}, {"none", BackwardPrefetch::None}};
    return choice_of(fsdp_backward_prefetch, kNames);
  }
  Offload optimizer_offload() const { return offload_of(offload_optimizer); }
  Offload params_offload() const { return offload_of(offload_params); }
};

struct HardwareConfig {
  std::string gpu = "a100-80gb";      // id in the GPU table (gpus.h)
  int64_t gpu_memory_bytes = 0;       // 0: the preset's capacity; otherwise a custom capacity
  double headroom_fraction = 0.10;    // budget practitioners keep free (10-15%)
  int64_t cuda_context_bytes = 0;     // 0: by CUDA module loading (lazy since PyTorch 1.13); else measured
  // auto (by the torch version), lazy (CUDA >= 11.7 with PyTorch >= 1.13) or eager (older, or forced)
  std::string cuda_module_loading = "auto";
  // PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (allocator.h): auto (what the framework's launcher sets), true
  // or false.
  std::string expandable_segments = "auto";
  int64_t nccl_channels = 16;         // NCCL channels per communicator (its log: "N coll channels"); 16 is what
                                      // 8-GPU nodes' logs commonly show (simulate.cpp nccl_bytes)
  int64_t gpus_per_node = 8;          // GPUs sharing one host (for host RAM under offload and NCCL's transports)
  int64_t host_memory_bytes = 0;      // host RAM per node; 0: not given (the need is shown without a verdict)

  bool operator==(const HardwareConfig&) const = default;
};

// The data a run reads, and how much of the run memsim replays. With `lengths` fixed, every micro-batch holds
// training.sequence_length tokens per sequence (packed data, or padding to max_length): memsim replays two steps,
// which is the whole story of a fixed shape. Otherwise every micro-batch has its own length, drawn as the run's
// data loader makes them (data_shape.h), and memsim replays `steps` optimizer steps through one allocator model,
// carrying its cache from step to step: the peak of a real run belongs to its longest batch, and reserved memory
// grows as batches of new sizes cannot reuse the cached blocks of earlier ones.
struct DataConfig {
  std::string lengths = "fixed";    // fixed, micro_batches (listed) or samples (a length distribution)
  std::string micro_batch_lengths;  // micro_batches: each micro-batch's padded length in order, "512,380,1024"
  // samples: per-sample token lengths, as percentiles "p0=12,p50=310,p90=720,p100=2048" or a histogram
  // "0-256:40,256-512:35,512-2048:25" (bins of lengths with relative weights). Samples longer than
  // training.sequence_length are truncated to it.
  std::string sample_lengths;
  std::string padding = "longest";  // samples: longest (pad to the micro-batch's longest), max_length, none (flattened)
  int64_t pad_to_multiple_of = 1;   // the collator's pad_to_multiple_of (HF DataCollatorWithPadding)
  bool group_by_length = false;     // HF TrainingArguments.group_by_length (LengthGroupedSampler)
  bool longest_first = false;       // the longest sample goes into the first micro-batch (lit-gpt 2023's loops)
  int64_t dataset_samples = 0;      // samples in the training set; 0: not given
  int64_t epochs = 1;
  int64_t steps = 0;                // optimizer steps to replay; 0: the run's (dataset_samples x epochs), at most 2,000
  int64_t seed = 1;                 // the shuffle's and the draws' seed (the replay is deterministic)
  // A vision-language model (model.vision_tower): images per sample. Each brings the tower's patch tokens into the
  // sequence (transformers' processor expands <image> before the collator), so sequence_length and the lengths above
  // count them; 0: text-only batches, the tower does not run.
  int64_t images_per_sample = 1;

  bool operator==(const DataConfig&) const = default;
  bool varies() const { return source() != LengthsSource::Fixed; }
  LengthsSource source() const {
    constexpr std::pair<std::string_view, LengthsSource> kNames[] = {
        {"fixed", LengthsSource::Fixed}, {"micro_batches", LengthsSource::MicroBatches}, {"samples", LengthsSource::Samples}};
    return choice_of(lengths, kNames);
  }
  Padding pad() const {
    constexpr std::pair<std::string_view, Padding> kNames[] = {
        {"longest", Padding::Longest}, {"max_length", Padding::MaxLength}, {"none", Padding::None}};
    return choice_of(padding, kNames);
  }
};

// The library versions of the run (versions.h): "latest" (today's behaviour) or a release such as "2.1" or "2.1.2".
// `date` ("2023-10" or "2023-10-15"; empty: none) stands for the releases current then: every library left at latest
// takes its newest release dated on or before that day. Each switch left at auto derives from these.
struct VersionsConfig {
  std::string torch = "latest";
  std::string transformers = "latest";
  std::string peft = "latest";
  std::string bitsandbytes = "latest";
  std::string deepspeed = "latest";
  std::string torchao = "latest";
  std::string flash_attn = "latest";
  std::string torchtune = "latest";
  std::string unsloth = "latest";
  std::string trl = "latest";
  std::string vllm = "latest";
  std::string liger = "latest";  // liger-kernel
  std::string date;

  bool operator==(const VersionsConfig&) const = default;
};

struct Config {
  ModelConfig model;
  TrainingConfig training;
  PeftConfig peft;
  ParallelConfig parallel;
  HardwareConfig hardware;
  DataConfig data;
  VersionsConfig versions;

  bool operator==(const Config&) const = default;
};


inline int64_t decoder_layers(const ModelConfig& m) {
  return !m.is_encoder_decoder ? 0 : m.num_decoder_layers > 0 ? m.num_decoder_layers : m.num_hidden_layers;
}
inline int64_t decoder_tokens_per_sequence(const Config& c) {
  return c.training.decoder_sequence_length > 0 ? c.training.decoder_sequence_length : c.training.sequence_length;
}

inline int64_t effective_head_dim(const ModelConfig& m) {
  return m.head_dim > 0 ? m.head_dim : (m.num_attention_heads > 0 ? m.hidden_size / m.num_attention_heads : 0);
}

}  // namespace memsim
