// Splitting an fp32 value into a high part and a residual that tensor cores can multiply
// (Ootomo & Yokota's error correction). Plain C++17 with host/device functions, so the CPU reference of
// corrected_matmul and the CUDA kernels split values with the same arithmetic.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "config.hpp"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif

namespace wmmae {

// The fp16 residual is scaled by 2^11 so that it stays out of fp16's subnormal range.
constexpr float kFp16ResidualScale = 2048.0f;
constexpr float kFp16ResidualUnscale = 1.0f / 2048.0f;

WMMAE_HD inline std::uint32_t float_bits(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  std::uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
#endif
}

WMMAE_HD inline float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float v;
  std::memcpy(&v, &u, sizeof v);
  return v;
#endif
}

WMMAE_HD inline bool is_finite_bits(std::uint32_t u) { return (u & 0x7f800000u) != 0x7f800000u; }

// floor(log2(|v|)) for finite non-zero v (subnormals included).
WMMAE_HD inline int float_exponent(float v) {
  const std::uint32_t u = float_bits(v) & 0x7fffffffu;
  const int biased = static_cast<int>(u >> 23);
  if (biased != 0) return biased - 127;
#if defined(__CUDA_ARCH__)
  return -118 - __clz(static_cast<int>(u));  // 31 - clz(u) - 149
#else
  return -118 - __builtin_clz(u);
#endif
}

// tf32 with round-to-nearest, ties away from zero (what cvt.rna.tf32.f32 does), kept in an fp32 register.
// A finite value that would round past FLT_MAX is truncated instead, so that a finite input never
// becomes Inf. Non-finite values pass through.
WMMAE_HD inline float round_to_tf32(float v) {
  const std::uint32_t u = float_bits(v);
  if (!is_finite_bits(u)) return v;
  const std::uint32_t rounded = (u + 0x1000u) & 0xffffe000u;
  return bits_float(is_finite_bits(rounded) ? rounded : (u & 0xffffe000u));
}

// v == hi + lo up to tf32's rounding of lo. Non-finite v: hi = v, lo = 0 (the residual would be NaN).
struct Tf32Split {
  float hi;
  float lo;
};
WMMAE_HD inline Tf32Split split_tf32(float v) {
  const float hi = round_to_tf32(v);
  if (!is_finite_bits(float_bits(v))) return {hi, 0.0f};
  return {hi, round_to_tf32(v - hi)};
}

// v == hi + lo / 2^11 up to fp16's rounding of lo, for v inside fp16's range (callers scale first).
// `Half` is the storage type (__half on the device, c10::Half on the host): Rounding::to_half rounds to
// nearest even and Rounding::to_float widens exactly. For a non-finite v, lo is NaN: callers must not use
// the residual products then (corrected_matmul returns the hi*hi sum alone when it is not finite).
// (The pragma: a host-only Rounding, as c10::Half's, instantiates this in a .cu file's host code without
// nvcc's warning about a __host__ function called from a __host__ __device__ one; the device's calls
// __device__ functions.)
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class Rounding, class Half>
WMMAE_HD inline void split_fp16(float v, Half& hi, Half& lo) {
  hi = Rounding::to_half(v);
  lo = Rounding::to_half((v - Rounding::to_float(hi)) * kFp16ResidualScale);
}

// The tensor core truncates the float32 result of each product toward zero: a sum of hi*hi products comes out
// about half an ulp short per 16-wide k-step (measured on an H200: 0.49 ulp of the result for 16 k, 0.93 for
// 32), always toward zero, so that the error of same-signed sums grows with K. The split of ONE operand (B's,
// in corrected_matmul) puts that back on average: its residual carries 2^-24 of its hi part, so that the
// correction product hi_a * lo_b adds 2^-24 of each hi_a * hi_b, between half an ulp and one ulp of that
// product's share of the sum. Rounding the residual to fp16 keeps this on average only (it is below the
// residual's half ulp), which is all a bias needs. The price: a sum that the tensor core forms exactly
// (operands of up to 11 significant bits, small integers say) comes out up to an ulp above its exact value.
// (2^-25 would keep those exact, but costs an instruction per element, on the GEMM's critical path: H200,
// 4096^3 4.7% slower.) Computed as one fused multiply-add, v 2^11 - hi (2^11 - 2^-13), which is
// (v - hi) 2^11 + hi 2^-13 rounded once (v 2^11 and the constant are exact): no more instructions than the
// plain residual. Non-finite v: lo is NaN, as in split_fp16.
constexpr float kFp16CompensatedHiWeight = kFp16ResidualScale - 0x1p-13f;  // 2^11 (1 - 2^-24): exact in fp32

WMMAE_HD inline float fp16_compensated_residual(float v, float hi) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(hi, -kFp16CompensatedHiWeight, v * kFp16ResidualScale);
#else
  return std::fma(hi, -kFp16CompensatedHiWeight, v * kFp16ResidualScale);
#endif
}

#if defined(__CUDACC__)
#pragma nv_exec_check_disable  // (as for split_fp16)
#endif
template <class Rounding, class Half>
WMMAE_HD inline void split_fp16_compensated(float v, Half& hi, Half& lo) {
  hi = Rounding::to_half(v);
  lo = Rounding::to_half(fp16_compensated_residual(v, Rounding::to_float(hi)));
}

#if defined(__CUDACC__)
// Rounding policy for split_fp16 on the device.
struct DeviceHalfRounding {
  __device__ static __half to_half(float v) { return __float2half_rn(v); }
  __device__ static float to_float(__half h) { return __half2float(h); }
};

// split_fp16 of two values at once (two conversions per instruction on the device). The residual is formed
// as v 2^11 - hi 2^11 in one fused multiply-add: the same value as (v - hi) 2^11 (every term is exact for v
// inside fp16's range), but v 2^11 is computed while v is converted to hi, so the residual is one dependent
// step closer to v (the A operand's split sits right before the GEMM's tensor-core products).
__device__ inline void split_fp16x2(float v0, float v1, __half2& hi, __half2& lo) {
  hi = __floats2half2_rn(v0, v1);
  const float2 h = __half22float2(hi);
  lo = __floats2half2_rn(__fmaf_rn(h.x, -kFp16ResidualScale, v0 * kFp16ResidualScale),
                         __fmaf_rn(h.y, -kFp16ResidualScale, v1 * kFp16ResidualScale));
}

// split_fp16_compensated of two values at once.
__device__ inline void split_fp16x2_compensated(float v0, float v1, __half2& hi, __half2& lo) {
  hi = __floats2half2_rn(v0, v1);
  const float2 h = __half22float2(hi);
  lo = __floats2half2_rn(fp16_compensated_residual(v0, h.x), fp16_compensated_residual(v1, h.y));
}
#endif

}  // namespace wmmae
