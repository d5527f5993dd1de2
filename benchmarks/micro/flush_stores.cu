// What writing a 128 x 128 fp32 output tile costs when every SM writes one at the same moment (as the
// persistent GEMM's blocks do at 64 x 512^3), from wgmma's m64n128 accumulator layout (two warpgroups), three
// ways: variant 0 one float2 per pair of columns (the GEMM's flush before session 37), variant 1 a float4 per
// lane after lanes 2i and 2i + 1 of each quad trade a pair (the flush since), variant 2 through shared memory
// into whole rows (512 contiguous bytes per warp store). 128 blocks each write 8 tiles of a 64 x 512 x 512
// output, spinning `spin` ns between tiles in place of the stage loop; every variant must write the same bits.
//
//   nvcc -O3 -arch=sm_90a -std=c++17 -o flush_stores benchmarks/micro/flush_stores.cu && ./flush_stores
//
// H200, session 37 (benchmarks/NOTES.md): per tile 1.40 / 1.15 / 1.50 us with 15 us between tiles.
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

constexpr int kBatch = 64, kM = 512, kN = 512, kTilesPerEntry = 16, kPieces = 8;
constexpr int kPitch = 136;  // shared-memory row pitch in floats (variant 2)

__device__ __forceinline__ std::uint64_t now() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

template <int kVariant>
__global__ void __launch_bounds__(256) flush_kernel(float* out, int spin_ns, unsigned long long* flush_ns) {
  extern __shared__ float smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, quad = lane % 4;
  const int row0 = 16 * warp + lane / 4;  // warp w: rows 16 w .. 16 w + 15 (both warpgroups)
  float acc[64];
#pragma unroll
  for (int x = 0; x < 64; ++x) acc[x] = static_cast<float>(threadIdx.x * 64 + x);
  unsigned long long spent = 0;
  const int slots = gridDim.x / kTilesPerEntry;
  const int tile = blockIdx.x % kTilesPerEntry, slot = blockIdx.x / kTilesPerEntry;
  for (int p = 0; p < kPieces; ++p) {
    const int z = slot + p * slots;
    // stand-in for the stage loop
    const std::uint64_t t0 = now();
    while (now() - t0 < static_cast<std::uint64_t>(spin_ns)) {
    }
#pragma unroll
    for (int x = 0; x < 64; ++x) acc[x] += 1.0f;
    __syncthreads();
    const std::uint64_t f0 = now();
    if (z < kBatch) {
      const int m0 = (tile / 4) * 128, n0 = (tile % 4) * 128;
      float* origin = out + (static_cast<std::int64_t>(z) * kM + m0) * kN + n0;
      if constexpr (kVariant == 0) {
#pragma unroll
        for (int x = 0; x < 64; x += 2) {
          const int r = (x >> 1) & 1, j = 8 * (x >> 2);
          *reinterpret_cast<float2*>(origin + (row0 + 8 * r) * kN + 2 * quad + j) = make_float2(acc[x], acc[x + 1]);
        }
      } else if constexpr (kVariant == 1) {
        // pairs t = 2u, 2u + 1 of one row: an even quad keeps t's pair and takes its partner's, an odd one
        // keeps t + 1's pair and takes its partner's.
        const bool odd = quad & 1;
#pragma unroll
        for (int u = 0; u < 8; ++u) {
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int x0 = 8 * u + 2 * r, x1 = x0 + 4;  // element of pair (t = 2u, r) and (t = 2u + 1, r)
            const float s0 = odd ? acc[x0] : acc[x1], s1 = odd ? acc[x0 + 1] : acc[x1 + 1];
            const float g0 = __shfl_xor_sync(0xffffffffu, s0, 1), g1 = __shfl_xor_sync(0xffffffffu, s1, 1);
            const float4 v = odd ? make_float4(g0, g1, acc[x1], acc[x1 + 1]) : make_float4(acc[x0], acc[x0 + 1], g0, g1);
            const int col = 16 * u + (odd ? 8 + 2 * (quad - 1) : 2 * quad);
            *reinterpret_cast<float4*>(origin + (row0 + 8 * r) * kN + col) = v;
          }
        }
      } else {
        float* w = smem + warp * 16 * kPitch;
        const int g = lane / 4;
#pragma unroll
        for (int x = 0; x < 64; x += 2) {
          const int r = (x >> 1) & 1, j = 8 * (x >> 2);
          *reinterpret_cast<float2*>(w + (g + 8 * r) * kPitch + 2 * quad + j) = make_float2(acc[x], acc[x + 1]);
        }
        __syncwarp();
#pragma unroll
        for (int row = 0; row < 16; ++row) {
          *reinterpret_cast<float4*>(origin + (16 * warp + row) * kN + 4 * lane) =
              *reinterpret_cast<const float4*>(w + row * kPitch + 4 * lane);
        }
        __syncwarp();
      }
    }
    __syncthreads();
    spent += now() - f0;
  }
  if (threadIdx.x == 0) flush_ns[blockIdx.x] = spent;
}

template <int V>
float run(float* out, int blocks, int spin, unsigned long long* d_ns, std::vector<unsigned long long>& ns) {
  const int smem = V == 2 ? 8 * 16 * kPitch * 4 : 0;
  cudaFuncSetAttribute(flush_kernel<V>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> t;
  for (int i = 0; i < 25; ++i) {
    cudaEventRecord(a);
    flush_kernel<V><<<blocks, 256, smem>>>(out, spin, d_ns);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    if (i >= 5) t.push_back(ms * 1000.f);
  }
  std::sort(t.begin(), t.end());
  ns.resize(blocks);
  cudaMemcpy(ns.data(), d_ns, blocks * sizeof(unsigned long long), cudaMemcpyDeviceToHost);
  return t[t.size() / 2];
}

int main() {
  const size_t count = static_cast<size_t>(kBatch) * kM * kN;
  float* out;
  unsigned long long* d_ns;
  cudaMalloc(&out, count * sizeof(float));
  cudaMalloc(&d_ns, 1024 * sizeof(unsigned long long));
  std::vector<float> ref(count), got(count);
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  printf("%s, %d SMs\n", prop.name, prop.multiProcessorCount);
  int failures = 0;
  const int blocks = 128;  // 8 batch slots x 16 tiles, as the persistent grid at 64 x 512^3
  for (int spin : {0, 15000}) {
    for (int v = 0; v < 3; ++v) {
      cudaMemset(out, 0xff, count * sizeof(float));  // NaN: every element must be written
      std::vector<unsigned long long> ns;
      const float us = v == 0 ? run<0>(out, blocks, spin, d_ns, ns)
                              : v == 1 ? run<1>(out, blocks, spin, d_ns, ns) : run<2>(out, blocks, spin, d_ns, ns);
      cudaError_t e = cudaDeviceSynchronize();
      std::sort(ns.begin(), ns.end());
      cudaMemcpy(v == 0 ? ref.data() : got.data(), out, count * sizeof(float), cudaMemcpyDeviceToHost);
      size_t bad = 0;
      if (v > 0)
        for (size_t i = 0; i < count; ++i) bad += memcmp(&ref[i], &got[i], 4) != 0;
      failures += bad != 0 || e != cudaSuccess;
      printf("spin %5d ns  variant %d: kernel %8.2f us, flush per block per piece median %6.3f us (max %6.3f), "
             "mismatches %zu, %s\n",
             spin, v, us, ns[ns.size() / 2] / 1000.0 / kPieces, ns.back() / 1000.0 / kPieces, bad,
             cudaGetErrorString(e));
    }
  }
  if (failures) printf("FAILED: %d runs wrote other bits than variant 0 or reported an error\n", failures);
  return failures ? 1 : 0;
}
