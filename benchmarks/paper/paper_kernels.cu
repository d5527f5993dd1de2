// Kernels of the paper's Figs. 3 and 5 (Ootomo & Yokota, WMMA API extension): batched v v^T of fp16 vectors
// (length N = 16 or 32, one warp per vector) written as float32 N x N matrices, optionally plus alpha*I.
// The WMMA-API-only way builds the fragments from tiles in shared memory (the vector in the first column /
// row of a zero-padded tile, alpha*I as a tile); the extension builds them in registers (load_vector,
// make_identity). Both store with store_matrix_sync, so only the way the fragments are made differs.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <torch/library.h>

#include "wmmae/wmmae.hpp"

namespace {

using namespace nvcuda;
constexpr int kWarps = 8;

template <int N, bool kExtension, bool kIdentity>
__global__ void __launch_bounds__(kWarps * 32) outer_kernel(const __half* __restrict__ v, float* __restrict__ out,
                                                            long long batch, float alpha) {
  constexpr int T = N / 16;  // tiles per side
  __shared__ __align__(32) __half padded[kWarps][2][16 * 16];  // per warp: A tile (column 0), B tile (row 0)
  __shared__ __align__(32) float identity[16 * 16];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (!kExtension) {
    for (int i = lane; i < 16 * 16; i += 32) {
      padded[warp][0][i] = __float2half(0.0f);
      padded[warp][1][i] = __float2half(0.0f);
    }
    if (kIdentity) {
      for (int i = threadIdx.x; i < 16 * 16; i += blockDim.x) identity[i] = (i / 16 == i % 16) ? alpha : 0.0f;
    }
    __syncthreads();
  }
  for (long long b = static_cast<long long>(blockIdx.x) * kWarps + warp; b < batch;
       b += static_cast<long long>(gridDim.x) * kWarps) {
    const __half* vb = v + b * N;
    float* ob = out + b * N * N;
#pragma unroll
    for (int ti = 0; ti < T; ++ti) {
#pragma unroll
      for (int tj = 0; tj < T; ++tj) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::col_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> bf;
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
        if constexpr (kExtension) {
          wmmae::load_vector(a, vb + ti * 16, 16);
          wmmae::load_vector(bf, vb + tj * 16, 16);
          if (kIdentity && ti == tj) wmmae::make_identity(c, alpha);
          else wmma::fill_fragment(c, 0.0f);
        } else {
          // col_major A: column 0 is the first 16 elements; row_major B: row 0 likewise.
          if (lane < 16) {
            padded[warp][0][lane] = vb[ti * 16 + lane];
            padded[warp][1][lane] = vb[tj * 16 + lane];
          }
          __syncwarp();
          wmma::load_matrix_sync(a, padded[warp][0], 16);
          wmma::load_matrix_sync(bf, padded[warp][1], 16);
          if (kIdentity && ti == tj) wmma::load_matrix_sync(c, identity, 16, wmma::mem_row_major);
          else wmma::fill_fragment(c, 0.0f);
          __syncwarp();
        }
        wmma::mma_sync(c, a, bf, c);
        wmma::store_matrix_sync(ob + ti * 16 * N + tj * 16, c, N, wmma::mem_row_major);
      }
    }
  }
}

template <int N, bool kIdentity>
void launch(const at::Tensor& v, at::Tensor& out, bool extension, double alpha) {
  const long long batch = v.size(0);
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int blocks = static_cast<int>(std::min<long long>((batch + kWarps - 1) / kWarps, sms * 16LL));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const auto* vp = reinterpret_cast<const __half*>(v.data_ptr<at::Half>());
  if (extension) outer_kernel<N, true, kIdentity><<<blocks, kWarps * 32, 0, stream>>>(vp, out.data_ptr<float>(), batch, alpha);
  else outer_kernel<N, false, kIdentity><<<blocks, kWarps * 32, 0, stream>>>(vp, out.data_ptr<float>(), batch, alpha);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// v: (batch, N) float16, N in {16, 32}; returns (batch, N, N) float32 = v v^T (+ alpha I when identity).
at::Tensor outer(const at::Tensor& v, bool extension, bool identity, double alpha) {
  TORCH_CHECK(v.is_cuda() && v.scalar_type() == at::kHalf && v.dim() == 2 && v.is_contiguous(), "v: contiguous (batch, N) fp16 CUDA");
  const int64_t n = v.size(1);
  TORCH_CHECK(n == 16 || n == 32, "N must be 16 or 32");
  at::Tensor out = at::empty({v.size(0), n, n}, v.options().dtype(at::kFloat));
  if (n == 16) identity ? launch<16, true>(v, out, extension, alpha) : launch<16, false>(v, out, extension, alpha);
  else identity ? launch<32, true>(v, out, extension, alpha) : launch<32, false>(v, out, extension, alpha);
  return out;
}

}  // namespace

TORCH_LIBRARY(wmmae_paper, m) {
  m.def("outer(Tensor v, bool extension, bool identity, float alpha) -> Tensor");
  m.impl("outer", c10::DispatchKey::CUDA, TORCH_FN(outer));
}
