// torch.matmul's shape rules for float32 operands, resolved once for the CPU and CUDA corrected_matmul.
// The operands stay views of the caller's tensors (no copies): batch dimensions are broadcast with stride 0
// and passed to the kernels as (size, stride) lists.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "../wmmae/config.hpp"

namespace wmmae_ops {

constexpr int kMaxBatchDims = 6;

// Plain data, passed by value to kernels: the batch index z of the flattened batch maps to
// offsets sum_d idx_d * stride_d, with idx the row-major multi-index of z in `size`.
struct BatchStrides {
  int ndim;
  std::int64_t size[kMaxBatchDims];
  std::int64_t a_stride[kMaxBatchDims];
  std::int64_t b_stride[kMaxBatchDims];
};

struct MatmulPlan {
  at::Tensor a;  // [*batch, M, K] view of the first operand
  at::Tensor b;  // [*batch, K, N] view of the second operand
  std::vector<std::int64_t> out_shape;  // torch.matmul's result shape
  std::int64_t batch, m, n, k;
  BatchStrides batch_strides;  // coalesced; batch == product of sizes
};

WMMAE_HD inline void batch_offsets(const BatchStrides& bs, std::int64_t z, std::int64_t& a_offset,
                                   std::int64_t& b_offset) {
  a_offset = 0;
  b_offset = 0;
  for (int d = bs.ndim - 1; d >= 0; --d) {
    const std::int64_t idx = z % bs.size[d];
    z /= bs.size[d];
    a_offset += idx * bs.a_stride[d];
    b_offset += idx * bs.b_stride[d];
  }
}

// Validates (float32, same device, matching inner dimensions, no 0-d tensors) and plans the product.
MatmulPlan plan_matmul(const at::Tensor& a, const at::Tensor& b, const char* op_name);

// The CUDA GEMM's grid: kGemmTile x kGemmTile output tiles per batch entry (the grid's z extent takes at most
// kMaxGridYZ batch entries, the rest in a loop), each K split `k_splits` times into whole 32-wide k-stages.
constexpr int kGemmTile = 128;
constexpr std::int64_t kMaxGridYZ = 65535;  // CUDA's limit on a grid's y and z extents

struct GemmGrid {
  std::int64_t tiles;        // output tiles of one batch entry (grid x)
  int k_splits;              // blocks per tile along K, 1: no split-K (grid y)
  std::int64_t batch_slots;  // batch entries launched at once, min(batch, kMaxGridYZ) (grid z)
  std::int64_t k_per_split;  // K elements per split, a multiple of 32
  std::int64_t blocks() const { return tiles * k_splits * batch_slots; }
};

// Split-K when the output has too few tiles to fill `sm_count` SMs (one block per SM); off in deterministic
// mode. Host code: the CUDA op launches with it, and the benchmarks record it (op _corrected_matmul_grid).
GemmGrid plan_gemm_grid(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch, std::int64_t sm_count);

}  // namespace wmmae_ops
