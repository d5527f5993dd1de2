// Autograd of batched_outer: out = u v^T + alpha I per batch index, so
//   reverse mode, for an incoming gradient g (..., n, n):
//     grad_u = g v      grad_v = g^T u      (v = None: grad_u = (g + g^T) u)
//   forward mode:  out_t = u_t v^T + u v_t^T    (v = None: u_t u^T + u u_t^T)
// The reverse products in float32 (the inputs are at most float32) with differentiable ATen ops, so that
// higher derivatives work, returned in the inputs' dtype: products and sums rather than at::matmul, which
// may run a float32 matmul in TF32 (torch.backends.cuda.matmul.allow_tf32, set_float32_matmul_precision),
// about 10 bits. The forward tangent with batched_outer itself, its two terms summed in float32 and rounded
// once to the output's dtype. alpha and out_dtype get no derivative. Built like PyTorch's own kernels
// (autograd_support.hpp), so torch.func's transforms take it.
//
// In C++ for the reasons given in corrected_matmul_autograd.cpp: a call that records no gradient only
// redispatches, and LibTorch programs get the gradients too.
#include <torch/library.h>

#include <optional>
#include <vector>

#include "autograd_support.hpp"
#include "op_calls.hpp"

namespace wmmae_ops {
namespace {

using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

// g (..., n, n) times x (..., n) as a column: (..., n), in float32.
at::Tensor times_vector(const at::Tensor& g, const at::Tensor& x) {
  return (g.to(at::kFloat) * x.to(at::kFloat).unsqueeze(-2)).sum(-1);
}

// The gradients of batched_outer(u, v) that are asked for (need_u: grad_u, which reads v; need_v: grad_v, which
// reads u), for the incoming gradient g, in the inputs' dtypes; v_is_u: the call had no v, so u is both and its
// gradient is the one asked for by need_u. The node's apply() and its function in Compiled Autograd's graph both
// compute them here.
variable_list batched_outer_gradients(const at::Tensor& g, const at::Tensor& u, const at::Tensor& v, bool v_is_u,
                                      at::ScalarType u_dtype, at::ScalarType v_dtype, bool need_u, bool need_v) {
  variable_list grad_inputs(v_is_u ? 1 : 2);
  if (!g.defined()) return grad_inputs;
  if (v_is_u) {
    if (need_u) {
      const at::Tensor g32 = g.to(at::kFloat);  // (the sum in float32 too: g may be fp16/bf16)
      grad_inputs[0] = times_vector(g32 + g32.transpose(-1, -2), u).to(u_dtype);
    }
    return grad_inputs;
  }
  if (need_u) grad_inputs[0] = times_vector(g, v).to(u_dtype);
  if (need_v) grad_inputs[1] = times_vector(g.transpose(-1, -2), u).to(v_dtype);
  return grad_inputs;
}

struct BatchedOuterBackward : public torch::autograd::Node {
  // grad_u reads v and grad_v reads u, so each is saved only where the other's gradient is wanted (v = None:
  // v is u, saved once for grad_u); an operand that no gradient reads may be changed in place after the call.
  SavedVariable u_, v_;
  bool v_is_u_ = false;
  at::ScalarType u_dtype_ = at::kFloat, v_dtype_ = at::kFloat;

  std::string name() const override { return "BatchedOuterBackward"; }
  void release_variables() override {
    u_.reset_data();
    v_.reset_data();
  }
  variable_list apply(variable_list&& grad_outputs) override {
    if (!grad_outputs[0].defined()) return variable_list(v_is_u_ ? 1 : 2);
    // (task_: only the gradients this backward pass asks for, as in CorrectedMatmulBackward.)
    const bool need_u = task_should_compute_output(0), need_v = !v_is_u_ && task_should_compute_output(1);
    const bool u_read = v_is_u_ ? need_u : need_v;
    return batched_outer_gradients(grad_outputs[0], u_read ? u_.unpack(shared_from_this()) : at::Tensor(),
                                   !v_is_u_ && need_u ? v_.unpack(shared_from_this()) : at::Tensor(), v_is_u_,
                                   u_dtype_, v_dtype_, need_u, need_v);
  }

  // Compiled Autograd (autograd_support.hpp, CompiledAutogradCall).
  void compiled_args(torch::autograd::CompiledNodeArgs& args) const override {
    args.collect(u_, /*is_output=*/false);
    args.collect(v_, /*is_output=*/false);
    args.collect(v_is_u_);
    args.collect(u_dtype_);
    args.collect(v_dtype_);
  }
  variable_list apply_with_saved(const variable_list& grads, torch::autograd::SwapSavedVariables& saved) override {
    saved.before(u_);
    saved.before(v_);
    CompiledAutogradCall call;
    call.pack(saved_or_none(u_));
    call.pack(saved_or_none(v_));
    call.pack(v_is_u_);
    call.pack(u_dtype_);
    call.pack(v_dtype_);
    call.pack(task_should_compute_output(0));
    call.pack(!v_is_u_ && task_should_compute_output(1));
    variable_list result = call.call(*this, saved, name(), &gradients_of_packed, grads);
    saved.after(u_);
    saved.after(v_);
    return result;
  }
  static variable_list gradients_of_packed(const variable_list& grads, const std::vector<c10::IValue>& values) {
    torch::dynamo::autograd::PackedArgs packed(values);
    const auto u = packed.unpack<std::optional<at::Tensor>>();
    const auto v = packed.unpack<std::optional<at::Tensor>>();
    const bool v_is_u = packed.unpack<bool>();
    const auto u_dtype = packed.unpack<at::ScalarType>();
    const auto v_dtype = packed.unpack<at::ScalarType>();
    const bool need_u = packed.unpack<bool>(), need_v = packed.unpack<bool>();
    return batched_outer_gradients(grads[0], u.value_or(at::Tensor()), v.value_or(at::Tensor()), v_is_u, u_dtype,
                                   v_dtype, need_u, need_v);
  }
};

at::Tensor batched_outer_autograd(const at::Tensor& u, const std::optional<at::Tensor>& v, double alpha,
                                  std::optional<at::ScalarType> out_dtype) {
  // (The node's inputs: u, and v where the call has one.)
  const auto grad_fn = v.has_value() ? make_grad_fn<BatchedOuterBackward>(u, *v) : make_grad_fn<BatchedOuterBackward>(u);
  if (grad_fn) {
    grad_fn->v_is_u_ = !v.has_value();
    if (grad_fn->v_is_u_ || grad_fn->should_compute_output(1)) grad_fn->u_ = SavedVariable(u, /*is_output=*/false);
    if (!grad_fn->v_is_u_ && grad_fn->should_compute_output(0)) grad_fn->v_ = SavedVariable(*v, /*is_output=*/false);
    grad_fn->u_dtype_ = u.scalar_type();
    grad_fn->v_dtype_ = v.has_value() ? v->scalar_type() : u.scalar_type();
  }
  at::Tensor out;
  {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    out = call_batched_outer(u, v, alpha, out_dtype);
  }
  if (grad_fn) torch::autograd::set_history(out, grad_fn);
  const at::Tensor u_t = forward_tangent(u), v_t = v.has_value() ? forward_tangent(*v) : u_t;
  if (u_t.defined() || v_t.defined()) {
    const at::Tensor u_p = forward_primal(u), v_p = v.has_value() ? forward_primal(*v) : u_p;
    at::Tensor out_t;  // in float32, rounded once below
    if (u_t.defined()) out_t = call_batched_outer(u_t, v_p, 0.0, at::kFloat);
    if (v_t.defined()) out_t = add_defined(out_t, call_batched_outer(u_p, v_t, 0.0, at::kFloat));
    out._set_fw_grad(out_t.to(out.scalar_type()), /*level=*/0, /*is_inplace_op=*/false);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(wmmae, Autograd, m) { m.impl("batched_outer", &batched_outer_autograd); }

}  // namespace wmmae_ops
