// Reading JSON documents (json_read.h) and the guards every decoder of the core applies first: size, nesting
// depth, UTF-8 (nlohmann throws on invalid UTF-8; the reader catches it).
#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>

#include "json_read.h"
#include "serialize.h"

namespace memsim {

using json = nlohmann::json;

namespace {

constexpr size_t kMaxDocumentBytes = 8 * 1024 * 1024;  // far above any real config.json (a few KB)
constexpr int kMaxDepth = 64;

// ---------------------------------------------------------------------------------------------------------
// [SECTION] Parsing guards: size, nesting depth, UTF-8 (nlohmann throws on invalid UTF-8; we catch it)
// ---------------------------------------------------------------------------------------------------------

int nesting_depth(std::string_view text) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escape = false;
  for (char ch : text) {
    if (in_string) {
      if (escape) escape = false;
      else if (ch == '\\') escape = true;
      else if (ch == '"') in_string = false;
      continue;
    }
    if (ch == '"') in_string = true;
    else if (ch == '{' || ch == '[') max_depth = std::max(max_depth, ++depth);
    else if (ch == '}' || ch == ']') --depth;
  }
  return max_depth;
}

}  // namespace

std::string document_guard_error(std::string_view text, const std::string& what) {
  if (text.size() > kMaxDocumentBytes)
    return what + " is " + std::to_string(text.size() / (1024 * 1024)) +
           " MiB; at most 8 MiB is accepted (a config.json is a few KB)";
  // Before any recursive parse or dump: nlohmann recurses once per level, so deep nesting would overflow the stack.
  if (nesting_depth(text) > kMaxDepth) return what + " is nested more than 64 levels deep";
  return "";
}

// ---------------------------------------------------------------------------------------------------------
// [SECTION] Reading JSON documents (json_read.h), shared by every decoder of the core
// ---------------------------------------------------------------------------------------------------------

namespace json_read {

std::string describe(const json& v) {
  std::string s = v.dump(-1, ' ', true, json::error_handler_t::replace);
  return s.size() > 40 ? s.substr(0, 40) + "..." : s;
}

// Strict UTF-8 (no overlongs, surrogates or code points above U+10FFFF), as JSON output requires.
bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    const size_t len = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    uint32_t cp = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
    for (size_t k = 1; k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += len;
  }
  return true;
}

bool parse_document(std::string_view text, const std::string& what, json& out, std::vector<FieldError>& errors) {
  if (std::string e = document_guard_error(text, what); !e.empty()) {
    errors.push_back({what, std::move(e)});
    return false;
  }
  try {
    out = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    std::string msg = e.what();
    if (auto p = msg.find("parse error"); p != std::string::npos) msg = msg.substr(p);
    errors.push_back({what, what + " is not valid JSON: " + msg});
    return false;
  }
  if (!out.is_object()) {
    errors.push_back({what, what + " must be a JSON object"});
    return false;
  }
  return true;
}

}  // namespace json_read

}  // namespace memsim
