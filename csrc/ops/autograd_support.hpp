// What the autograd kernels of both ops (corrected_matmul_autograd.cpp, batched_outer_autograd.cpp) share.
//
// They are written the way PyTorch's generated kernels for its own ops are (VariableType): a graph node of
// their own (a torch::autograd::Node with the inputs saved), history set on the output, and a forward-mode
// tangent computed from the inputs' tangents. Not a torch::autograd::Function: that has no forward mode, and
// functorch's transforms (torch.func.grad, vjp, jacrev, jacfwd, hessian, jvp) refuse it, while they take a
// kernel built like ATen's, because they run it inside their own layers as they run any ATen op.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/dynamo/compiled_autograd.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace wmmae_ops {

// t's forward-mode tangent (torch.autograd.forward_ad, torch.func.jvp and jacfwd all use level 0; functorch
// nests its levels in its own wrappers), or an undefined tensor where there is none or it is a symbolic zero.
inline at::Tensor forward_tangent(const at::Tensor& t) {
  if (!t.defined()) return {};
  const at::Tensor& tangent = t._fw_grad(/*level=*/0);
  return tangent.defined() && !tangent._is_zerotensor() ? tangent : at::Tensor();
}

// t without its tangent, to multiply another input's tangent by: the product of two tangents is second order
// and must not become part of the output's tangent.
inline at::Tensor forward_primal(const at::Tensor& t) {
  return t.defined() && t._fw_grad(/*level=*/0).defined() ? t._fw_primal(/*level=*/0) : t;
}

// The sum of the defined terms of a tangent (undefined if none is).
inline at::Tensor add_defined(at::Tensor x, const at::Tensor& y) {
  if (!x.defined()) return y;
  return y.defined() ? x + y : x;
}

// A new node of type NodeT for an op whose differentiable inputs are `inputs`, where gradient mode is on and
// one of them requires a gradient; null otherwise (then the output records no history).
template <class NodeT, class... Inputs>
std::shared_ptr<NodeT> make_grad_fn(const Inputs&... inputs) {
  if (!torch::autograd::compute_requires_grad(inputs...)) return nullptr;
  std::shared_ptr<NodeT> node(new NodeT(), torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(inputs...));
  return node;
}

// Compiled Autograd (torch._dynamo.compiled_autograd, the backward pass traced as one graph) does not run a node's
// apply(). The node's apply_with_saved hands it a function of (incoming gradients, packed values) that computes the
// node's gradients, and it puts a call of that function into its graph, as PyTorch's own nodes do. A node packs the
// values it saved (swapped for the graph's proxies by SwapSavedVariables::before) with their types, which are the
// function's schema; the function unpacks them in the same order (torch::dynamo::autograd::PackedArgs).
class CompiledAutogradCall {
 public:
  template <class T>
  void pack(const T& value) {
    values_.push_back(torch::dynamo::autograd::IValuePacker<T>::pack(value));
    schema_.push_back(torch::dynamo::autograd::IValuePacker<T>::packed_type());
  }

  // A call of fn(grads, packed values) in the graph under construction; returns the gradients' placeholders.
  // (Bound as a "custom function": under a fresh name at each call, since its Python namespace is the process's.)
  torch::autograd::variable_list call(const torch::autograd::Node& node, torch::autograd::SwapSavedVariables& saved,
                                      const std::string& fn_name, torch::autograd::functional_apply_t fn,
                                      const torch::autograd::variable_list& grads) const {
    namespace ca = torch::dynamo::autograd;
    const auto& compiler = ca::getPyCompilerInterface();
    const std::string bound = compiler->bind_function(saved.get_py_compiler(), fn_name, std::move(fn), schema_,
                                                      /*is_custom_function=*/true, /*is_traceable=*/true);
    const at::IValue output_metadata =
        ca::IValuePacker<std::vector<std::optional<torch::autograd::InputMetadata>>>::pack(
            ca::get_input_metadata(node.next_edges()));
    return compiler->call_function(saved.get_py_compiler(), "apply_functional", bound, grads, values_,
                                   output_metadata);
  }

 private:
  std::vector<at::IValue> values_;
  std::vector<at::TypePtr> schema_;
};

// A saved operand as a value to pack: nullopt where it was not saved (no gradient reads it).
inline std::optional<at::Tensor> saved_or_none(const torch::autograd::SavedVariable& saved) {
  at::Tensor t = saved.unpack();
  return t.defined() ? std::optional<at::Tensor>(std::move(t)) : std::nullopt;
}

}  // namespace wmmae_ops
