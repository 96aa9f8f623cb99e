// Mamba-2 as a model program (mamba2, tools/programs/mamba2.py; docs/research/mamba2.md) and the ops it brought
// (cast, ssd_mixer: mamba_ssm's fused conv1d, SSD scan, gated norm and out_proj): exact counts, one layer's saved
// set in closed form in pure bf16 and under autocast, the ledger, bad input.
#include <catch2/catch.hpp>

#include "core/architecture.h"
#include "core/model.h"
#include "core/simulate.h"
#include "core/validate.h"
#include "test_programs.h"
#include "test_util.h"

using namespace memsim;

namespace {

// mamba2-130m's shapes (d 768, 24 layers, 24 heads of 64, one group, state 128, tied), full fine-tuning in pure bf16.
const std::string k130m = "vocab_size=50288,hidden_size=768,num_hidden_layers=24,num_heads=24,n_groups=1,tie_word_embeddings=1";

Config mamba(const std::string& args = k130m) { return language_program_config("mamba2", args); }

int64_t per_layer(Config c) {
  auto at = [&](int layers) {
    Config x = c;
    x.model.architecture_args += ",num_hidden_layers=" + std::to_string(layers);
    INFO(errors_of(x));
    REQUIRE(validate(x).empty());
    return activations_before_backward(x);
  };
  return at(3) - at(2);
}

}  // namespace

TEST_CASE("mamba2: exact counts of state-spaces' releases and Codestral Mamba", "[architecture][mamba2]") {
  // docs/research/mamba2.md section 2: per layer d (2 di + 2 g N + H) + (K + 1)(di + 2 g N) + 3 H + di + di d + d,
  // the padded vocabulary (50,288) tied to the head. 130m: 3,765,320 x 24 + 50,288 x 768 + 768.
  auto count = [](const std::string& args) { return model_shape_of(mamba(args).model).params_total; };
  CHECK(count(k130m) == 128989632);
  CHECK(count("vocab_size=50288,hidden_size=1024,num_hidden_layers=48,num_heads=32,n_groups=1,tie_word_embeddings=1") == 368346624);
  CHECK(count("vocab_size=50288,hidden_size=2560,num_hidden_layers=64,num_heads=80,n_groups=1,tie_word_embeddings=1") == 2702599680);
  // The program's defaults are Mamba2Config's, Codestral Mamba 7B's: eight groups, 32,768 tokens, untied.
  CHECK(count("") == 7285403648);
}

TEST_CASE("mamba2: one layer's saved set in closed form, in pure bf16 and under autocast", "[architecture][mamba2]") {
  const int64_t b = 2, L = 512, d = 768, H = 24, g = 1, N = 128, T = b * L;
  Config c = mamba();
  c.model.architecture_args += ",sequence_length=512";
  // bf16 weights (mamba2.md section 4): the norm's fp32 copy of its bf16 input 4d, rstd 4 and the normalized cast
  // the weight's gradient reads 2d; in_proj's input 2d; the fused mixer's zxbcdt 2 (2 di + 2 g N + H), out_x 2 di and
  // rstd 4 g. With di = 2d: 20d + 4gN + 2H + 4g + 4 a token. (The fp32 stream between layers is saved by nothing.)
  CHECK(per_layer(c) == T * (20 * d + 4 * g * N + 2 * H + 4 * g + 4));
  // fp32 weights under autocast: the norm keeps the fp32 stream itself 4d and its fp32 product 4d, in_proj its
  // autocast copy 2d: 22d + 4gN + 2H + 4g + 4.
  c.training.precision = "amp_bf16";
  CHECK(per_layer(c) == T * (22 * d + 4 * g * N + 2 * H + 4 * g + 4));
}

TEST_CASE("mamba2: the shifted fp32 logits are copied before transformers 4.49, not after", "[architecture][mamba2]") {
  // Mamba2ForCausalLM at 4.46 shifts logits[..., :-1, :].contiguous(); ForCausalLMLoss from 4.49 shifts the labels.
  Config c = mamba();
  c.model.architecture_args += ",sequence_length=256";
  const int64_t fp32_logits = 4 * 2 * 256 * 50288;
  auto copies = [&](const std::string& transformers) {
    Config x = c;
    x.versions.transformers = transformers;
    const Result r = simulate(x);
    REQUIRE(r.ok);
    const auto& p = r.devices[0].program;
    int64_t n = 0;
    for (const auto& t : p.tensors)
      if (t.bytes == fp32_logits && p.labels[t.label].rfind("head shifted", 0) == 0) ++n;  // (not its gradient)
    return n;
  };
  CHECK(copies("4.46") > 0);
  CHECK(copies("latest") == 0);
}

TEST_CASE("mamba2: the ledger holds, checkpointed, under LoRA and with accumulation", "[architecture][mamba2]") {
  Config c = mamba();
  c.model.architecture_args += ",sequence_length=1024";
  c.training.activation_checkpointing = "full";
  c.training.gradient_accumulation_steps = 2;
  for (const char* precision : {"bf16_pure", "amp_bf16"}) {
    c.training.precision = precision;
    const Result r = simulate(c);
    REQUIRE(r.ok);
    CHECK(ledger_problem(r.devices[0].program).empty());
  }
  c.peft.method = "lora";
  c.peft.target_modules = "in_proj";
  INFO(errors_of(c));
  REQUIRE(validate(c).empty());
  const Result r = simulate(c);
  REQUIRE(r.ok);
  CHECK(ledger_problem(r.devices[0].program).empty());
}

TEST_CASE("mamba2: the fused kernel's own weights: no adapter, no quantization, no autocast cache", "[architecture][mamba2]") {
  Config c = mamba();
  c.peft.method = "lora";
  c.peft.target_modules = "out_proj";
  CHECK(errors_of(c).find("peft.target_modules: peft.target_modules names \"out_proj\", which Mamba-2's fused kernel") == 0);
  // all-linear is in_proj and lm_head's; an NF4 base quantizes in_proj only (out_proj kept, as llm_int8_skip_modules).
  c.peft.target_modules = "all-linear";
  c.peft.base_quantization = "nf4";
  ModelShape s = model_shape_of(c.model);
  apply_peft(s, c.peft, false);
  for (const auto& t : s.layer) {
    INFO(t.name);
    const bool out_proj = t.name.find("out_proj.weight") != std::string::npos && t.name.find("lora") == std::string::npos;
    if (out_proj) CHECK(!t.quantized);
    if (t.name.find("in_proj.weight") != std::string::npos && t.name.find("lora") == std::string::npos) CHECK(t.quantized);
    CHECK(t.name.find("out_proj.lora") == std::string::npos);
    CHECK(t.name.find("conv1d.lora") == std::string::npos);
  }
  // training.sequence_length is the built-in families': the program says its tokens itself.
  Config seq = mamba();
  seq.training.sequence_length = 8192;
  CHECK(errors_of(seq).find("training.sequence_length: training.sequence_length is the built-in families'") == 0);
}

TEST_CASE("mamba2: bad shapes get a field error", "[architecture][mamba2]") {
  // Groups that do not divide the heads.
  CHECK(first_error("mamba2", "n_groups=3").find("ssd_mixer's groups (3) must divide its heads (128)") != std::string::npos);
  // in_proj's width disagreeing with the mixer's heads (an edited program).
  CHECK(first_error(program_edited("mamba2", [](auto& j) { j["block"]["ops"][4]["heads"] = 64; }))
            .find("ssd_mixer reads in_proj's output of") != std::string::npos);
  CHECK(first_error(program_edited("mamba2", [](auto& j) { j["block"]["ops"][0]["dtype"] = "fp8"; }))
            .find("must be fp32, compute") != std::string::npos);
  CHECK(first_error("mamba2", "conv_kernel=5").find("causal_conv1d's kernels take widths 2 to 4") != std::string::npos);
  CHECK(first_error("mamba2", "hidden_size=2048").find("num_heads x head_dim = expand x hidden_size") != std::string::npos);
}
