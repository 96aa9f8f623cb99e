// The optimizer: its states, created lazily at the first step, and the step itself (per parameter, foreach or
// fused, flat partitions, 8-bit and paged states), including the optimizer run inside backward. Split from
// train_step.cpp (code moved, not changed).
#include <algorithm>
#include <string>

#include "checked.h"
#include "step_builder.h"

namespace memsim {

// Optimizer in backward (torchtune optimizer_in_bwd): each parameter is stepped in a post-accumulate-grad
// hook as soon as its gradient is complete, and the gradient is freed at once (set_to_none), so the full
// gradient set never exists. State is created lazily at the first such step.
void StepBuilder::step_in_backward(int64_t layer) {
  if (!cfg_.training.optimizer_in_backward) return;
  const size_t slot = static_cast<size_t>(layer + 1);
  const bool tied = tied_weight() != nullptr;
  if (!states_created_[slot]) {
    states_created_[slot] = true;
    const std::vector<ParamTensor>& ts = layer < 0 ? shape_.pre : layer >= shape_.num_layers ? shape_.post : shape_.params_of(layer);
    for (const auto& t : ts) create_state(t);
  }
  // A tied matrix's gradient is complete only after the embedding's backward; it is stepped there.
  std::vector<uint32_t> keep;
  if (layer >= shape_.num_layers && tied && !grads_[slot].empty()) keep.push_back(grads_[slot].back()), grads_[slot].pop_back();
  for (uint32_t g : grads_[slot]) drop(g);
  grads_[slot] = keep;
  if (layer < 0 && tied) {
    const size_t post = static_cast<size_t>(shape_.num_layers + 1);
    for (uint32_t g : grads_[post]) drop(g);
    grads_[post].clear();
  }
}

void StepBuilder::create_state(const ParamTensor& t) {
  int64_t bytes = param_optimizer_bytes(t, recipe_, shard_plan_.dtypes, ctx_.optimizer, false);
  if (shard_plan_.fsdp) bytes = ctx_.optimizer.paged && shard_plan_.local(t).numel >= kPagedMinNumel ? 0 : states_of(t).optimizer;
  if (bytes <= 0) return;
  // Each state is its own tensor (adam.py _init_group: exp_avg and exp_avg_sq, each zeros_like(p); bitsandbytes
  // state1/state2 with their absmax), so the allocator sees k blocks, not one of k times the size.
  const int64_t k = optimizer_full_states(ctx_.optimizer);
  const int64_t parts = k > 1 && bytes % k == 0 ? k : 1;
  for (int64_t i = 0; i < parts; ++i) program_.alloc(Component::OptimizerStates, bytes / parts, labels_.state);
}

// diffusers training_utils.py EMAModel.step (under no_grad), after each optimizer step: per parameter
// s_param.sub_(one_minus_decay * (s_param - param)), two fp32 temporaries of that parameter's size; with foreach,
// torch._foreach_sub(s, p) first makes an fp32 list as large as the whole copy. --offload_ema keeps the copy in
// pinned host memory and moves it to the GPU for the update (ema_unet.to(device), then back: the whole copy
// transiently on the GPU).
void StepBuilder::ema_update(int iter) {
  const EmaMode ema = cfg_.training.ema_mode();
  if (ema == EmaMode::None) return;
  program_.phase("EMA update " + std::to_string(iter));
  if (ema_label_ == UINT32_MAX) ema_label_ = program_.label("EMA copy of the trainable weights (fp32)");
  std::vector<uint32_t> moved;
  int64_t largest = 0;
  for_each_param(ctx_, [&](const ParamTensor& t) {
    if (t.frozen) return;
    largest = std::max(largest, t.numel);
    if (ema == EmaMode::Cpu) moved.push_back(program_.alloc(Component::OtherModels, mul(4, t.numel), ema_label_));
  });
  if (ema == EmaMode::GpuForeach) {
    std::vector<uint32_t> diff;
    for_each_param(ctx_, [&](const ParamTensor& t) {
      if (!t.frozen) diff.push_back(program_.alloc(Component::Temporaries, mul(4, t.numel), labels_.opt_tmp));
    });
    for (auto it = diff.rbegin(); it != diff.rend(); ++it) drop(*it);
  } else if (largest > 0) {
    const uint32_t d = program_.alloc(Component::Temporaries, mul(4, largest), labels_.opt_tmp);
    const uint32_t scaled = program_.alloc(Component::Temporaries, mul(4, largest), labels_.opt_tmp);
    drop(scaled), drop(d);
  }
  for (uint32_t t : moved) drop(t);
}

void StepBuilder::optimizer_step(int iter) {
  program_.phase("optimizer step " + std::to_string(iter));
  if (cfg_.training.optimizer_in_backward) return;  // stepped during backward
  if (shard_plan_.offload_optimizer) return;  // ZeRO-Offload / FSDP CPUOffload: the step runs on the host (CPU Adam)
  const auto& opt = ctx_.optimizer;
  // Optimizer state is created lazily in the first step() (torch/optim/adam.py::_init_group: zeros_like).
  // Paged bitsandbytes state (tensors >= 1e5 elements) lives in unified memory, outside the allocator.
  if (iter == 1) {
    if (shard_opt_) {
      // DeepSpeed keeps one flat fp32 partition of the trainable parameters (stage_1_and_2.py
      // single_partition_of_fp32_groups) and the optimizer's states beside it; so does Megatron's distributed
      // optimizer (distrib_optimizer.py: main params and states of the rank's shard of the grad buffer).
      const int64_t part = flat_partition_numel();
      if (recipe_.master_bytes > 0) program_.alloc(Component::OptimizerStates, mul(part, recipe_.master_bytes), labels_.master);
      if (!(opt.paged && part >= kPagedMinNumel)) {
        const int64_t st = optimizer_state_bytes(opt, part, part, recipe_.state_bytes);
        if (st > 0) program_.alloc(Component::OptimizerStates, st, labels_.state);
      }
    } else {
      for_each_param(ctx_, [&](const ParamTensor& t) { create_state(t); });
    }
  }
  if (shard_opt_ && shard_plan_.sharding == Sharding::DeepSpeed) {
    // DeepSpeed steps one group at a time: ZeRO-1/2 each parameter group's flat fp32 partition (stage_1_and_2.py
    // step; the whole partition is taken, as the Trainer's decay group holds nearly all of it), ZeRO-3 each
    // sub-group of at most sub_group_size (1e9, DeepSpeedZeroConfig's default) elements of it (stage3.py step). With 16-bit
    // gradients the group's gradient is upcast to fp32 first (single_grad_partition = flatten(...).to(fp32);
    // _prepare_fp32_grad_for_sub_group), freed after the group's update (_release_sub_group).
    const int64_t group = shard_weights_ ? std::min<int64_t>(flat_partition_numel(), 1000000000) : flat_partition_numel();
    const uint32_t grad32 = recipe_.grad_bytes < 4 ? program_.alloc(Component::Temporaries, mul(group, 4), labels_.opt_tmp) : UINT32_MAX;
    // The update is DeepSpeed's FusedAdam when its config names an optimizer (the framework "deepspeed"); without one
    // it is the client optimizer the HF Trainer passes to deepspeed.initialize (adamw_torch: zero_allow_untested_
    // optimizer), whose step() DeepSpeed calls with the group's one flat fp32 tensor as its only parameter
    // (_optimizer_step: param_groups[i]['params'] = [fp32_partition]). A foreach or for-loop torch AdamW then makes
    // exp_avg_sq.sqrt() of that whole tensor (and, before torch 2.1 under foreach, a second list for denom).
    const bool client_torch_adam = opt.kind == OptimizerKind::Adam && !opt.paged && resolved_.optimizer_impl != OptimizerImpl::Fused;
    if (client_torch_adam) {
      const uint32_t sqrt = program_.alloc(Component::Temporaries, mul(group, 4), labels_.opt_tmp);
      const bool denom_kept = resolved_.foreach_keeps_denom && resolved_.optimizer_impl == OptimizerImpl::Foreach;
      const uint32_t denom = denom_kept ? program_.alloc(Component::Temporaries, mul(group, 4), labels_.opt_tmp) : UINT32_MAX;
      drop(sqrt);
      if (denom != UINT32_MAX) drop(denom);
    }
    if (grad32 != UINT32_MAX) drop(grad32);
  }
  if (shard_opt_) return;  // Megatron's TE/Apex FusedAdam (and DeepSpeed's steps above): no temporaries here
  // Temporaries of torch's implementations (MEMORY_FORMULAS.md 6), on each rank's shards under FSDP:
  //  foreach Adam/AdamW: exp_avg_sq.sqrt() for every tensor of one param group at once (_foreach_sqrt),
  //    so the largest param group sets the size; fused has none.
  //  for-loop Adam (transformers' old AdamW, adamw_hf): one tensor's sqrt at a time.
  //  Adafactor (per tensor): grad**2 + eps and the approximated second moment, two full-size fp32 tensors.
  auto local = [&](const ParamTensor& t) { return shard_plan_.fsdp ? shard_plan_.local(t) : t; };
  const int64_t state_b = shard_plan_.fsdp && shard_plan_.mixed ? recipe_.master_bytes : -1;  // FSDP: states in the fp32 shard's dtype
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
    const uint32_t m = program_.alloc(Component::Temporaries, mul(largest, 4), labels_.opt_tmp);
    const uint32_t v = program_.alloc(Component::Temporaries, mul(largest, 4), labels_.opt_tmp);
    drop(v), drop(m);
    return;
  }
  if (resolved_.optimizer_impl == OptimizerImpl::Fused && opt.kind != OptimizerKind::Adafactor) return;
  if (opt.kind == OptimizerKind::Adafactor || (adam_like && resolved_.optimizer_impl == OptimizerImpl::ForLoop)) {
    int64_t largest = 0;
    for_each_param(ctx_, [&](const ParamTensor& t) {
      if (!t.frozen) largest = std::max(largest, local(t).numel);
    });
    const int64_t copies = opt.kind == OptimizerKind::Adafactor ? 2 : 1;
    const int64_t bytes = opt.kind == OptimizerKind::Adafactor ? 4 : state_b > 0 ? state_b : recipe_.state_bytes;
    std::vector<uint32_t> tmp;
    for (int64_t k = 0; k < copies; ++k) tmp.push_back(program_.alloc(Component::Temporaries, mul(largest, bytes), labels_.opt_tmp));
    for (uint32_t t : tmp) drop(t);
    return;
  }
  if (!adam_like || opt.paged) return;  // SGD, Lion and bitsandbytes kernels: no full-size temporaries
  for (int64_t group = 0; group < resolved_.param_groups; ++group) {
    std::vector<uint32_t> tmp;
    for_each_param(ctx_, [&](const ParamTensor& t) {
      const bool in_group = resolved_.param_groups == 1 || (group == 0) == decays(t);
      const int64_t b = state_b > 0 && t.kind != ParamKind::Adapter ? state_b : state_dtype_of(t);
      if (in_group && !t.frozen) tmp.push_back(program_.alloc(Component::Temporaries, mul(local(t).numel, b), labels_.opt_tmp));
    });
    // Before torch 2.1, denom = torch._foreach_add(exp_avg_sq_sqrt, eps) made a second list of the same sizes while
    // the first stayed referenced (Resolved::foreach_keeps_denom; pytorch#104898).
    std::vector<uint32_t> denom;
    if (resolved_.foreach_keeps_denom)
      for (uint32_t t : tmp) denom.push_back(program_.alloc(Component::Temporaries, program_.tensors[t].bytes, labels_.opt_tmp));
    // The lists go with the step's frame, exp_avg_sq_sqrt before denom (the frame clears its locals in order);
    // CPython's list_dealloc releases a list's items from the last to the first (Objects/listobject.c), as the
    // recorded allocator traces show.
    for (auto it = tmp.rbegin(); it != tmp.rend(); ++it) drop(*it);
    for (auto it = denom.rbegin(); it != denom.rend(); ++it) drop(*it);
  }
}

}  // namespace memsim
