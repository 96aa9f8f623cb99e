// Formatting numbers for people, used only at the edges (CLI table, interface labels).
#pragma once
#include <cstdint>
#include <string>

namespace memsim {

enum class Unit { GiB, GB, MiB };
std::string format_bytes(int64_t bytes, Unit unit = Unit::GiB, int decimals = 2);
std::string format_count(int64_t n);  // 8,030,261,248
std::string format_params(int64_t n); // 8.03B

}  // namespace memsim
