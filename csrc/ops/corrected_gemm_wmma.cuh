// The portable corrected GEMM (WMMA, sm_80 and newer): the GEMM of builds and GPUs without the wgmma kernel
// (corrected_gemm_sm90.cuh), and of TORCH_WMMAE_PORTABLE_GEMM=1. 128x128 output tiles, 8 warps of 64x32, fp32
// stages by cp.async, split into hi/lo tiles in shared memory (split_stage) once per element and block; the
// scheme is the one corrected_matmul_cuda.cu's header describes. Built on corrected_gemm_common.cuh (GemmArgs,
// the tile helpers: BlockWork, load_line_scales, chunk_result, ...; the cp.async stage loader).
#pragma once

#include <type_traits>

#include "corrected_gemm_common.cuh"

namespace wmmae_ops {

constexpr int kWarpsM = 2, kWarpsN = 4;
static_assert(kWarpsM * kWarpsN * 32 == kThreads, "the warp grid fills the block");
constexpr int kWarpTileM = kBlockM / kWarpsM, kWarpTileN = kBlockN / kWarpsN;  // 64 x 32
constexpr int kFragsM = kWarpTileM / 16, kFragsN = kWarpTileN / 16;              // 4 x 2

// One operand tile in shared memory, in the operand's orientation in global memory: kOuter lines of kInner
// contiguous elements, each line padded (bank conflicts; 16-byte and 32-byte alignment of fragments).
template <bool kRowMajor, int kRows, int kCols>
struct TileGeometry {
  static constexpr int kOuter = kRowMajor ? kRows : kCols;
  static constexpr int kInner = kRowMajor ? kCols : kRows;
  // Offset of matrix element (r, c) of the tile in a buffer with leading dimension ld.
  __device__ static constexpr int offset(int r, int c, int ld) { return kRowMajor ? r * ld + c : c * ld + r; }
};

// kCompact: fp16 stages of 16 k instead of 32, which halves the fp32 stages and hi/lo tiles in shared memory
// (at most 133,152 bytes instead of 231,456), for GPUs that allow a block less than the wide configuration
// needs, such as the A100 (166,912 bytes). Each k-step's products and each chunk's boundaries stay where they
// were, so the outputs are the same bits. (tf32 stages are 16 k in both.)
template <Method M, bool kARowMajor, bool kBRowMajor, bool kCompact = false>
struct GemmConfig {
  using T = MethodTraits<M>;
  static constexpr int kStep = T::kStep;
  static constexpr int kBlockK = M == Method::fp16 && !kCompact ? 32 : 16;  // k extent of one pipeline stage
  static constexpr int kStages = 4;                            // fp32 stages in flight (cp.async)
  static_assert((kStages & (kStages - 1)) == 0, "stage slots are taken with a mask");
  using A = TileGeometry<kARowMajor, kBlockM, kBlockK>;
  using B = TileGeometry<kBRowMajor, kBlockK, kBlockN>;
  static constexpr int kLdStageA = A::kInner + 4, kLdStageB = B::kInner + 4;           // floats
  static constexpr int kLdSplitA = A::kInner + T::kPad, kLdSplitB = B::kInner + T::kPad;  // split elements
  static constexpr int kStageA = A::kOuter * kLdStageA, kStageB = B::kOuter * kLdStageB;
  static constexpr int kSplitA = A::kOuter * kLdSplitA, kSplitB = B::kOuter * kLdSplitB;
  using Split = typename T::Smem;
  // Dynamic shared memory: fp32 stages, then double-buffered hi/lo tiles, then per-line scales.
  static constexpr std::size_t kStageBytes = sizeof(float) * kStages * (kStageA + kStageB);
  static constexpr std::size_t kSplitBytes = sizeof(Split) * 2 * 2 * (kSplitA + kSplitB);
  static constexpr std::size_t kSmemBytes = kStageBytes + kSplitBytes + LineScales::kBytes;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget of one block");
};

// The most shared memory a block of the WMMA kernel for method M needs, over the four operand layouts.
template <Method M, bool kCompact>
constexpr std::size_t wmma_gemm_smem_bytes() {
  const std::size_t sizes[] = {GemmConfig<M, true, true, kCompact>::kSmemBytes, GemmConfig<M, true, false, kCompact>::kSmemBytes,
                               GemmConfig<M, false, true, kCompact>::kSmemBytes, GemmConfig<M, false, false, kCompact>::kSmemBytes};
  std::size_t most = 0;
  for (const std::size_t bytes : sizes) most = bytes > most ? bytes : most;
  return most;
}
static_assert(wmma_gemm_smem_bytes<Method::fp16, true>() <= 166912 && wmma_gemm_smem_bytes<Method::tf32, false>() <= 166912,
              "the compact configuration fits an A100's shared memory per block");

// Splits one fp32 stage into hi and lo tiles (same orientation). Each element is scaled by its line's
// factor first (the power of two of its row of A / column of B, see line_shift). `kScaleAlongInner`: the
// scaled lines (rows of A, columns of B) run along the tile's inner dimension. `kCompensate`: B's fp16
// residuals carry the compensation of the tensor core's truncation (wmmae::split_fp16_compensated).
template <Method M, int kOuter, int kInner, int kLdStage, int kLdSplit, bool kScaleAlongInner, bool kCompensate>
__device__ __forceinline__ void split_stage(const float* stage, typename MethodTraits<M>::Smem* hi,
                                            typename MethodTraits<M>::Smem* lo, const float* scale) {
  using Plan = ChunkPlan<kOuter, kInner>;
  const Plan plan;
  const float* src = stage + plan.line0 * kLdStage + plan.inner;
  const int dst = plan.line0 * kLdSplit + plan.inner;
  float4 inner_scale = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
  if (kScaleAlongInner) inner_scale = *reinterpret_cast<const float4*>(scale + plan.inner);
#pragma unroll
  for (int q = 0; q < Plan::kChunksPerThread; ++q) {
    float4 v = *reinterpret_cast<const float4*>(src + q * Plan::kLineStep * kLdStage);
    const int off = dst + q * Plan::kLineStep * kLdSplit;
    float4 sc = inner_scale;
    if constexpr (!kScaleAlongInner) {
      const float s = scale[plan.line0 + q * Plan::kLineStep];
      sc = make_float4(s, s, s, s);
    }
    if constexpr (M == Method::fp16) {
      store_fp16_split4<kCompensate>(make_float4(v.x * sc.x, v.y * sc.y, v.z * sc.z, v.w * sc.w), hi + off, lo + off);
    } else {
      const wmmae::Tf32Split t0 = split_tf32_scaled(v.x, sc.x), t1 = split_tf32_scaled(v.y, sc.y);
      const wmmae::Tf32Split t2 = split_tf32_scaled(v.z, sc.z), t3 = split_tf32_scaled(v.w, sc.w);
      *reinterpret_cast<float4*>(hi + off) = make_float4(t0.hi, t1.hi, t2.hi, t3.hi);
      *reinterpret_cast<float4*>(lo + off) = make_float4(t0.lo, t1.lo, t2.lo, t3.lo);
    }
  }
}

template <Method M, bool kARowMajor, bool kBRowMajor, bool kCompact>
__global__ void __launch_bounds__(kThreads, 1) corrected_gemm_kernel(GemmArgs args) {
  namespace wmma = nvcuda::wmma;
  using Cfg = GemmConfig<M, kARowMajor, kBRowMajor, kCompact>;
  using T = MethodTraits<M>;
  using Split = typename Cfg::Split;
  constexpr int kStep = Cfg::kStep, kBlockK = Cfg::kBlockK, kStages = Cfg::kStages;
  using LayoutA = typename std::conditional<kARowMajor, wmma::row_major, wmma::col_major>::type;
  using LayoutB = typename std::conditional<kBRowMajor, wmma::row_major, wmma::col_major>::type;
  using FragA = wmma::fragment<wmma::matrix_a, 16, 16, kStep, typename T::FragT, LayoutA>;
  using FragB = wmma::fragment<wmma::matrix_b, 16, 16, kStep, typename T::FragT, LayoutB>;
  using Acc = wmma::fragment<wmma::accumulator, 16, 16, kStep, float>;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  float* stage_a = reinterpret_cast<float*>(smem_raw);
  float* stage_b = stage_a + kStages * Cfg::kStageA;
  Split* split_base = reinterpret_cast<Split*>(stage_b + kStages * Cfg::kStageB);
  // hi/lo tiles: [buffer][hi, lo]
  auto split_a = [&](int buf, int part) { return split_base + (buf * 2 + part) * Cfg::kSplitA; };
  auto split_b = [&](int buf, int part) { return split_base + 4 * Cfg::kSplitA + (buf * 2 + part) * Cfg::kSplitB; };
  const LineScales scales(split_base + 4 * (Cfg::kSplitA + Cfg::kSplitB));
  // The ring slots of k-stage kt.
  auto stage_a_of = [&](int kt) { return stage_a + (kt & (kStages - 1)) * Cfg::kStageA; };
  auto stage_b_of = [&](int kt) { return stage_b + (kt & (kStages - 1)) * Cfg::kStageB; };

  const std::int64_t m = args.m, n = args.n, k = args.k;
  const Method method = args.method;
  allow_dependent_grid();  // auto's tf32 GEMM after the fp16 one, the next call's first kernel after either
  if (M == Method::tf32 && method == Method::automatic) {
    wait_for_prior_grid();  // the fp16 GEMM's tf32_tiles_pending
    if (*args.tf32_tiles_pending == 0) return;
  }
  std::int64_t m0, n0;
  tile_origin(m, n, args.tile_group_rows, blockIdx.x, m0, n0);
  const int warp = threadIdx.x / 32;
  const int wm = warp / kWarpsN, wn = warp % kWarpsN;

  for (std::int64_t z = blockIdx.z; z < args.num_batches; z += gridDim.z) {
    std::int64_t a_off, b_off;
    batch_offsets(args.batch, z, a_off, b_off);
    const float* a = args.a + a_off;
    const float* b = args.b + b_off;
    const std::int64_t k_begin = blockIdx.y * args.k_per_split;  // this block's split of K
    const std::int64_t k_end = min(k, k_begin + args.k_per_split);

    // Line scales, and in auto mode whether this kernel owns the tile.
    wait_for_prior_grid();
    const TileLines lines = load_line_scales<M>(args, scales, z, m0, n0);
    if (method == Method::automatic && lines.fp16_safe != (M == Method::fp16)) {
      if (M == Method::fp16 && threadIdx.x == 0) *args.tf32_tiles_pending = 1;
      continue;
    }
    if (M == Method::tf32 && lines.beyond_split_limit && threadIdx.x == 0) *args.wide_tiles_pending = 1ull;

    const bool a_vec4 = vec4_operand(a, kARowMajor ? args.a_rs : args.a_ks);
    const bool b_vec4 = vec4_operand(b, kBRowMajor ? args.b_ks : args.b_cs);
    auto issue_stage = [&](int kt) {
      issue_operand_stage<kARowMajor, kBRowMajor, kBlockK, Cfg::kLdStageA, Cfg::kLdStageB>(
          stage_a_of(kt), stage_b_of(kt), a, b, args, m0, n0, k_begin + static_cast<std::int64_t>(kt) * kBlockK, k_end,
          a_vec4, b_vec4);
    };
    auto split = [&](int kt) {
      const int buf = kt & 1;
      const float* sa = stage_a_of(kt);
      const float* sb = stage_b_of(kt);
      // A's scaled lines are its rows (outer when row-major); B's are its columns (inner when row-major).
      split_stage<M, Cfg::A::kOuter, Cfg::A::kInner, Cfg::kLdStageA, Cfg::kLdSplitA, !kARowMajor, false>(
          sa, split_a(buf, 0), split_a(buf, 1), scales.a_scale);
      split_stage<M, Cfg::B::kOuter, Cfg::B::kInner, Cfg::kLdStageB, Cfg::kLdSplitB, kBRowMajor, true>(
          sb, split_b(buf, 0), split_b(buf, 1), scales.b_scale);
    };

    Acc main_acc[kFragsM][kFragsN], corr_acc[kFragsM][kFragsN];
#pragma unroll
    for (int i = 0; i < kFragsM; ++i) {
#pragma unroll
      for (int j = 0; j < kFragsN; ++j) {
        wmma::fill_fragment(main_acc[i][j], 0.0f);
        wmma::fill_fragment(corr_acc[i][j], 0.0f);
      }
    }

    // End of a chunk of K (corrected_matmul_scheme.hpp): combine the accumulators, add the chunk to the
    // partial sum kept in the output (each element is read and written by the lane that owns it), and after
    // the last chunk undo the scaling. Then restart the accumulators from zero.
    // Fast path (fp16), as in the wgmma kernel: an interior tile whose unscaling factors are normal floats,
    // and a chunk that is the whole sum or a split-K part; one multiplication and no bounds checks per
    // element. (Not for tf32, the fallback method: its instantiations spilled more with it.)
    float* c = args.c + z * args.c_batch_stride;
    const bool split_k = args.k_splits > 1;  // (stream-K is the wgmma kernel's schedule, never this kernel's)
    const bool direct = M == Method::fp16 && lines.small_shifts && m0 + kBlockM <= m && n0 + kBlockN <= n;
    auto flush = [&](bool first_chunk, bool last_chunk) {
      const bool fast = direct && (split_k || (first_chunk && last_chunk));
#pragma unroll
      for (int i = 0; i < kFragsM; ++i) {
#pragma unroll
        for (int j = 0; j < kFragsN; ++j) {
          const int r0 = wm * kWarpTileM + i * 16, c0 = wn * kWarpTileN + j * 16;
          const std::int64_t gr = m0 + r0, gc = n0 + c0;
          if (fast) {
            const Acc& corr = corr_acc[i][j];
            const Acc& hh_sum = main_acc[i][j];
            wmmae::foreach_ij(hh_sum, [&](auto xs, int r, int cc) {
              const float v = unscale_direct(chunk_result<M>(hh_sum.x[xs.first], corr.x[xs.first]),
                                             scales.a_shift[r0 + r] + scales.b_shift[c0 + cc]);
              float* out = c + (gr + r) * n + gc + cc;
              if (split_k) {
                atomicAdd(out, v);
              } else {
                *out = v;
              }
            });
          } else if (gr < m && gc < n) {
            const wmmae::TileBounds bounds{static_cast<int>(min(static_cast<std::int64_t>(16), m - gr)),
                                           static_cast<int>(min(static_cast<std::int64_t>(16), n - gc))};
            const Acc& corr = corr_acc[i][j];
            const Acc& hh_sum = main_acc[i][j];
            wmmae::foreach_ij(hh_sum, [&](auto xs, int r, int cc) {
              if (!bounds.contains(r, cc)) return;
              add_chunk_to_output<M>(hh_sum.x[xs.first], corr.x[xs.first], c + (gr + r) * n + gc + cc,
                                     scales.a_shift[r0 + r] + scales.b_shift[c0 + cc], split_k, first_chunk,
                                     last_chunk);
            });
          }
          if (!last_chunk) {
            wmma::fill_fragment(main_acc[i][j], 0.0f);
            wmma::fill_fragment(corr_acc[i][j], 0.0f);
          }
        }
      }
    };
    static_assert(kAccumulationChunkSmall % kBlockK == 0, "chunks hold whole stages");
    const int chunk_stages = accumulation_chunk(m, n) / kBlockK;

    const int k_tiles = static_cast<int>((k_end - k_begin + kBlockK - 1) / kBlockK);  // < 2^31 (checked on the host)
    stage_ring_prologue<kStages>(k_tiles, issue_stage);
    split(0);
    for (int kt = 0; kt < k_tiles; ++kt) {
      // Also: hi/lo of stage kt is complete, and its other buffer is free for stage kt + 1.
      stage_ring_advance<kStages>(kt, k_tiles, issue_stage);
      if (kt + 1 < k_tiles) split(kt + 1);

      const int buf = kt & 1;
      const Split* a_hi = split_a(buf, 0);
      const Split* a_lo = split_a(buf, 1);
      const Split* b_hi = split_b(buf, 0);
      const Split* b_lo = split_b(buf, 1);
#pragma unroll
      for (int ks = 0; ks < kBlockK / kStep; ++ks) {
        FragB bh[kFragsN], bl[kFragsN];
#pragma unroll
        for (int j = 0; j < kFragsN; ++j) {
          const int off = Cfg::B::offset(ks * kStep, wn * kWarpTileN + j * 16, Cfg::kLdSplitB);
          wmma::load_matrix_sync(bh[j], b_hi + off, Cfg::kLdSplitB);
          wmma::load_matrix_sync(bl[j], b_lo + off, Cfg::kLdSplitB);
        }
#pragma unroll
        for (int i = 0; i < kFragsM; ++i) {
          FragA ah, al;
          const int off = Cfg::A::offset(wm * kWarpTileM + i * 16, ks * kStep, Cfg::kLdSplitA);
          wmma::load_matrix_sync(ah, a_hi + off, Cfg::kLdSplitA);
          wmma::load_matrix_sync(al, a_lo + off, Cfg::kLdSplitA);
#pragma unroll
          for (int j = 0; j < kFragsN; ++j) {
            Acc hh;
            wmma::fill_fragment(hh, 0.0f);
            wmma::mma_sync(hh, ah, bh[j], hh);
#pragma unroll
            for (int x = 0; x < Acc::num_elements; ++x) main_acc[i][j].x[x] += hh.x[x];
            wmma::mma_sync(corr_acc[i][j], al, bh[j], corr_acc[i][j]);
            wmma::mma_sync(corr_acc[i][j], ah, bl[j], corr_acc[i][j]);
          }
        }
      }
      if ((kt + 1) % chunk_stages == 0 || kt + 1 == k_tiles) flush(kt < chunk_stages, kt + 1 == k_tiles);
    }
    cp_async_wait<0>();
    __syncthreads();  // the next batch index rewrites the scales and the stages
  }
}

}  // namespace wmmae_ops
