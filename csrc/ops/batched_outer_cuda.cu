// batched_outer on CUDA: argument checks, the (batch, n) views of u and v, and the kernel launch
// (batched_outer_kernel.cuh).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "batched_outer.hpp"
#include "batched_outer_kernel.cuh"

namespace wmmae_ops {
namespace {

template <class In>
void dispatch_out(const outer::Args& args, at::ScalarType out_dtype, int sm_count, cudaStream_t stream) {
  switch (out_dtype) {
    case at::kFloat: return outer::launch<In, float>(args, sm_count, stream);
    case at::kHalf: return outer::launch<In, __half>(args, sm_count, stream);
    default: return outer::launch<In, __nv_bfloat16>(args, sm_count, stream);
  }
}

at::Tensor batched_outer_cuda(const at::Tensor& u, const std::optional<at::Tensor>& v_opt, double alpha,
                              std::optional<at::ScalarType> out_dtype) {
  const BatchedOuterArgs checked = check_batched_outer(u, v_opt, out_dtype);
  TORCH_CHECK(u.is_cuda(), "batched_outer: argument 'u' must be a CUDA tensor for the CUDA kernel");
  const c10::cuda::CUDAGuard guard(u.device());
  const std::int64_t n = u.size(-1);
  at::Tensor out = at::empty(batched_outer_shape(u), u.options().dtype(checked.out_dtype));
  if (out.numel() == 0) return out;
  const cudaDeviceProp* props = at::cuda::getCurrentDeviceProperties();
  TORCH_CHECK(props->major >= 8, "batched_outer: the CUDA kernel needs compute capability 8.0 or newer");
  TORCH_CHECK(n <= (1 << 30), "batched_outer: n = ", n, " is too large");
  // (batch, n) views: a view whenever the batch dimensions allow it, a copy of the (small) inputs otherwise.
  const at::Tensor u2 = u.reshape({-1, n});
  const at::Tensor v2 = checked.v.reshape({-1, n});
  outer::Args args{};
  args.u = u2.data_ptr();
  args.v = v2.data_ptr();
  args.u_batch_stride = u2.stride(0);
  args.u_stride = u2.stride(1);
  args.v_batch_stride = v2.stride(0);
  args.v_stride = v2.stride(1);
  args.out = out.data_ptr();
  args.batch = u2.size(0);
  args.n = static_cast<int>(n);
  args.v_is_u = args.u == args.v && u2.strides() == v2.strides();
  args.alpha = static_cast<float>(alpha);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  switch (u.scalar_type()) {
    case at::kHalf: dispatch_out<__half>(args, checked.out_dtype, props->multiProcessorCount, stream); break;
    case at::kBFloat16: dispatch_out<__nv_bfloat16>(args, checked.out_dtype, props->multiProcessorCount, stream); break;
    default: dispatch_out<float>(args, checked.out_dtype, props->multiProcessorCount, stream); break;
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(wmmae, CUDA, m) { m.impl("batched_outer", &batched_outer_cuda); }

}  // namespace wmmae_ops
