// Relations between two setups that differ in one setting, as rapidcheck properties over generated configs. A
// failure is shrunk to a minimal config (rapidcheck shrinks the generator's tape of draws towards 0, that is towards
// the first choice of every list in tests/core/random_config.h) and printed as a link fragment.
//
// The relations hold for what no allocator policy can move: the model states and the bytes the step requests.
// max_memory_allocated counts whole blocks, and a block the caching allocator does not split keeps its remainder
// counted (CUDACachingAllocator.cpp: a large block is split only when more than kSmallSize, 1 MiB, remains), so it
// may fall by up to that remainder when the demand grows; reserved and nvidia-smi follow the cache's history and are
// not ordered at all. Where a relation has a named exception, the property states it and test_exceptions.cpp shows
// the mechanism.
#include <rapidcheck/catch.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "../core/random_config.h"
#include "core/frameworks.h"
#include "core/model.h"
#include "core/serialize.h"
#include "core/simulate.h"
#include "core/tables.h"
#include "core/train_step.h"

using namespace memsim;

namespace {

// The generator's draws, taken from a vector rapidcheck generates and shrinks.
struct Tape {
  using result_type = uint64_t;
  static constexpr uint64_t min() { return 0; }
  static constexpr uint64_t max() { return ~uint64_t(0); }
  const std::vector<uint64_t>& draws;
  size_t next = 0;
  uint64_t operator()() { return next < draws.size() ? draws[next++] : 0; }
};

Config generated_config() {
  const auto draws = *rc::gen::container<std::vector<uint64_t>>(96, rc::gen::inRange<uint64_t>(0, 1u << 16));
  Tape tape{draws};
  return memsim_test::random_config(tape);
}

// The result of a setup the validator accepts; rapidcheck discards the case otherwise.
Result simulated(const Config& c) {
  Result r = simulate(c);
  RC_PRE(r.ok);
  return r;
}

int64_t model_state_bytes(const DeviceResult& d) {
  return d.model_states.weights_bytes + d.model_states.gradients_bytes + d.model_states.optimizer_bytes;
}

// The most the allocated statistic can exceed the requested bytes at the peak: its 512-byte rounding and the
// remainders of unsplit blocks, at most what the smaller setup showed (allocated - requested at its peak).
int64_t block_slack(const DeviceResult& d) { return d.peak.allocated_bytes - d.peak.requested_bytes; }

void same_devices(const Result& a, const Result& b) { RC_PRE(a.devices.size() == b.devices.size()); }

// Optimizers whose bytes per element depend on a tensor's size, so that sharding, which changes the sizes, can raise
// them (test_exceptions.cpp): bitsandbytes' paging (1e5 elements) and 8-bit states (4,096), torchao's 8-bit blocks,
// Adafactor's factoring of matrices but not of a flat partition.
bool states_follow_tensor_size(const std::string& optimizer) {
  const OptimizerSpec& o = *find_optimizer(optimizer);
  return o.paged || o.kind == OptimizerKind::Adam8bit || o.kind == OptimizerKind::Adam8bitTorchao ||
         o.kind == OptimizerKind::Adafactor;
}

// Whether FSDP2 pads some parameter of a validated `c` on dim 0: a shard group that does not divide its rows
// (test_exceptions.cpp shows why that lets more GPUs hold more).
bool fsdp2_pads(const Config& c) {
  const Resolved rs = resolve(c);
  if (rs.sharding != Sharding::Fsdp2) return false;
  ModelShape shape = build_model_shape(c.model);
  apply_peft(shape, c.peft, rs.framework->bnb_via_lightning);
  apply_tensor_parallel(shape, c.model, c.parallel.tensor_parallel_size);
  apply_expert_parallel(shape, c.parallel.expert_parallel_size);
  const StepContext ctx{c, shape, *find_precision(c.training.precision), *find_optimizer(c.training.optimizer),
                        find_gpu(c.hardware.gpu)};
  const ShardPlan sp = shard_plan(ctx);
  bool pads = false;
  auto check = [&](const std::vector<ParamTensor>& ts, int64_t = 1) {
    for (const auto& t : ts) pads = pads || sp.local(t).numel * sp.ranks_of(t) > t.numel;
  };
  check(shape.pre);
  check(shape.post);
  shape.for_each_layer_kind(check);
  return pads;
}

}  // namespace

TEST_CASE("relations between two setups that differ in one setting", "[property][relations]") {
  rc::prop("a larger micro-batch never lowers the requested peak, nor allocated beyond the block slack", [] {
    const Config c = generated_config();
    Config bigger = c;
    bigger.training.micro_batch_size += 1;
    const Result a = simulated(c), b = simulated(bigger);
    same_devices(a, b);
    RC_LOG() << config_to_fragment(c) << "\n";
    for (size_t k = 0; k < a.devices.size(); ++k) {
      RC_ASSERT(b.devices[k].peak.requested_bytes >= a.devices[k].peak.requested_bytes);
      RC_ASSERT(b.devices[k].peak.allocated_bytes + block_slack(a.devices[k]) >= a.devices[k].peak.allocated_bytes);
    }
  });

  rc::prop("a longer sequence never lowers the requested peak", [] {
    const Config c = generated_config();
    Config longer = c;
    longer.training.sequence_length += 16;
    const Result a = simulated(c), b = simulated(longer);
    same_devices(a, b);
    RC_LOG() << config_to_fragment(c) << "\n";
    for (size_t k = 0; k < a.devices.size(); ++k)
      RC_ASSERT(b.devices[k].peak.requested_bytes >= a.devices[k].peak.requested_bytes);
  });


  // Not for an optimizer whose states follow the tensor's size: ZeRO's flat partition is one 1-D tensor, which
  // Adafactor does not factor; torchao's 8-bit AdamW keeps fp32 states for a partition that is not a multiple of its
  // block, bitsandbytes' for one under 4,096 elements (test_exceptions.cpp, all three).
  rc::prop("ZeRO-1 never holds more model states than ZeRO-0 on the same data-parallel group", [] {
    Config c = generated_config();
    RC_PRE(c.parallel.data_parallel_size >= 2 && !states_follow_tensor_size(c.training.optimizer));
    Config z0 = c, z1 = c;
    z0.parallel.zero_stage = 0;
    z1.parallel.zero_stage = 1;
    const Result a = simulated(z0), b = simulated(z1);
    same_devices(a, b);
    RC_LOG() << config_to_fragment(z1) << "\n";
    for (size_t k = 0; k < a.devices.size(); ++k)
      RC_ASSERT(model_state_bytes(b.devices[k]) <= model_state_bytes(a.devices[k]));
  });

  // It failed with every_k checkpointing and activation offload until the top layer went to the host before the
  // head rather than after the loss (schedule.cpp forward_mb; docs/robustness.md).
  // Not for an optimizer whose states follow the tensor's size on a ZeRO flat partition: one more layer can move
  // the partition past a threshold (paged from 1e5 elements, quantized by torchao at a multiple of its block;
  // test_exceptions.cpp).
  rc::prop("one more layer never lowers the requested peak of a single-stage layout", [] {
    Config c = generated_config();
    RC_PRE(c.parallel.pipeline_parallel_size == 1);
    RC_PRE(!states_follow_tensor_size(c.training.optimizer) || c.parallel.zero_stage == 0);
    Config deeper = c;
    deeper.model.num_hidden_layers += 1;
    const Result a = simulated(c), b = simulated(deeper);
    same_devices(a, b);
    RC_LOG() << config_to_fragment(c) << "\n";
    RC_ASSERT(b.devices[0].peak.requested_bytes >= a.devices[0].peak.requested_bytes);
  });

  // Bounded, not strict: reentrant checkpointing holds the recomputed layer's output through that layer's backward
  // (CheckpointFunction.backward), one hidden state "none" does not have at that point; activation offload moves
  // "none"'s saved tensors to the host but not the checkpoints' inputs, so the two are not comparable with it on.
  // Not for DoRA, whose recomputed forward makes weight-sized transients inside backward (test_exceptions.cpp; the
  // counterexamples of seeds 84, 111, 142, 165, 191, 241, 286, 304, 341 and 521 were all DoRA).
  rc::prop("full activation checkpointing requests at most one hidden state more than none (no offload)", [] {
    Config c = generated_config();
    RC_PRE(!c.training.activation_offload && c.peft.method != "dora");
    Config none = c, full = c;
    none.training.activation_checkpointing = "none";
    full.training.activation_checkpointing = "full";
    const Result a = simulated(none), b = simulated(full);
    same_devices(a, b);
    RC_LOG() << config_to_fragment(full) << "\n";
    const int64_t tokens = c.training.sequence_length + virtual_tokens(c.peft);  // prompt tuning's lengthen it
    const int64_t hidden_state_bytes = int64_t{4} * c.training.micro_batch_size * tokens * c.model.hidden_size;
    for (size_t k = 0; k < a.devices.size(); ++k)
      RC_ASSERT(b.devices[k].peak.requested_bytes <= a.devices[k].peak.requested_bytes + hidden_state_bytes);
  });

  // Not the requested peak: LoRA saves activations of its own (the adapter's input and its rank-r product, PEFT
  // lora/layer.py Linear.forward), which outweigh the weight gradients it drops when the model is small and the
  // batch large. Up to the adapters' own weights (at most 4 bytes per element): LoRA keeps the base's weights and
  // adds the adapters', while full fine-tuning's extra gradients and states may be sharded over many ranks (ZeRO-2
  // on 128 ranks: a 128th each) or offloaded (none on the GPU; test_exceptions.cpp). Not under FSDP1 with
  // use_orig_params, where LoRA keeps the base's gradients too (test_exceptions.cpp).
  rc::prop("LoRA on an unquantized base never holds more model states than full fine-tuning", [] {
    Config c = generated_config();
    Config full = c, lora = c;
    full.peft.method = "none";
    lora.peft.method = "lora";
    lora.peft.base_quantization = "none";
    lora.peft.lora_rank = 1 + lora.peft.lora_rank % 8;
    const Result a = simulated(full), b = simulated(lora);
    same_devices(a, b);
    RC_PRE(!fsdp1_unit_gradients(lora));
    RC_LOG() << config_to_fragment(lora) << "\n";
    const int64_t adapter_weight_bytes = 4 * (b.params_total - a.params_total);
    for (size_t k = 0; k < a.devices.size(); ++k)
      RC_ASSERT(model_state_bytes(b.devices[k]) <= model_state_bytes(a.devices[k]) + adapter_weight_bytes);
  });

  // Not where FSDP2 pads a parameter in the wider layout: its dim-0 padding grows with the ranks. An optimizer whose
  // states follow the tensor's size may hold more for smaller shards (a paged partition under 1e5 elements comes onto
  // the GPU, an 8-bit one under 4,096 keeps fp32 states): allowed up to the wider layout's optimizer states
  // (test_exceptions.cpp).
  // It failed under FSDP1 while each tensor was padded on its own rather than the unit's FlatParameter as a whole,
  // and for experts that transformers and torchtitan do not shard on the expert dim (sharding.cpp gathered_bytes,
  // ShardPlan::local; docs/robustness.md).
  rc::prop("ZeRO-3 on twice the GPUs never holds or requests more per GPU", [] {
    Config c = generated_config();
    c.parallel.zero_stage = 3;
    RC_PRE(c.parallel.data_parallel_size >= 2 && c.parallel.data_parallel_size <= 32);
    Config wider = c;
    wider.parallel.data_parallel_size *= 2;
    const Result a = simulated(c), b = simulated(wider);
    same_devices(a, b);
    RC_PRE(!fsdp2_pads(wider));
    RC_LOG() << config_to_fragment(c) << "\n";
    for (size_t k = 0; k < a.devices.size(); ++k) {
      const int64_t size_states = states_follow_tensor_size(c.training.optimizer) ? b.devices[k].model_states.optimizer_bytes : 0;
      RC_ASSERT(model_state_bytes(b.devices[k]) <= model_state_bytes(a.devices[k]) + size_states);
      RC_ASSERT(b.devices[k].peak.requested_bytes <= a.devices[k].peak.requested_bytes + size_states);
    }
  });
}
