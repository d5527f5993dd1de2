// Uses of the device library that must not compile (tests/test_device_library.py compiles this with
// -DMISUSE=<case> and expects each case's static_assert message; case 0 is the correct use, which must compile).
#include "wmmae/wmmae.hpp"

using namespace nvcuda;

__global__ void misuse(const __half* p) {
  auto same = [](__half v) { return v; };
  (void)same;
#if MISUSE == 0
  wmma::fragment<wmma::accumulator, 16, 16, 16, __half> acc;
  wmmae::load_matrix_with_op(acc, p, 16, wmma::mem_row_major, same);
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
  wmmae::load_matrix_with_op(a, p, 16, same);
#elif MISUSE == 1  // an operand through the accumulators' overload (it would ignore the operand's own layout)
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
  wmmae::load_matrix_with_op(a, p, 16, wmma::mem_col_major, same);
#elif MISUSE == 2  // on sm_75, a fragment whose layout has not been measured there
  wmma::fragment<wmma::matrix_a, 32, 8, 16, __half, wmma::row_major> a;
  wmmae::fill_zero(a);
#elif MISUSE == 3  // one multi-fragment load into fragments of different layouts
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b;
  wmmae::load_matrices_with_op(p, 16, [](__half, int, int, auto, auto&, auto&) {}, a, b);
#elif MISUSE == 4  // an accumulator through the multi-fragment load (it has no memory layout of its own)
  wmma::fragment<wmma::accumulator, 16, 16, 16, __half> acc;
  wmmae::load_matrices_with_op(p, 16, [](__half, int, int, auto, auto&) {}, acc);
#elif MISUSE == 7  // an accumulator after an operand of the same register layout in the multi-fragment load
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmmae::load_matrices_with_op(reinterpret_cast<const __nv_bfloat16*>(p), 16,
                               [](__nv_bfloat16, int, int, auto, auto&, auto&) {}, a, acc);
#elif MISUSE == 5  // something that is not a fragment, given to every primitive: one error, the assertion's
  float not_a_fragment[8];
  float out[16];
  const float* in = reinterpret_cast<const float*>(p);
  auto keep = [](float v) { return v; };
  wmmae::fill_zero(not_a_fragment);
  wmmae::make_identity(not_a_fragment, 1.0f);
  wmmae::foreach(not_a_fragment, [&](int x, int i, int j) { out[x] = i + j; });
  wmmae::foreach_ij(not_a_fragment, [&](auto xs, int i, int j) { out[xs.first] = i + j; });
  wmmae::foreach_diagonal(not_a_fragment, [&](auto xs, int i) { out[xs.first] = i; });
  (void)wmmae::map<float[8]>(0, 0);
  (void)wmmae::has_row_quads<float[8]>();
  wmmae::load_vector(not_a_fragment, in, 8);
  wmmae::store_vector(out, not_a_fragment, 8);
  wmmae::load_matrix_with_op(not_a_fragment, in, 16, keep);
  wmmae::load_matrix_with_op(not_a_fragment, in, 16, wmmae::TileBounds{3, 3}, 0.0f, keep);
  wmmae::load_matrix_with_op(not_a_fragment, in, 16, wmma::mem_row_major, keep);
  wmmae::load_matrices_with_op(in, 16, [](float, int, int, auto, auto&) {}, not_a_fragment);
  wmmae::store_matrix_with_op(out, not_a_fragment, 16, wmma::mem_row_major, wmmae::TileBounds{3, 3},
                              [](float v, int, int) { return v; });
  wmmae::foreach_row_quad(not_a_fragment, [&](int i, int j, auto quad) { out[i + j] = quad.v[0]; });
#elif MISUSE == 6  // a sub-byte fragment (no layout in the table)
  wmma::fragment<wmma::matrix_a, 8, 8, 32, wmma::experimental::precision::s4, wmma::row_major> a;
  wmmae::fill_zero(a);
#endif
}
