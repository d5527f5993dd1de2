// Where corrected_matmul's energy goes under held load. Its fp16 wgmma GEMM holds an H100/H200 at the 700 W
// power limit, so its held speed is 700 W divided by its energy per useful flop. This program rebuilds the
// GEMM's stage loop (csrc/ops/corrected_gemm_sm90.cuh) piece by piece, with no loads from global memory and
// no flush, holds each version for seconds on every SM, and reads the board's energy from NVML's counter. The
// products are the GEMM's own wgmma wrappers (csrc/ops/wgmma_sm90.cuh), the splits the device library's.
// Results and their reading: benchmarks/results/products_floor.md; the study: benchmarks/NOTES.md, session 71.
//
// Each block of 256 threads (two warpgroups, one 128 x 128 tile, one block per SM) loops over stages of 32 k
// as the GEMM's fp16 stage loop does:
//   G1: hi*hi of k-step 0 into a fresh hh, lo*hi and hi*lo into corr; wait for the previous stage's G3;
//   G2: hi*hi of k-step 1 onto hh;  G3: k-step 1's lo*hi and hi*lo;  wait for G2; then sum += hh,
// with one block barrier per stage.
//   variants 0 to 2 (products_kernel): the products alone, B's hi/lo tiles (no swizzle, K-major core
//     matrices) and A's fragments (already split, four 16-byte loads per thread and stage) rotating through
//     three buffers of random fp16 in shared memory, so that each product sees other data than the one
//     before: 0 the three products per k-step; 1 plus the 64 FADDs per thread and stage of the hi*hi sums
//     (all that the method prescribes per stage, data movement aside); 2 one product per k-step (the tile
//     shape's energy per tensor flop, beside cuBLAS's fp16 GEMM in bench_sustained.py);
//   variants 3 to 17 (splits_kernel): variant 1 plus A's and B's splits from fp32 stages in shared memory,
//     and variations of B's split (see BSplit and Probe below).
// Useful flops are 2 x 128 x 128 x 32 per block and stage, a third of the tensor flops.
//
//   nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -o products_floor \
//     benchmarks/micro/products_floor.cu -ldl
//   ./products_floor [seconds held per variant, default 3] [idle seconds before each, default 2]
//                    [variants to run, e.g. 0,1,3; default all]
#include <cuda_runtime.h>
#include <dlfcn.h>

#include "../../csrc/ops/wgmma_sm90.cuh"
#include "../../csrc/wmmae/split.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace wmmae_ops::sm90;  // the GEMM's wgmma wrappers and mbarrier helpers

constexpr int kThreads = 256, kStagesPerLaunch = 8192, kBuffers = 3;
constexpr int kCoreBytes = 128;                 // one 8 x 8 fp16 core matrix
constexpr int kSbo = kCoreBytes;                // next 8 columns n
constexpr int kLbo = 128 / 8 * kCoreBytes;      // next 8 k
constexpr int kSplitBytes = 32 * 128 * 2;       // one stage's hi (or lo) tile of B: 32 k x 128 n fp16
constexpr int kAFragBytes = kThreads * 4 * 16;  // one stage's A fragments: 16 registers per thread
constexpr int kBufferBytes = 2 * kSplitBytes + kAFragBytes;
constexpr int kSmemBytes = kBuffers * kBufferBytes;

#define CHECK_CUDA(x)                                                                          \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

__device__ __forceinline__ std::uint64_t descriptor(std::uint32_t smem_addr) {  // a hi/lo tile's, as the GEMM's
  return matrix_descriptor<kLbo, kSbo>(smem_addr);
}

// A 64x16 fp16 fragment's four registers, from four consecutive 32-bit words.
__device__ __forceinline__ void load_fragment(const uint4& v, std::uint32_t (&r)[4]) {
  r[0] = v.x, r[1] = v.y, r[2] = v.z, r[3] = v.w;
}

__device__ __forceinline__ std::uint32_t hash(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  return x ^ (x >> 16);
}

template <int kVariant>
__global__ void __launch_bounds__(kThreads, 1) products_kernel(int stages, int zero, std::uint32_t seed, float* out) {
  extern __shared__ __align__(128) std::uint8_t smem[];
  // Random fp16 in (-2, 2) with random mantissas (sign, exponent 14 or 15 of 30, mantissa): never zero.
  auto* words = reinterpret_cast<std::uint32_t*>(smem);
  for (int i = threadIdx.x; i < kSmemBytes / 4; i += kThreads) {
    const std::uint32_t h = hash(seed ^ (blockIdx.x * 0x9e3779b9U) ^ (i * 0x85ebca6bU));
    const std::uint32_t lo = (h & 0x83ffU) | 0x3800U | ((h >> 10) & 0x400U);
    const std::uint32_t hi = ((h >> 16) & 0x83ffU) | 0x3800U | ((h >> 26) & 0x400U);
    words[i] = lo | hi << 16;
  }
  __syncthreads();
  fence_proxy_async();
  __syncthreads();
  const auto base = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
  constexpr int kStepDesc = 2 * kLbo >> 4;  // descriptor units per k-step of 16
  float sum[64], hh[64], corr[64];
#pragma unroll
  for (int x = 0; x < 64; ++x) sum[x] = 0.0f, hh[x] = 0.0f;
  std::uint32_t a_hi0[4], a_lo0[4], a_hi1[4], a_lo1[4];
  int buf = 0;
  for (int s = 0; s < stages; ++s) {
    __syncthreads();  // the GEMM's one block barrier per stage
    const std::uint32_t buffer = base + buf * kBufferBytes;
    const std::uint64_t b_hi = descriptor(buffer), b_lo = descriptor(buffer + kSplitBytes);
    const uint4* a = reinterpret_cast<const uint4*>(smem + buf * kBufferBytes + 2 * kSplitBytes) + threadIdx.x;
    load_fragment(a[0], a_hi0);
    load_fragment(a[kThreads], a_lo0);
    if constexpr (kVariant == 2) {
      load_fragment(a[2 * kThreads], a_hi1);
      wgmma_fence();
      wgmma_m64n128k16<false>(corr, a_hi0, b_hi, s > 0);
      wgmma_m64n128k16<false>(corr, a_hi1, b_hi + kStepDesc, 1);
      wgmma_commit();
      wgmma_wait<1>();  // the previous stage's products
    } else {
      wgmma_fence();
      // A fresh hh, as in the GEMM. Variant 0 does not read hh, so its G1 takes the accumulating form with a
      // flag that is 0 at run time (no C read either way), or ptxas would find hh dead and drop products.
      if constexpr (kVariant == 0) {
        wgmma_m64n128k16<false>(hh, a_hi0, b_hi, zero);
      } else {
        wgmma_m64n128k16_overwrite<false>(hh, a_hi0, b_hi);
      }
      wgmma_m64n128k16<false>(corr, a_lo0, b_hi, s > 0);
      wgmma_m64n128k16<false>(corr, a_hi0, b_lo, 1);
      wgmma_commit();
      wgmma_wait<1>();  // the previous stage's G3: A's k-step-1 fragment is free
      load_fragment(a[2 * kThreads], a_hi1);
      load_fragment(a[3 * kThreads], a_lo1);
      wgmma_fence();
      wgmma_m64n128k16<false>(hh, a_hi1, b_hi + kStepDesc, 1);
      wgmma_commit();
      wgmma_m64n128k16<false>(corr, a_lo1, b_hi + kStepDesc, 1);
      wgmma_m64n128k16<false>(corr, a_hi1, b_lo + kStepDesc, 1);
      wgmma_commit();
      wgmma_wait<1>();  // G2 (and G1)
      if constexpr (kVariant == 1) {
        fence_registers(hh);
#pragma unroll
        for (int x = 0; x < 64; ++x) sum[x] += hh[x];
        fence_registers(hh);
      }
    }
    buf = buf == kBuffers - 1 ? 0 : buf + 1;
  }
  wgmma_wait<0>();
  fence_registers(corr);
  float total = 0.0f;
#pragma unroll
  for (int x = 0; x < 64; ++x) total += sum[x] + corr[x];
  if constexpr (kVariant != 2) total += hh[0];
  out[blockIdx.x * kThreads + threadIdx.x] = total;  // keeps every product live
}

// Variants 3 to 7: variant 1 plus A's and B's splits as the GEMM does them, from fp32 stages that stay in
// shared memory (three, of random values in (-1, 1), rotating; no loads from global memory): each thread
// splits its A fragment (16 values per stage, times its rows' line scales, wmmae::split_fp16x2) into
// registers, and 16 values of B (times their columns' scales, wmmae::split_fp16x2_compensated) into the next
// stage's hi/lo tiles, warpgroup 1 before its products and warpgroup 0 after its hi*hi sum, A's k-step 0 a
// stage ahead, one block barrier per stage.
//   variant 3 (BSplit::whole): that;
//   variant 4 (BSplit::half): B's split halved (8 values per thread and stage; the other half of the hi/lo
//     tiles left as they are): what two blocks of a cluster that shared B's split (in a GEMM, the blocks of
//     two tile rows, which read the same B) could save at most;
//   variant 5 (kScaled false): variant 3 without the multiplications by the line scales (one per element);
//   variant 6 (BSplit::cluster_barrier): B's split shared for real by the two blocks of a cluster: each
//     splits its half and stores it into its own and the other block's tiles (st.shared::cluster); the
//     stage's barrier is the cluster's (both blocks' threads);
//   variant 7 (BSplit::cluster_mbarrier): as 6, but the block barrier stays the block's, and the two blocks
//     meet only through an mbarrier pair per hi/lo buffer: "full" (each warp of the other block arrives once
//     its half of the buffer is stored; the products wait for it) and "empty" (each warp arrives on the other
//     block's once its products that read the buffer are retired; the other block's split waits for it
//     before storing into it);
//   variant 8: as 7 with B split two stages ahead (kAhead 2, four hi/lo buffers); variant 9: 3 so;
//   variant 16 (BSplit::cluster_bulk): as 7, but each block sends its half of a buffer by bulk copies
//     (cp.async.bulk into the other block's shared memory, completing on its "full" mbarrier as TMA does),
//     one thread per warpgroup, after the warpgroup's split; variant 17: 16 two stages ahead;
//   variants 10 to 15 (Probe, not correct protocols, timing probes of variant 7; 13: variant 4 launched in
//     clusters).
enum class BSplit { whole, half, cluster_barrier, cluster_mbarrier, cluster_bulk };
constexpr int kAPitch = 32 + 8, kBPitch = 128 + 4;  // fp32 stage rows padded (as the cp.async stages)
constexpr int kStageBytes = (128 * kAPitch + 32 * kBPitch) * 4;
constexpr int kMaxHiLo = 4;                     // hi/lo buffers: kAhead + 2
constexpr int kBarrierBytes = 2 * kMaxHiLo * 8;  // BSplit::cluster_mbarrier's full and empty mbarriers
constexpr int kSplitSmemBytes = kBuffers * kStageBytes + kMaxHiLo * 2 * kSplitBytes + kBarrierBytes;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ std::uint32_t bits(__half2 h) {
  std::uint32_t u;
  memcpy(&u, &h, sizeof u);
  return u;
}

__device__ __forceinline__ std::uint32_t cluster_rank() {
  std::uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}
// The address of the same shared-memory byte in block `rank` of the cluster.
__device__ __forceinline__ std::uint32_t cluster_address(std::uint32_t local, std::uint32_t rank) {
  std::uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}
__device__ __forceinline__ void cluster_store(std::uint32_t remote, std::uint32_t x, std::uint32_t y) {
  asm volatile("st.shared::cluster.v2.u32 [%0], {%1, %2};\n" ::"r"(remote), "r"(x), "r"(y) : "memory");
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// kSemantics: 0 release at the cluster's scope (what publishing the stores needs), 1 release at the block's
// scope (PTX's default), 2 relaxed (probes).
template <int kSemantics = 0>
__device__ __forceinline__ void remote_arrive(std::uint32_t remote_barrier) {
  if constexpr (kSemantics == 0) {
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote_barrier) : "memory");
  } else if constexpr (kSemantics == 1) {
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote_barrier) : "memory");
  } else {
    asm volatile("mbarrier.arrive.relaxed.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote_barrier) : "memory");
  }
}
// Copies `bytes` of this block's shared memory into another block's (remote address), completing them on
// that block's mbarrier `remote_barrier`.
__device__ __forceinline__ void bulk_copy(std::uint32_t remote, std::uint32_t local, int bytes,
                                          std::uint32_t remote_barrier) {
  asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   remote),
               "r"(local), "r"(bytes), "r"(remote_barrier)
               : "memory");
}
// mbarrier_wait (sm90_tma.cuh) with acquire at the cluster's scope (kClusterScope), which the other block's
// stores released at that scope need; mbarrier_wait itself where the block's scope is enough.
template <bool kClusterScope = true>
__device__ __forceinline__ void wait_parity(std::uint64_t* barrier, unsigned parity) {
  if constexpr (kClusterScope) {
    asm volatile(
        "{\n.reg .pred done;\nwait_%=:\n"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra wait_%=;\n}\n" ::"r"(smem_address(barrier)),
        "r"(parity)
        : "memory");
  } else {
    mbarrier_wait(barrier, parity);
  }
}

// Timing probes of variant 7 (none of them a correct protocol): 10 without the cluster-wide proxy fence after
// the remote stores; 11 with the other block's half stored locally (the handshake alone); 12 with the
// mbarrier waits at the block's scope; 14 and 15 with the remote arrivals released at the block's scope, or
// relaxed (no release of the stores at the cluster's scope).
enum class Probe { none, no_cluster_fence, local_stores, cta_scope_waits, cta_release_arrives, relaxed_arrives };

template <BSplit kB, bool kScaled = true, int kAhead = 1, Probe kProbe = Probe::none>
__global__ void __launch_bounds__(kThreads, 1)
    splits_kernel(int stages, const float* scales, std::uint32_t seed, float* out) {
  constexpr int kHiLo = kAhead + 2;  // buffers: the stage's, the one split ahead, and one still read
  static_assert(kHiLo <= kMaxHiLo, "shared memory holds kMaxHiLo hi/lo buffers");
  constexpr bool kBulk = kB == BSplit::cluster_bulk;
  constexpr bool kCluster = kB == BSplit::cluster_barrier || kB == BSplit::cluster_mbarrier || kBulk;
  constexpr bool kMbarriers = kB == BSplit::cluster_mbarrier || kBulk;
  constexpr int kBulkBytes = kThreads * 2 * 8 * 2;  // bytes of hi and lo the other block sends per fill
  extern __shared__ __align__(128) std::uint8_t smem[];
  auto stage_a = [&](int i) { return reinterpret_cast<const float*>(smem + i * kStageBytes); };
  auto stage_b = [&](int i) { return stage_a(i) + 128 * kAPitch; };
  auto split_tile = [&](int i) { return smem + kBuffers * kStageBytes + i * 2 * kSplitBytes; };
  const auto base = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
  // kMbarriers: "full" and "empty" of each hi/lo buffer
  std::uint64_t* const full = reinterpret_cast<std::uint64_t*>(smem + kBuffers * kStageBytes + kMaxHiLo * 2 * kSplitBytes);
  std::uint64_t* const empty = full + kMaxHiLo;
  auto* stage_words = reinterpret_cast<float*>(smem);
  for (int i = threadIdx.x; i < kBuffers * kStageBytes / 4; i += kThreads) {
    const std::uint32_t h = hash(seed ^ (blockIdx.x * 0x9e3779b9U) ^ (i * 0x85ebca6bU));
    stage_words[i] = (__uint_as_float(0x3f800000U | (h >> 9)) - 1.0f) * (h & 1 ? -1.0f : 1.0f);
  }
  if (kMbarriers && threadIdx.x == 0) {
    for (int i = 0; i < kMaxHiLo; ++i) {
      // kBulk: "full" completes on this block's one arrival with its expected bytes, and the bytes
      mbarrier_init(full + i, kBulk ? 1 : kWarps);
      mbarrier_init(empty + i, kWarps);
    }
    if constexpr (kBulk) {
      for (int i = 0; i < kHiLo; ++i) mbarrier_arrive_expect_tx(smem_address(full + i), kBulkBytes);  // first fills
    }
    fence_mbarrier_init();
  }
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int row0 = 16 * warp + lane / 4, quad = lane % 4;  // warp w of warpgroup g: rows 64 g + 16 (w % 4)
  // !kScaled: the scales are 1 at compile time, so the splits lose their multiplications by them.
  const float a_scale[2] = {kScaled ? scales[row0] : 1.0f, kScaled ? scales[row0 + 8] : 1.0f};
  float b_scale[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) b_scale[e] = kScaled ? scales[128 + (4 * (t / 8) + e) % 128] : 1.0f;
  const std::uint32_t rank = kCluster ? cluster_rank() : 0, other = rank ^ 1;
  constexpr int kStepDesc = 2 * kLbo >> 4;
  auto load_a = [&](int sb, int step, float2 (&v)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[i] = *reinterpret_cast<const float2*>(stage_a(sb) + (row0 + 8 * (i & 1)) * kAPitch + 16 * step +
                                              8 * (i >> 1) + 2 * quad);
    }
  };
  auto split_a = [&](const float2 (&v)[4], std::uint32_t (&hi)[4], std::uint32_t (&lo)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      __half2 h2, l2;
      wmmae::split_fp16x2(v[i].x * a_scale[i & 1], v[i].y * a_scale[i & 1], h2, l2);
      hi[i] = bits(h2), lo[i] = bits(l2);
    }
  };
  constexpr int kArrive = kProbe == Probe::cta_release_arrives ? 1 : kProbe == Probe::relaxed_arrives ? 2 : 0;
  // B's split of stage ring slot sb into hi/lo buffer hb, the use-th time that buffer is filled.
  auto split_b = [&](int sb, int hb, int use) {
    constexpr int kGroups = kB == BSplit::whole ? 4 : 2;  // groups of 8 k of the 32
    const int first = kCluster ? 2 * static_cast<int>(rank) : 0;  // this block's half
    float4 q[kGroups];
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      const int kc = first + g;
      q[g] = *reinterpret_cast<const float4*>(stage_b(sb) + (8 * kc + t % 8) * kBPitch + 4 * (t / 8 % 32));
    }
    std::uint8_t* tile = split_tile(hb);
    uint2 hi[kGroups], lo[kGroups];
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      __half2 h01, l01, h23, l23;
      wmmae::split_fp16x2_compensated(q[g].x * b_scale[0], q[g].y * b_scale[1], h01, l01);
      wmmae::split_fp16x2_compensated(q[g].z * b_scale[2], q[g].w * b_scale[3], h23, l23);
      hi[g] = make_uint2(bits(h01), bits(h23));
      lo[g] = make_uint2(bits(l01), bits(l23));
      const int off = ((first + g) * kThreads + t) * 8;
      *reinterpret_cast<uint2*>(tile + off) = hi[g];
      *reinterpret_cast<uint2*>(tile + kSplitBytes + off) = lo[g];
    }
    if constexpr (kBulk) {  // each warpgroup's part of the half, sent by one of its threads
      fence_proxy_async();
      asm volatile("bar.sync %0, 128;\n" ::"r"(1 + t / 128) : "memory");
      if (t % 128 == 0) {
        if (use > 0) mbarrier_wait(empty + hb, (use - 1) & 1);  // its products of the last use
        const std::uint32_t local = base + (tile - smem), remote = cluster_address(local, other);
        const std::uint32_t bar = cluster_address(smem_address(full + hb), other);
#pragma unroll
        for (int g = 0; g < 2; ++g) {
          const int off = ((first + g) * kThreads + t) * 8;  // 128 threads' 8 bytes: 1 KiB
          bulk_copy(remote + off, local + off, 1024, bar);
          bulk_copy(remote + kSplitBytes + off, local + kSplitBytes + off, 1024, bar);
        }
      }
    } else if constexpr (kCluster) {  // the same places in the other block's tiles
      if (kMbarriers && use > 0) {  // its products of the last use
        wait_parity<kProbe != Probe::cta_scope_waits>(empty + hb, (use - 1) & 1);
      }
      const std::uint32_t remote = kProbe == Probe::local_stores ? base + (tile - smem) + kSplitBytes / 2
                                                                 : cluster_address(base + (tile - smem), other);
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
        const int off = ((first + g) * kThreads + t) * 8;
        cluster_store(remote + off, hi[g].x, hi[g].y);
        cluster_store(remote + kSplitBytes + off, lo[g].x, lo[g].y);
      }
      if constexpr (kProbe == Probe::none) {
        asm volatile("fence.proxy.async.shared::cluster;\n" ::: "memory");
      } else {
        fence_proxy_async();
      }
      if constexpr (kMbarriers) {
        __syncwarp();
        if (lane == 0) remote_arrive<kArrive>(cluster_address(smem_address(full + hb), other));
      }
    } else {
      fence_proxy_async();  // wgmma reads them after the next barrier
    }
  };
  auto stage_barrier = [] {
    if constexpr (kB == BSplit::cluster_barrier) {
      cluster_sync();
    } else {
      __syncthreads();
    }
  };
  float sum[64], hh[64], corr[64];
#pragma unroll
  for (int x = 0; x < 64; ++x) sum[x] = 0.0f;
  std::uint32_t a_hi0[4], a_lo0[4], a_hi1[4], a_lo1[4];
  float2 a_next[4];
  // Stage s reads fp32 slot s % 3 and hi/lo buffer s % kHiLo (filled for the use-th time); B's split runs
  // kAhead stages ahead, A's k-step-0 fragment one.
  int sb = 0, hb = 0, use = 0;
  int ahead_sb = kAhead % kBuffers, ahead_hb = kAhead, ahead_use = 0;
  auto advance = [](int& slot, int count, int& uses) {  // the next hi/lo buffer, and its fills so far
    if (++slot == count) slot = 0, ++uses;
  };
  if constexpr (kCluster) {
    cluster_sync();  // both blocks have started (and initialized their mbarriers) before either writes the other's
  } else {
    __syncthreads();
  }
  for (int i = 0; i < kAhead; ++i) split_b(i % kBuffers, i, 0);
  load_a(0, 0, a_next);
  const bool split_first = warp >= 4;
  for (int s = 0; s < stages; ++s) {
    stage_barrier();
    const std::uint32_t tile = base + (split_tile(hb) - smem);
    const std::uint64_t b_hi = descriptor(tile), b_lo = descriptor(tile + kSplitBytes);
    const int next_sb = sb == kBuffers - 1 ? 0 : sb + 1;
    auto split_ahead = [&] {
      if (s + kAhead < stages) split_b(ahead_sb, ahead_hb, ahead_use);
      load_a(next_sb, 0, a_next);
    };
    split_a(a_next, a_hi0, a_lo0);
    if (split_first) split_ahead();
    if constexpr (kMbarriers) {  // the other block's half of this stage
      wait_parity<kProbe != Probe::cta_scope_waits>(full + hb, use & 1);
    }
    wgmma_fence();
    wgmma_m64n128k16_overwrite<false>(hh, a_hi0, b_hi);
    wgmma_m64n128k16<false>(corr, a_lo0, b_hi, s > 0);
    wgmma_m64n128k16<false>(corr, a_hi0, b_lo, 1);
    wgmma_commit();
    float2 a_step1[4];
    load_a(sb, 1, a_step1);
    wgmma_wait<1>();  // (and the previous stage's products: its hi/lo buffer is free for the other block)
    if constexpr (kMbarriers) {
      const int previous = hb == 0 ? kHiLo - 1 : hb - 1;
      if (kBulk && s > 0 && t == 0 && s - 1 + kHiLo < stages) {
        mbarrier_arrive_expect_tx(smem_address(full + previous), kBulkBytes);
      }
      if (s > 0 && lane == 0) remote_arrive<(kBulk ? 1 : kArrive)>(cluster_address(smem_address(empty + previous), other));
    }
    split_a(a_step1, a_hi1, a_lo1);
    wgmma_fence();
    wgmma_m64n128k16<false>(hh, a_hi1, b_hi + kStepDesc, 1);
    wgmma_commit();
    wgmma_m64n128k16<false>(corr, a_lo1, b_hi + kStepDesc, 1);
    wgmma_m64n128k16<false>(corr, a_hi1, b_lo + kStepDesc, 1);
    wgmma_commit();
    wgmma_wait<1>();
    fence_registers(hh);
#pragma unroll
    for (int x = 0; x < 64; ++x) sum[x] += hh[x];
    fence_registers(hh);
    if (!split_first) split_ahead();
    sb = next_sb;
    ahead_sb = ahead_sb == kBuffers - 1 ? 0 : ahead_sb + 1;
    advance(hb, kHiLo, use);
    advance(ahead_hb, kHiLo, ahead_use);
  }
  wgmma_wait<0>();
  if constexpr (kCluster) cluster_sync();  // no block exits while the other may still write to it
  fence_registers(corr);
  float total = 0.0f;
#pragma unroll
  for (int x = 0; x < 64; ++x) total += sum[x] + corr[x];
  out[blockIdx.x * kThreads + threadIdx.x] = total;
}

// NVML through dlopen (no header or link library needed at build time).
struct Nvml {
  using Device = void*;
  int (*init)() = nullptr;
  int (*by_pci)(const char*, Device*) = nullptr;
  int (*energy_mj)(Device, unsigned long long*) = nullptr;
  int (*power_mw)(Device, unsigned int*) = nullptr;
  int (*clock_mhz)(Device, int, unsigned int*) = nullptr;
  Device device = nullptr;
  bool load(int cuda_device) {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) return false;
    init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
    by_pci = reinterpret_cast<int (*)(const char*, Device*)>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
    energy_mj = reinterpret_cast<int (*)(Device, unsigned long long*)>(
        dlsym(lib, "nvmlDeviceGetTotalEnergyConsumption"));
    power_mw = reinterpret_cast<int (*)(Device, unsigned int*)>(dlsym(lib, "nvmlDeviceGetPowerUsage"));
    clock_mhz = reinterpret_cast<int (*)(Device, int, unsigned int*)>(dlsym(lib, "nvmlDeviceGetClockInfo"));
    if (!init || !by_pci || !energy_mj || !power_mw || !clock_mhz || init() != 0) return false;
    char pci[32];
    if (cudaDeviceGetPCIBusId(pci, sizeof pci, cuda_device) != cudaSuccess) return false;
    return by_pci(pci, &device) == 0;
  }
  double joules() const {
    unsigned long long mj = 0;
    energy_mj(device, &mj);
    return mj * 1e-3;
  }
  double watts() const {
    unsigned int mw = 0;
    power_mw(device, &mw);
    return mw * 1e-3;
  }
  unsigned sm_mhz() const {
    unsigned int mhz = 0;
    clock_mhz(device, 1 /* NVML_CLOCK_SM */, &mhz);
    return mhz;
  }
};

// A launch of `blocks` blocks of splits_kernel in clusters of `cluster` (1: a plain launch); the configuration
// points to `dims`, which holds the cluster attribute.
cudaLaunchConfig_t split_launch(int blocks, int cluster, cudaLaunchAttribute& dims) {
  dims = cudaLaunchAttribute{};
  dims.id = cudaLaunchAttributeClusterDimension;
  dims.val.clusterDim.x = cluster, dims.val.clusterDim.y = 1, dims.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(blocks), config.blockDim = dim3(kThreads), config.dynamicSmemBytes = kSplitSmemBytes;
  config.attrs = &dims, config.numAttrs = cluster > 1 ? 1 : 0;
  return config;
}

// Holds `launch` (one grid of `sms` blocks, kStagesPerLaunch stages each, `products` tensor-core products per
// k-step) and prints its table row.
const char* only = nullptr;  // run only these variants (argv[3], e.g. "3,7,10"; default all)

template <class Launch>
void hold(const char* name, int products, const Nvml& nvml, int sms, Launch launch, double seconds, double cool) {
  if (only != nullptr) {  // name starts with the variant's number and a colon
    const std::string number(name, std::strchr(name, ':') - name), list = std::string(",") + only + ",";
    if (list.find("," + number + ",") == std::string::npos) return;
  }
  launch();
  CHECK_CUDA(cudaDeviceSynchronize());
  std::this_thread::sleep_for(std::chrono::duration<double>(cool));
  // Windows of 4 launches, each recorded by an event; one window always queued ahead of the one waited for,
  // so the GPU never idles between the two energy readings. Power is energy over host time between the
  // readings, the rate is flops over GPU time between the same windows' events: both over busy time.
  std::vector<cudaEvent_t> events;
  auto window = [&] {
    for (int i = 0; i < 4; ++i) launch();
    events.emplace_back();
    CHECK_CUDA(cudaEventCreate(&events.back()));
    CHECK_CUDA(cudaEventRecord(events.back()));
    return events.size() - 1;
  };
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  const double lead_in = 0.5;
  std::size_t waited = window(), first = 0, last = 0;
  double e0 = 0, e1 = 0, h0 = 0, h1 = 0;
  bool measuring = false;
  std::vector<unsigned> mhz;
  std::vector<double> watts;
  for (;;) {
    const std::size_t ahead = window();
    CHECK_CUDA(cudaEventSynchronize(events[waited]));
    const double t = elapsed();
    if (!measuring && t >= lead_in) {
      measuring = true, first = waited, e0 = nvml.joules(), h0 = elapsed();
    } else if (measuring) {
      mhz.push_back(nvml.sm_mhz());
      watts.push_back(nvml.watts());
      if (t >= lead_in + seconds) {
        last = waited, e1 = nvml.joules(), h1 = elapsed();
        break;
      }
    }
    waited = ahead;
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaGetLastError());
  float gpu_ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&gpu_ms, events[first], events[last]));
  for (cudaEvent_t e : events) CHECK_CUDA(cudaEventDestroy(e));
  const double block_stages = 4.0 * (last - first) * sms * kStagesPerLaunch;
  const double useful = block_stages * 2.0 * 128 * 128 * 32, tensor = useful * products;
  const double useful_rate = useful / (gpu_ms * 1e-3), tensor_rate = tensor / (gpu_ms * 1e-3);
  const double power = (e1 - e0) / (h1 - h0);
  std::sort(mhz.begin(), mhz.end());
  std::sort(watts.begin(), watts.end());
  char per_useful[32] = "-";
  if (products == 3) std::snprintf(per_useful, sizeof per_useful, "%.2f", power / useful_rate * 1e12);
  std::printf("| %s | %.0f | %.1f | %u | %.0f | %.0f | %.3f | %s |\n", name, tensor_rate / 1e12,
              useful_rate / 1e12, mhz[mhz.size() / 2], watts[watts.size() / 2], power,
              power / tensor_rate * 1e12, per_useful);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 3.0, cool = argc > 2 ? std::atof(argv[2]) : 2.0;
  if (argc > 3) only = argv[3];
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9) {
    std::fprintf(stderr, "needs an sm_90 GPU (wgmma); this is sm_%d%d\n", prop.major, prop.minor);
    return 1;
  }
  Nvml nvml;
  if (!nvml.load(0)) {
    std::fprintf(stderr, "NVML (libnvidia-ml.so.1) not usable: no energy counter\n");
    return 1;
  }
  float* out = nullptr;
  CHECK_CUDA(cudaMalloc(&out, prop.multiProcessorCount * kThreads * sizeof(float)));
  std::printf("%s, %d SMs; each variant held %.1f s after %.1f s idle, measured after 0.5 s\n\n", prop.name,
              prop.multiProcessorCount, seconds, cool);
  std::printf("| variant | tensor TFLOP/s | useful TFLOP/s | SM MHz (median) | W (median) | W (energy / time) "
              "| pJ per tensor flop | pJ per useful flop |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  const int sms = prop.multiProcessorCount;
  std::vector<float> line_scales(256);
  for (int i = 0; i < 256; ++i) line_scales[i] = std::ldexp(1.0f, i % 5 - 2);  // powers of two, as the GEMM's
  float* scales = nullptr;
  CHECK_CUDA(cudaMalloc(&scales, line_scales.size() * sizeof(float)));
  CHECK_CUDA(cudaMemcpy(scales, line_scales.data(), line_scales.size() * sizeof(float), cudaMemcpyHostToDevice));
  std::uint32_t seed = 1;
  auto products = [&](auto kernel) {
    CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    return [=, &seed] { kernel<<<sms, kThreads, kSmemBytes>>>(kStagesPerLaunch, 0, seed++, out); };
  };
  hold("0: three products per k-step", 3, nvml, sms, products(products_kernel<0>), seconds, cool);
  hold("1: three products + hi*hi sums added", 3, nvml, sms, products(products_kernel<1>), seconds, cool);
  hold("2: one product per k-step", 1, nvml, sms, products(products_kernel<2>), seconds, cool);
  // One block per SM (an even count), in clusters of `cluster` (1: a plain launch) where that many clusters
  // can be resident at once (a GPC's SMs pair up; with an odd count one stays idle): never a second wave.
  const int even = sms / 2 * 2;
  auto hold_grid = [&](const char* name, auto grid_and_launch) {  // (the block count named where not `even`)
    const std::string label = grid_and_launch.first == even ? std::string(name)
                                                             : name + (", " + std::to_string(grid_and_launch.first) + " blocks");
    hold(label.c_str(), 3, nvml, grid_and_launch.first, grid_and_launch.second, seconds, cool);
  };
  auto grid_of = [&](auto kernel, int cluster) {
    if (cluster == 1) return even;
    cudaLaunchAttribute dims;
    const cudaLaunchConfig_t config = split_launch(even, cluster, dims);
    int clusters = 0;
    CHECK_CUDA(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
    return std::min(even, clusters * cluster);
  };
  auto splits = [&](auto kernel, int cluster) {
    CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSplitSmemBytes));
    const int blocks = grid_of(kernel, cluster);
    return std::make_pair(blocks, [=, &seed] {
      cudaLaunchAttribute dims;
      const cudaLaunchConfig_t config = split_launch(blocks, cluster, dims);
      CHECK_CUDA(cudaLaunchKernelEx(&config, kernel, kStagesPerLaunch, static_cast<const float*>(scales), seed++, out));
    });
  };
  hold_grid("3: variant 1 + A's and B's splits from fp32 stages in shared memory",
            splits(splits_kernel<BSplit::whole>, 1));
  hold_grid("4: variant 3 with half of B's split", splits(splits_kernel<BSplit::half>, 1));
  hold_grid("5: variant 3 without the line scales", splits(splits_kernel<BSplit::whole, false>, 1));
  hold_grid("6: B's split shared by clusters of two blocks, a cluster barrier per stage",
            splits(splits_kernel<BSplit::cluster_barrier>, 2));
  hold_grid("7: B's split shared by clusters of two blocks, mbarriers per hi/lo buffer",
            splits(splits_kernel<BSplit::cluster_mbarrier>, 2));
  hold_grid("8: variant 7 with B split two stages ahead (four hi/lo buffers)",
            splits(splits_kernel<BSplit::cluster_mbarrier, true, 2>, 2));
  hold_grid("9: variant 3 with B split two stages ahead (four hi/lo buffers)",
            splits(splits_kernel<BSplit::whole, true, 2>, 1));
  hold_grid("10: variant 7 without the cluster-wide proxy fence (probe)",
            splits(splits_kernel<BSplit::cluster_mbarrier, true, 1, Probe::no_cluster_fence>, 2));
  hold_grid("11: variant 7 with the other block's half stored locally (probe)",
            splits(splits_kernel<BSplit::cluster_mbarrier, true, 1, Probe::local_stores>, 2));
  hold_grid("12: variant 7 with the mbarrier waits at the block's scope (probe)",
            splits(splits_kernel<BSplit::cluster_mbarrier, true, 1, Probe::cta_scope_waits>, 2));
  hold_grid("13: variant 4 launched in clusters of two blocks (no interaction; probe)",
            splits(splits_kernel<BSplit::half>, 2));
  hold_grid("14: variant 7 with the remote arrivals released at the block's scope (probe)",
            splits(splits_kernel<BSplit::cluster_mbarrier, true, 1, Probe::cta_release_arrives>, 2));
  hold_grid("15: variant 7 with relaxed remote arrivals (probe)",
            splits(splits_kernel<BSplit::cluster_mbarrier, true, 1, Probe::relaxed_arrives>, 2));
  hold_grid("16: B's split shared by clusters of two blocks, each half sent by bulk copies (async proxy)",
            splits(splits_kernel<BSplit::cluster_bulk>, 2));
  hold_grid("17: variant 16 with B split two stages ahead (four hi/lo buffers)",
            splits(splits_kernel<BSplit::cluster_bulk, true, 2>, 2));
  CHECK_CUDA(cudaFree(scales));
  CHECK_CUDA(cudaFree(out));
  return 0;
}
