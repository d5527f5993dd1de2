// The CUDA kernels of corrected_matmul's matrix-vector path (matrix_vector.hpp). A warp takes one segment of K
// (kMatVecSegmentK) of a line: lane r sums the line's k = r (mod 32), in order, then a butterfly of xor shuffles
// combines the lanes.
// - Few lines (fewer than kFewLines per batch entry, a dot product among them) and tiny products: each warp takes
//   its own (entry, line, segment), or, where K is short, 4, 8 or 16 lanes do, and reads the vector from global
//   memory, so that a long K or a batch keeps every warp busy.
// - Otherwise a block of 8 warps takes one segment of a tile of kTileLines lines, kLinesPerWarp per warp, and stages
//   the segment's vector elements in shared memory as doubles, since every line reads them. The lines' elements are
//   read straight from global memory where their k are contiguous (a row-major A of N = 1, a column-major B of M =
//   1, as the W.t() of x @ W.t()): a warp's loads are then consecutive k; otherwise (lines contiguous, or neither)
//   through shared memory: the block copies the tile with loads along its lines, which are then the consecutive
//   ones, and its warps sum it as above.
// Where K has more than one segment, the segments' sums go to a float64 workspace ([output][segment]: 8 bytes per
// KiB of the matrix) and a second kernel, a warp per output (a block per output where few outputs have many groups),
// combines them in groups of 32 and adds the groups in order; otherwise the segment's warp writes the output.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include <algorithm>
#include <cstdint>

#include "matrix_vector.hpp"

namespace wmmae_ops {
namespace {

constexpr int kWarpSize = 32;
static_assert(kMatVecLanes == kWarpSize && kMatVecGroupSegments == kWarpSize, "a lane of a warp per lane sum");
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kWarpSize;
// A staged tile is 32 lines (a warp's copies: 32 consecutive lines of one k), 4 per warp. Read directly, 2 lines per
// warp: H100, session 123, us per call (torch.matmul float32), 1, 2, 4 lines: 1 x 4096 x 4096 (B column-major) 40.3,
// 31.2, 32.0 (30.8); 16384 x 1 x 4096 134, 99.4, 98.4 (98); 1000 x 1 x 4096 16.8, 14.9, 15.4 (10.7); 1 x 1000 x
// 65536 (B column-major) 141, 103, 101 (109). (With the matrix's loads after the vector's copy instead: a line per
// warp, 48 registers, 1.7-2.0 TB/s; 4 lines, 113 registers, 1.0-1.2.)
constexpr int kStagedLinesPerWarp = kWarpSize / kWarps;
constexpr int kDirectLinesPerWarp = 2;
// The staged tile, [line][k], a line padded by one float: a warp's copies (32 lines of one k) and its reads (one
// line's 32 consecutive k) each meet every bank once.
constexpr int kStagedLineFloats = kMatVecSegmentK + 1;
constexpr int kFinishWarps = 8;
// Outputs of more than one group take a block each where there are fewer than this (a warp per output would leave
// most SMs idle): matrix_vector_finish_long_kernel.
constexpr std::int64_t kFewFinishOutputs = 1024;
// Fewer lines than this take the few-lines kernel (lanes of their own per entry, line and segment): a block of 16
// lines would leave warps idle. So do tiny products (at most 8 lines), whose tile of 32 (staged) or 16 lines (direct)
// was mostly padding: H100, session 126, us per call, tile kernel / a warp per line (torch.matmul float32): 64 x (8 x
// 8 x 512) 17.0 / 11.4 (12.0); 256 x (8 x 8 x 256) 22.6 / 12.8 (9.4); 128 x (2 x 8 x 1024) 17.1 / 11.7 (19.5); 8 x 8
// x 4096 8.6 / 7.6 (13.0).
constexpr std::int64_t kFewLines = 8;
// The few-lines kernel's grid bound: its warps loop over the rest (more blocks than SMs can hold gain nothing).
constexpr std::int64_t kMaxFewLinesBlocks = 1 << 16;

// Each of the warp's n sets of lane sums, combined in aligned groups of 2 kFirstHalf lanes (all 32 by default), the
// group's first lane's in the order of combine_lane_sums (a lane with the lane kFirstHalf above, then half as far,
// ...). The n butterflies interleave, so that their shuffles are in flight together.
template <int n, int kFirstHalf = kWarpSize / 2>
__device__ __forceinline__ void warp_butterfly_sums(double (&sums)[n]) {
#pragma unroll
  for (int half = kFirstHalf; half > 0; half /= 2) {
#pragma unroll
    for (int u = 0; u < n; ++u) sums[u] += __shfl_xor_sync(0xffffffffu, sums[u], half);
  }
}

template <int kFirstHalf = kWarpSize / 2>
__device__ __forceinline__ double warp_butterfly_sum(double sum) {
  double sums[1] = {sum};
  warp_butterfly_sums<1, kFirstHalf>(sums);
  return sums[0];
}

// Lines [line0, line0 + 8 kLinesPerWarp) of batch entry z over the block's segment; kStaged: through shared memory.
// A thread's loads of the matrix are issued before the barrier that waits for the vector's copy, so that the two
// wait together.
template <bool kStaged, int kLinesPerWarp>
__global__ void __launch_bounds__(kThreads, kStaged || kLinesPerWarp > 2 ? 3 : 4)
    matrix_vector_kernel(MatrixVectorArgs args, std::int64_t line_tiles, float* out, double* partial) {
  constexpr int kTileLines = kWarps * kLinesPerWarp;
  static_assert(!kStaged || kTileLines == kWarpSize, "a staged tile's copies: a warp per k, a lane per line");
  constexpr int kCopyRounds = kMatVecSegmentK / (kThreads / kWarpSize);  // a staged tile's copies per thread
  __shared__ double v_segment[kMatVecSegmentK];
  __shared__ float staged[kStaged ? kTileLines * kStagedLineFloats : 1];
  const std::int64_t segment = blockIdx.x / line_tiles;
  const std::int64_t line0 = (blockIdx.x % line_tiles) * kTileLines;
  const std::int64_t k0 = segment * kMatVecSegmentK;
  const int count = static_cast<int>(min(static_cast<std::int64_t>(kMatVecSegmentK), args.k - k0));
  const std::int64_t segments = matrix_vector_segments(args.k);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  for (std::int64_t z = blockIdx.z; z < args.batches; z += gridDim.z) {
    std::int64_t x_offset, v_offset;
    args.offsets(z, x_offset, v_offset);
    const float* const x = args.x + x_offset + line0 * args.x_line_stride + k0 * args.x_k_stride;
    // kStaged: element (line t % 32, k t / 32 + 8 j) of the tile, a warp's loads 32 consecutive lines of one k;
    // otherwise: element (line kLinesPerWarp warp + q, k 32 round + lane), a warp's loads 32 consecutive k of one
    // line.
    // (Pointers stepped along k: an offset per load held two registers each.)
    constexpr int kLoads = kStaged ? kCopyRounds : kLinesPerWarp * kMatVecTermsPerLane;
    float loaded[kLoads];
    if constexpr (kStaged) {
      const bool line_in = line0 + lane < args.lines;
      const float* p = x + lane * args.x_line_stride + warp * args.x_k_stride;
      const std::int64_t step = kWarps * args.x_k_stride;
#pragma unroll
      for (int j = 0; j < kCopyRounds; ++j, p += step) loaded[j] = line_in && warp + j * kWarps < count ? *p : 0.0f;
    } else {
      const std::int64_t step = kWarpSize * args.x_k_stride;
#pragma unroll
      for (int q = 0; q < kLinesPerWarp; ++q) {
        const int l = warp * kLinesPerWarp + q;
        const float* p = x + l * args.x_line_stride + lane * args.x_k_stride;
#pragma unroll
        for (int round = 0; round < kMatVecTermsPerLane; ++round, p += step) {
          loaded[q * kMatVecTermsPerLane + round] =
              line0 + l < args.lines && round * kWarpSize + lane < count ? *p : 0.0f;
        }
      }
    }
    __syncthreads();  // (the previous entry's tile and vector have been read)
    for (int i = threadIdx.x; i < count; i += kThreads) {
      v_segment[i] = static_cast<double>(args.v[v_offset + (k0 + i) * args.v_k_stride]);
    }
    if constexpr (kStaged) {
#pragma unroll
      for (int j = 0; j < kCopyRounds; ++j) staged[lane * kStagedLineFloats + warp + j * kWarps] = loaded[j];
    }
    __syncthreads();
#pragma unroll
    for (int q = 0; q < kLinesPerWarp; ++q) {
      const int l = warp * kLinesPerWarp + q;
      if (line0 + l >= args.lines) break;  // (the whole warp, and its later lines too)
      double sum = 0.0;
#pragma unroll
      for (int round = 0; round < kMatVecTermsPerLane; ++round) {
        const int i = round * kWarpSize + lane;
        const float value = kStaged ? staged[l * kStagedLineFloats + i] : loaded[q * kMatVecTermsPerLane + round];
        if (i < count) sum += static_cast<double>(value) * v_segment[i];
      }
      const double segment_sum = warp_butterfly_sum(sum);
      const std::int64_t o = z * args.lines + line0 + l;
      if (lane == 0 && partial == nullptr) out[o] = static_cast<float>(segment_sum);
      if (lane == 0 && partial != nullptr) partial[o * segments + segment] = segment_sum;
    }
  }
}

// kItemLanes lanes per (batch entry, line, segment), an item, numbered as the workspace's [output][segment] (output
// z * lines + line), the matrix's and the vector's elements read straight from global memory. Lane t of an item holds
// the lane sums r = t + kItemLanes u (mod 32) of matrix_vector.hpp's order, reads k = t + kItemLanes j, j < 8, and
// combines its own sums as the butterfly's first levels would, so every kItemLanes gives the same bits; fewer than
// 32 lanes serve only a K of at most 8 kItemLanes (one segment), where a warp per item would idle most lanes.
template <int kItemLanes>
__global__ void __launch_bounds__(kThreads)
    matrix_vector_few_lines_kernel(MatrixVectorArgs args, std::int64_t segments, float* out, double* partial) {
  constexpr int kSumsPerLane = kWarpSize / kItemLanes, kItemsPerWarp = kWarpSize / kItemLanes;
  constexpr bool kOneSegment = kItemLanes < kWarpSize;
  const int t = threadIdx.x % kItemLanes, item_of_warp = threadIdx.x % kWarpSize / kItemLanes;
  const std::int64_t items = args.batches * args.lines * segments;
  const std::int64_t warp_items = static_cast<std::int64_t>(gridDim.x) * kWarps * kItemsPerWarp;
  // (A warp's lanes stay together until its last items, for the shuffles: an item past the end is masked, not left.)
  for (std::int64_t item0 = (static_cast<std::int64_t>(blockIdx.x) * kWarps + threadIdx.x / kWarpSize) * kItemsPerWarp;
       item0 < items; item0 += warp_items) {
    const std::int64_t item = item0 + item_of_warp;
    const bool item_in = item < items;
    const std::int64_t segment = kOneSegment ? 0 : item % segments, o = kOneSegment ? item : item / segments;
    const std::int64_t z = o / args.lines, line = o % args.lines;
    const std::int64_t k0 = segment * kMatVecSegmentK;
    const int count = item_in ? static_cast<int>(min(static_cast<std::int64_t>(kMatVecSegmentK), args.k - k0)) : 0;
    std::int64_t x_offset = 0, v_offset = 0;
    if (item_in) args.offsets(z, x_offset, v_offset);
    const float* x = args.x + x_offset + line * args.x_line_stride + (k0 + t) * args.x_k_stride;
    const float* v = args.v + v_offset + (k0 + t) * args.v_k_stride;
    const std::int64_t x_step = kItemLanes * args.x_k_stride, v_step = kItemLanes * args.v_k_stride;
    float xs[kMatVecTermsPerLane], vs[kMatVecTermsPerLane];
#pragma unroll
    for (int j = 0; j < kMatVecTermsPerLane; ++j, x += x_step, v += v_step) {
      const bool in = j * kItemLanes + t < count;
      xs[j] = in ? *x : 0.0f;
      vs[j] = in ? *v : 0.0f;
    }
    // sums[u]: lane sum t + kItemLanes u, its k in order (j = u, u + kSumsPerLane, ...)
    double sums[kSumsPerLane] = {};
#pragma unroll
    for (int j = 0; j < kMatVecTermsPerLane; ++j) {
      if (j * kItemLanes + t < count) sums[j % kSumsPerLane] += static_cast<double>(xs[j]) * static_cast<double>(vs[j]);
    }
    const double segment_sum = warp_butterfly_sum<kItemLanes / 2>(combine_lane_sums(sums));
    if (item_in && t == 0 && partial == nullptr) out[o] = static_cast<float>(segment_sum);
    if (item_in && t == 0 && partial != nullptr) partial[item] = segment_sum;
  }
}

// A warp per output: its segments' sums combined in groups of 32 (lane j: the group's segment j), the groups' sums
// added in order, rounded once.
__global__ void __launch_bounds__(kFinishWarps * kWarpSize)
    matrix_vector_finish_kernel(const double* partial, std::int64_t outputs, std::int64_t segments, float* out) {
  const std::int64_t o = static_cast<std::int64_t>(blockIdx.x) * kFinishWarps + threadIdx.x / kWarpSize;
  if (o >= outputs) return;  // (the whole warp)
  const int lane = threadIdx.x % kWarpSize;
  const double* const sums = partial + o * segments;
  double total = 0.0;
  for (std::int64_t g0 = 0; g0 < segments; g0 += kWarpSize) {
    const std::int64_t s = g0 + lane;
    const double group_sum = warp_butterfly_sum(s < segments ? sums[s] : 0.0);
    total = g0 == 0 ? group_sum : total + group_sum;
  }
  if (lane == 0) out[o] = static_cast<float>(total);
}

// The same sums for few outputs of many groups (a dot product of 2^20: one output, 128 groups), where a warp per
// output waits for one group's loads and shuffles after another. A block per output: per pass its warps combine
// kFinishPassGroups groups, kFinishGroupsPerWarp each with their loads in flight together, into shared memory, and
// one thread adds them to the total in order. (H100, session 124, that dot product's finish: a warp 12.8 us, or
// 21.7 with 8 groups' shuffles interleaved; this kernel 3.3 us, as long as the segments' sums.)
constexpr int kFinishGroupsPerWarp = 8;
constexpr int kFinishPassGroups = kFinishWarps * kFinishGroupsPerWarp;
__global__ void __launch_bounds__(kFinishWarps * kWarpSize)
    matrix_vector_finish_long_kernel(const double* partial, std::int64_t segments, float* out) {
  __shared__ double pass_sums[kFinishPassGroups];
  const std::int64_t o = blockIdx.x;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const double* const sums = partial + o * segments;
  const std::int64_t groups = matrix_vector_groups(segments);
  double total = 0.0;
  for (std::int64_t pass0 = 0; pass0 < groups; pass0 += kFinishPassGroups) {
    double group_sum[kFinishGroupsPerWarp];
#pragma unroll
    for (int u = 0; u < kFinishGroupsPerWarp; ++u) {
      const std::int64_t s = (pass0 + warp * kFinishGroupsPerWarp + u) * kWarpSize + lane;
      group_sum[u] = s < segments ? sums[s] : 0.0;  // (a missing group's sum is +0, and unused)
    }
    warp_butterfly_sums(group_sum);
    if (lane == 0) {
#pragma unroll
      for (int u = 0; u < kFinishGroupsPerWarp; ++u) pass_sums[warp * kFinishGroupsPerWarp + u] = group_sum[u];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      const int pass_groups = static_cast<int>(min(static_cast<std::int64_t>(kFinishPassGroups), groups - pass0));
      for (int i = 0; i < pass_groups; ++i) total = pass0 + i == 0 ? pass_sums[i] : total + pass_sums[i];
    }
    __syncthreads();  // (pass_sums read before the next pass writes it)
  }
  if (threadIdx.x == 0) out[o] = static_cast<float>(total);
}

std::int64_t ceil_div(std::int64_t items, std::int64_t per) { return (items + per - 1) / per; }

// Whether an item's lanes cover its K: a warp per item any K, segment by segment; fewer lanes, whose kernel takes one
// segment, a K their 8 loads each reach.
bool item_lanes_cover(int item_lanes, std::int64_t k) {
  return item_lanes == kWarpSize || k <= item_lanes * kMatVecTermsPerLane;
}

template <int kItemLanes>
void launch_few_lines_kernel_with(const MatrixVectorArgs& args, std::int64_t segments, float* out, double* partial,
                                  cudaStream_t stream) {
  // (A K the lanes do not cover would be cut short.)
  TORCH_INTERNAL_ASSERT(item_lanes_cover(kItemLanes, args.k), "matrix_vector_cuda: ", kItemLanes,
                        " lanes per item for K = ", args.k);
  const std::int64_t items = args.batches * args.lines * segments;
  const std::int64_t blocks = std::min(ceil_div(items, kWarps * (kWarpSize / kItemLanes)), kMaxFewLinesBlocks);
  matrix_vector_few_lines_kernel<kItemLanes><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      args, segments, out, partial);
}

// The fewest lanes per item whose 8 loads each cover K. H100, session 127, us per call, 32 lanes / the fewest
// (torch.matmul float32): 1024 x (8 x 8 x 64) 34.6 / 11.7 (7.8); 8192 x (2 x 3 x 17) 26.8 / 7.3 (28.1); 512 x (4 x 4
// x 100) 8.4 / 6.2 (9.5); 2048 x (1 x 4 x 128) 8.0 / 5.9 (6.5); where a warp per item would idle most of its lanes,
// and each item has its own 64-bit index arithmetic.
void launch_few_lines_kernel(const MatrixVectorArgs& args, std::int64_t segments, float* out, double* partial,
                             cudaStream_t stream) {
  if (item_lanes_cover(4, args.k)) {
    launch_few_lines_kernel_with<4>(args, segments, out, partial, stream);
  } else if (item_lanes_cover(8, args.k)) {
    launch_few_lines_kernel_with<8>(args, segments, out, partial, stream);
  } else if (item_lanes_cover(16, args.k)) {
    launch_few_lines_kernel_with<16>(args, segments, out, partial, stream);
  } else {
    launch_few_lines_kernel_with<kWarpSize>(args, segments, out, partial, stream);
  }
}

}  // namespace

void matrix_vector_cuda(const MatmulPlan& plan, const at::Tensor& out) {
  const MatrixVectorArgs args = matrix_vector_args(plan);
  const std::int64_t segments = matrix_vector_segments(args.k);
  const std::int64_t outputs = args.batches * args.lines;
  TORCH_INTERNAL_ASSERT(out.is_contiguous() && out.numel() == outputs && args.k > 0, "matrix_vector_cuda: ",
                        out.numel(), " outputs for ", outputs, ", K = ", args.k);
  at::Tensor workspace;  // (through PyTorch's caching allocator)
  double* partial = nullptr;
  if (segments > 1) {
    workspace = at::empty({outputs * segments}, out.options().dtype(at::kDouble));
    partial = workspace.data_ptr<double>();
  }
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  float* const out_ptr = out.data_ptr<float>();
  if (args.lines < kFewLines || args.rows > 1) {
    launch_few_lines_kernel(args, segments, out_ptr, partial, stream);
  } else {
    const bool direct = args.k > 1 && args.x_k_stride == 1;
    const int lines_per_warp = direct ? kDirectLinesPerWarp : kStagedLinesPerWarp;
    const std::int64_t line_tiles = ceil_div(args.lines, kWarps * lines_per_warp);
    const std::int64_t blocks = line_tiles * segments;
    TORCH_CHECK(blocks <= 0x7fffffff, "corrected_matmul: a matrix-vector product of ", args.lines, " lines of K = ",
                args.k, " needs more blocks than a CUDA grid holds");
    const dim3 grid(static_cast<unsigned>(blocks), 1, static_cast<unsigned>(std::min(args.batches, kMaxGridYZ)));
    if (direct) {
      matrix_vector_kernel<false, kDirectLinesPerWarp>
          <<<grid, kThreads, 0, stream>>>(args, line_tiles, out_ptr, partial);
    } else {
      matrix_vector_kernel<true, kStagedLinesPerWarp>
          <<<grid, kThreads, 0, stream>>>(args, line_tiles, out_ptr, partial);
    }
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (partial != nullptr) {
    if (outputs < kFewFinishOutputs && matrix_vector_groups(segments) > 1) {
      matrix_vector_finish_long_kernel<<<static_cast<unsigned>(outputs), kFinishWarps * kWarpSize, 0, stream>>>(
          partial, segments, out_ptr);
    } else {
      const std::int64_t finish_blocks = ceil_div(outputs, kFinishWarps);
      TORCH_CHECK(finish_blocks <= 0x7fffffff, "corrected_matmul: too many outputs (", outputs, ")");
      matrix_vector_finish_kernel<<<static_cast<unsigned>(finish_blocks), kFinishWarps * kWarpSize, 0, stream>>>(
          partial, outputs, segments, out_ptr);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

}  // namespace wmmae_ops
