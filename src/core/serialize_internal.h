// The pieces the config encoders share (serialize.cpp, links.cpp, hf_config.cpp): the walk over the field
// registry, the typed readers of one value, the visitors that read and write a Config, and the schema migration.
// Internal to the core's io files; nothing outside them includes it.
#pragma once
#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "choices.h"
#include "fields.h"
#include "json_read.h"
#include "serialize.h"

namespace memsim::serialize_detail {

using json = nlohmann::json;
using json_read::describe;
using json_read::valid_utf8;

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

// Calls the visitor's reader or writer for one field's type.
template <typename V>
void visit_field(const FieldSpec& f, Config& c, V& v) {
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

// Walks every field of the registry (fields.cpp) in its order.
template <typename V>
void visit_fields(Config& c, V& v) {
  for (const FieldSpec& f : fields()) visit_field(f, c, v);
}

inline std::pair<std::string, std::string> split_key(const std::string& key) {
  auto dot = key.find('.');
  return {key.substr(0, dot), key.substr(dot + 1)};
}

constexpr size_t kMaxStringBytes = 256;
// The data section's length lists (data.micro_batch_lengths, data.sample_lengths) hold hundreds of numbers.
constexpr size_t kMaxListBytes = 8192;
constexpr size_t kMaxProgramBytes = 65536;  // model.architecture: a model program as JSON text (ViT's is 4 KB)
constexpr size_t kMaxFragmentBytes = 64 * 1024;



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
    // A model program may be written inline, as the JSON object it is (architecture.h).
    if (v.is_object() && f == "model.architecture") return str(f, v.dump(), out);
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
    const size_t limit = f == "model.architecture" ? kMaxProgramBytes : f.rfind("data.", 0) == 0 ? kMaxListBytes : kMaxStringBytes;
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
  // A switch that was a boolean once (schema 1's switches, schema 2's peft.prepare_kbit) also takes 1 and 0, as the
  // boolean did in --set and in links.
  void tristate(const std::string& k, std::string& o) {
    if (k == key && (value == "1" || value == "0")) {
      found = true;
      o = value == "1" ? "true" : "false";
      return;
    }
    str(k, o);
  }
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

// Every flattened key, in the registry's order.
inline const std::vector<std::string>& all_keys() {
  static const std::vector<std::string> keys = [] {
    Config c;
    KeyLister l;
    visit_fields(c, l);
    return l.keys;
  }();
  return keys;
}

// A link's items, "key" = "value", in order.
using Pairs = std::vector<std::pair<std::string, std::string>>;

// Schema migration (serialize.cpp): false, with an error, for a schema this build cannot read; otherwise the
// document or the link's items are upgraded step by step to kConfigSchema.
bool check_schema(int version, std::vector<FieldError>& errors);
bool migrate(json& doc, int version, std::vector<FieldError>& errors);
bool migrate(Pairs& pairs, int version, std::vector<FieldError>& errors);
// One step of it, from schema `from` to `from + 1` (a link's items with an older schema's frozen defaults).
void migrate_step(Pairs& pairs, int from);

// A Hugging Face config.json, or memsim's model section, into `out` (hf_config.cpp).
void read_model_section(const json& src, ModelConfig& out, std::vector<FieldError>& errors,
                        std::vector<std::string>& notes);

}  // namespace memsim::serialize_detail
