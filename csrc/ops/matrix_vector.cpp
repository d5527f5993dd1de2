// The host side of corrected_matmul's matrix-vector path (matrix_vector.hpp): when it applies, the operands as a
// matrix and a vector, and the CPU's products.
#include "matrix_vector.hpp"

#include <ATen/Parallel.h>

#include <algorithm>

#include "kernel_switches.hpp"

namespace wmmae_ops {

bool matrix_vector_applies(const MatmulPlan& plan) {
  const bool tiny = plan.m <= kTinyOutputSide && plan.n <= kTinyOutputSide;
  if (plan.m != 1 && plan.n != 1 && !tiny) return false;
  return env_switch("TORCH_WMMAE_MATRIX_VECTOR") != Switch::kOff;
}

MatrixVectorArgs matrix_vector_args(const MatmulPlan& plan) {
  const at::Tensor& a = plan.a;  // [*batch, M, K]
  const at::Tensor& b = plan.b;  // [*batch, K, N]
  MatrixVectorArgs args{};
  args.x_is_a = plan.n == 1 && plan.m != 1;
  args.rows = 1;
  args.v_row_stride = 0;
  if (args.x_is_a) {  // N = 1: A's rows times B's column
    args.x = a.data_ptr<float>();
    args.x_line_stride = a.stride(-2);
    args.x_k_stride = a.stride(-1);
    args.v = b.data_ptr<float>();
    args.v_k_stride = b.stride(-2);
    args.lines = plan.m;
  } else {  // M = 1, or a tiny product: each of A's rows times B's columns
    args.x = b.data_ptr<float>();
    args.x_line_stride = b.stride(-1);
    args.x_k_stride = b.stride(-2);
    args.v = a.data_ptr<float>();
    args.v_k_stride = a.stride(-1);
    args.lines = plan.n;
    args.rows = plan.m;
    args.v_row_stride = a.stride(-2);
  }
  args.batch = plan.batch_strides;
  args.k = plan.k;
  args.batches = plan.batch * args.rows;
  return args;
}

void matrix_vector_cpu(const MatmulPlan& plan, float* out) {
  const MatrixVectorArgs args = matrix_vector_args(plan);
  const std::int64_t segments = matrix_vector_segments(args.k), groups = matrix_vector_groups(segments);
  at::parallel_for(0, args.batches * args.lines, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t o = begin; o < end; ++o) {
      const std::int64_t z = o / args.lines, line = o % args.lines;
      std::int64_t x_offset, v_offset;
      args.offsets(z, x_offset, v_offset);
      double total = 0.0;
      for (std::int64_t g = 0; g < groups; ++g) {
        double segment_sum[kMatVecGroupSegments] = {};
        for (int j = 0; j < kMatVecGroupSegments; ++j) {
          const std::int64_t k0 = (g * kMatVecGroupSegments + j) * kMatVecSegmentK;
          if (k0 >= args.k) break;
          segment_sum[j] = matrix_vector_segment_sum(
              args.x + x_offset + line * args.x_line_stride + k0 * args.x_k_stride, args.x_k_stride,
              args.v + v_offset + k0 * args.v_k_stride, args.v_k_stride,
              static_cast<int>(std::min<std::int64_t>(kMatVecSegmentK, args.k - k0)));
        }
        const double group_sum = combine_lane_sums(segment_sum);
        total = g == 0 ? group_sum : total + group_sum;
      }
      out[o] = static_cast<float>(total);
    }
  });
}

}  // namespace wmmae_ops
