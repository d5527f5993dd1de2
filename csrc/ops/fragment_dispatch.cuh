// From a runtime FragmentSpec to the nvcuda::wmma::fragment type it names: f(type_tag<Frag>, type_tag<Mem>)
// is called with the fragment type and the type load_matrix_sync reads from memory. The list of types is
// the one in csrc/wmmae/layout.hpp (WMMAE_FOR_EACH_SM80_FRAGMENT).
#pragma once

#include "../wmmae/fragment_traits.hpp"
#include "fragment_map.hpp"

namespace wmmae_ops {

template <class T> struct type_tag { using type = T; };

namespace detail {

template <wmmae::Use U> struct use_tag;
template <> struct use_tag<wmmae::Use::matrix_a> { using type = nvcuda::wmma::matrix_a; };
template <> struct use_tag<wmmae::Use::matrix_b> { using type = nvcuda::wmma::matrix_b; };
template <> struct use_tag<wmmae::Use::accumulator> { using type = nvcuda::wmma::accumulator; };

// Fragment element type and memory type of each Elem.
template <wmmae::Elem E> struct elem_types;
template <> struct elem_types<wmmae::Elem::half> { using frag = __half; using mem = __half; };
template <> struct elem_types<wmmae::Elem::bf16> { using frag = __nv_bfloat16; using mem = __nv_bfloat16; };
template <> struct elem_types<wmmae::Elem::tf32> { using frag = nvcuda::wmma::precision::tf32; using mem = float; };
template <> struct elem_types<wmmae::Elem::f32> { using frag = float; using mem = float; };
template <> struct elem_types<wmmae::Elem::f64> { using frag = double; using mem = double; };
template <> struct elem_types<wmmae::Elem::s8> { using frag = signed char; using mem = signed char; };
template <> struct elem_types<wmmae::Elem::u8> { using frag = unsigned char; using mem = unsigned char; };
template <> struct elem_types<wmmae::Elem::s32> { using frag = int; using mem = int; };

template <wmmae::Use U, int M, int N, int K, wmmae::Elem E, class F>
void call_with_fragment(wmmae::Order order, F&& f) {
  namespace wmma = nvcuda::wmma;
  using Tag = typename use_tag<U>::type;
  using T = typename elem_types<E>::frag;
  using Mem = type_tag<typename elem_types<E>::mem>;
  if constexpr (U == wmmae::Use::accumulator) {
    f(type_tag<wmma::fragment<Tag, M, N, K, T>>{}, Mem{});
  } else if (order == wmmae::Order::row_major) {
    f(type_tag<wmma::fragment<Tag, M, N, K, T, wmma::row_major>>{}, Mem{});
  } else {
    f(type_tag<wmma::fragment<Tag, M, N, K, T, wmma::col_major>>{}, Mem{});
  }
}

}  // namespace detail

template <class F>
void dispatch_fragment(const FragmentSpec& spec, F&& f) {
  using wmmae::Elem;
  using wmmae::Use;
#define WMMAE_DISPATCH_CASE(U, M, N, K, E, ...)                                                         \
  if (spec.use == Use::U && spec.m == M && spec.n == N && spec.k == K && spec.elem == Elem::E) {          \
    detail::call_with_fragment<Use::U, M, N, K, Elem::E>(spec.order, f);                                   \
    return;                                                                                                \
  }
  WMMAE_FOR_EACH_SM80_FRAGMENT(WMMAE_DISPATCH_CASE)
#undef WMMAE_DISPATCH_CASE
  TORCH_CHECK(false, "no WMMA fragment type ", spec.describe());
}

}  // namespace wmmae_ops
