// Links (serialize.h; README "Links"): the URL fragment in its short and full forms, percent-coding, the frozen
// defaults and presets links rest on, the checksum, and `--set`'s bare names.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "architecture.h"
#include "link_data.h"
#include "serialize.h"
#include "serialize_internal.h"

namespace memsim {

using namespace serialize_detail;

namespace {

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
// A short link:  memsim=3&model=llama-3.1-70b&framework=hf_trainer&method=lora&gpu=h200&c=7kq2m9
// - memsim=N starts it: the config schema N it is read with, and the promise that it ends with a checksum, so that a
//   link cut anywhere (at a field boundary too) is told from a whole one;
// - then only the fields that differ from schema N's frozen defaults (tests/golden/vN.defaults.json), by their bare
//   names where a name is unique among the schema's fields (hidden_size, not model.hidden_size);
// - model=ID, where it is shorter, stands for a catalogue model as frozen in tests/golden/vN.presets.json; the model
//   fields after it are the differences from that preset;
// - a program's argument list (architecture_args, vision_tower_args) edited from its preset's is written as the
//   arguments set: architecture_args~=target_length=128, each k=v taken out of the preset's list and appended, as the
//   page sets one, and "k=" taken out (a Whisper link then carries its one edited argument, not all eleven);
// - c= ends it: a checksum of everything before it.
// The full form (schema=N and every field, as every link was written before) is still read, without a checksum;
// a field it leaves out also takes schema N's frozen defaults.


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

// An argument list ("k=v,k2=v2") as its items, in order; false where an item has no '=' or an empty name (a
// trailing comma ends the list).
bool split_args(const std::string& args, Pairs& out) {
  out.clear();
  size_t pos = 0;
  while (pos < args.size()) {
    size_t end = args.find(',', pos);
    if (end == std::string::npos) end = args.size();
    const std::string item = args.substr(pos, end - pos);
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) return false;
    out.emplace_back(item.substr(0, eq), item.substr(eq + 1));
    pos = end + 1;
  }
  return true;
}

// `base` with each argument of `changes` set as the page sets one (set_architecture_arg_text): taken out of the list
// and appended with its new value, or only taken out where the value is empty ("k=": back to the program's default).
std::string merge_args(std::string base, const std::string& changes) {
  Pairs c;
  if (!split_args(changes, c)) return changes;
  for (const auto& [k, v] : c) base = set_architecture_arg_text(base, k, v);
  return base;
}

// The settings that turn `base` into `value` by merge_args: the base's arguments that value no longer has where
// they stood (each "k=" where value has none, else set again at the end), then value's tail; empty where value is
// not of that form (the list reordered by hand).
std::string args_changes(const std::string& base, const std::string& value) {
  Pairs b, v;
  if (base.empty() || !split_args(base, b) || !split_args(value, v)) return {};
  size_t kept = 0;
  std::vector<std::string> touched;
  for (const auto& kv : b) {
    if (kept < v.size() && v[kept] == kv) ++kept;
    else touched.push_back(kv.first);
  }
  std::string out;
  for (const std::string& k : touched)
    if (std::none_of(v.begin() + static_cast<std::ptrdiff_t>(kept), v.end(), [&](const auto& kv) { return kv.first == k; }))
      out += (out.empty() ? "" : ",") + k + "=";
  for (size_t i = kept; i < v.size(); ++i) out += (out.empty() ? "" : ",") + v[i].first + "=" + v[i].second;
  return !out.empty() && merge_args(base, out) == value ? out : std::string();
}

bool is_args_field(const std::string& full_key) {
  return full_key == "model.architecture_args" || full_key == "model.vision_tower_args";
}

// A link's items (schema `version`, without schema=, memsim= and c=) over the frozen defaults.
Parsed decode_items(Pairs items, int version, Parsed p) {
  const SchemaLinks* s = schema_links(version);
  // Bare names and model=ID as the link's own schema meant them.
  Pairs expanded;
  bool model_seen = false;
  const bool model_named = std::any_of(items.begin(), items.end(), [](const auto& kv) { return kv.first == "model"; });
  for (auto& [k, v] : items) {
    model_seen |= k == "model";
    if (k == "model") {
      const Pairs* preset = nullptr;
      if (s && s->presets.count(v)) preset = &s->presets.at(v);
      if (!preset) {
        p.errors.push_back({"model", "model: the link names the model \"" + v.substr(0, 40) +
                                         "\", which this memsim does not know (`memsim-cli presets` lists the ids)"});
        return p;
      }
      expanded.insert(expanded.end(), preset->begin(), preset->end());
    } else if (k.size() > 1 && k.back() == '~' && s && s->full_key.count(k.substr(0, k.size() - 1)) &&
               is_args_field(s->full_key.at(k.substr(0, k.size() - 1)))) {
      // Arguments set in the list so far: the preset's, or the schema's default.
      const std::string& full = s->full_key.at(k.substr(0, k.size() - 1));
      std::string base;
      for (const auto& kv : s->defaults)
        if (kv.first == full) base = kv.second;
      for (const auto& kv : expanded)
        if (kv.first == full) base = kv.second;
      Pairs settings, listed;
      if (!split_args(v, settings) || settings.size() > 512) {
        p.errors.push_back({full, k + ": the link sets \"" + v.substr(0, 60) + "\"; each setting is name=value (name= takes it out), at most 512"});
        return p;
      }
      if (model_named && !model_seen) {
        p.errors.push_back({full, k + ": the link sets arguments before model=, which sets the list they change"});
        return p;
      }
      if (!split_args(base, listed)) {
        p.errors.push_back({full, k + ": the link changes \"" + base.substr(0, 60) + "\", which is not a list of name=value"});
        return p;
      }
      expanded.emplace_back(full, merge_args(base, v));
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
  for (size_t i = 0; i < values.size(); ++i) {
    const std::string& base = (is_model(i) ? *model_base : b.defaults)[i];
    if (values[i] == base) continue;
    const std::string changes = is_args_field(keys[i]) ? args_changes(base, values[i]) : std::string();
    if (!changes.empty() && changes.size() + 1 < values[i].size()) items.emplace_back(b.names[i] + "~", changes);
    else items.emplace_back(b.names[i], values[i]);
  }
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
  if (const FieldSpec* field = find_field(key)) visit_field(*field, tmp, s);  // the one field, not a walk over all
  if (!s.found)
    errors.push_back({key.substr(0, 60), "unknown key \"" + key.substr(0, 60) + "\"; `memsim-cli keys` lists them"});
  if (errors.empty()) c = tmp;
  return errors;
}

}  // namespace memsim
