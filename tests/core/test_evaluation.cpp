// An evaluation between training steps (training.eval_batch_size, eval_step.cpp): a no-grad forward of the eval
// batch with the loss, and the HF Trainer's logits kept for compute_metrics (training.eval_logits_batches).
#include <catch2/catch.hpp>

#include "core/simulate.h"
#include "test_util.h"

using namespace memsim;

namespace {
// Llama-3-8B, LoRA, pure bf16, one GPU: training at micro-batch 1 under full checkpointing.
Config lora_config() {
  Config c = single_gpu_config("llama-3-8b.json", 1, 1024);
  c.peft.method = "lora";
  c.training.activation_checkpointing = "full";
  return c;
}

int64_t eval_peak(const Config& c) {
  const Result r = simulate(c);
  REQUIRE(r.ok);
  return peak_live_in_phase(r.devices[0].program, "evaluation (after step 1)", Component::Temporaries);
}
}  // namespace

TEST_CASE("an evaluation batch's peak is its loss over the whole batch's logits", "[evaluation]") {
  // transformers >= 4.49 under no_grad: the final norm's output [T, h] (the outputs hold it), the bf16 logits, the
  // loss's fp32 upcast and its fp32 log-softmax, [T, V] each, at once; nothing is saved for backward.
  Config c = lora_config();
  c.training.eval_batch_size = 8;
  const int64_t T = 8 * 1024, h = 4096, V = 128256;
  CHECK(eval_peak(c) == 2 * T * h + (2 + 4 + 4) * T * V);
  // It sets the run's peak: training at micro-batch 1 checkpointed needs far less.
  const Result r = simulate(c);
  CHECK(r.devices[0].peak_phase.rfind("evaluation (after step 1)", 0) == 0);
  Config none = lora_config();
  const Result t = simulate(none);
  REQUIRE(t.ok);
  CHECK(t.devices[0].peak.allocated_bytes < r.devices[0].peak.allocated_bytes);
  // The training steps themselves do not change.
  CHECK(t.devices[0].program.phases.size() + 1 == r.devices[0].program.phases.size());
  // Liger's fused loss skips the logits only in training mode (lce_forward: skip_logits = self.training and labels
  // is not None): the evaluation makes them and takes transformers' loss.
  c.training.loss = "fused_linear";
  CHECK(eval_peak(c) == 2 * T * h + (2 + 4 + 4) * T * V);
}

TEST_CASE("compute_metrics keeps every eval batch's gathered logits on the GPU", "[evaluation]") {
  // Two data-parallel GPUs, three batches kept: before the last batch's concatenation the earlier two batches'
  // gathered logits (2 x 2 x X), the batch's own X, the gather across ranks (2 X) and the concatenation (3 x 2 X)
  // are alive together: 13 X, X = the bf16 logits of one eval batch.
  Config c = lora_config();
  c.parallel.data_parallel_size = 2;
  c.training.eval_batch_size = 4;
  c.training.eval_logits_batches = 3;
  const int64_t X = 2 * int64_t{4} * 1024 * 128256;
  CHECK(eval_peak(c) == 13 * X);
}

TEST_CASE("evaluation settings memsim does not model are refused with the field", "[evaluation][bad-input]") {
  Config c = lora_config();
  c.training.eval_logits_batches = 2;  // no evaluation to keep them
  Result r = simulate(c);
  REQUIRE(!r.ok);
  CHECK(r.errors[0].field == "training.eval_logits_batches");
  c.training.eval_batch_size = 8;
  CHECK(simulate(c).ok);
  c.training.framework = "torchtune";  // not the HF Trainer's evaluation loop
  r = simulate(c);
  REQUIRE(!r.ok);
  CHECK(r.errors[0].field == "training.eval_logits_batches");
  c = lora_config();
  c.training.eval_batch_size = 8;
  c.parallel.pipeline_parallel_size = 2;
  c.parallel.data_parallel_size = 1;
  r = simulate(c);
  REQUIRE(!r.ok);
  bool named = false;
  for (const auto& e : r.errors) named |= e.field == "training.eval_batch_size";
  CHECK(named);
  c = lora_config();
  c.training.eval_batch_size = int64_t{1} << 21;  // beyond the registry's range
  r = simulate(c);
  REQUIRE(!r.ok);
  CHECK(r.errors[0].field == "training.eval_batch_size");
}
