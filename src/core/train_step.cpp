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
// `adapter_bytes`: the resolved peft.adapter_dtype's element size (Resolved::adapter_bytes).
int64_t param_storage_bytes(const ParamTensor& t, const PrecisionRecipe& pr, const PeftConfig& peft, int64_t adapter_bytes);
int64_t param_grad_bytes(const ParamTensor& t, const PrecisionRecipe& pr, const PeftConfig& peft, int64_t adapter_bytes);
int64_t param_optimizer_bytes(const ParamTensor& t, const PrecisionRecipe& pr, const PeftConfig& peft,
                              int64_t adapter_bytes, const OptimizerSpec& opt, bool include_paged);
// The element size of a trainable tensor's optimizer states, and of the fp32 master copy it needs (0: none).
struct OptimizerDtypes {
  int64_t state_bytes = 4, master_bytes = 0;
};
OptimizerDtypes optimizer_dtypes(const ParamTensor& t, const PrecisionRecipe& pr, const PeftConfig& peft, int64_t adapter_bytes);
}  // namespace

int64_t shard_group_size(const Config& c) {
  // Megatron's distributed optimizer and torchtitan's FSDP mesh both shard over the data- and context-parallel
  // ranks together (parallel_state.get_data_parallel_group(with_context_parallel=True); dp_shard_cp).
  const int64_t dp = c.parallel.shard_group_size > 0 ? c.parallel.shard_group_size : c.parallel.data_parallel_size;
  return mul(dp, c.parallel.context_parallel_size);
}

bool is_expert_param(const ParamTensor& t) { return t.name.rfind("mlp.experts.", 0) == 0; }

// DeepSpeed's stage3_param_persistence_threshold, 1e5 elements unless set (deepspeed/runtime/zero/config.py); a
// parameter of at most that many elements persists (ds_numel <= threshold).
int64_t zero_persistence_threshold(const ParallelConfig& p) {
  return p.zero_param_persistence_threshold > 0 ? p.zero_param_persistence_threshold : 100000;
}

std::pair<int64_t, int64_t> interleaved_chunk(int64_t layers, int64_t chunks, int64_t m) {
  const int64_t per = layers / chunks, rem = layers % chunks;
  const int64_t first = m * per + std::min(m, rem);
  return {first, first + per + (m < rem ? 1 : 0)};
}

ShardPlan shard_plan(const StepContext& ctx) {
  const auto& par = ctx.config.parallel;
  ShardPlan sp;
  const Resolved rs = resolve(ctx.config);
  sp.sharding = rs.sharding;
  sp.adapter_bytes = rs.adapter_bytes();
  sp.expert_shard = rs.framework->fsdp2_expert_shard;
  sp.n = shard_group_size(ctx.config);
  sp.ep = par.expert_parallel_size;
  // DeepSpeed runs ZeRO on one GPU too; that only changes memory where parameters live on the host and are
  // fetched module by module (ZeRO-Infinity), so a single GPU counts as unsharded otherwise.
  const bool one_gpu_offload = sp.sharding == Sharding::DeepSpeed && par.params_offload() != Offload::None && par.zero_stage == 3;
  const int64_t z = sp.n > 1 || one_gpu_offload ? par.zero_stage : 0;
  sp.fsdp = (sp.sharding == Sharding::Fsdp1 || sp.sharding == Sharding::Fsdp2) && z >= 2;
  sp.flat_optimizer = (sp.sharding == Sharding::DeepSpeed || sp.sharding == Sharding::Megatron) && z >= 1;
  sp.shard_grads = z >= 2;
  sp.shard_weights = z >= 3 || (sp.fsdp && z >= 2);  // FSDP keeps only shards at rest, even SHARD_GRAD_OP
  sp.grad_buffer = sp.sharding == Sharding::Megatron;
  sp.mixed = ctx.precision.master_bytes > 0;
  sp.offload_optimizer = par.optimizer_offload() != Offload::None;
  sp.offload_params = par.params_offload() != Offload::None;
  return sp;
}

bool fsdp1_unit_gradients(const Config& c) {
  const Resolved rs = resolve(c);
  const std::string& orig = c.parallel.fsdp_use_orig_params;
  return rs.sharding == Sharding::Fsdp1 && c.parallel.zero_stage >= 2 && shard_group_size(c) > 1 &&
         (orig == "true" || (orig == "auto" && rs.framework->fsdp_use_orig_params));
}

// Ranks one parameter is sharded over: expert weights only over the expert-data-parallel ranks (dp / ep).
int64_t ShardPlan::ranks_of(const ParamTensor& t) const {
  return ep > 1 && is_expert_param(t) ? std::max<int64_t>(1, n / ep) : n;
}

// FSDP2 chunks each parameter on dim 0 (torch.chunk), so a rank holds ceil(rows / N) rows (MEMORY_FORMULAS.md
// 2.6); FSDP1's flat parameter gives each rank ceil(numel / N) of the unit (2.5), padded by elements, not rows.
// The two differ where a tensor has fewer rows than ranks (a one-row expert bias or router on 16 ranks: FSDP2 gives
// each rank a whole row, FSDP1 a sixteenth), so FSDP1 is costed by elements. A routed expert's rows here are its
// experts, which is FSDP2's dim 0 only where the framework keeps the experts as one tensor and shards it there
// (FrameworkSpec::fsdp2_expert_shard): per-expert linears and torchtitan's dim-1 sharding split it by elements,
// the padding of a few rows of thousands being left out.
ParamTensor ShardPlan::local(const ParamTensor& t) const {
  ParamTensor l = t;
  const int64_t k = ranks_of(t);
  using ES = FrameworkSpec::ExpertShard;
  const bool expert_by_elements = is_expert_param(t) && (expert_shard == ES::PerExpertLinear ||
                                                         (expert_shard == ES::Dim1WhenShort && t.rows < k));
  const int64_t rows = t.rows > 0 && sharding != Sharding::Fsdp1 && !expert_by_elements ? t.rows : t.numel;
  const int64_t cols = rows > 0 ? t.numel / rows : 0;
  l.rows = ceil_div(rows, k);
  l.numel = mul(l.rows, std::max<int64_t>(cols, 1));
  return l;
}

// What sharding does to each parameter's persistent bytes (MEMORY_FORMULAS.md 2.1-2.6):
//  DeepSpeed ZeRO: 16-bit weights (stage 3), their gradients (stage 2) and the fp32 master + states (stage 1)
//    partitioned, the optimizer in one flat partition; parameters up to the persistence threshold stay whole.
//  FSDP (1 and 2): every parameter sharded; under mixed precision the shard is the fp32 parameter itself
//    (MixedPrecision param_dtype only for the unsharded copy), so there is no separate master; gradient shards
//    are in the shard's dtype.
//  Megatron: 16-bit weights whole, main gradients in an fp32 buffer whole; the distributed optimizer shards the
//    fp32 master and states (distrib_optimizer.md: 6 + 12/d bytes per parameter).
ParamStates param_states(const ShardPlan& sp, const StepContext& ctx, const ParamTensor& t) {
  const auto& peft = ctx.config.peft;
  const auto& pr = ctx.precision;
  const int64_t k = sp.ranks_of(t);
  ParamStates s;
  const int64_t ab = sp.adapter_bytes;
  const int64_t w = param_storage_bytes(t, pr, peft, ab), g = param_grad_bytes(t, pr, peft, ab);
  const bool plain = t.kind != ParamKind::Adapter && !t.quantized;  // a weight in the recipe's dtype
  if (sp.fsdp) {
    const ParamTensor l = sp.local(t);
    s.weights = param_storage_bytes(l, pr, peft, ab);
    if (sp.mixed && plain) s.weights = std::max(s.weights, mul(l.numel, pr.master_bytes));
    s.grads = !has_grad(t) ? 0 : sp.mixed && plain ? mul(l.numel, pr.master_bytes) : param_grad_bytes(l, pr, peft, ab);
    PrecisionRecipe no_master = pr;
    no_master.master_bytes = 0;
    if (sp.mixed) no_master.state_bytes = pr.master_bytes;
    s.optimizer = param_optimizer_bytes(l, no_master, peft, ab, ctx.optimizer, true);
    return s;
  }
  s.weights = sp.shard_weights && t.numel > zero_persistence_threshold(ctx.config.parallel) ? ceil_div(w, k) : w;
  if (sp.grad_buffer && t.kind == ParamKind::Adapter) s.grads = g;  // adapters keep their own dtype
  else if (sp.grad_buffer) s.grads = t.frozen ? 0 : mul(t.numel, std::max(pr.grad_bytes, sp.mixed ? int64_t{4} : pr.grad_bytes));
  else s.grads = sp.shard_grads ? ceil_div(g, k) : g;
  if (sp.flat_optimizer) s.flat_numel = t.frozen ? 0 : ceil_div(t.numel, k);
  else s.optimizer = param_optimizer_bytes(t, pr, peft, ab, ctx.optimizer, true);
  return s;
}

namespace {
// ZeRO-Infinity keeps parameters up to the persistence threshold whole on the GPU.
int64_t persistent_weight_bytes(const StepContext& ctx, const ShardPlan& sp, PerTensor<ParamStates>& states) {
  int64_t b = 0;
  const int64_t threshold = zero_persistence_threshold(ctx.config.parallel);
  for_each_param(ctx, [&](const ParamTensor& t) {
    if (t.numel <= threshold) b = add(b, states.get(t, [&](const ParamTensor& x) { return param_states(sp, ctx, x); }).weights);
  });
  return b;
}

// Model states as if nothing were offloaded.
ModelStates raw_model_states(const StepContext& ctx, const ShardPlan& sp, PerTensor<ParamStates>& states) {
  ModelStates m;
  // ZeRO-1/2's and Megatron's flat partition: each tensor's share keeps the fp32 master its dtype needs (none for
  // fp32 adapters, as unsharded), and the optimizer's states cover the partition as one 1-D tensor in the dtype of
  // the largest share (stage_1_and_2.py single_partition_of_fp32_groups: one flat tensor per parameter group).
  int64_t flat = 0, flat_master = 0, largest_share = 0, flat_state_bytes = ctx.precision.state_bytes;
  for_each_param(ctx, [&](const ParamTensor& t) {
    const ParamStates s = states.get(t, [&](const ParamTensor& x) { return param_states(sp, ctx, x); });
    m.weights_bytes = add(m.weights_bytes, s.weights);
    m.gradients_bytes = add(m.gradients_bytes, s.grads);
    m.optimizer_bytes = add(m.optimizer_bytes, s.optimizer);
    if (s.flat_numel == 0) return;
    flat = add(flat, s.flat_numel);
    const OptimizerDtypes d = optimizer_dtypes(t, ctx.precision, ctx.config.peft, sp.adapter_bytes);
    flat_master = add(flat_master, mul(s.flat_numel, d.master_bytes));
    if (s.flat_numel > largest_share) largest_share = s.flat_numel, flat_state_bytes = d.state_bytes;
  });
  if (sp.flat_optimizer)
    m.optimizer_bytes = add(flat_master, optimizer_state_bytes(ctx.optimizer, flat, flat, flat_state_bytes));
  return m;
}
}  // namespace

ModelStates model_state_bytes(const StepContext& ctx) {
  const ShardPlan sp = shard_plan(ctx);
  PerTensor<ParamStates> states(ctx.shape);
  ModelStates m = raw_model_states(ctx, sp, states);
  if (sp.offload_optimizer) {
    m.optimizer_bytes = 0;
    if (sp.shard_grads && !sp.grad_buffer) m.gradients_bytes = 0;  // reduced straight into host partitions
  }
  if (sp.offload_params) m.weights_bytes = sp.fsdp ? 0 : persistent_weight_bytes(ctx, sp, states);
  return m;
}

// What offload moves off the GPU, per GPU (MEMORY_FORMULAS.md 2.2): ZeRO-Offload the fp32 master, the states and
// the fp32 gradient partition; ZeRO-Infinity also the 16-bit parameter partition; FSDP's CPUOffload the sharded
// parameters and gradients, with the optimizer stepping on the CPU.
HostStates host_state_bytes(const StepContext& ctx) {
  const ShardPlan sp = shard_plan(ctx);
  PerTensor<ParamStates> states(ctx.shape);
  const ModelStates m = raw_model_states(ctx, sp, states);
  HostStates h;
  if (sp.offload_optimizer) {
    int64_t grads_fp32 = 0;
    for_each_param(ctx, [&](const ParamTensor& t) {
      if (has_grad(t)) grads_fp32 = add(grads_fp32, mul(4, sp.shard_grads || sp.flat_optimizer ? ceil_div(t.numel, sp.ranks_of(t)) : t.numel));
    });
    const int64_t opt = m.optimizer_bytes;
    const int64_t grads = sp.sharding == Sharding::Megatron ? 0 : grads_fp32;  // Megatron keeps main grads on the GPU
    (ctx.config.parallel.optimizer_offload() == Offload::Nvme ? h.nvme_bytes : h.host_bytes) += opt;
    h.host_bytes = add(h.host_bytes, grads);
  }
  if (sp.offload_params)  // everything but what stays on the GPU (model_state_bytes)
    (ctx.config.parallel.params_offload() == Offload::Nvme ? h.nvme_bytes : h.host_bytes) +=
        m.weights_bytes - (sp.fsdp ? 0 : persistent_weight_bytes(ctx, sp, states));
  return h;
}

namespace {

// Bytes of each stored parameter: its dtype, or bitsandbytes' packed storage for a quantized frozen weight
// (MEMORY_FORMULAS.md 4.2): int8 = 1 B/element + an fp32 scale per output row (Int8Params SCB); NF4/FP4 =
// 4 bits/element + an fp32 absmax per 64-element block, or with double quantization a uint8 absmax per block plus
// an fp32 scale per 256 blocks (QLoRA sec. 3), and the per-tensor fp32 offset and 256-entry code table.
// prepare_model_for_kbit_training casts every other parameter to fp32.
int64_t param_storage_bytes(const ParamTensor& t, const PrecisionRecipe& pr, const PeftConfig& peft, int64_t adapter_bytes) {
  if (t.kind == ParamKind::Adapter) return mul(t.numel, adapter_bytes);
  if (t.quantized && peft.quantization() == BaseQuantization::Int8) return add(t.numel, mul(t.rows, 4));
  if (t.quantized) {
    const int64_t blocks = ceil_div(t.numel, 64);
    const int64_t stats = peft.double_quantization ? add(add(blocks, mul(ceil_div(blocks, 256), 4)), 4 + 1024) : mul(blocks, 4);
    return add(ceil_div(t.numel, 2), stats);
  }
  if (peft.enabled() && peft.quantized() && peft.prepare_kbit) return mul(t.numel, 4);
  return mul(t.numel, pr.weight_bytes);
}

int64_t param_grad_bytes(const ParamTensor& t, const PrecisionRecipe& pr, const PeftConfig& peft, int64_t adapter_bytes) {
  if (!has_grad(t)) return 0;
  if (t.kind == ParamKind::Adapter) return mul(t.numel, adapter_bytes);
  if (peft.enabled() && peft.quantized() && peft.prepare_kbit) return mul(t.numel, 4);
  return mul(t.numel, pr.grad_bytes);
}

// Optimizer state of one trainable tensor: the fp32 master copy where the recipe keeps one for a low-precision
// parameter, and the optimizer's states in the parameter's dtype (torch: zeros_like(p)).
OptimizerDtypes optimizer_dtypes(const ParamTensor& t, const PrecisionRecipe& pr, const PeftConfig& peft,
                                 int64_t adapter_bytes) {
  OptimizerDtypes d{pr.state_bytes, pr.master_bytes};
  if (t.kind == ParamKind::Adapter || (peft.enabled() && peft.quantized() && peft.prepare_kbit)) {
    d.state_bytes = t.kind == ParamKind::Adapter ? adapter_bytes : 4;
    d.master_bytes = d.state_bytes == 4 ? 0 : d.master_bytes;
  }
  return d;
}

int64_t param_optimizer_bytes(const ParamTensor& t, const PrecisionRecipe& pr, const PeftConfig& peft,
                              int64_t adapter_bytes, const OptimizerSpec& opt, bool include_paged) {
  if (t.frozen) return 0;
  const OptimizerDtypes d = optimizer_dtypes(t, pr, peft, adapter_bytes);
  int64_t bytes = mul(t.numel, d.master_bytes);
  if (include_paged || !(opt.paged && t.numel >= kPagedMinNumel)) bytes = add(bytes, optimizer_state_bytes(opt, t.numel, t.rows, d.state_bytes));
  return bytes;
}

}  // namespace

int64_t StepBuilder::state_dtype_of(const ParamTensor& t) const {
  if (t.kind == ParamKind::Adapter) return adapter_bytes();
  if (c_.peft.enabled() && c_.peft.quantized() && c_.peft.prepare_kbit) return 4;
  return pr_.state_bytes;
}

int64_t StepBuilder::flat_partition_numel() const {
  if (flat_numel_cache_ >= 0) return flat_numel_cache_;
  int64_t n = 0;
  for_each_param(ctx_, [&](const ParamTensor& t) { n = add(n, states_of(t).flat_numel); });
  flat_numel_cache_ = n;
  return n;
}

bool StepBuilder::trainable_module(const char* module) const {
  for (const auto* list : {&s_.layer, &s_.moe_layer, &s_.decoder_layer, &s_.post})
    for (const auto& t : *list)
      if (has_grad(t) && t.kind != ParamKind::Adapter && module_name(t.name) == module) return true;
  return false;
}

int64_t StepBuilder::adapter_bytes() const { return adapter_bytes_; }
int64_t StepBuilder::weight_bytes_of(const ParamTensor& t) const {
  return param_storage_bytes(t, pr_, c_.peft, adapter_bytes_);
}
int64_t StepBuilder::grad_bytes_of(const ParamTensor& t) const {
  return grad_bytes_.get(t, [&](const ParamTensor& x) { return param_grad_bytes(x, pr_, c_.peft, adapter_bytes_); });
}
ParamStates StepBuilder::states_of(const ParamTensor& t) const {
  return states_.get(t, [&](const ParamTensor& x) { return param_states(sp_, ctx_, x); });
}

// The micro-batch's rows and tokens per row. Context parallel: each rank holds sequence_length / cp tokens of every
// sequence (2 x cp load-balanced chunks; torchtitan / torch.distributed.tensor.experimental.context_parallel,
// Megatron-Core with TE). Prompt tuning adds its virtual tokens to every sequence (model.cpp virtual_tokens).
// Sequence parallel splits the tokens that norms, dropout and the residual stream see over the TP ranks
// (Korthikanti et al. 2022 sec. 4.2.2).
void StepBuilder::use_shape(const MicroBatchShape& shape) {
  d_.b = shape.sequences;
  d_.s = (shape.tokens + virtual_tokens(c_.peft)) / c_.parallel.context_parallel_size;
  d_.T = mul(d_.b, d_.s);
  d_.Tn = c_.parallel.sequence_parallel ? d_.T / c_.parallel.tensor_parallel_size : d_.T;
  d_.padded = shape.padded;
}

StepBuilder::StepBuilder(const StepContext& ctx)
    : ctx_(ctx), c_(ctx.config), s_(ctx.shape), pr_(ctx.precision), rs_(resolve(ctx.config)) {
  const auto& m = c_.model;
  const auto& t = c_.training;
  use_shape({t.micro_batch_size, t.sequence_length});
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
  // prepare_model_for_kbit_training casts every parameter that is not quantized to fp32, the token embedding
  // included (peft utils/other.py, v0.4-v0.20: `param.data = param.data.to(torch.float32)` for fp16/bf16
  // parameters), so inputs_embeds, and with them the residual stream and the norms' outputs (LlamaRMSNorm
  // returns weight * hidden.to(input_dtype), an fp32 weight), are fp32 whatever the recipe. Lightning's
  // bitsandbytes plugin does not call it.
  const bool kbit = c_.peft.enabled() && c_.peft.quantized() && c_.peft.prepare_kbit;
  if (kbit && !rs_.framework->bnb_via_lightning && !c_.model.is_encoder_decoder) d_.e_res = 4;
  d_.amp = pr_.autocast_copy_bytes > 0;
  sp_ = shard_plan(ctx);
  adapter_bytes_ = rs_.adapter_bytes();
  n_ = sp_.n;
  shard_opt_ = sp_.flat_optimizer;
  shard_grads_ = sp_.shard_grads;
  shard_weights_ = sp_.shard_weights;
  kept_.resize(static_cast<size_t>(s_.num_layers + 2));
  accum_.assign(static_cast<size_t>(s_.num_layers + 2), UINT32_MAX);
  // torchtitan also keeps parameters unsharded after forward under PP (parallelize_llama.py apply_fsdp:
  // reshard_after_forward = False when pp_enabled); the pipeline's no_sync keeps them to the last backward.
  no_sync_ = sp_.fsdp && c_.parallel.pipeline_parallel_size > 1;
  const std::string& no_sync = c_.parallel.fsdp_no_sync;
  accum_no_sync_ = sp_.fsdp && (no_sync == "true" || (no_sync == "auto" && rs_.framework->fsdp_no_sync_accumulation)) &&
                   c_.parallel.pipeline_parallel_size == 1 && c_.training.gradient_accumulation_steps > 1;
  sharded_grad_made_.assign(static_cast<size_t>(s_.num_layers + 2), false);
  for (const auto* list : {&s_.layer, &s_.moe_layer, &s_.decoder_layer})
    for (const auto& t : *list) any_quantized_ |= t.quantized;
  grads_.resize(static_cast<size_t>(s_.num_layers + 2));
  grad_created_.assign(static_cast<size_t>(s_.num_layers + 2), false);
  states_created_.assign(static_cast<size_t>(s_.num_layers + 2), false);
  casts_.assign(static_cast<size_t>(s_.num_layers), UINT32_MAX);

  auto& p = p_;
  L_.weights = p.label("weights");
  L_.grads = p.label("gradients (.grad)");
  // Tensors are named after the engine that allocates them (a ZeRO-3 buffer is not DDP's): the one that reduces the
  // gradients follows alloc_weights and alloc_layer_grads, which pick it by the same tests.
  const bool deepspeed = sp_.sharding == Sharding::DeepSpeed;
  const std::string zero = "DeepSpeed ZeRO-" + std::to_string(c_.parallel.zero_stage);
  L_.grad_partition = p.label(zero + " gradient partition (this rank's reduced gradients, flat)");
  // Without ZeRO the layout is DDP's (memsim resolves HF Trainer to DeepSpeed's sharding, which it uses only with ZeRO).
  L_.grad_bucket = p.label(deepspeed && shard_opt_ ? zero + " reduce bucket (IPG buffer of reduce_bucket_size elements)"
                                                   : "DDP gradient bucket (second copy of the gradients)");
  L_.gathered = p.label(sp_.fsdp ? "FSDP unsharded parameters (all-gathered)" : zero + " all-gathered layer parameters");
  L_.ag_buffer = p.label("FSDP2 all-gather output (copied out per parameter)");
  L_.rs_input = p.label("FSDP2 reduce-scatter input (unsharded gradients in the reduce dtype)");
  L_.rs_output = p.label(std::string(sp_.sharding == Sharding::Fsdp2 ? "FSDP2" : "FSDP") +
                         " reduce-scatter output (added into the gradient shard)");
  L_.grad_shard = p.label(std::string(sp_.sharding == Sharding::Fsdp2 ? "FSDP2" : "FSDP") + " gradient shard");
  L_.main_grads = p.label("Megatron main-gradient buffer (fp32, whole)");
  L_.fp8_weights = p.label("fp8 weight copies and transposes (Transformer Engine)");
  L_.fp8_cast = p.label("fp8 cast of a linear's weight (transient)");
  L_.fp8_input = p.label("linear input saved in fp8 (Transformer Engine)");
  L_.grad_accum = p.label("FSDP unsharded gradients accumulated over micro-batches (no_sync)");
  L_.ring = p.label("ring attention: key/value chunks in flight and fp32 partial outputs");
  L_.a2a = p.label("expert-parallel all-to-all buffers (tokens sent to and received from other ranks)");
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
  L_.softmax_in = p.label("softmax / log_softmax input (saved by torch <= 1.10)");
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
  L_.recv_buffer = p.label("pipeline receive buffers (one per micro-batch, kept across steps)");
  L_.logits = p.label("logits");
  L_.logits_fp32 = p.label("logits upcast to fp32");
  L_.lse_loss = p.label("log-softmax of the logits (saved by the loss)");
  L_.loss_grad = p.label("loss backward: gradient of the logits");
  L_.loss_grad_bf16 = p.label("gradient of the logits cast back to the compute dtype");
  L_.flce_buffers = p.label("fused linear cross-entropy buffers (grad of lm_head input and weight)");
  L_.lm_head_in = p.label("final norm output (saved by lm_head)");
  L_.embed_grad_dense = p.label("dense embedding gradient");
  L_.tied_sum = p.label("tied weights: lm_head's and the embedding's gradients summed");
  L_.tied_pending = p.label("tied weights: lm_head's gradient, waiting for the embedding's");
  L_.logits_shifted = p.label("logits shifted by one token (logits[..., :-1, :].contiguous(), a copy)");
}

// nn.Module init: one allocation per parameter tensor. Under ZeRO-3 each rank keeps only its partition of
// every parameter (DeepSpeed partition_parameters.py: param.ds_tensor).
// DeepSpeed's defaults where a config leaves 0 (deepspeed/runtime/zero/config.py DeepSpeedZeroConfig).
int64_t StepBuilder::zero_reduce_bucket() const {
  return c_.parallel.zero_reduce_bucket_size > 0 ? c_.parallel.zero_reduce_bucket_size : 500000000;
}
int64_t StepBuilder::zero_persistence() const {
  return zero_persistence_threshold(c_.parallel);
}
bool StepBuilder::zero_overlap() const {  // the validator overlap_comm_valid: None means stage == 3
  const TriState set = c_.parallel.overlap_comm();
  return set == TriState::Auto ? c_.parallel.zero_stage == 3 : set == TriState::True;
}
// ZeRO-3 keeps parameters up to stage3_param_persistence_threshold whole on every rank, never released
// (partition_parameters.py _convert_to_deepspeed_param and parameter_offload.py mark_persistent_parameters:
// param.ds_numel <= param_persistence_threshold).
bool StepBuilder::persistent(const ParamTensor& t) const { return t.numel <= zero_persistence(); }

void StepBuilder::alloc_weights() {
  p_.phase("model load");
  // Offloaded parameter shards live in host memory (ZeRO-Infinity, FSDP CPUOffload); small persistent ones stay.
  const int64_t threshold = zero_persistence();
  for_each_param(ctx_, [&](const ParamTensor& t) {
    if (sp_.offload_params && (sp_.fsdp || t.numel > threshold)) return;
    p_.alloc(Component::Weights, states_of(t).weights, L_.weights);
  });
  // Transformer Engine's fp8 copies of every linear weight and its transpose, module buffers kept across steps
  // (linear.py: weight_fp8, weight_t_fp8). The transformer layers only: the output layer is not a TE module.
  if (pr_.fp8_weight_copy_bytes > 0) {
    int64_t numel = 0;
    for (int64_t l = ctx_.first_layer; l < std::min(ctx_.end_layer, s_.num_layers); ++l)
      numel = add(numel, matmul_numel(s_.params_of(l)));
    if (numel > 0) p_.alloc(Component::Weights, mul(numel, pr_.fp8_weight_copy_bytes), L_.fp8_weights);
  }
  // Megatron allocates the fp32 main-gradient buffer with the model (distributed/param_and_grad_buffer.py
  // _ParamAndGradBuffer: grad_data = torch.zeros(numel, dtype=grad_dtype)); zero_grad only zeroes it.
  if (sp_.grad_buffer) {
    int64_t bytes = 0;
    for_each_param(ctx_, [&](const ParamTensor& t) { bytes = add(bytes, states_of(t).grads); });
    if (bytes > 0) p_.alloc(Component::Gradients, bytes, L_.main_grads);
  }
  // ZeRO-3 allocates its gradient bucket with the optimizer (stage3.py _setup_for_real_optimizer:
  // __ipg_bucket_flat_buffer of reduce_bucket_size elements in the model dtype, contiguous_gradients on).
  if (sp_.sharding == Sharding::DeepSpeed && shard_weights_ && (n_ > 1 || sp_.offload_params))
    p_.alloc(Component::Communication, mul(zero_reduce_bucket(), pr_.weight_bytes), L_.grad_bucket);
}

// AccumulateGrad creates each .grad at its parameter's first backward of the step (MEMORY_FORMULAS.md 6).
// ZeRO-2/3 reduce each layer's full gradients into the flat partition and free them (stage_1_and_2.py,
// stage3.py: grad_partitions_flat_buffer); DDP (several GPUs, no ZeRO) also keeps a flat bucket copy of all
// gradients (gradient_as_bucket_view=False is the default, MEMORY_FORMULAS.md 2.7).
void StepBuilder::alloc_layer_grads(int64_t layer) {
  if (sp_.grad_buffer) return;  // Megatron: backward writes into main_grad (gradient_accumulation_fusion)
  if (!grads_live_) {
    grads_live_ = true;
    const bool deepspeed = sp_.sharding == Sharding::DeepSpeed;
    if (deepspeed && shard_grads_ && !(sp_.offload_optimizer)) {
      int64_t part = 0;
      for_each_param(ctx_, [&](const ParamTensor& t) { part = add(part, states_of(t).grads); });
      other_grads_.push_back(p_.alloc(Component::Gradients, part, L_.grad_partition));
    }
    // ZeRO-1/2 reduce gradients through ipg buffers of reduce_bucket_size elements in the model dtype, two with
    // overlap_comm (stage_1_and_2.py backward: buf_0, buf_1). They stay allocated from the first backward on.
    if (deepspeed && shard_opt_ && !shard_weights_ && n_ > 1 && !zero_buckets_) {
      zero_buckets_ = true;
      for (int i = 0; i < (zero_overlap() ? 2 : 1); ++i)
        p_.alloc(Component::Communication, mul(zero_reduce_bucket(), pr_.weight_bytes), L_.grad_bucket);
    }
  }
  const size_t slot = static_cast<size_t>(layer + 1);  // 0 = embeddings, L + 1 = final norm and head
  if (grad_created_[slot]) {  // gradient accumulation: the .grad tensors are already there
    if (layer >= s_.num_layers && tied_sum())  // ... but a tied matrix's gradient waits in the engine (tied_sum)
      tied_pending_ = p_.alloc(Component::Gradients, grad_bytes_of(s_.pre.front()), L_.tied_pending);
    return;
  }
  grad_created_[slot] = true;
  const std::vector<ParamTensor>& ts = layer < 0 ? s_.pre : layer >= s_.num_layers ? s_.post : s_.params_of(layer);
  // DDP with gradient_as_bucket_view: from the second iteration the .grad tensors are views into the buckets
  // (torch/nn/parallel/distributed.py docstring: "gradients will be views after first iteration").
  if (bucket_views_) return;
  for (const auto& t : ts) {
    if (layer < 0 && &t == &s_.pre.front() && c_.model.tie_word_embeddings) continue;  // created by lm_head
    if (!has_grad(t)) continue;
    grads_[slot].push_back(p_.alloc(Component::Gradients, grad_bytes_of(t), L_.grads, static_cast<int32_t>(layer)));
  }
  // Tied weights: lm_head is the embedding matrix, so its .grad appears in the loss backward.
  if (layer >= s_.num_layers && c_.model.tie_word_embeddings && has_grad(s_.pre.front()))
    grads_[slot].push_back(p_.alloc(Component::Gradients, grad_bytes_of(s_.pre.front()), L_.grads));
}

// ZeRO-2/3 reduce a layer's full gradients into the partition and free them. FSDP reduce-scatters them into a
// gradient shard: FSDP2 copies them into one flat input in the reduce dtype (fp32 under torchtitan's
// MixedPrecisionPolicy) that lives until the next group's reduce (_fsdp_collectives.py foreach_reduce,
// _fsdp_param_group.py post_backward: reduce_scatter_state); FSDP1 reduce-scatters the flat gradient itself
// (_runtime_utils.py _reduce_grad). The first micro-batch's output becomes the shard; later ones add into it.
void StepBuilder::release_layer_grads(int64_t layer) {
  if (!shard_grads_ || sp_.grad_buffer) return;
  // ... and so do the micro-batches before the last under no_sync gradient accumulation (accum_no_sync_).
  if (no_sync_ || (accum_no_sync_ && !last_backward_)) {
    // Pipeline stages under FSDP accumulate unsharded gradients and reduce once after the last micro-batch
    // (torch/distributed/pipelining/stage.py backward_maybe_with_nosync: set_requires_gradient_sync(False),
    // then post_backward of every group); FSDP2 accumulates them in the reduce dtype
    // (_fsdp_param.py to_accumulated_grad_if_needed).
    const size_t slot = static_cast<size_t>(layer + 1);
    const int64_t reduce_bytes = sp_.mixed ? pr_.master_bytes : pr_.grad_bytes;
    if (grads_[slot].empty() || reduce_bytes == pr_.grad_bytes) return;  // .grad itself accumulates
    if (accum_[slot] == UINT32_MAX) {
      int64_t numel = 0;
      for (const auto& t : layer < 0 ? s_.pre : layer >= s_.num_layers ? s_.post : s_.params_of(layer))
        if (has_grad(t)) numel = add(numel, t.numel);
      accum_[slot] = p_.alloc(Component::Gradients, mul(numel, reduce_bytes), L_.grad_accum, static_cast<int32_t>(layer));
    }
    for (uint32_t g : grads_[slot]) drop(g);
    grads_[slot].clear();
    grad_created_[slot] = false;
    return;
  }
  // FSDP's root unit holds the embeddings with the final norm and head, so the head's gradients wait for the
  // embedding's backward and are reduced with it.
  if (sp_.fsdp && layer >= s_.num_layers && ctx_.has_pre) return;
  if (sp_.fsdp && layer < 0 && ctx_.has_post) reduce_slot(s_.num_layers);
  reduce_slot(layer);
}

void StepBuilder::reduce_slot(int64_t layer) {
  const size_t slot = static_cast<size_t>(layer + 1);
  if (sp_.fsdp && (!grads_[slot].empty() || accum_[slot] != UINT32_MAX)) {
    const std::vector<ParamTensor>& ts = layer < 0 ? s_.pre : layer >= s_.num_layers ? s_.post : s_.params_of(layer);
    int64_t numel = 0, shard = 0;
    for (const auto& t : ts)
      if (has_grad(t)) numel = add(numel, t.numel), shard = add(shard, states_of(t).grads);
    if (layer >= s_.num_layers && c_.model.tie_word_embeddings && has_grad(s_.pre.front()))
      numel = add(numel, s_.pre.front().numel), shard = add(shard, states_of(s_.pre.front()).grads);
    const int64_t reduce_bytes = sp_.mixed ? pr_.master_bytes : pr_.grad_bytes;
    uint32_t input = UINT32_MAX;
    if (sp_.sharding == Sharding::Fsdp2) {
      if (pending_reduce_ != UINT32_MAX) drop(pending_reduce_), pending_reduce_ = UINT32_MAX;
      // FSDP2 copies the gradients into the reduce-scatter input on the compute stream (PR #129721, torch 2.5).
      input = p_.alloc(Component::Communication, mul(numel, reduce_bytes), L_.rs_input, static_cast<int32_t>(layer));
    }
    for (uint32_t g : grads_[slot]) drop(g);
    grads_[slot].clear();
    grad_created_[slot] = false;
    if (accum_[slot] != UINT32_MAX) drop(accum_[slot]), accum_[slot] = UINT32_MAX;
    if (!sharded_grad_made_[slot] && !sp_.offload_optimizer) {
      sharded_grad_made_[slot] = true;
      // The reduce-scatter output is allocated on the reduce-scatter stream and becomes the sharded gradient
      // (FSDP2 foreach_reduce: reduce_output under reduce_scatter_stream; FSDP1 _post_backward_hook:
      // new_sharded_grad = torch.empty_like(...) under the post-backward stream), so the gradients live in
      // that stream's pool until zero_grad.
      sharded_grads_.push_back(p_.alloc(Component::Gradients, shard, L_.grad_shard, static_cast<int32_t>(layer),
                                        Stream::ReduceScatter));
    } else {
      uint32_t out = p_.alloc(Component::Communication, shard, L_.rs_output, static_cast<int32_t>(layer), Stream::ReduceScatter);
      drop(out);  // added into the shard (or copied to the host shard under CPU offload)
    }
    if (input != UINT32_MAX) pending_reduce_ = input;
    return;
  }
  for (uint32_t g : grads_[slot]) drop(g);
  grads_[slot].clear();
  grad_created_[slot] = false;  // the next micro-batch makes new full gradients and reduces them again
}

// torch.distributed.pipelining: every micro-batch's receive buffer (activations into a stage after the first,
// gradients into a stage before the last) is allocated on the first step and kept; one set per stage (model chunk).
void StepBuilder::recv_buffers(int64_t stage_layer, bool grads) {
  for (const auto& [layer, g] : recv_made_)
    if (layer == stage_layer && g == grads) return;
  recv_made_.push_back({stage_layer, grads});
  const int64_t bytes = mul(d_.e_res, d_.Tn, d_.h);
  for (int64_t k = 0; k < c_.training.gradient_accumulation_steps; ++k)
    p_.alloc(Component::Communication, bytes, L_.recv_buffer, static_cast<int32_t>(stage_layer));
}

void StepBuilder::release_all_gather() {
  if (pending_all_gather_ != UINT32_MAX) drop(pending_all_gather_), pending_all_gather_ = UINT32_MAX;
}

void StepBuilder::end_backward() {
  in_backward_ = false;
  ds_release_window();
  ds_trace_complete_ = true;  // DeepSpeed's coordinator has the module trace after the first forward and backward
  if (no_sync_ && !last_backward_) return;  // parameters stay unsharded, gradients keep accumulating
  if (no_sync_)  // the last micro-batch: every group reduces in turn (run_post_backward)
    for (int64_t l = s_.num_layers; l >= -1; --l) reduce_slot(l);
  if (pending_reduce_ != UINT32_MAX) drop(pending_reduce_), pending_reduce_ = UINT32_MAX;
  if (!sp_.fsdp) return;  // only FSDP keeps parameters unsharded (gather): no need to visit every slot
  for (auto& k : kept_) {  // anything still unsharded (a stage without its backward) is freed
    for (uint32_t t : k) drop(t);
    k.clear();
  }
}

int64_t StepBuilder::gathered_bytes(int64_t l) const {
  if (l < -1 || l > s_.num_layers) return 0;
  // The same for every layer of a kind (dense or MoE), so each kind is summed once.
  const int kind = l < 0 ? 0 : l >= s_.num_layers ? 1 : s_.is_moe(l) ? 3 : 2;
  if (gathered_cache_[kind] >= 0) return gathered_cache_[kind];
  const std::vector<ParamTensor>& ts = l < 0 ? s_.pre : l >= s_.num_layers ? s_.post : s_.params_of(l);
  int64_t bytes = 0;
  // FSDP1 all-gathers a unit's FlatParameter, padded as a whole to a multiple of its ranks (flat_param.py
  // _init_flat_param_and_metadata / FlatParamHandle._get_shard: numel_to_pad = world_size * chunk - numel): the
  // unit's bytes per shard group (expert weights have their own under EP) are summed first, then padded. Padding
  // each tensor instead would add a rank's worth per tensor, and grow with the ranks where FSDP1's does not.
  std::vector<std::pair<int64_t, int64_t>> fsdp1_groups;  // (ranks, bytes)
  for (const auto& t : ts) {
    if (sp_.fsdp && sp_.sharding == Sharding::Fsdp1) {
      const int64_t k = sp_.ranks_of(t), b = param_storage_bytes(t, pr_, c_.peft, adapter_bytes_);
      auto g = std::find_if(fsdp1_groups.begin(), fsdp1_groups.end(), [&](const auto& x) { return x.first == k; });
      if (g == fsdp1_groups.end()) fsdp1_groups.push_back({k, b});
      else g->second = add(g->second, b);
      continue;
    }
    // torchao's float8 all-gather sends linear weights as fp8 (1 byte per element); the output layer stays
    // 16-bit (torchtitan's float8 filter_fqns excludes "output").
    if (sp_.fsdp && pr_.fp8_allgather && t.kind == ParamKind::Matmul && !t.quantized && l >= 0 && l < s_.num_layers)
      bytes = add(bytes, mul(sp_.ranks_of(t), sp_.local(t).numel));
    else if (sp_.fsdp) bytes = add(bytes, mul(sp_.ranks_of(t), param_storage_bytes(sp_.local(t), pr_, c_.peft, adapter_bytes_)));
    else if (!persistent(t)) bytes = add(bytes, weight_bytes_of(t));
  }
  for (const auto& [k, b] : fsdp1_groups) bytes = add(bytes, mul(ceil_div(b, k), k));
  gathered_cache_[kind] = bytes;
  return bytes;
}

// DeepSpeed ZeRO-3 fetches a module's full 16-bit parameters before its forward and backward and releases them
// after (partitioned_param_coordinator.py). Parameters up to stage3_param_persistence_threshold (1e5 elements)
// stay whole; they are small and counted with the partitioned weights here.
void StepBuilder::gather(int64_t layer, std::vector<uint32_t>& out) {
  if (!shard_weights_ || (n_ == 1 && !sp_.offload_params)) return;  // one GPU: only offloaded parameters move
  if (sp_.fsdp) {
    // Parameters stay unsharded from forward to backward under SHARD_GRAD_OP / reshard_after_forward=False, and
    // always for the root unit (embeddings, final norm and head): FSDP1 _post_forward_reshard skips the root,
    // FSDP2 sets the root's reshard_after_forward to False.
    const size_t slot = static_cast<size_t>(layer + 1);
    // parallel.fsdp_shard_embeddings (torchtune's custom_sharded_layers): the embedding and the output layer are
    // units of their own, resharded after forward like a block (the final norm, a few KiB, is taken with the head).
    const bool root = (layer < 0 || layer >= s_.num_layers) && !embedding_units();
    const bool last_kept = rs_.framework->fsdp_last_block_kept && sp_.sharding == Sharding::Fsdp2 &&
                           c_.parallel.pipeline_parallel_size == 1 && layer == s_.num_layers - 1;
    const bool keep = root || c_.parallel.zero_stage == 2 || no_sync_ || last_kept;
    auto unshard = [&](int64_t l, std::vector<uint32_t>& into) {
      const int64_t bytes = gathered_bytes(l);
      if (bytes == 0) return;
      // FSDP2 all-gathers into one flat buffer on its all-gather copy-in stream and copies out into per-parameter
      // tensors on the compute stream (_fsdp_collectives.py foreach_all_gather, foreach_all_gather_copy_out). In
      // forward the buffer waits for the next group's unshard ("Defer free to allow for overlap of this copy-out
      // with next all-gather", _fsdp_param_group.py wait_for_unshard); in backward it goes after the copy-out.
      // FSDP1 all-gathers straight into the flat parameter's padded storage on its unshard stream.
      const bool fsdp2 = sp_.sharding == Sharding::Fsdp2;
      const int32_t li = static_cast<int32_t>(l);
      uint32_t flat = fsdp2 ? p_.alloc(Component::Communication, bytes, L_.ag_buffer, li, Stream::AllGather) : UINT32_MAX;
      if (fsdp2 && !in_backward_) release_all_gather();
      into.push_back(p_.alloc(Component::Communication, bytes, L_.gathered, li, fsdp2 ? Stream::Compute : Stream::AllGather));
      if (flat != UINT32_MAX) {
        if (in_backward_) drop(flat);
        else pending_all_gather_ = flat;
      }
    };
    if (keep) {
      if (kept_[slot].empty()) unshard(layer, kept_[slot]);  // in backward too: e.g. a later micro-batch
    } else {
      unshard(layer, out);
    }
    // Backward prefetch: FSDP2 unshards the next group in backward order (_fsdp_param_group.py _prefetch_unshard),
    // or the k set by set_modules_to_backward_prefetch; FSDP1 does with BACKWARD_PRE (the default), holding "the
    // current set of parameters, next set of parameters, and current set of gradients". In forward, FSDP1's
    // forward_prefetch and FSDP2's set_modules_to_forward_prefetch all-gather the next unit(s) during this one;
    // neither prefetches in forward by default. A prefetched unit's parameters are held with this one's.
    if (c_.parallel.zero_stage != 3 || no_sync_) return;
    const int64_t depth = !in_backward_ ? c_.parallel.fsdp_forward_prefetch
                          : sp_.sharding == Sharding::Fsdp2 ? c_.parallel.fsdp2_backward_prefetch
                          : c_.parallel.backward_prefetch() == BackwardPrefetch::Pre ? 1 : 0;
    const int64_t step = in_backward_ ? -1 : 1;
    for (int64_t j = 1; j <= depth; ++j) {
      const int64_t next = layer + step * j;
      if (next < ctx_.first_layer || next >= std::min(ctx_.end_layer, s_.num_layers)) break;
      if (!kept_[static_cast<size_t>(next + 1)].empty()) continue;
      unshard(next, out);
    }
    return;
  }
  ds_fetch(layer, out);
}

// DeepSpeed ZeRO-3's fetches (partitioned_param_coordinator.py fetch_sub_module, the same from v0.8 to v0.14). Every
// module call all-gathers the module's own parameters and, once the first forward and backward have recorded the
// module trace, prefetches further along it while min(stage3_max_live_parameters - n_available,
// stage3_prefetch_bucket_size) > 0, at least one parameter per call. Parameterless modules (the decoder layer, its
// attention and MLP containers, activations, rotary) call it too, so the prefetch runs ahead until the gathered
// parameters reach max_live (1e9 elements by default), the last one overshooting it; release_sub_module frees each
// parameter after its module, so the working set stays at max_live elements in forward and in backward, whatever the
// layer size (a 7B-class model holds about five layers, not one). n_available counts elements, not bytes. The
// buffers are allocated on the all-gather stream when overlap_comm is on (the stage-3 default: __all_gather_params_
// runs under `with stream(self.__allgather_stream)`, and free_param record_stream()s the buffer), so released
// parameters are cached in that stream's pool. Frozen parameters are fetched in backward too: the fetch follows the
// module output's gradient (PreBackwardFunction), never param.requires_grad. The embedding is not fetched in
// backward here (its output takes no gradient under PEFT, and its dense gradient needs no weight).
void StepBuilder::ds_fetch(int64_t layer, std::vector<uint32_t>& out) {
  const int dir = in_backward_ ? -1 : 1;
  if (!ds_window_.empty() && ds_window_dir_ != dir) ds_release_window();
  ds_window_dir_ = dir;
  const Stream stream = zero_overlap() ? Stream::AllGather : Stream::Compute;
  auto params = [&](int64_t l) -> const std::vector<ParamTensor>& {
    return l < 0 ? s_.pre : l >= s_.num_layers ? s_.post : s_.params_of(l);
  };
  auto gather_param = [&](const ParamTensor& t, int64_t l, std::vector<uint32_t>& into) {
    into.push_back(p_.alloc(Component::Communication, weight_bytes_of(t), L_.gathered, static_cast<int32_t>(l), stream));
  };
  // The module's own parameters: those the prefetch gathered already are taken over, the rest gathered now.
  size_t from = 0;
  if (!ds_window_.empty() && ds_window_.front().slot == layer) {
    DsPrefetched& w = ds_window_.front();
    out.insert(out.end(), w.tensors.begin(), w.tensors.end());
    from = w.next_param;
    ds_ahead_elems_ -= w.elems;
    ds_window_.pop_front();
  } else {
    ds_release_window();  // another pass (a micro-batch, a chunk) left it: nothing in it is next
  }
  const auto& own = params(layer);
  int64_t live = ds_ahead_elems_;
  for (size_t i = 0; i < own.size(); ++i) {
    if (persistent(own[i])) continue;
    live = add(live, own[i].numel);
    if (i >= from) gather_param(own[i], layer, out);
  }
  if (!ds_trace_complete_) return;
  const int64_t max_live = c_.parallel.zero_max_live_parameters > 0 ? c_.parallel.zero_max_live_parameters : 1000000000;
  const int64_t last = std::min(ctx_.end_layer, s_.num_layers);
  auto in_trace = [&](int64_t l) {
    return dir > 0 ? (l >= ctx_.first_layer && l < last) || (l == s_.num_layers && ctx_.has_post)
                   : l >= ctx_.first_layer && l < last;
  };
  while (live < max_live) {
    if (ds_window_.empty() || ds_window_.back().next_param == params(ds_window_.back().slot).size()) {
      const int64_t next = ds_window_.empty() ? layer + dir : ds_window_.back().slot + dir;
      if (!in_trace(next)) break;
      ds_window_.push_back({next, 0, {}, 0});
    }
    DsPrefetched& w = ds_window_.back();
    const ParamTensor& t = params(w.slot)[w.next_param++];
    if (persistent(t)) continue;
    gather_param(t, w.slot, w.tensors);
    w.elems = add(w.elems, t.numel);
    ds_ahead_elems_ = add(ds_ahead_elems_, t.numel);
    live = add(live, t.numel);
  }
}

void StepBuilder::ds_release_window() {
  for (auto& w : ds_window_)
    for (uint32_t t : w.tensors) drop(t);
  ds_window_.clear();
  ds_ahead_elems_ = 0;
}

// FSDP: a layer's kept parameters are resharded once its backward is done.
void StepBuilder::reshard_after_backward(int64_t layer) {
  if (!sp_.fsdp || no_sync_) return;
  auto& k = kept_[static_cast<size_t>(layer + 1)];
  for (uint32_t t : k) drop(t);
  k.clear();
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
  int64_t bytes = param_optimizer_bytes(t, pr_, c_.peft, adapter_bytes_, ctx_.optimizer, false);
  if (sp_.fsdp) bytes = ctx_.optimizer.paged && sp_.local(t).numel >= kPagedMinNumel ? 0 : states_of(t).optimizer;
  if (bytes <= 0) return;
  // Each state is its own tensor (adam.py _init_group: exp_avg and exp_avg_sq, each zeros_like(p); bitsandbytes
  // state1/state2 with their absmax), so the allocator sees k blocks, not one of k times the size.
  const int64_t k = optimizer_full_states(ctx_.optimizer);
  const int64_t parts = k > 1 && bytes % k == 0 ? k : 1;
  for (int64_t i = 0; i < parts; ++i) p_.alloc(Component::OptimizerStates, bytes / parts, L_.state);
}

void StepBuilder::optimizer_step(int iter) {
  p_.phase("optimizer step " + std::to_string(iter));
  if (c_.training.optimizer_in_backward) return;  // stepped during backward
  if (sp_.offload_optimizer) return;  // ZeRO-Offload / FSDP CPUOffload: the step runs on the host (CPU Adam)
  const auto& opt = ctx_.optimizer;
  // Optimizer state is created lazily in the first step() (torch/optim/adam.py::_init_group: zeros_like).
  // Paged bitsandbytes state (tensors >= 1e5 elements) lives in unified memory, outside the allocator.
  if (iter == 1) {
    if (shard_opt_) {
      // DeepSpeed keeps one flat fp32 partition of the trainable parameters (stage_1_and_2.py
      // single_partition_of_fp32_groups) and the optimizer's states beside it; so does Megatron's distributed
      // optimizer (distrib_optimizer.py: main params and states of the rank's shard of the grad buffer).
      const int64_t part = flat_partition_numel();
      if (pr_.master_bytes > 0) p_.alloc(Component::OptimizerStates, mul(part, pr_.master_bytes), L_.master);
      if (!(opt.paged && part >= kPagedMinNumel)) {
        const int64_t st = optimizer_state_bytes(opt, part, part, pr_.state_bytes);
        if (st > 0) p_.alloc(Component::OptimizerStates, st, L_.state);
      }
    } else {
      for_each_param(ctx_, [&](const ParamTensor& t) { create_state(t); });
    }
  }
  // ZeRO-1/2 upcast each group's gradient partition to fp32 for the step (stage_1_and_2.py::step:
  // single_grad_partition = flatten(...).to(fp32)), freed after the group's update.
  if (shard_opt_ && sp_.sharding == Sharding::DeepSpeed && !shard_weights_ && pr_.grad_bytes < 4) {
    uint32_t t = p_.alloc(Component::Temporaries, mul(flat_partition_numel(), 4), L_.opt_tmp);
    drop(t);
  }
  // ZeRO-3 does the same per sub-group of at most sub_group_size (1e9) elements (stage3.py
  // _prepare_fp32_grad_for_sub_group: flatten(averaged_gradients).to(fp32), freed in _release_sub_group).
  if (shard_opt_ && sp_.sharding == Sharding::DeepSpeed && shard_weights_ && pr_.grad_bytes < 4) {
    uint32_t t = p_.alloc(Component::Temporaries, mul(std::min<int64_t>(flat_partition_numel(), 1000000000), 4), L_.opt_tmp);
    drop(t);
  }
  if (shard_opt_) return;  // DeepSpeed's FusedAdam, Megatron's TE/Apex FusedAdam: no full-size temporaries
  // Temporaries of torch's implementations (MEMORY_FORMULAS.md 6), on each rank's shards under FSDP:
  //  foreach Adam/AdamW: exp_avg_sq.sqrt() for every tensor of one param group at once (_foreach_sqrt),
  //    so the largest param group sets the size; fused has none.
  //  for-loop Adam (transformers' old AdamW, adamw_hf): one tensor's sqrt at a time.
  //  Adafactor (per tensor): grad**2 + eps and the approximated second moment, two full-size fp32 tensors.
  auto local = [&](const ParamTensor& t) { return sp_.fsdp ? sp_.local(t) : t; };
  const int64_t state_b = sp_.fsdp && sp_.mixed ? pr_.master_bytes : -1;  // FSDP: states in the fp32 shard's dtype
  const bool adam_like = opt.kind == OptimizerKind::Adam;
  if (opt.kind == OptimizerKind::Adam8bitTorchao) {
    // torchao's step runs single_param_adam one parameter at a time: exp_avg_f32 = exp_avg.float().lerp(grad_f32),
    // exp_avg_sq_f32 likewise, both read again by the block-wise requantization (scale_tensor's amax per block, then
    // quantize_8bit_with_qmap) and by the update, so two fp32 copies of the largest quantized tensor are alive at
    // once. Inductor may fuse some of them away; the size is the graph's, not verified against a trace.
    int64_t largest = 0;
    for_each_param(ctx_, [&](const ParamTensor& t) {
      const int64_t n = local(t).numel;
      if (!t.frozen && n >= kTorchaoMinNumel && n % kTorchaoBlock == 0) largest = std::max(largest, n);
    });
    if (largest == 0) return;
    const uint32_t m = p_.alloc(Component::Temporaries, mul(largest, 4), L_.opt_tmp);
    const uint32_t v = p_.alloc(Component::Temporaries, mul(largest, 4), L_.opt_tmp);
    drop(v), drop(m);
    return;
  }
  if (rs_.optimizer_impl == OptimizerImpl::Fused && opt.kind != OptimizerKind::Adafactor) return;
  if (opt.kind == OptimizerKind::Adafactor || (adam_like && rs_.optimizer_impl == OptimizerImpl::ForLoop)) {
    int64_t largest = 0;
    for_each_param(ctx_, [&](const ParamTensor& t) {
      if (!t.frozen) largest = std::max(largest, local(t).numel);
    });
    const int64_t copies = opt.kind == OptimizerKind::Adafactor ? 2 : 1;
    const int64_t bytes = opt.kind == OptimizerKind::Adafactor ? 4 : state_b > 0 ? state_b : pr_.state_bytes;
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
      const int64_t b = state_b > 0 && t.kind != ParamKind::Adapter ? state_b : state_dtype_of(t);
      if (in_group && !t.frozen) tmp.push_back(p_.alloc(Component::Temporaries, mul(local(t).numel, b), L_.opt_tmp));
    });
    // Before torch 2.1, denom = torch._foreach_add(exp_avg_sq_sqrt, eps) made a second list of the same sizes while
    // the first stayed referenced (Resolved::foreach_keeps_denom; pytorch#104898).
    std::vector<uint32_t> denom;
    if (rs_.foreach_keeps_denom)
      for (uint32_t t : tmp) denom.push_back(p_.alloc(Component::Temporaries, p_.tensors[t].bytes, L_.opt_tmp));
    // The lists go with the step's frame, exp_avg_sq_sqrt before denom (the frame clears its locals in order);
    // CPython's list_dealloc releases a list's items from the last to the first (Objects/listobject.c), as the
    // recorded allocator traces show.
    for (auto it = tmp.rbegin(); it != tmp.rend(); ++it) drop(*it);
    for (auto it = denom.rbegin(); it != denom.rend(); ++it) drop(*it);
  }
}

void StepBuilder::prologue() {
  // About 70 events per layer and micro-batch, 8 per parameter tensor: reserve once instead of regrowing.
  const int64_t passes = 1 + std::min<int64_t>(c_.training.gradient_accumulation_steps, 2 * c_.parallel.pipeline_parallel_size + 1);
  const int64_t layers = std::min(ctx_.end_layer, s_.num_layers) - ctx_.first_layer;
  const size_t events = static_cast<size_t>(passes * (layers + 2) * 70 +
                                            8 * (std::max(s_.layer.size(), s_.moe_layer.size()) * s_.num_layers + s_.pre.size() + s_.post.size()));
  p_.events.reserve(events);
  p_.tensors.reserve(events / 2 + 16);
  alloc_weights();
  // PyTorch DDP: a flat bucket copy of every gradient, allocated when the model is wrapped and kept for the run
  // (reducer.cpp Reducer::initialize_buckets: bucket.gradients = at::empty(...), from the constructor, and again
  // of the same size when rebuild_buckets reorders them after the first iteration); zero_grad frees only .grad.
  if (!sp_.grad_buffer && n_ > 1 && c_.parallel.zero_stage == 0) {
    int64_t grad_total = 0;
    for_each_param(ctx_, [&](const ParamTensor& t) { grad_total = add(grad_total, grad_bytes_of(t)); });
    p_.alloc(Component::Communication, grad_total, L_.grad_bucket);
  }
  // transformers 4.38's LlamaModel.__init__ registers a causal_mask buffer of max_position_embeddings^2 booleans
  // (register_buffer(..., persistent=False)), moved to the GPU with the model (docs/versions.md 6b).
  if (rs_.mask.build == MaskBuild::MaxPositions) {
    mask_labels();
    p_.alloc(Component::Weights, mul(c_.model.max_position_embeddings, c_.model.max_position_embeddings), LM_.buffer);
  }
  unsloth_weight_buffer();
  unsloth_gc_buffers(false);
  p_.alloc(Component::Overhead, cublas_workspace_bytes(ctx_.gpu), L_.ws);
  p_.alloc(Component::Overhead, kCublasLtWorkspaceBytes, L_.ws_lt);
}

// One optimizer step: its micro-batches (mbs of the step's gas), the optimizer step and zero_grad.
void StepBuilder::step(int iter, int64_t mbs, int64_t gas) {
  bucket_views_ = iter >= 2 && c_.parallel.ddp_gradient_as_bucket_view && n_ > 1 && c_.parallel.zero_stage == 0 &&
                  !sp_.grad_buffer;
  // step() starts by clearing the receive buffers' .grad (clear_runtime_states); the micro-batches this replay
  // leaves out left theirs too, one per stage that receives activations.
  for (uint32_t g : input_grads_) drop(g);
  input_grads_.clear();
  run_schedule(iter, mbs, gas);
  int64_t receiving = 0;
  for (const auto& [layer, g] : recv_made_) receiving += g ? 0 : 1;
  for (int64_t k = 0; k < receiving * (gas - mbs); ++k)
    input_grads_.push_back(p_.alloc(Component::Communication, mul(d_.e_res, d_.Tn, d_.h), L_.p2p, -1));
  optimizer_step(iter);
  // zero_grad(set_to_none=True), the default since torch 2.0, frees the gradients after the step; torch 1.x
  // zeroed them in place (Optimizer.zero_grad / Module.zero_grad set_to_none=False), so they stay allocated.
  p_.phase("zero_grad " + std::to_string(iter));
  if (!rs_.zero_grad_set_to_none) return;
  for (size_t slot = 0; slot < grads_.size(); ++slot) {
    for (uint32_t g : grads_[slot]) drop(g);
    grads_[slot].clear();
    grad_created_[slot] = false;
  }
  for (uint32_t g : other_grads_) drop(g);
  other_grads_.clear();
  for (uint32_t g : sharded_grads_) drop(g);
  sharded_grads_.clear();
  sharded_grad_made_.assign(sharded_grad_made_.size(), false);
  grads_live_ = false;
}

StepProgram StepBuilder::build() {
  prologue();
  const int64_t gas = c_.training.gradient_accumulation_steps;
  for (int iter = 1; iter <= 2; ++iter) {
    // Step 1 differs from the steady state only in lacking optimizer state until its step, so it is replayed
    // with one micro-batch. In step 2 every micro-batch after the first starts from the same live tensors
    // (gradients included) and makes the same requests, so the second stands for all the others; a pipeline
    // stage needs (stages - stage) micro-batches in flight before its pattern repeats, so it replays one more
    // than the stages.
    // Interleaving reaches its steady state after 2 x stages micro-batches.
    const int64_t pp = c_.parallel.pipeline_parallel_size;
    const int64_t repeat_after = c_.parallel.schedule() == PipelineSchedule::Interleaved1F1B && pp > 1 ? 2 * pp : pp + 1;
    step(iter, iter == 1 ? 1 : std::min<int64_t>(gas, repeat_after), gas);
  }
  return std::move(p_);
}

void StepBuilder::begin_run(const RunPlan& plan) {
  run_shapes_ = &plan.micro_batches;
  next_shape_ = 0;
  p_.recycle_ids = true;
  prologue();
}

// Shapes vary, so no micro-batch stands for another: every step replays all of its micro-batches.
void StepBuilder::run_step(int64_t k, int64_t gas) { step(static_cast<int>(k), gas, gas); }

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
