// What the autograd kernels (corrected_matmul_autograd.cpp, batched_outer_autograd.cpp) cannot do, refused with
// the op's name instead of a silent wrong derivative or a message that names neither op nor argument. They are
// torch::autograd::Function's, which have
// - no forward-mode derivative: an input with a tangent (torch.autograd.forward_ad, torch.func.jvp) would give
//   an output without one, which reads as a zero derivative;
// - no place in functorch's transforms (torch.func.grad, vjp, jacrev), which refuse them.
// It is also where corrected_matmul_autograd.cpp and batched_outer_autograd.cpp get torch's Function header.
#pragma once

#include <ATen/ATen.h>
#include <ATen/FuncTorchTLS.h>

// gcc 13 warns -Warray-bounds and -Wstringop-overflow in std::vector<bool> as inlined into torch's
// Function::apply: false positives in torch's header, reached from both autograd kernels. Off for that header
// only: gcc judges a warning from inlined code by the pragmas in force at each call site of the inlining
// chain, and the chain passes through this header's lines.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#endif
#include <torch/csrc/autograd/custom_function.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

namespace wmmae_ops {

inline void refuse_tangent(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(!t.defined() || !t._fw_grad(/*level=*/0).defined(), op, ": argument '", name,
              "' carries a forward-mode tangent (torch.autograd.forward_ad or torch.func.jvp), and the op has no "
              "forward-mode derivative; use reverse mode (backward, torch.autograd.grad)");
}

// Before recording a gradient: the check torch::autograd::Function::apply makes, with the op's name.
inline void refuse_functorch_transform(const char* op) {
  const auto& functorch_state = at::functorch::functorchTLSAccessor();
  if (!functorch_state) return;
  try {
    functorch_state->checkSupportsCppAutogradFunction();
  } catch (const c10::Error&) {
    TORCH_CHECK(false, op, ": gradients inside torch.func transforms (grad, vjp, jacrev, vmap of a gradient) are "
                "not supported: the op's autograd is a C++ torch::autograd::Function; use torch.autograd.grad or "
                "backward()");
  }
}

}  // namespace wmmae_ops
