// The question section's logic (ui/question.h), without ImGui: the method as users name it, a model picked from the
// catalogue keeping what the user set by hand, and the micro-batch and sequence length that fit.
#include <catch2/catch.hpp>

#include "core/band.h"
#include "core/validate.h"
#include "core/catalog.h"
#include "core/frameworks.h"
#include "core/gpu_count.h"
#include "core/simulate.h"
#include "ui/question.h"

using namespace memsim;
using namespace memsim::ui;

namespace {

bool all_fit(const Config& c) {
  const Result r = simulate(c);
  if (!r.ok) return false;
  for (const auto& d : r.devices)
    if (d.verdict != Verdict::Fits) return false;
  return true;
}

}  // namespace

TEST_CASE("question: Unsloth picked under Details brings what it implies, and a valid setup", "[question]") {
  Config c;  // the page's default: 8 GPUs under ZeRO-3
  set_method(c, Method::Qlora);
  c.training.framework = "unsloth";
  choose_framework(c, "deepspeed");
  CHECK(c.parallel.zero_stage == 0);
  CHECK(c.peft.prepare_kbit == "auto");
  CHECK_FALSE(resolve(c).prepare_kbit);
  CHECK(c.training.activation_checkpointing == "full");
  CHECK(c.training.activation_offload);
  CHECK(c.training.precision == "bf16_autocast");
  CHECK(c.peft.double_quantization);
  CHECK(validate(c).empty());
  CHECK(simulate(c).ok);
  c.training.framework = "hf_trainer";
  choose_framework(c, "unsloth");
  CHECK(!c.training.activation_offload);
  CHECK(c.parallel.zero_stage == 0);  // the rest stays as the user has it
}

TEST_CASE("question: an objective picked brings the trainer and the models it needs, and a valid setup", "[question]") {
  Config c;  // the page's default: 8 GPUs under the framework deepspeed, ZeRO-3
  c.training.objective = "ppo";
  choose_objective(c);
  CHECK(c.training.framework == "hf_trainer");  // TRL's PPOTrainer, on the HF Trainer with the same ZeRO-3
  CHECK(c.parallel.zero_stage == 3);
  CHECK(c.training.reward_model == "same_as_policy");
  CHECK(validate(c).empty());
  c.training.objective = "dpo";
  choose_objective(c);
  CHECK(c.training.reward_model == "none");
  CHECK(validate(c).empty());
  c.training.framework = "torchtune";  // torchtune's DPO recipes stay torchtune's
  choose_objective(c);
  CHECK(c.training.framework == "torchtune");
  c.training.objective = "kto";  // ... but TRL alone runs KTO
  choose_objective(c);
  CHECK(c.training.framework == "hf_trainer");
  c.training.objective = "sft";
  c.training.framework = "deepspeed";
  choose_objective(c);
  CHECK(c.training.framework == "deepspeed");  // supervised: the user's framework stays
  CHECK(validate(c).empty());
}

TEST_CASE("question: QLoRA is one choice: LoRA, an NF4 base, double quantization, every linear", "[question]") {
  Config c;
  REQUIRE(method_of(c.peft) == Method::Full);
  set_method(c, Method::Qlora);
  CHECK(c.peft.method == "lora");
  CHECK(c.peft.base_quantization == "nf4");
  CHECK(c.peft.double_quantization);
  CHECK(c.peft.target_modules == "all-linear");
  CHECK(method_of(c.peft) == Method::Qlora);
  set_method(c, Method::Lora);
  CHECK(c.peft.base_quantization == "none");
  CHECK(c.peft.target_modules == "q_proj,v_proj");
  CHECK(method_of(c.peft) == Method::Lora);
  set_method(c, Method::Full);
  CHECK(method_of(c.peft) == Method::Full);
  CHECK(c.peft.base_quantization == "none");
  c.peft.method = "lora";
  c.peft.base_quantization = "int8";
  CHECK(method_of(c.peft) == Method::Other);  // set under Details; the question names it as it is
}

TEST_CASE("question: a model picked keeps every field set by hand", "[question]") {
  Config c;
  HandSet hand;
  Config edited = c;
  edited.training.micro_batch_size = 2;
  edited.training.sequence_length = 8192;
  edited.training.optimizer = "adamw8bit";
  note_hand_set(hand, c, edited);
  CHECK(hand == HandSet{"training.micro_batch_size", "training.sequence_length", "training.optimizer"});
  const ModelPreset* p = find_model_preset("gpt2-medium");  // 1,024 positions
  REQUIRE(p);
  Config picked = edited;
  choose_model(picked, p->model, hand);
  CHECK(picked.model == p->model);
  CHECK(picked.training.micro_batch_size == 2);
  CHECK(picked.training.sequence_length == 8192);  // set by hand: kept, and validation says what is wrong with it
  CHECK(picked.training.optimizer == "adamw8bit");
  // Not set by hand, the sequence length is within the model's positions.
  Config fresh;
  choose_model(fresh, p->model, {});
  CHECK(fresh.training.sequence_length <= 1024);
}

TEST_CASE("question: picking a model program drops the sequence length the page chose for the last model", "[question]") {
  Config c;
  c.training.sequence_length = 2048;  // as fit_shape may leave it for a decoder
  choose_model(c, find_model_preset("mamba2-130m")->model, {});
  CHECK(c.training.sequence_length == Config{}.training.sequence_length);
  CHECK(validate(c).empty());
  // Set by hand, it stays, and validation names the program's own argument.
  Config hand_set;
  hand_set.training.sequence_length = 2048;
  choose_model(hand_set, find_model_preset("mamba2-130m")->model, HandSet{"training.sequence_length"});
  REQUIRE(!validate(hand_set).empty());
  CHECK(validate(hand_set).front().field == "training.sequence_length");
}

TEST_CASE("question: QLoRA of Llama-3.1-70B on one A100 80GB fits at micro-batch 1 x 2048", "[question]") {
  Config c;  // the page's default: 8 x A100 80GB, ZeRO-3, micro-batch 4 x 4096
  HandSet hand;
  choose_model(c, find_model_preset("llama-3.1-70b")->model, hand);
  set_method(c, Method::Qlora);
  fit_shape(c, hand);
  const TrainingConfig on_8 = c.training;  // the shape that fits on the default 8 GPUs
  CHECK(all_fit(c));
  set_gpu_count(c.parallel, 1);
  REQUIRE_FALSE(c.parallel.gpus);
  fit_shape(c, hand);
  CHECK(c.hardware.gpu == "a100-80gb");
  CHECK(gpu_count(c.parallel) == 1);
  CHECK(all_fit(c));
  // The longest sequence that fits (4096 does not at micro-batch 1), then the largest micro-batch at it.
  CHECK(c.training.sequence_length == 2048);
  CHECK(c.training.micro_batch_size == 1);
  Config longer = c;
  longer.training.sequence_length = 4096;
  CHECK_FALSE(all_fit(longer));
  Config bigger = c;
  bigger.training.micro_batch_size = 2;
  CHECK_FALSE(all_fit(bigger));
  // Back on 8 GPUs, the shape that fits there comes back: the search starts from the defaults, not from 1 x 2048.
  set_gpu_count(c.parallel, 8);
  fit_shape(c, hand);
  CHECK(c.training == on_8);
  CHECK(c.training.micro_batch_size * c.training.sequence_length > 2048);
}

TEST_CASE("question: a micro-batch or sequence set by hand is not resized", "[question]") {
  Config c;
  choose_model(c, find_model_preset("llama-3.1-70b")->model, {});
  set_method(c, Method::Qlora);
  set_gpu_count(c.parallel, 1);
  c.training.micro_batch_size = 2;
  const HandSet hand{"training.micro_batch_size"};
  fit_shape(c, hand);
  CHECK(c.training.micro_batch_size == 2);
  CHECK(c.training.sequence_length < 4096);  // the sequence is still free: shortened until micro-batch 2 fits
  CHECK(all_fit(c));
  const HandSet both{"training.micro_batch_size", "training.sequence_length"};
  c.training.sequence_length = 4096;
  CHECK_FALSE(fit_shape(c, both));
  CHECK(c.training.sequence_length == 4096);
}

TEST_CASE("question: when nothing fits, the defaults stay and the verdict says so", "[question]") {
  Config c;
  choose_model(c, find_model_preset("llama-3.1-405b")->model, {});
  set_gpu_count(c.parallel, 1);
  fit_shape(c, {});
  CHECK(c.training.micro_batch_size == default_micro_batch());
  CHECK(c.training.sequence_length == default_sequence_length(c.model));
  CHECK_FALSE(all_fit(c));
}

TEST_CASE("question: the shape search ignores a vLLM server's GPUs and vLLM's refusal to start, which no shape changes",
          "[question]") {
  Config c;
  choose_model(c, find_model_preset("llama-3.1-8b")->model, {});
  set_method(c, Method::Lora);
  c.training.framework = "hf_trainer";
  c.parallel.zero_stage = 0;
  c.training.objective = "grpo";
  c.training.generation_engine = "vllm_server";
  c.training.num_generations = 2;
  c.training.completion_length = 128;
  c.hardware.gpu = "l4";
  set_gpu_count(c.parallel, 2);
  // One L4 cannot hold the 16 GB model and one 131,072-token request's KV cache in 90%; four can.
  Config four = c;
  four.training.vllm_server_tensor_parallel_size = 4;
  const HandSet hand;
  fit_shape(c, hand);
  fit_shape(four, hand);
  const Result refused = simulate(c), starts = simulate(four);
  REQUIRE(refused.ok);
  REQUIRE(starts.ok);
  REQUIRE(!refused.devices.back().refusal.empty());
  REQUIRE(starts.devices.back().refusal.empty());
  CHECK(c.training.micro_batch_size == four.training.micro_batch_size);
  CHECK(c.training.sequence_length == four.training.sequence_length);
  CHECK(starts.devices.front().verdict == Verdict::Fits);
  // A colocated engine that vLLM would not start (TRL's vllm_max_model_length None: 131,072 tokens in a 30% share):
  // the search still finds the shape the training GPUs' memory holds, not the largest one.
  Config colocated = c;
  colocated.training.generation_engine = "vllm_colocate";
  colocated.hardware.gpu = "l40s";
  fit_shape(colocated, hand);
  const Result r = simulate(colocated);
  REQUIRE(r.ok);
  REQUIRE(!r.devices.front().refusal.empty());
  CHECK(device_verdict(r.devices.front()) == Verdict::Fits);
}
