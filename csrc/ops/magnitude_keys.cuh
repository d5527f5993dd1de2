// MagnitudeKeys: the fast fold of a line's largest and smallest magnitudes, which the grid pre-pass
// (line_range_prepass.cuh), the pre-pass beside the GEMM (resident_prepass_sm90.cuh), the small GEMM and the wgmma
// GEMM's tiles that fold their own lines (corrected_gemm_sm90.cuh) share.
#pragma once

#include <cstdint>

#include "corrected_matmul_scheme.hpp"

namespace wmmae_ops {

// A fold of a run of elements: the same result as MagnitudeBits where the run holds no Inf or
// NaN, in about 2.5 instructions per element instead of 8 (a shift, a fused add-and-min, half of a
// three-input max). Twice a float's bits is twice its magnitude with the sign shifted out; the unsigned max
// of that gives the largest magnitude, and the min of that minus one the smallest non-zero one (a zero's key
// wraps to the top). Inf and NaN have the largest keys, so exact() says whether the max is finite; where it
// is not (a line that holds one), the caller folds the same elements again with MagnitudeBits, which leaves
// them out.
struct MagnitudeKeys {
  std::uint32_t twice_max;
  std::uint32_t twice_min_less_one;

  __device__ static MagnitudeKeys none() { return MagnitudeKeys{0u, 0xffffffffu}; }
  __device__ void include(float v) {
    const std::uint32_t u = __float_as_uint(v);
    twice_max = max(twice_max, u + u);
    twice_min_less_one = min(twice_min_less_one, u + u - 1u);
  }
  __device__ void include(const MagnitudeKeys& o) {
    twice_max = max(twice_max, o.twice_max);
    twice_min_less_one = min(twice_min_less_one, o.twice_min_less_one);
  }
  // The keys of lane (this lane ^ lane_mask), which the whole warp calls together.
  __device__ MagnitudeKeys of_lane_xor(int lane_mask) const {
    return MagnitudeKeys{__shfl_xor_sync(0xffffffffu, twice_max, lane_mask),
                         __shfl_xor_sync(0xffffffffu, twice_min_less_one, lane_mask)};
  }
  __device__ bool exact() const { return twice_max < 0xff000000u; }  // 2 * 0x7f800000: no Inf or NaN
  __device__ MagnitudeBits bits() const {  // where exact()
    return MagnitudeBits{twice_max >> 1,
                         twice_min_less_one == 0xffffffffu ? 0xffffffffu : (twice_min_less_one + 1u) >> 1, false};
  }
};

}  // namespace wmmae_ops
