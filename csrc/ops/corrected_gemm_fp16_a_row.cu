// The fp16 method's tile GEMM kernels (and auto's) where A is row-major, in a translation unit of their own so
// that a build compiles them beside the others (corrected_gemm_common.cuh).
#include "corrected_gemm_launch.cuh"

namespace wmmae_ops {
template void launch_gemm_variant<Method::fp16, true, true>(const GemmArgs&, const GemmLaunch&);
template void launch_gemm_variant<Method::fp16, true, false>(const GemmArgs&, const GemmLaunch&);
}  // namespace wmmae_ops
