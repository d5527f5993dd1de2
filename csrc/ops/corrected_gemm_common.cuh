// What corrected_matmul's CUDA translation units share: the tile GEMMs' arguments (GemmArgs) and launches
// (KernelChoice, GemmLaunch), the device helpers of its kernels (stage ring, line scales, work schedule, output
// chunks, cp.async) and launch_gemm_variant, the entry to the tile GEMM kernels. corrected_gemm_launch.cuh defines
// that; corrected_gemm_fp16_a_row.cu, corrected_gemm_fp16_a_col.cu and corrected_gemm_tf32.cu instantiate it, so
// that a build compiles the GEMM kernels in parallel (in corrected_matmul_cuda.cu alone they took about 290 s of
// one core for sm_90a); corrected_matmul_cuda.cu, the host side and the other kernels, calls it. The helpers have
// internal linkage: each unit compiles those it uses.
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <type_traits>
#include <utility>

#include "../wmmae/wmmae.hpp"
#include "corrected_matmul_scheme.hpp"
#include "dynamic_smem.cuh"
#include "kernel_switches.hpp"
#include "matmul_plan.hpp"

namespace wmmae_ops {
namespace sm90 {
struct TmaMaps;  // corrected_gemm_sm90.cuh
struct ResidueMaps;
}  // namespace sm90

// The workspace of the pre-pass: per row of A / column of B (and batch index), in three int arrays that
// start as zeros (zero_workspace_kernel) and are merged into with atomicMax / atomicOr: the largest exponent as
// kExponentBias + max_exp and the smallest as kExponentBias - min_exp, both > 0 for every float exponent,
// so 0 stands for "no finite non-zero element yet".
struct RangeArrays {
  int* max_exp_code;
  int* min_exp_code;
  int* nonfinite;
  static constexpr int kExponentBias = -kNoExponent;

  __device__ void merge(std::int64_t i, const ExponentRange& r) const {
    if (r.max_exp != kNoExponent) {
      atomicMax(max_exp_code + i, kExponentBias + r.max_exp);
      atomicMax(min_exp_code + i, kExponentBias - r.min_exp);
    }
    if (r.nonfinite) atomicOr(nonfinite + i, 1);
  }
  // The three words are loaded together, so that a GEMM tile waits for one round trip to global memory for
  // its line ranges. (Written as plain loads, the compiler loaded the smallest exponent only once the largest
  // had come back non-zero: two round trips at each tile's start. H200, same run: 64 x 512^3 per call 1-2%
  // faster with one.)
  __device__ ExponentRange load(std::int64_t i) const {
    const int max_code = load_word(max_exp_code + i), min_code = load_word(min_exp_code + i);
    const bool any_nonfinite = load_word(nonfinite + i) != 0;
    ExponentRange range = empty_exponent_range();
    if (max_code != 0) range = ExponentRange{max_code - kExponentBias, kExponentBias - min_code, false};
    range.nonfinite = any_nonfinite;
    return range;
  }
  // A plain load that stays where it is written (asm volatile: not moved into a later branch).
  __device__ static int load_word(const int* p) {
    int v;
    asm volatile("ld.global.b32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
  }
};

struct GemmArgs {
  const float* a;
  const float* b;
  float* c;
  // Batch entry z's output at c + z * c_batch_stride: m * n, or more (split_batch_reads_in_place).
  std::int64_t c_batch_stride;
  std::int64_t m, n, k;
  std::int64_t a_rs, a_ks;  // A element (i, kk) at a[i * a_rs + kk * a_ks]
  std::int64_t b_ks, b_cs;  // B element (kk, j) at b[kk * b_ks + j * b_cs]
  BatchStrides batch;
  std::int64_t num_batches;
  RangeArrays a_ranges, b_ranges;  // [num_batches][m] and [num_batches][n]; unused for method tf32
  Method method;                   // fp16 / tf32: every tile; automatic: the tiles this kernel owns
  // automatic: set to 1 by the fp16 kernel when it leaves a tile to the tf32 kernel (launched after it),
  // which returns at once while it is 0 instead of reading every tile's line ranges.
  int* tf32_tiles_pending;
  // tf32 and auto: set to 1 by the tf32 kernel when it computes a tile beyond tf32_spans_fit, whose outputs
  // float32_fallback_kernel (launched after it) checks; that kernel returns at once while it is 0, and
  // otherwise counts on from 1 the items that its blocks claim (64 bits: a batch of 2^29 single tiles has
  // 2^31 items).
  unsigned long long* wide_tiles_pending;
  // Split-K: blockIdx.y takes K elements [y * k_per_split, (y + 1) * k_per_split). With more than one split
  // the output starts zeroed and every chunk result is added with an fp32 atomic (no workspace).
  int k_splits;
  std::int64_t k_per_split;        // a multiple of 32 (whole stages for both methods)
  // The wgmma kernel's stream-K schedule (stream_k_share, matmul_plan.hpp), launched as that many blocks
  // instead of the grid of tiles x k_splits x batch; 0: the grid. Its output too starts zeroed and takes atomics.
  std::int64_t stream_k_blocks;
  std::int64_t stream_k_gap;  // stream_k_share's gap between tiles
  // The resident pre-pass's count of finished items per batch entry (resident_prepass_sm90.cuh), which the
  // GEMM waits for instead of the whole pre-pass grid; null with the grid pre-pass.
  const int* prepass_items_done;
  int prepass_items_per_batch;
  // The wgmma fp16 GEMM with TMA stages folds its tile's line ranges itself from the stages it holds, in place of
  // any pre-pass: where K fits in the stages that a tile issues at its start (tile_line_ranges_apply). It computes
  // auto's tiles that are not fp16-safe itself, with float32 FMAs from those stages (fma_tile_from_stages), so that
  // such calls run neither the tf32 GEMM nor the fallback check: it is the call's only kernel, with no workspace to
  // zero before it, and waits for the kernel before it (which may write A or B) before its first loads.
  bool tile_line_ranges;
  // The wgmma fp16 GEMM's blocks [0, start_stagger_blocks) start a little apart (sm90::stagger_start); 0: none.
  int start_stagger_blocks;
  int tile_group_rows;  // tile_origin's group height (gemm_tile_group_rows)
  // The wgmma fp16 GEMM's blocks let the kernels after it launch (allow_dependent_grid) as each starts its last
  // piece instead of at its own start (late_dependents_apply: only on request); the small GEMM's as each exits
  // instead of once it has waited for the kernel before it (small_gemm_dependents_at_exit).
  bool dependents_at_last_piece;
  __host__ __device__ bool adds_into_output() const { return k_splits > 1 || stream_k_blocks > 0; }
};

// The GEMM kernels a call runs and how they are launched, decided once per call from the device and the
// environment (kernel_switches.hpp). sm90: the wgmma kernel for the fp16 GEMM on compute capability 9.0 when the build
// includes sm_90a code (setup.py), unless TORCH_WMMAE_PORTABLE_GEMM=1 asks for the WMMA kernel. sm90_tma: its
// fp32 stages may come by TMA (see TmaReadable), unless TORCH_WMMAE_SM90_TMA=0 asks for cp.async always (the
// outputs are the same bits). overlap_launches: a kernel may start while the one before it runs (programmatic
// dependent launch, compute capability 9.0 and newer; see allow_dependent_grid).
// wmma_compact: the WMMA kernel's fp16 GEMM with stages of 16 k (GemmConfig's kCompact), where the device
// allows a block less shared memory (smem_per_block) than the wide configuration needs. wmma_smem_needed: what
// the WMMA kernels of that configuration need per block (both methods), where sm90 is off.
// TORCH_WMMAE_SMEM_PER_BLOCK=n takes smem_per_block as at most n bytes, so that tests on an H100/H200 run what a
// GPU with less shared memory runs.
struct KernelChoice {
  bool sm90 = false;
  bool sm90_tma = false;
  bool overlap_launches = false;
  bool wmma_compact = false;
  std::size_t smem_per_block = 0;
  std::size_t wmma_smem_needed = 0;
};

// Where and how a GEMM kernel is launched. overlaps_previous: the kernel launched just before on the stream is
// the pre-pass (before the fp16 GEMM or the tf32 method's) or the fp16 GEMM (before auto's tf32 GEMM), or, before
// an fp16 GEMM that folds its own line ranges, any kernel (that GEMM waits for it before its first loads), which it
// may overlap (see allow_dependent_grid). sm_count: of the device it runs on. tma_maps: A's and B's TMA maps, which
// the wgmma GEMMs read with (the call encodes them once: corrected_matmul_cuda's tma_reads), or null where TMA cannot
// read an operand: then they copy their stages with cp.async. a_residue_maps, b_residue_maps: where
// tma_maps->a_by_residue or b_by_residue, that operand's maps.
struct GemmLaunch {
  dim3 grid;
  cudaStream_t stream;
  bool overlaps_previous;
  KernelChoice kernels;
  int sm_count;
  const sm90::TmaMaps* tma_maps;
  unsigned persistent_batch_slots;  // the grid's z extent for the wgmma fp16 kernel with TMA stages, where > 0
  const sm90::ResidueMaps* a_residue_maps;
  const sm90::ResidueMaps* b_residue_maps;
};

// The tile GEMM kernels of method M for one layout of A and B (all their variants), launched as `launch` says:
// defined in corrected_gemm_launch.cuh, instantiated in the corrected_gemm_*.cu units.
template <Method M, bool kARowMajor, bool kBRowMajor>
void launch_gemm_variant(const GemmArgs& args, const GemmLaunch& launch);

namespace {

using namespace nvcuda;

constexpr int kBlockM = kGemmTile, kBlockN = kGemmTile;
constexpr int kThreads = 256;  // both GEMM kernels: 8 warps (the WMMA kernel's 2 x 4, the wgmma kernel's 2 warpgroups)

// Per-method types. The shared-memory tiles are padded by 16 bytes per row against bank conflicts.
template <Method M> struct MethodTraits;
template <> struct MethodTraits<Method::fp16> {
  static constexpr int kStep = kFp16KStep;
  using Smem = __half;
  using FragT = __half;
  static constexpr int kPad = 8;
  static constexpr float kLoUnscale = wmmae::kFp16ResidualUnscale;
};
template <> struct MethodTraits<Method::tf32> {
  static constexpr int kStep = kTf32KStep;
  using Smem = float;
  using FragT = wmma::precision::tf32;
  static constexpr int kPad = 4;
  static constexpr float kLoUnscale = 1.0f;
};

// Programmatic dependent launch (sm_90): the fp16 GEMM (or the tf32 method's GEMM) is launched so that its
// blocks may start while the pre-pass still runs (or, where its tiles fold their line ranges, the kernel before the
// call), auto's tf32 GEMM so that its blocks may start while the fp16 GEMM still runs
// (GemmLaunch::overlaps_previous), and the next call's first kernel so that it may start while this call's last
// one runs (zero_workspace_kernel; the small GEMM, which waits for the kernel before it at its start:
// corrected_gemm_small.cuh; or the fp16 GEMM that folds its own line ranges, which waits for it before its first
// loads). Each earlier kernel lets them as soon as each of its blocks has started (the fp16 GEMM, on request, only
// as each block starts its last piece: late_dependents_apply; the small GEMM once each has waited, or on some grids
// at its exit: small_gemm_dependents_at_exit), and a later one reads nothing an earlier one writes (line ranges,
// the zeroed output, tf32_tiles_pending) before wait_for_prior_grid(), which waits for the whole earlier grid (so
// for the pre-pass too, which the fp16 GEMM waited for). A and B are complete before the pre-pass starts (and
// before the workspace's zeroing lets any kernel start: it waits for the kernel before it first), so the GEMMs
// after either may load them first. Both are no-ops without such a launch and before sm_90.
__device__ __forceinline__ void allow_dependent_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Launches kernel<<<grid, block, smem_bytes, stream>>>(args...); with `overlap`, by programmatic dependent
// launch, so that its blocks may start while the kernel before it on the stream still runs.
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem_bytes, cudaStream_t stream,
                   bool overlap, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute overlap_attr{};
  overlap_attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap_attr.val.programmaticStreamSerializationAllowed = 1;
  if (overlap) {
    config.attrs = &overlap_attr;
    config.numAttrs = 1;
  }
  C10_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// ------------------------------------------------------------------------------------------------------
// GEMM: what the WMMA and wgmma kernels share (stage ring, line scales, work schedule, output chunks)
// ------------------------------------------------------------------------------------------------------

// cp.async of 16 bytes from 16-byte aligned gmem, of which the first `bytes` (0-16) are read and the rest
// zero-filled.
__device__ __forceinline__ void cp_async16_bytes(void* smem, const void* gmem, int bytes) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  cp_async16_bytes(smem, gmem, valid ? 16 : 0);
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// The ring of kStages fp32 stages that both GEMM kernels fill with cp.async: stage s goes to slot
// s % kStages. Prologue: stages 0 .. kStages - 2 in flight, then a block barrier once stage 0 has landed.
template <int kStages, class IssueStage>
__device__ __forceinline__ void stage_ring_prologue(int k_tiles, IssueStage&& issue_stage) {
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) issue_stage(s);
    cp_async_commit();
  }
  cp_async_wait<kStages - 2>();
  __syncthreads();
}
// Top of iteration kt: stage kt + 1 has landed (own copies; the barrier makes everyone's visible), everyone
// is done with iteration kt - 1 and so with the slot that stage kt + kStages - 1 now takes.
template <int kStages, class IssueStage>
__device__ __forceinline__ void stage_ring_advance(int kt, int k_tiles, IssueStage&& issue_stage) {
  cp_async_wait<kStages - 3>();
  __syncthreads();
  if (kt + kStages - 1 < k_tiles) issue_stage(kt + kStages - 1);
  cp_async_commit();
}

// Per-line power-of-two scales of one output tile in shared memory: rows of A, columns of B; and for the tf32
// kernels, the widest line (exponent_span) of each warp's lines (see load_line_scales).
struct LineScales {
  float* a_scale;  // [kBlockM]
  float* b_scale;  // [kBlockN]
  int* a_shift;    // [kBlockM], log2 of a_scale
  int* b_shift;    // [kBlockN]
  int* warp_span;  // [kThreads / 32]
  static constexpr std::size_t kBytes =
      (sizeof(float) + sizeof(int)) * (kBlockM + kBlockN) + sizeof(int) * kThreads / 32;
  __device__ explicit LineScales(void* smem)
      : a_scale(static_cast<float*>(smem)), b_scale(a_scale + kBlockM),
        a_shift(reinterpret_cast<int*>(b_scale + kBlockN)), b_shift(a_shift + kBlockM),
        warp_span(b_shift + kBlockN) {}
};

// The chunks (4 consecutive inner elements) a thread copies and splits in a kOuter x kInner tile: lines
// line0 + q * kLineStep for q < kChunksPerThread, all at inner offset `inner`.
template <int kOuter, int kInner>
struct ChunkPlan {
  static constexpr int kChunksPerLine = kInner / 4;
  static constexpr int kLineStep = kThreads / kChunksPerLine;
  static constexpr int kChunksPerThread = kOuter / kLineStep;
  static_assert(kThreads % kChunksPerLine == 0 && kOuter % kLineStep == 0, "chunks must divide among threads");
  int line0, inner;
  __device__ ChunkPlan() : line0(threadIdx.x / kChunksPerLine), inner((threadIdx.x % kChunksPerLine) * 4) {}
};

// Issues the cp.async copies of one fp32 tile: lines [o0, o0 + kOuter) x inner [i0, i0 + kInner) of a matrix
// with contiguous inner dimension; elements outside (outer_extent, inner_extent) are zero-filled.
template <int kOuter, int kInner, int kLd>
__device__ __forceinline__ void load_stage(float* dst, const float* base, std::int64_t outer_stride,
                                           std::int64_t outer_extent, std::int64_t inner_extent, std::int64_t o0,
                                           std::int64_t i0, bool vec4) {
  using Plan = ChunkPlan<kOuter, kInner>;
  const Plan plan;
  const float* src = base + (o0 + plan.line0) * outer_stride + i0 + plan.inner;
  float* d = dst + plan.line0 * kLd + plan.inner;
  const std::int64_t line_step = Plan::kLineStep * outer_stride;
  if (vec4 && o0 + kOuter <= outer_extent && i0 + kInner <= inner_extent) {
    // Interior tile (the common case): no bounds checks.
#pragma unroll
    for (int q = 0; q < Plan::kChunksPerThread; ++q) cp_async16(d + q * Plan::kLineStep * kLd, src + q * line_step, true);
    return;
  }
#pragma unroll 1
  for (int q = 0; q < Plan::kChunksPerThread; ++q) {
    const std::int64_t go = o0 + plan.line0 + q * Plan::kLineStep, gi = i0 + plan.inner;
    const float* s = src + q * line_step;
    float* dq = d + q * Plan::kLineStep * kLd;
    const bool line_ok = go < outer_extent;
    if (vec4 && line_ok && gi + 4 <= inner_extent) {
      cp_async16(dq, s, true);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool ok = line_ok && gi + e < inner_extent;
        cp_async4(dq + e, ok ? s + e : base, ok);
      }
    }
  }
}

// Where output tile `tile` starts: groups of `group_rows` tile rows, column by column inside a group
// (consecutive tiles share columns of B in L2, tiles group_rows apart rows of A; gemm_tile_group_rows).
__device__ inline void tile_origin(std::int64_t m, std::int64_t n, int group_rows, std::int64_t tile,
                                   std::int64_t& m0, std::int64_t& n0) {
  const std::int64_t tiles_m = (m + kBlockM - 1) / kBlockM, tiles_n = (n + kBlockN - 1) / kBlockN;
  const std::int64_t group_tiles = group_rows * tiles_n;
  const std::int64_t first_m = tile / group_tiles * group_rows;
  const std::int64_t rows = min(static_cast<std::int64_t>(group_rows), tiles_m - first_m);
  m0 = (first_m + (tile % group_tiles) % rows) * kBlockM;
  n0 = (tile % group_tiles) / rows * kBlockN;
}

// The pieces of work (TileWork) of one GEMM block, one after the other: with stream-K its share of the units
// (stream_k_share); otherwise tile blockIdx.x, K split blockIdx.y, for batch entries blockIdx.z, blockIdx.z +
// gridDim.z, ... The current piece and the one after it (upcoming: the kernel issues its first stages while
// the current one ends) live in shared memory, where thread 0 advances them between two barriers: the wgmma
// kernel has no registers to spare for a cursor across its stage loop (it spilled).
class BlockWork {
 public:
  __device__ explicit BlockWork(TileWork* pieces) : pieces_(pieces) {}  // [current, upcoming]
  static __device__ bool valid(const TileWork& w) { return w.z >= 0; }
  __device__ TileWork first(const GemmArgs& args) {
    if (threadIdx.x == 0) {
      pieces_[0] = args.stream_k_blocks > 0
                       ? stream_k_from(args, share_start(args, blockIdx.x))
                       : grid_piece(args, blockIdx.z);
      pieces_[1] = after(args, pieces_[0]);
    }
    __syncthreads();
    return pieces_[0];
  }
  __device__ TileWork next(const GemmArgs& args) {
    __syncthreads();  // everyone has read the current piece
    if (threadIdx.x == 0) {
      pieces_[0] = pieces_[1];
      pieces_[1] = after(args, pieces_[1]);
    }
    __syncthreads();
    return pieces_[0];
  }
  // The piece after the current one (not valid() where there is none).
  __device__ TileWork upcoming() const { return pieces_[1]; }

 private:
  __device__ static std::int64_t tiles(const GemmArgs& args) { return gemm_tiles(args.m, args.n); }
  __device__ static std::int64_t k_stages(const GemmArgs& args) { return gemm_k_stages(args.k); }
  __device__ static std::int64_t share_start(const GemmArgs& args, std::int64_t block) {
    return stream_k_share(block, args.stream_k_blocks, tiles(args) * args.num_batches, k_stages(args),
                          args.stream_k_gap);
  }
  __device__ static TileWork none() { return TileWork{-1, 0, 0, 0}; }
  __device__ static TileWork after(const GemmArgs& args, const TileWork& w) {
    if (!valid(w)) return none();
    return args.stream_k_blocks > 0  // the share goes on where this piece ends
               ? stream_k_from(args, (w.z * tiles(args) + w.tile) * k_stages(args) + w.stage_end)
               : grid_piece(args, w.z + gridDim.z);
  }
  // The piece of this block's stream-K share that starts at `unit`.
  __device__ static TileWork stream_k_from(const GemmArgs& args, std::int64_t unit) {
    const std::int64_t end = share_start(args, blockIdx.x + 1);
    return unit < end ? stream_k_piece(unit, end, tiles(args), k_stages(args)) : none();
  }
  // This block's tile and split of K in batch entry z of the grid.
  __device__ static TileWork grid_piece(const GemmArgs& args, std::int64_t z) {
    if (z >= args.num_batches) return none();
    const std::int64_t split_stages = args.k_per_split / kGemmStageK;
    return TileWork{z, blockIdx.x, blockIdx.y * split_stages,
                    min(k_stages(args), (blockIdx.y + 1) * split_stages)};
  }
  TileWork* pieces_;
};

// What load_line_scales found about the tile's lines (the same in every thread).
struct TileLines {
  bool fp16_safe;     // every line is fp16-safe ("auto": the fp16 kernel's tile)
  bool small_shifts;  // every shift is within +-kDirectShift: see unscale_direct
  bool beyond_split_limit;  // (tf32 only) the lines span more than tf32_spans_fit: see float32_fallback_kernel
};
// Shifts up to this size make every output element's unscaling factor 2^-(a_shift + b_shift) a normal float.
constexpr int kDirectShift = 63;

// v * 2^-shift for |shift| <= 2 * kDirectShift: one multiplication by a normal float rounds once, as
// ldexpf(v, -shift) does, without its range checks.
__device__ __forceinline__ float unscale_direct(float v, int shift) {
  return __fmul_rn(v, __int_as_float((127 - shift) << 23));
}

// The tile's widest row and column (exponent_span), for tf32_spans_fit: where thread r takes line r (rows of A
// in warps 0-3, columns of B in warps 4-7), each warp's widest line goes to warp_span[warp] in shared memory,
// and after a block barrier every thread reads the same answer.
__device__ __forceinline__ void publish_warp_span(int span, int* warp_span) {
  const int widest = __reduce_max_sync(0xffffffffu, span);
  if (threadIdx.x % 32 == 0) warp_span[threadIdx.x / 32] = widest;
}
__device__ __forceinline__ bool tile_spans_fit_tf32(const int* warp_span) {
  int row_span = 0, col_span = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) {
    if (w < kBlockM / 32) {
      row_span = max(row_span, warp_span[w]);
    } else {
      col_span = max(col_span, warp_span[w]);
    }
  }
  return tf32_spans_fit(row_span, col_span);
}

// Line r of the tile at (m0, n0): row m0 + r of A for r < kBlockM, else column n0 + r - kBlockM of B; whether it
// lies inside the matrix, and its index in batch entry z's line ranges (RangeArrays) where it does.
__device__ __forceinline__ bool tile_line_index(const GemmArgs& args, std::int64_t z, std::int64_t m0, std::int64_t n0,
                                                int r, std::int64_t& index) {
  const bool is_a = r < kBlockM;
  const std::int64_t line = is_a ? m0 + r : n0 + (r - kBlockM), extent = is_a ? args.m : args.n;
  index = z * extent + line;
  return line < extent;
}

// Fills the line scales of method M of a tile from the exponent range of thread r's line (r = threadIdx.x:
// rows of A in warps 0-3, columns of B in warps 4-7; `in_matrix` false past the matrix's edge, where the line
// is not scaled and decides nothing) and says what it found (TileLines). Block-wide barriers.
template <Method M>
__device__ inline TileLines line_scales_from(const LineScales& ls, bool in_matrix, const ExponentRange& range) {
  static_assert(kBlockM + kBlockN == kThreads && kBlockM % 32 == 0,
                "a line per thread, A's and B's in whole warps");
  const int r = threadIdx.x;
  const bool is_a = r < kBlockM;
  int shift = 0, span = 0;
  bool line_fp16_safe = true;
  if (in_matrix) {
    shift = line_shift<M>(range);
    span = exponent_span(range);
    line_fp16_safe = fp16_safe(range);
  }
  (is_a ? ls.a_shift[r] : ls.b_shift[r - kBlockM]) = shift;
  (is_a ? ls.a_scale[r] : ls.b_scale[r - kBlockM]) = ldexpf(1.0f, shift);
  if constexpr (M == Method::tf32) publish_warp_span(span, ls.warp_span);
  TileLines lines{};
  lines.fp16_safe = __syncthreads_and(line_fp16_safe);
  lines.small_shifts = __syncthreads_and(shift >= -kDirectShift && shift <= kDirectShift);
  // (warp_span is read after the barriers above)
  if constexpr (M == Method::tf32) lines.beyond_split_limit = !tile_spans_fit_tf32(ls.warp_span);
  return lines;
}

// Past the matrix's edge it returns false and leaves `range` as it was; otherwise it loads line r's exponent
// range from the pre-pass into `range`.
__device__ __forceinline__ bool load_tile_line_range(const GemmArgs& args, std::int64_t z, std::int64_t m0,
                                                     std::int64_t n0, int r, ExponentRange& range) {
  std::int64_t index;
  if (!tile_line_index(args, z, m0, n0, r, index)) return false;
  range = (r < kBlockM ? args.a_ranges : args.b_ranges).load(index);
  return true;
}

// line_scales_from the pre-pass's line ranges of the tile at (m0, n0) of batch entry z: thread r's scale slot takes
// line `line` of the tile (see tile_line_index): r, except where the wgmma GEMM reads A by residue (its stage lines
// are the tile's rows in another order: tile_row_of_line). (A branch, not an empty range, around the use: the GEMMs'
// register allocation turned on the difference.)
template <Method M>
__device__ inline TileLines load_line_scales(const GemmArgs& args, const LineScales& ls, std::int64_t z,
                                             std::int64_t m0, std::int64_t n0,
                                             int line = static_cast<int>(threadIdx.x)) {
  ExponentRange range;
  const bool in_matrix = load_tile_line_range(args, z, m0, n0, line, range);
  return line_scales_from<M>(ls, in_matrix, range);
}

// One chunk's result for an output element: the hi*hi sum plus the unscaled corrections, or the hi*hi sum
// alone when it is not finite (a non-finite input leaves NaN in the residuals), still scaled by 2^shift.
template <Method M>
__device__ __forceinline__ float chunk_result(float hh_sum, float corr) {
  return isfinite(hh_sum) ? hh_sum + corr * MethodTraits<M>::kLoUnscale : hh_sum;
}

// Adds one chunk's result to the output element `out`. Split-K: an fp32 atomic of the unscaled value (scaling
// by a power of two is exact, so each split's chunks can be unscaled separately). Otherwise the partial sum
// lives in the output: the first chunk writes it, later chunks read-modify-write it, the last one undoes the
// scaling.
template <Method M>
__device__ __forceinline__ void add_chunk_to_output(float hh_sum, float corr, float* out, int shift, bool split_k,
                                                    bool first_chunk, bool last_chunk) {
  float v = chunk_result<M>(hh_sum, corr);
  if (split_k) {
    v = ldexpf(v, -shift);
    atomicAdd(out, v);
    return;
  }
  if (!first_chunk) v = *out + v;
  if (last_chunk) v = ldexpf(v, -shift);
  *out = v;
}

// The same for a chunk after the first without split-K, whose caller has read the partial sum `earlier` back
// from `out` already (batched with the other elements' loads).
template <Method M>
__device__ __forceinline__ void add_chunk_to_read_back_output(float hh_sum, float corr, float earlier, float* out,
                                                              int shift, bool last_chunk) {
  float v = earlier + chunk_result<M>(hh_sum, corr);
  if (last_chunk) v = ldexpf(v, -shift);
  *out = v;
}

// Issues the cp.async copies of the fp32 A and B tiles of k-stage [k0, k0 + kBlockK) (zero-filled past the
// matrix and past k_end, the end of this block's split of K).
template <bool kARowMajor, bool kBRowMajor, int kBlockK, int kLdA, int kLdB>
__device__ __forceinline__ void issue_operand_stage(float* sa, float* sb, const float* a, const float* b,
                                                    const GemmArgs& args, std::int64_t m0, std::int64_t n0,
                                                    std::int64_t k0, std::int64_t k_end, bool a_vec4, bool b_vec4) {
  if constexpr (kARowMajor) {
    load_stage<kBlockM, kBlockK, kLdA>(sa, a, args.a_rs, args.m, k_end, m0, k0, a_vec4);
  } else {
    load_stage<kBlockK, kBlockM, kLdA>(sa, a, args.a_ks, k_end, args.m, k0, m0, a_vec4);
  }
  if constexpr (kBRowMajor) {
    load_stage<kBlockK, kBlockN, kLdB>(sb, b, args.b_ks, k_end, args.n, k0, n0, b_vec4);
  } else {
    load_stage<kBlockN, kBlockK, kLdB>(sb, b, args.b_cs, args.n, k_end, n0, k0, b_vec4);
  }
}

// Whether an operand's contiguous dimension allows 16-byte copies.
__device__ __forceinline__ bool vec4_operand(const float* p, std::int64_t outer_stride) {
  return outer_stride % 4 == 0 && reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

__device__ __forceinline__ std::uint32_t half2_bits(__half2 h) { return *reinterpret_cast<const std::uint32_t*>(&h); }
__device__ __forceinline__ uint2 pack_halves(__half2 a, __half2 b) { return make_uint2(half2_bits(a), half2_bits(b)); }

// Splits four scaled values into fp16 hi and residual parts (the residual compensated: split_fp16_compensated) and
// stores each four as 8 bytes at hi and lo. (A non-finite value leaves a NaN in lo, which never reaches a result:
// its product makes the hi*hi sum non-finite, and the epilogue then returns that sum alone: chunk_result.)
template <bool kCompensate>
__device__ __forceinline__ void store_fp16_split4(float4 v, __half* hi, __half* lo) {
  __half2 h01, h23, l01, l23;
  if constexpr (kCompensate) {
    wmmae::split_fp16x2_compensated(v.x, v.y, h01, l01);
    wmmae::split_fp16x2_compensated(v.z, v.w, h23, l23);
  } else {
    wmmae::split_fp16x2(v.x, v.y, h01, l01);
    wmmae::split_fp16x2(v.z, v.w, h23, l23);
  }
  *reinterpret_cast<uint2*>(hi) = pack_halves(h01, h23);
  *reinterpret_cast<uint2*>(lo) = pack_halves(l01, l23);
}


// Calls f(std::bool_constant<x>{}): picks a kernel instantiation from a run-time flag.
template <class F>
void with_flag(bool x, F&& f) {
  if (x) f(std::true_type{});
  else f(std::false_type{});
}

// Calls f(std::bool_constant<x>{}, std::bool_constant<y>{}): picks a kernel instantiation from two run-time flags.
template <class F>
void with_flags(bool x, bool y, F&& f) {
  if (x && y) f(std::true_type{}, std::true_type{});
  else if (x) f(std::true_type{}, std::false_type{});
  else if (y) f(std::false_type{}, std::true_type{});
  else f(std::false_type{}, std::false_type{});
}

// Calls f(std::bool_constant<A row-major>{}, std::bool_constant<B row-major>{}): the GEMM kernels are instantiated
// per layout of their operands.
template <class F>
void with_layouts(bool a_row_major, bool b_row_major, F&& f) {
  with_flags(a_row_major, b_row_major, std::forward<F>(f));
}

// Whether the wgmma fp16 kernel reads the partial sums back in one batch (its kReadBack instantiation): wherever
// a block sums more than one chunk of K into the output itself (no split-K): small outputs' chunks of 1024 (a
// read-back every 32 stages) and large outputs' of 4096 (every 128). Element by element instead, each load
// waits for the previous element's store (see the flush in corrected_gemm_sm90.cuh). H200, same run: 128 x
// 14912 x 4096 (four chunks of 1024 per block) GEMM 216.0 -> 192.0 us; chunks of 4096, auto, TFLOP/s held 2 s,
// element by element -> one batch (session 66): 2048^2 x 4608 107.8 -> 114.0, 2048^2 x 8192 115.2 -> 118.9,
// 1024 x 4096 x 8192 114.3 -> 117.6, 2048 x 4096 x 6144 115.8 -> 119.6 (grids of fewer than 4 waves, which
// the long-K rule leaves unsplit), and unsplit as in deterministic mode 4096^2 x 8192 121.2 -> 124.1, 8192^3
// 123.1 -> 126.9, 16384^3 117.2 -> 122.5. Not where a block has one chunk: the batched loads change the main
// loop's code, which made such shapes 4-8% slower (4096^3, 2048^3, 64 x 512^3) when one kernel did both.
// TORCH_WMMAE_READ_BACK=0 reads back element by element (the same arithmetic: the same bits).
inline bool sm90_read_back(const GemmArgs& args) {  // (inline: not every unit uses it)
  return !args.adds_into_output() && args.k > accumulation_chunk(args.m, args.n) &&
         env_switch("TORCH_WMMAE_READ_BACK") != Switch::kOff;
}

// Whether the wgmma fp16 kernel with TMA stages (not the one beside the resident pre-pass) is an odd-width
// instantiation (kOddWidth), whose flush stages the output's rows, which are not 8-byte aligned, through shared
// memory, so that a warp stores 32 consecutive floats of a row at a time: wherever N is odd, for a block's only chunk
// of K, the atomics of split-K and stream-K and, in chunks of 1024, the chunks that are read back. Element by element,
// each store used 9 of each 32-byte sector's bytes. H200, us per call back to back, auto, TORCH_WMMAE_SMALL_GEMM=0,
// element by element -> staged (torch fp32), same build (session 100's benchmarks/results/unaligned.md):
// - one chunk: 4097^2 x 64 137 -> 80.5 (73.2), 8193^2 x 64 470 -> 293 (265), 4097^2 x 128 158 -> 103 (121),
//   4097^2 x 1000 388 -> 330 (789), 2049^2 x 256 74.7 -> 53.0 (64.3), 8 x 1025^2 x 64 76.1 -> 45.3 (44.4);
// - atomics: 4097^3 (two splits) 1370 -> 1270 (3140), 1025^2 x 4096 (stream-K) 155 -> 142 (242), 256 x 2049 x 4096
//   (stream-K) 112 -> 100 (112);
// - read back, chunks of 1024: 8 x 1025^2 x 2048 479 -> 427 (911).
// Not where the chunks that are read back are 4096 long (large outputs without split-K, e.g. in deterministic mode),
// where the odd-width instantiation's stage loop cost more than its flush saved (session 100, an earlier build with
// the same read-back flush): 4097^2 x 8192 2519 -> 2567 us, 2049^2 x 8193 957 -> 963 (4097^3, whose second chunk is
// one stage, 1420 -> 1396). They keep the plain read-back instantiation. Chunks of 1024 there: 8 x 1025^2 x 4096
// 925 -> 883, 1025^2 x 2100 95.9 -> 86.0, 32 x 513^2 x 2048 678 -> 679. Instantiations of their own, so that the
// others' code stays as it was: with the staging in every instantiation (a branch at run time), aligned shapes were
// 1-4% slower (H200, session 98, five alternating rounds: 2048^3 144.6 -> 149.8 us, 64 x 512^3 166.0 -> 169.3, 128 x
// 8192 x 4096 110.4 -> 111.5). TORCH_WMMAE_STAGED_FLUSH=0 runs the plain instantiations (the same bits, where at
// most two atomics add into an output).
inline bool staged_flush_applies(const GemmArgs& args) {
  return args.n % 2 != 0 && env_switch("TORCH_WMMAE_STAGED_FLUSH") != Switch::kOff &&
         (!sm90_read_back(args) || accumulation_chunk(args.m, args.n) == kAccumulationChunkSmall);
}


}  // namespace
}  // namespace wmmae_ops
