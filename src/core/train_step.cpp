// The training step's skeleton: the builder's setup (the micro-batch's dims, the shard plan), the workspaces before
// the first step, the iterations and a run of steps. What parameters cost is in model_states.cpp, what the engines
// do with weights and gradients in sharding.cpp, the optimizer in optimizer_step.cpp, the order of micro-batches in
// schedule.cpp, and what autograd saves between forward and backward in activations.cpp and loss.cpp.
#include "train_step.h"

#include <algorithm>
#include <string>

#include "checked.h"
#include "simulate.h"
#include "step_builder.h"

namespace memsim {

namespace {

// cuBLAS workspace per (handle, stream), allocated through the caching allocator on the first matmul:
// aten/src/ATen/cuda/CublasHandlePool.cpp::parseChosenWorkspaceSize (26a3905): ":4096:8" (32 MiB) on sm90,
// else ":4096:2:16:8" = 2*4 MiB + 8*16 KiB. cuBLASLt adds its own 1 MiB (parseCUDABlasLtWorkspaceSize).
int64_t cublas_workspace_bytes(const GpuSpec* gpu) {
  if (gpu && gpu->compute_capability >= 90) return 4096 * kKiB * 8;
  return 2 * 4096 * kKiB + 8 * 16 * kKiB;
}
constexpr int64_t kCublasLtWorkspaceBytes = 1024 * kKiB;

}  // namespace

int64_t StepBuilder::state_dtype_of(const ParamTensor& t) const {
  if (t.kind == ParamKind::Adapter) return adapter_bytes();
  if (resolved_.kbit_cast) return 4;
  return recipe_.state_bytes;
}

int64_t StepBuilder::flat_partition_numel() const {
  if (flat_numel_cache_ >= 0) return flat_numel_cache_;
  int64_t n = 0;
  for_each_param(ctx_, [&](const ParamTensor& t) { n = add(n, states_of(t).flat_numel); });
  flat_numel_cache_ = n;
  return n;
}

bool StepBuilder::trainable_module(const char* module) const {
  for (const auto* list : {&shape_.layer, &shape_.moe_layer, &shape_.decoder_layer, &shape_.post})
    for (const auto& t : *list)
      if (has_grad(t) && t.kind != ParamKind::Adapter && module_name_view(t.name) == module) return true;
  for (const auto& list : shape_.block_kinds)
    for (const auto& t : list)
      if (has_grad(t) && t.kind != ParamKind::Adapter && module_name_view(t.name) == module) return true;
  return false;
}

int64_t StepBuilder::adapter_bytes() const { return adapter_bytes_; }
int64_t StepBuilder::weight_bytes_of(const ParamTensor& t) const {
  return param_storage_bytes(t, recipe_, cfg_.peft, shard_plan_.dtypes);
}
int64_t StepBuilder::grad_bytes_of(const ParamTensor& t) const {
  return grad_bytes_.get(t, [&](const ParamTensor& x) { return param_grad_bytes(x, recipe_, shard_plan_.dtypes); });
}
ParamStates StepBuilder::states_of(const ParamTensor& t) const {
  return states_.get(t, [&](const ParamTensor& x) { return param_states(shard_plan_, ctx_, x); });
}

// The micro-batch's rows and tokens per row. Context parallel: each rank holds sequence_length / cp tokens of every
// sequence (2 x cp load-balanced chunks; torchtitan / torch.distributed.tensor.experimental.context_parallel,
// Megatron-Core with TE). Prompt tuning adds its virtual tokens to every sequence (model.cpp virtual_tokens).
// Sequence parallel splits the tokens that norms, dropout and the residual stream see over the TP ranks
// (Korthikanti et al. 2022 sec. 4.2.2).
void StepBuilder::use_shape(const MicroBatchShape& shape) {
  // A preference objective runs each pair's chosen and rejected sequences in one forward: twice the rows, or, with
  // the rows flattened (padding none: TRL's padding_free), twice the tokens of the one row. KTO's rows are unpaired.
  const bool pairs = preference() && resolved_.preference.paired;
  const bool flat = pairs && cfg_.data.varies() && cfg_.data.pad() == Padding::None;
  dims_.b = pairs && !flat ? mul(2, shape.sequences) : shape.sequences;
  dims_.s = (mul(flat ? 2 : 1, shape.tokens) + virtual_tokens(cfg_.peft)) / cfg_.parallel.context_parallel_size;
  dims_.T = mul(dims_.b, dims_.s);
  dims_.Tn = cfg_.parallel.sequence_parallel ? dims_.T / cfg_.parallel.tensor_parallel_size : dims_.T;
  dims_.padded = shape.padded;
}

StepBuilder::StepBuilder(const StepContext& ctx, StepProgram* into)
    : ctx_(ctx), cfg_(ctx.config), shape_(ctx.shape), recipe_(ctx.precision), resolved_(resolve(ctx.config)),
      program_(into ? *into : own_program_), shares_engine_(into != nullptr) {
  const auto& m = cfg_.model;
  const auto& t = cfg_.training;
  use_shape({t.micro_batch_size, t.sequence_length});
  dims_.h = m.hidden_size;
  dims_.h_q = mul(m.num_attention_heads, effective_head_dim(m));
  dims_.h_kv = mul(m.num_key_value_heads, effective_head_dim(m));
  dims_.f = m.intermediate_size;
  dims_.a = m.num_attention_heads;
  dims_.g = m.num_key_value_heads;
  dims_.V = m.vocab_size;
  // Tensor parallel (Megatron): attention heads, the MLP width and the vocabulary are split over t ranks; KV
  // heads are replicated when there are fewer than t. Sequence parallel also splits the tokens that norms,
  // dropout and the residual stream see (Korthikanti et al. 2022 sec. 4.2.2).
  const int64_t tp = cfg_.parallel.tensor_parallel_size;
  if (tp > 1) {
    const int64_t hd = effective_head_dim(m);
    dims_.a = m.num_attention_heads / tp;
    dims_.g = std::max<int64_t>(1, m.num_key_value_heads / tp);
    dims_.h_q = mul(dims_.a, hd);
    dims_.h_kv = mul(dims_.g, hd);
    dims_.f = m.intermediate_size / tp;
    dims_.V = ceil_div(m.vocab_size, tp);
  }
  dims_.e = recipe_.activation_bytes;
  dims_.e_res = recipe_.residual_bytes;
  // prepare_model_for_kbit_training casts every parameter that is not quantized to fp32, the token embedding
  // included (peft utils/other.py, v0.4-v0.20: `param.data = param.data.to(torch.float32)` for fp16/bf16
  // parameters), so inputs_embeds, and with them the residual stream and the norms' outputs (LlamaRMSNorm
  // returns weight * hidden.to(input_dtype), an fp32 weight), are fp32 whatever the recipe. Lightning's
  // bitsandbytes plugin does not call it.
  // TRL's cast of the embedding back to bf16 (model_load.h) makes inputs_embeds, and so the residual stream, bf16.
  shard_plan_ = shard_plan(ctx);
  const bool kbit = resolved_.kbit_cast;
  if (kbit && !resolved_.framework->bnb_via_lightning && !cfg_.model.is_encoder_decoder) dims_.e_res = shard_plan_.dtypes.trl_bf16.token_embedding ? 2 : 4;
  dims_.amp = recipe_.autocast_copy_bytes > 0 || recipe_.autocast_16bit;
  // A post-LN encoder (BERT) over 16-bit weights under autocast: every LayerNorm returns fp32 (layer_norm is on
  // autocast's fp32 list), and the residual sums that read it (dense output + LayerNorm output) promote to fp32.
  if (recipe_.autocast_16bit && cfg_.model.post_layernorm && cfg_.model.norm_type == NormType::LayerNorm) dims_.e_res = 4;
  adapter_bytes_ = resolved_.adapter_bytes();
  free_at_load_bytes_ = std::max<int64_t>(0, gpu_total_bytes(cfg_, ctx.gpu) - context_bytes(cfg_, ctx.gpu, resolved_.lazy_module_loading));
  shard_ranks_ = shard_plan_.n;
  shard_opt_ = shard_plan_.flat_optimizer;
  shard_grads_ = shard_plan_.shard_grads;
  shard_weights_ = shard_plan_.shard_weights;
  // torchtitan also keeps parameters unsharded after forward under PP (parallelize_llama.py apply_fsdp:
  // reshard_after_forward = False when pp_enabled); the pipeline's no_sync keeps them to the last backward.
  // FSDP2 over a one-rank mesh from torch 2.9: each unit is cast into its copy, with no all-gather (one_rank_fsdp2).
  const bool one_rank_copy = shard_plan_.fsdp && shard_ranks_ == 1 && resolved_.fsdp2_one_rank_skips_all_gather;
  fsdp_unshard_.configure(static_cast<size_t>(shape_.num_layers + 2), shard_plan_.sharding == Sharding::Fsdp2,
                          shard_plan_.fsdp && cfg_.parallel.pipeline_parallel_size > 1, one_rank_copy);
  const TriState no_sync = cfg_.parallel.no_sync();
  {
    const bool deepspeed = shard_plan_.sharding == Sharding::DeepSpeed;
    DataParallelGradients::Plan dp;
    dp.ddp_bucket = !shard_plan_.grad_buffer && shard_ranks_ > 1 && cfg_.parallel.zero_stage == 0;
    dp.ddp_views = dp.ddp_bucket && cfg_.parallel.ddp_gradient_as_bucket_view;
    dp.zero3_bucket = deepspeed && shard_weights_ && (shard_ranks_ > 1 || shard_plan_.offload_params) && !shares_engine_;
    dp.partition = deepspeed && shard_grads_ && !shard_plan_.offload_optimizer;
    dp.reduce_buckets = deepspeed && shard_opt_ && !shard_weights_ && shard_ranks_ > 1 && !shares_engine_ ? (zero_overlap() ? 2 : 1) : 0;
    if (dp.zero3_bucket || dp.reduce_buckets > 0) dp.bucket_bytes = mul(zero_reduce_bucket(), recipe_.weight_bytes);
    dp_grads_.configure(dp);
  }
  fsdp_reduce_.configure(static_cast<size_t>(shape_.num_layers + 2), shard_plan_.sharding == Sharding::Fsdp2,
                         shard_plan_.fsdp && (no_sync == TriState::True || (no_sync == TriState::Auto && resolved_.framework->fsdp_no_sync_accumulation)) &&
                             cfg_.parallel.pipeline_parallel_size == 1 && cfg_.training.gradient_accumulation_steps > 1);
  // FSDP1's reshard-only hook on a frozen layer unit (Resolved::fsdp1_reshard_hook): under PEFT the layers' own
  // weights are frozen wherever the units do not mix in the adapters (fsdp1_unit_gradients: the HF Trainer wraps
  // them as units of their own), and reentrant checkpointing around the unit hands the recomputed layer leaves that
  // require grad (inside the unit, FSDP's forward runs with grad on the real activations: fsdp_checkpoint_in_units).
  fsdp_hook_holds_inputs_ = resolved_.fsdp1_reshard_hook && shard_plan_.fsdp && shard_ranks_ > 1 && cfg_.peft.enabled() &&
                            !fsdp1_unit_gradients(cfg_) && resolved_.checkpoint_reentrant &&
                            !cfg_.parallel.fsdp_checkpoint_in_units;
  shape_.for_each_layer_kind([&](const std::vector<ParamTensor>& list, int64_t) {
    for (const auto& t : list) any_quantized_ |= t.quantized;
  });
  for (const auto* list : {&shape_.pre, &shape_.post})  // a program's embeddings or head alone may hold one
    for (const auto& t : *list) any_quantized_ |= t.quantized;
  if (cfg_.peft.kind() == PeftMethod::PrefixTuning) prefix_tokens_ = cfg_.peft.num_virtual_tokens;
  // LLaMA-Adapter (litgpt's v1, PEFT's adaption_prompt): the frozen embedding and the layers below
  // adapter_start_layer train nothing, so nothing below it needs a gradient. Under PEFT with gradient checkpointing
  // the embedding's output is made to require grad (enable_input_require_grads, without which a reentrant checkpoint
  // gives the prompts no gradient), so every layer records; litgpt's Fabric checkpoints non-reentrantly and does not.
  inputs_require_grad_ = cfg_.peft.kind() == PeftMethod::AdaptionPrompt && resolved_.checkpointing != Checkpointing::None;
  if ((cfg_.peft.kind() == PeftMethod::Adapter || cfg_.peft.kind() == PeftMethod::AdaptionPrompt) && !inputs_require_grad_)
    first_grad_layer_ = std::min(cfg_.peft.adapter_start_layer, shape_.num_layers);
  grads_.resize(static_cast<size_t>(shape_.num_layers + 2));
  grad_created_.assign(static_cast<size_t>(shape_.num_layers + 2), false);
  states_created_.assign(static_cast<size_t>(shape_.num_layers + 2), false);
  casts_.assign(static_cast<size_t>(shape_.num_layers), LayerCasts{});

  auto& p = program_;
  labels_.weights = p.label("weights");
  labels_.grads = p.label("gradients (.grad)");
  // Tensors are named after the engine that allocates them (a ZeRO-3 buffer is not DDP's): the one that reduces the
  // gradients follows alloc_weights and alloc_layer_grads, which pick it by the same tests.
  const bool deepspeed = shard_plan_.sharding == Sharding::DeepSpeed;
  const std::string zero = "DeepSpeed ZeRO-" + std::to_string(cfg_.parallel.zero_stage);
  labels_.grad_partition = p.label(zero + " gradient partition (this rank's reduced gradients, flat)");
  // Without ZeRO the layout is DDP's (memsim resolves HF Trainer to DeepSpeed's sharding, which it uses only with ZeRO).
  labels_.grad_bucket = p.label(deepspeed && shard_opt_ ? zero + " reduce bucket (IPG buffer of reduce_bucket_size elements)"
                                                   : "DDP gradient bucket (second copy of the gradients)");
  labels_.gathered = p.label(!shard_plan_.fsdp ? zero + " all-gathered layer parameters"
                             : one_rank_copy ? "FSDP unsharded parameters (cast from the one-rank shard)"
                                 : "FSDP unsharded parameters (all-gathered)");
  labels_.ag_buffer = p.label("FSDP2 all-gather output (copied out per parameter)");
  labels_.rs_input = p.label("FSDP2 reduce-scatter input (unsharded gradients in the reduce dtype)");
  labels_.rs_output = p.label(std::string(shard_plan_.sharding == Sharding::Fsdp2 ? "FSDP2" : "FSDP") +
                         " reduce-scatter output (added into the gradient shard)");
  labels_.grad_shard = p.label(std::string(shard_plan_.sharding == Sharding::Fsdp2 ? "FSDP2" : "FSDP") + " gradient shard");
  labels_.main_grads = p.label("Megatron main-gradient buffer (fp32, whole)");
  labels_.fp8_weights = p.label("fp8 weight copies and transposes (Transformer Engine)");
  labels_.fp8_cast = p.label("fp8 cast of a linear's weight (transient)");
  labels_.fp8_input = p.label("linear input saved in fp8 (Transformer Engine)");
  labels_.grad_accum = p.label("FSDP unsharded gradients accumulated over micro-batches (no_sync)");
  labels_.ring = p.label("ring attention: key/value chunks in flight and fp32 partial outputs");
  labels_.a2a = p.label("expert-parallel all-to-all buffers (tokens sent to and received from other ranks)");
  labels_.master = p.label("fp32 master weights");
  labels_.state = p.label("optimizer state");
  labels_.opt_tmp = p.label("optimizer temporary");
  labels_.cast = p.label("autocast low-precision weight copies");
  labels_.ws = p.label("cuBLAS workspace");
  labels_.ws_lt = p.label("cuBLASLt workspace");
  labels_.inputs = p.label("input ids and labels");
  labels_.residual = p.label("residual stream");
  labels_.norm_x32 = p.label("norm input upcast to fp32 (saved)");
  labels_.norm_rstd = p.label("norm rstd (saved)");
  labels_.norm_scaled = p.label("normalised input before the scale (saved for the norm weight's grad)");
  labels_.norm_out = p.label("norm output (saved by the next matmuls)");
  labels_.norm_out_cast = p.label("autocast copy of the norm output (saved by one matmul)");
  labels_.q = p.label("query projection");
  labels_.k = p.label("key projection");
  labels_.v = p.label("value projection (saved)");
  labels_.q_rot = p.label("query after RoPE (saved)");
  labels_.k_rot = p.label("key after RoPE (saved)");
  labels_.kv_rep = p.label("keys/values repeated for GQA (saved)");
  labels_.attn_out = p.label("attention output (saved by the kernel and o_proj)");
  labels_.lse = p.label("attention logsumexp, fp32 (saved)");
  labels_.scores = p.label("attention scores (eager)");
  labels_.softmax_in = p.label("softmax / log_softmax input (saved by torch <= 1.10)");
  labels_.softmax = p.label("attention softmax, fp32 (eager, saved)");
  labels_.probs = p.label("attention probabilities cast for attn @ V (eager, saved)");
  labels_.attn_mask = p.label("attention dropout mask (saved)");
  labels_.o_out = p.label("o_proj output");
  labels_.hidden_mask = p.label("hidden dropout mask (saved)");
  labels_.mlp_gate = p.label("MLP gate projection (saved by the activation)");
  labels_.mlp_up = p.label("MLP up projection (saved by the product)");
  labels_.mlp_act = p.label("MLP activation output (saved by the product)");
  labels_.mlp_prod = p.label("MLP gated product (saved by down_proj)");
  labels_.mlp_fc1 = p.label("MLP first projection (saved by the activation)");
  labels_.mlp_gelu = p.label("MLP activation output (saved by the second projection)");
  labels_.mlp_out = p.label("MLP output");
  labels_.attn_tmp = p.label("attention temporaries");
  labels_.ckpt_input = p.label("checkpointed layer input (saved)");
  labels_.ckpt_tmp = p.label("layer intermediates under no_grad (checkpointed forward)");
  labels_.bwd_mlp = p.label("MLP backward: activation gradients");
  labels_.bwd_attn = p.label("attention backward: dq, dk, dv, fp32 dq accumulator");
  labels_.bwd_norm = p.label("norm backward temporaries");
  labels_.dres = p.label("gradient of the residual stream");
  labels_.router = p.label("MoE router probabilities and top-k (saved)");
  labels_.expert_in = p.label("tokens gathered for the experts (saved)");
  labels_.expert_out = p.label("expert outputs before the routing weight (saved)");
  labels_.lora_in = p.label("LoRA adapter input (cast, dropout) or lora_A output (saved)");
  labels_.dequant = p.label("dequantized frozen weight (bitsandbytes matmul)");
  labels_.quant_stats = p.label("quantization statistics (absmax, row scales)");
  labels_.p2p = p.label("activation or gradient exchanged with the next pipeline stage");
  labels_.recv_buffer = p.label("pipeline receive buffers (one per micro-batch, kept across steps)");
  labels_.logits = p.label("logits");
  labels_.logits_fp32 = p.label("logits upcast to fp32");
  labels_.lse_loss = p.label("log-softmax of the logits (saved by the loss)");
  labels_.loss_grad = p.label("loss backward: gradient of the logits");
  labels_.loss_grad_bf16 = p.label("gradient of the logits cast back to the compute dtype");
  labels_.flce_buffers = p.label("fused linear cross-entropy buffers (grad of lm_head input and weight)");
  labels_.lm_head_in = p.label("final norm output (saved by lm_head)");
  labels_.embed_grad_dense = p.label("dense embedding gradient");
  labels_.tied_sum = p.label("tied weights: lm_head's and the embedding's gradients summed");
  labels_.tied_pending = p.label("tied weights: lm_head's gradient, waiting for the embedding's");
  labels_.logits_shifted = p.label("logits shifted by one token (logits[..., :-1, :].contiguous(), a copy)");
  if (ppo()) critic_setup();  // PPO's value model: a builder of its own over this program (ppo_step.cpp)
}

void StepBuilder::prologue() {
  // About 70 events per layer and micro-batch, 8 per parameter tensor: reserve once instead of regrowing.
  const int64_t passes = 1 + std::min<int64_t>(cfg_.training.gradient_accumulation_steps, 2 * cfg_.parallel.pipeline_parallel_size + 1);
  const int64_t layers = std::min(ctx_.end_layer, shape_.num_layers) - ctx_.first_layer;
  size_t widest_layer_list = 0;
  shape_.for_each_layer_kind([&](const std::vector<ParamTensor>& list, int64_t) { widest_layer_list = std::max(widest_layer_list, list.size()); });
  const size_t events = static_cast<size_t>(passes * (layers + 2) * 70 +
                                            8 * (widest_layer_list * shape_.num_layers + shape_.pre.size() + shape_.post.size()));
  program_.events.reserve(events);
  program_.tensors.reserve(events / 2 + 16);
  alloc_weights();
  alloc_grad_bucket();
  if (critic_) critic_prologue();  // PPO's value model, loaded before the trainer wraps both
  // transformers 4.38's LlamaModel.__init__ registers a causal_mask buffer of max_position_embeddings^2 booleans
  // (register_buffer(..., persistent=False)), moved to the GPU with the model (docs/versions.md 6b).
  if (resolved_.mask.build == MaskBuild::MaxPositions) {
    mask_labels();
    program_.alloc(Component::Weights, mul(cfg_.model.max_position_embeddings, cfg_.model.max_position_embeddings), mask_labels_.buffer);
  }
  unsloth_weight_buffer();
  unsloth_gc_buffers(false);
  program_.alloc(Component::Overhead, cublas_workspace_bytes(ctx_.gpu), labels_.ws);
  program_.alloc(Component::Overhead, kCublasLtWorkspaceBytes, labels_.ws_lt);
}

// One optimizer step: its micro-batches (mbs of the step's gas), the optimizer step and zero_grad.
void StepBuilder::step(int iter, int64_t mbs, int64_t gas) {
  dp_grads_.step_begins(iter);
  // step() starts by clearing the receive buffers' .grad (clear_runtime_states); the micro-batches this replay
  // leaves out left theirs too, one per stage that receives activations.
  for (uint32_t g : pipeline_.input_grads) drop(g);
  pipeline_.input_grads.clear();
  // GRPO generates and scores a step's completions before its first micro-batch (TRL 0.17+; rollout_step.cpp).
  if (grpo() && !resolved_.rollout.per_micro_batch) rollout("step " + std::to_string(iter), iter);
  run_schedule(iter, mbs, gas);
  for (uint32_t t : rollout_ids_) drop(t);
  rollout_ids_.clear();
  int64_t receiving = 0;
  for (const auto& [layer, g] : pipeline_.recv_made) receiving += g ? 0 : 1;
  for (int64_t k = 0; k < receiving * (gas - mbs); ++k)
    pipeline_.input_grads.push_back(program_.alloc(Component::Communication, mul(dims_.e_res, dims_.Tn, dims_.h), labels_.p2p, -1));
  optimizer_step(iter);
  if (critic_) critic_optimizer_step(iter);  // one optimizer over the policy and the value model
  // zero_grad(set_to_none=True), the default since torch 2.0, frees the gradients after the step; torch 1.x
  // zeroed them in place (Optimizer.zero_grad / Module.zero_grad set_to_none=False), so they stay allocated.
  // diffusers updates its EMA copy after optimizer.zero_grad() (train_text_to_image.py: ema_unet.step once
  // sync_gradients), so the update's temporaries meet no gradients.
  // training.zero_grad_at before_backward (Lightning's closure: training_step, zero_grad, backward): the gradients
  // stay through the next step's first forward and go just before its first backward (backward_mb).
  if (resolved_.zero_grad_set_to_none && resolved_.zero_grad_before_backward) {
    zero_grad_pending_ = true;
    return ema_update(iter);
  }
  program_.phase("zero_grad " + std::to_string(iter));
  if (resolved_.zero_grad_set_to_none) release_grads();
  if (ppo()) ppo_end_of_minibatch();  // the last micro-batch's entropy, then the loop's del and empty_cache
  ema_update(iter);
}

void StepBuilder::release_grads() {
  for (size_t slot = 0; slot < grads_.size(); ++slot) {
    for (uint32_t g : grads_[slot]) drop(g);
    grads_[slot].clear();
    grad_created_[slot] = false;
  }
  release_grad_shards();  // ZeRO's partition, FSDP's shards
  if (critic_) critic_release_grads();
}

StepProgram StepBuilder::build() {
  prologue();
  const int64_t gas = cfg_.training.gradient_accumulation_steps;
  for (int iter = 1; iter <= 2; ++iter) {
    // Step 1 differs from the steady state only in lacking optimizer state until its step, so it is replayed
    // with one micro-batch. In step 2 every micro-batch after the first starts from the same live tensors
    // (gradients included) and makes the same requests, so the second stands for all the others; a pipeline
    // stage needs (stages - stage) micro-batches in flight before its pattern repeats, so it replays one more
    // than the stages.
    // Interleaving reaches its steady state after 2 x stages micro-batches.
    const int64_t pp = cfg_.parallel.pipeline_parallel_size;
    const int64_t repeat_after = cfg_.parallel.schedule() == PipelineSchedule::Interleaved1F1B && pp > 1 ? 2 * pp : pp + 1;
    step(iter, iter == 1 ? 1 : std::min<int64_t>(gas, repeat_after), gas);
    if (iter == 1 && cfg_.training.eval_batch_size > 0) evaluation(1);
  }
  return std::move(program_);
}

void StepBuilder::begin_run(const RunPlan& plan) {
  run_shapes_ = &plan.micro_batches;
  next_shape_ = 0;
  program_.recycle_ids = true;
  prologue();
}

// Shapes vary, so no micro-batch stands for another: every step replays all of its micro-batches.
void StepBuilder::run_step(int64_t k, int64_t gas) {
  step(static_cast<int>(k), gas, gas);
  if (k == 1 && cfg_.training.eval_batch_size > 0) evaluation(1);
}

StepProgram build_train_step(const StepContext& ctx) { return StepBuilder(ctx).build(); }

RunBuilder::RunBuilder(const StepContext& ctx, const RunPlan& plan)
    : builder_(std::make_unique<StepBuilder>(ctx)), plan_(plan) {
  builder_->begin_run(plan);
}
RunBuilder::~RunBuilder() = default;

bool RunBuilder::next_step() {
  if (built_ >= plan_.steps) return false;
  builder_->run_step(++built_, plan_.gas);
  return true;
}

StepProgram& RunBuilder::program() { return builder_->program(); }

}  // namespace memsim
