#include "kernel_switches.hpp"

#include <c10/util/Exception.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace wmmae_ops {

namespace {

// Whether `text` is a plain decimal number within unsigned long long's range, stored in `value`: digits only,
// since strtoull takes " 4" and "+4", and "-1" as 2^64 - 1, and saturates past its range.
bool parse_decimal(const char* text, unsigned long long& value) {
  if (*text < '0' || *text > '9') return false;
  char* end = nullptr;
  errno = 0;
  value = std::strtoull(text, &end, 10);
  return *end == '\0' && errno != ERANGE;
}

}  // namespace

const char* env_value(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

Switch env_switch(const char* name) {
  const char* value = env_value(name);
  if (value == nullptr) return Switch::kUnset;
  if (std::strcmp(value, "0") == 0) return Switch::kOff;
  TORCH_CHECK(std::strcmp(value, "1") == 0, "corrected_matmul: the environment variable ", name,
              " must be 0 or 1 (or unset), got '", value, "'");
  return Switch::kOn;
}

std::uint64_t env_positive_number(const char* name, const char* what, std::uint64_t max) {
  const char* text = env_value(name);
  if (text == nullptr) return 0;
  unsigned long long value = 0;
  TORCH_CHECK(parse_decimal(text, value) && value >= 1 && value <= max, "corrected_matmul: the environment variable ",
              name, " must be a positive integer (", what, ") of at most ", max, ", got '", text, "'");
  return value;
}

}  // namespace wmmae_ops
