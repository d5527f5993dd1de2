// fragment_map: the (row, col) of the tile element each lane's frag.x[i] holds, as an int32 tensor
// [32, num_elements, 2]. On the CPU from the analytic tables of csrc/wmmae/layout.hpp (arch=...), on a GPU
// measured with load_matrix_sync/store_matrix_sync (device=...).
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>

#include "../wmmae/layout.hpp"

namespace wmmae_ops {

struct FragmentSpec {
  wmmae::Use use;
  int m, n, k;
  wmmae::Elem elem;
  wmmae::Order order;  // Order::none for accumulators
  std::string describe() const;
};

// Parses and validates the op's arguments (names as in the schema).
FragmentSpec parse_fragment_spec(c10::string_view use, std::int64_t m, std::int64_t n, std::int64_t k,
                                 c10::string_view dtype, std::optional<c10::string_view> layout);

// The sm_80+ descriptor, or an error naming the fragment when CUDA has no such fragment type.
wmmae::CoreLayout require_sm80_layout(const FragmentSpec& spec);

at::Tensor fragment_map_cpu(c10::string_view use, std::int64_t m, std::int64_t n, std::int64_t k,
                            c10::string_view dtype, std::optional<c10::string_view> layout,
                            std::optional<std::int64_t> arch, std::optional<at::Device> device);

}  // namespace wmmae_ops
