// batched_outer(u, v=None, alpha=0, out_dtype=None) = u_b v_b^T + alpha*I for every batch index b.
// Argument checks shared by the CPU and CUDA implementations.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace wmmae_ops {

struct BatchedOuterArgs {
  at::Tensor v;                 // v, or u when v is None
  at::ScalarType out_dtype;     // float32 unless given
};

BatchedOuterArgs check_batched_outer(const at::Tensor& u, const std::optional<at::Tensor>& v,
                                     std::optional<at::ScalarType> out_dtype);

// Output shape: u.shape + (n,).
std::vector<std::int64_t> batched_outer_shape(const at::Tensor& u);

}  // namespace wmmae_ops
