// The float32 fallback of corrected_matmul's "tf32" and "auto" methods. Where the tf32 GEMM computed a tile whose
// lines span more exponents than its split keeps (tf32_spans_fit, corrected_matmul_scheme.hpp),
// float32_fallback_kernel checks the tile's outputs (split_output_at_risk) and, where one is so small that what
// the split lost below float32's normal range may matter, computes the whole tile again with one float32 fused
// multiply-add per product, as torch.matmul does, summed in the split paths' chunks of K. Such tiles are rare
// (a row holding magnitudes 2^150 apart, or outputs far smaller than their rows' and columns' largest
// elements allow), so the recomputation is plain: 64 threads, 8x8 outputs each, slabs of 32 k of A and B through
// shared memory. A kernel of its own: inlined into the tf32 GEMMs (as a call too), its registers made
// ptxas spill in their stage loops. Included by corrected_matmul_cuda.cu after GemmArgs and the tile helpers.
#pragma once

namespace wmmae_ops {

// The kernel is launched in nearly every "tf32" and "auto" call and nearly always only reads wide_tiles_pending
// and returns, so its blocks are small: one of 64 threads per SM (128 registers each). On an H100, per "auto" call
// of 64 x 512^3 against a build without the kernel (session 51, same run): 256 threads per SM +10-12%, four
// blocks of 64 per SM +10%, one +2%; a probe kernel of 256 threads with few registers and the same shared memory
// +1% (why the registers of its resident blocks cost, not found). The recomputation is then slow: 4096^3 with
// every output at risk 17.7 ms with four blocks per SM, torch.matmul 2.6 ms.
constexpr int kFallbackThreads = 64;
constexpr int kFmaSlabK = 32;
constexpr int kFmaQuad = 64;  // the tile is recomputed in four 64x64 quadrants, 8x8 outputs per thread
// A slab holds kFmaQuad lines of kFmaSlabK elements, k-major, padded so that a warp storing 32 k of one line
// hits 32 banks.
constexpr int kFmaSlabLd = kFmaQuad + 1;
constexpr int kFmaScratchFloats = 2 * kFmaSlabK * kFmaSlabLd;  // A's slab and B's

// One operand as lines (rows of A, columns of B) of K elements: element (line, kk) at
// p[line * line_stride + kk * k_stride].
struct FmaOperand {
  const float* p;
  std::int64_t lines, line_stride, k_stride;
  // Consecutive threads load consecutive k where K is the contiguous dimension, else consecutive lines.
  __device__ bool k_contiguous() const { return k_stride == 1; }
};

namespace fma_tile {

constexpr int kSpread = kFmaQuad / 8;  // a thread's 8 rows (columns) of a quadrant are kSpread apart
static_assert(kFallbackThreads == kSpread * kSpread, "one thread per 8x8 outputs of a quadrant");
constexpr int kPerThread = kFmaQuad * kFmaSlabK / kFallbackThreads;  // slab elements each thread copies
constexpr int kBatch = 16;  // loads in flight together
static_assert(kPerThread % kBatch == 0, "whole batches");

// Copies the slab at k0 of lines [line0, line0 + kFmaQuad) into `slab` (zeros outside the operand and at
// k >= k_end), k-major. Thread t's q-th element is (line, kk) + q * (line_step, k_step): kBatch loads, then
// their stores, one pointer and one stride per operand (per-element offsets, hoisted out of the loops, spilled).
__device__ __forceinline__ void store_slab(const FmaOperand& op, std::int64_t line0, std::int64_t k0,
                                           std::int64_t k_end, float* slab) {
  const bool along_k = op.k_contiguous();
  const int t = threadIdx.x;
  const int line = along_k ? t / kFmaSlabK : t % kFmaQuad, kk = along_k ? t % kFmaSlabK : t / kFmaQuad;
  const int line_step = along_k ? kFallbackThreads / kFmaSlabK : 0, k_step = along_k ? 0 : kFallbackThreads / kFmaQuad;
  const float* p = op.p + (line0 + line) * op.line_stride + (k0 + kk) * op.k_stride;
  const std::int64_t step = line_step * op.line_stride + k_step * op.k_stride;
#pragma unroll 1
  for (int q0 = 0; q0 < kPerThread; q0 += kBatch) {
    float v[kBatch];
#pragma unroll
    for (int q = q0; q < q0 + kBatch; ++q) {
      const bool inside = line0 + line + q * line_step < op.lines && k0 + kk + q * k_step < k_end;
      v[q - q0] = inside ? p[q * step] : 0.0f;
    }
#pragma unroll
    for (int q = q0; q < q0 + kBatch; ++q) slab[(kk + q * k_step) * kFmaSlabLd + line + q * line_step] = v[q - q0];
  }
}

}  // namespace fma_tile

// Outputs [m0, m0 + kFmaQuad) x [n0, n0 + kFmaQuad) of c (leading dimension ldc) over all of K, in chunks of
// `chunk` elements, each summed from zero and added to the output (the first stored), as
// corrected_matmul_scheme.hpp sums chunks. `scratch`: kFmaScratchFloats of shared memory. Block-wide barriers;
// blockDim.x must be kFallbackThreads.
__device__ void float32_fma_quadrant(const FmaOperand& a, const FmaOperand& b, float* c, std::int64_t ldc,
                                     std::int64_t m0, std::int64_t n0, std::int64_t k, int chunk, float* scratch) {
  using namespace fma_tile;
  float* slab_a = scratch;
  float* slab_b = scratch + kFmaSlabK * kFmaSlabLd;
  const int tx = threadIdx.x % kSpread, ty = threadIdx.x / kSpread;  // rows ty + kSpread i, columns tx + kSpread j
  for (std::int64_t c0 = 0; c0 < k; c0 += chunk) {
    const std::int64_t c1 = min(k, c0 + chunk);
    float part[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int j = 0; j < 8; ++j) part[i][j] = 0.0f;
    }
    for (std::int64_t k0 = c0; k0 < c1; k0 += kFmaSlabK) {
      __syncthreads();  // the previous slab has been read
      store_slab(a, m0, k0, c1, slab_a);
      store_slab(b, n0, k0, c1, slab_b);
      __syncthreads();
#pragma unroll 1
      for (int kk = 0; kk < kFmaSlabK; ++kk) {
        float av[8], bv[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) av[i] = slab_a[kk * kFmaSlabLd + ty + kSpread * i];
#pragma unroll
        for (int j = 0; j < 8; ++j) bv[j] = slab_b[kk * kFmaSlabLd + tx + kSpread * j];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
#pragma unroll
          for (int j = 0; j < 8; ++j) part[i][j] = __fmaf_rn(av[i], bv[j], part[i][j]);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const std::int64_t r = m0 + ty + kSpread * i;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const std::int64_t col = n0 + tx + kSpread * j;
        if (r >= a.lines || col >= b.lines) continue;
        float* out = c + r * ldc + col;
        *out = c0 == 0 ? part[i][j] : *out + part[i][j];
      }
    }
  }
  __syncthreads();  // the scratch is free again
}

// The tiles beyond tf32_spans_fit that the tf32 GEMM computed (it set wide_tiles_pending): the block checks the
// tile's outputs, and where one is at risk computes the tile again. Launched after the tf32 GEMM so that its
// blocks may start at that one's end (launch_float32_fallback), it returns at once while wide_tiles_pending is 0.
// Blocks take the (batch entry, tile) pairs in turn and find the tiles again from the line ranges, as the GEMM
// did.
__global__ void __launch_bounds__(kFallbackThreads, 8) float32_fallback_kernel(GemmArgs args) {
  __shared__ float scratch[kFmaScratchFloats];
  __shared__ int widest[2];                 // the tile's widest row and column (exponent_span)
  __shared__ int shift[kBlockM + kBlockN];  // tf32 line_shift of the tile's rows, then columns; kNoShift: no
                                            // finite non-zero element (its outputs are exact)
  constexpr int kNoShift = 0x40000000;
  allow_dependent_grid();  // the next call's zeroing
  wait_for_prior_grid();   // the tf32 GEMM's outputs and wide_tiles_pending
  if (*args.wide_tiles_pending == 0) return;
  const std::int64_t m = args.m, n = args.n, tiles = gemm_tiles(m, n);
  const int log2_k = ceil_log2(args.k), chunk = accumulation_chunk(m, n);
  for (std::int64_t t = blockIdx.x; t < tiles * args.num_batches; t += gridDim.x) {
    const std::int64_t z = t / tiles;
    std::int64_t m0, n0;
    tile_origin(m, n, t % tiles, m0, n0);
    if (threadIdx.x < 2) widest[threadIdx.x] = 0;
    __syncthreads();
    for (int r = threadIdx.x; r < kBlockM + kBlockN; r += kFallbackThreads) {
      const bool is_a = r < kBlockM;
      const std::int64_t line = is_a ? m0 + r : n0 + (r - kBlockM), extent = is_a ? m : n;
      ExponentRange range = empty_exponent_range();
      if (line < extent) range = (is_a ? args.a_ranges : args.b_ranges).load(z * extent + line);
      shift[r] = range.max_exp == kNoExponent ? kNoShift : line_shift<Method::tf32>(range);
      atomicMax(&widest[is_a ? 0 : 1], exponent_span(range));
    }
    __syncthreads();
    bool at_risk = false;
    float* c = args.c + z * m * n;
    if (!tf32_spans_fit(widest[0], widest[1])) {
      const int rows = static_cast<int>(min(static_cast<std::int64_t>(kBlockM), m - m0));
      const int cols = static_cast<int>(min(static_cast<std::int64_t>(kBlockN), n - n0));
      // Consecutive threads, consecutive columns; kCheckBatch loads in flight together.
      constexpr int kCheckBatch = 8;
      for (int e0 = 0; e0 < rows * kBlockN; e0 += kCheckBatch * kFallbackThreads) {
        float v[kCheckBatch];
#pragma unroll
        for (int q = 0; q < kCheckBatch; ++q) {
          const int e = e0 + q * kFallbackThreads + threadIdx.x, row = e / kBlockN, col = e % kBlockN;
          v[q] = row < rows && col < cols ? c[(m0 + row) * n + n0 + col] : 0.0f;
        }
#pragma unroll
        for (int q = 0; q < kCheckBatch; ++q) {
          const int e = e0 + q * kFallbackThreads + threadIdx.x, row = e / kBlockN, col = e % kBlockN;
          if (row >= rows || col >= cols || shift[row] == kNoShift || shift[kBlockM + col] == kNoShift) continue;
          at_risk |= split_output_at_risk(v[q], shift[row] + shift[kBlockM + col], log2_k);
        }
      }
    }
    if (__syncthreads_or(at_risk)) {  // (also: widest and shift have been read)
      std::int64_t a_off, b_off;
      batch_offsets(args.batch, z, a_off, b_off);
      const FmaOperand a{args.a + a_off, m, args.a_rs, args.a_ks}, b{args.b + b_off, n, args.b_cs, args.b_ks};
#pragma unroll 1
      for (int quadrant = 0; quadrant < 4; ++quadrant) {
        const std::int64_t qm = m0 + quadrant / 2 * kFmaQuad, qn = n0 + quadrant % 2 * kFmaQuad;
        if (qm < m && qn < n) float32_fma_quadrant(a, b, c, n, qm, qn, args.k, chunk, scratch);
      }
    }
  }
}

// Launches float32_fallback_kernel after the tf32 GEMM of `args`: one block per SM at most (see kFallbackThreads).
inline void launch_float32_fallback(const GemmArgs& args, int sm_count, bool overlap, cudaStream_t stream) {
  const std::int64_t pairs = gemm_tiles(args.m, args.n) * args.num_batches;
  const unsigned blocks = static_cast<unsigned>(std::min<std::int64_t>(pairs, sm_count));
  launch_kernel(float32_fallback_kernel, dim3(blocks), dim3(kFallbackThreads), 0, stream, overlap, args);
}

}  // namespace wmmae_ops
