// batched_outer on CUDA: u_b v_b^T + alpha*I, one warp per 16x16 output tile.
//
// fp16/bf16 inputs: A = u-slice in the first column (load_vector), B = v-slice in the first row,
// C = alpha*I on diagonal tiles (make_identity), one mma; every off-diagonal product is exact in fp32.
// fp32 inputs: each value is split into three bf16 terms (u = u0 + u1 + u2 exactly for normal values);
// the nine products u_a v_b^T sit in the k dimension of one m16n16k16 bf16 mma. A tile that holds an Inf
// or NaN is computed in fp32 on the CUDA cores instead (0 * Inf from a zero split term would be NaN).
// The kernel is bound by the output writes: accumulators go straight to memory with paired streaming stores.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../wmmae/wmmae.hpp"
#include "batched_outer.hpp"

namespace wmmae_ops {
namespace {

using namespace nvcuda;

constexpr int kTile = 16;
constexpr int kWarpsPerBlock = 8;
constexpr int kDepth = 1;  // tiles per warp and iteration (2 measured slower on an H200: fewer resident warps)
// The kernel is bound by its output stream: 5 resident blocks (40 warps) per SM keep more stores in flight
// (6 would cap registers at 40 and spill).
constexpr int kMinBlocksPerSm = 5;

struct OuterArgs {
  const void* u;
  const void* v;
  std::int64_t u_batch_stride, u_stride, v_batch_stride, v_stride;
  void* out;
  std::int64_t batch;
  int n;
  int tiles_per_side;
  float alpha;
};

template <class Out> __device__ Out from_float(float v);
template <> __device__ float from_float<float>(float v) { return v; }
template <> __device__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <class Out> struct Pair;
template <> struct Pair<float> { using type = float2; };
template <> struct Pair<__half> { using type = __half2; };
template <> struct Pair<__nv_bfloat16> { using type = __nv_bfloat162; };

__device__ inline void store_streaming(float2* p, float2 v) { __stcs(p, v); }
__device__ inline void store_streaming(float* p, float v) { __stcs(p, v); }
template <class T> __device__ inline void store_streaming(T* p, T v) { *p = v; }

// Writes the in-bounds part of a 16x16 accumulator tile (row-major, leading dimension ld). The accumulator
// holds pairs of adjacent columns (run == 2): they are written together when the row allows it.
template <class Out, class Acc, class Value>
__device__ __forceinline__ void store_tile(Out* tile, std::int64_t ld, int rows, int cols, bool pairs_aligned, Value value) {
  using Tr = wmmae::fragment_traits<Acc>;
  static_assert(Tr::layout.run == 2 && !Tr::layout.transposed, "store_tile expects row pairs");
  const int lane = wmmae::lane_id();
  wmmae::detail::static_for<0, Tr::layout.num_elements / 2>([&](auto pair_index) {
    constexpr int x = 2 * decltype(pair_index)::value;
    const wmmae::RowCol rc = Tr::template position<x>(lane);
    if (rc.row >= rows) return;
    Out* p = tile + rc.row * ld + rc.col;
    const Out lo = from_float<Out>(value(std::integral_constant<int, x>{}, rc.row, rc.col));
    const Out hi = from_float<Out>(value(std::integral_constant<int, x + 1>{}, rc.row, rc.col + 1));
    if (pairs_aligned && rc.col + 1 < cols) {
      typename Pair<Out>::type pair;
      pair.x = lo;
      pair.y = hi;
      store_streaming(reinterpret_cast<typename Pair<Out>::type*>(p), pair);
    } else {
      if (rc.col < cols) store_streaming(p, lo);
      if (rc.col + 1 < cols) store_streaming(p + 1, hi);
    }
  });
}

template <class In>
__device__ inline float load_float(const In* p) { return wmmae::to_float(*p); }

// Term `which` (0, 1 or 2) of the three bf16 terms of an fp32 value: v = t0 + t1 + t2 exactly for normal
// values. Selected arithmetically: a run-time index into a small array would put it in local memory.
__device__ __forceinline__ __nv_bfloat16 bf16x3_term(float v, int which) {
  const __nv_bfloat16 t0 = __float2bfloat16_rn(v);
  const float r1 = v - __bfloat162float(t0);
  const __nv_bfloat16 t1 = __float2bfloat16_rn(r1);
  const __nv_bfloat16 t2 = __float2bfloat16_rn(r1 - __bfloat162float(t1));
  return which == 0 ? t0 : (which == 1 ? t1 : t2);
}

template <class In, class Out>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, kMinBlocksPerSm) batched_outer_kernel(OuterArgs args) {
  constexpr bool kSplitFp32 = std::is_same<In, float>::value;
  using FragT = typename std::conditional<std::is_same<In, __half>::value, __half, __nv_bfloat16>::type;
  using FragA = wmma::fragment<wmma::matrix_a, kTile, kTile, kTile, FragT, wmma::row_major>;
  using FragB = wmma::fragment<wmma::matrix_b, kTile, kTile, kTile, FragT, wmma::row_major>;
  using Acc = wmma::fragment<wmma::accumulator, kTile, kTile, kTile, float>;

  const In* u = static_cast<const In*>(args.u);
  const In* v = static_cast<const In*>(args.v);
  Out* out = static_cast<Out*>(args.out);
  // Lambdas below capture locals, not `args`: capturing the kernel parameter would copy it to the stack.
  const int n = args.n, tps = args.tiles_per_side;
  const std::int64_t u_stride = args.u_stride, v_stride = args.v_stride;
  const std::int64_t u_batch_stride = args.u_batch_stride, v_batch_stride = args.v_batch_stride;
  const float alpha = args.alpha;
  const std::int64_t tiles_per_batch = static_cast<std::int64_t>(tps) * tps;
  const std::int64_t total = args.batch * tiles_per_batch;
  const bool small_grid = total < (std::int64_t{1} << 32);
  const std::int64_t warp = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const std::int64_t num_warps = static_cast<std::int64_t>(gridDim.x) * blockDim.x / 32;
  const bool pairs_aligned = n % 2 == 0 && reinterpret_cast<std::uintptr_t>(out) % (2 * sizeof(Out)) == 0;

  struct Job {
    const In* ub;
    const In* vb;
    Out* tile;
    int rows, cols;
    float diagonal;
    bool valid;
  };
  auto prepare = [&](std::int64_t t) {
    Job job{};
    job.valid = t < total;
    if (!job.valid) return job;
    // 64-bit division is a long subroutine: decode in 32 bits whenever the tile count allows.
    std::int64_t b;
    int ti, tj;
    if (small_grid) {
      const unsigned tu = static_cast<unsigned>(t), tpb = static_cast<unsigned>(tiles_per_batch);
      b = tu / tpb;
      ti = static_cast<int>((tu % tpb) / static_cast<unsigned>(tps));
      tj = static_cast<int>(tu % static_cast<unsigned>(tps));
    } else {
      b = t / tiles_per_batch;
      ti = static_cast<int>((t % tiles_per_batch) / tps);
      tj = static_cast<int>(t % tps);
    }
    job.rows = min(kTile, n - ti * kTile);
    job.cols = min(kTile, n - tj * kTile);
    job.ub = u + b * u_batch_stride + static_cast<std::int64_t>(ti) * kTile * u_stride;
    job.vb = v + b * v_batch_stride + static_cast<std::int64_t>(tj) * kTile * v_stride;
    job.tile = out + (b * n + static_cast<std::int64_t>(ti) * kTile) * n + static_cast<std::int64_t>(tj) * kTile;
    job.diagonal = ti == tj ? alpha : 0.0f;
    return job;
  };
  // Builds the operand fragments in registers: u in the first column of A, v in the first row of B
  // (fp32: the nine bf16 term pairs along k). Returns false when the tile holds an Inf or a NaN (fp32).
  auto load_operands = [&](const Job& job, FragA& a, FragB& bf) {
    if constexpr (!kSplitFp32) {
      wmmae::load_vector(a, job.ub, job.rows, 1.0f, u_stride);
      wmmae::load_vector(bf, job.vb, job.cols, 1.0f, v_stride);
      return true;
    } else {
      // Term pairs (a, b) of u_a v_b^T along k: k = 3a + b for k < 9, zero beyond.
      bool finite = true;
      wmmae::foreach_ij(a, [&](auto xs, int i, int k) {
        const float x = i < job.rows ? load_float(job.ub + i * u_stride) : 0.0f;
        finite &= isfinite(x);
        wmmae::assign(a, xs, k < 9 ? bf16x3_term(x, k / 3) : __float2bfloat16_rn(0.0f));
      });
      wmmae::foreach_ij(bf, [&](auto xs, int k, int j) {
        const float y = j < job.cols ? load_float(job.vb + j * v_stride) : 0.0f;
        finite &= isfinite(y);
        wmmae::assign(bf, xs, k < 9 ? bf16x3_term(y, k % 3) : __float2bfloat16_rn(0.0f));
      });
      return finite;
    }
  };
  auto finish = [&](const Job& job, const FragA& a, const FragB& bf, bool finite) {
    if (kSplitFp32 && __any_sync(0xffffffffu, !finite)) {
      store_tile<Out, Acc>(job.tile, n, job.rows, job.cols, pairs_aligned, [&](auto, int i, int j) {
        const float x = i < job.rows ? load_float(job.ub + i * u_stride) : 0.0f;
        const float y = j < job.cols ? load_float(job.vb + j * v_stride) : 0.0f;
        return x * y + (i == j ? job.diagonal : 0.0f);
      });
      return;
    }
    Acc c;
    wmmae::make_identity(c, job.diagonal);
    wmma::mma_sync(c, a, bf, c);
    // Full float32 tiles: store_matrix_sync (measured faster on an H200 than the paired stores: 3.4 against
    // 2.8 TB/s for n = 16); it needs a 32-byte aligned tile and a leading dimension of 4 floats' multiple.
    if constexpr (std::is_same<Out, float>::value) {
      if (job.rows == kTile && job.cols == kTile && n % 4 == 0 && reinterpret_cast<std::uintptr_t>(job.tile) % 32 == 0) {
        wmma::store_matrix_sync(job.tile, c, n, wmma::mem_row_major);
        return;
      }
    }
    store_tile<Out, Acc>(job.tile, n, job.rows, job.cols, pairs_aligned,
                         [&](auto x, int, int) { return c.x[decltype(x)::value]; });
  };

  // kDepth tiles per warp and iteration: all their loads are issued before the first store, so that a
  // warp keeps several load latencies in flight.
  for (std::int64_t t0 = warp; t0 < total; t0 += kDepth * num_warps) {
    Job jobs[kDepth];
    FragA a[kDepth];
    FragB bf[kDepth];
    bool finite[kDepth];
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      jobs[d] = prepare(t0 + d * num_warps);
      finite[d] = jobs[d].valid ? load_operands(jobs[d], a[d], bf[d]) : true;
    }
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      if (jobs[d].valid) finish(jobs[d], a[d], bf[d], finite[d]);
    }
  }
}

template <class In, class Out>
void launch(const OuterArgs& args, cudaStream_t stream) {
  const std::int64_t total_tiles = args.batch * args.tiles_per_side * args.tiles_per_side;
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  // A grid-stride loop over tiles: enough blocks to fill every SM several times over.
  const std::int64_t wanted = (total_tiles + kWarpsPerBlock * kDepth - 1) / (kWarpsPerBlock * kDepth);
  const int blocks = static_cast<int>(std::min<std::int64_t>(wanted, static_cast<std::int64_t>(sms) * 16));
  batched_outer_kernel<In, Out><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(args);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <class In>
void dispatch_out(const OuterArgs& args, at::ScalarType out_dtype, cudaStream_t stream) {
  switch (out_dtype) {
    case at::kFloat: return launch<In, float>(args, stream);
    case at::kHalf: return launch<In, __half>(args, stream);
    default: return launch<In, __nv_bfloat16>(args, stream);
  }
}

at::Tensor batched_outer_cuda(const at::Tensor& u, const std::optional<at::Tensor>& v_opt, double alpha,
                              std::optional<at::ScalarType> out_dtype) {
  const BatchedOuterArgs checked = check_batched_outer(u, v_opt, out_dtype);
  TORCH_CHECK(u.is_cuda(), "batched_outer: argument 'u' must be a CUDA tensor for the CUDA kernel");
  const c10::cuda::CUDAGuard guard(u.device());
  const std::int64_t n = u.size(-1);
  at::Tensor out = at::empty(batched_outer_shape(u), u.options().dtype(checked.out_dtype));
  if (out.numel() == 0) return out;
  TORCH_CHECK(at::cuda::getCurrentDeviceProperties()->major >= 8,
              "batched_outer: the CUDA kernel needs compute capability 8.0 or newer");
  TORCH_CHECK(n <= (1 << 30), "batched_outer: n = ", n, " is too large");
  // (batch, n) views: a view whenever the batch dimensions allow it, a copy of the (small) inputs otherwise.
  const at::Tensor u2 = u.reshape({-1, n});
  const at::Tensor v2 = checked.v.reshape({-1, n});
  OuterArgs args{u2.data_ptr(), v2.data_ptr(), u2.stride(0), u2.stride(1), v2.stride(0), v2.stride(1), out.data_ptr(),
                 u2.size(0), static_cast<int>(n), static_cast<int>((n + kTile - 1) / kTile), static_cast<float>(alpha)};
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  switch (u.scalar_type()) {
    case at::kHalf: dispatch_out<__half>(args, checked.out_dtype, stream); break;
    case at::kBFloat16: dispatch_out<__nv_bfloat16>(args, checked.out_dtype, stream); break;
    default: dispatch_out<float>(args, checked.out_dtype, stream); break;
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(wmmae, CUDA, m) { m.impl("batched_outer", &batched_outer_cuda); }

}  // namespace wmmae_ops
