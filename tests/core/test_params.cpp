// Exact parameter counts against the totals the publishers state, read from the models' real config.json.
#include <catch2/catch.hpp>

#include "core/model.h"
#include "core/serialize.h"
#include "test_util.h"

using namespace memsim;

static int64_t params_of(const std::string& hf_file) {
  Parsed p = model_from_hf_json(read_file(source_path("tests/data/hf/" + hf_file)));
  INFO(hf_file << ": " << (p.errors.empty() ? "" : p.errors[0].message));
  REQUIRE(p.ok);
  return build_model_shape(p.config.model).params_total;
}

TEST_CASE("parameter counts equal published totals", "[params]") {
  // meta-llama/Meta-Llama-3-8B model card / safetensors index: 8,030,261,248
  CHECK(params_of("llama-3-8b.json") == 8030261248);
  // meta-llama/Llama-2-7b-hf safetensors metadata: 6,738,415,616
  CHECK(params_of("llama-2-7b.json") == 6738415616);
  // openai-community/gpt2 (GPT-2 small): 124,439,808 (tied head, learned positions, biases, LayerNorm)
  CHECK(params_of("gpt2.json") == 124439808);
  // mistralai/Mistral-7B-v0.1 safetensors metadata: 7,241,732,096
  CHECK(params_of("mistral-7b-v0.1.json") == 7241732096);
  // meta-llama/Llama-3.2-3B and -1B safetensors metadata: 3,212,749,824 and 1,235,814,400 (tied)
  CHECK(params_of("llama-3.2-3b.json") == 3212749824);
  CHECK(params_of("llama-3.2-1b.json") == 1235814400);
  // google-bert/bert-large-uncased: BertModel 335,141,888 (the HF checkpoint's total with pooler), plus the
  // 2-label classifier of BertForSequenceClassification, 1024 * 2 + 2
  CHECK(params_of("bert-large-uncased.json") == 335141888 + 2050);
  // Qwen/Qwen2.5-0.5B safetensors metadata: 494,032,768 (q/k/v biases, tied embeddings)
  CHECK(params_of("qwen2.5-0.5b.json") == 494032768);
}

static ModelShape shape_of(const std::string& hf_file) {
  Parsed p = model_from_hf_json(read_file(source_path("tests/data/hf/" + hf_file)));
  REQUIRE(p.ok);
  return build_model_shape(p.config.model);
}

TEST_CASE("mixture-of-experts and latent-attention models", "[params][moe]") {
  // mistralai/Mixtral-8x7B-v0.1: 46,702,792,704 parameters (safetensors metadata), 12.9B active per token
  ModelShape mixtral = shape_of("mixtral-8x7b.json");
  CHECK(mixtral.params_total == 46702792704);
  CHECK(mixtral.params_active_per_token == Approx(12.9e9).epsilon(0.01));
  // DeepSeek-V3 report (arXiv:2412.19437): 671B total, 37B activated; MEMORY_FORMULAS.md 1.1 derives
  // 671,026,419,200 and 187,107,328 attention parameters per layer (MLA with both norm vectors).
  ModelShape ds = shape_of("deepseek-v3.json");
  CHECK(ds.params_total == 671026419200);
  CHECK(ds.params_active_per_token == Approx(37.55e9).epsilon(0.005));
  CHECK(ds.num_dense_layers == 3);
  int64_t attn = 0;
  for (const auto& t : ds.layer)
    if (t.name.rfind("self_attn", 0) == 0) attn += t.numel;
  CHECK(attn == 187107328);  // q_a_layernorm and kv_a_layernorm included
  // Qwen/Qwen3-30B-A3B model card: 30.5B total, 3.3B activated
  ModelShape qwen = shape_of("qwen3-30b-a3b.json");
  CHECK(qwen.params_total == Approx(30.5e9).epsilon(0.002));
  CHECK(qwen.params_active_per_token == Approx(3.3e9).epsilon(0.02));
  // baidu/ERNIE-4.5-21B-A3B-PT (the keys of its config.json as transcribed by inference engines' tests; the
  // weights file is not here): Unsloth's notebook prints 22,002,983,104 parameters with 177,545,216 of LoRA, so
  // 21,825,437,888: layer 0 dense, layers 1-27 of 64 experts and 2 shared ones, each MoE layer with
  // Ernie4_5_MoeStatics' [1, 64] correction bias.
  ModelShape ernie = shape_of("ernie-4.5-21b-a3b.json");
  CHECK(ernie.params_total == 21825437888);
  CHECK(ernie.num_dense_layers == 1);
  CHECK(ernie.params_active_per_token > 3.0e9);  // "A3B": 3B activated, the tied embedding's 0.26B besides
  CHECK(ernie.params_active_per_token < 3.5e9);
}

TEST_CASE("ERNIE 4.5's MoE layer range: what memsim cannot lay out is refused with the key", "[params][moe][bad-input]") {
  std::string cfg = read_file(source_path("tests/data/hf/ernie-4.5-21b-a3b.json"));
  const std::string interval = "\"moe_layer_interval\": 1";
  cfg.replace(cfg.find(interval), interval.size(), "\"moe_layer_interval\": 2");
  Parsed p = model_from_hf_json(cfg);
  REQUIRE(!p.ok);
  CHECK(p.errors[0].field == "moe_layer_interval");
}

TEST_CASE("hand-derived counts of each architecture option", "[params]") {
  ModelConfig m;
  m.hidden_size = 8;
  m.num_hidden_layers = 1;
  m.num_attention_heads = 2;
  m.num_key_value_heads = 1;
  m.head_dim = 4;
  m.intermediate_size = 16;
  m.vocab_size = 10;
  m.tie_word_embeddings = true;
  // embed 10*8=80; q 8*8=64, k 8*4=32, v 32, o 64; gate/up/down 3*8*16=384; 2 RMSNorms 16; final 8.
  CHECK(build_model_shape(m).params_total == 80 + 64 + 32 + 32 + 64 + 384 + 16 + 8);
  m.tie_word_embeddings = false;  // + lm_head 80
  CHECK(build_model_shape(m).params_total == 680 + 80);
  m.mlp_gated = false;  // - gate 128
  CHECK(build_model_shape(m).params_total == 760 - 128);
  m.norm_type = NormType::LayerNorm;  // + 3 shifts of 8
  CHECK(build_model_shape(m).params_total == 632 + 24);
  m.attention_bias = true;  // + q 8, k 4, v 4, o 8
  CHECK(build_model_shape(m).params_total == 656 + 24);
  m.mlp_bias = true;  // + up 16, down 8
  CHECK(build_model_shape(m).params_total == 680 + 24);
  m.position_embedding_type = PositionType::Absolute;
  m.max_position_embeddings = 5;  // + 5*8
  CHECK(build_model_shape(m).params_total == 704 + 40);
  m.head_dim = 8;  // heads * head_dim = 16 != hidden: q 8*16, k/v 8*8, o 16*8, biases 16+8+8+8
  ModelShape s = build_model_shape(m);
  CHECK(s.params_per_layer == 128 + 64 + 64 + 128 + (16 + 8 + 8 + 8) + 16 * 8 * 2 + 16 + 8 + 4 * 8);
}

TEST_CASE("MQA keeps one key/value head", "[params]") {
  ModelConfig m;
  m.hidden_size = 64;
  m.num_attention_heads = 8;
  m.num_key_value_heads = 1;
  m.head_dim = 0;  // derived: 8
  ModelShape s = build_model_shape(m);
  // q 64*64 + k 64*8 + v 64*8 + o 64*64 = 2h^2 + 2h*d_h (MEMORY_FORMULAS.md 1.1, MQA)
  int64_t attn = 0;
  for (const auto& t : s.layer)
    if (t.name.rfind("self_attn", 0) == 0) attn += t.numel;
  CHECK(attn == 2 * 64 * 64 + 2 * 64 * 8);
}

TEST_CASE("tensor parallel ranks hold their share of every parameter", "[params][tp]") {
  Parsed p = model_from_hf_json(read_file(source_path("tests/data/hf/llama-3-8b.json")));
  REQUIRE(p.ok);
  ModelShape full = build_model_shape(p.config.model);
  ModelShape rank = full;
  apply_tensor_parallel(rank, p.config.model, 4);
  // Everything splits four ways except the norms (2 per layer + the final one, 4096 each), which replicate.
  const int64_t norms = (2 * 32 + 1) * 4096;
  CHECK(rank.params_total * 4 - 3 * norms == full.params_total);
  // 16-way TP with 8 KV heads: each rank keeps one whole KV head (head_dim 128) for k and for v.
  ModelShape r16 = full;
  apply_tensor_parallel(r16, p.config.model, 16);
  int64_t k = 0;
  for (const auto& t : r16.layer)
    if (t.name == "self_attn.k_proj.weight") k = t.numel;
  CHECK(k == 4096 * 128);
}

TEST_CASE("T5 family: exact counts against the published totals", "[params][t5]") {
  // keras-team/keras-hub keras_nlp/models/t5/t5_presets.py @0ce2274f, backbone_presets metadata "params":
  // t5_base 222,903,552, t5_large 737,668,096, t5_3b 2,851,598,336 (T5 v1.0: tied head, ReLU MLP).
  // t5-base.json is google-t5/t5-base's config.json at revision 666f4ee, from before model_type existed.
  CHECK(params_of("t5-base.json") == 222903552);
  CHECK(params_of("t5-large.json") == 737668096);
  // t5-3b.json: google-t5/t5-3b's config.json as quoted in GitHub index id 54268972674 (up to task_specific_params,
  // whose remaining entries, which hold no sizes, are completed as in t5-large's file).
  CHECK(params_of("t5-3b.json") == 2851598336);
  // t5-11b: 11,307,321,344 in a parameter table of pre-trained models (GitHub index id 29090630826, whose t5-base,
  // t5-large and t5-3b entries equal KerasHub's). The config is google/t5-11b-ssm-tqao's, a fine-tune of t5-11b with
  // the same architecture (d_ff 65536, 128 heads of 128).
  CHECK(params_of("t5-11b-ssm-tqao.json") == 11307321344);
  // T5 v1.1 (gated-gelu, untied head): keras-hub keras_hub/src/models/t5/t5_presets.py @0e1444fd: t5_1.1_base
  // 247,577,856, t5_1.1_xl 2,849,757,184, t5_1.1_xxl 11,135,332,352; a T5 v1.1 training README's table (GitHub index
  // id 46124504) gives the same and large 783,150,080, the shape of google/flan-t5-large (HF page: 783M).
  CHECK(params_of("t5-v1_1-base.json") == 247577856);
  CHECK(params_of("t5-v1_1-xxl.json") == 11135332352);
  CHECK(params_of("flan-t5-large.json") == 783150080);
  // bigscience/T0_3B is T5 v1.1 XL LM-adapted (same config as t5_1.1_xl): 2,849,757,184; its fp32 model.safetensors
  // is 11.4 GB = 4 B x 2.85e9 (HF file listing).
  CHECK(params_of("t0_3b.json") == 2849757184);
  // bigscience/mt0-xxl is mT5-XXL: no exact published total (the mT5 paper, arXiv:2010.11934, says 13B). Its blocks
  // are T5 v1.1 XXL's; its untied embedding and head have 250,112 rows instead of 32,128.
  const int64_t mt0 = 11135332352 + 2 * (250112 - 32128) * int64_t{4096};
  CHECK(params_of("mt0-xxl.json") == mt0);
  CHECK(mt0 == Approx(13e9).epsilon(0.01));
}

TEST_CASE("hand-derived counts of an encoder-decoder", "[params][t5]") {
  ModelConfig m;
  m.model_type = "t5";
  m.is_encoder_decoder = true;
  m.hidden_size = 8;
  m.num_attention_heads = m.num_key_value_heads = 2;
  m.head_dim = 4;  // d_kv: q, k, v and o are 8 x 8
  m.intermediate_size = 16;
  m.vocab_size = 10;
  m.num_hidden_layers = 1;
  m.num_decoder_layers = 1;
  m.relative_attention_num_buckets = 4;
  m.tie_word_embeddings = true;
  m.mlp_gated = false;
  m.hidden_act = "relu";
  // shared 10*8 = 80. Encoder block: layer_norm 8, q/k/v/o 4*64, layer_norm 8, wi and wo 2*8*16, relative bias
  // 4 buckets x 2 heads: 536. Decoder block: three norms 24, self- and cross-attention 2*256, wi/wo 256, bias 8:
  // 800. Final norms of both stacks 16.
  ModelShape s = build_model_shape(m);
  CHECK(s.params_total == 80 + 536 + 800 + 16);
  CHECK(s.num_layers == 2);
  CHECK(s.num_encoder_layers == 1);
  m.tie_word_embeddings = false;  // + lm_head 80
  CHECK(build_model_shape(m).params_total == 1432 + 80);
  m.mlp_gated = true;  // + wi_1 in both blocks
  CHECK(build_model_shape(m).params_total == 1512 + 2 * 128);
  m.num_decoder_layers = 3;  // + two decoder blocks without the bias: 792 + 128 each
  CHECK(build_model_shape(m).params_total == 1768 + 2 * 920);
  m.num_decoder_layers = 0;  // T5Config: as many as the encoder
  m.num_hidden_layers = 2;   // + an encoder block (528 + 128) and a decoder block (920)
  CHECK(build_model_shape(m).params_total == 1768 + 656 + 920);
}
