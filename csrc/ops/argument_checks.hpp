// Argument checks that both ops make, each with one message.
#pragma once

#include <ATen/ATen.h>

namespace wmmae_ops {

// A dense tensor: strided and not nested. (Sparse, quantized, MKL-DNN and nested tensors reach the ops' kernels
// registered for their dispatch keys in registration.cpp, which run these checks.)
inline void check_dense(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.layout() == at::kStrided, op, ": argument '", name, "' must be a dense (strided) tensor, got layout ",
              t.layout());
  TORCH_CHECK(!t.is_nested(), op, ": argument '", name, "' must be a dense (strided) tensor, got a nested tensor");
}

}  // namespace wmmae_ops
