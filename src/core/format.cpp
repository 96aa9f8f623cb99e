#include "format.h"

#include <cstdio>

namespace memsim {

std::string format_bytes(int64_t bytes, Unit unit, int decimals) {
  double v = static_cast<double>(bytes);
  const char* name = "GiB";
  switch (unit) {
    case Unit::GiB: v /= 1024.0 * 1024.0 * 1024.0; name = "GiB"; break;
    case Unit::GB: v /= 1e9; name = "GB"; break;
    case Unit::MiB: v /= 1024.0 * 1024.0; name = "MiB"; break;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f %s", decimals, v, name);
  return buf;
}

std::string format_count(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string format_params(int64_t n) {
  char buf[64];
  double v = static_cast<double>(n);
  if (v >= 1e12) std::snprintf(buf, sizeof buf, "%.2fT", v / 1e12);
  else if (v >= 1e9) std::snprintf(buf, sizeof buf, "%.2fB", v / 1e9);
  else if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.1fM", v / 1e6);
  else std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(n));
  return buf;
}

}  // namespace memsim
