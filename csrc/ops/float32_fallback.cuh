// The float32 fallback of corrected_matmul's "tf32" and "auto" methods. Where the tf32 GEMM computed a tile whose
// lines span more exponents than its split keeps (tf32_spans_fit, corrected_matmul_scheme.hpp),
// float32_fallback_kernel checks the tile's outputs (split_output_at_risk) by 64x64 quadrants and, where one is
// so small that what the split lost below float32's normal range may matter, computes its quadrant again with
// one float32 fused multiply-add per product, as torch.matmul does, summed in the split paths' chunks of K. Such
// tiles are rare (a row holding magnitudes 2^150 apart, or outputs far smaller than their rows' and columns'
// largest elements allow), so the recomputation is plain: 128 threads, 4x8 outputs each, slabs of 32 k of A and
// B through shared memory by cp.async, in four stages. A kernel of its own: inlined into the tf32 GEMMs (as a
// call too), its registers made ptxas spill in their stage loops. Built on
// corrected_gemm_common.cuh (GemmArgs, the tile helpers and the cp.async helpers). Its kernel is not a template:
// one translation unit includes this header (corrected_matmul_cuda.cu).
#pragma once

#include "corrected_gemm_common.cuh"

namespace wmmae_ops {

// The kernel is launched in nearly every "tf32" and "auto" call and nearly always only reads wide_tiles_pending
// and returns, so its blocks are small: 128 threads of at most 80 registers (kFallbackRegisters; on an H100,
// session 51, per "auto" call of 64 x 512^3 against a build without the kernel: blocks of 8192 registers 2%, of
// 32768 10-12%; session 53: 8192 -> 10240 the same within noise). Each block
// also asks for more than half of an SM's shared memory (fallback_smem_bytes), so that an SM holds one. Launched
// to overlap the tf32 GEMM, the blocks are placed as the GEMM's blocks leave their SMs, and without that the first
// SMs to empty took many blocks each (session 52, H100, every tile recomputed: 4096^3 51 -> 25 ms, 1024^3 1.6 ->
// 0.7 ms; the calls that only read wide_tiles_pending kept their time).
constexpr int kFallbackThreads = 128;
// The register cap: at 64 (session 52) ptxas read each k's operands from shared memory just before their
// products, and with one warp per scheduler every such read stalled; at 80 it reads them a k ahead, with no
// stack (session 53, H100, every tile recomputed: 1024^3 729 -> 349 us, 4096^3 25.0 -> 11.6 ms, together with
// the float4 copies and the QuadrantJob in shared memory).
constexpr int kFallbackRegisters = 80;
constexpr int kFmaQuad = kFallbackQuadrant;  // a quadrant's side (corrected_matmul_scheme.hpp)
constexpr int kFmaSlabK = 32;   // k per slab
constexpr int kFmaStages = 4;   // slabs in shared memory: the next three's copies are in flight while one is summed
// A slab holds kFmaQuad lines of kFmaSlabK elements, k-major. Rows of kFmaQuad + 4 floats: 16-byte aligned for
// the float4 reads and copies, and a warp's copies (SlabCopy) meet each bank once.
constexpr int kFmaSlabLd = kFmaQuad + 4;
constexpr int kFmaSlabFloats = kFmaSlabK * kFmaSlabLd;
constexpr int kFmaScratchFloats = kFmaStages * 2 * kFmaSlabFloats;  // A's slabs, then B's

// One operand as lines (rows of A, columns of B) of K elements: element (line, kk) at
// p[line * line_stride + kk * k_stride].
struct FmaOperand {
  const float* p;
  std::int64_t lines, line_stride, k_stride;
};

// How an operand's slabs are copied, by its layout (the same for all of a block's threads):
// - lines_float4: lines contiguous, 16-byte aligned groups of four (p aligned, k_stride a multiple of 4), copied
//   as float4s (the tail group's missing lines zero-filled by the copy);
// - along_k: k contiguous (the usual A), one float per copy, a warp taking 8 k of 4 lines;
// - along_lines: any other layout, one float per copy, a warp taking 32 lines of one k.
enum class SlabCopy { lines_float4, along_k, along_lines };

__device__ __forceinline__ SlabCopy slab_copy_of(const FmaOperand& op) {
  if (op.line_stride == 1 && op.k_stride % 4 == 0 && reinterpret_cast<std::uintptr_t>(op.p) % 16 == 0) {
    return SlabCopy::lines_float4;
  }
  return op.k_stride == 1 ? SlabCopy::along_k : SlabCopy::along_lines;
}

namespace fma_tile {

// Thread t sums the outputs of rows 4 (t / 8) + i (i < 4) and columns 4 (t % 8) + j and 32 + 4 (t % 8) + j
// (j < 4) of a quadrant: one float4 of A's slab and two of B's per k, a warp's float4s contiguous.
constexpr int kRowsPerThread = 4, kColsPerThread = 8;
static_assert(kRowsPerThread == 4 && kColsPerThread == 8, "one float4 of A's slab and two of B's per k");
constexpr int kColHalf = kFmaQuad / 2;             // a thread's columns: two runs of four, kColHalf apart
constexpr int kThreadsPerRowGroup = kColHalf / 4;  // threads that share their rows
static_assert(kFallbackThreads == kFmaQuad / kRowsPerThread * kThreadsPerRowGroup, "one quadrant");

// The thread's index, read again at each use: ptxas hoisted what copy_slab derives from it out of the slab loop
// and spilled it, and the reloads missed L1, which the 4-byte copies stream through.
__device__ __forceinline__ int thread_index_again() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}

// Starts the copies (cp.async) of the slab at k0 of lines [line0, line0 + kFmaQuad) into `slab`, k-major; zeros
// outside the operand and at k >= k_end. Each thread steps one source pointer (ptxas kept one address per
// element of an unrolled loop and spilled them), the destinations are offsets from one.
__device__ __forceinline__ void copy_slab(const FmaOperand& op, std::int64_t line0, std::int64_t k0,
                                          std::int64_t k_end, float* slab) {
  const int t = thread_index_again();
  const SlabCopy how = slab_copy_of(op);
  if (how == SlabCopy::lines_float4) {
    constexpr int kGroups = kFmaQuad / 4, kKPerPass = kFallbackThreads / kGroups;
    const int kk = t / kGroups, l = 4 * (t % kGroups);
    const std::int64_t line = line0 + l, k = k0 + kk;
    const int bytes = line < op.lines ? 4 * static_cast<int>(min(std::int64_t{4}, op.lines - line)) : 0;
    const float* src = op.p + line + k * op.k_stride;
    const std::int64_t step = kKPerPass * op.k_stride;
#pragma unroll
    for (int q = 0; q < kFmaSlabK / kKPerPass; ++q) {
      const int q_bytes = k + q * kKPerPass < k_end ? bytes : 0;
      cp_async16_bytes(slab + (kk + q * kKPerPass) * kFmaSlabLd + l, q_bytes > 0 ? src : op.p, q_bytes);
      src += step;
    }
  } else if (how == SlabCopy::along_k) {
    constexpr int kK = 8, kLinesPerPass = kFallbackThreads / kK;
    const int kk = t % kK, l = t / kK;
    const std::int64_t k_left = k_end - (k0 + kk);
    std::int64_t line = line0 + l;
    const float* src = op.p + line * op.line_stride + (k0 + kk);
    const std::int64_t step = kLinesPerPass * op.line_stride;
#pragma unroll 1
    for (int g = 0; g < kFmaQuad / kLinesPerPass; ++g) {
      float* dst = slab + kk * kFmaSlabLd + l + g * kLinesPerPass;
#pragma unroll
      for (int h = 0; h < kFmaSlabK / kK; ++h) {
        const bool inside = line < op.lines && kK * h < k_left;
        cp_async4(dst + h * kK * kFmaSlabLd, inside ? src + h * kK : op.p, inside);
      }
      src += step;
      line += kLinesPerPass;
    }
  } else {
    constexpr int kKPerPass = kFallbackThreads / kFmaQuad;
    const int l = t % kFmaQuad, kk = t / kFmaQuad;
    const bool line_inside = line0 + l < op.lines;
    const std::int64_t k_left = k_end - (k0 + kk);
    const float* src = op.p + (line0 + l) * op.line_stride + (k0 + kk) * op.k_stride;
    const std::int64_t step = kKPerPass * op.k_stride;
#pragma unroll 4
    for (int q = 0; q < kFmaSlabK / kKPerPass; ++q) {
      const bool inside = line_inside && q * kKPerPass < k_left;
      cp_async4(slab + (kk + q * kKPerPass) * kFmaSlabLd + l, inside ? src : op.p, inside);
      src += step;
    }
  }
}

}  // namespace fma_tile

// One quadrant's recomputation: outputs [m0, m0 + kFmaQuad) x [n0, n0 + kFmaQuad) of c (leading dimension ldc)
// from a and b over all of K, in chunks of `chunk`. Kept in shared memory and read where needed, so that fewer
// values live through the slab loop beside the 32 sums and the next k's operands (at a cap of 64 registers, the
// kernel's stack went from 112 to 64 bytes).
struct QuadrantJob {
  FmaOperand a, b;
  float* c;
  std::int64_t ldc, m0, n0, k;
  int chunk;
};

// The job's outputs, each chunk summed from zero by one fused multiply-add per k and added to the output (the
// first stored), as corrected_matmul_scheme.hpp sums chunks and fma_dot (corrected_matmul_cpu.cpp) emulates.
// `scratch`: kFmaScratchFloats of shared memory. Block-wide barriers; blockDim.x must be kFallbackThreads.
__device__ void float32_fma_quadrant(const QuadrantJob& job, float* scratch) {
  using namespace fma_tile;
  const int row0 = kRowsPerThread * (threadIdx.x / kThreadsPerRowGroup), col0 = 4 * (threadIdx.x % kThreadsPerRowGroup);
  for (std::int64_t c0 = 0; c0 < job.k; c0 += job.chunk) {
    // The chunk's end, c0 + min(K - c0, chunk), is worked out again where it is used: held through the slab
    // loop it took a stack slot (16 bytes, session 53).
    const int slabs = static_cast<int>((min(job.k - c0, std::int64_t{job.chunk}) + kFmaSlabK - 1) / kFmaSlabK);
    float part[kRowsPerThread][kColsPerThread];
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
#pragma unroll
      for (int j = 0; j < kColsPerThread; ++j) part[i][j] = 0.0f;
    }
    const auto issue = [&](int s) {  // slab s of the chunk into stage s % kFmaStages, if the chunk has it
      if (s < slabs) {
        float* stage = scratch + (s % kFmaStages) * kFmaSlabFloats;
        const std::int64_t k0 = c0 + std::int64_t{s} * kFmaSlabK, c1 = min(job.k, c0 + job.chunk);
        copy_slab(job.a, job.m0, k0, c1, stage);
        copy_slab(job.b, job.n0, k0, c1, stage + kFmaStages * kFmaSlabFloats);
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
      const float* slab_a = scratch + (s % kFmaStages) * kFmaSlabFloats + row0;
      const float* slab_b = scratch + (kFmaStages + s % kFmaStages) * kFmaSlabFloats + col0;
      struct Operands {
        float4 a, b_left, b_right;
      };
      const auto read_k = [&](int kk) {
        return Operands{*reinterpret_cast<const float4*>(slab_a + kk * kFmaSlabLd),
                        *reinterpret_cast<const float4*>(slab_b + kk * kFmaSlabLd),
                        *reinterpret_cast<const float4*>(slab_b + kk * kFmaSlabLd + kColHalf)};
      };
      const auto sum_k = [&](const Operands& o) {
        const float a_v[kRowsPerThread] = {o.a.x, o.a.y, o.a.z, o.a.w};
        const float b_v[kColsPerThread] = {o.b_left.x,  o.b_left.y,  o.b_left.z,  o.b_left.w,
                                           o.b_right.x, o.b_right.y, o.b_right.z, o.b_right.w};
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i) {
#pragma unroll
          for (int j = 0; j < kColsPerThread; ++j) part[i][j] = __fmaf_rn(a_v[i], b_v[j], part[i][j]);
        }
      };
      // Only the slab's k inside the chunk: a product of zeros would turn a -0 sum into +0. Full slabs unrolled,
      // each k's operands read before the previous k's products (one warp per scheduler: nothing else hides
      // the shared memory's latency).
      const int k_count = static_cast<int>(min(std::int64_t{kFmaSlabK}, min(job.k - c0, std::int64_t{job.chunk}) -
                                                                             std::int64_t{s} * kFmaSlabK));
      if (k_count == kFmaSlabK) {
        Operands next = read_k(0);
#pragma unroll
        for (int kk = 0; kk < kFmaSlabK; ++kk) {
          const Operands now = next;
          if (kk + 1 < kFmaSlabK) next = read_k(kk + 1);
          sum_k(now);
        }
      } else {
#pragma unroll 1
        for (int kk = 0; kk < k_count; ++kk) sum_k(read_k(kk));
      }
    }
    cp_async_wait<0>();  // (only empty groups are left)
    __syncthreads();     // everyone is done with the last slabs: the next chunk's copies may overwrite them
    // A thread's outputs are two runs of four columns: float4 stores where the rows keep them 16-byte aligned
    // (c itself is; the run is then wholly inside the output or wholly outside).
    const bool float4_rows = job.ldc % 4 == 0;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const std::int64_t r = job.m0 + row0 + i;
      if (r >= job.a.lines) continue;
#pragma unroll
      for (int half = 0; half < kColsPerThread / 4; ++half) {
        const std::int64_t col = job.n0 + col0 + half * kColHalf;
        float* out = job.c + r * job.ldc + col;
        const float* p = part[i] + 4 * half;
        if (float4_rows) {
          if (col >= job.b.lines) continue;
          float4 v = make_float4(p[0], p[1], p[2], p[3]);
          if (c0 != 0) {
            const float4 o = *reinterpret_cast<const float4*>(out);
            v = make_float4(o.x + v.x, o.y + v.y, o.z + v.z, o.w + v.w);
          }
          *reinterpret_cast<float4*>(out) = v;
        } else {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            if (col + j < job.b.lines) out[j] = c0 == 0 ? p[j] : out[j] + p[j];
          }
        }
      }
    }
  }
}

// The tiles beyond tf32_spans_fit that the tf32 GEMM computed (it set wide_tiles_pending), by quadrants: the
// block checks the quadrant's outputs, and where one is at risk computes the quadrant again. Launched after the
// tf32 GEMM so that its blocks may start at that one's end (launch_float32_fallback), it returns at once while
// wide_tiles_pending is 0. Otherwise its blocks claim the (batch entry, tile, quadrant) items one at a time,
// counting on from the 1 that the GEMM left in wide_tiles_pending: an item's cost is known only after its check
// (a quadrant computed again takes hundreds of times as long as one only checked), and with items taken in turn
// some blocks drew only quadrants to compute while others drew none (H100, session 54). Each block finds its
// tile again from the line ranges, as the GEMM did.
// (The shared memory keeps one block per SM; blockDim.x must be kFallbackThreads.)
__global__ void __maxnreg__(kFallbackRegisters) float32_fallback_kernel(GemmArgs args) {
  extern __shared__ __align__(128) unsigned char fallback_smem[];  // fallback_smem_bytes
  float* scratch = reinterpret_cast<float*>(fallback_smem);      // kFmaScratchFloats
  __shared__ QuadrantJob job;            // float32_fma_quadrant's
  __shared__ std::int64_t claimed;       // the block's current item
  __shared__ int widest[2];              // the tile's widest row and column (exponent_span)
  __shared__ int shift[2 * kFmaQuad];    // tf32 line_shift of the quadrant's rows, then columns; kNoShift: no
                                         // finite non-zero element (its outputs are exact)
  constexpr int kNoShift = 0x40000000;
  allow_dependent_grid();  // the next call's first kernel
  wait_for_prior_grid();   // the tf32 GEMM's outputs and wide_tiles_pending
  if (*args.wide_tiles_pending == 0ull) return;
  const std::int64_t m = args.m, n = args.n, tiles = gemm_tiles(m, n);
  const int log2_k = ceil_log2(args.k), chunk = accumulation_chunk(m, n);
  // Items: quadrant fastest, then tile, then batch entry.
  const std::int64_t items = tiles * args.num_batches * kFallbackQuadrantsPerTile;
  for (;;) {
    __syncthreads();  // everyone has read the last item and is done with its job
    if (threadIdx.x == 0) {
      claimed = static_cast<std::int64_t>(atomicAdd(args.wide_tiles_pending, 1ull)) - 1;
      widest[0] = widest[1] = 0;
    }
    __syncthreads();
    const std::int64_t item = claimed;
    if (item >= items) return;
    const std::int64_t t = item / kFallbackQuadrantsPerTile, z = t / tiles;
    const int quadrant = static_cast<int>(item % kFallbackQuadrantsPerTile);
    std::int64_t m0, n0;
    tile_origin(m, n, args.tile_group_rows, t % tiles, m0, n0);
    const int q_row = quadrant / kFallbackQuadrantsPerSide * kFmaQuad;
    const int q_col = quadrant % kFallbackQuadrantsPerSide * kFmaQuad;
    if (m0 + q_row >= m || n0 + q_col >= n) continue;
    // The tile's lines say whether it is beyond the split's limits (as the GEMM found them), the quadrant's
    // give the check its shifts.
    for (int r = threadIdx.x; r < kBlockM + kBlockN; r += kFallbackThreads) {
      const bool is_a = r < kBlockM;
      const int in_quadrant = is_a ? r - q_row : r - kBlockM - q_col;
      ExponentRange range = empty_exponent_range();
      load_tile_line_range(args, z, m0, n0, r, range);
      if (in_quadrant >= 0 && in_quadrant < kFmaQuad) {
        shift[(is_a ? 0 : kFmaQuad) + in_quadrant] =
            range.max_exp == kNoExponent ? kNoShift : line_shift<Method::tf32>(range);
      }
      atomicMax(&widest[is_a ? 0 : 1], exponent_span(range));
    }
    __syncthreads();
    bool at_risk = false;
    float* c = args.c + z * args.c_batch_stride;
    const std::int64_t qm = m0 + q_row, qn = n0 + q_col;
    if (!tf32_spans_fit(widest[0], widest[1])) {
      const int rows = static_cast<int>(min(static_cast<std::int64_t>(kFmaQuad), m - qm));
      const int cols = static_cast<int>(min(static_cast<std::int64_t>(kFmaQuad), n - qn));
      // Consecutive threads, consecutive columns; kCheckBatch loads in flight together.
      constexpr int kCheckBatch = 8;
      for (int e0 = 0; e0 < rows * kFmaQuad; e0 += kCheckBatch * kFallbackThreads) {
        float v[kCheckBatch];
#pragma unroll
        for (int q = 0; q < kCheckBatch; ++q) {
          const int e = e0 + q * kFallbackThreads + threadIdx.x, row = e / kFmaQuad, col = e % kFmaQuad;
          v[q] = row < rows && col < cols ? c[(qm + row) * n + qn + col] : 0.0f;
        }
#pragma unroll
        for (int q = 0; q < kCheckBatch; ++q) {
          const int e = e0 + q * kFallbackThreads + threadIdx.x, row = e / kFmaQuad, col = e % kFmaQuad;
          if (row >= rows || col >= cols || shift[row] == kNoShift || shift[kFmaQuad + col] == kNoShift) continue;
          at_risk |= split_output_at_risk(v[q], shift[row] + shift[kFmaQuad + col], log2_k);
        }
      }
    }
    if (__syncthreads_or(at_risk)) {  // (also: widest and shift have been read)
      if (threadIdx.x == 0) {
        std::int64_t a_off, b_off;
        batch_offsets(args.batch, z, a_off, b_off);
        job = QuadrantJob{FmaOperand{args.a + a_off, m, args.a_rs, args.a_ks},
                          FmaOperand{args.b + b_off, n, args.b_cs, args.b_ks}, c, n, qm, qn, args.k, chunk};
      }
      __syncthreads();
      float32_fma_quadrant(job, scratch);
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
  const std::int64_t items = gemm_tiles(args.m, args.n) * args.num_batches * kFallbackQuadrantsPerTile;
  const unsigned blocks = static_cast<unsigned>(std::min<std::int64_t>(items, props.multiProcessorCount));
  const std::size_t smem = fallback_smem_bytes(props);
  allow_dynamic_smem<float32_fallback_kernel>(smem);
  prefer_max_shared_carveout<float32_fallback_kernel>();  // (the GEMMs' carveout: no reconfiguration between them)
  launch_kernel(float32_fallback_kernel, dim3(blocks), dim3(kFallbackThreads), smem, stream, overlap, args);
}

}  // namespace wmmae_ops
