// Calls wmmae::corrected_matmul through the dispatcher, naming no symbol of libtorch_wmmae.so: the library is
// only reached through the operators it registers when it is loaded, so the link must keep it.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdio>

int main() {
  const auto handle = c10::Dispatcher::singleton().findSchema({"wmmae::corrected_matmul", ""});
  if (!handle.has_value()) {
    std::printf("wmmae::corrected_matmul is not registered: libtorch_wmmae.so was not loaded\n");
    return 1;
  }
  const auto op = handle->typed<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view)>();
  const at::Tensor a = at::randn({9, 40}), b = at::randn({40, 7});
  const at::Tensor ref = at::matmul(a.to(at::kDouble), b.to(at::kDouble));
  const double err = ((op.call(a, b, "auto").to(at::kDouble) - ref).norm() / ref.norm()).item<double>();
  std::printf("corrected_matmul through the dispatcher: relative error %.2e\n", err);
  return err < 1e-6 ? 0 : 1;
}
