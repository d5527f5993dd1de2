// corrected_matmul's matrix-vector products: calls whose output has one row or one column per batch entry (M = 1 or
// N = 1, after fold_batch_into_rows), for every method. Such a call reads each element of its matrix once for two
// flops, so it is memory-bound and tensor cores gain it nothing; and the split GEMMs, which sum K in float32 chunks,
// were less accurate than torch.matmul's blocked float32 sums on same-signed inputs (U(0, 1): 1.4-1.8x its error at
// 1 x 1000 x 4096..65536, H100, session 122). So are tiny products (M and N at most kTinyOutputSide, 4 x 4 x 65536
// U(0, 1): `fp16` 1.1x torch fp32's error, session 122), whose tensor-core tiles are almost all padding: they run
// here as M matrix-vector products, B's columns by each of A's rows. Here each product of two float32 values is
// exact in float64 and the products are summed in float64, so the result is float32's correctly rounded sum but for
// a relative 2^-53 per term: for every finite input, whatever its exponent range, with NaN and Inf propagating as in
// any float sum.
//
// The order of the float64 sums is fixed by K alone, so that the CUDA kernels of every layout and the CPU give the
// same bits (tests/test_matrix_vector.py models it in Python):
// - K is cut into segments of kMatVecSegmentK;
// - within a segment, the products of k = r (mod kMatVecLanes) are summed in their own sum ("lane" r: a warp's lane
//   on the GPU), in order of k, each starting from +0;
// - the lanes' sums are combined pairwise: lane r with lane r + 16 for r < 16, then r with r + 8 for r < 8, ..., as
//   a warp's butterfly (xor shuffles) leaves them in lane 0 (combine_lane_sums);
// - the segments' sums are combined the same way in groups of kMatVecGroupSegments consecutive segments (segment j
//   of a group as lane j, a group's missing segments as +0, which no sum here changes: none is ever -0);
// - the groups' sums are added in order, starting from group 0's, and the total is rounded to float32 once.
// (Pairwise over the segments, not in order: a long K of few lines, a dot product, would otherwise wait for
// K / 256 dependent additions: H100, 1 x 1 x 2^20, 0.17 ms against torch.matmul's 0.012.)
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "../wmmae/config.hpp"
#include "matmul_plan.hpp"

namespace wmmae_ops {

constexpr int kMatVecLanes = 32;
constexpr int kMatVecSegmentK = 256;
constexpr int kMatVecTermsPerLane = kMatVecSegmentK / kMatVecLanes;
constexpr int kMatVecGroupSegments = kMatVecLanes;
static_assert(kMatVecTermsPerLane * kMatVecLanes == kMatVecSegmentK, "a segment is whole rounds of the lanes");

WMMAE_HD inline std::int64_t matrix_vector_segments(std::int64_t k) {
  return (k + kMatVecSegmentK - 1) / kMatVecSegmentK;
}
WMMAE_HD inline std::int64_t matrix_vector_groups(std::int64_t segments) {
  return (segments + kMatVecGroupSegments - 1) / kMatVecGroupSegments;
}

// Combines n sums pairwise into one (the order above for n = 32: the CPU's, where the GPU's warps do it with xor
// shuffles; a CUDA thread holding n of a warp's lane sums, the butterfly's first levels for them).
template <int n>
WMMAE_HD inline double combine_lane_sums(double (&lane_sum)[n]) {
  static_assert(n > 0 && (n & (n - 1)) == 0, "pairwise halves: a power of two");
  for (int half = n / 2; half > 0; half /= 2) {
    for (int r = 0; r < half; ++r) lane_sum[r] += lane_sum[r + half];
  }
  return lane_sum[0];
}

// One segment's sum as one thread computes it (the CPU): the products x[i * x_stride] * v[i * v_stride], i < count
// <= kMatVecSegmentK, in the order above. (The product of two floats is exact in float64, so a fused multiply-add,
// which a compiler may contract this to, gives the same bits.)
inline double matrix_vector_segment_sum(const float* x, std::int64_t x_stride, const float* v, std::int64_t v_stride,
                                        int count) {
  double lane_sum[kMatVecLanes] = {};
  for (int i = 0; i < count; ++i) {
    lane_sum[i % kMatVecLanes] += static_cast<double>(x[i * x_stride]) * static_cast<double>(v[i * v_stride]);
  }
  return combine_lane_sums(lane_sum);
}

// The product as a matrix of `lines` lines of K elements (the operand that is not a vector) times a vector of K: line
// l of batch entry z gives output z * lines + l. Plain data, passed to the CUDA kernels by value.
struct MatrixVectorArgs {
  const float* x;  // element (l, kk) of entry z at x[x_offset(z) + l * x_line_stride + kk * x_k_stride]
  std::int64_t x_line_stride, x_k_stride;
  const float* v;  // element kk of entry z at v[v_offset(z) + kk * v_k_stride]
  std::int64_t v_k_stride;
  BatchStrides batch;  // a's strides are x's where x_is_a, else b's
  bool x_is_a;
  // rows > 1 (a tiny product): entry z is row z % rows of the plan's batch entry z / rows, its vector A's row, at
  // v_row_stride from the row before.
  std::int64_t rows, v_row_stride;
  std::int64_t lines, k, batches;  // batches: the plan's batch x rows

  WMMAE_HD void offsets(std::int64_t z, std::int64_t& x_offset, std::int64_t& v_offset) const {
    // (rows == 1 skips the 64-bit division, as batch_offsets does for a one-dimensional batch.)
    const std::int64_t entry = rows == 1 ? z : z / rows;
    std::int64_t a_offset, b_offset;
    batch_offsets(batch, entry, a_offset, b_offset);
    x_offset = x_is_a ? a_offset : b_offset;
    v_offset = (x_is_a ? b_offset : a_offset) + (z - entry * rows) * v_row_stride;
  }
};

// Tiny products: M and N at most this.
constexpr std::int64_t kTinyOutputSide = 8;

// Whether the planned call (batch folded as the op folds it) takes this path: M = 1 or N = 1, or a tiny product, unless
// TORCH_WMMAE_MATRIX_VECTOR=0 (read on every call: tests and benchmarks compare with the GEMMs), which sends such
// calls to the GEMMs of their method.
bool matrix_vector_applies(const MatmulPlan& plan);

// The plan's operands as MatrixVectorArgs: the matrix is a (its rows as lines) where N = 1, else b (its columns), by
// each of A's rows in turn.
MatrixVectorArgs matrix_vector_args(const MatmulPlan& plan);

// The products into `out` ([batch, lines] contiguous floats, every element written): on the CPU
// (matrix_vector.cpp), and on the GPU on the current stream (matrix_vector_cuda.cu).
void matrix_vector_cpu(const MatmulPlan& plan, float* out);
void matrix_vector_cuda(const MatmulPlan& plan, const at::Tensor& out);

}  // namespace wmmae_ops
