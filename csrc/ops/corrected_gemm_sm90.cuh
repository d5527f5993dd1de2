// The fp16 corrected GEMM on Hopper (sm_90a), built on corrected_gemm_common.cuh (GemmArgs, the tile helpers and
// the cp.async stage loader). Same numerical scheme as the WMMA kernel
// (corrected_gemm_wmma.cuh), on wgmma:
//
// - 128x128 output tiles, two warpgroups of 64x128, 4-stage ring of fp32 tiles (k extent 32), filled by TMA
//   (a box per warp, an mbarrier per slot) when TMA can read both operands in place, row- or column-major
//   (kTma; an A whose lines one map cannot read, in four maps by residue of its rows, AResidueStageTile, or of its
//   columns where it is column-major, AKResidueStageTile; a B whose lines one map cannot read, in four maps by
//   residue of its columns where it is column-major, BResidueStageTile, or of its rows, BKResidueStageTile), else by
//   cp.async from every thread.
// - A is split into fp16 hi and scaled residual straight into wgmma's register fragments: each thread reads
//   its fragment's elements from the fp32 stage (the library idea, load_matrix_with_op, for the wgmma layout),
//   so A's hi/lo never touch shared memory.
// - B is split by all threads into hi/lo tiles in shared memory in a core-matrix layout wgmma reads (no
//   swizzle: 8x8 core matrices of 128 bytes; K-major, or MN-major for row-major B in TMA stages, which wgmma
//   transposes), one stage ahead of the products: warpgroup 1 before its first products of a stage,
//   warpgroup 0 later in the stage (see split_ahead). B's residual carries the compensation of the tensor
//   core's truncation (wmmae::split_fp16_compensated).
// - Per stage (two 16-wide k-steps) and warpgroup: the hi*hi products of both k-steps summed in a fresh
//   accumulator (two wgmmas; four of 64 columns in the row-major instantiation beside the resident pre-pass,
//   see kHalfHi), added to the fp32 sum outside the tensor core (round to nearest) when done (the portable
//   WMMA kernel adds every k-step); lo*hi and hi*lo chained in the correction accumulator. All asynchronous,
//   while the next stage of B is split; the last correction products of a stage still run while the next
//   stage starts (B's hi/lo tiles are triple-buffered for that).
// - The tf32 method (corrected_gemm_sm90_tf32_kernel; also auto's tiles that are not fp16-safe): the same
//   kernel with tf32 hi and residual (the lines scaled only to keep clear of float32's subnormals and
//   overflow, see line_shift), k-steps of 8 (four per stage), B's hi/lo tiles K-major with 4-byte elements
//   and double-buffered, so each stage's products end before the next stage's barrier.
#pragma once

#include <type_traits>

#include "corrected_gemm_common.cuh"
#include "magnitude_keys.cuh"
#include "sm90_tma.cuh"
#include "wgmma_sm90.cuh"

namespace wmmae_ops {
namespace sm90 {

constexpr int kBlockK = 32;
constexpr int kStages = 4;
static_assert(kThreads == 256 && kBlockM == 128 && kBlockN == 128, "two warpgroups of 64 x 128");
static_assert(kBlockK == kGemmStageK, "stream-K's units are the kernel's stages");

// An fp32 stage tile, in the operand's orientation in global memory. Filled by cp.async: rows padded so that
// the fragment reads of A (float2 per lane, inner extent 32) and the transposing reads of the B split (inner
// extent 128) are free of bank conflicts. Filled by TMA (kTma): boxes of 32 inner elements (128 bytes) by
// kOuter lines, one after the other along the inner dimension, each in the 128-byte swizzle (16-byte chunk c
// of line o stored at chunk c ^ (o % 8)), which keeps the same reads conflict-free without padding.
template <bool kRowMajor, int kRows, int kCols, bool kTma = false>
struct StageTile {
  static constexpr int kOuter = kRowMajor ? kRows : kCols;
  static constexpr int kInner = kRowMajor ? kCols : kRows;
  static constexpr int kLd = kTma ? kInner : kInner + (kInner == kBlockK ? 8 : 4);
  static constexpr int kFloats = kOuter * kLd;
  static constexpr int kBoxInner = 32;  // TMA box: 32 floats x kOuter lines
  static constexpr int kBoxes = kInner / kBoxInner;
  // Offset in floats of element (outer, inner).
  __device__ static int offset(int outer, int inner) {
    if constexpr (kTma) {
      const int box = inner / kBoxInner, c = inner % kBoxInner;
      return box * kOuter * kBoxInner + outer * kBoxInner + (((c / 4) ^ (outer % 8)) * 4) + c % 4;
    } else {
      return outer * kLd + inner;
    }
  }
  static constexpr int kBoxFloats = kOuter * kBoxInner;  // box j starts at float j * kBoxFloats of the tile
  // Offset in floats from element (outer, inner) to (outer + 8 lines8, inner + 32 inner32): the same for
  // every element (the swizzle repeats every 8 lines, a box is 32 wide), so that a thread keeps the offsets
  // of a few elements and reaches the others by constants.
  static constexpr int shift(int lines8, int inner32) {
    return kTma ? lines8 * 8 * kBoxInner + inner32 * kBoxFloats : lines8 * 8 * kLd + inner32 * 32;
  }
  static constexpr unsigned kBoxBytes = sizeof(float) * kBoxFloats;
  static constexpr bool kByResidue = false;
  static constexpr bool kKByResidue = false;
};

// What AResidueStageTile and BResidueStageTile share: four TMA boxes, one per residue of the lines, of 32 lines of
// kLineFloats floats from the 16-byte aligned k0 of the stage, unswizzled, the stage's 32 k from a shift < 4 in each
// line (fold_stage_line's path for such lines: kByResidue).
template <int kLines, int kLineFloats>
struct ResidueLinesTile {
  static constexpr int kOuter = kLines;
  static constexpr int kInner = kBlockK;
  static constexpr int kLd = kLineFloats;
  static constexpr int kBoxLines = 32;
  static constexpr int kBoxes = kOuter / kBoxLines;
  static constexpr int kFloats = kOuter * kLd;
  static constexpr int kBoxFloats = kBoxLines * kLd;
  static constexpr unsigned kBoxBytes = sizeof(float) * kBoxFloats;
  static constexpr bool kByResidue = true;
  static constexpr bool kKByResidue = false;
};

// A's stage tile where TMA reads a row-major A by residue of its rows (TmaMaps::a_by_residue): box j (lines 32 j ..
// 32 j + 31) holds rows j, j + 4, ... of the tile (tile_row_of_line), 36 floats each from the 16-byte aligned k0 of
// the stage, unswizzled, in which the stage's 32 k start at column shift[j] < 4 of the box (encode_fp32_residue_maps).
// A line's offsets are those of offset plus its box's shift, which the reader adds (a run-time value, the same for
// a warp's 16 lines); so A's fragments are read a float at a time (2-way bank conflicts, as with lines of 40), and
// the fold reads a line's 9 aligned float4s (lines 9 chunks of 16 bytes apart: 8 lines in 8 bank groups).
struct AResidueStageTile : ResidueLinesTile<kBlockM, kBlockK + 4> {
  __device__ static int offset(int line, int inner) { return line * kLd + inner; }
  static constexpr int shift(int lines8, int inner32) { return lines8 * 8 * kLd + inner32 * 32; }
};

// The stage tile of an operand whose k-lines TMA reads by residue of k (TmaMaps::a_by_residue with A column-major,
// b_by_residue with B row-major): box j (lines 8 j .. 8 j + 7) holds the stage's k0 + j, k0 + j + 4, ... (line_of_k),
// each 136 floats of the operand's m or n from the tile's m0 or n0, the 16-byte aligned start of the box in map j,
// where the tile's m or n start at column shift[j] < 4 (encode_fp32_residue_maps), unswizzled. The products keep the
// stage's k in order: each element is read from its k's line, at its k's shift (so, unlike rows by residue, nothing
// else follows another order). With lines of 136 floats A's fragment reads have 2-way bank conflicts at every shift
// (4-way with 132).
template <int kTileInner>
struct KResidueStageTile {
  static constexpr int kOuter = kBlockK;
  static constexpr int kInner = kTileInner;
  static constexpr int kLd = kTileInner + 8;
  static constexpr int kBoxLines = kBlockK / 4;
  static constexpr int kBoxes = 4;
  static constexpr int kFloats = kOuter * kLd;
  static constexpr int kBoxFloats = kBoxLines * kLd;
  static constexpr unsigned kBoxBytes = sizeof(float) * kBoxFloats;
  static constexpr bool kByResidue = false;
  static constexpr bool kKByResidue = true;
  __device__ static constexpr int line_of_k(int k) { return k % 4 * kBoxLines + k / 4; }
  // Offset in floats of element (k, m or n) of the stage, before its k's shift.
  __device__ static int offset(int k, int inner) { return line_of_k(k) * kLd + inner; }
  // (k + 8 lies two lines further in the same box.)
  static constexpr int shift(int lines8, int inner32) { return lines8 * 2 * kLd + inner32 * 32; }
};
// A column-major A by residue of its k; a row-major B by residue of its k (the x of grad_w = grad.t() @ x, or the W of
// grad_x = grad @ W, with an odd width).
using AKResidueStageTile = KResidueStageTile<kBlockM>;
using BKResidueStageTile = KResidueStageTile<kBlockN>;

// B's stage tile where TMA reads a column-major B by residue of its columns (TmaMaps::b_by_residue): box j (lines
// 32 j .. 32 j + 31) holds the tile's columns j, j + 4, ... (line_of_column), 40 floats each from the 16-byte aligned
// k0 of the stage, unswizzled, in which the stage's 32 k start at column shift[j] < 4 of the box
// (encode_fp32_residue_maps). As for column-major A by residue of its k, only B's readers follow: the split, the fold
// of B's lines and the FMA tiles read each column at its line and shift, and the hi/lo tiles, the line scales and the
// flush keep the tile's column order. The boxes' bases are 128-byte aligned (TMA), so their banks coincide, and a split
// whose 8 lanes take consecutive columns (two per box) meets bank conflicts: with lines of 40 floats (8 banks apart)
// 2-way where the four shifts differ (an odd column stride), 4-way where they are equal; with 36, 4- and 8-way (H200,
// session 104, x @ W.t() with an odd K, us per call, 36 -> 40: 4096^2 x 4097 1252 -> 1185, 8192^2 x 8191 10070 ->
// 9650, 16384 x 1024 x 1023 357 -> 348; read once, 128 x 8192 x 4097, 123 -> 131). The split takes its columns in an
// order free of them (b_split_group).
struct BResidueStageTile : ResidueLinesTile<kBlockN, kBlockK + 8> {
  // (Columns 8 apart are 2 lines apart in their box.)
  static constexpr int kColumnGroupBytes = sizeof(float) * 2 * kLd;
  __device__ static constexpr int line_of_column(int n) { return n % 4 * kBoxLines + n / 4; }
  // Offset in floats of element (n, k) of the stage, before its column's shift.
  __device__ static int offset(int n, int k) { return line_of_column(n) * kLd + k; }
  // (Column n + 8 lies two lines further in the same box.)
  static constexpr int shift(int lines8, int inner32) { return lines8 * 2 * kLd + inner32 * 32; }
};

// B's hi and lo tiles as wgmma reads them, no swizzle: 8x8 core matrices of 128 bytes; core matrices
// adjacent in n are kSbo apart, adjacent in k kLbo apart. Inside a core matrix, in B's orientation in global
// memory, so that the split reads and writes runs of the same direction: K-major (B column-major: 8 columns
// n of 8 consecutive k) or MN-major (B row-major: 8 rows k of 8 consecutive n; wgmma transposes it).
constexpr int kCoreBytes = 128;
constexpr int kSbo = kCoreBytes;
constexpr int kLbo = kBlockN / 8 * kCoreBytes;
constexpr int kSplitTileBytes = kBlockK / 8 * kLbo;
constexpr int kSplitBuffers = 3;  // B's hi/lo tiles: written one stage ahead, read until a stage later

// The tf32 method's hi/lo tiles of B: 4-byte elements, so a core matrix (still 8 rows of 16 bytes, kLbo and
// kSbo as above) holds 4 k, always K-major (wgmma transposes no tf32 operand). Two buffers, not three: six
// would not fit beside four fp32 stages, so each stage's products are complete before the next stage's
// barrier (see the tf32 stage loop).
constexpr int kTf32SplitTileBytes = kBlockK / 4 * kLbo;
constexpr int kTf32SplitBuffers = 2;
template <Method kM>
constexpr int split_tile_bytes() { return kM == Method::tf32 ? kTf32SplitTileBytes : kSplitTileBytes; }
template <Method kM>
constexpr int split_buffers() { return kM == Method::tf32 ? kTf32SplitBuffers : kSplitBuffers; }
// v times its line's scale split into tf32 hi and residual (split_tf32_scaled), as the 32-bit patterns wgmma
// reads.
__device__ __forceinline__ void split_tf32_bits(float v, float scale, std::uint32_t& hi, std::uint32_t& lo) {
  const wmmae::Tf32Split x = split_tf32_scaled(v, scale);
  hi = __float_as_uint(x.hi);
  lo = __float_as_uint(x.lo);
}
// Byte offset of element (n, k) in a tf32 hi/lo tile.
__device__ __forceinline__ int tf32_split_offset(int n, int k) {
  return k / 4 * kLbo + n / 8 * kSbo + n % 8 * 16 + k % 4 * 4;
}

template <bool kMnMajor>
__device__ __forceinline__ int split_offset(int n, int k) {
  const int in_core = kMnMajor ? k % 8 * 16 + n % 8 * 2 : n % 8 * 16 + k % 8 * 2;
  return k / 8 * kLbo + n / 8 * kSbo + in_core;
}

// The descriptor of a hi/lo tile: leading (k) and stride (n) byte offsets kLbo and kSbo.
__device__ __forceinline__ std::uint64_t smem_descriptor(const void* p) {
  return matrix_descriptor<kLbo, kSbo>(static_cast<std::uint32_t>(__cvta_generic_to_shared(p)));
}

// Where a block writes its output tile, kept in shared memory during the stage loop: in registers, these
// values (or, before, the addresses of all 64 elements of a thread) take registers the loop needs.
struct OutputTile {
  float* origin;    // element (m0, n0) of this batch entry's output
  int rows, cols;   // of the tile inside the output: up to kBlockM, kBlockN
  bool direct;      // the flush's fast path applies (see flush)
  bool quads;       // direct with 16-byte aligned rows (a width of 0 mod 4): the fast path writes float4s
};

// The odd-width instantiations' flush stages its rows (not 8-byte aligned: see flush) through shared memory: each
// warp's 16 x 32 columns at a time, 2 KB per warp, in a B hi/lo buffer that no product reads during the flush (see
// the flush's call).
constexpr int kStagedRows = 16, kStagedCols = 32;
template <Method kM>
constexpr bool staging_fits() {
  return kThreads / 32 * kStagedRows * kStagedCols * sizeof(float) <= 2 * split_tile_bytes<kM>();
}

// What the cp.async stages (not kTma) need of the current piece to copy its stages, kept in shared memory for
// the same reason: in registers, the piece's operand pointers, origin and k range stayed live across the stage
// loop and ptxas spilled them (and others) into local memory inside it.
struct CopyPiece {
  const float* a;  // this batch entry's A and B
  const float* b;
  std::int64_t m0, n0, k_begin, k_end;
  bool a_vec4, b_vec4;  // 16-byte copies possible (vec4_operand)
};

// TMA: the next piece's box of one warp, whose lane 0 issues that piece's first stages in the current one's
// last (see issue_ahead): the box's line and batch coordinates, the piece's first k, and how many stages to
// issue (0: none). In shared memory, written and read by the same thread: in registers they made every TMA
// instantiation spill.
struct alignas(16) NextBox {
  int line, z, k_begin, stages;
};

template <bool kARowMajor, bool kBRowMajor, bool kTma, Method kM = Method::fp16, bool kAResidues = false,
          bool kBResidues = false>
struct Config {
  static_assert(!kAResidues || kTma, "A by residue: TMA stages");
  static_assert(!kBResidues || kTma, "B by residue: TMA stages");
  using A = std::conditional_t<kAResidues, std::conditional_t<kARowMajor, AResidueStageTile, AKResidueStageTile>,
                               StageTile<kARowMajor, kBlockM, kBlockK, kTma>>;
  using B = std::conditional_t<kBResidues, std::conditional_t<kBRowMajor, BKResidueStageTile, BResidueStageTile>,
                               StageTile<kBRowMajor, kBlockK, kBlockN, kTma>>;
  // fp32 stages, then the triple-buffered hi/lo tiles of B, then the line scales, the output tile and the
  // block's current piece of work, then (TMA) one mbarrier per stage slot. TMA's 128-byte swizzle wants
  // 1024-byte aligned boxes: the kernel aligns the base.
  static constexpr std::size_t kStageBytes = sizeof(float) * kStages * (A::kFloats + B::kFloats);
  static constexpr std::size_t kOutputTileOffset =
      kStageBytes + split_buffers<kM>() * 2 * split_tile_bytes<kM>() + LineScales::kBytes;
  static constexpr std::size_t kCopyPieceOffset = (kOutputTileOffset + sizeof(OutputTile) + 7) / 8 * 8;
  static constexpr std::size_t kWorkOffset = kCopyPieceOffset + (kTma ? 0 : sizeof(CopyPiece));
  static constexpr std::size_t kNextBoxOffset = (kWorkOffset + 2 * sizeof(TileWork) + 15) / 16 * 16;  // 2: BlockWork
  static constexpr std::size_t kBarrierOffset = kNextBoxOffset + (kTma ? kThreads / 32 * sizeof(NextBox) : 0);
  static constexpr std::size_t kSmemBytes = kBarrierOffset + (kTma ? kStages * sizeof(std::uint64_t) + 1024 : 0);
  static_assert(kStageBytes % 1024 == 0 || !kTma, "TMA boxes stay 1024-byte aligned");
  static_assert(kBarrierOffset % alignof(std::uint64_t) == 0, "mbarriers are 8-byte aligned");
  static_assert(kStageBytes % 128 == 0, "the hi/lo tiles start 128-byte aligned");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget of one block");
};

// The TMA maps of A and B as (inner, outer, batch) in their orientation in global memory (A: (k, m) when
// row-major, (m, k) when column-major; B: (n, k) / (k, n)), encoded on the host (encode_fp32_operand_map);
// an operand without its own batch index (no batch, or broadcast) is read at batch coordinate 0.
// a_by_residue: TMA cannot read A's lines as one map (a line stride or start that is not a multiple of 16 bytes: an
// odd K or M, a storage offset), so the corrected_gemm_sm90*_kernel_a_by_residue instantiations read them by residue
// (rows where A is row-major, columns where column-major), with ResidueMaps instead of `a`. b_by_residue: the same
// for B's lines (columns where B is column-major, rows where row-major: the corrected_gemm_sm90*_kernel_b_by_residue
// instantiations, with A by residue or not), with ResidueMaps instead of `b`.
struct TmaMaps {
  CUtensorMap a, b;
  bool a_batched, b_batched, a_by_residue, b_by_residue;
};

// An operand read by residue of its lines (TmaMaps::a_by_residue, b_by_residue): map j holds lines j, j + 4, j + 8, ...
// (4 lines apart: a stride of a multiple of 16 bytes) from a 16-byte aligned start shift[j] floats before line j's
// first element. A row-major, element (row, k) is at (k + shift[row % 4], row / 4), and each stage loads its 128 rows
// as four boxes of AResidueStageTile, one per residue; A column-major, element (row, k) is at (row + shift[k % 4],
// k / 4), and each stage loads its 32 k as four boxes of AKResidueStageTile; B column-major, element (k, n) is at
// (k + shift[n % 4], n / 4), four boxes of BResidueStageTile; B row-major, element (k, n) is at (n + shift[k % 4],
// k / 4), four boxes of BKResidueStageTile. A kernel parameter of those instantiations only (the
// others' registers turned on the size of TmaMaps).
struct ResidueMaps {
  CUtensorMap maps[kLineResidues];
  int shift[kLineResidues];
};

// Where A is read by residue, the stage's line s (A's fragments and the accumulators' row s) holds the tile's row
// 4 (s % 32) + s / 32: box j (rows j, j + 4, ...) lands as lines 32 j .. 32 j + 31. So rows r and r + 8 of a thread
// are output rows 32 apart, and a warp's 16 rows (from a multiple of 16) are output rows 4 apart, all of one box.
template <bool kAResidues>
__device__ __forceinline__ int tile_row_of_line(int s) {
  constexpr int kLines = AResidueStageTile::kBoxLines;
  return kAResidues ? 4 * (s % kLines) + s / kLines : s;
}

// Registers per thread of the kernel that runs beside the resident pre-pass (kBesidePrepass): few enough that
// each scheduler's quarter of the register file has room for the pre-pass's warp (resident_prepass_sm90.cuh).
// Only that instantiation: the cap costs time (H200: 4096^3 and 8192^3 calls about 2% slower at 248, the
// 64 x 512^3 GEMM 6% at 240).
constexpr int kBesidePrepassGemmRegisters = 240;

// Blocks that fill the GPU at once with equal work reach the same phases at the same moment: their first
// stages' loads, each tile's flush (64 KB of stores, or of atomics at the end of a stream-K share), where they
// wait for each other's memory traffic. Block b of the first `stagger_blocks` therefore starts (b % 16) x
// about 0.2 us late, up to about 3 us. Same-run A/B, per call (session 41): 1152^3 H100 49.3-49.5 -> 47.7-48.1
// us, H200 46.2 -> 44.5-44.8; 128 x 4288 x 4096 (stream-K) H100 81.0-81.8 -> 79.6-80.1, H200 71.8-72.0 ->
// 70.7-71.1; 2048^3 and larger, and the sweep from N = 8448, within 0.3%. The host decides which launches
// (launch_sm90).
constexpr int kStartStaggerPhases = 16;
constexpr long long kStartStaggerCycles = 360;
__device__ __forceinline__ void stagger_start(int stagger_blocks) {
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (block >= static_cast<unsigned>(stagger_blocks)) return;
  const long long wait = static_cast<long long>(block % kStartStaggerPhases) * kStartStaggerCycles;
  const long long start = clock64();
  while (clock64() - start < wait) {
  }
}

// For GemmArgs::tile_line_ranges: line `line` of one operand's stage tile (A's or B's StageTile), folded from
// shared memory into four independent folds (MagnitudeKeys or MagnitudeBits: four dependency chains, not one) as
// the pre-pass folds it from global memory: the same bits (TMA's zeros past K and past the matrix count for
// nothing). kKInner: the line runs along the tile's inner dimension (A row-major, B column-major); a thread reads
// its line's 16-byte chunks, which the 128-byte swizzle spreads over all banks across the 8 lines of a period.
// Otherwise the line is one element of each k row, and a warp's 32 lines share a 128-byte row. A by residue
// (AResidueStageTile): the line's box columns [inner_shift, inner_shift + 32) are its k, of the 36 read as float4s
// (inner_shift is the same in a warp's 32 lines: no divergence); B by residue (BResidueStageTile) the same of 40, with
// the four shifts of its columns in a warp. Column-major A by residue of its k
// (AKResidueStageTile): element k of the line at k's line and shift, k_shifts[k % 4] (ResidueMaps::shift).
template <class Tile, bool kKInner, class Fold>
__device__ __forceinline__ void fold_stage_line(Fold (&folds)[4], const float* tile, int line, int inner_shift = 0,
                                                const int* k_shifts = nullptr) {
  if constexpr (Tile::kKByResidue) {
    static_assert(!kKInner, "k-lines by residue: the line is one element of each k");
    float v[kBlockK];
#pragma unroll
    for (int c = 0; c < kBlockK; ++c) v[c] = tile[Tile::offset(c, line) + k_shifts[c % 4]];
#pragma unroll
    for (int c = 0; c < kBlockK; ++c) folds[c % 4].include(v[c]);
  } else if constexpr (Tile::kByResidue) {
    constexpr int kChunks = Tile::kLd / 4;
    float4 v[kChunks];
#pragma unroll
    for (int q = 0; q < kChunks; ++q) v[q] = *reinterpret_cast<const float4*>(tile + Tile::offset(line, 4 * q));
#pragma unroll
    for (int q = 0; q < kChunks; ++q) {
      const float e[4] = {v[q].x, v[q].y, v[q].z, v[q].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        // (Inside the k for every column of the chunks from the second to that of column 31; a line of 40 floats has
        // two chunks after it.)
        const int column = 4 * q + j;
        if ((q > 0 || column >= inner_shift) && (4 * q + 3 < kBlockK || column < inner_shift + kBlockK)) {
          folds[j].include(e[j]);
        }
      }
    }
  } else if constexpr (kKInner) {
    float4 v[kBlockK / 4];
#pragma unroll
    for (int q = 0; q < kBlockK / 4; ++q) v[q] = *reinterpret_cast<const float4*>(tile + Tile::offset(line, 4 * q));
#pragma unroll
    for (int q = 0; q < kBlockK / 4; ++q) {
      folds[0].include(v[q].x);
      folds[1].include(v[q].y);
      folds[2].include(v[q].z);
      folds[3].include(v[q].w);
    }
  } else {
    float v[kBlockK];
#pragma unroll
    for (int c = 0; c < kBlockK; ++c) v[c] = tile[Tile::offset(c, line)];
#pragma unroll
    for (int c = 0; c < kBlockK; ++c) folds[c % 4].include(v[c]);
  }
}

// The exponent range of that line over the k_tiles stages of the ring from slot first_slot on (slot 0's tile at
// `stages`), from the four folds of its keys (fold_stage_line over the same stages): where they saw an Inf or
// NaN, the stages are folded again exactly (see MagnitudeKeys).
template <class Tile, bool kKInner>
__device__ inline ExponentRange tile_line_range(const MagnitudeKeys (&keys)[4], const float* stages, int first_slot,
                                                int k_tiles, int line, int inner_shift = 0,
                                                const int* k_shifts = nullptr) {
  MagnitudeKeys all = keys[0];
#pragma unroll
  for (int j = 1; j < 4; ++j) all.include(keys[j]);
  MagnitudeBits bits = all.bits();
  if (!all.exact()) {
    MagnitudeBits exact[4] = {MagnitudeBits::none(), MagnitudeBits::none(), MagnitudeBits::none(),
                              MagnitudeBits::none()};
    for (int kt = 0; kt < k_tiles; ++kt) {
      fold_stage_line<Tile, kKInner>(exact, stages + ((first_slot + kt) & (kStages - 1)) * Tile::kFloats, line,
                                     inner_shift, k_shifts);
    }
    bits = exact[0];
#pragma unroll
    for (int j = 1; j < 4; ++j) bits.include(exact[j]);
  }
  return bits.exponent_range();
}

// For GemmArgs::tile_line_ranges, auto's tiles that are not fp16-safe (a line spanning more than fp16 keeps, an Inf
// or a NaN): computed by the fp16 GEMM itself from the fp32 stages that hold the tile's whole K (k_count <= kStages
// kBlockK, every stage landed), with one float32 fused multiply-add per product in k order, as the small GEMM and
// the float32 fallback compute such outputs: float32's accuracy over its whole range, Inf and NaN as float32 gives
// them, and no tf32 GEMM or fallback check after this kernel. Thread t sums rows 4 (t / 16) + 64 h + [0, 4) in pass
// h < 2 at columns 4 (t % 16) + [0, 4) and 64 + 4 (t % 16) + [0, 4), and writes those inside the output (rows x cols
// from origin, row stride n). It reads four k at a time as float4s (a 16-byte chunk of the swizzle holds four
// consecutive inner elements): four k of a line where k is inner, four lines of a k otherwise. Past K the stages
// hold TMA's zeros, whose products leave a sum from +0 unchanged, so k runs on to a multiple of four. Not inlined:
// inlined, its registers moved spills into the stage loop of the instantiation with both operands column-major, and
// changed the other stage loops' registers (ptxas, CUDA 13.0); as a call the stage loops are main's but for one
// or two equivalent instructions. A by residue (AResidueStageTile): one more argument, ResidueMaps::shift (a
// parameter pack, so that the others' calls stay as they were); tile row r is line 32 (r % 4) + r / 4, its k from
// column shift[r % 4], read one float at a time. Column-major A by residue of its k (AKResidueStageTile): the same
// argument; k c + q at its line and shift[q] (c is a multiple of 4), four rows read one float at a time. Column-major
// B by residue of its columns (BResidueStageTile): its shifts after A's, if any; column col_of(4 h + q) (of residue q)
// at its line and shift[q], four k read one float at a time; row-major B by residue of its k (BKResidueStageTile): its
// shifts after A's, if any; k c + q at its line and shift[q], four columns read one float at a time.
template <class A, class B, bool kARowMajor, bool kBRowMajor, class... ResidueShifts>
__device__ __noinline__ void fma_tile_from_stages(const float* stage_a, const float* stage_b, int first_slot,
                                                     int k_count, float* origin, std::int64_t n, int rows, int cols,
                                                     const ResidueShifts*... residue_shifts) {
  constexpr bool kAResidues = A::kByResidue || A::kKByResidue, kBResidues = B::kByResidue || B::kKByResidue;
  static_assert(sizeof...(ResidueShifts) == int{kAResidues} + int{kBResidues},
                "the shifts of the operands read by residue: A's, then B's");
  constexpr int kRows = 4, kCols = 8, kColGroups = kBlockN / 2 / 4;  // (16 threads across a row of the tile)
  static_assert(kThreads * kRows * kCols * 2 == kBlockM * kBlockN, "one tile in two passes");
  const int c0 = threadIdx.x % kColGroups * 4;
  auto col_of = [&](int j) { return c0 + j % 4 + j / 4 * (kBlockN / 2); };
  auto f4 = [](const float* p) { return *reinterpret_cast<const float4*>(p); };
  auto at = [](const float4& v, int e) { return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w; };
  for (int r0 = threadIdx.x / kColGroups * kRows; r0 < kBlockM; r0 += kBlockM / 2) {
    float part[kRows][kCols];
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
#pragma unroll
      for (int j = 0; j < kCols; ++j) part[i][j] = 0.0f;
    }
    for (int s = 0; s * kBlockK < k_count; ++s) {
      const float* sa = stage_a + ((first_slot + s) & (kStages - 1)) * A::kFloats;
      const float* sb = stage_b + ((first_slot + s) & (kStages - 1)) * B::kFloats;
      const int c_end = min(kBlockK, k_count - s * kBlockK);
      for (int c = 0; c < c_end; c += 4) {
        float av[kRows][4], bv[4][kCols];  // [row][k], [k][column]
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          if constexpr (A::kByResidue) {  // q: a row (r0 % 4 = 0: row r0 + q of residue q), four k
            const int* const shift[] = {residue_shifts...};
            const float* line = sa + A::offset(A::kBoxLines * q + r0 / 4, shift[0][q] + c);
#pragma unroll
            for (int e = 0; e < 4; ++e) av[q][e] = line[e];
          } else if constexpr (A::kKByResidue) {  // q: a k (c % 4 = 0: of residue q), four rows
            const int* const shift[] = {residue_shifts...};
            const float* rows = sa + A::offset(c + q, r0) + shift[0][q];
#pragma unroll
            for (int e = 0; e < 4; ++e) av[e][q] = rows[e];
          } else if constexpr (kARowMajor) {  // q: a row, four k
            const float4 v = f4(sa + A::offset(r0 + q, c));
#pragma unroll
            for (int e = 0; e < 4; ++e) av[q][e] = at(v, e);
          } else {  // q: a k, four rows
            const float4 v = f4(sa + A::offset(c + q, r0));
#pragma unroll
            for (int e = 0; e < 4; ++e) av[e][q] = at(v, e);
          }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            if constexpr (B::kKByResidue) {  // q: a k (c % 4 = 0: of residue q), four columns
              const int* const shift[] = {residue_shifts...};
              const float* columns = sb + B::offset(c + q, col_of(4 * h)) + shift[sizeof...(ResidueShifts) - 1][q];
#pragma unroll
              for (int e = 0; e < 4; ++e) bv[q][4 * h + e] = columns[e];
            } else if constexpr (kBRowMajor) {  // q: a k, four columns
              const float4 v = f4(sb + B::offset(c + q, col_of(4 * h)));
#pragma unroll
              for (int e = 0; e < 4; ++e) bv[q][4 * h + e] = at(v, e);
            } else if constexpr (kBResidues) {  // q: a column (c0 % 4 = 0: of residue q), four k
              const int* const shift[] = {residue_shifts...};
              const float* column = sb + B::offset(col_of(4 * h + q), c) + shift[sizeof...(ResidueShifts) - 1][q];
#pragma unroll
              for (int e = 0; e < 4; ++e) bv[e][4 * h + q] = column[e];
            } else {  // q: a column, four k
              const float4 v = f4(sb + B::offset(col_of(4 * h + q), c));
#pragma unroll
              for (int e = 0; e < 4; ++e) bv[e][4 * h + q] = at(v, e);
            }
          }
        }
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
          for (int i = 0; i < kRows; ++i) {
#pragma unroll
            for (int j = 0; j < kCols; ++j) part[i][j] = __fmaf_rn(av[i][kk], bv[kk][j], part[i][j]);
          }
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        if (r0 + i < rows && col_of(j) < cols) origin[(r0 + i) * n + col_of(j)] = part[i][j];
      }
    }
  }
}

// The GEMM's wait for the line ranges of batch entry z from the resident pre-pass: every item of the entry
// has released its count (see resident_prepass_kernel).
__device__ __forceinline__ void wait_for_resident_prepass(const int* items_done, std::int64_t z, int items) {
  for (;;) {
    int done;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(done) : "l"(items_done + z) : "memory");
    if (done >= items) return;
    __nanosleep(100);
  }
}

// kTma: the fp32 stages come by TMA (lane 0 of a warp per box issues them, an mbarrier per stage slot says
// when they have landed) instead of cp.async by every thread; see StageTile for their layout. kReadBack: the
// chunk flush reads the earlier chunks' partial sums back in one batch (see sm90_read_back for where).
// kBesidePrepass: the blocks share their SMs with the resident pre-pass and wait for their batch entry's line
// ranges (GemmArgs::prepass_items_done) instead of the whole pre-pass grid. kM: the fp16 method, or the tf32
// method (corrected_gemm_sm90_tf32_kernel: tf32 hi and residual, k-steps of 8; the method's
// tiles of "auto" too, after the fp16 GEMM). kOddWidth: for outputs of an odd width, whose rows are not 8-byte
// aligned: the flush's fast path stages them through shared memory, for every kind of chunk (a separate
// instantiation, so that the others' code stays as it was: with the staging in every instantiation, aligned shapes
// were 1-4% slower, H200). kAResidues: A read by TMA by residue of its lines (TmaMaps::a_by_residue): row-major, its
// stage lines in the order of tile_row_of_line, which the line scales and the flush follow (AResidueStageTile); or
// column-major, by residue of its k, which only A's readers follow (AKResidueStageTile). kBResidues: B read by TMA by
// residue of its lines (TmaMaps::b_by_residue), which only B's readers follow: column-major by residue of its columns
// (BResidueStageTile), row-major by residue of its k (BKResidueStageTile).
template <Method kM, bool kARowMajor, bool kBRowMajor, bool kTma, bool kReadBack, bool kBesidePrepass, bool kOddWidth,
          bool kAResidues = false, bool kBResidues = false>
__device__ __forceinline__ void corrected_gemm_sm90(const GemmArgs& args, const TmaMaps& maps,
                                                    const ResidueMaps* a_residues = nullptr,
                                                    const ResidueMaps* b_residues = nullptr) {
  static_assert(!kBesidePrepass || (kTma && !kReadBack), "the resident pre-pass runs beside TMA stages only");
  static_assert(kM == Method::fp16 || !(kReadBack || kBesidePrepass), "tf32: the plain instantiations only");
  static_assert(!kOddWidth || (kM == Method::fp16 && kTma && !kBesidePrepass && staging_fits<kM>()),
                "odd widths: the fp16 instantiations with TMA stages (plain or reading back) only");
  static_assert(!kAResidues || (kTma && !kBesidePrepass), "A by residue: TMA stages, not beside the pre-pass");
  static_assert(!kBResidues || (kTma && !kBesidePrepass), "B by residue: TMA stages, not beside the pre-pass");
#ifdef WMMAE_SM90A_DEVICE
  constexpr bool kTf32 = kM == Method::tf32;
  constexpr bool kARowResidues = kAResidues && kARowMajor, kAKResidues = kAResidues && !kARowMajor;
  constexpr bool kBColResidues = kBResidues && !kBRowMajor, kBKResidues = kBResidues && kBRowMajor;
  // auto's tf32 GEMM after the fp16 one, the next call's first kernel after either; or as each block starts its last
  // piece (GemmArgs::dependents_at_last_piece, below)
  if (!args.dependents_at_last_piece) allow_dependent_grid();
  // (Not compiled beside the resident pre-pass, whose launches are never staggered: there it put a
  // local-memory access into the stage loop of the instantiation with B column-major.)
  if constexpr (!kTf32 && !kBesidePrepass) stagger_start(args.start_stagger_blocks);
  if constexpr (kTf32) {
    if (args.method == Method::automatic) {  // auto's tiles that are not fp16-safe: launched after the fp16 GEMM
      wait_for_prior_grid();                 // (which let it start early) for its tf32_tiles_pending
      if (*args.tf32_tiles_pending == 0) return;
    }
  }
  // Row-major B in TMA stages is split into MN-major hi/lo tiles (H200, 4096^3: +3.7%); from cp.async
  // stages the K-major split measured faster (MN-major 4-8% slower). tf32 tiles are K-major.
  constexpr bool kBMnMajor = kBRowMajor && kTma && !kTf32;
  using Cfg = Config<kARowMajor, kBRowMajor, kTma, kM, kAResidues, kBResidues>;
  using A = typename Cfg::A;
  using B = typename Cfg::B;
  // A TMA stage is A's boxes, then B's (see StageTile), at most eight: box j is issued by lane 0 of warp j,
  // right after the warp's first products of the stage, while it waits for them. (Thread 0 issued them all
  // right after the stage's barrier: about 75 instructions for five boxes, which delayed warpgroup 0's
  // products; the other three warps of the warpgroup wait for them, and the other warpgroup at the next
  // barrier. H200, session 19: 5-8% less GEMM time at most shapes, 15% with A column-major, the same with B
  // column-major (one box of B).)
  constexpr int kTmaBoxes = A::kBoxes + B::kBoxes;
  static_assert(kTmaBoxes <= kThreads / 32, "a warp per TMA box");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = smem_raw;
  if constexpr (kTma) smem += (1024 - smem_address(smem_raw) % 1024) % 1024;
  float* stage_a = reinterpret_cast<float*>(smem);
  float* stage_b = stage_a + kStages * A::kFloats;
  // The ring of stages runs on from one piece of work to the next: ring_start counts the stages this block
  // has put through it before the current piece (modulo 2^32, a multiple of the ring's length). The ring
  // slot of the piece's k-stage kt, and its fp32 tiles:
  std::uint32_t ring_start = 0;
  auto slot_of = [&](int kt) { return static_cast<int>((ring_start + kt) & (kStages - 1)); };
  auto stage_a_of = [&](int kt) { return stage_a + slot_of(kt) * A::kFloats; };
  auto stage_b_of = [&](int kt) { return stage_b + slot_of(kt) * B::kFloats; };
  std::uint64_t* stage_full = reinterpret_cast<std::uint64_t*>(smem + Cfg::kBarrierOffset);  // TMA only
  OutputTile* out_tile = reinterpret_cast<OutputTile*>(smem + Cfg::kOutputTileOffset);
  NextBox* next_box = reinterpret_cast<NextBox*>(smem + Cfg::kNextBoxOffset);  // TMA only
  CopyPiece* copy_piece = reinterpret_cast<CopyPiece*>(smem + Cfg::kCopyPieceOffset);  // cp.async stages only
  if constexpr (kTma) {
    if (threadIdx.x == 0) {
      for (int s = 0; s < kStages; ++s) mbarrier_init(stage_full + s, kTmaBoxes);
      fence_mbarrier_init();
    }
    __syncthreads();
  }
  unsigned char* split_base = smem + Cfg::kStageBytes;  // [buffer][hi, lo]
  constexpr int kSplitBytes = split_tile_bytes<kM>(), kBuffers = split_buffers<kM>();
  auto split_tile = [&](int buf, int part) { return split_base + (buf * 2 + part) * kSplitBytes; };
  const LineScales scales(split_base + 2 * kBuffers * kSplitBytes);
  // The descriptor of hi/lo tile (0, hi); the others are kSplitBytes apart, and a descriptor's address
  // field (16-byte units, 14 bits: all of shared memory) is linear in the address, so theirs are this plus
  // their offset / 16.
  const std::uint64_t split_desc0 = smem_descriptor(split_tile(0, 0));

  const std::int64_t m = args.m, n = args.n, k = args.k;
  // The warp index, broadcast so that the compiler knows it is the same in every lane (it then keeps what
  // is derived from it, such as the TMA box parameters, in uniform registers).
  const int warp = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 32), 0);
  const int lane = threadIdx.x % 32;
  // wgmma fragment coordinates: warp w of warpgroup g owns rows 64 g + 16 w + (lane / 4) and 8 below; in
  // A's fragment, columns (k) 2 (lane % 4) + {0, 1} and 8 to the right; in the accumulator, columns
  // 8 i + 2 (lane % 4) + {0, 1} for i < 16.
  const int row0 = warp / 4 * 64 + warp % 4 * 16 + lane / 4;
  const int quad = lane % 4;
  // B split: warp w converts the core matrices of columns 8 w .. 8 w + 7 and 64 + 8 w ..; lane = 8 kp + ln
  // takes column ln of them (b_split_col(h), h < 2) and k 2 kp, 2 kp + 1 of every 8 (b_split_k(kc) in the
  // kc-th 8): each store instruction writes 32 banks (n % 8 and kp differ). By residue of B's columns
  // (BResidueStageTile) that would put a load's lanes in banks 8 lines apart (every box starts in bank 0): 2-way
  // conflicts where the column stride is odd, 4-way where it is even. There warp w converts columns 16 w .. 16 w + 15
  // (two groups of 8, 2 lines apart in a box: 16 banks), lane 8 kp + ln column ln of group b_split_group first and of
  // the other next, chosen from the shifts. Residues j and j ^ 2 have shifts of the same parity: 2 apart (an odd
  // stride, as the W.t() of x @ W.t() with an odd K), the lanes of the larger shift take group 1, but at k 14 of their
  // 16, which lands past the other's: every load reads 32 banks. Equal (an even stride), residue j takes group j / 2:
  // 2-way conflicts, which loading the pair's odd k first for odd j would avoid at about 50 more instructions per stage
  // (checked by enumerating the column stride and offset modulo 4).
  const int split_ln = lane % 8, split_kp = lane / 8;
  int b_split_group = 0;
  if constexpr (kBColResidues) {
    const int residue = split_ln % 4;
    const int own = b_residues->shift[residue], partner = b_residues->shift[residue ^ 2];
    b_split_group = own == partner ? residue / 2 : own > partner && 8 * (split_ln / 4) + 2 * split_kp < 14;
  }
  auto b_split_col = [&](int h) {
    if constexpr (kBColResidues) return 16 * warp + 8 * (h ^ b_split_group) + split_ln;
    return 64 * h + 8 * warp + split_ln;
  };
  auto b_split_k = [&](int kc) { return 8 * kc + 2 * split_kp; };
  // MN-major split: warp w converts columns 16 w .. 16 w + 15; lane = 8 q + r takes the four columns from
  // b_mn_col = 16 w + 4 q in rows k = 8 kc + r (one 16-byte chunk per load: 8 lanes read 8 rows, which the
  // 128-byte swizzle puts in 8 different bank groups; each half warp's 8-byte stores fill one core matrix).
  const int b_mn_col = 16 * warp + 4 * (lane / 8), b_mn_row = lane % 8;
  // Byte offsets of this thread's elements in a stage tile and in a hi/lo tile, up to the constants of
  // StageTile::shift and of whole core matrices: kept in registers, so that each shared-memory access is a
  // register, the stage's or buffer's base and a constant (ptxas recomputed them from the lane index at
  // every stage). A: element (r + 8 j, k + 8 h + 16 s) of its fragment, at a_elem_off[s][h] (row-major) or
  // a_elem_off[j][k - 2 quad] (column-major, k's pairs read one by one). By residue, the thread's lines row0 and
  // row0 + 8 are of box row0 / 32, whose k start at its column a_line_shift (see AResidueStageTile); column-major by
  // residue of k, element k's m start at column a_k_shift(k) of its line (see AKResidueStageTile): k + 8 has the same.
  int a_line_shift = 0;
  if constexpr (kARowResidues) a_line_shift = a_residues->shift[row0 / AResidueStageTile::kBoxLines];
  auto a_k_shift = [&](int k) {
    if constexpr (kAKResidues) return a_residues->shift[k % 4];
    return 0;
  };
  int a_elem_off[2][2];
#pragma unroll
  for (int p = 0; p < 2; ++p) {
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      a_elem_off[p][q] = sizeof(float) * (kARowMajor ? A::offset(row0, a_line_shift + 2 * quad + 8 * q + 16 * p)
                                                : A::offset(2 * quad + q, row0 + 8 * p) + a_k_shift(2 * quad + q));
    }
  }
  // B: MN-major split, row b_mn_row; K-major, column b_split_col(0) at k b_split_k(0) + d (row-major:
  // b_elem_off[d]) or at k b_split_k(kc) (column-major: b_elem_off[kc], the 128-byte swizzle mixes k's 8s). By
  // residue of its columns, column n's k start at column b_column_shift(n) of its line (see BResidueStageTile): the
  // same for each of a thread's columns (n % 4 is fixed per thread). Row-major by residue of its k, row k's n start at
  // column b_k_shift(k) of its line (see BKResidueStageTile): k + 8 has the same.
  auto b_column_shift = [&](int n) {
    if constexpr (kBColResidues) return b_residues->shift[n % 4];
    return 0;
  };
  auto b_k_shift = [&](int k) {
    if constexpr (kBKResidues) return b_residues->shift[k % 4];
    return 0;
  };
  int b_elem_off[kBlockK / 8];
#pragma unroll
  for (int j = 0; j < kBlockK / 8; ++j) {
    b_elem_off[j] = sizeof(float) * (kBMnMajor    ? B::offset(b_mn_row, b_mn_col) + b_k_shift(b_mn_row)
                                     : kBRowMajor ? B::offset(b_split_k(0) + j % 2, b_split_col(0))
                                                  : B::offset(b_split_col(0), b_split_k(j)) +
                                                        b_column_shift(b_split_col(0)));
  }
  // (By residue of B's columns: bytes from column group b_split_group to the other, in the stage and the hi/lo tiles.)
  constexpr int kGroupBytes = BResidueStageTile::kColumnGroupBytes;
  const int b_split_group_step = b_split_group ? -kGroupBytes : kGroupBytes;
  const int b_split_group_store_step = b_split_group ? -kSbo : kSbo;
  const int split_off = kBMnMajor ? split_offset<true>(b_mn_col, b_mn_row)
                                  : split_offset<false>(b_split_col(0), b_split_k(0));
  // The same for tf32 (the arrays above are then unused, and these in the fp16 kernel). A's fragment of
  // k-step s (8 k): elements (row0 + 8 i, quad + 4 h + 8 s), at a_tf32_off[2 s + h] (row-major, + 8 rows by
  // StageTile::shift) or a_tf32_off[2 h + i] (column-major, + 8 s lines by StageTile::shift). B's split: warp w
  // converts columns 16 w .. 16 w + 15, lane = 16 kg + c column 16 w + c at the k groups (4 k) kg + 2 j, j < 4,
  // reading them from (k, n) at b_tf32_off[e] + 8 j lines (row-major: rows 4 kg + e; four loads, which the
  // swizzle keeps in 32 banks) or from b_tf32_off[j] (column-major: one 16-byte load; by residue, four), and writing
  // each group as one 16-byte row of a core matrix at tf32_split_off + j * 2 kLbo.
  const int tf32_n = 16 * warp + lane % 16, tf32_kg = lane / 16;
  int a_tf32_off[8], b_tf32_off[4];
#pragma unroll
  for (int x = 0; x < 8; ++x) {
    a_tf32_off[x] = sizeof(float) * (kARowMajor ? A::offset(row0, a_line_shift + quad + 4 * (x % 2) + 8 * (x / 2))
                                                : A::offset(quad + 4 * (x / 2 % 2), row0 + 8 * (x % 2)) +
                                                      a_k_shift(quad));
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    b_tf32_off[j] = sizeof(float) * (kBRowMajor ? B::offset(4 * tf32_kg + j, tf32_n) + b_k_shift(j)
                                                : B::offset(tf32_n, 4 * (tf32_kg + 2 * j)) + b_column_shift(tf32_n));
  }
  const int tf32_split_off = tf32_split_offset(tf32_n, 4 * tf32_kg);

  BlockWork work(reinterpret_cast<TileWork*>(smem + Cfg::kWorkOffset));
  // TMA stages: a piece's last stages issue the next piece's first (see issue_ahead). Not where both operands
  // are column-major beside the resident pre-pass: under that instantiation's 240 registers the code put 17
  // local-memory accesses into its stage loop (0 without it).
  constexpr bool kIssueNextPiece = kTma && !(kBesidePrepass && !kARowMajor && !kBRowMajor);
  // k-stages of the previous piece where it ran its stage loop (0 where it did not), which then issued
  // this piece's first stages (see issue_ahead).
  int previous_k_tiles = 0;
  // Whether the call's tiles fold their own line ranges (GemmArgs::tile_line_ranges), which only the fp16 GEMM
  // with TMA stages, without read-back or the resident pre-pass, compiles (see tile_line_ranges_apply).
  constexpr bool kTileRangesCode = kTma && !kTf32 && !kReadBack && !kBesidePrepass;
  auto tiles_fold = [&]() { return kTileRangesCode && args.tile_line_ranges; };
  // There this is the call's only kernel (no workspace to zero before it): the kernel before it on the stream may
  // write A or B, so the block waits for it before its first loads.
  if (tiles_fold()) wait_for_prior_grid();
  for (TileWork piece = work.first(args); BlockWork::valid(piece); piece = work.next(args)) {
    const std::int64_t z = piece.z;
    // (A block without a piece lets them as it exits.)
    if (args.dependents_at_last_piece && !BlockWork::valid(work.upcoming())) allow_dependent_grid();
    ring_start = __shfl_sync(0xffffffffu, ring_start, 0);  // (the same in every lane: see warp)
    std::int64_t m0, n0;
    tile_origin(m, n, args.tile_group_rows, piece.tile, m0, n0);
    const std::int64_t k_begin = piece.stage_begin * kBlockK;
    const std::int64_t k_end = min(k, piece.stage_end * kBlockK);
    if constexpr (!kTma) {
      if (threadIdx.x == 0) {  // read after load_line_scales' barriers
        std::int64_t a_off, b_off;
        batch_offsets(args.batch, z, a_off, b_off);
        const float* a = args.a + a_off;
        const float* b = args.b + b_off;
        *copy_piece = CopyPiece{a, b, m0, n0, k_begin, k_end, vec4_operand(a, kARowMajor ? args.a_rs : args.a_ks),
                                vec4_operand(b, kBRowMajor ? args.b_ks : args.b_cs)};
      }
    }

    // TMA: this warp's box of each stage (see kTmaBoxes), fixed for the piece but for the stage's k and ring
    // slot. Its map's (inner, outer) coordinates: A as (k, m) row-major, (m, k) column-major; B as (n, k) /
    // (k, n). The other coordinate is the tile's m or n, plus 32 per box along it (where k is inner, an
    // operand has one box per stage).
    const bool box_of_a = warp < A::kBoxes;
    const int box = box_of_a ? warp : warp - A::kBoxes;
    // (By residue: A's box j is map j's, at outer coordinate m0 / 4 (AResidueStageTile), or column-major at inner
    // coordinate m0 and outer k0 / 4 (AKResidueStageTile); B's box j is map j's, at outer coordinate n0 / 4
    // (BResidueStageTile), or row-major at inner coordinate n0 and outer k0 / 4 (BKResidueStageTile).)
    const CUtensorMap* box_map = box_of_a ? &maps.a : &maps.b;
    if constexpr (kAResidues) {
      if (box_of_a) box_map = &a_residues->maps[box];
    }
    if constexpr (kBResidues) {
      if (!box_of_a) box_map = &b_residues->maps[box];
    }
    const unsigned box_bytes = box_of_a ? A::kBoxBytes : B::kBoxBytes;
    // (A ring slot's A and B tiles differ in size where A is read by residue.)
    const std::uint32_t box_slot_bytes = sizeof(float) * (box_of_a ? A::kFloats : B::kFloats);
    const bool box_k_inner = box_of_a ? kARowMajor : !kBRowMajor;
    // The box's outer coordinate in the tile at (tile_m0, tile_n0).
    auto box_line_of = [&](std::int64_t tile_m0, std::int64_t tile_n0) {
      if constexpr (kARowResidues) {
        if (box_of_a) return static_cast<int>(tile_m0 / 4);
      } else if constexpr (kAKResidues) {
        if (box_of_a) return static_cast<int>(tile_m0);
      }
      if constexpr (kBColResidues) {
        if (!box_of_a) return static_cast<int>(tile_n0 / 4);
      } else if constexpr (kBKResidues) {
        if (!box_of_a) return static_cast<int>(tile_n0);
      }
      return static_cast<int>(box_of_a ? tile_m0 : tile_n0) + box * 32;
    };
    // (Broadcast: the same in every lane, which the compiler cannot tell for values from shared memory.)
    const int box_line = __shfl_sync(0xffffffffu, box_line_of(m0, n0), 0);
    const bool box_batched = box_of_a ? maps.a_batched : maps.b_batched;
    const int box_z = __shfl_sync(0xffffffffu, box_batched ? static_cast<int>(z) : 0, 0);
    const std::uint32_t box_dst = box_of_a ? smem_address(stage_a + box * A::kBoxFloats)
                                           : smem_address(stage_b + box * B::kBoxFloats);  // in slot 0
    const std::uint32_t k_begin32 = static_cast<std::uint32_t>(k_begin);
    // This warp's box at k0 of `line` (its map's outer coordinate where k is inner) of batch entry batch_z into
    // the ring slot of this piece's stage kt, counted on the slot's barrier (lane 0 of a warp with a box).
    auto issue_box = [&](int kt, int k0, int line, int batch_z) {
      const int slot = slot_of(kt);
      const std::uint32_t full = smem_address(stage_full) + slot * sizeof(std::uint64_t);
      mbarrier_arrive_expect_tx(full, box_bytes);
      if (box_of_a ? kAKResidues : kBKResidues) k0 /= 4;  // (k-lines by residue: map j's line i is k-line 4 i + j)
      tma_load_3d(box_dst + slot * box_slot_bytes, box_map, full, box_k_inner ? k0 : line, box_k_inner ? line : k0,
                  batch_z);
    };
    // Box `warp` of stage kt of this tile (a no-op in lanes other than 0 and in warps without a box).
    auto issue_tma_stage = [&](int kt) {
      if (lane != 0 || warp >= kTmaBoxes) return;
      issue_box(kt, static_cast<int>(k_begin32 + kt * kBlockK), box_line, box_z);
    };
    // Each slot's barrier completes a phase per stage that lands in it: stage ring_start + kt is its slot's
    // use number (ring_start + kt) / kStages, so it waits for that parity.
    auto wait_tma_stage = [&](int kt) {
      mbarrier_wait(stage_full + slot_of(kt), ((ring_start + kt) / kStages) & 1u);
    };
    const int k_tiles = static_cast<int>((k_end - k_begin + kBlockK - 1) / kBlockK);
    // The stages issued at the piece's start: kStages - 1, the others as their slots free up (issue_ahead); where
    // the tile folds its own line ranges, every stage of its K (up to kStages: the slot of the last one held the
    // previous piece's last stage, which every warp was done with at work.next's barrier).
    const int first_stages = tiles_fold() ? k_tiles : min(kStages - 1, k_tiles);
    // Stage kt + kStages - 1 of this piece, issued in stage kt as its ring slot frees up; past the piece's end,
    // the first stages of the block's next piece (stage j into the slot that this piece's stage k_tiles + j
    // would take: the ring runs on), so that they land while this piece's last products and its flush run
    // and the next piece starts with them in place. Pieces shorter than kStages - 1 stages leave the next one
    // to issue its own (its first stages must be issued in order).
    // (Unsigned compares: a stage already issued at the start, ahead < first_stages, is neither this piece's to
    // issue nor the next one's, j < 0; one compare each, as where first_stages was always kStages - 1. A second,
    // signed compare instead made the stage loop of row-major A and B slower: H200, session 93, same run, fp16
    // 4096^3 996 -> 1054 us; this form 1009, and both column-major 1051 -> 993.)
    auto issue_ahead = [&](int kt) {
      const int ahead = kt + kStages - 1;
      if (static_cast<unsigned>(ahead - first_stages) < static_cast<unsigned>(k_tiles - first_stages)) {
        issue_tma_stage(ahead);
        return;
      }
      if (!kIssueNextPiece || lane != 0 || warp >= kTmaBoxes) return;
      const NextBox next = next_box[warp];
      const int j = ahead - k_tiles;
      if (static_cast<unsigned>(j) < static_cast<unsigned>(next.stages)) {
        issue_box(ahead, next.k_begin + j * kBlockK, next.line, next.z);
      }
    };
    if constexpr (kIssueNextPiece) {
      if (lane == 0 && warp < kTmaBoxes) {
        const TileWork next = work.upcoming();
        NextBox box_next{0, 0, 0, 0};
        if (k_tiles >= kStages - 1 && BlockWork::valid(next)) {
          std::int64_t next_m0, next_n0;
          tile_origin(m, n, args.tile_group_rows, next.tile, next_m0, next_n0);
          const std::int64_t next_stages = next.stage_end - next.stage_begin;
          box_next = NextBox{box_line_of(next_m0, next_n0),
                             box_batched ? static_cast<int>(next.z) : 0, static_cast<int>(next.stage_begin * kBlockK),
                             static_cast<int>(min(static_cast<std::int64_t>(kStages - 1), next_stages))};
        }
        next_box[warp] = box_next;
      }
    }
    // The first stages' copies are under way while the line scales load (both wait for global memory); the
    // previous piece may have issued them.
    if constexpr (kTma) {
      const int issued = !kIssueNextPiece || previous_k_tiles < kStages - 1 ? 0 : min(kStages - 1, k_tiles);
      for (int s = issued; s < first_stages; ++s) issue_tma_stage(s);
    }
    // The pre-pass's line ranges (and zeroed output), or without a pre-pass the zeroed workspace; A and B were
    // complete before either. (Where the tiles fold their line ranges, a no-op: waited for above.)
    if constexpr (kBesidePrepass) {
      wait_for_resident_prepass(args.prepass_items_done, z, args.prepass_items_per_batch);
    } else {
      wait_for_prior_grid();
    }
    // Where K is short (GemmArgs::tile_line_ranges), the line ranges come from the tile's own stages: all of them
    // were issued above (K fits in kStages), and each thread folds its line from each stage as it lands.
    auto fold_line_scales = [&]() {
      const int r = threadIdx.x;  // (A's rows in warps 0-3, B's columns in warps 4-7: no divergence)
      MagnitudeKeys keys[4] = {MagnitudeKeys::none(), MagnitudeKeys::none(), MagnitudeKeys::none(),
                               MagnitudeKeys::none()};
      int r_shift = 0;  // (by residue: line r's first k in its box, see AResidueStageTile)
      if constexpr (kARowResidues) r_shift = r < kBlockM ? a_residues->shift[r / AResidueStageTile::kBoxLines] : 0;
      // (k-lines by residue: each k's shift, see KResidueStageTile; A's in warps 0-3, B's in warps 4-7; an operand
      // whose k-lines are not by residue does not read them)
      const int* k_shifts = nullptr;
      if constexpr (kAKResidues && kBKResidues) {
        k_shifts = r < kBlockM ? a_residues->shift : b_residues->shift;
      } else if constexpr (kAKResidues) {
        k_shifts = a_residues->shift;
      } else if constexpr (kBKResidues) {
        k_shifts = b_residues->shift;
      }
      // (B by residue of columns: column r - kBlockM's first k in its line, see BResidueStageTile)
      int column_shift = 0;
      if constexpr (kBColResidues) column_shift = r < kBlockM ? 0 : b_column_shift(r - kBlockM);
      for (int s = 0; s < k_tiles; ++s) {
        wait_tma_stage(s);
        if (r < kBlockM) {
          fold_stage_line<A, kARowMajor>(keys, stage_a_of(s), r, r_shift, k_shifts);
        } else {
          fold_stage_line<B, !kBRowMajor>(keys, stage_b_of(s), r - kBlockM, column_shift, k_shifts);
        }
      }
      std::int64_t index;  // (unused: the ranges are this tile's own)
      const bool in_matrix =
          tile_line_index(args, z, m0, n0, kARowResidues && r < kBlockM ? tile_row_of_line<kARowResidues>(r) : r,
                          index);
      const ExponentRange range =
          r < kBlockM ? tile_line_range<A, kARowMajor>(keys, stage_a, slot_of(0), k_tiles, r, r_shift, k_shifts)
                      : tile_line_range<B, !kBRowMajor>(keys, stage_b, slot_of(0), k_tiles, r - kBlockM,
                                                        column_shift, k_shifts);
      return line_scales_from<kM>(scales, in_matrix, range);
    };
    auto load_scales = [&]() {
      if constexpr (kARowResidues) {
        const int r = threadIdx.x;  // (thread r's scale slot: line r of the stage)
        return load_line_scales<kM>(args, scales, z, m0, n0, r < kBlockM ? tile_row_of_line<true>(r) : r);
      } else {
        return load_line_scales<kM>(args, scales, z, m0, n0);
      }
    };
    const TileLines lines = tiles_fold() ? fold_line_scales() : load_scales();
    // The tile's output: its first element, and its rows and columns inside the matrix.
    float* const origin = args.c + z * args.c_batch_stride + m0 * n + n0;
    const int rows = static_cast<int>(min(static_cast<std::int64_t>(kBlockM), m - m0));
    const int cols = static_cast<int>(min(static_cast<std::int64_t>(kBlockN), n - n0));
    // auto: the fp16 kernel leaves the tiles that are not fp16-safe to the tf32 kernel, which takes only those; or,
    // where they folded their line ranges, computes them with float32 FMAs from the stages it holds.
    if (args.method == Method::automatic && (kTf32 ? lines.fp16_safe : !lines.fp16_safe)) {
      if constexpr (kTileRangesCode) {  // (compiled only there)
        if (tiles_fold()) {  // (every stage of the tile has landed: fold_line_scales)
          // (With the shifts of the operands read by residue, A's then B's: see fma_tile_from_stages.)
          const auto fma_tile = [&](const auto*... shifts) {
            fma_tile_from_stages<A, B, kARowMajor, kBRowMajor>(stage_a, stage_b, slot_of(0),
                                                               static_cast<int>(k_end - k_begin), origin, n, rows, cols,
                                                               shifts...);
          };
          if constexpr (kAResidues && kBResidues) {
            fma_tile(a_residues->shift, b_residues->shift);
          } else if constexpr (kAResidues) {
            fma_tile(a_residues->shift);
          } else if constexpr (kBResidues) {
            fma_tile(b_residues->shift);
          } else {
            fma_tile();
          }
        }
      }
      if (!kTf32 && !tiles_fold() && threadIdx.x == 0) *args.tf32_tiles_pending = 1;
      if constexpr (kTma) {  // the stages in flight land before their slots are used again
        for (int s = 0; s < first_stages; ++s) wait_tma_stage(s);
      }
      ring_start += first_stages;
      previous_k_tiles = 0;
      continue;
    }
    // A tile beyond the split's limits: float32_fallback_kernel checks its outputs after this kernel.
    if (kTf32 && lines.beyond_split_limit && threadIdx.x == 0) *args.wide_tiles_pending = 1ull;
    if (threadIdx.x == 0) {
      // Fast path: unscaling factors that are normal floats, and 8-byte aligned column pairs (an even output
      // width) or kOddWidth's staging.
      const bool direct =
          lines.small_shifts && (kOddWidth || (n % 2 == 0 && reinterpret_cast<std::uintptr_t>(origin) % 8 == 0));
      *out_tile = OutputTile{origin, rows, cols, direct,
                             !kOddWidth && direct && n % 4 == 0 && reinterpret_cast<std::uintptr_t>(origin) % 16 == 0};
    }  // read after the stage prologue's barrier
    const float a_scale[2] = {scales.a_scale[row0], scales.a_scale[row0 + 8]};
    float b_scale[4];
    if constexpr (kBMnMajor) {
#pragma unroll
      for (int e = 0; e < 4; ++e) b_scale[e] = scales.b_scale[b_mn_col + e];
    } else if constexpr (kTf32) {
      b_scale[0] = scales.b_scale[tf32_n];  // (one column per thread, see b_tf32_off)
    } else {
      b_scale[0] = scales.b_scale[b_split_col(0)];
      b_scale[1] = scales.b_scale[b_split_col(1)];
    }

    auto issue_stage = [&](int kt) {  // (cp.async stages)
      const CopyPiece p = *copy_piece;
      const std::int64_t k0 = p.k_begin + static_cast<std::int64_t>(kt) * kBlockK;
      issue_operand_stage<kARowMajor, kBRowMajor, kBlockK, A::kLd, B::kLd>(
          stage_a_of(kt), stage_b_of(kt), p.a, p.b, args, p.m0, p.n0, k0, p.k_end, p.a_vec4, p.b_vec4);
    };
    // Splits B's fp32 stage kt into hi/lo buffer `buf`.
    auto split_b = [&](int kt, int buf) {
      const unsigned char* src = reinterpret_cast<const unsigned char*>(stage_b_of(kt));
      if constexpr (kTf32) {  // (see b_tf32_off; all loads first, as below)
        unsigned char* hi = split_tile(buf, 0) + tf32_split_off;
        unsigned char* lo = split_tile(buf, 1) + tf32_split_off;
        float4 q[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if constexpr (kBRowMajor) {
            auto at = [&](int e) {
              return *reinterpret_cast<const float*>(src + b_tf32_off[e] + sizeof(float) * B::shift(j, 0));
            };
            q[j] = make_float4(at(0), at(1), at(2), at(3));
          } else if constexpr (kBResidues) {  // (a column's shift leaves its k 4-byte aligned only)
            const float* p = reinterpret_cast<const float*>(src + b_tf32_off[j]);
            q[j] = make_float4(p[0], p[1], p[2], p[3]);
          } else {
            q[j] = *reinterpret_cast<const float4*>(src + b_tf32_off[j]);
          }
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          uint4 h, l;
          split_tf32_bits(q[j].x, b_scale[0], h.x, l.x);
          split_tf32_bits(q[j].y, b_scale[0], h.y, l.y);
          split_tf32_bits(q[j].z, b_scale[0], h.z, l.z);
          split_tf32_bits(q[j].w, b_scale[0], h.w, l.w);
          *reinterpret_cast<uint4*>(hi + j * 2 * kLbo) = h;
          *reinterpret_cast<uint4*>(lo + j * 2 * kLbo) = l;
        }
        fence_proxy_async();  // wgmma reads these tiles after the next barrier
        return;
      }
      unsigned char* hi = split_tile(buf, 0) + split_off;
      unsigned char* lo = split_tile(buf, 1) + split_off;
      auto at = [&](int j, int lines8, int inner32) {
        return src + b_elem_off[j] + sizeof(float) * B::shift(lines8, inner32);
      };
      // All loads first: the compiler cannot tell the stage from the hi/lo tiles, so a load written after
      // a store would wait for it, and each load's latency would be paid one after the other.
      if constexpr (kBMnMajor) {
        constexpr int kRowGroups = kBlockK / 8;
        float4 q[kRowGroups];
#pragma unroll
        for (int kc = 0; kc < kRowGroups; ++kc) {
          if constexpr (kBKResidues) {  // (a k's shift leaves its columns 4-byte aligned only)
            const float* p = reinterpret_cast<const float*>(at(0, kc, 0));
            q[kc] = make_float4(p[0], p[1], p[2], p[3]);
          } else {
            q[kc] = *reinterpret_cast<const float4*>(at(0, kc, 0));
          }
        }
#pragma unroll
        for (int kc = 0; kc < kRowGroups; ++kc) {
          __half2 h01, l01, h23, l23;
          wmmae::split_fp16x2_compensated(q[kc].x * b_scale[0], q[kc].y * b_scale[1], h01, l01);
          wmmae::split_fp16x2_compensated(q[kc].z * b_scale[2], q[kc].w * b_scale[3], h23, l23);
          const int off = kc * kLbo;
          *reinterpret_cast<uint2*>(hi + off) = pack_halves(h01, h23);
          *reinterpret_cast<uint2*>(lo + off) = pack_halves(l01, l23);
        }
        fence_proxy_async();  // wgmma reads these tiles after the next barrier
        return;
      }
      constexpr int kPairs = kBlockK / 8;
      float2 v[2][kPairs];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int kc = 0; kc < kPairs; ++kc) {
          // Column 64 h further: 2 boxes of 32 (row-major) or 8 groups of 8 lines (column-major).
          if constexpr (kBRowMajor) {
            v[h][kc] = make_float2(*reinterpret_cast<const float*>(at(0, kc, 2 * h)),
                                   *reinterpret_cast<const float*>(at(1, kc, 2 * h)));
          } else if constexpr (kBResidues) {  // (see b_split_group; 4-byte aligned only)
            const float* p = reinterpret_cast<const float*>(at(kc, 0, 0) + h * b_split_group_step);
            v[h][kc] = make_float2(p[0], p[1]);
          } else {
            v[h][kc] = *reinterpret_cast<const float2*>(at(kc, 8 * h, 0));
          }
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int kc = 0; kc < kPairs; ++kc) {
          __half2 h2, l2;
          wmmae::split_fp16x2_compensated(v[h][kc].x * b_scale[h], v[h][kc].y * b_scale[h], h2, l2);
          // = split_offset(b_split_col(h), b_split_k(kc)) - split_off
          const int off = kc * kLbo + (kBColResidues ? h * b_split_group_store_step : 8 * h * kSbo);
          *reinterpret_cast<__half2*>(hi + off) = h2;
          *reinterpret_cast<__half2*>(lo + off) = l2;
        }
      }
      fence_proxy_async();  // wgmma reads these tiles after the next barrier
    };
    // A's fragment for k-step s of a stage: loaded (fp32), then split into hi and scaled residual (fp16: 16 k,
    // pairs of k per register; tf32: 8 k, one per register, no residual scale).
    using AFragment = std::conditional_t<kTf32, float[4], float2[4]>;
    auto load_a = [&](const float* stage, int s, AFragment& v) {
      const unsigned char* src = reinterpret_cast<const unsigned char*>(stage);
      if constexpr (kTf32) {  // element i: row0 + 8 (i & 1), k quad + 4 (i >> 1) + 8 s
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int j = i & 1, h = i >> 1;
          v[i] = *reinterpret_cast<const float*>(
              src + (kARowMajor ? a_tf32_off[2 * s + h] + sizeof(float) * A::shift(j, 0)
                                : a_tf32_off[2 * h + j] + sizeof(float) * A::shift(s, 0)));
        }
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int j = i & 1, h = i >> 1;  // rows 8 j below row0, k 8 h further
          if constexpr (A::kByResidue) {  // (an odd a_line_shift leaves the pair 4-byte aligned only)
            const unsigned char* p = src + a_elem_off[s][h] + sizeof(float) * A::shift(j, 0);
            v[i] = make_float2(*reinterpret_cast<const float*>(p), *reinterpret_cast<const float*>(p + sizeof(float)));
          } else if constexpr (kARowMajor) {
            v[i] = *reinterpret_cast<const float2*>(src + a_elem_off[s][h] + sizeof(float) * A::shift(j, 0));
          } else {
            const int step = sizeof(float) * A::shift(h + 2 * s, 0);
            v[i] = make_float2(*reinterpret_cast<const float*>(src + a_elem_off[j][0] + step),
                               *reinterpret_cast<const float*>(src + a_elem_off[j][1] + step));
          }
        }
      }
    };
    auto split_a = [&](const AFragment& v, std::uint32_t (&hi)[4], std::uint32_t (&lo)[4]) {
      if constexpr (kTf32) {
#pragma unroll
        for (int i = 0; i < 4; ++i) split_tf32_bits(v[i], a_scale[i & 1], hi[i], lo[i]);
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          __half2 h2, l2;
          wmmae::split_fp16x2(v[i].x * a_scale[i & 1], v[i].y * a_scale[i & 1], h2, l2);
          hi[i] = half2_bits(h2);
          lo[i] = half2_bits(l2);
        }
      }
    };

    // corr is written only by wgmma (a chunk's first correction product overwrites it): a register that an
    // in-flight wgmma group defines must not be written by ordinary code, or ptxas waits for the group.
    // kHalfHi: the hi*hi product of a k-step in two halves of 64 columns, each added as soon as it is done, so
    // that hh needs 32 registers. For the row-major instantiation beside the pre-pass, which is held to
    // kBesidePrepassGemmRegisters (H200, per call: 64 x 512^3 188.0 -> 184.5 us, 8 x 1024^3 162.5 -> 158.8,
    // 64 x 512 x 512 x 256 125.6 -> 122.4; same bits). With A column-major it was slower (64 x 512^3 both
    // column-major 180.2 -> 184.8, A column-major 182.7 -> 186.4), so not there.
    constexpr bool kHalfHi = kBesidePrepass && kARowMajor && kBRowMajor;
    constexpr int kHh = kHalfHi ? 32 : 64;  // hh's registers: the columns of one hi*hi product
    float sum[64], corr[64], hh[kHh];
#pragma unroll
    for (int x = 0; x < 64; ++x) sum[x] = 0.0f;
    const bool atomic_output = args.adds_into_output();  // split-K or stream-K
    // End of a chunk of K: see the WMMA kernel's flush. Accumulator element x of this thread lies in row
    // acc_row(x) of its two (row0, row0 + 8) and at column offset acc_col(x) from column 2 * quad (wgmma's
    // m64nNk16 layout). The flush addresses the two rows by pointer and the columns by constant offsets, so
    // there are no per-element addresses for the compiler to hoist out of the stage loop (it did, and
    // spilled all 64).
    auto acc_row = [](int x) { return (x >> 1) & 1; };
    auto acc_col = [](int x) { return 8 * (x >> 2) + (x & 1); };
    // Fast path (one multiplication and a float2 store or atomic per pair of elements, no bounds checks in
    // whole tiles): OutputTile::direct, and a chunk that is the whole sum or a split-K or stream-K part (added
    // by atomics). Otherwise element by element, where each thread reads an element's earlier partial sum
    // just before writing it, and ptxas (no free registers) makes every load wait for the previous element's
    // store: 64 round trips per flush. kReadBack (several chunks, no split-K) loads all 64 first, into hh
    // (free until the next hi*hi product overwrites it).
    // kOddWidth (rows not 8-byte aligned, which the fast path's pairs need), any chunk of a direct tile: the element
    // path's arithmetic, its chunk results staged through `staging` (a hi/lo buffer that no product reads then: see
    // the call) so that each warp stores, adds by atomics, or reads back and rewrites 32 consecutive columns of a row
    // at a time. Element by element, a warp's store put 4 floats 8 bytes apart into each of 8 rows: 9 of each
    // 32-byte sector's bytes used (H200, ncu, 4097^2 x 64: the GEMM 138 us against 60 at 4096^2 x 64, with 4x the
    // store requests and the same DRAM bytes).
    auto flush = [&](bool first_chunk, bool last_chunk, unsigned char* staging) {
      const OutputTile tile = *out_tile;
      // (The accumulators' rows row0 and row0 + 8 are the stage's lines; their rows in the tile, tile_row_of_line.)
      const int out_row0 = tile_row_of_line<kARowResidues>(row0), out_row8 = tile_row_of_line<kARowResidues>(row0 + 8);
      float* const out_row[2] = {tile.origin + out_row0 * n + 2 * quad, tile.origin + out_row8 * n + 2 * quad};
      const int a_shift[2] = {scales.a_shift[row0], scales.a_shift[row0 + 8]};
      const int* b_shift = scales.b_shift + 2 * quad;
      const bool row_in[2] = {out_row0 < tile.rows, out_row8 < tile.rows};
      const int cols_in = tile.cols - 2 * quad;  // column offsets j < cols_in are inside the output
      // The results of accumulator elements x and x + 1 (row r, columns j and j + 1 from 2 * quad), for the fast
      // path and the staged one. (nvcc's front end takes corr for "used before its value is set": only wgmma's
      // asm writes it, by design.)
#pragma nv_diagnostic push
#pragma nv_diag_suppress 549
      auto result_pair = [&](int x, int r, int j) {
        const int2 bs = *reinterpret_cast<const int2*>(b_shift + j);
        return make_float2(unscale_direct(chunk_result<kM>(sum[x], corr[x]), a_shift[r] + bs.x),
                           unscale_direct(chunk_result<kM>(sum[x + 1], corr[x + 1]), a_shift[r] + bs.y));
      };
      auto chunk_pair = [&](int x) {  // the same, still scaled
        return make_float2(chunk_result<kM>(sum[x], corr[x]), chunk_result<kM>(sum[x + 1], corr[x + 1]));
      };
#pragma nv_diagnostic pop
      if constexpr (kOddWidth) {
        // What each chunk does with its results, as add_chunk_to_output and add_chunk_to_read_back_output do: atomics
        // and a piece's only chunk store (or add) them unscaled, and are unscaled as they are staged; otherwise the
        // partial sum stays scaled in the output, read back after the first chunk and unscaled after the last one's
        // sum (so the unscaling waits for the read-back: row and column shifts of each stored element, from
        // `scales`). Read back only in the kReadBack instantiation (its blocks never add by atomics), so that each
        // instantiation compiles the cases it runs (both in one, the flush spilled); the plain one's chunks that
        // are read back (TORCH_WMMAE_READ_BACK=0) go element by element.
        // One staged flush per kind of chunk (kAtomics: added by atomics; kReadsBack: a chunk after the first, whose
        // earlier partial sums are read back), compiled apart: with the kind a branch at run time, calls whose tiles
        // are one chunk took 9-18% longer (H200, session 100, bench_unaligned's staged path: 4097^2 x 64 87.6 us
        // against 80.5 compiled apart, 2049^2 x 256 63.0 against 53.0, 8 x 1025^2 x 64 52.1 against 45.3).
        auto staged_flush = [&](auto atomics_tag, auto read_back_tag) {
          constexpr bool kAtomics = decltype(atomics_tag)::value, kReadsBack = decltype(read_back_tag)::value;
          // (In the plain instantiation the other chunks, which store, are a piece's only ones.)
          const bool unscale_staged = kAtomics || (!kReadsBack && (!kReadBack || last_chunk));
          const bool unscale_stored = kReadsBack && last_chunk;
          // The warp's rows 16 (warp % 4) + [0, 16) of its warpgroup's 64; the columns 32 c + [0, 32) in round c.
          // Row i's 8-column group g of the round lies at 8 (g ^ (i % 4)) in its 32 floats, so that a half warp's
          // 8-byte writes (4 rows, 4 lanes each) and a warp's reads along a row touch 32 different banks.
          float* const rows_of_warp = reinterpret_cast<float*>(staging) + warp * kStagedRows * kStagedCols;
          // (By residue, the warp's rows are tile rows kRowStep apart from warp_out_row: see tile_row_of_line.)
          const int warp_row = row0 - lane / 4;
          constexpr int kRowStep = kARowResidues ? 4 : 1;
          const int warp_out_row = tile_row_of_line<kARowResidues>(warp_row);
          // the warp's rows i < rows_in are inside the output
          const int rows_in =
              kARowResidues ? (tile.rows - warp_out_row + kRowStep - 1) / kRowStep : tile.rows - warp_row;
          float* const warp_out = tile.origin + static_cast<std::int64_t>(warp_out_row) * n + lane;
          // The earlier partial sums, all four rounds' at once, go to hh (free until the next hi*hi product
          // overwrites it), so that the loads are in flight together. (A round ahead instead, with fewer registers,
          // the wait for each round's loads made the flush slower than element by element: H200, 8 x 1025^2 x 4096
          // 1242 us against 925.)
          constexpr int kRounds = kBlockN / kStagedCols;
          if constexpr (kReadsBack) {
            const float* in = warp_out;
#pragma unroll
            for (int i = 0; i < kStagedRows; ++i) {
#pragma unroll
              for (int c = 0; c < kRounds; ++c) {
                hh[kStagedRows * c + i] = i < rows_in && kStagedCols * c + lane < tile.cols ? in[kStagedCols * c] : 0.0f;
              }
              in += kRowStep * n;
            }
          }
          // After a chunk that is not the piece's last, both warpgroups' products are complete only past a block
          // barrier: the products of the other warpgroup may still read the hi/lo buffer that `staging` is then.
          if (!last_chunk) __syncthreads();
#pragma unroll
          for (int c = 0; c < kRounds; ++c) {
#pragma unroll
            for (int x = 16 * c; x < 16 * c + 16; x += 2) {
              const int r = acc_row(x), i = lane / 4 + 8 * r, g = (x >> 2) & 3;
              *reinterpret_cast<float2*>(rows_of_warp + i * kStagedCols + 8 * (g ^ (i % 4)) + 2 * quad) =
                  unscale_staged ? result_pair(x, r, acc_col(x)) : chunk_pair(x);
              sum[x] = sum[x + 1] = 0.0f;
            }
            __syncwarp();
            const int col = kStagedCols * c + lane;
            float* out = warp_out + kStagedCols * c;
#pragma unroll
            for (int i = 0; i < kStagedRows; ++i) {
              float v = rows_of_warp[i * kStagedCols + 8 * ((lane / 8) ^ (i % 4)) + lane % 8];
              if constexpr (kReadsBack) {
                v = hh[kStagedRows * c + i] + v;
                // (scales.b_shift has kBlockN entries: col < 128 even past the output's edge)
                if (unscale_stored) v = unscale_direct(v, scales.a_shift[warp_row + i] + scales.b_shift[col]);
              }
              if (i < rows_in && col < tile.cols) {
                if constexpr (kAtomics) {
                  atomicAdd(out, v);
                } else {
                  *out = v;
                }
              }
              out += kRowStep * n;
            }
            __syncwarp();  // (the next round rewrites the warp's staging)
          }
        };
        if (tile.direct) {
          if constexpr (kReadBack) {  // (no atomics: sm90_read_back)
            if (first_chunk) {
              staged_flush(std::false_type{}, std::false_type{});
            } else {
              staged_flush(std::false_type{}, std::true_type{});
            }
            return;
          } else if (atomic_output) {
            staged_flush(std::true_type{}, std::false_type{});
            return;
          } else if (first_chunk && last_chunk) {
            staged_flush(std::false_type{}, std::false_type{});
            return;
          }
        }
      } else if (!kReadBack && tile.direct && (atomic_output || (first_chunk && last_chunk))) {
        // (Never with kReadBack: its blocks sum several chunks without split-K.)
        auto write = [&](auto* out, auto v) {  // (float2 or float4)
          if (atomic_output) {
            atomicAdd(out, v);
          } else {
            *out = v;
          }
        };
        // Whole tiles without bounds checks; a tile at the edge of the output checks each pair (the output
        // width is even, so both elements of a pair are inside or neither).
        auto write_pairs = [&](auto whole_tile) {
#pragma unroll
          for (int x = 0; x < 64; x += 2) {
            const int r = acc_row(x), j = acc_col(x);
            if (whole_tile || (row_in[r] && j < cols_in)) {
              write(reinterpret_cast<float2*>(out_row[r] + j), result_pair(x, r, j));
            }
            sum[x] = sum[x + 1] = 0.0f;
          }
        };
        // 16-byte aligned rows: lanes 2i and 2i + 1 of a quad trade one pair of each two 8-column groups, so
        // that each writes four adjacent columns with one float4 (or atomic): half the store instructions.
        // (A wave of blocks flushing at once: H200, 64 KB per block, 1.40 -> 1.15 us per flush in
        // benchmarks/micro/flush_stores.cu.) The width is 0 mod 4, so at the output's edge a float4 is inside
        // or outside as a whole; every lane trades, and only the store is skipped.
        auto write_quads = [&](auto whole_tile) {
          const bool odd = quad & 1;  // keeps the second group's pair: columns 8 + 2 (quad - 1) .. + 3
#pragma unroll
          for (int x = 0; x < 64; x += 8) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              const int x0 = x + 2 * r, x1 = x0 + 4, j = acc_col(x0);  // pairs at columns j and j + 8
              const float2 v0 = result_pair(x0, r, j), v1 = result_pair(x1, r, j + 8);
              const float2 give = odd ? v0 : v1;
              const float2 got = make_float2(__shfl_xor_sync(0xffffffffu, give.x, 1),
                                             __shfl_xor_sync(0xffffffffu, give.y, 1));
              const float4 v = odd ? make_float4(got.x, got.y, v1.x, v1.y) : make_float4(v0.x, v0.y, got.x, got.y);
              const int col = j + (odd ? 6 : 0);  // from column 2 * quad
              if (whole_tile || (row_in[r] && col < cols_in)) write(reinterpret_cast<float4*>(out_row[r] + col), v);
              sum[x0] = sum[x0 + 1] = sum[x1] = sum[x1 + 1] = 0.0f;
            }
          }
        };
        // (Edge tiles beside the resident pre-pass keep float2s: the code for float4s there put spills into
        // the stage loop of that instantiation, held to 240 registers; its batched calls rarely have edges.)
        const bool whole_tile = tile.rows == kBlockM && tile.cols == kBlockN;
        if (tile.quads && whole_tile) {
          write_quads(std::true_type{});
        } else if (tile.quads && !kBesidePrepass) {
          write_quads(std::false_type{});
        } else if (whole_tile) {
          write_pairs(std::true_type{});
        } else {
          write_pairs(std::false_type{});
        }
        return;
      }
      // (The odd-width read-back instantiation sends here only tiles whose shifts leave the fast path, rarely: they
      // read back element by element, which spares that instantiation the registers of the batch.)
      constexpr bool kBatchedReadBack = kReadBack && !kHalfHi && !kOddWidth;
      const bool read_back = kBatchedReadBack && !first_chunk;  // kReadBack implies no split-K (sm90_read_back)
      if constexpr (kBatchedReadBack) {
        if (read_back) {
#pragma unroll
          for (int x = 0; x < 64; ++x) {
            const int r = acc_row(x), j = acc_col(x);
            hh[x] = row_in[r] && j < cols_in ? out_row[r][j] : 0.0f;
          }
        }
      }
#pragma unroll
      for (int x = 0; x < 64; ++x) {
        const int r = acc_row(x), j = acc_col(x);
        if (row_in[r] && j < cols_in) {
          float* out = out_row[r] + j;
          const int shift = a_shift[r] + b_shift[j];
          if (read_back) {
            // (kHalfHi never reads back: kBesidePrepass excludes kReadBack. The index only stays in bounds.)
            add_chunk_to_read_back_output<kM>(sum[x], corr[x], hh[x % kHh], out, shift, last_chunk);
          } else {
            // With kBatchedReadBack this is the first chunk, unsplit; said as constants, or that instantiation spills.
            add_chunk_to_output<kM>(sum[x], corr[x], out, shift, !kReadBack && atomic_output,
                                    kBatchedReadBack || first_chunk, last_chunk);
          }
        }
        sum[x] = 0.0f;
      }
    };
    // The hi*hi product of one k-step, added to the fp32 sum outside the tensor core (round to nearest).
    auto add_hi_products = [&](int half = 0) {
      fence_registers(hh);
#pragma unroll
      for (int x = 0; x < kHh; ++x) sum[kHh * half + x] += hh[x];
      fence_registers(hh);
    };
    const int chunk_stages = accumulation_chunk(m, n) / kBlockK;

    if constexpr (kTma) {
      if (k_tiles > 0) wait_tma_stage(0);
      __syncthreads();
    } else {
      stage_ring_prologue<kStages>(k_tiles, issue_stage);
    }
    int split_buf = 0;  // B's hi/lo buffer of stage kt: kt % kBuffers, counted without a division
    auto next_split_buf = [](int buf) { return buf == kBuffers - 1 ? 0 : buf + 1; };
    split_b(0, split_buf);
    // Software pipeline over wgmma groups (in order per warpgroup; the fp16 groups are named in each branch
    // below). Each wait leaves a correction group running, so the tensor cores have it to work on while a
    // hi*hi sum is added, A is split and the block meets at the next barrier. The last group of stage kt,
    // k-step 1's corrections, still reads B's hi/lo buffer kt % 3 and A's k-step 1 fragment during stage
    // kt + 1: B is triple-buffered, and that fragment is rewritten only after the wait that retires it.
    // fp16 sums the hi*hi products of a stage's two k-steps in the tensor core and adds them to the fp32 sum
    // once (half the additions of one per k-step; H200, session 61: 4096^3 1.7% and 64 x 512^3 6%
    // less time per call), the truncation this doubles compensated in B's residual
    // (wmmae::split_fp16_compensated).
    // The flush sits outside the stage loop: inside it, ptxas would wait for every group at each stage.
    std::uint32_t a_hi[2][4], a_lo[2][4];
    // k-step 0 of A is loaded a stage ahead (it has landed by then), so a stage starts without waiting
    // for shared memory.
    AFragment a_next;
    if (k_tiles > 0) load_a(stage_a_of(0), 0, a_next);
    for (int chunk_begin = 0, chunk_end = 0; chunk_begin < k_tiles; chunk_begin = chunk_end) {
      chunk_end = min(k_tiles, chunk_begin + chunk_stages);
      // A piece added into the output by atomics takes a last remainder of up to chunk_stages / 8 stages into
      // the chunk before it: each flush there is a tile of atomics, and where most blocks of a stream-K
      // schedule flush at the same stage they wait for each other's. (H200, 128 x 4672 x 4096: 36-stage shares
      // as chunks of 32 + 4 stages, 81.9 us per call; as one chunk 77.3.) The chunk's error term grows by as
      // much (at most 1/8); the grid's outputs keep fixed chunks, the same as the CPU reference's.
      if (atomic_output && k_tiles - chunk_begin <= chunk_stages + chunk_stages / 8) chunk_end = k_tiles;
      for (int kt = chunk_begin; kt < chunk_end; ++kt) {
        // Also: B's hi/lo of stage kt are written, and every warpgroup's products of stage kt - 2 are
        // complete (so their hi/lo buffer can take stage kt + 1). With TMA, each thread waits for stage
        // kt + 1 to land only right before it reads it (split_ahead), not before this barrier: waiting here
        // held up the barrier, H200 2-4% more GEMM time.
        if constexpr (kTma) {
          __syncthreads();  // (also: every warp is done with stage kt - 1's slot, which stage kt + 3 takes)
        } else {
          stage_ring_advance<kStages>(kt, k_tiles, issue_stage);
        }
        const float* sa = stage_a_of(kt);
        const std::uint64_t b_hi = split_desc0 + split_buf * (2 * kSplitBytes >> 4);
        const std::uint64_t b_lo = b_hi + (kSplitBytes >> 4);
        constexpr int kStepDesc = 2 * kLbo >> 4;  // descriptor units per k-step (two core matrices along k)
        split_a(a_next, a_hi[0], a_lo[0]);
        // B's split of the next stage (and A's next k-step-0 fragment) needs hh free: warpgroup 1 does it
        // before its first products, warpgroup 0 once its hh is free (fp16: after the stage's hi*hi sum is
        // added; tf32 and kHalfHi, whose hh is half as large: after its first products), so that one
        // warpgroup splits while the other's products run. (Both after their first products, in step, the
        // tensor cores idled while both split: H200, 2-5% more GEMM time, up to 7% with a column-major
        // operand. Moving A's split of the next stage before the barrier instead cost 2-4%.)
        auto split_ahead = [&]() {
          if (kt + 1 < k_tiles) {
            if constexpr (kTma) wait_tma_stage(kt + 1);  // (each thread right before it reads the stage)
            split_b(kt + 1, next_split_buf(split_buf));
            load_a(stage_a_of(kt + 1), 0, a_next);
          }
        };
        const bool split_first = warp >= 4;
        if (split_first) split_ahead();
        if constexpr (kTf32) {
          // Per 8-wide k-step: hi*hi into hh, then lo*hi and hi*lo into corr; each wait leaves the step's
          // corrections running while its hi*hi part is added and the next step's fragment is split.
#pragma unroll
          for (int step = 0; step < kBlockK / 8; ++step) {
            const int cur = step & 1;
            const std::uint64_t b_step_hi = b_hi + step * kStepDesc, b_step_lo = b_lo + step * kStepDesc;
            wgmma_fence();
            wgmma_m64n128k8_tf32_overwrite(hh, a_hi[cur], b_step_hi);
            wgmma_commit();
            wgmma_m64n128k8_tf32(corr, a_lo[cur], b_step_hi, step > 0 || kt != chunk_begin);
            wgmma_m64n128k8_tf32(corr, a_hi[cur], b_step_lo, 1);
            wgmma_commit();
            if constexpr (kTma) {
              if (step == 0) issue_ahead(kt);
            }
            wgmma_wait<1>();  // this step's hi*hi and the previous step's corrections are done
            add_hi_products();
            if (step + 1 < kBlockK / 8) {  // (its registers were last read by the corrections just retired)
              AFragment v;
              load_a(sa, step + 1, v);
              if (step == 0 && !split_first) split_ahead();
              split_a(v, a_hi[cur ^ 1], a_lo[cur ^ 1]);
            }
          }
          wgmma_wait<0>();  // two hi/lo buffers: stage kt + 2's split, after the next barrier, rewrites this one's
        } else if constexpr (kHalfHi) {
          // Per half of 64 columns: the hi*hi products of both k-steps summed in the tensor core, then added.
          // Groups: G1 hi*hi of k-step 0, columns 0-63; G2 lo*hi of k-step 0; G3 hi*hi of k-step 1 onto G1;
          // G4 hi*lo of k-step 0; G5 both k-steps' hi*hi of columns 64-127; G6 k-step 1's corrections. Each
          // wait leaves a correction group running while the half is added.
          constexpr int kHalfNDesc = (kBlockN / 2 / 8) * kSbo >> 4;  // descriptor units of 64 columns
          wgmma_fence();
          wgmma_m64n64k16_overwrite<kBMnMajor>(hh, a_hi[0], b_hi);
          wgmma_commit();
          wgmma_m64n128k16<kBMnMajor>(corr, a_lo[0], b_hi, kt != chunk_begin);  // a chunk starts from zero
          wgmma_commit();
          issue_ahead(kt);
          wgmma_wait<2>();  // G6 of the previous stage is done: A's k-step-1 fragment is free
          AFragment a_step1;
          load_a(sa, 1, a_step1);
          split_a(a_step1, a_hi[1], a_lo[1]);
          wgmma_fence();
          wgmma_m64n64k16<kBMnMajor>(hh, a_hi[1], b_hi + kStepDesc, 1);
          wgmma_commit();
          wgmma_m64n128k16<kBMnMajor>(corr, a_hi[0], b_lo, 1);
          wgmma_commit();
          wgmma_wait<1>();  // G3 (and G1 before it)
          add_hi_products(0);
          wgmma_fence();
          wgmma_m64n64k16_overwrite<kBMnMajor>(hh, a_hi[0], b_hi + kHalfNDesc);
          wgmma_m64n64k16<kBMnMajor>(hh, a_hi[1], b_hi + kStepDesc + kHalfNDesc, 1);
          wgmma_commit();
          wgmma_m64n128k16<kBMnMajor>(corr, a_lo[1], b_hi + kStepDesc, 1);
          wgmma_m64n128k16<kBMnMajor>(corr, a_hi[1], b_lo + kStepDesc, 1);
          wgmma_commit();
          if (!split_first) split_ahead();
          wgmma_wait<1>();  // G5
          add_hi_products(1);
        } else {
          // The hi*hi products of both k-steps summed in the tensor core (G1: k-step 0 into a fresh hh, with
          // its corrections; G2: k-step 1 onto it; G3: k-step 1's corrections), added once per stage.
          wgmma_fence();
          wgmma_m64n128k16_overwrite<kBMnMajor>(hh, a_hi[0], b_hi);
          wgmma_m64n128k16<kBMnMajor>(corr, a_lo[0], b_hi, kt != chunk_begin);  // a chunk starts from zero
          wgmma_m64n128k16<kBMnMajor>(corr, a_hi[0], b_lo, 1);
          wgmma_commit();
          // A's k-step-1 values go to their own registers, so they can be loaded before the wait below (which
          // frees the registers of its split) where registers allow: row-major A with TMA stages, not beside
          // the pre-pass or with the batched read-back, whose stage loops would spill (ptxas, CUDA 13.0). H200,
          // session 68, same run: 4096^3 fp16 983 -> 941 us, 8192^3 8468-8568 -> 8313-8332 us.
          constexpr bool kEarlyAStep1 = kARowMajor && kTma && !kBesidePrepass && !kReadBack;
          AFragment a_step1;
          if constexpr (kEarlyAStep1) load_a(sa, 1, a_step1);
          if constexpr (kTma) issue_ahead(kt);
          wgmma_wait<1>();  // G3 of the previous stage is done: A's k-step-1 fragment is free
          if constexpr (!kEarlyAStep1) load_a(sa, 1, a_step1);
          split_a(a_step1, a_hi[1], a_lo[1]);
          wgmma_fence();
          wgmma_m64n128k16<kBMnMajor>(hh, a_hi[1], b_hi + kStepDesc, 1);
          wgmma_commit();
          wgmma_m64n128k16<kBMnMajor>(corr, a_lo[1], b_hi + kStepDesc, 1);
          wgmma_m64n128k16<kBMnMajor>(corr, a_hi[1], b_lo + kStepDesc, 1);
          wgmma_commit();
          wgmma_wait<1>();  // G2 (and G1 before it)
          add_hi_products();
          // B's next split needs hh's registers: warpgroup 0 splits now, while G3 runs (warpgroup 1 split
          // before its products).
          if (!split_first) split_ahead();
        }
        split_buf = next_split_buf(split_buf);
      }
      wgmma_wait<0>();
      fence_registers(corr);
      // The staging buffer (kOddWidth). In the piece's last chunk, B's hi/lo buffer of stage k_tiles is free: no
      // split wrote it in this piece, and the products of stage k_tiles - kBuffers that last read it were complete
      // at stage k_tiles - 1's barrier (every warpgroup's). The next piece's first split comes after work.next's
      // barrier. In an earlier chunk, that buffer holds stage chunk_end's split; the one after it (stage
      // chunk_end - 2's) is free once the flush's barrier has seen every warpgroup's products complete, and the
      // split that rewrites it comes after stage chunk_end's barrier.
      const bool last_chunk = chunk_end == k_tiles;
      flush(chunk_begin == 0, last_chunk, split_tile(last_chunk ? split_buf : next_split_buf(split_buf), 0));
    }
    cp_async_wait<0>();  // (the barrier of work.next: the next piece rewrites the scales and the stages)
    ring_start += k_tiles;
    previous_k_tiles = k_tiles;
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // code without wgmma (compute_90 PTX, sm_80): choose_kernels never launches it; fail loudly if it does
#endif
}

template <bool kARowMajor, bool kBRowMajor, bool kTma, bool kReadBack, bool kBesidePrepass, bool kOddWidth>
__global__ void __maxnreg__(kBesidePrepass ? kBesidePrepassGemmRegisters : 255)
    corrected_gemm_sm90_kernel(GemmArgs args, const __grid_constant__ TmaMaps maps) {
  corrected_gemm_sm90<Method::fp16, kARowMajor, kBRowMajor, kTma, kReadBack, kBesidePrepass, kOddWidth>(args, maps);
}

template <bool kARowMajor, bool kBRowMajor, bool kTma>
__global__ void __maxnreg__(255) corrected_gemm_sm90_tf32_kernel(GemmArgs args, const __grid_constant__ TmaMaps maps) {
  corrected_gemm_sm90<Method::tf32, kARowMajor, kBRowMajor, kTma, false, false, false>(args, maps);
}

// The same kernels for A read by residue of its lines (TmaMaps::a_by_residue: rows where A is row-major, k where it is
// column-major): TMA stages, not beside the pre-pass.
template <bool kARowMajor, bool kBRowMajor, bool kReadBack, bool kOddWidth>
__global__ void __maxnreg__(255)
    corrected_gemm_sm90_kernel_a_by_residue(GemmArgs args, const __grid_constant__ TmaMaps maps,
                                            const __grid_constant__ ResidueMaps a_residues) {
  corrected_gemm_sm90<Method::fp16, kARowMajor, kBRowMajor, true, kReadBack, false, kOddWidth, true>(args, maps,
                                                                                                    &a_residues);
}

template <bool kARowMajor, bool kBRowMajor>
__global__ void __maxnreg__(255)
    corrected_gemm_sm90_tf32_kernel_a_by_residue(GemmArgs args, const __grid_constant__ TmaMaps maps,
                                                 const __grid_constant__ ResidueMaps a_residues) {
  corrected_gemm_sm90<Method::tf32, kARowMajor, kBRowMajor, true, false, false, false, true>(args, maps, &a_residues);
}

// The same kernels for B read by residue of its lines (TmaMaps::b_by_residue: columns where B is column-major, k where
// it is row-major), with A by residue of its lines (kAResidues, a_residues) or read with maps.a. (kAResidues last, so
// that the arguments before it are those of the A-by-residue kernels.)
template <bool kARowMajor, bool kBRowMajor, bool kReadBack, bool kOddWidth, bool kAResidues>
__global__ void __maxnreg__(255)
    corrected_gemm_sm90_kernel_b_by_residue(GemmArgs args, const __grid_constant__ TmaMaps maps,
                                            const __grid_constant__ ResidueMaps a_residues,
                                            const __grid_constant__ ResidueMaps b_residues) {
  corrected_gemm_sm90<Method::fp16, kARowMajor, kBRowMajor, true, kReadBack, false, kOddWidth, kAResidues, true>(
      args, maps, &a_residues, &b_residues);
}

template <bool kARowMajor, bool kBRowMajor, bool kAResidues>
__global__ void __maxnreg__(255)
    corrected_gemm_sm90_tf32_kernel_b_by_residue(GemmArgs args, const __grid_constant__ TmaMaps maps,
                                                 const __grid_constant__ ResidueMaps a_residues,
                                                 const __grid_constant__ ResidueMaps b_residues) {
  corrected_gemm_sm90<Method::tf32, kARowMajor, kBRowMajor, true, false, false, false, kAResidues, true>(
      args, maps, &a_residues, &b_residues);
}

}  // namespace sm90
}  // namespace wmmae_ops
