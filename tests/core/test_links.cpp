// Short links (README "Links"): round trips of random configs, cut and altered links refused, what chat clients
// append ignored, every shipped link still opening with its meaning, and the frozen data they rest on.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "core/architecture.h"
#include "core/catalog.h"
#include "core/serialize.h"
#include "random_config.h"
#include "test_util.h"

using namespace memsim;
using memsim_test::pick;
using memsim_test::random_config;

namespace {

// A random config as people share them: a catalogue model now and then (as picked, or changed after), names with
// the characters a link must encode, stated versions, a data section.
Config random_shared_config(std::mt19937_64& rng) {
  Config c = random_config(rng);
  const auto& presets = model_presets();
  if (rng() % 3 == 0) {
    c.model = presets[rng() % presets.size()].model;
    if (rng() % 2) c.model.num_hidden_layers = 1 + static_cast<int64_t>(rng() % 8);
  }
  c.model.name = pick(rng, std::vector<std::string>{"", "Llama 3.1 8B", "my model (v2) & co: 100% \"tiny\" #1",
                                                    "a+b=c/d,e;f?g!", "Ünïcødé 模型 — ok", "trailing dot.", " spaced "});
  if (rng() % 3 == 0) c.versions.torch = pick(rng, std::vector<std::string>{"2.1.2+cu121", "1.10", "2.4"});
  if (rng() % 4 == 0) c.versions.date = "2024-01";
  if (rng() % 4 == 0) {
    c.data.lengths = "samples";
    c.data.sample_lengths = pick(rng, std::vector<std::string>{"p0=12,p50=310,p90=720,p100=2048", "0-256:40,256-512:35"});
    c.data.dataset_samples = 52000;
  }
  if (rng() % 5 == 0) c.hardware.headroom_fraction = 0.125;
  return c;
}

std::string file_text(const std::string& rel) {
  std::string s = read_file(source_path(rel));
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

// The links of the README's typical setups, built as the page builds them (a catalogue preset, then settings).
Config qlora_70b() {
  Config c;
  c.model = find_model_preset("llama-3.1-70b")->model;
  c.training.framework = "hf_trainer";
  c.training.micro_batch_size = 1;
  c.training.sequence_length = 2048;
  c.training.gradient_accumulation_steps = 16;
  c.peft.method = "lora";
  c.peft.base_quantization = "nf4";
  c.peft.double_quantization = true;
  c.peft.target_modules = "all-linear";
  c.peft.lora_rank = 16;
  c.peft.lora_alpha = 32;
  c.parallel.data_parallel_size = 1;
  c.parallel.zero_stage = 0;
  c.hardware.gpu = "h100-sxm";
  return c;
}

Config layout_405b() {
  Config c;
  c.model = find_model_preset("llama-3.1-405b")->model;
  c.training.framework = "megatron";
  c.training.precision = "bf16_fp32_grads";
  c.training.micro_batch_size = 1;
  c.training.sequence_length = 8192;
  c.training.gradient_accumulation_steps = 32;
  c.training.activation_checkpointing = "selective";
  c.parallel.data_parallel_size = 4;
  c.parallel.zero_stage = 1;
  c.parallel.tensor_parallel_size = 8;
  c.parallel.sequence_parallel = true;
  c.parallel.pipeline_parallel_size = 16;
  c.parallel.pipeline_schedule = "interleaved_1f1b";
  c.hardware.gpu = "h100-sxm";
  return c;
}

bool refused_as(const std::string& link, const std::string& needle, const Config& base) {
  Parsed p = config_from_fragment(link, base);
  INFO(link.substr(0, 160));
  if (p.ok) return false;
  INFO(p.errors[0].message);
  CHECK(p.config == base);
  return p.errors[0].message.find(needle) != std::string::npos;
}

}  // namespace

TEST_CASE("links: 400 random configs survive the short link exactly, and the full form too", "[links]") {
  std::mt19937_64 rng(20261201);
  size_t longest = 0;
  for (int i = 0; i < 400; ++i) {
    const Config c = random_shared_config(rng);
    const std::string link = config_to_fragment(c);
    INFO("config " << i << ": " << link);
    REQUIRE(link.rfind("memsim=3&", 0) == 0);
    REQUIRE(link.find("&c=") == link.size() - 9);
    Parsed back = config_from_fragment(link);
    INFO((back.errors.empty() ? "" : back.errors[0].message));
    REQUIRE(back.ok);
    CHECK(back.config == c);
    Parsed full = config_from_fragment(config_to_full_fragment(c));
    REQUIRE(full.ok);
    CHECK(full.config == c);
    // Only characters that chat clients keep inside a link: no quotes, brackets, spaces or '#'.
    CHECK(link.find_first_of(" \"'<>()[]{}#|\\^`") == std::string::npos);
    longest = std::max(longest, link.size());
  }
  CHECK(longest < 1200);  // every field of a random config differs from the defaults now and then
}

TEST_CASE("links: every simulated catalogue preset is in the frozen table, so its link names it", "[links]") {
  // A preset missing from tests/golden/v3.presets.json is written field by field (230 characters for a CLIP tower
  // where its id takes 45): tools/links/freeze_presets.py appends the new ones.
  const auto frozen = nlohmann::json::parse(read_file(source_path("tests/golden/v3.presets.json")));
  std::string missing;
  for (const auto& preset : model_presets())
    if (preset.supported && !frozen.contains(preset.id)) missing += " " + preset.id;
  INFO("run tools/links/freeze_presets.py build/native/memsim-cli; missing:" << missing);
  CHECK(missing.empty());
}

TEST_CASE("links: the default setup is its marker and checksum, a catalogue model is its id", "[links]") {
  const std::string def = config_to_fragment(Config{});
  CHECK(def.size() == std::string("memsim=3&c=123456").size());
  CHECK(def.rfind("memsim=3&c=", 0) == 0);
  // A model picked from the catalogue is written as its id alone, wherever the catalogue still equals the frozen
  // table (tests/golden/v3.presets.json; a corrected preset is written as the frozen one plus its corrections).
  const auto frozen = nlohmann::json::parse(read_file(source_path("tests/golden/v3.presets.json")));
  int named = 0;
  for (const auto& preset : model_presets()) {
    Config c;
    c.model = preset.model;
    const std::string link = config_to_fragment(c);
    INFO(preset.id << ": " << link);
    Parsed back = config_from_fragment(link);
    REQUIRE(back.ok);
    CHECK(back.config == c);
    if (!frozen.contains(preset.id)) continue;
    Parsed by_id = config_from_fragment("schema=3&model=" + preset.id);
    REQUIRE(by_id.ok);
    if (by_id.config.model != preset.model) continue;
    // The id, unless the fields it stands for are shorter still (a preset that is the default model but for its name).
    const std::string by_name = "memsim=3&model=" + preset.id + "&c=";
    CHECK((link.rfind(by_name, 0) == 0 || link.size() <= by_name.size() + 6));
    ++named;
  }
  CHECK(named > 0);
}

TEST_CASE("links: typical setups link in well under 400 characters, with names people can read", "[links]") {
  // 400 characters for the whole link, of which a page's address (https://someone.github.io/memsim/#) takes ~35.
  const std::string qlora = config_to_fragment(qlora_70b());
  const std::string layout = config_to_fragment(layout_405b());
  INFO(qlora);
  INFO(layout);
  CHECK(qlora.size() <= 360);
  CHECK(layout.size() <= 360);
  for (const char* part : {"model=llama-3.1-70b&", "framework=hf_trainer", "method=lora", "base_quantization=nf4",
                           "target_modules=all-linear", "gpu=h100-sxm"})
    CHECK(qlora.find(part) != std::string::npos);
  for (const char* part : {"model=llama-3.1-405b&", "tensor_parallel_size=8", "pipeline_parallel_size=16",
                           "pipeline_schedule=interleaved_1f1b", "data_parallel_size=4"})
    CHECK(layout.find(part) != std::string::npos);
  CHECK(qlora.find('%') == std::string::npos);
  CHECK(layout.find('%') == std::string::npos);
}

TEST_CASE("links: a program's arguments edited from its preset's are written as the ones set", "[links]") {
  // Whisper large-v3's eleven arguments with the labels' length set: the link carries that one argument.
  Config whisper;
  whisper.model = find_model_preset("whisper-large-v3")->model;
  const std::string preset_args = whisper.model.architecture_args;
  whisper.model.architecture_args = set_architecture_arg(preset_args, "target_length", 128, 448);
  const std::string link = config_to_fragment(whisper);
  INFO(link);
  CHECK(link.rfind("memsim=3&model=whisper-large-v3&architecture_args~=target_length=128&c=", 0) == 0);
  Parsed back = config_from_fragment(link);
  REQUIRE(back.ok);
  CHECK(back.config == whisper);
  // Several set at once, as the page sets them (each moved to the end); a vision tower's arguments alike.
  Config edited = whisper;
  edited.model.architecture_args = set_architecture_arg(set_architecture_arg(preset_args, "decoder_layers", 2, 32), "target_length", 64, 448);
  const std::string two = config_to_fragment(edited);
  INFO(two);
  CHECK(two.find("architecture_args~=decoder_layers=2,target_length=64&") != std::string::npos);
  Parsed two_back = config_from_fragment(two);
  REQUIRE(two_back.ok);
  CHECK(two_back.config == edited);
  Config vlm;
  vlm.model = find_model_preset("qwen2.5-vl-7b")->model;
  vlm.model.vision_tower_args += ",image_height=1080";
  const std::string tower = config_to_fragment(vlm);
  INFO(tower);
  CHECK(tower.find("vision_tower_args~=image_height=1080&") != std::string::npos);
  Parsed tower_back = config_from_fragment(tower);
  REQUIRE(tower_back.ok);
  CHECK(tower_back.config == vlm);
  // An argument back at the program's default is taken out of the list: "k=".
  Config removed = whisper;
  removed.model.architecture_args = preset_args.substr(preset_args.find(',') + 1);
  const std::string out = config_to_fragment(removed);
  INFO(out);
  CHECK(out.find("architecture_args~=vocab_size=&") != std::string::npos);
  Parsed out_back = config_from_fragment(out);
  REQUIRE(out_back.ok);
  CHECK(out_back.config == removed);
  // A list reordered by hand: what follows the first moved argument is set again.
  Config reordered = whisper;
  reordered.model.architecture_args = "num_mel_bins=128,vocab_size=51866" + preset_args.substr(preset_args.find(",d_model"));
  const std::string whole = config_to_fragment(reordered);
  INFO(whole);
  CHECK(whole.size() <= config_to_full_fragment(reordered).size());
  Parsed whole_back = config_from_fragment(whole);
  REQUIRE(whole_back.ok);
  CHECK(whole_back.config == reordered);
  // Over the defaults (no preset): a program picked by name, its arguments written whole.
  Config program;
  program.model.architecture = "mamba2";
  program.model.architecture_args = "sequence_length=4096";
  Parsed program_back = config_from_fragment(config_to_fragment(program));
  REQUIRE(program_back.ok);
  CHECK(program_back.config == program);
  // A hand-edited link whose settings are not k=v is a field error, not a crash.
  Parsed bad = config_from_fragment("schema=2&model=whisper-large-v3&architecture_args~=target_length");
  REQUIRE(bad.ok == false);
  CHECK(bad.errors.front().message.find("each setting is name=value") != std::string::npos);
  // Settings before the model=ID whose list they change, or over a list that is not name=value, are refused.
  Parsed early = config_from_fragment("schema=2&architecture_args~=target_length=64&model=whisper-large-v3");
  REQUIRE(early.ok == false);
  CHECK(early.errors.front().message.find("before model=") != std::string::npos);
  Parsed over = config_from_fragment("schema=2&model=whisper-large-v3&architecture_args=oops&architecture_args~=target_length=64");
  REQUIRE(over.ok == false);
  CHECK(over.errors.front().message.find("not a list of name=value") != std::string::npos);
}

TEST_CASE("links: a short link cut anywhere, at a field boundary or inside a field, is refused", "[links]") {
  Config base;
  base.training.micro_batch_size = 3;  // the setup on the page, which a refused link keeps
  std::mt19937_64 rng(7);
  std::vector<Config> configs = {Config{}, qlora_70b(), layout_405b()};
  for (int i = 0; i < 6; ++i) configs.push_back(random_shared_config(rng));
  for (const Config& c : configs) {
    const std::string link = config_to_fragment(c);
    for (size_t cut = 1; cut < link.size(); ++cut) {
      const std::string part = link.substr(0, cut);
      // At a field boundary (before or after the '&') the checksum is missing; inside the checksum it differs.
      const bool boundary = link[cut] == '&' || link[cut - 1] == '&';
      Parsed p = config_from_fragment(part, base);
      INFO(part);
      REQUIRE(!p.ok);
      CHECK(p.config == base);
      REQUIRE(!p.errors.empty());
      CHECK(p.errors[0].message.find("incomplete") != std::string::npos);
      if (boundary) CHECK(p.errors[0].message.find("cut off in chat") != std::string::npos);
    }
  }
}

TEST_CASE("links: an altered short link is refused, the same content encoded otherwise is not", "[links]") {
  const Config c = qlora_70b();
  const std::string link = config_to_fragment(c);
  auto altered = [&](const std::string& from, const std::string& to) {
    std::string s = link;
    const size_t at = s.find(from);
    REQUIRE(at != std::string::npos);
    return s.replace(at, from.size(), to);
  };
  const Config base;
  CHECK(refused_as(altered("micro_batch_size=1", "micro_batch_size=2"), "checksum mismatch", base));
  CHECK(refused_as(altered("gpu=h100-sxm&", ""), "checksum mismatch", base));
  CHECK(refused_as(altered("memsim=3", "memsim=3&zero_stage=3"), "checksum mismatch", base));
  CHECK(refused_as(link.substr(0, link.size() - 1) + (link.back() == 'z' ? "y" : "z"), "checksum mismatch", base));
  CHECK(refused_as(link + "&c=000000", "checksum mismatch", base));  // the checksum must end the link
  // The checksum sees the decoded content: a character percent-encoded on its way, or an upper-case checksum, opens.
  std::string upper = link;
  for (size_t i = upper.size() - 6; i < upper.size(); ++i)
    upper[i] = static_cast<char>(std::toupper(static_cast<unsigned char>(upper[i])));
  for (const std::string& same : {altered("all-linear", "all%2Dlinear"), altered("h100-sxm", "h100%2dsxm"), upper}) {
    Parsed p = config_from_fragment(same);
    INFO(same);
    REQUIRE(p.ok);
    CHECK(p.config == c);
  }
  // A newer memsim's link, a version no memsim wrote, an unknown model id: refused with what is wrong.
  CHECK(refused_as("memsim=4&c=000000", "newer memsim", base));
  CHECK(refused_as("memsim=1&c=000000", "begin at memsim=2", base));
  CHECK(refused_as("schema=2&model=llama-9", "does not know", base));
  CHECK(refused_as("schema=2&hidden_sizes=1", "unknown key", base));
}

TEST_CASE("links: what chat clients append to a link, and a whole URL, are ignored", "[links]") {
  const Config c = layout_405b();
  const std::string link = config_to_fragment(c);
  for (const std::string tail : {".", ",", ";", ":", "!", "?", ")", "]", ">", "'", "\"", ").", "\").", "'>,", "!?",
                                 "\n", " \r\n", "%22", "%3E.", "\xE2\x80\x9D", "%E2%80%99", ".)]>'\"!?;:,"}) {
    for (const std::string& head : {std::string(""), std::string("#"), std::string("https://example.org/memsim/#"),
                                    std::string("  http://127.0.0.1:8080/#")}) {
      Parsed p = config_from_fragment(head + link + tail);
      INFO(head + link + tail);
      INFO((p.errors.empty() ? "" : p.errors[0].message));
      REQUIRE(p.ok);
      CHECK(p.config == c);
    }
  }
  CHECK(link_fragment("https://host/x/#memsim=2&c=abcdef).") == "memsim=2&c=abcdef");
  // The same for a link of the full form (which has no checksum): its last value loses only what was appended.
  Config v;
  v.versions.date = "2024-01";
  Parsed full = config_from_fragment("https://host/#" + config_to_full_fragment(v) + ").");
  REQUIRE(full.ok);
  CHECK(full.config == v);
  // A URL without its fragment, and a link cut inside its first item, are named for what they are.
  CHECK(refused_as("https://example.org/memsim/", "no '#' part", Config{}));
  CHECK(refused_as("https://example.org/memsim/#mems", "incomplete", Config{}));
  CHECK(refused_as("#memsim=", "incomplete", Config{}));
}

TEST_CASE("links: every shipped link opens with its meaning", "[links][golden]") {
  // The full form of schema 1 and 2 (every field; test_serialize.cpp decodes tests/golden/vN.fragment too).
  Parsed v2 = config_from_json(read_file(source_path("tests/golden/v2.expected.json")));
  REQUIRE(v2.ok);
  Parsed full = config_from_fragment(file_text("tests/golden/v2.fragment"));
  REQUIRE(full.ok);
  CHECK(full.config == v2.config);
  // The short links that have shipped: the same schema-2 golden config, and a preset changed after it was picked.
  Parsed s = config_from_fragment(file_text("tests/golden/v2.short.fragment"));
  INFO((s.errors.empty() ? "" : s.errors[0].message));
  REQUIRE(s.ok);
  CHECK(s.config == v2.config);
  Parsed preset_expected = config_from_json(read_file(source_path("tests/golden/v2.short-preset.expected.json")));
  REQUIRE(preset_expected.ok);
  Parsed preset = config_from_fragment(file_text("tests/golden/v2.short-preset.fragment"));
  REQUIRE(preset.ok);
  CHECK(preset.config == preset_expected.config);
  CHECK(preset.config.model.num_hidden_layers == 16);
  // Schema 3's short link: TRL's QLoRA with peft.prepare_kbit at auto.
  Parsed v3 = config_from_json(read_file(source_path("tests/golden/v3.expected.json")));
  REQUIRE(v3.ok);
  Parsed s3 = config_from_fragment(file_text("tests/golden/v3.short.fragment"));
  REQUIRE(s3.ok);
  CHECK(s3.config == v3.config);
  CHECK(s3.config.peft.prepare_kbit == "auto");
  // Partial links of the full form, as people wrote them by hand: the fields they leave out are the schema's defaults
  // (schema 1's switches were fixed values: training.zero_grad_set_to_none true, ... as migrate_1_to_2 writes them).
  Parsed two = config_from_fragment("schema=2&training.micro_batch_size=2&parallel.zero_stage=2");
  REQUIRE(two.ok);
  Config want;
  want.training.micro_batch_size = 2;
  want.parallel.zero_stage = 2;
  CHECK(two.config == want);
  // Schema 2's peft.prepare_kbit, a boolean that defaulted to true, stays true where the cast does something (schema 3
  // made it a switch with auto); where it cannot (no method, or no base it casts) auto gives the same result.
  Parsed cast = config_from_fragment("schema=2&peft.method=lora&peft.base_quantization=nf4");
  REQUIRE(cast.ok);
  CHECK(cast.config.peft.prepare_kbit == "true");
  CHECK(s.config.peft.prepare_kbit == "true");
  Parsed one = config_from_fragment("schema=1&training.micro_batch_size=2&parallel.zero_stage=2");
  REQUIRE(one.ok);
  want.training.zero_grad_set_to_none = "true";
  want.training.softmax_saves_input = "false";
  want.training.empty_cache_steps = 0;
  want.peft.adapter_dtype = "fp32";
  want.peft.bnb_saves_input = "false";
  want.hardware.cuda_module_loading = "lazy";
  want.hardware.expandable_segments = "false";
  CHECK(one.config == want);
}

TEST_CASE("links: the frozen defaults and presets that short links rest on", "[links][golden]") {
  using nlohmann::json;
  const std::vector<std::string> keys = field_keys();
  // The current schema's frozen defaults name every field (a field added later is added to this file with the
  // default that keeps old links' meaning; its other values never change), and their bare names are unique, so
  // that a short link can write hidden_size for model.hidden_size.
  for (int schema = 1; schema <= kConfigSchema; ++schema) {
    const json d = json::parse(read_file(source_path("tests/golden/v" + std::to_string(schema) + ".defaults.json")));
    CHECK(d.at("schema") == schema);
    std::set<std::string> file_keys, names;
    for (auto sec = d.begin(); sec != d.end(); ++sec)
      if (sec->is_object())
        for (auto f = sec->begin(); f != sec->end(); ++f) {
          file_keys.insert(sec.key() + "." + f.key());
          INFO(f.key());
          CHECK(names.insert(f.key()).second);
        }
    for (const auto& k : file_keys) CHECK(std::find(keys.begin(), keys.end(), k) != keys.end());
    if (schema == kConfigSchema) CHECK(file_keys == std::set<std::string>(keys.begin(), keys.end()));
    CHECK(config_from_fragment("schema=" + std::to_string(schema)).ok);
  }
  // Today the code's defaults are schema 3's frozen ones, so the page opens on the shortest link. (Should a default
  // change, this is the check that fails: old links keep their meaning through the frozen file, never edited; the
  // page's new default setup then links with the changed fields.)
  CHECK(config_from_fragment("schema=3").config == Config{});
  // Every frozen preset opens, and sets model fields only.
  const json presets = json::parse(read_file(source_path("tests/golden/v3.presets.json")));
  CHECK(presets.size() >= 50);
  for (auto it = presets.begin(); it != presets.end(); ++it) {
    INFO(it.key());
    Parsed p = config_from_fragment("schema=3&model=" + it.key());
    REQUIRE(p.ok);
    Config c = p.config;
    c.model = Config{}.model;
    CHECK(c == Config{});
    CHECK(p.config.model.name == it->at("name").get<std::string>());
  }
}

TEST_CASE("links: --set and hand-written links take bare names where one field has the name", "[links]") {
  Config c;
  CHECK(apply_setting(c, "hidden_size=4096").empty());
  CHECK(c.model.hidden_size == 4096);
  CHECK(apply_setting(c, "method=lora").empty());
  CHECK(c.peft.method == "lora");
  auto e = apply_setting(c, "micro_batch_size=many");
  REQUIRE(e.size() == 1);
  CHECK(e[0].field == "training.micro_batch_size");  // errors name the full key
  Parsed p = config_from_fragment("schema=2&model=gpt2&num_hidden_layers=3&micro_batch_size=2");
  REQUIRE(p.ok);
  CHECK(p.config.model.model_type == "gpt2");
  CHECK(p.config.model.num_hidden_layers == 3);
  CHECK(p.config.training.micro_batch_size == 2);
}
