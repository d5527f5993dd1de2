// batched_outer on the CPU: the exact reference. Products of fp16/bf16 values are exact in float64, so
// computing in float64 and rounding once to out_dtype is the correctly rounded u v^T + alpha*I.
// alpha is a float32 value (the CUDA kernels hold it in a float32 accumulator): it is rounded to float32 first.
#include <ATen/ATen.h>

#include "batched_outer.hpp"

namespace wmmae_ops {

at::Tensor batched_outer_cpu(const at::Tensor& u, const std::optional<at::Tensor>& v_opt, double alpha,
                             std::optional<at::ScalarType> out_dtype) {
  const BatchedOuterArgs args = check_batched_outer(u, v_opt, out_dtype);
  at::Tensor out = u.to(at::kDouble).unsqueeze(-1) * args.v.to(at::kDouble).unsqueeze(-2);
  if (alpha != 0.0) out.diagonal(0, -2, -1).add_(static_cast<double>(static_cast<float>(alpha)));
  // Into a fresh contiguous tensor, not .contiguous(): a zero-size result of transposed inputs counts as
  // contiguous with the inputs' strides, and the CUDA and fake kernels give at::empty's.
  return at::empty(batched_outer_shape(u), u.options().dtype(args.out_dtype)).copy_(out);
}

}  // namespace wmmae_ops
