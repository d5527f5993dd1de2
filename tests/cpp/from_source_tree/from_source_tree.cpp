// The target of torch_wmmae's source tree gives what the installed package gives: the C++ API and, for the
// program's own CUDA code, the device library's headers on the include path.
#include <torch/torch.h>
#include <torch_wmmae/ops.h>

#include <iostream>

#if !__has_include("wmmae/wmmae.hpp")
#error "the device library's headers must be on the target's include path"
#endif

int main() {
  const at::Tensor a = torch::randn({33, 70}, torch::kFloat64), b = torch::randn({70, 21}, torch::kFloat64);
  const at::Tensor c = torch_wmmae::corrected_matmul(a.to(torch::kFloat32), b.to(torch::kFloat32), "auto");
  const at::Tensor ref = a.matmul(b);
  std::cout << "relative error vs float64: " << ((c.to(torch::kFloat64) - ref).norm() / ref.norm()).item<double>()
            << "\n";
}
