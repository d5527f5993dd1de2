// corrected_matmul's grid pre-pass: the exponent range of every line (row of A, column of B) of a strided
// matrix, folded into RangeArrays by atomics, and the zeroing of the output where K is split; with the
// small kernel before it that zeroes the workspace (zero_workspace_kernel). At most one launch of prepass_kernel
// per call (launch_prepass; none where the resident pre-pass or the GEMM's tiles find the ranges). The line
// folds (MagnitudeKeys, contiguous_line_ranges, ...) also serve the pre-pass that runs beside the GEMM in batched
// calls (resident_prepass_sm90.cuh) and the GEMM's tiles that fold their own lines (corrected_gemm_sm90.cuh).
// Built on corrected_gemm_common.cuh (RangeArrays, BatchStrides, launch_kernel, allow_dependent_grid). Its kernels
// are not templates: one translation unit includes this header (corrected_matmul_cuda.cu).
#pragma once

#include <algorithm>
#include <cstdint>

#include "corrected_gemm_common.cuh"
#include "magnitude_keys.cuh"

namespace wmmae_ops {

struct LinesArgs {
  const float* base;
  std::int64_t lines, length;            // lines x length elements per batch index
  std::int64_t line_stride, elem_stride;
  BatchStrides batch;
  bool use_b_strides;                    // which operand's batch strides apply
  RangeArrays out;                       // [num_batches][lines]
  std::int64_t num_batches;
  bool vec4 = false;                     // strided lines read in float4s: see float4_lines
  int lines_per_warp = 1;                // contiguous lines: see contiguous_lines_per_warp
};

constexpr int kPrepassThreads = 256;
constexpr int kChunk = 64;     // elements of one line reduced by one thread (strided lines)
constexpr int kLoadBatch = 8;  // loads a thread has in flight before it looks at their values

// Folds the elements first, first + step, ... (< end) of p into r (MagnitudeKeys or MagnitudeBits),
// kLoadBatch loads at a time: the loop carries only r, so without the batching each load's latency would be
// paid one after the other.
template <class Fold>
__device__ inline void include_strided(Fold& r, const float* p, std::int64_t first, std::int64_t end,
                                       std::int64_t step) {
  std::int64_t e = first;
  for (; e + (kLoadBatch - 1) * step < end; e += kLoadBatch * step) {
    float v[kLoadBatch];
#pragma unroll
    for (int j = 0; j < kLoadBatch; ++j) v[j] = p[e + j * step];
#pragma unroll
    for (int j = 0; j < kLoadBatch; ++j) r.include(v[j]);
  }
  for (; e < end; e += step) r.include(p[e]);
}

// The MagnitudeBits of the elements first, first + step, ... (< end) of p, whose keys were folded into `keys`:
// the keys' where they saw no Inf or NaN, else those elements read again exactly.
__device__ inline MagnitudeBits exact_magnitudes(const MagnitudeKeys& keys, const float* p, std::int64_t first,
                                                 std::int64_t end, std::int64_t step) {
  MagnitudeBits r = keys.bits();
  if (!keys.exact()) {
    r = MagnitudeBits::none();
    include_strided(r, p, first, end, step);
  }
  return r;
}

// MagnitudeBits of those elements: by keys, read again exactly where they hold an Inf or NaN.
__device__ inline MagnitudeBits strided_magnitudes(const float* p, std::int64_t first, std::int64_t end,
                                                   std::int64_t step) {
  MagnitudeKeys keys = MagnitudeKeys::none();
  include_strided(keys, p, first, end, step);
  return exact_magnitudes(keys, p, first, end, step);
}

__device__ inline MagnitudeBits warp_merge(MagnitudeBits r) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    r.max_finite = max(r.max_finite, __shfl_xor_sync(0xffffffffu, r.max_finite, off));
    r.min_nonzero = min(r.min_nonzero, __shfl_xor_sync(0xffffffffu, r.min_nonzero, off));
  }
  r.nonfinite = __any_sync(0xffffffffu, r.nonfinite);
  return r;
}

// The first element of batch entry z of the operand whose lines `args` describes.
__device__ inline const float* batch_base(const LinesArgs& args, std::int64_t z) {
  std::int64_t a_off, b_off;
  batch_offsets(args.batch, z, a_off, b_off);
  return args.base + (args.use_b_strides ? b_off : a_off);
}

// Lines contiguous in memory (elem_stride == 1): warp `task` (of line groups x chunks) reduces kWarpSpan
// elements of each of kLines consecutive lines, kLoads loads of each in flight together. Four lines per warp
// where there are enough of them (contiguous_lines_per_warp), one where there are few, which need the warps.
// (H200, session 22, with MagnitudeKeys: the pre-pass of 64 x 512^3 48.8 -> 43.6 us, of 64 x 512^3 with B
// column-major, where both operands' lines are contiguous, 53.0 -> 44.9 us. float4 loads were not faster
// here: 0.85-1.06x in an H200 microbenchmark.)
constexpr int kWarpSpan = 1024;
// Chunks of kWarpSpan elements per line, and the warp tasks of one batch entry with `lines_per_warp` lines each
// (line groups x chunks): the host sizes the grid with these, the warps find their lines with them.
__host__ __device__ inline std::int64_t contiguous_chunks(const LinesArgs& args) {
  return (args.length + kWarpSpan - 1) / kWarpSpan;
}
__host__ __device__ inline std::int64_t contiguous_tasks(const LinesArgs& args, int lines_per_warp) {
  return (args.lines + lines_per_warp - 1) / lines_per_warp * contiguous_chunks(args);
}
template <int kLines, int kLoads>
__device__ void contiguous_line_ranges(const LinesArgs& args, const float* base, std::int64_t task,
                                       std::int64_t z) {
  if (task >= contiguous_tasks(args, kLines)) return;
  const std::int64_t chunks = contiguous_chunks(args);
  const std::int64_t group = chunks == 1 ? task : task / chunks, chunk = chunks == 1 ? 0 : task % chunks;
  const std::int64_t line0 = group * kLines;
  const int lines_here = static_cast<int>(min(static_cast<std::int64_t>(kLines), args.lines - line0));
  const std::int64_t end = min(args.length, (chunk + 1) * kWarpSpan);
  const std::int64_t first = chunk * kWarpSpan + threadIdx.x % 32;
  const float* p = base + line0 * args.line_stride;
  // One pointer per line, advanced per batch of loads, so that each load is a pointer and a constant. Lines
  // past the last read its first line again (unpredicated loads; their keys are not merged).
  const float* q[kLines];
  MagnitudeKeys keys[kLines];
#pragma unroll
  for (int g = 0; g < kLines; ++g) {
    q[g] = p + (g < lines_here ? g : 0) * args.line_stride + first;
    keys[g] = MagnitudeKeys::none();
  }
  // A batch of kLoads loads per line from element e on; `checked` where it crosses the end (separate code,
  // or ptxas predicates every load; zeros count for nothing).
  auto fold_batch = [&](std::int64_t e, auto checked) {
    float v[kLines][kLoads];
#pragma unroll
    for (int g = 0; g < kLines; ++g) {
#pragma unroll
      for (int j = 0; j < kLoads; ++j) v[g][j] = !checked || e + 32 * j < end ? q[g][32 * j] : 0.0f;
      q[g] += 32 * kLoads;
    }
#pragma unroll
    for (int g = 0; g < kLines; ++g) {
#pragma unroll
      for (int j = 0; j < kLoads; ++j) keys[g].include(v[g][j]);
    }
  };
  for (std::int64_t e = first; e < end; e += 32 * kLoads) {
    if (e + 32 * (kLoads - 1) < end) {
      fold_batch(e, std::false_type{});
    } else {
      fold_batch(e, std::true_type{});
    }
  }
  const int lane = threadIdx.x % 32;
  wait_for_prior_grid();  // the workspace's zeroing (see zero_workspace_kernel)
#pragma unroll
  for (int g = 0; g < kLines; ++g) {
    // (Lines past the last: their stand-in, the first line, whose result is not merged.)
    const MagnitudeBits r =
        warp_merge(exact_magnitudes(keys[g], p + (g < lines_here ? g : 0) * args.line_stride, first, end, 32));
    if (lane == g && g < lines_here) args.out.merge(z * args.lines + line0 + g, r.exponent_range());
  }
}

// Strided lines: consecutive threads take consecutive lines (coalesced when line_stride == 1), kChunk
// elements of a line each, chunks chunk0, chunk0 + chunk_step, ...
__device__ void strided_line_ranges(const LinesArgs& args, const float* base, std::int64_t line,
                                    std::int64_t chunk0, std::int64_t chunk_step, std::int64_t z) {
  if (line >= args.lines) return;
  const float* p = base + line * args.line_stride;
  wait_for_prior_grid();  // the workspace's zeroing (see zero_workspace_kernel), before the first merge
  for (std::int64_t begin = chunk0 * kChunk; begin < args.length; begin += chunk_step * kChunk) {
    const std::int64_t end = min(args.length, begin + kChunk);
    const MagnitudeBits r = strided_magnitudes(p, begin * args.elem_stride, end * args.elem_stride, args.elem_stride);
    args.out.merge(z * args.lines + line, r.exponent_range());
  }
}

// Strided lines that float4s can read (LinesArgs::vec4: the same element of four consecutive lines is one
// aligned float4): a block takes kTileLines lines, each warp kTileRun elements of all of them (a lane four
// lines), in every kTileSpan-element band band0, band0 + band_step, ...; the warps' results meet in shared
// memory and each line is merged once per block. (H200, against one line per thread in chunks of 64:
// 1.03-1.22x the speed, fewer atomics.)
constexpr int kTileLines = 128, kTileRun = 16, kTileSpan = kTileRun * kPrepassThreads / 32;
__device__ void strided_line_tile_ranges(const LinesArgs& args, const float* base, std::int64_t line_tile,
                                         std::int64_t band0, std::int64_t band_step, std::int64_t z) {
  __shared__ MagnitudeBits partial[kPrepassThreads / 32][kTileLines];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const std::int64_t line0 = line_tile * kTileLines + 4 * lane;
  MagnitudeKeys keys[4] = {MagnitudeKeys::none(), MagnitudeKeys::none(), MagnitudeKeys::none(),
                           MagnitudeKeys::none()};
  const float4* p = reinterpret_cast<const float4*>(base + line0);
  const std::int64_t step = args.elem_stride / 4;
  const bool lines_in = line0 < args.lines;  // all four lines are there: lines % 4 == 0
  const std::int64_t first0 = band0 * kTileSpan + warp * kTileRun;
  // One run of kTileRun elements from `first` (a pointer advanced by the stride; the bounds checked only
  // where the run crosses the end of the lines: separate code, or ptxas predicates every load).
  auto fold_run = [&](std::int64_t first, auto checked) {
    const float4* pj = p + first * step;
#pragma unroll
    for (int batch = 0; batch < kTileRun; batch += kLoadBatch) {
      float4 v[kLoadBatch];
#pragma unroll
      for (int j = 0; j < kLoadBatch; ++j, pj += step) {
        v[j] = !checked || first + batch + j < args.length ? *pj : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int j = 0; j < kLoadBatch; ++j) {  // (zeros count for nothing)
        keys[0].include(v[j].x);
        keys[1].include(v[j].y);
        keys[2].include(v[j].z);
        keys[3].include(v[j].w);
      }
    }
  };
  if (lines_in) {
    for (std::int64_t first = first0; first < args.length; first += band_step * kTileSpan) {
      if (first + kTileRun <= args.length) {
        fold_run(first, std::false_type{});
      } else {
        fold_run(first, std::true_type{});
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    MagnitudeBits r = keys[i].bits();
    if (!keys[i].exact()) {  // an Inf or NaN among this lane's elements of line line0 + i: again, exactly
      r = MagnitudeBits::none();
      const float* elems = base + line0 + i;
      for (std::int64_t first = first0; first < args.length; first += band_step * kTileSpan) {
        include_strided(r, elems, first * args.elem_stride, min(args.length, first + kTileRun) * args.elem_stride,
                        args.elem_stride);
      }
    }
    partial[warp][4 * lane + i] = r;
  }
  __syncthreads();
  const std::int64_t line = line_tile * kTileLines + threadIdx.x;
  wait_for_prior_grid();  // the workspace's zeroing (see zero_workspace_kernel)
  if (threadIdx.x < kTileLines && line < args.lines) {
    MagnitudeBits all = partial[0][threadIdx.x];
    for (int w = 1; w < kPrepassThreads / 32; ++w) all.include(partial[w][threadIdx.x]);
    args.out.merge(z * args.lines + line, all.exponent_range());
  }
  __syncthreads();  // `partial` is reused for the next batch entry
}

// The pre-pass's workspace (see RangeArrays; with auto's tf32_tiles_pending and the resident pre-pass's counts)
// starts as zeros. A kernel rather than cudaMemsetAsync, so that the grid pre-pass can be launched to overlap
// it: the pre-pass's blocks read A and B at once and wait for this grid (wait_for_prior_grid) only before
// their first merge, so that the zeroing and its launch gap are hidden behind those reads.
// It is the first kernel of a call that runs a pre-pass (a call of the small GEMM, or whose tiles fold their line
// ranges, is one kernel, which waits likewise before its first loads), and is itself launched to overlap whatever
// kernel came before it on the stream (a call's last kernel lets it start early: allow_dependent_grid, at the GEMMs'
// start or, where late_dependents_apply, at each block's last piece), which hides the launch gap between two calls.
// So it waits for that grid (and so for every grid still in flight before it) before it writes the workspace, which
// may be the memory of the call before, and before it lets the pre-pass start, which reads A and B at once: they
// may be the previous kernel's output.
__global__ void __launch_bounds__(kPrepassThreads) zero_workspace_kernel(int* workspace, std::int64_t count) {
  wait_for_prior_grid();
  allow_dependent_grid();
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * kPrepassThreads;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kPrepassThreads + threadIdx.x; i < count;
       i += stride) {
    workspace[i] = 0;
  }
}

inline void launch_zero_workspace(int* workspace, std::int64_t count, int sm_count, bool overlap, cudaStream_t stream) {
  const std::int64_t blocks =
      std::min<std::int64_t>((count + kPrepassThreads - 1) / kPrepassThreads, std::int64_t{sm_count} * 4);
  launch_kernel(zero_workspace_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kPrepassThreads), 0, stream,
                overlap, workspace, count);
}

// The whole pre-pass of a call in one launch (each kernel boundary costs a few microseconds, which small
// problems feel): blocks [0, blocks[0]) take A's rows, the next blocks[1] B's columns, the rest zero the
// output when K is split (the GEMM adds its partial sums into it). Batch entries beyond the grid's z
// extent are taken in a grid-stride loop.
struct PrepassArgs {
  LinesArgs lines[2];          // A's rows, B's columns
  std::int64_t blocks[2];      // blocks per operand (0: none)
  std::int64_t line_blocks[2];  // strided lines: blocks across the lines (the rest of blocks[i] along them)
  float* zero;                 // the output to zero, or null
  std::int64_t zero_count;     // floats to zero: whole entries of zero_entry floats each,
  std::int64_t zero_entry;     // zero_entry_stride floats apart (a batch residue class's entries are
  std::int64_t zero_entry_stride;  // 4 entries apart: split_batch_reads_in_place)
};

// Block `block` of the blocks that one operand's lines take (line_blocks: see PrepassArgs).
__device__ void operand_line_ranges(const LinesArgs& lines, std::int64_t block, std::int64_t blocks,
                                    std::int64_t line_blocks) {
  for (std::int64_t z = blockIdx.z; z < lines.num_batches; z += gridDim.z) {
    const float* base = batch_base(lines, z);
    if (lines.elem_stride == 1) {
      const std::int64_t task = block * (kPrepassThreads / 32) + threadIdx.x / 32;
      if (lines.lines_per_warp == 4) {
        contiguous_line_ranges<4, 8>(lines, base, task, z);
      } else {
        contiguous_line_ranges<1, 16>(lines, base, task, z);
      }
    } else if (lines.vec4) {
      strided_line_tile_ranges(lines, base, block % line_blocks, block / line_blocks, blocks / line_blocks, z);
    } else {
      strided_line_ranges(lines, base, block % line_blocks * kPrepassThreads + threadIdx.x, block / line_blocks,
                          blocks / line_blocks, z);
    }
  }
}

__global__ void __launch_bounds__(kPrepassThreads) prepass_kernel(PrepassArgs args) {
  allow_dependent_grid();
  std::int64_t block = blockIdx.x;
  if (block < args.blocks[0]) return operand_line_ranges(args.lines[0], block, args.blocks[0], args.line_blocks[0]);
  block -= args.blocks[0];
  if (block < args.blocks[1]) return operand_line_ranges(args.lines[1], block, args.blocks[1], args.line_blocks[1]);
  block -= args.blocks[1];
  // Zeroing: the remaining blocks of every z slice, grid-stride.
  const std::int64_t zero_blocks = gridDim.x - args.blocks[0] - args.blocks[1];
  const std::int64_t stride = zero_blocks * gridDim.z * kPrepassThreads;
  const std::int64_t first = (blockIdx.z * zero_blocks + block) * kPrepassThreads + threadIdx.x;
  if (args.zero_entry_stride == args.zero_entry) {  // consecutive entries: one range
    for (std::int64_t e = first; e < args.zero_count; e += stride) args.zero[e] = 0.0f;
    return;
  }
  for (std::int64_t e = first; e < args.zero_count; e += stride) {
    const std::int64_t entry = e / args.zero_entry;
    args.zero[entry * args.zero_entry_stride + (e - entry * args.zero_entry)] = 0.0f;
  }
}

// Whether the pre-pass reads strided `lines` in float4s (strided_line_tile_ranges): the same element of
// four consecutive lines must be one 16-byte aligned float4, in every batch entry.
inline bool float4_lines(const LinesArgs& lines) {
  const auto multiple_of_4 = [](std::int64_t v) { return v % 4 == 0; };
  if (lines.elem_stride == 1 || lines.line_stride != 1 || !multiple_of_4(lines.lines) ||
      !multiple_of_4(lines.elem_stride) || reinterpret_cast<std::uintptr_t>(lines.base) % 16 != 0) {
    return false;
  }
  for (int d = 0; d < lines.batch.ndim; ++d) {
    if (!multiple_of_4(lines.use_b_strides ? lines.batch.b_stride[d] : lines.batch.a_stride[d])) return false;
  }
  return true;
}

// Contiguous lines per warp in the pre-pass: four where that still gives every SM 16 warps' worth of tasks
// (H200, session 22: one per warp was faster at 128 x 1024 x 4096, 128 lines).
inline int contiguous_lines_per_warp(const LinesArgs& lines, int sm_count) {
  return contiguous_tasks(lines, 4) * lines.num_batches >= std::int64_t{sm_count} * 16 ? 4 : 1;
}

// Blocks that one operand's lines take in prepass_kernel; line_blocks: see PrepassArgs.
inline std::int64_t prepass_blocks(const LinesArgs& lines, std::int64_t* line_blocks) {
  *line_blocks = 1;
  if (lines.lines == 0 || lines.length == 0) return 0;
  if (lines.elem_stride == 1) {
    const std::int64_t tasks = contiguous_tasks(lines, lines.lines_per_warp);
    return (tasks + kPrepassThreads / 32 - 1) / (kPrepassThreads / 32);
  }
  if (lines.vec4) {
    *line_blocks = (lines.lines + kTileLines - 1) / kTileLines;
    return *line_blocks * std::min((lines.length + kTileSpan - 1) / kTileSpan, kMaxGridYZ);
  }
  *line_blocks = (lines.lines + kPrepassThreads - 1) / kPrepassThreads;
  // At most 65535 blocks along the lines (the rest in strided_line_ranges' loop), as when they were a grid's
  // y extent: it bounds the grid for very long lines.
  return *line_blocks * std::min((lines.length + kChunk - 1) / kChunk, kMaxGridYZ);
}

// Launches the pre-pass: the line ranges of a and b (either may have no lines) and the zeroing of `zero`
// (`entries` entries of `entry` floats, `entry_stride` floats apart; none when null), right after
// zero_workspace_kernel, which it overlaps where `overlap`. Returns whether it launched a kernel.
inline bool launch_prepass(const LinesArgs& a, const LinesArgs& b, float* zero, std::int64_t entries,
                           std::int64_t entry, std::int64_t entry_stride, int sm_count, bool overlap,
                           cudaStream_t stream) {
  PrepassArgs args{};
  args.lines[0] = a;
  args.lines[1] = b;
  for (LinesArgs& lines : args.lines) {
    lines.vec4 = float4_lines(lines);
    lines.lines_per_warp = contiguous_lines_per_warp(lines, sm_count);
  }
  args.blocks[0] = prepass_blocks(args.lines[0], &args.line_blocks[0]);
  args.blocks[1] = prepass_blocks(args.lines[1], &args.line_blocks[1]);
  args.zero = zero;
  args.zero_count = zero == nullptr ? 0 : entries * entry;
  args.zero_entry = entry;
  args.zero_entry_stride = entry_stride;
  const std::int64_t slots = std::min(std::max(a.num_batches, b.num_batches), kMaxGridYZ);
  // Enough zeroing blocks to stream the output at full speed, a few per SM, spread over the z slices.
  const std::int64_t zero_blocks =
      args.zero_count == 0 ? 0
                           : std::max<std::int64_t>(1, std::min<std::int64_t>(
                                 (args.zero_count + 4 * kPrepassThreads - 1) / (4 * kPrepassThreads),
                                 std::int64_t{sm_count} * 8) / slots);
  const std::int64_t blocks = args.blocks[0] + args.blocks[1] + zero_blocks;
  if (blocks == 0) return false;
  TORCH_CHECK(blocks <= 0x7fffffff, "corrected_matmul: the operands have too many lines");
  launch_kernel(prepass_kernel, dim3(static_cast<unsigned>(blocks), 1, static_cast<unsigned>(slots)),
                dim3(kPrepassThreads), 0, stream, overlap, args);
  return true;
}

}  // namespace wmmae_ops
