// Builds the allocation/free program of a training step on one device from a validated config.
#pragma once
#include <cstdint>
#include <memory>
#include <utility>

#include "config.h"
#include "data_shape.h"
#include "frameworks.h"
#include "model.h"
#include "result.h"
#include "step.h"
#include "tables.h"

namespace memsim {

struct StepContext {
  const Config& config;
  const ModelShape& shape;
  const PrecisionRecipe& precision;
  const OptimizerSpec& optimizer;
  const GpuSpec* gpu;  // null for a custom GPU
  // The device's share of the model: pipeline stage `stage` holds layers [first_layer, end_layer), the
  // embeddings if has_pre and the final norm, head and loss if has_post. Defaults: the whole model.
  int64_t stage = 0;
  int64_t first_layer = 0;
  int64_t end_layer = INT64_MAX;
  bool has_pre = true;
  bool has_post = true;
};

// PPO's value model (ppo_step.cpp; its config is rollout.h value_model_config): its parameter tensors, and its context
// on the policy's device (the same precision, optimizer and GPU; its embeddings and every layer, no head).
ModelShape value_model_shape(const Config& value);
StepContext value_model_context(const Config& value, const ModelShape& shape, const StepContext& policy);

// The dtypes of the parameters that the precision recipe does not decide, resolved once (frameworks.h Resolved).
struct ParamDtypes {
  int64_t adapter_bytes = 4;     // the resolved peft.adapter_dtype's element size
  bool kbit_cast = false;        // prepare_model_for_kbit_training made every non-quantized parameter fp32
  TrlBf16Targets trl_bf16;       // ... and TRL cast these back to bf16 (ModelLoad::trl_bf16)
};

// How the data-parallel ranks share the model states (ParallelConfig::zero_stage, resolved sharding engine).
struct ShardPlan {
  Sharding sharding = Sharding::DeepSpeed;
  int64_t n = 1;              // ranks a shard group spans (data x context parallel, or the HSDP shard group)
  int64_t ep = 1;             // expert parallel: expert weights shard over n / ep ranks
  bool fsdp = false;          // FSDP1/FSDP2 sharding parameters (SHARD_GRAD_OP or FULL_SHARD)
  bool flat_optimizer = false;  // DeepSpeed / Megatron: one flat fp32 partition of master + states
  bool shard_grads = false, shard_weights = false;
  bool grad_buffer = false;   // Megatron: fp32 main grads in a contiguous buffer allocated with the model
  bool mixed = false;         // the recipe keeps fp32 master weights
  bool offload_optimizer = false, offload_params = false;
  ParamDtypes dtypes;
  FrameworkSpec::ExpertShard expert_shard = FrameworkSpec::ExpertShard::PerExpertLinear;  // FSDP2's expert dim
  int64_t ranks_of(const ParamTensor& t) const;
  ParamTensor local(const ParamTensor& t) const;  // one rank's shard of an FSDP parameter
};
struct ParamStates {
  int64_t weights = 0, grads = 0, optimizer = 0;
  int64_t flat_numel = 0;  // this parameter's share of a flat optimizer partition
};
struct HostStates {       // per GPU: what offload keeps in host RAM or on NVMe
  int64_t host_bytes = 0;
  int64_t nvme_bytes = 0;
};

ShardPlan shard_plan(const StepContext& ctx);
// FSDP1 with use_orig_params shards the model (stage 2 or 3 on more than one rank): a unit mixing frozen and
// trainable tensors keeps gradients for all of them (model.h mark_unit_gradients).
bool fsdp1_unit_gradients(const Config& c);
int64_t shard_group_size(const Config& c);
// The ZeRO / FSDP stage in effect (0 on one GPU, but for ZeRO-Infinity), and whether it shards the weights at rest.
int64_t sharding_stage(const Config& c, Sharding sharding);
// FSDP2 over a shard group of one GPU, where the framework applies fully_shard anyway (FrameworkSpec::fsdp_on_one_gpu).
bool one_rank_fsdp2(const Config& c, Sharding sharding);
bool shards_weights(const Config& c, Sharding sharding);
int64_t zero_persistence_threshold(const ParallelConfig& p);
// Interleaved pipelines split the layers into `chunks` model chunks, a remainder one layer each to the first
// chunks: [first, end) of chunk m.
std::pair<int64_t, int64_t> interleaved_chunk(int64_t layers, int64_t chunks, int64_t m);
ParamStates param_states(const ShardPlan& sp, const StepContext& ctx, const ParamTensor& t);

// Persistent model-state bytes per device, before allocator rounding (ZeRO paper sec. 5, Table 1).
ModelStates model_state_bytes(const StepContext& ctx);
HostStates host_state_bytes(const StepContext& ctx);
// A preference objective's frozen reference copy on this device (preference_step.cpp), 0 without one; part of
// model_state_bytes' weights.
int64_t reference_copy_bytes(const StepContext& ctx);
// A frozen model of the policy's architecture on this device (preference_step.cpp), whole or sharded as the policy's
// parameters are; a classifier leaves lm_head out.
int64_t frozen_model_bytes(const StepContext& ctx, bool sharded, bool without_lm_head);
// training.ema's fp32 shadow copy of the trainable weights on this device (0: none, or in host memory).
int64_t ema_copy_bytes(const StepContext& ctx);
// A model program's frozen modules (architecture.h FrozenModule: diffusers' VAE and text encoder) on this device, in
// the compute dtype (the scripts' weight_dtype); 0 without a program or any.
int64_t frozen_modules_bytes(const StepContext& ctx);
// GRPO's reward model (training.reward_model same_as_policy) on this device (rollout_step.cpp), 0 without one.
int64_t reward_model_bytes(const StepContext& ctx);
// GRPO's colocated vLLM engine on this device (rollout_step.cpp): what it claims (gpu_memory_utilization x the GPU's
// memory) and what its weights take of it; 0 and 0 without one.
struct EngineBytes {
  bool active = false;
  int64_t total = 0, weights = 0;
  int64_t trainer_at_start = 0;  // vLLM 0.8.0-0.9.0: the trainer's bytes that count against the engine's share
};
EngineBytes engine_bytes(const StepContext& ctx);

// Two iterations, so that the lazily created optimizer state (first step) and the steady state (second
// step, where the forward already carries that state) are both replayed.
StepProgram build_train_step(const StepContext& ctx);

class StepBuilder;

// A run of varying shapes (data_shape.h), built one optimizer step at a time: plan.steps steps, each of plan.gas
// micro-batches with the plan's shapes. After next_step(), program() holds the events not yet consumed (the first
// step's begin with the weights); the caller replays them and clears the events and phases, and the next step
// appends. Tensor ids are recycled from step to step (StepProgram::recycle_ids), so the table stays as small as
// one step's. `plan` must outlive the builder.
class RunBuilder {
 public:
  RunBuilder(const StepContext& ctx, const RunPlan& plan);
  ~RunBuilder();
  bool next_step();  // false once every step is built
  StepProgram& program();
  int64_t steps_built() const { return built_; }

 private:
  std::unique_ptr<StepBuilder> builder_;
  const RunPlan& plan_;
  int64_t built_ = 0;
};

}  // namespace memsim
