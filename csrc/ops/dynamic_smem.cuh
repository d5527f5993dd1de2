// A kernel that uses more than 48 KiB of dynamic shared memory must opt in, per kernel and device
// (cudaFuncSetAttribute). That is a driver call, which the host would pay on every launch; this remembers,
// per kernel and device, the largest size already allowed, and asks again only to raise it. The other
// per-kernel, per-device driver queries below are remembered the same way.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAMacros.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace wmmae_ops {

template <auto Kernel>
void allow_dynamic_smem(std::size_t bytes) {
  if (bytes <= (48u << 10)) return;
  static std::array<std::atomic<std::size_t>, C10_COMPILE_TIME_MAX_GPUS> allowed{};  // per device, 0 at first
  static std::mutex raising;
  std::atomic<std::size_t>& limit = allowed[c10::cuda::current_device()];
  if (limit.load(std::memory_order_acquire) >= bytes) return;
  // Under the lock, so that a smaller size set by another thread cannot overwrite a larger one.
  const std::lock_guard<std::mutex> lock(raising);
  if (limit.load(std::memory_order_relaxed) >= bytes) return;
  C10_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  limit.store(bytes, std::memory_order_release);
}

// Asks that SMs running `Kernel` take the largest shared-memory carveout (the rest of L1 stays cache). For
// kernels whose blocks share SMs with another kernel's (the resident pre-pass beside the GEMM): the carveout
// is a per-SM setting, and one sized for a small kernel's blocks would leave no room for the other's large
// ones. Once per kernel and device.
template <auto Kernel>
void prefer_max_shared_carveout() {
  static std::array<std::atomic<bool>, C10_COMPILE_TIME_MAX_GPUS> done{};
  std::atomic<bool>& set = done[c10::cuda::current_device()];
  if (set.load(std::memory_order_acquire)) return;
  C10_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                      cudaSharedmemCarveoutMaxShared));
  set.store(true, std::memory_order_release);
}

// How many blocks of `Kernel` (`threads` threads, `bytes` of dynamic shared memory) an SM holds at once, at
// least 1. Asked once per kernel, device and size (a driver call), for up to kRememberedSizes sizes per kernel and
// device (the small GEMM's grow with K; beyond them it asks at every call); `threads` must be the same at every
// call for one kernel.
template <auto Kernel>
int blocks_per_sm(int threads, std::size_t bytes) {
  constexpr int kRememberedSizes = 8;
  // Per device, the sizes asked, in the order asked: bytes << 32 | blocks (0: not asked yet; blocks >= 1).
  static std::array<std::array<std::atomic<std::uint64_t>, kRememberedSizes>, C10_COMPILE_TIME_MAX_GPUS> known{};
  auto& sizes = known[c10::cuda::current_device()];
  for (const auto& size : sizes) {
    const std::uint64_t entry = size.load(std::memory_order_acquire);
    if (entry == 0) break;
    if (entry >> 32 == bytes) return static_cast<int>(entry & 0xffffffffu);
  }
  allow_dynamic_smem<Kernel>(bytes);
  int n = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, Kernel, threads, bytes));
  n = n > 0 ? n : 1;
  const std::uint64_t entry = static_cast<std::uint64_t>(bytes) << 32 | static_cast<std::uint32_t>(n);
  for (auto& size : sizes) {  // the first free place, unless another thread has just remembered the same size
    std::uint64_t expected = 0;
    if (size.compare_exchange_strong(expected, entry, std::memory_order_acq_rel) || expected == entry) break;
  }
  return n;
}

// The PTX arch that `Kernel`'s code on the current device was compiled for (cudaFuncAttributes::ptxVersion,
// e.g. 90): older than the device where the build has only PTX of an older arch for it, JIT-compiled. Asked
// once per kernel and device.
template <auto Kernel>
int ptx_version() {
  static std::array<std::atomic<int>, C10_COMPILE_TIME_MAX_GPUS> known{};  // per device, 0: not asked yet
  std::atomic<int>& version = known[c10::cuda::current_device()];
  int v = version.load(std::memory_order_acquire);
  if (v > 0) return v;
  cudaFuncAttributes attributes{};
  C10_CUDA_CHECK(cudaFuncGetAttributes(&attributes, Kernel));
  v = attributes.ptxVersion;
  version.store(v, std::memory_order_release);
  return v;
}

}  // namespace wmmae_ops
