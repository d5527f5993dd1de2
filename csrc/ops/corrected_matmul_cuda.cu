// corrected_matmul on CUDA: fp32 GEMM on tensor cores with Ootomo & Yokota's error correction.
//
// Matrix-vector products (M or N = 1 per batch entry, every method) and tiny products (M and N at most 8) take none
// of what follows: they are memory-bound or almost all padding, and matrix_vector_cuda.cu sums their exact products
// in float64 (matrix_vector.hpp).
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
//
// The tile GEMMs' kernels are launched from their own translation units (corrected_gemm_common.cuh,
// launch_gemm_variant); this one holds the host side, the pre-passes, the float32 fallback and the small GEMM.
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

#include "corrected_matmul_scheme.hpp"
#include "dynamic_smem.cuh"
#include "kernel_switches.hpp"
#include "matmul_plan.hpp"
#include "matrix_vector.hpp"
#include "corrected_gemm_common.cuh"
#include "line_range_prepass.cuh"
#include "corrected_gemm_wmma.cuh"
#include "corrected_gemm_sm90.cuh"
#include "float32_fallback.cuh"
#include "resident_prepass_sm90.cuh"
#include "corrected_gemm_small.cuh"

namespace wmmae_ops {
namespace {

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

// Which operands TMA can read in place: each in its own orientation, the inner dimension contiguous, a 16-byte
// aligned start, line and batch stride, with a batch of at most one dimension.
struct TmaReadable {
  bool a, b;
};

#ifdef WMMAE_HAS_SM90A

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

#ifdef WMMAE_HAS_SM90A
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

#endif

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
[[maybe_unused]] bool tma_copies_apply(const GemmArgs& args, const KernelChoice& kernels) {  // (sm_90a only)
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
// it. Batch dimensions broadcast with stride 0 stay broadcasts of one copy. (sm_90a only)
[[maybe_unused]] at::Tensor tma_readable_copy(const at::Tensor& t, bool row_major) {
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
  // (These three only where the build has sm_90a code.)
  [[maybe_unused]] std::optional<TmaReadable> tma_readable;  // (per operand: the copies below take those that TMA
                                                             // cannot read)
  [[maybe_unused]] bool read_a_by_residue = false;  // (where the copies below would copy A: a_by_residue_applies)
  [[maybe_unused]] bool read_b_by_residue = false;  // (where the copies below would copy B: b_by_residue_applies)
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
  if (matrix_vector_applies(plan)) {  // (M or N = 1, or tiny: float64 sums on the CUDA cores, every method)
    matrix_vector_cuda(plan, out);
    return out;
  }
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
