// Fragment primitives built on the layout descriptors: fragments made and read in registers, without
// going through memory. Every function here that takes a fragment is warp-collective: all 32 lanes of a warp
// call it together (as for nvcuda::wmma::load_matrix_sync), with the same arguments except where noted. `map`
// and `has_row_quads` are compile-time layout queries (host and device).
//
// Loops run over compile-time element indices, so each lane's (row, col) arithmetic folds to a few
// integer operations on its lane id and the fragment's registers are never indexed at run time.
#pragma once

#include <type_traits>

#include "fragment_traits.hpp"

namespace wmmae {

// ------------------------------------------------------------------------------------------------------
// Small helpers
// ------------------------------------------------------------------------------------------------------

__device__ __forceinline__ int lane_id() {
  unsigned lane;
  asm("mov.u32 %0, %%laneid;" : "=r"(lane));
  return static_cast<int>(lane);
}

// Explicit conversions between element types (PyTorch builds with __CUDA_NO_HALF_CONVERSIONS__, so the
// 16-bit types never convert implicitly).
template <class T> __device__ __forceinline__ float to_float(T v) { return static_cast<float>(v); }
template <> __device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

namespace detail {

// Types whose values float cannot all hold: conversions and products involving them go through double.
template <class T> constexpr bool is_wide = std::is_same<T, double>::value || std::is_integral<T>::value;

template <class T> __device__ __forceinline__ double to_double(T v) {
  if constexpr (std::is_arithmetic<T>::value) return static_cast<double>(v);
  else return static_cast<double>(to_float(v));  // (16-bit types: exact)
}

// The integer nearest to x + residual (ties to even), saturated at S's range; NaN gives 0 (as cvt.rni.sat).
// residual: where x was itself rounded from an exact value x + residual (a product), that value decides the
// ties of x, which it may lie just off.
template <class S>
__device__ __forceinline__ S to_integer(double x, double residual = 0.0) {
  static_assert(sizeof(S) <= 4, "wmmae: integer conversions are defined for types of up to 32 bits");
  if (x != x) return S(0);
  double q = rint(x);
  if (residual != 0.0 && fabs(x - trunc(x)) == 0.5) q = residual > 0.0 ? ceil(x) : floor(x);
  // (std::numeric_limits is host-only without --expt-relaxed-constexpr)
  constexpr int kValueBits = 8 * static_cast<int>(sizeof(S)) - (std::is_signed<S>::value ? 1 : 0);
  constexpr double kHi = static_cast<double>((1ull << kValueBits) - 1);
  constexpr double kLo = std::is_signed<S>::value ? -kHi - 1.0 : 0.0;
  return static_cast<S>(fmin(fmax(q, kLo), kHi));
}

}  // namespace detail

// v as a To, rounded to nearest: floating-point results ties to even; integer results too, saturated at the
// type's range, NaN giving 0. Values of double and integer types convert through double, the others through
// float (exact either way).
template <class To, class From>
__device__ __forceinline__ To convert(From v) {
  constexpr bool kWide = detail::is_wide<From>;
  if constexpr (std::is_same<To, From>::value) {
    return v;
  } else if constexpr (std::is_integral<To>::value) {
    return detail::to_integer<To>(detail::to_double(v));
  } else if constexpr (std::is_same<To, __half>::value) {
    if constexpr (kWide) return __double2half(detail::to_double(v));
    else return __float2half_rn(to_float(v));
  } else if constexpr (std::is_same<To, __nv_bfloat16>::value) {
    if constexpr (kWide) return __double2bfloat16(detail::to_double(v));
    else return __float2bfloat16_rn(to_float(v));
  } else if constexpr (kWide || detail::is_wide<To>) {
    return static_cast<To>(detail::to_double(v));
  } else {
    return static_cast<To>(to_float(v));
  }
}

namespace detail {

// Calls f(std::integral_constant<int, I>) for I = Begin .. End-1: the index is a compile-time constant in
// f's body, so fragment registers are never indexed at run time (which would move them to local memory).
template <int Begin, int End, class F>
__device__ __forceinline__ void static_for(F&& f) {
  if constexpr (Begin < End) {
    f(std::integral_constant<int, Begin>{});
    static_for<Begin + 1, End>(f);
  }
}

}  // namespace detail

// The fragment element indices that hold one tile element: First, First + Period, ... (Count of them;
// more than one where the fragment repeats its elements, e.g. half m16n16k16 operands on sm_80+).
template <int First, int Period, int Count>
struct ElementIndices {
  static constexpr int first = First;
  static constexpr int count = Count;
  WMMAE_HD static constexpr int x(int c) { return First + c * Period; }
};

// Stores value, converted to the fragment's storage type as convert rounds it (the same for every copy), into
// each element of `indices`.
template <class Frag, int First, int Period, int Count, class V>
__device__ __forceinline__ void assign(Frag& frag, ElementIndices<First, Period, Count>, V value) {
  const auto stored = convert<typename fragment_traits<Frag>::storage_type>(value);
  detail::static_for<0, Count>([&](auto c) { frag.x[First + decltype(c)::value * Period] = stored; });
}

// A partial tile: elements at row >= rows or col >= cols are outside the matrix.
struct TileBounds {
  int rows;
  int cols;
  __device__ bool contains(int i, int j) const { return i < rows && j < cols; }
};

// ------------------------------------------------------------------------------------------------------
// foreach / foreach_ij / map
// ------------------------------------------------------------------------------------------------------

// f(x, i, j) for every element x of this lane's fragment (repeated elements included): (i, j) is the
// element's position in the tile.
template <class Frag, class F>
__device__ __forceinline__ void foreach(const Frag&, F&& f) {
  using Tr = fragment_traits<Frag>;
  const int lane = lane_id();
  detail::static_for<0, Tr::layout.num_elements>([&](auto x) {
    const RowCol rc = Tr::template position<decltype(x)::value>(lane);
    f(decltype(x)::value, rc.row, rc.col);
  });
}

// f(xs, i, j) once for every distinct tile element (i, j) this lane holds; xs (an ElementIndices) lists
// the fragment element indices that hold it. Write the callback as a generic lambda: [&](auto xs, int i, int j).
template <class Frag, class F>
__device__ __forceinline__ void foreach_ij(const Frag&, F&& f) {
  using Tr = fragment_traits<Frag>;
  const int lane = lane_id();
  detail::static_for<0, Tr::layout.period()>([&](auto u) {
    const RowCol rc = Tr::template position<decltype(u)::value>(lane);
    f(ElementIndices<decltype(u)::value, Tr::layout.period(), Tr::layout.copies()>{}, rc.row, rc.col);
  });
}

// f(xs, i) once for every element (i, i) of the tile's diagonal that this lane holds (xs as in foreach_ij).
// Cheaper than foreach_ij with an i == j test: elements that can never be on the diagonal are dropped at
// compile time, and each remaining one costs a comparison of a per-lane key with a constant (layout.hpp).
template <class Frag, class F>
__device__ __forceinline__ void foreach_diagonal(const Frag&, F&& f) {
  using Tr = fragment_traits<Frag>;
  const int lane = lane_id();
  const int key = diagonal_key(Tr::layout.run, lane);
  detail::static_for<0, Tr::layout.period()>([&](auto u) {
    constexpr int x = decltype(u)::value;
    constexpr CoreLayout L = Tr::layout;  // a local copy: the lambda must not odr-use the member
    if constexpr (can_be_on_diagonal(L, x)) {
      if (key == diagonal_offset(L, x)) f(ElementIndices<x, L.period(), L.copies()>{}, Tr::template position<x>(lane).row);
    }
  });
}

// Which (lane, x) pairs hold tile element (i, j): the inverse of foreach_ij. Host and device.
template <class Frag>
WMMAE_HD constexpr Holders map(int i, int j) {
  constexpr CoreLayout L = fragment_traits<Frag>::layout;  // a local copy: device code may not odr-use the member
  return holders_of(L, i, j);
}

// ------------------------------------------------------------------------------------------------------
// Fragments made in registers
// ------------------------------------------------------------------------------------------------------

template <class Frag>
__device__ __forceinline__ void fill_zero(Frag& frag) {
  using S = typename fragment_traits<Frag>::storage_type;
  constexpr int kElements = fragment_traits<Frag>::layout.num_elements;  // (Frag::num_elements, checked there)
#pragma unroll
  for (int x = 0; x < kElements; ++x) frag.x[x] = convert<S>(0.0f);
}

// alpha * I (paper section 4.2): for accumulators (alpha*I + A*B in one mma) and for operands.
// alpha keeps its type until it is rounded to the storage type (a double alpha stays exact for f64 fragments).
template <class Frag, class Alpha>
__device__ __forceinline__ void make_identity(Frag& frag, Alpha alpha) {
  using S = typename fragment_traits<Frag>::storage_type;
  const S diagonal = convert<S>(alpha), zero = convert<S>(0.0f);
  foreach_ij(frag, [&](auto xs, int i, int j) { assign(frag, xs, i == j ? diagonal : zero); });
}

namespace detail {

// Scales: floating-point or integers of up to 32 bits (double holds those exactly).
template <class Scale>
constexpr bool is_scale =
    std::is_floating_point<Scale>::value || (std::is_integral<Scale>::value && sizeof(Scale) <= 4);

// a * b rounded to odd: truncated, with its last bit set where the product is inexact. Rounding that once more
// to a type of at least two significant bits fewer gives a * b rounded once (Boldo and Melquiond's round-to-odd),
// which rounding a to-nearest product again does not (a tie made by the first rounding). The product is exact
// where rounding up and rounding down agree; infinities and NaN pass through.
__device__ __forceinline__ float product_rounded_to_odd(float a, float b) {
  const float truncated = __fmul_rz(a, b);
  if (__fmul_ru(a, b) == __fmul_rd(a, b) || !isfinite(truncated)) return truncated;
  return __int_as_float(__float_as_int(truncated) | 1);
}
__device__ __forceinline__ double product_rounded_to_odd(double a, double b) {
  const double truncated = __dmul_rz(a, b);
  if (__dmul_ru(a, b) == __dmul_rd(a, b) || !isfinite(truncated)) return truncated;
  return __longlong_as_double(__double_as_longlong(truncated) | 1ll);
}

}  // namespace detail

// v * scale as an S, the exact product rounded once as convert<S> rounds (floating point: to nearest, ties to
// even; integers: ties to even, saturated, NaN -> 0); convert<S>(v) where the scale is 1. The product is formed
// in float where v and scale are float-sized, in double otherwise; for a narrower destination it is rounded to
// odd there (above), and for an integer one its rounding error decides the ties.
template <class S, class T, class Scale = float>
__device__ __forceinline__ S scaled(T v, Scale scale) {
  static_assert(detail::is_scale<Scale>, "wmmae: a scale is a floating-point value or an integer of up to 32 bits");
  if (scale == Scale(1)) return convert<S>(v);  // (folds away where the scale is a constant)
  if constexpr (std::is_integral<S>::value) {
    const double a = detail::to_double(v), b = static_cast<double>(scale);
    const double product = a * b;
    return detail::to_integer<S>(product, fma(a, b, -product));
  } else if constexpr (std::is_same<S, double>::value) {
    return detail::to_double(v) * static_cast<double>(scale);  // rounded once, in double itself
  } else if constexpr (detail::is_wide<T> || detail::is_wide<Scale>) {
    // (convert rounds a double once, also to 16 bits: cvt.rn.f16.f64, and bf16's own round-to-odd before sm_90)
    return convert<S>(detail::product_rounded_to_odd(detail::to_double(v), static_cast<double>(scale)));
  } else if constexpr (std::is_same<S, float>::value) {
    return to_float(v) * static_cast<float>(scale);  // rounded once, in float itself
  } else {
    return convert<S>(detail::product_rounded_to_odd(to_float(v), static_cast<float>(scale)));
  }
}

// Where a vector goes in a tile: its first column (element i at (i, 0)) or its first row (at (0, i)).
enum class VectorAs { column0, row0 };

// The natural placement: the first column of A and the first row of B, so that A*B = u v^T.
template <class Frag>
constexpr VectorAs default_vector_placement() {
  return fragment_traits<Frag>::use == Use::matrix_b ? VectorAs::row0 : VectorAs::column0;
}

// The tile with ptr[0..count) * scale in its first column (or row) and zeros elsewhere, without a
// zero-padded tile in memory (paper section 4.1). Element e is read at ptr[e * stride]; elements past
// `count` are zero; only the lanes that hold the vector read memory, with no alignment requirement.
template <class Frag, class T, VectorAs Placement = default_vector_placement<Frag>(), class Scale = float>
__device__ __forceinline__ void load_vector(Frag& frag, const T* ptr, int count, Scale scale = 1.0f, long long stride = 1) {
  using S = typename fragment_traits<Frag>::storage_type;
  const S zero = convert<S>(0.0f);
  foreach_ij(frag, [&](auto xs, int i, int j) {
    const int along = Placement == VectorAs::column0 ? i : j;
    const int across = Placement == VectorAs::column0 ? j : i;
    S value = zero;
    if (across == 0 && along < count) value = scaled<S>(ptr[along * stride], scale);
    assign(frag, xs, value);
  });
}

// Writes the first column (or row) of a fragment to ptr[0..count): each element once.
template <class Frag, class T, VectorAs Placement = default_vector_placement<Frag>(), class Scale = float>
__device__ __forceinline__ void store_vector(T* ptr, const Frag& frag, int count, Scale scale = 1.0f) {
  foreach_ij(frag, [&](auto xs, int i, int j) {
    const int along = Placement == VectorAs::column0 ? i : j;
    const int across = Placement == VectorAs::column0 ? j : i;
    if (across == 0 && along < count) ptr[along] = scaled<T>(frag.x[xs.first], scale);
  });
}

// ------------------------------------------------------------------------------------------------------
// load_matrix_with_op (paper sections 4.3 and 4.4)
// ------------------------------------------------------------------------------------------------------

namespace detail {

template <class Frag, class... Frags>
struct same_layout {
  static constexpr CoreLayout a = fragment_traits<Frag>::layout;
  static constexpr bool value = true;
};
template <class Frag, class Next, class... Rest>
struct same_layout<Frag, Next, Rest...> {
  static constexpr CoreLayout a = fragment_traits<Frag>::layout, b = fragment_traits<Next>::layout;
  static constexpr bool value = equal_layouts(a, b) && same_layout<Next, Rest...>::value;
};

template <class Frag, class T, class Op, class... Frags>
__device__ __forceinline__ void load_with_op(const T* ptr, unsigned ldm, bool row_major_memory, const TileBounds* bounds,
                                    T fill, Op&& op, Frag& first, Frags&... rest) {
  static_assert(same_layout<Frag, Frags...>::value,
                "load_matrices_with_op: all fragments must share one register layout");
  // (The first fragment is checked by operand_row_major, which chose the memory layout; an accumulator can
  // share an operand's register layout, so the layouts alone do not catch it among the others.)
  static_assert((true && ... && (fragment_traits<Frags>::order != Order::none)),
                "wmmae: load_matrices_with_op takes operands (matrix_a, matrix_b) only; load an accumulator with "
                "load_matrix_with_op(frag, ptr, ldm, layout, op)");
  foreach_ij(first, [&](auto xs, int i, int j) {
    T value = fill;
    if (bounds == nullptr || bounds->contains(i, j)) {
      value = ptr[row_major_memory ? static_cast<long long>(i) * ldm + j : static_cast<long long>(j) * ldm + i];
    }
    op(value, i, j, xs, first, rest...);
  });
}

template <class Frag>
__device__ constexpr bool operand_row_major() {
  static_assert(fragment_traits<Frag>::order != Order::none,
                "wmmae: load_matrices_with_op and the bounded load_matrix_with_op take operands (matrix_a, matrix_b), "
                "whose memory layout is their own; load an accumulator with load_matrix_with_op(frag, ptr, ldm, "
                "layout, op)");
  return fragment_traits<Frag>::order == Order::row_major;
}

}  // namespace detail

// Multi-fragment form: the address of each element is computed once, and
// op(value, i, j, xs, frags...) fills all fragments at element indices xs (e.g. hi and lo parts of a
// split). The memory layout is the fragments' own (row_major/col_major operands). Any ldm, any alignment.
// (Not for a TileBounds op: with a named `fill`, the bounded form below would otherwise match this one too.)
template <class T, class Op, class Frag, class... Frags,
          std::enable_if_t<!std::is_same<std::decay_t<Op>, TileBounds>::value, int> = 0>
__device__ __forceinline__ void load_matrices_with_op(const T* ptr, unsigned ldm, Op&& op, Frag& first, Frags&... rest) {
  detail::load_with_op(ptr, ldm, detail::operand_row_major<Frag>(), nullptr, T(), op, first, rest...);
}

// The same for a partial tile: elements outside `bounds` are not read; op sees `fill` for them.
template <class T, class Op, class Frag, class... Frags>
__device__ __forceinline__ void load_matrices_with_op(const T* ptr, unsigned ldm, TileBounds bounds, T fill, Op&& op,
                                             Frag& first, Frags&... rest) {
  detail::load_with_op(ptr, ldm, detail::operand_row_major<Frag>(), &bounds, fill, op, first, rest...);
}

// Single-fragment form: frag's element (i, j) = op(memory value at (i, j)).
template <class Frag, class T, class Op>
__device__ __forceinline__ void load_matrix_with_op(Frag& frag, const T* ptr, unsigned ldm, Op&& op) {
  using S = typename fragment_traits<Frag>::storage_type;
  load_matrices_with_op(ptr, ldm, [&](T v, int, int, auto xs, Frag& f) {
    assign(f, xs, convert<S>(op(v)));
  }, frag);
}

template <class Frag, class T, class Op>
__device__ __forceinline__ void load_matrix_with_op(Frag& frag, const T* ptr, unsigned ldm, TileBounds bounds, T fill,
                                           Op&& op) {
  using S = typename fragment_traits<Frag>::storage_type;
  load_matrices_with_op(ptr, ldm, bounds, fill, [&](T v, int, int, auto xs, Frag& f) {
    assign(f, xs, convert<S>(op(v)));
  }, frag);
}

// Accumulators: the memory layout is given, as for load_matrix_sync.
template <class Frag, class T, class Op>
__device__ __forceinline__ void load_matrix_with_op(Frag& frag, const T* ptr, unsigned ldm, nvcuda::wmma::layout_t layout,
                                           Op&& op) {
  static_assert(fragment_traits<Frag>::use == Use::accumulator,
                "load_matrix_with_op: a layout_t argument is for accumulators; operands load in their own layout");
  using S = typename fragment_traits<Frag>::storage_type;
  detail::load_with_op(ptr, ldm, layout == nvcuda::wmma::mem_row_major, nullptr, T(), [&](T v, int, int,
                       auto xs, Frag& f) { assign(f, xs, convert<S>(op(v))); }, frag);
}

// ------------------------------------------------------------------------------------------------------
// Row quads: four consecutive elements of one row in one lane, for 16-byte stores of accumulators
// ------------------------------------------------------------------------------------------------------

template <class S>
struct RowQuad {
  S v[4];
};

namespace detail {

// The core that sits right of core c (same rows, one core width further), or -1.
WMMAE_HD constexpr int right_core(const CoreLayout& L, int c) {
  for (int d = 0; d < L.num_cores; ++d) {
    if (L.offset[d].row == L.offset[c].row && L.offset[d].col == L.offset[c].col + 4 * L.run) return d;
  }
  return -1;
}

WMMAE_HD constexpr bool is_right_core(const CoreLayout& L, int c) {
  for (int d = 0; d < L.num_cores; ++d) {
    if (right_core(L, d) == c) return true;
  }
  return false;
}

// Row quads need runs of 2 along rows and cores in side-by-side pairs: lane l and lane l ^ 1 then hold
// 8 consecutive elements of a row between them (the 16x16 accumulators; not m32n8k16 or m8n32k16).
WMMAE_HD constexpr bool has_row_quads(const CoreLayout& L) {
  if (L.transposed || L.run != 2 || L.copies() != 1) return false;
  for (int c = 0; c < L.num_cores; ++c) {
    const int r = right_core(L, c);
    const bool left = r >= 0 && !is_right_core(L, c);
    if (!left && !is_right_core(L, c)) return false;  // a core without a partner
    if (left && right_core(L, r) >= 0) return false;  // a run of three cores
  }
  return true;
}

}  // namespace detail

template <class Frag>
WMMAE_HD constexpr bool has_row_quads() {
  constexpr CoreLayout L = fragment_traits<Frag>::layout;
  return detail::has_row_quads(L);
}

// f(i, j, quad) with quad.v[e] = tile element (i, j + e), every element of the fragment once, each quad
// in one lane (j a multiple of 4). Lanes trade half their runs with lane ^ 1 (two shuffles per pair of
// cores), so that an accumulator goes to memory with one 16-byte (float) store per quad instead of two
// 8-byte ones.
template <class Frag, class F>
__device__ __forceinline__ void foreach_row_quad(const Frag& frag, F&& f) {
  using Tr = fragment_traits<Frag>;
  using S = typename Tr::storage_type;
  constexpr CoreLayout L = Tr::layout;
  static_assert(!Tr::known || detail::has_row_quads(L), "foreach_row_quad: this fragment has no side-by-side core pairs");
  const int lane = lane_id();
  const bool odd = lane & 1;
  detail::static_for<0, L.num_cores>([&](auto core) {
    constexpr int c = decltype(core)::value;
    constexpr CoreLayout layout = Tr::layout;  // a local copy: the lambda must not odr-use L
    constexpr int r = detail::right_core(layout, c);
    constexpr bool left = r >= 0 && !detail::is_right_core(layout, c);
    if constexpr (left) {
      const S l0 = frag.x[c * 2], l1 = frag.x[c * 2 + 1], r0 = frag.x[r * 2], r1 = frag.x[r * 2 + 1];
      // Even lanes keep their left run and take the odd neighbour's; odd lanes do the same on the right.
      const S g0 = __shfl_xor_sync(0xffffffffu, odd ? l0 : r0, 1);
      const S g1 = __shfl_xor_sync(0xffffffffu, odd ? l1 : r1, 1);
      const RowQuad<S> quad = odd ? RowQuad<S>{{g0, g1, r0, r1}} : RowQuad<S>{{l0, l1, g0, g1}};
      const RowCol start = core_position(layout.offset[c], layout.run, false, lane & ~1, 0);
      f(start.row, odd ? start.col + 4 * layout.run : start.col, quad);
    }
  });
}

// Stores the elements of a fragment that lie inside `bounds`, each once, as convert<T>(op(value, i, j)).
template <class Frag, class T, class Op>
__device__ __forceinline__ void store_matrix_with_op(T* ptr, const Frag& frag, unsigned ldm, nvcuda::wmma::layout_t layout,
                                            TileBounds bounds, Op&& op) {
  foreach_ij(frag, [&](auto xs, int i, int j) {
    if (!bounds.contains(i, j)) return;
    const long long offset =
        layout == nvcuda::wmma::mem_row_major ? static_cast<long long>(i) * ldm + j : static_cast<long long>(j) * ldm + i;
    ptr[offset] = convert<T>(op(frag.x[xs.first], i, j));
  });
}

}  // namespace wmmae
