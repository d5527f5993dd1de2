// The numerical scheme of corrected_matmul, shared by the CPU reference and the CUDA kernels:
// method names, the k-step of each split, and the power-of-two scaling that keeps the fp16 split accurate.
#pragma once

#include <cstdint>
#include <string>

#include "../wmmae/split.hpp"

namespace wmmae_ops {

enum class Method : int { fp16 = 0, tf32 = 1, automatic = 2 };

// Throws (through TORCH_CHECK in the caller's translation unit) on unknown names; see method_from_string.
Method method_from_string(const std::string& name);

// Elements per tensor-core k-step: the hi*hi partial product of one k-step is added to the fp32 result
// outside the tensor core, the corrections are chained inside their own accumulator.
constexpr int kFp16KStep = 16;
constexpr int kTf32KStep = 8;
// The fp16 wgmma kernel (H100/H200) sums the hi*hi products of two k-steps in the tensor core before it adds
// them to the fp32 result: half the additions. The tensor core's truncation, which that sum doubles, is
// compensated in B's residual (wmmae::split_fp16_compensated); the CPU emulation does the same. The portable
// WMMA kernel adds every k-step (kFp16KStep).
constexpr int kFp16HiSumK = 2 * kFp16KStep;

// K is summed in chunks: each chunk accumulates from zero and the chunk results are added in fp32.
// Two-level summation: the rounding error grows like (chunk / k-step + K / chunk) ulps instead of
// K / k-step. It matters for same-signed products, where cuBLAS's own (blocked) float32 sums are accurate:
// on an H200, a 1x4096 @ 4096x1000 tf32 product had 6x torch.matmul's error with chunks of 4096.
// Each chunk boundary costs the CUDA kernel a read-modify-write of its output tile (16% at 8192^3 with
// chunks of 1024), so large outputs, whose error is already far below float32's, use longer chunks.
constexpr int kAccumulationChunkSmall = 1024;
constexpr int kAccumulationChunkLarge = 4096;
constexpr std::int64_t kLargeOutput = std::int64_t{1} << 22;  // m * n elements

WMMAE_HD inline int accumulation_chunk(std::int64_t m, std::int64_t n) {
  return m * n >= kLargeOutput ? kAccumulationChunkLarge : kAccumulationChunkSmall;
}

// Exponent summary of one row of A or one column of B: floor(log2|v|) over its finite non-zero elements.
struct ExponentRange {
  int max_exp;     // kNoExponent when the row has no finite non-zero element
  int min_exp;
  bool nonfinite;  // the row holds an Inf or a NaN
};
constexpr int kNoExponent = -1000;

WMMAE_HD inline ExponentRange empty_exponent_range() { return ExponentRange{kNoExponent, -kNoExponent, false}; }

// What is gathered of a run of elements to find their ExponentRange: the largest finite and the smallest
// non-zero magnitude as bit patterns (|v|'s bits order as |v| for finite floats, so two integer min/max per
// element, and the exponents are taken once per run), and whether an Inf or NaN was seen. Runs merge with
// include(other). A plain struct, so that the CUDA pre-pass can keep it in shared memory: start from none().
struct MagnitudeBits {
  std::uint32_t max_finite;  // 0: no finite non-zero element
  std::uint32_t min_nonzero;
  bool nonfinite;

  WMMAE_HD static MagnitudeBits none() { return MagnitudeBits{0u, 0xffffffffu, false}; }
  WMMAE_HD void include(float v) {
    const std::uint32_t mag = wmmae::float_bits(v) & 0x7fffffffu;
    const bool finite = mag < 0x7f800000u;
    const std::uint32_t as_max = finite ? mag : 0u, as_min = finite && mag != 0 ? mag : 0xffffffffu;
    max_finite = as_max > max_finite ? as_max : max_finite;
    min_nonzero = as_min < min_nonzero ? as_min : min_nonzero;
    nonfinite |= !finite;
  }
  WMMAE_HD void include(const MagnitudeBits& o) {
    max_finite = o.max_finite > max_finite ? o.max_finite : max_finite;
    min_nonzero = o.min_nonzero < min_nonzero ? o.min_nonzero : min_nonzero;
    nonfinite |= o.nonfinite;
  }
  WMMAE_HD ExponentRange exponent_range() const {
    ExponentRange range = empty_exponent_range();
    range.nonfinite = nonfinite;
    if (max_finite != 0) {
      range.max_exp = wmmae::float_exponent(wmmae::bits_float(max_finite));
      range.min_exp = wmmae::float_exponent(wmmae::bits_float(min_nonzero));
    }
    return range;
  }
};

// Scaling a row by 2^(kFp16TargetExp - max_exp) puts its largest magnitude in [2^14, 2^15): far enough
// below fp16's maximum (65504) that neither the high part nor the products (< 2^30) overflow.
constexpr int kFp16TargetExp = 14;
// The fp16 split represents an element x to within 2^-22 |x| while x >= 2^-14 after scaling: hi is a normal
// fp16 number (error <= 2^-11 |x|), and the scaled residual's own rounding costs at most 2^-11 of that when
// it is normal, or half of fp16's subnormal spacing, 2^-25 / 2^11 = 2^-36 <= 2^-22 |x|, when it is not. So
// a row keeps that accuracy while its exponents span at most 14 - (-14) = 28; below, each binade loses a bit
// (measured: rows spanning 2^28 as accurate as rows spanning 2^20, 2^32 at 2x float32's error). "auto"
// sends wider rows to the tf32 split. (N(0, 1) rows of 2^k elements reach a span of 28 with probability
// about 2^k * 2^-27, of 23 about 2^k * 2^-22: the limit sets how often "auto" falls back.)
constexpr int kFp16MaxExponentSpan = 28;
// 2^shift must be a normal float: rows whose largest magnitude is below 2^-113 are not fp16-safe.
constexpr int kMaxShift = 127;

// The tf32 split needs scaling only at the ends of float32's range: a residual below 2^-126 (an element below
// about 2^-115) loses bits in float32's subnormals, and a high part rounded up past 2^127 would overflow.
// Scaling a line by 2^(kTf32TargetExp - max_exp) puts its largest magnitude in [2^40, 2^41): products stay
// below 2^82, so sums of up to 2^45 of them stay finite, and every element at most 155 binades below the
// line's largest keeps 2^-22 relative accuracy (and a still smaller one a non-zero high part: see
// split_tf32_scaled); see tf32_spans_fit for tiles with wider lines. Powers of two scale exactly: where nothing
// underflows or overflows, the bits are those of the unscaled split.
constexpr int kTf32TargetExp = 40;

// Power-of-two exponent a line is multiplied by before the split of method M (0 for lines without a finite
// non-zero element), clamped so that 2^shift stays a normal float.
template <Method M>
WMMAE_HD inline int line_shift(ExponentRange r) {
  if (r.max_exp == kNoExponent) return 0;
  const int s = (M == Method::tf32 ? kTf32TargetExp : kFp16TargetExp) - r.max_exp;
  return s > kMaxShift ? kMaxShift : s;
}

// v scaled by its line's power of two (line_shift), split into tf32 parts. A non-zero v keeps a non-zero hi, so
// that an Inf times v gives Inf, as in float32, not Inf * 0 = NaN: where tf32 cannot reach the scaled value
// (below 2^-137, which round_to_tf32 takes to 0, or scaled to 0) hi is +-2^-126 and lo exactly -hi.
WMMAE_HD inline wmmae::Tf32Split split_tf32_scaled(float v, float scale) {
  wmmae::Tf32Split t = wmmae::split_tf32(v * scale);
  if (t.hi == 0.0f && v != 0.0f) {
    t.hi = v > 0.0f ? 0x1p-126f : -0x1p-126f;
    t.lo = -t.hi;
  }
  return t;
}

// Where the tf32 split may stop being accurate. A line's elements are scaled to at least 2^(40 - span) (span:
// max_exp - min_exp), so in a 128x128 output tile whose rows span at most kTf32MaxLineSpan and whose widest row
// and column span at most kTf32MaxPairSpan together (tf32_spans_fit), every element is scaled to at least
// 2^-110, whose residual is a normal float32 and keeps 22 bits of it, and every product of two is at least
// 2^-100, whose correction products stay clear of float32's subnormals. Beyond that (exponents spread over
// 2^U(-60, 60), for example) elements and products far below their lines' largest lose bits in the subnormals
// (an element from 2^155 below its line's largest, lost from 2^177: session 50; a product of two elements
// 2^106 below theirs, 85 ulp in the emulation: session 51), up to about 2^-94 of each product in the scaled
// domain. That matters only where such products make up an output, which is then small: an output whose
// scaled magnitude is at least K 2^-68 keeps float32's accuracy whatever its products lost. So in a tile beyond
// the limits the split's outputs are checked (split_output_at_risk), and where one is smaller, its quadrant of
// the tile (kFallbackQuadrant x kFallbackQuadrant outputs) is computed again with one float32 fused multiply-add
// per product, as torch.matmul computes it.
constexpr int kTf32MaxLineSpan = 150;
constexpr int kTf32MaxPairSpan = 180;
constexpr int kTf32FloorExponent = -68;
// The float32 fallback checks and recomputes a 128x128 output tile by quadrants of 64x64, each on its own: a
// quadrant without an output at risk keeps the split, and float32_fallback_kernel's blocks take quadrants, not
// tiles, as their items (four times as many: a GPU with more SMs than tiles has work for more of them).
constexpr int kFallbackQuadrant = 64;

// max_exp - min_exp of a line with a finite non-zero element, 0 for one without.
WMMAE_HD inline int exponent_span(ExponentRange r) { return r.max_exp == kNoExponent ? 0 : r.max_exp - r.min_exp; }

// Whether the tf32 split keeps every element and product of a tile whose widest row and column span these
// exponents.
WMMAE_HD inline bool tf32_spans_fit(int row_span, int col_span) {
  return row_span <= kTf32MaxLineSpan && col_span <= kTf32MaxLineSpan && row_span + col_span <= kTf32MaxPairSpan;
}

// ceil(log2(k)) for k >= 1.
WMMAE_HD inline int ceil_log2(std::int64_t k) {
  int e = 0;
  while ((std::int64_t{1} << e) < k) ++e;
  return e;
}

// Whether a tf32 split output c of a tile beyond tf32_spans_fit may have lost float32 accuracy: a finite c
// whose magnitude, scaled by its row's and column's tf32 shifts (shift_sum), is below 2^(kTf32FloorExponent +
// log2_k) (zero included). Outputs of lines without a finite non-zero element are exact: the caller leaves
// them out.
WMMAE_HD inline bool split_output_at_risk(float c, int shift_sum, int log2_k) {
  const std::uint32_t mag = wmmae::float_bits(c) & 0x7fffffffu;
  if (mag >= 0x7f800000u) return false;  // Inf or NaN: propagated as float32 does
  return mag == 0 || wmmae::float_exponent(c) + shift_sum < kTf32FloorExponent + log2_k;
}

// True when the fp16 split represents every element of the row to about 2^-22 relative accuracy.
WMMAE_HD inline bool fp16_safe(ExponentRange r) {
  if (r.nonfinite) return false;
  if (r.max_exp == kNoExponent) return true;
  return kFp16TargetExp - r.max_exp <= kMaxShift && r.max_exp - r.min_exp <= kFp16MaxExponentSpan;
}

}  // namespace wmmae_ops
