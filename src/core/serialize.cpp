// Config JSON in and out, --set's settings diff, and the migration of every schema that has shipped
// (serialize.h). The fragment is links.cpp's, the Hugging Face model section hf_config.cpp's, the result JSON
// result_to_json.cpp's; they share serialize_internal.h.
#include "serialize.h"

#include "serialize_internal.h"

namespace memsim {

using namespace serialize_detail;
using json_read::parse_document;

namespace {

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

bool schema_readable(int version, std::vector<FieldError>& errors) {
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

// Schema 3 made peft.prepare_kbit a switch: auto (PEFT's prepare_model_for_kbit_training where the framework calls
// it, not under TRL's SFTTrainer from 0.26, Unsloth, torchtune or litgpt; frameworks.cpp) / true / false, auto the
// default. Schema 2 had a boolean that defaulted to true: a schema-2 config that sets it keeps its value (the reader
// takes a JSON boolean for true and false), and one whose peft section leaves it out meant true. A schema-2 link
// that leaves it out takes tests/golden/v2.defaults.json's true before this step, so nothing is left to do there.
// Where the cast can do nothing (no PEFT method, no quantized base, or GPTQ's, which peft leaves alone), an old true
// becomes auto: the same result, and a config or link written again from it does not carry prepare_kbit=true. An
// unknown method or quantization (a JSON section that leaves it to the base) keeps true.
bool kbit_cast_idle(const std::string& method, const std::string& quantization) {
  return method == "none" || quantization == "none" || quantization == "gptq";
}

void migrate_2_to_3(json& doc) {
  auto peft = doc.find("peft");
  if (peft == doc.end() || !peft->is_object()) return;  // no PEFT section: the base's values, as before
  auto it = peft->find("prepare_kbit");
  if (it == peft->end() || it->is_null()) (*peft)["prepare_kbit"] = "true";
  else if (it->is_boolean()) *it = it->get<bool>() ? "true" : "false";
  const auto text = [&](const char* key) {
    auto f = peft->find(key);
    return f != peft->end() && f->is_string() ? f->get<std::string>() : std::string("?");
  };
  if (kbit_cast_idle(text("method"), text("base_quantization")) && (*peft)["prepare_kbit"] == "true")
    (*peft)["prepare_kbit"] = "auto";
}
// A short link's pairs hold every field by now (decode_items fills them from the frozen defaults first); a full-form
// link's may leave one to the defaults, whose method and quantization are none.
void migrate_2_to_3(std::vector<std::pair<std::string, std::string>>& pairs) {
  std::string method = "none", quantization = "none";
  for (const auto& [k, v] : pairs) {
    if (k == "peft.method") method = v;
    if (k == "peft.base_quantization") quantization = v;
  }
  for (auto& [k, v] : pairs) {
    if (k != "peft.prepare_kbit") continue;
    if (v == "1" || v == "0") v = v == "1" ? "true" : "false";  // Reader::boolean's
    if (v == "true" && kbit_cast_idle(method, quantization)) v = "auto";
  }
}

// Upgrades `doc` (a JSON document or a link's pairs) from schema `from` to `from + 1`.
template <typename Doc>
void migrate_doc_step(Doc& doc, int from) {
  switch (from) {
    case 1:
      migrate_1_to_2(doc);
      break;
    case 2:
      migrate_2_to_3(doc);
      break;
  }
}

// Returns false (with an error) for versions this build cannot read. `Doc` is a JSON document or a link's pairs.
template <typename Doc>
bool migrate_doc(Doc& doc, int version, std::vector<FieldError>& errors) {
  if (!schema_readable(version, errors)) return false;
  for (int v = version; v < kConfigSchema; ++v) migrate_doc_step(doc, v);
  return true;
}

}  // namespace

namespace serialize_detail {
bool check_schema(int version, std::vector<FieldError>& errors) { return schema_readable(version, errors); }
bool migrate(json& doc, int version, std::vector<FieldError>& errors) { return migrate_doc(doc, version, errors); }
bool migrate(Pairs& pairs, int version, std::vector<FieldError>& errors) { return migrate_doc(pairs, version, errors); }
void migrate_step(Pairs& pairs, int from) { migrate_doc_step(pairs, from); }
}  // namespace serialize_detail

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

}  // namespace memsim
