// The exponent pre-pass beside the wgmma GEMM (sm_90a), for batched calls whose operands TMA reads in place;
// built on line_range_prepass.cuh (LinesArgs, exact_magnitudes, batch_base), magnitude_keys.cuh (MagnitudeKeys) and
// corrected_gemm_sm90.cuh (TmaMaps, StageTile).
//
// The grid pre-pass must end before the GEMM's first tile starts: its blocks fill every SM, and the GEMM's
// take a whole SM each. Here the pre-pass is one block of four warps per SM that fits beside a GEMM block
// (registers: see kResidentPrepassRegisters; shared memory: a ring of two 16 KB stages, and both kernels ask
// for the largest carveout), so the GEMM starts at once and each of its tiles waits only until the line
// ranges of its own batch entry are complete (a counter per entry, GemmArgs::prepass_items_done). The blocks
// take the batch entries in order, and the GEMM's tiles come in the same order, so after the first few
// entries the pre-pass runs ahead of the GEMM, or keeps pace (see resident_prepass_applies for where it is
// used).
//
// One pre-pass block per SM is not something a launch can ask for: the block scheduler sometimes puts two or
// more on one SM (H100, 64 x 512^3: 5-66 SMs in 8 of 55 calls), and such an SM has no room for a GEMM block,
// which then started only when a pre-pass block ended, 60 us or more late. So a block that finds another
// pre-pass block on its SM exits at once, and the blocks take their items from a counter, in order, rather
// than by block index.
//
// A block's unit of work (an item) is the ranges of 128 lines (rows of A or columns of B) over a band of
// kResidentBandStages k-stages of 32, merged into the line ranges by atomics as in the grid form; each warp
// folds 32 of the lines. Each stage of an item comes by TMA with the GEMM's own maps and boxes (StageTile's
// layout), so the block reads the same 16 KB stage tiles that the GEMM does.
#pragma once

#include "corrected_gemm_sm90.cuh"
#include "line_range_prepass.cuh"

namespace wmmae_ops {
namespace sm90 {

// Registers per lane of the pre-pass's warps. Each of an SM's four schedulers has its own quarter of the
// register file (16 K) for its warps: two of a GEMM block's eight (kBesidePrepassGemmRegisters each) and one
// of the pre-pass block's four. (With 8 x 248 + 64, which fills the whole file exactly, no GEMM block ever
// joined a one-warp pre-pass block: H200, the two kernels ran one after the other.) With one warp per block,
// which folded all 128 lines, the pre-pass set the GEMM's pace (H200, 64 x 512^3: the whole pre-pass took
// 164 us beside the GEMM, 98 us when it only waited for its stages, and the GEMM's tiles waited for it).
constexpr int kResidentPrepassRegisters = 32;
constexpr int kResidentWarps = 4;
constexpr int kResidentThreads = 32 * kResidentWarps;
static_assert((kThreads / 32 / 4) * kBesidePrepassGemmRegisters + kResidentPrepassRegisters <= 16384 / 32,
              "a scheduler's share of the register file holds two GEMM warps and a pre-pass warp");

constexpr int kResidentLines = kBlockM;      // lines per item: one tile's rows or columns
constexpr int kResidentBandStages = 4;       // k-stages per item (128 k, 64 KB)
constexpr int kResidentSlots = 2;            // the block's ring of stage tiles
constexpr std::uint32_t kResidentStageBytes = sizeof(float) * kResidentLines * kBlockK;
// The ring, its alignment, its mbarriers and the next item's index (see resident_prepass_kernel).
constexpr std::size_t kResidentSmemBytes = kResidentSlots * kResidentStageBytes + 1024 + kResidentSlots * 8 + 8;
// SM ids (%smid) that the blocks claim in the workspace; an SM id beyond them is not claimed.
constexpr int kResidentSmClaims = 1024;
static_assert(kResidentLines == kBlockN, "an item covers one tile's rows of A or columns of B");
static_assert(kResidentLines == 32 * kResidentWarps, "a warp folds 32 lines of an item");

struct ResidentPrepassArgs {
  LinesArgs lines[2];            // A's rows, B's columns (where a band holds an Inf or NaN, read again)
  int line_tiles[2];             // items of 128 lines per band and batch entry, per operand
  int bands;                     // bands of kResidentBandStages stages along K
  int items_per_batch;           // (line_tiles[0] + line_tiles[1]) * bands
  int items;                     // items_per_batch * batch entries (32 bits: the host checks)
  int* items_done;               // [num_batches]: items finished, released after their ranges are merged
  int* next_item;                // items handed out so far (zeroed with the workspace)
  int* sm_claims;                // [kResidentSmClaims]: pre-pass blocks that started on each SM (zeroed)
};

// One block per SM (the grid is at most the SM count). Element (line l, k c) of a stage tile lies where
// StageTile puts it: for a k-inner operand (A row-major, B column-major) one box of 128 lines x 32 k, for a
// line-inner one (A column-major, B row-major) four boxes of 32 k x 32 lines. Warp w folds lines 32 w to
// 32 w + 31: k-inner, lane l its line 32 w + l (a 128-byte row of the box); line-inner, box w, where lane l
// takes lines 32 w + 4 (l % 8) + {0, 1, 2, 3} (one 16-byte chunk of a k row) in the k rows c = l / 8 (mod 4).
template <bool kARowMajor, bool kBRowMajor>
__global__ void __maxnreg__(kResidentPrepassRegisters)
    resident_prepass_kernel(ResidentPrepassArgs args, const __grid_constant__ TmaMaps maps) {
#ifdef WMMAE_SM90A_DEVICE
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + (1024 - smem_address(smem_raw) % 1024) % 1024;
  const float* ring = reinterpret_cast<const float*>(smem);
  std::uint64_t* full = reinterpret_cast<std::uint64_t*>(smem + kResidentSlots * kResidentStageBytes);
  int* next_item = reinterpret_cast<int*>(full + kResidentSlots);  // thread 0's fetch, for the whole block
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kResidentSlots; ++s) mbarrier_init(full + s, 1);
    fence_mbarrier_init();
  }
  __syncthreads();

  // (32-bit item arithmetic: with 32 registers, 64-bit state spilled and left one load in flight at a time.)
  const int total = args.items;
  const int k_stages = static_cast<int>((args.lines[0].length + kBlockK - 1) / kBlockK);
  struct Item {
    int z, line0, operand, stage0, stages;
  };
  auto item_at = [&](int i) {
    Item it;
    it.z = i / args.items_per_batch;
    int r = i % args.items_per_batch;
    it.operand = r < args.line_tiles[0] * args.bands ? 0 : 1;
    if (it.operand == 1) r -= args.line_tiles[0] * args.bands;
    it.line0 = r / args.bands * kResidentLines;
    it.stage0 = static_cast<int>(r % args.bands) * kResidentBandStages;
    it.stages = min(kResidentBandStages, k_stages - it.stage0);
    return it;
  };
  // Stage s of item `it` into ring slot `slot` (thread 0): the GEMM's boxes of that stage.
  auto issue = [&](const Item& it, int s, int slot) {
    if (threadIdx.x != 0) return;
    const std::uint32_t bar = smem_address(full + slot);
    const std::uint32_t dst = smem_address(ring) + slot * kResidentStageBytes;
    const bool of_a = it.operand == 0;
    const bool k_inner = of_a ? kARowMajor : !kBRowMajor;
    const CUtensorMap* map = of_a ? &maps.a : &maps.b;
    const int z = (of_a ? maps.a_batched : maps.b_batched) ? it.z : 0;
    const int k0 = (it.stage0 + s) * kBlockK, line0 = it.line0;
    mbarrier_arrive_expect_tx(bar, kResidentStageBytes);
    if (k_inner) {
      tma_load_3d(dst, map, bar, k0, line0, z);
    } else {
      for (int box = 0; box < kResidentLines / 32; ++box) {
        tma_load_3d(dst + box * 32 * kBlockK * sizeof(float), map, bar, line0 + 32 * box, k0, z);
      }
    }
  };

  std::uint32_t t = 0;  // stages this block has put through its ring
  // The workspace's zeroing (zero_workspace_kernel, which this grid overlaps) has ended before the SM claims,
  // the first item and the first merge, and before the GEMM, which reads the counts without waiting for a
  // grid, starts.
  wait_for_prior_grid();
  if (threadIdx.x == 0) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    const bool second_on_sm = sm < kResidentSmClaims && atomicAdd(args.sm_claims + sm, 1) != 0;
    const int first = second_on_sm ? total : atomicAdd(args.next_item, 1);
    *next_item = first;
    if (first < total) issue(item_at(first), 0, 0);
  }
  __syncthreads();
  int i = *next_item;
  __syncthreads();  // (every thread has read it before thread 0 writes the next one)
  allow_dependent_grid();  // the GEMM's blocks may take the rest of each SM now (or all of it: see below)
  // A second pre-pass block on an SM ends here, leaving room for a GEMM block; so does one that finds no item.
  while (i < total) {
    // The item after this one (thread 0, for its issue in this item's last stage), read by every thread after
    // the stage loop's barriers and before the barrier that lets thread 0 fetch the one after it.
    int next = total;
    if (threadIdx.x == 0) {
      next = atomicAdd(args.next_item, 1);
      *next_item = next;
    }
    const Item it = item_at(i);
    const bool k_inner = it.operand == 0 ? kARowMajor : !kBRowMajor;
    // k-inner: this lane's line in keys[0]; line-inner: its four lines' keys over its k rows.
    MagnitudeKeys keys[4] = {MagnitudeKeys::none(), MagnitudeKeys::none(), MagnitudeKeys::none(),
                             MagnitudeKeys::none()};
    for (int s = 0; s < it.stages; ++s, ++t) {
      // The next stage (of this item or the next) into the other slot, which every thread finished reading
      // at the end of the previous stage (__syncthreads below).
      if (s + 1 < it.stages) {
        issue(it, s + 1, (t + 1) % kResidentSlots);
      } else if (next < total) {  // (thread 0 only: the others' `next` is total)
        issue(item_at(next), 0, (t + 1) % kResidentSlots);
      }
      const int slot = t % kResidentSlots;
      mbarrier_wait(full + slot, (t / kResidentSlots) & 1u);
      const float* stage = ring + slot * (kResidentStageBytes / sizeof(float));
      // Four 16-byte loads in flight at a time: 32 registers leave room for no more.
      constexpr int kLoads = 4;
      if (k_inner) {
        const float* line = stage + (32 * warp + lane) * kBlockK;
#pragma unroll
        for (int q0 = 0; q0 < kBlockK / 4; q0 += kLoads) {
          float4 v[kLoads];
#pragma unroll
          for (int q = 0; q < kLoads; ++q) {  // chunk q0 + q of the line, where the 128-byte swizzle put it
            v[q] = *reinterpret_cast<const float4*>(line + (((q0 + q) ^ (lane % 8)) * 4));
          }
#pragma unroll
          for (int q = 0; q < kLoads; ++q) {
            keys[0].include(v[q].x);
            keys[0].include(v[q].y);
            keys[0].include(v[q].z);
            keys[0].include(v[q].w);
          }
        }
      } else {
        // This lane's chunk of k row c = 4 r + lane / 8 (r < 8) lies at chunk (lane % 8) ^ (c % 8), which is
        // ((lane % 8) ^ (lane / 8)) ^ 4 (r % 2) (lane / 8 < 4): two offsets for all eight rows. (ptxas kept one
        // per row, and spilled them.)
        const float* rows = stage + warp * 32 * kBlockK + (lane / 8) * 32;
        const int chunk = ((lane % 8) ^ (lane / 8)) * 4;
#pragma unroll
        for (int r0 = 0; r0 < kBlockK / 4; r0 += kLoads) {
          float4 v[kLoads];
#pragma unroll
          for (int q = 0; q < kLoads; ++q) {
            const int r = r0 + q;
            v[q] = *reinterpret_cast<const float4*>(rows + 4 * r * 32 + (chunk ^ (16 * (r % 2))));
          }
#pragma unroll
          for (int q = 0; q < kLoads; ++q) {
            keys[0].include(v[q].x);
            keys[1].include(v[q].y);
            keys[2].include(v[q].z);
            keys[3].include(v[q].w);
          }
        }
      }
      __syncthreads();
    }
    next = *next_item;
    const LinesArgs& lines = args.lines[it.operand];
    const std::int64_t k_begin = static_cast<std::int64_t>(it.stage0) * kBlockK;
    const std::int64_t k_end = min(lines.length, k_begin + static_cast<std::int64_t>(it.stages) * kBlockK);
    // Line `line` of the item's 128 from its keys. An Inf or NaN in its band: read again, exactly, from
    // global memory. (The line's address only in that branch: found before it, as exact_magnitudes'
    // argument, it made these warps spill more.)
    auto merge_line = [&](const MagnitudeKeys& key, int line_in_item) {
      const std::int64_t line = it.line0 + line_in_item;  // (64-bit: the offsets)
      if (line >= lines.lines) return;
      MagnitudeBits r = key.bits();
      if (!key.exact()) {
        r = exact_magnitudes(key, batch_base(lines, it.z) + line * lines.line_stride, k_begin * lines.elem_stride,
                             k_end * lines.elem_stride, lines.elem_stride);
      }
      lines.out.merge(it.z * lines.lines + line, r.exponent_range());
    };
    if (k_inner) {
      merge_line(keys[0], 32 * warp + lane);
    } else {
      // The four lanes with this lane's chunk (lane % 8) folded the other k rows of its lines.
#pragma unroll
      for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int other = 8; other < 32; other *= 2) keys[j].include(keys[j].of_lane_xor(other));
      }
      if (lane < 8) {
#pragma unroll
        for (int j = 0; j < 4; ++j) merge_line(keys[j], 32 * warp + 4 * lane + j);
      }
    }
    __threadfence();
    __syncthreads();  // every thread's merges come before the count (a release by thread 0)
    if (threadIdx.x == 0) {
      asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(args.items_done + it.z) : "memory");
    }
    i = next;
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // as corrected_gemm_sm90: never launched from code without sm_90a features
#endif
}

}  // namespace sm90
}  // namespace wmmae_ops
