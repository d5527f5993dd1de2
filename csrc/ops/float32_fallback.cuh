// The float32 fallback of corrected_matmul's "tf32" and "auto" methods. Where the tf32 GEMM computed a tile whose
// lines span more exponents than its split keeps (tf32_spans_fit, corrected_matmul_scheme.hpp),
// float32_fallback_kernel checks the tile's outputs (split_output_at_risk) and, where one is so small that what
// the split lost below float32's normal range may matter, computes the whole tile again with one float32 fused
// multiply-add per product, as torch.matmul does, summed in the split paths' chunks of K. Such tiles are rare
// (a row holding magnitudes 2^150 apart, or outputs far smaller than their rows' and columns' largest
// elements allow), so the recomputation is plain: 128 threads, 4x8 outputs each, slabs of 16 k of A and B
// through shared memory by cp.async, four in flight. A kernel of its own: inlined into the tf32 GEMMs (as a call
// too), its registers made ptxas spill in their stage loops. Included by corrected_matmul_cuda.cu after GemmArgs,
// the tile helpers and the cp.async helpers.
#pragma once

namespace wmmae_ops {

// The kernel is launched in nearly every "tf32" and "auto" call and nearly always only reads wide_tiles_pending
// and returns, so its blocks are small: 128 threads of 64 registers (on an H100, session 51, per "auto" call of
// 64 x 512^3 against a build without the kernel: blocks of 8192 registers 2%, of 32768 10-12%). Each block
// also asks for more than half of an SM's shared memory (fallback_smem_bytes), so that an SM holds one. Launched
// to overlap the tf32 GEMM, the blocks are placed as the GEMM's blocks leave their SMs, and without that the first
// SMs to empty took many blocks each (session 52, H100, every tile recomputed: 4096^3 51 -> 25 ms, 1024^3 1.6 ->
// 0.7 ms; the calls that only read wide_tiles_pending kept their time).
constexpr int kFallbackThreads = 128;
constexpr int kFmaQuad = 64;    // the tile is recomputed in four 64x64 quadrants
constexpr int kFmaSlabK = 16;   // k per slab
constexpr int kFmaStages = 4;   // slabs in shared memory: the next three's copies are in flight while one is summed
// A slab holds kFmaQuad lines of kFmaSlabK elements, k-major. Rows of kFmaQuad + 4 floats: 16-byte aligned for
// the float4 reads, and a warp copying 16 k of two lines (K contiguous) meets each bank at most twice.
constexpr int kFmaSlabLd = kFmaQuad + 4;
constexpr int kFmaSlabFloats = kFmaSlabK * kFmaSlabLd;
constexpr int kFmaScratchFloats = kFmaStages * 2 * kFmaSlabFloats;  // A's slabs, then B's

// One operand as lines (rows of A, columns of B) of K elements: element (line, kk) at
// p[line * line_stride + kk * k_stride].
struct FmaOperand {
  const float* p;
  std::int64_t lines, line_stride, k_stride;
  // Consecutive threads copy consecutive k where K is the contiguous dimension, else consecutive lines.
  __device__ bool k_contiguous() const { return k_stride == 1; }
};

namespace fma_tile {

// Thread t sums the outputs of rows 4 (t / 8) + i (i < 4) and columns 4 (t % 8) + j and 32 + 4 (t % 8) + j
// (j < 4) of a quadrant: one float4 of A's slab and two of B's per k, a warp's float4s contiguous.
constexpr int kRowsPerThread = 4, kColsPerThread = 8;
static_assert(kRowsPerThread == 4 && kColsPerThread == 8, "one float4 of A's slab and two of B's per k");
constexpr int kColHalf = kFmaQuad / 2;             // a thread's columns: two runs of four, kColHalf apart
constexpr int kThreadsPerRowGroup = kColHalf / 4;  // threads that share their rows
static_assert(kFallbackThreads == kFmaQuad / kRowsPerThread * kThreadsPerRowGroup, "one quadrant");
constexpr int kCopies = kFmaQuad * kFmaSlabK / kFallbackThreads;  // elements each thread copies per operand slab

// Starts the copies (cp.async) of the slab at k0 of lines [line0, line0 + kFmaQuad) into `slab`, k-major; zeros
// outside the operand and at k >= k_end. Thread t's q-th element is (line, kk) + q * (line_step, k_step), its
// address stepped in a loop (unrolled, ptxas kept 16 addresses per operand and spilled them).
__device__ __forceinline__ void copy_slab(const FmaOperand& op, std::int64_t line0, std::int64_t k0,
                                          std::int64_t k_end, float* slab) {
  const bool along_k = op.k_contiguous();
  const int t = threadIdx.x;
  const int line = along_k ? t / kFmaSlabK : t % kFmaQuad, kk = along_k ? t % kFmaSlabK : t / kFmaQuad;
  const int line_step = along_k ? kFallbackThreads / kFmaSlabK : 0, k_step = along_k ? 0 : kFallbackThreads / kFmaQuad;
  std::int64_t l = line0 + line, k = k0 + kk;
  const float* src = op.p + l * op.line_stride + k * op.k_stride;
  const std::int64_t src_step = line_step * op.line_stride + k_step * op.k_stride;
  float* dst = slab + kk * kFmaSlabLd + line;
#pragma unroll 1
  for (int q = 0; q < kCopies; ++q) {
    const bool inside = l < op.lines && k < k_end;
    cp_async4(dst, inside ? src : op.p, inside);
    l += line_step;
    k += k_step;
    src += src_step;
    dst += k_step * kFmaSlabLd + line_step;
  }
}

}  // namespace fma_tile

// Outputs [m0, m0 + kFmaQuad) x [n0, n0 + kFmaQuad) of c (leading dimension ldc) over all of K, in chunks of
// `chunk` elements, each summed from zero by one fused multiply-add per k and added to the output (the first
// stored), as corrected_matmul_scheme.hpp sums chunks and fma_dot (corrected_matmul_cpu.cpp) emulates.
// `scratch`: kFmaScratchFloats of shared memory. Block-wide barriers; blockDim.x must be kFallbackThreads.
__device__ void float32_fma_quadrant(const FmaOperand& a, const FmaOperand& b, float* c, std::int64_t ldc,
                                     std::int64_t m0, std::int64_t n0, std::int64_t k, int chunk, float* scratch) {
  using namespace fma_tile;
  const int row0 = kRowsPerThread * (threadIdx.x / kThreadsPerRowGroup), col0 = 4 * (threadIdx.x % kThreadsPerRowGroup);
  for (std::int64_t c0 = 0; c0 < k; c0 += chunk) {
    const std::int64_t c1 = min(k, c0 + chunk);
    const int slabs = static_cast<int>((c1 - c0 + kFmaSlabK - 1) / kFmaSlabK);
    float part[kRowsPerThread][kColsPerThread];
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
#pragma unroll
      for (int j = 0; j < kColsPerThread; ++j) part[i][j] = 0.0f;
    }
    const auto issue = [&](int s) {  // slab s of the chunk into stage s % kFmaStages, if the chunk has it
      if (s < slabs) {
        float* stage = scratch + (s % kFmaStages) * kFmaSlabFloats;
        copy_slab(a, m0, c0 + std::int64_t{s} * kFmaSlabK, c1, stage);
        copy_slab(b, n0, c0 + std::int64_t{s} * kFmaSlabK, c1, stage + kFmaStages * kFmaSlabFloats);
      }
      cp_async_commit();  // (also an empty group: one group per slab index keeps the wait counts right)
    };
#pragma unroll
    for (int s = 0; s < kFmaStages - 1; ++s) issue(s);
#pragma unroll 1
    for (int s = 0; s < slabs; ++s) {
      cp_async_wait<kFmaStages - 2>();  // this thread's copies of slab s have landed
      __syncthreads();                  // everyone's; and everyone is done with slab s - 1, whose stage ...
      issue(s + kFmaStages - 1);        // ... slab s + kFmaStages - 1 takes
      const float* slab_a = scratch + (s % kFmaStages) * kFmaSlabFloats;
      const float* slab_b = slab_a + kFmaStages * kFmaSlabFloats;
      // Only the slab's k inside the chunk: a product of zeros would turn a -0 sum into +0.
      const int k_count = static_cast<int>(min(std::int64_t{kFmaSlabK}, c1 - c0 - std::int64_t{s} * kFmaSlabK));
#pragma unroll 2
      for (int kk = 0; kk < k_count; ++kk) {
        const float4 av = *reinterpret_cast<const float4*>(slab_a + kk * kFmaSlabLd + row0);
        const float4 b_left = *reinterpret_cast<const float4*>(slab_b + kk * kFmaSlabLd + col0);
        const float4 b_right = *reinterpret_cast<const float4*>(slab_b + kk * kFmaSlabLd + kColHalf + col0);
        const float a_v[kRowsPerThread] = {av.x, av.y, av.z, av.w};
        const float b_v[kColsPerThread] = {b_left.x, b_left.y, b_left.z, b_left.w,
                                           b_right.x, b_right.y, b_right.z, b_right.w};
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i) {
#pragma unroll
          for (int j = 0; j < kColsPerThread; ++j) part[i][j] = __fmaf_rn(a_v[i], b_v[j], part[i][j]);
        }
      }
    }
    cp_async_wait<0>();  // (only empty groups are left)
    __syncthreads();     // everyone is done with the last slabs: the next chunk's copies may overwrite them
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const std::int64_t r = m0 + row0 + i;
#pragma unroll
      for (int j = 0; j < kColsPerThread; ++j) {
        const std::int64_t col = n0 + col0 + j / 4 * kColHalf + j % 4;
        if (r >= a.lines || col >= b.lines) continue;
        float* out = c + r * ldc + col;
        *out = c0 == 0 ? part[i][j] : *out + part[i][j];
      }
    }
  }
}

// The tiles beyond tf32_spans_fit that the tf32 GEMM computed (it set wide_tiles_pending): the block checks the
// tile's outputs, and where one is at risk computes the tile again. Launched after the tf32 GEMM so that its
// blocks may start at that one's end (launch_float32_fallback), it returns at once while wide_tiles_pending is 0.
// Blocks take the (batch entry, tile) pairs in turn and find the tiles again from the line ranges, as the GEMM
// did.
// (The launch bounds' 8 blocks cap the registers at 64 a thread; the shared memory keeps one block per SM.)
__global__ void __launch_bounds__(kFallbackThreads, 8) float32_fallback_kernel(GemmArgs args) {
  extern __shared__ __align__(128) unsigned char fallback_smem[];  // fallback_smem_bytes
  float* scratch = reinterpret_cast<float*>(fallback_smem);      // kFmaScratchFloats
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

// Dynamic shared memory of a float32_fallback_kernel block: its scratch, or more than half of the SM's where that
// is more, so that an SM holds one block (see kFallbackThreads).
inline std::size_t fallback_smem_bytes(const cudaDeviceProp& props) {
  const std::size_t scratch = sizeof(float) * kFmaScratchFloats;
  return std::max(scratch, props.sharedMemPerMultiprocessor / 2 + 1024);
}

// Launches float32_fallback_kernel after the tf32 GEMM of `args`: one block per SM at most (see kFallbackThreads).
inline void launch_float32_fallback(const GemmArgs& args, const cudaDeviceProp& props, bool overlap,
                                    cudaStream_t stream) {
  const std::int64_t pairs = gemm_tiles(args.m, args.n) * args.num_batches;
  const unsigned blocks = static_cast<unsigned>(std::min<std::int64_t>(pairs, props.multiProcessorCount));
  const std::size_t smem = fallback_smem_bytes(props);
  allow_dynamic_smem<float32_fallback_kernel>(smem);
  prefer_max_shared_carveout<float32_fallback_kernel>();  // (the GEMMs' carveout: no reconfiguration between them)
  launch_kernel(float32_fallback_kernel, dim3(blocks), dim3(kFallbackThreads), smem, stream, overlap, args);
}

}  // namespace wmmae_ops
