// A reader of the flat YAML that `accelerate config` writes: one level of nested mappings (fsdp_config, ...), lists of
// scalars (block "- x" lines or a one-line [a, b]), PyYAML's resolution of plain scalars (YAML 1.1: yes/no/on/off are
// booleans, 010 stays text rather than octal, 1e5 is text and 1.0e+5 a float), quoted strings and comments. Anything
// else (anchors, aliases, tags, block scalars, flow mappings other than {}, several documents, tabs, a key given
// twice) is refused with its line and key, never guessed. tests/yaml/yaml_differential.py compares what it reads
// with Debian's python3-yaml (yaml.safe_load) over a corpus of Accelerate configs and of scalars.
#pragma once
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "validate.h"

namespace memsim::yaml_subset {

constexpr size_t kMaxLines = 20000;           // an Accelerate config has about 30
constexpr size_t kMaxEntries = 2000;          // keys and list items, all levels together
constexpr size_t kMaxScalarBytes = 4096;
constexpr int64_t kMaxExactInteger = int64_t{1} << 53;  // integers a double holds exactly

// Reads `text` into `out` (an object). On failure returns false and sets `error`: the field is the key path
// ("fsdp_config.fsdp_version") or `what`, the message "<what>, line N (path): reason".
bool parse(std::string_view text, const char* what, nlohmann::json& out, FieldError& error);

}  // namespace memsim::yaml_subset
