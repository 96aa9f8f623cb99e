// The field registry: every config field declared once, with its key, type, allowed values, the schema version it
// arrived in, and the label and help the page shows. Its default is the member's initializer in config.h (the
// plain struct); everything else about a field comes from here:
// - JSON, the URL fragment, `--set KEY=VALUE` and `memsim-cli keys` (serialize.cpp walks the registry);
// - validation's integer ranges, number intervals and choice lists (validate.cpp check_registered);
// - the page's labels and help (ui/widgets.cpp);
// - the JSON Schema `memsim-cli schema` prints (docs/config.schema.json, checked as current by the CLI contract).
// Adding a field: a member with its default in config.h, a row in fields.cpp, and the code that models it.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "config.h"

namespace memsim {

// Inclusive bounds of an integer field.
struct IntRange {
  int64_t min;
  int64_t max;
};
inline constexpr IntRange kNoRange{INT64_MIN, INT64_MAX};

enum class FieldKind {
  Integer,   // int64_t, within `range`
  Number,    // double, within `number` where it is bounded
  Boolean,
  Text,      // free text (names, lists of modules or lengths, versions)
  Choice,    // a string among `choices`
  TriState,  // a string among auto, true, false: auto derives it (frameworks.cpp resolve())
  Enum,      // a C++ enum of config.h, written as one of `choices` in the enum's order
  TableId,   // a string naming a row of a table (tables.h), or "custom" for the GPU
};

// The interval of a Number field; min == max: any finite number.
struct NumberRange {
  double min = 0.0, max = 0.0;
  bool min_exclusive = false, max_exclusive = true;
  bool bounded() const { return min != max; }
  // "from 0 to below 1", "above 0 and below 1000000", "from 0 to 64"
  std::string words() const;
};

// Where a field lives in a Config; the alternative says its C++ type.
using FieldRef = std::variant<int64_t*, double*, bool*, std::string*, NormType*, PositionType*>;

struct FieldSpec {
  std::string_view key;                       // "section.name", as in JSON, links and --set
  FieldRef (*ref)(Config&);                   // the member it reads and writes
  FieldKind kind;
  IntRange range;                             // Integer: inclusive bounds (kNoRange: any int64)
  std::span<const std::string_view> choices;  // Choice, TriState, Enum: the allowed strings
  int since_schema;                           // the config schema (serialize.h kConfigSchema) it arrived in
  std::string_view label;                     // the page's label
  std::string_view help;                      // what it does to memory: the page's tooltip, the schema's description
  NumberRange number = {};                    // Number: the allowed interval

  std::string_view section() const { return key.substr(0, key.find('.')); }
  std::string_view name() const { return key.substr(key.find('.') + 1); }
};

// Every field, in the order of the config's sections and of their JSON.
std::span<const FieldSpec> fields();
// The field of `key` ("model.hidden_size"); nullptr for an unknown key.
const FieldSpec* find_field(std::string_view key);
// The ids a TableId field accepts (precision recipes, optimizers, GPUs), from their tables.
std::vector<std::string> table_ids(std::string_view key);

// The allowed string values of a choice field ("training.attention", ...), "auto" first where it applies; empty for
// other fields.
std::span<const std::string_view> choices(std::string_view field);
// A field's integer bounds; kNoRange for a field without them.
IntRange int_range(std::string_view field);
// Every integer field that has a range, by its key in sorted order (the worst-case search of
// tests/bench/worst_case.cpp walks them).
std::vector<std::string> ranged_fields();

// One field in words, for `memsim-cli keys --long`: "integer", "1 to 4096", "40", and its help.
struct FieldDescription {
  std::string key, type, allowed, default_value, help;
};
std::vector<FieldDescription> field_descriptions();

// JSON Schema (draft 2020-12) of a config file: every section and field with its type, allowed values, default
// (Config{}'s) and help. `memsim-cli schema` prints it; docs/config.schema.json is its checked-in copy.
std::string config_json_schema();

}  // namespace memsim
