// What each parameter costs to keep: the shard plan (ZeRO, FSDP1/2, Megatron's distributed optimizer), each
// tensor's weight, gradient and optimizer-state bytes, and the persistent model-state totals per device and in
// host memory. Split from train_step.cpp (code moved, not changed).
#include <algorithm>
#include <string>

#include "architecture.h"
#include "checked.h"
#include "step_builder.h"
#include "train_step.h"

namespace memsim {

int64_t shard_group_size(const Config& c) {
  // Megatron's distributed optimizer and torchtitan's FSDP mesh both shard over the data- and context-parallel
  // ranks together (parallel_state.get_data_parallel_group(with_context_parallel=True); dp_shard_cp).
  const int64_t dp = c.parallel.shard_group_size > 0 ? c.parallel.shard_group_size : c.parallel.data_parallel_size;
  return mul(dp, c.parallel.context_parallel_size);
}

bool one_rank_fsdp2(const Config& c, Sharding sharding) {
  if (sharding != Sharding::Fsdp2 || shard_group_size(c) != 1) return false;
  const FrameworkSpec* f = find_framework(c.training.framework);
  return f != nullptr && f->fsdp_on_one_gpu;
}

int64_t sharding_stage(const Config& c, Sharding sharding) {
  const auto& par = c.parallel;
  // DeepSpeed runs ZeRO on one GPU too; that only changes memory where parameters live on the host and are
  // fetched module by module (ZeRO-Infinity), so a single GPU counts as unsharded otherwise.
  const bool one_gpu_offload = sharding == Sharding::DeepSpeed && par.params_offload() != Offload::None && par.zero_stage == 3;
  // A framework that applies fully_shard on one GPU too (FrameworkSpec::fsdp_on_one_gpu) shards over a one-rank mesh:
  // a single GPU, or a shard group of one (parallel.shard_group_size 1: HSDP that only replicates).
  return shard_group_size(c) > 1 || one_gpu_offload || one_rank_fsdp2(c, sharding) ? par.zero_stage : 0;
}

bool shards_weights(const Config& c, Sharding sharding) {
  const int64_t z = sharding_stage(c, sharding);
  const bool fsdp = (sharding == Sharding::Fsdp1 || sharding == Sharding::Fsdp2) && z >= 2;
  return z >= 3 || fsdp;  // FSDP keeps only shards at rest, even SHARD_GRAD_OP
}

bool is_expert_param(const ParamTensor& t) { return t.name.rfind("mlp.experts.", 0) == 0; }

int64_t one_linear_numel(const ParamTensor& t, bool mlp_gated) {
  if (!is_expert_param(t) || t.rows <= 0) return t.numel;
  const int64_t one = t.numel / t.rows;
  return mlp_gated && t.name.ends_with("gate_up_proj") ? one / 2 : one;
}

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
  sp.dtypes = {rs.adapter_bytes(), rs.kbit_cast, rs.model_load.trl_bf16};
  sp.expert_shard = rs.framework->fsdp2_expert_shard;
  sp.n = shard_group_size(ctx.config);
  sp.ep = par.expert_parallel_size;
  const int64_t z = sharding_stage(ctx.config, sp.sharding);
  sp.fsdp = (sp.sharding == Sharding::Fsdp1 || sp.sharding == Sharding::Fsdp2) && z >= 2;
  sp.flat_optimizer = (sp.sharding == Sharding::DeepSpeed || sp.sharding == Sharding::Megatron) && z >= 1;
  sp.shard_grads = z >= 2;
  sp.shard_weights = shards_weights(ctx.config, sp.sharding);
  sp.grad_buffer = sp.sharding == Sharding::Megatron;
  sp.mixed = ctx.precision.master_bytes > 0;
  sp.offload_optimizer = par.optimizer_offload() != Offload::None;
  sp.offload_params = par.params_offload() != Offload::None;
  return sp;
}

bool fsdp1_unit_gradients(const Config& c) {
  const Resolved rs = resolve(c);
  const TriState orig = c.parallel.use_orig_params();
  return rs.sharding == Sharding::Fsdp1 && c.parallel.zero_stage >= 2 && shard_group_size(c) > 1 &&
         (orig == TriState::True || (orig == TriState::Auto && rs.framework->fsdp_use_orig_params));
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
  const ParamDtypes& ab = sp.dtypes;
  const int64_t w = param_storage_bytes(t, pr, peft, ab), g = param_grad_bytes(t, pr, ab);
  const bool plain = t.kind != ParamKind::Adapter && !t.quantized;  // a weight in the recipe's dtype
  if (sp.fsdp) {
    const ParamTensor l = sp.local(t);
    s.weights = param_storage_bytes(l, pr, peft, ab);
    if (sp.mixed && plain) s.weights = std::max(s.weights, mul(l.numel, pr.master_bytes));
    s.grads = !has_grad(t) ? 0 : sp.mixed && plain ? mul(l.numel, pr.master_bytes) : param_grad_bytes(l, pr, ab);
    PrecisionRecipe no_master = pr;
    no_master.master_bytes = 0;
    if (sp.mixed) no_master.state_bytes = pr.master_bytes;
    s.optimizer = param_optimizer_bytes(l, no_master, ab, ctx.optimizer, true);
    return s;
  }
  s.weights = sp.shard_weights && t.numel > zero_persistence_threshold(ctx.config.parallel) ? ceil_div(w, k) : w;
  if (sp.grad_buffer && t.kind == ParamKind::Adapter) s.grads = g;  // adapters keep their own dtype
  else if (sp.grad_buffer) s.grads = t.frozen ? 0 : mul(t.numel, std::max(pr.grad_bytes, sp.mixed ? int64_t{4} : pr.grad_bytes));
  else s.grads = sp.shard_grads ? ceil_div(g, k) : g;
  if (sp.flat_optimizer) s.flat_numel = t.frozen ? 0 : ceil_div(t.numel, k);
  else s.optimizer = param_optimizer_bytes(t, pr, ab, ctx.optimizer, true);
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
    const OptimizerDtypes d = optimizer_dtypes(t, ctx.precision, sp.dtypes);
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
  // Frozen models beside the policy: a reference copy, a reward model, a program's frozen encoders.
  m.other_models_bytes = add(add(reference_copy_bytes(ctx), reward_model_bytes(ctx)), frozen_modules_bytes(ctx));
  m.other_models_bytes = add(m.other_models_bytes, ema_copy_bytes(ctx));
  // PPO's value model trains beside the policy (ppo_step.cpp): its weights, gradients and optimizer states, sharded
  // by the same layout, count with the policy's.
  if (ctx.config.training.ppo()) {
    const Config v = value_model_config(ctx.config);
    const ModelShape shape = value_model_shape(v);
    const ModelStates vm = model_state_bytes(value_model_context(v, shape, ctx));
    m.weights_bytes = add(m.weights_bytes, vm.weights_bytes);
    m.gradients_bytes = add(m.gradients_bytes, vm.gradients_bytes);
    m.optimizer_bytes = add(m.optimizer_bytes, vm.optimizer_bytes);
  }
  return m;
}

// diffusers training_utils.py EMAModel: shadow_params = [p.clone().detach() for p in parameters] of a UNet loaded in
// fp32 (train_text_to_image.py: ema_unet = UNet2DConditionModel.from_pretrained(...), then ema_unet.to(device)).
int64_t ema_copy_bytes(const StepContext& ctx) {
  const EmaMode ema = ctx.config.training.ema_mode();
  if (ema != EmaMode::Gpu && ema != EmaMode::GpuForeach) return 0;
  int64_t numel = 0;
  for_each_param(ctx, [&](const ParamTensor& t) {
    if (!t.frozen) numel = add(numel, t.numel);
  });
  return mul(4, numel);
}

int64_t frozen_modules_bytes(const StepContext& ctx) {
  if (!ctx.shape.program) return 0;
  int64_t bytes = 0;
  for (const auto& f : ctx.shape.program->frozen_modules)
    bytes = add(bytes, mul(f.bytes_per_param(ctx.precision.activation_bytes, ctx.precision.weight_bytes), f.params));
  return bytes;
}

// What offload moves off the GPU, per GPU (MEMORY_FORMULAS.md 2.2): ZeRO-Offload the fp32 master, the states and
// the fp32 gradient partition; ZeRO-Infinity also the 16-bit parameter partition; FSDP's CPUOffload the sharded
// parameters and gradients, with the optimizer stepping on the CPU.
HostStates host_state_bytes(const StepContext& ctx) {
  const ShardPlan sp = shard_plan(ctx);
  HostStates h;
  if (!sp.offload_optimizer && !sp.offload_params) return h;  // (most layouts: no walk over every parameter)
  PerTensor<ParamStates> states(ctx.shape);
  const ModelStates m = raw_model_states(ctx, sp, states);
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

// A GPTQ or AWQ 4-bit linear's buffers (docs/research/gptq-awq-lora.md 1), with G = ceil(in / group_size) groups
// (one for group_size -1): qweight packs eight 4-bit values per int32 (in x out / 2 bytes), qzeros the groups' zeros
// the same way (G x out / 2), scales are fp16 (2 G out). auto-gptq's QuantLinear (v0.4.2-v0.7.1, every kernel class)
// also registers g_idx, one int32 per input feature; AutoAWQ's WQLinear_GEMM has none. optimum before 1.20 gave
// every GPTQ linear an fp16 bias, which a Llama-style model does not have: not counted (2 x out bytes).
static int64_t packed_int4_bytes(const ParamTensor& t, const PeftConfig& peft) {
  const int64_t out = std::max<int64_t>(t.rows, 1), in = t.numel / out;
  const int64_t groups = peft.quant_group_size > 0 ? ceil_div(in, peft.quant_group_size) : 1;
  int64_t bytes = add(add(ceil_div(t.numel, 2), ceil_div(mul(groups, out), 2)), mul(2, groups, out));
  if (peft.quantization() == BaseQuantization::Gptq) bytes = add(bytes, mul(4, in));
  return bytes;
}

// Bytes of each stored parameter: its dtype, or bitsandbytes' packed storage for a quantized frozen weight
// (MEMORY_FORMULAS.md 4.2): int8 = 1 B/element + an fp32 scale per output row (Int8Params SCB); NF4/FP4 =
// 4 bits/element + an fp32 absmax per 64-element block, or with double quantization a uint8 absmax per block plus
// an fp32 scale per 256 blocks (QLoRA sec. 3), and the per-tensor fp32 offset and 256-entry code table.
// prepare_model_for_kbit_training casts every other parameter to fp32.
int64_t param_storage_bytes(const ParamTensor& t, const PrecisionRecipe& pr, const PeftConfig& peft, const ParamDtypes& dt) {
  if (t.kind == ParamKind::Adapter) return mul(t.numel, dt.adapter_bytes);
  if (t.quantized && peft.packed_int4()) return packed_int4_bytes(t, peft);
  if (t.quantized && peft.quantization() == BaseQuantization::Int8) return add(t.numel, mul(t.rows, 4));
  if (t.quantized) {
    const int64_t blocks = ceil_div(t.numel, 64);
    const int64_t stats = peft.double_quantization ? add(add(blocks, mul(ceil_div(blocks, 256), 4)), 4 + 1024) : mul(blocks, 4);
    return add(ceil_div(t.numel, 2), stats);
  }
  // TRL's peft_module_casting_to_bf16, by module name (model_load.cpp trl_bf16_targets).
  const TrlBf16Targets& b = dt.trl_bf16;
  if (dt.kbit_cast && ((b.token_embedding && t.name == "embed_tokens.weight") ||
                       (b.position_embedding && t.name == "embed_positions.weight") || (b.head && t.name == "lm_head.weight")))
    return mul(t.numel, 2);
  if (dt.kbit_cast) return mul(t.numel, 4);
  return mul(t.numel, pr.weight_bytes);
}

int64_t param_grad_bytes(const ParamTensor& t, const PrecisionRecipe& pr, const ParamDtypes& dt) {
  if (!has_grad(t)) return 0;
  if (t.kind == ParamKind::Adapter) return mul(t.numel, dt.adapter_bytes);
  if (dt.kbit_cast) return mul(t.numel, 4);
  return mul(t.numel, pr.grad_bytes);
}

// Optimizer state of one trainable tensor: the fp32 master copy where the recipe keeps one for a low-precision
// parameter, and the optimizer's states in the parameter's dtype (torch: zeros_like(p)).
OptimizerDtypes optimizer_dtypes(const ParamTensor& t, const PrecisionRecipe& pr, const ParamDtypes& dt) {
  OptimizerDtypes d{pr.state_bytes, pr.master_bytes};
  if (t.kind == ParamKind::Adapter || dt.kbit_cast) {
    d.state_bytes = t.kind == ParamKind::Adapter ? dt.adapter_bytes : 4;
    d.master_bytes = d.state_bytes == 4 ? 0 : d.master_bytes;
  }
  return d;
}

int64_t param_optimizer_bytes(const ParamTensor& t, const PrecisionRecipe& pr, const ParamDtypes& dt,
                              const OptimizerSpec& opt, bool include_paged) {
  if (t.frozen) return 0;
  const OptimizerDtypes d = optimizer_dtypes(t, pr, dt);
  int64_t bytes = mul(t.numel, d.master_bytes);
  if (include_paged || !(opt.paged && t.numel >= kPagedMinNumel)) bytes = add(bytes, optimizer_state_bytes(opt, t.numel, t.rows, d.state_bytes));
  return bytes;
}

}  // namespace memsim
