// Hopper (sm_90a) bulk tensor copies (TMA) and the mbarriers that say when they have landed: device-side PTX
// wrappers, and the host-side encoding of a tensor map for an fp32 operand read in place.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WMMAE_SM90A_DEVICE 1
#endif

namespace wmmae_ops {
namespace sm90 {

__device__ __forceinline__ std::uint32_t smem_address(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbarrier_init(std::uint64_t* bar, unsigned arrivals) {
#ifdef WMMAE_SM90A_DEVICE
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(arrivals) : "memory");
#endif
}

// Makes initialized mbarriers visible to the async proxy (TMA) before the first copy signals them.
__device__ __forceinline__ void fence_mbarrier_init() {
#ifdef WMMAE_SM90A_DEVICE
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// One arrival, and `bytes` more that the copies of this phase will deliver before the phase completes. `bar`
// is the mbarrier's shared-memory address (smem_address).
__device__ __forceinline__ void mbarrier_arrive_expect_tx(std::uint32_t bar, unsigned bytes) {
#ifdef WMMAE_SM90A_DEVICE
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}

// Waits until the phase with the given parity has completed.
__device__ __forceinline__ void mbarrier_wait(std::uint64_t* bar, unsigned parity) {
#ifdef WMMAE_SM90A_DEVICE
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(smem_address(bar)),
      "r"(parity)
      : "memory");
#endif
}

// Copies the box at coordinates (c0, c1, c2) of `map` to shared memory at `dst` (1024-byte aligned for the
// 128-byte swizzle) and counts its bytes on the mbarrier at `bar` (both shared-memory addresses, see
// smem_address). Elements outside the tensor arrive as zeros.
__device__ __forceinline__ void tma_load_3d(std::uint32_t dst, const CUtensorMap* map, std::uint32_t bar, int c0,
                                            int c1, int c2) {
#ifdef WMMAE_SM90A_DEVICE
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
      ::"r"(dst), "l"(reinterpret_cast<std::uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
#endif
}

// cuTensorMapEncodeTiled from the driver, found through the runtime (so the extension does not link
// libcuda); null if the driver does not have it.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t err =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
    return (err == cudaSuccess && found == cudaDriverEntryPointSuccess)
               ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn)
               : nullptr;
  }();
  return encode;
}

// The map of an fp32 operand whose inner dimension is contiguous, as (inner, outer, batch), in boxes of 32
// inner elements (128 bytes) x box_outer lines with the 128-byte swizzle (or box_inner elements, a multiple of 4,
// with `swizzle`); zeros outside. Strides in elements.
// *batched is false when the map has one batch index only (no batch, or a broadcast operand: stride 0).
// Returns false where TMA cannot read the operand in place (alignment, strides, sizes); the caller then
// copies with cp.async instead.
inline bool encode_fp32_operand_map(CUtensorMap* map, bool* batched, const float* base, std::int64_t inner,
                                    std::int64_t outer, std::int64_t outer_stride, std::int64_t batches,
                                    std::int64_t batch_stride, std::uint32_t box_outer, std::uint32_t box_inner = 32,
                                    CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B) {
  constexpr std::int64_t kMaxCoordinate = 0x7fffffff;  // box coordinates are 32-bit signed
  constexpr std::int64_t kStrideAlign = 16 / sizeof(float);  // global strides: multiples of 16 bytes
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  if (reinterpret_cast<std::uintptr_t>(base) % 16 != 0) return false;
  if (outer_stride <= 0 || outer_stride % kStrideAlign != 0) return false;
  if (inner > kMaxCoordinate || outer > kMaxCoordinate || batches > kMaxCoordinate) return false;
  *batched = batches > 1 && batch_stride != 0;
  if (*batched && (batch_stride < 0 || batch_stride % kStrideAlign != 0)) return false;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(outer),
                              static_cast<cuuint64_t>(*batched ? batches : 1)};
  const cuuint64_t byte_strides[2] = {
      static_cast<cuuint64_t>(outer_stride) * sizeof(float),
      static_cast<cuuint64_t>(*batched ? batch_stride : outer_stride * outer) * sizeof(float)};
  const cuuint32_t box[3] = {box_inner, box_outer, 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, const_cast<float*>(base), dims, byte_strides, box,
                element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Lines by residue (encode_fp32_residue_maps): a stride of 4 lines is a multiple of 16 bytes for any line stride.
constexpr int kLineResidues = 4;

// The four maps of an fp32 operand whose lines TMA cannot read as one map (a line stride or start that is not a
// multiple of 16 bytes), by residue of the line index (see TmaMaps::a_by_residue): map j holds lines j, j + 4, ...
// (4 line strides apart: a multiple of 16 bytes) from line j's start rounded down to 16 bytes, shift[j] floats
// before it, with an inner extent of inner + shift[j] (so that elements past a line's end still arrive as zeros).
// Element e of line j + 4 i is at (e + shift[j], i). A box must start 16-byte aligned in the inner dimension (boxes
// at e + shift[j] faulted with an illegal instruction: H200, session 101), so the kernel loads inner elements
// [e, e + 32) from a box at e that is box_inner >= 35 wide, unswizzled, and reads them from its column shift[j].
// False where a map cannot be encoded, and for fewer than 4 lines (a residue without lines would have a map past
// the operand's end).
inline bool encode_fp32_residue_maps(CUtensorMap maps[kLineResidues], int shift[kLineResidues], bool* batched,
                                     const float* base, std::int64_t inner, std::int64_t outer,
                                     std::int64_t outer_stride, std::int64_t batches, std::int64_t batch_stride,
                                     std::uint32_t box_inner, std::uint32_t box_outer) {
  if (outer < kLineResidues || outer_stride <= 0) return false;
  for (int j = 0; j < kLineResidues; ++j) {
    const float* line = base + j * outer_stride;
    const std::uintptr_t address = reinterpret_cast<std::uintptr_t>(line);
    if (address % sizeof(float) != 0) return false;
    shift[j] = static_cast<int>(address % 16 / sizeof(float));
    const std::int64_t lines = (outer - j + kLineResidues - 1) / kLineResidues;
    if (!encode_fp32_operand_map(&maps[j], batched, line - shift[j], inner + shift[j], lines,
                                 kLineResidues * outer_stride, batches, batch_stride, box_outer, box_inner,
                                 CU_TENSOR_MAP_SWIZZLE_NONE)) {
      return false;
    }
  }
  return true;
}

}  // namespace sm90
}  // namespace wmmae_ops
