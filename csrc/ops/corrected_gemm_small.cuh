// The GEMM of small products (small_gemm_applies in corrected_matmul_cuda.cu): square output tiles of 64, 32 or 16
// (the smallest that holds a batch entry's output, or 32 for few of them: small_gemm_tile) of a K that fits in
// shared memory whole
// (K <= kSmallMaxK), one block of 2 x tile threads per tile and batch entry, many blocks per SM (a kernel per tile
// and K bucket, SmallKBucket: fewer registers at a smaller K). The 128x128 tiles of the other GEMMs waste three
// quarters of their work on a 64x64 output and wait, one tile after the other, on each tile's fixed latencies (line
// ranges, first stage, flush: benchmarks/NOTES.md, sessions 81 and 82); here the blocks of other tiles hide them,
// and a call is one kernel (no pre-pass, no workspace, no exit kernels).
// A block: copies its rows of A and columns of B into shared memory (cp.async, any strides), folds each line's
// exponent range (thread t takes line t's, rows of A then columns of B; at K <= 64 folded from the chunks that each
// thread then splits, SmallChunkValues), and then
// - fp16, and auto where every line of the tile is fp16-safe: the fp16 method's arithmetic of the wgmma kernel
//   (corrected_matmul_scheme.hpp): lines scaled by their powers of two and split into hi and residual tiles (B's
//   residual compensated), per 32 k the hi*hi products summed in the tensor core and added to the float32 sum,
//   the corrections chained in their own accumulator; WMMA (mma.sync) products, sm_80 and newer;
// - auto where a line is not fp16-safe (a wide range of magnitudes, an Inf or a NaN): one float32 fused
//   multiply-add per product in k order, as torch.matmul computes it: float32's accuracy over float32's whole
//   range, and Inf and NaN as float32 gives them.
// Every output is a sum over k alone, in the same order whatever the tile: the tile sizes give the same bits (but for
// auto's tiles that take float32 FMAs, whose extent depends on the tile).
// Built on corrected_gemm_common.cuh (GemmArgs and the helpers it shares with the other GEMMs).
#pragma once

#include "corrected_gemm_common.cuh"
#include "magnitude_keys.cuh"

namespace wmmae_ops {

constexpr int kSmallMaxTile = 64;
constexpr int kSmallMaxK = 128;  // K in shared memory whole: 70 KB of it per block at this K and tile 64

// A block's shape for square output tiles of kTile: thread t folds line t (rows of A, then columns of B), the warps
// in a grid of at most two rows, each warp computing kWarpRows x kWarpCols outputs.
template <int kTile>
struct SmallShape {
  static_assert(kTile == 16 || kTile == 32 || kTile == 64, "small GEMM tiles: 16, 32 or 64");
  static constexpr int kThreads = 2 * kTile;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kWarpsM = kWarps >= 2 ? 2 : 1, kWarpsN = kWarps / kWarpsM;
  static constexpr int kWarpRows = kTile / kWarpsM, kWarpCols = kTile / kWarpsN;
  static constexpr int kFragsM = kWarpRows / 16, kFragsN = kWarpCols / 16;
  static constexpr int kOutLd = kTile + 4;  // the output tile's rows in shared memory, before they are stored
  // Words per line (per thread) in shared memory after the tiles: its shift, then the two words of its MagnitudeKeys.
  static constexpr int kLineWords = 3;
};

// The largest K of a kernel (its K bucket: small_gemm_k_bucket) and what it sets: the four-element chunks of one
// operand that a thread copies and splits (SmallChunks: kMaxK / 8 for every tile, since the threads grow with the
// lines), held in registers across the split's barrier, and the blocks per SM that the launch bounds let the
// registers allow. A smaller K needs fewer chunks and less shared memory, so that more blocks fit on an SM: at K <=
// 64 the registers, not shared memory, limited them (ncu, session 88: 16 warps per SM of tiles 16 and 32, 12 of tile
// 64). Tiles 16 and 32 are built for K of at most 32, 64 and kSmallMaxK; tile 64 for K of at most 64 and kSmallMaxK
// (its three sets of accumulators take 96 registers: at K <= 32 too, a fifth block per SM would spill). Tile 64 at
// K <= 64 and tile 32 at K <= 32 have a second kernel, kHhPerFragment (small_gemm_products_per_fragment), whose
// fewer registers allow five and sixteen blocks per SM: the host picks it where that takes fewer waves
// (small_gemm_hh_per_fragment).
template <int kTile, int kMaxK, bool kHhPerFragment = false>
struct SmallKBucket {
  static_assert(kMaxK == 32 || kMaxK == 64 || kMaxK == kSmallMaxK, "small GEMM K buckets: 32, 64 or kSmallMaxK");
  static_assert(kTile != kSmallMaxTile || kMaxK != 32, "tile 64: K buckets 64 and kSmallMaxK");
  // Whether the bucket has a kernel with kHhPerFragment.
  static constexpr bool kHasHhPerFragment = (kTile == kSmallMaxTile && kMaxK == 64) || (kTile == 32 && kMaxK == 32);
  static_assert(!kHhPerFragment || kHasHhPerFragment, "the hi*hi sums per fragment: tile 64 at K <= 64, 32 at K <= 32");
  static constexpr int kMaxChunks = kMaxK / 8;
  // The lines' exponent ranges folded from the split's chunks (SmallChunkValues::fold) at K <= 64, held in registers
  // from the fold to the split at K <= 32 and for tile 64 (SmallChunkValues' kHold); at K <= 128 each line folded by
  // its own thread (small_gemm_line_keys): there the fold, reading the chunks twice, was slower (H200, session 91).
  static constexpr bool kFoldChunks = kMaxK <= 64;
  static constexpr bool kHoldChunks = kFoldChunks && (kMaxK <= 32 || kTile == kSmallMaxTile);
  static_assert(kMaxK % 16 == 0 && kMaxChunks * 4 * SmallShape<kTile>::kThreads == kTile * kMaxK,
                "SmallChunks' chunks of each thread");
  // H100/H200 (228 KB of shared memory, 64K registers per SM), blocks per SM at the bucket's largest K:
  // tile 16: 32 (the SM's limit) / 24 (shared memory: 21) / 16 (shared memory: 12); tile 32: 14 (with kHhPerFragment
  // 16) / 12 (shared memory: 11) / 8 (shared memory: 6); tile 64: 4 (with kHhPerFragment 5; shared memory: 6) / 3
  // (shared memory: 3).
  // Each without spills in its products' loop (results/sass.md; tools/small_gemm_ptxas.sh compiles these kernels
  // alone in seconds); one more block per SM spills for tiles 32 and 64.
  static constexpr int kBlocksPerSm = kTile == 64   ? (kMaxK == 64 ? (kHhPerFragment ? 5 : 4) : 3)
                                      : kTile == 32 ? (kMaxK == 32 ? (kHhPerFragment ? 16 : 14) : kMaxK == 64 ? 12 : 8)
                                                    : (kMaxK == 32 ? 32 : kMaxK == 64 ? 24 : 16);
};

// The K bucket of a kernel for a tile and K: the smallest of 32 (not tile 64), 64 and kSmallMaxK that holds K.
__host__ __device__ constexpr int small_gemm_k_bucket(int tile, std::int64_t k) {
  return k <= 32 && tile != kSmallMaxTile ? 32 : k <= 64 ? 64 : kSmallMaxK;
}

// One operand's tile in shared memory, in its orientation in global memory: `kKInner` when K is its contiguous
// dimension (A row-major, B column-major), so that lines (rows of A, columns of B) are its outer dimension;
// otherwise K is the outer one. First the fp32 elements, padded by 16 bytes per line (bank conflicts, 16-byte
// chunks); the split then writes the hi and residual tiles over them (fp16, 16 bytes of padding per line;
// 32-byte aligned fragments), hi first.
template <int kTile, bool kKInner>
struct SmallOperandTile {
  int k_pad;  // K rounded up to whole k-steps
  __device__ explicit SmallOperandTile(int k_pad_) : k_pad(k_pad_) {}
  __host__ __device__ static constexpr int outer(int k_pad) { return kKInner ? kTile : k_pad; }
  __host__ __device__ static constexpr int inner(int k_pad) { return kKInner ? k_pad : kTile; }
  __device__ int outer() const { return outer(k_pad); }
  __device__ int inner() const { return inner(k_pad); }
  __device__ int ld_f32() const { return inner() + 4; }
  __device__ int ld_half() const { return inner() + 8; }
  __device__ int offset(int line, int kk, int ld) const { return kKInner ? line * ld + kk : kk * ld + line; }
  // Bytes: the hi and residual tiles, which take more than the fp32 elements.
  __host__ __device__ static std::size_t bytes(int k_pad) {
    return static_cast<std::size_t>(outer(k_pad)) * 2 * (inner(k_pad) + 8) * sizeof(__half);
  }
};

// K rounded up to whole fp16 k-steps (the tiles' zero padding takes the rest).
__host__ __device__ inline int small_gemm_k_pad(std::int64_t k) {
  return static_cast<int>((k + kFp16KStep - 1) / kFp16KStep * kFp16KStep);
}

// Dynamic shared memory of a block: A's and B's tiles, which the output tile reuses at the end, then the line
// shifts and the lines' MagnitudeKeys (two words each; unused where the K bucket folds line by line: the same
// blocks per SM).
template <int kTile, bool kARowMajor, bool kBRowMajor>
__host__ __device__ inline std::size_t small_gemm_smem_bytes(std::int64_t k) {
  const int k_pad = small_gemm_k_pad(k);
  const std::size_t tiles =
      SmallOperandTile<kTile, kARowMajor>::bytes(k_pad) + SmallOperandTile<kTile, !kBRowMajor>::bytes(k_pad);
  const std::size_t out = sizeof(float) * kTile * SmallShape<kTile>::kOutLd;
  return (tiles > out ? tiles : out) + SmallShape<kTile>::kLineWords * sizeof(int) * SmallShape<kTile>::kThreads;
}

// Thread t's four-element chunks of a tile, q = 0, 1, ... (the same for the copies and the split): with K inner, of
// line t / 2 at chunk t % 2 + 2 q (two threads per line); else of k-row t / (kTile / 4) + 8 q at lines
// 4 (t % (kTile / 4)) + [0, 4) (kTile / 4 threads per k-row, 8 k-rows per step). Affine in q, so that no offsets are
// kept across the batch loop. A warp's 16-byte copies cover whole 32-byte sectors of 16 lines (K inner) or whole
// k-rows of the tile.
template <int kTile, bool kKInner>
struct SmallChunks {
  static constexpr int kRowThreads = kTile / 4;  // (K outer) threads per k-row
  static constexpr int kOuterStep = kKInner ? 0 : SmallShape<kTile>::kThreads / kRowThreads;
  static constexpr int kInnerStep = kKInner ? 8 : 0;
  static_assert(kKInner || kOuterStep == 8, "eight k-rows per step, as eight k per step with K inner");
  int outer0, inner0, count;  // chunk q: outer index outer0 + q * kOuterStep, inner index inner0 + q * kInnerStep
  __device__ explicit SmallChunks(const SmallOperandTile<kTile, kKInner>& tile)
      : outer0(kKInner ? threadIdx.x / 2 : threadIdx.x / kRowThreads),
        inner0(kKInner ? (threadIdx.x % 2) * 4 : (threadIdx.x % kRowThreads) * 4),
        count(kKInner ? tile.inner() / 8 : tile.outer() / kOuterStep) {}
  __device__ int outer(int q) const { return outer0 + q * kOuterStep; }
  __device__ int inner(int q) const { return inner0 + q * kInnerStep; }
};

// Issues the cp.async copies of the tile's lines [line0, line0 + kTile) (of `line_extent` in the matrix) and K
// elements into its fp32 elements, zero-filling the rest: 16-byte copies (SmallChunks) where the contiguous
// dimension allows them (stride 1, 16-byte aligned lines), else 4-byte ones, consecutive lanes at consecutive
// addresses where a dimension is contiguous.
template <int kTile, bool kKInner>
__device__ __forceinline__ void small_gemm_stage(float* stage, const SmallOperandTile<kTile, kKInner>& tile,
                                                 const float* base, std::int64_t line0, std::int64_t line_extent,
                                                 std::int64_t k, std::int64_t line_stride, std::int64_t k_stride) {
  const int ld = tile.ld_f32();
  const std::int64_t outer_stride = kKInner ? line_stride : k_stride, inner_stride = kKInner ? k_stride : line_stride;
  const int lines = static_cast<int>(min(static_cast<std::int64_t>(kTile), line_extent - line0));
  const int kk_end = static_cast<int>(k);  // (k <= kSmallMaxK)
  const int outer_end = kKInner ? lines : kk_end, inner_end = kKInner ? kk_end : lines;
  const float* origin = base + line0 * line_stride;  // element (line0, 0)
  const bool vec4 = inner_stride == 1 && outer_stride % 4 == 0 && reinterpret_cast<std::uintptr_t>(origin) % 16 == 0;
  if (vec4) {
    const SmallChunks<kTile, kKInner> chunks(tile);
    const float* src = origin + chunks.outer0 * outer_stride + chunks.inner0;
    float* dst = stage + chunks.outer0 * ld + chunks.inner0;
    const bool outer_in = chunks.outer0 < outer_end;  // (K inner: the thread's one line)
#pragma unroll 4
    for (int q = 0; q < chunks.count; ++q) {
      const int o = chunks.outer(q), left = inner_end - chunks.inner(q);
      const int bytes = (kKInner ? outer_in : o < outer_end) && left > 0 ? (left >= 4 ? 16 : 4 * left) : 0;
      using Chunks = SmallChunks<kTile, kKInner>;
      cp_async16_bytes(dst + q * (Chunks::kOuterStep * ld + Chunks::kInnerStep),
                       bytes > 0 ? src + q * (Chunks::kOuterStep * outer_stride + Chunks::kInnerStep) : base, bytes);
    }
    return;
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int o = warp; o < tile.outer(); o += SmallShape<kTile>::kWarps) {
    const float* src = origin + o * outer_stride;
    for (int i = lane; i < tile.inner(); i += 32) {
      const bool valid = o < outer_end && i < inner_end;
      cp_async4(stage + o * ld + i, valid ? src + i * inner_stride : base, valid);
    }
  }
}

// The MagnitudeKeys of line `line` of a tile's fp32 elements (two integer operations per element), folded by one
// thread.
template <int kTile, bool kKInner>
__device__ __forceinline__ MagnitudeKeys small_gemm_line_keys(const float* stage,
                                                              const SmallOperandTile<kTile, kKInner>& tile, int line) {
  const int ld = tile.ld_f32();
  const int step = kKInner ? 1 : ld;  // along the line (16-byte reads: lanes 8 lines apart share no bank) or across
  const float* p = stage + (kKInner ? line * ld : line);
  MagnitudeKeys keys = MagnitudeKeys::none();
  for (int kk = 0; kk < tile.k_pad; kk += 4) {
    float4 v;
    if constexpr (kKInner) {
      v = *reinterpret_cast<const float4*>(p + kk);
    } else {
      v = make_float4(p[kk * step], p[(kk + 1) * step], p[(kk + 2) * step], p[(kk + 3) * step]);
    }
    keys.include(v.x);
    keys.include(v.y);
    keys.include(v.z);
    keys.include(v.w);
  }
  return keys;
}

// The exponent range of line `line` of a tile's fp32 elements from its MagnitudeKeys, where they saw no Inf or NaN,
// else from the line folded again exactly (zeros, the padding among them, count for nothing).
template <int kTile, bool kKInner>
__device__ __forceinline__ ExponentRange small_gemm_line_range(const MagnitudeKeys& keys, const float* stage,
                                                                const SmallOperandTile<kTile, kKInner>& tile,
                                                                int line) {
  if (keys.exact()) return keys.bits().exponent_range();
  MagnitudeBits bits = MagnitudeBits::none();
  for (int kk = 0; kk < tile.k_pad; ++kk) bits.include(stage[tile.offset(line, kk, tile.ld_f32())]);
  return bits.exponent_range();
}

// The power of two 2^shift as a float (|shift| <= 127, see line_shift).
__device__ __forceinline__ float small_gemm_scale(int shift) { return __int_as_float((127 + shift) << 23); }

// Thread t's four-element chunks of a tile's fp32 elements (SmallChunks) in registers: folded into their lines'
// MagnitudeKeys, then, once the lines' shifts are known, scaled and split into the hi and residual tiles in place
// (the residual compensated for B: wmmae::split_fp16_compensated). kHold: the chunks stay in registers from the
// fold to the split, so that each element is read from shared memory once (SmallKBucket::kHoldChunks); else the
// split reads them again (more registers would spill, or there was no fold: SmallKBucket::kFoldChunks).
template <int kMaxChunks, bool kHold, int kTile, bool kKInner>
struct SmallChunkValues {
  SmallChunks<kTile, kKInner> chunks;
  float4 v[kMaxChunks];

  __device__ explicit SmallChunkValues(const SmallOperandTile<kTile, kKInner>& tile) : chunks(tile) {}
  __device__ void read(const float* stage, const SmallOperandTile<kTile, kKInner>& tile) {
#pragma unroll
    for (int q = 0; q < kMaxChunks; ++q) {  // (every q reads, chunk 0 past the thread's last: v stays in registers)
      const int r = q < chunks.count ? q : 0;
      v[q] = *reinterpret_cast<const float4*>(stage + chunks.outer(r) * tile.ld_f32() + chunks.inner(r));
    }
  }
  // Adds the chunks' magnitudes to their lines' keys in shared memory (line_max[line], line_min[line]: the words of
  // MagnitudeKeys; a line's chunks are several threads'). Chunk 0 read again past the thread's last adds nothing.
  __device__ void fold(unsigned* line_max, unsigned* line_min) const {
    if constexpr (kKInner) {  // one line
      MagnitudeKeys keys = MagnitudeKeys::none();
#pragma unroll
      for (int q = 0; q < kMaxChunks; ++q) {
        keys.include(v[q].x);
        keys.include(v[q].y);
        keys.include(v[q].z);
        keys.include(v[q].w);
      }
      atomicMax(line_max + chunks.outer0, keys.twice_max);
      atomicMin(line_min + chunks.outer0, keys.twice_min_less_one);
    } else {  // four lines, inner0 + [0, 4)
      MagnitudeKeys keys[4] = {MagnitudeKeys::none(), MagnitudeKeys::none(), MagnitudeKeys::none(),
                               MagnitudeKeys::none()};
#pragma unroll
      for (int q = 0; q < kMaxChunks; ++q) {
        keys[0].include(v[q].x);
        keys[1].include(v[q].y);
        keys[2].include(v[q].z);
        keys[3].include(v[q].w);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        atomicMax(line_max + chunks.inner0 + j, keys[j].twice_max);
        atomicMin(line_min + chunks.inner0 + j, keys[j].twice_min_less_one);
      }
    }
  }
  // Writes the chunks' splits over the tile's fp32 elements, scaled by their lines' powers of two: at once where
  // they are held (every thread's reads were before the fold's barrier), else after reading them again and a block
  // barrier (a block-wide call then).
  template <bool kCompensate>
  __device__ void store_split(float* stage, const SmallOperandTile<kTile, kKInner>& tile, const int* shift) {
    if constexpr (!kHold) {
      read(stage, tile);
      __syncthreads();  // every fp32 element has been read
    }
    __half* hi = reinterpret_cast<__half*>(stage);
    __half* lo = hi + tile.outer() * tile.ld_half();
#pragma unroll
    for (int q = 0; q < kMaxChunks; ++q) {
      if (q < chunks.count) {
        const int o = chunks.outer(q), i = chunks.inner(q);
        float4 x = v[q];
        if constexpr (kKInner) {  // one line: one scale
          const float s = small_gemm_scale(shift[o]);
          x = make_float4(x.x * s, x.y * s, x.z * s, x.w * s);
        } else {
          x = make_float4(x.x * small_gemm_scale(shift[i]), x.y * small_gemm_scale(shift[i + 1]),
                          x.z * small_gemm_scale(shift[i + 2]), x.w * small_gemm_scale(shift[i + 3]));
        }
        const int off = o * tile.ld_half() + i;
        store_fp16_split4<kCompensate>(x, hi + off, lo + off);
      }
    }
  }
};

// Stores the output tile (rows x cols of it, kOutLd floats per row in shared memory) into row-major c at (m0, n0): a
// warp per row, consecutive lanes at consecutive columns.
template <int kTile>
__device__ __forceinline__ void small_gemm_store(float* c, std::int64_t n, std::int64_t m0, std::int64_t n0, int rows,
                                                 int cols, const float* tile) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int r = warp; r < rows; r += SmallShape<kTile>::kWarps) {
    float* row = c + (m0 + r) * n + n0;
    for (int cc = lane; cc < cols; cc += 32) row[cc] = tile[r * SmallShape<kTile>::kOutLd + cc];
  }
}

// A warp's view of the block's hi and residual tiles: its output fragments' first row (A) and column (B).
template <class TileA, class TileB>
struct SmallWarpTiles {
  TileA tile_a;
  TileB tile_b;
  const __half *hi_a, *lo_a, *hi_b, *lo_b;
  int row0, col0;
  __device__ int offset_a(int i, int kk) const { return tile_a.offset(row0 + 16 * i, kk, tile_a.ld_half()); }
  __device__ int offset_b(int j, int kk) const { return tile_b.offset(col0 + 16 * j, kk, tile_b.ld_half()); }
};

// A warp's fp16 products over K, as the kernel's loop over k-steps computes them (each output fragment's operations
// in the same order: the same bits), but per 32 k (kFp16HiSumK) one output fragment after the other, so that one
// hi*hi sum is held instead of one per output fragment (tile 64, four fragments per warp: 93-96 registers, not 128;
// tile 32 at K <= 32, two: 61-64, not 71-72), at the cost of loading each A and B fragment once per output fragment
// (tile 64: twice the loads from shared memory; tile 32: a third more).
template <class FragA, class FragB, class Acc, int kFragsM, int kFragsN, class TileA, class TileB>
__device__ __forceinline__ void small_gemm_products_per_fragment(Acc (&sum)[kFragsM][kFragsN],
                                                                 Acc (&corr)[kFragsM][kFragsN],
                                                                 const SmallWarpTiles<TileA, TileB> w, int k_steps) {
  namespace wmma = nvcuda::wmma;
  constexpr int kStepsPerSum = kFp16HiSumK / kFp16KStep;
  for (int ks0 = 0; ks0 < k_steps; ks0 += kStepsPerSum) {
    const int steps = min(kStepsPerSum, k_steps - ks0);
#pragma unroll
    for (int i = 0; i < kFragsM; ++i) {
#pragma unroll
      for (int j = 0; j < kFragsN; ++j) {
        Acc hh;
        wmma::fill_fragment(hh, 0.0f);
#pragma unroll
        for (int s = 0; s < kStepsPerSum; ++s) {
          if (s < steps) {
            const int kk = (ks0 + s) * kFp16KStep;
            FragA ah, al;
            FragB bh, bl;
            wmma::load_matrix_sync(ah, w.hi_a + w.offset_a(i, kk), w.tile_a.ld_half());
            wmma::load_matrix_sync(bh, w.hi_b + w.offset_b(j, kk), w.tile_b.ld_half());
            wmma::mma_sync(hh, ah, bh, hh);
            wmma::load_matrix_sync(al, w.lo_a + w.offset_a(i, kk), w.tile_a.ld_half());
            wmma::mma_sync(corr[i][j], al, bh, corr[i][j]);
            wmma::load_matrix_sync(bl, w.lo_b + w.offset_b(j, kk), w.tile_b.ld_half());
            wmma::mma_sync(corr[i][j], ah, bl, corr[i][j]);
          }
        }
#pragma unroll
        for (int x = 0; x < Acc::num_elements; ++x) sum[i][j].x[x] += hh.x[x];
      }
    }
  }
}

// kMaxK: the largest K the kernel takes (its K bucket, SmallKBucket). kHhPerFragment: the products of
// small_gemm_products_per_fragment (SmallKBucket::kHasHhPerFragment), else the loop over k-steps below.
template <int kTile, int kMaxK, bool kARowMajor, bool kBRowMajor, bool kHhPerFragment>
__global__ void __launch_bounds__(SmallShape<kTile>::kThreads,
                                  (SmallKBucket<kTile, kMaxK, kHhPerFragment>::kBlocksPerSm))
    corrected_gemm_small_kernel(GemmArgs args) {
  namespace wmma = nvcuda::wmma;
  using Shape = SmallShape<kTile>;
  using Bucket = SmallKBucket<kTile, kMaxK>;
  using TileA = SmallOperandTile<kTile, kARowMajor>;    // A row-major: K inner
  using TileB = SmallOperandTile<kTile, !kBRowMajor>;   // B column-major: K inner
  using LayoutA = typename std::conditional<kARowMajor, wmma::row_major, wmma::col_major>::type;
  using LayoutB = typename std::conditional<kBRowMajor, wmma::row_major, wmma::col_major>::type;
  using FragA = wmma::fragment<wmma::matrix_a, 16, 16, kFp16KStep, __half, LayoutA>;
  using FragB = wmma::fragment<wmma::matrix_b, 16, 16, kFp16KStep, __half, LayoutB>;
  using Acc = wmma::fragment<wmma::accumulator, 16, 16, kFp16KStep, float>;

  const std::int64_t m = args.m, n = args.n, k = args.k;
  const int k_pad = small_gemm_k_pad(k);
  const TileA tile_a(k_pad);
  const TileB tile_b(k_pad);
  extern __shared__ __align__(128) unsigned char smem_raw[];
  float* stage_a = reinterpret_cast<float*>(smem_raw);
  float* stage_b = reinterpret_cast<float*>(smem_raw + TileA::bytes(k_pad));
  float* out_tile = stage_a;  // after the products: the output tile, Shape::kOutLd floats per row
  int* shift =
      reinterpret_cast<int*>(smem_raw + small_gemm_smem_bytes<kTile, kARowMajor, kBRowMajor>(k)) -
      Shape::kLineWords * Shape::kThreads;
  unsigned* line_max = reinterpret_cast<unsigned*>(shift + Shape::kThreads);  // MagnitudeKeys of line t, A then B
  unsigned* line_min = line_max + Shape::kThreads;
  const __half* hi_a = reinterpret_cast<const __half*>(stage_a);
  const __half* lo_a = hi_a + tile_a.outer() * tile_a.ld_half();
  const __half* hi_b = reinterpret_cast<const __half*>(stage_b);
  const __half* lo_b = hi_b + tile_b.outer() * tile_b.ld_half();

  const unsigned tiles_n = static_cast<unsigned>((n + kTile - 1) / kTile);  // (tiles < 2^31: the host)
  const std::int64_t m0 = static_cast<std::int64_t>(blockIdx.x / tiles_n) * kTile;
  const std::int64_t n0 = static_cast<std::int64_t>(blockIdx.x % tiles_n) * kTile;
  const int rows = static_cast<int>(min(static_cast<std::int64_t>(kTile), m - m0));
  const int cols = static_cast<int>(min(static_cast<std::int64_t>(kTile), n - n0));
  const int t = threadIdx.x, warp = t / 32, wm = warp / Shape::kWarpsN, wn = warp % Shape::kWarpsN;
  const bool is_a = t < kTile;
  const int line = is_a ? t : t - kTile;
  const bool in_matrix = line < (is_a ? rows : cols);
  // Launched to overlap the kernel before it on the stream (launch_small_gemm), whose outputs A and B may be, and
  // whose inputs c's memory may have held: nothing is read or written before that kernel is complete. Then the
  // next call's first kernel may launch (it waits for this grid in turn), or, where args.dependents_at_last_piece,
  // only as each block exits (small_gemm_dependents_at_exit). Where it could launch before this wait (fdc7ff2), as
  // many calls' grids as fit could wait on the SMs at once, which was slower on some grids of at most one block per
  // SM (H200, session 87, back to back, before -> after the wait: 128 x 48 x 40 x 100 14.0 -> 10.0 us, 64 x 64^2 x
  // 128 12.9 -> 10.9, 100 x 64^3 10.5 -> 9.3) and no faster on any.
  wait_for_prior_grid();
  if (!args.dependents_at_last_piece) allow_dependent_grid();
  for (std::int64_t z = blockIdx.y; z < args.num_batches; z += gridDim.y) {
    std::int64_t a_off, b_off;
    batch_offsets(args.batch, z, a_off, b_off);
    if constexpr (Bucket::kFoldChunks) {  // (thread t read line t's keys last; others add to them after the copies)
      line_max[t] = MagnitudeKeys::none().twice_max;
      line_min[t] = MagnitudeKeys::none().twice_min_less_one;
    }
    small_gemm_stage(stage_a, tile_a, args.a + a_off, m0, m, k, args.a_rs, args.a_ks);
    small_gemm_stage(stage_b, tile_b, args.b + b_off, n0, n, k, args.b_cs, args.b_ks);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    // The lines' exponent ranges, from the chunks that the split takes (each thread's of A and of B; where it holds
    // them, every element is read from shared memory once) or line by line (SmallKBucket::kFoldChunks).
    SmallChunkValues<Bucket::kMaxChunks, Bucket::kHoldChunks, kTile, kARowMajor> chunks_a(tile_a);
    SmallChunkValues<Bucket::kMaxChunks, Bucket::kHoldChunks, kTile, !kBRowMajor> chunks_b(tile_b);
    MagnitudeKeys keys;
    if constexpr (Bucket::kFoldChunks) {
      chunks_a.read(stage_a, tile_a);
      chunks_a.fold(line_max, line_min);
      chunks_b.read(stage_b, tile_b);
      chunks_b.fold(line_max + kTile, line_min + kTile);
      __syncthreads();  // every line's keys are complete
      keys = MagnitudeKeys{line_max[t], line_min[t]};
    } else {
      keys = is_a ? small_gemm_line_keys(stage_a, tile_a, line) : small_gemm_line_keys(stage_b, tile_b, line);
    }
    const ExponentRange range = is_a ? small_gemm_line_range(keys, stage_a, tile_a, line)
                                     : small_gemm_line_range(keys, stage_b, tile_b, line);
    const int line_shift_fp16 = in_matrix ? line_shift<Method::fp16>(range) : 0;
    shift[t] = line_shift_fp16;
    const bool fp16_tile = __syncthreads_and(!in_matrix || fp16_safe(range)) || args.method == Method::fp16;

    if (fp16_tile) {
      // Shifts within +-kDirectShift unscale each output with one multiplication (unscale_direct). Where the
      // products leave the fewest registers (kHhPerFragment), decided after them from shared memory, so that nothing
      // more is held across them; the other kernels kept no spill only with it decided here (ptxas, session 89).
      bool small_shifts = false;
      if constexpr (!kHhPerFragment) {
        small_shifts = __syncthreads_and(line_shift_fp16 >= -kDirectShift && line_shift_fp16 <= kDirectShift);
      }
      chunks_a.template store_split<false>(stage_a, tile_a, shift);
      chunks_b.template store_split<true>(stage_b, tile_b, shift + kTile);
      __syncthreads();
      Acc sum[Shape::kFragsM][Shape::kFragsN], corr[Shape::kFragsM][Shape::kFragsN];
#pragma unroll
      for (int i = 0; i < Shape::kFragsM; ++i) {
#pragma unroll
        for (int j = 0; j < Shape::kFragsN; ++j) {
          wmma::fill_fragment(sum[i][j], 0.0f);
          wmma::fill_fragment(corr[i][j], 0.0f);
        }
      }
      const int k_steps = k_pad / kFp16KStep;
      if constexpr (kHhPerFragment) {
        const SmallWarpTiles<TileA, TileB> warp_tiles{tile_a, tile_b, hi_a, lo_a, hi_b, lo_b, wm * Shape::kWarpRows,
                                                      wn * Shape::kWarpCols};
        small_gemm_products_per_fragment<FragA, FragB>(sum, corr, warp_tiles, k_steps);
      } else {
        // (Here, not in a function: as one, it spilled in tile 32's K <= 32 kernels.)
        Acc hh[Shape::kFragsM][Shape::kFragsN];
        for (int ks = 0; ks < k_steps; ++ks) {
          const int kk = ks * kFp16KStep;
          FragA ah[Shape::kFragsM], al[Shape::kFragsM];
#pragma unroll
          for (int i = 0; i < Shape::kFragsM; ++i) {
            const int off = tile_a.offset(wm * Shape::kWarpRows + 16 * i, kk, tile_a.ld_half());
            wmma::load_matrix_sync(ah[i], hi_a + off, tile_a.ld_half());
            wmma::load_matrix_sync(al[i], lo_a + off, tile_a.ld_half());
          }
          const bool first_of_sum = ks % (kFp16HiSumK / kFp16KStep) == 0;
#pragma unroll
          for (int j = 0; j < Shape::kFragsN; ++j) {
            FragB bh, bl;
            const int off = tile_b.offset(wn * Shape::kWarpCols + 16 * j, kk, tile_b.ld_half());
            wmma::load_matrix_sync(bh, hi_b + off, tile_b.ld_half());
            wmma::load_matrix_sync(bl, lo_b + off, tile_b.ld_half());
#pragma unroll
            for (int i = 0; i < Shape::kFragsM; ++i) {
              if (first_of_sum) wmma::fill_fragment(hh[i][j], 0.0f);
              wmma::mma_sync(hh[i][j], ah[i], bh, hh[i][j]);
              wmma::mma_sync(corr[i][j], al[i], bh, corr[i][j]);
              wmma::mma_sync(corr[i][j], ah[i], bl, corr[i][j]);
            }
          }
          // The hi*hi sum of 32 k (kFp16HiSumK), or of the last 16, goes into the float32 sum.
          if (!first_of_sum || ks + 1 == k_steps) {
#pragma unroll
            for (int i = 0; i < Shape::kFragsM; ++i) {
#pragma unroll
              for (int j = 0; j < Shape::kFragsN; ++j) {
#pragma unroll
                for (int x = 0; x < Acc::num_elements; ++x) sum[i][j].x[x] += hh[i][j].x[x];
              }
            }
          }
        }
      }
      // Every warp is done with the hi and residual tiles, which the output tile overwrites.
      if constexpr (kHhPerFragment) {
        small_shifts = __syncthreads_and(shift[t] >= -kDirectShift && shift[t] <= kDirectShift);
      } else {
        __syncthreads();
      }
#pragma unroll
      for (int i = 0; i < Shape::kFragsM; ++i) {
#pragma unroll
        for (int j = 0; j < Shape::kFragsN; ++j) {
          const int r0 = wm * Shape::kWarpRows + 16 * i, c0 = wn * Shape::kWarpCols + 16 * j;
          wmmae::foreach_ij(sum[i][j], [&](auto xs, int r, int cc) {
            const float v = chunk_result<Method::fp16>(sum[i][j].x[xs.first], corr[i][j].x[xs.first]);
            const int s = shift[r0 + r] + shift[kTile + c0 + cc];
            wmmae::assign(sum[i][j], xs, small_shifts ? unscale_direct(v, s) : ldexpf(v, -s));
          });
          wmma::store_matrix_sync(out_tile + r0 * Shape::kOutLd + c0, sum[i][j], Shape::kOutLd, wmma::mem_row_major);
        }
      }
    } else {
      // auto, a line that is not fp16-safe: float32 FMAs. Thread t: rows kRows (t / (kTile / 4)) + [0, kRows) at
      // columns 4 (t % (kTile / 4)) + [0, 4), k in order.
      constexpr int kCols = 4, kRows = kTile * kTile / (Shape::kThreads * kCols);
      const int r0 = t / (kTile / kCols) * kRows, c0 = t % (kTile / kCols) * kCols;
      float part[kRows][kCols] = {};
      for (int kk = 0; kk < k; ++kk) {
        float av[kRows], bv[kCols];
#pragma unroll
        for (int i = 0; i < kRows; ++i) av[i] = stage_a[tile_a.offset(r0 + i, kk, tile_a.ld_f32())];
#pragma unroll
        for (int j = 0; j < kCols; ++j) bv[j] = stage_b[tile_b.offset(c0 + j, kk, tile_b.ld_f32())];
#pragma unroll
        for (int i = 0; i < kRows; ++i) {
#pragma unroll
          for (int j = 0; j < kCols; ++j) part[i][j] = __fmaf_rn(av[i], bv[j], part[i][j]);
        }
      }
      __syncthreads();  // every thread is done with the fp32 tiles, which the output tile overwrites
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        *reinterpret_cast<float4*>(out_tile + (r0 + i) * Shape::kOutLd + c0) =
            make_float4(part[i][0], part[i][1], part[i][2], part[i][3]);
      }
    }
    __syncthreads();  // the output tile is complete
    small_gemm_store<kTile>(args.c + z * args.c_batch_stride, n, m0, n0, rows, cols, out_tile);
    __syncthreads();  // the next batch entry rewrites the tiles and the shifts
  }
}

}  // namespace wmmae_ops
