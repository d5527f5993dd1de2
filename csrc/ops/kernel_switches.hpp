// The environment variables that choose between kernel paths (README: the table under "Building for other
// GPUs"). They are read at each call, since tests and benchmarks change them between calls in one process. Unset
// and empty mean the same: the default rule. Any other value a variable does not take is an error naming the
// variable and what it takes, not a silent default (TORCH_WMMAE_STREAM_K=2 or =yes once read as unset).
#pragma once

#include <cstdint>

namespace wmmae_ops {

// The value of the environment variable `name`, nullptr where it is unset or empty.
const char* env_value(const char* name);

// A yes/no switch: "0" kOff, "1" kOn, unset or empty kUnset.
enum class Switch { kUnset, kOff, kOn };
Switch env_switch(const char* name);

// A positive whole number of at most `max` from the environment variable `name`, 0 where it is unset or empty;
// `what` says what it counts (for the error).
std::uint64_t env_positive_number(const char* name, const char* what, std::uint64_t max);

}  // namespace wmmae_ops
