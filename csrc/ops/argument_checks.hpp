// Argument checks that both ops make, each with one message.
#pragma once

#include <ATen/ATen.h>

#include <string>

namespace wmmae_ops {

// A dtype as Python prints it ("torch.float64", not c10's "Double"), so that the messages of the C++ checks and
// of the fake kernels (torch.compile) are the same, in the names Python users write.
inline std::string dtype_name(at::ScalarType t) {
  if (t == at::ScalarType::Undefined) return "None (an undefined tensor)";
  try {
    return "torch." + c10::getDtypeNames(t).first;
  } catch (const c10::Error&) {  // (a type without a Python name)
    return c10::toString(t);
  }
}

// A dense tensor: strided and not nested. (Sparse, quantized, MKL-DNN and nested tensors reach the ops' kernels
// registered for their dispatch keys in registration.cpp, which run these checks.)
inline void check_dense(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.layout() == at::kStrided, op, ": argument '", name, "' must be a dense (strided) tensor, got layout ",
              t.layout());
  TORCH_CHECK(!t.is_nested(), op, ": argument '", name, "' must be a dense (strided) tensor, got a nested tensor");
}

}  // namespace wmmae_ops
