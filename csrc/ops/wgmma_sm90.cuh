// Hopper (sm_90a) warpgroup matrix products (wgmma): the PTX wrappers the corrected GEMM's kernel is built
// from (shared-memory matrix descriptors, fences, commit and wait of product groups, the register fence around
// them, and the fp16 m64n128k16 / m64n64k16 and tf32 m64n128k8 products with A in registers and B in shared
// memory). Also used by benchmarks/micro/products_floor.cu, which rebuilds the GEMM's stage loop from them.
#pragma once

#include <cstdint>

#include "sm90_tma.cuh"  // (WMMAE_SM90A_DEVICE: compiled for sm_90a)

namespace wmmae_ops {
namespace sm90 {

// A shared-memory matrix descriptor: the matrix's shared-window byte address and its leading and stride byte
// offsets (between core matrices), in 16-byte units; no swizzle, base offset 0.
template <int kLeadingBytes, int kStrideBytes>
__device__ __forceinline__ std::uint64_t matrix_descriptor(std::uint32_t smem_addr) {
  return static_cast<std::uint64_t>((smem_addr & 0x3ffff) >> 4) |
         (static_cast<std::uint64_t>(kLeadingBytes >> 4) << 16) | (static_cast<std::uint64_t>(kStrideBytes >> 4) << 32);
}

__device__ __forceinline__ void wgmma_fence() {
#ifdef WMMAE_SM90A_DEVICE
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#ifdef WMMAE_SM90A_DEVICE
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most `kPending` committed groups of this warpgroup's products are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
#ifdef WMMAE_SM90A_DEVICE
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}
// Shared memory written by ordinary stores and read next by wgmma (the async proxy).
__device__ __forceinline__ void fence_proxy_async() {
#ifdef WMMAE_SM90A_DEVICE
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Keeps the compiler from moving accesses of accumulator registers across the wgmma fences and waits.
template <int N>
__device__ __forceinline__ void fence_registers(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// The accumulator operands of a wgmma, each with constraint c ("+f": read and written, "=f": written only).
#define WMMAE_WGMMA_ACC8(c, i) \
  c(d[i]), c(d[i + 1]), c(d[i + 2]), c(d[i + 3]), c(d[i + 4]), c(d[i + 5]), c(d[i + 6]), c(d[i + 7])
#define WMMAE_WGMMA_ACC32(c) \
  WMMAE_WGMMA_ACC8(c, 0), WMMAE_WGMMA_ACC8(c, 8), WMMAE_WGMMA_ACC8(c, 16), WMMAE_WGMMA_ACC8(c, 24)
#define WMMAE_WGMMA_ACC64(c)                                                                                 \
  WMMAE_WGMMA_ACC8(c, 0), WMMAE_WGMMA_ACC8(c, 8), WMMAE_WGMMA_ACC8(c, 16), WMMAE_WGMMA_ACC8(c, 24),        \
      WMMAE_WGMMA_ACC8(c, 32), WMMAE_WGMMA_ACC8(c, 40), WMMAE_WGMMA_ACC8(c, 48), WMMAE_WGMMA_ACC8(c, 56)
// The wgmma texts: accumulators %0.., then A's four registers, the accumulate flag (the scale-d predicate),
// B's descriptor and (fp16) B's transpose.
#define WMMAE_WGMMA_M64N128K16_F16                                                                  \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %68, 0;\n"                                                      \
  "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"                                          \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                          \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"                \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"                \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"                 \
  "}, {%64, %65, %66, %67}, %69, p, 1, 1, %70;\n}\n"
#define WMMAE_WGMMA_M64N64K16_F16                                                                   \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %36, 0;\n"                                                      \
  "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"                                           \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                          \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"                 \
  "}, {%32, %33, %34, %35}, %37, p, 1, 1, %38;\n}\n"
#define WMMAE_WGMMA_M64N128K8_TF32                                                                  \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %68, 0;\n"                                                      \
  "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {"                                         \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                          \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"                \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"                \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"                 \
  "}, {%64, %65, %66, %67}, %69, p, 1, 1;\n}\n"
// Defines one shape's pair of wrappers (fp16: TEMPLATE_HEAD `template <bool kTransB>` and MORE_OPERANDS
// WMMAE_WGMMA_TRANS_B; tf32: both empty):
// - NAME(d, a, b, accumulate): d (+)= a * b, d = a * b where accumulate == 0;
// - NAME_overwrite(d, a, b): d = a * b, with d's earlier values dead to the compiler, so that between one
//   product's last read of d and the next product its registers are free for other values.
#define WMMAE_DEFINE_WGMMA(TEMPLATE_HEAD, NAME, ACCUMULATORS, TEXT, MORE_OPERANDS)                                \
  TEMPLATE_HEAD __device__ __forceinline__ void NAME(float (&d)[ACCUMULATORS], const std::uint32_t (&a)[4], \
                                                     std::uint64_t b, int accumulate) {                   \
    WMMAE_SM90A_ONLY(asm volatile(TEXT                                                                    \
                                  : WMMAE_WGMMA_ACC##ACCUMULATORS("+f")                                    \
                                  : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(accumulate),           \
                                    "l"(b) MORE_OPERANDS));                                              \
  }                                                                                                        \
  TEMPLATE_HEAD __device__ __forceinline__ void NAME##_overwrite(float (&d)[ACCUMULATORS],                 \
                                                                 const std::uint32_t (&a)[4], std::uint64_t b) { \
    WMMAE_SM90A_ONLY(asm volatile(TEXT                                                                    \
                                  : WMMAE_WGMMA_ACC##ACCUMULATORS("=f")                                    \
                                  : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(0), "l"(b) MORE_OPERANDS)); \
  }
#ifdef WMMAE_SM90A_DEVICE
#define WMMAE_SM90A_ONLY(statement) statement
#else
#define WMMAE_SM90A_ONLY(statement)
#endif

// a: a 64x16 fp16 fragment in registers; b: 16x128 (m64n128k16) or 16x64 (m64n64k16, a slice of 64 columns)
// fp16 in shared memory (descriptor; kTransB: MN-major core matrices); d: 64x128 or 64x64 fp32 in registers.
#define WMMAE_WGMMA_TRANS_B , "n"(kTransB ? 1 : 0)
WMMAE_DEFINE_WGMMA(template <bool kTransB>, wgmma_m64n128k16, 64, WMMAE_WGMMA_M64N128K16_F16, WMMAE_WGMMA_TRANS_B)
WMMAE_DEFINE_WGMMA(template <bool kTransB>, wgmma_m64n64k16, 32, WMMAE_WGMMA_M64N64K16_F16, WMMAE_WGMMA_TRANS_B)
// The tf32 products: a a 64x8 tf32 fragment in registers (4 x 32 bits per thread: rows 16 w + lane / 4 and 8
// below, k lane % 4 and 4 further), b 8x128 tf32 in shared memory (K-major descriptor).
WMMAE_DEFINE_WGMMA(, wgmma_m64n128k8_tf32, 64, WMMAE_WGMMA_M64N128K8_TF32, )
#undef WMMAE_DEFINE_WGMMA
#undef WMMAE_WGMMA_TRANS_B
#undef WMMAE_SM90A_ONLY
#undef WMMAE_WGMMA_M64N128K8_TF32
#undef WMMAE_WGMMA_M64N128K16_F16
#undef WMMAE_WGMMA_M64N64K16_F16
#undef WMMAE_WGMMA_ACC32
#undef WMMAE_WGMMA_ACC64
#undef WMMAE_WGMMA_ACC8

}  // namespace sm90
}  // namespace wmmae_ops
