// Fragment layouts: which tile element (row, col) a lane's frag.x[i] holds.
//
// This header is the single definition of every layout the project knows. It is plain C++17 (no CUDA
// needed), so the host code of the fragment_map op and the device primitives in primitives.hpp read the
// same tables.
//
// sm_75 and newer: every WMMA fragment is a set of 8-row "core matrices". In a core matrix lane l holds a
// run of `run` consecutive elements (1, 2 or 4) of row l/4, starting at column run*(l%4); a transposed core
// holds them down a column instead. Core c sits at offset[c] in the tile, and frag.x[i] belongs to core
// (i / run) % num_cores: where a fragment has more elements than distinct ones (half m16n16k16 operands),
// the extra elements repeat the first ones. The descriptors were measured on an H200 (sm_90, CUDA 13.0)
// with load_matrix_sync of index-encoded tiles (the fragment_map op does this), and are the same for
// row_major and col_major operands: only the memory offset differs.
//
// sm_70 (Volta) does not fit that model: each operand element is held by two lanes and the register layout
// depends on the fragment's layout. Its tables are analytic (no Volta GPU to measure, and CUDA 13 cannot
// compile sm_70), used by fragment_map(arch=70) on the host only.
#pragma once

#include "config.hpp"

namespace wmmae {

enum class Use : int { matrix_a = 0, matrix_b = 1, accumulator = 2 };
enum class Elem : int { half = 0, bf16, tf32, f32, f64, s8, u8, s32 };
enum class Order : int { row_major = 0, col_major = 1, none = 2 };

struct RowCol {
  int row;
  int col;
};

struct CoreLayout {
  int rows;            // tile extent of this fragment (m x k for A, k x n for B, m x n for C)
  int cols;
  int num_elements;    // frag.num_elements
  int run;             // consecutive elements a lane holds in one core-matrix row (1, 2 or 4)
  bool transposed;     // runs go down a column (B operands, m8n32k16 accumulators)
  int num_cores;       // number of distinct core matrices
  RowCol offset[8];    // top-left corner of core c in the tile

  // Number of distinct elements per lane; x and x + period hold the same element.
  WMMAE_HD constexpr int period() const { return run * num_cores; }
  WMMAE_HD constexpr int copies() const { return num_elements / period(); }

  // Top-left corner of the core matrix that element x belongs to.
  WMMAE_HD constexpr RowCol origin(int x) const { return offset[(x / run) % num_cores]; }

  WMMAE_HD constexpr RowCol at(int lane, int x) const;
};

// Position of element x of `lane` inside a core matrix whose corner is `origin`. Split from
// CoreLayout::at so that device code can fold origin(x) at compile time and keep the descriptor itself
// out of registers and local memory.
WMMAE_HD constexpr RowCol core_position(RowCol origin, int run, bool transposed, int lane, int x) {
  const int along = run * (lane % 4) + x % run;
  const int across = lane / 4;
  return transposed ? RowCol{origin.row + along, origin.col + across} : RowCol{origin.row + across, origin.col + along};
}

WMMAE_HD constexpr RowCol CoreLayout::at(int lane, int x) const {
  return core_position(origin(x), run, transposed, lane, x);
}

// The descriptor of a fragment type without a known layout (num_elements == 0).
WMMAE_HD constexpr CoreLayout no_layout() { return CoreLayout{0, 0, 0, 1, false, 1, {{0, 0}}}; }

// Whether two descriptors place every element alike (the offsets of cores past num_cores do not count).
WMMAE_HD constexpr bool equal_layouts(const CoreLayout& a, const CoreLayout& b) {
  if (a.rows != b.rows || a.cols != b.cols || a.num_elements != b.num_elements || a.run != b.run ||
      a.transposed != b.transposed || a.num_cores != b.num_cores) {
    return false;
  }
  for (int c = 0; c < a.num_cores; ++c) {
    if (a.offset[c].row != b.offset[c].row || a.offset[c].col != b.offset[c].col) return false;
  }
  return true;
}

// The tile's diagonal, solved from core_position: element x of `lane` sits at (i, i) exactly when
// diagonal_key(run, lane) == diagonal_offset(L, x). The key depends on the lane only and the offset on x only,
// so device code computes the key once and tests each element against a compile-time constant; an element
// whose offset lies outside the keys' range [-3 * run, 7] is never on the diagonal. diagonal_rule_holds()
// checks this against CoreLayout::at for every table row at compile time.
WMMAE_HD constexpr int diagonal_key(int run, int lane) { return lane / 4 - run * (lane % 4); }
WMMAE_HD constexpr int diagonal_offset(const CoreLayout& L, int x) {
  const RowCol o = L.origin(x);
  return (L.transposed ? o.row - o.col : o.col - o.row) + x % L.run;
}
WMMAE_HD constexpr bool can_be_on_diagonal(const CoreLayout& L, int x) {
  const int d = diagonal_offset(L, x);
  return d >= -3 * L.run && d <= 7;
}

// (lane, x) pairs that hold one tile element: the inverse of CoreLayout::at.
struct Holders {
  int count;
  int lane[4];
  int x[4];
};

WMMAE_HD constexpr Holders holders_of(const CoreLayout& L, int row, int col) {
  Holders h{0, {0, 0, 0, 0}, {0, 0, 0, 0}};
  const int extent = 4 * L.run;  // core footprint: 8 x extent (transposed: extent x 8)
  for (int c = 0; c < L.num_cores; ++c) {
    const int r = row - L.offset[c].row, k = col - L.offset[c].col;
    const int across = L.transposed ? k : r, along = L.transposed ? r : k;
    if (across < 0 || across >= 8 || along < 0 || along >= extent) continue;
    for (int q = 0; q < L.copies(); ++q) {
      h.lane[h.count] = across * 4 + along / L.run;
      h.x[h.count] = q * L.period() + c * L.run + along % L.run;
      ++h.count;
    }
  }
  return h;
}

// ---------------------------------------------------------------------------------------------------
// The sm_80+ table (also sm_75 for the m16n16k16 half fragments). One row per fragment type:
//   X(use, m, n, k, elem, num_elements, run, transposed, num_cores, {offset of each core})
// Operand elem is the multiplicand type; accumulator elem is the accumulator type.
// ---------------------------------------------------------------------------------------------------
#define WMMAE_CORES4_16x16 {{0, 0}, {8, 0}, {0, 8}, {8, 8}}
#define WMMAE_FOR_EACH_SM80_FRAGMENT(X)                                                                  \
  X(matrix_a, 16, 16, 16, half, 16, 2, false, 4, WMMAE_CORES4_16x16)                                    \
  X(matrix_b, 16, 16, 16, half, 16, 2, true, 4, WMMAE_CORES4_16x16)                                     \
  X(matrix_a, 16, 16, 16, bf16, 8, 2, false, 4, WMMAE_CORES4_16x16)                                     \
  X(matrix_b, 16, 16, 16, bf16, 8, 2, true, 4, WMMAE_CORES4_16x16)                                      \
  X(matrix_a, 32, 8, 16, half, 16, 2, false, 8,                                                        \
    {{0, 0}, {8, 0}, {0, 8}, {8, 8}, {16, 0}, {24, 0}, {16, 8}, {24, 8}})                              \
  X(matrix_b, 32, 8, 16, half, 16, 2, true, 2, {{0, 0}, {8, 0}})                                       \
  X(matrix_a, 32, 8, 16, bf16, 16, 2, false, 8,                                                        \
    {{0, 0}, {8, 0}, {0, 8}, {8, 8}, {16, 0}, {24, 0}, {16, 8}, {24, 8}})                              \
  X(matrix_b, 32, 8, 16, bf16, 4, 2, true, 2, {{0, 0}, {8, 0}})                                        \
  X(matrix_a, 8, 32, 16, half, 16, 2, false, 2, {{0, 0}, {0, 8}})                                      \
  X(matrix_b, 8, 32, 16, half, 16, 2, true, 8,                                                         \
    {{0, 0}, {0, 8}, {8, 0}, {8, 8}, {0, 16}, {0, 24}, {8, 16}, {8, 24}})                              \
  X(matrix_a, 8, 32, 16, bf16, 4, 2, false, 2, {{0, 0}, {0, 8}})                                       \
  X(matrix_b, 8, 32, 16, bf16, 16, 2, true, 8,                                                         \
    {{0, 0}, {0, 8}, {8, 0}, {8, 8}, {0, 16}, {0, 24}, {8, 16}, {8, 24}})                              \
  X(matrix_a, 16, 16, 16, s8, 8, 4, false, 2, {{0, 0}, {8, 0}})                                        \
  X(matrix_b, 16, 16, 16, s8, 8, 4, true, 2, {{0, 0}, {0, 8}})                                         \
  X(matrix_a, 16, 16, 16, u8, 8, 4, false, 2, {{0, 0}, {8, 0}})                                        \
  X(matrix_b, 16, 16, 16, u8, 8, 4, true, 2, {{0, 0}, {0, 8}})                                         \
  X(matrix_a, 32, 8, 16, s8, 16, 4, false, 4, {{0, 0}, {8, 0}, {16, 0}, {24, 0}})                      \
  X(matrix_b, 32, 8, 16, s8, 4, 4, true, 1, {{0, 0}})                                                  \
  X(matrix_a, 32, 8, 16, u8, 16, 4, false, 4, {{0, 0}, {8, 0}, {16, 0}, {24, 0}})                      \
  X(matrix_b, 32, 8, 16, u8, 4, 4, true, 1, {{0, 0}})                                                  \
  X(matrix_a, 8, 32, 16, s8, 4, 4, false, 1, {{0, 0}})                                                 \
  X(matrix_b, 8, 32, 16, s8, 16, 4, true, 4, {{0, 0}, {0, 8}, {0, 16}, {0, 24}})                       \
  X(matrix_a, 8, 32, 16, u8, 4, 4, false, 1, {{0, 0}})                                                 \
  X(matrix_b, 8, 32, 16, u8, 16, 4, true, 4, {{0, 0}, {0, 8}, {0, 16}, {0, 24}})                       \
  X(matrix_a, 16, 16, 8, tf32, 4, 1, false, 4, {{0, 0}, {8, 0}, {0, 4}, {8, 4}})                       \
  X(matrix_b, 16, 16, 8, tf32, 4, 1, true, 4, {{0, 0}, {4, 0}, {0, 8}, {4, 8}})                        \
  X(matrix_a, 8, 8, 4, f64, 1, 1, false, 1, {{0, 0}})                                                  \
  X(matrix_b, 8, 8, 4, f64, 1, 1, true, 1, {{0, 0}})                                                   \
  X(accumulator, 16, 16, 16, f32, 8, 2, false, 4, WMMAE_CORES4_16x16)                                   \
  X(accumulator, 16, 16, 16, half, 8, 2, false, 4, WMMAE_CORES4_16x16)                                  \
  X(accumulator, 16, 16, 16, s32, 8, 2, false, 4, WMMAE_CORES4_16x16)                                   \
  X(accumulator, 32, 8, 16, f32, 8, 2, false, 4, {{0, 0}, {8, 0}, {16, 0}, {24, 0}})                   \
  X(accumulator, 32, 8, 16, half, 8, 2, false, 4, {{0, 0}, {8, 0}, {16, 0}, {24, 0}})                  \
  X(accumulator, 32, 8, 16, s32, 8, 2, false, 4, {{0, 0}, {8, 0}, {16, 0}, {24, 0}})                   \
  X(accumulator, 8, 32, 16, f32, 8, 2, true, 4, {{0, 0}, {0, 8}, {0, 16}, {0, 24}})                    \
  X(accumulator, 8, 32, 16, half, 8, 2, true, 4, {{0, 0}, {0, 8}, {0, 16}, {0, 24}})                   \
  X(accumulator, 8, 32, 16, s32, 8, 2, true, 4, {{0, 0}, {0, 8}, {0, 16}, {0, 24}})                    \
  X(accumulator, 16, 16, 8, f32, 8, 2, false, 4, WMMAE_CORES4_16x16)                                    \
  X(accumulator, 8, 8, 4, f64, 2, 2, false, 1, {{0, 0}})

// Tile extent of a fragment of shape (m, n, k): A is m x k, B is k x n, accumulators are m x n.
WMMAE_HD constexpr int tile_rows(Use use, int m, int k) { return use == Use::matrix_b ? k : m; }
WMMAE_HD constexpr int tile_cols(Use use, int n, int k) { return use == Use::matrix_a ? k : n; }

// The sm_80+ descriptor of a fragment type; num_elements == 0 when CUDA has no such fragment.
WMMAE_HD constexpr CoreLayout sm80_layout(Use use, int m, int n, int k, Elem elem) {
// The offsets' braces do not protect their commas from the preprocessor: they arrive as __VA_ARGS__.
#define WMMAE_LAYOUT_CASE(U, M, N, K, E, NUM, RUN, T, NC, ...)                                         \
  if (use == Use::U && m == M && n == N && k == K && elem == Elem::E)                                   \
    return CoreLayout{tile_rows(Use::U, M, K), tile_cols(Use::U, N, K), NUM, RUN, T, NC, __VA_ARGS__};
  WMMAE_FOR_EACH_SM80_FRAGMENT(WMMAE_LAYOUT_CASE)
#undef WMMAE_LAYOUT_CASE
  return no_layout();
}

// The fragments that the sm_70 and sm_75 tables cover: m16n16k16 half operands with float or half
// accumulators.
WMMAE_HD constexpr bool sm7x_has_table(Use use, int m, int n, int k, Elem elem) {
  return m == 16 && n == 16 && k == 16 && (elem == Elem::half || (use == Use::accumulator && elem == Elem::f32));
}

// sm_75 shares sm_80's m16n16k16 half layouts; its other shapes have not been measured.
WMMAE_HD constexpr CoreLayout sm75_layout(Use use, int m, int n, int k, Elem elem) {
  return sm7x_has_table(use, m, n, k, elem) ? sm80_layout(use, m, n, k, elem) : no_layout();
}

// The descriptor that device code compiled for `cuda_arch` (__CUDA_ARCH__: 750, 800, 900, ...) uses. Empty
// (num_elements == 0) below sm_75: sm_70's fragments do not fit the core-matrix model, so the primitives refuse
// them at compile time rather than read a wrong table.
WMMAE_HD constexpr CoreLayout device_layout(int cuda_arch, Use use, int m, int n, int k, Elem elem) {
  return cuda_arch >= 800 ? sm80_layout(use, m, n, k, elem)
         : cuda_arch >= 750 ? sm75_layout(use, m, n, k, elem)
                            : no_layout();
}

// The diagonal rule (diagonal_key / diagonal_offset) against CoreLayout::at, for every lane and element.
WMMAE_HD constexpr bool diagonal_rule_holds(const CoreLayout& L) {
  for (int lane = 0; lane < 32; ++lane) {
    for (int x = 0; x < L.num_elements; ++x) {
      const RowCol rc = L.at(lane, x);
      const bool on = diagonal_key(L.run, lane) == diagonal_offset(L, x);
      if (on != (rc.row == rc.col) || (on && !can_be_on_diagonal(L, x))) return false;
    }
  }
  return true;
}
// Whether rule(layout) holds for every row of the sm_80+ table (the compile-time checks below).
template <class Rule>
WMMAE_HD constexpr bool holds_for_sm80_table(Rule rule) {
  bool ok = true;
#define WMMAE_RULE_CASE(U, M, N, K, E, ...) ok = ok && rule(sm80_layout(Use::U, M, N, K, Elem::E));
  WMMAE_FOR_EACH_SM80_FRAGMENT(WMMAE_RULE_CASE)
#undef WMMAE_RULE_CASE
  return ok;
}
static_assert(holds_for_sm80_table(diagonal_rule_holds), "diagonal_key/diagonal_offset disagree with CoreLayout::at");

// holders_of against CoreLayout::at, for every lane and element: the element's tile position is held by
// exactly copies() pairs, among them (lane, x), each of which CoreLayout::at maps back to that position.
WMMAE_HD constexpr bool holders_rule_holds(const CoreLayout& L) {
  for (int lane = 0; lane < 32; ++lane) {
    for (int x = 0; x < L.num_elements; ++x) {
      const RowCol rc = L.at(lane, x);
      const Holders h = holders_of(L, rc.row, rc.col);
      if (h.count != L.copies()) return false;
      bool found = false;
      for (int e = 0; e < h.count; ++e) {
        const RowCol back = L.at(h.lane[e], h.x[e]);
        if (back.row != rc.row || back.col != rc.col) return false;
        found = found || (h.lane[e] == lane && h.x[e] == x);
      }
      if (!found) return false;
    }
  }
  return true;
}
static_assert(holds_for_sm80_table(holders_rule_holds), "holders_of (map's inverse) disagrees with CoreLayout::at");

// ---------------------------------------------------------------------------------------------------
// sm_70, m16n16k16 half operands with float or half accumulators (analytic; see the header comment).
// ---------------------------------------------------------------------------------------------------
WMMAE_HD constexpr int sm70_num_elements(Use use, Elem elem) {
  return use == Use::accumulator ? 8 : (elem == Elem::half ? 16 : 0);
}

WMMAE_HD constexpr RowCol sm70_at(Use use, Order order, Elem acc_elem, int l, int x) {
  const int b2 = (l >> 2) & 1, b3 = (l >> 3) & 1, b4 = (l >> 4) & 1;
  if (use == Use::matrix_a) {
    return order == Order::col_major ? RowCol{8 * b2 + 4 * b4 + (x & 3), (l & 3) + 4 * (x >> 2)}
                                     : RowCol{(l & 3) + 8 * b2 + 4 * b4, x};
  }
  if (use == Use::matrix_b) {
    return order == Order::col_major ? RowCol{x, (l & 3) + 8 * b3 + 4 * b4}
                                     : RowCol{(l & 3) + 4 * (x >> 2), 8 * b3 + 4 * b4 + (x & 3)};
  }
  if (acc_elem == Elem::f32) {
    return RowCol{(l & 1) + 2 * ((x >> 1) & 1) + 4 * b4 + 8 * b2,
                  (x & 1) + 2 * ((l >> 1) & 1) + 4 * ((x >> 2) & 1) + 8 * b3};
  }
  return RowCol{(l & 3) + 4 * b4 + 8 * b2, x + 8 * b3};
}

}  // namespace wmmae
