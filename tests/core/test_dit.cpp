// FLUX.1's transformer as a model program (flux_dit, tools/programs/flux.py; docs/research/flux-dit.md), the ops it
// brought (layer_norm without affine, a per-head rms_norm, rows that modulate token rows, a slice of token rows,
// rotary, attention cast back to q's dtype) and bitsandbytes bases under a program: the exact count, the token
// counts, one single-stream block's saved set in closed form under LoRA and under an NF4 base, the ledger.
#include <catch2/catch.hpp>

#include "core/architecture.h"
#include "core/frameworks.h"
#include "core/model.h"
#include "core/simulate.h"
#include "core/validate.h"
#include "test_programs.h"
#include "test_util.h"

using namespace memsim;

namespace {

// diffusers' Flux LoRA recipe at a small size: 256 px (256 image tokens), 64 T5 tokens, rank 4 on the single and
// double blocks' to_q, to_k, to_v, bf16 weights under autocast, no checkpointing.
Config flux_lora(const std::string& args = "") {
  Config c;
  c.model.architecture = "flux_dit";
  c.model.architecture_args = "resolution=256,max_sequence_length=64,vae_on_gpu=0,text_encoder_on_gpu=0,text_encoder_2_on_gpu=0" +
                              (args.empty() ? "" : "," + args);
  c.training.framework = "hf_loop";
  c.training.precision = "bf16_autocast";
  c.training.optimizer = "adamw";
  c.training.activation_checkpointing = "none";
  c.training.attention = "sdpa";
  c.training.micro_batch_size = 1;
  c.peft.method = "lora";
  c.peft.lora_rank = 4;
  c.peft.lora_alpha = 4;
  c.peft.target_modules = "to_q,to_k,to_v";
  c.peft.adapter_dtype = "fp32";
  c.parallel.zero_stage = 0;
  c.parallel.data_parallel_size = 1;
  c.hardware.gpu = "h100-sxm";
  return c;
}

}  // namespace

TEST_CASE("flux_dit: FLUX.1-dev's exact count and its token counts", "[architecture][dit]") {
  // 11,901,408,320: FluxTransformer2DModel(**FLUX.1-dev/transformer/config.json).num_parameters(), the HF blog's
  // printed 11,906,077,760 less its 4,669,440 LoRA parameters (flux-dit.md section 1).
  Config c = flux_lora();
  c.model.architecture_args = "";
  CHECK(model_shape_of(c.model).params_total == 11901408320);
  std::shared_ptr<const Architecture> a;
  REQUIRE(decode_architecture("flux_dit", "", a).empty());
  CHECK(a->tokens == 64 * 64);  // 1024 px: latents of 128, packed 2 x 2
  CHECK(a->repeat == 19 + 1 + 38);  // the double blocks, the join, the single blocks
  REQUIRE(decode_architecture("flux_dit", "height=768,width=512,max_sequence_length=77", a).empty());
  CHECK(a->tokens == 48 * 32);  // 1,536 image tokens at 512 x 768
  // The single blocks run on the joint rows, text first: 77 + 1,536.
  CHECK(a->blocks.back().tensors[static_cast<size_t>(a->blocks.back().input)].shape == std::vector<int64_t>{77 + 1536, 3072});
}

TEST_CASE("flux_dit: one single-stream block's saved set, under LoRA and under an NF4 base", "[architecture][dit]") {
  const int64_t T = 64 + 256, C = 3072, H = 24, r = 4, b = 2;
  auto per_block = [&](Config c) {
    c.training.micro_batch_size = b;
    Config one = c, two = c;
    one.model.architecture_args += ",num_single_layers=1";
    two.model.architecture_args += ",num_single_layers=2";
    INFO(errors_of(two));
    REQUIRE(validate(two).empty());
    return activations_before_backward(two) - activations_before_backward(one);
  };
  // bf16 weights: the LayerNorm's fp32 copy of its input (autocast's fp32 list) 4 TC and its mean and rstd 8 T; GELU's
  // input [T, 4C] 8 TC; each LoRA linear's autocast copy of its input 2 TC and lora_B's input 2 T r; each per-head
  // RMSNorm's fp32 copy 4 TC and rstd 4 T H; SDPA's q, k, v and output 8 TC and logsumexp 4 H T; the modulation row
  // [1, 3C] (bf16) the multiplies keep.
  const int64_t lora = b * (34 * T * C + 8 * T + 6 * T * r + 12 * T * H + 6 * C);
  CHECK(per_block(flux_lora()) == lora);
  // An NF4 base (bitsandbytes Linear4bit returns its input's dtype: the fp32 stream a LayerNorm under autocast
  // makes): the LayerNorm keeps its fp32 input itself 4 TC, GELU's input is fp32 16 TC, the RMSNorms keep their fp32
  // inputs 8 TC, SDPA keeps bf16 copies of the fp32 q, k, v and its own bf16 output 8 TC (the op's output is the
  // cast back to fp32, .to(query.dtype)); the LoRA inputs as before. 42 TC in all (flux-dit.md section 8, table Q).
  Config q = flux_lora();
  q.peft.base_quantization = "nf4";
  const int64_t nf4 = b * (42 * T * C + 8 * T + 6 * T * r + 12 * T * H + 6 * C);
  CHECK(per_block(q) == nf4);
}

TEST_CASE("flux_dit: QLoRA's weights, the ledger in every variant, and what a program refuses", "[architecture][dit]") {
  Config c = flux_lora();
  c.model.architecture_args = "vae_on_gpu=0,text_encoder_on_gpu=0,text_encoder_2_on_gpu=0,height=768,width=512,max_sequence_length=77";
  c.peft.base_quantization = "nf4";
  c.peft.target_modules = "to_k,to_q,to_v,to_out.0";
  c.training.activation_checkpointing = "full";
  REQUIRE(errors_of(c).empty());
  const Result r = simulate(c);
  REQUIRE(r.ok);
  CHECK(r.params_trainable == 4669440);  // the blog's rank-4 adapters
  // Every nn.Linear in NF4, 64-element blocks with an fp32 absmax each: 11,898,322,944 weights x (1/2 + 4/64);
  // the 3,085,376 biases and RMSNorm weights fp32 after prepare_model_for_kbit_training; the adapters fp32.
  const int64_t nf4 = 11898322944 / 2 + 11898322944 / 64 * 4;
  CHECK(r.model_states.weights_bytes == nf4 + 4 * int64_t{3085376} + 4 * int64_t{4669440});
  CHECK(ledger_problem(r.devices[0].program).empty());
  // The transients of each quantized linear are on the timeline.
  bool dequant = false;
  for (const auto& l : r.devices[0].program.labels) dequant |= l.find("dequantized") != std::string::npos;
  CHECK(dequant);
  for (const char* v : {"none", "full"})
    for (const char* quant : {"none", "nf4", "int8"}) {
      Config x = flux_lora();
      x.training.activation_checkpointing = v;
      x.peft.base_quantization = quant;
      x.training.gradient_accumulation_steps = 2;
      INFO(v << " " << quant);
      const Result rx = simulate(x);
      REQUIRE(rx.ok);
      CHECK(ledger_problem(rx.devices[0].program).empty());
    }
  Config z3 = flux_lora();
  z3.parallel.zero_stage = 3;
  z3.parallel.data_parallel_size = 2;
  const Result rz = simulate(z3);
  REQUIRE(rz.ok);
  CHECK(ledger_problem(rz.devices[0].program).empty());
  // GPTQ and AWQ bases are for the built-in decoders.
  Config gptq = flux_lora();
  gptq.peft.base_quantization = "gptq";
  CHECK(errors_of(gptq).find("peft.base_quantization") != std::string::npos);
}

TEST_CASE("flux_dit's ops: shapes, parameters and field errors", "[architecture][dit]") {
  auto with_block_op = [](const char* json_op) {
    return program_edited("flux_dit", [&](nlohmann::ordered_json& j) {
      auto& ops = j["blocks"].back()["ops"];
      ops.insert(ops.begin(), nlohmann::ordered_json::parse(json_op));
    });
  };
  // A per-head RMSNorm's unit divides the width; a slice of rows stays within them; rotary needs an activation.
  CHECK(first_error(with_block_op(R"({"op": "rms_norm", "name": "n", "in": "x", "unit": 100, "out": "bad"})")).find("unit (100) must divide") != std::string::npos);
  CHECK(first_error(with_block_op(R"({"op": "slice", "in": "x", "axis": "tokens", "start": 10, "size": 100000, "out": "bad"})")).find("past the") != std::string::npos);
  CHECK(first_error(with_block_op(R"({"op": "slice", "in": "x", "axis": "channels", "start": 0, "size": 1, "out": "bad"})")).find("must be features") != std::string::npos);
  CHECK(first_error(with_block_op(R"({"op": "rms_norm", "name": "n", "in": "x", "variant": "llama", "out": "bad"})")).find("must be transformers") != std::string::npos);
  // A row broadcasts over token rows only where its width matches.
  CHECK(first_error(with_block_op(R"({"op": "mul", "in": ["x", "s_emb"], "out": "bad"})")).find("not produced") != std::string::npos);
  const std::string wide_row = program_edited("flux_dit", [](nlohmann::ordered_json& j) {
    auto& ops = j["blocks"].back()["ops"];
    ops.insert(ops.begin() + 2, nlohmann::ordered_json::parse(R"({"op": "mul", "in": ["x", "s_emb"], "out": "bad"})"));
  });
  CHECK(first_error(wide_row).find("one row [1, width]") != std::string::npos);
  // layer_norm without affine owns nothing; a per-head rms_norm owns [unit].
  std::shared_ptr<const Architecture> a;
  REQUIRE(decode_architecture("flux_dit", "", a).empty());
  const ModelShape s = build_program_shape(a);
  int64_t norms = 0;
  for (const auto& t : s.block_kinds.back()) {
    CHECK(t.name.find("norm.norm") == std::string::npos);  // AdaLayerNormZeroSingle's LayerNorm: no weight
    if (t.kind == ParamKind::Norm) norms += t.numel;
  }
  CHECK(norms == 2 * 128);  // norm_q and norm_k over head_dim
}

TEST_CASE("rms_norm's diffusers variant keeps its input beside the fp32 copy", "[architecture][dit]") {
  // diffusers' RMSNorm (v0.30-v0.34): x * rsqrt(...) multiplies the 16-bit input itself, which the product saves
  // besides pow's fp32 copy: 2 bytes an element more than the composite norm.
  const std::string diffusers = program_edited("flux_dit", [](nlohmann::ordered_json& j) {
    for (auto& op : j["blocks"].back()["ops"])
      if (op["op"] == "rms_norm") op["variant"] = "diffusers";
  });
  Config base = flux_lora("num_single_layers=1");
  Config alt = base;
  alt.model.architecture = diffusers;
  REQUIRE(validate(alt).empty());
  const int64_t T = 64 + 256, C = 3072;
  CHECK(activations_before_backward(alt) - activations_before_backward(base) == 2 * (2 * T * C));
}

TEST_CASE("sd3_mmdit: SD3-medium's exact count, its tokens, its LoRA, the position buffer beside it", "[architecture][dit]") {
  // 2,028,328,000: SD3Transformer2DModel(**stable-diffusion-3-medium-diffusers/transformer/config.json)
  // .num_parameters() (sd3-mmdit.md section 1): 23 joint blocks of 84,980,736 and the context_pre_only last block of
  // 54,294,528, which has no to_add_out, norm2_context or ff_context.
  Config c;
  c.model.architecture = "sd3_mmdit";
  CHECK(model_shape_of(c.model).params_total == 2028328000);
  std::shared_ptr<const Architecture> a;
  REQUIRE(decode_architecture("sd3_mmdit", "", a).empty());
  CHECK(a->tokens == 64 * 64);  // 1024 px: latents of 128, 2 x 2 patches
  CHECK(a->repeat == 24);
  // The text rows: 77 CLIP tokens and 77 T5 tokens, the training scripts' --max_sequence_length.
  std::vector<int64_t> text_rows;
  for (const auto& t : a->blocks[0].tensors)
    if (t.name == "ctx0") text_rows = t.shape;
  CHECK(text_rows == std::vector<int64_t>{154, 1536});
  REQUIRE(decode_architecture("sd3_mmdit", "resolution=256", a).empty());
  CHECK(a->tokens == 16 * 16);
  // The Colab recipe's LoRA (rank 4 on to_k, to_q, to_v, to_out.0): the image side's four projections of 24 blocks.
  Config lora = flux_lora();
  lora.model.architecture = "sd3_mmdit";
  lora.model.architecture_args = "resolution=256";
  lora.peft.target_modules = "to_k,to_q,to_v,to_out.0";
  lora.training.precision = "fp16_autocast";
  lora.training.activation_checkpointing = "full";
  REQUIRE(errors_of(lora).empty());
  const Result r = simulate(lora);
  REQUIRE(r.ok);
  CHECK(r.params_trainable == 96 * 4 * (1536 + 1536));
  CHECK(ledger_problem(r.devices[0].program).empty());
  // Beside it: the VAE in fp32 and the 192^2 x 1536 position buffer, which moves with the transformer: 16-bit here,
  // fp32 where the transformer trains in fp32 (amp). The text encoders are deleted after the prompt's encoding.
  const int64_t buffer = int64_t{192} * 192 * 1536;
  CHECK(r.model_states.other_models_bytes == 4 * int64_t{83819683} + 2 * buffer);
  Config full = lora;
  full.peft.method = "none";
  full.training.precision = "amp_fp16";
  full.training.optimizer = "adamw_8bit";
  full.training.activation_checkpointing = "none";
  REQUIRE(errors_of(full).empty());
  const Result rf = simulate(full);
  REQUIRE(rf.ok);
  CHECK(rf.model_states.other_models_bytes == 4 * int64_t{83819683} + 4 * buffer);
  CHECK(ledger_problem(rf.devices[0].program).empty());
  // The week's scripts that left the text encoders on the GPU: 5,580,620,800 more parameters in fp16.
  Config leak = full;
  leak.model.architecture_args = "resolution=256,text_encoder_on_gpu=1,text_encoder_2_on_gpu=1,text_encoder_3_on_gpu=1";
  const Result rl = simulate(leak);
  REQUIRE(rl.ok);
  CHECK(rl.model_states.other_models_bytes - rf.model_states.other_models_bytes == 2 * int64_t{5580620800});
}

TEST_CASE("sd35_large_mmdit and sd35_medium_mmdit: SD3.5's exact counts, q/k norms as diffusers' RMSNorm, dual attention", "[architecture][dit]") {
  // 8,056,627,520 (sd3-mmdit.md section 1): 38 joint blocks of 38 heads with q/k RMSNorm weights [64].
  Config c;
  c.model.architecture = "sd35_large_mmdit";
  CHECK(model_shape_of(c.model).params_total == 8056627520);
  std::shared_ptr<const Architecture> a;
  REQUIRE(decode_architecture("sd35_large_mmdit", "", a).empty());
  int norms = 0;
  for (const auto& op : a->blocks[0].ops)
    if (op.kind == OpKind::RmsNorm) norms += op.diffusers && op.unit == 64;
  CHECK(norms == 4);  // norm_q, norm_k, norm_added_q, norm_added_k
  // SD3.5 Medium: 2,243,171,520, its first 13 blocks with dual attention (nine modulation chunks and attn2 over the
  // image rows, with its own q/k norms), a 384^2 position table beside it.
  c.model.architecture = "sd35_medium_mmdit";
  CHECK(model_shape_of(c.model).params_total == 2243171520);
  REQUIRE(decode_architecture("sd35_medium_mmdit", "", a).empty());
  int attentions = 0;
  for (const auto& op : a->blocks[12].ops) attentions += op.kind == OpKind::Attention;
  CHECK(attentions == 2);
  attentions = 0;
  for (const auto& op : a->blocks[13].ops) attentions += op.kind == OpKind::Attention;
  CHECK(attentions == 1);
  for (const char* program : {"sd35_large_mmdit", "sd35_medium_mmdit"}) {
    INFO(program);
    Config lora = flux_lora();
    lora.model.architecture = program;
    lora.model.architecture_args = "resolution=256";
    lora.peft.target_modules = "to_k,to_q,to_v,to_out.0";
    lora.training.precision = "fp16_autocast";
    lora.training.activation_checkpointing = "full";
    REQUIRE(errors_of(lora).empty());
    const Result r = simulate(lora);
    REQUIRE(r.ok);
    CHECK(ledger_problem(r.devices[0].program).empty());
  }
}

TEST_CASE("bitsandbytes under a program: which linears, and what a non-reentrant checkpoint keeps", "[architecture][dit]") {
  // Only a linear's weight is replaced, and not the modules the program keeps as they are: transformers'
  // get_keys_to_not_convert leaves ViT's classifier (the last module) in its dtype.
  std::shared_ptr<const Architecture> a;
  REQUIRE(decode_architecture("vit", "", a).empty());
  ModelShape s = build_program_shape(a);
  PeftConfig peft;
  peft.method = "lora";
  peft.base_quantization = "nf4";
  peft.target_modules = "query,value";
  apply_peft(s, peft, false);
  bool query = false, classifier = false, position = false;
  for (const auto& t : s.post) classifier |= t.name == "classifier.weight" && t.quantized;
  for (const auto& t : s.pre) position |= t.quantized && t.name.find("position") != std::string::npos;
  for (const auto& t : s.layer) query |= t.name.ends_with("query.weight") && t.quantized;
  CHECK(query);
  CHECK_FALSE(classifier);
  CHECK_FALSE(position);
  // diffusers checkpoints with use_reentrant=False, so auto resolves so for its programs. The first forward then
  // keeps what bitsandbytes' nodes hold as attributes: LLM.int8's input (MatMul8bitLt's ctx.tensors) for every
  // quantized linear whose input needs a gradient, until the graph goes; a 4-bit base from 0.43.2 keeps nothing.
  Config c = flux_lora();
  c.training.activation_checkpointing = "full";
  c.peft.base_quantization = "int8";
  CHECK_FALSE(resolve(c).checkpoint_reentrant);
  Config reentrant = c;
  reentrant.training.checkpoint_reentrant = "true";
  const int64_t held = activations_before_backward(c) - activations_before_backward(reentrant);
  CHECK(held > 0);
  Config nf4 = c, nf4_re = reentrant;
  nf4.peft.base_quantization = nf4_re.peft.base_quantization = "nf4";
  CHECK(activations_before_backward(nf4) == activations_before_backward(nf4_re));
  const Result r = simulate(c);
  REQUIRE(r.ok);
  CHECK(ledger_problem(r.devices[0].program).empty());
}
