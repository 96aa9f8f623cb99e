// The Hugging Face config.json as memsim's model section (serialize.h model_from_hf_json; config_from_json reads
// a config's model section the same way): structural defaults per model_type, key aliases, ignored keys.
#include <algorithm>
#include <iomanip>
#include <sstream>

#include "architecture.h"
#include "serialize.h"
#include "serialize_internal.h"

namespace memsim {

using namespace serialize_detail;
using json_read::parse_document;

namespace {

// ---------------------------------------------------------------------------------------------------------
// [SECTION] Hugging Face config.json: structural defaults per model_type, key aliases
// ---------------------------------------------------------------------------------------------------------

// What HF encodes in the model class rather than in config.json, per model_type (modeling_<type>.py).
// Numeric fields are left at 0 so that a missing required key is detected.
ModelConfig hf_structure(const std::string& model_type, std::vector<std::string>& notes) {
  ModelConfig m;
  m.hidden_size = m.num_hidden_layers = m.num_attention_heads = m.vocab_size = 0;
  m.num_key_value_heads = m.intermediate_size = m.head_dim = 0;
  m.max_position_embeddings = 2048;
  m.model_type = model_type;
  m.name = "imported " + model_type + " config";
  m.tie_word_embeddings = false;  // LlamaConfig default
  if (model_type == "llama" || model_type == "mistral" || model_type == "mixtral" || model_type == "phi3" ||
      model_type == "olmo" || model_type == "yi" || model_type == "internlm2") {
  } else if (model_type == "phimoe") {
    // PhimoeDecoderLayer: nn.LayerNorm (with bias) before attention and the MoE, and the final norm; config
    // lm_head_bias = true (modeling_phimoe.py).
    m.norm_type = NormType::LayerNorm;
    m.lm_head_bias = true;
  } else if (model_type == "qwen2" || model_type == "qwen2_vl" || model_type == "qwen2_vl_text" || model_type == "qwen2_5_vl" ||
             model_type == "qwen2_5_vl_text") {
    // Qwen2Attention: q/k/v_proj bias=True, o_proj bias=False. Qwen2-VL's and Qwen2.5-VL's language models are
    // Qwen2's layers with multimodal rotary positions (modeling_qwen2_vl.py Qwen2VLAttention: the same projections).
    m.qkv_bias = true;
  } else if (model_type == "qwen3") {
    m.qk_norm = true;  // Qwen3Attention: q_norm, k_norm = RMSNorm(head_dim)
  } else if (model_type == "gemma") {
    m.tie_word_embeddings = true;  // GemmaConfig default
    m.hidden_act = "gelu_pytorch_tanh";
  } else if (model_type == "gemma2" || model_type == "gemma3_text" || model_type == "gemma3") {
    m.tie_word_embeddings = true;
    m.hidden_act = "gelu_pytorch_tanh";
    m.norms_per_layer = 4;                    // pre/post attention and pre/post feed-forward norms
    m.qk_norm = model_type != "gemma2";       // Gemma3Attention has q_norm and k_norm
  } else if (model_type == "gpt2") {
    m.norm_type = NormType::LayerNorm;
    m.mlp_gated = false;
    m.attention_bias = m.mlp_bias = true;     // Conv1D c_attn, c_proj, c_fc all have biases
    m.position_embedding_type = PositionType::Absolute;
    m.tie_word_embeddings = true;
    m.hidden_act = "gelu_new";
    m.max_position_embeddings = 1024;
  } else if (model_type == "gpt_neox") {
    m.norm_type = NormType::LayerNorm;
    m.mlp_gated = false;
    m.attention_bias = m.mlp_bias = true;     // query_key_value, dense, dense_h_to_4h, dense_4h_to_h
    m.hidden_act = "gelu";
  } else if (model_type == "qwen") {
    // Qwen-1 (remote code modeling_qwen.py QWenBlock): RMSNorm, a fused c_attn with bias, c_proj without
    // (no_bias), and QWenMLP's w1 and w2 of intermediate_size // 2 each with c_proj back: a gated SiLU MLP whose
    // config.json intermediate_size is twice the MLP width (read_model_section halves it). Untied head.
    m.fused_qkv = true;
    m.qkv_bias = true;
  } else if (model_type == "olmo2") {
    m.qk_norm = true;  // Olmo2Attention: q_norm over num_heads * head_dim, k_norm over num_kv_heads * head_dim
    m.qk_norm_per_head = false;
  } else if (model_type == "falcon") {
    // FalconDecoderLayer (new_decoder_architecture false): one LayerNorm feeds attention and MLP in parallel,
    // fused query_key_value, GELU MLP of 4 x hidden, tied head.
    m.norm_type = NormType::LayerNorm;
    m.mlp_gated = false;
    m.norms_per_layer = 1;
    m.tie_word_embeddings = true;
    m.hidden_act = "gelu";
  } else if (model_type == "qwen3_moe") {
    m.qk_norm = true;  // Qwen3MoeAttention keeps q_norm/k_norm; experts use moe_intermediate_size
  } else if (model_type == "deepseek_v3" || model_type == "deepseek_v2") {
    m.router_bias = model_type == "deepseek_v3";  // DeepseekV3TopkRouter.e_score_correction_bias
  } else if (model_type == "ernie4_5" || model_type == "ernie4_5_moe") {
    // Ernie4_5 / Ernie4_5_Moe (transformers 4.54+): Llama's block with use_bias on every linear (read below); the MoE
    // layers keep each routed expert as an Ernie4_5_MoeMLP of nn.Linear modules, a router gate [E, h] and
    // Ernie4_5_MoeStatics' e_score_correction_bias [1, E], a frozen fp32 parameter of every MoE layer.
    m.router_bias = model_type == "ernie4_5_moe";
  } else if (model_type == "bert" || model_type == "roberta") {
    m.norm_type = NormType::LayerNorm;
    m.mlp_gated = false;
    m.attention_bias = m.mlp_bias = true;     // BertSelfAttention q/k/v, BertSelfOutput, BertIntermediate, BertOutput
    m.position_embedding_type = PositionType::Absolute;
    m.post_layernorm = true;
    m.tie_word_embeddings = true;
    m.hidden_act = "gelu";
    m.max_position_embeddings = 512;
    m.task_head = "sequence_classification";
    notes.push_back("model: an encoder; memsim trains it with a sequence-classification head (pooler + classifier)");
  } else if (model_type == "t5" || model_type == "mt5") {
    // T5Config / MT5Config defaults (configuration_t5.py, configuration_mt5.py): T5LayerNorm is an RMSNorm
    // without bias, no linear has a bias, positions come from the relative attention bias, dropout_rate 0.1
    // applies everywhere. T5 v1.0 ties the head to the shared embedding (PretrainedConfig default) and uses a
    // ReLU MLP; mT5 unties and uses feed_forward_proj "gated-gelu".
    m.is_encoder_decoder = true;
    m.relative_attention_num_buckets = 32;
    m.attention_dropout = m.hidden_dropout = 0.1;
    m.max_position_embeddings = 512;
    m.tie_word_embeddings = model_type == "t5";
    m.mlp_gated = model_type == "mt5";
    m.hidden_act = model_type == "mt5" ? "gelu_new" : "relu";
  } else if (model_type == "stablelm") {
    m.norm_type = NormType::LayerNorm;        // StableLmDecoderLayer uses nn.LayerNorm; use_qkv_bias below
  } else {
    notes.push_back("model_type \"" + model_type +
                    "\" is not known: assumed a Llama-style block (RMSNorm, gated MLP, RoPE, no biases)");
  }
  return m;
}

// GPT-2 and other older configs name the same things differently.
constexpr std::pair<const char*, const char*> kAliases[] = {
    {"n_embd", "hidden_size"},          {"n_layer", "num_hidden_layers"},
    {"n_head", "num_attention_heads"},  {"n_inner", "intermediate_size"},
    {"n_positions", "max_position_embeddings"}, {"activation_function", "hidden_act"},
    {"use_qkv_bias", "qkv_bias"},       {"num_kv_heads", "num_key_value_heads"},
    {"_name_or_path", "name"},             {"num_local_experts", "num_experts"},   {"n_routed_experts", "num_experts"},
    {"attention_probs_dropout_prob", "attention_dropout"}, {"attn_pdrop", "attention_dropout"},
    {"hidden_dropout_prob", "hidden_dropout"}, {"resid_pdrop", "hidden_dropout"},
    {"attn_dropout_prob", "attention_dropout"},  // Qwen-1
    {"moe_num_experts", "num_experts"}, {"moe_k", "num_experts_per_tok"}, {"moe_num_shared_experts", "n_shared_experts"},  // ERNIE 4.5
    // T5Config names (configuration_t5.py); dense_act_fn and is_gated_act are what it derives from
    // feed_forward_proj, which read_model_section reads first.
    {"d_model", "hidden_size"}, {"num_layers", "num_hidden_layers"}, {"num_heads", "num_attention_heads"},
    {"d_ff", "intermediate_size"}, {"d_kv", "head_dim"}, {"dense_act_fn", "hidden_act"}, {"is_gated_act", "mlp_gated"},
};

// Keys HF configs carry that do not change memory (or that memsim takes from the training section).
const std::set<std::string>& hf_ignorable() {
  static const std::set<std::string> s = {
      "architectures", "torch_dtype", "dtype", "transformers_version", "bos_token_id", "eos_token_id",
      "pad_token_id", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "initializer_range", "rope_theta",
      "rope_scaling", "use_cache", "pretraining_tp", "schema", "id2label", "label2id",
      // Qwen2-VL's special tokens (its vision_config is the tower, read_vision_config)
      "vision_start_token_id", "vision_end_token_id", "vision_token_id", "image_token_id", "video_token_id", "vision_config",
      "gradient_checkpointing", "classifier_dropout", "n_shared_experts", "router_aux_loss_coef",
      "output_router_logits", "norm_topk_prob", "routed_scaling_factor", "scoring_func", "topk_method", "n_group",
      "topk_group", "aux_loss_alpha", "seq_aux", "moe_layer_freq", "ep_size", "num_nextn_predict_layers",
      "decoder_sparse_step", "mlp_only_layers", "sliding_window", "use_sliding_window", "max_window_layers",
      "quantization_config", "layer_types", "rope_interleave", "multi_query", "parallel_attn", "bias", "alibi",
      "new_decoder_architecture", "ffn_hidden_size", "partial_rotary_factor", "rope_pct", "query_pre_attn_scalar",
      "final_logit_softcapping", "attn_logit_softcapping", "sliding_window_pattern", "rope_local_base_freq",
      "cache_implementation", "hidden_activation", "use_parallel_residual", "qk_layernorm",
      // Qwen-1 (QWenConfig): kv_channels and seq_length are read as head_dim and max_position_embeddings; the
      // rest are kernel choices and rotary settings that change no tensor's size.
      "kv_channels", "seq_length", "rotary_emb_base", "rotary_pct", "scale_attn_weights", "use_flash_attn",
      "use_dynamic_ntk", "use_logn_attn", "no_bias", "softmax_in_fp32", "emb_dropout_prob", "auto_map", "tokenizer_class", "bf16", "fp16",
      "fp32", "use_cache_quantization", "use_cache_kernel", "onnx_safe",
      // ERNIE 4.5: the MoE layer range and use_bias are read into first_k_dense_replace and the biases
      // (read_model_section); the capacity, gate name and norm floor change nothing in a dropless HF forward.
      "moe_layer_start_index", "moe_layer_end_index", "moe_layer_interval", "moe_use_aux_free", "use_bias", "moe_capacity", "moe_gate", "moe_gate_act", "moe_norm_min",
      // T5: generation settings, init scale, the bucketing distance (no parameters), legacy PretrainedConfig keys
      "decoder_start_token_id", "initializer_factor", "output_past", "task_specific_params", "relative_attention_max_distance",
      "tokenizer_class", "feed_forward_proj", "dropout_rate", "finetuning_task", "is_decoder", "output_attentions",
      "output_hidden_states", "pruned_heads", "torchscript", "use_bfloat16"};
  return s;
}

}  // namespace

namespace serialize_detail {

namespace {

// LlavaForConditionalGeneration's config.json (transformers models/llava/configuration_llava.py): its vision_config
// is the tower, a CLIP vision model read into the clip_vision program's arguments; the projector is
// LlavaMultiModalProjector's two linears. Other multimodal types keep the language model alone, with a note.
void read_vision_config(const json& src, ModelConfig& out, std::vector<FieldError>& errors, std::vector<std::string>& notes) {
  auto vc = src.find("vision_config");
  if (vc == src.end() || !vc->is_object()) return;
  std::string type;
  if (auto it = src.find("model_type"); it != src.end() && it->is_string()) type = it->get<std::string>().substr(0, 60);
  std::string vision_type;
  if (auto it = vc->find("model_type"); it != vc->end() && it->is_string()) vision_type = it->get<std::string>().substr(0, 60);
  if (type == "qwen2_vl" || type == "qwen2_5_vl") {
    // Qwen2VLForConditionalGeneration and Qwen2_5_VLForConditionalGeneration (transformers models/qwen2_vl,
    // qwen2_5_vl): vision_config is the tower's config, the program's hyperparameters by the same names (its
    // config.json's "in_chans" is not one of them: the config classes take in_channels, so the default 3 holds;
    // Qwen2.5-VL's fullatt_block_indexes are read by the program's hf_keys). The merger is the projector.
    const std::string program = type == "qwen2_vl" ? "qwen2_vl_vision" : "qwen2_5_vl_vision";
    const std::string title = type == "qwen2_vl" ? "Qwen2-VL" : "Qwen2.5-VL";
    if (auto f = vc->find("fullatt_block_indexes"); f != vc->end() && (!f->is_array() || f->size() != 4)) {
      errors.push_back({"model.vision_tower", "model.vision_tower: fullatt_block_indexes must list 4 blocks, as "
                                              "qwen2_5_vl_vision's block kinds are written; got " + f->dump().substr(0, 60)});
      return;
    }
    std::string args;
    for (const auto& [key, where] : architecture_hf_keys(program)) {
      const json::json_pointer pointer(where);
      if (!vc->contains(pointer) || !(*vc)[pointer].is_number()) continue;
      std::ostringstream text;
      text << std::setprecision(15) << key << "=" << (*vc)[pointer].get<double>();
      args += (args.empty() ? "" : ",") + text.str();
    }
    out.name = (out.name.empty() ? title : out.name) + " with its vision tower (" + type + ")";
    out.vision_tower = program;
    out.vision_tower_args = args;
    notes.push_back("model: model_type " + type + ": the vision_config is the vision tower \"" + program + "\" (" +
                    (args.empty() ? std::string("its defaults") : args) + ") with its patch merger; each image's size "
                    "(image_height, image_width, before smart_resize) and max_pixels are the tower's arguments "
                    "(defaults 448 x 448, the hub processor's 12845056)");
    return;
  }
  // LlavaNextForConditionalGeneration (model_type llava_next): the same tower and projector, with anyres crops and the
  // image_newline row; clip_vision.json's dims are written for llava-v1.6's five grid pinpoints, in units of the tower's
  // image_size.
  const bool next = type == "llava_next";
  if (next && vision_type == "clip_vision_model") {
    const double size = vc->contains("image_size") && (*vc)["image_size"].is_number() ? (*vc)["image_size"].get<double>() : 224;
    const json expected = json::array({json::array({size, 2 * size}), json::array({2 * size, size}), json::array({2 * size, 2 * size}),
                                       json::array({3 * size, size}), json::array({size, 3 * size})});
    auto pins = src.find("image_grid_pinpoints");
    bool same = pins != src.end() && pins->is_array() && pins->size() == expected.size();
    for (size_t i = 0; same && i < expected.size(); ++i)
      same = (*pins)[i].is_array() && (*pins)[i].size() == 2 && (*pins)[i][0].is_number() && (*pins)[i][1].is_number() &&
             (*pins)[i][0].get<double>() == expected[i][0].get<double>() && (*pins)[i][1].get<double>() == expected[i][1].get<double>();
    if (!same) {
      errors.push_back({"model.vision_tower", "model.vision_tower: image_grid_pinpoints " +
                                              (pins == src.end() ? std::string("(none)") : pins->dump().substr(0, 80)) +
                                              " are not modelled; llava-v1.6's five ([[s, 2s], [2s, s], [2s, 2s], [3s, s], [s, 3s]] "
                                              "for the tower's image_size s) are"});
      return;
    }
  }
  if ((type != "llava" && !next) || vision_type != "clip_vision_model") {
    notes.push_back("model: the vision tower of this " + (type.empty() ? std::string("multimodal") : type) + " config (" +
                    (vision_type.empty() ? std::string("no model_type") : vision_type) + ") is not modelled; memsim reads "
                    "its language model alone (vision towers: LLaVA's CLIP, model_types llava and llava_next; Qwen2-VL's and Qwen2.5-VL's, model_types qwen2_vl and qwen2_5_vl)");
    return;
  }
  if (auto it = src.find("vision_feature_select_strategy"); it != src.end() && it->is_string() && it->get<std::string>() != "default") {
    errors.push_back({"model.vision_tower", "model.vision_tower: vision_feature_select_strategy \"" +
                                            it->get<std::string>().substr(0, 40) + "\" is not modelled (default: the patch tokens without the class token)"});
    return;
  }
  if (auto it = src.find("vision_feature_layer"); it != src.end() && !it->is_number_integer()) {
    errors.push_back({"model.vision_tower", "model.vision_tower: a vision_feature_layer list (features of several layers "
                                            "concatenated) is not modelled; one layer is"});
    return;
  }
  std::string args;
  for (const auto& [key, where] : architecture_hf_keys("clip_vision")) {
    const json::json_pointer pointer(where);
    if (!vc->contains(pointer) || !(*vc)[pointer].is_number()) continue;
    std::ostringstream text;
    text << key << "=" << (*vc)[pointer].get<double>();
    args += (args.empty() ? "" : ",") + text.str();
  }
  if (next) args += (args.empty() ? "" : ",") + std::string("anyres=1");
  // The name came from the text_config (the language model's checkpoint): say what is around it.
  out.name = (out.name.empty() ? std::string(next ? "LLaVA-NeXT" : "LLaVA") : out.name) + " with a CLIP vision tower (" + type + ")";
  out.vision_tower = "clip_vision";
  out.vision_tower_args = args;
  out.projector_depth = 2;
  notes.push_back("model: model_type " + type + ": the vision_config is the vision tower \"clip_vision\" (" +
                  (args.empty() ? std::string("its defaults") : args) + ") and the projector LlavaMultiModalProjector's "
                  "two linears; the text_config is the language model" +
                  (next ? std::string("; each image's size before processing is the tower's image_height and image_width "
                                      "(0: the tower's image_size), which choose its tiles")
                        : std::string()));
}

}  // namespace

void read_model_section(const json& src, ModelConfig& out, std::vector<FieldError>& errors,
                        std::vector<std::string>& notes) {
  const json* j = &src;
  // Multimodal configs (Gemma 3, Llava) nest the language model under text_config.
  if (!src.contains("hidden_size") && src.contains("text_config") && src["text_config"].is_object())
    j = &src["text_config"], notes.push_back("model: read text_config (the language model of a multimodal config)");
  std::string type = "llama";
  if (auto it = j->find("model_type"); it != j->end() && it->is_string()) type = it->get<std::string>();
  // Configs saved by transformers before model_type existed (t5-base's first config.json) name T5 only by its keys.
  if (!j->contains("model_type") && j->contains("d_model") && j->contains("d_kv") && j->contains("num_layers")) {
    type = "t5";
    notes.push_back("model: no model_type; d_model, d_kv and num_layers are T5Config's keys, read as model_type t5");
  }
  // A timm config.json (timm's push_to_hf_hub: "architecture" names the timm model, with its pretrained_cfg): the
  // built-in program that declares the name (timm_models), with the classes, channels and image size it sets.
  if (auto it = j->find("architecture"); it != j->end() && it->is_string() &&
                                          (j->contains("pretrained_cfg") || j->contains("num_features"))) {
    const std::string name = it->get<std::string>().substr(0, kMaxStringBytes);
    std::string program, args;
    if (!architecture_for_timm(name, program, args)) {
      std::string known;
      for (const auto& n : timm_model_names()) known += (known.empty() ? "" : ", ") + n;
      errors.push_back({"model.architecture", "model.architecture: the timm model \"" + name.substr(0, 60) +
                                                  "\" has no built-in program; the timm models memsim builds: " + known});
      return;
    }
    const auto declared = architecture_hyperparameters(program);
    auto set = [&](std::initializer_list<const char*> keys, double v) {
      for (const char* k : keys)
        if (std::find(declared.begin(), declared.end(), k) != declared.end()) {
          std::ostringstream text;
          text << k << "=" << v;
          args += (args.empty() ? "" : ",") + text.str();  // a later value replaces an earlier one
          return;
        }
    };
    if (auto n = j->find("num_classes"); n != j->end() && n->is_number_integer() && n->get<int64_t>() > 0)
      set({"num_classes", "num_labels"}, n->get<double>());
    if (auto pc = j->find("pretrained_cfg"); pc != j->end() && pc->is_object())
      if (auto in = pc->find("input_size"); in != pc->end() && in->is_array() && in->size() == 3 &&
                                            (*in)[0].is_number_integer() && (*in)[1].is_number_integer()) {
        set({"num_channels", "in_chans"}, (*in)[0].get<double>());
        set({"image_size", "img_size"}, (*in)[1].get<double>());
      }
    out = ModelConfig{};
    out.name = name;
    out.architecture = program;
    out.architecture_args = args;
    notes.push_back("model: the timm model " + name + " is the model program \"" + program + "\" (src/core/catalog/architectures) with " +
                    (args.empty() ? "its defaults" : args));
    return;
  }
  // A model section that holds a program (model.architecture: a memsim config's, not an HF config.json): memsim's own
  // fields, read onto the defaults, with none of the HF structure or required keys (the program has its own).
  if (auto it = j->find("architecture");
      it != j->end() && (it->is_object() || (it->is_string() && !it->get_ref<const std::string&>().empty()))) {
    Config tmp;
    JsonSectionReader rd{{errors}, *j, "model", {}};
    visit_fields(tmp, rd);
    out = tmp.model;
    return;
  }
  // A family written as a model program (src/core/catalog/architectures): the program's hyperparameters are HF
  // config keys, so the import passes on those the file sets (num_labels from id2label as below).
  std::string mismatch;
  const std::string program = architecture_for_model_type(type, j->dump(), mismatch);
  if (program.empty() && !mismatch.empty()) {
    errors.push_back({"model.architecture", "model.architecture: this model_type " + type.substr(0, 60) +
                                                " config sets keys no built-in program models: " + mismatch});
    return;
  }
  if (!program.empty()) {
    // Only the keys that differ from the program's defaults: a link carries the arguments (at most 256 bytes), and
    // a large config sets every key (Whisper's 15).
    std::shared_ptr<const Architecture> defaults;
    decode_architecture(program, "", defaults);
    auto is_default = [&](const std::string& key, double v) {
      if (!defaults) return false;
      for (const auto& [k, d] : defaults->defaults)
        if (k == key) return d == v;
      return false;
    };
    std::string args;
    for (const auto& [key, where] : architecture_hf_keys(program)) {
      double v = 0;
      const json::json_pointer pointer(where);  // a built-in program's, checked when it decodes
      if (j->contains(pointer) && ((*j)[pointer].is_number() || (*j)[pointer].is_boolean()))
        v = (*j)[pointer].is_boolean() ? ((*j)[pointer].get<bool>() ? 1.0 : 0.0) : (*j)[pointer].get<double>();
      else if (where == "/num_labels" && j->contains("id2label") && (*j)["id2label"].is_object() && !(*j)["id2label"].empty())
        v = static_cast<double>((*j)["id2label"].size());
      else
        continue;
      if (is_default(key, v)) continue;
      std::ostringstream text;
      text << key << "=" << v;
      args += (args.empty() ? "" : ",") + text.str();
    }
    out = ModelConfig{};
    out.model_type = type.substr(0, kMaxStringBytes);
    if (auto it = j->find("_name_or_path"); it != j->end() && it->is_string()) out.name = it->get<std::string>().substr(0, kMaxStringBytes);
    out.architecture = program;
    out.architecture_args = args;
    notes.push_back("model: model_type " + out.model_type + " is the model program \"" + program +
                    "\" (src/core/catalog/architectures); read its hyperparameters: " + (args.empty() ? "all at the program's defaults" : args + ", the rest at the program's defaults"));
    return;
  }
  Config tmp;
  tmp.model = hf_structure(type.substr(0, kMaxStringBytes), notes);
  json norm = *j;
  // A nested text_config is saved as its differences from the class's defaults (PretrainedConfig.to_diff_dict), so
  // llava-1.5-7b-hf's names only the vocabulary and positions: LlamaConfig's defaults (configuration_llama.py) are
  // the rest.
  // MistralConfig's (configuration_mistral.py) likewise for llava-v1.6-mistral-7b-hf's text_config.
  if (j != &src && (type == "llama" || type == "mistral")) {
    const bool mistral = type == "mistral";
    std::string filled;
    for (auto [key, value] : {std::pair<const char*, int64_t>{"hidden_size", 4096}, {"intermediate_size", mistral ? 14336 : 11008},
                              {"num_hidden_layers", 32}, {"num_attention_heads", 32}, {"vocab_size", 32000}})
      if (!norm.contains(key)) norm[key] = value, filled += (filled.empty() ? "" : ", ") + std::string(key) + " " + std::to_string(value);
    if (mistral && !norm.contains("num_key_value_heads"))
      norm["num_key_value_heads"] = 8, filled += std::string(filled.empty() ? "" : ", ") + "num_key_value_heads 8";
    if (!filled.empty())
      notes.push_back(std::string("model: text_config leaves out ") + (mistral ? "MistralConfig" : "LlamaConfig") + "'s defaults; read " + filled);
  }
  // tie_word_embeddings is the top-level config's (PreTrainedModel ties by self.config, the composite one), which a
  // re-saved multimodal config may state there alone (Qwen2.5-VL-3B's, transformers >= 4.52).
  if (j != &src && !norm.contains("tie_word_embeddings"))
    if (auto it = src.find("tie_word_embeddings"); it != src.end() && it->is_boolean()) norm["tie_word_embeddings"] = *it;
  if (type == "t5" || type == "mt5") {
    // T5Config.__init__: feed_forward_proj is "{gated-}{act}"; "gated-gelu" means the tanh approximation gelu_new.
    if (auto it = norm.find("feed_forward_proj"); it != norm.end() && it->is_string()) {
      std::string ff = it->get<std::string>().substr(0, kMaxStringBytes);
      const bool gated = ff.rfind("gated-", 0) == 0;
      std::string act = gated ? ff.substr(6) : ff;
      if (ff == "gated-gelu") act = "gelu_new";
      if (!norm.contains("mlp_gated")) norm["mlp_gated"] = gated;
      if (!norm.contains("hidden_act")) norm["hidden_act"] = act;
    }
    // One dropout_rate for every dropout of the model (T5Attention.dropout and every nn.Dropout).
    if (auto it = norm.find("dropout_rate"); it != norm.end() && it->is_number()) {
      if (!norm.contains("attention_dropout")) norm["attention_dropout"] = *it;
      if (!norm.contains("hidden_dropout")) norm["hidden_dropout"] = *it;
    }
    // T5Config: num_decoder_layers None means as many as num_layers.
    if ((!norm.contains("num_decoder_layers") || norm["num_decoder_layers"].is_null()) && norm.contains("num_layers"))
      norm["num_decoder_layers"] = norm["num_layers"];
  }
  if (type == "ernie4_5_moe") {  // Ernie4_5_MoeConfig's defaults (configuration_ernie4_5_moe.py)
    if (!norm.contains("moe_num_shared_experts")) norm["moe_num_shared_experts"] = 2;
    if (!norm.contains("moe_layer_start_index")) norm["moe_layer_start_index"] = 1;
  }
  for (auto [alias, canon] : kAliases)
    if (!norm.contains(canon) && norm.contains(alias)) norm[canon] = norm[alias];

  if (!norm.contains("num_labels") && norm.contains("id2label") && norm["id2label"].is_object() && !norm["id2label"].empty())
    norm["num_labels"] = norm["id2label"].size();
  if (!norm.contains("task_head") && norm.contains("architectures") && norm["architectures"].is_array())
    for (const auto& a : norm["architectures"])
      if (a.is_string() && a.get<std::string>().find("ForSequenceClassification") != std::string::npos)
        norm["task_head"] = "sequence_classification";
  if (!norm.contains("shared_expert_intermediate_size") && norm.contains("n_shared_experts") &&
      norm["n_shared_experts"].is_number_integer() && norm.contains("moe_intermediate_size") &&
      norm["moe_intermediate_size"].is_number_integer()) {
    // Checked: n_shared_experts of 2^53 + 1 times the expert width wrapped to a small, valid-looking width.
    const int64_t n = norm["n_shared_experts"].get<int64_t>(), w = norm["moe_intermediate_size"].get<int64_t>();
    int64_t width = 0;
    if (n < 0 || w < 0 || __builtin_mul_overflow(n, w, &width) || width > (int64_t{1} << 30))
      errors.push_back({"n_shared_experts", "n_shared_experts x moe_intermediate_size must be a width of at most 2^30; got " +
                                                std::to_string(n) + " x " + std::to_string(w)});
    else norm["shared_expert_intermediate_size"] = width;
  }
  if (type == "ernie4_5" || type == "ernie4_5_moe") {
    // Ernie4_5_MoeDecoderLayer: layer i is an MoE layer when (i + 1) % moe_layer_interval == 0 and
    // moe_layer_start_index <= i <= moe_layer_end_index (-1: the last); memsim's shape is dense layers first, then
    // MoE layers to the end (first_k_dense_replace), so other patterns are refused with the key named.
    auto integer = [&](const char* k, int64_t fallback) {
      auto it = norm.find(k);
      return it != norm.end() && it->is_number_integer() ? it->get<int64_t>() : fallback;
    };
    if (auto it = norm.find("use_bias"); it != norm.end() && it->is_boolean()) {
      if (!norm.contains("attention_bias")) norm["attention_bias"] = *it;
      if (!norm.contains("mlp_bias")) norm["mlp_bias"] = *it;
    }
    const int64_t layers = integer("num_hidden_layers", 0), start = integer("moe_layer_start_index", 0);
    const int64_t end = integer("moe_layer_end_index", -1), interval = integer("moe_layer_interval", 1);
    if (norm.contains("num_experts") && !norm.contains("first_k_dense_replace")) {
      if (interval != 1 || start < 0 || (end != -1 && end < layers - 1))
        errors.push_back({"moe_layer_interval", "memsim models MoE layers from moe_layer_start_index to the last, every "
                                                "layer (moe_layer_interval 1, moe_layer_end_index -1 or the last layer); got "
                                                "interval " + std::to_string(interval) + ", start " + std::to_string(start) +
                                                ", end " + std::to_string(end)});
      else norm["first_k_dense_replace"] = start;
    }
  }
  if (type == "falcon") {
    auto flag = [&](const char* k) { return norm.contains(k) && norm[k].is_boolean() && norm[k].get<bool>(); };
    if (!norm.contains("num_key_value_heads") && flag("multi_query") && !flag("new_decoder_architecture"))
      norm["num_key_value_heads"] = 1;
    if (norm.contains("bias") && norm["bias"].is_boolean()) norm["attention_bias"] = norm["mlp_bias"] = norm["bias"];
    if (norm.contains("parallel_attn") && norm["parallel_attn"].is_boolean() && !norm["parallel_attn"].get<bool>())
      norm["norms_per_layer"] = 2;
    if (!norm.contains("intermediate_size") && norm.contains("ffn_hidden_size")) norm["intermediate_size"] = norm["ffn_hidden_size"];
  }
  if (type == "qwen") {
    // QWenConfig: kv_channels is the head size, seq_length the context; QWenMLP halves intermediate_size.
    if (!norm.contains("head_dim") && norm.contains("kv_channels")) norm["head_dim"] = norm["kv_channels"];
    if (!norm.contains("max_position_embeddings") && norm.contains("seq_length")) norm["max_position_embeddings"] = norm["seq_length"];
    if (auto it = norm.find("intermediate_size"); it != norm.end() && it->is_number_integer()) {
      const int64_t width = it->get<int64_t>() / 2;
      norm["intermediate_size"] = width;
      notes.push_back("model.intermediate_size: Qwen-1's config gives twice the MLP width (QWenMLP w1, w2 = "
                      "intermediate_size // 2); read as " + std::to_string(width));
    }
  }
  JsonSectionReader rd{{errors}, norm, "model", {}};
  std::vector<FieldError> before = errors;
  visit_fields(tmp, rd);
  auto& m = tmp.model;
  // HF semantics of absent keys (configuration_llama.py, configuration_gpt2.py).
  if (!rd.seen.count("num_key_value_heads") || norm["num_key_value_heads"].is_null())
    m.num_key_value_heads = m.num_attention_heads;
  if (m.intermediate_size == 0 && m.hidden_size > 0 && !m.mlp_gated) {
    m.intermediate_size = 4 * m.hidden_size;  // GPT-2: n_inner = None means 4 * n_embd
    notes.push_back("model.intermediate_size: not given, assumed 4 x hidden_size as GPT-2 does");
  }
  // A config of a family memsim has no structure for (an HF vision model's: depths and hidden_sizes, no hidden_size)
  // is one line saying what memsim reads, not five missing keys.
  if (j->contains("model_type") && !norm.contains("hidden_size") && !norm.contains("num_hidden_layers") &&
      !norm.contains("num_attention_heads") && !norm.contains("vocab_size")) {
    std::string programs;
    for (const auto& n : builtin_architecture_names()) programs += (programs.empty() ? "" : ", ") + n;
    errors.push_back({"model.model_type", "model.model_type: an HF \"" + type.substr(0, 60) +
                                              "\" config.json without hidden_size, layers, heads or vocabulary is not a family memsim reads (decoders, BERT, T5, "
                                              "and the model_types its programs read: vit, dinov2, resnet, convnext, swin, whisper, mamba2, nemotron_h, bamba). Families written as "
                                              "model programs: " + programs + " (their presets, --set model.architecture=NAME, "
                                              "or a timm config.json)"});
    return;
  }
  for (const char* req : {"hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size"}) {
    bool present = false;
    if (auto it = norm.find(req); it != norm.end() && !it->is_null()) present = true;
    if (!present && !(std::string(req) == "intermediate_size" && m.intermediate_size > 0))
      errors.push_back({std::string("model.") + req, std::string("model.") + req + " is required"});
  }
  std::vector<std::string> ignored;
  for (auto it = j->begin(); it != j->end(); ++it) {
    const std::string& k = it.key();
    bool alias = false;
    for (auto [a, c] : kAliases) alias |= k == a;
    if (!rd.seen.count(k) && !alias && !hf_ignorable().count(k)) ignored.push_back(k);
  }
  if (!ignored.empty()) {
    std::string list;
    for (size_t i = 0; i < ignored.size() && i < 12; ++i) list += (i ? ", " : "") + ignored[i];
    if (ignored.size() > 12) list += ", ... (" + std::to_string(ignored.size()) + " in all)";
    notes.push_back("model: ignored keys that memsim does not model: " + list);
  }
  if (m.is_encoder_decoder && type != "t5" && type != "mt5")
    errors.push_back({"model.is_encoder_decoder", "model.is_encoder_decoder: memsim models the T5 family (model_type t5 "
                                                  "or mt5) as encoder-decoders; model_type \"" + type.substr(0, 40) +
                                                  "\" (BART-style) is not modelled"});
  if (errors.size() == before.size()) {
    out = m;
    if (j != &src || src.contains("vision_config")) read_vision_config(src, out, errors, notes);
  }
}

}  // namespace serialize_detail

namespace {

// A quantized checkpoint's config.json carries how its linears are stored (transformers' quantization_config:
// GPTQConfig, AwqConfig, BitsAndBytesConfig to_dict). That storage is the PEFT base's: the checkpoint's weights
// can only be trained through adapters, so a setup without a PEFT method gets LoRA. Anything memsim does not model
// (other bit widths, other methods) leaves the base as it was, with a note.
void read_quantization_config(const json& doc, PeftConfig& peft, std::vector<std::string>& notes) {
  const auto q = doc.find("quantization_config");
  if (q == doc.end() || !q->is_object()) return;
  const std::string method = q->value("quant_method", std::string());
  auto integer = [&](const char* key, int64_t fallback) {
    const auto it = q->find(key);
    return it != q->end() && it->is_number_integer() ? it->get<int64_t>() : fallback;
  };
  auto flag = [&](const char* key) {
    const auto it = q->find(key);
    return it != q->end() && it->is_boolean() && it->get<bool>();
  };
  std::string storage, detail;
  if (method == "gptq" || method == "awq") {
    const int64_t bits = integer(method == "awq" ? "w_bit" : "bits", integer("bits", 4));
    if (bits != 4) {
      notes.push_back("quantization_config: a " + std::to_string(bits) + "-bit " + method +
                      " checkpoint; memsim models 4-bit GPTQ and AWQ only, so the base is left as it was");
      return;
    }
    storage = method;
    peft.quant_group_size = integer("group_size", integer("q_group_size", 128));
    detail = "group size " + std::to_string(peft.quant_group_size);
  } else if (method == "bitsandbytes" || flag("load_in_4bit") || flag("load_in_8bit")) {
    if (flag("load_in_8bit")) {
      storage = "int8";
    } else {
      storage = q->value("bnb_4bit_quant_type", std::string("fp4")) == "nf4" ? "nf4" : "fp4";
      peft.double_quantization = flag("bnb_4bit_use_double_quant");
      detail = peft.double_quantization ? "double quantization" : "no double quantization";
    }
  } else {
    notes.push_back("quantization_config: quant_method \"" + method.substr(0, 40) +
                    "\" is not modelled (gptq, awq and bitsandbytes are), so the base is left as it was");
    return;
  }
  peft.base_quantization = storage;
  std::string note = "quantization_config: a " + storage + " checkpoint" + (detail.empty() ? "" : " (" + detail + ")") +
                     ": peft.base_quantization " + storage;
  if (!peft.enabled()) {
    peft.method = "lora";
    note += "; peft.method lora, since a quantized base trains only through adapters";
  }
  notes.push_back(note);
}

}  // namespace

Parsed model_from_hf_json(std::string_view text, const Config& base) {
  Parsed p;
  p.config = base;
  json doc;
  if (!parse_document(text, "config.json", doc, p.errors)) return p;
  ModelConfig m = base.model;
  read_model_section(doc, m, p.errors, p.notes);
  if (p.errors.empty()) {
    p.config.model = m;
    p.ok = true;
    read_quantization_config(doc, p.config.peft, p.notes);
  }
  return p;
}

}  // namespace memsim
