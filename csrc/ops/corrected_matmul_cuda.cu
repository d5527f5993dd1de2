// corrected_matmul on CUDA: fp32 GEMM on tensor cores with Ootomo & Yokota's error correction.
//
// 0. Small products (fp16 and auto, K <= 128, and each batch entry's output at most 64x64, or the call's at most
//    256^2 elements, or, where TMA could not read an operand in place, at most 2^20 where the tile GEMMs would
//    stay slow on a copy of it, and beyond that with M or N at most 32 or an odd N with K <= 64 (N <= 64 where the
//    tile GEMMs read copies, whose flush stages an odd width): small_gemm_applies) are one kernel, the small GEMM
//    of corrected_gemm_small.cuh, which does all of what follows for its tiles (64x64, 32x32 or 16x16) itself
//    (auto's tiles that are not fp16-safe with float32 FMAs). The rest is the tile GEMMs'.
// 1. (fp16 and auto) A pre-pass finds, for every row of A and column of B, the exponent range of its
//    elements (atomics into a small workspace: 3 ints per row/column, no copy of A or B), and zeroes the
//    output when K is split; one launch for all of it, which on sm_90 overlaps the small kernel before it
//    that zeroes the workspace (line_range_prepass.cuh). In batched calls on H100/H200 it may instead run as
//    one block of four warps per SM beside the GEMM, batch entry by batch entry (resident_prepass_sm90.cuh).
//    Where K <= 128 and a batch entry's output is one tile, or the call has at most 8 (fp16) or 16 (auto) waves of
//    tiles, there is no pre-pass: the wgmma fp16 GEMM's tiles fold their lines from the stages they load
//    (GemmArgs::tile_line_ranges, tile_line_ranges_apply), and that GEMM is the call's only kernel (no workspace).
// 2. GEMM (corrected_gemm_wmma.cuh): 128x128 output tiles, 8 warps of 64x32, one block per SM. A and B are
//    read in place (row- or column-major views, batch strides, any alignment) by a 4-stage cp.async pipeline
//    of fp32 tiles; a split pass scales each value by its row's / column's power of two and splits it into hi
//    and residual (wmmae::split_fp16x2 / split_tf32) into double-buffered shared-memory tiles, once per
//    element and block: there are no hi/lo copies of A or B in global memory. Per k-step three mma's: hi*hi
//    into a zero accumulator that is added to the fp32 result outside the tensor core (round to nearest), and
//    lo*hi + hi*lo chained in a correction accumulator; B's residual carries the compensation of the tensor
//    core's truncation of the hi*hi sums (wmmae::split_fp16_compensated). K is summed in chunks
//    (accumulation_chunk) whose
//    results are added in the output tile (two-level summation, no extra registers). With few output tiles, K
//    is also split across blocks (split-K, fp32 atomics; not in deterministic mode), or, in the wgmma kernel,
//    every block takes an equal share of all (tile, k-stage) units (stream-K, also atomics).
//    On H100/H200 (sm_90a builds) both GEMMs are the wgmma kernel of corrected_gemm_sm90.cuh instead
//    (fp16 and tf32 instantiations): same tiles, stages, scaling and chunked summation, A split straight
//    into wgmma register fragments, and (fp16) the hi*hi products of two k-steps summed in the tensor core
//    before they are added (kFp16HiSumK).
//    On sm_90 the fp16 GEMM's blocks may start while the pre-pass finishes (allow_dependent_grid).
// 3. "auto": both kernels are launched; a 128x128 tile is computed by the fp16 kernel when all its rows of
//    A and columns of B are fp16-safe (corrected_matmul_scheme.hpp) and by the tf32 kernel otherwise. The
//    decision is made on the device, so the op never synchronizes the host and can be graph-captured. Where the
//    tiles fold their own line ranges (1.), the fp16 kernel computes the other tiles itself with float32 FMAs
//    from the stages that hold their whole K, and neither the tf32 kernel nor the check of 4. is launched.
// 4. "tf32" and "auto": where the tf32 GEMM computed a tile whose lines span more exponents than its split
//    keeps (tf32_spans_fit), float32_fallback_kernel (float32_fallback.cuh), launched after it, checks the
//    tile's outputs and computes it again with float32 fused multiply-adds where one is at risk
//    (split_output_at_risk); it returns at once where there is no such tile, again decided on the device.
#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

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

}  // namespace
}  // namespace wmmae_ops

#include "line_range_prepass.cuh"
#include "corrected_gemm_wmma.cuh"
#include "corrected_gemm_sm90.cuh"
#include "float32_fallback.cuh"
#include "resident_prepass_sm90.cuh"
#include "corrected_gemm_small.cuh"

namespace wmmae_ops {
namespace {

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

constexpr std::uint64_t kMaxSmemPerBlockSwitch = std::uint64_t{1} << 30;  // (far above any GPU's: a cap only lowers)
std::size_t smem_per_block(const cudaDeviceProp& props) {
  std::size_t bytes = props.sharedMemPerBlockOptin;
  if (const std::uint64_t cap = env_positive_number("TORCH_WMMAE_SMEM_PER_BLOCK", "bytes", kMaxSmemPerBlockSwitch)) {
    bytes = std::min<std::size_t>(bytes, cap);
  }
  return bytes;
}

KernelChoice choose_kernels(const cudaDeviceProp& props) {
  KernelChoice choice;
#ifdef WMMAE_HAS_SM90A
  choice.sm90 = props.major == 9 && props.minor == 0 && env_switch("TORCH_WMMAE_PORTABLE_GEMM") != Switch::kOn;
  choice.sm90_tma = choice.sm90 && env_switch("TORCH_WMMAE_SM90_TMA") != Switch::kOff;
#endif
  choice.smem_per_block = smem_per_block(props);
  choice.wmma_compact = !choice.sm90 && wmma_gemm_smem_bytes<Method::fp16, false>() > choice.smem_per_block;
  if (!choice.sm90) {
    choice.wmma_smem_needed = std::max(choice.wmma_compact ? wmma_gemm_smem_bytes<Method::fp16, true>()
                                                           : wmma_gemm_smem_bytes<Method::fp16, false>(),
                                       wmma_gemm_smem_bytes<Method::tf32, false>());
  }
  // Only where the code this device runs was compiled for sm_90 or newer: a build whose only code for an H100
  // is PTX of an older arch (TORCH_CUDA_ARCH_LIST="8.0+PTX") runs with wait_for_prior_grid compiled out, and
  // its kernels would read the workspace before it is ready.
  choice.overlap_launches = props.major >= 9 && ptx_version<prepass_kernel>() >= 90;
  return choice;
}

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

// Launches `Kernel` with `smem_bytes` of dynamic shared memory.
template <auto Kernel, class... Params>
void launch_with_smem(std::size_t smem_bytes, const GemmLaunch& launch, const Params&... params) {
  allow_dynamic_smem<Kernel>(smem_bytes);
  launch_kernel(Kernel, launch.grid, dim3(kThreads), smem_bytes, launch.stream,
                launch.overlaps_previous && launch.kernels.overlap_launches, params...);
}

#ifdef WMMAE_HAS_SM90A
// Which operands TMA can read in place: each in its own orientation, the inner dimension contiguous, a 16-byte
// aligned start, line and batch stride, with a batch of at most one dimension.
struct TmaReadable {
  bool a, b;
};

// Whether an operand of `lines` lines (rows or columns, by its layout), batch strides `batch_strides`, may be read by
// residue of them: every batch entry has its lines at the same residues of 16 bytes (one entry, or one batch dimension
// whose stride is a multiple of 4 floats, 0 where the operand is broadcast: four maps with a batch dimension then read
// them all; a stride of another residue would give each entry its own shifts, and TMA needs a map's batch stride to be
// a multiple of 16 bytes anyway; such a call may run as residue classes of the batch index instead:
// split_batch_reads_in_place), at least 4 lines (with fewer a residue would have none, and no map:
// encode_fp32_residue_maps), and its switch not 0.
bool operand_by_residue_applies(const GemmArgs& args, std::int64_t lines, const std::int64_t* batch_strides,
                                const char* switch_name) {
  const bool residues_shared_by_batch =
      args.num_batches == 1 ||
      (args.batch.ndim == 1 && batch_strides[0] * static_cast<std::int64_t>(sizeof(float)) % 16 == 0);
  return residues_shared_by_batch && lines >= sm90::kLineResidues && env_switch(switch_name) != Switch::kOff;
}

// Where the tile GEMMs would read a copy of an A that one TMA map cannot read (tma_copies_apply), or copy its stages
// with cp.async because the copy would not pay (tma_copies_pay), they read it in place by residue of its lines instead
// (rows where A is row-major, k where it is column-major: TmaMaps::a_by_residue; encode_fp32_residue_maps): calls whose
// batch entries share their lines' residues and of at least 4 such lines (operand_by_residue_applies), unless
// TORCH_WMMAE_A_BY_RESIDUE=0 keeps the copy or the cp.async stages (the outputs are the same bits). The copy costs A's
// size in memory and its time; by residue, the kernel reads 36 floats of each row per stage and A's fragments a float
// at a time. H200, session 102, us per call back to back, auto, by residue / copy / K rounded up to a multiple of 4:
// 16384 x 1024 x 1023 (x @ W^T) 304 / 337 / 280, 2048^2 x 2047 142 / 151 / 138, 4096^2 x 33 59.4 / 61.1 / 57.2; but
// 8192^2 x 8191 8700-8950 / 8390-8530 / 8250-8360. Read once (N <= 128), by residue / cp.async / torch fp32: 4096 x 128
// x 4097 65.4 / 94.1 / 100.1, 16384 x 128 x 1023 67.1 / 95.5 / 94.9, 8192 x 64 x 8191 210 / 361 / 196, 65536 x 128 x
// 511 134.5 / 189.9 / 187.1, 32768 x 32 x 2047 218 / 361 / 201. Column-major (session 103, A = X.t(), by residue /
// copy): 1023 x 1024 x 16384 292 / 337, 4097 x 4096 x 4096 1031 / 1060, but 8191 x 8192 x 8192 8764 / 8238; read once,
// by residue / cp.async: 8193 x 128 x 4096 118 / 169.
bool a_by_residue_applies(const GemmArgs& args, bool a_row) {
  return operand_by_residue_applies(args, a_row ? args.m : args.k, args.batch.a_stride, "TORCH_WMMAE_A_BY_RESIDUE");
}

// The same for B (TmaMaps::b_by_residue): column-major (the W.t() of x @ W.t() with an odd K, or a view with a storage
// offset) read in place by residue of its columns, row-major (the W of grad @ W, the x of grad.t() @ x, with an odd
// width N) by residue of its k, unless TORCH_WMMAE_B_BY_RESIDUE=0 keeps the copy or the cp.async stages (the outputs
// are the same bits). The copy costs B's size in memory; by residue, the split reads B a float at a time, and each
// stage 40 floats of a column for 32 (column-major) or 136 of a row for 128 (row-major).
// H200, session 104, us per call back to back, auto, x @ W.t() with both unaligned, by residue / B copied / K rounded
// up to a multiple of 4: 16384 x 1024 x 1023 348 / 304 / 280, 2048^2 x 2047 175 / 156 / 136, 4096^2 x 4097 1189 /
// 1169 / 1020, 8192^2 x 8191 9634 / 8691 / 7950; read once, by residue / cp.async: 128 x 8192 x 4097 129 / 199.
// Row-major, H200, session 105, by residue / B copied: grad @ W 2048 x 1023 x 1024 50.9 / 51.2, 8192 x 4095 x 4096
// 2107 / 2042; grad.t() @ x 1024 x 1023 x 2048 53.5 / 62.6, 4096 x 4095 x 8192 2093 / 2203; read once, by residue /
// cp.async: 128 x 4097 x 4096 82.1 / 107.
bool b_by_residue_applies(const GemmArgs& args, bool b_row) {
  return operand_by_residue_applies(args, b_row ? args.k : args.n, args.batch.b_stride, "TORCH_WMMAE_B_BY_RESIDUE");
}

// Whether copying the operands that TMA cannot read in place (tma_readable_copy, where tma_copies_apply) pays: not
// where such an operand is at least kCopiedOnceMinBytes and one line of output tiles reads it (B where M <= 128, A
// where N <= 128, each where it is not read by residue: a_by_residue, b_by_residue). The GEMM then reads it once either
// way, and the copy's extra read and write cost more than the TMA stages save. H200, session 99, same build, us per
// call back to back, auto, TORCH_WMMAE_SMALL_GEMM=0, copies / cp.async (TORCH_WMMAE_TMA_COPIES=0) (torch fp32), B of
// odd width read once: 128 x 4097 x 4096 139.9 / 106.7 (110.0), 128 x 4097 x 1024 54.9 / 43.5 (37.9), 128 x 16385 x
// 4096 480 / 395 (375); A of odd K read once: 4096 x 128 x 4097 117.1 / 94.2 (99.7); but a small B read once, 128 x
// 4097 x 256 (4 MB), 26.1 / 37.7. Read twice it is mixed: 256 x 4097 x 4096 181.7 / 174.4, 256 x 4097 x 1024 64.2 /
// 56.7, 4096 x 256 x 4097 148.8 / 153.8, 256 x 8193 x 8192 626 / 656; from three times the copies win: 384 x 4097 x
// 4096 224 / 245, 512 x 4097 x 1024 62.2 / 81.7.
constexpr std::int64_t kCopiedOnceMinBytes = std::int64_t{8} << 20;
bool tma_copies_pay(const GemmArgs& args, const TmaReadable& readable, bool a_by_residue, bool b_by_residue) {
  const std::int64_t floats_a = args.num_batches * args.m * args.k, floats_b = args.num_batches * args.k * args.n;
  const bool a_read_once = !readable.a && !a_by_residue && args.n <= kGemmTile && 4 * floats_a >= kCopiedOnceMinBytes;
  const bool b_read_once = !readable.b && !b_by_residue && args.m <= kGemmTile && 4 * floats_b >= kCopiedOnceMinBytes;
  return !a_read_once && !b_read_once;
}

// Encodes the maps of the operands TMA can read in place (see TmaReadable) into *maps; with a_by_residue (not null), an
// A that one map cannot read (a line stride or start that is not a multiple of 16 bytes) by residue of its lines
// instead (rows where A is row-major, k where it is column-major), into *a_by_residue, where those maps encode
// (TmaMaps::a_by_residue); with b_by_residue (not null), B so by residue of its lines (columns where B is
// column-major, k where it is row-major: TmaMaps::b_by_residue).
template <bool kARowMajor, bool kBRowMajor>
TmaReadable tma_operand_maps(const GemmArgs& args, sm90::TmaMaps* maps, sm90::ResidueMaps* a_by_residue,
                             sm90::ResidueMaps* b_by_residue) {
  using Cfg = sm90::Config<kARowMajor, kBRowMajor, true>;
  using Tf32Cfg = sm90::Config<kARowMajor, kBRowMajor, true, Method::tf32>;
  static_assert(std::is_same_v<typename Cfg::A, typename Tf32Cfg::A> &&
                    std::is_same_v<typename Cfg::B, typename Tf32Cfg::B>,
                "both methods' GEMMs read with the same maps (a call encodes them once: gemm_maps)");
  if (args.batch.ndim > 1) return {false, false};
  // (inner stride, line stride) of each operand in its orientation.
  const std::int64_t a_inner_stride = kARowMajor ? args.a_ks : args.a_rs;
  const std::int64_t a_line_stride = kARowMajor ? args.a_rs : args.a_ks;
  const std::int64_t b_inner_stride = kBRowMajor ? args.b_cs : args.b_ks;
  const std::int64_t b_line_stride = kBRowMajor ? args.b_ks : args.b_cs;
  const std::int64_t a_bs = args.batch.ndim == 1 ? args.batch.a_stride[0] : 0;
  const std::int64_t b_bs = args.batch.ndim == 1 ? args.batch.b_stride[0] : 0;
  bool a = a_inner_stride == 1 &&
           sm90::encode_fp32_operand_map(&maps->a, &maps->a_batched, args.a, kARowMajor ? args.k : args.m,
                                         kARowMajor ? args.m : args.k, a_line_stride, args.num_batches, a_bs,
                                         Cfg::A::kOuter);
  maps->a_by_residue = false;
  if (!a && a_by_residue != nullptr && a_inner_stride == 1) {
    using ATile = typename sm90::Config<kARowMajor, kBRowMajor, true, Method::fp16, true>::A;
    a = maps->a_by_residue =
        sm90::encode_fp32_residue_maps(a_by_residue->maps, a_by_residue->shift, &maps->a_batched, args.a,
                                       kARowMajor ? args.k : args.m, kARowMajor ? args.m : args.k, a_line_stride,
                                       args.num_batches, a_bs, ATile::kLd, ATile::kBoxLines);
  }
  bool b = b_inner_stride == 1 &&
           sm90::encode_fp32_operand_map(&maps->b, &maps->b_batched, args.b, kBRowMajor ? args.n : args.k,
                                         kBRowMajor ? args.k : args.n, b_line_stride, args.num_batches, b_bs,
                                         Cfg::B::kOuter);
  maps->b_by_residue = false;
  if (!b && b_by_residue != nullptr && b_inner_stride == 1) {
    using BTile = typename sm90::Config<kARowMajor, kBRowMajor, true, Method::fp16, false, true>::B;
    b = maps->b_by_residue =
        sm90::encode_fp32_residue_maps(b_by_residue->maps, b_by_residue->shift, &maps->b_batched, args.b,
                                       kBRowMajor ? args.n : args.k, kBRowMajor ? args.k : args.n, b_line_stride,
                                       args.num_batches, b_bs, BTile::kLd, BTile::kBoxLines);
  }
  return {a, b};
}

// tma_operand_maps for the operands' layout (a_row, b_row: row-major). The wgmma kernel's fp32 stages come by TMA
// where TMA can read both operands, with these maps; otherwise by cp.async (also where KernelChoice::sm90_tma is off).
TmaReadable encode_operand_maps(const GemmArgs& args, bool a_row, bool b_row, sm90::TmaMaps* maps,
                                sm90::ResidueMaps* a_by_residue, sm90::ResidueMaps* b_by_residue) {
  return a_row ? (b_row ? tma_operand_maps<true, true>(args, maps, a_by_residue, b_by_residue)
                        : tma_operand_maps<true, false>(args, maps, a_by_residue, b_by_residue))
               : (b_row ? tma_operand_maps<false, true>(args, maps, a_by_residue, b_by_residue)
                        : tma_operand_maps<false, false>(args, maps, a_by_residue, b_by_residue));
}
#endif

// auto's tf32 GEMM nearly always finds that the fp16 GEMM left it no tile, and returns. Launched with a block
// per tile, most of those blocks start only as the fp16 GEMM ends (auto took 4-6 us more than fp16 per call at
// 64 x 512^3, H200). So batched calls launch it with fewer batch slots, down to one wave of blocks
// (blocks_per_sm per SM, at least 1), whose blocks take the batch entries in turn. (H200, 64 x 512^3: its
// kernel's span 24.0 -> 21.7 us; auto minus fp16 per call 1.8-2.6 us against 3.6-4.1 in one pair of runs,
// within noise in another.)
dim3 tf32_exit_grid(dim3 grid, int blocks_per_sm, int sm_count) {
  const std::int64_t wave_slots =
      static_cast<std::int64_t>(sm_count) * blocks_per_sm / (static_cast<std::int64_t>(grid.x) * grid.y);
  return dim3(grid.x, grid.y, static_cast<unsigned>(std::clamp<std::int64_t>(wave_slots, 1, grid.z)));
}

#ifdef WMMAE_HAS_SM90A
// Whether the fp16 GEMM lets the kernels after it launch only as each block starts its last piece
// (GemmArgs::dependents_at_last_piece) instead of at its start: only where TORCH_WMMAE_LATE_DEPENDENTS=1 asks, for
// every wgmma fp16 GEMM with TMA stages but the one beside the resident pre-pass (the same bits). It was the rule for
// auto on persistent grids of one-tile batch entries whose tiles fold their line ranges, while auto's two exit kernels
// (the tf32 GEMM and the fallback check) followed that GEMM: launched at its start, they lengthened it by about 5 us
// each (H200, session 83: 512 x 128^2 x 64 45.8 -> 40.8-41.0 us per call back to back at the last piece). Such calls
// no longer launch them (GemmArgs::tile_line_ranges), and without them the placement changed nothing (session 92,
// same build, 512 x 128^2 x 64 auto 35.88 against 35.86 us, 2000 x 128^2 x 64 122.39 against 122.01); for fp16 it
// had been slower (512 x 128^2 x 64: 34.5 -> 34.8-35.1), as for grids of more than one tile (64 x 512^3, 8 x 1024^3:
// the same or about 1% slower).
bool late_dependents_apply() { return env_switch("TORCH_WMMAE_LATE_DEPENDENTS") == Switch::kOn; }

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
bool sm90_read_back(const GemmArgs& args) {
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
bool staged_flush_applies(const GemmArgs& args) {
  return args.n % 2 != 0 && env_switch("TORCH_WMMAE_STAGED_FLUSH") != Switch::kOff &&
         (!sm90_read_back(args) || accumulation_chunk(args.m, args.n) == kAccumulationChunkSmall);
}

// Whether the pre-pass runs beside the GEMM (resident_prepass_sm90.cuh): the fp16 GEMM's batched calls where TMA
// reads both operands, without split-K, stream-K or the chunk read-back, with overlapped launches. Per call against the
// grid pre-pass (H200, same build, the four-warp pre-pass): 64 x 512^3 about 205 -> 189 us, 32 x 256 x 1024 x
// 512 115 -> 107, 128 x 256^3 90 -> 74, 256 x 128^3 52 -> 43, 16 x 256 x 256 x 512 equal (31.5). (The one-warp
// pre-pass of session 24 lost at 32 x 256 x 1024 x 512, 120 -> 127, so it ran only where A and B hold at most
// 9 KB per tile and k-stage.) TORCH_WMMAE_RESIDENT_PREPASS=0 turns it off (the line ranges, and so the
// outputs, are the same).
bool resident_prepass_applies(const GemmArgs& args, const KernelChoice& kernels) {
  return args.method != Method::tf32 && kernels.sm90 && kernels.sm90_tma && kernels.overlap_launches &&
         args.num_batches >= 2 && !args.adds_into_output() && !sm90_read_back(args) &&
         env_switch("TORCH_WMMAE_RESIDENT_PREPASS") != Switch::kOff;
}

// Whether the fp16 GEMM folds each tile's line ranges from its own stages (GemmArgs::tile_line_ranges), so that
// the call runs no pre-pass. It can where a tile's whole K lies in the kStages stages that it issues at its start
// (K <= 128: the last one in the slot of the previous piece's last stage, which frees up as that piece ends) and
// every tile is computed whole (no split-K or stream-K): fp16 and auto on the wgmma kernel with TMA stages (TMA
// must read both operands in place: encode_operand_maps). Where a batch entry's output is one tile (m, n <= 128), each
// line is folded once, as the pre-pass folds it, so it always does. Where tiles share lines, each folds them
// again: a cost per tile (about 0.6 us per wave of tiles at K = 64, H200), against the pre-pass's fixed cost (its
// launch and its reads before the first tile's scales, and for auto the tf32 GEMM and the fallback check, which
// the folding GEMM needs not: about 7-11 us for fp16, 11-12 for auto). So it does up to kTileRangesFp16Waves /
// kTileRangesAutoWaves waves of tiles. H200, session 94, same build, three rounds of alternating processes, us per
// call back to back, pre-pass -> tiles' own ranges, auto (fp16): 32 x 512^2 x 64 37.2 -> 29.5 (34.3 -> 29.5),
// 128 x 256^2 x 64 40.4 -> 31.6 (36.7 -> 31.6), 1024^2 x 64 13.6 -> 9.3 (10.5 -> 9.3), 4096^2 x 64 (8 waves)
// 67.6 -> 56.3 (61.5 -> 56.3), 4096^2 x 128 82.5 -> 75.6 (76.6 -> 75.6), 16 x 1024^2 x 64 (8 waves) 61.1 -> 54.5
// (56.1 -> 54.4), 8 x 2048^2 x 64 (16 waves) 113.6 -> 109.1 (107.3 -> 109.2); 31 waves: 64 x 1024^2 x 64 198.1 ->
// 204.5 (191.1 -> 204.8), 8192^2 x 128 280.5 -> 288.2 (260.4 -> 287.9), 4 x 4096^2 x 96 242.5 -> 244.3 (228.2 ->
// 244.5), 8192^2 x 64 222.7 -> 219.5 (207.1 -> 219.1); auto with a row spanning 2^60 in every eighth row of tiles
// (those tiles take float32 FMAs instead of the tf32 GEMM) gained on every shape tried, 64 x 1024^2 x 64 560 -> 423.
// One tile per entry, session 82 (auto; fp16): 512 x 128^2 x 64 48.5-49.7 -> 44.9-45.0 (47.1-47.2 -> 34.2), 1024 x
// 128^2 x 64 81.8-82.5 -> 73.0 (82.5-83.3 -> 62.7-62.8); session 93 (auto): 256 x 128^3 37.4 -> 24.0, 300 x 128^2
// x 112 42.7 -> 32.2. TORCH_WMMAE_TILE_RANGES=0 turns it off, =1 on wherever it can run (the ranges, and so the
// fp16 method's outputs, are the same).
constexpr std::int64_t kTileRangesFp16Waves = 8;
constexpr std::int64_t kTileRangesAutoWaves = 16;
bool tile_line_ranges_apply(const GemmArgs& args, const KernelChoice& kernels, std::int64_t tiles_per_entry,
                            int sm_count) {
  const Switch tile_ranges = env_switch("TORCH_WMMAE_TILE_RANGES");
  if (tile_ranges == Switch::kOff) return false;
  const bool can = args.method != Method::tf32 && kernels.sm90 && kernels.sm90_tma &&
                   args.k <= sm90::kStages * sm90::kBlockK && !args.adds_into_output();
  if (!can) return false;
  const std::int64_t waves = args.method == Method::automatic ? kTileRangesAutoWaves : kTileRangesFp16Waves;
  return tile_ranges == Switch::kOn || tiles_per_entry == 1 ||
         tiles_per_entry * args.num_batches <= waves * sm_count;
}

// Launches the resident pre-pass of a and b into their line ranges, reading with A's and B's TMA maps (which the
// GEMM reads with too), counting finished items in items_done ([num_batches], zeroed), and points args at the
// counts. Returns false (nothing launched) where the items would not fit the kernel's 32-bit counts.
template <bool kARowMajor, bool kBRowMajor>
bool launch_resident_prepass_variant(GemmArgs& args, const LinesArgs& a, const LinesArgs& b, int* items_done,
                                     int sm_count, cudaStream_t stream, const sm90::TmaMaps& maps) {
  sm90::ResidentPrepassArgs prepass{};
  prepass.lines[0] = a;
  prepass.lines[1] = b;
  const auto line_tiles = [](std::int64_t lines) { return (lines + sm90::kResidentLines - 1) / sm90::kResidentLines; };
  constexpr std::int64_t kBandK = sm90::kResidentBandStages * sm90::kBlockK;
  const std::int64_t a_tiles = line_tiles(args.m), b_tiles = line_tiles(args.n), bands = (args.k + kBandK - 1) / kBandK;
  const std::int64_t items_per_batch = (a_tiles + b_tiles) * bands;
  if (items_per_batch * args.num_batches > 0x3fffffff) return false;  // (the kernel counts items in 32 bits)
  prepass.line_tiles[0] = static_cast<int>(a_tiles);
  prepass.line_tiles[1] = static_cast<int>(b_tiles);
  prepass.bands = static_cast<int>(bands);
  prepass.items_per_batch = static_cast<int>(items_per_batch);
  prepass.items = static_cast<int>(items_per_batch * args.num_batches);
  prepass.items_done = items_done;
  prepass.next_item = items_done + args.num_batches;
  prepass.sm_claims = prepass.next_item + 1;
  const unsigned blocks = static_cast<unsigned>(std::min(sm_count, prepass.items));  // one block per SM
  constexpr auto kernel = sm90::resident_prepass_kernel<kARowMajor, kBRowMajor>;
  prefer_max_shared_carveout<kernel>();  // (and the GEMM's beside it: see launch_sm90)
  // (Overlapping zero_workspace_kernel: resident_prepass_applies needs overlapped launches.)
  launch_kernel(kernel, dim3(blocks), dim3(sm90::kResidentThreads), sm90::kResidentSmemBytes, stream, true, prepass,
                maps);
  args.prepass_items_done = items_done;
  args.prepass_items_per_batch = prepass.items_per_batch;
  return true;
}

bool launch_resident_prepass(GemmArgs& args, const LinesArgs& a, const LinesArgs& b, bool a_row, bool b_row,
                             int* items_done, int sm_count, cudaStream_t stream, const sm90::TmaMaps& maps) {
  const auto variant = a_row ? (b_row ? launch_resident_prepass_variant<true, true>
                                      : launch_resident_prepass_variant<true, false>)
                             : (b_row ? launch_resident_prepass_variant<false, true>
                                      : launch_resident_prepass_variant<false, false>);
  return variant(args, a, b, items_done, sm_count, stream, maps);
}

// The wgmma kernel of method M with fp32 stages by TMA (kTma, `maps`) or cp.async. tf32: the method, or auto's
// tiles that are not fp16-safe, on the plan's grid (no stream-K; auto: the fp16 GEMM skipped those tiles'
// pieces, this kernel takes them whole), in one wave's batch slots for auto (see tf32_exit_grid).
template <Method M, bool kARowMajor, bool kBRowMajor, bool kTma>
void launch_sm90(const GemmArgs& args, const sm90::TmaMaps& maps, const GemmLaunch& launch) {
  // (A or B by residue: in TMA stages only, never beside the resident pre-pass.)
  [[maybe_unused]] const bool a_by_residue = kTma && maps.a_by_residue;
  [[maybe_unused]] const bool b_by_residue = kTma && maps.b_by_residue;
  if constexpr (M == Method::tf32) {
    GemmArgs tf32_args = args;
    tf32_args.stream_k_blocks = 0;
    GemmLaunch tf32_launch = launch;
    if (args.method == Method::automatic) tf32_launch.grid = tf32_exit_grid(launch.grid, 1, launch.sm_count);
    constexpr std::size_t kSmem = sm90::Config<kARowMajor, kBRowMajor, kTma, Method::tf32>::kSmemBytes;
    if constexpr (kTma) {
      if (b_by_residue) {
        with_flag(a_by_residue, [&](auto a_residues) {
          constexpr bool kAResidues = decltype(a_residues)::value;
          launch_with_smem<sm90::corrected_gemm_sm90_tf32_kernel_b_by_residue<kARowMajor, kBRowMajor, kAResidues>>(
              sm90::Config<kARowMajor, kBRowMajor, true, Method::tf32, kAResidues, true>::kSmemBytes, tf32_launch,
              tf32_args, maps, *launch.a_residue_maps, *launch.b_residue_maps);
        });
        return;
      }
    }
    if constexpr (kTma) {
      if (a_by_residue) {
        launch_with_smem<sm90::corrected_gemm_sm90_tf32_kernel_a_by_residue<kARowMajor, kBRowMajor>>(
            sm90::Config<kARowMajor, kBRowMajor, true, Method::tf32, true>::kSmemBytes, tf32_launch, tf32_args, maps,
            *launch.a_residue_maps);
        return;
      }
    }
    launch_with_smem<sm90::corrected_gemm_sm90_tf32_kernel<kARowMajor, kBRowMajor, kTma>>(kSmem, tf32_launch,
                                                                                          tf32_args, maps);
  } else {
    using Cfg = sm90::Config<kARowMajor, kBRowMajor, kTma>;
    GemmLaunch fp16_launch = launch;
    if constexpr (kTma) {
      if (launch.persistent_batch_slots > 0) fp16_launch.grid.z = launch.persistent_batch_slots;
      TORCH_INTERNAL_ASSERT(!((a_by_residue || b_by_residue) && args.prepass_items_done != nullptr),
                            "an operand by residue beside the pre-pass");
      if (args.prepass_items_done != nullptr) {  // beside the resident pre-pass, whose blocks share its SMs
        constexpr auto kernel = sm90::corrected_gemm_sm90_kernel<kARowMajor, kBRowMajor, true, false, true, false>;
        prefer_max_shared_carveout<kernel>();
        launch_with_smem<kernel>(Cfg::kSmemBytes, fp16_launch, args, maps);
        return;
      }
    }
    // The first wave starts staggered (sm90::stagger_start) where it fills at least half of the SMs (fewer
    // blocks hardly meet each other's memory traffic) and each block has at least 12 k-stages of work: the
    // delay, up to 3 us, is a large part of shorter calls (about 20 us at 128 x 448 x 4096, 4 stages per
    // block), where the A/B could not resolve its effect. Never beside the resident pre-pass (above), whose
    // blocks start as their batch entries' lines are ready, one entry after the other (H100, 64 x 512^3 and
    // 8 x 1024^3: the same or up to 1% slower staggered).
    GemmArgs fp16_args = args;
    if constexpr (kTma) fp16_args.dependents_at_last_piece = late_dependents_apply();
    const std::int64_t blocks = std::int64_t{fp16_launch.grid.x} * fp16_launch.grid.y * fp16_launch.grid.z;
    const std::int64_t stages = gemm_tiles(args.m, args.n) * gemm_k_stages(args.k) * args.num_batches;
    const bool staggered = 2 * blocks >= launch.sm_count && stages >= 12 * blocks;
    fp16_args.start_stagger_blocks = staggered ? launch.sm_count : 0;
    // An instantiation per kind of flush: chunks read back or not, and the staged flush of odd widths (TMA
    // stages only: with cp.async stages the output's odd widths keep the element stores).
    const bool staged = kTma && staged_flush_applies(args);
    with_flags(sm90_read_back(args), staged, [&](auto read_back, auto odd_width) {
      constexpr bool kReadBack = decltype(read_back)::value, kOddWidth = decltype(odd_width)::value;
      if constexpr (kTma) {
        if (b_by_residue) {
          with_flag(a_by_residue, [&](auto a_residues) {
            constexpr bool kAResidues = decltype(a_residues)::value;
            launch_with_smem<sm90::corrected_gemm_sm90_kernel_b_by_residue<kARowMajor, kBRowMajor, kReadBack,
                                                                           kOddWidth, kAResidues>>(
                sm90::Config<kARowMajor, kBRowMajor, true, Method::fp16, kAResidues, true>::kSmemBytes, fp16_launch,
                fp16_args, maps, *launch.a_residue_maps, *launch.b_residue_maps);
          });
          return;
        }
      }
      if constexpr (kTma) {
        if (a_by_residue) {
          launch_with_smem<sm90::corrected_gemm_sm90_kernel_a_by_residue<kARowMajor, kBRowMajor, kReadBack, kOddWidth>>(
              sm90::Config<kARowMajor, kBRowMajor, true, Method::fp16, true>::kSmemBytes, fp16_launch,
              fp16_args, maps, *launch.a_residue_maps);
          return;
        }
      }
      if constexpr (kTma || !kOddWidth) {
        launch_with_smem<sm90::corrected_gemm_sm90_kernel<kARowMajor, kBRowMajor, kTma, kReadBack, false, kOddWidth>>(
            Cfg::kSmemBytes, fp16_launch, fp16_args, maps);
      }
    });
  }
}
#endif

template <Method M, bool kARowMajor, bool kBRowMajor, bool kCompact>
void launch_wmma(const GemmArgs& args, const GemmLaunch& launch) {
  using Cfg = GemmConfig<M, kARowMajor, kBRowMajor, kCompact>;
  constexpr auto kernel = corrected_gemm_kernel<M, kARowMajor, kBRowMajor, kCompact>;
  if (M == Method::tf32 && args.method == Method::automatic) {
    GemmLaunch exit_launch = launch;
    exit_launch.grid = tf32_exit_grid(launch.grid, blocks_per_sm<kernel>(kThreads, Cfg::kSmemBytes), launch.sm_count);
    launch_with_smem<kernel>(Cfg::kSmemBytes, exit_launch, args);
  } else {
    launch_with_smem<kernel>(Cfg::kSmemBytes, launch, args);
  }
}

// Calls f(std::bool_constant<A row-major>{}, std::bool_constant<B row-major>{}): the GEMM kernels are instantiated
// per layout of their operands.
template <class F>
void with_layouts(bool a_row_major, bool b_row_major, F&& f) {
  with_flags(a_row_major, b_row_major, std::forward<F>(f));
}

template <Method M, bool kARowMajor, bool kBRowMajor>
void launch_gemm_variant(const GemmArgs& args, const GemmLaunch& launch) {
  if (launch.kernels.sm90) {
#ifdef WMMAE_HAS_SM90A
    if (launch.tma_maps != nullptr) {
      launch_sm90<M, kARowMajor, kBRowMajor, true>(args, *launch.tma_maps, launch);
    } else {
      launch_sm90<M, kARowMajor, kBRowMajor, false>(args, sm90::TmaMaps{}, launch);
    }
#endif
  } else {
    if constexpr (M == Method::fp16) {  // (tf32's stages are 16 k in both configurations: one instantiation)
      if (launch.kernels.wmma_compact) return launch_wmma<M, kARowMajor, kBRowMajor, true>(args, launch);
    }
    launch_wmma<M, kARowMajor, kBRowMajor, false>(args, launch);
  }
}

template <Method M>
void launch_gemm(const GemmArgs& args, const GemmGrid& plan, bool a_row_major, bool b_row_major, cudaStream_t stream,
                 bool overlaps_previous, const KernelChoice& kernels, int sm_count, const sm90::TmaMaps* tma_maps,
                 const sm90::ResidueMaps* a_residue_maps = nullptr,
                 const sm90::ResidueMaps* b_residue_maps = nullptr) {
  TORCH_CHECK(plan.tiles <= 0x7fffffff, "corrected_matmul: the output has too many tiles");
  TORCH_CHECK(args.k_per_split / 16 < 0x7fffffff, "corrected_matmul: the inner dimension is too large");
  const bool stream_k = M == Method::fp16 && args.stream_k_blocks > 0;  // (set only for the wgmma kernel)
  const GemmLaunch launch{stream_k ? dim3(static_cast<unsigned>(args.stream_k_blocks))
                                   : dim3(static_cast<unsigned>(plan.tiles), static_cast<unsigned>(plan.k_splits),
                                          static_cast<unsigned>(plan.batch_slots)),
                          stream, overlaps_previous, kernels, sm_count, tma_maps,
                          static_cast<unsigned>(M == Method::fp16 && !stream_k ? plan.persistent_batch_slots : 0),
                          a_residue_maps, b_residue_maps};
  with_layouts(a_row_major, b_row_major, [&](auto a_row, auto b_row) {
    launch_gemm_variant<M, decltype(a_row)::value, decltype(b_row)::value>(args, launch);
  });
}

// Whether the tile GEMMs read an operand that TMA cannot read in place (a start, line or batch stride not a multiple
// of 16 bytes: an odd K or N, a storage offset) from a copy that it can (tma_readable_copy), instead of copying their
// stages with cp.async. The copy reads and writes the operand once more and needs its memory; it gives the TMA
// stages, and where K <= 128 the tiles' own line ranges. H200, session 97, same build, us per call back to back,
// auto, cp.async (TORCH_WMMAE_TMA_COPIES=0) -> copies: 4097^3 2599 -> 1318 (torch fp32 3139), 2049^3 387 -> 236,
// 4096^2 x 33 76.8 -> 61.3, 4096^2 x 64 with A one float past 16 bytes 75.0 -> 58.0, 2049^2 x 256 93.0 -> 75.4,
// 1448^2 x 99 29.9 -> 22.1, 8 x 1025^2 x 64 92.4 -> 77.1; aligned shapes unchanged (4096^2 x 64 54.4 / 54.5). An
// odd N gained less (4097^2 x 64 148 -> 137, torch 73): there the GEMM's time went to the output's odd width, which
// a copy of B does not change (session 99 stages it: staged_flush_applies). A batch of more than one dimension keeps
// cp.async (TMA reads one), and so does a large operand that one line of output tiles reads (tma_copies_pay).
// TORCH_WMMAE_TMA_COPIES=0 turns the copies off (the outputs are the same bits).
bool tma_copies_apply(const GemmArgs& args, const KernelChoice& kernels) {
  return kernels.sm90_tma && args.batch.ndim <= 1 && env_switch("TORCH_WMMAE_TMA_COPIES") != Switch::kOff;
}

// Whether a call runs the small GEMM (corrected_gemm_small.cuh) instead of the tile GEMMs: fp16 and auto where K fits
// in its shared memory (K <= kSmallMaxK), by default where a batch entry's output fits one 64x64 tile, which fills a
// quarter of the tile GEMMs' 128x128 tiles, or where the whole call's output is at most kSmallCallOutputs elements
// with M, N <= kSmallCallExtent: at most four 128x128 tiles, which the small GEMM spreads over more, smaller blocks
// (small_gemm_tile), so that the call, one block's latency, is shorter. H200, session 95, back to back, us, tile
// GEMMs -> small GEMM: 128^2 x 64 7.70 -> 6.95, 256^2 x 64 7.80 -> 6.99, 256^2 x 128 9.96 -> 8.92; with more output
// it gains less or loses: 512^2 x 32 6.68 -> 6.27, x 64 7.83 -> 7.97, x 128 9.96 -> 10.52, 1024^2 x 32 6.74 -> 9.14,
// 16 x 256^2 x 64 7.97 -> 10.60. On H100/H200, where the wgmma GEMM could not read an operand by TMA (a start or
// line stride not a multiple of 16 bytes, more than one batch dimension, TMA switched off: tma_reads() is false),
// it copied with cp.async and the call was four or five kernels (the workspace's zeroing, the pre-pass, the GEMMs,
// auto's check), not the GEMM alone, and the small GEMM won on calls of up to kSmallUnreadCallOutputs outputs
// (H200, session 96, back to back, us, tile GEMMs -> small GEMM, auto: with A's lines unaligned (odd K) 1024^2 x 50
// 15.5 -> 12.4, x 99 19.0 -> 18.4, x 127 19.8 -> 16.8, 4 x 512^2 x 63 16.4 -> 12.5; A 4 bytes past 16, 1024^2 x
// 128 19.7 -> 16.8; B's (odd N) 257^2 x 64 23.9 -> 7.8, 769^2 x 64 25.7 -> 10.4, 513^2 x 128 27.7 -> 12.2, 64 x
// 65^2 x 64 26.8 -> 10.4; beyond the bound, A's lines unaligned: 1448^2 x 63 23.1 -> 18.9, x 99 30.0 -> 35.7,
// 2048^2 x 50 23.3 -> 29.1, 16 x 512^2 x 63 28.3 -> 29.4; B's: 1025^2 x 64 25.2 -> 12.5, 8193^2 x 64 481 -> 404).
// Where the tile GEMMs read copies instead (tma_copies_apply), the small GEMM keeps only the calls with an odd N, whose
// output's odd width the copies leave slow (the wgmma GEMM's flush then stores element by element, 9 of each 32-byte
// sector's bytes per store: H200, session 98, ncu, 4097^2 x 64 against 4096^2 x 64, 4x the store requests, 4.8x the L2
// write requests, 138 against 60 us, the same DRAM bytes), and those with M or N at most kSmallNarrowExtent, which fill
// a quarter or less of the tile GEMMs' 128-wide tiles (H200, session 97, same build, us, small GEMM -> copies and tile
// GEMMs: 1024^2 x 50 12.38 -> 10.40, x 99 18.33 -> 12.86, 1024^2 x 64 with A one float past 16 bytes 12.50 -> 9.78; odd
// N: 257^2 x 64 7.89 -> 15.93, 769^2 x 64 10.43 -> 18.92, 64 x 65^2 x 64 10.45 -> 17.23; A's lines of 63 floats, M x N:
// 65536 x 16 30.02 -> 45.56, 32768 x 32 16.66 -> 23.66, 16384 x 64 14.02 -> 13.86, 8192 x 128 13.08 -> 11.47, 16 x
// 65536 26.00 -> 32.76, 64 x 16384 12.47 -> 11.30, 128 x 8192 12.44 -> 10.19). Beyond kSmallUnreadCallOutputs the small
// GEMM also takes those two kinds where it won there: M or N at most kSmallNarrowExtent, and an odd N with K <=
// kSmallOddWidthMaxK (H200, session 97, same build, us, copies and tile GEMMs -> small GEMM: 1048576 x 8 x 64 747 ->
// 440, 262144 x 32 x 99 232 -> 206, 4097^2 x 64 136.4 -> 108.8, 8193^2 x 64 466 -> 409; but 2049^2 x 128 51.6 -> 53.5;
// session 96, against cp.async, which an odd N's copies barely change: 2049^2 x 64 57.0 -> 31.9, 4097^2 x 32 135.8 ->
// 81.9, 16 x 513^2 x 64 67.0 -> 34.7, 1024 x 65^2 x 64 142.1 -> 90.3; session 98, this rule against
// TORCH_WMMAE_SMALL_GEMM=0: 4097^2 x 64 138.9 -> 109.2, 4097^2 x 32 130.2 -> 82.4, 1048576 x 8 x 64 751 -> 440, 40000 x
// 32 x 31 23.5 -> 15.3, 32 x 262144 x 63 114 -> 104). Since session 99 the tile GEMMs that read copies stage an odd
// width (staged_flush_applies), and the small GEMM keeps, of the odd widths beyond the bound, those of at most
// kSmallStagedOddWidthMaxN (H200, session 99, us per call back to back, auto, small GEMM / staged tile GEMMs (torch
// fp32): 65536 x 33 x 64 28.6 / 40.6 (21.0); but 32768 x 65 x 64 27.6 / 24.1 (20.5), 65536 x 65 x 64 51.2 / 39.8,
// 16384 x 129 x 64 24.7 / 21.8, 32768 x 257 x 64 64.2 / 52.9, 4097^2 x 64 109.2 / 79.5, 8193^2 x 64 408 / 291; close
// or lost: 8192 x 257 x 64 18.7 / 19.7, 1025^2 x 32 9.8 / 10.2, 8192 x 257 x 16 11.3 / 16.6).
// Since session 105 the tile GEMMs read a row-major B of odd width by residue of its k instead of a copy, and from
// kSmallOddWidthByResidueMinOutputs outputs they win those calls too, where they read no copy: A in place, with one
// map or by residue (H200, us per call back to back, auto, small GEMM / tile GEMMs: session 105, B by residue: 769^2 x
// 64 10.42 / 9.28, 1023^2 x 64 10.60 / 9.12, 769^2 x 128 15.76 / 11.89, 1023^2 x 32 9.16 / 7.80, 4096 x 255 x 64 10.63
// / 9.30, 255 x 4095 x 64 11.86 / 9.07, 2049 x 511 x 96 13.53 / 11.40; session 106, A by residue too: 769^2 x 63 12.73
// / 9.70, 1023^2 x 63 12.87 / 9.67, 1023^2 x 33 12.17 / 9.41, 2049 x 511 x 95 15.50 / 12.47; batched B by residue: 2 x
// 513^2 x 64 10.40 / 9.20, 2 x 723^2 x 64 12.29 / 9.84, 4 x 363^2 x 64 10.45 / 9.10; from 2^18 outputs, session 106:
// 513^2 x 63 11.34 / 9.30, 513^2 x 127 14.58 / 12.08, 601^2 x 96 11.11 / 9.94, 400 x 701 x 64 9.00 / 8.75, 513^2 x 64
// 8.95 / 8.78, but 4 x 257^2 x 64 9.01 / 9.08; below the bound 511^2 x 64 8.15 / 9.02, 363^2 x 64 7.69 / 9.00, 257^2 x
// 64 7.82 / 8.97).
// TORCH_WMMAE_SMALL_GEMM=0 turns it off, =1 on wherever it can run (any M and N). Read on every call: tests
// compare it with the tile GEMMs.
constexpr std::int64_t kSmallCallOutputs = 256 * 256;
constexpr std::int64_t kSmallCallExtent = 256;
constexpr std::int64_t kSmallUnreadCallOutputs = std::int64_t{1} << 20;
constexpr std::int64_t kSmallNarrowExtent = 32;
constexpr std::int64_t kSmallOddWidthMaxK = 64;
constexpr std::int64_t kSmallStagedOddWidthMaxN = 64;
constexpr std::int64_t kSmallOddWidthByResidueMinOutputs = std::int64_t{1} << 18;
template <class TmaReads, class ReadsCopies, class ReadsInPlace>
bool small_gemm_applies(const GemmArgs& args, const KernelChoice& kernels, TmaReads&& tma_reads,
                        ReadsCopies&& tile_gemms_read_copies, ReadsInPlace&& tile_gemms_read_in_place) {
  if (args.method == Method::tf32 || args.k > kSmallMaxK) return false;
  const Switch forced = env_switch("TORCH_WMMAE_SMALL_GEMM");
  if (forced == Switch::kOff) return false;
  const std::int64_t outputs = args.num_batches * args.m * args.n;
  if (forced == Switch::kOn || (args.m <= kSmallMaxTile && args.n <= kSmallMaxTile) ||
      (args.m <= kSmallCallExtent && args.n <= kSmallCallExtent && outputs <= kSmallCallOutputs)) {
    return true;
  }
  // (tma_reads() and tile_gemms_read_copies() asked last: they encode the maps, which the tile GEMMs would then
  // use. Reading copies by TMA, the tile GEMMs stage an odd width: staged_flush_applies.)
  if (!kernels.sm90) return false;
  const bool odd_width = args.n % 2 != 0, narrow = std::min(args.m, args.n) <= kSmallNarrowExtent;
  const bool small_wins =
      outputs <= kSmallUnreadCallOutputs
          ? (odd_width && !(outputs >= kSmallOddWidthByResidueMinOutputs && tile_gemms_read_in_place())) ||
                narrow || !tile_gemms_read_copies()
          : narrow || (odd_width && args.k <= kSmallOddWidthMaxK &&
                       (args.n <= kSmallStagedOddWidthMaxN ||
                        !(staged_flush_applies(args) && tile_gemms_read_copies())));
  return small_wins && !tma_reads();
}

// The small GEMM's output tiles of `tile` per batch entry.
std::int64_t small_gemm_tiles(const GemmArgs& args, int tile) {
  return ((args.m + tile - 1) / tile) * ((args.n + tile - 1) / tile);
}

// The small GEMM's tile: the smallest of 16, 32 and 64 that holds a batch entry's output (64 for larger ones), so
// that a block's copies, folds and products are of that output's lines and not of a 64x64 tile's; but 32 instead
// of 64 where tile 64's grid would leave at least half of the SMs without a block, or at K <= 32 (where tile 32 has
// a kernel of fewer registers, tile 64 none) would leave any: four blocks of a quarter of the outputs each then
// shorten the call, which is one block's latency. H200 (132 SMs), session 90, back to back, us, tile 64 -> 32: 1 x
// 64^3 8.3 -> 6.9, 16 x 64^3 8.4 -> 7.0, 66 x 64^3 8.5 -> 7.8, 1 x 64^2 x 128 10.6 -> 8.6, 66 x 64^2 x 128 11.0 ->
// 10.3, 66 x 50 x 61 x 47 10.7 -> 10.3, 100 x 64^2 x 32 7.9 -> 7.0, 132 x 64^2 x 32 8.1 -> 7.4; about even at 80
// and 100 x 64^3 (8.6, 8.8 either way); on larger grids tile 64: 120 x 64^3 9.0 -> 9.3, 132 x 64^3 9.1 -> 9.4, 100 x
// 64^2 x 128 12.0 -> 13.3, 100 x 50 x 61 x 47 10.8 -> 11.2, 200 x 64^2 x 32 8.8 -> 9.0, 600 x 64^2 x 32 14.7 ->
// 19.5. Tile 16 gained nothing over 32 (1 x 64^3 7.0, 1 x 32^3 5.8 against 5.9). Every tile gives the same bits
// (but for auto's tiles of float32 FMAs, whose extent is the tile's). TORCH_WMMAE_SMALL_TILE=16, 32 or 64 forces
// that tile, whatever the output (tests).
int small_gemm_tile(const GemmArgs& args, int sm_count) {
  if (const char* forced = env_value("TORCH_WMMAE_SMALL_TILE")) {
    for (const int tile : {16, 32, kSmallMaxTile}) {
      if (std::to_string(tile) == forced) return tile;
    }
    TORCH_CHECK(false, "corrected_matmul: the environment variable TORCH_WMMAE_SMALL_TILE must be 16, 32 or 64 (or "
                "unset), got '", forced, "'");
  }
  const std::int64_t extent = std::max(args.m, args.n);
  if (extent <= 16) return 16;
  if (extent <= 32) return 32;
  const std::int64_t blocks = small_gemm_tiles(args, kSmallMaxTile) * args.num_batches;  // of tile 64
  return blocks * 2 <= sm_count || (args.k <= 32 && blocks <= sm_count) ? 32 : kSmallMaxTile;
}

// Whether the small GEMM lets the next call's first kernel launch only as each of its blocks exits
// (GemmArgs::dependents_at_last_piece) rather than once each has waited for the kernel before it: where its grid is
// one partial wave with more than one block on some SMs that leaves at least one block's room on each. Launched
// while this grid runs, the next grid's blocks would take that room, unevenly (the SMs that take the most finish
// last). H200, session 87, back to back, us, once waited -> at the exit: 264 x 64^3 14.1 -> 12.7, 256 x 48 x 40 x
// 100 16.2 -> 13.9, 600 x 32^2 x 64 14.3 -> 12.5, 1500 x 16^2 x 64 16.0 -> 14.6 (launched without overlap: 14.1, 15.3,
// 14.0, 16.0); on the other side of the bounds the exit was the slower: 300 x 64^3 14.3 -> 14.5, 390 x 64^3 14.8 ->
// 15.3, 1000 x 32^3 11.9 -> 12.5, 3000 x 16^3 17.2 -> 17.8, and no faster on grids of at most a block per SM (27
// shapes in all, each placement best or within 0.1 us where this rule picks it: benchmarks/NOTES.md, session 87).
// blocks_per_sm: how many fit on an SM.
bool small_gemm_dependents_at_exit(std::int64_t blocks, int sm_count, int blocks_per_sm) {
  return blocks > sm_count && blocks <= static_cast<std::int64_t>(blocks_per_sm - 1) * sm_count;
}

// The small GEMM's grid: a block per output tile and batch entry, the batch entries beyond kMaxGridYZ looped over.
template <int kTile>
dim3 small_gemm_grid(const GemmArgs& args) {
  const std::int64_t tiles = small_gemm_tiles(args, kTile);
  TORCH_CHECK(tiles <= 0x7fffffff, "corrected_matmul: the output has too many tiles");
  return dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(std::min(args.num_batches, kMaxGridYZ)));
}

// Whether the kernel with the hi*hi sums per output fragment (small_gemm_products_per_fragment: tile 64 at K <= 64,
// five blocks per SM instead of four; tile 32 at K <= 32, sixteen instead of fourteen; more fragment loads) runs
// instead of the one with them per k-step: where it takes fewer waves of blocks, and at K > 32 at most two. H200,
// back to back, us, per k-step -> per fragment. Session 89, tile 64, K = 64 / 32 / 16: 600 x 64^3 23.9 -> 20.4 (one
// wave instead of two), 600 x 64^2 x 16 17.6 -> 11.6, 1300 x 64^3 41.4 -> 39.9 (two instead of three), 1300 x 64^2 x
// 16 26.8 -> 22.0; on more than two waves, fewer paid at K = 32 (4096 x 64^2 x 32 82.6 -> 79.8, 2640 x 64^2 x 32
// 54.7 -> 52.0, 8192 x 64^2 x 32 159.4 -> 149.4) but not at K = 64 (4096 x 64^3 103.6 -> 105.0, 2640 x 64^3 69.8 ->
// 70.6); session 90, tile 64 at K <= 32 on more than two: 3000 x 64^2 x 32 63.2 -> 60.3, 6000 x 64^2 x 16 104.8 ->
// 97.0, 1600 x 64^2 x 32 38.8 -> 36.6 (and 1600 x 64^3 47.1 -> 48.9); tile 32: 2000 x 32^3 18.8 -> 16.7, 2000 x
// 32^2 x 16 15.4 -> 13.3, 2000 x 24 x 30 x 20 16.7 -> 14.6, 3800 x 32^3 28.5 -> 27.6, 8192 x 32^3 52.6 -> 51.0,
// 6000 x 32^3 40.5 -> 39.1, 12000 x 32^2 x 16 62.7 -> 59.6. On as many waves it was up to 11% slower (tile 64:
// 2048 x 64^3 56.8 -> 59.6, 520 x 64^3 16.7 -> 18.3; tile 32: 2200 x 32^3 19.3 -> 20.2, 1848 x 32^3 14.9 -> 15.1).
// TORCH_WMMAE_SMALL_HH_PER_FRAGMENT=1 or 0 forces the one or the other (tests). blocks_per_sm_*: how many of each
// fit on an SM.
bool small_gemm_hh_per_fragment(std::int64_t blocks, std::int64_t k, int sm_count, int blocks_per_sm_per_k_step,
                                int blocks_per_sm_per_fragment) {
  switch (env_switch("TORCH_WMMAE_SMALL_HH_PER_FRAGMENT")) {
    case Switch::kOff: return false;
    case Switch::kOn: return true;
    case Switch::kUnset: break;
  }
  const auto waves = [&](int blocks_per_sm) {
    const std::int64_t wave = static_cast<std::int64_t>(sm_count) * blocks_per_sm;
    return (blocks + wave - 1) / wave;
  };
  const std::int64_t per_fragment = waves(blocks_per_sm_per_fragment);
  return per_fragment < waves(blocks_per_sm_per_k_step) && (per_fragment <= 2 || k <= 32);
}

template <int kTile, int kMaxK, bool kARowMajor, bool kBRowMajor, bool kHhPerFragment>
void launch_small_gemm_variant(const GemmArgs& args, dim3 grid, int sm_count, bool overlap, cudaStream_t stream) {
  constexpr auto kernel = corrected_gemm_small_kernel<kTile, kMaxK, kARowMajor, kBRowMajor, kHhPerFragment>;
  const std::size_t smem_bytes = small_gemm_smem_bytes<kTile, kARowMajor, kBRowMajor>(args.k);
  allow_dynamic_smem<kernel>(smem_bytes);
  GemmArgs small_args = args;
  small_args.dependents_at_last_piece =
      small_gemm_dependents_at_exit(static_cast<std::int64_t>(grid.x) * grid.y, sm_count,
                                    blocks_per_sm<kernel>(SmallShape<kTile>::kThreads, smem_bytes));
  launch_kernel(kernel, grid, dim3(SmallShape<kTile>::kThreads), smem_bytes, stream, overlap, small_args);
}

// The small GEMM's kernel for the call's tile (small_gemm_tile) and K bucket (small_gemm_k_bucket), and where the
// bucket has two (SmallKBucket::kHasHhPerFragment), its products (small_gemm_hh_per_fragment).
template <int kTile, bool kARowMajor, bool kBRowMajor>
void launch_small_gemm_tile(const GemmArgs& args, int sm_count, bool overlap, cudaStream_t stream) {
  const dim3 grid = small_gemm_grid<kTile>(args);
  const auto launch_bucket = [&](auto max_k) {
    constexpr int kMaxK = decltype(max_k)::value;
    if constexpr (SmallKBucket<kTile, kMaxK>::kHasHhPerFragment) {
      constexpr auto per_k_step = corrected_gemm_small_kernel<kTile, kMaxK, kARowMajor, kBRowMajor, false>;
      constexpr auto per_fragment = corrected_gemm_small_kernel<kTile, kMaxK, kARowMajor, kBRowMajor, true>;
      const std::size_t smem_bytes = small_gemm_smem_bytes<kTile, kARowMajor, kBRowMajor>(args.k);
      if (small_gemm_hh_per_fragment(static_cast<std::int64_t>(grid.x) * grid.y, args.k, sm_count,
                                     blocks_per_sm<per_k_step>(SmallShape<kTile>::kThreads, smem_bytes),
                                     blocks_per_sm<per_fragment>(SmallShape<kTile>::kThreads, smem_bytes))) {
        launch_small_gemm_variant<kTile, kMaxK, kARowMajor, kBRowMajor, true>(args, grid, sm_count, overlap, stream);
        return;
      }
    }
    launch_small_gemm_variant<kTile, kMaxK, kARowMajor, kBRowMajor, false>(args, grid, sm_count, overlap, stream);
  };
  const int bucket = small_gemm_k_bucket(kTile, args.k);
  if constexpr (kTile != kSmallMaxTile) {  // (tile 64 has no bucket of 32)
    if (bucket == 32) return launch_bucket(std::integral_constant<int, 32>{});
  }
  if (bucket == 64) return launch_bucket(std::integral_constant<int, 64>{});
  launch_bucket(std::integral_constant<int, kSmallMaxK>{});
}

// overlap: launched to overlap the kernel before it on the stream (programmatic dependent launch), which the
// kernel waits for before it reads or writes anything, as the tile GEMMs' first kernel does.
void launch_small_gemm(const GemmArgs& args, bool a_row_major, bool b_row_major, int sm_count, bool overlap,
                       cudaStream_t stream) {
  const int tile = small_gemm_tile(args, sm_count);
  with_layouts(a_row_major, b_row_major, [&](auto a_row, auto b_row) {
    constexpr bool kARowMajor = decltype(a_row)::value, kBRowMajor = decltype(b_row)::value;
    if (tile == 16) launch_small_gemm_tile<16, kARowMajor, kBRowMajor>(args, sm_count, overlap, stream);
    else if (tile == 32) launch_small_gemm_tile<32, kARowMajor, kBRowMajor>(args, sm_count, overlap, stream);
    else launch_small_gemm_tile<kSmallMaxTile, kARowMajor, kBRowMajor>(args, sm_count, overlap, stream);
  });
}

// A strided (rows x cols) view is read in place when one of its dimensions is contiguous (or has one
// element); otherwise it is copied once into a contiguous tensor.
bool row_major_view(const at::Tensor& t) { return t.stride(-1) == 1 || t.size(-1) == 1; }
bool col_major_view(const at::Tensor& t) { return t.stride(-2) == 1 || t.size(-2) == 1; }

// A copy of the operand view t ([*batch,] lines x inner where row_major, else transposed) in the same orientation,
// each line padded to a multiple of 16 bytes in a fresh allocation (at least 16-byte aligned), so that TMA can read
// it. Batch dimensions broadcast with stride 0 stay broadcasts of one copy.
at::Tensor tma_readable_copy(const at::Tensor& t, bool row_major) {
  at::Tensor source = t;
  for (std::int64_t d = 0; d + 2 < t.dim(); ++d) {
    if (t.stride(d) == 0) source = source.narrow(d, 0, 1);
  }
  const at::Tensor lines = row_major ? source : source.transpose(-2, -1);  // inner dimension last
  std::vector<std::int64_t> padded = lines.sizes().vec();
  constexpr std::int64_t kFloatsPer16Bytes = 4;
  padded.back() = (padded.back() + kFloatsPer16Bytes - 1) / kFloatsPer16Bytes * kFloatsPer16Bytes;
  at::Tensor copy = at::empty(padded, t.options()).narrow(-1, 0, lines.size(-1));
  copy.copy_(lines);
  return (row_major ? copy : copy.transpose(-2, -1)).expand(t.sizes());
}

#ifdef WMMAE_HAS_SM90A
// An operand's batch entries at different residues of 16 bytes (one batch dimension whose stride is not a multiple of 4
// floats, as a contiguous [batch, 301, 1001]) are not read by residue (operand_by_residue_applies); but the entries
// whose index has one residue modulo 4 are kBatchResidueClasses strides apart, a multiple of 4 floats, and share their
// lines' residues. So a call that would copy such an operand may run as one call per residue class instead
// (batch_residue_class), each reading its entries by residue, where every operand it would copy is then read in place:
// the same kernels on a quarter of the batch each, outputs kBatchResidueClasses entries apart
// (GemmArgs::c_batch_stride), the same bits in deterministic mode. Each class's GEMM has its own last wave and fixed
// costs, so the copies are faster until a class has kBatchClassMinWaves waves of tiles. H200, session 111, us per call
// back to back, auto, classes / copies (torch fp32): 16 x 2047^3 2552 / 2706 (5493), 64 x 1025^3 1899 / 2071, 128 x
// 513^3 811 / 843, 8 x 4095^3 8760 / 8779, 16 x 4095 x 1024 x 1023 1212 / 1255 (classes of 6-16 waves); but 32 x 1023 x
// 1024 x 1023 634 / 620 (3.9 waves), 64 x 511 x 512 x 511 241 / 218 (1.9), 64 x 513^3 554 / 442 (3 waves), 4 x 2047^3
// 764 / 667 (1.9), 8 x 1023 x 1024 x 1023 192 / 172 (1). TORCH_WMMAE_BATCH_RESIDUE_CLASSES=0 never splits, =1 wherever
// the classes read every operand in place (read on every call: tests compare them with the copies, as the A and B
// by-residue switches at 0 do).
constexpr int kBatchResidueClasses = 4;
constexpr std::int64_t kBatchClassMinWaves = 4;
bool split_batch_reads_in_place(const GemmArgs& args, bool a_row, bool b_row, bool copy_a, bool copy_b, int sm_count) {
  if (args.batch.ndim != 1 || args.num_batches < 2) return false;
  const Switch forced = env_switch("TORCH_WMMAE_BATCH_RESIDUE_CLASSES");
  if (forced == Switch::kOff) return false;
  GemmArgs one_class = args;
  one_class.batch.a_stride[0] *= kBatchResidueClasses;
  one_class.batch.b_stride[0] *= kBatchResidueClasses;
  one_class.num_batches = (args.num_batches + kBatchResidueClasses - 1) / kBatchResidueClasses;
  const bool pays = forced == Switch::kOn ||
                    one_class.num_batches * gemm_tiles(args.m, args.n) >= kBatchClassMinWaves * sm_count;
  return pays && (!copy_a || a_by_residue_applies(one_class, a_row)) &&
         (!copy_b || b_by_residue_applies(one_class, b_row));
}

// The batch entries p, p + kBatchResidueClasses, ... of a call with one batch dimension, as views of its operands a
// and b ([*batch, M, K] and [*batch, K, N], their batch dimensions coalescing into plan.batch_strides), planned.
MatmulPlan batch_residue_class(const at::Tensor& a, const at::Tensor& b, const MatmulPlan& plan, int p) {
  TORCH_INTERNAL_ASSERT(plan.batch_strides.ndim == 1 && p < plan.batch, "batch_residue_class: one batch dimension");
  const std::int64_t entries = (plan.batch - p + kBatchResidueClasses - 1) / kBatchResidueClasses;
  const auto class_of = [&](const at::Tensor& t, std::int64_t batch_stride) {
    return t.as_strided({entries, t.size(-2), t.size(-1)}, {kBatchResidueClasses * batch_stride, t.stride(-2),
                                                            t.stride(-1)},
                        t.storage_offset() + p * batch_stride);
  };
  return plan_matmul(class_of(a, plan.batch_strides.a_stride[0]), class_of(b, plan.batch_strides.b_stride[0]),
                     "corrected_matmul");
}
#endif

// Launches the product of plan's operands (views of the caller's tensors) into batch entries first_entry,
// first_entry + entry_step, ... of `out`, the call's output (contiguous, [*, m, n]): all of them (0, 1), or a batch
// residue class's (split_batch_reads_in_place). may_split_batch: where the call would copy an operand only because its
// batch entries sit at different residues of 16 bytes, it runs as one call per residue class of the batch index
// instead, which do not split again.
void run_corrected_gemm(MatmulPlan plan, const at::Tensor& out, std::int64_t first_entry, std::int64_t entry_step,
                        Method method, const cudaDeviceProp& props, [[maybe_unused]] bool may_split_batch) {
  // Each operand is read in place when one of its matrix dimensions is contiguous (a dimension of size 1
  // counts as contiguous: it is read at offset 0 only), otherwise copied once. The classification that
  // decides the copy also picks the kernel's layout.
  at::Tensor a = plan.a, b = plan.b;
  bool a_row = row_major_view(a), b_row = row_major_view(b);
  if (!a_row && !col_major_view(a)) {
    a = a.contiguous();
    a_row = true;
  }
  if (!b_row && !col_major_view(b)) {
    b = b.contiguous();
    b_row = true;
  }
  const auto replan_if_copied = [&] {
    if (!a.is_same(plan.a) || !b.is_same(plan.b)) {
      const std::vector<std::int64_t> out_shape = plan.out_shape;  // the views are >= 2-D now: keep the 1-D rules
      plan = plan_matmul(a, b, "corrected_matmul");
      plan.out_shape = out_shape;
    }
  };
  replan_if_copied();

  GemmArgs args{};
  const auto point_at_operands = [&] {
    args.a = a.data_ptr<float>();
    args.b = b.data_ptr<float>();
    args.a_rs = a.stride(-2);
    args.a_ks = a.stride(-1);
    args.b_ks = b.stride(-2);
    args.b_cs = b.stride(-1);
    args.batch = plan.batch_strides;
  };
  point_at_operands();
  args.c = out.data_ptr<float>() + first_entry * plan.m * plan.n;
  args.c_batch_stride = entry_step * plan.m * plan.n;
  args.m = plan.m;
  args.n = plan.n;
  args.k = plan.k;
  args.num_batches = plan.batch;
  args.method = method;

  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int sm_count = props.multiProcessorCount;
  const GemmGrid grid = plan_gemm_grid(plan.m, plan.n, plan.k, plan.batch, sm_count, props.l2CacheSize);
  args.k_splits = grid.k_splits;
  args.k_per_split = grid.k_per_split;
  const KernelChoice kernels = choose_kernels(props);
  // Before any launch: a GPU that cannot run the WMMA kernels gets this message.
  TORCH_CHECK(kernels.wmma_smem_needed <= kernels.smem_per_block, "corrected_matmul: the portable WMMA GEMM needs ",
              kernels.wmma_smem_needed, " bytes of shared memory per block, and this ", props.name,
              " (compute capability ", props.major, ".", props.minor, ") allows ", kernels.smem_per_block,
              env_value("TORCH_WMMAE_SMEM_PER_BLOCK") ? " (TORCH_WMMAE_SMEM_PER_BLOCK)" : "",
              ". The CUDA kernels run on H100/H200 and on GPUs that allow a block at least 163 KiB, such as the "
              "A100; compute on the CPU elsewhere");
  // A's and B's TMA maps, encoded at most once per call, where a choice below or the wgmma GEMMs ask whether TMA can
  // read the operands; the resident pre-pass and both GEMMs read with them (the maps do not depend on the method).
  sm90::TmaMaps gemm_tma_maps{};
  sm90::ResidueMaps gemm_a_residue_maps{};  // (where gemm_tma_maps.a_by_residue)
  sm90::ResidueMaps gemm_b_residue_maps{};  // (where gemm_tma_maps.b_by_residue)
  std::optional<TmaReadable> tma_readable;  // (per operand: the copies below take those that TMA cannot read)
  bool read_a_by_residue = false;           // (where the copies below would copy A: a_by_residue_applies)
  bool read_b_by_residue = false;           // (where the copies below would copy B: b_by_residue_applies)
  const auto tma_reads = [&] {
#ifdef WMMAE_HAS_SM90A
    if (!tma_readable) {
      tma_readable = kernels.sm90_tma ? encode_operand_maps(args, a_row, b_row, &gemm_tma_maps,
                                                            read_a_by_residue ? &gemm_a_residue_maps : nullptr,
                                                            read_b_by_residue ? &gemm_b_residue_maps : nullptr)
                                      : TmaReadable{};
    }
    return tma_readable->a && tma_readable->b;
#else
    return false;
#endif
  };
  // Whether the tile GEMMs read copies of the operands that TMA cannot read in place (tma_copies_apply and
  // tma_copies_pay): one answer for the small GEMM's rule and the copies below. (It matters only where TMA cannot
  // read an operand in place.)
  const auto tile_gemms_read_copies = [&] {
#ifdef WMMAE_HAS_SM90A
    if (!tma_copies_apply(args, kernels)) return false;
    tma_reads();
    return tma_copies_pay(args, *tma_readable, a_by_residue_applies(args, a_row), b_by_residue_applies(args, b_row));
#else
    return false;
#endif
  };
  // Whether the tile GEMMs, where they would read copies (tile_gemms_read_copies), read no copy: TMA reads each operand
  // in place, with one map or by residue of its lines.
  const auto tile_gemms_read_in_place = [&] {
#ifdef WMMAE_HAS_SM90A
    return tile_gemms_read_copies() && (tma_readable->a || a_by_residue_applies(args, a_row)) &&
           (tma_readable->b || b_by_residue_applies(args, b_row));
#else
    return false;
#endif
  };
  // (One kernel: no workspace, no pre-pass.)
  if (small_gemm_applies(args, kernels, tma_reads, tile_gemms_read_copies, tile_gemms_read_in_place)) {
    launch_small_gemm(args, a_row, b_row, sm_count, kernels.overlap_launches, stream);
    return;
  }
#ifdef WMMAE_HAS_SM90A
  if (!tma_reads() && tile_gemms_read_copies()) {
    // A, B by residue where their maps encode, not copied
    read_a_by_residue = !tma_readable->a && a_by_residue_applies(args, a_row);
    read_b_by_residue = !tma_readable->b && b_by_residue_applies(args, b_row);
    if (read_a_by_residue || read_b_by_residue) {
      tma_readable.reset();
      tma_reads();
    }
    const bool copy_a = !tma_readable->a, copy_b = !tma_readable->b;
    if ((copy_a || copy_b) && may_split_batch &&
        split_batch_reads_in_place(args, a_row, b_row, copy_a, copy_b, sm_count)) {
      for (int p = 0; p < kBatchResidueClasses && p < plan.batch; ++p) {
        run_corrected_gemm(batch_residue_class(a, b, plan, p), out, first_entry + p * entry_step,
                           kBatchResidueClasses * entry_step, method, props, false);
      }
      return;
    }
    if (copy_a) a = tma_readable_copy(a, a_row);
    if (copy_b) b = tma_readable_copy(b, b_row);
    if (copy_a || copy_b) {  // (with the operands by residue or readable, the maps above stand: nothing to encode again)
      replan_if_copied();
      point_at_operands();
      tma_readable.reset();  // (asked again below, of the copies)
    }
  }
#endif
  // Stream-K is a schedule of the wgmma kernel (the fp16 GEMM on sm_90); "auto"'s tf32 kernel keeps the grid.
  args.stream_k_blocks = method != Method::tf32 && kernels.sm90 ? grid.stream_k_blocks : 0;
  args.stream_k_gap = grid.stream_k_gap;
  args.tile_group_rows = launch_tile_group_rows(plan.k, props.l2CacheSize, grid.k_splits);
  // With split-K or stream-K the GEMM adds into the output, which the pre-pass zeroes (a batch residue class's
  // entries too, c_batch_stride apart: split_batch_reads_in_place).
  const bool zero_output = args.adds_into_output();
  bool prepass_launched = false;
  // Every method scales its lines (line_shift), so every call finds their ranges: by a pre-pass, or where K is
  // short in the fp16 GEMM's tiles (tile_line_ranges_apply).
#ifdef WMMAE_HAS_SM90A
  args.tile_line_ranges = tile_line_ranges_apply(args, kernels, grid.tiles, sm_count) && tma_reads();
  if (args.tile_line_ranges) {
    // The GEMM reads A and B and writes the output, nothing else: no workspace to zero, no other kernel. It may
    // start while the kernel before it runs, and waits for it before its first loads.
    launch_gemm<Method::fp16>(args, grid, a_row, b_row, stream, true, kernels, sm_count, &gemm_tma_maps,
                              &gemm_a_residue_maps, &gemm_b_residue_maps);
    return;
  }
  // (The resident pre-pass reads A and B with their one map each: not where one is read by residue.)
  const bool resident = resident_prepass_applies(args, kernels) && tma_reads() && !gemm_tma_maps.a_by_residue &&
                        !gemm_tma_maps.b_by_residue;
#else
  const bool resident = false;
#endif
  // In int words: the 64-bit wide_tiles_pending (words 0-1, 8-byte aligned as the allocation is), auto's
  // tf32_tiles_pending (word 2) and one unused word, so that the line ranges start 16-byte aligned; then three
  // int arrays (max exponent, min exponent, non-finite flag) of batch * (m + n) entries each: A's rows as
  // [batch][m] first, then B's columns as [batch][n]; then the resident pre-pass's counts per batch entry, its
  // next item and its SM claims (ResidentPrepassArgs).
  constexpr std::int64_t kFlagWords = 4;
  const std::int64_t per = plan.batch * (plan.m + plan.n);
  const std::int64_t resident_words = resident ? plan.batch + 1 + sm90::kResidentSmClaims : 0;
  // Zeroed by zero_workspace_kernel (at::zeros goes through TensorIterator and a fill kernel, which cost the
  // host 1.4-12 us more per call: H200, two same-build pairs of runs).
  const at::Tensor workspace = at::empty({kFlagWords + 3 * per + resident_words}, a.options().dtype(at::kInt));
  int* const flags = workspace.data_ptr<int>();
  TORCH_INTERNAL_ASSERT(reinterpret_cast<std::uintptr_t>(flags) % 16 == 0, "corrected_matmul: workspace alignment");
  launch_zero_workspace(flags, workspace.numel(), sm_count, kernels.overlap_launches, stream);
  args.wide_tiles_pending = reinterpret_cast<unsigned long long*>(flags);
  args.tf32_tiles_pending = flags + 2;
  int* const base = flags + kFlagWords;  // see RangeArrays
  const std::int64_t a_block = plan.batch * plan.m;
  args.a_ranges = RangeArrays{base, base + per, base + 2 * per};
  args.b_ranges = RangeArrays{base + a_block, base + per + a_block, base + 2 * per + a_block};
  const LinesArgs a_lines{args.a, plan.m, plan.k, args.a_rs, args.a_ks, args.batch, false, args.a_ranges, plan.batch};
  const LinesArgs b_lines{args.b, plan.n, plan.k, args.b_cs, args.b_ks, args.batch, true, args.b_ranges, plan.batch};
#ifdef WMMAE_HAS_SM90A
  if (resident) {
    prepass_launched = launch_resident_prepass(args, a_lines, b_lines, a_row, b_row, base + 3 * per, sm_count,
                                               stream, gemm_tma_maps);
  }
#endif
  // The wgmma GEMMs read by TMA wherever it can read both operands (never on the WMMA GEMMs: no sm90_tma).
  const sm90::TmaMaps* const gemm_maps = tma_reads() ? &gemm_tma_maps : nullptr;
  if (!prepass_launched) {
    prepass_launched = launch_prepass(a_lines, b_lines, zero_output ? args.c : nullptr, plan.batch,
                                      plan.m * plan.n, args.c_batch_stride, sm_count, kernels.overlap_launches,
                                      stream);
  }
  if (method != Method::tf32) {
    // (It overlaps the pre-pass, which it waits for before its first tile's scales.)
    launch_gemm<Method::fp16>(args, grid, a_row, b_row, stream, prepass_launched, kernels, sm_count, gemm_maps,
                              &gemm_a_residue_maps, &gemm_b_residue_maps);
  }
  // auto's tf32 GEMM returns at once where the fp16 GEMM left it no tile; launched to overlap the fp16 GEMM's
  // end, so that this costs no launch gap. The tf32 method's overlaps the pre-pass's end.
  if (method != Method::fp16) {
    launch_gemm<Method::tf32>(args, grid, a_row, b_row, stream, method == Method::automatic || prepass_launched,
                              kernels, sm_count, gemm_maps, &gemm_a_residue_maps,
                              &gemm_b_residue_maps);
    launch_float32_fallback(args, props, kernels.overlap_launches, stream);  // checks tiles beyond its split
  }
}

// The guard sets the device only where it differs from the thread's current one, and a thread's current device is 0
// before its first CUDA call, with no context current: so a thread's first call on device 0 may reach the driver's
// tensor-map encoder (cuTensorMapEncodeTiled), which needs a current context, before any runtime call made one
// current. There it failed, and the call copied its operands (the first backward pass of a process, on autograd's
// device thread; H200, session 113). Once per thread the device is set regardless, which makes its context current.
void make_context_current_once_per_thread(c10::DeviceIndex device) {
  thread_local bool done = false;
  if (!done) {
    C10_CUDA_CHECK(c10::cuda::SetDevice(device, /*force=*/true));
    done = true;
  }
}

at::Tensor corrected_matmul_cuda(const at::Tensor& a_in, const at::Tensor& b_in, c10::string_view method_name) {
  const Method method = method_from_string(std::string(method_name));
  MatmulPlan plan = plan_matmul(a_in, b_in, "corrected_matmul");  // checks dtypes, devices and shapes first
  TORCH_CHECK(a_in.is_cuda(), "corrected_matmul: argument 'a' must be a CUDA tensor for the CUDA kernel");
  const c10::cuda::CUDAGuard guard(a_in.device());
  make_context_current_once_per_thread(a_in.device().index());
  // Allocated in its final shape (the same memory as [batch, m, n], contiguous), so no view is made per call.
  at::Tensor out = at::empty(plan.out_shape, a_in.options());
  if (out.numel() == 0) return out;
  if (plan.k == 0) return out.zero_();
  const cudaDeviceProp& props = *at::cuda::getCurrentDeviceProperties();  // of a's device (the guard)
  TORCH_CHECK(props.major >= 8, "corrected_matmul: the CUDA kernels need compute capability 8.0 or newer");
  // One matrix product where b is broadcast over a's packed batch.
  fold_batch_into_rows(plan, props.multiProcessorCount, props.l2CacheSize);
  run_corrected_gemm(std::move(plan), out, 0, 1, method, props, true);
  return out;
}

// See the schema (registration.cpp).
std::vector<std::string> corrected_matmul_kernel_choice_cuda(const at::Tensor& like) {
  const c10::cuda::CUDAGuard guard(like.device());  // (choose_kernels asks the current device for the PTX version)
  const KernelChoice choice = choose_kernels(*at::cuda::getDeviceProperties(like.get_device()));
  std::vector<std::string> names;
  if (choice.sm90) names.emplace_back("sm90");
  if (choice.sm90_tma) names.emplace_back("sm90_tma");
  if (choice.overlap_launches) names.emplace_back("overlap_launches");
  if (choice.wmma_compact) names.emplace_back("wmma_compact");
  return names;
}

}  // namespace

TORCH_LIBRARY_IMPL(wmmae, CUDA, m) {
  m.impl("corrected_matmul", &corrected_matmul_cuda);
  m.impl("_corrected_matmul_kernel_choice", &corrected_matmul_kernel_choice_cuda);
}

}  // namespace wmmae_ops
