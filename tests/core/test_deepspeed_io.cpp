// The DeepSpeed config import and export (core/deepspeed_io.h): every form DeepSpeed's config takes, contradictions
// refused, every unread key noted, and a lossless round trip for what the export writes.
#include <catch2/catch.hpp>
#include <random>

#include "core/serialize.h"
#include "core/simulate.h"
#include "random_config.h"

using namespace memsim;

namespace {

std::string all_notes(const Parsed& p) {
  std::string s;
  for (const auto& n : p.notes) s += n + "\n";
  return s;
}

bool noted(const Parsed& p, const std::string& what) { return all_notes(p).find(what) != std::string::npos; }

}  // namespace

TEST_CASE("a DeepSpeed config sets what memsim models and lists the rest", "[serialize][deepspeed]") {
  const std::string ds = R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": "auto",
    "fp16": {"enabled": true}, "zero_optimization": {"stage": 1, "overlap_comm": true},
    "optimizer": {"type": "Adam"}})";
  Config base;
  base.training.gradient_accumulation_steps = 7;
  Parsed p = config_from_deepspeed_json(ds, base);
  REQUIRE(p.ok);
  CHECK(p.config.training.micro_batch_size == 2);
  CHECK(p.config.training.gradient_accumulation_steps == 7);  // "auto" keeps the current value
  CHECK(p.config.training.precision == "fp16_mixed");
  CHECK(p.config.parallel.zero_stage == 1);
  CHECK(p.config.training.optimizer == "adam");
  CHECK(p.config.model == base.model);
  bool listed = false;
  for (const auto& n : p.notes) listed |= n.find("overlap_comm") != std::string::npos;
  CHECK(listed);
  // The export reads back to the same training settings.
  Parsed back = config_from_deepspeed_json(deepspeed_json(p.config), base);
  REQUIRE(back.ok);
  CHECK(back.config.training.micro_batch_size == 2);
  CHECK(back.config.parallel.zero_stage == 1);
  // Hostile: wrong types keep the setup and name the field.
  Parsed bad = config_from_deepspeed_json(R"({"train_micro_batch_size_per_gpu": "lots"})", base);
  REQUIRE(!bad.ok);
  CHECK(bad.errors[0].field == "train_micro_batch_size_per_gpu");
  CHECK(!config_from_deepspeed_json(R"({"zero_optimization": 3})", base).ok);
}

TEST_CASE("DeepSpeed offload: devices, the deprecated cpu_offload flags, export and read-back", "[serialize][deepspeed]") {
  // deepspeed/runtime/zero/offload_config.py: device none|cpu|nvme; zero/config.py: cpu_offload (deprecated) ->
  // offload_optimizer cpu, cpu_offload_param (deprecated) -> offload_param cpu.
  Config base;
  base.parallel.sharding = "fsdp2";
  const std::string ds = R"({"zero_optimization": {"stage": 3,
    "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme", "pin_memory": true},
    "offload_param": {"device": "cpu", "pin_memory": true}}})";
  Parsed p = config_from_deepspeed_json(ds, base);
  REQUIRE(p.ok);
  CHECK(p.config.parallel.sharding == "deepspeed");
  CHECK(p.config.parallel.offload_optimizer == "nvme");
  CHECK(p.config.parallel.offload_params == "cpu");
  bool listed = false;
  for (const auto& n : p.notes) listed |= n.find("offload_param.pin_memory") != std::string::npos;
  CHECK(listed);
  // The export writes the same blocks and reads back to the same offload.
  const std::string out = deepspeed_json(p.config);
  CHECK(out.find("\"offload_optimizer\"") != std::string::npos);
  CHECK(out.find("\"nvme_path\"") != std::string::npos);
  Parsed back = config_from_deepspeed_json(out, base);
  REQUIRE(back.ok);
  CHECK(back.config.parallel.offload_optimizer == "nvme");
  CHECK(back.config.parallel.offload_params == "cpu");
  CHECK(back.config.parallel.zero_stage == 3);
  CHECK(simulate(back.config).ok);
  // No offload: the export has no offload blocks, and a ZeRO section without them clears a previous offload.
  Config none = back.config;
  none.parallel.offload_optimizer = none.parallel.offload_params = "none";
  CHECK(deepspeed_json(none).find("offload") == std::string::npos);
  Parsed cleared = config_from_deepspeed_json(R"({"zero_optimization": {"stage": 2}})", back.config);
  REQUIRE(cleared.ok);
  CHECK(cleared.config.parallel.offload_optimizer == "none");
  CHECK(cleared.config.parallel.offload_params == "none");
  // The deprecated flags.
  Parsed legacy = config_from_deepspeed_json(R"({"zero_optimization": {"stage": 3, "cpu_offload": true, "cpu_offload_param": true}})", base);
  REQUIRE(legacy.ok);
  CHECK(legacy.config.parallel.offload_optimizer == "cpu");
  CHECK(legacy.config.parallel.offload_params == "cpu");
  Parsed newer = config_from_deepspeed_json(
      R"({"zero_optimization": {"stage": 2, "cpu_offload": true, "offload_optimizer": {"device": "none"}}})", base);
  REQUIRE(newer.ok);
  CHECK(newer.config.parallel.offload_optimizer == "none");
  // Hostile values name the field and keep the setup.
  for (const char* bad : {R"({"zero_optimization": {"offload_optimizer": {"device": "gpu"}}})",
                          R"({"zero_optimization": {"offload_param": {"device": 1}}})",
                          R"({"zero_optimization": {"offload_param": "cpu"}})",
                          R"({"zero_optimization": {"cpu_offload": "sometimes"}})",
                          R"({"optimizer": {"type": 3}})"}) {
    INFO(bad);
    Parsed b = config_from_deepspeed_json(bad, base);
    REQUIRE_FALSE(b.ok);
    CHECK((b.errors[0].field.find("offload") != std::string::npos || b.errors[0].field == "optimizer.type"));
    CHECK(b.config == base);
  }
}

TEST_CASE("DeepSpeed enabled flags in every form DeepSpeed takes, fp32 when both are off, both on refused",
          "[serialize][deepspeed]") {
  // precision_config.py: enabled is a pydantic bool (true/false, 0/1, "true"/"false", "yes"/"no", ...).
  Config base;
  base.training.precision = "amp_fp16";
  for (const char* on : {"true", "1", "\"true\"", "\"True\"", "\"yes\"", "\"on\"", "1.0"}) {
    INFO(on);
    Parsed p = config_from_deepspeed_json(std::string(R"({"bf16": {"enabled": )") + on + "}}", base);
    REQUIRE(p.ok);
    CHECK(p.config.training.precision == "bf16_mixed");
    Parsed f = config_from_deepspeed_json(std::string(R"({"fp16": {"enabled": )") + on + R"(}, "bf16": {"enabled": false}})", base);
    REQUIRE(f.ok);
    CHECK(f.config.training.precision == "fp16_mixed");
  }
  // Both off, in any form, or neither section: DeepSpeed trains in fp32 (it kept bf16 mixed before).
  for (const char* ds : {R"({"bf16": {"enabled": false}, "fp16": {"enabled": false}})",
                         R"({"bf16": {"enabled": "false"}, "fp16": {"enabled": 0}})", R"({"bf16": {}, "fp16": {"enabled": "off"}})",
                         R"({"zero_optimization": {"stage": 2}})"}) {
    INFO(ds);
    Parsed p = config_from_deepspeed_json(ds, base);
    REQUIRE(p.ok);
    CHECK(p.config.training.precision == "fp32");
  }
  CHECK(noted(config_from_deepspeed_json(R"({"zero_optimization": {"stage": 2}})", base), "fp32"));
  // The shorthand {"bf16": true} and the older "bfloat16" key.
  Parsed shorthand = config_from_deepspeed_json(R"({"bf16": true})", base);
  REQUIRE(shorthand.ok);
  CHECK(shorthand.config.training.precision == "bf16_mixed");
  CHECK(noted(shorthand, "the form DeepSpeed takes"));
  Parsed old = config_from_deepspeed_json(R"({"bfloat16": {"enabled": true}})", base);
  REQUIRE(old.ok);
  CHECK(old.config.training.precision == "bf16_mixed");
  // "auto" (HF Trainer fills it from --bf16/--fp16): memsim keeps its precision and says so.
  Parsed a = config_from_deepspeed_json(R"({"bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}})", base);
  REQUIRE(a.ok);
  CHECK(a.config.training.precision == "amp_fp16");
  CHECK(noted(a, "\"auto\""));
  CHECK(noted(a, "bf16.enabled"));
  // Both on: DeepSpeed asserts (config.py); memsim refuses, naming both keys, and keeps the setup.
  for (const char* both : {R"({"bf16": {"enabled": true}, "fp16": {"enabled": true}})", R"({"bf16": true, "fp16": {"enabled": "1"}})"}) {
    INFO(both);
    Parsed b = config_from_deepspeed_json(both, base);
    REQUIRE_FALSE(b.ok);
    CHECK(b.errors[0].message.find("bf16.enabled") != std::string::npos);
    CHECK(b.errors[0].message.find("fp16.enabled") != std::string::npos);
    CHECK(b.config == base);
  }
  // Not a boolean: a field error.
  for (const char* bad : {R"({"bf16": {"enabled": 2}})", R"({"bf16": {"enabled": "maybe"}})", R"({"fp16": [true]})"}) {
    INFO(bad);
    Parsed b = config_from_deepspeed_json(bad, base);
    REQUIRE_FALSE(b.ok);
    CHECK((b.errors[0].field.rfind("bf16", 0) == 0 || b.errors[0].field.rfind("fp16", 0) == 0));
  }
}

TEST_CASE("DeepSpeed optimizer as an object or a name, overlap_comm as a string, the deprecated ZeRO boolean",
          "[serialize][deepspeed]") {
  Config base;
  base.training.optimizer = "lion";
  for (const char* ds : {R"({"optimizer": "AdamW"})", R"({"optimizer": {"type": "AdamW", "params": {"lr": 3e-5}}})",
                         R"({"optimizer": {"type": "adamw"}})"}) {
    INFO(ds);
    Parsed p = config_from_deepspeed_json(ds, base);
    REQUIRE(p.ok);
    CHECK(p.config.training.optimizer == "adamw");
  }
  CHECK(noted(config_from_deepspeed_json(R"({"optimizer": "AdamW"})", base), "the form DeepSpeed takes"));
  CHECK(noted(config_from_deepspeed_json(R"({"optimizer": {"type": "AdamW", "params": {"lr": 3e-5}}})", base), "optimizer.params.lr"));
  Parsed sgd = config_from_deepspeed_json(R"({"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}})", base);
  REQUIRE(sgd.ok);
  CHECK(sgd.config.training.optimizer == "sgd_momentum");
  CHECK(config_from_deepspeed_json(R"({"optimizer": {"type": "SGD"}})", base).config.training.optimizer == "sgd");
  CHECK(config_from_deepspeed_json(R"({"optimizer": {"type": "Lion"}})", Config{}).config.training.optimizer == "lion");
  // A name memsim does not model keeps the current optimizer, in the notes.
  Parsed lamb = config_from_deepspeed_json(R"({"optimizer": {"type": "Lamb"}})", base);
  REQUIRE(lamb.ok);
  CHECK(lamb.config.training.optimizer == "lion");
  CHECK(noted(lamb, "Lamb"));
  CHECK_FALSE(config_from_deepspeed_json(R"({"optimizer": 3})", base).ok);

  for (const char* on : {"true", "\"true\"", "1"}) {
    Parsed p = config_from_deepspeed_json(std::string(R"({"zero_optimization": {"stage": 2, "overlap_comm": )") + on + "}}", base);
    REQUIRE(p.ok);
    CHECK(p.config.parallel.zero_overlap_comm == "true");
  }
  CHECK(config_from_deepspeed_json(R"({"zero_optimization": {"overlap_comm": "false"}})", base).config.parallel.zero_overlap_comm == "false");
  CHECK(config_from_deepspeed_json(R"({"zero_optimization": {"overlap_comm": "auto"}})", base).config.parallel.zero_overlap_comm == "auto");
  CHECK_FALSE(config_from_deepspeed_json(R"({"zero_optimization": {"overlap_comm": "sometimes"}})", base).ok);
  // zero/config.py read_zero_config_deprecated: a boolean is stage 1 or 0.
  CHECK(config_from_deepspeed_json(R"({"zero_optimization": true})", base).config.parallel.zero_stage == 1);
  CHECK(config_from_deepspeed_json(R"({"zero_optimization": false})", base).config.parallel.zero_stage == 0);
  CHECK_FALSE(config_from_deepspeed_json(R"({"zero_optimization": {"stage": 4}})", base).ok);
}

TEST_CASE("DeepSpeed batch keys: train_batch_size gives the data-parallel size, \"auto\" keeps memsim's values",
          "[serialize][deepspeed]") {
  Config base;
  base.parallel.data_parallel_size = 8;
  base.training.micro_batch_size = 4;
  base.training.gradient_accumulation_steps = 2;
  Parsed all = config_from_deepspeed_json(R"({"train_batch_size": 96, "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 4})", base);
  REQUIRE(all.ok);
  CHECK(all.config.parallel.data_parallel_size == 8);
  CHECK(all.config.training.micro_batch_size == 3);
  Parsed dp2 = config_from_deepspeed_json(R"({"train_batch_size": 24, "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 4})", base);
  REQUIRE(dp2.ok);
  CHECK(dp2.config.parallel.data_parallel_size == 2);
  // Two of the three: DeepSpeed derives the third from the data-parallel size (memsim's).
  Parsed ga = config_from_deepspeed_json(R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2})", base);
  REQUIRE(ga.ok);
  CHECK(ga.config.training.gradient_accumulation_steps == 4);
  Parsed mb = config_from_deepspeed_json(R"({"train_batch_size": 64})", base);
  REQUIRE(mb.ok);
  CHECK(mb.config.training.micro_batch_size == 8);
  CHECK(mb.config.training.gradient_accumulation_steps == 1);
  // "auto" everywhere: memsim's values, listed.
  Parsed a = config_from_deepspeed_json(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto", "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}})", base);
  REQUIRE(a.ok);
  CHECK(a.config.training.micro_batch_size == 4);
  CHECK(a.config.parallel.data_parallel_size == 8);
  CHECK(noted(a, "train_batch_size"));
  CHECK(noted(a, "zero_optimization.reduce_bucket_size"));
  // Inconsistent or wrapped: a field error naming train_batch_size.
  for (const char* bad : {R"({"train_batch_size": 25, "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 4})",
                          R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4611686018427387904, "gradient_accumulation_steps": 4})",
                          R"({"train_batch_size": 0})", R"({"train_batch_size": 12})"}) {
    INFO(bad);
    Parsed b = config_from_deepspeed_json(bad, base);
    REQUIRE_FALSE(b.ok);
    CHECK(b.errors[0].field == "train_batch_size");
    CHECK(b.config == base);
  }
}

TEST_CASE("every DeepSpeed key memsim does not read is noted", "[serialize][deepspeed]") {
  const std::string ds = R"({"steps_per_print": 10, "gradient_clipping": 1.0, "wall_clock_breakdown": false,
    "fp16": {"enabled": false, "loss_scale": 0}, "bf16": {"enabled": true, "immediate_grad_update": true},
    "scheduler": {"type": "WarmupLR"}, "optimizer": {"type": "AdamW", "params": {"betas": [0.9, 0.95]}, "legacy_fusion": false},
    "zero_optimization": {"stage": 3, "contiguous_gradients": true, "offload_param": {"device": "cpu", "pin_memory": true}},
    "activation_checkpointing": {"partition_activations": true}, "memsim": {"future_key": 1}})";
  Parsed p = config_from_deepspeed_json(ds, Config{});
  REQUIRE(p.ok);
  for (const char* key : {"steps_per_print", "gradient_clipping", "wall_clock_breakdown", "fp16.loss_scale",
                          "bf16.immediate_grad_update", "scheduler", "optimizer.params.betas", "optimizer.legacy_fusion",
                          "zero_optimization.contiguous_gradients", "zero_optimization.offload_param.pin_memory",
                          "activation_checkpointing.partition_activations", "memsim.future_key"}) {
    INFO(key);
    CHECK(noted(p, key));
  }
}

TEST_CASE("DeepSpeed export and re-import restore every field the export writes", "[serialize][deepspeed][roundtrip]") {
  // For generated configs, config_from_deepspeed_json(deepspeed_json(c), base) with those fields set otherwise in
  // base gives c back (as a DeepSpeed run: framework and sharding deepspeed).
  std::mt19937_64 rng(18);
  int checked = 0;
  for (int i = 0; i < 300; ++i) {
    Config c = memsim_test::random_config(rng);
    c.parallel.offload_params = memsim_test::pick(rng, std::vector<std::string>{"none", "cpu", "nvme"});
    if (rng() % 3 == 0) c.parallel.offload_optimizer = "nvme";
    c.parallel.zero_overlap_comm = memsim_test::pick(rng, std::vector<std::string>{"auto", "true", "false"});
    if (rng() % 2) c.parallel.zero_reduce_bucket_size = 1 + static_cast<int64_t>(rng() % 100000000);
    if (rng() % 2) c.training.activation_checkpointing = "every_k", c.training.checkpoint_every_k_layers = 1 + static_cast<int64_t>(rng() % 4);
    Config base = c;
    base.training.micro_batch_size = c.training.micro_batch_size + 5;
    base.training.gradient_accumulation_steps = c.training.gradient_accumulation_steps + 3;
    base.parallel.data_parallel_size = c.parallel.data_parallel_size * 3;
    base.training.precision = c.training.precision == "amp_fp16" ? "fp8_te" : "amp_fp16";
    base.training.optimizer = c.training.optimizer == "paged_adamw_8bit" ? "sgd_momentum" : "paged_adamw_8bit";
    base.training.activation_checkpointing = c.training.activation_checkpointing == "none" ? "full" : "none";
    base.training.checkpoint_every_k_layers = c.training.checkpoint_every_k_layers + 1;
    base.parallel.zero_stage = (c.parallel.zero_stage + 1) % 4;
    base.parallel.offload_optimizer = c.parallel.offload_optimizer == "cpu" ? "none" : "cpu";
    base.parallel.offload_params = c.parallel.offload_params == "cpu" ? "nvme" : "cpu";
    base.parallel.zero_overlap_comm = c.parallel.zero_overlap_comm == "auto" ? "true" : "auto";
    base.parallel.zero_reduce_bucket_size = c.parallel.zero_reduce_bucket_size + 7;
    const std::string out = deepspeed_json(c);
    Parsed back = config_from_deepspeed_json(out, base);
    INFO(out);
    INFO((back.errors.empty() ? "" : back.errors[0].message));
    REQUIRE(back.ok);
    Config expected = c;
    expected.training.framework = "deepspeed";
    expected.parallel.sharding = "deepspeed";
    if (c.training.activation_checkpointing != "every_k")  // only every_k's k is written
      expected.training.checkpoint_every_k_layers = base.training.checkpoint_every_k_layers;
    CHECK(back.config.training.micro_batch_size == c.training.micro_batch_size);
    CHECK(back.config.training.gradient_accumulation_steps == c.training.gradient_accumulation_steps);
    CHECK(back.config.parallel.data_parallel_size == c.parallel.data_parallel_size);
    CHECK(back.config.training.precision == c.training.precision);
    CHECK(back.config.training.optimizer == c.training.optimizer);
    CHECK(back.config.training.activation_checkpointing == c.training.activation_checkpointing);
    CHECK(back.config.parallel.zero_stage == c.parallel.zero_stage);
    CHECK(back.config.parallel.offload_optimizer == c.parallel.offload_optimizer);
    CHECK(back.config.parallel.offload_params == c.parallel.offload_params);
    CHECK(back.config.parallel.zero_overlap_comm == c.parallel.zero_overlap_comm);
    CHECK(back.config == expected);  // and nothing else changed
    ++checked;
  }
  CHECK(checked == 300);
  // Activation checkpointing "none" comes back as none (it came back as full), and DeepSpeed's own section follows it.
  Config none;
  none.training.activation_checkpointing = "none";
  CHECK(deepspeed_json(none).find("\"activation_checkpointing\": {") == std::string::npos);
  CHECK(config_from_deepspeed_json(deepspeed_json(none), Config{}).config.training.activation_checkpointing == "none");
  // Precision and optimizer DeepSpeed can say need no memsim section entry; the others say why in it.
  Config plain;
  plain.training.precision = "fp32";
  plain.training.optimizer = "sgd";
  const std::string out = deepspeed_json(plain);
  CHECK(out.find("\"training.precision\"") == std::string::npos);
  CHECK(out.find("\"training.optimizer\"") == std::string::npos);
  CHECK(out.find("\"SGD\"") != std::string::npos);
  plain.training.optimizer = "adamw_8bit";
  CHECK(deepspeed_json(plain).find("\"optimizer\": {") == std::string::npos);  // HF Trainer builds it (--optim)
  CHECK(deepspeed_json(plain).find("\"training.optimizer\": \"adamw_8bit\"") != std::string::npos);
}

TEST_CASE("the memsim section: its values are checked, and DeepSpeed's keys win when they disagree", "[serialize][deepspeed]") {
  Parsed bad = config_from_deepspeed_json(R"({"memsim": {"training.precision": "fp64"}})", Config{});
  REQUIRE_FALSE(bad.ok);
  CHECK(bad.errors[0].field == "memsim.training.precision");
  CHECK_FALSE(config_from_deepspeed_json(R"({"memsim": 5})", Config{}).ok);
  // Edited by hand: fp16 on, but the section still says a bf16 recipe.
  Parsed edited = config_from_deepspeed_json(R"({"fp16": {"enabled": true}, "memsim": {"training.precision": "amp_bf16"}})", Config{});
  REQUIRE(edited.ok);
  CHECK(edited.config.training.precision == "fp16_mixed");
  CHECK(noted(edited, "disagrees"));
  Parsed agree = config_from_deepspeed_json(R"({"bf16": {"enabled": true}, "memsim": {"training.precision": "amp_bf16"}})", Config{});
  REQUIRE(agree.ok);
  CHECK(agree.config.training.precision == "amp_bf16");
}

TEST_CASE("a DeepSpeed config without an optimizer section says whose optimizer then steps", "[deepspeed]") {
  const Parsed none = config_from_deepspeed_json(R"({"zero_optimization": {"stage": 3}, "bf16": {"enabled": true}})", Config{});
  REQUIRE(none.ok);
  CHECK(noted(none, "no optimizer section: DeepSpeed steps the optimizer the training script passes it"));
  const Parsed named = config_from_deepspeed_json(
      R"({"zero_optimization": {"stage": 3}, "bf16": {"enabled": true}, "optimizer": {"type": "AdamW"}})", Config{});
  REQUIRE(named.ok);
  CHECK(!noted(named, "no optimizer section"));
}
