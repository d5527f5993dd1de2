// fragment_traits<nvcuda::wmma::fragment<...>>: the fragment's use, shape, element type and its layout
// descriptor from layout.hpp for the architecture being compiled (__CUDA_ARCH__).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <type_traits>

#include "layout.hpp"

namespace wmmae {
namespace detail {

template <class> constexpr bool always_false = false;

template <Elem E> struct known_elem {
  static constexpr Elem value = E;
  static constexpr bool known = true;
};
template <class T> struct elem_of {
  static_assert(always_false<T>, "wmmae: fragments of this element type are not supported (sub-byte types: "
                                 "experimental::precision::s4, u4 and b1 have no layout in layout.hpp)");
  static constexpr Elem value = Elem::half;
  static constexpr bool known = false;  // (so that no second, misleading layout error follows the one above)
};
template <> struct elem_of<__half> : known_elem<Elem::half> {};
template <> struct elem_of<__nv_bfloat16> : known_elem<Elem::bf16> {};
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800  // <mma.h> has tf32 fragments on sm_80+ only
template <> struct elem_of<nvcuda::wmma::precision::tf32> : known_elem<Elem::tf32> {};
#endif
template <> struct elem_of<float> : known_elem<Elem::f32> {};
template <> struct elem_of<double> : known_elem<Elem::f64> {};
template <> struct elem_of<signed char> : known_elem<Elem::s8> {};
template <> struct elem_of<unsigned char> : known_elem<Elem::u8> {};
template <> struct elem_of<int> : known_elem<Elem::s32> {};

template <class U> struct use_of;
template <> struct use_of<nvcuda::wmma::matrix_a> { static constexpr Use value = Use::matrix_a; };
template <> struct use_of<nvcuda::wmma::matrix_b> { static constexpr Use value = Use::matrix_b; };
template <> struct use_of<nvcuda::wmma::accumulator> { static constexpr Use value = Use::accumulator; };

template <class L> struct order_of { static constexpr Order value = Order::none; };
template <> struct order_of<nvcuda::wmma::row_major> { static constexpr Order value = Order::row_major; };
template <> struct order_of<nvcuda::wmma::col_major> { static constexpr Order value = Order::col_major; };

// The layout of the architecture this pass compiles for. The host pass (no __CUDA_ARCH__) sees the sm_80
// table, which only host-side code such as static_asserts reads.
WMMAE_HD constexpr CoreLayout compiled_layout(Use use, int m, int n, int k, Elem elem) {
#if defined(__CUDA_ARCH__)
  return device_layout(__CUDA_ARCH__, use, m, n, k, elem);
#else
  return device_layout(800, use, m, n, k, elem);
#endif
}

template <Use U> struct use_type;
template <> struct use_type<Use::matrix_a> { using type = nvcuda::wmma::matrix_a; };
template <> struct use_type<Use::matrix_b> { using type = nvcuda::wmma::matrix_b; };
template <> struct use_type<Use::accumulator> { using type = nvcuda::wmma::accumulator; };

template <Order O> struct order_type { using type = void; };  // accumulators: fragment<..., void>
template <> struct order_type<Order::row_major> { using type = nvcuda::wmma::row_major; };
template <> struct order_type<Order::col_major> { using type = nvcuda::wmma::col_major; };

}  // namespace detail

// The element type of an Elem in a fragment, and the type load_matrix_sync reads from memory for it.
template <Elem E> struct element_types;
template <> struct element_types<Elem::half> { using fragment = __half; using memory = __half; };
template <> struct element_types<Elem::bf16> { using fragment = __nv_bfloat16; using memory = __nv_bfloat16; };
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
template <> struct element_types<Elem::tf32> { using fragment = nvcuda::wmma::precision::tf32; using memory = float; };
#endif
template <> struct element_types<Elem::f32> { using fragment = float; using memory = float; };
template <> struct element_types<Elem::f64> { using fragment = double; using memory = double; };
template <> struct element_types<Elem::s8> { using fragment = signed char; using memory = signed char; };
template <> struct element_types<Elem::u8> { using fragment = unsigned char; using memory = unsigned char; };
template <> struct element_types<Elem::s32> { using fragment = int; using memory = int; };

// The fragment type of a table row (the inverse of fragment_traits): fragment_t<Use::matrix_a, 16, 16, 16,
// Elem::half, Order::row_major> is nvcuda::wmma::fragment<matrix_a, 16, 16, 16, __half, row_major>.
template <Use U, int M, int N, int K, Elem E, Order O = Order::none>
using fragment_t = nvcuda::wmma::fragment<typename detail::use_type<U>::type, M, N, K,
                                          typename element_types<E>::fragment, typename detail::order_type<O>::type>;

template <class Frag> struct fragment_traits {
  static_assert(detail::always_false<Frag>, "wmmae: this argument must be an nvcuda::wmma::fragment");
  // Placeholders of a fragment without elements, so that the assertion above is a misuse's only error (the
  // primitives' bodies compile against these instead of failing on every missing member).
  static constexpr bool known = false;  // (checks that would fail on the placeholders test it first)
  using fragment_type = Frag;
  using storage_type = float;
  static constexpr Use use = Use::matrix_a;
  static constexpr Elem elem = Elem::f32;
  static constexpr Order order = Order::row_major;
  static constexpr int m = 0, n = 0, k = 0;
  static constexpr CoreLayout layout = CoreLayout{0, 0, 0, 1, false, 0, {{0, 0}}};  // period() 0: no element
  template <int X>
  WMMAE_HD static constexpr RowCol position(int) { return RowCol{0, 0}; }
};

template <class U, int M, int N, int K, class T, class L>
struct fragment_traits<nvcuda::wmma::fragment<U, M, N, K, T, L>> {
  static constexpr bool known = true;
  using fragment_type = nvcuda::wmma::fragment<U, M, N, K, T, L>;
  using storage_type = typename fragment_type::storage_element_type;  // type of frag.x[i]
  static constexpr Use use = detail::use_of<U>::value;
  static constexpr Elem elem = detail::elem_of<T>::value;
  static constexpr Order order = detail::order_of<L>::value;
  static constexpr int m = M, n = N, k = K;
  static constexpr CoreLayout layout = detail::compiled_layout(use, M, N, K, elem);
  // (row, col) of element X of `lane`; X is a compile-time constant, so only lane arithmetic remains.
  template <int X>
  WMMAE_HD static constexpr RowCol position(int lane) {
    constexpr RowCol origin = layout.origin(X);
    return core_position(origin, layout.run, layout.transposed, lane, X);
  }
  static_assert(!detail::elem_of<T>::known || layout.num_elements == fragment_type::num_elements,
                "wmmae: the layout of this fragment type is not known for the architecture being compiled "
                "(sm_75 has only the m16n16k16 half operands and half/float accumulators, sm_70/72 none): "
                "compile for sm_80 or newer");
};

}  // namespace wmmae
