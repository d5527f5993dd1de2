// Argument checks that both ops make, each with one message.
#pragma once

#include <ATen/ATen.h>

#include <sstream>
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

// The name Python users write for a layout (c10 prints Sparse, SparseCsr, Mkldnn, ...).
inline std::string layout_name(c10::Layout layout) {
  switch (layout) {
    case c10::kStrided: return "torch.strided";
    case c10::kSparse: return "torch.sparse_coo";
    case c10::kSparseCsr: return "torch.sparse_csr";
    case c10::kSparseCsc: return "torch.sparse_csc";
    case c10::kSparseBsr: return "torch.sparse_bsr";
    case c10::kSparseBsc: return "torch.sparse_bsc";
    case c10::kMkldnn: return "torch._mkldnn";
    case c10::kJagged: return "torch.jagged";
    default: {
      std::ostringstream name;
      name << layout;
      return name.str();
    }
  }
}

// A dense tensor: strided and not nested. (Sparse, quantized, MKL-DNN and nested tensors reach the ops' kernels
// registered for their dispatch keys in registration.cpp, which run these checks.)
inline void check_dense(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.layout() == at::kStrided, op, ": argument '", name, "' must be a dense (strided) tensor, got ",
              layout_name(t.layout()));
  TORCH_CHECK(!t.is_nested(), op, ": argument '", name, "' must be a dense (strided) tensor, got a nested tensor");
}

}  // namespace wmmae_ops
