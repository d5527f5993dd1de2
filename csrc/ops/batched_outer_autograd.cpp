// Autograd of batched_outer: out = u v^T + alpha I per batch index, so for an incoming gradient g (..., n, n)
//   grad_u = g v      grad_v = g^T u      (v = None: grad_u = (g + g^T) u)
// computed in float32 (the inputs are at most float32) with differentiable ATen ops, so that double backward
// works, and returned in the inputs' dtype. Products and sums rather than at::matmul: a float32 matmul may run
// in TF32 (torch.backends.cuda.matmul.allow_tf32, set_float32_matmul_precision), about 10 bits. alpha and
// out_dtype get no gradient. Forward mode and torch.func transforms are refused (autograd_support.hpp).
//
// In C++ for the reasons given in corrected_matmul_autograd.cpp: a call that records no gradient only
// redispatches, and LibTorch programs get the gradients too.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <optional>

#include "autograd_support.hpp"

namespace wmmae_ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor batched_outer_below_autograd(const at::Tensor& u, const std::optional<at::Tensor>& v, double alpha,
                                        std::optional<at::ScalarType> out_dtype) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("wmmae::batched_outer", "")
                             .typed<at::Tensor(const at::Tensor&, const std::optional<at::Tensor>&, double,
                                               std::optional<at::ScalarType>)>();
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return op.call(u, v, alpha, out_dtype);
}

// g (..., n, n) times x (..., n) as a column: (..., n), in float32.
at::Tensor times_vector(const at::Tensor& g, const at::Tensor& x) {
  return (g.to(at::kFloat) * x.to(at::kFloat).unsqueeze(-2)).sum(-1);
}

class BatchedOuterFunction : public torch::autograd::Function<BatchedOuterFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& u, const std::optional<at::Tensor>& v,
                            double alpha, std::optional<at::ScalarType> out_dtype) {
    ctx->saved_data["v_is_u"] = !v.has_value();
    ctx->save_for_backward({u, v.value_or(u)});
    return batched_outer_below_autograd(u, v, alpha, out_dtype);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& u = saved[0];
    const at::Tensor& v = saved[1];
    const at::Tensor& g = grad_outputs[0];
    if (ctx->saved_data["v_is_u"].toBool()) {
      at::Tensor grad_u;
      if (ctx->needs_input_grad(0)) {
        const at::Tensor g32 = g.to(at::kFloat);  // (the sum in float32 too: g may be fp16/bf16)
        grad_u = times_vector(g32 + g32.transpose(-1, -2), u).to(u.scalar_type());
      }
      return {grad_u, at::Tensor(), at::Tensor(), at::Tensor()};
    }
    at::Tensor grad_u, grad_v;
    if (ctx->needs_input_grad(0)) grad_u = times_vector(g, v).to(u.scalar_type());
    if (ctx->needs_input_grad(1)) grad_v = times_vector(g.transpose(-1, -2), u).to(v.scalar_type());
    return {grad_u, grad_v, at::Tensor(), at::Tensor()};  // none for alpha and out_dtype
  }
};

at::Tensor batched_outer_autograd(const at::Tensor& u, const std::optional<at::Tensor>& v, double alpha,
                                  std::optional<at::ScalarType> out_dtype) {
  refuse_tangent("batched_outer", "u", u);
  if (v.has_value()) refuse_tangent("batched_outer", "v", *v);
  const bool any_requires_grad = u.requires_grad() || (v.has_value() && v->requires_grad());
  if (!at::GradMode::is_enabled() || !any_requires_grad) return batched_outer_below_autograd(u, v, alpha, out_dtype);
  refuse_functorch_transform("batched_outer");
  return BatchedOuterFunction::apply(u, v, alpha, out_dtype);
}

}  // namespace

TORCH_LIBRARY_IMPL(wmmae, Autograd, m) { m.impl("batched_outer", &batched_outer_autograd); }

}  // namespace wmmae_ops
