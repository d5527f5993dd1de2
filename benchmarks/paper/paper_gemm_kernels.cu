// Kernels of the paper's Figs. 8, 9 and 10 (Ootomo & Yokota, WMMA API extension): an error-corrected fp32
// GEMM C = A B on fp16 tensor cores, in which only the way the hi/lo fragments are made differs.
//
// Arithmetic (the published method, project notes FACTS.md section 2): each fp32 value v is split into hi = fp16(v) and
// lo = fp16((v - hi) * 2^11); per 16-wide k-step three m16n16k16 products: hi_A*hi_B into a zeroed
// accumulator whose result is added to the fp32 sum outside the tensor core, lo_A*hi_B and hi_A*lo_B chained
// in their own accumulator (lo_A*lo_B dropped). C = sum + corrections / 2^11. No per-row scaling, as in the
// paper: inputs must be below fp16's maximum (65504), and elements under fp16's normal range (2^-14) lose
// relative accuracy (the benchmark uses U(-1, 1), where they contribute negligibly to the error).
//
// Block and warp design (the paper's setup: 32x32 output blocks, 256 threads):
//   - A and B: fp32, row-major, contiguous; M, N and K multiples of 32.
//   - grid (N/32, M/32); 8 warps per block. Warp w computes the 16x16 output tile (w%4)/2, (w%4)%2 over the
//     k-steps of its half of each 32-wide stage (w/4): 4 tiles x 2 K-halves. The two partial sums of a tile
//     are added at the end through shared memory.
//   - fp32 stages of 32x32 (A) and 32x32 (B) move global -> shared memory by a 3-stage cp.async ring (one
//     16-byte chunk of A and one of B per thread and stage), one barrier per stage.
//   - Variant::shared_memory (WMMA API only): after the barrier every thread splits the chunks it copied
//     into fp16 hi and residual tiles in shared memory (wmmae::split_fp16x2), a second barrier, then
//     wmma::load_matrix_sync of hi and lo. Each element is split once per block.
//   - Variant::registers: wmmae::load_matrices_with_op reads the fp32 tile and fills hi and lo in one pass
//     (no fp16 copies, no second barrier, a smaller shared-memory footprint). The two warps that use a
//     16x16 sub-tile of A (or B) both split it, so each element is split twice per block.
//   - Variant::registers_single: as registers, but wmmae::load_matrix_with_op once per fragment (hi pass,
//     then lo pass that reads and rounds again): the paper's Fig. 9 comparison.
//   - kSkew: floats of padding per fp32 row (0 or 4) and the same bytes (2*kSkew halves) per fp16 row. With
//     the sm_80+ fragment layout, an unpadded 32-float row stride puts the 32 lanes of a fragment-element
//     load on 4 (A) / 8 (B) banks (8- / 4-way conflicts); +4 floats gives 2 wavefronts for A (the minimum of
//     a paired 64-bit load) and none for B. +8 floats would be worse for B (2-way), so +4 is used. The fp16
//     tiles are read by ldmatrix (8 rows of 16 bytes per phase): 64-byte rows conflict 4-way, 80-byte none.
//   - Occupancy: one register cap for all (below), so every variant runs 5 blocks (40 warps) per SM on sm_90;
//     shared memory (24-37 KB per block) limits none of them there.
// All variants run the same arithmetic in the same order, so their outputs are bitwise identical (the
// benchmark checks this).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>

#include "wmmae/wmmae.hpp"

namespace {

using namespace nvcuda;

constexpr int kBM = 32, kBN = 32, kBK = 32;  // block tile (M, N) and the K extent of one stage
constexpr int kWarps = 8, kThreads = kWarps * 32;
// Resident blocks per SM that the register cap must allow (Turing holds at most 1024 threads per SM).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 750
constexpr int kMinBlocks = 4;
#else
constexpr int kMinBlocks = 5;
#endif
constexpr int kStages = 3;  // fp32 stages in flight: loads of stage kt+2 overlap the products of stage kt

enum class Variant : int { shared_memory = 0, registers = 1, registers_single = 2 };

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Shared-memory layout in bytes. The fp16 tiles exist only in the shared_memory variant: the registers
// variants have the smaller footprint that is part of the paper's point.
template <Variant V, int kSkew>
struct Layout {
  static constexpr int kLdA = kBK + kSkew, kLdB = kBN + kSkew;              // fp32 row strides (floats)
  static constexpr int kLdHA = kBK + 2 * kSkew, kLdHB = kBN + 2 * kSkew;    // fp16 row strides (halves)
  static constexpr int kStageA = kBM * kLdA, kStageB = kBK * kLdB;          // floats per stage
  static constexpr int kHalfA = kBM * kLdHA, kHalfB = kBK * kLdHB;          // halves per fp16 tile
  static constexpr int kFloatBytes = kStages * (kStageA + kStageB) * 4;
  static constexpr int kBytes = kFloatBytes + (V == Variant::shared_memory ? 2 * (kHalfA + kHalfB) * 2 : 0);
  // wmma::load_matrix_sync needs 32-byte aligned tiles and ldm a multiple of 16 bytes; cp.async and the
  // split pass move 16-byte chunks.
  static_assert(kSkew % 4 == 0 && kFloatBytes % 32 == 0 && (kHalfA * 2) % 32 == 0 && (kHalfB * 2) % 32 == 0, "");
  static_assert(kStageA >= 4 * 16 * 16, "the epilogue's reduction tiles reuse stage 0 of A");
};

__device__ __forceinline__ void copy16(float* smem, const float* gmem) {
#if __CUDA_ARCH__ >= 800
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem) : "memory");
#else  // sm_75 (the paper's Turing case): a synchronous copy; the ring's barriers keep it correct
  *reinterpret_cast<float4*>(smem) = __ldg(reinterpret_cast<const float4*>(gmem));
#endif
}
__device__ __forceinline__ void copy_commit() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void copy_wait() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

__device__ __forceinline__ unsigned half2_bits(__half2 h) {
  unsigned u;
  memcpy(&u, &h, sizeof u);
  return u;
}

// hi = fp16(v), lo = fp16((v - hi) * 2^11): the library's split, the same arithmetic in every variant.
__device__ __forceinline__ __half split_hi(float v) {
  __half hi, lo;
  wmmae::split_fp16<wmmae::DeviceHalfRounding>(v, hi, lo);
  return hi;
}
__device__ __forceinline__ __half split_lo(float v) {
  __half hi, lo;
  wmmae::split_fp16<wmmae::DeviceHalfRounding>(v, hi, lo);
  return lo;
}

// The hi and lo fragments of one 16x16 operand tile (A: row-major at ld; B: row-major at ld).
template <Variant V, class Frag>
__device__ __forceinline__ void split_fragments(const float* tile, unsigned ld, Frag& hi, Frag& lo) {
  if constexpr (V == Variant::registers) {
    // One pass: each element is read from shared memory and split once, both fragments filled.
    wmmae::load_matrices_with_op(tile, ld, [](float v, int, int, auto xs, Frag& h, Frag& l) {
      __half hv, lv;
      wmmae::split_fp16<wmmae::DeviceHalfRounding>(v, hv, lv);
      wmmae::assign(h, xs, hv);
      wmmae::assign(l, xs, lv);
    }, hi, lo);
  } else {
    // Two passes (one per fragment); the lo pass reads and rounds to the hi part again.
    wmmae::load_matrix_with_op(hi, tile, ld, [](float v) { return split_hi(v); });
    wmmae::load_matrix_with_op(lo, tile, ld, [](float v) { return split_lo(v); });
  }
}

// One register cap for every variant (sm_90: at most 48 registers, 5 blocks = 40 warps per SM, no spills), so
// that occupancy does not differ between them: uncapped, the registers variants take 57-60 registers (4 blocks
// per SM) and the shared_memory variant 47-48 (5 blocks).
template <Variant V, int kSkew>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    gemm_kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c, int n, int k) {
  using L = Layout<V, kSkew>;
  __shared__ __align__(128) unsigned char smem[L::kBytes];
  float* const a_stages = reinterpret_cast<float*>(smem);
  float* const b_stages = a_stages + kStages * L::kStageA;
  __half* const a_hi = reinterpret_cast<__half*>(smem + L::kFloatBytes);  // shared_memory variant only
  __half* const a_lo = a_hi + L::kHalfA;
  __half* const b_hi = a_lo + L::kHalfA;
  __half* const b_lo = b_hi + L::kHalfB;

  const int warp = threadIdx.x / 32;
  const int tile = warp % 4, ti = tile / 2, tj = tile % 2;  // this warp's 16x16 output tile
  const int kh = warp / 4;                                   // its 16-wide half of each 32-wide stage
  const int row0 = blockIdx.y * kBM, col0 = blockIdx.x * kBN;
  const int k_tiles = k / kBK;

  // Each thread copies (and, in the shared_memory variant, splits) one 16-byte chunk of each 32x32 stage
  // tile: row t/8, columns 4*(t%8) .. +3. Eight consecutive threads cover a 128-byte row: coalesced.
  const int cr = threadIdx.x / 8, cc = (threadIdx.x % 8) * 4;
  const float* const a_src = a + static_cast<long long>(row0 + cr) * k + cc;
  const float* const b_src = b + static_cast<long long>(cr) * n + col0 + cc;
  auto load_stage = [&](int kt) {
    const int buf = kt % kStages;
    copy16(a_stages + buf * L::kStageA + cr * L::kLdA + cc, a_src + kt * kBK);
    copy16(b_stages + buf * L::kStageB + cr * L::kLdB + cc, b_src + static_cast<long long>(kt) * kBK * n);
  };

  FragC sum, corr, prod;
  wmma::fill_fragment(sum, 0.0f);
  wmma::fill_fragment(corr, 0.0f);

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_stage(s);
    copy_commit();  // one group per stage, empty or not, so that wait_group counts stages
  }

  for (int kt = 0; kt < k_tiles; ++kt) {
    copy_wait<kStages - 2>();  // this thread's chunks of stage kt have landed
    __syncthreads();           // everyone's have, and stage kt-1 (the buffer refilled next) is consumed
    if (kt + kStages - 1 < k_tiles) load_stage(kt + kStages - 1);
    copy_commit();

    const float* const as = a_stages + (kt % kStages) * L::kStageA;
    const float* const bs = b_stages + (kt % kStages) * L::kStageB;
    FragA ahi, alo;
    FragB bhi, blo;
    if constexpr (V == Variant::shared_memory) {
      // Split this thread's two chunks into the fp16 tiles (the previous stage's fragment loads finished
      // before the barrier above), then make the fragments with the WMMA API.
      const float4 va = *reinterpret_cast<const float4*>(as + cr * L::kLdA + cc);
      const float4 vb = *reinterpret_cast<const float4*>(bs + cr * L::kLdB + cc);
      __half2 h0, h1, l0, l1;
      wmmae::split_fp16x2(va.x, va.y, h0, l0);
      wmmae::split_fp16x2(va.z, va.w, h1, l1);
      *reinterpret_cast<uint2*>(a_hi + cr * L::kLdHA + cc) = make_uint2(half2_bits(h0), half2_bits(h1));
      *reinterpret_cast<uint2*>(a_lo + cr * L::kLdHA + cc) = make_uint2(half2_bits(l0), half2_bits(l1));
      wmmae::split_fp16x2(vb.x, vb.y, h0, l0);
      wmmae::split_fp16x2(vb.z, vb.w, h1, l1);
      *reinterpret_cast<uint2*>(b_hi + cr * L::kLdHB + cc) = make_uint2(half2_bits(h0), half2_bits(h1));
      *reinterpret_cast<uint2*>(b_lo + cr * L::kLdHB + cc) = make_uint2(half2_bits(l0), half2_bits(l1));
      __syncthreads();
      wmma::load_matrix_sync(ahi, a_hi + ti * 16 * L::kLdHA + kh * 16, L::kLdHA);
      wmma::load_matrix_sync(alo, a_lo + ti * 16 * L::kLdHA + kh * 16, L::kLdHA);
      wmma::load_matrix_sync(bhi, b_hi + kh * 16 * L::kLdHB + tj * 16, L::kLdHB);
      wmma::load_matrix_sync(blo, b_lo + kh * 16 * L::kLdHB + tj * 16, L::kLdHB);
    } else {
      split_fragments<V>(as + ti * 16 * L::kLdA + kh * 16, L::kLdA, ahi, alo);
      split_fragments<V>(bs + kh * 16 * L::kLdB + tj * 16, L::kLdB, bhi, blo);
    }
    // hi*hi into a zeroed accumulator, added in fp32 outside the tensor core; corrections chained.
    wmma::fill_fragment(prod, 0.0f);
    wmma::mma_sync(prod, ahi, bhi, prod);
#pragma unroll
    for (int i = 0; i < FragC::num_elements; ++i) sum.x[i] += prod.x[i];
    wmma::mma_sync(corr, alo, bhi, corr);
    wmma::mma_sync(corr, ahi, blo, corr);
  }

  // Both accumulators have the same register layout, so they combine element by element.
#pragma unroll
  for (int i = 0; i < FragC::num_elements; ++i) sum.x[i] += corr.x[i] * wmmae::kFp16ResidualUnscale;
  copy_wait<0>();   // only empty groups can be pending; drain them before the buffers are reused
  __syncthreads();  // every warp is done with the stages: the 4 reduction tiles reuse stage 0 of A
  float* const red = a_stages + tile * 16 * 16;
  if (kh == 1) wmma::store_matrix_sync(red, sum, 16, wmma::mem_row_major);
  __syncthreads();
  if (kh == 0) {
    wmma::load_matrix_sync(prod, red, 16, wmma::mem_row_major);
#pragma unroll
    for (int i = 0; i < FragC::num_elements; ++i) sum.x[i] += prod.x[i];
    wmma::store_matrix_sync(c + static_cast<long long>(row0 + ti * 16) * n + col0 + tj * 16, sum, n,
                            wmma::mem_row_major);
  }
}

template <Variant V, int kSkew>
void launch(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  const int m = static_cast<int>(a.size(0)), k = static_cast<int>(a.size(1)), n = static_cast<int>(b.size(1));
  const dim3 grid(n / kBN, m / kBM);
  gemm_kernel<V, kSkew><<<grid, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
      a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), n, k);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <Variant V>
void launch_skew(const at::Tensor& a, const at::Tensor& b, at::Tensor& out, int64_t skew) {
  if (skew == 0) launch<V, 0>(a, b, out);
  else launch<V, 4>(a, b, out);
}

// a: (M, K), b: (K, N), float32, contiguous, CUDA; M, N, K multiples of 32. variant: 0 shared_memory,
// 1 registers (load_matrices_with_op), 2 registers_single (load_matrix_with_op per fragment); skew 0 or 4.
at::Tensor gemm(const at::Tensor& a, const at::Tensor& b, int64_t variant, int64_t skew) {
  TORCH_CHECK(a.is_cuda() && b.is_cuda() && a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat,
              "gemm: float32 CUDA tensors expected");
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.is_contiguous() && b.is_contiguous(), "gemm: contiguous 2-D operands");
  TORCH_CHECK(a.size(1) == b.size(0), "gemm: inner dimensions differ");
  TORCH_CHECK(reinterpret_cast<std::uintptr_t>(a.data_ptr()) % 16 == 0 &&
                  reinterpret_cast<std::uintptr_t>(b.data_ptr()) % 16 == 0,
              "gemm: operands must be 16-byte aligned (the stages are copied in 16-byte chunks)");
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  TORCH_CHECK(m > 0 && n > 0 && k > 0 && m % 32 == 0 && n % 32 == 0 && k % 32 == 0,
              "gemm: M, N and K must be positive multiples of 32");
  TORCH_CHECK(m / kBM <= 65535 && k < (1LL << 31) && n < (1LL << 31), "gemm: too large");
  TORCH_CHECK(variant >= 0 && variant <= 2 && (skew == 0 || skew == 4), "gemm: variant in 0..2, skew 0 or 4");
  const c10::cuda::CUDAGuard guard(a.device());
  at::Tensor out = at::empty({m, n}, a.options());
  if (variant == 0) launch_skew<Variant::shared_memory>(a, b, out, skew);
  else if (variant == 1) launch_skew<Variant::registers>(a, b, out, skew);
  else launch_skew<Variant::registers_single>(a, b, out, skew);
  return out;
}

}  // namespace

// Its own namespace: paper_kernels.cu defines TORCH_LIBRARY(wmmae_paper), which may exist only once.
TORCH_LIBRARY(wmmae_paper_gemm, m) {
  m.def("gemm(Tensor a, Tensor b, int variant, int skew) -> Tensor");
  m.impl("gemm", c10::DispatchKey::CUDA, TORCH_FN(gemm));
}
