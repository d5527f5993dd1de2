// torch.matmul's shape rules for float32 operands, resolved once for the CPU and CUDA corrected_matmul.
// The operands stay views of the caller's tensors: batch dimensions are broadcast with stride 0 and passed to
// the kernels as at most kMaxBatchDims (size, stride) triples (copies only where they do not merge into that).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "../wmmae/config.hpp"
#include "corrected_matmul_scheme.hpp"

namespace wmmae_ops {

constexpr int kMaxBatchDims = 6;

// Plain data, passed by value to kernels: the batch index z of the flattened batch maps to
// offsets sum_d idx_d * stride_d, with idx the row-major multi-index of z in `size`.
struct BatchStrides {
  int ndim;
  std::int64_t size[kMaxBatchDims];
  std::int64_t a_stride[kMaxBatchDims];
  std::int64_t b_stride[kMaxBatchDims];
};

struct MatmulPlan {
  at::Tensor a;  // [*batch, M, K] view of the first operand
  at::Tensor b;  // [*batch, K, N] view of the second operand
  std::vector<std::int64_t> out_shape;  // torch.matmul's result shape
  std::int64_t batch, m, n, k;
  BatchStrides batch_strides;  // coalesced; batch == product of sizes
};

// (z < batch: what is left of z at the outermost dimension is its index there, so that dimension, the only one of
// the common one-dimensional batch, costs no 64-bit division.)
WMMAE_HD inline void batch_offsets(const BatchStrides& bs, std::int64_t z, std::int64_t& a_offset,
                                   std::int64_t& b_offset) {
  a_offset = 0;
  b_offset = 0;
  for (int d = bs.ndim - 1; d > 0; --d) {
    const std::int64_t idx = z % bs.size[d];
    z /= bs.size[d];
    a_offset += idx * bs.a_stride[d];
    b_offset += idx * bs.b_stride[d];
  }
  if (bs.ndim > 0) {
    a_offset += z * bs.a_stride[0];
    b_offset += z * bs.b_stride[0];
  }
}

// Validates (float32, same device, matching inner dimensions, no 0-d tensors) and plans the product.
MatmulPlan plan_matmul(const at::Tensor& a, const at::Tensor& b, const char* op_name);

// Where b is one matrix broadcast over the batch and a's batch entries are its rows continued (one batch stride of
// M rows, or any nonzero stride where M = 1, as the [batch, M, K] input of x @ W.t()), the product is the single
// matrix product [batch x M, K] @ [K, N], whose output is the same memory as [batch, M, N] (torch.matmul folds it
// so too): plans it so (out_shape kept) and returns true, except where M is a multiple of 128 and the batched plan
// takes persistent batch slots (see the definition); otherwise leaves plan as it is. sm_count and l2_bytes as for
// plan_gemm_grid; sm_count = 0 (the CPU emulation, which runs no GPU schedule) makes no such exception: where a GPU
// makes it (K <= 1024, whole 128-row tiles per entry), folded and kept are the same arithmetic (the same tiles, one
// accumulation chunk), so the emulation's bits do not depend on it. TORCH_WMMAE_FOLD_BATCH=0 keeps every batch
// (tests compare the two; both callers, CUDA and the CPU emulation, read the switch here).
bool fold_batch_into_rows(MatmulPlan& plan, std::int64_t sm_count, std::int64_t l2_bytes);

// The CUDA GEMM's grid: kGemmTile x kGemmTile output tiles per batch entry (the grid's z extent takes at most
// kMaxGridYZ batch entries, the rest in a loop), each K split `k_splits` times into whole 32-wide k-stages.
// Or, for the wgmma fp16 kernel, stream-K: see stream_k_share below.
constexpr int kGemmTile = 128;
constexpr int kGemmStageK = 32;             // k extent of one stage of the fp16 kernels
constexpr std::int64_t kMaxGridYZ = 65535;  // CUDA's limit on a grid's y and z extents
// The float32 fallback's quadrants (kFallbackQuadrant, corrected_matmul_scheme.hpp) along a tile's side and in a
// tile: the CUDA kernel's items and the CPU emulation's decisions.
constexpr int kFallbackQuadrantsPerSide = kGemmTile / kFallbackQuadrant;
static_assert(kFallbackQuadrantsPerSide * kFallbackQuadrant == kGemmTile, "a tile is made of whole quadrants");
constexpr int kFallbackQuadrantsPerTile = kFallbackQuadrantsPerSide * kFallbackQuadrantsPerSide;

// Output tiles of one batch entry, and k-stages of one tile: the host's plan and the kernels' schedules
// count with these.
WMMAE_HD inline std::int64_t gemm_tiles(std::int64_t m, std::int64_t n) {
  return ((m + kGemmTile - 1) / kGemmTile) * ((n + kGemmTile - 1) / kGemmTile);
}
WMMAE_HD inline std::int64_t gemm_k_stages(std::int64_t k) { return (k + kGemmStageK - 1) / kGemmStageK; }

struct GemmGrid {
  std::int64_t tiles;        // output tiles of one batch entry (grid x)
  int k_splits;              // blocks per tile along K, 1: no split-K (grid y)
  std::int64_t batch_slots;  // batch entries launched at once, min(batch, kMaxGridYZ) (grid z)
  std::int64_t k_per_split;  // K elements per split, a multiple of 32
  // Blocks of the wgmma fp16 kernel's stream-K schedule, which it runs instead of this grid when > 0.
  std::int64_t stream_k_blocks;
  std::int64_t stream_k_gap;  // stream_k_share's gap between tiles
  // Batch slots (grid z) of the wgmma fp16 kernel with TMA stages when > 0, which then loops over the batch
  // entries in one round of blocks (see persistent_batch_slots in matmul_plan.cpp).
  std::int64_t persistent_batch_slots;
  std::int64_t blocks() const { return tiles * k_splits * batch_slots; }
};

// Split-K when the output has too few tiles to fill `sm_count` SMs (one block per SM), or, from 4 waves of
// tiles on, where K is long (long_k_splits, from K and the GPU's `l2_bytes` of L2); stream-K where it
// promises to be faster than that, or as TORCH_WMMAE_STREAM_K says: 0 never, 1 wherever it can run; the
// split count as TORCH_WMMAE_K_SPLITS says (a positive integer: that many splits, fewer where one would be
// empty; stream-K is then chosen only by TORCH_WMMAE_STREAM_K=1). Both switches are read on every call: tests
// and benchmarks compare them. Split-K and stream-K are off in deterministic mode (fp32 atomics combine the
// parts). Host code: the CUDA op launches with it, and the benchmarks record it (op _corrected_matmul_grid).
GemmGrid plan_gemm_grid(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch, std::int64_t sm_count,
                        std::int64_t l2_bytes);

// How many tile rows the GEMM's consecutive tiles walk down before the next column (tile_origin). The
// blocks that run at once are at k positions spread over their tiles' K (a block starts when another ends),
// so a strip of B is read again by the next tile of its column one launch later, and a strip of A by the
// next tile of its row `rows` launches later: for that read to hit L2, L2 has to hold about
// rows x K x kGemmTile floats of A. Taller groups read B from DRAM fewer times (once per group). So:
// kMaxTileGroupRows where that share of A fits 2/3 of `l2_bytes`, else kMinTileGroupRows. K: that of one
// tile's piece, K `k` cut into `k_splits` (GemmGrid::k_per_split). H200 (60 MiB of L2), auto held for 2 s,
// TFLOP/s (NOTES.md, session 63): 16384^3 8 rows 116-117, 4 rows 119-120 (DRAM reads per GEMM 123-126 GB
// against 90); 8192^2 x 32768 2 rows 116.5-117, 4 rows 118, 8 rows 117-117.6; 8192^3 8 rows 123, 4 rows 121-122.
constexpr int kMaxTileGroupRows = 8;
constexpr int kMinTileGroupRows = 4;
int gemm_tile_group_rows(std::int64_t k, std::int64_t l2_bytes, std::int64_t k_splits);

// The group height that the CUDA op launches with: TORCH_WMMAE_TILE_GROUP_ROWS (a positive integer, read on
// every call: tests check that the tile order leaves every output bit as it is, benchmarks compare orders) or
// else gemm_tile_group_rows.
int launch_tile_group_rows(std::int64_t k, std::int64_t l2_bytes, std::int64_t k_splits);

// Splits of a long K for a grid of many tiles (at least 4 waves, where split-K is otherwise never chosen; below
// that, large outputs whose split fills its waves, see long_k_split_below_4_waves in matmul_plan.cpp): 2 where
// K is longer than kLongKSplitAboveK, and more, up to kMaxLongKSplits, where a piece must be shorter still to keep
// kMaxTileGroupRows (gemm_tile_group_rows); 1 up to it. The threshold is the large outputs' accumulation chunk: an
// unsplit tile with a longer K flushes a chunk's partial sums into the output and reads them back before it adds
// the next chunk, while the splits' pieces add every chunk with float32 atomics, which do not wait. (Small
// outputs' chunks are 1024 long: batched grids of such outputs keep the same threshold, not measured for them.)
// The grid also runs split 0 of every tile before split 1 (blockIdx.y), so the blocks that run at once share one
// piece of K, L2 holds more of what they read, and the GEMM reads less from DRAM, which under held load is SM
// clock (the 700 W limit). The price is the output's zeroing, its atomics and a block's fixed cost per piece.
// H200, auto, one process, held 2 s / burst TFLOP/s, unsplit -> 2 splits (benchmarks/NOTES.md, sessions 64 and
// 65): 4096^3 126.2-127.0 -> 120.0-120.1 (one chunk: slower), 4352^3 115.3-115.4 -> 120.1-120.9, 4608^3 118.7 ->
// 123.7-123.8, 5120^3 115.0-117.1 -> 122.6-124.8, 6144^3 119.2-120.9 -> 127.4-127.8, 8192^3 122.8-123.5 ->
// 128.7-130.4 (4 splits 125.8-125.9), 8192^2 x 5120 118.8-121.5 -> 125.6-127.0, 12288^3 122.8-123.8 ->
// 128.9-129.8, 16384^3 118.6-119.8 -> 127.5-128.2 (DRAM reads 77 -> 66 GB), 8192^2 x 32768 119.4-120.0 ->
// 128.3-128.6 (4 splits 127.9-128.2). Those unsplit figures read the chunks back element by element; in one batch
// (the kReadBack kernel, the default since session 66: sm90_read_back) they recover about half of the split's
// gain: 4352^3 118.6-118.8, 5120^3 119.1-119.4, 8192^3 126.5-127.4.
constexpr std::int64_t kLongKSplitAboveK = kAccumulationChunkLarge;
constexpr int kMaxLongKSplits = 8;
int long_k_splits(std::int64_t k, std::int64_t l2_bytes);

// Stream-K's shares as plan_gemm_grid chooses them for `tiles` tiles (batch entries included) of `k_stages`
// stages over `blocks` blocks: where each block's share starts, blocks + 1 units (the last: the end).
std::vector<std::int64_t> stream_k_shares(std::int64_t tiles, std::int64_t k_stages, std::int64_t blocks);

// Stream-K: the work of a GEMM is units of one k-stage of one output tile of one batch entry, unit
// (z * tiles + tile) * k_stages + s, and block b of `blocks` takes units [stream_k_share(b), stream_k_share(b +
// 1)): about the same cost for every block, whatever the number of tiles, so no wave is left part empty. A
// block's share is cut where it crosses from one tile to the next (stream_k_piece); each piece is added into
// the zeroed output with atomics, as with split-K.
struct TileWork {
  std::int64_t z, tile;                 // batch entry, output tile (tile_origin)
  std::int64_t stage_begin, stage_end;  // k-stages [stage_begin, stage_end) of the tile
};
// A block whose share crosses into another tile runs one more piece: its line scales, pipeline fill and flush of
// atomics take about 8 us, some 10 k-stages (H100, session 122: 0.83 us per stage at 128 x 8448 x 4096).
// kStreamKCrossingStages, what the planner charges per crossing, is 12: over the benchmark sweep's stream-K points
// (M = 128, K = 4096) it took 0.5% less time than 4 in geometric mean (8: 0.4%), 3.8% less at N = 4288, 2.2% at
// 8512 and 1.5% more at worst; 10 took the same time as 12 and 16 0.3% more (H100, session 133; NOTES.md). So the
// shares may be equal along a line that puts `gap` empty units after each tile (plan_gemm_grid picks 0 or
// kStreamKCrossingStages): a share that covers the gap between two tiles takes that many fewer stages, and where
// few shares cross (fewer tiles than blocks) the slowest block runs about that many stages less than with shares
// of equal stages. (A share that lies wholly within a gap is empty: where shares are shorter than the gap, a block
// may idle.)
constexpr std::int64_t kStreamKCrossingStages = 12;
WMMAE_HD inline std::int64_t stream_k_share(std::int64_t block, std::int64_t blocks, std::int64_t tiles,
                                            std::int64_t k_stages, std::int64_t gap) {
  const std::int64_t span = k_stages + gap;  // a tile and the gap after it
  const std::int64_t point = block * (tiles * span - gap) / blocks;
  const std::int64_t tile = point / span, stage = point - tile * span;
  return tile * k_stages + (stage < k_stages ? stage : k_stages);
}
// The piece of a share that starts at `unit` and ends at the end of its tile or at end_unit, whichever
// comes first.
WMMAE_HD inline TileWork stream_k_piece(std::int64_t unit, std::int64_t end_unit, std::int64_t tiles,
                                        std::int64_t k_stages) {
  const std::int64_t tile_index = unit / k_stages, stage = unit % k_stages;
  const std::int64_t stage_end = stage + (end_unit - unit) < k_stages ? stage + (end_unit - unit) : k_stages;
  return TileWork{tile_index / tiles, tile_index % tiles, stage, stage_end};
}

}  // namespace wmmae_ops
