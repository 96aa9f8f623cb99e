// Parameter-efficient fine-tuning: trainable counts, frozen storage, and what a frozen base saves.
#include <catch2/catch.hpp>

#include "core/checked.h"
#include "core/model.h"
#include "core/serialize.h"
#include "core/simulate.h"
#include "core/validate.h"
#include "test_util.h"

using namespace memsim;

static Config from_hf(const char* file) { return single_gpu_config(file); }

TEST_CASE("LoRA trainable parameter counts", "[peft]") {
  // Llama-2-7B, r = 8 on q and v: 32 layers x 2 x 8 x (4096 + 4096) = 4,194,304 (LoRA paper setup; the litgpt
  // and PEFT tables print the same count).
  Config c = from_hf("llama-2-7b.json");
  c.peft.method = "lora";
  c.peft.lora_rank = 8;
  c.peft.target_modules = "q_proj,v_proj";
  Result r = simulate(c);
  REQUIRE(r.ok);
  CHECK(r.params_trainable == 4194304);
  CHECK(r.params_total == 6738415616 + 4194304);
  // Llama-3-8B, r = 16 on all seven linears: 1,310,720 per layer, 41,943,040 (MEMORY_FORMULAS.md 4.1)
  Config d = from_hf("llama-3-8b.json");
  d.peft.method = "lora";
  d.peft.lora_rank = 16;
  d.peft.target_modules = "all-linear";
  r = simulate(d);
  REQUIRE(r.ok);
  CHECK(r.params_trainable == 41943040);
  // DoRA adds the magnitude vector (out_features) of every adapted linear: 32 x (4096 + 1024 + ... ).
  d.peft.method = "dora";
  r = simulate(d);
  CHECK(r.params_trainable == 41943040 + 32 * (4096 + 1024 + 1024 + 4096 + 14336 + 14336 + 4096));
}

TEST_CASE("LoRA on an encoder-decoder: PEFT's T5 targets q and v in every attention", "[peft][t5]") {
  // huggingface/peft README, getting started with bigscience/mt0-large (mT5-large shape; tests/data/hf/mt5-large.json
  // is google/mt5-large's config.json), LoraConfig(r=8) with the T5 default targets q and v:
  // "trainable params: 2359296 || all params: 1231940608". 24 encoder self-attentions and 24 decoder self- and
  // cross-attentions, two modules each, 8 x (1024 + 1024) per module.
  Config c = from_hf("mt5-large.json");
  c.training.sequence_length = 256;
  c.training.decoder_sequence_length = 16;
  c.training.attention = "auto";
  c.peft.method = "lora";
  c.peft.lora_rank = 8;
  c.peft.target_modules = "q,v";
  Result r = simulate(c);
  INFO((r.errors.empty() ? "" : r.errors[0].message));
  REQUIRE(r.ok);
  CHECK(r.params_trainable == 2359296);
  CHECK(r.params_total == 1231940608);
}

TEST_CASE("frozen base storage: bf16, NF4 with and without double quantization, int8", "[peft]") {
  Config c = from_hf("llama-2-7b.json");
  c.peft.method = "lora";
  c.peft.target_modules = "q_proj,v_proj";
  c.peft.adapter_dtype = "fp32";
  const int64_t layer_linear = 4 * 4096 * 4096 + 3 * 4096 * 11008;  // quantized: the layers' nn.Linear weights
  const int64_t other = 6738415616 - 32 * layer_linear;               // embeddings, head, norms (not quantized)
  const int64_t lora = 4194304;
  Result r = simulate(c);
  CHECK(r.model_states.weights_bytes == 2 * 6738415616 + 4 * lora);
  CHECK(r.model_states.gradients_bytes == 4 * lora);           // fp32 adapters only
  CHECK(r.model_states.optimizer_bytes == 8 * lora);           // AdamW states in the adapters' dtype
  c.peft.base_quantization = "nf4";
  c.peft.prepare_kbit = "false";
  r = simulate(c);
  // 4 bits per element plus an fp32 absmax per 64-element block: 4.5 bits (QLoRA sec. 3)
  const double nf4 = static_cast<double>(r.model_states.weights_bytes - 2 * other - 4 * lora) / (32.0 * layer_linear);
  CHECK(nf4 * 8 == Approx(4.5).epsilon(0.001));
  c.peft.double_quantization = true;
  r = simulate(c);
  // double quantization: 8/64 + 32/(64 * 256) = 0.127 bits of constants per parameter (QLoRA sec. 3)
  const double dq = static_cast<double>(r.model_states.weights_bytes - 2 * other - 4 * lora) / (32.0 * layer_linear);
  CHECK(dq * 8 == Approx(4.127).epsilon(0.001));
  c.peft.prepare_kbit = "true";  // prepare_model_for_kbit_training: everything not quantized goes to fp32
  Result up = simulate(c);
  CHECK(up.model_states.weights_bytes - r.model_states.weights_bytes == 2 * other);
  c.peft.base_quantization = "int8";
  c.peft.prepare_kbit = "false";
  r = simulate(c);
  // LLM.int8: one byte per element and an fp32 scale per output row (bitsandbytes Int8Params SCB)
  const int64_t rows = 32 * (4 * 4096 + 2 * 11008 + 4096);
  CHECK(r.model_states.weights_bytes == 2 * other + 32 * layer_linear + 4 * rows + 4 * lora);
}

TEST_CASE("a frozen base saves less: LoRA on q and v with fp32 adapters and dropout", "[peft][activations]") {
  // Per layer (MEMORY_FORMULAS.md 4.4): frozen norms keep x32 and rstd only (no scaled copy); the norm output is
  // not kept (frozen q/k/v do not need it), but each adapted module keeps its dropout output in fp32 (4 bytes),
  // a 1-byte mask and lora_A's fp32 output; attention keeps what it always keeps; the MLP keeps gate, up and
  // act (silu and the product need them) but not the product (frozen down_proj).
  Config c = from_hf("llama-2-7b.json");
  c.training.micro_batch_size = 1;
  c.training.sequence_length = 2048;
  c.peft.method = "lora";
  c.peft.lora_rank = 8;
  c.peft.target_modules = "q_proj,v_proj";
  c.peft.lora_dropout = 0.05;
  auto live = [](const Config& cfg) {
    Result r = simulate(cfg);
    REQUIRE(r.ok);
    return live_bytes_before_phase(r.devices[0].program, "backward", Component::Activations);
  };
  Config one = c, two = c;
  one.model.num_hidden_layers = 1;
  two.model.num_hidden_layers = 2;
  const int64_t T = 2048, h = 4096, f = 11008, a = 32, r = 8;
  const int64_t norms = 2 * (4 * T * h + 4 * T);
  const int64_t lora = 2 * (T * h + 4 * T * h + 4 * T * r);
  const int64_t attention = 2 * T * h * 4 + 4 * a * T;  // v, q_rot, k_rot, output (bf16) and the fp32 LSE
  const int64_t mlp = 3 * 2 * T * f;
  CHECK(live(two) - live(one) == norms + lora + attention + mlp);
}

TEST_CASE("bf16 autocast over a bf16 model: LoRA's inputs are saved in 16 bits (HF Trainer bf16=True)", "[peft][activations][precision]") {
  // The model loaded with torch_dtype=bfloat16 and trained under the Trainer's autocast. PEFT casts x to the fp32
  // adapter (x.to(lora_A.weight.dtype)), dropout runs in fp32, and autocast casts dropout's output back to bf16 for
  // lora_A's matmul, which saves that cast: per adapted module a 1-byte mask, a bf16 copy and lora_A's bf16 output,
  // against bf16_pure's fp32 copy and fp32 output (the test above). The rest of the layer is bf16_pure's.
  Config c = from_hf("llama-2-7b.json");
  c.training.micro_batch_size = 1;
  c.training.sequence_length = 2048;
  c.training.precision = "bf16_autocast";
  c.peft.method = "lora";
  c.peft.lora_rank = 8;
  c.peft.target_modules = "q_proj,v_proj";
  c.peft.lora_dropout = 0.05;
  c.peft.adapter_dtype = "fp32";
  auto live = [](const Config& cfg) {
    return live_bytes_before_phase(simulate_valid(cfg).program, "backward", Component::Activations);
  };
  Config one = c, two = c;
  one.model.num_hidden_layers = 1;
  two.model.num_hidden_layers = 2;
  const int64_t T = 2048, h = 4096, f = 11008, a = 32, r = 8;
  const int64_t norms = 2 * (4 * T * h + 4 * T);
  const int64_t lora = 2 * (T * h + 2 * T * h + 2 * T * r);
  const int64_t attention = 2 * T * h * 4 + 4 * a * T;
  const int64_t mlp = 3 * 2 * T * f;
  CHECK(live(two) - live(one) == norms + lora + attention + mlp);

  // With bf16 adapters nothing is cast (x.to(bf16) and autocast's cast of a bf16 tensor return it), and an RMSNorm
  // decoder's norms return bf16 (weight * hidden.to(input_dtype)): the step is bf16_pure's, event for event. So is
  // full fine-tuning, whose matmuls read bf16 tensors and bf16 weights.
  for (const bool peft : {true, false}) {
    Config autocast = c;
    autocast.peft.method = peft ? "lora" : "none";
    autocast.peft.adapter_dtype = "bf16";
    Config pure = autocast;
    pure.training.precision = "bf16_pure";
    const DeviceResult x = simulate_valid(autocast), y = simulate_valid(pure);
    CHECK(x.peak.allocated_bytes == y.peak.allocated_bytes);
    CHECK(x.peak.reserved_bytes == y.peak.reserved_bytes);
    CHECK(x.program.events.size() == y.program.events.size());
  }
}

TEST_CASE("16-bit weights under autocast: a LayerNorm saves an fp32 cast of its input and returns fp32", "[activations][precision]") {
  // layer_norm is on autocast's fp32 list: native_layer_norm gets (and saves) an fp32 copy of the bf16 residual,
  // and its fp32 output is cast again by each matmul that reads it. Full fine-tuning of a Llama-shaped layer with
  // LayerNorms under bf16_autocast keeps more than under bf16_pure, and per layer as much as amp_bf16, whose fp32
  // residual is what its LayerNorms save (it differs in the weights: fp32, and their casts).
  Config c = from_hf("llama-2-7b.json");
  c.model.norm_type = NormType::LayerNorm;
  c.training.micro_batch_size = 1;
  c.training.sequence_length = 1024;
  c.training.activation_checkpointing = "none";
  auto per_layer = [](Config cfg, const char* precision) {
    cfg.training.precision = precision;
    Config one = cfg, two = cfg;
    one.model.num_hidden_layers = 1;
    two.model.num_hidden_layers = 2;
    return live_bytes_before_phase(simulate_valid(two).program, "backward", Component::Activations) -
           live_bytes_before_phase(simulate_valid(one).program, "backward", Component::Activations);
  };
  const int64_t pure = per_layer(c, "bf16_pure"), autocast = per_layer(c, "bf16_autocast"), amp = per_layer(c, "amp_bf16");
  const int64_t T = 1024, h = 4096;
  // Two norms per layer: each saves the fp32 cast of its input instead of the bf16 residual (+2 bytes per element),
  // and q, k, v (three matmuls) and gate/up (two) each save a bf16 cast of the fp32 norm output instead of sharing
  // the bf16 output itself (+2 and +1 further copies).
  CHECK(autocast - pure == 2 * 2 * T * h + 2 * T * h * (2 + 1));
  CHECK(amp == autocast);
}

TEST_CASE("litgpt's LoRA on a fused qkv linear: the zero-padded delta and the head's casts per chunk", "[peft][activations]") {
  Config c = from_hf("llama-2-7b.json");
  c.training.framework = "litgpt";
  c.training.micro_batch_size = 1;
  c.training.sequence_length = 1024;
  c.peft.method = "lora";
  c.peft.lora_rank = 8;
  c.peft.adapter_dtype = "bf16";  // Fabric's bf16-true creates every parameter in bf16
  const int64_t T = 1024, h = 4096, V = 32000;
  // LoRAQKVLinear.zero_pad scatters the q and v deltas into zeros of the full qkv width with index_copy, whose
  // backward keeps that [T, h_q + h_kv] bf16 source; with q, k and v all adapted there is no padding.
  Config qv = c, qkv = c;
  qv.peft.target_modules = "q_proj,v_proj";
  qkv.peft.target_modules = "q_proj,k_proj,v_proj";
  CHECK(per_layer_activations(qv) - per_layer_activations(qkv) == 2 * T * (h + h));
  // bf16-mixed: the frozen fp32 head is cast to bf16 again for each 128-token chunk (autocast caches only weights
  // that require grad), and each chunk's matmul saves its cast: 8 copies at 1024 tokens, 1 at 128.
  auto head_casts = [&](int64_t seq) {
    Config m = qv;
    m.training.precision = "amp_bf16";
    m.training.sequence_length = seq;
    m.model.num_hidden_layers = 1;
    Result r = simulate(m);
    REQUIRE(r.ok);
    return live_bytes_before_phase(r.devices[0].program, "backward", Component::Temporaries);
  };
  CHECK(head_casts(1024) - head_casts(128) == 7 * 2 * V * h);
}

TEST_CASE("bad PEFT settings name the field", "[peft][bad-input]") {
  Config c = from_hf("llama-2-7b.json");
  c.peft.method = "lora";
  c.peft.lora_rank = 0;
  CHECK(simulate(c).errors.at(0).field == "peft.lora_rank");
  c.peft.lora_rank = 5000;  // above the smallest adapted dimension (4096)
  CHECK(simulate(c).errors.at(0).field == "peft.lora_rank");
  c.peft.lora_rank = 8;
  c.peft.target_modules = "q_proj,w_pack";
  Result r = simulate(c);
  REQUIRE(!r.ok);
  CHECK(r.errors[0].field == "peft.target_modules");
  CHECK(r.errors[0].message.find("w_pack") != std::string::npos);
  Config full = from_hf("llama-2-7b.json");
  full.peft.base_quantization = "nf4";  // 4-bit storage with an optimizer on the frozen weights
  r = simulate(full);
  REQUIRE(!r.ok);
  CHECK(r.errors[0].field == "peft.base_quantization");
  // torch's GradScaler unscales fp32 gradients only: 16-bit adapters under an fp16 recipe cannot train
  for (const char* precision : {"fp16_autocast", "amp_fp16"}) {
    Config s = from_hf("llama-2-7b.json");
    s.parallel.zero_stage = 0, s.parallel.data_parallel_size = 1;
    s.training.precision = precision;
    s.peft.method = "lora";
    s.peft.adapter_dtype = "fp32";
    CHECK(validate(s).empty());
    for (const char* dtype : {"fp16", "bf16"}) {
      s.peft.adapter_dtype = dtype;
      const auto errors = validate(s);
      REQUIRE(errors.size() == 1);
      CHECK(errors[0].field == "peft.adapter_dtype");
      CHECK(errors[0].message.find(std::string(dtype) + " under " + precision) != std::string::npos);
    }
  }
}

TEST_CASE("QLoRA paper headline: LLaMA-65B fine-tunes on one 48 GB GPU", "[peft][qlora]") {
  // Dettmers et al. 2023 (arXiv:2305.14314) abstract: 65B fine-tuning "on a single 48GB GPU". Their setup: NF4 with
  // double quantization, LoRA r = 64 on every linear layer, paged AdamW, bf16 compute, gradient checkpointing,
  // micro-batch 1 (sequence 512 assumed: the Guanaco runs cut sources at 512 tokens).
  Config c;
  c.model = ModelConfig{};
  c.model.hidden_size = 8192;
  c.model.num_hidden_layers = 80;
  c.model.num_attention_heads = 64;
  c.model.num_key_value_heads = 64;
  c.model.head_dim = 0;
  c.model.intermediate_size = 22016;
  c.model.vocab_size = 32000;
  c.training.framework = "hf_trainer";
  c.training.precision = "bf16_pure";
  c.training.optimizer = "paged_adamw";
  c.training.activation_checkpointing = "full";
  c.training.micro_batch_size = 1;
  c.training.sequence_length = 512;
  c.training.gradient_accumulation_steps = 16;
  c.peft.method = "lora";
  c.peft.lora_rank = 64;
  c.peft.target_modules = "all-linear";
  c.peft.lora_dropout = 0.05;
  c.peft.base_quantization = "nf4";
  c.peft.double_quantization = true;
  c.parallel.data_parallel_size = 1;
  c.parallel.zero_stage = 0;
  c.hardware.gpu = "custom";
  c.hardware.gpu_memory_bytes = 48 * kGiB;
  Result r = simulate(c);
  REQUIRE(r.ok);
  // memsim predicts about 41.8 GiB on the device (36.4 GiB of it weights: 4.127-bit base, fp32 embeddings and
  // head after prepare_model_for_kbit_training, fp32 adapters), which fits a 48 GB card: the headline holds.
  CHECK(r.devices[0].fits);
  CHECK(r.devices[0].peak.device_bytes > 36 * kGiB);
  CHECK(r.devices[0].peak.device_bytes < 44 * kGiB);
}

// PEFT's method comparison (method_comparison/MetaMathQA/results/*.json, train_info) reports
// get_nb_trainable_parameters() for Llama-3.2-3B: the trainable count and the total, which counts what a method adds.
TEST_CASE("IA3, LN tuning and prompt tuning counts match PEFT's on Llama-3.2-3B", "[peft]") {
  Config c = from_hf("llama-3.2-3b.json");
  // ia3--llama-3.2-3B-default.json: IA3Config defaults for llama (k_proj, v_proj, down_proj; down_proj feedforward):
  // 28 x (1024 + 1024 + 8192) = 286,720 of 3,213,036,544.
  c.peft.method = "ia3";
  c.peft.target_modules = "k_proj,v_proj,down_proj";
  c.peft.feedforward_modules = "down_proj";
  Result r = simulate(c);
  REQUIRE(r.ok);
  CHECK(r.params_trainable == 286720);
  CHECK(r.params_total == 3213036544);
  // IA3 as the output scaling of down_proj instead: out_features (3072) replaces in_features (8192).
  c.peft.feedforward_modules = "";
  CHECK(simulate(c).params_trainable == 28 * (1024 + 1024 + 3072));
  // ln_tuning--llama-3.2-3B-default.json: trainable copies of input_layernorm, post_attention_layernorm and the final
  // norm: 28 x 2 x 3072 + 3072 = 175,104 of 3,212,924,928 (the frozen originals stay).
  c.peft.method = "ln_tuning";
  c.peft.target_modules = "input_layernorm,post_attention_layernorm,norm";
  r = simulate(c);
  REQUIRE(r.ok);
  CHECK(r.params_trainable == 175104);
  CHECK(r.params_total == 3212924928);
  // prompt_tuning--llama-3.2-3B-default.json: 200 virtual tokens x 3072 = 614,400 of 3,213,364,224.
  c.peft.method = "prompt_tuning";
  c.peft.num_virtual_tokens = 200;
  r = simulate(c);
  REQUIRE(r.ok);
  CHECK(r.params_trainable == 614400);
  CHECK(r.params_total == 3213364224);
  // The LoRA rows of the same benchmark: rank 64 on q and v, rank 10 on the MLP, DoRA rank 32 on q and v.
  c.peft.method = "lora";
  c.peft.lora_rank = 64;
  c.peft.target_modules = "q_proj,v_proj";
  CHECK(simulate(c).params_trainable == 18350080);
  c.peft.lora_rank = 10;
  c.peft.target_modules = "gate_proj,up_proj,down_proj";
  CHECK(simulate(c).params_trainable == 9461760);
  c.peft.method = "dora";
  c.peft.lora_rank = 32;
  c.peft.target_modules = "q_proj,v_proj";
  CHECK(simulate(c).params_trainable == 9289728);
}

namespace {
// What one more layer leaves saved for backward: the difference of two runs with one and two layers.
int64_t saved_per_layer(Config c) {
  auto live = [](const Config& cfg) {
    Result r = simulate(cfg);
    REQUIRE(r.ok);
    return live_bytes_before_phase(r.devices[0].program, "backward", Component::Activations);
  };
  Config one = c, two = c;
  one.model.num_hidden_layers = 1;
  two.model.num_hidden_layers = 2;
  return live(two) - live(one);
}
}  // namespace

TEST_CASE("saved activations of IA3, LN tuning, prompt tuning and DoRA, derived by hand", "[peft][activations]") {
  // Llama-3.2-3B, one sequence of 2048 tokens, pure bf16, SDPA with native GQA. With a frozen base a layer keeps
  // (MEMORY_FORMULAS.md 4.4): the two RMSNorms' fp32 input copies and rstd, attention's v, rotated q and k, output
  // and fp32 logsumexp, and the MLP's gate, up and activation (silu and the product need them); not the norm
  // outputs or the down projection's input, whose frozen consumers need no gradient.
  Config c = single_gpu_config("llama-3.2-3b.json", 1, 2048);
  const int64_t T = 2048, h = 3072, hq = 3072, hkv = 1024, f = 8192, a = 24;
  const int64_t norms = 2 * (4 * T * h + 4 * T);
  const int64_t attention = 2 * T * hkv + 2 * T * hq + 2 * T * hkv + 2 * T * hq + 4 * a * T;
  const int64_t mlp = 3 * 2 * T * f;
  c.peft.method = "ia3";
  c.peft.target_modules = "q_proj";  // smallest IA3 setting: the bf16 pre-scale output of q_proj
  c.peft.feedforward_modules = "";
  const int64_t frozen = saved_per_layer(c) - 2 * T * hq;
  CHECK(frozen == norms + attention + mlp);

  // IA3 (ia3/layer.py, peft 0.11+): k_proj and v_proj keep their bf16 pre-scale output, which
  // `(result * ia3_scaling)` saves for the vector's gradient; the feedforward down_proj keeps `x.to(fp32)`, an fp32
  // copy of its input.
  c.peft.target_modules = "k_proj,v_proj,down_proj";
  c.peft.feedforward_modules = "down_proj";
  CHECK(saved_per_layer(c) == frozen + 2 * 2 * T * hkv + 4 * T * f);
  // Before peft 0.11 (peft#1634) the output was cast to the vector's fp32 first, `result.to(dtype) * ia3_scaling`,
  // and the product kept that copy.
  c.versions.peft = "0.10.0";
  CHECK(saved_per_layer(c) == frozen + 2 * 4 * T * hkv + 4 * T * f);
  c.versions.peft = "latest";
  // bf16 vectors (autocast_adapter_dtype=False): the pre-scale outputs are kept in bf16, and down_proj's input is
  // multiplied as it is, so the product keeps the bf16 input itself.
  c.peft.adapter_dtype = "bf16";
  CHECK(saved_per_layer(c) == frozen + 2 * 2 * T * hkv + 2 * T * f);
  c.peft.adapter_dtype = "fp32";

  // LN tuning: each norm's trainable copy needs `hidden_states.to(input_dtype)` (bf16) for its weight's gradient.
  c.peft.method = "ln_tuning";
  c.peft.target_modules = "input_layernorm,post_attention_layernorm,norm";
  CHECK(saved_per_layer(c) == frozen + 2 * 2 * T * h);
  c.peft.target_modules = "post_attention_layernorm";
  CHECK(saved_per_layer(c) == frozen + 2 * T * h);

  // Prompt tuning: every layer sees 2048 + 30 positions.
  c.peft.method = "prompt_tuning";
  c.peft.num_virtual_tokens = 30;
  const int64_t T2 = T + 30;
  CHECK(saved_per_layer(c) == 2 * (4 * T2 * h + 4 * T2) + 2 * (2 * T2 * hkv + 2 * T2 * hq) + 4 * a * T2 + 3 * 2 * T2 * f);

  // DoRA on q and v without dropout (lora/dora.py): on top of LoRA's fp32 input copy and lora_A output, the
  // magnitude's products keep the base layer's bf16 output and lora_B's fp32 output, [tokens, out] each.
  c.peft.method = "lora";
  c.peft.lora_rank = 16;
  c.peft.target_modules = "q_proj,v_proj";
  const int64_t lora = saved_per_layer(c);
  CHECK(lora == frozen + 2 * (4 * T * h + 4 * T * 16));
  c.peft.method = "dora";
  CHECK(saved_per_layer(c) == lora + (2 + 4) * T * hq + (2 + 4) * T * hkv);
  // With dropout the base result is recomputed from the dropped-out fp32 input and the weight's fp32 cast, which
  // F.linear keeps: [out, in] per module, beside the fp32 result.
  Config d = c;
  d.peft.lora_dropout = 0.1;
  d.peft.method = "lora";
  const int64_t lora_dropout = saved_per_layer(d);
  d.peft.method = "dora";
  CHECK(saved_per_layer(d) == lora_dropout + 4 * h * hq + 2 * 4 * T * hq + 4 * h * hkv + 2 * 4 * T * hkv);
}

TEST_CASE("PEFT methods memsim does not model are refused with the field", "[peft][bad-input]") {
  Config c = from_hf("llama-3.2-3b.json");
  // Prefix tuning is modelled from transformers 4.56 (test_prefix_tuning.cpp); an older stated version is refused.
  c.peft.method = "prefix_tuning";
  c.versions.transformers = "4.46.0";
  Result r = simulate(c);
  REQUIRE(!r.ok);
  CHECK(r.errors[0].field == "versions.transformers");
  c.versions.transformers = "latest";
  c.peft.method = "p_tuning";
  CHECK(simulate(c).errors.at(0).field == "peft.method");
  // IA3's feedforward modules must be among its targets (IA3Config.__post_init__).
  c.peft.method = "ia3";
  c.peft.target_modules = "k_proj,v_proj";
  c.peft.feedforward_modules = "down_proj";
  r = simulate(c);
  REQUIRE(!r.ok);
  CHECK(r.errors[0].field == "peft.feedforward_modules");
  // IA3 on a fused qkv linear (litgpt) is not PEFT's layout.
  c.peft.feedforward_modules = "";
  c.training.framework = "litgpt";
  CHECK(simulate(c).errors.at(0).field == "peft.method");
  c.training.framework = "hf_trainer";
  CHECK(simulate(c).ok);
  // LN tuning targets norms.
  c.peft.method = "ln_tuning";
  c.peft.target_modules = "q_proj";
  r = simulate(c);
  REQUIRE(!r.ok);
  CHECK(r.errors[0].field == "peft.target_modules");
  CHECK(r.errors[0].message.find("input_layernorm") != std::string::npos);
  // Prompt tuning needs a virtual token, and learned positions long enough for them.
  c.peft.method = "prompt_tuning";
  c.peft.num_virtual_tokens = 0;
  CHECK(simulate(c).errors.at(0).field == "peft.num_virtual_tokens");
  Config g = single_gpu_config("gpt2.json", 1, 1024);
  g.peft.method = "prompt_tuning";
  g.peft.num_virtual_tokens = 8;  // 1024 + 8 positions, GPT-2 has 1024
  CHECK(simulate(g).errors.at(0).field == "peft.num_virtual_tokens");
}

TEST_CASE("the new PEFT fields travel through JSON, the fragment and --set", "[peft][serialize]") {
  Config c = from_hf("llama-3.2-3b.json");
  REQUIRE(apply_setting(c, "peft.method=ia3").empty());
  REQUIRE(apply_setting(c, "peft.feedforward_modules=down_proj,up_proj").empty());
  REQUIRE(apply_setting(c, "peft.num_virtual_tokens=64").empty());
  CHECK(c.peft.feedforward_modules == "down_proj,up_proj");
  CHECK(c.peft.num_virtual_tokens == 64);
  Parsed j = config_from_json(config_to_json(c));
  REQUIRE(j.ok);
  CHECK(j.config == c);
  Parsed f = config_from_fragment(config_to_fragment(c));
  REQUIRE(f.ok);
  CHECK(f.config == c);
  // A config written before these fields keeps PEFT's defaults for them.
  Parsed old = config_from_json(R"({"schema": 1, "peft": {"method": "lora"}})");
  REQUIRE(old.ok);
  CHECK(old.config.peft.feedforward_modules == "down_proj");
  CHECK(old.config.peft.num_virtual_tokens == 20);
}

TEST_CASE("LoRA on a fused q/k/v linear is one adapter over its whole width (Qwen-1 c_attn)", "[peft]") {
  // Qwen-7B's config.json (remote code, model_type qwen): QWenBlock = RMSNorm, c_attn Linear(h, 3h, bias) and
  // c_proj Linear(h, h), RMSNorm, QWenMLP w1 and w2 Linear(h, 22016 // 2) and c_proj back; untied head. Summed
  // from those shapes: 2 x 151936 x 4096 + 32 x (4096 x 12288 + 12288 + 4096^2 + 3 x 4096 x 11008 + 2 x 4096) + 4096.
  Parsed p = model_from_hf_json(read_file(source_path("tests/data/hf/qwen-7b.json")));
  REQUIRE(p.ok);
  Config c = p.config;
  CHECK(c.model.fused_qkv);
  CHECK(c.model.intermediate_size == 11008);
  CHECK(c.model.head_dim == 128);
  CHECK(c.model.max_position_embeddings == 8192);
  const int64_t base = 7721324544;
  CHECK(build_model_shape(c.model).params_total == base);
  c.training.framework = "hf_trainer";
  c.parallel.data_parallel_size = 1;
  c.parallel.zero_stage = 0;
  c.peft.method = "lora";
  c.peft.lora_rank = 8;
  // peft LoraLayer on c_attn: lora_A (8, 4096), lora_B (12288, 8), per layer.
  c.peft.target_modules = "c_attn";
  Result fused = simulate(c);
  REQUIRE(fused.ok);
  CHECK(fused.params_trainable == 32 * (8 * 4096 + 12288 * 8));
  // Three separate adapters (what memsim could express before) read the input three times and keep three rank-8
  // intermediates; the fused one keeps one of each.
  c.peft.target_modules = "q_proj,k_proj,v_proj";
  Result separate = simulate(c);
  REQUIRE(separate.ok);
  CHECK(separate.params_trainable == 32 * 3 * (8 * 4096 + 4096 * 8));
  CHECK(fused.devices[0].peak.allocated_bytes < separate.devices[0].peak.allocated_bytes);
  // A model with separate q/k/v linears has no fused one to target.
  c.model.fused_qkv = false;
  c.peft.target_modules = "c_attn";
  Result bad = simulate(c);
  REQUIRE_FALSE(bad.ok);
  CHECK(bad.errors[0].field == "peft.target_modules");
}

TEST_CASE("transformers 5: a built-in MoE's routed experts are 3-D parameters that LoRA and bitsandbytes pass by", "[peft][moe][versions]") {
  // transformers#41580 (5.0) made Mixtral's experts gate_up_proj [E, 2f, d] and down_proj [E, d, f] of one module:
  // PEFT's target_modules (before its 0.19 rewrite) names nn.Linear modules, and replace_with_bnb_linear replaces
  // nn.Linear only (bitsandbytes#1849), so a QLoRA load keeps the experts in bf16 and prepare_model_for_kbit_training
  // casts them to fp32 with the other unquantized weights (docs/research/transformers5-moe.md sections 4-5).
  Config c = single_gpu_config("mixtral-8x7b.json", 1, 512);
  c.peft.method = "lora";
  c.peft.base_quantization = "nf4";
  c.peft.target_modules = "q_proj,k_proj,v_proj,o_proj";
  c.hardware.gpu = "h200";
  auto weights = [](const Result& r) { return r.devices[0].model_states.weights_bytes; };
  c.versions.transformers = "4.57.0";
  const Result v4 = simulate(c);
  c.versions.transformers = "5.0.0";
  const Result v5 = simulate(c);
  REQUIRE(v4.ok);
  REQUIRE(v5.ok);
  CHECK(v5.params_trainable == v4.params_trainable);  // the attention's adapters either way
  // 32 layers x 8 experts x 3 x 4,096 x 14,336 weights: about half a byte each in NF4, 4 bytes once cast to fp32.
  const int64_t experts = 32LL * 8 * 3 * 4096 * 14336;
  CHECK(weights(v5) - weights(v4) > 3 * experts);
  CHECK(weights(v5) - weights(v4) < 4 * experts);
  bool noted = false;
  for (const auto& n : v5.notes) noted |= n.find("3-D parameters") != std::string::npos;
  CHECK(noted);
  // Megatron's and torchtune's own model code are not transformers'.
  c.training.framework = "torchtune";
  c.peft.base_quantization = "none";
  c.training.precision = "bf16_pure";
  const int64_t tt5 = simulate(c).devices[0].model_states.weights_bytes;
  c.versions.transformers = "4.57.0";
  CHECK(simulate(c).devices[0].model_states.weights_bytes == tt5);
}

TEST_CASE("transformers 4: LoRA adapts each routed expert's linears, and a frozen expert keeps nothing it reads", "[peft][moe][activations]") {
  // modeling_mixtral.py (4.x) MixtralBlockSparseTop2MLP: each expert's w1, w3 and w2 is an nn.Linear, which PEFT
  // matches like any linear (memsim's names: gate_proj, up_proj, down_proj). Mixtral-8x7B, r = 16 on the seven:
  // 32 layers x (attention 16 x (2 x 8192 + 2 x 5120) + 8 experts x 3 x 16 x (4096 + 14336)) = 240,123,904;
  // all-linear adds the router (gate, [8, 4096]): 32 x 16 x (4096 + 8).
  Config c = single_gpu_config("mixtral-8x7b.json", 1, 512);
  c.versions.transformers = "4.57.0";
  c.peft.method = "lora";
  c.peft.lora_rank = 16;
  c.peft.lora_dropout = 0;
  c.peft.adapter_dtype = "fp32";
  c.peft.target_modules = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj";
  Result r = simulate(c);
  REQUIRE(r.ok);
  const int64_t attention = 16 * (2 * 8192 + 2 * 5120), experts = 8 * 3 * 16 * (4096 + 14336);
  CHECK(r.params_trainable == 32 * (attention + experts));
  c.peft.target_modules = "all-linear";
  CHECK(simulate(c).params_trainable == 32 * (attention + experts + 16 * (4096 + 8)));
  // transformers 5's experts are 3-D parameters: no adapters there.
  c.versions.transformers = "5.0.0";
  c.peft.target_modules = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj";
  CHECK(simulate(c).params_trainable == 32 * attention);
  c.versions.transformers = "4.57.0";

  // What one MoE layer keeps, by the difference of two models and one. A frozen expert keeps neither its gathered
  // tokens nor the product it projects down: only gate, up and silu's output for the elementwise ops, and its
  // output for the routing weight. Adapted, with fp32 adapters on a bf16 base, each of the three keeps an fp32 copy
  // of what it reads (x.to(lora_A.weight.dtype)) and lora_A's fp32 output; the 16-bit tokens themselves are not kept.
  auto layer = [](Config cfg) {
    cfg.model.num_hidden_layers = 1;
    Config two = cfg;
    two.model.num_hidden_layers = 2;
    const Result one_r = simulate(cfg), two_r = simulate(two);
    REQUIRE(one_r.ok);
    REQUIRE(two_r.ok);
    return live_bytes_before_phase(two_r.devices[0].program, "backward", Component::Activations) -
           live_bytes_before_phase(one_r.devices[0].program, "backward", Component::Activations);
  };
  const int64_t T = 512, h = 4096, fe = 14336, k = 2, n = k * T, rank = 16;
  c.peft.target_modules = "q_proj,k_proj,v_proj,o_proj";
  const int64_t frozen = layer(c);
  c.peft.target_modules = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj";
  const int64_t adapted = layer(c);
  CHECK(adapted - frozen == 2 * (4 * n * h + 4 * n * rank) + 4 * n * fe + 4 * n * rank);
  // Labelled: the gathered tokens and the product, per MoE layer, kept by full fine-tuning only.
  auto kept = [](const Config& cfg, const char* label) {
    const Result res = simulate(cfg);
    REQUIRE(res.ok);
    return live(res.devices[0].program, "backward", label);
  };
  CHECK(kept(c, "tokens gathered for the experts") == 0);
  CHECK(kept(c, "MLP gated product") == 0);
  Config full = c;
  full.peft.method = "none";
  CHECK(kept(full, "tokens gathered for the experts") == 32 * 2 * n * h);
  CHECK(kept(full, "MLP gated product") == 32 * 2 * n * fe);
  // modules_to_save on the experts' down projections trains a copy of them, which needs the product again.
  Config saving = c;
  saving.peft.target_modules = "q_proj";
  saving.peft.modules_to_save = "down_proj";
  CHECK(kept(saving, "MLP gated product") == 32 * 2 * n * fe);
  // DoRA keeps each adapted expert's base output (bf16) and lora_result (fp32) at the projection's output width:
  // the expert width for gate and up, the hidden size for down (dora.py DoraLinearLayer.forward).
  c.peft.target_modules = "gate_proj,up_proj,down_proj";
  const int64_t lora_experts = layer(c);
  c.peft.method = "dora";
  CHECK(layer(c) - lora_experts == 2 * (2 + 4) * n * fe + (2 + 4) * n * h);
  c.peft.method = "lora";

  // The router is an nn.Linear in transformers 4 only: transformers 5's MixtralTopKRouter and DeepSeek's MoEGate
  // hold a bare parameter, which PEFT refuses as a target and all-linear passes by.
  c.peft.target_modules = "q_proj,gate";
  CHECK(simulate(c).ok);
  c.versions.transformers = "5.0.0";
  CHECK(!simulate(c).ok);
  c.peft.target_modules = "all-linear";
  CHECK(simulate(c).params_trainable == 32 * attention);  // the attention only
  // gpt-oss kept its experts as 3-D parameters in transformers 4 already (GptOssExperts, 4.55).
  c.versions.transformers = "4.56.0";
  c.model.model_type = "gpt_oss";
  CHECK(simulate(c).params_trainable == 32 * attention);
  Config ds = single_gpu_config("deepseek-v3.json", 1, 512);
  ds.peft.method = "lora";
  ds.peft.target_modules = "all-linear";
  ds.model.num_hidden_layers = 4;
  const Result dsr = simulate(ds);
  REQUIRE(dsr.ok);
  ds.peft.target_modules = "q_a_proj,q_b_proj,kv_a_proj_with_mqa,kv_b_proj,o_proj,gate_proj,up_proj,down_proj";
  CHECK(simulate(ds).params_trainable == dsr.params_trainable);
}
