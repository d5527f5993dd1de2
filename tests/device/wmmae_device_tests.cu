// Test-only operators for the device library (built by tests/test_device_library.py on a GPU machine).
// wmmae_test::check(use, m, n, k, dtype, layout, seed) runs every primitive against its plain-WMMA
// equivalent for one fragment type and returns (errors [kNumChecks] int32, compile-time map [32, num, 2]).
// wmmae_test::split_fp16(values) returns the device forms of split.hpp's fp16 splits, for the test to compare
// with its own float64 arithmetic.
#include <ATen/cuda/CUDAContext.h>
#include <cuda_fp16.h>
#include <torch/library.h>

#include <limits>

#include "ops/fragment_dispatch.cuh"
#include "wmmae/wmmae.hpp"

namespace {

using namespace nvcuda;
using wmmae::Order;
using wmmae::Use;

enum Check {
  kForeachIjCoverage,   // foreach_ij visits every (i, j) as often as map() says
  kMapInverse,          // every holder map() names holds (i, j) according to foreach
  kLoadWithOpIdentity,  // load_matrix_with_op(identity) == load_matrix_sync
  kPartialOddLdm,       // bounded load at odd ldm and unaligned base == load_matrix_sync of a padded copy
  kLoadVector,          // load_vector == load_matrix_sync of a zero-padded tile
  kLoadVectorScaled,    // load_vector with scale 2 of values float cannot hold (f64, s32) == the doubled tile
  kMakeIdentity,        // make_identity == load_matrix_sync of alpha*I
  kStoreWithOp,         // store_matrix_with_op (bounded) == store_matrix_sync (accumulators)
  kMultiLoad,           // load_matrices_with_op into two fragments == two single loads
  kRowQuads,            // foreach_row_quad covers every element once, == store_matrix_sync (accumulators)
  kStoreVector,         // store_vector (first column, first row scaled; values float cannot hold) == the tile's
                        // elements, nothing past count
  kForeachDiagonal,     // foreach_diagonal visits exactly the holders of (i, i), as map() names them, with row i
  kFillZero,            // fill_zero over a fragment of non-zero values == fill_fragment(0)
  kIntegerResults,      // integer results of load_vector/store_vector: nearest (ties to even, by the exact
                        // product), saturated, NaN -> 0; references in integer arithmetic
  kScaleRoundedOnce,    // load_vector/store_vector products that float or double would round onto a tie: the exact
                        // product rounded once (float and double scales; references worked out in exact arithmetic)
  kWideAlpha,           // make_identity with a double alpha rounded once to the storage type, not through float
  kWithOpUsed,          // load/store_matrix_with_op apply a non-identity op, accumulators in column-major memory
  kLoadVectorEdges,     // load_vector: count 0, count past the tile, negative and zero strides, infinities
  kNumChecks
};

// The row-quad check must not pass vacuously: the 16x16 accumulators have side-by-side cores.
static_assert(wmmae::has_row_quads<wmma::fragment<wmma::accumulator, 16, 16, 16, float>>() &&
              wmmae::has_row_quads<wmma::fragment<wmma::accumulator, 16, 16, 16, __half>>() &&
              !wmmae::has_row_quads<wmma::fragment<wmma::accumulator, 32, 8, 16, float>>(),
              "row quads: unexpected layout table");

constexpr int kLd = 48;  // leading dimension of the reference tiles: a multiple of 16 bytes for every element type

__device__ unsigned hash(unsigned x) {
  x ^= x >> 16; x *= 0x7feb352dU; x ^= x >> 15; x *= 0x846ca68bU; x ^= x >> 16;
  return x;
}
// Small integers: exact in every fragment type.
template <class Mem> __device__ Mem value_at(unsigned seed, int idx) {
  return wmmae::convert<Mem>(static_cast<float>(static_cast<int>(hash(seed * 7919u + idx) % 15u)) - 7.0f);
}
template <> __device__ unsigned char value_at<unsigned char>(unsigned seed, int idx) {
  return static_cast<unsigned char>(hash(seed * 7919u + idx) % 15u);
}
// Values that float cannot hold where the type can (f64 with bits 2^-40 below the integer part, s32 above 2^24), so
// that a primitive rounding through float shows; small integers elsewhere. Doubling them stays exact.
template <class Mem> __device__ Mem wide_value_at(unsigned seed, int idx) {
  if constexpr (std::is_same<Mem, double>::value) {
    return value_at<Mem>(seed, idx) + static_cast<double>(hash(seed + 31u * idx) % 255u + 1u) * 0x1p-40;
  } else if constexpr (std::is_same<Mem, int>::value) {
    return value_at<Mem>(seed, idx) + (1 << 25) + static_cast<int>(hash(seed + 31u * idx) % 255u);
  } else {
    return value_at<Mem>(seed, idx);
  }
}
template <class Mem> __device__ Mem twice(Mem v) {
  if constexpr (std::is_same<Mem, double>::value || std::is_same<Mem, int>::value) return v + v;
  else return wmmae::convert<Mem>(2.0f * wmmae::to_float(v));  // small integers: exact
}
template <class Mem> __device__ Mem from_int(int v) { return wmmae::convert<Mem>(static_cast<float>(v)); }
// Exact for every element type (float would round f64 and large s32 values).
template <class S> __device__ double as_double(S v) {
  if constexpr (std::is_same<S, double>::value || std::is_same<S, int>::value) return static_cast<double>(v);
  else return static_cast<double>(wmmae::to_float(v));
}

// num / den rounded to the nearest integer, ties to even (den > 0), and clamped to Mem's range.
__device__ long long div_round_half_even(long long num, long long den) {
  long long q = num / den, r = num % den;
  if (r < 0) {
    r += den;
    q -= 1;
  }
  if (2 * r > den || (2 * r == den && (q & 1))) q += 1;
  return q;
}
template <class Mem> __device__ Mem clamp_to(long long v) {
  const long long lo = std::is_signed<Mem>::value ? -(1ll << (8 * sizeof(Mem) - 1)) : 0;
  const long long hi = std::is_signed<Mem>::value ? (1ll << (8 * sizeof(Mem) - 1)) - 1 : (1ll << (8 * sizeof(Mem))) - 1;
  return static_cast<Mem>(v < lo ? lo : v > hi ? hi : v);
}

template <class Frag>
__device__ int count_mismatch(const Frag& a, const Frag& b) {
  int bad = 0;
#pragma unroll
  for (int x = 0; x < Frag::num_elements; ++x) bad += as_double(a.x[x]) != as_double(b.x[x]);
  return bad;
}

template <class Frag, class Mem>
__device__ void load_ref(Frag& f, const Mem* p, unsigned ldm) {
  if constexpr (wmmae::fragment_traits<Frag>::use == Use::accumulator) wmma::load_matrix_sync(f, p, ldm, wmma::mem_row_major);
  else wmma::load_matrix_sync(f, p, ldm);
}

template <class Frag, class Mem>
__global__ void check_kernel(unsigned seed, int* errors, int* table) {
  using Tr = wmmae::fragment_traits<Frag>;
  constexpr wmmae::CoreLayout L = Tr::layout;
  constexpr bool kRowMajor = Tr::order != Order::col_major;
  constexpr int R = L.rows, C = L.cols;
  __shared__ __align__(32) Mem tile[kLd * kLd];
  __shared__ __align__(32) Mem odd[kLd * kLd + 8];
  __shared__ int visits[32 * 32];
  const int lane = threadIdx.x;
  int err[kNumChecks] = {};
  auto at = [](int i, int j) { return kRowMajor ? i * kLd + j : j * kLd + i; };
  // Reference fragments: `tile` filled with value_of(i, j), then loaded by plain WMMA.
  auto load_reference = [&](Frag& out, auto value_of) {
    __syncwarp();
    for (int idx = lane; idx < kLd * kLd; idx += 32) {
      const int i = kRowMajor ? idx / kLd : idx % kLd, j = kRowMajor ? idx % kLd : idx / kLd;
      tile[idx] = value_of(i, j);
    }
    __syncwarp();
    load_ref(out, tile, kLd);
  };
  // ... with value_of(e) along the first column (A, accumulators) or row (B), zero elsewhere.
  constexpr bool kVectorColumn = Tr::use != Use::matrix_b;
  constexpr int kVectorLength = kVectorColumn ? R : C;
  const Mem zero = from_int<Mem>(0);
  auto load_vector_reference = [&](Frag& out, auto value_of) {
    load_reference(out, [&](int i, int j) {
      const int along = kVectorColumn ? i : j, across = kVectorColumn ? j : i;
      return across == 0 && along < kVectorLength ? value_of(along) : zero;
    });
  };

  // Compile-time map, as the device sees it.
  Frag f0;
  wmmae::foreach(f0, [&](int x, int i, int j) {
    table[(lane * L.num_elements + x) * 2] = i;
    table[(lane * L.num_elements + x) * 2 + 1] = j;
  });

  // foreach_ij coverage and map() as its inverse.
  for (int i = lane; i < 32 * 32; i += 32) visits[i] = 0;
  __syncwarp();
  wmmae::foreach_ij(f0, [&](auto xs, int i, int j) {
    atomicAdd(&visits[i * 32 + j], xs.count);
    for (int c = 0; c < xs.count; ++c) {
      const wmmae::RowCol rc = L.at(lane, xs.x(c));
      err[kForeachIjCoverage] += rc.row != i || rc.col != j;
    }
  });
  __syncwarp();
  for (int idx = lane; idx < R * C; idx += 32) {
    const int i = idx / C, j = idx % C;
    const wmmae::Holders h = wmmae::map<Frag>(i, j);
    err[kForeachIjCoverage] += visits[i * 32 + j] != h.count || h.count == 0;
    for (int c = 0; c < h.count; ++c) {
      const wmmae::RowCol rc = L.at(h.lane[c], h.x[c]);
      err[kMapInverse] += rc.row != i || rc.col != j;
    }
  }

  // foreach_diagonal: every holder of a diagonal element once (with its row), nothing off the diagonal.
  __syncwarp();
  for (int i = lane; i < 32 * 32; i += 32) visits[i] = 0;
  __syncwarp();
  wmmae::foreach_diagonal(f0, [&](auto xs, int i) {
    atomicAdd(&visits[i * 32 + i], xs.count);
    for (int c = 0; c < xs.count; ++c) {
      const wmmae::RowCol rc = L.at(lane, xs.x(c));
      err[kForeachDiagonal] += rc.row != i || rc.col != i;
    }
  });
  __syncwarp();
  for (int idx = lane; idx < 32 * 32; idx += 32) {
    const int i = idx / 32, j = idx % 32;
    const int expected = i == j && i < R && j < C ? wmmae::map<Frag>(i, j).count : 0;
    err[kForeachDiagonal] += visits[idx] != expected;
  }

  // load_matrix_with_op(identity) == load_matrix_sync, on random values.
  for (int idx = lane; idx < kLd * kLd; idx += 32) tile[idx] = value_at<Mem>(seed, idx);
  __syncwarp();
  Frag ref, got, got2;
  load_ref(ref, tile, kLd);
  if constexpr (Tr::use == Use::accumulator) {
    wmmae::load_matrix_with_op(got, tile, kLd, wmma::mem_row_major, [](Mem v) { return v; });
  } else {
    wmmae::load_matrix_with_op(got, tile, kLd, [](Mem v) { return v; });
  }
  err[kLoadWithOpIdentity] += count_mismatch(ref, got);

  // Partial tile at an odd ldm from an unaligned base: equals load_matrix_sync of a padded aligned copy.
  const int ldm_odd = (kRowMajor ? C : R) + 3;
  const int rows = R - 3, cols = C - 5 > 0 ? C - 5 : 1;
  const Mem fill = from_int<Mem>(5);
  Mem* src = odd + 1;
  for (int idx = lane; idx < kLd * kLd; idx += 32) src[idx] = value_at<Mem>(seed + 1, idx);
  load_reference(ref, [&](int i, int j) {
    return i < rows && j < cols ? src[kRowMajor ? i * ldm_odd + j : j * ldm_odd + i] : fill;
  });
  if constexpr (Tr::use != Use::accumulator) {
    wmmae::load_matrix_with_op(got, static_cast<const Mem*>(src), ldm_odd, wmmae::TileBounds{rows, cols}, fill,
                               [](Mem v) { return v; });
    err[kPartialOddLdm] += count_mismatch(ref, got);
    // Multi-fragment form: two fragments from one pass.
    wmmae::load_matrices_with_op(static_cast<const Mem*>(src), ldm_odd, wmmae::TileBounds{rows, cols}, fill,
                                 [](Mem v, int, int, auto xs, Frag& a, Frag& b) {
                                   wmmae::assign(a, xs, v);
                                   wmmae::assign(b, xs, v);
                                 }, got, got2);
    err[kMultiLoad] += count_mismatch(ref, got) + count_mismatch(ref, got2);
  }

  // load_vector == zero-padded tile with the vector in its first column (A, accumulators) / first row (B).
  {
    const int count = kVectorLength - 2;
    load_vector_reference(ref, [&](int e) { return e < count ? src[e * 3] : zero; });
    wmmae::load_vector(got, static_cast<const Mem*>(src), count, 1.0f, 3);
    err[kLoadVector] += count_mismatch(ref, got);
    // Scaled by 2: the tile holds the doubled values, the vector the wide ones.
    __syncwarp();
    for (int idx = lane; idx < kLd * kLd; idx += 32) src[idx] = wide_value_at<Mem>(seed + 3, idx);
    load_vector_reference(ref, [&](int e) { return e < count ? twice(src[e]) : zero; });
    wmmae::load_vector(got, static_cast<const Mem*>(src), count, 2.0f);
    err[kLoadVectorScaled] += count_mismatch(ref, got);
  }

  // store_vector: the first column (unscaled: the plain-copy path) and the first row (scaled by 2: the
  // converting path) of a fragment loaded from a random tile; the slots past `count` keep their sentinel.
  {
    __syncwarp();
    for (int idx = lane; idx < kLd * kLd; idx += 32) tile[idx] = wide_value_at<Mem>(seed + 2, idx);
    Mem* column = odd;
    Mem* row = odd + kLd;
    const Mem sentinel = from_int<Mem>(99);
    for (int idx = lane; idx < 2 * kLd; idx += 32) odd[idx] = sentinel;
    __syncwarp();
    load_ref(ref, tile, kLd);
    const int column_count = R - 1, row_count = C - 3;
    wmmae::store_vector<Frag, Mem, wmmae::VectorAs::column0>(column, ref, column_count);
    wmmae::store_vector<Frag, Mem, wmmae::VectorAs::row0>(row, ref, row_count, 2.0f);
    __syncwarp();
    for (int e = lane; e < kLd; e += 32) {
      const double column_expected = e < column_count ? as_double(tile[at(e, 0)]) : 99.0;
      const double row_expected = e < row_count ? 2.0 * as_double(tile[at(0, e)]) : 99.0;
      err[kStoreVector] += (as_double(column[e]) != column_expected) + (as_double(row[e]) != row_expected);
    }
  }

  // Integer results. Operands (s8/u8): load_vector at scales 1/2 (ties), 20 (saturation high) and -1 (u8: low).
  if constexpr (Tr::use != Use::accumulator && std::is_integral<Mem>::value) {
    const int scales[3][2] = {{1, 2}, {20, 1}, {-1, 1}};  // numerator, denominator
    for (int s = 0; s < 3; ++s) {
      load_vector_reference(ref, [&](int e) {
        return clamp_to<Mem>(div_round_half_even(static_cast<long long>(src[e]) * scales[s][0], scales[s][1]));
      });
      wmmae::load_vector(got, static_cast<const Mem*>(src), kVectorLength,
                         static_cast<float>(scales[s][0]) / scales[s][1]);
      err[kIntegerResults] += count_mismatch(ref, got);
    }
    // assign converts as load_vector's results are rounded: 200.5 to 200 (ties to even; s8: saturated at 127) and
    // -300 saturated (s8: -128, u8: 0), on a checkerboard.
    load_reference(ref, [&](int i, int j) { return clamp_to<Mem>((i + j) % 2 ? -300 : 200); });
    wmmae::foreach_ij(got, [&](auto xs, int i, int j) { wmmae::assign(got, xs, (i + j) % 2 ? -300.0f : 200.5f); });
    err[kIntegerResults] += count_mismatch(ref, got);
  }
  // s32 accumulators: store_vector at scale (2^23 + 1) / 2^24, whose products of up to 55 bits can round (in
  // double) onto a tie that the exact product lies off (2^31 - 1 does), and at scale 3, which saturates.
  if constexpr (Tr::use == Use::accumulator && std::is_same<Mem, int>::value) {
    __syncwarp();
    for (int idx = lane; idx < kLd * kLd; idx += 32) {
      const int magnitude = 0x7fffffff - static_cast<int>(hash(seed * 3u + idx) % 100000u);
      tile[idx] = idx == 0 ? 0x7fffffff : (hash(seed + idx) & 1u) ? magnitude : -magnitude;
    }
    int* const out = visits;
    for (int idx = lane; idx < 2 * kLd; idx += 32) out[idx] = 99;
    __syncwarp();
    load_ref(ref, tile, kLd);
    wmmae::store_vector<Frag, int, wmmae::VectorAs::column0>(out, ref, R, 0.5f + 0x1p-24f);
    wmmae::store_vector<Frag, int, wmmae::VectorAs::column0>(out + kLd, ref, R, 3.0f);
    __syncwarp();
    for (int e = lane; e < R; e += 32) {
      const long long v = tile[at(e, 0)];
      err[kIntegerResults] += out[e] != div_round_half_even(v * ((1 << 23) + 1), 1 << 24);
      err[kIntegerResults] += out[kLd + e] != clamp_to<int>(3 * v);
    }
  }
  // float accumulators stored as int: NaN, ties, out-of-range values and values below one half.
  if constexpr (Tr::use == Use::accumulator && std::is_same<Mem, float>::value) {
    constexpr int kCases = 8;
    const float value[kCases] = {__int_as_float(0x7fc00000), 2.5f, -2.5f, 3.5f, 3e9f, -3e9f, -0.5f, 1e-30f};
    const int expected[kCases] = {0, 2, -2, 4, 0x7fffffff, -0x7fffffff - 1, 0, 0};
    Frag acc;
    wmmae::foreach(acc, [&](int x, int i, int) { acc.x[x] = i < kCases ? value[i] : 1.0f; });
    __syncwarp();
    for (int idx = lane; idx < kLd; idx += 32) visits[idx] = 99;
    __syncwarp();
    wmmae::store_vector<Frag, int, wmmae::VectorAs::column0>(visits, acc, kCases);
    __syncwarp();
    for (int e = lane; e < kLd; e += 32) err[kIntegerResults] += visits[e] != (e < kCases ? expected[e] : 99);
  }

  // make_identity == alpha * I loaded from memory.
  load_reference(ref, [&](int i, int j) { return from_int<Mem>(i == j ? 3 : 0); });
  wmmae::make_identity(got, 3.0f);
  err[kMakeIdentity] += count_mismatch(ref, got);

  // fill_zero over a fragment whose every element is non-zero == fill_fragment with zero.
  {
    using S = typename Tr::storage_type;
    wmmae::foreach(got, [&](int x, int, int) { got.x[x] = wmmae::convert<S>(5.0f); });
#pragma unroll
    for (int x = 0; x < Frag::num_elements; ++x) err[kFillZero] += as_double(got.x[x]) == 0.0;  // every one written
    wmmae::fill_zero(got);
    wmma::fill_fragment(ref, wmmae::convert<S>(0.0f));
    err[kFillZero] += count_mismatch(ref, got);
  }

  // Accumulators: bounded store_matrix_with_op == store_matrix_sync inside the bounds, untouched outside.
  if constexpr (Tr::use == Use::accumulator) {
    Frag acc;
    wmmae::foreach(acc, [&](int x, int i, int j) { acc.x[x] = from_int<Mem>((i * 5 + j * 3 + static_cast<int>(seed % 1000u)) % 23 - 11); });
    __syncwarp();
    wmma::store_matrix_sync(tile, acc, kLd, wmma::mem_row_major);
    for (int idx = lane; idx < kLd * kLd; idx += 32) odd[idx] = from_int<Mem>(99);
    __syncwarp();
    wmmae::store_matrix_with_op(odd, acc, kLd, wmma::mem_row_major, wmmae::TileBounds{rows, cols},
                                [](Mem v, int, int) { return v; });
    __syncwarp();
    for (int idx = lane; idx < R * C; idx += 32) {
      const int i = idx / C, j = idx % C;
      const double expected = (i < rows && j < cols) ? as_double(tile[at(i, j)]) : 99.0;
      err[kStoreWithOp] += as_double(odd[at(i, j)]) != expected;
    }
  }
  // Accumulators with side-by-side cores: the quads written out == store_matrix_sync, each element once.
  if constexpr (Tr::use == Use::accumulator && wmmae::has_row_quads<Frag>()) {
    Frag acc;
    wmmae::foreach(acc, [&](int x, int i, int j) { acc.x[x] = from_int<Mem>((i * 7 + j * 5 + static_cast<int>(seed % 997u)) % 29 - 14); });
    __syncwarp();
    wmma::store_matrix_sync(tile, acc, kLd, wmma::mem_row_major);
    for (int idx = lane; idx < 32 * 32; idx += 32) visits[idx] = 0;
    __syncwarp();
    wmmae::foreach_row_quad(acc, [&](int i, int j, const wmmae::RowQuad<typename Tr::storage_type>& quad) {
      err[kRowQuads] += j % 4 != 0;
      for (int e = 0; e < 4; ++e) {
        atomicAdd(&visits[i * 32 + j + e], 1);
        err[kRowQuads] += as_double(quad.v[e]) != as_double(tile[at(i, j + e)]);
      }
    });
    __syncwarp();
    for (int idx = lane; idx < R * C; idx += 32) err[kRowQuads] += visits[(idx / C) * 32 + idx % C] != 1;
  }

  // --- Rounding of scaled vectors and of alpha, ops that are used, load_vector's edges ---
  // Products that a first rounding (to float, or to double) puts on a tie of the destination type; the values
  // were found, and their correctly rounded products worked out, in exact rational arithmetic.
  if constexpr (std::is_same<Mem, __half>::value || std::is_same<Mem, __nv_bfloat16>::value) {
    constexpr bool kHalf = std::is_same<Mem, __half>::value;
    const float v[1] = {kHalf ? 1611.0f / 1024.0f : 217.0f / 128.0f};
    const float scale = kHalf ? 4041997.0f * 0x1p-21f : 949517.0f * 0x1p-19f;
    const Mem expected = wmmae::convert<Mem>(kHalf ? 3.033203125f : 3.078125f);  // (float: 3.03125, 3.0625)
    load_vector_reference(ref, [&](int e) { return e == 0 ? expected : zero; });
    wmmae::load_vector(got, v, 1, scale);
    err[kScaleRoundedOnce] += count_mismatch(ref, got);
    wmmae::load_vector(got, v, 1, static_cast<double>(scale));
    err[kScaleRoundedOnce] += count_mismatch(ref, got);
  }
  if constexpr (std::is_same<typename Tr::storage_type, float>::value) {  // tf32 operands, float accumulators
    const float v[1] = {1.5625f};
    const double scale = 0x1.94f58e147ae14p-1;                            // (double first: 0x1.3c5fd8p+0)
    load_vector_reference(ref, [&](int e) { return e == 0 ? 0x1.3c5fd6p+0f : 0.0f; });
    wmmae::load_vector(got, v, 1, scale);
    err[kScaleRoundedOnce] += count_mismatch(ref, got);
  }
  if constexpr (Tr::use == Use::accumulator && std::is_same<Mem, int>::value) {
    // 1619001343 * (1 + 2^-23) to float (double first: 1619001600).
    __shared__ float stored[2];
    Frag acc;
    wmmae::foreach(acc, [&](int x, int i, int j) { acc.x[x] = i == 0 && j == 0 ? 1619001343 : 1; });
    if (lane < 2) stored[lane] = 99.0f;
    __syncwarp();
    wmmae::store_vector<Frag, float, wmmae::VectorAs::column0>(stored, acc, 1, 1.0f + 0x1p-23f);
    __syncwarp();
    err[kScaleRoundedOnce] += lane == 0 && (stored[0] != 1619001472.0f || stored[1] != 99.0f);
  }

  // make_identity with a double alpha just off a tie of the storage type (through float it would be the tie).
  {
    using S = typename Tr::storage_type;
    double alpha, expected;
    if constexpr (std::is_same<S, double>::value) alpha = expected = 3.0 + 0x1p-40;
    else if constexpr (std::is_same<S, __half>::value) alpha = 1.0 + 0x1p-11 + 0x1p-40, expected = 1.0 + 0x1p-10;
    else if constexpr (std::is_same<S, __nv_bfloat16>::value) alpha = 1.0 + 0x1p-8 + 0x1p-40, expected = 1.0 + 0x1p-7;
    else if constexpr (std::is_same<S, float>::value) alpha = 1.0 + 0x1p-24 + 0x1p-40, expected = 1.0 + 0x1p-23;
    else alpha = 2.5 + 0x1p-40, expected = 3.0;  // integers: nearest, not the tie's even 2
    load_reference(ref, [&](int i, int j) { return i == j ? wmmae::convert<Mem>(expected) : zero; });
    wmmae::make_identity(got, alpha);
    err[kWideAlpha] += count_mismatch(ref, got);
  }

  // Ops that change the values: element (i, j) of the loaded fragment is 2 * memory + 1 (exact small integers).
  {
    auto twice_plus_one = [](Mem v) { return 2.0 * as_double(v) + 1.0; };
    __syncwarp();
    for (int idx = lane; idx < kLd * kLd; idx += 32) src[idx] = value_at<Mem>(seed + 5, idx);
    __syncwarp();
    for (int idx = lane; idx < kLd * kLd; idx += 32) tile[idx] = wmmae::convert<Mem>(twice_plus_one(src[idx]));
    __syncwarp();
    if constexpr (Tr::use == Use::accumulator) {
      // Column-major memory: (i, j) at j * kLd + i.
      wmma::load_matrix_sync(ref, tile, kLd, wmma::mem_col_major);
      wmmae::load_matrix_with_op(got, static_cast<const Mem*>(src), kLd, wmma::mem_col_major, twice_plus_one);
    } else {
      load_ref(ref, tile, kLd);
      wmmae::load_matrix_with_op(got, static_cast<const Mem*>(src), kLd, twice_plus_one);
    }
    err[kWithOpUsed] += count_mismatch(ref, got);
  }
  if constexpr (Tr::use == Use::accumulator) {
    // Stored column-major through op(v, i, j) = 2v + i - j, every element inside the bounds.
    Frag acc;
    wmmae::foreach(acc, [&](int x, int i, int j) {
      acc.x[x] = from_int<Mem>((i * 3 + j * 7 + static_cast<int>(seed % 89u)) % 19 - 9);
    });
    __syncwarp();
    wmma::store_matrix_sync(tile, acc, kLd, wmma::mem_row_major);
    for (int idx = lane; idx < kLd * kLd; idx += 32) odd[idx] = from_int<Mem>(99);
    __syncwarp();
    wmmae::store_matrix_with_op(odd, acc, kLd, wmma::mem_col_major, wmmae::TileBounds{R, C},
                                [](Mem v, int i, int j) { return 2.0 * as_double(v) + i - j; });
    __syncwarp();
    for (int idx = lane; idx < kLd * kLd; idx += 32) {
      const int j = idx / kLd, i = idx % kLd;  // column-major
      const double expected = i < R && j < C ? 2.0 * as_double(tile[i * kLd + j]) + i - j : 99.0;
      err[kWithOpUsed] += as_double(odd[idx]) != expected;
    }
  }

  // load_vector's edges, over a fragment of non-zero values: count 0 or negative (all zero), a count past the
  // tile (the tile's length), a negative stride (the vector read backwards), stride 0 (one value repeated),
  // and infinities scaled (still infinite).
  {
    __syncwarp();
    for (int idx = lane; idx < kLd * kLd; idx += 32) src[idx] = value_at<Mem>(seed + 6, idx);
    __syncwarp();
    wmmae::foreach(got, [&](int x, int, int) { got.x[x] = wmmae::convert<typename Tr::storage_type>(5.0f); });
    load_vector_reference(ref, [&](int) { return zero; });
    wmmae::load_vector(got, static_cast<const Mem*>(src), 0);
    err[kLoadVectorEdges] += count_mismatch(ref, got);
    wmmae::foreach(got, [&](int x, int, int) { got.x[x] = wmmae::convert<typename Tr::storage_type>(5.0f); });
    wmmae::load_vector(got, static_cast<const Mem*>(src), -5);
    err[kLoadVectorEdges] += count_mismatch(ref, got);
    load_vector_reference(ref, [&](int e) { return src[e]; });
    wmmae::load_vector(got, static_cast<const Mem*>(src), 1000);
    err[kLoadVectorEdges] += count_mismatch(ref, got);
    load_vector_reference(ref, [&](int e) { return src[kVectorLength - 1 - e]; });
    wmmae::load_vector(got, static_cast<const Mem*>(src) + kVectorLength - 1, kVectorLength, 1.0f, -1);
    err[kLoadVectorEdges] += count_mismatch(ref, got);
    load_vector_reference(ref, [&](int) { return src[3]; });
    wmmae::load_vector(got, static_cast<const Mem*>(src) + 3, kVectorLength, 1.0f, 0);
    err[kLoadVectorEdges] += count_mismatch(ref, got);
    if constexpr (!std::is_integral<Mem>::value) {
      const Mem inf = wmmae::convert<Mem>(__int_as_float(0x7f800000));
      const Mem minus_inf = wmmae::convert<Mem>(__int_as_float(0xff800000));
      if (lane == 0) {
        src[0] = inf;
        src[1] = minus_inf;
      }
      __syncwarp();
      load_vector_reference(ref, [&](int e) { return e < 2 ? src[e] : twice(src[e]); });
      wmmae::load_vector(got, static_cast<const Mem*>(src), kVectorLength, 2.0f);
      err[kLoadVectorEdges] += count_mismatch(ref, got);
      wmmae::load_vector(got, static_cast<const Mem*>(src), kVectorLength, 2.0);
      err[kLoadVectorEdges] += count_mismatch(ref, got);
    }
  }
  for (int c = 0; c < kNumChecks; ++c) atomicAdd(&errors[c], err[c]);
}

std::tuple<at::Tensor, at::Tensor> check(c10::string_view use, int64_t m, int64_t n, int64_t k, c10::string_view dtype,
                                         std::optional<c10::string_view> layout, int64_t seed) {
  const wmmae_ops::FragmentSpec spec = wmmae_ops::parse_fragment_spec(use, m, n, k, dtype, layout);
  const wmmae::CoreLayout L = wmmae_ops::require_sm80_layout(spec);
  const auto opts = at::TensorOptions().dtype(at::kInt).device(at::kCUDA);
  at::Tensor errors = at::zeros({kNumChecks}, opts);
  at::Tensor table = at::full({32, L.num_elements, 2}, -1, opts);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  wmmae_ops::dispatch_fragment(spec, [&](auto frag_tag, auto mem_tag) {
    using Frag = typename decltype(frag_tag)::type;
    using Mem = typename decltype(mem_tag)::type;
    check_kernel<Frag, Mem><<<1, 32, 0, stream>>>(static_cast<unsigned>(seed), errors.data_ptr<int>(),
                                                  table.data_ptr<int>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {errors, table};
}

// out[form][part][i], part 0 hi, 1 lo; forms: split_fp16, split_fp16x2, split_fp16_compensated,
// split_fp16x2_compensated (the x2 forms take values in pairs).
__global__ void split_kernel(const float* v, __half* out, int64_t n) {
  const int64_t pair = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (2 * pair >= n) return;
  const int64_t i = 2 * pair;
  auto put = [&](int form, int64_t at, __half hi, __half lo) {
    out[(2 * form) * n + at] = hi;
    out[(2 * form + 1) * n + at] = lo;
  };
  __half hi, lo;
  __half2 hi2, lo2;
  for (int64_t at = i; at < i + 2; ++at) {
    wmmae::split_fp16<wmmae::DeviceHalfRounding>(v[at], hi, lo);
    put(0, at, hi, lo);
    wmmae::split_fp16_compensated<wmmae::DeviceHalfRounding>(v[at], hi, lo);
    put(2, at, hi, lo);
  }
  wmmae::split_fp16x2(v[i], v[i + 1], hi2, lo2);
  put(1, i, __low2half(hi2), __low2half(lo2));
  put(1, i + 1, __high2half(hi2), __high2half(lo2));
  wmmae::split_fp16x2_compensated(v[i], v[i + 1], hi2, lo2);
  put(3, i, __low2half(hi2), __low2half(lo2));
  put(3, i + 1, __high2half(hi2), __high2half(lo2));
}

at::Tensor split_fp16(const at::Tensor& values) {
  TORCH_CHECK(values.is_cuda() && values.scalar_type() == at::kFloat && values.dim() == 1 && values.is_contiguous() &&
                  values.numel() % 2 == 0,
              "split_fp16: values must be a contiguous 1-D float32 CUDA tensor of even length");
  const int64_t n = values.numel();
  at::Tensor out = at::full({4, 2, n}, std::numeric_limits<float>::quiet_NaN(), values.options().dtype(at::kHalf));
  if (n == 0) return out;
  const int threads = 256;
  const int64_t blocks = (n / 2 + threads - 1) / threads;
  split_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
      values.data_ptr<float>(), reinterpret_cast<__half*>(out.data_ptr<at::Half>()), n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace

TORCH_LIBRARY(wmmae_test, m) {
  m.def("check(str use, int m, int n, int k, str dtype, str? layout, int seed) -> (Tensor, Tensor)");
  m.impl("check", c10::DispatchKey::CompositeExplicitAutograd, TORCH_FN(check));
  m.def("split_fp16(Tensor values) -> Tensor");
  m.impl("split_fp16", c10::DispatchKey::CUDA, TORCH_FN(split_fp16));
}
