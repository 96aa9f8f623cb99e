// The field registry (fields.h): one row per config field. A row is the key (section and member), the kind, the
// integer range, the choices, the schema version it arrived in, the page's label and the help. Defaults are config.h's
// initializers. The integer ranges are wide enough for any model trained so far and beyond (100T parameters, 1M-token
// sequences, 10M vocabularies), and narrow enough that every product of them stays checkable in int64.
#include "fields.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "choices.h"
#include "serialize.h"
#include "tables.h"

namespace memsim {

namespace {

using K = FieldKind;
using namespace choice;

// The key of config member `section.name` and the accessor of that member.
#define F(section, name) #section "." #name, [](Config& c) -> FieldRef { return &c.section.name; }

// clang-format off
constexpr FieldSpec kFields[] = {
    {F(model, name), K::Text, kNoRange, {}, 1,
     "name",
     "A name for display (Hugging Face _name_or_path, or the preset's name); nothing simulated depends on it."},
    {F(model, model_type), K::Text, kNoRange, {}, 1,
     "model_type",
     "Hugging Face model_type. Informational once the fields below are set; paste a config.json to fill everything from it."},
    {F(model, hidden_size), K::Integer, {1, 1 << 20}, {}, 1,
     "hidden_size",
     "Width of the residual stream. Weights grow with its square; activations linearly."},
    {F(model, num_hidden_layers), K::Integer, {1, 4096}, {}, 1,
     "num_hidden_layers",
     "Transformer layers. Weights, gradients, optimizer states and saved activations all scale with it."},
    {F(model, num_attention_heads), K::Integer, {1, 1 << 16}, {}, 1,
     "num_attention_heads",
     "Query heads. With head_dim 0, hidden_size / heads is the head size."},
    {F(model, num_key_value_heads), K::Integer, {1, 1 << 16}, {}, 1,
     "num_key_value_heads",
     "Key/value heads: equal to the query heads for MHA, fewer for GQA, 1 for MQA. Fewer means smaller k/v projections."},
    {F(model, head_dim), K::Integer, {0, 1 << 16}, {}, 1,
     "head_dim",
     "Size of each head; 0 means hidden_size / num_attention_heads (HF's default)."},
    {F(model, intermediate_size), K::Integer, {1, 1 << 24}, {}, 1,
     "intermediate_size",
     "MLP width. A gated MLP has three matrices of hidden x intermediate, a plain one two."},
    {F(model, vocab_size), K::Integer, {1, 1 << 26}, {}, 1,
     "vocab_size",
     "Vocabulary. The embedding (and an untied output head) hold vocab x hidden parameters."},
    {F(model, max_position_embeddings), K::Integer, {1, 1 << 26}, {}, 1,
     "max_position_embeddings",
     "Rows of the learned position table; also the longest sequence."},
    {F(model, tie_word_embeddings), K::Boolean, kNoRange, {}, 1,
     "tie_word_embeddings",
     "The output head reuses the input embedding: one vocab x hidden matrix instead of two."},
    {F(model, hidden_act), K::Choice, kNoRange, kActivations, 1,
     "hidden_act",
     "The MLP's activation (transformers' ACT2CLS names). Only gelu_new (eager, as T5 runs it) and relu (which saves its output) differ in memory; the others save their input."},
    {F(model, attention_bias), K::Boolean, kNoRange, {}, 1,
     "attention_bias",
     "Biases on q, k, v and o."},
    {F(model, mlp_bias), K::Boolean, kNoRange, {}, 1,
     "mlp_bias",
     "Biases on the MLP projections."},
    {F(model, lm_head_bias), K::Boolean, kNoRange, {}, 1,
     "lm_head_bias",
     "A bias on the output head (PhiMoE)."},
    {F(model, norm_type), K::Enum, kNoRange, kNormType, 1,
     "norm_type",
     "RMSNorm has a scale vector; LayerNorm a scale and a shift."},
    {F(model, mlp_gated), K::Boolean, kNoRange, {}, 1,
     "mlp_gated",
     "SwiGLU/GeGLU MLP with gate, up and down projections (Llama) instead of two (GPT-2)."},
    {F(model, qkv_bias), K::Boolean, kNoRange, {}, 1,
     "qkv_bias",
     "Biases on q, k and v only (Qwen2)."},
    {F(model, fused_qkv), K::Boolean, kNoRange, {}, 2,
     "fused_qkv",
     "One linear computes q, k and v (GPT-2 and Qwen-1 c_attn, Falcon and GPT-NeoX query_key_value): PEFT can adapt it only whole, as one adapter."},
    {F(model, qk_norm), K::Boolean, kNoRange, {}, 1,
     "qk_norm",
     "Per-head RMSNorm on queries and keys (Qwen3, Gemma 3)."},
    {F(model, qk_norm_per_head), K::Boolean, kNoRange, {}, 1,
     "qk_norm_per_head",
     "With qk_norm: one norm per head (Qwen3, Gemma 3) rather than one over the whole projection (OLMo 2)."},
    {F(model, norms_per_layer), K::Integer, {1, 8}, {}, 1,
     "norms_per_layer",
     "Norms per layer: 2 in most models, 4 in Gemma 2/3."},
    {F(model, position_embedding_type), K::Enum, kNoRange, kPositionType, 1,
     "position_embedding_type",
     "Learned absolute positions (GPT-2, BERT) add max_position_embeddings x hidden parameters."},
    {F(model, attention_dropout), K::Number, kNoRange, {}, 1,
     "attention_dropout",
     "Dropout on attention probabilities: with eager attention it saves a 1-byte mask of heads x seq^2 per layer.", {0.0, 1.0}},
    {F(model, hidden_dropout), K::Number, kNoRange, {}, 1,
     "hidden_dropout",
     "Dropout after attention and MLP: a 1-byte mask per token and hidden unit, twice per layer.", {0.0, 1.0}},
    {F(model, num_experts), K::Integer, {0, 1 << 16}, {}, 1,
     "num_experts",
     "Routed experts per MoE layer; 0 = dense. Every expert's weights, gradients and optimizer states are held unless expert parallelism splits them."},
    {F(model, num_experts_per_tok), K::Integer, {0, 1 << 16}, {}, 1,
     "experts per token",
     "Top-k: each token's activations pass through k experts, so expert activations are k x a dense MLP's at moe_intermediate_size."},
    {F(model, moe_intermediate_size), K::Integer, {0, 1 << 24}, {}, 1,
     "moe_intermediate_size",
     "Width of one expert; 0 = intermediate_size (Mixtral)."},
    {F(model, shared_expert_intermediate_size), K::Integer, {0, 1 << 24}, {}, 1,
     "shared experts width",
     "All shared experts together (DeepSeek: n_shared_experts x moe_intermediate_size)."},
    {F(model, first_k_dense_replace), K::Integer, {0, 4096}, {}, 1,
     "first dense layers",
     "Leading layers with a dense MLP (DeepSeek-V3: 3)."},
    {F(model, router_bias), K::Boolean, kNoRange, {}, 1,
     "router_bias",
     "MoE: the router's score-correction bias (DeepSeek-V3 e_score_correction_bias)."},
    {F(model, moe_capacity_factor), K::Number, kNoRange, {}, 1,
     "capacity factor",
     "0 = dropless (HF). Above 1, each expert buffers capacity x k x tokens / experts tokens.", {0.0, 64.0, false, false}},
    {F(model, q_lora_rank), K::Integer, {0, 1 << 20}, {}, 1,
     "q_lora_rank",
     "Query compression rank; 0 = none."},
    {F(model, kv_lora_rank), K::Integer, {0, 1 << 20}, {}, 1,
     "kv_lora_rank",
     "DeepSeek-V2/V3 compress keys and values to this rank; 0 = standard attention."},
    {F(model, qk_nope_head_dim), K::Integer, {0, 1 << 16}, {}, 1,
     "qk_nope_head_dim",
     "Per-head q/k width without RoPE."},
    {F(model, qk_rope_head_dim), K::Integer, {0, 1 << 16}, {}, 1,
     "qk_rope_head_dim",
     "Per-head q/k width with RoPE."},
    {F(model, v_head_dim), K::Integer, {0, 1 << 16}, {}, 1,
     "v_head_dim",
     "Per-head value width."},
    {F(model, post_layernorm), K::Boolean, kNoRange, {}, 1,
     "post_layernorm (encoder)",
     "BERT-style layers: LayerNorm after each residual add, which saves the sum."},
    {F(model, type_vocab_size), K::Integer, {0, 1 << 16}, {}, 1,
     "type_vocab_size",
     "Token-type embeddings (BERT): type_vocab_size x hidden parameters; 0: none."},
    {F(model, task_head), K::Choice, kNoRange, kTaskHead, 1,
     "task_head",
     "causal_lm: the language-model head over the vocabulary; sequence_classification: a classifier over num_labels (BERT-style encoders)."},
    {F(model, num_labels), K::Integer, {1, 1 << 20}, {}, 1,
     "num_labels",
     "Classes of a sequence_classification head (Hugging Face len(id2label))."},
    {F(model, is_encoder_decoder), K::Boolean, kNoRange, {}, 1,
     "is_encoder_decoder",
     "T5's layout: num_hidden_layers encoder blocks on the source tokens, then decoder blocks with cross-attention to the encoder output on the target tokens."},
    {F(model, num_decoder_layers), K::Integer, {0, 4096}, {}, 1,
     "num_decoder_layers",
     "Decoder blocks; 0 = as many as the encoder (T5Config's default)."},
    {F(model, relative_attention_num_buckets), K::Integer, {1, 1 << 16}, {}, 1,
     "relative buckets",
     "relative_attention_num_buckets: the position bias is an Embedding(buckets, heads) in the first block of each stack."},
    {F(model, architecture), K::Text, kNoRange, {}, 2,
     "architecture",
     "A model program instead of the fields above: a built-in program's name (vit) or a program as JSON (memsim-cli --architecture FILE). Empty: the built-in families."},
    {F(model, architecture_args), K::Text, kNoRange, {}, 2,
     "architecture args",
     "The program's hyperparameters that differ from its defaults, as name=number pairs: image_size=384, num_labels=10."},
    {F(model, vision_tower), K::Text, kNoRange, {}, 2,
     "vision tower",
     "A vision-language model: the frozen vision tower, a built-in program's name, which runs under no_grad on each sample's images. clip_vision: LLaVA's layout, whose patch features go through an MLP projector (trained or frozen: train projector) into the decoder's sequence. qwen2_vl_vision: Qwen2-VL's native-resolution tower, whose patch merger makes one token of each 2 x 2 patches; qwen2_5_vl_vision: Qwen2.5-VL's, with windowed attention in most blocks. Empty: text only."},
    {F(model, vision_tower_args), K::Text, kNoRange, {}, 2,
     "vision tower args",
     "The tower program's hyperparameters that differ from its defaults: image_size=336, patch_size=14, hidden_size=1024, num_hidden_layers=24, ... (LLaVA-1.5's CLIP ViT-L/14-336); for Qwen2-VL and Qwen2.5-VL the image's size before the processor resizes it, image_height=1080, image_width=1920, and its max_pixels (the hub's 12845056; ms-swift's MAX_PIXELS)."},
    {F(model, projector_depth), K::Integer, {1, 16}, {}, 2,
     "projector depth",
     "Linears in LLaVA's projector (mlp2x_gelu: 2, GELU between; 1: one linear). The first maps the tower's width to hidden_size, the others hidden_size to hidden_size. Qwen2-VL's patch merger is always LayerNorm, Linear, GELU, Linear."},
    {F(training, micro_batch_size), K::Integer, {1, 1 << 20}, {}, 1,
     "micro_batch_size",
     "Sequences per GPU per forward pass. Activations grow linearly with it. Until you set it, it is the largest that fits (from 4 down)."},
    {F(training, sequence_length), K::Integer, {1, 1 << 26}, {}, 1,
     "sequence_length",
     "Tokens per sequence. Activations grow linearly (quadratically with eager attention). Until you set it, it is the longest that fits (from 4096, within the model's positions, down to 512)."},
    {F(training, decoder_sequence_length), K::Integer, {0, 1 << 26}, {}, 1,
     "target length",
     "Decoder (target) tokens per sequence; sequence_length is the encoder's (source). 0 = the source length."},
    {F(training, gradient_accumulation_steps), K::Integer, {1, 1 << 20}, {}, 1,
     "grad_accumulation",
     "Micro-batches per optimizer step. Gradients stay allocated across them; activations do not add up."},
    {F(training, framework), K::Choice, kNoRange, kFrameworkIds, 1,
     "framework",
     "Frameworks differ in what they save and allocate (attention kernel, norm, loss, optimizer implementation). Each choice below set to auto follows the framework. Unsloth also sets no ZeRO, no kbit preparation and its offloaded checkpointing."},
    {F(training, precision), K::TableId, kNoRange, {}, 1,
     "precision",
     "How weights, gradients and optimizer states are stored (bytes per parameter), and the dtype of saved activations. A model loaded in bf16 and trained with the HF Trainer's bf16=True is bf16 autocast over bf16 weights (bf16_autocast); pure bf16 runs no autocast; amp_bf16 keeps fp32 weights."},
    {F(training, optimizer), K::TableId, kNoRange, {}, 1,
     "optimizer",
     "AdamW keeps two states per parameter, 8-bit AdamW about 2 bytes, Adafactor a factored second moment, SGD without momentum none. Paged states live outside the GPU allocator."},
    {F(training, optimizer_impl), K::Choice, kNoRange, kOptImpl, 1,
     "optimizer impl",
     "foreach (torch's default on CUDA) builds a temporary as large as one param group's states; fused has none; for_loop one tensor's worth."},
    {F(training, ema), K::Choice, kNoRange, kEma, 2,
     "EMA",
     "An exponential moving average of the trainable weights, as diffusers' training scripts keep it (--use_ema: EMAModel's fp32 shadow copy, updated after each optimizer step). gpu: the copy on the GPU, updated one parameter at a time (two temporaries of the largest). gpu_foreach (--foreach_ema): one fp32 temporary the size of the whole copy during the update. cpu (--offload_ema): the copy in pinned host memory, moved to the GPU for each update."},
    {F(training, activation_checkpointing), K::Choice, kNoRange, kCheckpointing, 1,
     "checkpointing",
     "full: each layer keeps only its input and is recomputed in backward (about 33% more compute). selective: recompute only the attention core (Megatron). selective_op: torchtitan's op-level policy, keeping every other matmul output and the attention output. every_k: checkpoint every k-th layer."},
    {F(training, checkpoint_every_k_layers), K::Integer, {1, 4096}, {}, 1,
     "every k layers",
     "Layers 0, k, 2k, ... are checkpointed; the others keep all their activations."},
    {F(training, checkpoint_reentrant), K::TriState, kNoRange, kTriState, 2,
     "use_reentrant",
     "torch.utils.checkpoint's use_reentrant. true keeps each recomputed layer's output through its backward: HF's gradient checkpointing before transformers 5.0, unless gradient_checkpointing_kwargs sets use_reentrant: False (TRL 0.27+ does). false keeps only what the recomputed graph saved: transformers 5.0+, torchtune, torchtitan, litgpt."},
    {F(training, attention), K::Choice, kNoRange, kAttention, 1,
     "attention",
     "sdpa / flash_attention_2 save q, k, v, the output and a small logsumexp; eager saves the heads x seq^2 softmax. repeat_kv materialises k and v for every query head (GQA). sdpa_math: SDPA's math fallback (inputs no fused kernel takes), which keeps the bf16 heads x seq^2 softmax and scaled copies of q and k."},
    {F(training, norm_impl), K::Choice, kNoRange, kNorm, 1,
     "norm",
     "HF's and torchtune's eager RMSNorm keep an fp32 copy of their input; litgpt also keeps the fp32 normalised input; a fused kernel keeps only its input."},
    {F(training, loss), K::Choice, kNoRange, kLoss, 1,
     "loss",
     "The logits are tokens x vocabulary: HF upcasts them to fp32 (before transformers 4.49 it also shifted a copy: hf_shift_fp32 4.46-4.48, hf_fp32_logits 4.31-4.45 with fp32 logits in the outputs, hf_shift before), chunked losses keep one chunk's fp32 copy at a time, fused linear cross-entropy (Liger) never builds them. Unsloth's follow its version: unsloth_logits keeps 16-bit logits and writes their gradient into them, cut_cross_entropy and unsloth_fused_ce never build them. vocab_chunked is prime-rl's RL head (FusedOutputLinear): each token's log-probability over 2,048-column slices of the vocabulary, recomputed slice by slice in backward with a 16-bit [vocab, hidden] weight gradient."},
    {F(training, loss_chunks), K::Integer, {1, 1024}, {}, 1,
     "loss_chunks",
     "Chunks of a chunked loss (torchtune's CEWithChunkedOutputLoss: 8): fewer chunks hold more fp32 logits at once."},
    {F(training, activation_offload), K::Boolean, kNoRange, {}, 1,
     "CPU activation offload",
     "Saved activations move to host memory after the next layer's forward and come back for backward: about one layer stays on the GPU. Under Unsloth, with full checkpointing, this is use_gradient_checkpointing=\"unsloth\": each layer's input goes to the host (from 2025.3 it comes back into one persistent GPU buffer and the last layer's stays)."},
    {F(training, optimizer_in_backward), K::Boolean, kNoRange, {}, 1,
     "optimizer_in_backward",
     "Step each parameter as soon as its gradient is ready (torchtune's optimizer_in_bwd), freeing the gradient at once; needs gradient accumulation 1 and no ZeRO."},
    {F(training, compile), K::Boolean, kNoRange, {}, 1,
     "torch.compile",
     "Inductor recomputes the cheap pointwise ops in backward: a compiled layer's norms keep only their input and rstd, and SwiGLU does not keep silu(gate). torchtune's chunked loss compiles too."},
    {F(training, train_projector), K::TriState, kNoRange, kTriState, 2,
     "train projector",
     "With a vision tower: whether the projector trains. auto: yes without PEFT; under PEFT no, as peft freezes the base model (TRL, ms-swift and LLaMA-Factory's LoRA runs leave it frozen). true: LLaVA's own scripts, which build the projector after get_peft_model and train it in every stage. A trained projector keeps its inputs for backward, its gradients and optimizer states."},
    {F(training, vit_gradient_checkpointing), K::TriState, kNoRange, kTriState, 2,
     "vit_gradient_checkpointing",
     "With a vision tower: ms-swift's --vit_gradient_checkpointing (on by default from ms-swift 3.5). true: the tower's blocks are checkpointed, and a frozen tower's patch embeddings are made to require grad, so even frozen it keeps each block's input and backward runs through it (and through a frozen merger). auto: the decoder's checkpointing reaches a trained tower, and a frozen one records nothing (transformers' Trainer, TRL, LLaMA-Factory). false: a trained tower keeps its activations."},
    {F(training, train_vision_tower), K::Boolean, kNoRange, {}, 2,
     "train vision tower",
     "With a vision tower: train it in full. Off (LLaVA, ms-swift's freeze_vit, LLaMA-Factory's freeze_vision_tower): it runs under no_grad. On (TRL's full fine-tuning of llava-hf freezes nothing unless told): its blocks keep their activations, or only their inputs when activation checkpointing is on (HF's gradient checkpointing covers the tower's encoder), and it holds gradients and optimizer states."},
    {F(training, zero_grad_set_to_none), K::TriState, kNoRange, kTriState, 1,
     "zero_grad(set_to_none)",
     "true, torch >= 2.0's default: the gradients are freed after each step. false: torch 1.x zeroed them in place, so they stay allocated through the next forward."},
    {F(training, zero_grad_at), K::Choice, kNoRange, kZeroGradAt, 2,
     "zero_grad at",
     "Where the training loop calls zero_grad. after_step: after each optimizer step, so the gradients are gone before the next forward (the HF Trainer, accelerate, torchtune, LitGPT). before_backward: between the loss and its backward, as PyTorch Lightning's automatic optimization does (its closure runs training_step, zero_grad, then backward) and many hand-written loops: the previous step's gradients stay allocated through the next forward, one more copy of the trainable weights' gradients at the forward's end."},
    {F(training, softmax_saves_input), K::TriState, kNoRange, kTriState, 1,
     "softmax keeps its input",
     "Before torch 1.11 (PR #66018) softmax and log_softmax saved their input as well as their output: eager attention kept one more heads x seq^2 tensor per layer, and the loss one more tokens x vocabulary tensor."},
    {F(training, empty_cache_steps), K::Integer, {-1, int64_t{1} << 40}, {}, 1,
     "empty_cache steps",
     "torch.cuda.empty_cache() after every k optimizer steps (HF TrainingArguments.torch_empty_cache_steps); 0 = never; -1 = auto (the HF Trainer of transformers 4.41 emptied it at every step). It hands the allocator's unused cached blocks back to the GPU, so reserved memory stops growing with every new batch size, at the cost of cudaMalloc calls afterwards."},
    {F(training, objective), K::Choice, kNoRange, kObjective, 2,
     "objective",
     "sft: next-token cross-entropy. dpo, orpo, simpo: preference pairs as TRL's DPOTrainer, ORPOTrainer and CPOTrainer (and torchtune's DPO recipes) run them: the chosen and rejected sequences of each pair go through one forward together (twice the rows), the loss takes log-probabilities over the whole vocabulary, and dpo also runs a reference model's forward on top of the policy's saved activations. kto: TRL's KTOTrainer: micro_batch_size unpaired rows, each desirable or undesirable; the policy and the reference each run a no-grad forward of the KL batch (each prompt with another row's completion) besides the batch's. grpo: generation, scoring and the policy's update (the fields below). ppo: TRL's PPOTrainer: a response per prompt generated with the fp32 scores of every token kept through the update, scored by the reference, the value model and the reward model, then the policy and a value model of the same shape (initialised from the reward model, trained in full beside the policy, not checkpointed) update together."},
    {F(training, reference_model), K::Choice, kNoRange, kReferenceModel, 2,
     "reference model",
     "Where dpo's, kto's and ppo's reference log-probabilities come from (grpo's: none is beta = 0). copy: a frozen second model (full fine-tuning's default; sharded like the policy under ZeRO-3 / FSDP). adapter_disabled: the policy with its adapters off (PEFT's default, no second model). precomputed: precompute_ref_log_probs, one pass before training and no reference during it. none: reference-free (orpo and simpo). auto picks by the method and PEFT."},
    {F(training, nll_alpha), K::Number, kNoRange, {}, 2,
     "NLL weight",
     "DPO's rpo_alpha or CPO's cpo_alpha (SimPO): above 0 a cross-entropy over the chosen half adds its own log-softmax of half the logits. ORPO always has one.", {0.0, 1000.0, false, false}},
    {F(training, num_generations), K::Integer, {2, 4096}, {}, 2,
     "generations per prompt",
     "grpo: completions generated for each prompt (GRPOConfig.num_generations). It must divide the completions generated at once across the GPUs (micro_batch_size x data-parallel GPUs x the micro-batches per generation)."},
    {F(training, completion_length), K::Integer, {1, int64_t{1} << 24}, {}, 2,
     "completion length",
     "grpo: tokens generated per completion (max_completion_length; ppo: response_length); the rest of sequence_length is the prompt. Generation's KV cache grows to the whole sequence; the loss takes logits of the completion's tokens only."},
    {F(training, generation_engine), K::Choice, kNoRange, kGenerationEngine, 2,
     "generation engine",
     "grpo: hf_generate (use_vllm false): the policy generates with model.generate and a KV cache that grows by a token at a time (under ZeRO-3 the whole model is gathered first). vllm_colocate: a vLLM engine in the training process holds gpu_memory_utilization of each GPU. vllm_server: the engine runs on other GPUs (trl vllm-serve)."},
    {F(training, gpu_memory_utilization), K::Number, kNoRange, {}, 2,
     "vLLM memory fraction",
     "vllm_colocate: the fraction of each GPU's memory the vLLM engine claims for its weights, activations and KV cache (GRPOConfig.vllm_gpu_memory_utilization, 0.3 by default).", {0.0, 1.0, true, false}},
    {F(training, vllm_sleep), K::Boolean, kNoRange, {}, 2,
     "vLLM sleep mode",
     "vllm_colocate: vllm_enable_sleep_mode: the engine frees its KV cache and offloads its weights while the policy trains, and wakes for generation."},
    {F(training, reward_model), K::Choice, kNoRange, kRewardModel, 2,
     "reward model",
     "grpo: none (reward functions: rules, nothing on the GPU) or same_as_policy: a frozen reward model of the policy's architecture (AutoModelForSequenceClassification), loaded like the policy, sharded under ZeRO-3 from TRL 0.17, which scores the whole generation batch in one no-grad forward. ppo needs same_as_policy: the reward model, and the value model TRL initialises from it, are of the policy's shape."},
    {F(training, value_model), K::Choice, kNoRange, kValueModel, 3,
     "value model",
     "ppo: how the value model (the policy's shape, initialised from the reward model) trains beside the policy. full: every parameter, as TRL's PPOTrainer does (it wraps only the policy with PEFT). peft: the policy's PEFT method and quantization on it too, as ms-swift prepares it."},
    {F(training, use_cache), K::Boolean, kNoRange, {}, 3,
     "use_cache",
     "ppo: the models' config.use_cache (true in transformers' configs). TRL's forward() passes none, so the reference model's scoring forward keeps every layer's keys and values in its output until the log-probabilities are taken (2 x layers x rows x tokens x kv width), and without gradient checkpointing the policy's training forward keeps its own with its output until the next micro-batch. false: ms-swift, which sets use_cache to false on every model."},
    {F(training, steps_per_generation), K::Integer, {0, int64_t{1} << 20}, {}, 2,
     "steps per generation",
     "grpo, TRL 0.18+: steps_per_generation: each generation makes micro_batch_size x this many completions per GPU (0: gradient_accumulation_steps, TRL's default). Where generations do not fall on optimizer-step boundaries, one runs with the step's accumulated gradients alive. The policy scores its own completions first (old_per_token_logps) where TRL needs it: above gradient_accumulation_steps (0.18-0.19), or where the accumulation steps are not a multiple of this x num_iterations (0.20+)."},
    {F(training, num_iterations), K::Integer, {1, 1 << 16}, {}, 2,
     "iterations per generation",
     "grpo, TRL 0.16+: num_iterations: the optimization passes over each generation batch (ppo: num_ppo_epochs; the fp32 scores of the generation stay through all of them). Above 1 the policy scores its completions under no_grad first (old_per_token_logps; from TRL 0.20 only where generations do not align with optimizer steps)."},
    {F(training, vllm_server_tensor_parallel_size), K::Integer, {1, 1024}, {}, 2,
     "server tensor parallel",
     "vllm_server: trl vllm-serve --tensor_parallel_size: the GPUs each server engine splits the model over (1 before TRL 0.16, whose engine ran on one vllm_device). Each GPU holds its share of the 16-bit weights and of the KV heads."},
    {F(training, vllm_server_data_parallel_size), K::Integer, {1, 1 << 16}, {}, 2,
     "server data parallel",
     "vllm_server, TRL 0.17+: trl vllm-serve --data_parallel_size: engines side by side, each on tensor-parallel-size GPUs of its own. The server's GPUs are tensor x data parallel."},
    {F(training, vllm_server_gpu_memory_utilization), K::Number, kNoRange, {}, 2,
     "server memory fraction",
     "vllm_server: trl vllm-serve --gpu_memory_utilization (0.9 by default; GRPOConfig.vllm_gpu_memory_utilization in TRL 0.15): the share of each server GPU vLLM claims for its weights, activations and KV cache. From vLLM 0.9.1 it refuses to start when the share exceeds the GPU's free memory.", {0.0, 1.0, true, false}},
    {F(training, vllm_max_model_len), K::Integer, {0, 1 << 26}, {}, 2,
     "vLLM max_model_len",
     "vllm_server and vllm_colocate: the engine's max_model_len: trl vllm-serve --max_model_len, or GRPOConfig.vllm_max_model_length (TRL 0.26+). 0: TRL's default, the model's max_position_embeddings (a colocated engine before TRL 0.26: the prompt and completion, training.sequence_length). vLLM refuses to start when its KV cache cannot hold one request this long; at least training.sequence_length."},
    {F(training, eval_batch_size), K::Integer, {0, 1 << 20}, {}, 2,
     "eval batch size",
     "An evaluation during training (HF eval_strategy \"steps\" or \"epoch\" with per_device_eval_batch_size, 8 by default there; litgpt's and torchtune's validation loops): this many sequences of training.sequence_length go through the model under no_grad, with the loss; memsim runs one after the first optimizer step, so that later steps start from the cache it leaves. Nothing is saved for backward and no layer is recomputed, but the whole batch's logits and the loss's fp32 copies of them exist at once, so a batch larger than the training micro-batch can set the run's peak. 0: no evaluation."},
    {F(training, eval_logits_batches), K::Integer, {0, 1 << 16}, {}, 2,
     "eval batches of logits kept",
     "HF Trainer evaluation with compute_metrics (and no preprocess_logits_for_metrics that reduces the logits): the evaluation loop gathers each batch's logits from every data-parallel GPU and concatenates them on the GPU, [eval_batch_size x data-parallel GPUs, sequence, vocabulary] per batch, until eval_accumulation_steps batches move them to the host, or to the end of the evaluation when that is unset. This many batches: eval_accumulation_steps, or the eval set's batches. 0: the loss only (no compute_metrics)."},
    {F(peft, method), K::Choice, kNoRange, kPeftMethod, 1,
     "method",
     "none: full fine-tuning. Every other method freezes the base: only what it adds has gradients and optimizer states, and frozen layers keep fewer activations. LoRA/DoRA: low-rank adapters; IA3: one learned vector per targeted linear; ln_tuning: trainable copies of the norms; prompt_tuning: learned virtual tokens before every sequence; adapter and adapter_v2: litgpt's LLaMA-Adapter (an adaption prompt attended to in every layer from adapter_start_layer; v2 adds a trainable bias and scale to every linear and trains the norms); adaption_prompt: PEFT's LLaMA-Adapter (AdaptionPromptConfig, Llama and Mistral); prefix_tuning: learned keys and values put before every layer's own through transformers' cache (PrefixTuningConfig without prefix_projection, SDPA, transformers 4.56 or later)."},
    {F(peft, lora_rank), K::Integer, {1, 1 << 16}, {}, 1,
     "rank",
     "Adapter rank r: each adapted linear gains r x (in + out) trainable parameters."},
    {F(peft, lora_alpha), K::Number, kNoRange, {}, 1,
     "alpha",
     "Scaling alpha / r; no memory effect.", {0.0, 1e6, true, true}},
    {F(peft, lora_dropout), K::Number, kNoRange, {}, 1,
     "dropout",
     "Above 0, every adapted linear keeps its own dropout output and a 1-byte mask of its input.", {0.0, 1.0}},
    {F(peft, target_modules), K::Text, kNoRange, {}, 1,
     "target_modules",
     "Module names to adapt (PEFT target_modules), comma-separated, or all-linear; for ln_tuning, the norms that get a trainable copy."},
    {F(peft, feedforward_modules), K::Text, kNoRange, {}, 1,
     "feedforward_modules",
     "IA3Config feedforward_modules: targeted linears whose input the vector scales (one value per input feature, and an fp32 copy of the input kept); the others scale their output (the pre-scale output kept: in its own dtype from peft 0.11, an fp32 cast of it before)."},
    {F(peft, num_virtual_tokens), K::Integer, {1, 1 << 16}, {}, 1,
     "virtual tokens",
     "PromptTuningConfig num_virtual_tokens: learned embeddings put before every sequence, so the layers and the loss see sequence_length + this many positions. PrefixTuningConfig num_virtual_tokens: learned keys and values before every layer's, so each attention reads this many more keys (and a mask of that width)."},
    {F(peft, adapter_prompt_length), K::Integer, {1, 1 << 16}, {}, 2,
     "adaption prompt length",
     "litgpt adapter / adapter_v2 (adapter.py Config adapter_prompt_length, 10) or PEFT adaption_prompt (AdaptionPromptConfig adapter_len): learned prompt rows per adapted layer; every token also attends to them, a second attention whose output the gate keeps (PEFT's keeps its scores too, eager, [heads, tokens, this many] per layer)."},
    {F(peft, adapter_start_layer), K::Integer, {0, 1 << 20}, {}, 2,
     "adapter start layer",
     "litgpt adapter / adapter_v2 (adapter.py Config adapter_start_layer, 2): the first layer with an adaption prompt. PEFT adaption_prompt adapts the top adapter_layers layers: this is num_hidden_layers - adapter_layers. With adapter (v1) and adaption_prompt the layers below it train nothing and need no gradient, so they keep nothing for backward."},
    {F(peft, adapter_dtype), K::Choice, kNoRange, kAdapterDtype, 1,
     "adapter dtype",
     "PEFT keeps adapters in fp32 by default (autocast_adapter_dtype, peft 0.12+; 0.6-0.11 cast them to a bf16/fp16 base's dtype); IA3 vectors and prompt embeddings are created in fp32. An adapter dtype other than the activations' makes each adapted linear keep a cast copy."},
    {F(peft, base_quantization), K::Choice, kNoRange, kBaseQuantization, 1,
     "base storage",
     "How the frozen linears are stored: the precision's dtype, LLM.int8 (1 byte + row scales), 4-bit NF4/FP4 (4.5 bits per weight, 4.127 with double quantization), or a 4-bit GPTQ/AWQ checkpoint (packed int32 with fp16 scales per group). GPTQ trains through auto-gptq's torch path (exllama off, as transformers asks for PEFT), which keeps a dequantized fp16 copy of every linear until backward unless checkpointing recomputes it."},
    {F(peft, double_quantization), K::Boolean, kNoRange, {}, 1,
     "double quantization",
     "Quantizes the 4-bit blocks' scales too: 0.127 instead of 0.5 bits per weight."},
    {F(peft, quant_group_size), K::Integer, {-1, 1 << 16}, {}, 2,
     "quantization group size",
     "GPTQConfig / AwqConfig group_size: input features that share one fp16 scale and zero; -1 is one group per row."},
    {F(peft, prepare_kbit), K::TriState, kNoRange, kTriState, 1,
     "prepare_model_for_kbit_training",
     "PEFT's helper casts every parameter that is not quantized (embeddings, head, norms) to fp32. auto: called where the framework uses PEFT (the HF Trainer; TRL's SFTTrainer before 0.26, DPOTrainer before 0.29), not by Unsloth, torchtune or litgpt."},
    {F(peft, bnb_saves_input), K::TriState, kNoRange, kTriState, 1,
     "4-bit keeps its input",
     "bitsandbytes before 0.43.2 keeps every 4-bit linear's input for backward although the frozen weight needs no gradient (PR #1270): about 2 bytes x tokens x (3h + f) per layer."},
    {F(peft, modules_to_save), K::Text, kNoRange, {}, 1,
     "modules_to_save",
     "Modules trained in full beside the adapters (PEFT modules_to_save)."},
    {F(parallel, data_parallel_size), K::Integer, {1, 1 << 24}, {}, 1,
     "data_parallel",
     "GPUs that each train on their own data. With sharding they share the model states. It follows from the question's GPUs / (tensor x pipeline x context parallel); set here, it sets the GPUs."},
    {F(parallel, zero_stage), K::Integer, {0, 3}, {}, 1,
     "zero_stage",
     "What the data-parallel GPUs shard: 1 the optimizer states (ZeRO-1, Megatron's distributed optimizer), 2 also the gradients (ZeRO-2, FSDP SHARD_GRAD_OP), 3 also the weights (ZeRO-3, FSDP FULL_SHARD). Rajbhandari et al. 2020."},
    {F(parallel, sharding), K::Choice, kNoRange, kSharding, 1,
     "sharding engine",
     "Whose code shards the states: DeepSpeed ZeRO (flat partitions, reduce buckets), FSDP1 (flat parameters per unit), FSDP2 (per-parameter shards, fp32 shards under mixed precision) or Megatron (main-grad buffer, distributed optimizer)."},
    {F(parallel, shard_group_size), K::Integer, {0, 1 << 24}, {}, 1,
     "shard group (HSDP)",
     "Hybrid sharding: shard within groups of this many GPUs (often one node) and replicate across groups. 0 shards over all data-parallel GPUs."},
    {F(parallel, fsdp_backward_prefetch), K::Choice, kNoRange, kBackwardPrefetch, 1,
     "backward prefetch",
     "backward_pre holds the current and the next unit's parameters with the current gradients; backward_post and none hold one unit's parameters."},
    {F(parallel, fsdp_forward_prefetch), K::Integer, {0, 4096}, {}, 1,
     "forward prefetch",
     "Units all-gathered ahead in forward, their parameters held with the current one's: FSDP1 forward_prefetch=True is 1; FSDP2 set_modules_to_forward_prefetch(k blocks) is k."},
    {F(parallel, fsdp2_backward_prefetch), K::Integer, {0, 4096}, {}, 1,
     "backward prefetch",
     "Blocks all-gathered ahead in backward: 1 is FSDP2's own prefetch of the next block, k what set_modules_to_backward_prefetch(k blocks) asks for, 0 none."},
    {F(parallel, fsdp_shard_embeddings), K::Boolean, kNoRange, {}, 2,
     "embeddings as own units",
     "The token embedding and the output layer are FSDP2 units of their own (torchtune's custom_sharded_layers ['tok_embeddings', 'output']): each is resharded after its forward and all-gathered again in backward, instead of staying unsharded in the root."},
    {F(parallel, fsdp_use_orig_params), K::TriState, kNoRange, kTriState, 1,
     "use_orig_params",
     "true: a unit that trains any tensor (a LoRA Block) keeps gradients for its frozen weights too, as if they were not frozen. auto follows the framework (Lightning Fabric sets it; FSDP1's own default is false)."},
    {F(parallel, fsdp_no_sync), K::TriState, kNoRange, kTriState, 1,
     "accumulate under no_sync",
     "true: micro-batches before the last keep unsharded gradients of the whole model (FSDP's no_sync(), as HF Trainer and Lightning Fabric accumulate); false: every micro-batch reduce-scatters (Accelerate's sync_each_batch=True). auto follows the framework."},
    {F(parallel, fsdp_checkpoint_in_units), K::Boolean, kNoRange, {}, 2,
     "checkpoint inside FSDP units",
     "FSDP1 with activation checkpointing: the checkpoint wrapper sits inside each FSDP unit (torch's apply_activation_checkpointing applied after the FSDP wrap: Accelerate's fsdp_activation_checkpointing, Answer.AI's fsdp_qlora, llama-recipes) rather than around it (transformers' gradient_checkpointing_enable under the HF Trainer). Inside, the unit's forward runs with grad, so under reentrant checkpointing of frozen layers FSDP's reshard-only hook holds no recomputed inputs and backward prefetch works as usual."},
    {F(parallel, tensor_parallel_size), K::Integer, {1, 1024}, {}, 1,
     "tensor_parallel",
     "Megatron tensor parallelism: attention heads, the MLP and the vocabulary are split over t GPUs; norms and the residual stream are not (unless sequence parallel)."},
    {F(parallel, sequence_parallel), K::Boolean, kNoRange, {}, 1,
     "sequence parallel",
     "Also splits the tokens that norms, dropout and the residual stream hold, by t."},
    {F(parallel, context_parallel_size), K::Integer, {1, 1024}, {}, 1,
     "context_parallel",
     "Ring attention: every GPU holds sequence / cp tokens of each sequence, so activations shrink by cp; key/value chunks circulate in small buffers."},
    {F(parallel, cp_rotate_method), K::Choice, kNoRange, kCpRotate, 2,
     "cp_rotate_method",
     "Context parallel's exchange of keys and values: allgather gathers every rank's, alltoall passes them around the ring (torch's _cp_options.rotate_method); auto is the framework's."},
    {F(parallel, expert_parallel_size), K::Integer, {1, 1 << 16}, {}, 1,
     "expert_parallel",
     "Each GPU of an expert-parallel group holds num_experts / ep routed experts; tokens travel to their experts through all-to-all buffers."},
    {F(parallel, pipeline_parallel_size), K::Integer, {1, 1024}, {}, 1,
     "pipeline_parallel",
     "Layers split into stages on different GPUs. Each stage is its own device below: the first holds the embeddings and the most micro-batches in flight, the last the head and the loss."},
    {F(parallel, pipeline_schedule), K::Choice, kNoRange, kSchedules, 1,
     "schedule",
     "1F1B keeps at most (stages - stage) micro-batches in flight; GPipe all of them; interleaved 1F1B runs v model chunks per GPU, holding 1 + (p-1)/(p v) times 1F1B's activations on the first stage. Gradient accumulation sets the number of micro-batches."},
    {F(parallel, virtual_pipeline_stages), K::Integer, {1, 1024}, {}, 1,
     "virtual stages",
     "Model chunks per GPU (Megatron's virtual pipeline size)."},
    {F(parallel, pipeline_first_stage_layers), K::Integer, {0, 4096}, {}, 1,
     "first stage layers",
     "Uneven split: layers on the first stage, which also holds the embeddings (0 = even)."},
    {F(parallel, pipeline_last_stage_layers), K::Integer, {0, 4096}, {}, 1,
     "last stage layers",
     "Uneven split: layers on the last stage, which also holds the head and loss (0 = even)."},
    {F(parallel, offload_optimizer), K::Choice, kNoRange, kOffload, 1,
     "offload optimizer",
     "ZeRO-Offload / FSDP CPUOffload: the fp32 master, the optimizer states and the gradient shards live in host RAM (or NVMe, DeepSpeed) and the step runs on the CPU."},
    {F(parallel, offload_params), K::Choice, kNoRange, kOffload, 1,
     "offload params",
     "ZeRO-Infinity / FSDP CPUOffload: parameter shards live in host RAM and are copied in per layer. Needs stage 3."},
    {F(parallel, zero_reduce_bucket_size), K::Integer, {0, int64_t(1) << 40}, {}, 1,
     "reduce_bucket_size",
     "Elements per gradient bucket (0 = DeepSpeed's 5e8; HF's auto = hidden^2). One bucket, two with overlap_comm, in the model dtype."},
    {F(parallel, zero_overlap_comm), K::TriState, kNoRange, kTriState, 1,
     "overlap_comm",
     "auto: on for stage 3 only, as DeepSpeed's config validator does."},
    {F(parallel, zero_prefetch_bucket_size), K::Integer, {0, int64_t(1) << 40}, {}, 1,
     "prefetch_bucket",
     "Elements of the next layer all-gathered ahead (0 = DeepSpeed's 5e7)."},
    {F(parallel, zero_param_persistence_threshold), K::Integer, {0, int64_t(1) << 40}, {}, 1,
     "persistence_threshold",
     "Parameters smaller than this stay whole on every GPU (0 = DeepSpeed's 1e5)."},
    {F(parallel, zero_max_live_parameters), K::Integer, {0, int64_t(1) << 40}, {}, 1,
     "max_live_parameters",
     "At most this many elements are gathered at once, the prefetch included (0 = DeepSpeed's 1e9)."},
    {F(parallel, ddp_gradient_as_bucket_view), K::Boolean, kNoRange, {}, 1,
     "gradient_as_bucket_view",
     "PyTorch DDP: gradients become views into the all-reduce buckets from the second iteration, saving one copy of the gradients."},
    {F(hardware, gpu), K::TableId, kNoRange, {}, 1,
     "gpu",
     "The GPU card: its memory as the process sees it (nvidia-smi total); custom: hardware.gpu_memory_bytes gives it."},
    {F(hardware, gpu_memory_bytes), K::Integer, {0, int64_t(1) << 50}, {}, 1,
     "capacity (bytes)",
     "Total memory of the custom GPU, in bytes."},
    {F(hardware, headroom_fraction), K::Number, kNoRange, {}, 1,
     "headroom_fraction",
     "Memory kept free for what no model predicts (other processes, allocator spikes). Practitioners budget 10-15%; memsim's own uncertainty is the band under each verdict, and the verdict fits only when the band's top is under this line.", {0.0, 1.0}},
    {F(hardware, cuda_context_bytes), K::Integer, {0, int64_t(1) << 40}, {}, 1,
     "CUDA context (bytes)",
     "Memory the CUDA context and its loaded kernels take outside PyTorch's allocator; 0 uses the measured default for the GPU and module loading (254 MiB lazy; 767 MiB lazy on Hopper). Old CUDA loads eagerly: 0.7-1.4 GiB."},
    {F(hardware, cuda_module_loading), K::Choice, kNoRange, kModuleLoading, 1,
     "CUDA module loading",
     "lazy (CUDA 11.7+ with PyTorch 1.13+, the default) loads kernels on first use: a context of 254 MiB (PyTorch PR #86509), 767 MiB on Hopper after real training steps (memsim's own H200 calibration); eager (older CUDA or PyTorch) loads them all: 616 MiB."},
    {F(hardware, expandable_segments), K::TriState, kNoRange, kTriState, 1,
     "expandable segments",
     "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (auto: on where the launcher sets it, torchtitan's run_train.sh): one segment per stream that grows by mapping 20 MiB pages (2 MiB for requests up to 1 MiB), instead of one cudaMalloc per segment. No segment rounding, but a freed block between live ones stays mapped, so reserved can come out lower or higher than the default."},
    {F(hardware, nccl_channels), K::Integer, {1, 64}, {}, 1,
     "NCCL channels",
     "NCCL's buffers (outside PyTorch's allocator) grow with channels x communicators: about 18 MiB per channel per communicator. NCCL's log says \"N coll channels\"."},
    {F(hardware, gpus_per_node), K::Integer, {1, 1024}, {}, 1,
     "GPUs per node (at most)",
     "The most GPUs one host holds: a setup on fewer GPUs takes one node of that many; more take GPUs / this nodes, rounded up (the question's nodes field sets it). The offloaded states of a node's GPUs share its RAM."},
    {F(hardware, host_memory_bytes), K::Integer, {0, int64_t(1) << 50}, {}, 1,
     "host RAM per node (bytes)",
     "With offload, the node's RAM the offloaded states must fit in; 0 shows the need without a verdict."},
    {F(data, lengths), K::Choice, kNoRange, kLengths, 1,
     "lengths",
     "fixed: every micro-batch holds sequence_length tokens per sequence, as packed data or padding to max_length gives, and memsim replays two steps. Listed or a distribution: every micro-batch has its own length, and memsim replays the run step by step through one allocator, whose cache is carried along: the peak belongs to the longest batch, and reserved memory grows as batches of new sizes cannot reuse the cached blocks."},
    {F(data, micro_batch_lengths), K::Text, kNoRange, {}, 1,
     "micro_batch_lengths",
     "With lengths micro_batches: each micro-batch's padded length in order, comma-separated (512,380,1024)."},
    {F(data, sample_lengths), K::Text, kNoRange, {}, 1,
     "sample_lengths",
     "With lengths samples: the per-sample token lengths as percentiles (p0=12,p50=310,p90=720,p100=2048) or a histogram of bins with weights (0-256:40,256-512:35,512-2048:25). Samples longer than sequence_length are truncated to it."},
    {F(data, padding), K::Choice, kNoRange, kPadding, 1,
     "padding",
     "longest: the collator pads each micro-batch to its longest sample (HF DataCollatorWithPadding, padding=True). max_length: to sequence_length, the fixed shape's cost. none: the samples are concatenated into one row without padding (DataCollatorWithFlattening, padding-free attention)."},
    {F(data, pad_to_multiple_of), K::Integer, {1, 1 << 16}, {}, 1,
     "pad to a multiple of",
     "The collator's pad_to_multiple_of: each micro-batch's length is rounded up to it (8 or 64 for tensor cores). Fewer distinct lengths also let the allocator reuse more of its cache."},
    {F(data, group_by_length), K::Boolean, kNoRange, {}, 1,
     "group_by_length",
     "HF TrainingArguments.group_by_length (LengthGroupedSampler): samples of similar length go into the same batches, less padding; its very first batch holds the longest sample."},
    {F(data, longest_first), K::Boolean, kNoRange, {}, 1,
     "longest sample first",
     "The first micro-batch holds the longest sample, as lit-gpt's 2023 fine-tuning loops did, so that an out-of-memory error comes at once; otherwise the shuffle places it."},
    {F(data, dataset_samples), K::Integer, {0, int64_t{1} << 40}, {}, 1,
     "dataset samples",
     "Samples in the training set; 0 = not given. With steps at 0 it sets the run's length: samples x epochs over the samples one step takes on a GPU (micro-batch x accumulation x data parallel)."},
    {F(data, epochs), K::Integer, {1, 1 << 20}, {}, 1,
     "epochs",
     "Passes over the dataset; each holds its longest sample."},
    {F(data, steps), K::Integer, {0, int64_t{1} << 40}, {}, 1,
     "steps",
     "Optimizer steps memsim replays; 0 = auto: a listed run once, or a distribution's run length from the dataset's size, at most 2,000 steps."},
    {F(data, seed), K::Integer, {0, int64_t{1} << 62}, {}, 1,
     "seed",
     "Seed of the draws and the shuffle: the same seed replays the same run, another seed another order of the same data."},
    {F(data, images_per_sample), K::Integer, {0, 64}, {}, 2,
     "images per sample",
     "With a vision tower: images in each sample. Each brings the tower's patch tokens into the sequence, which sequence_length counts (the processor expands <image> before batching); 0: text-only batches."},
    {F(versions, torch), K::Text, kNoRange, {}, 2,
     "torch",
     "The torch version: latest, or a release such as 2.1 or 2.1.2. The switches left at auto derive from it."},
    {F(versions, transformers), K::Text, kNoRange, {}, 2,
     "transformers",
     "The transformers version: latest, or a release such as 2.1 or 2.1.2. The switches left at auto derive from it."},
    {F(versions, peft), K::Text, kNoRange, {}, 2,
     "peft",
     "The peft version: latest, or a release such as 2.1 or 2.1.2. The switches left at auto derive from it."},
    {F(versions, bitsandbytes), K::Text, kNoRange, {}, 2,
     "bitsandbytes",
     "The bitsandbytes version: latest, or a release such as 2.1 or 2.1.2. The switches left at auto derive from it."},
    {F(versions, deepspeed), K::Text, kNoRange, {}, 2,
     "deepspeed",
     "The DeepSpeed version: latest, or a release such as 2.1 or 2.1.2. The switches left at auto derive from it."},
    {F(versions, torchao), K::Text, kNoRange, {}, 2,
     "torchao",
     "The torchao version: latest, or a release such as 2.1 or 2.1.2. The switches left at auto derive from it."},
    {F(versions, flash_attn), K::Text, kNoRange, {}, 2,
     "flash_attn",
     "The flash-attn version: latest, or a release such as 2.1 or 2.1.2. The switches left at auto derive from it."},
    {F(versions, torchtune), K::Text, kNoRange, {}, 2,
     "torchtune",
     "The torchtune version: latest, or a release such as 2.1 or 2.1.2. The switches left at auto derive from it."},
    {F(versions, unsloth), K::Text, kNoRange, {}, 2,
     "unsloth",
     "Unsloth's version: latest, or a release such as 2025.3 (its releases are year.month). The switches left at auto derive from it."},
    {F(versions, trl), K::Text, kNoRange, {}, 2,
     "trl",
     "The TRL version: latest, or a release such as 0.11 or 0.19.1. A preference objective's log-probabilities and which logits outlive the policy's forward derive from it."},
    {F(versions, vllm), K::Text, kNoRange, {}, 2,
     "vllm",
     "The vLLM version: latest, or a release such as 0.8.5 or 0.10.1. For grpo with vllm_colocate: from 0.8.0 to 0.9.0 (the V1 engine before 0.9.1) gpu_memory_utilization capped the whole process, so the trainer's memory at the engine's start comes out of the engine's share; before 0.8 and from 0.9.1 it is the engine's own."},
    {F(versions, liger), K::Text, kNoRange, {}, 3,
     "liger-kernel",
     "The liger-kernel version: latest, or a release such as 0.6.4. For grpo with training.loss fused_linear (TRL's use_liger_loss, use_liger_kernel from 0.25): from 0.5.4 each completion's weight gradient is a 16-bit [vocab, hidden] tensor; from 0.8.0 an fp32 one and its 16-bit cast."},
    {F(versions, date), K::Text, kNoRange, {}, 2,
     "date",
     "A date (2023-10 or 2023-10-15): every library left at latest takes its newest release dated on or before that day; empty: none."},
};
// clang-format on
#undef F

}  // namespace

std::span<const FieldSpec> fields() { return kFields; }

const FieldSpec* find_field(std::string_view key) {
  for (const FieldSpec& f : kFields)
    if (f.key == key) return &f;
  return nullptr;
}

std::vector<std::string> table_ids(std::string_view key) {
  std::vector<std::string> ids;
  auto add = [&](const auto& table) {
    for (const auto& row : table) ids.emplace_back(row.id);
  };
  if (key == "training.precision") add(precision_recipes());
  else if (key == "training.optimizer") add(optimizers());
  else if (key == "hardware.gpu") add(gpus()), ids.emplace_back("custom");
  return ids;
}

std::span<const std::string_view> choices(std::string_view field) {
  const FieldSpec* f = find_field(field);
  return f ? f->choices : std::span<const std::string_view>{};
}

IntRange int_range(std::string_view field) {
  const FieldSpec* f = find_field(field);
  return f && f->kind == FieldKind::Integer ? f->range : kNoRange;
}

std::vector<std::string> ranged_fields() {
  std::vector<std::string> keys;
  for (const FieldSpec& f : kFields)
    if (f.kind == FieldKind::Integer && f.range.min != kNoRange.min) keys.emplace_back(f.key);
  std::sort(keys.begin(), keys.end());
  return keys;
}

namespace {

std::string joined(std::span<const std::string_view> names) {
  std::string s;
  for (std::string_view n : names) s += (s.empty() ? "" : ", ") + std::string(n);
  return s;
}

std::string number_text(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.10g", v);
  return text;
}

}  // namespace

std::string NumberRange::words() const {
  const std::string lo = number_text(min), hi = number_text(max);
  if (min_exclusive) return "above " + lo + " and " + (max_exclusive ? "below " : "at most ") + hi;
  return "from " + lo + " to " + (max_exclusive ? "below " : "") + hi;
}

std::vector<FieldDescription> field_descriptions() {
  const nlohmann::json defaults = nlohmann::json::parse(config_to_json(Config{}));
  std::vector<FieldDescription> out;
  for (const FieldSpec& f : kFields) {
    FieldDescription d;
    d.key = std::string(f.key);
    d.help = std::string(f.help);
    const nlohmann::json& v = defaults[std::string(f.section())][std::string(f.name())];
    d.default_value = v.is_string() ? v.get<std::string>() : v.dump();
    switch (f.kind) {
      case FieldKind::Integer:
        d.type = "integer";
        if (f.range.min != kNoRange.min) d.allowed = std::to_string(f.range.min) + " to " + std::to_string(f.range.max);
        break;
      case FieldKind::Number:
        d.type = "number";
        if (f.number.bounded()) d.allowed = f.number.words();
        break;
      case FieldKind::Boolean: d.type = "boolean", d.allowed = "true, false"; break;
      case FieldKind::Text: d.type = "string"; break;
      case FieldKind::Choice:
      case FieldKind::TriState:
      case FieldKind::Enum: d.type = "choice", d.allowed = joined(f.choices); break;
      case FieldKind::TableId: {
        d.type = "choice";
        for (const std::string& id : table_ids(f.key)) d.allowed += (d.allowed.empty() ? "" : ", ") + id;
        break;
      }
    }
    out.push_back(std::move(d));
  }
  return out;
}

std::string config_json_schema() {
  using json = nlohmann::ordered_json;
  const json defaults = json::parse(config_to_json(Config{}));
  json sections = json::object();
  for (const FieldSpec& f : kFields) {
    const std::string section(f.section()), name(f.name());
    json p = json::object();
    p["description"] = std::string(f.help);
    switch (f.kind) {
      case FieldKind::Integer:
        p["type"] = "integer";
        if (f.range.min != kNoRange.min) p["minimum"] = f.range.min, p["maximum"] = f.range.max;
        break;
      case FieldKind::Number:
        p["type"] = "number";
        if (f.number.bounded()) {
          p[f.number.min_exclusive ? "exclusiveMinimum" : "minimum"] = f.number.min;
          p[f.number.max_exclusive ? "exclusiveMaximum" : "maximum"] = f.number.max;
        }
        break;
      case FieldKind::Boolean: p["type"] = "boolean"; break;
      case FieldKind::Text:
        if (f.key == "data.micro_batch_lengths")  // the reader also takes a JSON array of integers (serialize.cpp)
          p["anyOf"] = json::array({json{{"type", "string"}}, json{{"type", "array"}, {"items", {{"type", "integer"}}}}});
        else if (f.key == "model.architecture")  // ... and a model program inline, as the object it is (architecture.h)
          p["anyOf"] = json::array({json{{"type", "string"}}, json{{"type", "object"}}});
        else
          p["type"] = "string";
        break;
      case FieldKind::TriState:  // the reader also takes a JSON boolean for true and false
        p["enum"] = json::array({"auto", "true", "false", true, false});
        break;
      case FieldKind::Choice:
      case FieldKind::Enum: {
        p["type"] = "string";
        json e = json::array();
        for (std::string_view v : f.choices) e.push_back(std::string(v));
        p["enum"] = e;
        break;
      }
      case FieldKind::TableId: {
        p["type"] = "string";
        json e = json::array();
        for (const std::string& v : table_ids(f.key)) e.push_back(v);
        p["enum"] = e;
        break;
      }
    }
    p["default"] = defaults[section][name];
    if (f.since_schema > 1) p["x-memsim-since-schema"] = f.since_schema;
    json& s = sections[section];
    if (s.is_null()) {
      s = json{{"type", "object"}, {"additionalProperties", false}, {"properties", json::object()}};
      if (section == "model") {  // a Hugging Face config.json is a model section (serialize.cpp model_from_hf_json)
        s["description"] = "The model, in Hugging Face config.json keys: a config.json is a valid model section (its "
                           "aliases such as n_embd and d_model are read, keys that change no memory are ignored). A "
                           "model section needs hidden_size, num_hidden_layers, num_attention_heads, vocab_size and "
                           "intermediate_size (or their aliases); a file without one keeps the default model.";
        s["additionalProperties"] = true;
      }
    }
    s["properties"][name] = p;
  }
  json schema = json::object();
  schema["$schema"] = "https://json-schema.org/draft/2020-12/schema";
  schema["$id"] = "https://memsim.dev/config.schema.json";
  schema["title"] = "memsim config";
  schema["description"] = "A memsim training-job description (memsim-cli estimate --config FILE). Every section and "
                          "field is optional: what a file leaves out takes the default. Generated by memsim-cli schema "
                          "from the field registry (src/core/fields.cpp).";
  schema["type"] = "object";
  schema["additionalProperties"] = false;
  json props = json::object();
  props["schema"] = json{{"description", "The config schema version this file is written in; older ones are migrated."},
                         {"type", "integer"}, {"minimum", 1}, {"maximum", kConfigSchema}, {"default", kConfigSchema}};
  for (auto& [section, s] : sections.items()) props[section] = s;
  schema["properties"] = props;
  return schema.dump(2) + "\n";
}

}  // namespace memsim
