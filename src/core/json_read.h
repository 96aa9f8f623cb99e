// Reading JSON documents, for the core's decoders (serialize.cpp, deepspeed_io.cpp, accelerate_io.cpp): the guards
// every document passes before nlohmann parses it, and a value shown in an error line. Internal to the core.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "validate.h"  // FieldError

namespace memsim::json_read {

// A value as an error line shows it: compact JSON, invalid UTF-8 replaced, cut at 40 characters.
std::string describe(const nlohmann::json& v);
// Strict UTF-8 (no overlongs, surrogates or code points above U+10FFFF), as JSON output requires.
bool valid_utf8(const std::string& s);
// `text` as a JSON object, after the size and nesting guards (document_guard_error); otherwise one error naming
// `what` and false.
bool parse_document(std::string_view text, const std::string& what, nlohmann::json& out, std::vector<FieldError>& errors);

}  // namespace memsim::json_read
