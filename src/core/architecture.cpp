// Decoding and checking model programs (architecture.h).
#include "architecture.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>

#include "checked.h"
#include "ops.h"
#include "serialize.h"  // document_guard_error

namespace memsim {

namespace {

using ojson = nlohmann::ordered_json;

// The largest dimension a program may name: shapes multiply to per-sample element counts, which the step multiplies
// by the micro-batch and element sizes, all in checked int64.
constexpr double kMaxDim = double(int64_t{1} << 40);

struct Names {
  std::vector<std::pair<std::string, double>>& values;
  const double* find(std::string_view n) const {
    for (const auto& [k, v] : values)
      if (k == n) return &v;
    return nullptr;
  }
};

// Integer arithmetic over hyperparameter and dimension names: + - * / (exact or fractional), // (floor), % and ^,
// max(a, b), min(a, b), sqrt(x), round(x) and if(c, a, b), with parentheses. Errors are sentences for the caller to prefix with the field.
class Expr {
 public:
  Expr(std::string_view text, const Names& names) : t_(text), names_(names) {}
  bool eval(double& out, std::string& error) {
    if (t_.size() > 500) return error = "is longer than 500 characters", false;
    out = sum(0);
    skip();
    if (error_.empty() && i_ < t_.size()) error_ = "has unexpected '" + std::string(1, t_[i_]) + "' at character " + std::to_string(i_ + 1);
    if (error_.empty() && !std::isfinite(out)) error_ = "is not a finite number";
    error = error_;
    return error_.empty();
  }

 private:
  void skip() {
    while (i_ < t_.size() && t_[i_] == ' ') ++i_;
  }
  bool eat(std::string_view op) {
    skip();
    if (t_.substr(i_, op.size()) != op) return false;
    if (op == "/" && t_.substr(i_, 2) == "//") return false;
    i_ += op.size();
    return true;
  }
  double fail(std::string msg) {
    if (error_.empty()) error_ = std::move(msg);
    i_ = t_.size();
    return 0;
  }
  double sum(int depth) {
    double v = product(depth);
    while (error_.empty()) {
      if (eat("+")) v += product(depth);
      else if (eat("-")) v -= product(depth);
      else break;
    }
    return v;
  }
  double product(int depth) {
    double v = power(depth);
    while (error_.empty()) {
      if (eat("*")) v *= power(depth);
      else if (eat("//")) {
        const double d = power(depth);
        v = d == 0 ? fail("divides by zero") : std::floor(v / d);
      } else if (eat("/")) {
        const double d = power(depth);
        v = d == 0 ? fail("divides by zero") : v / d;
      } else if (eat("%")) {
        const double d = power(depth);
        v = d == 0 ? fail("divides by zero") : std::fmod(v, d);
      } else break;
    }
    return v;
  }
  double power(int depth) {
    const double base = unary(depth);
    if (error_.empty() && eat("^")) {
      const double e = power(depth + 1);
      if (e < 0 || e > 8 || e != std::floor(e)) return fail("raises to " + std::to_string(e) + "; exponents are integers 0 to 8");
      return std::pow(base, e);
    }
    return base;
  }
  double unary(int depth) {
    if (depth > 32) return fail("nests deeper than 32");
    if (eat("-")) return -unary(depth + 1);
    skip();
    if (i_ >= t_.size()) return fail("ends where a number or name is expected");
    const char c = t_[i_];
    if (c == '(') {
      ++i_;
      const double v = sum(depth + 1);
      if (!eat(")")) return fail("misses a ')'");
      return v;
    }
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '.') {
      size_t j = i_;
      while (j < t_.size() && (std::isdigit(static_cast<unsigned char>(t_[j])) || t_[j] == '.')) ++j;
      try {
        const double v = std::stod(std::string(t_.substr(i_, j - i_)));
        i_ = j;
        return v;
      } catch (...) {
        return fail("has a malformed number");
      }
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i_;
      while (j < t_.size() && (std::isalnum(static_cast<unsigned char>(t_[j])) || t_[j] == '_')) ++j;
      const std::string name(t_.substr(i_, j - i_));
      i_ = j;
      if ((name == "max" || name == "min") && eat("(")) {  // max(a, b), min(a, b)
        const double a = sum(depth + 1);
        if (!eat(",")) return fail("misses the ',' between " + name + "'s two arguments");
        const double b = sum(depth + 1);
        if (!eat(")")) return fail("misses a ')' after " + name + "'s arguments");
        return name == "max" ? std::max(a, b) : std::min(a, b);
      }
      // sqrt(x) and round(x) as Python's math.sqrt and round (half to even), and if(c, a, b): a where c is not 0,
      // else b. Qwen2-VL's smart_resize is written with them (qwen2_vl_vision.json).
      if ((name == "sqrt" || name == "round") && eat("(")) {
        const double a = sum(depth + 1);
        if (!eat(")")) return fail("misses a ')' after " + name + "'s argument");
        if (name == "sqrt" && a < 0) return fail("takes the square root of a negative number");
        return name == "sqrt" ? std::sqrt(a) : std::nearbyint(a);  // the default rounding mode: to nearest, ties to even
      }
      if (name == "if" && eat("(")) {
        const double c = sum(depth + 1);
        if (!eat(",")) return fail("misses the ',' after if's condition");
        const double a = sum(depth + 1);
        if (!eat(",")) return fail("misses the ',' between if's two values");
        const double b = sum(depth + 1);
        if (!eat(")")) return fail("misses a ')' after if's arguments");
        return c != 0 ? a : b;
      }
      if (const double* v = names_.find(name)) return *v;
      return fail("names '" + name + "', which is neither a hyperparameter nor a dimension (or the dimensions name each other in a cycle)");
    }
    return fail("has unexpected '" + std::string(1, c) + "' at character " + std::to_string(i_ + 1));
  }

  std::string_view t_;
  const Names& names_;
  size_t i_ = 0;
  std::string error_;
};

class Decoder {
 public:
  Decoder(std::vector<ArchitectureError>& errors, std::string field) : errors_(errors), field_(std::move(field)) {}

  void error(const std::string& where, const std::string& msg) {
    if (errors_.size() < 20) errors_.push_back({field_, field_ + ": " + (where.empty() ? "" : where + ": ") + msg});
  }

  // A number or an expression string, as a double.
  bool value(const ojson& v, const std::string& where, double& out) {
    if (v.is_number()) {
      out = v.get<double>();
      if (std::isfinite(out)) return true;
      error(where, "must be a finite number");
      return false;
    }
    if (!v.is_string()) {
      error(where, "must be a number or an expression (a string such as \"hidden_size // num_attention_heads\")");
      return false;
    }
    std::string e;
    if (!Expr(v.get_ref<const std::string&>(), Names{values_}).eval(out, e)) {
      error(where, "\"" + v.get<std::string>().substr(0, 60) + "\" " + e);
      return false;
    }
    return true;
  }
  bool dim(const ojson& v, const std::string& where, int64_t& out, int64_t min = 1) {
    double d;
    if (!value(v, where, d)) return false;
    if (d != std::floor(d) || d < double(min) || d > kMaxDim) {
      error(where, "must be a whole number from " + std::to_string(min) + " to 2^40; it is " + number(d));
      return false;
    }
    out = static_cast<int64_t>(d);
    return true;
  }
  static std::string number(double d) {
    std::string s = std::to_string(d);
    while (!s.empty() && s.back() == '0') s.pop_back();
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  }

  bool shape(const ojson& v, const std::string& where, std::vector<int64_t>& out) {
    if (!v.is_array() || v.empty() || v.size() > 4) {
      error(where, "must be a list of 1 to 4 dimensions");
      return false;
    }
    out.clear();
    int64_t n = 1;
    for (size_t i = 0; i < v.size(); ++i) {
      int64_t d;
      if (!dim(v[i], where + "[" + std::to_string(i) + "]", d)) return false;
      out.push_back(d);
      if (double(n) * double(d) > kMaxDim) {
        error(where, "has more than 2^40 elements per sample");
        return false;
      }
      n *= d;
    }
    return true;
  }

  void decode(const ojson& p, Architecture& a, const std::string& args) {
    arch_ = &a;
    static const char* kTop[] = {"memsim_architecture", "name", "title", "source", "model_types", "requires", "hf_keys", "timm_models", "lora_targets",
                                 "hyperparameters", "dims", "repeat", "inputs", "embeddings", "block", "blocks", "head", "vision_tower",
                                 "frozen_modules", "frozen_forward", "not_quantized", "checkpoint_reentrant", "attention_code",
                                 "transformers_sdpa_since"};
    for (const auto& [k, v] : p.items()) {
      bool known = false;
      for (const char* t : kTop) known |= k == t;
      if (!known) error(k, "is not a program key; allowed: memsim_architecture, name, title, source, model_types, requires, hf_keys, timm_models, "
                           "lora_targets, hyperparameters, dims, repeat, inputs, embeddings, block, blocks, head, vision_tower, frozen_modules, "
                           "frozen_forward, not_quantized, checkpoint_reentrant, attention_code, transformers_sdpa_since");
    }
    if (!p.contains("memsim_architecture") || p["memsim_architecture"] != 1)
      error("memsim_architecture", "must be 1 (the program format this memsim reads)");
    auto text = [&](const char* key, std::string& out, bool required) {
      if (!p.contains(key)) {
        if (required) error(key, "is missing");
        return;
      }
      if (!p[key].is_string() || p[key].get_ref<const std::string&>().size() > 1000) error(key, "must be a string of at most 1,000 characters");
      else out = p[key].get<std::string>();
    };
    text("name", a.name, true);
    text("title", a.title, false);
    text("source", a.source, true);
    text("lora_targets", a.lora_targets, false);
    if (p.contains("checkpoint_reentrant")) {
      if (!p["checkpoint_reentrant"].is_boolean()) error("checkpoint_reentrant", "must be true or false (the use_reentrant the family's own checkpoint call passes)");
      else a.checkpoint_reentrant = p["checkpoint_reentrant"].get<bool>() ? 1 : 0;
    }
    if (p.contains("attention_code")) {
      const ojson& ac = p["attention_code"];
      if (ac == "torch_sdpa") a.attention_code = Architecture::AttentionCode::TorchSdpa;
      else if (ac == "eager") a.attention_code = Architecture::AttentionCode::Eager;
      else error("attention_code", "must be \"torch_sdpa\" (the family's code calls F.scaled_dot_product_attention from torch 2.0) or "
                                   "\"eager\" (its own matmul and softmax in every version); leave it out where transformers' "
                                   "attn_implementation decides");
    }
    if (p.contains("transformers_sdpa_since")) {
      const ojson& t = p["transformers_sdpa_since"];
      if (!t.is_string() || !parse_version(t.get<std::string>(), a.transformers_sdpa_since) || a.transformers_sdpa_since.major == 0)
        error("transformers_sdpa_since", "must be a transformers release such as \"4.41\" (the first whose class for the family "
                                         "supports SDPA)");
    }
    if (p.contains("not_quantized")) {
      const ojson& q = p["not_quantized"];
      bool ok = q.is_array() && q.size() <= 64;
      for (size_t i = 0; ok && i < q.size(); ++i) ok = q[i].is_string() && !q[i].get_ref<const std::string&>().empty() && q[i].get_ref<const std::string&>().size() <= 200;
      if (!ok) error("not_quantized", "must be a list of at most 64 module paths (non-empty strings of at most 200 characters)");
      else for (const auto& k : q) a.not_quantized.push_back(k.get<std::string>());
    }
    // HF config keys the program's structure assumes (the import picks, among the programs of a model_type, the one
    // whose assumptions the config meets): {"use_swiglu_ffn": {"equals": false, "when_absent": false}}.
    if (p.contains("requires")) {
      if (!p["requires"].is_object()) error("requires", "must be an object of HF config keys, each {\"equals\": value, \"when_absent\": value}");
      else
        for (const auto& [k, v] : p["requires"].items())
          if (!v.is_object() || !v.contains("equals") || !v.contains("when_absent"))
            error("requires." + k, "must be {\"equals\": value, \"when_absent\": value}: the value the program assumes, and the config class's default");
    }
    // Where an HF config.json keeps a hyperparameter whose key is not its name: a JSON pointer into the config
    // ({"layers1": "/depths/0"}; "/num_labels" counts id2label, as HF does).
    if (p.contains("hf_keys")) {
      if (!p["hf_keys"].is_object()) error("hf_keys", "must be an object of hyperparameter names, each a JSON pointer such as \"/depths/0\"");
      else
        for (const auto& [k, v] : p["hf_keys"].items())
          if (!v.is_string() || v.get_ref<const std::string&>().empty() || v.get_ref<const std::string&>().front() != '/' ||
              v.get_ref<const std::string&>().size() > 200)
            error("hf_keys." + k, "must be a JSON pointer into the HF config, such as \"/depths/0\"");
    }
    // timm's model names this program builds, each with the arguments that make it (the import of a timm config.json).
    if (p.contains("timm_models")) {
      if (!p["timm_models"].is_object()) error("timm_models", "must be an object of timm model names with their arguments");
      else
        for (const auto& [k, v] : p["timm_models"].items())
          if (!v.is_string()) error("timm_models." + k, "must be the program's arguments as text (\"layers3=23\"; \"\" for its defaults)");
    }
    if (p.contains("model_types")) {
      if (!p["model_types"].is_array()) error("model_types", "must be a list of HF model_type strings");
      else
        for (const auto& t : p["model_types"])
          if (t.is_string()) a.model_types.push_back(t.get<std::string>());
    }
    // Hyperparameters: declared with defaults, overridden by model.architecture_args.
    if (!p.contains("hyperparameters") || !p["hyperparameters"].is_object()) {
      error("hyperparameters", "must be an object of names with default numbers");
      return;
    }
    for (const auto& [k, v] : p["hyperparameters"].items()) {
      if (!valid_name(k)) error("hyperparameters." + k, "is not a name (letters, digits and _, not first a digit)");
      else if (!v.is_number()) error("hyperparameters." + k, "must be a number");
      else values_.push_back({k, v.get<double>()});
    }
    a.defaults = values_;
    apply_args(args);
    // Dimensions may use each other in any order (a config's JSON object may have sorted its keys): each pass
    // evaluates those whose names are known, until none is left or a pass makes no progress.
    if (p.contains("dims")) {
      if (!p["dims"].is_object()) error("dims", "must be an object of names with expressions");
      std::vector<std::pair<std::string, const ojson*>> pending;
      if (p["dims"].is_object())
        for (const auto& [k, v] : p["dims"].items()) {
          if (!valid_name(k) || Names{values_}.find(k)) error("dims." + k, "must be a new name (letters, digits and _)");
          else pending.push_back({k, &v});
        }
      while (!pending.empty() && errors_.empty()) {
        std::vector<std::pair<std::string, const ojson*>> left;
        for (const auto& [k, v] : pending) {
          double d;
          std::string e;
          if (v->is_number()) values_.push_back({k, v->get<double>()});
          else if (v->is_string() && Expr(v->get_ref<const std::string&>(), Names{values_}).eval(d, e)) values_.push_back({k, d});
          else left.push_back({k, v});
        }
        if (left.size() == pending.size()) {  // no progress: report each as it fails now
          for (const auto& [k, v] : left) {
            double d;
            value(*v, "dims." + k, d);
          }
          break;
        }
        pending = std::move(left);
      }
    }
    if (!errors_.empty()) return;
    if (p.contains("frozen_modules")) frozen_modules(p["frozen_modules"], a);
    if (!errors_.empty()) return;
    const bool one = p.contains("block"), several = p.contains("blocks");
    if (one == several)
      return error("block", "a program has either \"block\" (one kind, repeated \"repeat\" times) or \"blocks\" (a list "
                            "of kinds, each with its own \"repeat\"), not both or neither");
    if (one && !p.contains("repeat"))
      return error("repeat", "is missing: the number of blocks (an expression such as \"num_hidden_layers\")");
    if (several && p.contains("repeat")) return error("repeat", "goes in each entry of \"blocks\"");
    if (several && (!p["blocks"].is_array() || p["blocks"].empty() || p["blocks"].size() > 4096))
      return error("blocks", "must be a list of 1 to 4,096 entries: block kinds, each an object with repeat, input, ops and output, "
                             "or same_as entries that run an earlier kind again");
    if (several) {
      size_t kinds = 0;
      for (const auto& j : p["blocks"]) kinds += !(j.is_object() && j.contains("same_as"));
      if (kinds > 128) return error("blocks", "declares " + std::to_string(kinds) + " kinds of block; a program has at most 128 (same_as entries run one again)");
    }
    // The data a micro-batch brings.
    if (!p.contains("inputs") || !p["inputs"].is_object() || p["inputs"].empty())
      return error("inputs", "must name the data tensors a sample brings, each with its \"shape\"");
    for (const auto& [k, v] : p["inputs"].items()) {
      ArchTensor t;
      t.name = k;
      if (!v.is_object() || !v.contains("shape")) {
        error("inputs." + k, "must be an object with a \"shape\" (and optionally a \"dtype\")");
        continue;
      }
      for (const auto& [key, x] : v.items())
        if (key != "shape" && key != "dtype") error("inputs." + k + "." + key, "is not a key of an input; allowed: shape, dtype");
      if (v.contains("dtype")) {
        const ojson& d = v["dtype"];
        if (d == "fp32") t.dtype = InputDtype::Fp32;
        else if (d == "compute") t.dtype = InputDtype::Compute;
        else if (d == "int64") t.dtype = InputDtype::Int64;
        else error("inputs." + k + ".dtype", "must be fp32 (the collator's pixel values), compute (made on the GPU in the compute dtype, "
                                             "as a frozen encoder's latents or text embeddings) or int64");
      }
      if (shape(v["shape"], "inputs." + k + ".shape", t.shape)) a.inputs.push_back(t);
    }
    if (!errors_.empty()) return;
    if (!p.contains("embeddings") || !p["embeddings"].is_object()) return error("embeddings", "must be an object with \"ops\"");
    stage_position_ = -1;
    input_read_.assign(a.inputs.size(), false);
    stage(p["embeddings"], "embeddings", a.inputs, nullptr, a.embeddings);
    if (!errors_.empty()) return;
    const ArchTensor emb_out = a.embeddings.tensors[a.embeddings.output];
    if (emb_out.shape.size() != 2 && emb_out.shape.size() != 3)
      return error("embeddings.output", "must be token rows [tokens, width] or an image [channels, height, width]");
    // The block kinds, in order: each receives what the one before passed on.
    ArchTensor received = emb_out;
    const size_t kinds = one ? 1 : p["blocks"].size();
    for (size_t k = 0; k < kinds; ++k) {
      const std::string where = one ? "block" : "blocks[" + std::to_string(k) + "]";
      const ojson& j = one ? p["block"] : p["blocks"][k];
      if (!j.is_object()) return error(where, "must be an object with \"ops\"");
      if (!one && j.contains("same_as")) {
        if (!more_of_kind(j, where, received, a)) return;
        continue;
      }
      int64_t repeat = 0;
      if (one) {
        if (!dim(p["repeat"], "repeat", repeat)) return;
      } else {
        if (!j.contains("repeat")) return error(where + ".repeat", "is missing: how many times this kind of block runs");
        if (!dim(j["repeat"], where + ".repeat", repeat, 0)) return;
      }
      if (a.repeat + repeat > 4096) return error(one ? "repeat" : where + ".repeat", "makes more than 4096 blocks in all");
      std::string name = one ? "block" : "block " + std::to_string(k);
      if (!one && j.contains("name")) {
        if (!j["name"].is_string() || j["name"].get_ref<const std::string&>().empty() || j["name"].get_ref<const std::string&>().size() > 64)
          return error(where + ".name", "must be a string of 1 to 64 characters (what the timeline calls these blocks)");
        name = j["name"].get<std::string>();
      }
      if (std::find(a.block_names.begin(), a.block_names.end(), name) != a.block_names.end())
        return error(where + ".name", "\"" + name + "\" names an earlier kind of block; names are unique (same_as finds a kind by it)");
      in_block_ = true, first_layer_ = a.repeat, repeat_ = repeat, stage_position_ = a.repeat;
      ArchStage st;
      stage(j, where, {}, &received, st);
      in_block_ = false;
      if (!errors_.empty()) return;
      const ArchTensor& out = st.tensors[st.output];
      if (repeat != 1 && out.shape != received.shape)
        return error(where + ".output", "the block repeats, so its output must have its input's shape; " + out.name + " differs" +
                                            (repeat == 0 ? " (a kind that runs 0 times must keep the shape too)" : ""));
      if (out.shape.size() != 2 && out.shape.size() != 3)
        return error(where + ".output", "must be token rows [tokens, width] or an image [channels, height, width]");
      if (repeat > 0) received = out, received.producer = -1;
      for (int64_t r = 0; r < repeat; ++r) a.kind_of_layer.push_back(static_cast<int32_t>(a.blocks.size()));
      a.repeat += repeat;
      a.blocks.push_back(std::move(st));
      a.block_names.push_back(name);
    }
    if (a.repeat < 1) return error("blocks", "run no block: at least one kind needs a repeat of 1 or more");
    if (p.contains("vision_tower")) tower(p["vision_tower"], received, a);
    if (!errors_.empty()) return;
    if (p.contains("frozen_forward")) {
      if (!p["frozen_forward"].is_boolean()) return error("frozen_forward", "must be true or false");
      a.frozen_forward = p["frozen_forward"].get<bool>();
      if (a.frozen_forward && (p.contains("head") || a.tower.declared || !a.carries.empty() || !a.frozen_modules.empty()))
        return error("frozen_forward", "a frozen module's forward has no head, vision_tower, carries or frozen modules of its own");
    }
    if (!p.contains("head") && (a.tower.declared || a.frozen_forward)) {
      // A tower-only program: its last block's output is what a vision-language model's projector reads.
    } else {
      if (!p.contains("head") || !p["head"].is_object()) return error("head", "must be an object with \"ops\"");
      stage_position_ = a.repeat;
      stage(p["head"], "head", {}, &received, a.head);
    }
    if (!errors_.empty()) return;
    // Each carry's last reader: the stages that read it by name, and the next stage where it is its producer's output.
    for (int64_t l = 0; l <= a.repeat; ++l) {
      const ArchStage& st = l < a.repeat ? a.block_of(l) : a.head;
      for (const auto& t : st.tensors)
        if (t.carry >= 0) a.carries[static_cast<size_t>(t.carry)].last_reader = l;
      if (l < a.repeat && a.block_of(l).output >= 0)
        for (const auto& [t, c] : a.block_of(l).exports)
          if (t == a.block_of(l).output && a.carries[static_cast<size_t>(c)].producer == l)
            a.carries[static_cast<size_t>(c)].last_reader = std::max<int64_t>(a.carries[static_cast<size_t>(c)].last_reader, l + 1);
    }
    for (const auto& [t, c] : a.embeddings.exports)
      if (t == a.embeddings.output) a.carries[static_cast<size_t>(c)].last_reader = std::max<int64_t>(a.carries[static_cast<size_t>(c)].last_reader, 0);
    for (const auto& c : a.carries)
      if (c.last_reader <= c.producer) error("carry", "\"" + c.name + "\" is carried but no later stage reads it");
    for (size_t t = 0; t < a.inputs.size(); ++t)
      if (!input_read_[t]) error("inputs." + a.inputs[t].name, "is never read by any stage");
    // Each tensor of each stage kind gets up to three timeline labels (its output, gradient and cast), and a step's
    // labels are 16-bit: a bound on the tensors of all the stages keeps them apart.
    size_t tensors = 0;
    for (const ArchStage* st : a.stages()) tensors += st->tensors.size();
    if (tensors > 16384) error("blocks", "hold " + std::to_string(tensors) + " tensors in all their kinds; a program has at most 16,384");
    if (a.head.ops.size() > 0 && a.head.ops.back().kind == OpKind::MseLoss) a.label_bytes = 0;  // its target is an input
    if (a.head.ops.size() > 0 && a.head.ops.back().kind == OpKind::CrossEntropy) {  // an int64 label per scored row
      const ArchTensor& scores = a.head.tensors[static_cast<size_t>(a.head.ops.back().in[0])];
      a.label_bytes = mul(8, scores.numel() / std::max<int64_t>(1, scores.shape.back()));
    }
    tie_embedding(a);
    if (!errors_.empty()) return;
    const bool image = emb_out.shape.size() == 3;
    a.tokens = image ? mul(emb_out.shape[1], emb_out.shape[2]) : emb_out.shape[0];
    a.width = image ? emb_out.shape[0] : emb_out.shape[1];
    a.values = values_;
  }

  // An embedding op with "tied": its weight is the head's output linear's, the last linear of the head, which must
  // have that weight's shape [rows, width] (PreTrainedModel.tie_weights ties the output embeddings to the input ones).
  void tie_embedding(Architecture& a) {
    const ArchOp* tied = nullptr;
    std::string where;
    for (const ArchStage* st : a.stages())
      for (const auto& op : st->ops)
        if (op.kind == OpKind::Embedding && op.tied) {
          if (tied) return error("embedding", "\"" + op.name + "\" is tied too; one embedding may share the head's weight");
          tied = &op;
          if (st == &a.head) return error("head", "a tied embedding belongs to an earlier stage than the head whose weight it shares");
        }
    if (!tied) return;
    const ArchOp* out = nullptr;
    for (const auto& op : a.head.ops)
      if (op.kind == OpKind::Linear) out = &op;
    if (!out) return error("head", "has no linear for the tied embedding \"" + tied->name + "\" to share its weight with");
    const int64_t width = a.head.tensors[static_cast<size_t>(out->in[0])].shape.back();
    if (out->out_features != tied->size || width != tied->out_features)
      return error("head", "\"" + out->name + "\" has a weight [" + std::to_string(out->out_features) + ", " + std::to_string(width) +
                               "], which the tied embedding \"" + tied->name + "\" [" + std::to_string(tied->size) + ", " +
                               std::to_string(tied->out_features) + "] cannot share");
    a.tied_head = out->name;
  }

 private:
  static bool valid_name(const std::string& n) {
    if (n.empty() || n.size() > 64 || std::isdigit(static_cast<unsigned char>(n[0]))) return false;
    for (char c : n)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
    return true;
  }

  // "vision_tower": {"module": "visual", "width": "embed_dim", "feature_rows": "patches", "merge": 4,
  // "feature_layer": -1, "all_hidden_states": false, "projector": "patch_merger"} (TowerSpec). `last` is the last
  // block's output, which the features' rows and width must fit.
  void tower(const ojson& j, const ArchTensor& last, Architecture& a) {
    if (!j.is_object()) return error("vision_tower", "must be an object: module, width, feature_rows, merge, feature_layer, all_hidden_states, projector");
    static const char* kKeys[] = {"module", "width", "feature_rows", "merge", "feature_layer", "all_hidden_states", "projector",
                                  "out_width", "merger_norm", "reordered"};
    for (const auto& [k, v] : j.items()) {
      bool known = false;
      for (const char* t : kKeys) known |= k == t;
      if (!known) error("vision_tower." + k, "is not a key of vision_tower; allowed: module, width, feature_rows, merge, feature_layer, all_hidden_states, projector, "
                                             "out_width, merger_norm, reordered");
    }
    TowerSpec& t = a.tower;
    t.declared = true;
    if (j.contains("module")) {
      if (!j["module"].is_string() || !valid_name(j["module"].get<std::string>())) error("vision_tower.module", "must be a module name (letters, digits and _)");
      else t.module = j["module"].get<std::string>();
    }
    for (const char* k : {"width", "feature_rows"})
      if (!j.contains(k)) error(std::string("vision_tower.") + k, "is missing");
    if (!errors_.empty()) return;
    if (!dim(j["width"], "vision_tower.width", t.width) || !dim(j["feature_rows"], "vision_tower.feature_rows", t.feature_rows)) return;
    if (j.contains("merge") && !dim(j["merge"], "vision_tower.merge", t.merge)) return;
    if (j.contains("feature_layer")) {
      double d = 0;
      if (!value(j["feature_layer"], "vision_tower.feature_layer", d)) return;
      if (d != -1 && d != -2) return error("vision_tower.feature_layer", "must be -1 (the last block's output) or -2 (the one before it)");
      t.feature_layer = static_cast<int64_t>(d);
    }
    if (j.contains("all_hidden_states")) {
      if (!j["all_hidden_states"].is_boolean()) return error("vision_tower.all_hidden_states", "must be true or false");
      t.all_hidden_states = j["all_hidden_states"].get<bool>();
    }
    if (j.contains("projector")) {
      const ojson& v = j["projector"];
      if (v == "llava_mlp") t.projector = TowerSpec::Projector::LlavaMlp;
      else if (v == "patch_merger") t.projector = TowerSpec::Projector::PatchMerger;
      else return error("vision_tower.projector", "must be llava_mlp (LlavaMultiModalProjector) or patch_merger (Qwen2-VL's PatchMerger)");
    }
    if (j.contains("out_width")) {
      if (!dim(j["out_width"], "vision_tower.out_width", t.out_width)) return;
      if (j["out_width"].is_string() && valid_name(j["out_width"].get<std::string>())) t.out_width_name = j["out_width"].get<std::string>();
    }
    if (j.contains("merger_norm")) {
      if (j["merger_norm"] == "rms_norm") t.rms_merger = true;
      else if (j["merger_norm"] != "layer_norm") return error("vision_tower.merger_norm", "must be layer_norm or rms_norm");
    }
    if (j.contains("reordered")) {
      if (!j["reordered"].is_boolean()) return error("vision_tower.reordered", "must be true or false");
      t.reordered = j["reordered"].get<bool>();
    }
    if (t.projector == TowerSpec::Projector::LlavaMlp && t.merge != 1)
      return error("vision_tower.merge", "must be 1 with the llava_mlp projector, which reads one row per image token");
    if (t.projector != TowerSpec::Projector::PatchMerger && (t.out_width > 0 || t.rms_merger || t.reordered))
      return error("vision_tower.projector", "out_width, merger_norm and reordered describe a patch_merger");
    if (last.shape.size() != 2) return error("vision_tower", "needs blocks that pass on token rows [tokens, width]");
    if (!t.all_hidden_states && t.feature_layer != -1)
      return error("vision_tower.feature_layer", "must be -1 where all_hidden_states is false: only the last block's output is kept");
    if (t.projector == TowerSpec::Projector::PatchMerger && t.feature_layer != -1)
      return error("vision_tower.projector", "patch_merger reads the last block's output (feature_layer -1)");
    if (t.feature_layer == -2 && t.feature_rows != last.shape[0] - 1)
      return error("vision_tower.feature_rows", "must be the rows but the class token (" + std::to_string(last.shape[0] - 1) + ") with feature_layer -2, as LLaVA selects them");
    if (t.feature_layer == -1 && t.feature_rows != last.shape[0])
      return error("vision_tower.feature_rows", "must be every row the blocks pass on (" + std::to_string(last.shape[0]) + ") with feature_layer -1");

    if (t.width != last.shape[1]) return error("vision_tower.width", "is " + std::to_string(t.width) + " but the blocks' output is " + std::to_string(last.shape[1]) + " wide");
    if (t.feature_rows > last.shape[0]) return error("vision_tower.feature_rows", "is " + std::to_string(t.feature_rows) + ", more than the " + std::to_string(last.shape[0]) + " rows the blocks pass on");
    if (t.feature_rows % t.merge != 0) return error("vision_tower.merge", "must divide the feature rows (" + std::to_string(t.feature_rows) + "); got " + std::to_string(t.merge));
  }

  void apply_args(const std::string& args) {
    size_t i = 0;
    while (i < args.size()) {
      size_t j = args.find(',', i);
      if (j == std::string::npos) j = args.size();
      std::string item = args.substr(i, j - i);
      i = j + 1;
      const auto trim = [](std::string s) {
        while (!s.empty() && s.front() == ' ') s.erase(s.begin());
        while (!s.empty() && s.back() == ' ') s.pop_back();
        return s;
      };
      item = trim(item);
      if (item.empty()) continue;
      const size_t eq = item.find('=');
      const std::string key = trim(item.substr(0, eq));
      std::string names;
      for (const auto& [k, v] : values_) names += (names.empty() ? "" : ", ") + k;
      if (eq == std::string::npos) {
        errors_.push_back({"model.architecture_args", "model.architecture_args: \"" + item.substr(0, 60) + "\" must be name=number; the program's hyperparameters are " + names});
        continue;
      }
      const std::string val = trim(item.substr(eq + 1));
      double d = 0;
      bool found = false;
      for (auto& [k, v] : values_)
        if (k == key) found = true;
      char* end = nullptr;
      d = std::strtod(val.c_str(), &end);
      if (!found)
        errors_.push_back({"model.architecture_args", "model.architecture_args: \"" + key.substr(0, 60) + "\" is not a hyperparameter of this program; it has " + names});
      else if (val.empty() || end != val.c_str() + val.size() || !std::isfinite(d))
        errors_.push_back({"model.architecture_args", "model.architecture_args: " + key + " must be a number; got \"" + val.substr(0, 40) + "\""});
      else
        for (auto& [k, v] : values_)
          if (k == key) v = d;
    }
  }

  // Whether an expression names `layer` (a whole name, not part of one).
  static bool names_layer(const std::string& e) {
    for (size_t at = e.find("layer"); at != std::string::npos; at = e.find("layer", at + 1)) {
      const auto part = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
      if ((at == 0 || !part(e[at - 1])) && (at + 5 >= e.size() || !part(e[at + 5]))) return true;
    }
    return false;
  }

  // "frozen_modules": [{"name": "vae", "params": "vae_params", "when": "vae_on_gpu", "dtype": "fp32"}, ...]: frozen
  // models resident beside the program's (FrozenModule); "when" (an expression, nonzero: present) defaults to
  // present, "dtype" to the compute dtype.
  void frozen_modules(const ojson& j, Architecture& a) {
    if (!j.is_array() || j.size() > 16) return error("frozen_modules", "must be a list of at most 16 objects with name, params and optionally when");
    for (size_t i = 0; i < j.size(); ++i) {
      const std::string where = "frozen_modules[" + std::to_string(i) + "]";
      const ojson& m = j[i];
      if (!m.is_object() || !m.contains("name") || !m["name"].is_string() || !valid_name(m["name"].get<std::string>()) || !m.contains("params"))
        return error(where, "must be an object with a name (letters, digits and _) and params (a count or an expression)");
      for (const auto& [k, v] : m.items())
        if (k != "name" && k != "params" && k != "when" && k != "dtype" && k != "forward")
          error(where + "." + k, "is not a key of a frozen module; allowed: name, params, when, dtype, forward");
      bool fp32 = false, weights_dtype = false;
      if (m.contains("dtype")) {
        if (m["dtype"] == "fp32") fp32 = true;
        else if (m["dtype"] == "weights") weights_dtype = true;
        else if (m["dtype"] != "compute") return error(where + ".dtype", "must be compute (the dtype the scripts cast it to), fp32, or weights (the trained model's own dtype: a buffer that moves with it)");
      }
      double when = 1;
      if (m.contains("when") && !value(m["when"], where + ".when", when)) return;
      if (m.contains("when")) note_switch(m["when"], a);
      int64_t params = 0;
      if (!dim(m["params"], where + ".params", params, 0)) return;
      for (const auto& f : a.frozen_modules)
        if (f.name == m["name"].get<std::string>()) return error(where + ".name", "\"" + f.name + "\" names an earlier frozen module; names are unique");
      const std::string when_name = m.contains("when") && m["when"].is_string() && valid_name(m["when"].get<std::string>()) ? m["when"].get<std::string>() : "";
      std::shared_ptr<const Architecture> forward;
      if (when != 0 && m.contains("forward")) {
        // {"program": a built-in frozen_forward program, "args": {its hyperparameter: an expression over this one's}}
        const ojson& fw = m["forward"];
        if (!fw.is_object() || !fw.contains("program") || !fw["program"].is_string() || !valid_name(fw["program"].get<std::string>()))
          return error(where + ".forward", "must be an object with a built-in program's name (program) and its args");
        std::string args;
        if (fw.contains("args")) {
          if (!fw["args"].is_object()) return error(where + ".forward.args", "must be an object: the program's hyperparameter -> an expression");
          for (const auto& [k, v] : fw["args"].items()) {
            double d = 0;
            if (!value(v, where + ".forward.args." + k, d)) return;
            args += (args.empty() ? "" : ",") + k + "=" + number(d);
          }
        }
        const std::string prog = fw["program"].get<std::string>();
        if (builtin_architecture(prog).empty()) return error(where + ".forward.program", "\"" + prog.substr(0, 40) + "\" is not a built-in program");
        const auto errs = decode_architecture(prog, args, forward);
        if (!errs.empty()) return error(where + ".forward", "the program " + prog + " does not hold with " + args + ": " + errs.front().message);
        if (!forward->frozen_forward) return error(where + ".forward.program", prog + " is not a frozen module's forward (frozen_forward)");
      }
      if (when != 0) a.frozen_modules.push_back({m["name"].get<std::string>(), params, fp32, weights_dtype, when_name, forward});
    }
  }

  // A tensor of the stage, or else a carry of an earlier stage, which becomes an input of this one.
  int32_t tensor_or_carry(ArchStage& s, const std::string& n) {
    const int32_t t = tensor_named(s, n);
    if (t >= 0) return t;
    // A program input read after the embeddings (a UNet's text embeddings, read by every cross-attention).
    for (size_t i = 0; i < arch_->inputs.size(); ++i)
      if (arch_->inputs[i].name == n) {
        s.tensors.push_back(arch_->inputs[i]);
        input_read_[i] = true;
        return static_cast<int32_t>(s.tensors.size()) - 1;
      }
    for (size_t c = 0; c < arch_->carries.size(); ++c)
      if (arch_->carries[c].name == n) {
        ArchTensor in = arch_->carries[c].tensor;
        in.producer = -1, in.carry = static_cast<int32_t>(c), in.is_parameter = false;
        s.tensors.push_back(in);
        return static_cast<int32_t>(s.tensors.size()) - 1;
      }
    return -1;
  }

  // "carry": ["skip1", ...]: tensors of this stage that later stages read by name. Each is a new tensor an op made
  // (not a view, an in-place result or a parameter), made once: in the embeddings or a block kind that runs once.
  void carry(const ojson& j, const std::string& sk, ArchStage& s) {
    const std::string kw = sk + ".carry";
    if (!j.is_array() || j.size() > 64) return error(kw, "must be a list of at most 64 tensor names");
    if (in_block_ && repeat_ != 1) return error(kw, "needs a block kind that runs once (repeat 1): each carry is made by one stage");
    for (const auto& v : j) {
      const std::string n = v.is_string() ? v.get<std::string>() : std::string();
      const int32_t t = tensor_named(s, n);
      if (t < 0 || s.tensors[t].producer < 0) return error(kw, "\"" + n.substr(0, 60) + "\" is not a tensor an op of the stage makes");
      const ArchOp& op = s.ops[static_cast<size_t>(s.tensors[t].producer)];
      if (!makes_new_tensor(op))
        return error(kw, "\"" + n + "\" is a view, an in-place result or a parameter (" + op_name(op.kind) + "); carry a tensor an op makes anew");
      for (const auto& c : arch_->carries)
        if (c.name == n) return error(kw, "\"" + n + "\" is carried by an earlier stage already; carry names are unique in a program");
      for (const auto& in : arch_->inputs)
        if (in.name == n) return error(kw, "\"" + n + "\" is the name of a program input, which later stages read by that name; rename the carry");
      ArchCarry c;
      c.name = n, c.tensor = s.tensors[t], c.producer = stage_position_;
      s.exports.push_back({t, static_cast<int32_t>(arch_->carries.size())});
      arch_->carries.push_back(std::move(c));
    }
  }

  static bool makes_new_tensor(const ArchOp& op) {
    switch (op.kind) {
      case OpKind::Parameter:
      case OpKind::FlattenTokens:
      case OpKind::UnflattenTokens:
      case OpKind::SelectToken:
      case OpKind::Slice:
      case OpKind::Dropout:
      case OpKind::DropPath:
      case OpKind::Copy:
      case OpKind::Unpad:
      case OpKind::Cast:
      case OpKind::ResizeTokens: return false;  // each may return its input, or a view of it
      default: return !op.inplace;
    }
  }

  int32_t tensor_named(ArchStage& s, const std::string& n) {
    for (size_t i = 0; i < s.tensors.size(); ++i)
      if (s.tensors[i].name == n) return static_cast<int32_t>(i);
    return -1;
  }

  // A flag written as a hyperparameter's name (an op's "bias": "use_bias", a frozen module's "when"): that
  // hyperparameter is a switch (Architecture::switches).
  static void note_switch(const ojson& v, Architecture& a) {
    if (!v.is_string()) return;
    const std::string& name = v.get_ref<const std::string&>();
    const bool declared = std::any_of(a.defaults.begin(), a.defaults.end(), [&](const auto& h) { return h.first == name; });
    if (declared && std::find(a.switches.begin(), a.switches.end(), name) == a.switches.end()) a.switches.push_back(name);
  }

  // A "blocks" entry {"same_as": "mamba", "repeat": 2}: more blocks of an earlier kind, with its parameter list and
  // ops (a hybrid's interleaved layers: Nemotron-H's pattern, Bamba's attention layers among Mamba-2 ones). Such a
  // kind runs at several places in the order, so it must keep its input's shape, make no carry (a carry is made
  // once) and read none (a carry lives until its last reader in the order), and give no per-block values.
  bool more_of_kind(const ojson& j, const std::string& where, const ArchTensor& received, Architecture& a) {
    for (const auto& [k, v] : j.items())
      if (k != "same_as" && k != "repeat") return error(where + "." + k, "is not a key of a same_as entry (same_as, repeat)"), false;
    if (!j["same_as"].is_string()) return error(where + ".same_as", "must name an earlier kind of block"), false;
    const std::string& name = j["same_as"].get_ref<const std::string&>();
    const auto named = std::find(a.block_names.begin(), a.block_names.end(), name);
    if (named == a.block_names.end())
      return error(where + ".same_as", "\"" + name.substr(0, 64) + "\" is not the name of an earlier entry of blocks"), false;
    const size_t kind = static_cast<size_t>(named - a.block_names.begin());
    const ArchStage& st = a.blocks[kind];
    const ArchTensor& in = st.tensors[static_cast<size_t>(st.input)];
    if (in.shape != received.shape || st.tensors[static_cast<size_t>(st.output)].shape != in.shape)
      return error(where + ".same_as", "\"" + name + "\" runs again here, so it must receive and pass on " + dims_text(received.shape) + " as it does"), false;
    if (!st.exports.empty()) return error(where + ".same_as", "\"" + name + "\" makes a carry, which only a kind that runs once may"), false;
    for (const ArchTensor& t : st.tensors)
      if (t.carry >= 0 && &t != &in) return error(where + ".same_as", "\"" + name + "\" reads a carry; a kind that runs at several places may not"), false;
    for (const ArchOp& op : st.ops)
      if (!op.p_per_layer.empty()) return error(where + ".same_as", "\"" + name + "\" has per-block values (an expression of layer); a kind that runs at several places may not"), false;
    if (!j.contains("repeat")) return error(where + ".repeat", "is missing: how many more blocks of that kind run here"), false;
    int64_t repeat = 0;
    if (!dim(j["repeat"], where + ".repeat", repeat, 0)) return false;
    if (a.repeat + repeat > 4096) return error(where + ".repeat", "makes more than 4096 blocks in all"), false;
    for (int64_t r = 0; r < repeat; ++r) a.kind_of_layer.push_back(static_cast<int32_t>(kind));
    a.repeat += repeat;
    return true;
  }

  // One stage (`sk`: embeddings, block, blocks[k] or head) from its object `j`.
  void stage(const ojson& j, const std::string& sk, const std::vector<ArchTensor>& inputs, const ArchTensor* received,
             ArchStage& s) {
    const bool head = sk == "head", embeddings = sk == "embeddings", kind = sk.rfind("blocks[", 0) == 0;
    for (const auto& [k, v] : j.items())
      if (k != "ops" && k != "input" && k != "output" && !(kind && (k == "repeat" || k == "name" || k == "checkpoint")) && !(k == "carry" && !head))
        error(sk + "." + k, std::string("is not a stage key; allowed: ") + (kind ? "name, repeat, checkpoint, " : "") + "input, ops, output" + (head ? "" : ", carry"));
    if (kind && j.contains("checkpoint")) {
      if (!j["checkpoint"].is_boolean()) error(sk + ".checkpoint", "must be true or false (whether a checkpoint may wrap this kind of block)");
      else s.checkpointable = j["checkpoint"].get<bool>();
    }
    for (const auto& t : inputs) s.tensors.push_back(t);
    if (received) {
      if (!j.contains("input") || !j["input"].is_string()) return error(sk + ".input", "must name the tensor the stage receives");
      ArchTensor t = *received;
      t.name = j["input"].get<std::string>();
      t.producer = -1;
      s.input = static_cast<int32_t>(s.tensors.size());
      s.tensors.push_back(t);
    } else if (j.contains("input")) {
      error(sk + ".input", "the embeddings read the program's inputs, not a stage input");
    }
    if (!j.contains("ops") || !j["ops"].is_array() || j["ops"].empty()) return error(sk + ".ops", "must be a non-empty list of ops");
    if (j["ops"].size() > 256) return error(sk + ".ops", "must hold at most 256 ops");
    for (size_t i = 0; i < j["ops"].size(); ++i) {
      op(j["ops"][i], sk + ".ops[" + std::to_string(i) + "]", s);
      if (!errors_.empty()) return;
    }
    s.last_reader.assign(s.tensors.size(), -1);
    for (size_t i = 0; i < s.ops.size(); ++i)
      for (int32_t t : s.ops[i].in) s.last_reader[t] = static_cast<int32_t>(i);
    // What an in-place op writes is gone for any later reader: the op must be its last.
    for (size_t i = 0; i < s.ops.size(); ++i)
      if (s.ops[i].inplace && s.last_reader[s.ops[i].in[0]] != static_cast<int32_t>(i))
        return error(sk + ".ops[" + std::to_string(i) + "].inplace", "overwrites \"" + s.tensors[s.ops[i].in[0]].name +
                                                                       "\", which a later op still reads");
    if (head) {
      if (s.ops.back().kind != OpKind::CrossEntropy && s.ops.back().kind != OpKind::MseLoss)
        return error(sk + ".ops", "the head must end with its loss (cross_entropy or mse_loss)");
      if (j.contains("output")) error(sk + ".output", "the head ends in its loss and passes nothing on");
    } else {
      if (!j.contains("output") || !j["output"].is_string()) return error(sk + ".output", "must name the tensor the stage passes on");
      s.output = tensor_named(s, j["output"].get<std::string>());
      if (s.output < 0) return error(sk + ".output", "\"" + j["output"].get<std::string>().substr(0, 60) + "\" is not a tensor of the stage");
      if (s.tensors[s.output].is_parameter) return error(sk + ".output", "must be an activation, not a parameter");
    }
    if (j.contains("carry")) carry(j["carry"], sk, s);
    if (!errors_.empty()) return;
    // A tensor nothing reads is a mistake in a program (a typo in an "in", or a dead op).
    for (size_t t = 0; t < s.tensors.size(); ++t)
      // (A parameter may be registered and unused in training, as DINOv2's mask_token: it stays a weight.)
      if (s.last_reader[t] < 0 && static_cast<int32_t>(t) != s.output && !(embeddings && s.tensors[t].producer < 0) &&
          !s.tensors[t].is_parameter &&
          !(head && s.tensors[t].producer == static_cast<int32_t>(s.ops.size()) - 1) &&
          std::none_of(s.exports.begin(), s.exports.end(), [&](const auto& e) { return e.first == static_cast<int32_t>(t); }))
        error(sk, "tensor \"" + s.tensors[t].name + "\" is produced but never read");
    for (size_t t = 0; embeddings && t < inputs.size(); ++t)
      if (s.last_reader[t] >= 0) input_read_[t] = true;
  }

  void op(const ojson& o, const std::string& where, ArchStage& s) {
    if (!o.is_object() || !o.contains("op") || !o["op"].is_string()) return error(where, "must be an object with an \"op\"");
    const std::string name = o["op"].get<std::string>();
    const OpSpec* spec = find_op(name);
    if (!spec) return error(where + ".op", "\"" + name.substr(0, 40) + "\" is not an op; the vocabulary: " + op_names());
    ArchOp op;
    op.kind = spec->kind;
    for (const auto& [k, v] : o.items()) {
      bool known = k == "op" || k == "out" || (k == "name" && spec->has_params);
      for (const auto& key : spec->keys) known |= k == key.name;
      if (!known) {
        std::string allowed = "op, out";
        if (spec->has_params) allowed += ", name";
        for (const auto& key : spec->keys) allowed += std::string(", ") + key.name;
        error(where + "." + k, "is not a key of " + name + "; allowed: " + allowed);
      }
    }
    if (spec->has_params) {
      if (!o.contains("name") || !o["name"].is_string() || o["name"].get_ref<const std::string&>().empty() ||
          o["name"].get_ref<const std::string&>().size() > 200)
        return error(where + ".name", "must be the module's path (a non-empty string of at most 200 characters)");
      op.name = o["name"].get<std::string>();
      op.module = module_name(op.name + ".weight");
    }
    std::vector<int64_t> param_shape;
    for (const auto& key : spec->keys) {
      const std::string kw = where + "." + key.name;
      if (!o.contains(key.name)) {
        if (key.required) error(kw, "is missing");
        continue;
      }
      const ojson& v = o[key.name];
      switch (key.kind) {
        case OpKey::Tensor:
        case OpKey::Tensors: {
          std::vector<std::string> names;
          if (v.is_string()) names.push_back(v.get<std::string>());
          else if (v.is_array() && key.kind == OpKey::Tensors)
            for (const auto& x : v) names.push_back(x.is_string() ? x.get<std::string>() : std::string());
          else {
            error(kw, key.kind == OpKey::Tensor ? "must name one tensor" : "must name a tensor or a list of tensors");
            continue;
          }
          for (const auto& n : names) {
            const int32_t t = tensor_or_carry(s, n);
            if (t < 0) error(kw, "tensor \"" + n.substr(0, 60) + "\" is not produced before this op (ops run in the order written, so a cycle shows here too)");
            else op.in.push_back(t);
          }
          break;
        }
        case OpKey::Dim: {
          if (spec->kind == OpKind::Parameter) {
            shape(v, kw, param_shape);
            break;
          }
          int64_t d = 0;
          const bool from_zero = spec->kind == OpKind::SelectToken || key.name == std::string("start") || key.name == std::string("padding");
          if (!dim(v, kw, d, from_zero ? 0 : 1)) break;
          const std::string kn = key.name;
          if (kn == "out_features" || kn == "out_channels") op.out_features = d;
          if (kn == "kernel") op.kernel = d;
          if (kn == "stride") op.stride = d;
          if (kn == "padding") op.padding = d;
          if (kn == "groups") op.groups = d;
          if (kn == "heads") op.heads = d;
          if (kn == "kv_heads") op.kv_heads = d;
          if (kn == "window") op.window = d;
          if (kn == "index" || kn == "start" || kn == "height") op.index = d;
          if (kn == "size" || kn == "rows") op.size = d;
          if (kn == "unit") op.unit = d;
          if (kn == "scale") op.stride = d;
          if (kn == "head_dim") op.head_dim = d;
          if (kn == "rotary_dims") op.size = d;
          if (kn == "state") op.state = d;
          if (kn == "chunk") op.chunk = d;
          if (kn == "experts") op.experts = d;
          if (kn == "top_k") op.top_k = d;
          if (kn == "width") op.expert_width = d;
          break;
        }
        case OpKey::Probability: {
          // In a block, `layer` names the block's index (0 to repeat - 1): the expression is evaluated per block.
          const bool per_layer = in_block_ && v.is_string() && names_layer(v.get_ref<const std::string&>());
          // Bounded: a program evaluates at most 65,536 per-block values (4,096 blocks x 16 ops).
          if (per_layer && (per_layer_values_ += repeat_) > 65536) {
            error(kw, "makes more than 65,536 per-block values in all (blocks x ops whose expression names layer)");
            break;
          }
          if (per_layer) op.p_first_layer = first_layer_;
          for (int64_t l = 0; l < (per_layer ? repeat_ : 1); ++l) {
            if (per_layer) values_.push_back({"layer", static_cast<double>(first_layer_ + l)});
            double d = 0;
            const bool ok = value(v, kw, d);
            if (per_layer) values_.pop_back();
            if (!ok) break;
            if (d < 0 || d >= 1) {
              error(kw, "must be a probability from 0 to below 1; it is " + number(d) + (per_layer ? " in block " + std::to_string(first_layer_ + l) : ""));
              break;
            }
            if (per_layer) op.p_per_layer.push_back(d), op.p = std::max(op.p, d);
            else op.p = d;
          }
          break;
        }
        case OpKey::Flag: {  // true, false, or an expression: nonzero is true (qkv_bias = 1)
          double d = 0;
          if (v.is_boolean()) d = v.get<bool>() ? 1 : 0;
          else if (!value(v, kw, d)) break;
          if (arch_) note_switch(v, *arch_);
          if (key.name == std::string("bias")) op.bias = d != 0;
          else if (key.name == std::string("inplace")) op.inplace = d != 0;
          else if (key.name == std::string("noise_scaled")) op.noise_scaled = d != 0;
          else if (key.name == std::string("when")) op.when = d != 0;
          else if (key.name == std::string("masked")) op.masked = d != 0;
          else if (key.name == std::string("packed")) op.packed = d != 0;
          else if (key.name == std::string("affine")) op.affine = d != 0;
          else if (key.name == std::string("cast_out")) op.cast_out = d != 0;
          else if (key.name == std::string("tied")) op.tied = d != 0;
          else if (key.name == std::string("frozen")) op.frozen = d != 0;
          else if (key.name == std::string("conv_bias")) op.conv_bias = d != 0;
          else if (key.name == std::string("shifted_logits")) op.shifted_logits = d != 0;
          else op.tanh = d != 0;
          break;
        }
        case OpKey::Choice: {
          const std::string c = v.is_string() ? v.get<std::string>() : "";
          if (key.name == std::string("axis") && spec->kind == OpKind::Slice) {
            if (c == "tokens" || c == "features") op.rows = c == "tokens";
            else error(kw, "must be features (columns of the last dimension) or tokens (rows, dim=1)");
            break;
          }
          if (key.name == std::string("axis")) {
            if (c == "tokens" || c == "features" || c == "channels") op.features = c == "features", op.channels = c == "channels";
            else error(kw, "must be tokens (rows, dim=1), features (the last dimension) or channels (an image's, dim=1)");
            break;
          }
          if (key.name == std::string("dtype")) {
            if (c == "fp32") op.cast_to = CastTo::Fp32;
            else if (c == "compute") op.cast_to = CastTo::Compute;
            else if (c == "weights") op.cast_to = CastTo::Weights;
            else error(kw, "must be fp32, compute (the autocast or weight dtype) or weights (the weights' storage dtype)");
            break;
          }
          if (key.name == std::string("variant") && spec->kind == OpKind::Rotary) {
            if (c == "transformers" || c == "diffusers") op.hf_rotary = c == "transformers";
            else error(kw, "must be transformers (apply_rotary_pos_emb) or diffusers (apply_rotary_emb)");
            break;
          }
          if (key.name == std::string("variant")) {
            if (c == "transformers" || c == "diffusers") op.diffusers = c == "diffusers";
            else error(kw, "must be transformers (LlamaRMSNorm's arithmetic) or diffusers (diffusers' RMSNorm)");
            break;
          }
          if (c == "embedding") op.param_kind = ParamKind::Embedding;
          else if (c == "norm") op.param_kind = ParamKind::Norm;
          else if (c == "bias") op.param_kind = ParamKind::Bias;
          else if (c == "matmul") op.param_kind = ParamKind::Matmul;
          else error(kw, "must be one of: embedding, norm, bias, matmul (what HF Trainer's decay groups and the optimizer see)");
          break;
        }
      }
    }
    // Defaults that depend on the op: LayerNorm has a bias unless told otherwise, Linear and Conv2d likewise.
    if (!o.contains("bias") && (op.kind == OpKind::LayerNorm || op.kind == OpKind::Linear || op.kind == OpKind::Conv2d ||
                               op.kind == OpKind::Conv1d)) op.bias = true;
    if (op.kind == OpKind::MaxPool2d && !o.contains("stride")) op.stride = op.kernel;  // nn.MaxPool2d's default
    // An in-place op writes a tensor this stage made (writing the stage's input or a parameter would change what
    // another stage or the optimizer holds).
    if (op.inplace && !op.in.empty() && (s.tensors[op.in[0]].producer < 0 || s.tensors[op.in[0]].is_parameter))
      return error(where + ".inplace", "writes its input, so the input must be an activation this stage makes; \"" +
                                           s.tensors[op.in[0]].name + "\" is not");
    if (!errors_.empty()) return;
    if (!o.contains("out") || !o["out"].is_string() || o["out"].get_ref<const std::string&>().empty())
      return error(where + ".out", "must name the tensor the op produces");
    const std::string out = o["out"].get<std::string>();
    if (out.size() > 64) return error(where + ".out", "must be at most 64 characters");
    if (tensor_named(s, out) >= 0) return error(where + ".out", "\"" + out + "\" is produced already; each tensor is written once");
    std::vector<const ArchTensor*> in;
    for (int32_t t : op.in) in.push_back(&s.tensors[t]);
    std::vector<int64_t> shape_out;
    std::string e;
    try {
      if (!op_shape(op, in, param_shape, shape_out, e)) return error(where, e);
    } catch (const RangeError&) {
      return error(where, "makes a tensor too large to count");
    }
    ArchTensor t;
    t.name = out;
    t.shape = shape_out;
    t.producer = static_cast<int32_t>(s.ops.size());
    t.is_parameter = op.kind == OpKind::Parameter;
    double n = 1;
    for (int64_t d : t.shape) n *= double(d);
    if (n > kMaxDim) return error(where, "makes more than 2^40 elements per sample");
    op.out = static_cast<int32_t>(s.tensors.size());
    s.tensors.push_back(t);
    s.ops.push_back(op);
  }

  std::vector<ArchitectureError>& errors_;
  std::string field_;
  Architecture* arch_ = nullptr;  // the program being decoded (its inputs, and its carries so far)
  std::vector<bool> input_read_;  // per program input: some stage reads it
  int64_t stage_position_ = -1;   // the stage being decoded: -1 the embeddings, a block kind's first block, or the head
  bool in_block_ = false;  // decoding a block kind's ops, where `layer` names the block's index
  int64_t first_layer_ = 0, repeat_ = 0;  // the kind's first block and how many run
  int64_t per_layer_values_ = 0;
  std::vector<std::pair<std::string, double>> values_;
};

}  // namespace

namespace {

// What the built-in programs declare about themselves, read once: the catalogue's import asks for every model.
struct BuiltinProgram {
  std::string name;
  std::vector<std::string> model_types, hyperparameters;
  std::vector<std::pair<std::string, std::string>> timm_models;  // timm's name, the arguments
  std::vector<std::pair<std::string, std::string>> hf_keys;      // hyperparameter, its JSON pointer in an HF config
  struct Require {
    std::string key;
    ojson equals, when_absent;
  };
  std::vector<Require> requires_;
  std::string_view text;
};

const std::vector<BuiltinProgram>& builtin_programs() {
  static const std::vector<BuiltinProgram> programs = [] {
    std::vector<BuiltinProgram> out;
    for (std::string_view f : catalog_architecture_files()) {
      try {
        const auto j = ojson::parse(f);
        BuiltinProgram b{j.at("name").get<std::string>(), {}, {}, {}, {}, {}, f};
        if (j.contains("requires"))
          for (const auto& [k, v] : j.at("requires").items()) b.requires_.push_back({k, v.at("equals"), v.at("when_absent")});
        for (const auto& t : j.at("model_types")) b.model_types.push_back(t.get<std::string>());
        for (const auto& [k, v] : j.at("hyperparameters").items()) {
          b.hyperparameters.push_back(k);
          const bool mapped = j.contains("hf_keys") && j.at("hf_keys").contains(k);
          b.hf_keys.push_back({k, mapped ? j.at("hf_keys").at(k).get<std::string>() : "/" + k});
        }
        if (j.contains("timm_models"))
          for (const auto& [k, v] : j.at("timm_models").items()) b.timm_models.push_back({k, v.get<std::string>()});
        out.push_back(std::move(b));
      } catch (const ojson::exception&) {
        // a built-in program that does not parse fails its test (test_architecture.cpp); here it is left out
      }
    }
    return out;
  }();
  return programs;
}

}  // namespace

std::vector<std::string> builtin_architecture_names() {
  std::vector<std::string> names;
  for (const auto& b : builtin_programs()) names.push_back(b.name);
  return names;
}

std::string_view builtin_architecture(std::string_view name) {
  for (const auto& b : builtin_programs())
    if (b.name == name) return b.text;
  return {};
}

bool architecture_for_timm(std::string_view timm_name, std::string& program, std::string& args) {
  for (const auto& b : builtin_programs())
    for (const auto& [name, a] : b.timm_models)
      if (name == timm_name) return program = b.name, args = a, true;
  return false;
}

std::vector<std::string> timm_model_names() {
  std::vector<std::string> names;
  for (const auto& b : builtin_programs())
    for (const auto& [name, a] : b.timm_models) names.push_back(name);
  return names;
}

std::string architecture_for_model_type(std::string_view model_type, const std::string& config_json, std::string& mismatch) {
  const ojson cfg = config_json.empty() ? ojson::object() : ojson::parse(config_json, nullptr, false);
  mismatch.clear();
  for (const auto& b : builtin_programs()) {
    if (std::find(b.model_types.begin(), b.model_types.end(), model_type) == b.model_types.end()) continue;
    std::string needs;
    bool meets = true;
    for (const auto& r : b.requires_) {
      ojson got = cfg.is_object() && cfg.contains(r.key) ? cfg[r.key] : r.when_absent;
      if (r.equals.is_boolean() && got.is_number()) got = got.get<double>() != 0;  // 1 for true, as some configs write it
      meets = meets && got == r.equals;
      needs += (needs.empty() ? "" : ", ") + r.key + " " + r.equals.dump();
    }
    if (meets) return b.name;
    mismatch += (mismatch.empty() ? "" : "; ") + std::string("\"") + b.name + "\" needs " + needs;
  }
  return {};
}

std::vector<ArchitectureError> decode_architecture(const std::string& spec, const std::string& args,
                                                   std::shared_ptr<const Architecture>& out) {
  // The last few programs decoded, kept: validation, the simulation's setup and the page decode the same texts on
  // every edit, and a decode costs about as much as the step it describes. A few, not one: a vision-language model's
  // validation decodes its tower with and without its arguments, and the model's program beside it, which evicted
  // each other from a single entry on every simulation. Programs are immutable once decoded.
  struct Decoded {
    std::string spec, args;
    std::shared_ptr<const Architecture> program;
  };
  static std::mutex recent_mutex;
  static std::array<Decoded, 4> recent;  // most recently used first
  {
    const std::lock_guard<std::mutex> lock(recent_mutex);
    for (size_t i = 0; i < recent.size(); ++i)
      if (recent[i].program && recent[i].spec == spec && recent[i].args == args) {
        out = recent[i].program;
        std::rotate(recent.begin(), recent.begin() + static_cast<std::ptrdiff_t>(i), recent.begin() + static_cast<std::ptrdiff_t>(i) + 1);
        return {};
      }
  }
  std::vector<ArchitectureError> errors;
  const std::string field = "model.architecture";
  std::string_view text = spec;
  const bool inline_program = !spec.empty() && spec.front() == '{';
  if (!inline_program) {
    text = builtin_architecture(spec);
    if (text.empty()) {
      std::string names;
      for (const auto& n : builtin_architecture_names()) names += (names.empty() ? "" : ", ") + n;
      errors.push_back({field, field + " must be empty (the built-in families), a program as JSON, or one of: " + names +
                                   "; got \"" + spec.substr(0, 40) + "\""});
      return errors;
    }
  }
  if (std::string e = document_guard_error(text, field); !e.empty()) {
    errors.push_back({field, e});
    return errors;
  }
  ojson p;
  try {
    p = ojson::parse(text.begin(), text.end());
  } catch (const ojson::exception& e) {
    std::string msg = e.what();
    if (auto at = msg.find("parse error"); at != std::string::npos) msg = msg.substr(at);
    errors.push_back({field, field + " is not valid JSON: " + msg});
    return errors;
  }
  if (!p.is_object()) {
    errors.push_back({field, field + " must be a JSON object (a program)"});
    return errors;
  }
  auto a = std::make_shared<Architecture>();
  Decoder d(errors, field);
  try {
    d.decode(p, *a, args);
  } catch (const RangeError&) {
    errors.push_back({field, field + ": a shape is too large to count"});
  } catch (const ojson::exception& e) {
    errors.push_back({field, field + ": " + e.what()});
  }
  // A program that holds with its defaults but not with the user's values: the values are the field to fix.
  if (!errors.empty() && !args.empty() && errors.front().field == field) {
    std::shared_ptr<const Architecture> plain;
    if (decode_architecture(spec, "", plain).empty())
      for (auto& e : errors) {
        if (e.field != field) continue;
        e.field = "model.architecture_args";
        e.message = "model.architecture_args: with \"" + args.substr(0, 60) + "\" the program does not hold: " + e.message;
      }
  }
  if (errors.empty()) {
    out = a;
    const std::lock_guard<std::mutex> lock(recent_mutex);
    std::rotate(recent.begin(), recent.end() - 1, recent.end());
    recent.front() = {spec, args, a};
  }
  return errors;
}

namespace {

// A vision-language model's tower and projector, after the decoder's embeddings in `pre` (model.h ParamTensor::Part).
// The tower is the program's vision model: its embeddings, every block's tensors (one list per block, as its
// modules allocate them) and a CLIP program's post-layernorm, without the program's classifier head. The projector:
// - llava_mlp, LlavaMultiModalProjector (transformers models/llava/modeling_llava.py; LLaVA's
//   multimodal_projector/builder.py mlp2x_gelu): linear_1 [hidden, tower width] and linear_2 [hidden, hidden], each
//   with a bias (multimodal_projector_bias, default True);
// - patch_merger, Qwen2-VL's PatchMerger (transformers v4.45.0 models/qwen2_vl/modeling_qwen2_vl.py: ln_q =
//   LayerNorm(context_dim), mlp = Linear(context_dim x merge, same), GELU, Linear(same, dim)), where dim is the
//   decoder's hidden size. It is a module of the tower (visual.merger); memsim keeps it with the projectors.
void attach_vision_tower(ModelShape& s, const ModelConfig& m) {
  std::shared_ptr<const Architecture> tower;
  decode_architecture(m.vision_tower, m.vision_tower_args, tower);
  if (!tower) throw RangeError("model.vision_tower does not decode; validate the config first");
  const TowerSpec spec = tower_spec(*tower);
  const ModelShape t = build_program_shape(tower);
  const int64_t before = sum_numel(s.pre);
  auto add_tower = [&](const std::vector<ParamTensor>& ts, const std::string& layer) {
    for (ParamTensor p : ts) {
      if (p.name.rfind("classifier", 0) == 0) continue;  // the program's classification head: not in the tower
      for (const char* list : {"layers.", "blocks."})
        if (const size_t at = p.name.find(list); !layer.empty() && at != std::string::npos) {
          p.name.insert(at + 7, layer + ".");
          break;
        }
      p.name = spec.module + "." + p.name;
      p.frozen = true;
      p.part = ParamTensor::Part::VisionTower;
      s.pre.push_back(std::move(p));
    }
  };
  add_tower(t.pre, "");
  for (int64_t l = 0; l < t.num_layers; ++l) add_tower(t.params_of(l), std::to_string(l));
  add_tower(t.post, "");
  s.tower_embeddings = t.pre, s.tower_block = t.layer, s.tower_head = t.post;
  for (auto* list : {&s.tower_embeddings, &s.tower_block, &s.tower_head})
    for (auto& p : *list) p.frozen = true, p.part = ParamTensor::Part::VisionTower;
  auto projector = [&](const std::string& name, int64_t out, int64_t in, ParamKind kind) {
    ParamTensor w{name + ".weight", in == 0 ? out : mul(out, in), kind, out};
    ParamTensor b{name + ".bias", out, kind == ParamKind::Norm ? ParamKind::Norm : ParamKind::Bias, out};
    w.part = b.part = ParamTensor::Part::Projector;
    s.pre.push_back(w);
    s.pre.push_back(b);
  };
  if (spec.projector == TowerSpec::Projector::PatchMerger) {
    const int64_t merged = mul(spec.width, spec.merge);
    s.projector_widths = {merged, merged, m.hidden_size};
    if (spec.rms_merger) {  // Qwen2RMSNorm: a weight only
      ParamTensor w{spec.module + ".merger.ln_q.weight", spec.width, ParamKind::Norm, spec.width};
      w.part = ParamTensor::Part::Projector;
      s.pre.push_back(w);
    } else {
      projector(spec.module + ".merger.ln_q", spec.width, 0, ParamKind::Norm);
    }
    projector(spec.module + ".merger.mlp.0", merged, merged, ParamKind::Matmul);
    projector(spec.module + ".merger.mlp.2", m.hidden_size, merged, ParamKind::Matmul);
  } else {
    s.projector_widths = {spec.width};
    for (int64_t i = 0; i < m.projector_depth; ++i) s.projector_widths.push_back(m.hidden_size);
    for (int64_t i = 0; i < m.projector_depth; ++i)
      projector("multi_modal_projector.linear_" + std::to_string(i + 1), m.hidden_size, s.projector_widths[static_cast<size_t>(i)], ParamKind::Matmul);
  }
  // LlavaNextModel's image_newline [hidden_size] (use_image_newline_parameter), initialised beside the projector.
  if (spec.newline) {
    ParamTensor nl{"image_newline", m.hidden_size, ParamKind::Bias, m.hidden_size};
    nl.part = ParamTensor::Part::Projector;
    s.pre.push_back(nl);
  }
  s.image_tokens = spec.tokens_per_image();  // vision_image_tokens(m), without decoding the tower again
  s.image_crops = spec.crops;
  s.projector_rows = spec.projector_rows_per_image();
  s.vision_tower = std::move(tower);
  const int64_t added = sub(sum_numel(s.pre), before);
  s.params_total = add(s.params_total, added);
  s.params_active_per_token = add(s.params_active_per_token, added);
}

}  // namespace

TowerSpec tower_spec(const Architecture& a) {
  if (a.tower.declared) return a.tower;
  // LLaVA's use of a CLIP program: its 'default' vision_feature_select_strategy (feature_select 'patch') drops the
  // class token, so one image is its (image_size / patch_size)^2 patch rows (576 for ViT-L/14 at 336).
  TowerSpec t;
  t.width = static_cast<int64_t>(architecture_value(a, "hidden_size"));
  t.feature_rows = std::max<int64_t>(0, static_cast<int64_t>(architecture_value(a, "tokens")) - 1);
  // LLaVA-NeXT's anyres, where the program's dims say (clip_vision.json with anyres = 1).
  t.crops = std::max<int64_t>(1, static_cast<int64_t>(architecture_value(a, "crops")));
  t.image_tokens = std::max<int64_t>(0, static_cast<int64_t>(architecture_value(a, "image_tokens")));
  t.newline = architecture_value(a, "image_newline") != 0;
  return t;
}

bool tower_packs_attention(const ModelConfig& m) {
  if (m.vision_tower.empty()) return false;
  std::shared_ptr<const Architecture> tower;
  decode_architecture(m.vision_tower, m.vision_tower_args, tower);
  if (!tower) return false;
  for (const ArchStage* st : tower->stages())
    for (const auto& op : st->ops)
      if (op.kind == OpKind::Attention && op.packed) return true;
  return false;
}

int64_t vision_image_tokens(const ModelConfig& m) {
  if (m.vision_tower.empty()) return 0;
  std::shared_ptr<const Architecture> tower;
  decode_architecture(m.vision_tower, m.vision_tower_args, tower);
  if (!tower) return 0;
  return tower_spec(*tower).tokens_per_image();
}

ModelShape model_shape_of(const ModelConfig& m) {
  if (m.architecture.empty()) {
    ModelShape s = build_model_shape(m);
    if (!m.vision_tower.empty()) attach_vision_tower(s, m);
    return s;
  }
  std::shared_ptr<const Architecture> program;
  decode_architecture(m.architecture, m.architecture_args, program);
  if (!program) throw RangeError("model.architecture does not decode; validate the config first");
  return build_program_shape(std::move(program));
}

std::vector<std::string> architecture_hyperparameters(std::string_view name) {
  for (const auto& b : builtin_programs())
    if (b.name == name) return b.hyperparameters;
  return {};
}

std::vector<std::pair<std::string, std::string>> architecture_hf_keys(std::string_view name) {
  for (const auto& b : builtin_programs())
    if (b.name == name) return b.hf_keys;
  return {};
}

std::string compact_architecture(const std::string& text) {
  if (!document_guard_error(text, "model.architecture").empty()) return text;
  try {
    return ojson::parse(text).dump();
  } catch (const ojson::exception&) {
    return text;
  }
}

bool looks_like_architecture(std::string_view text) { return text.find("\"memsim_architecture\"") != std::string_view::npos; }

std::string set_architecture_arg_text(const std::string& args, const std::string& name, const std::string& text) {
  std::string out;
  size_t i = 0;
  while (i <= args.size()) {  // every entry but `name`'s, as written
    size_t j = args.find(',', i);
    if (j == std::string::npos) j = args.size();
    std::string item = args.substr(i, j - i);
    i = j + 1;
    const size_t eq = item.find('=');
    std::string key = item.substr(0, eq);
    key.erase(0, key.find_first_not_of(' '));
    if (const size_t end = key.find_last_not_of(' '); end != std::string::npos) key.erase(end + 1);
    if (key.empty() || key == name) continue;
    item.erase(0, item.find_first_not_of(' '));
    out += (out.empty() ? "" : ",") + item;
  }
  if (!text.empty()) out += (out.empty() ? "" : ",") + name + "=" + text;
  return out;
}

std::string set_architecture_arg(const std::string& args, const std::string& name, double value, double default_value) {
  if (value == default_value) return set_architecture_arg_text(args, name, "");
  char text[64];
  std::snprintf(text, sizeof text, "%.10g", value);
  return set_architecture_arg_text(args, name, text);
}

std::string default_lora_targets(const ModelConfig& m) {
  if (m.architecture.empty()) return {};
  std::shared_ptr<const Architecture> a;
  decode_architecture(m.architecture, m.architecture_args, a);
  return a && !a->lora_targets.empty() ? a->lora_targets : "all-linear";
}

double architecture_arg(const std::string& args, const std::string& name, double fallback) {
  size_t i = 0;
  while (i < args.size()) {
    size_t j = args.find(',', i);
    if (j == std::string::npos) j = args.size();
    const std::string item = args.substr(i, j - i);
    i = j + 1;
    const size_t eq = item.find('=');
    if (eq == std::string::npos) continue;
    std::string key = item.substr(0, eq);
    key.erase(0, key.find_first_not_of(' '));
    if (const size_t end = key.find_last_not_of(' '); end != std::string::npos) key.erase(end + 1);
    if (key != name) continue;
    const std::string text = item.substr(eq + 1);
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (end != text.c_str() && std::isfinite(v)) fallback = v;
  }
  return fallback;
}

double architecture_value(const Architecture& a, std::string_view name) {
  for (const auto& [k, v] : a.values)
    if (k == name) return v;
  return 0;
}

ModelShape build_program_shape(std::shared_ptr<const Architecture> a) {
  ModelShape s;
  auto params = [](const ArchStage& st, std::vector<ParamTensor>& out) {
    for (const auto& op : st.ops) {
      std::vector<const ArchTensor*> in;
      for (int32_t t : op.in) in.push_back(&st.tensors[t]);
      op_params(op, in, st.tensors[op.out].shape, out);
    }
  };
  params(a->embeddings, s.pre);
  if (a->blocks.size() == 1) {
    params(a->blocks[0], s.layer);
  } else {  // several kinds: each its own parameter list
    s.block_kinds.resize(a->blocks.size());
    for (size_t k = 0; k < a->blocks.size(); ++k) params(a->blocks[k], s.block_kinds[k]);
    s.kind_of_layer = a->kind_of_layer;
  }
  params(a->head, s.post);
  s.num_layers = a->repeat;
  s.num_dense_layers = a->repeat;
  s.params_per_layer = sum_numel(s.layer);
  int64_t total = add(sum_numel(s.pre), sum_numel(s.post));
  s.for_each_layer_kind([&](const std::vector<ParamTensor>& ts, int64_t n) { total = add(total, mul(sum_numel(ts), n)); });
  s.params_total = total;
  s.params_active_per_token = s.params_total;
  s.program = std::move(a);
  return s;
}

}  // namespace memsim
