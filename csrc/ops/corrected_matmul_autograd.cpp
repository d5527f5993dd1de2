// Autograd of corrected_matmul, with corrected_matmul itself for every derivative (so derivatives of any order
// work), summed over broadcast batch dimensions:
//   reverse mode  grad_a = grad @ b^T      grad_b = a^T @ grad
//   forward mode  out_t = a_t @ b + a @ b_t
// Built like PyTorch's own kernels (autograd_support.hpp), so torch.func's transforms take it.
//
// Written in C++ rather than with torch.library.register_autograd: that Python kernel runs on every call, with
// or without gradients, and cost the host 6-10 us per call (H200 machine; benchmarks/NOTES.md), which is what
// decides the speed of small products. Here a call that records no gradient only redispatches, and LibTorch
// programs get the gradients as well.
#include <ATen/Context.h>
#include <ATen/ExpandUtils.h>
#include <ATen/TensorUtils.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <vector>

#include "autograd_support.hpp"
#include "op_calls.hpp"

namespace wmmae_ops {
namespace {

using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

// The matrix sizes of an operand as torch.matmul promotes it: a 1-D a is a row (1, k), a 1-D b a column (k, 1).
// sym_sizes: under torch.compile the sizes are symbols, which sizes() would make constants of the graph.
std::vector<c10::SymInt> matrix_sym_sizes(const at::Tensor& x, int64_t vector_dim) {
  std::vector<c10::SymInt> sizes = x.sym_sizes().vec();
  if (x.dim() == 1) sizes.insert(sizes.begin() + vector_dim, c10::SymInt(1));
  return sizes;
}

// t ([*, rows, cols]) as the matrix [product of its leading sizes, cols] where that is a view of it, else undefined.
// (The sizes are given, not -1: a tensor of no elements has no size to infer.)
at::Tensor rows_view(const at::Tensor& t) {
  c10::SymInt rows = 1;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) rows = rows * t.sym_size(d);
  const std::vector<c10::SymInt> shape{rows, t.sym_size(-1)};
  return at::detail::computeStride(t.sym_sizes(), t.sym_strides(), shape) ? t.view_symint(shape) : at::Tensor();
}

// What the gradients depend on besides the operands and the incoming gradient.
struct MatmulGradientContext {
  std::vector<c10::SymInt> a_sizes, b_sizes;  // as matrices (matrix_sym_sizes)
  bool a_is_vector = false, b_is_vector = false;
  std::string method;
};

// The gradients of corrected_matmul(a, b) that are asked for (need_a: grad_a, which reads b; need_b: grad_b, which
// reads a), for the incoming gradient grad; the others undefined. The node's apply() and its function in Compiled
// Autograd's graph both compute them here.
variable_list corrected_matmul_gradients(at::Tensor grad, const at::Tensor& a, const at::Tensor& b,
                                         const MatmulGradientContext& c, bool need_a, bool need_b) {
  variable_list grad_inputs(2);
  if (!grad.defined()) return grad_inputs;
  // Promote 1-D operands to matrices as torch.matmul does, then drop the added dimensions again. b's column
  // dimension first: for 1-D @ 1-D the gradient is 0-d and has no dimension -2 yet.
  if (c.b_is_vector) grad = grad.unsqueeze(-1);
  if (c.a_is_vector) grad = grad.unsqueeze(-2);
  if (need_a) {
    const at::Tensor b2 = c.b_is_vector ? b.unsqueeze(-1) : b;
    at::Tensor grad_a = at::sum_to(call_corrected_matmul(grad, b2.transpose(-1, -2), c.method), c.a_sizes);
    grad_inputs[0] = c.a_is_vector ? grad_a.squeeze(0) : grad_a;
  }
  if (need_b) {
    const at::Tensor a2 = c.a_is_vector ? a.unsqueeze(0) : a;
    // b one matrix broadcast over a's batch (x @ W): the sum over the batch is one product of a's rows, as
    // [K, batch x M] @ [batch x M, N], not batch products of K x N summed afterwards (a temporary the size of b
    // times the batch), where a's and grad's rows are views (no copy) and not in deterministic mode (no split-K
    // there: a W of few output tiles would be few blocks, each over all batch x M rows).
    const bool one_product = c.b_sizes.size() == 2 && a2.dim() > 2 && !at::globalContext().deterministicAlgorithms();
    const at::Tensor a_rows = one_product ? rows_view(a2) : at::Tensor();
    const at::Tensor grad_rows = a_rows.defined() ? rows_view(grad) : at::Tensor();
    at::Tensor grad_b;
    if (grad_rows.defined()) {
      grad_b = call_corrected_matmul(a_rows.transpose(0, 1), grad_rows, c.method);
    } else {
      grad_b = at::sum_to(call_corrected_matmul(a2.transpose(-1, -2), grad, c.method), c.b_sizes);
    }
    grad_inputs[1] = c.b_is_vector ? grad_b.squeeze(-1) : grad_b;
  }
  return grad_inputs;
}

struct CorrectedMatmulBackward : public torch::autograd::Node {
  // Each operand is saved only where the other's gradient reads it (grad_a needs b, grad_b needs a), as
  // PyTorch's mm does: a product with a frozen weight keeps no activation alive, and an operand that no
  // gradient reads may be changed in place after the call.
  SavedVariable a_, b_;
  MatmulGradientContext context_;

  std::string name() const override { return "CorrectedMatmulBackward"; }
  void release_variables() override {
    a_.reset_data();
    b_.reset_data();
  }
  variable_list apply(variable_list&& grad_outputs) override {
    // task_: only the gradients this backward pass asks for (torch.autograd.grad(out, a) or backward(inputs=[a])
    // leaves b's edge in the graph, but not in the task; should_compute_output would compute grad_b for nothing).
    if (!grad_outputs[0].defined()) return variable_list(2);
    const bool need_a = task_should_compute_output(0), need_b = task_should_compute_output(1);
    return corrected_matmul_gradients(grad_outputs[0], need_b ? a_.unpack(shared_from_this()) : at::Tensor(),
                                      need_a ? b_.unpack(shared_from_this()) : at::Tensor(), context_, need_a, need_b);
  }

  // Compiled Autograd (autograd_support.hpp, CompiledAutogradCall).
  void compiled_args(torch::autograd::CompiledNodeArgs& args) const override {
    args.collect(a_, /*is_output=*/false);
    args.collect(b_, /*is_output=*/false);
    args.collect(context_.a_sizes);
    args.collect(context_.b_sizes);
    args.collect(context_.a_is_vector);
    args.collect(context_.b_is_vector);
    args.collect(context_.method);
  }
  variable_list apply_with_saved(const variable_list& grads, torch::autograd::SwapSavedVariables& saved) override {
    saved.before(a_);
    saved.before(b_);
    saved.before(context_.a_sizes);
    saved.before(context_.b_sizes);
    CompiledAutogradCall call;
    call.pack(saved_or_none(a_));
    call.pack(saved_or_none(b_));
    call.pack(context_.a_sizes);
    call.pack(context_.b_sizes);
    call.pack(context_.a_is_vector);
    call.pack(context_.b_is_vector);
    call.pack(context_.method);
    call.pack(task_should_compute_output(0));
    call.pack(task_should_compute_output(1));
    variable_list result = call.call(*this, saved, name(), &gradients_of_packed, grads);
    saved.after(a_);
    saved.after(b_);
    saved.after(context_.a_sizes);
    saved.after(context_.b_sizes);
    return result;
  }
  static variable_list gradients_of_packed(const variable_list& grads, const std::vector<c10::IValue>& values) {
    torch::dynamo::autograd::PackedArgs packed(values);
    const auto a = packed.unpack<std::optional<at::Tensor>>();
    const auto b = packed.unpack<std::optional<at::Tensor>>();
    MatmulGradientContext c;
    c.a_sizes = packed.unpack<std::vector<c10::SymInt>>();
    c.b_sizes = packed.unpack<std::vector<c10::SymInt>>();
    c.a_is_vector = packed.unpack<bool>();
    c.b_is_vector = packed.unpack<bool>();
    c.method = packed.unpack<std::string>();
    const bool need_a = packed.unpack<bool>(), need_b = packed.unpack<bool>();
    return corrected_matmul_gradients(grads[0], a.value_or(at::Tensor()), b.value_or(at::Tensor()), c, need_a, need_b);
  }
};

at::Tensor corrected_matmul_autograd(const at::Tensor& a, const at::Tensor& b, c10::string_view method) {
  const auto grad_fn = make_grad_fn<CorrectedMatmulBackward>(a, b);
  if (grad_fn) {
    if (grad_fn->should_compute_output(1)) grad_fn->a_ = SavedVariable(a, /*is_output=*/false);
    if (grad_fn->should_compute_output(0)) grad_fn->b_ = SavedVariable(b, /*is_output=*/false);
    grad_fn->context_.a_sizes = matrix_sym_sizes(a, 0);
    grad_fn->context_.b_sizes = matrix_sym_sizes(b, 1);
    grad_fn->context_.a_is_vector = a.dim() == 1;
    grad_fn->context_.b_is_vector = b.dim() == 1;
    grad_fn->context_.method = std::string(method);
  }
  at::Tensor out;
  {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    out = call_corrected_matmul(a, b, method);
  }
  if (grad_fn) torch::autograd::set_history(out, grad_fn);
  const at::Tensor a_t = forward_tangent(a), b_t = forward_tangent(b);
  if (a_t.defined() || b_t.defined()) {
    at::Tensor out_t;
    if (a_t.defined()) out_t = call_corrected_matmul(a_t, forward_primal(b), method);
    if (b_t.defined()) out_t = add_defined(out_t, call_corrected_matmul(forward_primal(a), b_t, method));
    out._set_fw_grad(out_t, /*level=*/0, /*is_inplace_op=*/false);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(wmmae, Autograd, m) { m.impl("corrected_matmul", &corrected_matmul_autograd); }

}  // namespace wmmae_ops
