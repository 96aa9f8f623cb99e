// Round trips of both encodings, and hostile input that must come back as a clear error.
#include <catch2/catch.hpp>
#include <filesystem>
#include <random>

#include "core/serialize.h"
#include "core/simulate.h"
#include "test_util.h"

using namespace memsim;

static Config modified() {
  Config c;
  c.model.model_type = "gpt2";
  c.model.hidden_size = 1024;
  c.model.num_hidden_layers = 3;
  c.model.num_attention_heads = 16;
  c.model.num_key_value_heads = 4;
  c.model.head_dim = 0;
  c.model.norm_type = NormType::LayerNorm;
  c.model.position_embedding_type = PositionType::Absolute;
  c.model.tie_word_embeddings = true;
  c.model.hidden_act = "gelu & \"quoted\" =#%";
  c.training.precision = "fp32";
  c.training.micro_batch_size = 7;
  c.training.optimizer_impl = "fused";
  c.training.activation_checkpointing = "every_k";
  c.training.attention = "eager";
  c.model.attention_dropout = 0.1;
  c.parallel.zero_stage = 1;
  c.hardware.gpu = "h100-sxm";
  c.hardware.headroom_fraction = 0.125;
  c.hardware.expandable_segments = "true";
  c.training.compile = true;
  c.parallel.fsdp_forward_prefetch = 2;
  c.parallel.fsdp2_backward_prefetch = 3;
  c.parallel.fsdp_use_orig_params = "true";
  c.parallel.fsdp_no_sync = "false";
  return c;
}

TEST_CASE("JSON round trip gives back the identical config", "[serialize]") {
  for (const Config& c : {Config{}, modified()}) {
    Parsed p = config_from_json(config_to_json(c));
    INFO((p.errors.empty() ? "" : p.errors[0].message));
    REQUIRE(p.ok);
    CHECK(p.config == c);
  }
}

TEST_CASE("fragment round trip gives back the identical config", "[serialize]") {
  for (const Config& c : {Config{}, modified()}) {
    std::string frag = config_to_fragment(c);
    CHECK(frag.rfind("memsim=3&", 0) == 0);
    Parsed p = config_from_fragment("#" + frag);
    INFO((p.errors.empty() ? "" : p.errors[0].message));
    REQUIRE(p.ok);
    CHECK(p.config == c);
  }
}

TEST_CASE("a --set override changes one field and names the field when it fails", "[serialize]") {
  Config c;
  CHECK(apply_setting(c, "model.hidden_size=4096").empty());
  CHECK(c.model.hidden_size == 4096);
  CHECK(apply_setting(c, "model.norm_type=layernorm").empty());
  CHECK(c.model.norm_type == NormType::LayerNorm);
  auto e = apply_setting(c, "model.hidden_size=abc");
  REQUIRE(e.size() == 1);
  CHECK(e[0].field == "model.hidden_size");
  CHECK(e[0].message.find("integer") != std::string::npos);
  CHECK(c.model.hidden_size == 4096);  // unchanged on failure
  CHECK(apply_setting(c, "model.nope=1")[0].message.find("unknown key") != std::string::npos);
  CHECK(!apply_setting(c, "no-equals-sign").empty());
  CHECK(!apply_setting(c, "model.tie_word_embeddings=maybe").empty());
  CHECK(!apply_setting(c, "model.hidden_size=99999999999999999999999").empty());
}

TEST_CASE("hostile fragments are rejected with a message, never a crash", "[serialize][hostile]") {
  const std::vector<std::string> bad = {
      "",                                   // no schema
      "schema=999&model.hidden_size=1",     // future version
      "schema=0",                           // impossible version
      "schema=abc",
      "schema=1&model.hidden_size=%ZZ",     // broken percent escape
      "schema=1&model.hidden_size=%4",
      "schema=1&model.hidden_size",         // no '='
      "schema=1&model.hidden_size=<script>alert(1)</script>",
      "schema=1&hardware.headroom_fraction=NaN",
      "schema=1&training.precision=" + std::string(300, 'x'),
      "schema=1&" + std::string(1 << 20, 'a'),  // 1 MB
  };
  for (const auto& f : bad) {
    Parsed p = config_from_fragment(f);
    INFO(f.substr(0, 80));
    CHECK(!p.ok);
    REQUIRE(!p.errors.empty());
    CHECK(!p.errors[0].message.empty());
    CHECK(p.config == Config{});  // falls back to the base config
  }
  std::mt19937 rng(1234);
  for (int i = 0; i < 300; ++i) {
    std::string s(rng() % 200, '\0');
    for (auto& ch : s) ch = static_cast<char>(rng());
    Parsed p = config_from_fragment(s);
    if (!p.ok) CHECK(!p.errors.empty());
  }
}

TEST_CASE("hostile JSON is rejected with a message naming the problem", "[serialize][hostile]") {
  auto fails = [](const std::string& text, const std::string& needle) {
    Parsed p = config_from_json(text);
    INFO(text.substr(0, 80));
    REQUIRE(!p.ok);
    INFO(p.errors[0].message);
    CHECK(p.errors[0].message.find(needle) != std::string::npos);
  };
  fails("{", "not valid JSON");
  fails("[1,2]", "JSON object");
  fails(std::string(100000, '[') + std::string(100000, ']'), "nested");
  fails("{\"training\":{\"micro_batch_size\":\"four\"}}", "training.micro_batch_size");
  fails("{\"training\":{\"micro_batch_size\":1e300}}", "training.micro_batch_size");
  fails("{\"training\":{\"micro_batch_size\":18446744073709551615}}", "training.micro_batch_size");
  fails("{\"training\":{\"bogus\":1}}", "training.bogus");
  fails("{\"schema\":" + std::to_string(kConfigSchema + 1) + "}", "newer memsim");
  fails("{\"model\":{\"hidden_size\":4096}}", "model.num_hidden_layers");
  fails("{\"model\":{\"model_type\":\"llama\",\"hidden_size\":\"\xff\xfe\"}}", "");  // invalid UTF-8
  fails(std::string(9 * 1024 * 1024, ' '), "MiB");
}

TEST_CASE("negative and absurd values reach the user as field errors", "[serialize][hostile]") {
  Config c;
  REQUIRE(apply_setting(c, "model.num_hidden_layers=1000000000000000").empty());
  Result r = simulate(c);
  REQUIRE(!r.ok);
  CHECK(r.errors[0].field == "model.num_hidden_layers");
  CHECK(r.errors[0].message.find("from 1 to") != std::string::npos);

  Config d;
  d.model.hidden_size = -5;
  r = simulate(d);
  REQUIRE(!r.ok);
  CHECK(r.errors[0].field == "model.hidden_size");
}

TEST_CASE("a real config.json pasted as the model section works", "[serialize]") {
  std::string hf = read_file(source_path("tests/data/hf/llama-3-8b.json"));
  Parsed p = config_from_json("{\"schema\":1,\"model\":" + hf + "}");
  REQUIRE(p.ok);
  CHECK(p.config.model.num_key_value_heads == 8);
  CHECK(p.config.model.head_dim == 0);
  CHECK(p.config.training == Config{}.training);  // other sections keep their values
  bool noted = false;
  for (const auto& n : p.notes) noted |= n.find("ignored") != std::string::npos;
  CHECK(!noted);  // every key of a Llama config is either modelled or known not to matter
}

TEST_CASE("golden files of every shipped schema still decode", "[serialize][golden]") {
  // One file per schema version that has shipped; never edit an old one, add a migration instead.
  for (int v = 1; v <= kConfigSchema; ++v) {
    std::string base = source_path("tests/golden/v" + std::to_string(v));
    Parsed expected = config_from_json(read_file(base + ".expected.json"));
    REQUIRE(expected.ok);
    Parsed from_json = config_from_json(read_file(base + ".json"));
    REQUIRE(from_json.ok);
    CHECK(from_json.config == expected.config);
    std::string frag = read_file(base + ".fragment");
    while (!frag.empty() && (frag.back() == '\n' || frag.back() == '\r')) frag.pop_back();
    Parsed from_frag = config_from_fragment(frag);
    INFO((from_frag.errors.empty() ? "" : from_frag.errors[0].message));
    REQUIRE(from_frag.ok);
    CHECK(from_frag.config == expected.config);
  }
}

TEST_CASE("fuzzer findings stay fixed", "[serialize][fuzz]") {
  // tests/fuzz/regressions/<target>/: inputs that once crashed a fuzz target. Each must now decode or fail with
  // a message, and whatever decodes must serialise again.
  for (const char* target : {"fragment", "set", "deepspeed", "accelerate"}) {
    const std::string dir = source_path(std::string("tests/fuzz/regressions/") + target);
    if (!std::filesystem::is_directory(dir)) continue;
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      const std::string input = read_file(e.path().string());
      INFO(e.path().string());
      Config c;
      bool ok;
      if (std::string(target) != "set") {
        Parsed p = std::string(target) == "fragment"    ? config_from_fragment(input)
                   : std::string(target) == "deepspeed" ? config_from_deepspeed_json(input, Config{})
                                                        : config_from_accelerate(input, Config{});
        ok = p.ok, c = p.config;
        if (!ok) CHECK(!p.errors.empty());
      } else {
        auto errs = apply_setting(c, input);
        ok = errs.empty();
      }
      if (ok) CHECK(config_from_json(config_to_json(c)).ok);
    }
  }
  // The finding: a string field given bytes that are not UTF-8 (the JSON writer threw on them).
  Config c;
  auto errs = apply_setting(c, std::string("model.name=bad\xff\xfe"));
  REQUIRE(errs.size() == 1);
  CHECK(errs[0].message.find("UTF-8") != std::string::npos);
  CHECK(apply_setting(c, "model.name=Ünïcødé 模型").empty());
}

// Imported and exported integers are checked: a product that passes 2^63 is a field error, never a wrapped value.
TEST_CASE("imported products that overflow are refused, and the DeepSpeed export never wraps", "[serialize][hostile]") {
  std::string hf = read_file(source_path("tests/data/hf/deepseek-v3.json"));
  const auto at = hf.find("\"n_shared_experts\"");
  REQUIRE(at != std::string::npos);
  hf.replace(at, hf.find(',', at) - at, "\"n_shared_experts\": 9007199254740993");
  Parsed p = model_from_hf_json(hf);
  REQUIRE(!p.ok);
  CHECK(p.errors[0].field == "n_shared_experts");

  const std::string mesh = "distributed_type: FSDP\nparallelism_config:\n  parallelism_config_dp_replicate_size: 16777216\n"
                           "  parallelism_config_dp_shard_size: 16777216\n  parallelism_config_tp_size: 16777216\n"
                           "  parallelism_config_cp_size: 16777216\n";
  Parsed a = config_from_accelerate(mesh, Config{});
  REQUIRE(!a.ok);
  CHECK(a.errors[0].field == "parallelism_config");

  Config c;
  c.training.micro_batch_size = int64_t{1} << 40;
  c.training.gradient_accumulation_steps = int64_t{1} << 20;
  c.parallel.data_parallel_size = int64_t{1} << 20;
  CHECK(deepspeed_json(c).find("\"train_batch_size\"") == std::string::npos);  // DeepSpeed derives it
}

TEST_CASE("model.hidden_act names one of transformers' activations, T5's bare \"gated-\" is refused", "[serialize][hostile]") {
  Config c;
  REQUIRE(apply_setting(c, "model.hidden_act=banana").empty());
  auto errors = validate(c);
  REQUIRE(!errors.empty());
  CHECK(errors[0].field == "model.hidden_act");
  std::string t5 = read_file(source_path("tests/data/hf/flan-t5-large.json"));
  const auto at = t5.find("\"feed_forward_proj\"");
  REQUIRE(at != std::string::npos);
  t5.replace(at, t5.find(',', at) - at, "\"feed_forward_proj\": \"gated-\"");
  Parsed p = model_from_hf_json(t5);
  const bool refused = !p.ok || !validate(p.config).empty();
  CHECK(refused);
}
