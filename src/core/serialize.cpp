#include "serialize.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <type_traits>
#include <variant>

#include "choices.h"
#include "fields.h"
#include "json_read.h"
#include "link_data.h"

namespace memsim {

using json = nlohmann::json;
using json_read::describe;
using json_read::parse_document;
using json_read::valid_utf8;

namespace {

// ---------------------------------------------------------------------------------------------------------
// [SECTION] The fields: the registry (fields.cpp) names every config field, its flattened key and its type.
// ---------------------------------------------------------------------------------------------------------

template <typename E>
struct EnumName {
  E value;
  std::string_view name;
};
// config.h's enums by their names in the field registry (choices.h), in the enums' order.
constexpr EnumName<NormType> kNormNames[] = {{NormType::RMSNorm, choice::kNormType[0]},
                                             {NormType::LayerNorm, choice::kNormType[1]}};
constexpr EnumName<PositionType> kPositionNames[] = {{PositionType::Rope, choice::kPositionType[0]},
                                                     {PositionType::Absolute, choice::kPositionType[1]}};

// Walks every field of the registry (fields.cpp) in its order, calling the visitor's reader or writer for its type.
template <typename V>
void visit_fields(Config& c, V& v) {
  for (const FieldSpec& f : fields()) {
    const std::string key(f.key);
    std::visit(
        [&](auto* member) {
          using T = std::remove_pointer_t<decltype(member)>;
          if constexpr (std::is_same_v<T, int64_t>) v.integer(key, *member);
          else if constexpr (std::is_same_v<T, double>) v.number(key, *member);
          else if constexpr (std::is_same_v<T, bool>) v.boolean(key, *member);
          else if constexpr (std::is_same_v<T, std::string>) {
            if (f.kind == FieldKind::TriState) v.tristate(key, *member);
            else v.str(key, *member);
          } else if constexpr (std::is_same_v<T, NormType>) v.enumeration(key, *member, kNormNames);
          else v.enumeration(key, *member, kPositionNames);
        },
        f.ref(c));
  }
}

std::pair<std::string, std::string> split_key(const std::string& key) {
  auto dot = key.find('.');
  return {key.substr(0, dot), key.substr(dot + 1)};
}

constexpr size_t kMaxStringBytes = 256;
// The data section's length lists (data.micro_batch_lengths, data.sample_lengths) hold hundreds of numbers.
constexpr size_t kMaxListBytes = 8192;
constexpr size_t kMaxDocumentBytes = 8 * 1024 * 1024;  // far above any real config.json (a few KB)
constexpr size_t kMaxFragmentBytes = 64 * 1024;
constexpr int kMaxDepth = 64;



// ---------------------------------------------------------------------------------------------------------
// [SECTION] Typed reading of one value, from JSON or from a string (fragment, --set)
// ---------------------------------------------------------------------------------------------------------

struct Reader {
  std::vector<FieldError>& errors;
  void fail(const std::string& field, const std::string& what, const std::string& got) {
    errors.push_back({field, field + " must be " + what + "; got " + got});
  }
  std::string int_what(const std::string& field) {
    IntRange r = int_range(field);
    if (r.min == INT64_MIN) return "an integer";
    return "an integer from " + std::to_string(r.min) + " to " + std::to_string(r.max);
  }

  bool integer(const std::string& f, const json& v, int64_t& out) {
    if (v.is_number_integer() && !v.is_number_unsigned()) {
      out = v.get<int64_t>();
      return true;
    }
    if (v.is_number_unsigned()) {
      uint64_t u = v.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) {
        out = static_cast<int64_t>(u);
        return true;
      }
    }
    if (v.is_number_float()) {  // 4096.0 and 1e3 are integers too, if exact
      double d = v.get<double>();
      if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) <= 9007199254740992.0) {
        out = static_cast<int64_t>(d);
        return true;
      }
    }
    fail(f, int_what(f), describe(v));
    return false;
  }
  bool integer(const std::string& f, const std::string& s, int64_t& out) {
    json v = json::parse(s, nullptr, false);
    if (v.is_discarded() || !v.is_number()) {
      fail(f, int_what(f), "\"" + s.substr(0, 40) + "\"");
      return false;
    }
    return integer(f, v, out);
  }
  bool number(const std::string& f, const json& v, double& out) {
    if (v.is_number() && std::isfinite(v.get<double>())) {
      out = v.get<double>();
      return true;
    }
    fail(f, "a number", describe(v));
    return false;
  }
  bool number(const std::string& f, const std::string& s, double& out) {
    json v = json::parse(s, nullptr, false);
    if (v.is_discarded()) v = s;
    return number(f, v, out);
  }
  bool boolean(const std::string& f, const json& v, bool& out) {
    if (v.is_boolean()) {
      out = v.get<bool>();
      return true;
    }
    fail(f, "true or false", describe(v));
    return false;
  }
  bool boolean(const std::string& f, const std::string& s, bool& out) {
    if (s == "true" || s == "1") return out = true, true;
    if (s == "false" || s == "0") return out = false, true;
    fail(f, "true or false", "\"" + s.substr(0, 40) + "\"");
    return false;
  }
  bool str(const std::string& f, const json& v, std::string& out) {
    if (v.is_string()) return str(f, v.get<std::string>(), out);
    // A length list may be written as a JSON array of integers: [512, 380, 1024].
    if (v.is_array() && f == "data.micro_batch_lengths" && v.size() <= kMaxListBytes / 2) {
      std::string joined;
      for (const auto& x : v) {
        if (!x.is_number_integer()) return fail(f, "a list of integers", describe(v)), false;
        joined += (joined.empty() ? "" : ",") + x.dump();
      }
      return str(f, joined, out);
    }
    // A version written as a JSON number loses its text (2.10 reads as 2.1): ask for the string.
    if (f.rfind("versions.", 0) == 0 && f != "versions.date")
      fail(f, "a version such as \"2.1\" or \"2.1.2\" (a string), or \"latest\"", describe(v));
    else
      fail(f, "a string", describe(v));
    return false;
  }
  // auto / true / false; a JSON boolean is read as "true" or "false".
  bool tristate(const std::string& f, const json& v, std::string& out) {
    if (v.is_boolean()) return out = v.get<bool>() ? "true" : "false", true;
    if (v.is_string()) return str(f, v.get<std::string>(), out);
    fail(f, "auto, true or false", describe(v));
    return false;
  }
  bool str(const std::string& f, const std::string& s, std::string& out) {
    const size_t limit = f.rfind("data.", 0) == 0 ? kMaxListBytes : kMaxStringBytes;
    if (s.size() > limit) {
      fail(f, "a string of at most " + std::to_string(limit) + " bytes", std::to_string(s.size()) + " bytes");
      return false;
    }
    if (!valid_utf8(s)) {  // found by the fragment fuzzer: JSON output of such a string used to throw
      fail(f, "UTF-8 text", "bytes that are not UTF-8");
      return false;
    }
    out = s;
    return true;
  }
  template <typename E, size_t N>
  bool enumeration(const std::string& f, const std::string& s, E& out, const EnumName<E> (&names)[N]) {
    for (const auto& n : names)
      if (s == n.name) return out = n.value, true;
    std::string allowed;
    for (const auto& n : names) allowed += (allowed.empty() ? "" : ", ") + std::string(n.name);
    fail(f, "one of: " + allowed, "\"" + s.substr(0, 40) + "\"");
    return false;
  }
  template <typename E, size_t N>
  bool enumeration(const std::string& f, const json& v, E& out, const EnumName<E> (&names)[N]) {
    if (!v.is_string()) {
      fail(f, "a string", describe(v));
      return false;
    }
    return enumeration(f, v.get<std::string>(), out, names);
  }
};

// Reads the fields whose key starts with `section.` from a JSON object; records which keys it saw.
struct JsonSectionReader {
  Reader r;
  const json& obj;
  std::string section;
  std::set<std::string> seen;
  template <typename T, typename... Extra>
  void any(const std::string& key, T& out, const Extra&... extra) {
    auto [sec, name] = split_key(key);
    if (sec != section) return;
    auto it = obj.find(name);
    if (it == obj.end()) return;
    seen.insert(name);
    if (it->is_null()) return;  // HF writes null for "not set" (head_dim, n_inner): keep the default
    T tmp = out;
    if (read(key, *it, tmp, extra...)) out = tmp;
  }
  bool read(const std::string& k, const json& v, int64_t& o) { return r.integer(k, v, o); }
  bool read(const std::string& k, const json& v, double& o) { return r.number(k, v, o); }
  bool read(const std::string& k, const json& v, bool& o) { return r.boolean(k, v, o); }
  bool read(const std::string& k, const json& v, std::string& o) { return r.str(k, v, o); }
  struct TriState {};
  bool read(const std::string& k, const json& v, std::string& o, TriState) { return r.tristate(k, v, o); }
  template <typename E, size_t N>
  bool read(const std::string& k, const json& v, E& o, const EnumName<E> (&names)[N]) {
    return r.enumeration(k, v, o, names);
  }
  void integer(const std::string& k, int64_t& o) { any(k, o); }
  void number(const std::string& k, double& o) { any(k, o); }
  void boolean(const std::string& k, bool& o) { any(k, o); }
  void str(const std::string& k, std::string& o) { any(k, o); }
  void tristate(const std::string& k, std::string& o) { any(k, o, TriState{}); }
  template <typename E, size_t N>
  void enumeration(const std::string& k, E& o, const EnumName<E> (&names)[N]) { any(k, o, names); }
};

// Sets one field from its string form (fragment, --set).
struct StringSetter {
  Reader r;
  const std::string& key;
  const std::string& value;
  bool found = false;
  void integer(const std::string& k, int64_t& o) { if (k == key) { found = true; int64_t t; if (r.integer(k, value, t)) o = t; } }
  void number(const std::string& k, double& o) { if (k == key) { found = true; double t; if (r.number(k, value, t)) o = t; } }
  void boolean(const std::string& k, bool& o) { if (k == key) { found = true; bool t; if (r.boolean(k, value, t)) o = t; } }
  void str(const std::string& k, std::string& o) { if (k == key) { found = true; std::string t; if (r.str(k, value, t)) o = t; } }
  void tristate(const std::string& k, std::string& o) { str(k, o); }
  template <typename E, size_t N>
  void enumeration(const std::string& k, E& o, const EnumName<E> (&names)[N]) {
    if (k == key) { found = true; E t; if (r.enumeration(k, value, t, names)) o = t; }
  }
};

struct JsonWriter {
  json& out;
  template <typename T>
  void put(const std::string& key, const T& v) {
    auto [sec, name] = split_key(key);
    out[sec][name] = v;
  }
  void integer(const std::string& k, int64_t& o) { put(k, o); }
  void number(const std::string& k, double& o) { put(k, o); }
  void boolean(const std::string& k, bool& o) { put(k, o); }
  void str(const std::string& k, std::string& o) { put(k, o); }
  void tristate(const std::string& k, std::string& o) { put(k, o); }
  template <typename E, size_t N>
  void enumeration(const std::string& k, E& o, const EnumName<E> (&names)[N]) {
    for (const auto& n : names)
      if (n.value == o) put(k, std::string(n.name));
  }
};

struct KeyLister {
  std::vector<std::string> keys;
  template <typename T>
  void add(const std::string& k, T&) { keys.push_back(k); }
  void integer(const std::string& k, int64_t& o) { add(k, o); }
  void number(const std::string& k, double& o) { add(k, o); }
  void boolean(const std::string& k, bool& o) { add(k, o); }
  void str(const std::string& k, std::string& o) { add(k, o); }
  void tristate(const std::string& k, std::string& o) { add(k, o); }
  template <typename E, size_t N>
  void enumeration(const std::string& k, E& o, const EnumName<E> (&)[N]) { add(k, o); }
};

// ---------------------------------------------------------------------------------------------------------
// [SECTION] Parsing guards: size, nesting depth, UTF-8 (nlohmann throws on invalid UTF-8; we catch it)
// ---------------------------------------------------------------------------------------------------------

int nesting_depth(std::string_view text) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escape = false;
  for (char ch : text) {
    if (in_string) {
      if (escape) escape = false;
      else if (ch == '\\') escape = true;
      else if (ch == '"') in_string = false;
      continue;
    }
    if (ch == '"') in_string = true;
    else if (ch == '{' || ch == '[') max_depth = std::max(max_depth, ++depth);
    else if (ch == '}' || ch == ']') --depth;
  }
  return max_depth;
}


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
  } else if (model_type == "qwen2") {
    m.qkv_bias = true;  // Qwen2Attention: q/k/v_proj bias=True, o_proj bias=False
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
      // T5: generation settings, init scale, the bucketing distance (no parameters), legacy PretrainedConfig keys
      "decoder_start_token_id", "initializer_factor", "output_past", "task_specific_params", "relative_attention_max_distance",
      "tokenizer_class", "feed_forward_proj", "dropout_rate", "finetuning_task", "is_decoder", "output_attentions",
      "output_hidden_states", "pruned_heads", "torchscript", "use_bfloat16"};
  return s;
}

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
  Config tmp;
  tmp.model = hf_structure(type.substr(0, kMaxStringBytes), notes);
  json norm = *j;
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
  if (errors.size() == before.size()) out = m;
}

// ---------------------------------------------------------------------------------------------------------
// [SECTION] Versions: every schema that has shipped is migrated step by step to the current one.
// ---------------------------------------------------------------------------------------------------------

// Schema 2 made the switches that library versions decide derivable (frameworks.cpp resolve(), versions.h): each
// is auto / true / false or gained an auto, and auto is the new default. Schema 1 wrote them as fixed values (its
// booleans as JSON booleans, or "1"/"0" in a link) and meant its fixed defaults where a section left one out;
// migration writes every one of them explicitly, so that an old config or link keeps its exact meaning whatever the
// versions derive. A section a config leaves out still keeps the base's values (config_from_json), as it did: a
// dropped model-only config does not reset the page's training switches. A link always decodes over the defaults,
// so a link's missing keys are schema 1's defaults.
struct Schema1Switch {
  const char* section;
  const char* name;
  const char* schema1_default;  // the JSON text of schema 1's default
  bool boolean;                 // a bool in schema 1, a tri-state string in schema 2
};
constexpr Schema1Switch kSchema1Switches[] = {
    {"training", "zero_grad_set_to_none", "true", true},
    {"training", "softmax_saves_input", "false", true},
    {"training", "empty_cache_steps", "0", false},
    {"peft", "adapter_dtype", "\"fp32\"", false},
    {"peft", "bnb_saves_input", "false", true},
    {"hardware", "cuda_module_loading", "\"lazy\"", false},
    {"hardware", "expandable_segments", "false", true},
};
// training.optimizer_impl, attention and loss were "auto" in schema 1 already, meaning the framework's choice; with
// no versions section (schema 1 had none) every version is latest, and auto derives exactly that choice.

void migrate_1_to_2(json& doc) {
  for (const auto& s : kSchema1Switches) {
    auto found = doc.find(s.section);
    if (found == doc.end() || !found->is_object()) continue;  // kept from the base, or reported by the reader
    json& section = *found;
    auto it = section.find(s.name);
    if (it == section.end() || it->is_null()) section[s.name] = json::parse(s.schema1_default);
    json& v = section[s.name];
    if (!s.boolean) continue;
    if (v.is_boolean()) v = v.get<bool>() ? "true" : "false";
    else if (v == "1" || v == "0") v = v == "1" ? "true" : "false";  // a link's boolean (Reader::boolean)
  }
}

// The same step on a link's key=value pairs.
void migrate_1_to_2(std::vector<std::pair<std::string, std::string>>& pairs) {
  for (const auto& s : kSchema1Switches) {
    const std::string key = std::string(s.section) + "." + s.name;
    auto it = std::find_if(pairs.begin(), pairs.end(), [&](const auto& kv) { return kv.first == key; });
    if (it == pairs.end()) {
      json d = json::parse(s.schema1_default);
      pairs.emplace_back(key, d.is_string() ? d.get<std::string>() : d.dump());
    } else if (s.boolean && (it->second == "1" || it->second == "0")) {
      it->second = it->second == "1" ? "true" : "false";
    }
  }
}

bool check_schema(int version, std::vector<FieldError>& errors) {
  if (version > kConfigSchema) {
    errors.push_back({"schema", "schema " + std::to_string(version) + " comes from a newer memsim; this build reads "
                                "schemas 1 to " + std::to_string(kConfigSchema) + ". Open the link in the current memsim."});
    return false;
  }
  if (version < 1) {
    errors.push_back({"schema", "schema must be an integer from 1 to " + std::to_string(kConfigSchema)});
    return false;
  }
  return true;
}

// Upgrades `doc` (a JSON document or a link's pairs) from schema `from` to `from + 1`.
template <typename Doc>
void migrate_step(Doc& doc, int from) {
  switch (from) {
    case 1:
      migrate_1_to_2(doc);
      break;
  }
}

// Returns false (with an error) for versions this build cannot read. `Doc` is a JSON document or a link's pairs.
template <typename Doc>
bool migrate(Doc& doc, int version, std::vector<FieldError>& errors) {
  if (!check_schema(version, errors)) return false;
  for (int v = version; v < kConfigSchema; ++v) migrate_step(doc, v);
  return true;
}

// ---------------------------------------------------------------------------------------------------------
// [SECTION] Percent-encoding for the fragment
// ---------------------------------------------------------------------------------------------------------

bool ascii_alnum(unsigned char ch) { return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'); }

// The strict form (RFC 3986's unreserved characters raw): the full links' values, and a link's content as its
// checksum sees it.
std::string percent_encode(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char ch : s) {
    if (ascii_alnum(ch) || ch == '-' || ch == '_' || ch == '.' || ch == '~') out += static_cast<char>(ch);
    else out += '%', out += hex[ch >> 4], out += hex[ch & 15];
  }
  return out;
}

bool percent_decode(std::string_view s, std::string& out) {
  out.clear();
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%') {
      if (i + 2 >= s.size()) return false;
      auto hexval = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
      };
      int hi = hexval(s[i + 1]), lo = hexval(s[i + 2]);
      if (hi < 0 || lo < 0) return false;
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else if (s[i] == '+') {
      out += ' ';
    } else {
      out += s[i];
    }
  }
  return true;
}

// ---------------------------------------------------------------------------------------------------------
// [SECTION] Links: the short form, its frozen defaults and presets, its checksum
// ---------------------------------------------------------------------------------------------------------
//
// A short link:  memsim=2&model=llama-3.1-70b&framework=hf_trainer&method=lora&gpu=h200&c=7kq2m9
// - memsim=N starts it: the config schema N it is read with, and the promise that it ends with a checksum, so that a
//   link cut anywhere (at a field boundary too) is told from a whole one;
// - then only the fields that differ from schema N's frozen defaults (tests/golden/vN.defaults.json), by their bare
//   names where a name is unique among the schema's fields (hidden_size, not model.hidden_size);
// - model=ID, where it is shorter, stands for a catalogue model as frozen in tests/golden/vN.presets.json; the model
//   fields after it are the differences from that preset;
// - c= ends it: a checksum of everything before it.
// The full form (schema=N and every field, as every link was written before) is still read, without a checksum;
// a field it leaves out also takes schema N's frozen defaults.

using Pairs = std::vector<std::pair<std::string, std::string>>;

// Six Crockford base32 characters keep 30 bits of the hash. A cut at a field boundary is caught whatever the length,
// because the c= item is then missing; the bits guard against alterations (a hand edit, a chat client re-encoding a
// character, a cut inside the checksum), which pass unnoticed once in 2^30 (about 10^9), for 9 of the link's
// characters ("&c=" and six). Four characters (one in 10^6) would save two characters of a 400-character budget.
constexpr int kChecksumChars = 6;
constexpr std::string_view kShortMarker = "memsim";  // memsim=N: a short link of schema N
constexpr int kFirstShortSchema = 2;                 // short links began with schema 2

std::string value_text(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// The text of every field, in field order, as a link writes it (JSON's text of numbers and booleans).
struct ValueTexts {
  std::vector<std::string> out;
  void integer(const std::string&, int64_t& o) { out.push_back(std::to_string(o)); }
  void number(const std::string&, double& o) { out.push_back(json(o).dump()); }
  void boolean(const std::string&, bool& o) { out.push_back(o ? "true" : "false"); }
  void str(const std::string&, std::string& o) { out.push_back(o); }
  void tristate(const std::string&, std::string& o) { out.push_back(o); }
  template <typename E, size_t N>
  void enumeration(const std::string&, E& o, const EnumName<E> (&names)[N]) {
    std::string name;
    for (const auto& n : names)
      if (n.value == o) name = n.name;
    out.push_back(name);
  }
};

std::vector<std::string> value_texts(const Config& c) {
  Config copy = c;
  ValueTexts v;
  visit_fields(copy, v);
  return v.out;
}

const std::vector<std::string>& all_keys() {
  static const std::vector<std::string> keys = [] {
    Config c;
    KeyLister l;
    visit_fields(c, l);
    return l.keys;
  }();
  return keys;
}

// Bare name -> full key, for the names that only one of `keys` has (section.name).
std::map<std::string, std::string> bare_names(const std::vector<std::string>& keys) {
  std::map<std::string, int> count;
  for (const auto& k : keys) ++count[split_key(k).second];
  std::map<std::string, std::string> out;
  for (const auto& k : keys)
    if (count[split_key(k).second] == 1) out[split_key(k).second] = k;
  return out;
}

// One schema's frozen link data (core/link_data.h).
struct SchemaLinks {
  Pairs defaults;                              // every field the schema had, full keys, in that schema's text
  std::map<std::string, std::string> full_key; // bare name -> full key
  std::map<std::string, Pairs> presets;        // model=ID -> the model fields it sets
};

const SchemaLinks* schema_links(int schema) {
  static const std::map<int, SchemaLinks> all = [] {
    std::map<int, SchemaLinks> m;
    for (const LinkDataFile& f : link_data_files()) {
      const json doc = json::parse(f.text, nullptr, false);
      if (doc.is_discarded() || !doc.is_object()) continue;  // test_links.cpp reads every file
      SchemaLinks& s = m[f.schema];
      for (auto it = doc.begin(); it != doc.end(); ++it) {
        if (!it->is_object()) continue;  // "schema"
        for (auto field = it->begin(); field != it->end(); ++field) {
          if (f.kind == "defaults") s.defaults.emplace_back(it.key() + "." + field.key(), value_text(*field));
          else s.presets[it.key()].emplace_back("model." + field.key(), value_text(*field));
        }
      }
    }
    for (auto& [schema, s] : m) {
      std::vector<std::string> keys;
      for (const auto& kv : s.defaults) keys.push_back(kv.first);
      s.full_key = bare_names(keys);
    }
    return m;
  }();
  auto it = all.find(schema);
  return it == all.end() ? nullptr : &it->second;
}

// The current schema's frozen defaults as a config (its file names every field: test_links.cpp).
const Config& frozen_defaults() {
  static const Config c = [] {
    Config d;
    if (const SchemaLinks* s = schema_links(kConfigSchema))
      for (const auto& [k, v] : s->defaults) apply_setting(d, k + "=" + v);
    return d;
  }();
  return c;
}

// What the encoder compares with: the frozen defaults' texts, and each frozen preset's (the defaults with its model).
struct EncoderBases {
  std::vector<std::string> defaults;
  std::vector<std::pair<std::string, std::vector<std::string>>> presets;  // id, texts; in id order
  std::vector<std::string> names;                                          // what each field is written as
};

const EncoderBases& encoder_bases() {
  static const EncoderBases b = [] {
    EncoderBases e;
    e.defaults = value_texts(frozen_defaults());
    const SchemaLinks* s = schema_links(kConfigSchema);
    for (const auto& key : all_keys()) {
      const std::string bare = split_key(key).second;
      const bool unique = s && s->full_key.count(bare) && s->full_key.at(bare) == key;
      e.names.push_back(unique ? bare : key);
    }
    if (!s) return e;
    for (const auto& [id, fields] : s->presets) {
      Config c = frozen_defaults();
      for (const auto& [k, v] : fields) apply_setting(c, k + "=" + v);
      e.presets.emplace_back(id, value_texts(c));
    }
    return e;
  }();
  return b;
}

// The readable form of a short link's values: the characters that mean nothing in a fragment and that chat clients
// keep inside a link stay raw (a value's '=' too, since an item splits at its first '='), a space becomes '+';
// the rest is percent-encoded ('&', '%', '+', '#', quotes and brackets, which chat clients take for a link's end).
std::string readable_encode(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char ch : s) {
    if (ascii_alnum(ch) || std::string_view("-_.~,:=/").find(static_cast<char>(ch)) != std::string_view::npos)
      out += static_cast<char>(ch);
    else if (ch == ' ')
      out += '+';
    else
      out += '%', out += hex[ch >> 4], out += hex[ch & 15];
  }
  return out;
}

// The checksum: FNV-1a (64 bits) over the link's decoded items in the strict percent-encoding, so that a character
// encoded differently on its way (',' as %2C) still checks, then MurmurHash3's 64-bit finalizer, so that every input
// bit reaches the top bits kept.
std::string link_checksum(const Pairs& items) {
  uint64_t h = 14695981039346656037ull;
  auto add = [&h](const std::string& s) {
    for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  };
  for (const auto& [k, v] : items) add(percent_encode(k) + "=" + percent_encode(v) + "&");
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  static constexpr char kDigits[] = "0123456789abcdefghjkmnpqrstvwxyz";  // Crockford's base32: no i, l, o or u
  std::string out;
  for (int i = 0; i < kChecksumChars; ++i) out += kDigits[(h >> (59 - 5 * i)) & 31];
  return out;
}

bool ends_with_nocase(std::string_view s, std::string_view tail) {
  if (s.size() < tail.size()) return false;
  for (size_t i = 0; i < tail.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(s[s.size() - tail.size() + i])) != std::tolower(static_cast<unsigned char>(tail[i])))
      return false;
  return true;
}

// Splits a fragment into decoded key=value items; false for an item without '=' or with a broken escape.
bool split_items(std::string_view fragment, Pairs& items, std::string& bad_item) {
  size_t pos = 0;
  while (pos <= fragment.size()) {
    size_t amp = fragment.find('&', pos);
    if (amp == std::string_view::npos) amp = fragment.size();
    std::string_view item = fragment.substr(pos, amp - pos);
    pos = amp + 1;
    if (item.empty()) continue;
    size_t eq = item.find('=');
    std::string k, v;
    if (eq == std::string_view::npos || !percent_decode(item.substr(0, eq), k) || !percent_decode(item.substr(eq + 1), v)) {
      bad_item = std::string(item.substr(0, 40));
      return false;
    }
    items.emplace_back(std::move(k), std::move(v));
  }
  return true;
}

// A link's items (schema `version`, without schema=, memsim= and c=) over the frozen defaults.
Parsed decode_items(Pairs items, int version, Parsed p) {
  const SchemaLinks* s = schema_links(version);
  // Bare names and model=ID as the link's own schema meant them.
  Pairs expanded;
  for (auto& [k, v] : items) {
    if (k == "model") {
      const Pairs* preset = nullptr;
      if (s && s->presets.count(v)) preset = &s->presets.at(v);
      if (!preset) {
        p.errors.push_back({"model", "model: the link names the model \"" + v.substr(0, 40) +
                                         "\", which this memsim does not know (`memsim-cli presets` lists the ids)"});
        return p;
      }
      expanded.insert(expanded.end(), preset->begin(), preset->end());
    } else if (k.find('.') == std::string::npos && s && s->full_key.count(k)) {
      expanded.emplace_back(s->full_key.at(k), v);
    } else {
      expanded.emplace_back(std::move(k), std::move(v));
    }
  }
  // The fields the link leaves out take its schema's frozen defaults; a field its schema did not have yet, the next
  // schema's; each step migrates them with the link's own.
  for (int v = version; v < kConfigSchema; ++v) {
    std::set<std::string> present;
    for (const auto& kv : expanded) present.insert(kv.first);
    if (const SchemaLinks* old = schema_links(v))
      for (const auto& kv : old->defaults)
        if (!present.count(kv.first)) expanded.push_back(kv);
    migrate_step(expanded, v);
  }
  Config c = frozen_defaults();
  for (auto& [k, v] : expanded) {
    auto errs = apply_setting(c, k + "=" + v);
    p.errors.insert(p.errors.end(), errs.begin(), errs.end());
    if (p.errors.size() > 20) break;
  }
  if (p.errors.empty()) {
    p.config = c;
    p.ok = true;
  }
  return p;
}

const char* const kCutMessage =
    "the link is incomplete: it lacks the checksum (c=...) that ends every memsim link. Was it cut off in chat? "
    "Copy the whole link again";
const char* const kAlteredMessage =
    "the link is incomplete or altered (checksum mismatch): was it cut off in chat? Copy the whole link again";

Parsed short_link(std::string_view fragment, Parsed p) {
  Pairs items;
  std::string bad;
  if (!split_items(fragment, items, bad) || items.empty() || items.front().first != kShortMarker) {
    // Cut inside its first item ("memsim", "memsim="), or damaged: say which, by whether its end is still there.
    const bool has_end = fragment.find("&c=") != std::string_view::npos;
    p.errors.push_back({"link", has_end ? kAlteredMessage : kCutMessage});
    return p;
  }
  int64_t n = 0;
  Reader r{p.errors};
  if (!r.integer("memsim", items.front().second, n)) {
    p.errors.back() = {"link", kAlteredMessage};
    return p;
  }
  const int version = static_cast<int>(std::clamp<int64_t>(n, -1, 1 << 20));
  if (!check_schema(version, p.errors)) return p;
  if (version < kFirstShortSchema) {
    p.errors.push_back({"link", "the link starts with memsim=" + std::to_string(version) + ", which no memsim wrote: "
                                "short links begin at memsim=" + std::to_string(kFirstShortSchema)});
    return p;
  }
  if (items.back().first != "c") {
    p.errors.push_back({"link", kCutMessage});
    return p;
  }
  std::string sum = items.back().second;
  std::transform(sum.begin(), sum.end(), sum.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  items.pop_back();
  if (sum != link_checksum(items)) {
    p.errors.push_back({"link", kAlteredMessage});
    return p;
  }
  items.erase(items.begin());
  return decode_items(std::move(items), version, std::move(p));
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// [SECTION] Public functions
// ---------------------------------------------------------------------------------------------------------

std::vector<std::string> field_keys() { return all_keys(); }

std::string config_to_json(const Config& c, int indent) {
  json out = json::object();
  out["schema"] = kConfigSchema;
  Config copy = c;
  JsonWriter w{out};
  visit_fields(copy, w);
  return out.dump(indent, ' ', false, json::error_handler_t::replace);
}

Parsed config_from_json(std::string_view text, const Config& base) {
  Parsed p;
  p.config = base;
  json doc;
  if (!parse_document(text, "config", doc, p.errors)) return p;
  int version = kConfigSchema;
  if (auto it = doc.find("schema"); it != doc.end()) {
    int64_t v = 0;
    Reader r{p.errors};
    if (!r.integer("schema", *it, v)) return p;
    version = static_cast<int>(std::clamp<int64_t>(v, -1, 1 << 20));
  } else {
    p.notes.push_back("schema: not given, read as schema " + std::to_string(kConfigSchema));
  }
  if (!migrate(doc, version, p.errors)) return p;

  Config c = base;
  static const std::set<std::string> sections = {"model", "training", "peft", "parallel", "hardware", "data", "versions"};
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    if (it.key() == "schema") continue;
    if (!sections.count(it.key())) {
      p.errors.push_back({it.key(), "unknown section \"" + it.key().substr(0, 40) +
                                        "\"; a config has schema, model, training, peft, parallel, hardware, data and versions"});
      continue;
    }
    if (!it->is_object()) {
      p.errors.push_back({it.key(), it.key() + " must be a JSON object"});
      continue;
    }
    if (it.key() == "model") {
      read_model_section(*it, c.model, p.errors, p.notes);
      continue;
    }
    JsonSectionReader rd{{p.errors}, *it, it.key(), {}};
    visit_fields(c, rd);
    for (auto f = it->begin(); f != it->end(); ++f)
      if (!rd.seen.count(f.key()))
        p.errors.push_back({it.key() + "." + f.key(), "unknown field " + it.key() + "." + f.key().substr(0, 40)});
  }
  if (p.errors.empty()) {
    p.config = c;
    p.ok = true;
  }
  return p;
}

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
  }
  return p;
}

std::string config_to_full_fragment(const Config& c) {
  const std::vector<std::string> values = value_texts(c);
  std::string out = "schema=" + std::to_string(kConfigSchema);
  for (size_t i = 0; i < values.size(); ++i) out += "&" + all_keys()[i] + "=" + percent_encode(values[i]);
  return out;
}

std::string config_to_fragment(const Config& c) {
  const EncoderBases& b = encoder_bases();
  const std::vector<std::string>& keys = all_keys();
  const std::vector<std::string> values = value_texts(c);
  auto is_model = [&](size_t i) { return keys[i].rfind("model.", 0) == 0; };
  // The model over the defaults, or as the frozen preset that leaves the shortest text: "model=ID&" and the fields
  // that still differ from it (a catalogue model picked in the page is its id alone). Ties keep the defaults.
  auto model_chars = [&](const std::vector<std::string>& base) {
    size_t n = 0;
    for (size_t i = 0; i < values.size(); ++i)
      if (is_model(i) && values[i] != base[i]) n += b.names[i].size() + readable_encode(values[i]).size() + 2;
    return n;
  };
  const std::vector<std::string>* model_base = &b.defaults;
  const std::string* preset_id = nullptr;
  size_t best = model_chars(b.defaults);
  for (const auto& [id, texts] : b.presets) {
    const size_t n = std::string_view("model=&").size() + id.size() + model_chars(texts);
    if (n < best) best = n, model_base = &texts, preset_id = &id;
  }
  Pairs items = {{std::string(kShortMarker), std::to_string(kConfigSchema)}};
  if (preset_id) items.emplace_back("model", *preset_id);
  for (size_t i = 0; i < values.size(); ++i)
    if (values[i] != (is_model(i) ? *model_base : b.defaults)[i]) items.emplace_back(b.names[i], values[i]);
  std::string out;
  for (const auto& [k, v] : items) out += (out.empty() ? "" : "&") + k + "=" + readable_encode(v);
  return out + "&c=" + link_checksum(items);
}

std::string_view link_fragment(std::string_view text) {
  auto space = [](char ch) { return ch == ' ' || ch == '\t' || ch == '\r' || ch == '\n'; };
  while (!text.empty() && space(text.front())) text.remove_prefix(1);
  if (size_t hash = text.find('#'); hash != std::string_view::npos) text.remove_prefix(hash + 1);
  // What chat clients append to a link that ends a sentence or sits in brackets or quotes: raw, as the browser's
  // address bar encodes it (%22, %3E), and typographic closing quotes. None of them can end a link memsim writes,
  // which ends with its checksum's letters and digits.
  static constexpr std::string_view kTails[] = {".", ",", ";", ":", "!", "?", ")", "]", ">", "'", "\"", " ", "\t",
                                                "\r", "\n", "%22", "%3E", "\xE2\x80\x9D", "\xE2\x80\x99",
                                                "%E2%80%9D", "%E2%80%99"};
  for (bool stripped = true; stripped && !text.empty();) {
    stripped = false;
    for (std::string_view tail : kTails)
      if (ends_with_nocase(text, tail)) {
        text.remove_suffix(tail.size());
        stripped = true;
        break;
      }
  }
  return text;
}

Parsed config_from_fragment(std::string_view link, const Config& base) {
  Parsed p;
  p.config = base;
  if (link.size() > kMaxFragmentBytes) {
    p.errors.push_back({"link", "the link's fragment is " + std::to_string(link.size() / 1024) +
                                    " KiB; at most 64 KiB is accepted"});
    return p;
  }
  const bool had_hash = link.find('#') != std::string_view::npos;
  std::string_view fragment = link_fragment(link);
  // A short link, or what is left of one cut inside its first item ("mems", "memsim=").
  const std::string marker = std::string(kShortMarker) + "=";
  if (fragment.rfind(marker, 0) == 0 || (!fragment.empty() && marker.rfind(fragment, 0) == 0))
    return short_link(fragment, std::move(p));
  if (!had_hash && (fragment.rfind("http://", 0) == 0 || fragment.rfind("https://", 0) == 0)) {
    p.errors.push_back({"link", "the link has no '#' part, where memsim keeps the setup: was it cut off?"});
    return p;
  }
  // The full form: schema=N anywhere, and fields by their keys.
  Pairs pairs;
  std::string bad;
  if (!split_items(fragment, pairs, bad)) {
    p.errors.push_back({"link", "the link is damaged near \"" + bad + "\""});
    return p;
  }
  int version = -1;
  for (auto& [k, v] : pairs)
    if (k == "schema") {
      int64_t n = 0;
      Reader r{p.errors};
      if (!r.integer("schema", v, n)) return p;
      version = static_cast<int>(std::clamp<int64_t>(n, -1, 1 << 20));
    }
  if (version == -1) {
    p.errors.push_back({"schema", "the link has no schema version; it was not made by memsim"});
    return p;
  }
  if (!check_schema(version, p.errors)) return p;
  pairs.erase(std::remove_if(pairs.begin(), pairs.end(), [](const auto& kv) { return kv.first == "schema"; }), pairs.end());
  return decode_items(std::move(pairs), version, std::move(p));
}

std::vector<FieldError> apply_setting(Config& c, std::string_view key_equals_value) {
  std::vector<FieldError> errors;
  size_t eq = key_equals_value.find('=');
  if (eq == std::string_view::npos) {
    errors.push_back({"set", "a setting must look like KEY=VALUE, e.g. model.hidden_size=4096; got \"" +
                                 std::string(key_equals_value.substr(0, 40)) + "\""});
    return errors;
  }
  std::string key(key_equals_value.substr(0, eq));
  const std::string value(key_equals_value.substr(eq + 1));
  // A bare name, as short links write it (hidden_size for model.hidden_size), where one field has it.
  static const std::map<std::string, std::string> bare = bare_names(all_keys());
  if (key.find('.') == std::string::npos && bare.count(key)) key = bare.at(key);
  Config tmp = c;
  StringSetter s{{errors}, key, value};
  visit_fields(tmp, s);
  if (!s.found)
    errors.push_back({key.substr(0, 60), "unknown key \"" + key.substr(0, 60) + "\"; `memsim-cli keys` lists them"});
  if (errors.empty()) c = tmp;
  return errors;
}


std::vector<std::string> config_changes(const Config& from, const Config& to) {
  const json a = json::parse(config_to_json(from, -1), nullptr, false);
  const json b = json::parse(config_to_json(to, -1), nullptr, false);
  std::vector<std::string> out;
  for (const std::string& key : field_keys()) {
    auto [sec, name] = split_key(key);
    const json& va = a[sec][name];
    const json& vb = b[sec][name];
    if (va != vb) out.push_back(key + "=" + (vb.is_string() ? vb.get<std::string>() : vb.dump()));
  }
  return out;
}

std::string result_to_json(const Result& r, bool with_timeline, int indent, const std::vector<Suggestion>* suggestions,
                           const Config* base) {
  json out;
  out["schema"] = kResultSchema;
  out["ok"] = r.ok;
  if (!r.ok) {
    json errs = json::array();
    for (const auto& e : r.errors) errs.push_back({{"field", e.field}, {"message", e.message}});
    out["errors"] = errs;
    return out.dump(indent, ' ', false, json::error_handler_t::replace);
  }
  out["params_total"] = r.params_total;
  out["params_trainable"] = r.params_trainable;
  out["model_states"] = {{"weights_bytes", r.model_states.weights_bytes},
                         {"gradients_bytes", r.model_states.gradients_bytes},
                         {"optimizer_bytes", r.model_states.optimizer_bytes}};
  json devices = json::array();
  for (const auto& d : r.devices) {
    json dev;
    dev["role"] = d.role;
    dev["device_count"] = d.device_count;
    dev["peak"] = {{"allocated_bytes", d.peak.allocated_bytes}, {"reserved_bytes", d.peak.reserved_bytes},
                   {"active_bytes", d.peak.active_bytes},       {"requested_bytes", d.peak.requested_bytes},
                   {"device_bytes", d.peak.device_bytes}};
    json bd;
    for (int i = 0; i < kComponentCount; ++i) bd[component_id(static_cast<Component>(i))] = d.breakdown.allocator[i];
    bd["fragmentation"] = d.breakdown.fragmentation_bytes;
    bd["cuda_context"] = d.breakdown.cuda_context_bytes;
    bd["nccl"] = d.breakdown.nccl_bytes;
    dev["breakdown"] = bd;
    dev["fits"] = d.fits;
    dev["verdict"] = verdict_id(d.verdict);
    if (d.band.valid) {  // the uncertainty band of each statistic (core/band.h)
      json band;
      for (int i = 0; i < kBandStatistics; ++i) {
        const auto s = static_cast<BandStatistic>(i);
        band[band_statistic_id(s)] = {{"low_bytes", d.band.of(s).low_bytes}, {"high_bytes", d.band.of(s).high_bytes}};
      }
      dev["band"] = band;
    }
    dev["oom"] = d.oom;
    if (d.oom) dev["oom_at"] = {{"event", d.oom_event}};
    dev["capacity_bytes"] = d.capacity_bytes;
    dev["usable_bytes"] = d.usable_bytes;
    dev["peak_at"] = {{"event", d.peak_event}, {"phase", d.peak_phase}, {"tensor", d.peak_label}};
    if (d.host_bytes > 0 || d.nvme_bytes > 0) dev["offloaded"] = {{"host_bytes", d.host_bytes}, {"nvme_bytes", d.nvme_bytes}};
    if (d.run.steps > 0) {  // a run of varying shapes: where in the run the peaks fell, and how reserved grew
      const auto& run = d.run;
      dev["run"] = {{"steps", run.steps},
                    {"allocated_peak_step", run.allocated_peak_step},
                    {"reserved_peak_step", run.reserved_peak_step},
                    {"longest_step", run.longest_step},
                    {"longest_tokens", run.longest_tokens},
                    {"first_step_reserved_bytes", run.first_step_reserved_bytes},
                    {"empty_cache_calls", run.empty_cache_calls}};
      if (with_timeline) {
        json tokens = json::array(), alloc = json::array(), res = json::array();
        for (const auto& pt : run.per_step)
          tokens.push_back(pt.tokens), alloc.push_back(pt.allocated_bytes), res.push_back(pt.reserved_bytes);
        dev["run"]["per_step"] = {{"tokens", tokens}, {"allocated_bytes", alloc}, {"reserved_bytes", res}};
      }
    }
    if (with_timeline) {
      json phases = json::array();
      for (const auto& ph : d.program.phases) phases.push_back({{"name", ph.name}, {"first_event", ph.first_event}});
      json alloc = json::array(), res = json::array();
      for (const auto& pt : d.timeline) alloc.push_back(pt.allocated_bytes), res.push_back(pt.reserved_bytes);
      dev["timeline"] = {{"phases", phases}, {"allocated_bytes", alloc}, {"reserved_bytes", res}};
    }
    devices.push_back(dev);
  }
  out["devices"] = devices;
  if (r.host.per_node_bytes > 0 || r.host.nvme_per_node_bytes > 0) {
    out["host"] = {{"per_node_bytes", r.host.per_node_bytes}, {"nvme_per_node_bytes", r.host.nvme_per_node_bytes},
                   {"gpus_per_node", r.host.gpus_per_node}, {"nodes", r.host.nodes}};
    if (r.host.capacity_bytes > 0) out["host"]["capacity_bytes"] = r.host.capacity_bytes, out["host"]["fits"] = r.host.fits;
  }
  out["notes"] = r.notes;
  if (suggestions) {
    json list = json::array();
    // The group's id, in advice.h's order: the JSON edge's words for SuggestionGroup.
    static const char* const kGroupIds[kSuggestionGroups] = {"same_job", "same_job_numerics", "pair", "more_hardware",
                                                             "changes_job"};
    for (const auto& sg : *suggestions) {
      json item = {{"id", sg.id}, {"group", kGroupIds[static_cast<int>(sg.group)]}, {"change", sg.change}, {"cost", sg.cost},
                   {"set", base ? config_changes(*base, sg.config) : std::vector<std::string>{}},
                   {"device_bytes_after", sg.peak_bytes}, {"saved_bytes", sg.saved_bytes}, {"fits", sg.fits},
                   {"verdict", verdict_id(sg.verdict)}};
      if (!sg.part_changes.empty()) item["parts"] = sg.part_changes;
      list.push_back(item);
    }
    out["suggestions"] = list;
  }
  return out.dump(indent, ' ', false, json::error_handler_t::replace);
}

std::string document_guard_error(std::string_view text, const std::string& what) {
  if (text.size() > kMaxDocumentBytes)
    return what + " is " + std::to_string(text.size() / (1024 * 1024)) +
           " MiB; at most 8 MiB is accepted (a config.json is a few KB)";
  // Before any recursive parse or dump: nlohmann recurses once per level, so deep nesting would overflow the stack.
  if (nesting_depth(text) > kMaxDepth) return what + " is nested more than 64 levels deep";
  return "";
}

// ---------------------------------------------------------------------------------------------------------
// [SECTION] Reading JSON documents (json_read.h), shared by every decoder of the core
// ---------------------------------------------------------------------------------------------------------

namespace json_read {

std::string describe(const json& v) {
  std::string s = v.dump(-1, ' ', true, json::error_handler_t::replace);
  return s.size() > 40 ? s.substr(0, 40) + "..." : s;
}

// Strict UTF-8 (no overlongs, surrogates or code points above U+10FFFF), as JSON output requires.
bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    const size_t len = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    uint32_t cp = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
    for (size_t k = 1; k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += len;
  }
  return true;
}

bool parse_document(std::string_view text, const std::string& what, json& out, std::vector<FieldError>& errors) {
  if (std::string e = document_guard_error(text, what); !e.empty()) {
    errors.push_back({what, std::move(e)});
    return false;
  }
  try {
    out = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    std::string msg = e.what();
    if (auto p = msg.find("parse error"); p != std::string::npos) msg = msg.substr(p);
    errors.push_back({what, what + " is not valid JSON: " + msg});
    return false;
  }
  if (!out.is_object()) {
    errors.push_back({what, what + " must be a JSON object"});
    return false;
  }
  return true;
}

}  // namespace json_read

}  // namespace memsim
