// Instantiates every primitive of the device library for every fragment type the architecture being
// compiled has a layout for, in both memory orders (tests/test_device_library.py compiles this for sm_75 ...
// sm_90 with warnings as errors).
#include "wmmae/wmmae.hpp"

using namespace nvcuda;

template <class Frag, class Mem>
__device__ void use_all(const Mem* p, Mem* q, float* out) {
  Frag f, g;
  wmmae::fill_zero(f);
  wmmae::fill_zero(g);
  wmmae::make_identity(f, 2.0f);
  wmmae::foreach(f, [&](int x, int i, int j) { out[x] += i + j; });
  wmmae::foreach_ij(f, [&](auto xs, int i, int j) { out[xs.first] += i * j; });
  wmmae::foreach_diagonal(f, [&](auto xs, int i) { out[xs.first] += i; });
  out[0] += wmmae::map<Frag>(1, 1).count;
  // Vectors in and out of every fragment: both placements, a stride, float, double and integer scales, and a
  // double alpha (README's table).
  wmmae::load_vector(f, p, 9, 0.5f, 2);
  wmmae::load_vector(f, p, 9, 0.5);
  wmmae::load_vector(f, p, 9, 3);
  wmmae::load_vector<Frag, Mem, wmmae::VectorAs::row0>(f, p, 9);
  wmmae::load_vector<Frag, Mem, wmmae::VectorAs::column0>(f, p, 9, 2u);
  wmmae::store_vector(q, f, 7);
  wmmae::store_vector(q, f, 7, 0.25);
  wmmae::store_vector<Frag, Mem, wmmae::VectorAs::row0>(q, f, 7, -3);
  wmmae::make_identity(f, 2.0);
  if constexpr (wmmae::fragment_traits<Frag>::use == wmmae::Use::accumulator) {
    wmmae::load_matrix_with_op(f, p, 40, wmma::mem_row_major, [](Mem v) { return v; });
    wmmae::store_matrix_with_op(q, f, 40, wmma::mem_col_major, wmmae::TileBounds{3, 5}, [](Mem v, int, int) { return v; });
    // op's result converted to the memory type (a half accumulator to float, without implicit conversions).
    wmmae::store_matrix_with_op(out, f, 40, wmma::mem_row_major, wmmae::TileBounds{3, 5}, [](Mem v, int, int) { return v; });
    if constexpr (wmmae::has_row_quads<Frag>()) {
      wmmae::foreach_row_quad(f, [&](int i, int j, const auto& quad) { q[i * 40 + j] = quad.v[3]; });
    }
  } else {
    wmmae::load_matrix_with_op(f, p, 41, [](Mem v) { return v; });
    wmmae::load_matrix_with_op(f, p, 41, wmmae::TileBounds{5, 3}, Mem(), [](Mem v) { return v; });
    wmmae::load_matrices_with_op(p, 41, [](Mem v, int, int, auto xs, Frag& a, Frag& b) {
      wmmae::assign(a, xs, v);
      wmmae::assign(b, xs, v);
    }, f, g);
    // The bounded form with a named fill and a named op (which the unbounded form must not also match).
    const Mem fill = Mem();
    const auto copy = [](Mem v, int, int, auto xs, Frag& a, Frag& b) {
      wmmae::assign(a, xs, v);
      wmmae::assign(b, xs, v);
    };
    wmmae::load_matrices_with_op(p, 41, wmmae::TileBounds{4, 7}, fill, copy, f, g);
  }
  // assign converts to the storage type as convert does (a float into integer and 16-bit fragments too).
  wmmae::foreach_ij(f, [&](auto xs, int i, int j) { wmmae::assign(f, xs, 0.5f * (i - j)); });
  out[1] += wmmae::to_float(f.x[0]) + wmmae::to_float(g.x[0]);
  // The split helpers' device forms.
  __half hi, lo;
  wmmae::split_fp16<wmmae::DeviceHalfRounding>(out[2], hi, lo);
  __half2 hi2, lo2;
  wmmae::split_fp16x2(out[3], out[4], hi2, lo2);
  const wmmae::Tf32Split t = wmmae::split_tf32(out[5]);
  out[6] = __half2float(hi) + __half2float(lo) + __low2float(hi2) + __high2float(lo2) + t.hi + t.lo;
  wmmae::split_fp16_compensated<wmmae::DeviceHalfRounding>(out[2], hi, lo);
  wmmae::split_fp16x2_compensated(out[3], out[4], hi2, lo2);
  out[7] = __half2float(hi) + __half2float(lo) + __low2float(hi2) + __high2float(lo2);
}

template <wmmae::Use U, int M, int N, int K, wmmae::Elem E>
__device__ void use_all_orders(const void* p, void* q, float* out) {
  using Mem = typename wmmae::element_types<E>::memory;
  const Mem* in = static_cast<const Mem*>(p);
  Mem* to = static_cast<Mem*>(q);
  if constexpr (U == wmmae::Use::accumulator) {
    use_all<wmmae::fragment_t<U, M, N, K, E>>(in, to, out);
  } else {
    use_all<wmmae::fragment_t<U, M, N, K, E, wmmae::Order::row_major>>(in, to, out);
    use_all<wmmae::fragment_t<U, M, N, K, E, wmmae::Order::col_major>>(in, to, out);
  }
}

// Every fragment type of the table for which the architecture being compiled has a layout.
__global__ void instantiate(const void* p, void* q, float* out) {
#if __CUDA_ARCH__ >= 800
#define WMMAE_USE_ALL(U, M, N, K, E, ...) use_all_orders<wmmae::Use::U, M, N, K, wmmae::Elem::E>(p, q, out);
  WMMAE_FOR_EACH_SM80_FRAGMENT(WMMAE_USE_ALL)
#undef WMMAE_USE_ALL
#else  // sm_75: the m16n16k16 half fragments (layout.hpp)
  use_all_orders<wmmae::Use::matrix_a, 16, 16, 16, wmmae::Elem::half>(p, q, out);
  use_all_orders<wmmae::Use::matrix_b, 16, 16, 16, wmmae::Elem::half>(p, q, out);
  use_all_orders<wmmae::Use::accumulator, 16, 16, 16, wmmae::Elem::half>(p, q, out);
  use_all_orders<wmmae::Use::accumulator, 16, 16, 16, wmmae::Elem::f32>(p, q, out);
#endif
}

// The fp16 splits with a host-only rounding policy (as the CPU emulation's c10::Half) in a .cu file's host code.
struct HostOnlyHalfRounding {
  __host__ static float to_half(float v) { return v; }
  __host__ static float to_float(float h) { return h; }
};
__host__ float split_on_the_host(float v) {
  float hi, lo;
  wmmae::split_fp16<HostOnlyHalfRounding>(v, hi, lo);
  float hi_c, lo_c;
  wmmae::split_fp16_compensated<HostOnlyHalfRounding>(v, hi_c, lo_c);
  return hi + lo + hi_c + lo_c;
}

// Compile-time facts of the layout descriptors that no fragment type of the table exercises.
namespace {
using wmmae::CoreLayout;
using wmmae::Elem;
using wmmae::Use;
// Below sm_75 there is no core-matrix layout: the primitives refuse sm_70/72 at compile time (fragment_traits).
static_assert(wmmae::device_layout(700, Use::matrix_a, 16, 16, 16, Elem::half).num_elements == 0, "sm_70");
static_assert(wmmae::device_layout(720, Use::accumulator, 16, 16, 16, Elem::f32).num_elements == 0, "sm_72");
// sm_75 knows the m16n16k16 half fragments only; sm_80 and newer the whole table.
static_assert(wmmae::device_layout(750, Use::matrix_a, 16, 16, 16, Elem::half).num_elements == 16, "sm_75");
static_assert(wmmae::device_layout(750, Use::matrix_a, 32, 8, 16, Elem::half).num_elements == 0, "sm_75");
static_assert(wmmae::device_layout(900, Use::matrix_a, 32, 8, 16, Elem::half).num_elements == 16, "sm_90");
// Layouts that differ only in where their cores sit are different layouts.
constexpr CoreLayout kDown{16, 16, 8, 4, false, 2, {{0, 0}, {8, 0}}};
constexpr CoreLayout kAcross{16, 16, 8, 4, false, 2, {{0, 0}, {0, 8}}};
static_assert(wmmae::equal_layouts(kDown, kDown) && !wmmae::equal_layouts(kDown, kAcross), "offsets");
}  // namespace
