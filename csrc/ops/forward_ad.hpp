// The autograd kernels are torch::autograd::Function's, which have no forward-mode derivative: an input with a
// tangent (torch.autograd.forward_ad, torch.func.jvp) would give an output without one, which reads as a zero
// derivative. Such inputs are refused instead.
#pragma once

#include <ATen/ATen.h>

namespace wmmae_ops {

inline void refuse_tangent(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(!t.defined() || !t._fw_grad(/*level=*/0).defined(), op, ": argument '", name,
              "' carries a forward-mode tangent (torch.autograd.forward_ad or torch.func.jvp), and the op has no "
              "forward-mode derivative; use reverse mode (backward, torch.autograd.grad)");
}

}  // namespace wmmae_ops
