// corrected_matmul on CUDA: fp32 GEMM on tensor cores with Ootomo & Yokota's error correction.
//
// 1. (fp16 and auto) A pre-pass finds, for every row of A and column of B, the exponent range of its
//    elements (atomics into a small workspace: 3 ints per row/column, no copy of A or B).
// 2. GEMM: 128x128 output tiles, 8 warps of 64x32. A and B are read in place (row- or column-major views,
//    batch strides, any alignment) into registers one k-step ahead; each value is scaled by its row's /
//    column's power of two and split into hi and residual with wmmae::split_fp16 / split_tf32 while it
//    goes to shared memory (no stored hi/lo copies in global memory). Per k-step three mma's: hi*hi into a
//    zero accumulator that is added to the fp32 result outside the tensor core (round to nearest), and
//    lo*hi + hi*lo chained in a correction accumulator.
// 3. "auto": both kernels are launched; a 128x128 tile is computed by the fp16 kernel when all its rows of
//    A and columns of B are fp16-safe (corrected_matmul_scheme.hpp) and by the tf32 kernel otherwise. The
//    decision is made on the device, so the op never synchronizes the host and can be graph-captured.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../wmmae/wmmae.hpp"
#include "corrected_matmul_scheme.hpp"
#include "matmul_plan.hpp"

namespace wmmae_ops {
namespace {

using namespace nvcuda;

constexpr int kBlockM = 128, kBlockN = 128;
constexpr int kWarpsM = 2, kWarpsN = 4, kThreads = kWarpsM * kWarpsN * 32;
constexpr int kWarpTileM = kBlockM / kWarpsM, kWarpTileN = kBlockN / kWarpsN;  // 64 x 32
constexpr int kFragsM = kWarpTileM / 16, kFragsN = kWarpTileN / 16;              // 4 x 2
constexpr int kGroupM = 8;  // consecutive blocks walk down 8 tile rows first: better L2 reuse of B

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

// The workspace of the pre-pass: per row of A / column of B (and batch index), in three int arrays.
struct RangeArrays {
  int* max_exp;
  int* min_exp;
  int* nonfinite;
};

__device__ inline ExponentRange load_range(const RangeArrays& r, std::int64_t i) {
  return ExponentRange{r.max_exp[i], r.min_exp[i], r.nonfinite[i] != 0};
}

struct GemmArgs {
  const float* a;
  const float* b;
  float* c;
  std::int64_t m, n, k;
  std::int64_t a_rs, a_ks;  // A element (i, kk) at a[i * a_rs + kk * a_ks]
  std::int64_t b_ks, b_cs;  // B element (kk, j) at b[kk * b_ks + j * b_cs]
  BatchStrides batch;
  std::int64_t num_batches;
  RangeArrays a_ranges, b_ranges;  // [num_batches][m] and [num_batches][n]; unused for method tf32
  Method method;                   // fp16 / tf32: every tile; automatic: the tiles this kernel owns
};

// ------------------------------------------------------------------------------------------------------
// Pre-pass: exponent ranges of the lines (rows of A, columns of B) of a strided matrix.
// ------------------------------------------------------------------------------------------------------
struct LinesArgs {
  const float* base;
  std::int64_t lines, length;            // lines x length elements per batch index
  std::int64_t line_stride, elem_stride;
  BatchStrides batch;
  bool use_b_strides;                    // which operand's batch strides apply
  RangeArrays out;                       // [num_batches][lines]
};

constexpr int kChunk = 256;  // elements of one line reduced by one thread (strided lines)

__device__ inline void merge_into(const RangeArrays& out, std::int64_t idx, const ExponentRange& r) {
  if (r.max_exp != kNoExponent) {
    atomicMax(out.max_exp + idx, r.max_exp);
    atomicMin(out.min_exp + idx, r.min_exp);
  }
  if (r.nonfinite) atomicOr(out.nonfinite + idx, 1);
}

__device__ inline ExponentRange warp_merge(ExponentRange r) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    r.max_exp = max(r.max_exp, __shfl_xor_sync(0xffffffffu, r.max_exp, off));
    r.min_exp = min(r.min_exp, __shfl_xor_sync(0xffffffffu, r.min_exp, off));
    r.nonfinite = __any_sync(0xffffffffu, r.nonfinite);
  }
  return r;
}

// Lines contiguous in memory (elem_stride == 1): a warp reduces kChunk * 32 / 8 elements of one line.
__global__ void line_ranges_contiguous_kernel(LinesArgs args) {
  constexpr int kWarpSpan = 1024;
  const std::int64_t z = blockIdx.z;
  std::int64_t a_off, b_off;
  batch_offsets(args.batch, z, a_off, b_off);
  const float* base = args.base + (args.use_b_strides ? b_off : a_off);
  const std::int64_t chunks = (args.length + kWarpSpan - 1) / kWarpSpan;
  const std::int64_t task = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (task >= args.lines * chunks) return;
  const std::int64_t line = task / chunks, chunk = task % chunks;
  const float* p = base + line * args.line_stride;
  ExponentRange r = empty_exponent_range();
  const std::int64_t end = min(args.length, (chunk + 1) * kWarpSpan);
  for (std::int64_t e = chunk * kWarpSpan + (threadIdx.x % 32); e < end; e += 32) include_value(r, p[e]);
  r = warp_merge(r);
  if (threadIdx.x % 32 == 0) merge_into(args.out, z * args.lines + line, r);
}

// Strided lines: consecutive threads take consecutive lines (coalesced when line_stride == 1).
__global__ void line_ranges_strided_kernel(LinesArgs args) {
  const std::int64_t z = blockIdx.z;
  std::int64_t a_off, b_off;
  batch_offsets(args.batch, z, a_off, b_off);
  const float* base = args.base + (args.use_b_strides ? b_off : a_off);
  const std::int64_t line = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (line >= args.lines) return;
  const std::int64_t begin = static_cast<std::int64_t>(blockIdx.y) * kChunk;
  const std::int64_t end = min(args.length, begin + kChunk);
  ExponentRange r = empty_exponent_range();
  for (std::int64_t e = begin; e < end; ++e) include_value(r, base[line * args.line_stride + e * args.elem_stride]);
  merge_into(args.out, z * args.lines + line, r);
}

void launch_line_ranges(const LinesArgs& args, std::int64_t num_batches, cudaStream_t stream) {
  if (args.lines == 0 || args.length == 0) return;
  const unsigned z = static_cast<unsigned>(num_batches);
  if (args.elem_stride == 1) {
    const std::int64_t tasks = args.lines * ((args.length + 1023) / 1024);
    const dim3 grid(static_cast<unsigned>((tasks + 7) / 8), 1, z);
    line_ranges_contiguous_kernel<<<grid, 256, 0, stream>>>(args);
  } else {
    const dim3 grid(static_cast<unsigned>((args.lines + 255) / 256),
                    static_cast<unsigned>((args.length + kChunk - 1) / kChunk), z);
    line_ranges_strided_kernel<<<grid, 256, 0, stream>>>(args);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// ------------------------------------------------------------------------------------------------------
// GEMM
// ------------------------------------------------------------------------------------------------------

// One k-step of an operand tile in registers: kRows x kStep (A) or kStep x kCols (B) values, 8 per thread,
// read along the operand's contiguous dimension.
template <int kOuter, int kInner>
struct TileRegs {
  static constexpr int kPerThread = kOuter * kInner / kThreads;
  float v[kPerThread];
};

// Loads the tile (outer, inner) at [o0, o0 + kOuter) x [i0, i0 + kInner) of a matrix whose inner dimension
// has stride inner_stride and outer dimension outer_stride; out-of-range elements read as 0.
template <int kOuter, int kInner>
__device__ inline void load_tile(TileRegs<kOuter, kInner>& regs, const float* base, std::int64_t outer_stride,
                                 std::int64_t inner_stride, std::int64_t outer_extent, std::int64_t inner_extent,
                                 std::int64_t o0, std::int64_t i0, bool vec4) {
  constexpr int kPer = TileRegs<kOuter, kInner>::kPerThread;
  constexpr int kThreadsPerLine = kInner / kPer;
  const int t = threadIdx.x;
  const std::int64_t o = o0 + t / kThreadsPerLine;
  const std::int64_t i = i0 + (t % kThreadsPerLine) * kPer;
  const float* p = base + o * outer_stride + i * inner_stride;
  if (vec4 && o < outer_extent && i + kPer <= inner_extent) {
#pragma unroll
    for (int q = 0; q < kPer / 4; ++q) {
      const float4 f = __ldg(reinterpret_cast<const float4*>(p) + q);
      regs.v[4 * q] = f.x;
      regs.v[4 * q + 1] = f.y;
      regs.v[4 * q + 2] = f.z;
      regs.v[4 * q + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int q = 0; q < kPer; ++q) {
      regs.v[q] = (o < outer_extent && i + q < inner_extent) ? __ldg(p + q * inner_stride) : 0.0f;
    }
  }
}

template <Method M>
struct SharedTiles {
  using T = MethodTraits<M>;
  using S = typename T::Smem;
  static constexpr int kLdA = T::kStep + T::kPad;  // A stored row-major [kBlockM][kStep]
  static constexpr int kLdB = kBlockN + T::kPad;   // B stored row-major [kStep][kBlockN]
  S a_hi[2][kBlockM * kLdA];
  S a_lo[2][kBlockM * kLdA];
  S b_hi[2][T::kStep * kLdB];
  S b_lo[2][T::kStep * kLdB];
  float a_scale[kBlockM];  // 2^shift per row of A / column of B (fp16); 1 for tf32
  float b_scale[kBlockN];
  int a_shift[kBlockM];
  int b_shift[kBlockN];
};

template <Method M>
__device__ inline void split_store(typename MethodTraits<M>::Smem* hi, typename MethodTraits<M>::Smem* lo, int idx,
                                   float v, float scale) {
  if constexpr (M == Method::fp16) {
    __half h, l;
    wmmae::split_fp16<wmmae::DeviceHalfRounding>(v * scale, h, l);
    hi[idx] = h;
    lo[idx] = l;
  } else {
    const wmmae::Tf32Split s = wmmae::split_tf32(v);
    hi[idx] = s.hi;
    lo[idx] = s.lo;
  }
}

template <Method M, bool kARowMajor, bool kBRowMajor>
__global__ void __launch_bounds__(kThreads) corrected_gemm_kernel(GemmArgs args) {
  using T = MethodTraits<M>;
  constexpr int kStep = T::kStep;
  using Smem = SharedTiles<M>;
  using FragA = wmma::fragment<wmma::matrix_a, 16, 16, kStep, typename T::FragT, wmma::row_major>;
  using FragB = wmma::fragment<wmma::matrix_b, 16, 16, kStep, typename T::FragT, wmma::row_major>;
  using Acc = wmma::fragment<wmma::accumulator, 16, 16, kStep, float>;
  // A tile in registers: outer/inner along A's contiguous dimension.
  using ARegs = typename std::conditional<kARowMajor, TileRegs<kBlockM, kStep>, TileRegs<kStep, kBlockM>>::type;
  using BRegs = typename std::conditional<kBRowMajor, TileRegs<kStep, kBlockN>, TileRegs<kBlockN, kStep>>::type;

  __shared__ __align__(128) Smem smem;

  // Tile order: groups of kGroupM tile rows, column by column inside a group.
  const std::int64_t tiles_m = (args.m + kBlockM - 1) / kBlockM, tiles_n = (args.n + kBlockN - 1) / kBlockN;
  const std::int64_t tile = blockIdx.x;
  const std::int64_t group = tile / (kGroupM * tiles_n);
  const std::int64_t first_m = group * kGroupM;
  const std::int64_t group_rows = min(static_cast<std::int64_t>(kGroupM), tiles_m - first_m);
  const std::int64_t tm = first_m + (tile % (kGroupM * tiles_n)) % group_rows;
  const std::int64_t tn = (tile % (kGroupM * tiles_n)) / group_rows;
  const std::int64_t m0 = tm * kBlockM, n0 = tn * kBlockN;

  for (std::int64_t z = blockIdx.z; z < args.num_batches; z += gridDim.z) {
    std::int64_t a_off, b_off;
    batch_offsets(args.batch, z, a_off, b_off);
    const float* a = args.a + a_off;
    const float* b = args.b + b_off;

    // Scales, and in auto mode whether this kernel owns the tile.
    bool tile_fp16_safe = true;
    for (int r = threadIdx.x; r < kBlockM + kBlockN; r += kThreads) {
      const bool is_a = r < kBlockM;
      const std::int64_t line = is_a ? m0 + r : n0 + (r - kBlockM);
      int shift = 0;
      if (M == Method::fp16 && line < (is_a ? args.m : args.n)) {
        const ExponentRange range =
            load_range(is_a ? args.a_ranges : args.b_ranges, z * (is_a ? args.m : args.n) + line);
        shift = fp16_shift(range);
        tile_fp16_safe &= fp16_safe(range);
      }
      if (is_a) {
        smem.a_shift[r] = shift;
        smem.a_scale[r] = ldexpf(1.0f, shift);
      } else {
        smem.b_shift[r - kBlockM] = shift;
        smem.b_scale[r - kBlockM] = ldexpf(1.0f, shift);
      }
    }
    if (M == Method::tf32 && args.method == Method::automatic) {
      // The tf32 kernel owns the tiles that the fp16 kernel does not.
      for (int r = threadIdx.x; r < kBlockM + kBlockN; r += kThreads) {
        const bool is_a = r < kBlockM;
        const std::int64_t line = is_a ? m0 + r : n0 + (r - kBlockM);
        if (line < (is_a ? args.m : args.n)) {
          tile_fp16_safe &= fp16_safe(load_range(is_a ? args.a_ranges : args.b_ranges,
                                                 z * (is_a ? args.m : args.n) + line));
        }
      }
    }
    const bool all_safe = __syncthreads_and(tile_fp16_safe);
    if (args.method == Method::automatic && all_safe != (M == Method::fp16)) continue;

    const int warp = threadIdx.x / 32;
    const int wm = warp / kWarpsN, wn = warp % kWarpsN;
    Acc main_acc[kFragsM][kFragsN], corr_acc[kFragsM][kFragsN];
#pragma unroll
    for (int i = 0; i < kFragsM; ++i) {
#pragma unroll
      for (int j = 0; j < kFragsN; ++j) {
        wmma::fill_fragment(main_acc[i][j], 0.0f);
        wmma::fill_fragment(corr_acc[i][j], 0.0f);
      }
    }

    const bool a_vec4 = (kARowMajor ? args.a_ks == 1 && args.a_rs % 4 == 0 : args.a_rs == 1 && args.a_ks % 4 == 0) &&
                        reinterpret_cast<std::uintptr_t>(a) % 16 == 0;
    const bool b_vec4 = (kBRowMajor ? args.b_cs == 1 && args.b_ks % 4 == 0 : args.b_ks == 1 && args.b_cs % 4 == 0) &&
                        reinterpret_cast<std::uintptr_t>(b) % 16 == 0;
    ARegs a_regs;
    BRegs b_regs;
    auto load_k_step = [&](std::int64_t k0) {
      if constexpr (kARowMajor) load_tile(a_regs, a, args.a_rs, args.a_ks, args.m, args.k, m0, k0, a_vec4);
      else load_tile(a_regs, a, args.a_ks, args.a_rs, args.k, args.m, k0, m0, a_vec4);
      if constexpr (kBRowMajor) load_tile(b_regs, b, args.b_ks, args.b_cs, args.k, args.n, k0, n0, b_vec4);
      else load_tile(b_regs, b, args.b_cs, args.b_ks, args.n, args.k, n0, k0, b_vec4);
    };
    // Scale, split and store one k-step into buffer `buf` ([m][k] for A, [k][n] for B).
    auto stage_k_step = [&](int buf) {
      constexpr int kPerA = ARegs::kPerThread, kPerB = BRegs::kPerThread;
      {
        constexpr int kInner = kARowMajor ? kStep : kBlockM;
        const int o = threadIdx.x / (kInner / kPerA), i = (threadIdx.x % (kInner / kPerA)) * kPerA;
#pragma unroll
        for (int q = 0; q < kPerA; ++q) {
          const int row = kARowMajor ? o : i + q, kk = kARowMajor ? i + q : o;
          split_store<M>(smem.a_hi[buf], smem.a_lo[buf], row * Smem::kLdA + kk, a_regs.v[q], smem.a_scale[row]);
        }
      }
      {
        constexpr int kInner = kBRowMajor ? kBlockN : kStep;
        const int o = threadIdx.x / (kInner / kPerB), i = (threadIdx.x % (kInner / kPerB)) * kPerB;
#pragma unroll
        for (int q = 0; q < kPerB; ++q) {
          const int col = kBRowMajor ? i + q : o, kk = kBRowMajor ? o : i + q;
          split_store<M>(smem.b_hi[buf], smem.b_lo[buf], kk * Smem::kLdB + col, b_regs.v[q], smem.b_scale[col]);
        }
      }
    };

    const std::int64_t k_steps = (args.k + kStep - 1) / kStep;
    if (k_steps > 0) {
      load_k_step(0);
      stage_k_step(0);
    }
    __syncthreads();
    for (std::int64_t ks = 0; ks < k_steps; ++ks) {
      const int buf = static_cast<int>(ks & 1);
      if (ks + 1 < k_steps) load_k_step((ks + 1) * kStep);

      FragB b_hi[kFragsN], b_lo[kFragsN];
#pragma unroll
      for (int j = 0; j < kFragsN; ++j) {
        const int col = wn * kWarpTileN + j * 16;
        wmma::load_matrix_sync(b_hi[j], smem.b_hi[buf] + col, Smem::kLdB);
        wmma::load_matrix_sync(b_lo[j], smem.b_lo[buf] + col, Smem::kLdB);
      }
#pragma unroll
      for (int i = 0; i < kFragsM; ++i) {
        FragA a_hi, a_lo;
        const int row = wm * kWarpTileM + i * 16;
        wmma::load_matrix_sync(a_hi, smem.a_hi[buf] + row * Smem::kLdA, Smem::kLdA);
        wmma::load_matrix_sync(a_lo, smem.a_lo[buf] + row * Smem::kLdA, Smem::kLdA);
#pragma unroll
        for (int j = 0; j < kFragsN; ++j) {
          Acc hh;
          wmma::fill_fragment(hh, 0.0f);
          wmma::mma_sync(hh, a_hi, b_hi[j], hh);
#pragma unroll
          for (int x = 0; x < Acc::num_elements; ++x) main_acc[i][j].x[x] += hh.x[x];
          wmma::mma_sync(corr_acc[i][j], a_lo, b_hi[j], corr_acc[i][j]);
          wmma::mma_sync(corr_acc[i][j], a_hi, b_lo[j], corr_acc[i][j]);
        }
      }
      if (ks + 1 < k_steps) stage_k_step(buf ^ 1);
      __syncthreads();
    }

    // Epilogue: combine, undo the scaling, store the in-range part of each 16x16 tile.
    float* c = args.c + z * args.m * args.n;
#pragma unroll
    for (int i = 0; i < kFragsM; ++i) {
#pragma unroll
      for (int j = 0; j < kFragsN; ++j) {
        const int r0 = wm * kWarpTileM + i * 16, c0 = wn * kWarpTileN + j * 16;
        const std::int64_t gr = m0 + r0, gc = n0 + c0;
        if (gr >= args.m || gc >= args.n) continue;
        const wmmae::TileBounds bounds{static_cast<int>(min(static_cast<std::int64_t>(16), args.m - gr)),
                                       static_cast<int>(min(static_cast<std::int64_t>(16), args.n - gc))};
        const Acc& corr = corr_acc[i][j];
        wmmae::foreach_ij(main_acc[i][j], [&](auto xs, int r, int cc) {
          if (!bounds.contains(r, cc)) return;
          const float hh = main_acc[i][j].x[xs.first];
          float v = isfinite(hh) ? hh + corr.x[xs.first] * T::kLoUnscale : hh;
          if (M == Method::fp16) v = ldexpf(v, -(smem.a_shift[r0 + r] + smem.b_shift[c0 + cc]));
          c[(gr + r) * args.n + gc + cc] = v;
        });
      }
    }
    __syncthreads();  // the next batch index rewrites the scales
  }
}

template <Method M>
void launch_gemm(const GemmArgs& args, bool a_row_major, bool b_row_major, cudaStream_t stream) {
  const std::int64_t tiles = ((args.m + kBlockM - 1) / kBlockM) * ((args.n + kBlockN - 1) / kBlockN);
  TORCH_CHECK(tiles <= 0x7fffffff, "corrected_matmul: the output has too many tiles");
  const dim3 grid(static_cast<unsigned>(tiles), 1, static_cast<unsigned>(std::min<std::int64_t>(args.num_batches, 65535)));
  if (a_row_major && b_row_major) corrected_gemm_kernel<M, true, true><<<grid, kThreads, 0, stream>>>(args);
  else if (a_row_major) corrected_gemm_kernel<M, true, false><<<grid, kThreads, 0, stream>>>(args);
  else if (b_row_major) corrected_gemm_kernel<M, false, true><<<grid, kThreads, 0, stream>>>(args);
  else corrected_gemm_kernel<M, false, false><<<grid, kThreads, 0, stream>>>(args);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// A strided (rows x cols) view is read in place when one of its dimensions is contiguous (or has one
// element); otherwise it is copied once into a contiguous tensor.
bool row_major_view(const at::Tensor& t) { return t.stride(-1) == 1 || t.size(-1) == 1; }
bool col_major_view(const at::Tensor& t) { return t.stride(-2) == 1 || t.size(-2) == 1; }

at::Tensor corrected_matmul_cuda(const at::Tensor& a_in, const at::Tensor& b_in, c10::string_view method_name) {
  const Method method = method_from_string(std::string(method_name));
  TORCH_CHECK(a_in.is_cuda(), "corrected_matmul: argument 'a' must be a CUDA tensor for the CUDA kernel");
  const c10::cuda::CUDAGuard guard(a_in.device());
  MatmulPlan plan = plan_matmul(a_in, b_in, "corrected_matmul");
  at::Tensor out = at::empty({plan.batch, plan.m, plan.n}, a_in.options());
  if (out.numel() == 0) return out.view(plan.out_shape);
  if (plan.k == 0) return out.zero_().view(plan.out_shape);
  TORCH_CHECK(at::cuda::getCurrentDeviceProperties()->major >= 8,
              "corrected_matmul: the CUDA kernels need compute capability 8.0 or newer");

  at::Tensor a = plan.a, b = plan.b;
  if (!row_major_view(a) && !col_major_view(a)) a = a.contiguous();
  if (!row_major_view(b) && !col_major_view(b)) b = b.contiguous();
  if (!a.is_same(plan.a) || !b.is_same(plan.b)) plan = plan_matmul(a, b, "corrected_matmul");
  const bool a_row = a.stride(-1) == 1 && !(a.size(-1) == 1 && a.stride(-2) == 1);
  const bool b_row = b.stride(-1) == 1 && !(b.size(-1) == 1 && b.stride(-2) == 1);

  GemmArgs args{};
  args.a = a.data_ptr<float>();
  args.b = b.data_ptr<float>();
  args.c = out.data_ptr<float>();
  args.m = plan.m;
  args.n = plan.n;
  args.k = plan.k;
  args.a_rs = a.stride(-2);
  args.a_ks = a.stride(-1);
  args.b_ks = b.stride(-2);
  args.b_cs = b.stride(-1);
  args.batch = plan.batch_strides;
  args.num_batches = plan.batch;
  args.method = method;

  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  at::Tensor ranges;
  if (method != Method::tf32) {
    // Three int arrays (max exponent, min exponent, non-finite flag) of batch * (m + n) entries each:
    // A's rows as [batch][m] first, then B's columns as [batch][n].
    ranges = at::empty({3, plan.batch, plan.m + plan.n}, a.options().dtype(at::kInt));
    ranges[0].fill_(kNoExponent);
    ranges[1].fill_(-kNoExponent);
    ranges[2].zero_();
    int* base = ranges.data_ptr<int>();
    const std::int64_t per = plan.batch * (plan.m + plan.n);
    const std::int64_t a_block = plan.batch * plan.m;
    args.a_ranges = RangeArrays{base, base + per, base + 2 * per};
    args.b_ranges = RangeArrays{base + a_block, base + per + a_block, base + 2 * per + a_block};
    const LinesArgs a_lines{args.a, plan.m, plan.k, args.a_rs, args.a_ks, args.batch, false, args.a_ranges};
    const LinesArgs b_lines{args.b, plan.n, plan.k, args.b_cs, args.b_ks, args.batch, true, args.b_ranges};
    TORCH_CHECK(plan.batch <= 65535, "corrected_matmul: method '", method_name, "' supports at most 65535 batch "
                "entries, got ", plan.batch);
    launch_line_ranges(a_lines, plan.batch, stream);
    launch_line_ranges(b_lines, plan.batch, stream);
  }
  if (method != Method::tf32) launch_gemm<Method::fp16>(args, a_row, b_row, stream);
  if (method != Method::fp16) launch_gemm<Method::tf32>(args, a_row, b_row, stream);
  return out.view(plan.out_shape);
}

}  // namespace

TORCH_LIBRARY_IMPL(wmmae, CUDA, m) { m.impl("corrected_matmul", &corrected_matmul_cuda); }

}  // namespace wmmae_ops
