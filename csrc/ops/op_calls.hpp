// The wmmae operators called through the dispatcher from inside the library: the autograd kernels (whose
// derivatives are calls of the ops themselves) and the autocast kernel (which calls the op once it has cast).
// Each call dispatches from the keys the caller leaves in place, like a call from Python.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>

namespace wmmae_ops {

inline at::Tensor call_corrected_matmul(const at::Tensor& a, const at::Tensor& b, c10::string_view method) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("wmmae::corrected_matmul", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view)>();
  return op.call(a, b, method);
}

inline at::Tensor call_batched_outer(const at::Tensor& u, const std::optional<at::Tensor>& v, double alpha,
                                     std::optional<at::ScalarType> out_dtype) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("wmmae::batched_outer", "")
                             .typed<at::Tensor(const at::Tensor&, const std::optional<at::Tensor>&, double,
                                               std::optional<at::ScalarType>)>();
  return op.call(u, v, alpha, out_dtype);
}

}  // namespace wmmae_ops
