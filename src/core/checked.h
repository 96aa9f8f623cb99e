// Checked 64-bit byte and element arithmetic. Every size in the core goes through these so that an absurd
// configuration (100T parameters, a 1M-token sequence) ends in a clear "out of range" error, never in a
// silently wrapped count.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

namespace memsim {

// Thrown when a count leaves int64; simulate() turns it into a user-facing error.
struct RangeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline int64_t add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) throw RangeError("a byte count exceeds 2^63");
  return r;
}
inline int64_t sub(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) throw RangeError("a byte count exceeds 2^63");
  return r;
}
inline int64_t mul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) throw RangeError("a byte count exceeds 2^63");
  return r;
}
template <typename... T>
inline int64_t mul(int64_t a, int64_t b, T... rest) {
  return mul(mul(a, b), rest...);
}
// Ceiling division for positive operands.
inline int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }
inline int64_t round_up(int64_t a, int64_t multiple) { return mul(ceil_div(a, multiple), multiple); }

constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * kKiB;
constexpr int64_t kGiB = 1024 * kMiB;

}  // namespace memsim
