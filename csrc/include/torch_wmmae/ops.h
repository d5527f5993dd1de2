// C++ API of torch-wmmae for LibTorch programs. Each function calls the registered operator through the
// PyTorch dispatcher, so device dispatch, device guards and argument checks are those of the Python API
// (torch_wmmae.corrected_matmul etc., documented in the README). Link the torch_wmmae library
// (find_package(torch_wmmae) then target_link_libraries(... torch_wmmae::torch_wmmae)).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

namespace torch_wmmae {

// float32 matmul on tensor cores with error correction; torch.matmul's shape rules.
// method: "auto" (default), "fp16" or "tf32". Differentiable (reverse and forward mode: the autograd is
// registered in C++ too); under at::autocast, float16 and bfloat16 operands are cast to float32.
at::Tensor corrected_matmul(const at::Tensor& a, const at::Tensor& b, c10::string_view method = "auto");

// out[..., :, :] = u v^T + alpha * I; u, v of shape (..., n), float16, bfloat16 or float32; v defaults to u;
// out_dtype float32 (default), float16 or bfloat16. Differentiable in u and v (reverse and forward mode).
at::Tensor batched_outer(const at::Tensor& u, const std::optional<at::Tensor>& v = std::nullopt, double alpha = 0.0,
                         std::optional<at::ScalarType> out_dtype = std::nullopt);

// int32 [32, num_elements, 2]: the (row, col) of each lane's frag.x[i]. Give exactly one of arch (analytic
// table) and device (measured on that GPU).
at::Tensor fragment_map(c10::string_view use, std::int64_t m, std::int64_t n, std::int64_t k, c10::string_view dtype,
                        std::optional<c10::string_view> layout = std::nullopt,
                        std::optional<std::int64_t> arch = std::nullopt, std::optional<at::Device> device = std::nullopt);

}  // namespace torch_wmmae
