// fragment_map on a GPU: the paper's fragment analysis (section 3). A warp loads a tile whose elements hold
// their own row (then their own column) with nvcuda::wmma::load_matrix_sync and reports what each lane's
// frag.x[i] received. For accumulators the layout is also measured the other way round, through
// store_matrix_sync; an entry where the two disagree is written as (-1, -1).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "fragment_dispatch.cuh"

namespace wmmae_ops {
namespace {

using namespace nvcuda;
using wmmae::Order;
using wmmae::Use;

constexpr int kTileLd = 32;  // every fragment tile fits in 32 x 32; 32 elements of any type are 16-byte multiples

// Small integers (< 256) are exact in every element type.
template <class T> __device__ T encode(int v) { return static_cast<T>(v); }
template <> __device__ __half encode<__half>(int v) { return __int2half_rn(v); }
template <> __device__ __nv_bfloat16 encode<__nv_bfloat16>(int v) { return __int2bfloat16_rn(v); }
template <class T> __device__ int decode(T v) { return static_cast<int>(v); }
template <> __device__ int decode<__half>(__half v) { return __half2int_rn(v); }
template <> __device__ int decode<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162int_rn(v); }

template <class Frag, class Mem>
__device__ void load_tile(Frag& frag, const Mem* tile) {
  if constexpr (wmmae::fragment_traits<Frag>::use == Use::accumulator) {
    wmma::load_matrix_sync(frag, tile, kTileLd, wmma::mem_row_major);
  } else {
    wmma::load_matrix_sync(frag, tile, kTileLd);
  }
}

// out: [32, num_elements, 2] int32. One warp.
template <class Frag, class Mem>
__global__ void measure_fragment_kernel(int* __restrict__ out) {
  constexpr bool kRowMajorMemory = wmmae::fragment_traits<Frag>::order != Order::col_major;
  constexpr int kNum = Frag::num_elements;
  __shared__ Mem tile[kTileLd * kTileLd];
  const int lane = threadIdx.x;
  int loaded[kNum][2];
  for (int pass = 0; pass < 2; ++pass) {
    for (int idx = lane; idx < kTileLd * kTileLd; idx += 32) {
      const int r = kRowMajorMemory ? idx / kTileLd : idx % kTileLd;
      const int c = kRowMajorMemory ? idx % kTileLd : idx / kTileLd;
      tile[idx] = encode<Mem>(pass == 0 ? r : c);
    }
    __syncwarp();
    Frag frag;
    load_tile(frag, tile);
#pragma unroll
    for (int x = 0; x < kNum; ++x) loaded[x][pass] = decode<Mem>(static_cast<Mem>(frag.x[x]));
    __syncwarp();
  }
  bool agrees[kNum];
#pragma unroll
  for (int x = 0; x < kNum; ++x) agrees[x] = true;
  if constexpr (wmmae::fragment_traits<Frag>::use == Use::accumulator) {
    // Store (lane, x) codes and check that each lands where the load said it came from.
    Frag frag;
#pragma unroll
    for (int x = 0; x < kNum; ++x) frag.x[x] = encode<Mem>(lane * kNum + x);
    wmma::store_matrix_sync(tile, frag, kTileLd, wmma::mem_row_major);
    __syncwarp();
#pragma unroll
    for (int x = 0; x < kNum; ++x) {
      const int stored = decode<Mem>(tile[loaded[x][0] * kTileLd + loaded[x][1]]);
      // Where a fragment repeats an element, the stored code may come from another copy of it.
      const int other_lane = stored / kNum, other_x = stored % kNum;
      agrees[x] = stored == lane * kNum + x ||
                  (other_lane == lane && other_x % wmmae::fragment_traits<Frag>::layout.period() ==
                                             x % wmmae::fragment_traits<Frag>::layout.period());
    }
  }
#pragma unroll
  for (int x = 0; x < kNum; ++x) {
    out[(lane * kNum + x) * 2 + 0] = agrees[x] ? loaded[x][0] : -1;
    out[(lane * kNum + x) * 2 + 1] = agrees[x] ? loaded[x][1] : -1;
  }
}

at::Tensor fragment_map_cuda(c10::string_view use, std::int64_t m, std::int64_t n, std::int64_t k,
                             c10::string_view dtype, std::optional<c10::string_view> layout,
                             std::optional<std::int64_t> arch, std::optional<at::Device> device) {
  const FragmentSpec spec = parse_fragment_spec(use, m, n, k, dtype, layout);
  TORCH_CHECK(!arch.has_value(), "fragment_map: pass either arch= (analytic table) or device= (measure the GPU), "
              "not both");
  TORCH_CHECK(device.has_value() && device->is_cuda(), "fragment_map: the CUDA kernel needs a CUDA device");
  // Checked here rather than by the device guard or the CUDA runtime, whose errors would be less clear.
  const int devices = static_cast<int>(c10::cuda::device_count());
  TORCH_CHECK(devices > 0, "fragment_map: argument 'device' is ", *device, ", but this machine has 0 CUDA device(s)");
  // "cuda" without an index means the current device.
  const at::Device dev = device->has_index() ? *device : at::Device(at::kCUDA, c10::cuda::current_device());
  TORCH_CHECK(dev.index() < devices, "fragment_map: argument 'device' is ", dev, ", but this machine has ", devices,
              " CUDA device(s)");
  const c10::cuda::CUDAGuard guard(dev);
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  TORCH_CHECK(prop->major >= 8, "fragment_map: measuring needs compute capability 8.0 or newer, ", dev.str(),
              " has ", prop->major, ".", prop->minor);
  const wmmae::CoreLayout expected = require_sm80_layout(spec);  // also rejects types CUDA does not have
  at::Tensor out = at::empty({32, expected.num_elements, 2}, at::TensorOptions().dtype(at::kInt).device(dev));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  dispatch_fragment(spec, [&](auto frag_tag, auto mem_tag) {
    using Frag = typename decltype(frag_tag)::type;
    using Mem = typename decltype(mem_tag)::type;
    measure_fragment_kernel<Frag, Mem><<<1, 32, 0, stream>>>(out.data_ptr<int>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(wmmae, CUDA, m) { m.impl("fragment_map", &fragment_map_cuda); }

}  // namespace wmmae_ops
