// The tf32 method's tile GEMM kernels (also auto's GEMM of the tiles that are not fp16-safe), every layout, in a
// translation unit of their own so that a build compiles them beside the others (corrected_gemm_common.cuh).
#include "corrected_gemm_launch.cuh"

namespace wmmae_ops {
template void launch_gemm_variant<Method::tf32, true, true>(const GemmArgs&, const GemmLaunch&);
template void launch_gemm_variant<Method::tf32, true, false>(const GemmArgs&, const GemmLaunch&);
template void launch_gemm_variant<Method::tf32, false, true>(const GemmArgs&, const GemmLaunch&);
template void launch_gemm_variant<Method::tf32, false, false>(const GemmArgs&, const GemmLaunch&);
}  // namespace wmmae_ops
