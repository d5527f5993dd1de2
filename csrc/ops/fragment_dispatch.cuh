// From a runtime FragmentSpec to the nvcuda::wmma::fragment type it names: f(type_tag<Frag>, type_tag<Mem>)
// is called with the fragment type and the type load_matrix_sync reads from memory (wmmae::fragment_t and
// wmmae::element_types). The list of types is the one in csrc/wmmae/layout.hpp (WMMAE_FOR_EACH_SM80_FRAGMENT).
#pragma once

#include "../wmmae/fragment_traits.hpp"
#include "fragment_map.hpp"

namespace wmmae_ops {

template <class T> struct type_tag { using type = T; };

namespace detail {

template <wmmae::Use U, int M, int N, int K, wmmae::Elem E, class F>
void call_with_fragment(wmmae::Order order, F&& f) {
  using Mem = type_tag<typename wmmae::element_types<E>::memory>;
  if constexpr (U == wmmae::Use::accumulator) {
    f(type_tag<wmmae::fragment_t<U, M, N, K, E>>{}, Mem{});
  } else if (order == wmmae::Order::row_major) {
    f(type_tag<wmmae::fragment_t<U, M, N, K, E, wmmae::Order::row_major>>{}, Mem{});
  } else {
    f(type_tag<wmmae::fragment_t<U, M, N, K, E, wmmae::Order::col_major>>{}, Mem{});
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
