// Multiplies two float32 matrices with torch_wmmae::corrected_matmul and prints the error against a float64
// product, next to torch::matmul's in float32. Runs on the GPU when there is one and the library has CUDA
// kernels (CMake's TORCH_WMMAE_WITH_CUDA=ON), else on the CPU.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/torch.h>
#include <torch_wmmae/ops.h>

#include <cstdio>

// Whether the library was built with its CUDA kernels: a default CMake build has the CPU ones only, and a
// CUDA tensor would then find no kernel for the operator.
bool library_has_cuda_kernels() {
  const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("wmmae::corrected_matmul", "");
  return op.hasKernelForDispatchKey(c10::DispatchKey::CUDA);
}

int main() {
  const bool gpu = torch::cuda::is_available() && library_has_cuda_kernels();
  if (torch::cuda::is_available() && !gpu) {
    std::printf("a GPU is present, but the library has no CUDA kernels (-DTORCH_WMMAE_WITH_CUDA=ON): on the CPU\n");
  }
  const torch::Device device = gpu ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  const int64_t n = gpu ? 2048 : 256;
  torch::manual_seed(0);
  const torch::Tensor a = torch::rand({n, n}, device) * 2 - 1, b = torch::rand({n, n}, device) * 2 - 1;
  const torch::Tensor ref = torch::matmul(a.to(torch::kDouble), b.to(torch::kDouble));
  auto rel_err = [&](const torch::Tensor& c) { return ((c.to(torch::kDouble) - ref).norm() / ref.norm()).item<double>(); };
  const torch::Tensor ours = torch_wmmae::corrected_matmul(a, b);
  const torch::Tensor fp32 = torch::matmul(a, b);  // TF32 is off by default in LibTorch
  std::printf("%s, %ld x %ld x %ld\n", device.str().c_str(), static_cast<long>(n), static_cast<long>(n), static_cast<long>(n));
  std::printf("corrected_matmul relative error vs float64: %.3e\n", rel_err(ours));
  std::printf("torch::matmul fp32 relative error vs float64: %.3e\n", rel_err(fp32));
  return 0;
}
