// Library versions as inputs (core/versions.h): parsing, the date, each rule at its boundary (frameworks.cpp
// resolve(), docs/versions.md), explicit values over versions, the notes, the schema-1 migration, and the
// loss paths of transformers before 4.49.
#include <catch2/catch.hpp>

#include "core/frameworks.h"
#include "core/serialize.h"
#include "core/simulate.h"
#include "core/architecture.h"
#include "core/validation.h"
#include "core/versions.h"
#include "test_util.h"

using namespace memsim;

namespace {

Version parsed(const char* text) {
  Version v;
  REQUIRE(parse_version(text, v));
  return v;
}

// A resolved config: the framework and the stated versions ("torch=1.10", ...).
Resolved with(std::initializer_list<const char*> settings, const char* framework = "hf_trainer") {
  Config c;
  c.training.framework = framework;
  for (const char* s : settings) REQUIRE(apply_setting(c, s).empty());
  REQUIRE(validate(c).empty());
  return resolve(c);
}

std::vector<std::string> notes_of(const Config& c) {
  const Result r = simulate(c);
  REQUIRE(r.ok);
  return r.notes;
}

bool has_note(const std::vector<std::string>& notes, const std::string& prefix) {
  for (const auto& n : notes)
    if (n.rfind(prefix, 0) == 0) return true;
  return false;
}

}  // namespace

TEST_CASE("versions: release numbers as pip prints them", "[versions]") {
  CHECK(parsed("2") == Version{2, 0, 0});
  CHECK(parsed("2.1") == Version{2, 1, 0});
  CHECK(parsed("2.1.2") == Version{2, 1, 2});
  CHECK(parsed("2.1.2+cu121") == Version{2, 1, 2});  // torch's local build label
  CHECK(parsed("2.7.0a0+gitb98af95") == Version{2, 7, 0});
  CHECK(parsed("4.46.0.dev0") == Version{4, 46, 0});
  CHECK(parsed("0.43.2rc1") == Version{0, 43, 2});
  CHECK(parsed("v0.43.2") == Version{0, 43, 2});  // a git tag
  CHECK(parsed("2.3.1.post300") == Version{2, 3, 1});
  CHECK(parsed("1.10") < parsed("1.11"));
  CHECK(parsed("2.10") > parsed("2.9.1"));  // numbers, not text
  Version v;
  for (const char* bad : {"", "latest", "2.", "2..1", ".1", "x", "2.1.x", "1.2.3.4", "2.1 ", " 2.1", "2.1+", "2,1",
                          "12345.0", "2.1-foo"}) {
    INFO(bad);
    CHECK_FALSE(parse_version(bad, v));
  }
}

TEST_CASE("versions: dates are a day or a month's first day", "[versions]") {
  Date d;
  REQUIRE(parse_date("2023-10", d));
  CHECK(d == Date{2023, 10, 1});
  REQUIRE(parse_date("2024-02-29", d));
  CHECK(d == Date{2024, 2, 29});
  for (const char* bad : {"", "2023", "2023-13", "2023-00", "2023-02-30", "23-10", "2023/10", "2023-10-1", "1999-12",
                          "2023-10-15x", "latest"}) {
    INFO(bad);
    CHECK_FALSE(parse_date(bad, d));
  }
}

TEST_CASE("versions: bad input names the field and what is allowed", "[versions]") {
  Config c;
  c.versions.torch = "2.1.x";
  c.versions.date = "October 2023";
  const auto errors = validate(c);
  REQUIRE(errors.size() == 2);
  CHECK(errors[0].field == "versions.torch");
  CHECK(errors[0].message == "versions.torch must be a version such as 2.1 or 2.1.2, or latest; got \"2.1.x\"");
  CHECK(errors[1].field == "versions.date");
  CHECK(errors[1].message.rfind("versions.date must be a date such as 2023-10 or 2023-10-15", 0) == 0);
  // A JSON number loses the version's text (2.10 would read as 2.1): the reader asks for a string.
  Parsed p = config_from_json(R"({"schema": 2, "versions": {"transformers": 4.4}})");
  REQUIRE(!p.ok);
  CHECK(p.errors[0].field == "versions.transformers");
  CHECK(p.errors[0].message.find("(a string)") != std::string::npos);
  // --set and links go through the same reader.
  Config s;
  auto e = apply_setting(s, "versions.peft=new");
  CHECK(e.empty());  // a string, checked by validate() like every choice
  CHECK(validate(s).at(0).field == "versions.peft");
  CHECK(!config_from_json(R"({"schema": 2, "versions": {"pytorch": "2.1"}})").ok);  // unknown key
  Config t;
  t.training.softmax_saves_input = "yes";
  CHECK(validate(t).at(0).message == "training.softmax_saves_input must be one of: auto, true, false; got \"yes\"");
}

TEST_CASE("versions: a date picks each library's newest release on or before it", "[versions]") {
  VersionsConfig v;
  v.date = "2023-10";  // 2023-10-01: torch 2.1.0 came on 10-04, transformers 4.34 on 10-03
  StackVersions s = stack_versions(v);
  CHECK(s[Library::Torch].version == Version{2, 0, 0});
  CHECK(s[Library::Transformers].version == Version{4, 33, 0});
  CHECK(s[Library::Peft].version == Version{0, 5, 0});
  CHECK(s[Library::Bitsandbytes].version == Version{0, 41, 0});
  CHECK(s[Library::Torch].from_date);
  CHECK(describe_version(s, Library::Torch) == "torch 2.0.0 (current at versions.date 2023-10-01)");
  v.date = "2023-10-15";
  s = stack_versions(v);
  CHECK(s[Library::Torch].version == Version{2, 1, 0});
  CHECK(s[Library::Transformers].version == Version{4, 34, 0});
  // A stated version beats the date.
  v.torch = "1.13.1";
  s = stack_versions(v);
  CHECK(s[Library::Torch].version == Version{1, 13, 1});
  CHECK(!s[Library::Torch].from_date);
  // Before a table's first release, the first release stands in (every rule's boundary lies after it).
  v = {};
  v.date = "2021-01";
  s = stack_versions(v);
  CHECK(s[Library::Torch].version == Version{1, 10, 0});
  CHECK(s[Library::Torch].before_table);
  CHECK(s[Library::Peft].version == Version{0, 4, 0});
  // No date: every library left at latest stays latest.
  v = {};
  s = stack_versions(v);
  for (const auto& lib : libraries()) CHECK(s[lib.library].latest);
}

TEST_CASE("versions: a date after every table derives what latest does", "[versions]") {
  for (const char* fw : {"hf_trainer", "hf_loop", "deepspeed", "torchtune", "litgpt", "megatron", "torchtitan", "unsloth"}) {
    INFO(fw);
    Config latest;
    latest.training.framework = fw;
    latest.peft.prepare_kbit = "false";
    latest.peft.method = "lora";
    latest.peft.base_quantization = "nf4";
    latest.parallel.zero_stage = 0;
    latest.parallel.data_parallel_size = 1;
    Config dated = latest;
    dated.versions.date = "2026-12-01";
    const Resolved a = resolve(latest), b = resolve(dated);
    for (size_t i = 0; i < kSwitchCount; ++i) CHECK(switch_value(a, Switch(i)) == switch_value(b, Switch(i)));
  }
}

TEST_CASE("versions: latest derives exactly what memsim did before versions were inputs", "[versions]") {
  // Schema 1's fixed defaults, and each framework's own choices (FrameworkSpec).
  for (const auto& f : frameworks()) {
    INFO(f.id);
    Config c;
    c.training.framework = std::string(f.id);
    const Resolved r = resolve(c);
    CHECK(!r.softmax_saves_input);
    CHECK(r.zero_grad_set_to_none);
    CHECK(!r.bnb_saves_input);
    // One departure, later than versions: torchtune's and litgpt's own adapters take the model's dtype (the
    // default recipe's bf16 weights), a rule of their code (FrameworkSpec::adapters_in_model_dtype), not of a version.
    CHECK(r.adapter_dtype == (f.adapters_in_model_dtype ? AdapterDtype::Bf16 : AdapterDtype::Fp32));
    CHECK(r.lazy_module_loading);
    CHECK(r.empty_cache_steps == 0);
    CHECK(switch_value(r, Switch::OptimizerImpl) == f.optimizer_impl);
    CHECK(switch_value(r, Switch::Attention) == f.attention);
    CHECK(switch_value(r, Switch::Loss) == f.loss);
    // torchtitan's launcher sets expandable segments (run_train.sh, torchtitan#643), and so does `import unsloth`
    // (unsloth#249) and prime-rl's launcher (rl.py) and benchmarks workflow; memsim had no framework for the last two
    // before versions were inputs.
    CHECK(r.expandable_segments == (f.id == "torchtitan" || f.id == "unsloth" || f.id == "prime_rl"));
    for (size_t i = 0; i < kSwitchCount; ++i) CHECK(r.origin[i].kind == Origin::Kind::Default);
  }
}

TEST_CASE("versions: torch's rules at their boundaries", "[versions]") {
  // pytorch#66018: softmax and log_softmax stopped saving their input in 1.11.
  CHECK(with({"versions.torch=1.10.2"}).softmax_saves_input);
  CHECK(!with({"versions.torch=1.11"}).softmax_saves_input);
  // pytorch#92731: zero_grad(set_to_none=True) by default from 2.0.
  CHECK(!with({"versions.torch=1.13.1"}).zero_grad_set_to_none);
  CHECK(with({"versions.torch=2.0"}).zero_grad_set_to_none);
  // pytorch#85692 / #86509: lazy CUDA module loading from 1.13.
  CHECK(!with({"versions.torch=1.12.1"}).lazy_module_loading);
  CHECK(with({"versions.torch=1.13"}).lazy_module_loading);
  // torch.optim's foreach default from 2.0 (pytorch#95862), for frameworks that take torch's default.
  for (const char* fw : {"hf_loop", "litgpt", "torchtitan"}) {
    INFO(fw);
    CHECK(with({"versions.torch=1.13.1"}, fw).optimizer_impl == OptimizerImpl::ForLoop);
    CHECK(with({"versions.torch=2.0"}, fw).optimizer_impl == OptimizerImpl::Foreach);
  }
  // Fused kernels a framework asks for itself do not depend on torch's default.
  CHECK(with({"versions.torch=1.13.1"}, "deepspeed").optimizer_impl == OptimizerImpl::Fused);
  CHECK(with({"versions.torch=1.13.1", "parallel.zero_stage=1"}, "megatron").optimizer_impl == OptimizerImpl::Fused);
}

TEST_CASE("versions: the HF Trainer's optimizer by transformers and torch", "[versions]") {
  CHECK(with({"versions.transformers=4.31.0"}).optimizer_impl == OptimizerImpl::ForLoop);  // adamw_hf
  CHECK(with({"versions.transformers=4.32", "versions.torch=2.0"}).optimizer_impl == OptimizerImpl::Foreach);
  CHECK(with({"versions.transformers=4.32", "versions.torch=1.13"}).optimizer_impl == OptimizerImpl::ForLoop);
  CHECK(with({"versions.transformers=4.53", "versions.torch=2.8"}).optimizer_impl == OptimizerImpl::Foreach);
  CHECK(with({"versions.transformers=4.54", "versions.torch=2.7"}).optimizer_impl == OptimizerImpl::Foreach);
  CHECK(with({"versions.transformers=4.54", "versions.torch=2.8"}).optimizer_impl == OptimizerImpl::Fused);
  CHECK(with({"versions.torch=2.7.1"}).optimizer_impl == OptimizerImpl::Foreach);  // latest transformers, older torch
}

TEST_CASE("versions: transformers' default attention", "[versions]") {
  // Llama-3.2-1B has 8 KV heads for 32 query heads: GQA.
  auto gqa = [](std::initializer_list<const char*> v) {
    Config c = single_gpu_config("llama-3.2-1b.json", 1, 512);
    c.training.attention = "auto";
    for (const char* s : v) REQUIRE(apply_setting(c, s).empty());
    return resolve(c).attention;
  };
  CHECK(gqa({"versions.transformers=4.35", "versions.torch=2.1.2"}) == Attention::Eager);
  CHECK(gqa({"versions.transformers=4.36", "versions.torch=2.1.0"}) == Attention::Eager);  // needs torch >= 2.1.1
  CHECK(gqa({"versions.transformers=4.36", "versions.torch=2.1.1"}) == Attention::SdpaRepeatKv);
  CHECK(gqa({"versions.transformers=4.55", "versions.torch=2.5"}) == Attention::SdpaRepeatKv);
  CHECK(gqa({"versions.transformers=4.56", "versions.torch=2.4"}) == Attention::SdpaRepeatKv);  // enable_gqa needs 2.5
  CHECK(gqa({"versions.transformers=4.56", "versions.torch=2.5"}) == Attention::Sdpa);
  // Without GQA nothing is repeated: SDPA from 4.36 on.
  CHECK(with({"versions.transformers=4.40", "versions.torch=2.2"}).attention == Attention::Sdpa);
  // BERT's SDPA attention came in 4.41.
  Config bert = single_gpu_config("bert-large-uncased.json", 4, 512);
  bert.training.attention = "auto";
  bert.versions.transformers = "4.40";
  CHECK(resolve(bert).attention == Attention::Eager);
  bert.versions.transformers = "4.41";
  CHECK(resolve(bert).attention == Attention::Sdpa);
  // Frameworks with their own model code keep their attention.
  CHECK(with({"versions.transformers=4.30", "versions.torch=1.13"}, "torchtune").attention == Attention::SdpaRepeatKv);
}

TEST_CASE("versions: attention the model's own code picks: a program's attention_code, Qwen-1's remote code", "[versions]") {
  // torchvision's ViT calls nn.MultiheadAttention with need_weights=False: SDPA from torch 2.0 whatever transformers'
  // rule says (2.1.0 is below the 2.1.1 that transformers' SDPA default needs), the math path before.
  auto vit = [](const char* torch) {
    Config c;
    c.training.framework = "hf_loop";
    REQUIRE(apply_setting(c, "model.architecture=vit_torchvision").empty());
    REQUIRE(apply_setting(c, std::string("versions.torch=") + torch).empty());
    REQUIRE(validate(c).empty());
    return resolve(c);
  };
  CHECK(vit("2.1.0").attention == Attention::Sdpa);
  CHECK(vit("2.0").attention == Attention::Sdpa);
  CHECK(vit("1.13").attention == Attention::Eager);
  CHECK(vit("2.0").origin[static_cast<size_t>(Switch::Attention)].kind == Origin::Kind::Version);
  // A program without attention_code keeps transformers' rule (HF's ViT program).
  Config hf_vit;
  REQUIRE(apply_setting(hf_vit, "model.architecture=vit").empty());
  REQUIRE(apply_setting(hf_vit, "versions.torch=2.1.0").empty());
  CHECK(resolve(hf_vit).attention == Attention::Eager);
  // A program names the transformers release whose class for its family supports SDPA: ViT's in 4.41 (#30555),
  // CLIP's in 4.43 (#31940), DINOv2's in 4.45 (#33403); transformers' 4.36 is no longer taken for them.
  auto hf = [](const char* program, const char* transformers) {
    Config c;
    REQUIRE(apply_setting(c, std::string("model.architecture=") + program).empty());
    REQUIRE(apply_setting(c, std::string("versions.transformers=") + transformers).empty());
    REQUIRE(apply_setting(c, "versions.torch=2.3").empty());
    return resolve(c).attention;
  };
  CHECK(hf("vit", "4.40") == Attention::Eager);
  CHECK(hf("vit", "4.41") == Attention::Sdpa);
  CHECK(hf("clip_vision", "4.42") == Attention::Eager);
  CHECK(hf("clip_vision", "4.43") == Attention::Sdpa);
  CHECK(hf("dinov2", "4.44") == Attention::Eager);
  CHECK(hf("dinov2", "4.45") == Attention::Sdpa);
  // An explicit value still wins.
  Config explicit_eager;
  REQUIRE(apply_setting(explicit_eager, "model.architecture=vit_torchvision").empty());
  REQUIRE(apply_setting(explicit_eager, "training.attention=eager").empty());
  CHECK(resolve(explicit_eager).attention == Attention::Eager);

  // Qwen-1 (model_type qwen, remote code): flash-attn's kernels when flash-attn is stated, else SDPA with its own
  // mask on torch 2, the materialised scores before; its loss is its own in every transformers version.
  ValidationCase qwen;
  std::vector<FieldError> errors;
  REQUIRE(parse_validation_case(read_file(source_path("tests/validation/cases/qwen1-readme-1_8b-lora-s2048.json")), qwen, errors));
  Config q = qwen.config;
  q.training.attention = "auto";
  q.training.loss = "auto";
  CHECK(resolve(q).attention == Attention::FlashAttention2);
  CHECK(resolve(q).loss == LossImpl::HfShift);  // 16-bit logits and a shifted copy, as transformers before 4.31
  q.versions.flash_attn = "latest";  // unstated: an optional package memsim does not assume
  CHECK(resolve(q).attention == Attention::Sdpa);
  CHECK(resolve(q).mask.build != MaskBuild::None);  // the model's own mask reaches SDPA
  q.versions.transformers = "latest";
  CHECK(resolve(q).mask.build != MaskBuild::None);  // whatever the transformers version
  q.training.framework = "megatron";  // Megatron runs its own model code, not modeling_qwen.py
  CHECK(resolve(q).attention != Attention::Sdpa);
  q.training.framework = "hf_trainer";
  q.versions.torch = "1.13";
  CHECK(resolve(q).attention == Attention::Eager);
  // A bad attention_code names the key and what it allows.
  Config bad;
  const std::string program = std::string(builtin_architecture("vit_torchvision"));
  std::string edited = program;
  edited.replace(edited.find("\"torch_sdpa\""), 12, "\"flash\"");
  REQUIRE(apply_setting(bad, "model.architecture=" + edited).empty());
  const auto problems = validate(bad);
  REQUIRE(!problems.empty());
  CHECK(problems[0].message.find("attention_code") != std::string::npos);
  Config bad_since;
  std::string since = std::string(builtin_architecture("vit"));
  since.replace(since.find("\"4.41\""), 6, "\"soon\"");
  REQUIRE(apply_setting(bad_since, "model.architecture=" + since).empty());
  const auto since_problems = validate(bad_since);
  REQUIRE(!since_problems.empty());
  CHECK(since_problems[0].message.find("transformers_sdpa_since") != std::string::npos);
}

TEST_CASE("versions: transformers' loss path", "[versions]") {
  CHECK(with({"versions.transformers=4.30.2"}).loss == LossImpl::HfShift);
  CHECK(with({"versions.transformers=4.31"}).loss == LossImpl::HfFp32Logits);
  CHECK(with({"versions.transformers=4.45.2"}).loss == LossImpl::HfFp32Logits);
  CHECK(with({"versions.transformers=4.46"}).loss == LossImpl::HfShiftFp32);
  CHECK(with({"versions.transformers=4.48.3"}).loss == LossImpl::HfShiftFp32);
  CHECK(with({"versions.transformers=4.49"}).loss == LossImpl::HfFp32Upcast);
  // A classification head has no causal-LM loss: the switch does not apply and names no version.
  Config bert = single_gpu_config("bert-large-uncased.json", 4, 512);
  bert.versions.transformers = "4.31";
  CHECK(!switch_applies(bert, resolve(bert), Switch::Loss));
  CHECK(!has_note(notes_of(bert), "training.loss"));
}

TEST_CASE("frameworks: the rules that belong to one framework are flags of its spec, not comparisons of its id", "[versions]") {
  for (const auto& f : frameworks()) {
    INFO(f.id);
    CHECK(f.torchtune_recipes == (f.id == "torchtune"));
    CHECK(f.hf_trainer_loop == (f.id == "hf_trainer" || f.id == "unsloth"));
    CHECK(f.unsloth_kernels == (f.id == "unsloth"));
    CHECK(f.compiles_loss == (f.id == "torchtitan"));
    CHECK(f.adapters_in_model_dtype == (f.id == "torchtune" || f.id == "litgpt"));
    CHECK(f.selective_recompute == (f.id == "megatron"));
    CHECK(f.cp_rotate == (f.id == "torchtitan" ? "allgather" : "alltoall"));
  }
}

TEST_CASE("versions: torchtune's loss and optimizer by its release", "[versions]") {
  CHECK(with({"versions.torchtune=0.2.1"}, "torchtune").loss == LossImpl::FullFp32);
  CHECK(with({"versions.torchtune=0.3.0"}, "torchtune").loss == LossImpl::ChunkedFp32);
  CHECK(with({"versions.torchtune=0.3.1"}, "torchtune").optimizer_impl == OptimizerImpl::Foreach);
  CHECK(with({"versions.torchtune=0.4.0"}, "torchtune").optimizer_impl == OptimizerImpl::Fused);
}

TEST_CASE("versions: torchtitan compiles its loss with the model from PR #1033 (taken from torch 2.7)", "[versions]") {
  const Resolved eager = with({"training.compile=true", "versions.torch=2.6", "parallel.sharding=fsdp2"}, "torchtitan");
  CHECK(eager.loss == LossImpl::FullFp32);
  const Resolved compiled = with({"training.compile=true", "versions.torch=2.7", "parallel.sharding=fsdp2"}, "torchtitan");
  CHECK(compiled.loss == LossImpl::ChunkedFp32);
  CHECK(compiled.loss_chunks == 1);
  CHECK(with({"training.compile=true", "versions.date=2025-06"}, "torchtitan").loss == LossImpl::ChunkedFp32);
  CHECK(with({"training.compile=true", "versions.date=2024-12"}, "torchtitan").loss == LossImpl::FullFp32);
  // A nightly's date beats its version number: 2.7.0a0 of February 2025 predates the PR.
  CHECK(with({"training.compile=true", "versions.torch=2.7.0a0", "versions.date=2025-02-28"}, "torchtitan").loss ==
        LossImpl::FullFp32);
  CHECK(with({"versions.torch=2.7"}, "torchtitan").loss == LossImpl::FullFp32);  // without compile nothing is compiled
  CHECK(with({"training.compile=true"}, "torchtune").loss_chunks == 8);          // torchtune's own chunks stay
}

TEST_CASE("versions: Unsloth's loss, checkpointing buffers and allocator by its release", "[versions]") {
  const char* qlora[] = {"peft.method=lora", "peft.base_quantization=nf4", "peft.prepare_kbit=false", "parallel.zero_stage=0"};
  auto unsloth = [&](const char* version, std::initializer_list<const char*> more = {}) {
    Config c;
    c.training.framework = "unsloth";
    for (const char* s : qlora) REQUIRE(apply_setting(c, s).empty());
    REQUIRE(apply_setting(c, std::string("versions.unsloth=") + version).empty());
    for (const char* s : more) REQUIRE(apply_setting(c, s).empty());
    REQUIRE(validate(c).empty());
    return resolve(c);
  };
  // The loss (docs/research/unsloth.md 2b): materialised logits, CCE from 2024.12 (above 1024 tokens from 2025.1),
  // unsloth_fused_ce_loss from 2025.8 (above 1024 tokens until 2025.11).
  CHECK(unsloth("2024.11").loss == LossImpl::UnslothLogits);
  CHECK(unsloth("2024.12").loss == LossImpl::CutCrossEntropy);
  CHECK(unsloth("2024.12").unsloth_logits_max_tokens == 0);
  CHECK(unsloth("2025.1").unsloth_logits_max_tokens == 1024);
  CHECK(unsloth("2025.7.3").loss == LossImpl::CutCrossEntropy);
  CHECK(unsloth("2025.8").loss == LossImpl::UnslothFusedCe);
  CHECK(unsloth("2025.10").unsloth_logits_max_tokens == 1024);
  CHECK(unsloth("2025.11").unsloth_logits_max_tokens == 0);
  CHECK(unsloth("2025.10", {"training.loss=unsloth_fused_ce"}).unsloth_logits_max_tokens == 0);  // a loss set by hand
  CHECK(unsloth("latest").loss == LossImpl::UnslothFusedCe);
  // Checkpointing: the offloaded checkpointer up to 2025.2, the smart one with its GPU buffer from 2025.3, double
  // buffering from 2026.6; the dequantization buffer from 2025.2.
  CHECK(unsloth("2025.2").unsloth_gc == UnslothGc::Offload);
  CHECK(unsloth("2025.3").unsloth_gc == UnslothGc::Smart);
  CHECK(unsloth("2026.6").unsloth_gc == UnslothGc::SmartDouble);
  CHECK(!unsloth("2025.1").unsloth_weight_buffer);
  CHECK(unsloth("2025.2").unsloth_weight_buffer);
  // A date picks the month's release: 2025-03-10 is still 2025.2 (each month's releases dated on its last day).
  CHECK(unsloth("latest", {"versions.date=2025-03-10"}).unsloth_gc == UnslothGc::Offload);
  CHECK(unsloth("latest", {"versions.date=2025-04-01"}).unsloth_gc == UnslothGc::Smart);
  // `import unsloth` sets expandable segments from unsloth#249 (2024-03), with torch >= 2.2.
  CHECK(!unsloth("2024.3").expandable_segments);
  CHECK(unsloth("2024.4", {"versions.torch=2.2"}).expandable_segments);
  CHECK(!unsloth("2024.8", {"versions.torch=2.1.2"}).expandable_segments);
  // The HF Trainer's optim default follows transformers under Unsloth too (TRL's SFTTrainer is a Trainer).
  CHECK(unsloth("2024.8", {"versions.transformers=4.31"}).optimizer_impl == OptimizerImpl::ForLoop);
}

TEST_CASE("versions: bitsandbytes, peft and the HF Trainer's empty_cache", "[versions]") {
  // bitsandbytes#1270: MatMul4Bit kept its input until 0.43.2; only where the 4-bit layers are bitsandbytes'.
  CHECK(with({"versions.bitsandbytes=0.43.1"}).bnb_saves_input);
  CHECK(!with({"versions.bitsandbytes=0.43.2"}).bnb_saves_input);
  CHECK(with({"versions.bitsandbytes=0.42"}, "litgpt").bnb_saves_input);
  CHECK(!with({"versions.bitsandbytes=0.42"}, "torchtune").bnb_saves_input);  // torchao's NF4Tensor
  // PEFT's adapters: fp32 before 0.6 and from 0.12, the base's float dtype in between, fp32 over a quantized base.
  auto adapters = [](const char* peft, const char* precision, const char* quant = "none") {
    return with({"peft.method=lora", (std::string("versions.peft=") + peft).c_str(),
                 (std::string("training.precision=") + precision).c_str(),
                 (std::string("peft.base_quantization=") + quant).c_str(), "parallel.zero_stage=0",
                 "parallel.data_parallel_size=1"})
        .adapter_dtype;
  };
  CHECK(adapters("0.5.0", "bf16_pure") == AdapterDtype::Fp32);
  CHECK(adapters("0.6.0", "bf16_pure") == AdapterDtype::Bf16);
  CHECK(adapters("0.11.1", "fp16_mixed") == AdapterDtype::Fp16);
  CHECK(adapters("0.11.1", "amp_bf16") == AdapterDtype::Fp32);  // fp32 weights under autocast
  CHECK(adapters("0.7.1", "bf16_pure", "nf4") == AdapterDtype::Fp32);
  CHECK(adapters("0.12.0", "bf16_pure") == AdapterDtype::Fp32);
  // The cast was LoRA's update_layer: prompt embeddings stay in the fp32 they are created in.
  CHECK(with({"peft.method=prompt_tuning", "versions.peft=0.7", "training.precision=bf16_pure",
              "parallel.zero_stage=0", "parallel.data_parallel_size=1"})
            .adapter_dtype == AdapterDtype::Fp32);
  // transformers 4.41's Trainer emptied the cache at every step (transformers#28769 until #31530 in 4.42).
  CHECK(with({"versions.transformers=4.40.2"}).empty_cache_steps == 0);
  CHECK(with({"versions.transformers=4.41.0"}).empty_cache_steps == 1);
  CHECK(with({"versions.transformers=4.41.2"}).empty_cache_steps == 1);
  CHECK(with({"versions.transformers=4.42"}).empty_cache_steps == 0);
  CHECK(with({"versions.transformers=4.41.2"}, "hf_loop").empty_cache_steps == 0);  // the Trainer's, not the model's
}

// docs/versions.md 8: transformers' gradient checkpointing was reentrant by default in every 4.x and is
// non-reentrant from 5.0 (#43203); frameworks with their own checkpointing keep theirs.
TEST_CASE("versions: use_reentrant follows transformers 5.0 for transformers' model code", "[versions]") {
  CHECK(with({"versions.transformers=4.57.1"}).checkpoint_reentrant);
  CHECK(!with({"versions.transformers=5.0.0"}).checkpoint_reentrant);
  CHECK(!with({}).checkpoint_reentrant);  // latest
  CHECK(with({"versions.transformers=4.57.1"}).origin_of(Switch::CheckpointReentrant).kind == Origin::Kind::Version);
  CHECK(!with({"versions.transformers=4.57.1"}, "torchtune").checkpoint_reentrant);
}

TEST_CASE("versions: an explicit value beats the version", "[versions]") {
  const Resolved r = with({"versions.torch=1.10", "versions.transformers=4.31", "versions.bitsandbytes=0.41",
                           "versions.peft=0.7", "training.softmax_saves_input=false", "training.zero_grad_set_to_none=true",
                           "training.optimizer_impl=fused", "training.attention=flash_attention_2",
                           "training.loss=hf_fp32_upcast", "peft.bnb_saves_input=false", "peft.adapter_dtype=bf16",
                           "hardware.cuda_module_loading=lazy", "hardware.expandable_segments=true",
                           "training.empty_cache_steps=0", "training.checkpoint_reentrant=false",
                           "peft.prepare_kbit=true"});
  CHECK(!r.softmax_saves_input);
  CHECK(r.zero_grad_set_to_none);
  CHECK(r.optimizer_impl == OptimizerImpl::Fused);
  CHECK(r.attention == Attention::FlashAttention2);
  CHECK(r.loss == LossImpl::HfFp32Upcast);
  CHECK(!r.bnb_saves_input);
  CHECK(r.adapter_dtype == AdapterDtype::Bf16);
  CHECK(r.lazy_module_loading);
  CHECK(r.expandable_segments);
  CHECK(r.empty_cache_steps == 0);
  CHECK(!r.checkpoint_reentrant);
  CHECK(r.prepare_kbit);
  for (size_t i = 0; i < kSwitchCount; ++i) CHECK(r.origin[i].kind == Origin::Kind::Explicit);
  // And on torchtitan an explicit false beats its launcher.
  CHECK(!with({"hardware.expandable_segments=false"}, "torchtitan").expandable_segments);
}

TEST_CASE("versions: the result's notes say which version set which switch", "[versions]") {
  Config c = single_gpu_config("llama-3.2-1b.json", 1, 512);
  c.training.attention = "auto";
  {  // every version latest: no switch is named in a note (other notes, such as the band's, may be there)
    const auto latest = notes_of(c);
    for (size_t i = 0; i < kSwitchCount; ++i) CHECK(!has_note(latest, std::string(switch_field(Switch(i))) + ":"));
  }
  c.versions.torch = "1.10";
  c.versions.transformers = "4.31";
  auto notes = notes_of(c);
  CHECK(has_note(notes, "training.softmax_saves_input: true, from torch 1.10.0: softmax and log_softmax kept their "
                        "input until pytorch#66018, in 1.11"));
  CHECK(has_note(notes, "training.zero_grad_set_to_none: false, from torch 1.10.0: "));
  CHECK(has_note(notes, "training.optimizer_impl: for_loop, from transformers 4.31.0: "));
  CHECK(has_note(notes, "training.attention: eager, from transformers 4.31.0 and torch 1.10.0: "));
  CHECK(has_note(notes, "training.loss: hf_fp32_logits, from transformers 4.31.0: "));
  CHECK(!has_note(notes, "peft."));  // no adapters, no 4-bit base: nothing of theirs applies
  // An explicit value is the user's: no note for it.
  c.training.softmax_saves_input = "true";
  CHECK(!has_note(notes_of(c), "training.softmax_saves_input"));
  // A date names itself.
  Config d = single_gpu_config("llama-3.2-1b.json", 1, 512);
  d.versions.date = "2023-10";
  CHECK(has_note(notes_of(d), "training.loss: hf_fp32_logits, from transformers 4.33.0 (current at versions.date "
                              "2023-10-01): "));
}

TEST_CASE("versions: schema-1 configs and links keep their exact meaning", "[versions][serialize]") {
  // Schema 1 wrote the switches as booleans and meant its fixed defaults where a given section left them out.
  Parsed p = config_from_json(R"({"schema": 1, "training": {"framework": "torchtitan", "softmax_saves_input": true},
                                  "peft": {"method": "lora"}, "hardware": {"gpu": "h100-sxm"}})");
  REQUIRE(p.ok);
  CHECK(p.config.training.softmax_saves_input == "true");
  CHECK(p.config.training.zero_grad_set_to_none == "true");
  CHECK(p.config.training.empty_cache_steps == 0);
  CHECK(p.config.peft.adapter_dtype == "fp32");
  CHECK(p.config.peft.bnb_saves_input == "false");
  CHECK(p.config.hardware.cuda_module_loading == "lazy");
  CHECK(p.config.hardware.expandable_segments == "false");  // schema 1's default, not torchtitan's launcher
  CHECK(!resolve(p.config).expandable_segments);
  // Written again it is a schema-2 config that means the same.
  Parsed again = config_from_json(config_to_json(p.config));
  REQUIRE(again.ok);
  CHECK(again.config == p.config);
  // The same config at schema 2 leaves the launcher's choice to auto.
  Parsed now = config_from_json(R"({"schema": 2, "training": {"framework": "torchtitan"}})");
  REQUIRE(now.ok);
  CHECK(resolve(now.config).expandable_segments);
  // A section a schema-1 config leaves out keeps the base's values, as it always did.
  Config base;
  base.training.softmax_saves_input = "auto";
  base.versions.torch = "1.10";
  Parsed model_only = config_from_json(R"({"schema": 1, "model": {"hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "vocab_size": 100, "intermediate_size": 128}})", base);
  REQUIRE(model_only.ok);
  CHECK(model_only.config.training == base.training);
  // A link's booleans ("true", or "1" as Reader::boolean took them) and its missing keys, schema 1's defaults.
  Parsed link = config_from_fragment("schema=1&training.zero_grad_set_to_none=0&peft.bnb_saves_input=1");
  REQUIRE(link.ok);
  CHECK(link.config.training.zero_grad_set_to_none == "false");
  CHECK(link.config.peft.bnb_saves_input == "true");
  CHECK(link.config.training.softmax_saves_input == "false");
  CHECK(link.config.hardware.expandable_segments == "false");
  CHECK(link.config.peft.adapter_dtype == "fp32");
  // A schema-2 link round-trips with its versions.
  Config v2;
  v2.versions.torch = "2.1.2+cu121";
  v2.versions.date = "2024-01";
  v2.training.empty_cache_steps = kEmptyCacheAuto;
  Parsed back = config_from_fragment(config_to_fragment(v2));
  REQUIRE(back.ok);
  CHECK(back.config == v2);
  // JSON booleans are still read for the switches at schema 2.
  Parsed b = config_from_json(R"({"schema": 2, "hardware": {"expandable_segments": true}})");
  REQUIRE(b.ok);
  CHECK(b.config.hardware.expandable_segments == "true");
}

TEST_CASE("versions: the schema-1 golden JSON and link resolve alike, as schema 1's defaults did", "[versions][serialize]") {
  Parsed a = config_from_json(read_file(source_path("tests/golden/v1.json")));
  Parsed b = config_from_fragment(read_file(source_path("tests/golden/v1.fragment")));
  REQUIRE(a.ok);
  REQUIRE(b.ok);
  const Resolved ra = resolve(a.config), rb = resolve(b.config);
  for (size_t i = 0; i < kSwitchCount; ++i) {
    INFO(switch_field(Switch(i)));
    CHECK(switch_value(ra, Switch(i)) == switch_value(rb, Switch(i)));
  }
  CHECK(!ra.softmax_saves_input);
  CHECK(ra.zero_grad_set_to_none);
  CHECK(!ra.expandable_segments);
}

// The loss paths of transformers before 4.49 (docs/versions.md 6a, "Memory consequences"):
// a loss-dominated step (128k vocabulary, 2048 tokens, a 1B model with LoRA and full checkpointing), whose peak is in
// the loss. T x V x 2 bytes is one compute-dtype copy of the logits. Tolerances cover the allocator's rounding of
// the last block of a segment (up to 1 MiB each side).
TEST_CASE("versions: the HF loss paths keep what each transformers version kept", "[versions][activations]") {
  auto peak = [](const char* framework, const char* loss) {
    Config c = single_gpu_config("llama-3.2-1b.json", 1, 2048);
    c.training.framework = framework;
    c.training.loss = loss;
    c.training.activation_checkpointing = "full";
    c.peft.method = "lora";
    const Result r = simulate(c);
    REQUIRE(r.ok);
    return r.devices[0].peak.allocated_bytes;
  };
  const int64_t tv2 = int64_t{2048} * 128256 * 2;
  const int64_t slack = int64_t{4} << 20;
  // The Trainer drops the outputs before backward. 4.49+: bf16 logits + fp32 upcast + fp32 log-softmax in forward,
  // nll and log_softmax gradients beside the log-softmax in backward: 12 bytes per logit at the peak.
  const int64_t upcast = peak("hf_trainer", "hf_fp32_upcast");
  // 4.31-4.45: fp32 logits + fp32 shifted copy + fp32 log-softmax = 12 as well: the same peak.
  CHECK(std::abs(peak("hf_trainer", "hf_fp32_logits") - upcast) <= slack);
  // 4.46-4.48: the outputs' bf16 logits stay beside the loss's fp32 upcast and shifted copy: 14.
  CHECK(std::abs(peak("hf_trainer", "hf_shift_fp32") - upcast - tv2) <= slack);
  // Before 4.31, pure bf16: logits, shifted copy and log-softmax all bf16: 6 instead of 12.
  CHECK(std::abs(peak("hf_trainer", "hf_shift") - upcast + 3 * tv2) <= slack);
  // A plain loop holds the outputs through backward: fp32 logits in 4.31-4.45 instead of bf16 ones.
  CHECK(std::abs(peak("hf_loop", "hf_fp32_logits") - peak("hf_loop", "hf_fp32_upcast") - tv2) <= slack);
}


TEST_CASE("versions: torch 2.0's foreach AdamW keeps a second list of intermediates (pytorch#104898, 2.1)", "[versions]") {
  Config c = single_gpu_config("llama-3.2-1b.json", 1, 256);
  c.training.framework = "hf_loop";  // torch.optim.AdamW with torch's default
  c.training.precision = "bf16_mixed";
  auto temporaries = [&](const char* torch) {
    Config v = c;
    REQUIRE(apply_setting(v, std::string("versions.torch=") + torch).empty());
    REQUIRE(validate(v).empty());
    REQUIRE(resolve(v).optimizer_impl == OptimizerImpl::Foreach);
    const Result r = simulate(v);
    REQUIRE(r.ok);
    return std::pair{peak_live_in_phase(r.devices[0].program, "optimizer step 2", Component::Temporaries), r.notes};
  };
  const auto [two, notes_20] = temporaries("2.0.1");
  const auto [one, notes_21] = temporaries("2.1.0");
  // One list is exp_avg_sq.sqrt() of every trainable tensor in its fp32 state dtype; 2.0 adds denom beside it.
  CHECK(one > 0);
  CHECK(two == 2 * one);
  CHECK(has_note(notes_20, "optimizer: torch.optim's foreach Adam/AdamW keeps two full-size intermediates"));
  CHECK(!has_note(notes_21, "optimizer: torch.optim's foreach"));
  // latest (no version stated) is today's behaviour: one list.
  CHECK(!resolve(c).foreach_keeps_denom);
}

TEST_CASE("versions: a nightly build stands for the newest release before its build date", "[versions]") {
  // torch 2.1.0.dev20230623 (the nightly rasbt/pytorch-memory-optim's logs print) predates pytorch#104780 and #104898
  // (2023-07-07 and -10), which made foreach Adam's and AdamW's denom in place: it keeps the second list, as 2.0 does.
  CHECK(with({"versions.torch=2.1.0.dev20230623"}).foreach_keeps_denom);
  CHECK(with({"versions.torch=2.1.0.dev20230623+cu118"}).foreach_keeps_denom);
  CHECK_FALSE(with({"versions.torch=2.1.0"}).foreach_keeps_denom);
  CHECK_FALSE(with({"versions.torch=2.2.0.dev20231015"}).foreach_keeps_denom);  // after 2.1.0's release
  // A 2.2 nightly from before 2.1.0's release is built after 2.1's branch cut: it reads as 2.1, not two releases back.
  CHECK_FALSE(with({"versions.torch=2.2.0.dev20230915"}).foreach_keeps_denom);
  // A dev build without a date (transformers from main, "4.46.0.dev0") stands for its release, as before.
  CHECK_FALSE(with({"versions.torch=2.1.0.dev0"}).foreach_keeps_denom);
  CHECK_FALSE(with({"versions.torch=2.1.0.dev20231399"}).foreach_keeps_denom);  // not a day: no date read
  Config c;
  REQUIRE(apply_setting(c, "versions.torch=2.1.0.dev20230623").empty());
  CHECK(describe_version(stack_versions(c.versions), Library::Torch).find("nightly build of 2023-06-23") != std::string::npos);
  // zero_grad's place is torch's optimizer's: DeepSpeed's engine clears its gradient buffers itself, so it is ignored
  // there (a note says so), and What helps' moves to ZeRO stay open to a Lightning loop.
  Config ds;
  ds.training.zero_grad_at = "before_backward";
  ds.parallel.zero_stage = 2;
  ds.parallel.data_parallel_size = 2;
  REQUIRE(validate(ds).empty());
  CHECK_FALSE(resolve(ds).zero_grad_before_backward);
  CHECK(has_note(notes_of(ds), "training.zero_grad_at before_backward: no effect here"));
  ds.parallel.zero_stage = 0;
  ds.parallel.data_parallel_size = 1;
  CHECK(resolve(ds).zero_grad_before_backward);
}
