#include "serialize.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

namespace memsim {

using json = nlohmann::json;

namespace {

// ---------------------------------------------------------------------------------------------------------
// [SECTION] The field list: one place names every config field and its flattened key.
// ---------------------------------------------------------------------------------------------------------

template <typename E>
struct EnumName {
  E value;
  const char* name;
};
constexpr EnumName<NormType> kNormNames[] = {{NormType::RMSNorm, "rmsnorm"}, {NormType::LayerNorm, "layernorm"}};
constexpr EnumName<PositionType> kPositionNames[] = {{PositionType::Rope, "rope"}, {PositionType::Absolute, "absolute"}};

template <typename V>
void visit_fields(Config& c, V& v) {
  auto& m = c.model;
  v.str("model.name", m.name);
  v.str("model.model_type", m.model_type);
  v.integer("model.hidden_size", m.hidden_size);
  v.integer("model.num_hidden_layers", m.num_hidden_layers);
  v.integer("model.num_attention_heads", m.num_attention_heads);
  v.integer("model.num_key_value_heads", m.num_key_value_heads);
  v.integer("model.head_dim", m.head_dim);
  v.integer("model.intermediate_size", m.intermediate_size);
  v.integer("model.vocab_size", m.vocab_size);
  v.integer("model.max_position_embeddings", m.max_position_embeddings);
  v.boolean("model.tie_word_embeddings", m.tie_word_embeddings);
  v.str("model.hidden_act", m.hidden_act);
  v.boolean("model.attention_bias", m.attention_bias);
  v.boolean("model.mlp_bias", m.mlp_bias);
  v.enumeration("model.norm_type", m.norm_type, kNormNames);
  v.boolean("model.mlp_gated", m.mlp_gated);
  v.boolean("model.qkv_bias", m.qkv_bias);
  v.boolean("model.qk_norm", m.qk_norm);
  v.boolean("model.qk_norm_per_head", m.qk_norm_per_head);
  v.integer("model.norms_per_layer", m.norms_per_layer);
  v.enumeration("model.position_embedding_type", m.position_embedding_type, kPositionNames);
  v.number("model.attention_dropout", m.attention_dropout);
  v.number("model.hidden_dropout", m.hidden_dropout);
  v.integer("model.num_experts", m.num_experts);
  v.integer("model.num_experts_per_tok", m.num_experts_per_tok);
  v.integer("model.moe_intermediate_size", m.moe_intermediate_size);
  v.integer("model.shared_expert_intermediate_size", m.shared_expert_intermediate_size);
  v.integer("model.first_k_dense_replace", m.first_k_dense_replace);
  v.boolean("model.router_bias", m.router_bias);
  v.number("model.moe_capacity_factor", m.moe_capacity_factor);
  v.integer("model.q_lora_rank", m.q_lora_rank);
  v.integer("model.kv_lora_rank", m.kv_lora_rank);
  v.integer("model.qk_nope_head_dim", m.qk_nope_head_dim);
  v.integer("model.qk_rope_head_dim", m.qk_rope_head_dim);
  v.integer("model.v_head_dim", m.v_head_dim);
  v.boolean("model.post_layernorm", m.post_layernorm);
  v.integer("model.type_vocab_size", m.type_vocab_size);
  v.str("model.task_head", m.task_head);
  v.integer("model.num_labels", m.num_labels);

  auto& t = c.training;
  v.integer("training.micro_batch_size", t.micro_batch_size);
  v.integer("training.sequence_length", t.sequence_length);
  v.integer("training.gradient_accumulation_steps", t.gradient_accumulation_steps);
  v.str("training.framework", t.framework);
  v.str("training.precision", t.precision);
  v.str("training.optimizer", t.optimizer);
  v.str("training.optimizer_impl", t.optimizer_impl);
  v.str("training.activation_checkpointing", t.activation_checkpointing);
  v.integer("training.checkpoint_every_k_layers", t.checkpoint_every_k_layers);
  v.str("training.attention", t.attention);
  v.str("training.norm_impl", t.norm_impl);
  v.str("training.loss", t.loss);
  v.integer("training.loss_chunks", t.loss_chunks);
  v.boolean("training.activation_offload", t.activation_offload);
  v.boolean("training.optimizer_in_backward", t.optimizer_in_backward);
  v.boolean("training.compile", t.compile);
  v.boolean("training.zero_grad_set_to_none", t.zero_grad_set_to_none);

  auto& p = c.peft;
  v.str("peft.method", p.method);
  v.integer("peft.lora_rank", p.lora_rank);
  v.number("peft.lora_alpha", p.lora_alpha);
  v.number("peft.lora_dropout", p.lora_dropout);
  v.str("peft.target_modules", p.target_modules);
  v.str("peft.adapter_dtype", p.adapter_dtype);
  v.str("peft.base_quantization", p.base_quantization);
  v.boolean("peft.double_quantization", p.double_quantization);
  v.boolean("peft.prepare_kbit", p.prepare_kbit);
  v.str("peft.modules_to_save", p.modules_to_save);

  v.integer("parallel.data_parallel_size", c.parallel.data_parallel_size);
  v.integer("parallel.zero_stage", c.parallel.zero_stage);
  v.str("parallel.sharding", c.parallel.sharding);
  v.integer("parallel.shard_group_size", c.parallel.shard_group_size);
  v.str("parallel.fsdp_backward_prefetch", c.parallel.fsdp_backward_prefetch);
  v.integer("parallel.tensor_parallel_size", c.parallel.tensor_parallel_size);
  v.boolean("parallel.sequence_parallel", c.parallel.sequence_parallel);
  v.integer("parallel.context_parallel_size", c.parallel.context_parallel_size);
  v.integer("parallel.expert_parallel_size", c.parallel.expert_parallel_size);
  v.integer("parallel.pipeline_parallel_size", c.parallel.pipeline_parallel_size);
  v.str("parallel.pipeline_schedule", c.parallel.pipeline_schedule);
  v.integer("parallel.virtual_pipeline_stages", c.parallel.virtual_pipeline_stages);
  v.integer("parallel.pipeline_first_stage_layers", c.parallel.pipeline_first_stage_layers);
  v.integer("parallel.pipeline_last_stage_layers", c.parallel.pipeline_last_stage_layers);
  v.str("parallel.offload_optimizer", c.parallel.offload_optimizer);
  v.str("parallel.offload_params", c.parallel.offload_params);
  v.integer("parallel.zero_reduce_bucket_size", c.parallel.zero_reduce_bucket_size);
  v.str("parallel.zero_overlap_comm", c.parallel.zero_overlap_comm);
  v.integer("parallel.zero_prefetch_bucket_size", c.parallel.zero_prefetch_bucket_size);
  v.integer("parallel.zero_param_persistence_threshold", c.parallel.zero_param_persistence_threshold);

  v.str("hardware.gpu", c.hardware.gpu);
  v.integer("hardware.gpu_memory_bytes", c.hardware.gpu_memory_bytes);
  v.number("hardware.headroom_fraction", c.hardware.headroom_fraction);
  v.integer("hardware.cuda_context_bytes", c.hardware.cuda_context_bytes);
  v.integer("hardware.gpus_per_node", c.hardware.gpus_per_node);
  v.integer("hardware.host_memory_bytes", c.hardware.host_memory_bytes);
}

std::pair<std::string, std::string> split_key(const std::string& key) {
  auto dot = key.find('.');
  return {key.substr(0, dot), key.substr(dot + 1)};
}

constexpr size_t kMaxStringBytes = 256;
constexpr size_t kMaxDocumentBytes = 8 * 1024 * 1024;  // far above any real config.json (a few KB)
constexpr size_t kMaxFragmentBytes = 64 * 1024;
constexpr int kMaxDepth = 64;

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
    fail(f, "a string", describe(v));
    return false;
  }
  bool str(const std::string& f, const std::string& s, std::string& out) {
    if (s.size() > kMaxStringBytes) {
      fail(f, "a string of at most 256 bytes", std::to_string(s.size()) + " bytes");
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
  template <typename E, size_t N>
  bool read(const std::string& k, const json& v, E& o, const EnumName<E> (&names)[N]) {
    return r.enumeration(k, v, o, names);
  }
  void integer(const std::string& k, int64_t& o) { any(k, o); }
  void number(const std::string& k, double& o) { any(k, o); }
  void boolean(const std::string& k, bool& o) { any(k, o); }
  void str(const std::string& k, std::string& o) { any(k, o); }
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

bool parse_document(std::string_view text, const std::string& what, json& out, std::vector<FieldError>& errors) {
  if (text.size() > kMaxDocumentBytes) {
    errors.push_back({what, what + " is " + std::to_string(text.size() / (1024 * 1024)) +
                                " MiB; at most 8 MiB is accepted (a config.json is a few KB)"});
    return false;
  }
  if (nesting_depth(text) > kMaxDepth) {
    errors.push_back({what, what + " is nested more than 64 levels deep"});
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
      model_type == "phimoe" ||
      model_type == "olmo" || model_type == "yi" || model_type == "internlm2") {
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
      "cache_implementation", "hidden_activation", "use_parallel_residual", "qk_layernorm"};
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
  Config tmp;
  tmp.model = hf_structure(type.substr(0, kMaxStringBytes), notes);
  json norm = *j;
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
      norm["moe_intermediate_size"].is_number_integer())
    norm["shared_expert_intermediate_size"] =
        norm["n_shared_experts"].get<int64_t>() * norm["moe_intermediate_size"].get<int64_t>();
  if (type == "falcon") {
    auto flag = [&](const char* k) { return norm.contains(k) && norm[k].is_boolean() && norm[k].get<bool>(); };
    if (!norm.contains("num_key_value_heads") && flag("multi_query") && !flag("new_decoder_architecture"))
      norm["num_key_value_heads"] = 1;
    if (norm.contains("bias") && norm["bias"].is_boolean()) norm["attention_bias"] = norm["mlp_bias"] = norm["bias"];
    if (norm.contains("parallel_attn") && norm["parallel_attn"].is_boolean() && !norm["parallel_attn"].get<bool>())
      norm["norms_per_layer"] = 2;
    if (!norm.contains("intermediate_size") && norm.contains("ffn_hidden_size")) norm["intermediate_size"] = norm["ffn_hidden_size"];
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
  if (errors.size() == before.size()) out = m;
}

// ---------------------------------------------------------------------------------------------------------
// [SECTION] Versions: every schema that has shipped is migrated step by step to the current one.
// ---------------------------------------------------------------------------------------------------------

// Returns false (with an error) for versions this build cannot read.
bool migrate(json& doc, int version, std::vector<FieldError>& errors) {
  if (version > kConfigSchema) {
    errors.push_back({"schema", "schema " + std::to_string(version) + " comes from a newer memsim; this build reads "
                                "schemas 1 to " + std::to_string(kConfigSchema) + ". Open the link in the current memsim."});
    return false;
  }
  if (version < 1) {
    errors.push_back({"schema", "schema must be an integer from 1 to " + std::to_string(kConfigSchema)});
    return false;
  }
  switch (version) {  // fall through: each case upgrades one version
    case 1:
      break;
  }
  (void)doc;
  return true;
}

// ---------------------------------------------------------------------------------------------------------
// [SECTION] Percent-encoding for the fragment
// ---------------------------------------------------------------------------------------------------------

std::string percent_encode(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char ch : s) {
    if (std::isalnum(ch) || ch == '-' || ch == '_' || ch == '.' || ch == '~') out += static_cast<char>(ch);
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

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// [SECTION] Public functions
// ---------------------------------------------------------------------------------------------------------

std::vector<std::string> field_keys() {
  Config c;
  KeyLister l;
  visit_fields(c, l);
  return l.keys;
}

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
  static const std::set<std::string> sections = {"model", "training", "peft", "parallel", "hardware"};
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    if (it.key() == "schema") continue;
    if (!sections.count(it.key())) {
      p.errors.push_back({it.key(), "unknown section \"" + it.key().substr(0, 40) +
                                        "\"; a config has schema, model, training, peft, parallel and hardware"});
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

std::string config_to_fragment(const Config& c) {
  json j = json::parse(config_to_json(c, -1), nullptr, false);
  std::string out = "schema=" + std::to_string(kConfigSchema);
  for (const std::string& key : field_keys()) {
    auto [sec, name] = split_key(key);
    const json& v = j[sec][name];
    std::string s = v.is_string() ? v.get<std::string>() : v.dump();
    out += "&" + key + "=" + percent_encode(s);
  }
  return out;
}

Parsed config_from_fragment(std::string_view fragment, const Config& base) {
  Parsed p;
  p.config = base;
  if (!fragment.empty() && fragment[0] == '#') fragment.remove_prefix(1);
  if (fragment.size() > kMaxFragmentBytes) {
    p.errors.push_back({"link", "the link's fragment is " + std::to_string(fragment.size() / 1024) +
                                    " KiB; at most 64 KiB is accepted"});
    return p;
  }
  std::vector<std::pair<std::string, std::string>> pairs;
  size_t pos = 0;
  while (pos <= fragment.size()) {
    size_t amp = fragment.find('&', pos);
    if (amp == std::string_view::npos) amp = fragment.size();
    std::string_view item = fragment.substr(pos, amp - pos);
    pos = amp + 1;
    if (item.empty()) continue;
    size_t eq = item.find('=');
    std::string k, v;
    if (eq == std::string_view::npos || !percent_decode(item.substr(0, eq), k) ||
        !percent_decode(item.substr(eq + 1), v)) {
      p.errors.push_back({"link", "the link is damaged near \"" + std::string(item.substr(0, 40)) + "\""});
      return p;
    }
    pairs.emplace_back(std::move(k), std::move(v));
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
  json unused;
  if (!migrate(unused, version, p.errors)) return p;
  Config c = base;
  for (auto& [k, v] : pairs) {
    if (k == "schema") continue;
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

std::vector<FieldError> apply_setting(Config& c, std::string_view key_equals_value) {
  std::vector<FieldError> errors;
  size_t eq = key_equals_value.find('=');
  if (eq == std::string_view::npos) {
    errors.push_back({"set", "a setting must look like KEY=VALUE, e.g. model.hidden_size=4096; got \"" +
                                 std::string(key_equals_value.substr(0, 40)) + "\""});
    return errors;
  }
  const std::string key(key_equals_value.substr(0, eq));
  const std::string value(key_equals_value.substr(eq + 1));
  Config tmp = c;
  StringSetter s{{errors}, key, value};
  visit_fields(tmp, s);
  if (!s.found)
    errors.push_back({key.substr(0, 60), "unknown key \"" + key.substr(0, 60) + "\"; `memsim-cli keys` lists them"});
  if (errors.empty()) c = tmp;
  return errors;
}

Parsed config_from_deepspeed_json(std::string_view text, const Config& base) {
  Parsed p;
  p.config = base;
  json doc;
  if (!parse_document(text, "the DeepSpeed config", doc, p.errors)) return p;
  Config c = base;
  std::vector<std::string> used, kept_auto, ignored, notes_extra;
  Reader r{p.errors};
  auto integer = [&](const json& obj, const char* key, const char* field, int64_t& out) {
    auto it = obj.find(key);
    if (it == obj.end()) return;
    if (it->is_string() && it->get<std::string>() == "auto") return kept_auto.emplace_back(key), void();
    int64_t v;
    if (r.integer(field, *it, v)) out = v, used.emplace_back(key);
  };
  integer(doc, "train_micro_batch_size_per_gpu", "training.micro_batch_size", c.training.micro_batch_size);
  integer(doc, "gradient_accumulation_steps", "training.gradient_accumulation_steps", c.training.gradient_accumulation_steps);
  auto enabled = [&](const char* section) {
    auto it = doc.find(section);
    if (it == doc.end() || !it->is_object()) return false;
    auto e = it->find("enabled");
    return e != it->end() && ((e->is_boolean() && e->get<bool>()) || (e->is_string() && e->get<std::string>() == "auto"));
  };
  if (enabled("bf16")) c.training.precision = "bf16_mixed", used.emplace_back("bf16");
  else if (enabled("fp16")) c.training.precision = "fp16_mixed", used.emplace_back("fp16");
  if (auto z = doc.find("zero_optimization"); z != doc.end()) {
    if (!z->is_object()) {
      p.errors.push_back({"zero_optimization", "zero_optimization must be a JSON object"});
    } else {
      integer(*z, "stage", "parallel.zero_stage", c.parallel.zero_stage);
      integer(*z, "reduce_bucket_size", "parallel.zero_reduce_bucket_size", c.parallel.zero_reduce_bucket_size);
      integer(*z, "stage3_prefetch_bucket_size", "parallel.zero_prefetch_bucket_size", c.parallel.zero_prefetch_bucket_size);
      integer(*z, "stage3_param_persistence_threshold", "parallel.zero_param_persistence_threshold",
              c.parallel.zero_param_persistence_threshold);
      if (auto o = z->find("overlap_comm"); o != z->end() && o->is_boolean())
        c.parallel.zero_overlap_comm = o->get<bool>() ? "true" : "false", used.emplace_back("overlap_comm");
      // Offload (deepspeed/runtime/zero/offload_config.py: OffloadDeviceEnum none|cpu|nvme, default none;
      // zero/config.py: the deprecated cpu_offload -> offload_optimizer cpu, cpu_offload_param -> offload_param
      // cpu). A ZeRO section without them means no offload, whatever the current setup had.
      auto offload = [&](const char* section, const char* legacy, std::string& out) {
        const std::string zo = "zero_optimization.";
        std::string device = "none";
        bool legacy_given = false;
        if (auto l = z->find(legacy); l != z->end() && !l->is_null()) {
          if (!l->is_boolean()) {
            p.errors.push_back({zo + legacy, zo + legacy + " must be true or false; got " + describe(*l)});
            return;
          }
          if (l->get<bool>()) device = "cpu";
          legacy_given = true;
          used.emplace_back(legacy);
        }
        if (auto o = z->find(section); o != z->end() && !o->is_null()) {
          const std::string name = zo + section + ".device";
          if (!o->is_object()) {
            p.errors.push_back({name, zo + section + " must be a JSON object such as {\"device\": \"cpu\"}; got " + describe(*o)});
            return;
          }
          auto d = o->find("device");
          if (d != o->end() && !d->is_string() && !d->is_null()) {
            p.errors.push_back({name, name + " must be one of: none, cpu, nvme; got " + describe(*d)});
            return;
          }
          const std::string v = d == o->end() || d->is_null() ? "none" : d->get<std::string>();
          if (v != "none" && v != "cpu" && v != "nvme") {
            p.errors.push_back({name, name + " must be one of: none, cpu, nvme; got \"" + v.substr(0, 40) + "\""});
            return;
          }
          if (legacy_given && v != device)
            notes_extra.push_back(zo + section + " (" + v + ") is read, not the deprecated " + zo + legacy);
          device = v;
          used.emplace_back(std::string(section) + ".device");
        }
        out = device;
      };
      offload("offload_optimizer", "cpu_offload", c.parallel.offload_optimizer);
      offload("offload_param", "cpu_offload_param", c.parallel.offload_params);
      c.training.framework = "deepspeed";
      static const std::set<std::string> read_keys = {"stage", "reduce_bucket_size", "stage3_prefetch_bucket_size",
                                                      "stage3_param_persistence_threshold", "overlap_comm",
                                                      "offload_optimizer", "offload_param", "cpu_offload",
                                                      "cpu_offload_param"};
      for (auto it = z->begin(); it != z->end(); ++it)
        if (!read_keys.count(it.key())) ignored.push_back("zero_optimization." + it.key());
      // Offload sub-keys other than the device (pin_memory, nvme_path, buffer_count, ...) change speed, not
      // the GPU's bytes.
      for (const char* section : {"offload_optimizer", "offload_param"})
        if (auto o = z->find(section); o != z->end() && o->is_object())
          for (auto it = o->begin(); it != o->end(); ++it)
            if (it.key() != "device") ignored.push_back(std::string("zero_optimization.") + section + "." + it.key());
    }
  }
  c.parallel.sharding = "deepspeed";
  if (auto o = doc.find("optimizer"); o != doc.end() && o->is_object()) {
    // json::value() throws when the key holds another type ({"type": 3} aborted the page); read it by hand.
    auto t = o->find("type");
    if (t != o->end() && !t->is_string() && !t->is_null())
      p.errors.push_back({"optimizer.type", "optimizer.type must be a string such as \"AdamW\"; got " + describe(*t)});
    const std::string type = t != o->end() && t->is_string() ? t->get<std::string>() : "";
    if (type == "AdamW" || type == "Adam" || type == "adamw" || type == "adam")
      c.training.optimizer = type == "Adam" || type == "adam" ? "adam" : "adamw", used.emplace_back("optimizer.type");
    else if (!type.empty()) ignored.push_back("optimizer.type " + type.substr(0, 40));
  }
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const std::string& k = it.key();
    if (k == "train_micro_batch_size_per_gpu" || k == "gradient_accumulation_steps" || k == "bf16" || k == "fp16" ||
        k == "zero_optimization" || k == "optimizer")
      continue;
    ignored.push_back(k);
  }
  if (!p.errors.empty()) return p;
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size() && i < 16; ++i) s += (i ? ", " : "") + v[i];
    if (v.size() > 16) s += ", ...";
    return s;
  };
  if (!used.empty()) p.notes.push_back("DeepSpeed config: read " + list(used));
  if (!kept_auto.empty()) p.notes.push_back("kept the current values for \"auto\": " + list(kept_auto));
  for (const auto& n : notes_extra) p.notes.push_back(n);
  if (!ignored.empty()) p.notes.push_back("not modelled, ignored: " + list(ignored));
  p.config = c;
  p.ok = true;
  return p;
}

std::string deepspeed_json(const Config& c, int indent) {
  json ds;
  ds["train_micro_batch_size_per_gpu"] = c.training.micro_batch_size;
  ds["gradient_accumulation_steps"] = c.training.gradient_accumulation_steps;
  ds["train_batch_size"] = c.training.micro_batch_size * c.training.gradient_accumulation_steps * c.parallel.data_parallel_size;
  ds["bf16"] = {{"enabled", c.training.precision == "bf16_mixed" || c.training.precision == "bf16_fp32_grads" ||
                             c.training.precision == "amp_bf16" || c.training.precision == "bf16_pure"}};
  ds["fp16"] = {{"enabled", c.training.precision == "fp16_mixed" || c.training.precision == "amp_fp16"}};
  ds["zero_optimization"] = {{"stage", c.parallel.zero_stage}};
  if (c.parallel.zero_reduce_bucket_size > 0) ds["zero_optimization"]["reduce_bucket_size"] = c.parallel.zero_reduce_bucket_size;
  if (c.parallel.zero_overlap_comm != "auto") ds["zero_optimization"]["overlap_comm"] = c.parallel.zero_overlap_comm == "true";
  if (c.parallel.zero_prefetch_bucket_size > 0)
    ds["zero_optimization"]["stage3_prefetch_bucket_size"] = c.parallel.zero_prefetch_bucket_size;
  if (c.parallel.zero_param_persistence_threshold > 0)
    ds["zero_optimization"]["stage3_param_persistence_threshold"] = c.parallel.zero_param_persistence_threshold;
  // Offload blocks as deepspeed/runtime/zero/offload_config.py names them; NVMe needs a path, so the export
  // writes DeepSpeed's documentation example for the user to replace.
  auto offload = [&](const char* section, const std::string& device) {
    if (device == "none") return;
    ds["zero_optimization"][section] = {{"device", device}};
    if (device == "nvme") ds["zero_optimization"][section]["nvme_path"] = "/local_nvme";
  };
  offload("offload_optimizer", c.parallel.offload_optimizer);
  offload("offload_param", c.parallel.offload_params);
  if (c.training.optimizer == "adamw" || c.training.optimizer == "adam")
    ds["optimizer"] = {{"type", c.training.optimizer == "adam" ? "Adam" : "AdamW"}, {"params", {{"lr", "auto"}}}};
  if (c.training.activation_checkpointing != "none")
    ds["activation_checkpointing"] = {{"partition_activations", false}, {"contiguous_memory_optimization", false}};
  return ds.dump(indent, ' ', false, json::error_handler_t::replace);
}

std::string result_to_json(const Result& r, bool with_timeline, int indent) {
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
    dev["breakdown"] = bd;
    dev["fits"] = d.fits;
    dev["oom"] = d.oom;
    if (d.oom) dev["oom_at"] = {{"event", d.oom_event}};
    dev["capacity_bytes"] = d.capacity_bytes;
    dev["usable_bytes"] = d.usable_bytes;
    dev["peak_at"] = {{"event", d.peak_event}, {"phase", d.peak_phase}, {"tensor", d.peak_label}};
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
  out["notes"] = r.notes;
  return out.dump(indent, ' ', false, json::error_handler_t::replace);
}

}  // namespace memsim
