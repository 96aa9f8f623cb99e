// The Accelerate config importer (YAML as `accelerate config` writes it, or the same content as JSON): real
// configs map onto the layout memsim simulates, and hostile text comes back as a message that keeps the setup.
#include <catch2/catch.hpp>
#include <string>

#include "core/serialize.h"
#include "core/simulate.h"
#include "test_util.h"

using namespace memsim;

namespace {

Parsed load(const std::string& name, const Config& base = Config{}) {
  return config_from_accelerate(read_file(source_path("tests/data/accelerate/" + name)), base);
}

bool has_note(const Parsed& p, const std::string& part) {
  for (const auto& n : p.notes)
    if (n.find(part) != std::string::npos) return true;
  return false;
}

// Every imported config must simulate (or fail validation with messages) and round-trip.
void check_usable(const Parsed& p) {
  REQUIRE(p.ok);
  Parsed again = config_from_json(config_to_json(p.config));
  REQUIRE(again.ok);
  CHECK(again.config == p.config);
  Result r = simulate(p.config);
  INFO((r.errors.empty() ? "" : r.errors[0].message));
  CHECK(r.ok);
}

}  // namespace

TEST_CASE("Accelerate FSDP1 FULL_SHARD with CPU offload", "[serialize][accelerate]") {
  Config base;
  base.parallel.tensor_parallel_size = 2;  // the file's layout replaces the current one
  base.parallel.sequence_parallel = true;
  Parsed p = load("fsdp1_full_shard_offload.yaml", base);
  INFO((p.errors.empty() ? "" : p.errors[0].message));
  REQUIRE(p.ok);
  const auto& par = p.config.parallel;
  CHECK(par.sharding == "fsdp1");
  CHECK(par.zero_stage == 3);
  CHECK(par.offload_params == "cpu");
  CHECK(par.offload_optimizer == "cpu");
  CHECK(par.fsdp_backward_prefetch == "backward_pre");
  CHECK(par.fsdp_use_orig_params == "true");  // fsdp_use_orig_params: true
  CHECK(par.fsdp_forward_prefetch == 0);      // fsdp_forward_prefetch: false
  CHECK(par.shard_group_size == 0);
  CHECK(par.data_parallel_size == 8);
  CHECK(par.tensor_parallel_size == 1);
  CHECK_FALSE(par.sequence_parallel);
  CHECK(p.config.hardware.gpus_per_node == 8);
  CHECK(p.config.training.precision == "bf16_mixed");
  CHECK(p.config.training.activation_checkpointing == "full");
  CHECK(p.config.model == base.model);
  CHECK(has_note(p, "no fsdp_version: FSDP1"));
  CHECK(has_note(p, "ignored: "));
  CHECK(has_note(p, "fsdp_config.fsdp_state_dict_type"));
  check_usable(p);
}

TEST_CASE("Accelerate FSDP2 with reshard_after_forward false is ZeRO-2-like", "[serialize][accelerate]") {
  Config base;
  base.training.activation_checkpointing = "selective";
  Parsed p = load("fsdp2_no_reshard.yaml", base);
  REQUIRE(p.ok);
  CHECK(p.config.parallel.sharding == "fsdp2");
  CHECK(p.config.parallel.zero_stage == 2);
  CHECK(p.config.parallel.offload_params == "none");
  CHECK(p.config.parallel.offload_optimizer == "none");
  CHECK(p.config.parallel.data_parallel_size == 4);
  CHECK(p.config.hardware.gpus_per_node == 4);
  // fsdp_activation_checkpointing false keeps the current choice, and says so.
  CHECK(p.config.training.activation_checkpointing == "selective");
  CHECK(has_note(p, "fsdp_activation_checkpointing false"));
  check_usable(p);
}

TEST_CASE("Accelerate HYBRID_SHARD on 2 machines x 8 GPUs shards within a machine", "[serialize][accelerate]") {
  Parsed p = load("fsdp1_hybrid_2x8.yaml");
  REQUIRE(p.ok);
  CHECK(p.config.parallel.sharding == "fsdp1");
  CHECK(p.config.parallel.zero_stage == 3);
  CHECK(p.config.parallel.data_parallel_size == 16);
  CHECK(p.config.parallel.shard_group_size == 8);
  CHECK(p.config.hardware.gpus_per_node == 8);
  check_usable(p);
  // HYBRID_SHARD_ZERO2 (5) shards gradients and optimizer states only.
  std::string text = read_file(source_path("tests/data/accelerate/fsdp1_hybrid_2x8.yaml"));
  const std::string key = "fsdp_sharding_strategy: HYBRID_SHARD";
  text.replace(text.find(key), key.size(), "fsdp_sharding_strategy: 5");
  Parsed z2 = config_from_accelerate(text, Config{});
  REQUIRE(z2.ok);
  CHECK(z2.config.parallel.zero_stage == 2);
  CHECK(z2.config.parallel.shard_group_size == 8);
}

TEST_CASE("Accelerate legacy keys: numeric strategy, backward_prefetch_policy, quoted 'no'", "[serialize][accelerate]") {
  Parsed p = load("fsdp1_legacy_numeric.yaml");
  REQUIRE(p.ok);
  CHECK(p.config.parallel.zero_stage == 2);  // 2 = SHARD_GRAD_OP (torch ShardingStrategy)
  CHECK(p.config.parallel.fsdp_backward_prefetch == "backward_pre");
  CHECK(p.config.training.precision == "fp32");
  CHECK(p.config.parallel.data_parallel_size == 2);
}

TEST_CASE("Accelerate FSDP2 device mesh (HSDP x TP) in the JSON form", "[serialize][accelerate]") {
  Parsed p = load("fsdp2_hsdp_tp.json");
  INFO((p.errors.empty() ? "" : p.errors[0].message));
  REQUIRE(p.ok);
  CHECK(p.config.parallel.sharding == "fsdp2");
  CHECK(p.config.parallel.zero_stage == 3);
  CHECK(p.config.parallel.data_parallel_size == 8);
  CHECK(p.config.parallel.tensor_parallel_size == 2);
  CHECK(p.config.parallel.shard_group_size == 4);
  CHECK(p.config.hardware.gpus_per_node == 8);
  check_usable(p);
  // The mesh must multiply out to num_processes.
  std::string text = read_file(source_path("tests/data/accelerate/fsdp2_hsdp_tp.json"));
  text.replace(text.find("\"num_processes\": 16"), 19, "\"num_processes\": 12");
  Parsed bad = config_from_accelerate(text, Config{});
  REQUIRE_FALSE(bad.ok);
  CHECK(bad.errors[0].field == "parallelism_config");
}

TEST_CASE("Accelerate YAML and JSON forms of one config give the same config", "[serialize][accelerate]") {
  const std::string yaml = "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n  fsdp_offload_params: true\n"
                           "mixed_precision: fp16\nnum_machines: 1\nnum_processes: 8\ntpu_env: []\n";
  const std::string js = R"({"distributed_type": "FSDP", "fsdp_config": {"fsdp_version": 2, "fsdp_offload_params": true},
                             "mixed_precision": "fp16", "num_machines": 1, "num_processes": 8, "tpu_env": []})";
  Parsed a = config_from_accelerate(yaml, Config{}), b = config_from_accelerate(js, Config{});
  REQUIRE(a.ok);
  REQUIRE(b.ok);
  CHECK(a.config == b.config);
  CHECK(a.config.parallel.zero_stage == 3);
  CHECK(a.config.parallel.offload_params == "cpu");
  CHECK(a.config.training.precision == "fp16_mixed");
  CHECK(looks_like_accelerate_config(yaml));
  CHECK(looks_like_accelerate_config(js));
  CHECK_FALSE(looks_like_accelerate_config(R"({"zero_optimization": {"stage": 3}})"));
  CHECK_FALSE(looks_like_accelerate_config(read_file(source_path("tests/data/hf/llama-3-8b.json"))));
}

TEST_CASE("Accelerate DeepSpeed and DDP configs", "[serialize][accelerate]") {
  Parsed ds = load("deepspeed_zero3_offload.yaml");
  REQUIRE(ds.ok);
  CHECK(ds.config.parallel.sharding == "deepspeed");
  CHECK(ds.config.parallel.zero_stage == 3);
  CHECK(ds.config.parallel.offload_optimizer == "cpu");
  CHECK(ds.config.parallel.offload_params == "cpu");
  CHECK(ds.config.training.gradient_accumulation_steps == 4);
  CHECK(ds.config.training.precision == "bf16_mixed");
  check_usable(ds);
  Parsed ddp = load("multi_gpu_dynamo.yaml");
  REQUIRE(ddp.ok);
  CHECK(ddp.config.parallel.zero_stage == 0);
  CHECK(ddp.config.parallel.data_parallel_size == 4);
  CHECK(ddp.config.training.precision == "amp_fp16");  // DDP autocasts over fp32 weights
  CHECK(has_note(ddp, "dynamo_config.dynamo_backend"));
}

TEST_CASE("Accelerate YAML subset: comments, quotes, PyYAML booleans, lists", "[serialize][accelerate]") {
  const std::string yaml =
      "---\n"
      "# written by hand\n"
      "distributed_type: \"FSDP\"   # quoted\n"
      "fsdp_config:\n"
      "  fsdp_offload_params: yes\n"
      "  fsdp_sharding_strategy: 'SHARD_GRAD_OP'\n"
      "  fsdp_transformer_layer_cls_to_wrap:\n"
      "  - LlamaDecoderLayer\n"
      "  - 'MistralDecoderLayer'\n"
      "tpu_env: [A, \"B\"]\r\n"
      "num_processes: 2\n"
      "mixed_precision: bf16\n";
  Parsed p = config_from_accelerate(yaml, Config{});
  INFO((p.errors.empty() ? "" : p.errors[0].message));
  REQUIRE(p.ok);
  CHECK(p.config.parallel.zero_stage == 2);
  CHECK(p.config.parallel.offload_params == "cpu");
}

TEST_CASE("hostile Accelerate configs are refused with a message and keep the setup", "[serialize][accelerate][hostile]") {
  Config base;
  base.training.micro_batch_size = 3;
  base.parallel.data_parallel_size = 5;
  const std::string head = "distributed_type: FSDP\n";
  struct Case {
    const char* name;
    std::string text;
    const char* says;
  };
  std::string deep = "{\"distributed_type\": \"FSDP\", \"a\": ";
  for (int i = 0; i < 100000; ++i) deep += "[";
  std::string deep_yaml = head;
  for (int i = 0; i < 50; ++i) deep_yaml += std::string(static_cast<size_t>(i) * 2, ' ') + "k" + std::to_string(i) + ":\n";
  const Case cases[] = {
      {"50 MB", head + std::string(50u << 20, 'x'), "at most 1 MiB"},
      {"deep JSON", deep, "nested"},
      {"deep YAML", deep_yaml, "nested more than one level"},
      {"deep flow", head + "x: [[[[[1]]]]]\n", "nested"},
      {"invalid UTF-8", head + "main_process_ip: \"\xff\xfe\"\n", "UTF-8"},
      {"beyond 2^53 (YAML)", head + "num_processes: 9007199254740993\n", "2^53"},
      {"beyond 2^64 (YAML)", head + "num_processes: 123456789012345678901234567890\n", "2^53"},
      {"beyond 2^53 (JSON)", R"({"distributed_type": "FSDP", "num_processes": 18014398509481984})", "2^53"},
      {"tab indentation", head + "fsdp_config:\n\tfsdp_version: 2\n", "tab"},
      {"anchor", "distributed_type: &t FSDP\n", "anchors"},
      {"alias", head + "mixed_precision: *t\n", "aliases"},
      {"tag", head + "num_processes: !!int 8\n", "tags"},
      {"block scalar", head + "main_training_function: |\n  main\n", "block scalars"},
      {"multi-document", head + "---\ndistributed_type: NO\n", "several YAML documents"},
      {"document end", head + "...\n", "several YAML documents"},
      {"directive", "%YAML 1.2\n" + head, "directives"},
      {"duplicate key", head + "distributed_type: NO\n", "twice"},
      {"flow mapping", head + "fsdp_config: {fsdp_version: 2}\n", "flow mappings"},
      {"unclosed quote", head + "main_process_ip: \"10.0.0.1\n", "same line"},
      {"unclosed list", head + "tpu_env: [a, b\n", "close"},
      {"bad escape", head + "x: \"\\q\"\n", "escape"},
      {"NUL escape", head + "x: \"\\u0000\"\n", "valid character"},
      {"control character", head + "x: a\x01b\n", "control character"},
      {"list of mappings", head + "tpu_env:\n- a: 1\n", "mappings"},
      {"bad indentation", head + "fsdp_config:\n    fsdp_version: 2\n  fsdp_offload_params: true\n", "indentation"},
      {"not a mapping", "- FSDP\n", "where a key"},
      {"a JSON list", "[1, 2]", "JSON object"},
      {"broken JSON", "{\"distributed_type\": ", "not valid JSON"},
      {"empty", "", "no keys"},
      {"NaN", head + "x: .nan\n", "NaN"},
      {"missing type", "num_processes: 8\n", "distributed_type is missing"},
      {"unknown type", "distributed_type: XLA\n", "distributed_type must be one of"},
      {"bad strategy", head + "fsdp_config:\n  fsdp_sharding_strategy: 9\n", "fsdp_sharding_strategy"},
      {"bad version", head + "fsdp_config:\n  fsdp_version: 3\n", "fsdp_version"},
      {"bad offload", head + "fsdp_config:\n  fsdp_offload_params: maybe\n", "fsdp_offload_params"},
      {"zero processes", head + "num_processes: 0\n", "num_processes"},
      {"uneven machines", head + "num_processes: 9\nnum_machines: 2\n", "multiple of num_machines"},
      {"section not a mapping", head + "fsdp_config: 3\n", "fsdp_config must be a mapping"},
      {"Ulysses", head + "parallelism_config:\n  parallelism_config_sp_size: 2\n", "not modelled"},
  };
  for (const auto& c : cases) {
    INFO(c.name);
    Parsed p = config_from_accelerate(c.text, base);
    REQUIRE_FALSE(p.ok);
    REQUIRE_FALSE(p.errors.empty());
    INFO(p.errors[0].message);
    CHECK(p.errors[0].message.find(c.says) != std::string::npos);
    CHECK_FALSE(p.errors[0].field.empty());
    CHECK(p.config == base);
  }
}
