// Checks a config before simulation. Every problem names its field and what is allowed, so the UI can show
// it next to the input and the CLI can print it in one line.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config.h"
#include "fields.h"  // IntRange, int_range(), ranged_fields(): the ranges live in the field registry

namespace memsim {

struct FieldError {
  std::string field;    // flattened key, as in the URL fragment: "model.hidden_size"
  std::string message;  // full sentence naming the field and the allowed values
};

std::vector<FieldError> validate(const Config& c);

}  // namespace memsim
