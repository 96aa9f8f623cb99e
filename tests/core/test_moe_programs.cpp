// The moe op (a mixture of experts' routed part: transformers 5's sigmoid router and grouped_mm experts) and the
// program it came for, Nemotron-3-Nano (nemotron3_nano; tools/programs/nemotron_h.py, docs/research/nemotron3-moe.md):
// the exact count, the layer pattern, which linears PEFT reaches, the saved set in closed form, the ledger, the
// import and bad input.
#include <catch2/catch.hpp>

#include <string>

#include "core/architecture.h"
#include "core/model.h"
#include "core/serialize.h"
#include "core/simulate.h"
#include "core/validate.h"
#include "test_programs.h"
#include "test_util.h"

using namespace memsim;

namespace {

const char* kNanoPattern = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME";

// A small Nemotron-3-Nano with the released pattern: d 256, 4 heads of 64 with 2 kv heads, 8 Mamba heads of 64 in 2
// groups, state 16; 8 experts of width 128, 2 a token, a shared expert of 256; 1,000 tokens, 128 tokens a sample.
const std::string kSmall = "vocab_size=1000,hidden_size=256,num_attention_heads=4,num_key_value_heads=2,attention_head_dim=64,"
                           "mamba_num_heads=8,mamba_head_dim=64,n_groups=2,ssm_state_size=16,chunk_size=64,"
                           "n_routed_experts=8,num_experts_per_tok=2,moe_intermediate_size=128,"
                           "moe_shared_expert_intermediate_size=256,sequence_length=128";

Config nano(const std::string& args = kSmall) { return language_program_config("nemotron3_nano", args); }

// kSmall (or `args`) with one of its arguments set to another value.
std::string small_with(const std::string& key, int64_t value, std::string args = kSmall) {
  const size_t at = args.find(key + "=");
  const size_t end = args.find(',', at);
  return args.replace(at, end - at, key + "=" + std::to_string(value));
}

std::string pattern_of(const Architecture& a) {
  std::string p;
  for (int32_t k : a.kind_of_layer) {
    const std::string& name = a.block_names[static_cast<size_t>(k)];
    p += name == "mamba" ? 'M' : name == "attention" ? '*' : name == "moe" ? 'E' : '-';
  }
  return p;
}

}  // namespace

TEST_CASE("nemotron3_nano: the exact count, the layer pattern, and the linears PEFT reaches", "[architecture][moe]") {
  // docs/research/nemotron3-moe.md section 1.3: 23 Mamba-2 layers of 38,744,896, 6 attention layers of 23,399,040,
  // 23 MoE layers of 1,297,468,032 (128 experts' up and down 1,277,165,568, the shared expert 19,955,712, the router
  // 344,064, the norm), two untied 131,072 x 2,688 tables and norm_f: the Unsloth notebook's total less its LoRA.
  Config c = nano("");
  CHECK(model_shape_of(c.model).params_total == 23 * 38744896LL + 6 * 23399040LL + 23 * 1297468032LL + 2 * 352321536LL + 2688);
  CHECK(model_shape_of(c.model).params_total == 31577937344);
  std::shared_ptr<const Architecture> a;
  REQUIRE(decode_architecture("nemotron3_nano", "", a).empty());
  CHECK(pattern_of(*a) == kNanoPattern);
  CHECK(a->blocks.size() == 3);  // mamba, moe, attention: one parameter list each
  // The TRL notebook's adapter: r = 8 on q, k, v, o and up_proj, down_proj, which reach the 6 attention layers and
  // the 23 shared experts only; the routed experts are 3-D parameters (no nn.Linear): 3,289,088, the 13.2 MB of fp32
  // adapter_model.safetensors the notebook uploaded (section 3.5).
  c.peft.method = "lora";
  c.peft.lora_rank = 8;
  c.peft.target_modules = "q_proj,k_proj,v_proj,o_proj,up_proj,down_proj";
  c.training.micro_batch_size = 1;
  c.model.architecture_args = "sequence_length=128";
  INFO(errors_of(c));
  REQUIRE(validate(c).empty());
  const Result r = simulate(c);
  REQUIRE(r.ok);
  CHECK(r.params_trainable == 3289088);
  // The routed experts and the router are no modules PEFT can name.
  c.peft.target_modules = "experts";
  CHECK(errors_of(c).find("\"experts\", which this architecture lacks") != std::string::npos);
  c.peft.target_modules = "gate";
  CHECK(errors_of(c).find("\"gate\", which this architecture lacks") != std::string::npos);
}

TEST_CASE("moe: the routed part's saved set in closed form", "[architecture][moe]") {
  const int64_t T = 2 * 128, d = 256;
  // Full fine-tuning in pure bf16 (no autocast: the router's logits and sigmoid are fp32): with every weight training
  // the 23 MoE layers keep the pairs' gathered tokens [S, d] and the down GEMM's output [S, d], relu's output and the
  // square [S, f] (bf16), the sorted order and its inverse [S] int64, the top-k indices and weights [T, k] (int64 and
  // fp32), besides what does not depend on k or f (the sigmoid [T, E] fp32, x.float() [T, d] and the router
  // weight's fp32 copy). S = top_k x T.
  auto with = [&](int64_t k, int64_t f) {
    return activations_before_backward(nano(small_with("moe_intermediate_size", f, small_with("num_experts_per_tok", k))));
  };
  CHECK(with(2, 256) - with(2, 128) == 23 * (2 * 2) * (2 * T) * 128);
  CHECK(with(3, 128) - with(2, 128) == 23 * T * (2 * d + 2 * d + 2 * 2 * 128 + 16 + 12));
  // Under LoRA on the attention only, the routed part's weights are frozen: it keeps relu's output and the down
  // output, not the gathered tokens or the square; and the MoE layers before the first adapted attention layer (1 and
  // 3 of the pattern) see an input that needs no gradient and keep nothing.
  auto lora = [&](int64_t f) {
    Config c = nano(small_with("moe_intermediate_size", f));
    c.peft.method = "lora";
    c.peft.target_modules = "q_proj,k_proj,v_proj,o_proj";
    INFO(errors_of(c));
    REQUIRE(validate(c).empty());
    return activations_before_backward(c);
  };
  CHECK(lora(256) - lora(128) == 21 * 2 * (2 * T) * 128);
  // ... and a wider top_k adds its sorted order, relu's output and the down output per pair, not the gathered
  // tokens (up_proj is frozen), nor the square (down_proj is).
  auto lora_k = [&](int64_t k) {
    Config c = nano(small_with("num_experts_per_tok", k));
    c.peft.method = "lora";
    c.peft.target_modules = "q_proj,k_proj,v_proj,o_proj";
    return activations_before_backward(c);
  };
  CHECK(lora_k(3) - lora_k(2) == 21 * T * (2 * d + 2 * 128 + 16 + 12));
  // Under autocast over fp32 weights the experts run in fp32 (_grouped_mm casts its input to the weights' dtype;
  // grouped_mm is not autocast-enabled): relu's output and the square, 4 bytes an element.
  auto amp = [&](int64_t f) {
    Config c = nano(small_with("moe_intermediate_size", f));
    c.training.precision = "amp_bf16";
    return activations_before_backward(c);
  };
  CHECK(amp(256) - amp(128) == 23 * (2 * 4) * (2 * T) * 128);
}

TEST_CASE("moe: modules_to_save reaches the router, not the 3-D expert stacks", "[architecture][moe]") {
  // PEFT's ModulesToSaveWrapper wraps modules: "gate" is the router (NemotronHTopkRouter), which then trains and
  // keeps its input's fp32 copy (x.float(), 4 bytes a token and unit of width, in each of the 23 MoE layers);
  // "up_proj" is the shared expert's nn.Linear, never the experts' up_proj stack, a parameter.
  Config c = nano();
  c.peft.method = "lora";
  c.peft.target_modules = "q_proj,k_proj,v_proj,o_proj";
  const int64_t base = activations_before_backward(c);
  const int64_t trainable = simulate(c).params_trainable;
  c.peft.modules_to_save = "gate";
  INFO(errors_of(c));
  REQUIRE(validate(c).empty());
  CHECK(simulate(c).params_trainable == trainable + 23 * 8 * 256);
  const int64_t T = 2 * 128, d = 256;
  CHECK(activations_before_backward(c) - base >= 23 * 4 * T * d);
  c.peft.modules_to_save = "up_proj";
  CHECK(simulate(c).params_trainable == trainable + 23 * 256 * 256);
}

TEST_CASE("moe: the ledger holds, checkpointed, under autocast and LoRA", "[architecture][moe]") {
  Config c = nano();
  c.training.gradient_accumulation_steps = 2;
  for (const char* checkpointing : {"none", "full"})
    for (const char* precision : {"bf16_pure", "amp_bf16", "bf16_autocast", "fp32"}) {
      c.training.activation_checkpointing = checkpointing;
      c.training.precision = precision;
      INFO(checkpointing << " " << precision);
      const Result r = simulate(c);
      REQUIRE(r.ok);
      CHECK(ledger_problem(r.devices[0].program).empty());
    }
  c.training.precision = "bf16_autocast";
  c.peft.method = "lora";
  c.peft.target_modules = "q_proj,k_proj,v_proj,o_proj,up_proj,down_proj";
  c.peft.base_quantization = "nf4";  // bitsandbytes replaces nn.Linear only: the experts and the router stay bf16
  INFO(errors_of(c));
  REQUIRE(validate(c).empty());
  const Result r = simulate(c);
  REQUIRE(r.ok);
  CHECK(ledger_problem(r.devices[0].program).empty());
  ModelShape shape = model_shape_of(c.model);
  apply_peft(shape, c.peft, false);
  int moe_tensors = 0, shared = 0;
  for (const auto& t : shape.params_of(1))  // layer 1: the first MoE layer
    if (t.name.find(".experts.") != std::string::npos || t.name.find(".gate.weight") != std::string::npos) {
      ++moe_tensors;
      CHECK(!t.quantized);
    } else if (t.name.ends_with("shared_experts.up_proj.weight")) {
      ++shared;
      CHECK(t.quantized);
    }
  CHECK(moe_tensors == 3);
  CHECK(shared == 1);
}

TEST_CASE("nemotron3_nano: its config.json imports by its pattern, and a bad moe op gets a field error", "[architecture][moe]") {
  const std::string config = R"({"model_type": "nemotron_h", "hidden_size": 2688, "num_hidden_layers": 52,
      "hybrid_override_pattern": "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME", "num_attention_heads": 32,
      "num_key_value_heads": 2, "head_dim": 128, "intermediate_size": 1856, "mlp_hidden_act": "relu2",
      "mamba_num_heads": 64, "mamba_head_dim": 64, "n_groups": 8, "ssm_state_size": 128, "conv_kernel": 4,
      "chunk_size": 128, "vocab_size": 131072, "tie_word_embeddings": false, "residual_in_fp32": false,
      "n_routed_experts": 128, "num_experts_per_tok": 6, "moe_intermediate_size": 1856,
      "moe_shared_expert_intermediate_size": 3712, "n_group": 1, "topk_group": 1, "norm_topk_prob": true,
      "routed_scaling_factor": 2.5})";
  const Parsed p = model_from_hf_json(config);
  INFO((p.errors.empty() ? std::string() : p.errors.front().message));
  REQUIRE(p.ok);
  CHECK(p.config.model.architecture == "nemotron3_nano");
  CHECK(model_shape_of(p.config.model).params_total == 31577937344);
  // A latent projection (Nemotron-3 Super's) is another program.
  nlohmann::json j = nlohmann::json::parse(config);
  j["moe_latent_size"] = 1024;
  CHECK(!model_from_hf_json(j.dump()).ok);
  // More experts a token than there are.
  CHECK(first_error("nemotron3_nano", "num_experts_per_tok=129").find("moe's top_k (129) must be at most its experts (128)") != std::string::npos);
  auto edited = [](auto&& edit) { return first_error(program_edited("nemotron3_nano", edit)); };
  CHECK(edited([](auto& j) {
          for (auto& op : j["blocks"][1]["ops"])
            if (op["op"] == "moe") op.erase("top_k");
        }).find("top_k") != std::string::npos);
}
