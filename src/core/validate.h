// Checks a config before simulation. Every problem names its field and what is allowed, so the UI can show
// it next to the input and the CLI can print it in one line.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config.h"

namespace memsim {

struct FieldError {
  std::string field;    // flattened key, as in the URL fragment: "model.hidden_size"
  std::string message;  // full sentence naming the field and the allowed values
};

// Inclusive bounds of every integer field. Shared with the deserializer so both speak the same ranges.
struct IntRange {
  int64_t min;
  int64_t max;
};
IntRange int_range(const std::string& field);
// Every integer field that has a range, by its key (the worst-case search of tests/bench/worst_case.cpp walks them).
std::vector<std::string> ranged_fields();

std::vector<FieldError> validate(const Config& c);

}  // namespace memsim
