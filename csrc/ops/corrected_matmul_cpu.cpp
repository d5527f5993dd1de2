// corrected_matmul on the CPU: emulates the tensor-core kernels' arithmetic step by step, so that the
// numerics of each method are tested without a GPU and serve as the reference for the CUDA kernels.
//
// Per output element, per chunk of accumulation_chunk(m, n) elements of K, per k-step (16 for fp16, 8 for tf32):
//   main += fp32( sum_k hiA*hiB )              (exact products, fp32 sum; added outside the tensor core)
//   corr += fp32( sum_k loA*hiB ); corr += fp32( sum_k hiA*loB )   (chained in their own accumulator)
// except that fp16's hi*hi sums span two k-steps (kFp16HiSumK), each k-step's result truncated toward zero as
// the tensor core truncates it, and B's fp16 residual carries the compensation of that truncation
// (wmmae::split_fp16_compensated). The corrections' own truncation, 2^-11 of the result's scale, is not
// modelled.
// chunk = main + corr * lo_unscale (a non-finite main is taken as it is: an Inf times a residual must not
// turn into NaN); the chunks are summed in fp32, then the power-of-two row/column scaling is undone.
// Which split an output element takes is decided per 128x128 output tile, as on the GPU: "auto" takes fp16
// where every row and column of the tile is fp16-safe, tf32 elsewhere. A tf32 tile whose lines span more than
// the split keeps (tf32_spans_fit) is checked by quadrants (kFallbackQuadrant x kFallbackQuadrant outputs): a
// quadrant with an output at risk (split_output_at_risk) is computed again with float32 fused multiply-adds,
// chunked the same way.
// Matrix-vector products (M = 1 or N = 1) and tiny products (M and N at most 8) take no split: matrix_vector.hpp says
// how they are summed.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "corrected_matmul_scheme.hpp"
#include "matmul_plan.hpp"
#include "matrix_vector.hpp"

namespace wmmae_ops {
namespace {

struct HostHalfRounding {
  static c10::Half to_half(float v) { return c10::Half(v); }
  static float to_float(c10::Half h) { return static_cast<float>(h); }
};

// hi/lo parts of one operand, K contiguous per row (A) or per column (B), for the splits its method takes (the
// other's vectors stay empty). The float32 fallback reads the operand itself, through `value`'s strides.
struct SplitOperand {
  std::int64_t rows, k;
  const float* value;                   // element (r, k) at value[r * row_stride + k * k_stride]
  std::int64_t row_stride, k_stride;
  std::vector<float> fp16_hi, fp16_lo, tf32_hi, tf32_lo;
  std::vector<int> fp16_shift, tf32_shift;  // power-of-two scaling exponent per row (line_shift)
  std::vector<char> has_nonzero;             // the row holds a finite non-zero element
  std::vector<char> tile_fp16_ok;  // per kGemmTile rows: every row is accurate in the fp16 split (fp16_safe)
  std::vector<int> tile_span;      // per kGemmTile rows: the largest exponent_span of a row
};

// `mat` is [rows, k] (A as is, B transposed): any strides; it must outlive the result, which reads it. B's fp16
// residuals carry the compensation of the tensor core's truncation (compensate_fp16), A's do not.
SplitOperand split_operand(const at::Tensor& mat, bool compensate_fp16, Method method) {
  SplitOperand s;
  s.rows = mat.size(0);
  s.k = mat.size(1);
  s.value = mat.data_ptr<float>();
  s.row_stride = mat.stride(0);
  s.k_stride = mat.stride(1);
  const bool fp16 = method != Method::tf32, tf32 = method != Method::fp16;
  const std::size_t total = static_cast<std::size_t>(s.rows * s.k);
  if (fp16) {
    s.fp16_hi.resize(total);
    s.fp16_lo.resize(total);
  }
  if (tf32) {
    s.tf32_hi.resize(total);
    s.tf32_lo.resize(total);
  }
  s.fp16_shift.resize(s.rows);
  s.tf32_shift.resize(s.rows);
  s.has_nonzero.resize(s.rows);
  std::vector<char> fp16_ok(s.rows);
  std::vector<int> span(s.rows);
  const auto acc = mat.accessor<float, 2>();
  at::parallel_for(0, s.rows, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t r = begin; r < end; ++r) {
      MagnitudeBits magnitudes = MagnitudeBits::none();
      for (std::int64_t k = 0; k < s.k; ++k) magnitudes.include(acc[r][k]);
      const ExponentRange range = magnitudes.exponent_range();
      const int fp16_shift = line_shift<Method::fp16>(range), tf32_shift = line_shift<Method::tf32>(range);
      s.fp16_shift[r] = fp16_shift;
      s.tf32_shift[r] = tf32_shift;
      fp16_ok[r] = fp16_safe(range);
      span[r] = exponent_span(range);
      s.has_nonzero[r] = range.max_exp != kNoExponent;
      for (std::int64_t k = 0; k < s.k; ++k) {
        const float v = acc[r][k];
        const std::size_t i = static_cast<std::size_t>(r * s.k + k);
        if (fp16) {
          c10::Half hi, lo;
          if (compensate_fp16) {
            wmmae::split_fp16_compensated<HostHalfRounding>(std::ldexp(v, fp16_shift), hi, lo);
          } else {
            wmmae::split_fp16<HostHalfRounding>(std::ldexp(v, fp16_shift), hi, lo);
          }
          s.fp16_hi[i] = static_cast<float>(hi);
          s.fp16_lo[i] = static_cast<float>(lo);
        }
        if (tf32) {
          const wmmae::Tf32Split t = split_tf32_scaled(v, std::ldexp(1.0f, tf32_shift));
          s.tf32_hi[i] = t.hi;
          s.tf32_lo[i] = t.lo;
        }
      }
    }
  });
  const std::int64_t tiles = (s.rows + kGemmTile - 1) / kGemmTile;
  s.tile_fp16_ok.assign(tiles, 1);
  s.tile_span.assign(tiles, 0);
  for (std::int64_t r = 0; r < s.rows; ++r) {
    s.tile_fp16_ok[r / kGemmTile] &= fp16_ok[r];
    s.tile_span[r / kGemmTile] = std::max(s.tile_span[r / kGemmTile], span[r]);
  }
  return s;
}

// The float32 path (quadrants of a tile with an output at risk): one fused multiply-add per k, in the same chunks
// as the split paths, over row i of sa and row j of sb.
float fma_dot(const SplitOperand& sa, std::int64_t i, const SplitOperand& sb, std::int64_t j, int chunk_length) {
  const float* a = sa.value + i * sa.row_stride;
  const float* b = sb.value + j * sb.row_stride;
  const std::int64_t k = sa.k;
  float total = 0.0f;
  for (std::int64_t c0 = 0; c0 < k; c0 += chunk_length) {
    const std::int64_t c1 = std::min<std::int64_t>(k, c0 + chunk_length);
    float chunk = 0.0f;
    for (std::int64_t e = c0; e < c1; ++e) chunk = std::fma(a[e * sa.k_stride], b[e * sb.k_stride], chunk);
    total = c0 == 0 ? chunk : total + chunk;
  }
  return total;
}

// The float32 result of a tensor-core product, d = c + the sum of the products, truncated toward zero, as
// Hopper's tensor cores give it (up to the bits they drop while aligning the terms, which this model does not
// drop: the sum is taken in double, where products of two 11-bit halves are exact). Inf and NaN pass through.
float tensor_core_result(double exact) {
  const float f = static_cast<float>(exact);
  return std::fabs(static_cast<double>(f)) > std::fabs(exact) ? std::nextafter(f, 0.0f) : f;
}

// sum_k hi_a * hi_b over [k0, k1) as the fp16 wgmma kernel forms it: one tensor-core product per k-step, the
// second accumulating onto the first's result.
float fp16_hi_products(const float* a_hi, const float* b_hi, std::int64_t k0, std::int64_t k1) {
  float hh = 0.0f;
  for (std::int64_t s0 = k0; s0 < k1; s0 += kFp16KStep) {
    double exact = hh;
    for (std::int64_t i = s0; i < std::min<std::int64_t>(k1, s0 + kFp16KStep); ++i) {
      exact += static_cast<double>(a_hi[i]) * static_cast<double>(b_hi[i]);
    }
    hh = tensor_core_result(exact);
  }
  return hh;
}

// kFp16: hi*hi summed over kFp16HiSumK in the tensor core (fp16_hi_products); otherwise per k-step, in fp32.
template <bool kFp16>
float corrected_dot(const float* a_hi, const float* a_lo, const float* b_hi, const float* b_lo, std::int64_t k,
                    float lo_unscale, int chunk_length) {
  constexpr int kStep = kFp16 ? kFp16KStep : kTf32KStep;
  constexpr int kHiStep = kFp16 ? kFp16HiSumK : kTf32KStep;
  float total = 0.0f;
  for (std::int64_t c0 = 0; c0 < k; c0 += chunk_length) {
    const std::int64_t c1 = std::min<std::int64_t>(k, c0 + chunk_length);
    float main = 0.0f, corr = 0.0f;
    for (std::int64_t h0 = c0; h0 < c1; h0 += kHiStep) {
      const std::int64_t h1 = std::min<std::int64_t>(c1, h0 + kHiStep);
      float hh = 0.0f;
      if constexpr (kFp16) {
        hh = fp16_hi_products(a_hi, b_hi, h0, h1);
      } else {
        for (std::int64_t i = h0; i < h1; ++i) hh += a_hi[i] * b_hi[i];
      }
      main += hh;
      for (std::int64_t k0 = h0; k0 < h1; k0 += kStep) {
        const std::int64_t k1 = std::min<std::int64_t>(h1, k0 + kStep);
        float lh = 0.0f, hl = 0.0f;
        for (std::int64_t i = k0; i < k1; ++i) lh += a_lo[i] * b_hi[i];
        for (std::int64_t i = k0; i < k1; ++i) hl += a_hi[i] * b_lo[i];
        corr += lh;
        corr += hl;
      }
    }
    const float chunk = std::isfinite(main) ? main + corr * lo_unscale : main;
    total = c0 == 0 ? chunk : total + chunk;
  }
  return total;
}

void corrected_matmul_2d(const SplitOperand& sa, const SplitOperand& sb, float* out, Method method) {
  const std::int64_t m = sa.rows, n = sb.rows, k = sa.k;
  const int chunk = accumulation_chunk(m, n), log2_k = ceil_log2(k);
  const std::int64_t tiles_m = (m + kGemmTile - 1) / kGemmTile, tiles_n = (n + kGemmTile - 1) / kGemmTile;
  // (by output tile, each on its own: a product of few row tiles, as x @ W of a few rows, still takes every thread)
  at::parallel_for(0, tiles_m * tiles_n, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t tile = begin; tile < end; ++tile) {
      const std::int64_t ti = tile / tiles_n, tj = tile % tiles_n;
      const std::int64_t i0 = ti * kGemmTile, i1 = std::min(m, i0 + kGemmTile);
      const std::int64_t j0 = tj * kGemmTile, j1 = std::min(n, j0 + kGemmTile);
      const bool use_fp16 =
          method == Method::fp16 || (method == Method::automatic && sa.tile_fp16_ok[ti] && sb.tile_fp16_ok[tj]);
      const bool check = !use_fp16 && !tf32_spans_fit(sa.tile_span[ti], sb.tile_span[tj]);
      // [(i - i0) / kFallbackQuadrant][(j - j0) / kFallbackQuadrant]
      bool at_risk[kFallbackQuadrantsPerSide][kFallbackQuadrantsPerSide] = {};
      for (std::int64_t i = i0; i < i1; ++i) {
        for (std::int64_t j = j0; j < j1; ++j) {
          const std::size_t ai = static_cast<std::size_t>(i * k), bj = static_cast<std::size_t>(j * k);
          float v;
          if (use_fp16) {
            v = corrected_dot<true>(sa.fp16_hi.data() + ai, sa.fp16_lo.data() + ai, sb.fp16_hi.data() + bj,
                                    sb.fp16_lo.data() + bj, k, wmmae::kFp16ResidualUnscale, chunk);
            v = std::ldexp(v, -(sa.fp16_shift[i] + sb.fp16_shift[j]));
          } else {
            v = corrected_dot<false>(sa.tf32_hi.data() + ai, sa.tf32_lo.data() + ai, sb.tf32_hi.data() + bj,
                                     sb.tf32_lo.data() + bj, k, 1.0f, chunk);
            v = std::ldexp(v, -(sa.tf32_shift[i] + sb.tf32_shift[j]));
            at_risk[(i - i0) / kFallbackQuadrant][(j - j0) / kFallbackQuadrant] |=
                check && sa.has_nonzero[i] && sb.has_nonzero[j] &&
                split_output_at_risk(v, sa.tf32_shift[i] + sb.tf32_shift[j], log2_k);
          }
          out[i * n + j] = v;
        }
      }
      for (std::int64_t i = i0; i < i1; ++i) {
        for (std::int64_t j = j0; j < j1; ++j) {
          if (!at_risk[(i - i0) / kFallbackQuadrant][(j - j0) / kFallbackQuadrant]) continue;
          out[i * n + j] = fma_dot(sa, i, sb, j, chunk);
        }
      }
    }
  });
}

}  // namespace

at::Tensor corrected_matmul_cpu(const at::Tensor& a, const at::Tensor& b, c10::string_view method_name) {
  const Method method = method_from_string(std::string(method_name));
  MatmulPlan plan = plan_matmul(a, b, "corrected_matmul");
  // As on CUDA, a b broadcast over a's packed batch makes one product of batch x M rows, so that the emulation has
  // the GPU's tiles, accumulation chunks and auto's per-tile choices.
  fold_batch_into_rows(plan, /*sm_count=*/0, /*l2_bytes=*/0);
  at::Tensor out = at::empty({plan.batch, plan.m, plan.n}, a.options());
  if (out.numel() == 0) return out.view(plan.out_shape);
  if (matrix_vector_applies(plan)) {  // (as on CUDA: float64 sums in their fixed order, every method)
    matrix_vector_cpu(plan, out.data_ptr<float>());
    return out.view(plan.out_shape);
  }
  // Each entry's matrices read in place at the plan's batch offsets (a reshape of a broadcast operand would copy
  // it to the batch's size); an operand whose offset repeats the previous entry's (a broadcast b) is split once.
  const at::Tensor& pa = plan.a;
  const at::Tensor& pb = plan.b;
  SplitOperand sa, sb;
  std::int64_t a_split_at = -1, b_split_at = -1;  // the offsets sa and sb were split at (-1: none yet)
  for (std::int64_t z = 0; z < plan.batch; ++z) {
    std::int64_t a_off, b_off;
    batch_offsets(plan.batch_strides, z, a_off, b_off);
    if (a_off != a_split_at) {
      sa = split_operand(pa.as_strided({plan.m, plan.k}, {pa.stride(-2), pa.stride(-1)}, pa.storage_offset() + a_off),
                         false, method);
      a_split_at = a_off;
    }
    if (b_off != b_split_at) {  // (B transposed: [n, k])
      sb = split_operand(pb.as_strided({plan.n, plan.k}, {pb.stride(-1), pb.stride(-2)}, pb.storage_offset() + b_off),
                         true, method);
      b_split_at = b_off;
    }
    corrected_matmul_2d(sa, sb, out.data_ptr<float>() + z * plan.m * plan.n, method);
  }
  return out.view(plan.out_shape);
}

}  // namespace wmmae_ops
