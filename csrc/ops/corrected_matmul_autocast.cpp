// corrected_matmul under autocast (torch.autocast, at::autocast) runs in float32, as autocast runs PyTorch's own
// precision-sensitive ops: float16 and bfloat16 operands (a previous layer's output, say) are cast to float32,
// exactly, and the op runs with autocast off. float64 and float32 pass unchanged (float64 is then refused by
// the op's checks). Outside autocast a 16-bit operand is an error, as before.
//
// In C++, so that LibTorch programs get it too; also because torch.library.register_autocast, for an op defined
// in C++, gives both autocast keys the Python kernel of the last device type registered (torch 2.11), which
// casts only that device's tensors: CUDA operands went uncast under torch.compile.
#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include "op_calls.hpp"

namespace wmmae_ops {
namespace {

at::Tensor to_float32(const at::Tensor& t) {
  const auto dtype = t.scalar_type();
  return dtype == at::kHalf || dtype == at::kBFloat16 ? t.to(at::kFloat) : t;
}

at::Tensor corrected_matmul_autocast(const at::Tensor& a, const at::Tensor& b, c10::string_view method) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  return call_corrected_matmul(to_float32(a), to_float32(b), method);
}

}  // namespace

TORCH_LIBRARY_IMPL(wmmae, AutocastCUDA, m) { m.impl("corrected_matmul", &corrected_matmul_autocast); }
TORCH_LIBRARY_IMPL(wmmae, AutocastCPU, m) { m.impl("corrected_matmul", &corrected_matmul_autocast); }

}  // namespace wmmae_ops
