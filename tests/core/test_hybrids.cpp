// The hybrids as model programs: Nemotron-H (nemotron_h, nemotron_h_47b, nemotron_h_56b; tools/programs/nemotron_h.py)
// and Bamba (bamba; tools/programs/bamba.py), docs/research/nemotron-h.md, and what they brought: blocks that run an
// earlier kind again ("same_as": the layer pattern with one parameter list per kind), grouped-query attention (the
// attention op's kv_heads) and transformers' rotary embedding (rotary's variant transformers, partial). Exact counts,
// the patterns, closed forms, the repeated k and v by version, the import, bad input.
#include <catch2/catch.hpp>

#include <algorithm>

#include "core/architecture.h"
#include "core/serialize.h"
#include "core/model.h"
#include "core/simulate.h"
#include "core/validate.h"
#include "test_programs.h"
#include "test_util.h"

using namespace memsim;

namespace {

// A small Nemotron-H with the 8B's pattern: d 256, 4 heads of 64 with 2 kv heads, ffn 512, 8 Mamba heads of 64 in
// 2 groups, state 16, 1,000 tokens, 128 tokens a sample.
const std::string kSmall = "vocab_size=1000,hidden_size=256,num_attention_heads=4,num_key_value_heads=2,attention_head_dim=64,"
                           "intermediate_size=512,mamba_num_heads=8,mamba_head_dim=64,n_groups=2,ssm_state_size=16,"
                           "chunk_size=64,sequence_length=128";

Config nemotron(const std::string& args = kSmall) { return language_program_config("nemotron_h", args); }

std::string pattern_of(const char* program) {
  std::shared_ptr<const Architecture> a;
  REQUIRE(decode_architecture(program, "", a).empty());
  std::string p;
  for (int32_t k : a->kind_of_layer) {
    const std::string& name = a->block_names[static_cast<size_t>(k)];
    p += name == "mamba" ? 'M' : name == "attention" ? '*' : '-';
  }
  CHECK(a->blocks.size() == 3);  // three kinds, three parameter lists, however long the pattern
  return p;
}

}  // namespace

TEST_CASE("nemotron_h: exact counts and each release's layer pattern", "[architecture][nemotron_h]") {
  // docs/research/nemotron-h.md section 1.3, the 8B: 24 Mamba-2 layers of 109,640,064, 4 attention layers of
  // 41,947,136, 24 MLP layers of 176,164,864, two untied 131,072 x 4,096 tables and norm_f.
  auto count = [](const char* program, const std::string& args) {
    Config c = nemotron(args);
    c.model.architecture = program;
    return model_shape_of(c.model).params_total;
  };
  CHECK(count("nemotron_h", "") == 24 * 109640064LL + 4 * 41947136LL + 24 * 176164864LL + 2 * 536870912LL + 4096);
  CHECK(count("nemotron_h", "") == 8100852736);
  CHECK(count("nemotron_h", "hidden_size=3072,mamba_num_heads=112,intermediate_size=12288") == 4489223040);
  CHECK(count("nemotron_h_47b", "") == 46791554816);
  CHECK(count("nemotron_h_56b", "") == 56324350464);
  // hybrid_override_pattern, one character a layer, kept in order by same_as entries.
  CHECK(pattern_of("nemotron_h") == "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-");
  CHECK(pattern_of("nemotron_h_47b") == "M-M-M-M-M-M-M-M-M*-M-M-M-M-M-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-M-M---MM---M-M*-M-M-M-M-M-");
  CHECK(pattern_of("nemotron_h_56b") ==
        "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-");
}

TEST_CASE("programs: the hyperparameters an op reads as a flag are its switches (the page's checkboxes)", "[architecture][nemotron_h]") {
  std::shared_ptr<const Architecture> a;
  REQUIRE(decode_architecture("nemotron_h", "", a).empty());
  std::vector<std::string> switches = a->switches;
  std::sort(switches.begin(), switches.end());
  CHECK(switches == std::vector<std::string>{"attention_bias", "mlp_bias", "tie_word_embeddings", "use_bias", "use_conv_bias"});
  // A "when" flag too: FLUX.1's models kept on the GPU.
  REQUIRE(decode_architecture("flux_dit", "", a).empty());
  CHECK(std::find(a->switches.begin(), a->switches.end(), "vae_on_gpu") != a->switches.end());
  CHECK(std::find(a->switches.begin(), a->switches.end(), "height") == a->switches.end());
}

TEST_CASE("nemotron_h: the MLP and attention layers' saved sets in closed form", "[architecture][nemotron_h]") {
  const int64_t T = 2 * 128;
  // MLP layers (24 of them) in pure bf16: the norm's fp32 copy 4d, rstd 4 and normalized cast 2d, up_proj's input 2d,
  // relu's output 2f (square reads it too), down_proj's input, the square, 2f. A wider ffn adds 4 bytes a token per
  // unit per MLP layer.
  auto with_ffn = [&](int64_t f) { return activations_before_backward(nemotron(kSmall + ",intermediate_size=" + std::to_string(f))); };
  CHECK(with_ffn(1024) - with_ffn(512) == 24 * T * 4 * 512);
  // Attention layers (4): before enable_gqa (transformers < 4.56) repeat_kv copies k and v for every query head and
  // SDPA saves the copies in their place: 2 x (heads - kv_heads) x head_dim more bf16 elements a token a layer.
  Config old = nemotron(), recent = nemotron();
  old.versions.transformers = "4.46.0";
  recent.versions.transformers = "4.57.0";
  CHECK(activations_before_backward(old) - activations_before_backward(recent) == 4 * T * 2 * (4 - 2) * 64 * 2);
  // In fp32, SDPA with enable_gqa falls back to the math kernel, which saves the fp32 softmax: 4 layers x 4 heads x
  // b x 128^2 x 4 bytes more than the flash path would keep (as the built-in layers model it).
  Config fp32 = recent;
  fp32.training.precision = "fp32";
  Config fp32_mha = fp32;
  fp32_mha.model.architecture_args += ",num_key_value_heads=4";
  CHECK(activations_before_backward(fp32) - activations_before_backward(fp32_mha) ==
        4 * 4 * 2 * 128 * 128 * 4 - 4 * T * 2 * (4 - 2) * 64 * 4);
  // Eager attention repeats them in every version, and keeps the scores' probabilities besides.
  Config eager = recent;
  eager.training.attention = "eager";
  CHECK(activations_before_backward(eager) > activations_before_backward(old));
}

TEST_CASE("nemotron_h: the ledger holds, checkpointed, under LoRA, with repeated k and v", "[architecture][nemotron_h]") {
  Config c = nemotron();
  c.training.activation_checkpointing = "full";
  c.training.gradient_accumulation_steps = 2;
  c.versions.transformers = "4.46.0";
  for (const char* precision : {"bf16_pure", "amp_bf16"}) {
    c.training.precision = precision;
    const Result r = simulate(c);
    REQUIRE(r.ok);
    CHECK(ledger_problem(r.devices[0].program).empty());
  }
  c.peft.method = "lora";  // the program's targets: q_proj, k_proj, v_proj, o_proj
  c.training.attention = "eager";
  INFO(errors_of(c));
  REQUIRE(validate(c).empty());
  const Result r = simulate(c);
  REQUIRE(r.ok);
  CHECK(ledger_problem(r.devices[0].program).empty());
  CHECK(r.params_trainable < r.params_total / 10);
  // The Mamba-2 layers' fused kernel reads out_proj itself: an adapter there is refused, as for Mamba-2.
  c.peft.target_modules = "out_proj";
  CHECK(errors_of(c).find("out_proj") != std::string::npos);
}

TEST_CASE("nemotron_h: an HF config.json imports by its layer pattern, and another pattern is refused", "[architecture][nemotron_h]") {
  const std::string eight = R"({"model_type": "nemotron_h", "hidden_size": 4096, "num_hidden_layers": 52,
      "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-", "num_attention_heads": 32,
      "num_key_value_heads": 8, "attention_head_dim": 128, "intermediate_size": 21504, "mlp_hidden_act": "relu2",
      "mamba_num_heads": 128, "mamba_head_dim": 64, "n_groups": 8, "ssm_state_size": 128, "conv_kernel": 4,
      "chunk_size": 128, "vocab_size": 131072, "tie_word_embeddings": false, "residual_in_fp32": false})";
  const Parsed p = model_from_hf_json(eight);
  REQUIRE(p.ok);
  CHECK(p.config.model.architecture == "nemotron_h");
  CHECK(model_shape_of(p.config.model).params_total == 8100852736);
  // The 56B's pattern picks its own program.
  nlohmann::json j = nlohmann::json::parse(eight);
  j["hybrid_override_pattern"] =
      "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-";
  const Parsed big = model_from_hf_json(j.dump());
  REQUIRE(big.ok);
  CHECK(big.config.model.architecture == "nemotron_h_56b");
  // A pattern no program has (a fine-tune that drops layers), or an fp32 residual: one error naming what each needs.
  j["hybrid_override_pattern"] = "M-M*-";
  const Parsed other = model_from_hf_json(j.dump());
  REQUIRE(!other.ok);
  CHECK(other.errors.front().field == "model.architecture");
  CHECK(other.errors.front().message.find("hybrid_override_pattern") != std::string::npos);
}

TEST_CASE("same_as and kv_heads: bad programs get a field error", "[architecture][nemotron_h]") {
  auto edited = [](auto&& edit) { return first_error(program_edited("nemotron_h", edit)); };
  // A kind that is not (yet) defined.
  CHECK(edited([](auto& j) { j["blocks"][1] = {{"same_as", "attention"}, {"repeat", 1}}; })
            .find("\"attention\" is not the name of an earlier entry of blocks") != std::string::npos);
  CHECK(edited([](auto& j) { j["blocks"][2] = {{"same_as", "mamba"}, {"repeat", 1}, {"ops", 1}}; })
            .find("is not a key of a same_as entry") != std::string::npos);
  CHECK(edited([](auto& j) { j["blocks"][2] = {{"same_as", 3}, {"repeat", 1}}; }).find("must name an earlier kind") != std::string::npos);
  CHECK(edited([](auto& j) { j["blocks"][2] = {{"same_as", "mamba"}}; }).find("is missing") != std::string::npos);
  // Kind names are unique: same_as finds a kind by its name.
  CHECK(edited([](auto& j) { j["blocks"][1]["name"] = "mamba"; }).find("\"mamba\" names an earlier kind of block") != std::string::npos);
  // A kind that makes a carry runs once.
  CHECK(edited([](auto& j) { j["blocks"][0]["carry"] = {"h"}; })
            .find("makes a carry, which only a kind that runs once may") != std::string::npos);
  // kv_heads must divide the heads and give k's width.
  CHECK(first_error("nemotron_h", "num_key_value_heads=3").find("kv_heads (3) must divide its heads (32)") != std::string::npos);
  CHECK(edited([](auto& j) {
          for (auto& op : j["blocks"][7]["ops"])
            if (op["op"] == "attention") op["kv_heads"] = 4;
        }).find("needs k 512 wide") != std::string::npos);
  // No crash and a field error on a shape the pattern cannot keep: a kind whose output is another width.
  CHECK(!edited([](auto& j) {
           for (auto& op : j["blocks"][1]["ops"])
             if (op["op"] == "linear" && op["name"] == "backbone.layers.mixer.down_proj") op["out_features"] = 64;
         }).empty());
}

namespace {

Config bamba(const std::string& args) {
  Config c = nemotron("");
  c.model.architecture = "bamba";
  c.model.architecture_args = args;
  return c;
}

// A small Bamba: d 256, 4 heads of 64 with 2 kv heads, rotary over 32 of each head's 64, ffn 512, 8 Mamba heads of
// 64 in one group, state 16, 1,000 tokens, 128 tokens a sample.
const std::string kSmallBamba = "vocab_size=1000,hidden_size=256,num_attention_heads=4,num_key_value_heads=2,attn_rotary_emb=32,"
                                "intermediate_size=512,mamba_n_heads=8,mamba_d_head=64,mamba_d_state=16,mamba_chunk_size=64,"
                                "sequence_length=128";

}  // namespace

TEST_CASE("bamba: the exact count, the attention layers' places", "[architecture][nemotron_h][bamba]") {
  // docs/research/nemotron-h.md section 2.3: 29 Mamba-2 layers of 278,455,936 (with their MLP and two norms), 3
  // attention layers of 218,112,000, two untied 128,256 x 4,096 tables and the final norm; the model card's 9.78B.
  CHECK(model_shape_of(bamba("").model).params_total == 29 * 278455936LL + 3 * 218112000LL + 2 * 525336576LL + 4096);
  CHECK(model_shape_of(bamba("").model).params_total == 9780235392);
  std::shared_ptr<const Architecture> a;
  REQUIRE(decode_architecture("bamba", "", a).empty());
  REQUIRE(a->kind_of_layer.size() == 32);
  for (size_t l = 0; l < 32; ++l) {
    INFO(l);
    CHECK((a->block_names[static_cast<size_t>(a->kind_of_layer[l])] == "attention") == (l == 9 || l == 18 || l == 27));
  }
}

TEST_CASE("bamba: transformers' rotary saves nothing of its own, and its dtype is the stream's", "[architecture][nemotron_h][bamba]") {
  // In pure bf16 the rotated q and k replace q and k in what SDPA saves: a partial or a full rotation saves the same.
  Config half = bamba(kSmallBamba), full = bamba(kSmallBamba + ",attn_rotary_emb=64");
  CHECK(activations_before_backward(half) == activations_before_backward(full));
  // Under autocast with fp32 weights, cos and sin are fp32 (the stream's dtype): the rotated q and k are fp32, and
  // the kernel reads and saves their compute-dtype casts instead, the same bytes; the ledger holds either way.
  for (const char* precision : {"bf16_pure", "amp_bf16"}) {
    Config c = half;
    c.training.precision = precision;
    c.training.activation_checkpointing = "full";
    c.versions.transformers = "4.48.0";
    INFO(precision << ": " << errors_of(c));
    REQUIRE(validate(c).empty());
    const Result r = simulate(c);
    REQUIRE(r.ok);
    CHECK(ledger_problem(r.devices[0].program).empty());
  }
  Config amp = half, amp_full = full;
  amp.training.precision = amp_full.training.precision = "amp_bf16";
  CHECK(activations_before_backward(amp) == activations_before_backward(amp_full));
  // Bad rotations are field errors; heads and rotary_dims belong to the transformers variant.
  CHECK(first_error(program_edited("bamba", [](auto& j) {
          for (auto& op : j["blocks"][1]["ops"])
            if (op["op"] == "rotary") op.erase("variant");
        })).find("add \"variant\": \"transformers\"") != std::string::npos);
  CHECK(first_error("bamba", "attn_rotary_emb=33").find("must be even and at most the head width 128") != std::string::npos);
  CHECK(first_error("bamba", "attn_rotary_emb=256").find("must be even and at most the head width 128") != std::string::npos);
}

TEST_CASE("bamba: an HF config.json imports with its attention layers, and another layout is refused", "[architecture][nemotron_h][bamba]") {
  nlohmann::json j = nlohmann::json::parse(R"({"model_type": "bamba", "hidden_size": 4096, "num_hidden_layers": 32,
      "attn_layer_indices": [9, 18, 27], "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
      "mamba_n_heads": 128, "mamba_d_head": 64, "mamba_d_state": 128, "mamba_n_groups": 1, "mamba_d_conv": 4,
      "mamba_expand": 2, "mamba_chunk_size": 256, "mamba_conv_bias": true, "mamba_proj_bias": false,
      "attn_rotary_emb": 64, "vocab_size": 128256, "tie_word_embeddings": false})");
  const Parsed p = model_from_hf_json(j.dump());
  REQUIRE(p.ok);
  CHECK(p.config.model.architecture == "bamba");
  CHECK(model_shape_of(p.config.model).params_total == 9780235392);
  j["attn_layer_indices"] = {4, 12};
  const Parsed other = model_from_hf_json(j.dump());
  REQUIRE(!other.ok);
  CHECK(other.errors.front().message.find("attn_layer_indices") != std::string::npos);
}
