// Autograd of corrected_matmul: grad_a = grad @ b^T and grad_b = a^T @ grad, both with corrected_matmul itself
// (so double backward works too), summed over broadcast batch dimensions.
//
// Written in C++ rather than with torch.library.register_autograd: that Python kernel runs on every call, with
// or without gradients, and cost the host 6-10 us per call (H200 machine; benchmarks/NOTES.md), which is what
// decides the speed of small products. Here a call that records no gradient only redispatches, and LibTorch
// programs get the gradients as well.
#include <ATen/ExpandUtils.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <string>

#include "autograd_support.hpp"

namespace wmmae_ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor call_corrected_matmul(const at::Tensor& a, const at::Tensor& b, c10::string_view method) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("wmmae::corrected_matmul", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view)>();
  return op.call(a, b, method);
}

// The backend's kernel (CPU, CUDA, or the fake kernel under torch.compile) with no autograd recording.
at::Tensor corrected_matmul_below_autograd(const at::Tensor& a, const at::Tensor& b, c10::string_view method) {
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return call_corrected_matmul(a, b, method);
}

class CorrectedMatmulFunction : public torch::autograd::Function<CorrectedMatmulFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b, c10::string_view method) {
    ctx->saved_data["method"] = std::string(method);
    ctx->save_for_backward({a, b});
    return corrected_matmul_below_autograd(a, b, method);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& a = saved[0];
    const at::Tensor& b = saved[1];
    const std::string method = ctx->saved_data["method"].toStringRef();
    // Promote 1-D operands to matrices as torch.matmul does, then drop the added dimensions again. b's column
    // dimension first: for 1-D @ 1-D the gradient is 0-d and has no dimension -2 yet.
    const at::Tensor a2 = a.dim() == 1 ? a.unsqueeze(0) : a;
    const at::Tensor b2 = b.dim() == 1 ? b.unsqueeze(-1) : b;
    at::Tensor grad = grad_outputs[0];
    if (b.dim() == 1) grad = grad.unsqueeze(-1);
    if (a.dim() == 1) grad = grad.unsqueeze(-2);
    at::Tensor grad_a, grad_b;
    // sym_sizes: under torch.compile the sizes are symbols, which sizes() would make constants of the graph.
    if (ctx->needs_input_grad(0)) {
      grad_a = at::sum_to(call_corrected_matmul(grad, b2.transpose(-1, -2), method), a2.sym_sizes());
      if (a.dim() == 1) grad_a = grad_a.squeeze(0);
    }
    if (ctx->needs_input_grad(1)) {
      grad_b = at::sum_to(call_corrected_matmul(a2.transpose(-1, -2), grad, method), b2.sym_sizes());
      if (b.dim() == 1) grad_b = grad_b.squeeze(-1);
    }
    return {grad_a, grad_b, at::Tensor()};  // none for `method`
  }
};

at::Tensor corrected_matmul_autograd(const at::Tensor& a, const at::Tensor& b, c10::string_view method) {
  refuse_tangent("corrected_matmul", "a", a);
  refuse_tangent("corrected_matmul", "b", b);
  if (!at::GradMode::is_enabled() || !(a.requires_grad() || b.requires_grad())) {
    return corrected_matmul_below_autograd(a, b, method);
  }
  refuse_functorch_transform("corrected_matmul");
  return CorrectedMatmulFunction::apply(a, b, method);
}

}  // namespace

TORCH_LIBRARY_IMPL(wmmae, Autograd, m) { m.impl("corrected_matmul", &corrected_matmul_autograd); }

}  // namespace wmmae_ops
