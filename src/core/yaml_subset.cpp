// The flat YAML subset reader (yaml_subset.h).
#include "yaml_subset.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

namespace memsim::yaml_subset {

namespace {

using json = nlohmann::json;

struct YamlLine {
  size_t number;        // 1-based
  size_t indent;        // leading spaces
  std::string_view body;  // the rest of the line, trailing spaces kept
};

struct YamlReader {
  const char* document = "";  // the document, as messages name it ("the Accelerate config")
  std::vector<YamlLine> lines;
  size_t entries = 0;
  FieldError error;
  bool failed = false;

  bool fail(size_t line, const std::string& path, const std::string& what) {
    if (failed) return false;
    failed = true;
    error.field = path.empty() ? document : path;
    error.message = std::string(document) + ", line " + std::to_string(line) +
                    (path.empty() ? "" : " (" + path.substr(0, 80) + ")") + ": " + what;
    return false;
  }

  static std::string_view trim(std::string_view s) {
    while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
    while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
    return s;
  }
  // What may follow a value: nothing, or a comment after at least one space.
  static bool only_comment(std::string_view rest) {
    if (rest.empty()) return true;
    if (rest.front() != ' ') return false;
    rest = trim(rest);
    return rest.empty() || rest.front() == '#';
  }

  // Splits the text into content lines; rejects tabs, control characters, directives and more than one document.
  bool split(std::string_view text) {
    size_t number = 0, pos = 0;
    bool content = false, marker = false;
    while (pos < text.size()) {
      size_t end = text.find('\n', pos);
      if (end == std::string_view::npos) end = text.size();
      std::string_view line = text.substr(pos, end - pos);
      pos = end + 1;
      ++number;
      if (number > kMaxLines)
        return fail(number, "", "more than " + std::to_string(kMaxLines) + " lines; an Accelerate config has about 30");
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      for (char ch : line) {
        const unsigned char u = static_cast<unsigned char>(ch);
        if (ch == '\t') return fail(number, "", "a tab character; this reader accepts spaces only (YAML indents with spaces)");
        if (u < 0x20 || u == 0x7F) return fail(number, "", "a control character (byte " + std::to_string(u) + ")");
      }
      size_t indent = 0;
      while (indent < line.size() && line[indent] == ' ') ++indent;
      std::string_view body = line.substr(indent);
      if (body.empty() || body.front() == '#') continue;
      if (indent == 0 && (body.substr(0, 3) == "---" || body.substr(0, 3) == "...") &&
          (body.size() == 3 || body[3] == ' ')) {
        if (body.substr(0, 3) == "..." || content || marker || !only_comment(body.substr(3)))
          return fail(number, "", "several YAML documents (--- or ...); an Accelerate config is one mapping");
        marker = true;
        continue;
      }
      if (indent == 0 && body.front() == '%') return fail(number, "", "YAML directives (%YAML, %TAG) are not accepted");
      content = true;
      lines.push_back({number, indent, body});
    }
    return true;
  }

  // Indicators that start YAML features this reader refuses, with the reason.
  bool refuse_indicator(std::string_view v, size_t line, const std::string& path) {
    switch (v.front()) {
      case '&': return fail(line, path, "YAML anchors (&) are not accepted; write the value itself");
      case '*': return fail(line, path, "YAML aliases (*) are not accepted; write the value itself");
      case '!': return fail(line, path, "YAML tags (!) are not accepted");
      case '|': case '>': return fail(line, path, "block scalars (| or >) are not accepted; write the value on one line");
      case '?': return fail(line, path, "complex keys (?) are not accepted");
      case '@': case '`': case '%': return fail(line, path, std::string("a plain value may not start with ") + v.front() + "; quote it");
      default: return true;
    }
  }

  // One scalar: a quoted string, or a plain scalar resolved as PyYAML does (null, bool, int, float, string).
  // `rest` receives what follows a quoted scalar.
  bool scalar(std::string_view v, size_t line, const std::string& path, json& out, std::string_view* rest) {
    if (rest) *rest = {};
    if (v.empty()) return out = nullptr, true;
    if (v.front() == '"' || v.front() == '\'') {
      const char q = v.front();
      std::string s;
      size_t i = 1;
      for (;; ++i) {
        if (i >= v.size()) return fail(line, path, "a quoted value must end on the same line");
        const char ch = v[i];
        if (q == '\'' && ch == '\'') {
          if (i + 1 < v.size() && v[i + 1] == '\'') { s += '\''; ++i; continue; }
          break;
        }
        if (q == '"' && ch == '"') break;
        if (q == '"' && ch == '\\') {
          if (++i >= v.size()) return fail(line, path, "a quoted value must end on the same line");
          const char e = v[i];
          int hex = 0;
          switch (e) {
            case '"': s += '"'; break;
            case '\\': s += '\\'; break;
            case '/': s += '/'; break;
            case 'n': s += '\n'; break;
            case 't': s += '\t'; break;
            case 'r': s += '\r'; break;
            case 'b': s += '\b'; break;
            case 'f': s += '\f'; break;
            case 'x': hex = 2; break;
            case 'u': hex = 4; break;
            case 'U': hex = 8; break;
            default: return fail(line, path, std::string("the escape \\") + e + " is not accepted");
          }
          if (hex) {
            if (i + hex >= v.size()) return fail(line, path, "a \\x, \\u or \\U escape needs its hex digits");
            uint32_t cp = 0;
            for (int k = 1; k <= hex; ++k) {
              const char h = v[i + k];
              const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
              if (d < 0) return fail(line, path, "a \\x, \\u or \\U escape needs its hex digits");
              cp = cp * 16 + static_cast<uint32_t>(d);
            }
            i += hex;
            if (cp == 0 || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
              return fail(line, path, "an escape names no valid character (NUL, a surrogate or beyond U+10FFFF)");
            if (cp < 0x80) s += static_cast<char>(cp);
            else if (cp < 0x800) s += static_cast<char>(0xC0 | (cp >> 6)), s += static_cast<char>(0x80 | (cp & 0x3F));
            else if (cp < 0x10000)
              s += static_cast<char>(0xE0 | (cp >> 12)), s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F)),
                  s += static_cast<char>(0x80 | (cp & 0x3F));
            else
              s += static_cast<char>(0xF0 | (cp >> 18)), s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F)),
                  s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), s += static_cast<char>(0x80 | (cp & 0x3F));
          }
          continue;
        }
        s += ch;
      }
      if (s.size() > kMaxScalarBytes)
        return fail(line, path, "a value longer than " + std::to_string(kMaxScalarBytes) + " bytes");
      if (rest) *rest = v.substr(i + 1);
      else if (!only_comment(v.substr(i + 1))) return fail(line, path, "text after the closing quote");
      out = s;
      return true;
    }
    if (!refuse_indicator(v, line, path)) return false;
    if (v.front() == '[' || v.front() == '{' || v.front() == ']' || v.front() == '}' || v.front() == ',')
      return fail(line, path, "nested [ ] or { } are not accepted here");
    if ((v.front() == '-' && (v.size() == 1 || v[1] == ' ')))
      return fail(line, path, "a list item (- ) where a value was expected");
    if (v.size() > kMaxScalarBytes)
      return fail(line, path, "a value longer than " + std::to_string(kMaxScalarBytes) + " bytes");
    if (v.find(": ") != std::string_view::npos || v.back() == ':')
      return fail(line, path, "a plain value may not contain \": \"; quote it, or put a nested key on its own line");
    const std::string s(v);
    if (s == "~" || s == "null" || s == "Null" || s == "NULL") return out = nullptr, true;
    static const std::set<std::string> yes = {"yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"};
    static const std::set<std::string> no = {"no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"};
    if (yes.count(s)) return out = true, true;
    if (no.count(s)) return out = false, true;
    return number_or_text(s, line, path, out);
  }

  // PyYAML's timestamp: YYYY-MM-DD, or YYYY-M-D then T or spaces and H:MM:SS (yaml/resolver.py; what follows the
  // seconds, fraction and zone, is not looked at).
  static bool looks_like_timestamp(std::string_view s) {
    auto digits = [&](size_t& i, size_t lo, size_t hi) {
      size_t n = 0;
      while (i < s.size() && n < hi && s[i] >= '0' && s[i] <= '9') ++i, ++n;
      return n >= lo;
    };
    size_t i = 0;
    if (!digits(i, 4, 4) || i >= s.size() || s[i++] != '-') return false;
    const size_t month = i;
    if (!digits(i, 1, 2) || i >= s.size() || s[i++] != '-') return false;
    const size_t day = i;
    if (!digits(i, 1, 2)) return false;
    if (i == s.size()) return day - month == 3 && i - day == 2;  // the date alone needs two-digit month and day
    if (s[i] == 'T' || s[i] == 't') ++i;
    else if (s[i] == ' ') while (i < s.size() && s[i] == ' ') ++i;
    else return false;
    return digits(i, 1, 2) && i < s.size() && s[i++] == ':' && digits(i, 2, 2) && i < s.size() && s[i++] == ':' &&
           digits(i, 2, 2);
  }

  // PyYAML's resolution of a plain scalar that is not null or a bool (yaml/resolver.py, YAML 1.1): ints in
  // decimal, octal (010), hex (0x1F) and binary (0b101) with underscores allowed, floats that have a dot (a signed
  // exponent only: 1.0e+5, while 1e5 and 2.5e10 stay text), and the rest text. What JSON has no value for, or no
  // config field would mean, is refused rather than read differently: base-60 numbers (1:30), dates
  // (2024-05-01), infinity and NaN, and integers beyond 2^53.
  bool number_or_text(const std::string& s, size_t line, const std::string& path, json& out) {
    auto all_of = [](std::string_view t, const char* set) {
      return !t.empty() && t.find_first_not_of(set) == std::string_view::npos;
    };
    auto digit = [](char c) { return c >= '0' && c <= '9'; };
    const size_t k = s[0] == '-' || s[0] == '+' ? 1 : 0;
    const bool negative = s[0] == '-';
    const std::string_view body = std::string_view(s).substr(k);
    auto integer = [&](std::string_view digits, int base) {
      int64_t value = 0;
      size_t count = 0;
      for (char c : digits) {
        if (c == '_') continue;
        const int d = digit(c) ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c - 'A' + 10;
        value = value * base + d, ++count;
        if (value > kMaxExactInteger)
          return fail(line, path, "the number " + s.substr(0, 40) + " is beyond 2^53; no field of a config is that large");
      }
      if (count == 0) return fail(line, path, "the number " + s.substr(0, 40) + " has no digits");
      out = negative ? -value : value;
      return true;
    };
    if (body.size() > 2 && body.substr(0, 2) == "0b" && all_of(body.substr(2), "01_")) return integer(body.substr(2), 2);
    if (body.size() > 2 && body.substr(0, 2) == "0x" && all_of(body.substr(2), "0123456789abcdefABCDEF_"))
      return integer(body.substr(2), 16);
    if (body.size() > 1 && body[0] == '0' && all_of(body.substr(1), "01234567_")) return integer(body.substr(1), 8);
    if (body == "0" || (!body.empty() && body[0] >= '1' && body[0] <= '9' && all_of(body, "0123456789_")))
      return integer(body, 10);
    // Base 60 ([1-9][0-9_]*(:[0-5]?[0-9])+, and floats of that form) and dates, as PyYAML's resolver matches them.
    const size_t colon = body.find(':');
    if (colon != std::string_view::npos && colon > 0 && digit(body[0]) && all_of(body.substr(0, colon), "0123456789_") &&
        all_of(body.substr(colon), "0123456789:._")) {
      bool base60 = true;
      for (size_t i = colon; i < body.size() && base60;) {
        if (body[i] == '.') break;
        size_t j = i + 1, n = 0;
        while (j < body.size() && digit(body[j])) ++j, ++n;
        base60 = body[i] == ':' && (n == 1 || (n == 2 && body[i + 1] <= '5'));
        i = j;
      }
      if (base60 && body[0] != '0')
        return fail(line, path, "PyYAML reads " + s.substr(0, 40) + " as a base-60 number; quote it, or write the number");
    }
    if (k == 0 && looks_like_timestamp(s)) return fail(line, path, "PyYAML reads " + s.substr(0, 40) + " as a date; quote it");
    // Floats: [-+]?[0-9][0-9_]*.[0-9_]*([eE][-+][0-9]+)? or, unsigned, .[0-9][0-9_]*([eE][-+][0-9]+)?
    if (body == ".inf" || body == ".Inf" || body == ".INF" || s == ".nan" || s == ".NaN" || s == ".NAN")
      return fail(line, path, "infinite or NaN numbers are not accepted");
    const size_t dot = body.find('.');
    if (dot != std::string_view::npos) {
      const std::string_view whole = body.substr(0, dot);
      std::string_view fraction = body.substr(dot + 1), exponent;
      if (const size_t e = fraction.find_first_of("eE"); e != std::string_view::npos)
        exponent = fraction.substr(e + 1), fraction = fraction.substr(0, e);
      const bool whole_ok = whole.empty() ? k == 0 && !fraction.empty() && digit(fraction[0])
                                          : digit(whole[0]) && all_of(whole, "0123456789_");
      const bool fraction_ok = fraction.empty() || all_of(fraction, "0123456789_");
      const bool exponent_ok = body.find_first_of("eE") == std::string_view::npos ||
                               (exponent.size() >= 2 && (exponent[0] == '+' || exponent[0] == '-') &&
                                all_of(exponent.substr(1), "0123456789"));
      if (whole_ok && fraction_ok && exponent_ok) {
        std::string plain;
        for (char c : s)
          if (c != '_') plain += c;
        const double d = std::strtod(plain.c_str(), nullptr);
        if (!std::isfinite(d)) return fail(line, path, "the number " + s.substr(0, 40) + " is not finite");
        out = d;
        return true;
      }
    }
    out = s;
    return true;
  }

  // A value on the line of its key: a scalar, [] or a one-line list of scalars, or {}.
  bool inline_value(std::string_view v, size_t line, const std::string& path, json& out) {
    if (v.front() == '{') {
      std::string_view inner = trim(v.substr(1));
      if (inner.empty() || inner.front() != '}')
        return fail(line, path, "flow mappings ({ ... }) other than {} are not accepted; write one key per line");
      if (!only_comment(inner.substr(1))) return fail(line, path, "text after {}");
      return out = json::object(), true;
    }
    if (v.front() == '[') {
      out = json::array();
      std::string_view rest = v.substr(1);
      rest = trim(rest);
      if (!rest.empty() && rest.front() == ']') {
        if (!only_comment(rest.substr(1))) return fail(line, path, "text after ]");
        return true;
      }
      for (;;) {
        rest = trim(rest);
        if (rest.empty()) return fail(line, path, "a [ list must close with ] on the same line");
        json item;
        std::string_view after;
        if (rest.front() == '"' || rest.front() == '\'') {
          if (!scalar(rest, line, path, item, &after)) return false;
        } else {
          const size_t stop = rest.find_first_of(",]");
          if (stop == std::string_view::npos) return fail(line, path, "a [ list must close with ] on the same line");
          std::string_view plain = trim(rest.substr(0, stop));
          if (plain.empty()) return fail(line, path, "an empty item in a [ list");
          if (plain.find_first_of("[{}#") != std::string_view::npos)
            return fail(line, path, "nested [ ] or { } are not accepted in a list");
          if (!scalar(plain, line, path, item, nullptr)) return false;
          after = rest.substr(stop);
        }
        if (++entries > kMaxEntries) return fail(line, path, "more than " + std::to_string(kMaxEntries) + " entries");
        out.push_back(std::move(item));
        after = trim(after);
        if (after.empty()) return fail(line, path, "a [ list must close with ] on the same line");
        if (after.front() == ']') {
          if (!only_comment(after.substr(1))) return fail(line, path, "text after ]");
          return true;
        }
        if (after.front() != ',') return fail(line, path, "list items must be separated by commas");
        rest = after.substr(1);
      }
    }
    if (v.front() == '"' || v.front() == '\'') return scalar(v, line, path, out, nullptr);
    // A plain scalar ends at a comment (" #").
    std::string_view plain = v;
    if (auto hash = plain.find(" #"); hash != std::string_view::npos) plain = plain.substr(0, hash);
    return scalar(trim(plain), line, path, out, nullptr);
  }

  // Block list items ("- value") at `indent`, scalars only.
  bool sequence(size_t& i, size_t indent, const std::string& path, json& out) {
    out = json::array();
    while (i < lines.size() && lines[i].indent == indent && lines[i].body.front() == '-' &&
           (lines[i].body.size() == 1 || lines[i].body[1] == ' ')) {
      const YamlLine& l = lines[i];
      std::string_view item = trim(l.body.substr(1));
      if (++entries > kMaxEntries) return fail(l.number, path, "more than " + std::to_string(kMaxEntries) + " entries");
      ++i;
      if (item.empty() && i < lines.size() && lines[i].indent > indent)
        return fail(lines[i].number, path, "lists of lists or of mappings are not accepted");
      if (!item.empty() && (item.front() == '[' || item.front() == '{' || item.front() == '-'))
        return fail(l.number, path, "lists of lists or of mappings are not accepted");
      if (!item.empty() && item.front() != '"' && item.front() != '\'' &&
          (item.find(": ") != std::string_view::npos || item.back() == ':'))
        return fail(l.number, path, "lists of mappings are not accepted");
      json v;
      if (item.empty()) v = nullptr;
      else if (!inline_value(item, l.number, path, v)) return false;
      out.push_back(std::move(v));
    }
    if (i < lines.size() && lines[i].indent > indent)
      return fail(lines[i].number, path, "unexpected indentation after a list");
    return true;
  }

  // A block mapping whose keys sit at `indent`; depth 1 is the top level, depth 2 a section (fsdp_config).
  bool mapping(size_t& i, size_t indent, int depth, const std::string& prefix, json& out) {
    out = json::object();
    while (i < lines.size() && lines[i].indent == indent) {
      const YamlLine& l = lines[i];
      std::string_view body = l.body;
      if (body.front() == '-' && (body.size() == 1 || body[1] == ' '))
        return fail(l.number, prefix, "a list item (- ) where a key was expected");
      if (body.front() == '"' || body.front() == '\'') return fail(l.number, prefix, "quoted keys are not accepted");
      if (!refuse_indicator(body, l.number, prefix)) return false;
      if (body.front() == '{' || body.front() == '[')
        return fail(l.number, prefix, depth == 1 ? "an Accelerate config is a YAML mapping of key: value lines (or a JSON object)"
                                                 : "flow collections are not accepted as keys");
      size_t colon = 0;
      while (colon < body.size() && (std::isalnum(static_cast<unsigned char>(body[colon])) || body[colon] == '_' ||
                                     body[colon] == '-' || body[colon] == '.'))
        ++colon;
      const std::string key(body.substr(0, colon));
      const std::string path = prefix.empty() ? key : prefix + "." + key;
      if (key.empty() || colon >= body.size() || body[colon] != ':' || (colon + 1 < body.size() && body[colon + 1] != ' '))
        return fail(l.number, prefix, "expected \"key: value\" with a plain key (letters, digits, _ - .)");
      if (key.size() > 128) return fail(l.number, prefix, "a key longer than 128 bytes");
      if (out.contains(key)) return fail(l.number, path, "the key appears twice");
      if (++entries > kMaxEntries) return fail(l.number, path, "more than " + std::to_string(kMaxEntries) + " entries");
      std::string_view rest = body.substr(colon + 1);
      ++i;
      json value;
      if (only_comment(rest)) {  // the value is on the following lines, or null
        if (i < lines.size() && lines[i].indent >= indent && lines[i].body.front() == '-' &&
            (lines[i].body.size() == 1 || lines[i].body[1] == ' ')) {  // "key:" then "- item" lines
          if (!sequence(i, lines[i].indent, path, value)) return false;
        } else if (i < lines.size() && lines[i].indent > indent) {
          if (depth >= 2)
            return fail(lines[i].number, path, "nested more than one level deep; an Accelerate config has sections of key: value lines");
          if (!mapping(i, lines[i].indent, depth + 1, path, value)) return false;
        } else {
          value = nullptr;
        }
      } else {
        if (!inline_value(trim(rest), l.number, path, value)) return false;
        if (i < lines.size() && lines[i].indent > indent)
          return fail(lines[i].number, path, "a value continued on the next line, or unexpected indentation");
      }
      out[key] = std::move(value);
    }
    if (i < lines.size() && lines[i].indent > indent)
      return fail(lines[i].number, prefix, "unexpected indentation");
    return true;
  }

  bool parse(std::string_view text, json& out) {
    if (!split(text)) return false;
    size_t i = 0;
    if (lines.empty()) return fail(1, "", "the file has no keys");
    if (lines[0].indent != 0) return fail(lines[0].number, "", "the first key must not be indented");
    if (!mapping(i, 0, 1, "", out)) return false;
    if (i < lines.size()) return fail(lines[i].number, "", "indentation does not match any enclosing level");
    return true;
  }
};

}  // namespace

bool parse(std::string_view text, const char* what, json& out, FieldError& error) {
  YamlReader reader;
  reader.document = what;
  if (reader.parse(text, out)) return true;
  error = reader.error;
  return false;
}

}  // namespace memsim::yaml_subset
