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

struct CorrectedMatmulBackward : public torch::autograd::Node {
  // Each operand is saved only where the other's gradient reads it (grad_a needs b, grad_b needs a), as
  // PyTorch's mm does: a product with a frozen weight keeps no activation alive, and an operand that no
  // gradient reads may be changed in place after the call.
  SavedVariable a_, b_;
  std::vector<c10::SymInt> a_sizes_, b_sizes_;  // as matrices (matrix_sym_sizes)
  bool a_is_vector_ = false, b_is_vector_ = false;
  std::string method_;

  std::string name() const override { return "CorrectedMatmulBackward"; }
  void release_variables() override {
    a_.reset_data();
    b_.reset_data();
  }
  variable_list apply(variable_list&& grad_outputs) override {
    variable_list grad_inputs(2);
    at::Tensor grad = grad_outputs[0];
    if (!grad.defined()) return grad_inputs;
    // Promote 1-D operands to matrices as torch.matmul does, then drop the added dimensions again. b's column
    // dimension first: for 1-D @ 1-D the gradient is 0-d and has no dimension -2 yet.
    if (b_is_vector_) grad = grad.unsqueeze(-1);
    if (a_is_vector_) grad = grad.unsqueeze(-2);
    // task_: only the gradients this backward pass asks for (torch.autograd.grad(out, a) or backward(inputs=[a])
    // leaves b's edge in the graph, but not in the task; should_compute_output would compute grad_b for nothing).
    if (task_should_compute_output(0)) {
      const at::Tensor b = b_.unpack(shared_from_this());
      const at::Tensor b2 = b_is_vector_ ? b.unsqueeze(-1) : b;
      at::Tensor grad_a = at::sum_to(call_corrected_matmul(grad, b2.transpose(-1, -2), method_), a_sizes_);
      grad_inputs[0] = a_is_vector_ ? grad_a.squeeze(0) : grad_a;
    }
    if (task_should_compute_output(1)) {
      const at::Tensor a = a_.unpack(shared_from_this());
      const at::Tensor a2 = a_is_vector_ ? a.unsqueeze(0) : a;
      // b one matrix broadcast over a's batch (x @ W): the sum over the batch is one product of a's rows, as
      // [K, batch x M] @ [batch x M, N], not batch products of K x N summed afterwards (a temporary the size of b
      // times the batch), where a's and grad's rows are views (no copy) and not in deterministic mode (no split-K
      // there: a W of few output tiles would be few blocks, each over all batch x M rows).
      const bool one_product = b_sizes_.size() == 2 && a2.dim() > 2 &&
                               !at::globalContext().deterministicAlgorithms();
      const at::Tensor a_rows = one_product ? rows_view(a2) : at::Tensor();
      const at::Tensor grad_rows = a_rows.defined() ? rows_view(grad) : at::Tensor();
      at::Tensor grad_b;
      if (grad_rows.defined()) {
        grad_b = call_corrected_matmul(a_rows.transpose(0, 1), grad_rows, method_);
      } else {
        grad_b = at::sum_to(call_corrected_matmul(a2.transpose(-1, -2), grad, method_), b_sizes_);
      }
      grad_inputs[1] = b_is_vector_ ? grad_b.squeeze(-1) : grad_b;
    }
    return grad_inputs;
  }
};

at::Tensor corrected_matmul_autograd(const at::Tensor& a, const at::Tensor& b, c10::string_view method) {
  const auto grad_fn = make_grad_fn<CorrectedMatmulBackward>(a, b);
  if (grad_fn) {
    if (grad_fn->should_compute_output(1)) grad_fn->a_ = SavedVariable(a, /*is_output=*/false);
    if (grad_fn->should_compute_output(0)) grad_fn->b_ = SavedVariable(b, /*is_output=*/false);
    grad_fn->a_sizes_ = matrix_sym_sizes(a, 0);
    grad_fn->b_sizes_ = matrix_sym_sizes(b, 1);
    grad_fn->a_is_vector_ = a.dim() == 1;
    grad_fn->b_is_vector_ = b.dim() == 1;
    grad_fn->method_ = std::string(method);
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
