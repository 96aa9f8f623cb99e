#include "train_step.h"

#include <algorithm>
#include <string>

#include "checked.h"

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

struct Layout {
  int64_t n;            // data-parallel degree
  bool shard_optimizer; // ZeRO >= 1
  bool shard_grads;     // ZeRO >= 2
  bool shard_weights;   // ZeRO == 3
};

Layout layout_of(const Config& c) {
  const int64_t s = c.parallel.zero_stage;
  return {c.parallel.data_parallel_size, s >= 1, s >= 2, s >= 3};
}

// Every parameter tensor of the model, in forward order, with the index of its layer (-1 pre, L post).
template <typename F>
void for_each_param(const ModelShape& s, F&& f) {
  for (const auto& t : s.pre) f(t, int64_t{-1});
  for (int64_t l = 0; l < s.num_layers; ++l)
    for (const auto& t : s.layer) f(t, l);
  for (const auto& t : s.post) f(t, s.num_layers);
}

}  // namespace

ModelStates model_state_bytes(const StepContext& ctx) {
  const Layout lay = layout_of(ctx.config);
  const int64_t p = ctx.shape.params_total;
  const auto& pr = ctx.precision;
  const int64_t opt_per_param = add(pr.master_bytes, mul(ctx.optimizer.states_per_param, pr.state_bytes));
  ModelStates m;
  m.weights_bytes = mul(lay.shard_weights ? shard(p, lay.n) : p, pr.weight_bytes);
  m.gradients_bytes = mul(lay.shard_grads ? shard(p, lay.n) : p, pr.grad_bytes);
  m.optimizer_bytes = mul(lay.shard_optimizer ? shard(p, lay.n) : p, opt_per_param);
  return m;
}

StepProgram build_train_step(const StepContext& ctx) {
  const Config& c = ctx.config;
  const ModelShape& s = ctx.shape;
  const auto& pr = ctx.precision;
  const auto& opt = ctx.optimizer;
  const Layout lay = layout_of(c);
  StepProgram prog;

  // Weights: one allocation per parameter tensor (nn.Module init); under ZeRO-3 each rank keeps only its
  // partition of every parameter (DeepSpeed partition_parameters.py: param.ds_tensor).
  prog.phase("model load");
  const uint32_t lbl_w = prog.label("weights");
  for_each_param(s, [&](const ParamTensor& t, int64_t) {
    const int64_t numel = lay.shard_weights ? shard(t.numel, lay.n) : t.numel;
    prog.alloc(Component::Weights, mul(numel, pr.weight_bytes), lbl_w);
  });

  const uint32_t lbl_ws = prog.label("cuBLAS workspace");
  const uint32_t lbl_lt = prog.label("cuBLASLt workspace");
  const uint32_t lbl_g = prog.label("gradients");
  const uint32_t lbl_cast = prog.label("autocast low-precision weight copy");
  const uint32_t lbl_master = prog.label("fp32 master weights");
  const uint32_t lbl_state = prog.label("optimizer state");
  const uint32_t lbl_tmp = prog.label("optimizer foreach temporary (_foreach_sqrt)");

  std::vector<uint32_t> grads;
  std::vector<uint32_t> casts(static_cast<size_t>(s.num_layers), UINT32_MAX);
  bool states_created = false;
  const int64_t layer_matmul_numel = [&] {
    int64_t n = 0;
    for (const auto& t : s.layer)
      if (t.kind == ParamKind::Matmul) n = add(n, t.numel);
    return n;
  }();

  for (int iter = 1; iter <= 2; ++iter) {
    // Micro-batches after the second start from the same live tensors and replay the same requests, so
    // the allocator reaches a fixed point: the third simulated micro-batch stands for all the remaining ones.
    const int64_t gas = c.training.gradient_accumulation_steps;
    for (int64_t mb = 1; mb <= std::min<int64_t>(gas, 3); ++mb) {
      const std::string mbs = (mb == 3 && gas > 3) ? "3-" + std::to_string(gas) : std::to_string(mb);
      const std::string tag = " (step " + std::to_string(iter) + ", micro-batch " + mbs + ")";
      prog.phase("forward" + tag);
      if (iter == 1 && mb == 1) {
        prog.alloc(Component::Overhead, cublas_workspace_bytes(ctx.gpu), lbl_ws);
        prog.alloc(Component::Overhead, kCublasLtWorkspaceBytes, lbl_lt);
      }
      // torch.autocast caches a low-precision copy of each fp32 matmul weight on first use in the forward;
      // the matmul saves it for backward, so it lives until that layer's backward (MEMORY_FORMULAS.md 1.2).
      for (int64_t l = 0; l < s.num_layers; ++l) {
        if (pr.autocast_copy_bytes > 0)
          casts[l] = prog.alloc(Component::Temporaries, mul(layer_matmul_numel, pr.autocast_copy_bytes), lbl_cast);
      }
      prog.phase("backward" + tag);
      // Gradients appear during the first backward of a step and persist across accumulation.
      if (grads.empty()) {
        if (lay.shard_grads) {
          grads.push_back(prog.alloc(Component::Gradients, mul(shard(s.params_total, lay.n), pr.grad_bytes), lbl_g));
        } else {
          for_each_param(s, [&](const ParamTensor& t, int64_t) {
            grads.push_back(prog.alloc(Component::Gradients, mul(t.numel, pr.grad_bytes), lbl_g));
          });
        }
      }
      for (int64_t l = s.num_layers - 1; l >= 0; --l)
        if (casts[l] != UINT32_MAX) {
          prog.free(casts[l]);
          casts[l] = UINT32_MAX;
        }
    }

    prog.phase("optimizer step " + std::to_string(iter));
    // Optimizer state is created lazily in the first step() (torch/optim/adam.py::_init_group: zeros_like).
    if (!states_created) {
      states_created = true;
      if (lay.shard_optimizer) {
        // DeepSpeed keeps one flat fp32 partition per param group (stage_1_and_2.py
        // single_partition_of_fp32_groups) and its states beside it.
        const int64_t part = shard(s.params_total, lay.n);
        if (pr.master_bytes > 0) prog.alloc(Component::OptimizerStates, mul(part, pr.master_bytes), lbl_master);
        for (int64_t k = 0; k < opt.states_per_param; ++k)
          prog.alloc(Component::OptimizerStates, mul(part, pr.state_bytes), lbl_state);
      } else {
        for_each_param(s, [&](const ParamTensor& t, int64_t) {
          if (pr.master_bytes > 0) prog.alloc(Component::OptimizerStates, mul(t.numel, pr.master_bytes), lbl_master);
          for (int64_t k = 0; k < opt.states_per_param; ++k)
            prog.alloc(Component::OptimizerStates, mul(t.numel, pr.state_bytes), lbl_state);
        });
      }
    }
    // The foreach path builds one full-size list (exp_avg_sq.sqrt()) over the whole param group; the fused
    // kernel and DeepSpeed's FusedAdam (used under ZeRO) have no such temporary.
    if (!c.training.optimizer_fused && !lay.shard_optimizer && opt.foreach_temp_states > 0) {
      std::vector<uint32_t> tmp;
      for_each_param(s, [&](const ParamTensor& t, int64_t) {
        for (int64_t k = 0; k < opt.foreach_temp_states; ++k)
          tmp.push_back(prog.alloc(Component::Temporaries, mul(t.numel, pr.state_bytes), lbl_tmp));
      });
      for (uint32_t t : tmp) prog.free(t);
    }
    // zero_grad(set_to_none=True), the default since torch 2.0: gradients are freed after the step.
    prog.phase("zero_grad " + std::to_string(iter));
    for (uint32_t g : grads) prog.free(g);
    grads.clear();
  }
  return prog;
}

}  // namespace memsim
