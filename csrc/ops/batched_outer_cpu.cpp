// batched_outer on the CPU: the reference, and the CUDA kernels' arithmetic. Every product of two fp16, bf16 or
// float32 values is exact in float64, so an off-diagonal element is the exact product rounded once to
// out_dtype. The diagonal with alpha != 0 is fmaf(u_i, v_i, alpha) in float32, as the CUDA kernels compute it
// (alpha is a float32 value there): u_i v_i + alpha rounded once to float32 (float64 would round twice where
// the exact sum needs more than its 53 bits), and then to out_dtype where that is 16-bit.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>

#include "batched_outer.hpp"

namespace wmmae_ops {

at::Tensor batched_outer_cpu(const at::Tensor& u, const std::optional<at::Tensor>& v_opt, double alpha,
                             std::optional<at::ScalarType> out_dtype) {
  const BatchedOuterArgs args = check_batched_outer(u, v_opt, out_dtype);
  at::Tensor out = u.to(at::kDouble).unsqueeze(-1) * args.v.to(at::kDouble).unsqueeze(-2);
  if (alpha != 0.0 && out.numel() > 0) {
    const at::Tensor uf = u.to(at::kFloat).contiguous(), vf = args.v.to(at::kFloat).contiguous();
    at::Tensor diagonal = at::empty_like(uf);
    const float* up = uf.const_data_ptr<float>();
    const float* vp = vf.const_data_ptr<float>();
    float* dp = diagonal.mutable_data_ptr<float>();
    const float alpha32 = static_cast<float>(alpha);
    at::parallel_for(0, uf.numel(), 4096, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) dp[i] = std::fma(up[i], vp[i], alpha32);
    });
    out.diagonal(0, -2, -1).copy_(diagonal);
  }
  // Into a fresh contiguous tensor, not .contiguous(): a zero-size result of transposed inputs counts as
  // contiguous with the inputs' strides, and the CUDA and fake kernels give at::empty's.
  return at::empty(batched_outer_shape(u), u.options().dtype(args.out_dtype)).copy_(out);
}

}  // namespace wmmae_ops
