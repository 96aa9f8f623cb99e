#include "catalog.h"

#include <algorithm>
#include <cctype>
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
      if (auto a = m.find("hf_aliases"); a != m.end() && a->is_array())
        for (const auto& alias : *a)
          if (alias.is_string()) p.hf_aliases.push_back(alias.get<std::string>());
      p.generated_from = str(doc, "source");
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

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

// Lower case without the separators people write differently ("Llama-3.1-8B", "llama 3.1 8b", "llama3.1_8b").
std::string squeezed(std::string_view s) {
  std::string out;
  for (char ch : s)
    if (ch != '-' && ch != '_' && ch != '.' && ch != '/' && ch != ' ') out += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

// What a search looks in, built once per preset.
struct Haystack {
  std::string text, squeezed;
  std::vector<std::string> exact;  // id, name, HF id and aliases, lower case
  std::vector<std::string> starts; // name and HF repository names (without the organisation), lower case
};

const std::vector<Haystack>& haystacks() {
  static const std::vector<Haystack> all = [] {
    std::vector<Haystack> out;
    for (const auto& p : model_presets()) {
      Haystack h;
      h.text = lower(p.id + " " + p.name + " " + p.family + " " + p.hf_id);
      for (const auto& a : p.hf_aliases) {
        h.text += ' ';
        h.text += lower(a);
      }
      h.squeezed = squeezed(h.text);
      h.exact = {lower(p.id), lower(p.name)};
      h.starts = {lower(p.name)};
      for (const std::string* hf : {&p.hf_id}) {
        if (hf->empty()) continue;
        h.exact.push_back(lower(*hf));
        h.starts.push_back(lower(hf->substr(hf->find('/') == std::string::npos ? 0 : hf->find('/') + 1)));
      }
      for (const auto& a : p.hf_aliases) {
        h.exact.push_back(lower(a));
        h.starts.push_back(lower(a.substr(a.find('/') == std::string::npos ? 0 : a.find('/') + 1)));
      }
      out.push_back(std::move(h));
    }
    return out;
  }();
  return all;
}

}  // namespace

std::vector<const ModelPreset*> search_model_presets(std::string_view query) {
  const std::string q = lower(query);
  std::vector<std::string> words;
  size_t pos = 0;
  while (pos < q.size()) {
    size_t end = q.find_first_of(" \t", pos);
    if (end == std::string::npos) end = q.size();
    if (end > pos) words.push_back(q.substr(pos, end - pos));
    pos = end + 1;
  }
  std::string whole;  // the query without surrounding blanks, for the exact and prefix ranks
  for (size_t i = 0; i < words.size(); ++i) {
    if (i) whole += ' ';
    whole += words[i];
  }
  const auto& presets = model_presets();
  const auto& hay = haystacks();
  std::vector<std::pair<int, const ModelPreset*>> found;
  for (size_t i = 0; i < presets.size(); ++i) {
    const Haystack& h = hay[i];
    bool all = true;
    for (const auto& w : words) {
      if (h.text.find(w) != std::string::npos) continue;
      const std::string sw = squeezed(w);
      if (!sw.empty() && h.squeezed.find(sw) != std::string::npos) continue;
      all = false;
      break;
    }
    if (!all) continue;
    int rank = 2;
    if (!whole.empty()) {
      if (std::find(h.exact.begin(), h.exact.end(), whole) != h.exact.end()) rank = 0;
      else
        for (const auto& s : h.starts)
          if (s.rfind(whole, 0) == 0) rank = 1;
    }
    found.emplace_back(rank, &presets[i]);
  }
  // Within a rank: the hand-collected entries (cited and checked one by one) before the generated ones, and, for a
  // search, the closest name first: "Llama-3.1-8B" before "Llama-3.1-8B-Instruct" for "llama3.1 8b".
  const bool searching = !whole.empty();
  std::stable_sort(found.begin(), found.end(), [searching](const auto& a, const auto& b) {
    if (a.first != b.first) return a.first < b.first;
    const bool ga = !a.second->generated_from.empty(), gb = !b.second->generated_from.empty();
    if (ga != gb) return gb;
    return searching && a.second->name.size() < b.second->name.size();
  });
  std::vector<const ModelPreset*> out;
  out.reserve(found.size());
  for (const auto& f : found) out.push_back(f.second);
  return out;
}

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
