// The C++ API: thin calls of the registered wmmae operators through the dispatcher.
#include "torch_wmmae/ops.h"

#include <ATen/core/dispatch/Dispatcher.h>

namespace torch_wmmae {
namespace {

template <class Signature>
c10::TypedOperatorHandle<Signature> wmmae_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

}  // namespace

at::Tensor corrected_matmul(const at::Tensor& a, const at::Tensor& b, c10::string_view method) {
  static const auto op =
      wmmae_op<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view)>("wmmae::corrected_matmul");
  return op.call(a, b, method);
}

at::Tensor batched_outer(const at::Tensor& u, const std::optional<at::Tensor>& v, double alpha,
                         std::optional<at::ScalarType> out_dtype) {
  static const auto op = wmmae_op<at::Tensor(const at::Tensor&, const std::optional<at::Tensor>&, double,
                                             std::optional<at::ScalarType>)>("wmmae::batched_outer");
  return op.call(u, v, alpha, out_dtype);
}

at::Tensor fragment_map(c10::string_view use, std::int64_t m, std::int64_t n, std::int64_t k, c10::string_view dtype,
                        std::optional<c10::string_view> layout, std::optional<std::int64_t> arch,
                        std::optional<at::Device> device) {
  TORCH_CHECK(arch.has_value() != device.has_value(),
              "fragment_map: pass exactly one of arch (analytic table) and device (measure the GPU)");
  static const auto op =
      wmmae_op<at::Tensor(c10::string_view, std::int64_t, std::int64_t, std::int64_t, c10::string_view,
                          std::optional<c10::string_view>, std::optional<std::int64_t>, std::optional<at::Device>)>(
          "wmmae::fragment_map");
  return op.call(use, m, n, k, dtype, layout, arch, device);
}

}  // namespace torch_wmmae
