// The training step's skeleton: weights, gradients, ZeRO sharding, the optimizer step and the iterations.
// What autograd saves between forward and backward lives in activations.cpp.
#include "train_step.h"

#include <algorithm>
#include <string>

#include "checked.h"
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

// ZeRO partitions: each of N ranks holds ceil(numel / N) elements (DeepSpeed pads partitions to equal size).
int64_t shard(int64_t numel, int64_t n) { return ceil_div(numel, n); }

// Parameters of the decay group in HF Trainer (get_decay_parameter_names): everything but norms and biases.
bool decays(const ParamTensor& t) {
  return t.kind == ParamKind::Matmul || t.kind == ParamKind::Embedding || t.kind == ParamKind::Adapter;
}

// Every parameter tensor this device holds: its pipeline stage's layers, and the embeddings / head where the
// stage has them.
template <typename F>
void for_each_param(const StepContext& ctx, F&& f) {
  const ModelShape& s = ctx.shape;
  if (ctx.has_pre)
    for (const auto& t : s.pre) f(t);
  for (int64_t l = ctx.first_layer; l < std::min(ctx.end_layer, s.num_layers); ++l)
    for (const auto& t : s.params_of(l)) f(t);
  if (ctx.has_post)
    for (const auto& t : s.post) f(t);
}

}  // namespace

namespace {
int64_t param_storage_bytes(const ParamTensor& t, const PrecisionRecipe& pr, const PeftConfig& peft);
int64_t param_grad_bytes(const ParamTensor& t, const PrecisionRecipe& pr, const PeftConfig& peft);
int64_t param_optimizer_bytes(const ParamTensor& t, const PrecisionRecipe& pr, const PeftConfig& peft,
                              const OptimizerSpec& opt, bool include_paged);
}  // namespace

ModelStates model_state_bytes(const StepContext& ctx) {
  const auto& par = ctx.config.parallel;
  const auto& peft = ctx.config.peft;
  const int64_t n = par.data_parallel_size;
  int64_t weights = 0, grads = 0, opt = 0, trainable = 0;
  for_each_param(ctx, [&](const ParamTensor& t) {
    weights = add(weights, param_storage_bytes(t, ctx.precision, peft));
    grads = add(grads, param_grad_bytes(t, ctx.precision, peft));
    if (!t.frozen) trainable = add(trainable, t.numel);
    if (par.zero_stage == 0) opt = add(opt, param_optimizer_bytes(t, ctx.precision, peft, ctx.optimizer, true));
  });
  ModelStates m;
  // ZeRO partitions each of the three over the data-parallel ranks (stage 3, 2 and 1), in one flat partition
  // for the optimizer (ZeRO paper sec. 5, Table 1).
  if (par.zero_stage >= 3 && n > 1) {  // parameters under the persistence threshold stay whole
    const int64_t threshold = par.zero_param_persistence_threshold > 0 ? par.zero_param_persistence_threshold : 100000;
    int64_t sharded = 0;
    for_each_param(ctx, [&](const ParamTensor& t) {
      const int64_t b = param_storage_bytes(t, ctx.precision, peft);
      sharded = add(sharded, t.numel < threshold ? b : ceil_div(b, n));
    });
    m.weights_bytes = sharded;
  } else {
    m.weights_bytes = par.zero_stage >= 3 ? ceil_div(weights, n) : weights;
  }
  m.gradients_bytes = par.zero_stage >= 2 ? ceil_div(grads, n) : grads;
  if (par.zero_stage >= 1) {
    const int64_t part = shard(trainable, n);
    ParamTensor flat{"flat partition", part, ParamKind::Matmul, part};
    m.optimizer_bytes = param_optimizer_bytes(flat, ctx.precision, PeftConfig{}, ctx.optimizer, true);
  } else {
    m.optimizer_bytes = opt;
  }
  return m;
}

namespace {

// Bytes of each stored parameter: its dtype, or bitsandbytes' packed storage for a quantized frozen weight
// (MEMORY_FORMULAS.md 4.2): int8 = 1 B/element + an fp32 scale per output row (Int8Params SCB); NF4/FP4 =
// 4 bits/element + an fp32 absmax per 64-element block, or with double quantization a uint8 absmax per block plus
// an fp32 scale per 256 blocks (QLoRA sec. 3), and the per-tensor fp32 offset and 256-entry code table.
// prepare_model_for_kbit_training casts every other parameter to fp32.
int64_t param_storage_bytes(const ParamTensor& t, const PrecisionRecipe& pr, const PeftConfig& peft) {
  const std::string& q = peft.base_quantization;
  if (t.kind == ParamKind::Adapter) return mul(t.numel, peft.adapter_dtype == "fp32" ? 4 : 2);
  if (t.quantized && q == "int8") return add(t.numel, mul(t.rows, 4));
  if (t.quantized) {
    const int64_t blocks = ceil_div(t.numel, 64);
    const int64_t stats = peft.double_quantization ? add(add(blocks, mul(ceil_div(blocks, 256), 4)), 4 + 1024) : mul(blocks, 4);
    return add(ceil_div(t.numel, 2), stats);
  }
  if (peft.enabled() && q != "none" && peft.prepare_kbit) return mul(t.numel, 4);
  return mul(t.numel, pr.weight_bytes);
}

int64_t param_grad_bytes(const ParamTensor& t, const PrecisionRecipe& pr, const PeftConfig& peft) {
  if (t.frozen) return 0;
  if (t.kind == ParamKind::Adapter) return mul(t.numel, peft.adapter_dtype == "fp32" ? 4 : 2);
  if (peft.enabled() && peft.base_quantization != "none" && peft.prepare_kbit) return mul(t.numel, 4);
  return mul(t.numel, pr.grad_bytes);
}

// Optimizer state of one trainable tensor: the fp32 master copy where the recipe keeps one for a low-precision
// parameter, and the optimizer's states in the parameter's dtype (torch: zeros_like(p)).
int64_t param_optimizer_bytes(const ParamTensor& t, const PrecisionRecipe& pr, const PeftConfig& peft,
                              const OptimizerSpec& opt, bool include_paged) {
  if (t.frozen) return 0;
  int64_t dtype = pr.state_bytes, master = pr.master_bytes;
  if (t.kind == ParamKind::Adapter || (peft.enabled() && peft.base_quantization != "none" && peft.prepare_kbit)) {
    dtype = t.kind == ParamKind::Adapter && peft.adapter_dtype != "fp32" ? 2 : 4;
    master = dtype == 4 ? 0 : master;
  }
  int64_t bytes = mul(t.numel, master);
  if (include_paged || !(opt.paged && t.numel >= 100000)) bytes = add(bytes, optimizer_state_bytes(opt, t.numel, t.rows, dtype));
  return bytes;
}

}  // namespace

int64_t StepBuilder::state_dtype_of(const ParamTensor& t) const {
  if (t.kind == ParamKind::Adapter) return adapter_bytes();
  if (c_.peft.enabled() && c_.peft.base_quantization != "none" && c_.peft.prepare_kbit) return 4;
  return pr_.state_bytes;
}

int64_t StepBuilder::stage_trainable_numel() const {
  int64_t n = 0;
  for_each_param(ctx_, [&](const ParamTensor& t) {
    if (!t.frozen) n = add(n, t.numel);
  });
  return n;
}

bool StepBuilder::trainable_module(const char* module) const {
  for (const auto* list : {&s_.layer, &s_.moe_layer, &s_.decoder_layer, &s_.post})
    for (const auto& t : *list)
      if (!t.frozen && t.kind != ParamKind::Adapter && module_name(t.name) == module) return true;
  return false;
}

int64_t StepBuilder::adapter_bytes() const { return c_.peft.adapter_dtype == "fp32" ? 4 : 2; }
int64_t StepBuilder::weight_bytes_of(const ParamTensor& t) const { return param_storage_bytes(t, pr_, c_.peft); }
int64_t StepBuilder::grad_bytes_of(const ParamTensor& t) const { return param_grad_bytes(t, pr_, c_.peft); }

StepBuilder::StepBuilder(const StepContext& ctx)
    : ctx_(ctx), c_(ctx.config), s_(ctx.shape), pr_(ctx.precision), rs_(resolve(ctx.config)) {
  const auto& m = c_.model;
  const auto& t = c_.training;
  d_.b = t.micro_batch_size;
  d_.s = t.sequence_length;
  d_.T = mul(d_.b, d_.s);
  d_.h = m.hidden_size;
  d_.h_q = mul(m.num_attention_heads, effective_head_dim(m));
  d_.h_kv = mul(m.num_key_value_heads, effective_head_dim(m));
  d_.f = m.intermediate_size;
  d_.a = m.num_attention_heads;
  d_.g = m.num_key_value_heads;
  d_.V = m.vocab_size;
  // Tensor parallel (Megatron): attention heads, the MLP width and the vocabulary are split over t ranks; KV
  // heads are replicated when there are fewer than t. Sequence parallel also splits the tokens that norms,
  // dropout and the residual stream see (Korthikanti et al. 2022 sec. 4.2.2).
  const int64_t tp = c_.parallel.tensor_parallel_size;
  d_.Tn = c_.parallel.sequence_parallel ? d_.T / tp : d_.T;
  if (tp > 1) {
    const int64_t hd = effective_head_dim(m);
    d_.a = m.num_attention_heads / tp;
    d_.g = std::max<int64_t>(1, m.num_key_value_heads / tp);
    d_.h_q = mul(d_.a, hd);
    d_.h_kv = mul(d_.g, hd);
    d_.f = m.intermediate_size / tp;
    d_.V = ceil_div(m.vocab_size, tp);
  }
  d_.e = pr_.activation_bytes;
  d_.e_res = pr_.residual_bytes;
  d_.amp = pr_.autocast_copy_bytes > 0;
  n_ = c_.parallel.data_parallel_size;
  shard_opt_ = c_.parallel.zero_stage >= 1;
  shard_grads_ = c_.parallel.zero_stage >= 2;
  shard_weights_ = c_.parallel.zero_stage >= 3;
  for (const auto* list : {&s_.layer, &s_.moe_layer, &s_.decoder_layer})
    for (const auto& t : *list) any_quantized_ |= t.quantized;
  grads_.resize(static_cast<size_t>(s_.num_layers + 2));
  grad_created_.assign(static_cast<size_t>(s_.num_layers + 2), false);
  states_created_.assign(static_cast<size_t>(s_.num_layers + 2), false);
  casts_.assign(static_cast<size_t>(s_.num_layers), UINT32_MAX);

  auto& p = p_;
  L_.weights = p.label("weights");
  L_.grads = p.label("gradients (.grad)");
  L_.grad_partition = p.label("ZeRO gradient partition");
  L_.grad_bucket = p.label("DDP gradient bucket (second copy of the gradients)");
  L_.gathered = p.label("ZeRO-3 all-gathered layer parameters");
  L_.master = p.label("fp32 master weights");
  L_.state = p.label("optimizer state");
  L_.opt_tmp = p.label("optimizer temporary");
  L_.cast = p.label("autocast low-precision weight copies");
  L_.ws = p.label("cuBLAS workspace");
  L_.ws_lt = p.label("cuBLASLt workspace");
  L_.inputs = p.label("input ids and labels");
  L_.residual = p.label("residual stream");
  L_.norm_x32 = p.label("norm input upcast to fp32 (saved)");
  L_.norm_rstd = p.label("norm rstd (saved)");
  L_.norm_scaled = p.label("normalised input before the scale (saved for the norm weight's grad)");
  L_.norm_out = p.label("norm output (saved by the next matmuls)");
  L_.norm_out_cast = p.label("autocast copy of the norm output (saved by one matmul)");
  L_.q = p.label("query projection");
  L_.k = p.label("key projection");
  L_.v = p.label("value projection (saved)");
  L_.q_rot = p.label("query after RoPE (saved)");
  L_.k_rot = p.label("key after RoPE (saved)");
  L_.kv_rep = p.label("keys/values repeated for GQA (saved)");
  L_.attn_out = p.label("attention output (saved by the kernel and o_proj)");
  L_.lse = p.label("attention logsumexp, fp32 (saved)");
  L_.scores = p.label("attention scores (eager)");
  L_.softmax = p.label("attention softmax, fp32 (eager, saved)");
  L_.probs = p.label("attention probabilities cast for attn @ V (eager, saved)");
  L_.attn_mask = p.label("attention dropout mask (saved)");
  L_.o_out = p.label("o_proj output");
  L_.hidden_mask = p.label("hidden dropout mask (saved)");
  L_.mlp_gate = p.label("MLP gate projection (saved by the activation)");
  L_.mlp_up = p.label("MLP up projection (saved by the product)");
  L_.mlp_act = p.label("MLP activation output (saved by the product)");
  L_.mlp_prod = p.label("MLP gated product (saved by down_proj)");
  L_.mlp_fc1 = p.label("MLP first projection (saved by the activation)");
  L_.mlp_gelu = p.label("MLP activation output (saved by the second projection)");
  L_.mlp_out = p.label("MLP output");
  L_.attn_tmp = p.label("attention temporaries");
  L_.ckpt_input = p.label("checkpointed layer input (saved)");
  L_.ckpt_tmp = p.label("layer intermediates under no_grad (checkpointed forward)");
  L_.bwd_mlp = p.label("MLP backward: activation gradients");
  L_.bwd_attn = p.label("attention backward: dq, dk, dv, fp32 dq accumulator");
  L_.bwd_norm = p.label("norm backward temporaries");
  L_.dres = p.label("gradient of the residual stream");
  L_.router = p.label("MoE router probabilities and top-k (saved)");
  L_.expert_in = p.label("tokens gathered for the experts (saved)");
  L_.expert_out = p.label("expert outputs before the routing weight (saved)");
  L_.lora_in = p.label("LoRA adapter input (cast, dropout) or lora_A output (saved)");
  L_.dequant = p.label("dequantized frozen weight (bitsandbytes matmul)");
  L_.quant_stats = p.label("quantization statistics (absmax, row scales)");
  L_.p2p = p.label("activation or gradient exchanged with the next pipeline stage");
  L_.logits = p.label("logits");
  L_.logits_fp32 = p.label("logits upcast to fp32");
  L_.lse_loss = p.label("log-softmax of the logits (saved by the loss)");
  L_.loss_grad = p.label("loss backward: gradient of the logits");
  L_.loss_grad_bf16 = p.label("gradient of the logits cast back to the compute dtype");
  L_.flce_buffers = p.label("fused linear cross-entropy buffers (grad of lm_head input and weight)");
  L_.lm_head_in = p.label("final norm output (saved by lm_head)");
  L_.embed_grad_dense = p.label("dense embedding gradient (tied weights: added into lm_head's grad)");
}

// nn.Module init: one allocation per parameter tensor. Under ZeRO-3 each rank keeps only its partition of
// every parameter (DeepSpeed partition_parameters.py: param.ds_tensor).
// DeepSpeed's defaults where a config leaves 0 (deepspeed/runtime/zero/config.py DeepSpeedZeroConfig).
int64_t StepBuilder::zero_reduce_bucket() const {
  return c_.parallel.zero_reduce_bucket_size > 0 ? c_.parallel.zero_reduce_bucket_size : 500000000;
}
int64_t StepBuilder::zero_persistence() const {
  return c_.parallel.zero_param_persistence_threshold > 0 ? c_.parallel.zero_param_persistence_threshold : 100000;
}
bool StepBuilder::zero_overlap() const {  // the validator overlap_comm_valid: None means stage == 3
  return c_.parallel.zero_overlap_comm == "auto" ? c_.parallel.zero_stage == 3 : c_.parallel.zero_overlap_comm == "true";
}
// ZeRO-3 keeps parameters under stage3_param_persistence_threshold whole on every rank (never partitioned).
bool StepBuilder::persistent(const ParamTensor& t) const { return t.numel < zero_persistence(); }

void StepBuilder::alloc_weights() {
  p_.phase("model load");
  for_each_param(ctx_, [&](const ParamTensor& t) {
    const int64_t bytes = weight_bytes_of(t);
    p_.alloc(Component::Weights, shard_weights_ && !persistent(t) ? ceil_div(bytes, n_) : bytes, L_.weights);
  });
  // ZeRO-3 allocates its gradient bucket with the optimizer (stage3.py _setup_for_real_optimizer:
  // __ipg_bucket_flat_buffer of reduce_bucket_size elements in the model dtype, contiguous_gradients on).
  if (shard_weights_ && n_ > 1)
    p_.alloc(Component::Communication, mul(zero_reduce_bucket(), pr_.weight_bytes), L_.grad_bucket);
}

// AccumulateGrad creates each .grad at its parameter's first backward of the step (MEMORY_FORMULAS.md 6).
// ZeRO-2/3 reduce each layer's full gradients into the flat partition and free them (stage_1_and_2.py,
// stage3.py: grad_partitions_flat_buffer); DDP (several GPUs, no ZeRO) also keeps a flat bucket copy of all
// gradients (gradient_as_bucket_view=False is the default, MEMORY_FORMULAS.md 2.7).
void StepBuilder::alloc_layer_grads(int64_t layer) {
  if (!grads_live_) {
    grads_live_ = true;
    int64_t grad_total = 0;
    for_each_param(ctx_, [&](const ParamTensor& t) { grad_total = add(grad_total, grad_bytes_of(t)); });
    if (shard_grads_)
      other_grads_.push_back(p_.alloc(Component::Gradients, ceil_div(grad_total, n_), L_.grad_partition));
    // ZeRO-1/2 reduce gradients through ipg buffers of reduce_bucket_size elements in the model dtype, two with
    // overlap_comm (stage_1_and_2.py backward: buf_0, buf_1). They stay allocated from the first backward on.
    if (shard_opt_ && !shard_weights_ && n_ > 1 && !zero_buckets_) {
      zero_buckets_ = true;
      for (int i = 0; i < (zero_overlap() ? 2 : 1); ++i)
        p_.alloc(Component::Communication, mul(zero_reduce_bucket(), pr_.weight_bytes), L_.grad_bucket);
    }
    else if (n_ > 1 && c_.parallel.zero_stage == 0)  // PyTorch DDP; ZeRO-1's reduce buckets are not modelled yet
      other_grads_.push_back(p_.alloc(Component::Communication, grad_total, L_.grad_bucket));
  }
  const size_t slot = static_cast<size_t>(layer + 1);  // 0 = embeddings, L + 1 = final norm and head
  if (grad_created_[slot]) return;  // gradient accumulation: the .grad tensors are already there
  grad_created_[slot] = true;
  const std::vector<ParamTensor>& ts = layer < 0 ? s_.pre : layer >= s_.num_layers ? s_.post : s_.params_of(layer);
  for (const auto& t : ts) {
    if (layer < 0 && &t == &s_.pre.front() && c_.model.tie_word_embeddings) continue;  // created by lm_head
    if (t.frozen) continue;
    grads_[slot].push_back(p_.alloc(Component::Gradients, grad_bytes_of(t), L_.grads, static_cast<int32_t>(layer)));
  }
  // Tied weights: lm_head is the embedding matrix, so its .grad appears in the loss backward.
  if (layer >= s_.num_layers && c_.model.tie_word_embeddings && !s_.pre.front().frozen)
    grads_[slot].push_back(p_.alloc(Component::Gradients, grad_bytes_of(s_.pre.front()), L_.grads));
}

void StepBuilder::release_layer_grads(int64_t layer) {
  if (!shard_grads_) return;
  const size_t slot = static_cast<size_t>(layer + 1);
  for (uint32_t g : grads_[slot]) drop(g);
  grads_[slot].clear();
  grad_created_[slot] = false;  // the next micro-batch makes new full gradients and reduces them again
}

// DeepSpeed ZeRO-3 fetches a module's full 16-bit parameters before its forward and backward and releases them
// after (partitioned_param_coordinator.py). Parameters under stage3_param_persistence_threshold (1e5 elements)
// stay whole; they are small and counted with the partitioned weights here.
void StepBuilder::gather(int64_t layer, std::vector<uint32_t>& out) {
  if (!shard_weights_ || n_ == 1) return;
  auto partitioned_bytes = [&](int64_t l) {
    if (l < -1 || l > s_.num_layers) return int64_t{0};
    const std::vector<ParamTensor>& ts = l < 0 ? s_.pre : l >= s_.num_layers ? s_.post : s_.params_of(l);
    int64_t bytes = 0;
    for (const auto& t : ts)
      if (!persistent(t)) bytes = add(bytes, weight_bytes_of(t));
    return bytes;
  };
  out.push_back(p_.alloc(Component::Communication, partitioned_bytes(layer), L_.gathered, static_cast<int32_t>(layer)));
  // The coordinator prefetches the next module's parameters, up to stage3_prefetch_bucket_size elements
  // (partitioned_param_coordinator.py), while this one computes.
  const int64_t prefetch_elems = c_.parallel.zero_prefetch_bucket_size > 0 ? c_.parallel.zero_prefetch_bucket_size : 50000000;
  const int64_t next = std::min(partitioned_bytes(layer + 1), mul(prefetch_elems, pr_.weight_bytes));
  if (next > 0) out.push_back(p_.alloc(Component::Communication, next, L_.gathered, static_cast<int32_t>(layer + 1)));
}

// Optimizer in backward (torchtune optimizer_in_bwd): each parameter is stepped in a post-accumulate-grad
// hook as soon as its gradient is complete, and the gradient is freed at once (set_to_none), so the full
// gradient set never exists. State is created lazily at the first such step.
void StepBuilder::step_in_backward(int64_t layer) {
  if (!c_.training.optimizer_in_backward) return;
  const size_t slot = static_cast<size_t>(layer + 1);
  const bool tied = c_.model.tie_word_embeddings;
  if (!states_created_[slot]) {
    states_created_[slot] = true;
    const std::vector<ParamTensor>& ts = layer < 0 ? s_.pre : layer >= s_.num_layers ? s_.post : s_.params_of(layer);
    for (const auto& t : ts) create_state(t);
  }
  // A tied matrix's gradient is complete only after the embedding's backward; it is stepped there.
  std::vector<uint32_t> keep;
  if (layer >= s_.num_layers && tied && !grads_[slot].empty()) keep.push_back(grads_[slot].back()), grads_[slot].pop_back();
  for (uint32_t g : grads_[slot]) drop(g);
  grads_[slot] = keep;
  if (layer < 0 && tied) {
    const size_t post = static_cast<size_t>(s_.num_layers + 1);
    for (uint32_t g : grads_[post]) drop(g);
    grads_[post].clear();
  }
}

void StepBuilder::create_state(const ParamTensor& t) {
  const int64_t bytes = param_optimizer_bytes(t, pr_, c_.peft, ctx_.optimizer, false);
  if (bytes > 0) p_.alloc(Component::OptimizerStates, bytes, L_.state);
}

void StepBuilder::optimizer_step(int iter) {
  p_.phase("optimizer step " + std::to_string(iter));
  if (c_.training.optimizer_in_backward) return;  // stepped during backward
  const auto& opt = ctx_.optimizer;
  // Optimizer state is created lazily in the first step() (torch/optim/adam.py::_init_group: zeros_like).
  // Paged bitsandbytes state (tensors >= 1e5 elements) lives in unified memory, outside the allocator.
  if (iter == 1) {
    if (shard_opt_) {
      // DeepSpeed keeps one flat fp32 partition of the trainable parameters (stage_1_and_2.py
      // single_partition_of_fp32_groups) and the optimizer's states beside it.
      const int64_t part = shard(stage_trainable_numel(), n_);
      if (pr_.master_bytes > 0) p_.alloc(Component::OptimizerStates, mul(part, pr_.master_bytes), L_.master);
      if (!(opt.paged && part >= 100000)) {
        const int64_t st = optimizer_state_bytes(opt, part, part, pr_.state_bytes);
        if (st > 0) p_.alloc(Component::OptimizerStates, st, L_.state);
      }
    } else {
      for_each_param(ctx_, [&](const ParamTensor& t) { create_state(t); });
    }
  }
  // ZeRO-1/2 upcast each group's gradient partition to fp32 for the step (stage_1_and_2.py::step:
  // single_grad_partition = flatten(...).to(fp32)), freed after the group's update.
  if (shard_opt_ && !shard_weights_ && pr_.grad_bytes < 4) {
    uint32_t t = p_.alloc(Component::Temporaries, mul(shard(stage_trainable_numel(), n_), 4), L_.opt_tmp);
    drop(t);
  }
  if (shard_opt_) return;  // DeepSpeed's FusedAdam: no full-size temporaries
  // Temporaries of torch's implementations (MEMORY_FORMULAS.md 6):
  //  foreach Adam/AdamW: exp_avg_sq.sqrt() for every tensor of one param group at once (_foreach_sqrt),
  //    so the largest param group sets the size; fused has none.
  //  for-loop Adam (transformers' old AdamW, adamw_hf): one tensor's sqrt at a time.
  //  Adafactor (per tensor): grad**2 + eps and the approximated second moment, two full-size fp32 tensors.
  const bool adam_like = opt.kind == OptimizerKind::Adam;
  if (rs_.optimizer_impl == OptimizerImpl::Fused && opt.kind != OptimizerKind::Adafactor) return;
  if (opt.kind == OptimizerKind::Adafactor || (adam_like && rs_.optimizer_impl == OptimizerImpl::ForLoop)) {
    int64_t largest = 0;
    for_each_param(ctx_, [&](const ParamTensor& t) {
      if (!t.frozen) largest = std::max(largest, t.numel);
    });
    const int64_t copies = opt.kind == OptimizerKind::Adafactor ? 2 : 1;
    const int64_t bytes = opt.kind == OptimizerKind::Adafactor ? 4 : pr_.state_bytes;
    std::vector<uint32_t> tmp;
    for (int64_t k = 0; k < copies; ++k) tmp.push_back(p_.alloc(Component::Temporaries, mul(largest, bytes), L_.opt_tmp));
    for (uint32_t t : tmp) drop(t);
    return;
  }
  if (!adam_like || opt.paged) return;  // SGD, Lion and bitsandbytes kernels: no full-size temporaries
  for (int64_t group = 0; group < rs_.param_groups; ++group) {
    std::vector<uint32_t> tmp;
    for_each_param(ctx_, [&](const ParamTensor& t) {
      const bool in_group = rs_.param_groups == 1 || (group == 0) == decays(t);
      if (in_group && !t.frozen) tmp.push_back(p_.alloc(Component::Temporaries, mul(t.numel, state_dtype_of(t)), L_.opt_tmp));
    });
    for (uint32_t t : tmp) drop(t);
  }
}

StepProgram StepBuilder::build() {
  // About 70 events per layer and micro-batch, 8 per parameter tensor: reserve once instead of regrowing.
  const int64_t passes = 1 + std::min<int64_t>(c_.training.gradient_accumulation_steps, c_.parallel.pipeline_parallel_size + 1);
  const int64_t layers = std::min(ctx_.end_layer, s_.num_layers) - ctx_.first_layer;
  const size_t events = static_cast<size_t>(passes * (layers + 2) * 70 +
                                            8 * (std::max(s_.layer.size(), s_.moe_layer.size()) * s_.num_layers + s_.pre.size() + s_.post.size()));
  p_.events.reserve(events);
  p_.tensors.reserve(events / 2 + 16);
  alloc_weights();
  p_.alloc(Component::Overhead, cublas_workspace_bytes(ctx_.gpu), L_.ws);
  p_.alloc(Component::Overhead, kCublasLtWorkspaceBytes, L_.ws_lt);
  for (int iter = 1; iter <= 2; ++iter) {
    // Step 1 differs from the steady state only in lacking optimizer state until its step, so it is replayed
    // with one micro-batch. In step 2 every micro-batch after the first starts from the same live tensors
    // (gradients included) and makes the same requests, so the second stands for all the others; a pipeline
    // stage needs (stages - stage) micro-batches in flight before its pattern repeats, so it replays one more
    // than the stages.
    const int64_t gas = c_.training.gradient_accumulation_steps;
    const int64_t mbs = iter == 1 ? 1 : std::min<int64_t>(gas, c_.parallel.pipeline_parallel_size + 1);
    run_schedule(iter, mbs, gas);
    optimizer_step(iter);
    // zero_grad(set_to_none=True), the default since torch 2.0, frees the gradients after the step; torch 1.x
    // zeroed them in place (Optimizer.zero_grad / Module.zero_grad set_to_none=False), so they stay allocated.
    p_.phase("zero_grad " + std::to_string(iter));
    if (!c_.training.zero_grad_set_to_none) continue;
    for (size_t slot = 0; slot < grads_.size(); ++slot) {
      for (uint32_t g : grads_[slot]) drop(g);
      grads_[slot].clear();
      grad_created_[slot] = false;
    }
    for (uint32_t g : other_grads_) drop(g);
    other_grads_.clear();
    grads_live_ = false;
  }
  return std::move(p_);
}

StepProgram build_train_step(const StepContext& ctx) { return StepBuilder(ctx).build(); }

}  // namespace memsim
