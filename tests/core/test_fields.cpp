// The field registry (core/fields.h): each row agrees with the member it names, its default with its own rules,
// its schema version with the frozen link data, and validate() enforces what it declares.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <type_traits>
#include <variant>

#include "core/fields.h"
#include "core/link_data.h"
#include "core/serialize.h"
#include "core/validate.h"

using namespace memsim;

namespace {

bool kind_fits_member(FieldKind kind, const FieldRef& member) {
  return std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, int64_t>) return kind == FieldKind::Integer;
        else if constexpr (std::is_same_v<T, double>) return kind == FieldKind::Number;
        else if constexpr (std::is_same_v<T, bool>) return kind == FieldKind::Boolean;
        else if constexpr (std::is_same_v<T, std::string>)
          return kind == FieldKind::Text || kind == FieldKind::Choice || kind == FieldKind::TriState ||
                 kind == FieldKind::TableId;
        else return kind == FieldKind::Enum;
      },
      member);
}

bool has_error_on(const std::vector<FieldError>& errors, std::string_view field) {
  for (const auto& e : errors)
    if (e.field == field) return true;
  return false;
}

}  // namespace

TEST_CASE("every registry row names a distinct member of its kind, with a label and help") {
  Config c;
  std::set<std::string_view> keys;
  std::set<const void*> members;
  const std::set<std::string_view> sections = {"model", "training", "peft", "parallel", "hardware", "data", "versions"};
  for (const FieldSpec& f : fields()) {
    INFO(f.key);
    CHECK(keys.insert(f.key).second);
    CHECK(sections.count(f.section()) == 1);
    const FieldRef member = f.ref(c);
    CHECK(members.insert(std::visit([](auto* p) { return static_cast<const void*>(p); }, member)).second);
    CHECK(kind_fits_member(f.kind, member));
    CHECK_FALSE(f.label.empty());
    CHECK(f.help.size() > 10);
    CHECK(f.help.back() == '.');
    CHECK((f.since_schema >= 1 && f.since_schema <= kConfigSchema));
    const bool listed = f.kind == FieldKind::Choice || f.kind == FieldKind::TriState || f.kind == FieldKind::Enum;
    CHECK(listed == !f.choices.empty());
    if (f.kind == FieldKind::Integer) CHECK(f.range.min <= f.range.max);
    if (f.kind != FieldKind::Number) CHECK_FALSE(f.number.bounded());
    CHECK(find_field(f.key) == &f);
  }
  CHECK(find_field("model.nope") == nullptr);
  // serialize.cpp walks the registry: its keys are these, in this order.
  std::vector<std::string> registry_keys;
  for (const FieldSpec& f : fields()) registry_keys.emplace_back(f.key);
  CHECK(field_keys() == registry_keys);
}

TEST_CASE("every default lies within its field's range and choices") {
  const Config defaults;
  CHECK(validate(defaults).empty());
  Config c;
  for (const FieldSpec& f : fields()) {
    INFO(f.key);
    const FieldRef member = f.ref(c);
    if (f.kind == FieldKind::Integer) {
      const int64_t v = *std::get<int64_t*>(member);
      CHECK((v >= f.range.min && v <= f.range.max));
    }
    if (f.kind == FieldKind::Choice || f.kind == FieldKind::TriState) {
      const std::string& v = *std::get<std::string*>(member);
      bool found = false;
      for (std::string_view choice : f.choices) found |= choice == v;
      CHECK(found);
    }
    if (f.kind == FieldKind::TableId) {
      const std::vector<std::string> ids = table_ids(f.key);
      CHECK(std::find(ids.begin(), ids.end(), *std::get<std::string*>(member)) != ids.end());
    }
  }
}

TEST_CASE("a field's schema version is the first frozen schema whose defaults name it") {
  std::map<int, nlohmann::json> frozen;
  for (const LinkDataFile& file : link_data_files())
    if (file.kind == "defaults") frozen[file.schema] = nlohmann::json::parse(file.text);
  REQUIRE(frozen.size() == static_cast<size_t>(kConfigSchema));
  for (const FieldSpec& f : fields()) {
    INFO(f.key);
    int first = 0;
    for (const auto& [schema, doc] : frozen) {
      const std::string section(f.section()), name(f.name());
      if (!first && doc.contains(section) && doc[section].contains(name)) first = schema;
    }
    CHECK(f.since_schema == first);
  }
}

TEST_CASE("validate() refuses a value just outside every declared range and list, naming the field") {
  for (const FieldSpec& f : fields()) {
    INFO(f.key);
    std::vector<std::function<void(Config&)>> outside;
    if (f.kind == FieldKind::Integer && f.range.min != kNoRange.min) {
      outside.push_back([&](Config& c) { *std::get<int64_t*>(f.ref(c)) = f.range.max + 1; });
      outside.push_back([&](Config& c) { *std::get<int64_t*>(f.ref(c)) = f.range.min - 1; });
    }
    if (f.kind == FieldKind::Number && f.number.bounded()) {
      outside.push_back([&](Config& c) { *std::get<double*>(f.ref(c)) = f.number.max + (f.number.max_exclusive ? 0 : 1); });
      outside.push_back([&](Config& c) { *std::get<double*>(f.ref(c)) = f.number.min - (f.number.min_exclusive ? 0 : 1); });
    }
    if (f.kind == FieldKind::Choice || f.kind == FieldKind::TriState)
      outside.push_back([&](Config& c) { *std::get<std::string*>(f.ref(c)) = "not_a_choice"; });
    if (f.kind == FieldKind::TableId)
      outside.push_back([&](Config& c) { *std::get<std::string*>(f.ref(c)) = "not_an_id"; });
    for (const auto& set : outside) {
      Config c;
      set(c);
      CHECK(has_error_on(validate(c), f.key));
    }
  }
}
