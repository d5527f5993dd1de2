// Parsing and validation of fragment_map's arguments (shared by the op and the device-library tests).
#include <sstream>

#include "fragment_map.hpp"

namespace wmmae_ops {
namespace {

using wmmae::Elem;
using wmmae::Order;
using wmmae::Use;

const char* use_name(Use u) {
  switch (u) {
    case Use::matrix_a: return "matrix_a";
    case Use::matrix_b: return "matrix_b";
    default: return "accumulator";
  }
}

const char* elem_name(Elem e) {
  static const char* names[] = {"half", "bf16", "tf32", "float", "double", "int8", "uint8", "int32"};
  return names[static_cast<int>(e)];
}

Use parse_use(c10::string_view s) {
  if (s == "matrix_a") return Use::matrix_a;
  if (s == "matrix_b") return Use::matrix_b;
  if (s == "accumulator") return Use::accumulator;
  TORCH_CHECK(false, "fragment_map: argument 'use' must be 'matrix_a', 'matrix_b' or 'accumulator', got '", s, "'");
}

Elem parse_elem(c10::string_view s) {
  for (int e = 0; e <= static_cast<int>(Elem::s32); ++e) {
    if (s == elem_name(static_cast<Elem>(e))) return static_cast<Elem>(e);
  }
  TORCH_CHECK(false, "fragment_map: argument 'dtype' must be one of 'half', 'bf16', 'tf32', 'float', 'double', "
              "'int8', 'uint8', 'int32', got '", s, "'");
}

}  // namespace

std::string FragmentSpec::describe() const {
  std::ostringstream s;
  s << use_name(use) << " m" << m << "n" << n << "k" << k << " " << elem_name(elem);
  if (order != Order::none) s << (order == Order::row_major ? " row_major" : " col_major");
  return s.str();
}

FragmentSpec parse_fragment_spec(c10::string_view use, std::int64_t m, std::int64_t n, std::int64_t k,
                                 c10::string_view dtype, std::optional<c10::string_view> layout) {
  FragmentSpec spec{parse_use(use), static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), parse_elem(dtype),
                    Order::none};
  TORCH_CHECK(m > 0 && n > 0 && k > 0 && m <= 64 && n <= 64 && k <= 64, "fragment_map: m, n, k must be WMMA tile ",
              "sizes (such as 16, 16, 16), got m=", m, " n=", n, " k=", k);
  if (spec.use == Use::accumulator) {
    TORCH_CHECK(!layout.has_value(), "fragment_map: accumulator fragments have no layout; pass layout=None, got '",
                *layout, "'");
  } else {
    TORCH_CHECK(layout.has_value(), "fragment_map: argument 'layout' ('row_major' or 'col_major') is required for ",
                use_name(spec.use));
    TORCH_CHECK(*layout == "row_major" || *layout == "col_major",
                "fragment_map: argument 'layout' must be 'row_major' or 'col_major', got '", *layout, "'");
    spec.order = *layout == "row_major" ? Order::row_major : Order::col_major;
  }
  return spec;
}

wmmae::CoreLayout require_sm80_layout(const FragmentSpec& spec) {
  const wmmae::CoreLayout layout = wmmae::sm80_layout(spec.use, spec.m, spec.n, spec.k, spec.elem);
  TORCH_CHECK(layout.num_elements > 0, "fragment_map: CUDA has no WMMA fragment ", spec.describe(),
              " (see the fragment types of <mma.h>; accumulators take the accumulator type, e.g. 'float')");
  return layout;
}

}  // namespace wmmae_ops
