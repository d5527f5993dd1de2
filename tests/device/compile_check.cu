// Instantiates every primitive of the device library for every fragment type the architecture being
// compiled has (tests/test_device_library.py compiles this for sm_75 ... sm_90 with warnings as errors).
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
  if constexpr (wmmae::fragment_traits<Frag>::use == wmmae::Use::accumulator) {
    wmmae::load_matrix_with_op(f, p, 40, wmma::mem_row_major, [](Mem v) { return v; });
    wmmae::store_matrix_with_op(q, f, 40, wmma::mem_col_major, wmmae::TileBounds{3, 5}, [](Mem v, int, int) { return v; });
    wmmae::store_vector(q, f, 7);
    if constexpr (wmmae::has_row_quads<Frag>()) {
      wmmae::foreach_row_quad(f, [&](int i, int j, const auto& quad) { q[i * 40 + j] = quad.v[3]; });
    }
  } else {
    wmmae::load_vector(f, p, 9, 0.5f, 2);
    wmmae::load_matrix_with_op(f, p, 41, [](Mem v) { return v; });
    wmmae::load_matrix_with_op(f, p, 41, wmmae::TileBounds{5, 3}, Mem(), [](Mem v) { return v; });
    wmmae::load_matrices_with_op(p, 41, [](Mem v, int, int, auto xs, Frag& a, Frag& b) {
      wmmae::assign(a, xs, v);
      wmmae::assign(b, xs, v);
    }, f, g);
  }
  out[1] += wmmae::to_float(f.x[0]) + wmmae::to_float(g.x[0]);
  // The split helpers' device forms.
  __half hi, lo;
  wmmae::split_fp16<wmmae::DeviceHalfRounding>(out[2], hi, lo);
  __half2 hi2, lo2;
  wmmae::split_fp16x2(out[3], out[4], hi2, lo2);
  const wmmae::Tf32Split t = wmmae::split_tf32(out[5]);
  out[6] = __half2float(hi) + __half2float(lo) + __low2float(hi2) + __high2float(lo2) + t.hi + t.lo;
}

__global__ void instantiate(const void* p, void* q, float* out) {
  using namespace wmma;
  const __half* h = static_cast<const __half*>(p);
  __half* hq = static_cast<__half*>(q);
  use_all<fragment<matrix_a, 16, 16, 16, __half, row_major>>(h, hq, out);
  use_all<fragment<matrix_b, 16, 16, 16, __half, col_major>>(h, hq, out);
  use_all<fragment<accumulator, 16, 16, 16, __half>>(h, hq, out);
  use_all<fragment<accumulator, 16, 16, 16, float>>(static_cast<const float*>(p), static_cast<float*>(q), out);
#if __CUDA_ARCH__ >= 800
  const __nv_bfloat16* b = static_cast<const __nv_bfloat16*>(p);
  use_all<fragment<matrix_a, 32, 8, 16, __nv_bfloat16, col_major>>(b, static_cast<__nv_bfloat16*>(q), out);
  use_all<fragment<matrix_b, 8, 32, 16, __half, row_major>>(h, hq, out);
  use_all<fragment<matrix_a, 16, 16, 8, precision::tf32, row_major>>(static_cast<const float*>(p), static_cast<float*>(q), out);
  use_all<fragment<matrix_b, 16, 16, 16, signed char, row_major>>(static_cast<const signed char*>(p), static_cast<signed char*>(q), out);
  use_all<fragment<matrix_a, 8, 8, 4, double, row_major>>(static_cast<const double*>(p), static_cast<double*>(q), out);
  use_all<fragment<accumulator, 8, 32, 16, int>>(static_cast<const int*>(p), static_cast<int*>(q), out);
  use_all<fragment<accumulator, 8, 8, 4, double>>(static_cast<const double*>(p), static_cast<double*>(q), out);
#endif
}
