#include "catalog.h"

#include <nlohmann/json.hpp>

#include "serialize.h"

namespace memsim {

using json = nlohmann::json;

namespace {

std::string str(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

int64_t count(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : -1;
}

std::vector<ModelPreset> load() {
  std::vector<ModelPreset> out;
  for (std::string_view text : catalog_model_files()) {
    json doc = json::parse(text.begin(), text.end(), nullptr, false);
    if (doc.is_discarded() || !doc.contains("models")) continue;  // the catalogue test reports such a file
    for (const auto& m : doc["models"]) {
      ModelPreset p;
      p.id = str(m, "id");
      p.name = str(m, "name");
      p.family = str(doc, "family");
      p.hf_id = str(m, "hf_id");
      p.params_published = count(m, "params_published");
      p.params_source = str(m, "params_source");
      p.params_expected = m.contains("params_expected") ? count(m, "params_expected") : p.params_published;
      p.params_expected_why = str(m, "params_expected_why");
      p.config_source = str(m, "config_source");
      p.notes = str(m, "notes");
      Parsed parsed = model_from_hf_json(m.value("config", json::object()).dump());
      if (!parsed.ok) {
        p.supported = false;
        p.unsupported_reason = parsed.errors.empty() ? "the preset does not load" : parsed.errors[0].message;
      } else {
        p.model = parsed.config.model;
        p.model.name = p.name;
      }
      out.push_back(std::move(p));
    }
  }
  return out;
}

}  // namespace

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> presets = load();
  return presets;
}

const ModelPreset* find_model_preset(std::string_view id) {
  for (const auto& p : model_presets())
    if (p.id == id) return &p;
  return nullptr;
}

}  // namespace memsim
