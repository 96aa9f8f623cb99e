// Encoder-decoder models (T5 family): the HF config.json importer, what is refused, and the saved activations of
// the step against closed forms derived by hand from transformers' modeling_t5.py (see encoder_decoder.cpp for the
// per-op reasons). Bytes are requested bytes of live activation tensors at the start of the first backward.
#include <catch2/catch.hpp>

#include "core/serialize.h"
#include "core/simulate.h"
#include "test_util.h"

using namespace memsim;

static ModelConfig import(const std::string& file, std::vector<std::string>* notes = nullptr) {
  Parsed p = model_from_hf_json(read_file(source_path("tests/data/hf/" + file)));
  INFO(file << ": " << (p.errors.empty() ? "" : p.errors[0].message));
  REQUIRE(p.ok);
  if (notes) *notes = p.notes;
  return p.config.model;
}

TEST_CASE("T5 config.json files import with T5Config's semantics", "[t5][serialize]") {
  std::vector<std::string> notes;
  // google-t5/t5-base at revision 666f4ee: no model_type, no feed_forward_proj, no tie_word_embeddings, no
  // num_decoder_layers; T5Config's defaults apply (relu, tied, decoder as deep as the encoder).
  ModelConfig base = import("t5-base.json", &notes);
  CHECK(base.model_type == "t5");
  CHECK(base.is_encoder_decoder);
  CHECK(base.hidden_size == 768);
  CHECK(base.head_dim == 64);
  CHECK(base.num_attention_heads == 12);
  CHECK(base.num_key_value_heads == 12);
  CHECK(base.intermediate_size == 3072);
  CHECK(base.num_hidden_layers == 12);
  CHECK(base.num_decoder_layers == 12);
  CHECK(base.tie_word_embeddings);
  CHECK_FALSE(base.mlp_gated);
  CHECK(base.hidden_act == "relu");
  CHECK(base.attention_dropout == 0.1);
  CHECK(base.hidden_dropout == 0.1);
  CHECK(base.relative_attention_num_buckets == 32);
  CHECK(base.norm_type == NormType::RMSNorm);
  bool inferred = false;
  for (const auto& n : notes) inferred |= n.find("read as model_type t5") != std::string::npos;
  CHECK(inferred);
  // T5 v1.1 / T0: gated-gelu is the tanh approximation gelu_new (T5Config.__init__), and the head is untied.
  ModelConfig t0 = import("t0_3b.json");
  CHECK(t0.mlp_gated);
  CHECK(t0.hidden_act == "gelu_new");
  CHECK_FALSE(t0.tie_word_embeddings);
  CHECK(t0.head_dim == 64);
  CHECK(t0.hidden_size == 2048);
  // mT5 (mt0-xxl): model_type mt5, 250,112-token vocabulary, 64 heads of 64 = d_model 4096.
  ModelConfig mt0 = import("mt0-xxl.json");
  CHECK(mt0.model_type == "mt5");
  CHECK(mt0.is_encoder_decoder);
  CHECK(mt0.vocab_size == 250112);
  CHECK(mt0.mlp_gated);
  CHECK(mt0.hidden_act == "gelu_new");
  CHECK_FALSE(mt0.tie_word_embeddings);
  CHECK(mt0.num_decoder_layers == 24);
  // t5-3b: 32 heads of d_kv 128, so the attention width (4096) is four times d_model.
  ModelConfig t3 = import("t5-3b.json");
  CHECK(t3.head_dim == 128);
  CHECK(t3.hidden_size == 1024);
}

TEST_CASE("T5 configs round-trip through memsim JSON and the link", "[t5][serialize]") {
  Config c;
  c.model = import("mt0-xxl.json");
  c.training.decoder_sequence_length = 128;
  Parsed j = config_from_json(config_to_json(c));
  REQUIRE(j.ok);
  CHECK(j.config == c);
  Parsed f = config_from_fragment(config_to_fragment(c));
  REQUIRE(f.ok);
  CHECK(f.config == c);
}

TEST_CASE("encoder-decoders other than T5 are refused on import", "[t5][serialize]") {
  // BART-style configs say is_encoder_decoder too; modelling them as T5 would be wrong.
  Parsed p = model_from_hf_json(R"({"model_type": "bart", "is_encoder_decoder": true, "d_model": 1024,
      "encoder_layers": 12, "num_hidden_layers": 12, "num_attention_heads": 16, "intermediate_size": 4096,
      "vocab_size": 50265})");
  REQUIRE_FALSE(p.ok);
  CHECK(p.errors[0].field == "model.is_encoder_decoder");
}

static Config t5_config(const std::string& file, int64_t b, int64_t s, int64_t t) {
  Config c = single_gpu_config(file, b, s);
  c.training.decoder_sequence_length = t;
  c.training.attention = "auto";
  return c;
}

TEST_CASE("what the encoder-decoder step refuses, with the field", "[t5][validate]") {
  auto refused = [](Config c, const std::string& field) {
    Result r = simulate(c);
    REQUIRE_FALSE(r.ok);
    bool found = false;
    for (const auto& e : r.errors) found |= e.field == field;
    INFO(r.errors[0].field << ": " << r.errors[0].message);
    CHECK(found);
  };
  const Config base = t5_config("t5-base.json", 1, 128, 32);
  REQUIRE(simulate(base).ok);
  Config c = base;
  c.parallel.tensor_parallel_size = 2;
  refused(c, "parallel.tensor_parallel_size");
  c = base;
  c.parallel.pipeline_parallel_size = 2;
  refused(c, "parallel.pipeline_parallel_size");
  c = base;
  c.training.attention = "sdpa";
  refused(c, "training.attention");
  c = base;
  c.training.activation_checkpointing = "selective";
  refused(c, "training.activation_checkpointing");
  c = base;
  c.training.framework = "torchtune";
  refused(c, "training.framework");
  c = base;
  c.training.precision = "fp8_te";
  refused(c, "training.precision");
  c = base;
  c.parallel.context_parallel_size = 2;
  refused(c, "parallel.context_parallel_size");
  c = base;
  c.training.loss = "chunked_fp32";
  refused(c, "training.loss");
  c = base;
  c.peft.method = "lora";
  c.peft.target_modules = "q_proj,v_proj";  // Llama's names; T5's are q and v
  refused(c, "peft.target_modules");
  c.peft.target_modules = "q,v";
  CHECK(simulate(c).ok);
}

static int64_t live_at_backward(const Config& c) {
  Result r = simulate(c);
  INFO((r.errors.empty() ? "" : r.errors[0].message));
  REQUIRE(r.ok);
  return live_bytes_before_phase(r.devices[0].program, "backward", Component::Activations);
}

// A tiny T5 v1.0 block layout: d_model 8, 2 heads of d_kv 4, d_ff 16, vocab 10, one block per stack.
static Config tiny(int64_t b, int64_t s, int64_t t) {
  Config c;
  auto& m = c.model;
  m.model_type = "t5";
  m.is_encoder_decoder = true;
  m.hidden_size = 8;
  m.num_attention_heads = m.num_key_value_heads = 2;
  m.head_dim = 4;
  m.intermediate_size = 16;
  m.vocab_size = 10;
  m.num_hidden_layers = 1;
  m.num_decoder_layers = 1;
  m.tie_word_embeddings = false;
  m.mlp_gated = false;
  m.hidden_act = "relu";
  m.attention_dropout = m.hidden_dropout = 0.0;
  c.training.micro_batch_size = b;
  c.training.sequence_length = s;
  c.training.decoder_sequence_length = t;
  c.training.framework = "hf_trainer";
  c.training.precision = "bf16_pure";
  c.training.activation_checkpointing = "none";
  c.parallel.zero_stage = 0;
  c.parallel.data_parallel_size = 1;
  return c;
}

TEST_CASE("tiny encoder-decoder: every saved byte derived by hand", "[t5][activations]") {
  // bf16 everywhere (2 B), no dropout, untied head, HF Trainer (it drops the outputs, the decoder's k/v cache among
  // them, before backward). T = b*s source tokens, U = b*t target tokens, hq = heads*d_kv.
  const int64_t b = 2, s = 8, t = 4, h = 8, a = 2, hq = 8, f = 16, V = 10, T = b * s, U = b * t;
  // Inputs: input_ids, labels and the shifted decoder_input_ids, int64: 8(T + 2U).
  const int64_t inputs = 8 * (T + 2 * U);
  // Each T5LayerNorm on n tokens: rstd 4n, the fp32 copy of its input 4nh (pow), the input itself 2nh (x * rsqrt),
  // the normalised bf16 h 2nh (weight * h): 4n + 8nh; plus its output 2nh where a matmul saves it.
  auto norm = [&](int64_t n, bool out_saved) { return 4 * n + 8 * n * h + (out_saved ? 2 * n * h : 0); };
  // Each eager T5Attention with nq queries and nk keys: bmm copies of q and k, v's copy, the context read by o
  // (2 B each), the fp32 softmax and its bf16 cast read by the second bmm: 6 B per score.
  auto attn = [&](int64_t nq, int64_t nk, int64_t sq, int64_t sk) {
    return 2 * nq * hq + 2 * nk * hq + 2 * nk * hq + 2 * nq * hq + 6 * a * b * sq * sk;
  };
  // relu saves its result, which is also wo's input: 2nf.
  const int64_t encoder = norm(T, true) + 8 * s * s /* int64 position buckets */ + attn(T, T, s, s) +
                          norm(T, true) + 2 * T * f +
                          norm(T, false) + 2 * T * h /* final norm; its output is the encoder output */;
  const int64_t decoder = norm(U, true) + 8 * t * t + attn(U, U, t, t) +
                          norm(U, true) + attn(U, T, t, s) /* k and v read the encoder output, counted above */ +
                          norm(U, true) + 2 * U * f +
                          norm(U, true) /* final norm; its output is lm_head's input */ +
                          2 * U * V /* log_softmax of the bf16 logits */;
  const Config c = tiny(b, s, t);
  CHECK(live_at_backward(c) == inputs + encoder + decoder);
  // With decoder_sequence_length 0 the decoder runs on the source length.
  Config same = tiny(b, s, 0), explicit_same = tiny(b, s, s);
  CHECK(live_at_backward(same) == live_at_backward(explicit_same));
}

static int64_t per_block(Config c, bool decoder) {
  auto& m = c.model;
  const int64_t one = live_at_backward(c);
  (decoder ? m.num_decoder_layers : m.num_hidden_layers) += 1;
  return live_at_backward(c) - one;
}

TEST_CASE("T5 blocks with dropout, the decoder's cache and checkpointing", "[t5][activations]") {
  const int64_t b = 2, s = 8, t = 4, h = 8, a = 2, hq = 8, f = 16, T = b * s, U = b * t;
  Config c = tiny(b, s, t);
  c.model.num_hidden_layers = c.model.num_decoder_layers = 2;  // the added block is not a stack's first
  // Encoder block, no dropout: two norms (4T + 10Th each), attention (8T hq + 6 a b s^2), relu (2Tf).
  const int64_t enc = 8 * T + 20 * T * h + 8 * T * hq + 6 * a * b * s * s + 2 * T * f;
  CHECK(per_block(c, false) == enc);
  // Decoder block: three norms, self-attention over t, cross-attention (q and the context over U, k and v copies
  // over T), relu.
  const int64_t dec = 12 * U + 30 * U * h + 12 * U * hq + 4 * T * hq + 6 * a * b * t * t + 6 * a * b * t * s + 2 * U * f;
  CHECK(per_block(c, true) == dec);
  // dropout_rate 0.1: a 1-byte mask per attention probability (whose dropped copy replaces the cast), per hidden
  // unit after attention and after the MLP, and per MLP unit, where wo then saves the dropped copy (2Tf) besides
  // relu's result.
  Config d = c;
  d.model.attention_dropout = d.model.hidden_dropout = 0.1;
  CHECK(per_block(d, false) == enc + a * b * s * s + 2 * T * h + T * f + 2 * T * f);
  // fp16 weights (DeepSpeed fp16): T5Block clamps the hidden states after every sublayer, and clamp saves the
  // unclamped sum: 2 B per token and hidden unit per sublayer.
  Config f16 = c;
  f16.training.precision = "fp16_mixed";
  CHECK(per_block(f16, false) == enc + 2 * 2 * T * h);
  CHECK(per_block(f16, true) == dec + 3 * 2 * U * h);
  // A plain loop (hf_loop) holds the outputs, the decoder's cache among them, through backward: each decoder block
  // adds its self-attention k and v (2Uhq each) and cross-attention k and v (2Thq each).
  Config loop = c;
  loop.training.framework = "hf_loop";
  CHECK(per_block(loop, true) == dec + 4 * U * hq + 4 * T * hq);
  // torch <= 1.10: softmax(scores.float()) also kept its input, the fp32 copy of the scores (4 B per score).
  Config old = c;
  old.training.softmax_saves_input = "true";
  CHECK(per_block(old, false) == enc + 4 * a * b * s * s);
  CHECK(per_block(old, true) == dec + 4 * a * b * t * t + 4 * a * b * t * s);
  // Full checkpointing: each block keeps its input only (bf16 residual), and the cache is off.
  Config ck = c;
  ck.training.activation_checkpointing = "full";
  CHECK(per_block(ck, false) == 2 * T * h);
  CHECK(per_block(ck, true) == 2 * U * h);
}

TEST_CASE("T5 v1.1 block under autocast: fp32 residual, gelu_new in eager ops", "[t5][activations]") {
  // amp_bf16 over fp32 weights, gated-gelu, no dropout. Norm: rstd 4T, the fp32 input 4Th (its own fp32 copy),
  // fp32 h 4Th, one bf16 cast of the output per matmul. Attention as in bf16. MLP: pow's fp32 copy of wi_0's output,
  // tanh, 0.5 x (bf16), 1 + tanh, the fp32 activation, wi_1's output (bf16), wo's bf16 cast of the fp32 product:
  // 4 + 4 + 2 + 4 + 4 + 2 + 2 = 22 B per MLP unit.
  const int64_t b = 2, s = 8, t = 4, h = 8, a = 2, hq = 8, f = 16, T = b * s;
  Config c = tiny(b, s, t);
  c.model.num_hidden_layers = c.model.num_decoder_layers = 2;
  c.model.mlp_gated = true;
  c.model.hidden_act = "gelu_new";
  c.training.precision = "amp_bf16";
  const int64_t attn_norm = 4 * T + 8 * T * h + 3 * 2 * T * h;
  const int64_t mlp_norm = 4 * T + 8 * T * h + 2 * 2 * T * h;
  CHECK(per_block(c, false) == attn_norm + 8 * T * hq + 6 * a * b * s * s + mlp_norm + 22 * T * f);
  // The same block in pure bf16: norms 4T + 10Th, and the MLP saves wi_0's output, tanh, 0.5 x, 1 + tanh, the
  // activation, wi_1's output and their product (wo's input), 2 B each.
  c.training.precision = "bf16_pure";
  CHECK(per_block(c, false) == 8 * T + 20 * T * h + 8 * T * hq + 6 * a * b * s * s + 14 * T * f);
}

TEST_CASE("memory never falls as the source or the target grows", "[t5][property]") {
  for (const char* ck : {"none", "full"}) {
    for (const char* prec : {"bf16_pure", "amp_bf16", "fp32"}) {
      Config c = t5_config("t0_3b.json", 1, 64, 16);
      c.model.num_hidden_layers = c.model.num_decoder_layers = 2;
      c.training.activation_checkpointing = ck;
      c.training.precision = prec;
      for (bool target : {false, true}) {
        int64_t prev_alloc = 0, prev_act = 0;
        for (int64_t len : {16, 64, 128, 256, 512}) {
          Config x = c;
          (target ? x.training.decoder_sequence_length : x.training.sequence_length) = len;
          Result r = simulate(x);
          REQUIRE(r.ok);
          // Requested bytes: the allocated peak also carries the allocator's block rounding, which can move a few
          // hundred KiB either way when sizes change.
          const int64_t alloc = r.devices[0].peak.requested_bytes;
          const int64_t acts = live_bytes_before_phase(r.devices[0].program, "backward", Component::Activations);
          INFO(ck << " " << prec << (target ? " target " : " source ") << len);
          CHECK(alloc >= prev_alloc);
          CHECK(acts > prev_act);
          prev_alloc = alloc, prev_act = acts;
        }
      }
    }
  }
}

TEST_CASE("T5 presets simulate under ZeRO and LoRA", "[t5][simulate]") {
  // The default scenario's layout (DeepSpeed ZeRO-3 on 8 GPUs, bf16, full checkpointing) with mt0-xxl.
  Config c;
  c.model = import("mt0-xxl.json");
  c.training.sequence_length = 512;
  c.training.decoder_sequence_length = 128;
  c.training.micro_batch_size = 2;
  for (int64_t stage : {0, 1, 2, 3}) {
    c.parallel.zero_stage = stage;
    Result r = simulate(c);
    INFO("stage " << stage << ": " << (r.errors.empty() ? "" : r.errors[0].message));
    REQUIRE(r.ok);
    CHECK(r.params_total == 12921057280);
  }
  // FSDP (HF Trainer through accelerate) and ZeRO-Offload take the same per-block hooks.
  c.parallel.zero_stage = 3;
  for (const char* sharding : {"fsdp1", "fsdp2"}) {
    c.parallel.sharding = sharding;
    REQUIRE(simulate(c).ok);
  }
  c.parallel.sharding = "auto";
  c.parallel.offload_optimizer = "cpu";
  Result off = simulate(c);
  REQUIRE(off.ok);
  CHECK(off.devices[0].model_states.optimizer_bytes == 0);
  // PEFT's default LoRA targets for T5 (q and v), every self- and cross-attention: r (d_model + hq) per module.
  Config l = t5_config("t0_3b.json", 8, 256, 8);
  l.training.precision = "fp32";
  l.peft.method = "lora";
  l.peft.lora_rank = 8;
  l.peft.target_modules = "q,v";
  Result r = simulate(l);
  REQUIRE(r.ok);
  const int64_t modules = 2 * (24 + 2 * 24);  // q and v of 24 encoder and 24 decoder self- and cross-attentions
  CHECK(r.params_trainable == modules * 8 * (2048 + 2048));
}
