// Model states through the step: the weights at load, the gradients each backward makes, and what the sharding
// engines do with them per layer: the hosts of DDP's and ZeRO's gradient buffers (dp_gradients.cpp), of DeepSpeed
// ZeRO-3's fetches (zero3_prefetch.cpp), of FSDP's all-gathers and reshards (fsdp_unshard.cpp) and of FSDP's
// reduce-scatters (fsdp_reduce.cpp), and the pipeline's receive buffers.
#include <algorithm>
#include <string>

#include "architecture.h"
#include "checked.h"
#include "step_builder.h"

namespace memsim {

// What FsdpUnshard asks of the step: a unit's all-gathered bytes, and the buffers on the step's program.
class StepBuilder::FsdpHost final : public FsdpUnshard::Host {
 public:
  explicit FsdpHost(StepBuilder& b) : builder_(b) {}
  int64_t unsharded_bytes(int64_t slot) const override { return builder_.gathered_bytes(slot); }
  uint32_t alloc(int64_t bytes, bool all_gather_buffer, int64_t slot, Stream stream) override {
    const uint32_t label = all_gather_buffer ? builder_.labels_.ag_buffer : builder_.labels_.gathered;
    return builder_.program_.alloc(Component::Communication, bytes, label, static_cast<int32_t>(slot), stream);
  }
  void release(uint32_t tensor) override { builder_.drop(tensor); }

 private:
  StepBuilder& builder_;
};

// What DataParallelGradients asks of the step: the device's gradients whole and partitioned, and its buffers.
class StepBuilder::DpGradientsHost final : public DataParallelGradients::Host {
 public:
  explicit DpGradientsHost(StepBuilder& b) : builder_(b) {}
  int64_t whole_gradient_bytes() const override {
    int64_t bytes = 0;
    for_each_param(builder_.ctx_, [&](const ParamTensor& t) { bytes = add(bytes, builder_.grad_bytes_of(t)); });
    return bytes;
  }
  int64_t partition_bytes() const override {
    int64_t bytes = 0;
    for_each_param(builder_.ctx_, [&](const ParamTensor& t) { bytes = add(bytes, builder_.states_of(t).grads); });
    return bytes;
  }
  uint32_t alloc(DataParallelGradients::Buffer buffer, int64_t bytes) override {
    if (buffer == DataParallelGradients::Buffer::Partition)
      return builder_.program_.alloc(Component::Gradients, bytes, builder_.labels_.grad_partition);
    return builder_.program_.alloc(Component::Communication, bytes, builder_.labels_.grad_bucket);
  }
  void release(uint32_t tensor) override { builder_.drop(tensor); }

 private:
  StepBuilder& builder_;
};

// What FsdpReduce asks of the step: a slot's gradients, and its buffers on the step's program.
class StepBuilder::FsdpReduceHost final : public FsdpReduce::Host {
 public:
  explicit FsdpReduceHost(StepBuilder& b) : builder_(b) {}
  Gradients slot_gradients(int64_t slot, bool tied_head) const override {
    const StepBuilder& b = builder_;
    const ModelShape& shape = b.shape_;
    Gradients g;
    for (const auto& t : slot < 0 ? shape.pre : slot >= shape.num_layers ? shape.post : shape.params_of(slot))
      if (has_grad(t)) g.numel = add(g.numel, t.numel), g.shard_bytes = add(g.shard_bytes, b.states_of(t).grads);
    if (tied_head && slot >= shape.num_layers && b.cfg_.model.tie_word_embeddings && has_grad(shape.pre.front()))
      g.numel = add(g.numel, shape.pre.front().numel), g.shard_bytes = add(g.shard_bytes, b.states_of(shape.pre.front()).grads);
    return g;
  }
  uint32_t alloc(FsdpReduce::Buffer buffer, int64_t bytes, int64_t slot) override {
    const auto& l = builder_.labels_;
    const int32_t layer = static_cast<int32_t>(slot);
    switch (buffer) {
      case FsdpReduce::Buffer::ReduceInput: return builder_.program_.alloc(Component::Communication, bytes, l.rs_input, layer);
      case FsdpReduce::Buffer::ReduceOutput:
        return builder_.program_.alloc(Component::Communication, bytes, l.rs_output, layer, Stream::ReduceScatter);
      case FsdpReduce::Buffer::GradShard:
        return builder_.program_.alloc(Component::Gradients, bytes, l.grad_shard, layer, Stream::ReduceScatter);
      case FsdpReduce::Buffer::Accumulated: return builder_.program_.alloc(Component::Gradients, bytes, l.grad_accum, layer);
    }
    return UINT32_MAX;
  }
  void release(uint32_t tensor) override { builder_.drop(tensor); }
  void release_slot_grads(int64_t slot) override {
    const size_t i = static_cast<size_t>(slot + 1);
    for (uint32_t g : builder_.grads_[i]) builder_.drop(g);
    builder_.grads_[i].clear();
    builder_.grad_created_[i] = false;
  }

 private:
  StepBuilder& builder_;
};

// DeepSpeed's defaults where a config leaves 0 (deepspeed/runtime/zero/config.py DeepSpeedZeroConfig).
int64_t StepBuilder::zero_reduce_bucket() const {
  return cfg_.parallel.zero_reduce_bucket_size > 0 ? cfg_.parallel.zero_reduce_bucket_size : 500000000;
}
int64_t StepBuilder::zero_persistence() const {
  return zero_persistence_threshold(cfg_.parallel);
}
bool StepBuilder::zero_overlap() const {  // the validator overlap_comm_valid: None means stage == 3
  const TriState set = cfg_.parallel.overlap_comm();
  return set == TriState::Auto ? cfg_.parallel.zero_stage == 3 : set == TriState::True;
}
// ZeRO-3 keeps parameters up to stage3_param_persistence_threshold whole on every rank, never released
// (partition_parameters.py _convert_to_deepspeed_param and parameter_offload.py mark_persistent_parameters:
// param.ds_numel <= param_persistence_threshold).
bool StepBuilder::persistent(const ParamTensor& t) const { return t.numel <= zero_persistence(); }

// nn.Module init: one allocation per parameter tensor. Under ZeRO-3 each rank keeps only its partition of
// every parameter (DeepSpeed partition_parameters.py: param.ds_tensor).
void StepBuilder::alloc_weights() {
  program_.phase("model load");
  // Offloaded parameter shards live in host memory (ZeRO-Infinity, FSDP CPUOffload); small persistent ones stay.
  const int64_t threshold = zero_persistence();
  if (resolved_.model_load.ordered && !shard_weights_ && !shard_plan_.offload_params) alloc_loaded_weights();
  else
    for_each_param(ctx_, [&](const ParamTensor& t) {
      if (shard_plan_.offload_params && (shard_plan_.fsdp || t.numel > threshold)) return;
      program_.alloc(Component::Weights, states_of(t).weights, labels_.weights);
    });
  alloc_reference_weights();  // a preference objective's frozen copy (preference_step.cpp)
  // training.ema's fp32 shadow copy on the GPU, a tensor per trainable parameter (EMAModel.shadow_params).
  if (ema_copy_bytes(ctx_) > 0) {
    if (ema_label_ == UINT32_MAX) ema_label_ = program_.label("EMA copy of the trainable weights (fp32)");
    for_each_param(ctx_, [&](const ParamTensor& t) {
      if (!t.frozen) program_.alloc(Component::OtherModels, mul(4, t.numel), ema_label_);
    });
  }
  // A model program's frozen modules (diffusers' VAE and text encoder, in weight_dtype), one tensor each.
  if (shape_.program)
    for (const auto& f : shape_.program->frozen_modules)
      program_.alloc(Component::OtherModels, mul(f.bytes_per_param(recipe_.activation_bytes, recipe_.weight_bytes), f.params), program_.label(f.name + " weights (frozen, beside the model)"));
  alloc_engine();             // GRPO's colocated vLLM engine (rollout_step.cpp)
  // Transformer Engine's fp8 copies of every linear weight and its transpose, module buffers kept across steps
  // (linear.py: weight_fp8, weight_t_fp8). The transformer layers only: the output layer is not a TE module.
  if (recipe_.fp8_weight_copy_bytes > 0) {
    int64_t numel = 0;
    for (int64_t l = ctx_.first_layer; l < std::min(ctx_.end_layer, shape_.num_layers); ++l)
      numel = add(numel, matmul_numel(shape_.params_of(l)));
    if (numel > 0) program_.alloc(Component::Weights, mul(numel, recipe_.fp8_weight_copy_bytes), labels_.fp8_weights);
  }
  // Megatron allocates the fp32 main-gradient buffer with the model (distributed/param_and_grad_buffer.py
  // _ParamAndGradBuffer: grad_data = torch.zeros(numel, dtype=grad_dtype)); zero_grad only zeroes it.
  if (shard_plan_.grad_buffer) {
    int64_t bytes = 0;
    for_each_param(ctx_, [&](const ParamTensor& t) { bytes = add(bytes, states_of(t).grads); });
    if (bytes > 0) program_.alloc(Component::Gradients, bytes, labels_.main_grads);
  }
  DpGradientsHost host(*this);
  dp_grads_.with_optimizer(host);  // ZeRO-3's ipg bucket
}

// AccumulateGrad creates each .grad at its parameter's first backward of the step (MEMORY_FORMULAS.md 6). The
// step's first also makes ZeRO's partition and, at the run's first, ZeRO-1/2's ipg buffers (dp_gradients.cpp); DDP
// (several GPUs, no ZeRO) keeps a flat bucket copy of all gradients besides (gradient_as_bucket_view=False is the
// default, MEMORY_FORMULAS.md 2.7).
void StepBuilder::alloc_layer_grads(int64_t layer) {
  if (shard_plan_.grad_buffer) return;  // Megatron: backward writes into main_grad (gradient_accumulation_fusion)
  if (!dp_grads_.gradients_live()) {
    DpGradientsHost host(*this);
    dp_grads_.gradients_begin(host);
  }
  const size_t slot = static_cast<size_t>(layer + 1);  // 0 = embeddings, L + 1 = final norm and head
  if (grad_created_[slot]) {  // gradient accumulation: the .grad tensors are already there
    if (layer >= shape_.num_layers && tied_sum())  // ... but a tied matrix's gradient waits in the engine (tied_sum)
      tied_pending_ = program_.alloc(Component::Gradients, grad_bytes_of(*tied_weight()), labels_.tied_pending);
    return;
  }
  grad_created_[slot] = true;
  const std::vector<ParamTensor>& ts = layer < 0 ? shape_.pre : layer >= shape_.num_layers ? shape_.post : shape_.params_of(layer);
  // DDP with gradient_as_bucket_view: from the second iteration the .grad tensors are views into the buckets
  // (torch/nn/parallel/distributed.py docstring: "gradients will be views after first iteration").
  if (dp_grads_.bucket_views()) return;
  for (const auto& t : ts) {
    if (layer < 0 && &t == &shape_.pre.front() && cfg_.model.tie_word_embeddings) continue;  // created by lm_head
    if (!has_grad(t)) continue;
    grads_[slot].push_back(program_.alloc(Component::Gradients, grad_bytes_of(t), labels_.grads, static_cast<int32_t>(layer)));
  }
  // Tied weights: lm_head is the embedding matrix, so its .grad appears in the loss backward.
  if (layer >= shape_.num_layers && cfg_.model.tie_word_embeddings && has_grad(shape_.pre.front()))
    grads_[slot].push_back(program_.alloc(Component::Gradients, grad_bytes_of(shape_.pre.front()), labels_.grads));
}

// A layer's backward is done: ZeRO-2/3 reduce its full gradients into the partition and free them; FSDP
// reduce-scatters them into the unit's gradient shard, or accumulates them under no_sync (fsdp_reduce.cpp says how,
// with its sources). This decides which, and when the root unit's head reduces.
void StepBuilder::release_layer_grads(int64_t layer) {
  if (!shard_grads_ || shard_plan_.grad_buffer) return;
  // ... and so do the micro-batches before the last under no_sync gradient accumulation (FsdpReduce, pipeline
  // stages under FSDP included), unless the .grad tensors themselves accumulate in the reduce dtype.
  if (fsdp_unshard_.no_sync() || (fsdp_reduce_.accumulate_no_sync() && !last_backward_)) {
    const size_t slot = static_cast<size_t>(layer + 1);
    const int64_t reduce_bytes = shard_plan_.mixed ? recipe_.master_bytes : recipe_.grad_bytes;
    if (grads_[slot].empty() || reduce_bytes == recipe_.grad_bytes) return;  // .grad itself accumulates
    FsdpReduceHost host(*this);
    fsdp_reduce_.accumulate(host, layer, reduce_bytes);
    return;
  }
  // FSDP's root unit holds the embeddings with the final norm and head, so the head's gradients wait for the
  // embedding's backward and are reduced with it.
  if (shard_plan_.fsdp && layer >= shape_.num_layers && ctx_.has_pre) return;
  if (shard_plan_.fsdp && layer < 0 && ctx_.has_post) reduce_slot(shape_.num_layers);
  reduce_slot(layer);
}

void StepBuilder::release_grad_shards() {
  DpGradientsHost dp_host(*this);
  dp_grads_.zero_grad(dp_host);
  FsdpReduceHost host(*this);
  fsdp_reduce_.release_shards(host);
}

// DDP's bucket, when the model is wrapped (dp_gradients.cpp); PPO's value model calls it on its own builder.
void StepBuilder::alloc_grad_bucket() {
  DpGradientsHost host(*this);
  dp_grads_.with_model(host);
}

void StepBuilder::reduce_slot(int64_t layer) {
  const size_t slot = static_cast<size_t>(layer + 1);
  if (shard_plan_.fsdp && (!grads_[slot].empty() || fsdp_reduce_.accumulated(layer))) {
    FsdpReduceHost host(*this);
    fsdp_reduce_.reduce(host, layer, shard_plan_.mixed ? recipe_.master_bytes : recipe_.grad_bytes,
                        shard_plan_.offload_optimizer);
    return;
  }
  for (uint32_t g : grads_[slot]) drop(g);
  grads_[slot].clear();
  grad_created_[slot] = false;  // the next micro-batch makes new full gradients and reduces them again
}

// torch.distributed.pipelining: every micro-batch's receive buffer (activations into a stage after the first,
// gradients into a stage before the last) is allocated on the first step and kept; one set per stage (model chunk).
void StepBuilder::recv_buffers(int64_t stage_layer, bool grads) {
  for (const auto& [layer, g] : pipeline_.recv_made)
    if (layer == stage_layer && g == grads) return;
  pipeline_.recv_made.push_back({stage_layer, grads});
  const int64_t bytes = mul(dims_.e_res, dims_.Tn, dims_.h);
  for (int64_t k = 0; k < cfg_.training.gradient_accumulation_steps; ++k)
    program_.alloc(Component::Communication, bytes, labels_.recv_buffer, static_cast<int32_t>(stage_layer));
}

void StepBuilder::release_all_gather() {
  FsdpHost host(*this);
  fsdp_unshard_.release_all_gather(host);
}

void StepBuilder::end_backward() {
  in_backward_ = false;
  ds_release_window();
  zero3_.trace_recorded();  // DeepSpeed's coordinator has the module trace after the first forward and backward
  if (fsdp_unshard_.no_sync() && !last_backward_) return;  // parameters stay unsharded, gradients keep accumulating
  if (fsdp_unshard_.no_sync())  // the last micro-batch: every group reduces in turn (run_post_backward)
    for (int64_t l = shape_.num_layers; l >= -1; --l) reduce_slot(l);
  if (!shard_plan_.fsdp) return;  // only FSDP's engines hold anything past the backward
  FsdpReduceHost reduce_host(*this);
  fsdp_reduce_.end_backward(reduce_host);  // FSDP2's last reduce-scatter input
  FsdpHost host(*this);
  fsdp_unshard_.release_kept(host);  // anything still unsharded (a stage without its backward) is freed
}

int64_t StepBuilder::gathered_bytes(int64_t l) const {
  if (l < -1 || l > shape_.num_layers) return 0;
  // The same for every layer of a kind (dense or MoE), so each kind is summed once.
  const int kind = l < 0 ? 0 : l >= shape_.num_layers ? 1 : shape_.is_moe(l) ? 3 : 2;
  if (gathered_cache_[kind] >= 0) return gathered_cache_[kind];
  const std::vector<ParamTensor>& ts = l < 0 ? shape_.pre : l >= shape_.num_layers ? shape_.post : shape_.params_of(l);
  int64_t bytes = 0;
  // FSDP1 all-gathers a unit's FlatParameter, padded as a whole to a multiple of its ranks (flat_param.py
  // _init_flat_param_and_metadata / FlatParamHandle._get_shard: numel_to_pad = world_size * chunk - numel): the
  // unit's bytes per shard group (expert weights have their own under EP) are summed first, then padded. Padding
  // each tensor instead would add a rank's worth per tensor, and grow with the ranks where FSDP1's does not.
  std::vector<std::pair<int64_t, int64_t>> fsdp1_groups;  // (ranks, bytes)
  for (const auto& t : ts) {
    if (shard_plan_.fsdp && shard_plan_.sharding == Sharding::Fsdp1) {
      const int64_t k = shard_plan_.ranks_of(t), b = param_storage_bytes(t, recipe_, cfg_.peft, shard_plan_.dtypes);
      auto g = std::find_if(fsdp1_groups.begin(), fsdp1_groups.end(), [&](const auto& x) { return x.first == k; });
      if (g == fsdp1_groups.end()) fsdp1_groups.push_back({k, b});
      else g->second = add(g->second, b);
      continue;
    }
    // torchao's float8 all-gather sends linear weights as fp8 (1 byte per element); the output layer stays
    // 16-bit (torchtitan's float8 filter_fqns excludes "output").
    if (shard_plan_.fsdp && recipe_.fp8_allgather && t.kind == ParamKind::Matmul && !t.quantized && l >= 0 && l < shape_.num_layers)
      bytes = add(bytes, mul(shard_plan_.ranks_of(t), shard_plan_.local(t).numel));
    else if (shard_plan_.fsdp) bytes = add(bytes, mul(shard_plan_.ranks_of(t), param_storage_bytes(shard_plan_.local(t), recipe_, cfg_.peft, shard_plan_.dtypes)));
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
  // One GPU: only offloaded parameters move, except under FSDP over a one-rank mesh (one_rank_fsdp2), which still
  // unshards every unit into a 16-bit copy.
  if (!shard_weights_ || (shard_ranks_ == 1 && !shard_plan_.offload_params && !shard_plan_.fsdp)) return;
  if (shard_plan_.fsdp) {
    // Parameters stay unsharded from forward to backward under SHARD_GRAD_OP / reshard_after_forward=False, and
    // always for the root unit (embeddings, final norm and head): FSDP1 _post_forward_reshard skips the root,
    // FSDP2 sets the root's reshard_after_forward to False.
    // parallel.fsdp_shard_embeddings (torchtune's custom_sharded_layers): the embedding and the output layer are
    // units of their own, resharded after forward like a block (the final norm, a few KiB, is taken with the head).
    const bool root = (layer < 0 || layer >= shape_.num_layers) && !embedding_units();
    const bool last_kept = resolved_.framework->fsdp_last_block_kept && shard_plan_.sharding == Sharding::Fsdp2 &&
                           cfg_.parallel.pipeline_parallel_size == 1 && layer == shape_.num_layers - 1;
    FsdpUnshard::Call call;
    call.backward = in_backward_;
    call.keep = root || cfg_.parallel.zero_stage == 2 || fsdp_unshard_.no_sync() || last_kept;
    // Prefetch (fsdp_unshard.cpp): FULL_SHARD only, and not while no_sync keeps everything unsharded.
    // FSDP1 prefetches in backward only a unit that registered pre-backward hooks in its forward
    // (_get_handle_to_prefetch skips a handle without _needs_pre_backward_unshard); a layer whose forward ran under
    // reentrant checkpointing ran without grad, where _register_pre_backward_hooks returns at once, so backward
    // prefetch never reaches it: it is all-gathered when its recomputation starts. A checkpoint inside the unit
    // (fsdp_checkpoint_in_units) leaves the unit's own forward with grad, hooks registered. A layer below
    // first_grad_layer_ (LLaMA-Adapter's frozen layers) ran without grad too, and has no backward at all.
    const bool next_unhooked = shard_plan_.sharding == Sharding::Fsdp1 && layer >= 1 && layer - 1 < shape_.num_layers &&
                               ((resolved_.checkpoint_reentrant && !cfg_.parallel.fsdp_checkpoint_in_units &&
                                 checkpointed(layer - 1)) ||
                                layer - 1 < first_grad_layer_);
    if (cfg_.parallel.zero_stage == 3 && !fsdp_unshard_.no_sync())
      call.prefetch_depth = !in_backward_ ? cfg_.parallel.fsdp_forward_prefetch
                            : shard_plan_.sharding == Sharding::Fsdp2 ? cfg_.parallel.fsdp2_backward_prefetch
                            : cfg_.parallel.backward_prefetch() == BackwardPrefetch::Pre && !next_unhooked ? 1 : 0;
    call.first_layer = ctx_.first_layer;
    call.end_layer = std::min(ctx_.end_layer, shape_.num_layers);
    FsdpHost host(*this);
    fsdp_unshard_.unshard(host, layer, call, out);
    return;
  }
  ds_fetch(layer, out);
}

// DeepSpeed ZeRO-3's fetches (zero3_prefetch.cpp). The buffers are allocated on the all-gather stream when
// overlap_comm is on (the stage-3 default: __all_gather_params_ runs under `with stream(self.__allgather_stream)`,
// and free_param record_stream()s the buffer), so released parameters are cached in that stream's pool. The
// embedding is not fetched in backward here (its output takes no gradient under PEFT, and its dense gradient needs
// no weight).
class StepBuilder::Zero3Host final : public Zero3Prefetch::Host {
 public:
  Zero3Host(StepBuilder& b, Stream stream, uint32_t label = UINT32_MAX)
      : builder_(b), stream_(stream), label_(label == UINT32_MAX ? b.labels_.gathered : label) {}
  const std::vector<ParamTensor>& params(int64_t l) const override {
    const ModelShape& shape = builder_.shape_;
    return l < 0 ? shape.pre : l >= shape.num_layers ? shape.post : shape.params_of(l);
  }
  bool persistent(const ParamTensor& t) const override { return builder_.persistent(t); }
  uint32_t gather(const ParamTensor& t, int64_t l) override {
    return builder_.program_.alloc(Component::Communication, builder_.weight_bytes_of(t), label_,
                                   static_cast<int32_t>(l), stream_);
  }
  void release(uint32_t buffer) override { builder_.drop(buffer); }

 private:
  StepBuilder& builder_;
  Stream stream_;
  uint32_t label_;
};

// stage3_max_live_parameters, DeepSpeed's default 1e9 elements (runtime/zero/config.py max_live_parameters).
int64_t StepBuilder::zero_max_live() const {
  return cfg_.parallel.zero_max_live_parameters > 0 ? cfg_.parallel.zero_max_live_parameters : 1000000000;
}

void StepBuilder::ds_fetch(int64_t layer, std::vector<uint32_t>& out) {
  Zero3Host host(*this, zero_overlap() ? Stream::AllGather : Stream::Compute);
  const Zero3Prefetch::Trace trace{ctx_.first_layer, ctx_.end_layer, shape_.num_layers, ctx_.has_post, false, first_grad_layer_};
  zero3_.fetch(host, layer, in_backward_, zero_max_live(), trace, out);
}

void StepBuilder::ds_release_window() {
  Zero3Host host(*this, Stream::Compute);  // releasing allocates nothing: the stream is not read
  zero3_.release_window(host);
}

// docs/research/zero3-reference.md section 2: TRL's prepare_deepspeed makes the frozen reference copy a DeepSpeed
// engine of its own (deepspeed.initialize with no optimizer: a DeepSpeedZeRoOffload), whose coordinator records the
// reference's forward and prefetches along it from its second forward on (reset_step at every forward, so the trace
// is that forward alone), up to the same stage3_max_live_parameters: the reference's window is max_live elements, not
// one layer, beside whatever the policy's engine keeps gathered.
void StepBuilder::reference_ds_fetch(int64_t unit, uint32_t label, std::vector<uint32_t>& out) {
  Zero3Host host(*this, zero_overlap() ? Stream::AllGather : Stream::Compute, label);
  const Zero3Prefetch::Trace trace{0, shape_.num_layers, shape_.num_layers, true, true, 0};
  reference_zero3_.fetch(host, unit, false, zero_max_live(), trace, out);
}

void StepBuilder::reference_ds_pass_done() {
  Zero3Host host(*this, Stream::Compute);
  reference_zero3_.release_window(host);  // _clean_inflight_param_registry at the next forward: nothing is left
  reference_zero3_.trace_recorded();      // its first forward recorded the trace
}

// FSDP: a layer's kept parameters are resharded once its backward is done.
void StepBuilder::reshard_after_backward(int64_t layer) {
  if (!shard_plan_.fsdp) return;
  FsdpHost host(*this);
  fsdp_unshard_.reshard_after_backward(host, layer);
}

}  // namespace memsim
