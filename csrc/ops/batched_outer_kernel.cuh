// The batched_outer CUDA kernel: out_b = u_b v_b^T + alpha*I, built from the device library.
//
// Work unit: `group` consecutive batch items (several when n is small) times one block of up to
// kSliceLen elements of u and one of v (the whole vectors when n <= kSliceLen). A warp first copies the
// unit's slices of u and v into its own shared memory with coalesced loads, so it waits for memory once
// per unit instead of once per 16x16 tile. It then makes every output tile of the unit from there:
// u in the first column of A and v in the first row of B (load_vector), one mma, the diagonal of
// diagonal tiles as u_i v_i + alpha rounded once (foreach_diagonal), and the accumulator written with
// 16-byte stores (foreach_row_quad). For 32 < n <= 128 a 16-row band of tiles is collected in shared
// memory and leaves row by row (use_staged_output), and the next unit's slices arrive by cp.async while
// this one is worked on.
//
// fp16/bf16 inputs: every product that float32 can hold exactly comes out exact (all fp16 products;
// bf16 products within float32's normal range), and alpha is added with one rounding.
// fp32 inputs: each value is split into three bf16 terms (u = u0 + u1 + u2 exactly when 2^-109 <= |u| <
// 2^127); the nine products u_a v_b^T sit in the k dimension of one m16n16k16 bf16 mma (at k = 4a + b). A
// tile with a value outside that range (Inf, NaN, near FLT_MAX where bf16 rounding overflows, tiny or
// subnormal where the lower terms lose bits) is computed in fp32 on the CUDA cores instead.
#pragma once

#include <c10/cuda/CUDAException.h>

#include <cstdint>
#include <type_traits>

#include "../wmmae/wmmae.hpp"
#include "dynamic_smem.cuh"

namespace wmmae_ops {
namespace outer {

using namespace nvcuda;

constexpr int kTile = 16;
constexpr int kWarpsPerBlock = 8;
constexpr int kSliceLen = 256;  // elements of u (and of v) per unit when n > kSliceLen

// 4 resident blocks (32 warps, 64 registers) per SM: measured faster on an H200 than 5 (48 registers,
// spills outside the tile loop) or 6, by 2-8%: each warp waits for memory once per unit, not per tile.
constexpr int kMinBlocksPerSm = 4;

struct Args {
  const void* u;
  const void* v;
  std::int64_t u_batch_stride, u_stride, v_batch_stride, v_stride;
  void* out;
  std::int64_t batch;
  std::int64_t num_units;
  int n;
  int group;            // batch items per unit
  int stage_len;        // elements of each staging buffer (group * n, or one slice; 16-byte multiple)
  int slices_per_side;  // ceil(n / kSliceLen)
  int vector_width;     // elements per output store: 4, 2 or 1 (from n and the output's alignment)
  int band_stride;      // staged output: floats per band row in shared memory
  bool v_is_u;          // v is u (same data, same strides): stage it once
  float alpha;
};

// Batch items per unit: enough to amortize the staging, about unit_bytes of output per unit, and at most
// 1 KiB of each input vector per unit. 16-bit inputs, H200, same run, fp16 -> fp32 at 64 KiB against
// 16 KiB: n = 16, batch 2^20: 88% of the copy bandwidth against 85%; n = 32: 91% against 87%; n = 48: 88%
// against 83%; n = 64: 93% against 87%; only n = 16 at batch 2^17 (a 35 us kernel, where fewer units leave a
// longer tail) lost, 86% against 87%. fp32 inputs keep 16 KiB: at most 1 KiB of input makes that for n = 16,
// and larger units were not measured for them.
template <class In>
constexpr std::int64_t unit_bytes() { return sizeof(In) == 2 ? 64 << 10 : 16 << 10; }
template <class In>
constexpr int max_stage_len() { return 1024 / sizeof(In); }
template <class In>
inline int items_per_unit(std::int64_t n, std::int64_t out_elem_size) {
  if (n > kSliceLen) return 1;
  const std::int64_t by_output = unit_bytes<In>() / (n * n * out_elem_size);
  const std::int64_t by_input = max_stage_len<In>() / n;
  return static_cast<int>(std::max<std::int64_t>(1, std::min(by_output, by_input)));
}
// Dynamic shared memory: per warp two buffers (this unit's slices and the next one's) of u and v, then the
// output bands of StagedOutput.
constexpr int kStagesPerWarp = 2 * 2;  // [this unit, next unit] x [u, v]
template <class In>
__host__ __device__ inline std::size_t stage_bytes(int stage_len) {
  return std::size_t{kWarpsPerBlock} * kStagesPerWarp * stage_len * sizeof(In);
}

// Stores of 1, 2 or 4 consecutive output elements (16-bit outputs: packed into 32/64-bit words), all
// evict-first (__stcs): the kernel never reads its output, and they measured 1-9% faster than plain stores.
__device__ __forceinline__ unsigned int bits16(float v, __half) { return __half_as_ushort(__float2half_rn(v)); }
__device__ __forceinline__ unsigned int bits16(float v, __nv_bfloat16) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }

template <class Out>
__device__ __forceinline__ void store_run(Out* p, const float* v, int count) {
  if constexpr (std::is_same<Out, float>::value) {
    if (count == 4) __stcs(reinterpret_cast<float4*>(p), make_float4(v[0], v[1], v[2], v[3]));
    else if (count == 2) __stcs(reinterpret_cast<float2*>(p), make_float2(v[0], v[1]));
    else __stcs(p, v[0]);
  } else {
    const unsigned int lo = bits16(v[0], Out()) | (count > 1 ? bits16(v[1], Out()) << 16 : 0u);
    if (count == 4) {
      const unsigned int hi = bits16(v[2], Out()) | bits16(v[3], Out()) << 16;
      __stcs(reinterpret_cast<uint2*>(p), make_uint2(lo, hi));
    } else if (count == 2) {
      __stcs(reinterpret_cast<unsigned int*>(p), lo);
    } else {
      __stcs(reinterpret_cast<unsigned short*>(p), static_cast<unsigned short>(lo));
    }
  }
}

// Writes the rows x cols top-left part of an accumulator tile (row-major, leading dimension ld), four
// consecutive elements per lane at a time; `width` is the widest store the output's alignment allows.
template <class Out, class Acc>
__device__ __forceinline__ void store_tile(Out* tile, std::int64_t ld, int rows, int cols, int width, const Acc& c) {
  wmmae::foreach_row_quad(c, [&](int i, int j, const wmmae::RowQuad<float>& quad) {
    if (i >= rows || j >= cols) return;
    Out* p = tile + i * ld + j;
    if (width == 4 && j + 4 <= cols) {
      store_run(p, quad.v, 4);
      return;
    }
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      if (width >= 2 && j + e + 2 <= cols) {
        store_run(p + e, quad.v + e, 2);
      } else {
        if (j + e < cols) store_run(p + e, quad.v + e, 1);
        if (j + e + 1 < cols) store_run(p + e + 1, quad.v + e + 1, 1);
      }
    }
  });
}

// Output bands: with `staged` output, a warp collects the 16 rows x n tile row of one output matrix (a
// contiguous range of memory) in shared memory and writes it out row after row, so that consecutive lanes
// write consecutive bytes and every 32-byte sector is written whole by one store instruction. Direct
// 16x16 tile stores spread each instruction over 8 rows and leave sectors half-written by two tiles
// wherever a row does not start on a sector boundary (n = 100: half the rows).
constexpr int kMaxStagedN = 128;
// Floats per band row: room for whole 16-column tiles, and an odd multiple of 16 so that the two rows one
// quad-store phase touches fall into different banks.
inline int band_stride(int n) {
  const int cols = (n + kTile - 1) / kTile * kTile;
  return cols % 32 == 0 ? cols + 16 : cols;
}
inline std::size_t band_bytes(int n) { return std::size_t{kWarpsPerBlock} * kTile * band_stride(n) * sizeof(float); }

// Which lanes write which part of a band row: lanes_per_row lanes per row, rows_per_pass rows at a time.
struct BandLanes {
  int lanes_per_row, rows_per_pass, row, col;
};
__device__ __forceinline__ BandLanes band_lanes(int words_per_row) {
  BandLanes b;
  b.lanes_per_row = min(32, words_per_row);
  b.rows_per_pass = 32 / b.lanes_per_row;
  const int lane = wmmae::lane_id();
  b.row = lane / b.lanes_per_row;
  b.col = lane - b.row * b.lanes_per_row;
  return b;
}

// Writes rows x n floats of a band (row stride `stride` in shared memory) to the contiguous output range
// at `dst`, `width` elements per store.
template <class Out>
__device__ __forceinline__ void write_band(Out* dst, const float* band, int rows, int n, int stride, int width,
                                           const BandLanes& lanes) {
  if (lanes.row >= lanes.rows_per_pass) return;
  const int words = n / width;
  for (int r = lanes.row; r < rows; r += lanes.rows_per_pass) {
    for (int w = lanes.col; w < words; w += lanes.lanes_per_row) {
      const int col = w * width;
      if (width == 4) {
        const float4 q = *reinterpret_cast<const float4*>(band + r * stride + col);
        const float v[4] = {q.x, q.y, q.z, q.w};
        store_run(dst + static_cast<std::int64_t>(r) * n + col, v, 4);
      } else {
        store_run(dst + static_cast<std::int64_t>(r) * n + col, band + r * stride + col, width);
      }
    }
  }
}

// `items` slices of `len` elements (slice g starts at src + g * batch_stride, elements `stride` apart) are
// staged to dst[g * len + i]: one contiguous range when the elements are adjacent and the slices follow
// each other.
__device__ __forceinline__ bool slices_contiguous(int items, int len, std::int64_t batch_stride, std::int64_t stride) {
  return stride == 1 && (items == 1 || batch_stride == len);
}

// A contiguous range that 16-byte words cover exactly, from a 16-byte aligned start.
template <class In>
__device__ __forceinline__ bool in_16_byte_words(const In* src, int count) {
  return reinterpret_cast<std::uintptr_t>(src) % 16 == 0 && count % (16 / sizeof(In)) == 0;
}

// Copies the slices with all lanes of the warp; contiguous slices go as 16-byte words where the alignment
// allows.
template <class In>
__device__ __forceinline__ void stage_slices(In* dst, const In* src, int items, int len, std::int64_t batch_stride,
                                             std::int64_t stride) {
  const int lane = wmmae::lane_id();
  const int count = items * len;
  if (slices_contiguous(items, len, batch_stride, stride)) {
    if (in_16_byte_words(src, count)) {
      constexpr int kPerWord = 16 / sizeof(In);
      const uint4* s = reinterpret_cast<const uint4*>(src);
      uint4* d = reinterpret_cast<uint4*>(dst);
      for (int w = lane; w < count / kPerWord; w += 32) d[w] = __ldcs(s + w);
    } else {
      for (int e = lane; e < count; e += 32) dst[e] = __ldcs(src + e);
    }
  } else {
    for (int e = lane; e < count; e += 32) {
      const int g = static_cast<unsigned>(e) / static_cast<unsigned>(len), i = e - g * len;
      dst[e] = src[g * batch_stride + i * stride];
    }
  }
}

// Asynchronous staging (sm_80+): the 16-byte word copy of stage_slices as cp.async, where it applies.
template <class In>
__device__ __forceinline__ bool can_stage_async(const In* src, int items, int len, std::int64_t batch_stride,
                                                std::int64_t stride) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return slices_contiguous(items, len, batch_stride, stride) && in_16_byte_words(src, items * len);
#else
  return false;
#endif
}

template <class In>
__device__ __forceinline__ void stage_slices_async(In* dst, const In* src, int count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kPerWord = 16 / sizeof(In);
  for (int w = wmmae::lane_id(); w < count / kPerWord; w += 32) {
    const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(dst + w * kPerWord));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to), "l"(src + w * kPerWord) : "memory");
  }
#endif
}

// One commit group per unit: wait_async_all_but_newest() then waits for every unit but the newest one.
__device__ __forceinline__ void commit_async() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_async_all_but_newest() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group 1;\n" ::: "memory");
#endif
}

// Whether bf16x3_split splits v exactly (zero included).
__device__ __forceinline__ bool bf16x3_exact(float v) {
  const float a = fabsf(v);
  return v == 0.0f || (a >= 0x1p-109f && a < 0x1p127f);  // false for Inf and NaN
}

// The three bf16 terms of an fp32 value: v = t0 + t1 + t2 exactly for normal values. Packed as t0 | t1 << 16 |
// t2 << 32, so that picking a term is a shift. (Picked by selects, the terms were split again per fragment
// element: the compiler turned the selects into branches; a run-time index into an array would put them in
// local memory.)
struct Bf16x3 {
  unsigned long long packed;
};
__device__ __forceinline__ Bf16x3 bf16x3_split(float v) {
  const __nv_bfloat16 t0 = __float2bfloat16_rn(v);
  const float r1 = v - __bfloat162float(t0);
  const __nv_bfloat16 t1 = __float2bfloat16_rn(r1);
  const __nv_bfloat16 t2 = __float2bfloat16_rn(r1 - __bfloat162float(t1));
  const unsigned int low = __bfloat16_as_ushort(t0) | static_cast<unsigned int>(__bfloat16_as_ushort(t1)) << 16;
  return {low | static_cast<unsigned long long>(__bfloat16_as_ushort(t2)) << 32};
}
// Term `which` (0, 1 or 2; 3: zero) of a split.
__device__ __forceinline__ __nv_bfloat16 bf16x3_pick(Bf16x3 s, int which) {
  return __ushort_as_bfloat16(static_cast<unsigned short>(s.packed >> (16 * which)));
}

// fp32 inputs: the product of u's term a and v's term b sits at k = 4a + b of the bf16 mma (a, b < 3). The term
// of each operand at k, 3 (bf16x3_pick's zero) where the slot holds no product: A at k >= 12, B there and at
// b = 3. In base 4 rather than 3a + b, so that the two elements of an A register, k = 2c and 2c + 1 in the
// m16n16k16 operand layouts, take the same term of the same u_i, and the selects by term cost fewer
// instructions (the k -> term arithmetic is shifts and masks instead of a division).
__device__ __forceinline__ int u_term_at(int k) { return k >> 2; }
__device__ __forceinline__ int v_term_at(int k) { return k < 12 ? k & 3 : 3; }

// p[i] for i < count, else 0 (count >= 1). The read itself is unconditional, at a clamped index: the
// elements of a fragment that share a row (or column) then share one load, and the split and the check of
// its value, where a conditional read per element made the compiler load and split again for each element.
__device__ __forceinline__ float clamped_read(const float* p, int i, int count) {
  const float x = p[min(i, count - 1)];
  return i < count ? x : 0.0f;
}

// Whether an element of the mma's result is the exact product u_i v_j (the k = 0 term is its only nonzero
// term): always for fp16 inputs (products have at most 22 significant bits and magnitudes within 2^-48 ..
// 2^32); for bf16 inputs where it is a finite, normal float32 (bf16 has float32's exponent range, so a
// product can overflow or fall below the normal range); never for the bf16x3 sums of fp32 inputs.
template <class In>
__device__ __forceinline__ bool is_exact_product(float p) {
  if constexpr (std::is_same<In, __half>::value) {
    return true;
  } else if constexpr (std::is_same<In, __nv_bfloat16>::value) {
    const float a = fabsf(p);
    return a >= 0x1p-126f && a <= 0x1.fffffep127f;  // false for zero, subnormals, Inf and NaN
  } else {
    return false;
  }
}

template <class In, class Out, bool StagedOutput>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, kMinBlocksPerSm) batched_outer_kernel(Args args) {
  constexpr bool kSplitFp32 = std::is_same<In, float>::value;
  using FragT = typename std::conditional<std::is_same<In, __half>::value, __half, __nv_bfloat16>::type;
  using FragA = wmma::fragment<wmma::matrix_a, kTile, kTile, kTile, FragT, wmma::row_major>;
  using FragB = wmma::fragment<wmma::matrix_b, kTile, kTile, kTile, FragT, wmma::row_major>;
  using Acc = wmma::fragment<wmma::accumulator, kTile, kTile, kTile, float>;

  // Two buffers per warp: the next unit's slices arrive (cp.async) while this unit's tiles are made.
  extern __shared__ float4 dynamic_smem[];
  const int warp_in_block = threadIdx.x / 32;
  const int stage_len = args.stage_len;
  In* const stage_base = reinterpret_cast<In*>(dynamic_smem) + warp_in_block * kStagesPerWarp * stage_len;
  auto stage = [&](int buffer, int side) { return stage_base + (buffer * 2 + side) * stage_len; };  // side 0: u, 1: v
  // StagedOutput: kWarpsPerBlock bands of 16 x band_stride floats after the stages (16-byte aligned: stage_len
  // is a multiple of 16 bytes).
  const int stride = args.band_stride;
  float* band = reinterpret_cast<float*>(reinterpret_cast<char*>(dynamic_smem) + stage_bytes<In>(stage_len)) +
                warp_in_block * kTile * stride;

  const In* u = static_cast<const In*>(args.u);
  const In* v = static_cast<const In*>(args.v);
  Out* out = static_cast<Out*>(args.out);
  // Lambdas below capture locals, not `args`: capturing the kernel parameter would copy it to the stack.
  const std::int64_t n = args.n;
  const int group = args.group, slices = args.slices_per_side, width = args.vector_width;
  const float alpha = args.alpha;
  const std::int64_t u_bs = args.u_batch_stride, u_s = args.u_stride, v_bs = args.v_batch_stride, v_s = args.v_stride;
  const std::int64_t batch = args.batch, num_units = args.num_units;
  const bool v_is_u = args.v_is_u;
  const BandLanes lanes = band_lanes(args.n / args.vector_width);
  // alpha on the diagonal of a tile and -0.0 elsewhere (x + -0.0 == x for every x, signed zeros included),
  // made once: adding it to a diagonal tile whose products are exact adds alpha with one rounding.
  Acc alpha_diagonal;
  wmma::fill_fragment(alpha_diagonal, -0.0f);
  wmmae::foreach_diagonal(alpha_diagonal, [&](auto xs, int) { wmmae::assign(alpha_diagonal, xs, alpha); });

  // Operand fragments from the staged slices: u in the first column of A, v in the first row of B (fp32:
  // the nine bf16 term pairs along k, see u_term_at). Returns false when a value cannot be split exactly (fp32
  // only).
  auto load_a = [&](FragA& a, const In* p, int count) {
    if constexpr (!kSplitFp32) {
      wmmae::load_vector(a, p, count);
      return true;
    } else {
      bool exact = true;
      wmmae::foreach_ij(a, [&](auto xs, int i, int k) {
        const float x = clamped_read(p, i, count);
        exact &= bf16x3_exact(x);
        wmmae::assign(a, xs, bf16x3_pick(bf16x3_split(x), u_term_at(k)));
      });
      return exact;
    }
  };
  auto load_b = [&](FragB& b, const In* p, int count) {
    if constexpr (!kSplitFp32) {
      wmmae::load_vector(b, p, count);
      return true;
    } else {
      bool exact = true;
      wmmae::foreach_ij(b, [&](auto xs, int k, int j) {
        const float y = clamped_read(p, j, count);
        exact &= bf16x3_exact(y);
        wmmae::assign(b, xs, bf16x3_pick(bf16x3_split(y), v_term_at(k)));
      });
      return exact;
    }
  };

  const std::int64_t warp = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const std::int64_t num_warps = static_cast<std::int64_t>(gridDim.x) * blockDim.x / 32;
  // The batch items and the slices of u and v that a unit covers.
  struct Span {
    std::int64_t first_item;
    int r0, c0, items, u_len, v_len;
  };
  auto span_of = [&](std::int64_t unit) {
    Span sp{unit * group, 0, 0, 0, 0, 0};
    if (slices > 1) {  // n > kSliceLen: one item per unit, in slices x slices blocks
      const std::int64_t per_item = static_cast<std::int64_t>(slices) * slices;
      sp.first_item = unit / per_item;
      const int s = static_cast<int>(unit - sp.first_item * per_item);
      sp.r0 = s / slices * kSliceLen;
      sp.c0 = s % slices * kSliceLen;
    }
    sp.items = static_cast<int>(min(static_cast<std::int64_t>(group), batch - sp.first_item));
    sp.u_len = static_cast<int>(min(static_cast<std::int64_t>(kSliceLen), n - sp.r0));
    sp.v_len = static_cast<int>(min(static_cast<std::int64_t>(kSliceLen), n - sp.c0));
    return sp;
  };
  auto u_slices = [&](const Span& sp) { return u + sp.first_item * u_bs + sp.r0 * u_s; };
  auto v_slices = [&](const Span& sp) { return v + sp.first_item * v_bs + sp.c0 * v_s; };
  // Starts the asynchronous copy of a unit's slices into buffer `buf` when they allow it, and commits
  // one group either way.
  auto prefetch = [&](const Span& sp, int buf) {
    const bool async = can_stage_async(u_slices(sp), sp.items, sp.u_len, u_bs, u_s) &&
                       (v_is_u || can_stage_async(v_slices(sp), sp.items, sp.v_len, v_bs, v_s));
    if (async) {
      stage_slices_async(stage(buf, 0), u_slices(sp), sp.items * sp.u_len);
      if (!v_is_u) stage_slices_async(stage(buf, 1), v_slices(sp), sp.items * sp.v_len);
    }
    commit_async();
    return async;
  };

  int buf = 0;
  bool staged_ahead = false;
  if (warp < num_units) staged_ahead = prefetch(span_of(warp), 0);
  for (std::int64_t unit = warp; unit < num_units; unit += num_warps) {
    const Span sp = span_of(unit);
    const std::int64_t first_item = sp.first_item;
    const int r0 = sp.r0, c0 = sp.c0, items = sp.items, u_len = sp.u_len, v_len = sp.v_len;
    In* su = stage(buf, 0);
    In* sv = v_is_u ? su : stage(buf, 1);

    __syncwarp();  // every lane is done reading the previous unit's slices (the other buffer)
    bool next_staged_ahead = false;
    if (unit + num_warps < num_units) next_staged_ahead = prefetch(span_of(unit + num_warps), buf ^ 1);
    else commit_async();  // an empty group: the wait below always leaves exactly one group pending
    if (staged_ahead) {
      wait_async_all_but_newest();
    } else {
      stage_slices(su, u_slices(sp), items, u_len, u_bs, u_s);
      if (!v_is_u) stage_slices(sv, v_slices(sp), items, v_len, v_bs, v_s);
    }
    __syncwarp();  // the slices are visible to every lane
    staged_ahead = next_staged_ahead;
    buf ^= 1;

    for (int g = 0; g < items; ++g) {
      const In* ug = su + g * u_len;
      const In* vg = sv + g * v_len;
      Out* out_block = out + ((first_item + g) * n + r0) * n + c0;
      for (int ti = 0; ti * kTile < u_len; ++ti) {
        const int rows = min(kTile, u_len - ti * kTile);
        FragA a;
        const bool exact_a = load_a(a, ug + ti * kTile, rows);
        for (int tj = 0; tj * kTile < v_len; ++tj) {
          const int cols = min(kTile, v_len - tj * kTile);
          const float diagonal = r0 + ti * kTile == c0 + tj * kTile ? alpha : 0.0f;
          FragB b;
          const bool exact = load_b(b, vg + tj * kTile, cols) && exact_a;
          Acc c;
          if (kSplitFp32 && __any_sync(0xffffffffu, !exact)) {
            wmmae::foreach_ij(c, [&](auto xs, int i, int j) {
              const float x = i < rows ? wmmae::to_float(ug[ti * kTile + i]) : 0.0f;
              const float y = j < cols ? wmmae::to_float(vg[tj * kTile + j]) : 0.0f;
              wmmae::assign(c, xs, i == j ? fmaf(x, y, diagonal) : x * y);
            });
          } else {
            wmma::fill_fragment(c, 0.0f);
            wmma::mma_sync(c, a, b, c);
            if (diagonal != 0.0f) {
              // u_i v_i + alpha rounded once, as fmaf(u_i, v_i, alpha), and not alpha*I (make_identity) as
              // the mma's C: the tensor core neither rounds a product plus C correctly (where they cancel
              // it lost an ulp of the larger term) nor keeps a product that overflows float32 finite
              // against an infinite alpha. Where every diagonal product of the tile is exact, that is one
              // add of alpha_diagonal per element (ptxas drops the adds of constant -0.0); otherwise an
              // fmaf of the staged values where a product is not. (A diagonal tile has rows == cols.)
              bool all_exact = true;
              if constexpr (std::is_same<In, __nv_bfloat16>::value) {
                // The diagonal elements are those where alpha_diagonal is not -0.0 (alpha != 0 here): that
                // mask, made once, takes fewer instructions than foreach_diagonal's per-lane key (sm_90a SASS
                // of the check: ~18 against ~26).
                wmmae::foreach(c, [&](int x, int, int) {
                  all_exact &= alpha_diagonal.x[x] == 0.0f || is_exact_product<In>(c.x[x]);
                });
                all_exact = __all_sync(0xffffffffu, all_exact);
              }
              if (!kSplitFp32 && all_exact) {
#pragma unroll
                for (int x = 0; x < Acc::num_elements; ++x) c.x[x] += alpha_diagonal.x[x];
              } else {
                wmmae::foreach_diagonal(c, [&](auto xs, int i) {
                  const float product = c.x[xs.first];
                  if (is_exact_product<In>(product)) {
                    wmmae::assign(c, xs, product + diagonal);
                  } else if (i < rows) {
                    wmmae::assign(c, xs, fmaf(wmmae::to_float(ug[ti * kTile + i]), wmmae::to_float(vg[tj * kTile + i]),
                                              diagonal));
                  }
                });
              }
            }
          }
          if constexpr (StagedOutput) {
            // All 16 rows and columns: a band row holds whole tiles.
            wmmae::foreach_row_quad(c, [&](int i, int j, const wmmae::RowQuad<float>& quad) {
              *reinterpret_cast<float4*>(band + i * stride + tj * kTile + j) =
                  make_float4(quad.v[0], quad.v[1], quad.v[2], quad.v[3]);
            });
          } else {
            store_tile(out_block + ti * kTile * n + tj * kTile, n, rows, cols, width, c);
          }
        }
        if constexpr (StagedOutput) {
          __syncwarp();
          write_band(out_block + ti * kTile * n, band, rows, static_cast<int>(n), stride, width, lanes);
          __syncwarp();  // the band is free for the next tile row
        }
      }
    }
  }
}

// When to stage output bands, whatever the dtypes. Measured on an H200, fp16 -> fp32, same run: n = 64: 89%
// of copy against 78% direct, 100: 74% against 30%, 128: 87% against 78%; no gain up to n = 32 (16: 72%
// against 86%), where a 16x16 tile already covers whole rows or half rows, nor for odd n (single-element
// stores either way). fp32 inputs, once their split took fewer instructions (H100, session 43, fp32 ->
// fp32): n = 48: 86% against 83%, 64: 90% against 85%, 96: 91% against 86%, 128: 97% against 89%.
inline bool use_staged_output(int n) { return n > 32 && n <= kMaxStagedN && n % 2 == 0; }

// Fills in the launch-dependent fields of `args` (grouping, store width) and launches on `stream`.
template <class In, class Out>
void launch(Args args, int sm_count, cudaStream_t stream) {
  const std::int64_t n = args.n;
  args.slices_per_side = static_cast<int>((n + kSliceLen - 1) / kSliceLen);
  args.group = items_per_unit<In>(n, sizeof(Out));
  constexpr int kPerWord = 16 / sizeof(In);
  const std::int64_t staged_elems = args.slices_per_side > 1 ? kSliceLen : args.group * n;
  args.stage_len = static_cast<int>((staged_elems + kPerWord - 1) / kPerWord * kPerWord);
  args.v_is_u = args.v_is_u && args.slices_per_side == 1;
  const std::int64_t groups = (args.batch + args.group - 1) / args.group;
  args.num_units = groups * args.slices_per_side * args.slices_per_side;
  const auto address = reinterpret_cast<std::uintptr_t>(args.out);
  args.vector_width = n % 4 == 0 && address % (4 * sizeof(Out)) == 0 ? 4 : (n % 2 == 0 && address % (2 * sizeof(Out)) == 0 ? 2 : 1);
  const bool staged = use_staged_output(args.n);
  args.band_stride = staged ? band_stride(args.n) : 0;
  // A grid-stride loop over units: enough blocks to fill every SM several times over.
  const std::int64_t wanted = (args.num_units + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const int blocks = static_cast<int>(std::min<std::int64_t>(wanted, static_cast<std::int64_t>(sm_count) * 16));
  const std::size_t smem = stage_bytes<In>(args.stage_len) + (staged ? band_bytes(args.n) : 0);
  if (staged) {
    allow_dynamic_smem<batched_outer_kernel<In, Out, true>>(smem);
    batched_outer_kernel<In, Out, true><<<blocks, kWarpsPerBlock * 32, smem, stream>>>(args);
  } else {
    allow_dynamic_smem<batched_outer_kernel<In, Out, false>>(smem);
    batched_outer_kernel<In, Out, false><<<blocks, kWarpsPerBlock * 32, smem, stream>>>(args);
  }
}

}  // namespace outer
}  // namespace wmmae_ops
