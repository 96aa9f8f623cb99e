// Saved activations per layer against the closed forms derived from the autograd rules of each op
// (MEMORY_FORMULAS.md 3.3 and the variants of 3.2; the worked MiB values are the reference's unit anchors).
// Measured as the bytes requested by live activation tensors at the start of backward, with L + 1 layers minus
// with L layers: exactly one layer's saved set.
#include <catch2/catch.hpp>

#include <map>

#include "core/serialize.h"
#include "core/simulate.h"
#include "test_util.h"

using namespace memsim;

static Config llama3_8b(int64_t b, int64_t s) { return single_gpu_config("llama-3-8b.json", b, s); }

static double mib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

TEST_CASE("Llama-3-8B layer, bf16, SDPA with native GQA", "[activations]") {
  // 16bsh + 4bs*h_q + 4bs*h_kv + 8bsf + 8bs + 4abs  (b=1, s=4096): 784.5 MiB
  const int64_t b = 1, s = 4096, h = 4096, hq = 4096, hkv = 1024, f = 14336, a = 32;
  Config c = llama3_8b(b, s);
  c.training.attention = "sdpa";
  const int64_t expected = 16 * b * s * h + 4 * b * s * hq + 4 * b * s * hkv + 8 * b * s * f + 8 * b * s + 4 * a * b * s;
  CHECK(per_layer_activations(c) == expected);
  CHECK(mib(expected) == Approx(784.5).margin(0.05));
}

TEST_CASE("q/k norms (Qwen3) add their saved set to the Llama layer", "[activations]") {
  // Qwen3RMSNorm on q [bs, h_q] and k [bs, h_kv], one rstd per head (modeling_qwen3.py): the fp32 copy of the
  // input (4 B), rstd (4 B per head and token) and, for the trainable weight's gradient, normed cast back to bf16
  // (2 B): 6bs*h_q + 4abs + 6bs*h_kv + 4gbs. The H200 calibration runs of Qwen3-0.6B (docs/validation.md) were
  // 4-11% under before this; within 2% after.
  const int64_t b = 1, s = 4096, hq = 4096, hkv = 1024, a = 32, g = 8;
  Config c = llama3_8b(b, s);
  c.training.attention = "sdpa";
  const int64_t plain = per_layer_activations(c);
  c.model.qk_norm = true;
  CHECK(per_layer_activations(c) - plain == 6 * b * s * hq + 4 * a * b * s + 6 * b * s * hkv + 4 * g * b * s);
  // Frozen norms (LoRA) need no normed copy: 4bs*h_q + 4abs + 4bs*h_kv + 4gbs.
  c.peft.method = "lora";
  Config base = c;
  base.model.qk_norm = false;
  CHECK(per_layer_activations(c) - per_layer_activations(base) ==
        4 * b * s * hq + 4 * a * b * s + 4 * b * s * hkv + 4 * g * b * s);
}

TEST_CASE("torch.compile: each norm keeps its input and rstd, and silu(gate) is recomputed", "[activations]") {
  // Inductor's default partitioner saves what a non-recomputable op (matmul, attention) reads and a reduction's
  // small output, and recomputes the pointwise ops between them. An eager HF RMSNorm saves x.float() (4bsh), rstd
  // and normed cast back (2bsh); compiled it keeps its bf16 input (2bsh) and rstd: 4bsh less per norm. SwiGLU
  // keeps gate, up and the product but not silu(gate) (2bsf). Per layer: 8bsh + 2bsf, 320 MiB for Llama 3.2 3B
  // at b=2, s=4096: 8.75 GiB over 28 layers, against the 9.0 GiB that torchtune measured ('+ Packed' to
  // '+ Compile'); packed RoPE's per-call fp32 index copies (8 MiB a layer, recomputed when compiled) are not modelled.
  const int64_t b = 1, s = 4096, h = 4096, f = 14336;
  Config c = llama3_8b(b, s);
  c.training.attention = "sdpa";
  const int64_t eager = per_layer_activations(c);
  c.training.compile = true;
  CHECK(eager - per_layer_activations(c) == 8 * b * s * h + 2 * b * s * f);
  // The torchtune row's shape: Llama 3.2 3B at 2 x 4096 tokens, torchtune's eager norm (cast back before the scale).
  Config t = single_gpu_config("llama-3.2-3b.json", 2, 4096);
  t.training.framework = "torchtune";
  t.training.attention = "sdpa";
  const int64_t t_eager = per_layer_activations(t);
  t.training.compile = true;
  const int64_t saved = t_eager - per_layer_activations(t);
  CHECK(saved == 8 * 2 * 4096 * 3072LL + 2 * 2 * 4096 * 8192LL);
  CHECK(mib(saved) * 28 / 1024 == Approx(8.75).margin(0.005));  // GiB over 28 layers; the README row drops 9.0
}

// Llama-3-8B under LoRA with bf16 adapters on a pure-bf16 base, SDPA: the bitsandbytes tests' starting point.
static Config bf16_lora(int64_t b, int64_t s) {
  Config c = llama3_8b(b, s);
  c.training.attention = "sdpa";
  c.training.precision = "bf16_pure";
  c.peft.method = "lora";
  c.peft.adapter_dtype = "bf16";
  return c;
}

TEST_CASE("old bitsandbytes keeps every 4-bit linear's input (peft.bnb_saves_input)", "[activations][peft]") {
  // QLoRA on q and v (lora_A reads the normed input unchanged, so it is saved already) and SDPA keeps the
  // attention output that o_proj reads: the flag adds the MLP's input [bs, h] and down_proj's input [bs, f], 2 bytes
  // each (MatMul4Bit.forward before bitsandbytes 0.43.2: ctx.tensors = (A, B)).
  const int64_t b = 1, s = 2048, h = 4096, f = 14336;
  Config c = bf16_lora(b, s);
  c.peft.base_quantization = "nf4";
  const int64_t modern = per_layer_activations(c);
  c.peft.bnb_saves_input = "true";
  CHECK(per_layer_activations(c) - modern == 2 * b * s * (h + f));
}

TEST_CASE("an LLM.int8 base keeps each linear's input, and before bitsandbytes 0.45 an int8 copy of it", "[activations][peft]") {
  // MatMul8bitLt: ctx.tensors = (CAt, subA, A) whenever the input requires grad (docs/versions.md 4). As for the
  // 4-bit test above, A adds the MLP's input [bs, h] and down_proj's [bs, f] in 2 bytes; before 0.45 (#1401) each
  // linear's CAt adds its input's size in 1 byte: q, k, v and gate, up read [bs, h], o_proj [bs, h_q], down [bs, f].
  const int64_t b = 1, s = 2048, h = 4096, hq = 4096, f = 14336;
  Config c = bf16_lora(b, s);
  const int64_t plain = per_layer_activations(c);
  c.peft.base_quantization = "int8";
  c.versions.bitsandbytes = "0.45.0";
  const int64_t kept = per_layer_activations(c) - plain;
  CHECK(kept == 2 * b * s * (h + f));
  c.versions.bitsandbytes = "0.44.1";
  CHECK(per_layer_activations(c) - plain == kept + b * s * (5 * h + hq + f));
}

TEST_CASE("non-reentrant checkpointing keeps old bitsandbytes' inputs for the whole graph", "[activations][peft]") {
  // A non-reentrant checkpoint runs the layer's first forward with grad, its saved tensors going through a pack
  // hook that keeps none of them; MatMul4Bit's ctx.tensors (before 0.43.2) and MatMul8bitLt's are attributes of
  // the node, not saved tensors, so each 4-bit linear's input stays with the graph: q/k/v's and the MLP's
  // normalised inputs [bs, h], o_proj's [bs, h_q] and down_proj's [bs, f], beside the checkpoint's own input.
  // A reentrant checkpoint's forward runs under no_grad and keeps only its input. Answer.AI's profiling notebook
  // (fsdp_qlora nbs/00-profile_lora_qlora.ipynb at 0719cd0: a 24-layer Llama, h 2048, f 4096, bf16, LoRA on q and v,
  // no prepare_model_for_kbit_training, HF checkpointing with use_reentrant=False, bitsandbytes before 0.43) measured
  // QLoRA minus LoRA allocated after forward at 0.250 / 0.499 / 0.998 / 1.498 GB for 512 / 1024 / 2048 / 3072
  // tokens: (3h + f) x 2 bytes per token and layer, but for layer 0's q/k/v input, is 0.2496 / ... / 1.4974 GB.
  const int64_t b = 1, s = 2048, h = 4096, hq = 4096, f = 14336;
  Config c = bf16_lora(b, s);
  c.peft.base_quantization = "nf4";
  c.peft.prepare_kbit = "false";  // else the fp32 norms make the residual, the checkpoint's input, fp32
  c.training.activation_checkpointing = "full";
  c.peft.bnb_saves_input = "true";
  c.training.checkpoint_reentrant = "true";
  const int64_t input = 2 * b * s * h;
  CHECK(per_layer_activations(c) == input);
  c.training.checkpoint_reentrant = "false";
  CHECK(per_layer_activations(c) == input + 2 * b * s * (h + hq + h + f));
  c.peft.bnb_saves_input = "false";
  CHECK(per_layer_activations(c) == input);
  // LLM.int8 keeps its input in every version, and before bitsandbytes 0.45 an int8 copy per linear: q, k, v and
  // gate, up read [bs, h], o_proj [bs, h_q], down [bs, f].
  c.peft.base_quantization = "int8";
  c.peft.bnb_saves_input = "auto";
  c.versions.bitsandbytes = "0.45.0";
  CHECK(per_layer_activations(c) == input + 2 * b * s * (h + hq + h + f));
  c.versions.bitsandbytes = "0.44.1";
  CHECK(per_layer_activations(c) == input + 2 * b * s * (h + hq + h + f) + b * s * (5 * h + hq + f));
  c.training.checkpoint_reentrant = "true";
  CHECK(per_layer_activations(c) == input);
}

TEST_CASE("Answer.AI's notebook: what old bitsandbytes keeps under non-reentrant checkpointing, per token", "[activations][peft]") {
  // fsdp_qlora nbs/00-profile_lora_qlora.ipynb (0719cd0): LlamaConfig(hidden 2048, 24 layers, 16 heads, intermediate
  // 4096, vocab 32000) in bf16, PEFT LoRA r=8 on q_proj and v_proj with dropout 0.1, every layer linear a
  // Linear4bit (nf4, bf16 storage), gradient_checkpointing_enable(use_reentrant=False), batch 1. Allocated after the
  // forward, QLoRA minus LoRA, measured (GB = 1e9): 0.250 / 0.499 / 0.998 / 1.498 at 512 / 1024 / 2048 / 3072 tokens.
  // Besides the weights (the model load, subtracted there) the two differ only by the inputs the 4-bit linears keep.
  Config c = single_gpu_config("llama-3.2-1b.json", 1, 512);
  c.model.hidden_size = 2048, c.model.num_hidden_layers = 24, c.model.num_attention_heads = 16;
  c.model.num_key_value_heads = 16, c.model.head_dim = 128, c.model.intermediate_size = 4096, c.model.vocab_size = 32000;
  c.model.tie_word_embeddings = false;
  c.training.activation_checkpointing = "full";
  c.training.checkpoint_reentrant = "false";
  c.peft.method = "lora";
  c.peft.lora_rank = 8;
  c.peft.lora_dropout = 0.1;
  c.peft.target_modules = "q_proj,v_proj";
  c.peft.adapter_dtype = "bf16";
  c.peft.prepare_kbit = "false";
  c.peft.bnb_saves_input = "true";
  auto after_forward = [](Config x) {
    const Result r = simulate(x);
    REQUIRE(r.ok);
    return live_bytes_before_phase(r.devices[0].program, "backward", Component::Activations);
  };
  const double measured_gb[] = {0.250, 0.499, 0.998, 1.498};
  const int64_t lengths[] = {512, 1024, 2048, 3072};
  for (int i = 0; i < 4; ++i) {
    c.training.sequence_length = lengths[i];
    Config lora = c;
    lora.peft.base_quantization = "none";
    c.peft.base_quantization = "nf4";
    const int64_t kept = after_forward(c) - after_forward(lora);
    // (3h + f) x 2 bytes per token and layer: q/k/v's and the MLP's normalised inputs, o_proj's and down_proj's;
    // layer 0's q/k/v read the frozen embedding's normalised output, which requires no grad.
    CHECK(kept == lengths[i] * (24 * (3 * 2048 + 4096) * 2 - 2048 * 2));
    CHECK(std::fabs(static_cast<double>(kept) / 1e9 - measured_gb[i]) < 0.002);
  }
}

TEST_CASE("a 4-bit MoE dequantizes one expert's projection at a time", "[activations][peft][moe]") {
  // transformers' Mixtral experts are nn.Linear modules (w1, w3 [f, h], w2 [h, f]), each a Linear4bit: MatMul4Bit
  // dequantizes one of them for its GEMM, [14336, 4096] in bf16, not all eight experts' weights at once.
  // (transformers 4: from 5.0 the experts are 3-D parameters that bitsandbytes leaves unquantized, test_peft.cpp.)
  Config c = single_gpu_config("mixtral-8x7b.json", 1, 1024);
  c.model.num_hidden_layers = 2;
  c.peft.method = "lora";
  c.peft.base_quantization = "nf4";
  c.versions.transformers = "4.57.0";
  Result r = simulate(c);
  REQUIRE(r.ok);
  const StepProgram& p = r.devices[0].program;
  int64_t largest = 0;
  for (const auto& t : p.tensors)
    if (p.labels[t.label] == "dequantized frozen weight (bitsandbytes matmul)") largest = std::max(largest, t.bytes);
  CHECK(largest == 2 * 14336LL * 4096);
}

TEST_CASE("litgpt's loop holds the last micro-batch's logits, and old bitsandbytes' 4-bit inputs, into the next forward",
          "[activations][peft]") {
  // fit() rebinds `logits` only after the next model() call, and through their grad_fn the graph stays too, with
  // the attribute MatMul4Bit keeps (ctx.tensors = (A, B), not released by backward) before bitsandbytes 0.43.2.
  // Between step 1 and step 2's forward the activations left are those: the bf16 logits [b, s, V], and per
  // 4-bit linear whose input requires grad its input: the fused qkv's (not layer 0's, which reads the frozen
  // embedding's output), o_proj's [bs, h_q], the MLP's [bs, h] and down's [bs, f], then lm_head's [bs, h]
  // (Lightning quantizes the head too).
  const int64_t b = 2, s = 512, h = 4096, hq = 4096, f = 14336, V = 128256, L = 2;
  Config c = llama3_8b(b, s);
  c.model.num_hidden_layers = L;
  c.training.framework = "litgpt";
  c.training.attention = "sdpa_repeat_kv";
  c.peft.method = "lora";
  c.peft.target_modules = "q_proj,v_proj";
  c.peft.adapter_dtype = "bf16";
  c.peft.base_quantization = "nf4";
  c.peft.prepare_kbit = "false";
  auto held = [&](const char* bnb_saves_input, const char* framework) {
    Config k = c;
    k.peft.bnb_saves_input = bnb_saves_input;
    k.training.framework = framework;
    Result r = simulate(k);
    REQUIRE(r.ok);
    return live_bytes_before_phase(r.devices[0].program, "forward (step 2", Component::Activations);
  };
  const int64_t logits = 2 * b * s * V;
  CHECK(held("false", "litgpt") == logits);
  const int64_t inputs = 2 * b * s * ((L - 1) * h + L * (hq + h + f) + h);
  CHECK(held("true", "litgpt") == logits + inputs);
  // The HF Trainer's training_step returns after backward: the graph goes with it, and the inputs with the graph.
  CHECK(held("true", "hf_trainer") == 0);
}

TEST_CASE("Llama-3-8B layer, bf16, repeat_kv (torchtune, litgpt, older HF)", "[activations]") {
  Config c = llama3_8b(1, 4096);
  c.training.attention = "sdpa_repeat_kv";
  CHECK(mib(per_layer_activations(c)) == Approx(832.5).margin(0.05));
}

TEST_CASE("Llama-3-8B layer, bf16, eager attention keeps the s^2 softmax", "[activations]") {
  // 16bsh + 8bs*h_q + 8bsf + 8bs + 6*a*s^2*b: 3904.0 MiB
  Config c = llama3_8b(1, 4096);
  c.training.attention = "eager";
  CHECK(mib(per_layer_activations(c)) == Approx(3904.0).margin(0.05));
}

TEST_CASE("Llama-3-8B layer, autocast over fp32 weights", "[activations]") {
  // 26bsh + 4bs*h_q + 4bs*h_kv + 8bsf + 8bs + 4abs: 944.5 MiB (fp32 residual stream, one cast per matmul)
  Config c = llama3_8b(1, 4096);
  c.training.precision = "amp_bf16";
  c.training.attention = "sdpa";
  CHECK(mib(per_layer_activations(c)) == Approx(944.5).margin(0.05));
}

TEST_CASE("Llama-2-7B layer (MHA), fp32", "[activations]") {
  // 24bsh + 8bs*h_q + 8bs*h_kv + 16bsf + 8bs + 4ab*s32 (b=4, s=2048): 2657.1 MiB
  Config c = single_gpu_config("llama-2-7b.json", 4, 2048);
  c.training.precision = "fp32";
  CHECK(mib(per_layer_activations(c)) == Approx(2657.1).margin(0.05));
}

static Config bert_large(const char* precision) {
  Config c = single_gpu_config("bert-large-uncased.json", 4, 512);
  c.training.attention = "eager";
  c.training.precision = precision;
  return c;
}

TEST_CASE("BERT-large post-LN layer with dropout, fp32 and fp16 autocast", "[activations]") {
  // fp32: 66bsh + 9as^2b + 16bs (Korthikanti et al. 2022 sec. 4.1, 34sbh + 5as^2b in 2-byte units, plus the
  // fp32 LayerNorm statistics); b=4, s=512: 276.0 MiB. fp16 autocast: 42bsh + 7as^2b + 16bs = 196.0 MiB.
  const int64_t b = 4, s = 512, h = 1024, a = 16;
  CHECK(per_layer_activations(bert_large("fp32")) == 66 * b * s * h + 9 * a * s * s * b + 16 * b * s);
  CHECK(per_layer_activations(bert_large("amp_fp16")) == 42 * b * s * h + 7 * a * s * s * b + 16 * b * s);
  CHECK(mib(per_layer_activations(bert_large("fp32"))) == Approx(276.0).margin(0.1));
  CHECK(mib(per_layer_activations(bert_large("amp_fp16"))) == Approx(196.0).margin(0.1));
  // SDPA (BertSdpaSelfAttention): no heads x seq^2 tensors; the kernel's fp32 logsumexp (4abs) instead.
  Config sdpa = bert_large("fp32");
  sdpa.training.attention = "sdpa";
  CHECK(per_layer_activations(sdpa) == 66 * b * s * h + 16 * b * s + 4 * a * b * s);
}

TEST_CASE("torch <= 1.10 softmax also keeps its input: one more heads x seq^2 tensor per layer", "[activations]") {
  // _softmax saved self until pytorch PR #66018 (torch 1.11). In BERT the input is scores / sqrt(d) + mask: fp32,
  // and fp32 under autocast as well, because the fp32 extended mask promotes the fp16 scores (4as^2b bytes).
  const int64_t b = 4, s = 512, a = 16;
  for (const char* precision : {"fp32", "amp_fp16"}) {
    Config old = bert_large(precision);
    old.training.softmax_saves_input = "true";
    CHECK(per_layer_activations(old) - per_layer_activations(bert_large(precision)) == 4 * a * s * s * b);
  }
  // A decoder's eager softmax(x, dtype=fp32) is _softmax(x.to(fp32)): the fp32 copy of the bf16 scores is kept.
  Config llama = single_gpu_config("llama-2-7b.json", 1, 2048);
  llama.training.attention = "eager";
  Config old = llama;
  old.training.softmax_saves_input = "true";
  CHECK(per_layer_activations(old) - per_layer_activations(llama) == 4 * 32 * 2048 * 2048);
  // The HF loss's log_softmax also kept its input, the fp32 upcast of the bf16 logits (4TV), until its backward.
  auto at_backward = [](Config x) {
    x.model.num_hidden_layers = 1;
    Result r = simulate(x);
    REQUIRE(r.ok);
    return live_bytes_before_phase(r.devices[0].program, "backward", Component::Activations);
  };
  CHECK(at_backward(old) - at_backward(llama) == 4 * 32 * 2048 * 2048 + int64_t{4} * 2048 * 32000);
  // An fp16 model's softmax(x, dtype=fp32) runs _softmax(x, half_to_float) on the scores themselves: those are kept.
  Config f16 = llama, f16_old = old;
  f16.training.precision = f16_old.training.precision = "fp16_mixed";
  CHECK(per_layer_activations(f16_old) - per_layer_activations(f16) == 2 * 32 * 2048 * 2048);
  // Under full checkpointing nothing inside the layer is saved, the softmax input included.
  llama.training.activation_checkpointing = old.training.activation_checkpointing = "full";
  CHECK(per_layer_activations(old) == per_layer_activations(llama));
}

TEST_CASE("Mixtral MoE layer: router, gathered tokens, expert MLPs and outputs", "[activations][moe]") {
  Config c = single_gpu_config("mixtral-8x7b.json", 1, 4096);
  const int64_t T = 4096, h = 4096, hq = 4096, hkv = 1024, a = 32, E = 8, k = 2, f = 14336, N = k * T;
  const int64_t attention = 8 * T * h + 4 * T + 4 * T * hq + 4 * T * hkv + 4 * a * T;  // norm 1 and SDPA, as Llama
  const int64_t norm2 = 8 * T * h + 4 * T;
  const int64_t router = 4 * T * E + 12 * T * k;               // fp32 softmax, top-k weights and indices
  const int64_t experts = 2 * N * h + 4 * 2 * N * f + 2 * N * h;  // gathered in, gate/up/act/prod, out
  CHECK(per_layer_activations(c) == attention + norm2 + router + experts);
  c.model.moe_capacity_factor = 1.25;  // each expert buffers ceil(1.25 * k * T / E) tokens
  const int64_t n_cap = E * ((5 * k * T + 4 * E - 1) / (4 * E));
  CHECK(per_layer_activations(c) == attention + norm2 + router + (2 * n_cap * h + 8 * n_cap * f + 2 * n_cap * h));
}

TEST_CASE("tensor parallel splits attention and MLP activations, sequence parallel also the norms", "[activations][tp]") {
  // Korthikanti et al. 2022 sec. 4.2: with t-way TP what lives inside attention and the MLP is divided by t,
  // the norm inputs/outputs and dropout are not; sequence parallelism divides those by t as well.
  const int64_t b = 1, s = 4096, h = 4096, hq = 4096, hkv = 1024, f = 14336, a = 32, t = 4;
  Config c = llama3_8b(b, s);
  c.training.attention = "sdpa";
  c.parallel.tensor_parallel_size = t;
  const int64_t inside = (4 * b * s * hq + 4 * b * s * hkv + 8 * b * s * f + 4 * a * b * s) / t;
  const int64_t norms = 16 * b * s * h + 8 * b * s;
  CHECK(per_layer_activations(c) == norms + inside);
  c.parallel.sequence_parallel = true;
  CHECK(per_layer_activations(c) == norms / t + inside);
}

TEST_CASE("full checkpointing keeps one residual per layer", "[activations]") {
  Config c = llama3_8b(1, 4096);
  c.training.activation_checkpointing = "full";
  CHECK(per_layer_activations(c) == 2 * 1 * 4096 * 4096);  // the bf16 layer input, 2bsh
  c.training.precision = "amp_bf16";
  CHECK(per_layer_activations(c) == 4 * 1 * 4096 * 4096);  // fp32 residual under autocast, 4bsh
}

// Reentrant checkpointing (CheckpointFunction.backward) holds the recomputed layer's output while backward runs
// through the recomputed graph; use_reentrant=False keeps only what that graph saved. HF's gradient checkpointing is
// reentrant before transformers 5.0 unless gradient_checkpointing_kwargs says otherwise (training.checkpoint_reentrant).
// With eager attention the peak is inside a layer's backward, so the two differ by exactly that output, the bf16 2bsh.
TEST_CASE("use_reentrant=False drops the recomputed layer output that reentrant checkpointing holds", "[activations]") {
  Config c = single_gpu_config("llama-3-8b.json", 1, 4096);
  c.training.framework = "hf_trainer";
  c.training.attention = "eager";
  c.training.activation_checkpointing = "full";
  c.peft.method = "lora";
  auto peak = [&](const char* reentrant) {
    Config x = c;
    x.training.checkpoint_reentrant = reentrant;
    const Result r = simulate(x);
    REQUIRE(r.ok);
    return r.devices[0].peak.requested_bytes;
  };
  CHECK(peak("auto") == peak("false"));  // the latest transformers: non-reentrant
  CHECK(peak("true") - peak("false") == int64_t{2} * 1 * 4096 * 4096);
  c.versions.transformers = "4.57.1";
  CHECK(peak("auto") == peak("true"));
  c.training.framework = "torchtune";  // FSDP's NO_REENTRANT wrapper: auto is false
  CHECK(peak("auto") == peak("false"));
}

TEST_CASE("a checkpointed layer's no_grad forward frees each intermediate after its last reader", "[activations]") {
  // torch.utils.checkpoint runs the layer under no_grad: its ops allocate as usual (a recorded H200 trace shows
  // each norm, q/k/v, RoPE, attention and MLP tensor allocated and freed one by one), and each result goes once
  // its last reader has run. The largest moment of a Llama layer is silu(gate) beside gate and up, with the
  // middle residual alive: 2bsh + 6bsf, where the checkpoint keeps only the layer's input.
  const int64_t b = 1, s = 4096, h = 4096, f = 14336;
  Config c = llama3_8b(b, s);
  c.model.num_hidden_layers = 2;
  c.training.activation_checkpointing = "full";
  Result r = simulate(c);
  REQUIRE(r.ok);
  const StepProgram& p = r.devices[0].program;
  int64_t live = 0, peak = 0;
  bool in_layer = false;
  for (const Event& e : p.events) {
    const Tensor& t = p.tensors[e.tensor];
    if (e.op == Event::Op::Alloc && t.component == Component::Activations && t.layer == 1) break;  // layer 1's output
    if (t.component != Component::Temporaries || t.layer != 0) continue;
    in_layer = true;
    live += (e.op == Event::Op::Alloc ? 1 : -1) * t.bytes;
    peak = std::max(peak, live);
  }
  REQUIRE(in_layer);
  CHECK(peak == 2 * b * s * h + 6 * b * s * f);
  CHECK(live == 0);  // nothing of the layer outlives its forward
  // A MoE layer runs one expert at a time under no_grad: nothing of its forward outlives it either.
  Config moe = single_gpu_config("mixtral-8x7b.json", 1, 1024);
  moe.model.num_hidden_layers = 2;
  moe.training.activation_checkpointing = "full";
  Result mr = simulate(moe);
  REQUIRE(mr.ok);
  int64_t moe_live = 0;
  for (const Event& e : mr.devices[0].program.events) {
    const Tensor& t = mr.devices[0].program.tensors[e.tensor];
    if (e.op == Event::Op::Alloc && t.component == Component::Activations && t.layer == 1) break;
    if (t.component == Component::Temporaries && t.layer == 0) moe_live += (e.op == Event::Op::Alloc ? 1 : -1) * t.bytes;
  }
  CHECK(moe_live == 0);
}

TEST_CASE("no_grad forward of a parallel-attention layer keeps the shared norm output for the MLP", "[activations]") {
  // One norm per layer (Falcon, GPT-J, phi-1.5): attention and the MLP both read its output, so under a checkpoint's
  // no_grad it lives until the MLP's first projection has run, while the attention output goes once o_proj has.
  Config c = llama3_8b(1, 2048);
  c.model.num_hidden_layers = 2;
  c.model.norms_per_layer = 1;
  c.model.mlp_gated = false;
  c.model.hidden_act = "gelu";
  c.training.activation_checkpointing = "full";
  Result r = simulate(c);
  REQUIRE(r.ok);
  const StepProgram& p = r.devices[0].program;
  std::map<std::string, int> live;  // layer 0's live tensors by label, during its first (no_grad) forward
  bool checked = false;
  for (const Event& e : p.events) {
    const Tensor& t = p.tensors[e.tensor];
    if (t.layer != 0) continue;
    const std::string& label = p.labels[t.label];
    if (e.op == Event::Op::Alloc && label.rfind("MLP first projection", 0) == 0) {
      CHECK(live["norm output (saved by the next matmuls)"] == 1);
      CHECK(live["attention output (saved by the kernel and o_proj)"] == 0);
      checked = true;
      break;
    }
    live[label] += e.op == Event::Op::Alloc ? 1 : -1;
  }
  CHECK(checked);
}

TEST_CASE("memory never falls as batch, sequence, layers or hidden size grow", "[simulate][property]") {
  Config base = llama3_8b(1, 512);
  base.model.num_hidden_layers = 4;
  for (const char* ck : {"none", "full", "selective"}) {
    for (const char* att : {"sdpa", "eager", "sdpa_repeat_kv"}) {
      // Grow one size at a time from the same base; the allocated peak must never fall.
      auto grows = [&](const std::vector<int64_t>& values, auto set) {
        Config c = base;
        c.training.activation_checkpointing = ck;
        c.training.attention = att;
        int64_t prev = 0;
        for (int64_t v : values) {
          set(c, v);
          const int64_t peak = simulate(c).devices[0].peak.allocated_bytes;
          CHECK(peak >= prev);
          prev = peak;
        }
      };
      grows({1, 2, 3, 4}, [](Config& c, int64_t v) { c.training.micro_batch_size = v; });
      grows({128, 256, 512, 1024}, [](Config& c, int64_t v) { c.training.sequence_length = v; });
      grows({1, 2, 4, 8}, [](Config& c, int64_t v) { c.model.num_hidden_layers = v; });
      grows({1024, 2048, 4096}, [](Config& c, int64_t v) { c.model.hidden_size = v; });
    }
  }
}

// Live activation bytes at the start of the first backward of step 2 on each pipeline stage.
static std::vector<int64_t> in_flight_bytes(const Config& c) {
  Result r = simulate(c);
  REQUIRE(r.ok);
  std::vector<int64_t> out;
  for (const auto& d : r.devices)
    out.push_back(live_bytes_before_phase(d.program, "backward (step 2", Component::Activations));
  return out;
}

TEST_CASE("pipeline schedules: 1F1B keeps stages - stage micro-batches in flight, GPipe all of them", "[pp]") {
  // Narayanan et al. 2021 (PipeDream-Flush / 1F1B): stage i of p holds at most p - i micro-batches' activations;
  // GPipe holds all m. Measured against the same stage with a single micro-batch in flight.
  Config c = llama3_8b(1, 1024);
  c.training.activation_checkpointing = "full";
  c.parallel.pipeline_parallel_size = 4;
  c.training.gradient_accumulation_steps = 1;
  const auto one = in_flight_bytes(c);
  REQUIRE(one.size() == 4);
  c.training.gradient_accumulation_steps = 8;
  const auto f1b = in_flight_bytes(c);
  for (int i = 0; i < 4; ++i) {
    INFO("stage " << i);
    // the step-1 forward-only cost and the last stage's loss are per micro-batch as well
    CHECK(f1b[i] == one[i] * (4 - i));
  }
  c.parallel.pipeline_schedule = "gpipe";
  c.training.gradient_accumulation_steps = 4;
  const auto gpipe = in_flight_bytes(c);
  for (int i = 0; i < 4; ++i) CHECK(gpipe[i] == one[i] * 4);
}
