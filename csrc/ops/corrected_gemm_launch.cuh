// The launches of the tile GEMM kernels (the wgmma kernels of corrected_gemm_sm90.cuh, the portable WMMA kernel of
// corrected_gemm_wmma.cuh) in all their instantiations: launch_gemm_variant, which corrected_matmul_cuda.cu calls
// and the corrected_gemm_*.cu units instantiate, each for some methods and layouts (corrected_gemm_common.cuh).
#pragma once

#include "corrected_gemm_common.cuh"
#include "corrected_gemm_wmma.cuh"
#include "corrected_gemm_sm90.cuh"

namespace wmmae_ops {
namespace {

// Launches `Kernel` with `smem_bytes` of dynamic shared memory.
template <auto Kernel, class... Params>
void launch_with_smem(std::size_t smem_bytes, const GemmLaunch& launch, const Params&... params) {
  allow_dynamic_smem<Kernel>(smem_bytes);
  launch_kernel(Kernel, launch.grid, dim3(kThreads), smem_bytes, launch.stream,
                launch.overlaps_previous && launch.kernels.overlap_launches, params...);
}

// auto's tf32 GEMM nearly always finds that the fp16 GEMM left it no tile, and returns. Launched with a block
// per tile, most of those blocks start only as the fp16 GEMM ends (auto took 4-6 us more than fp16 per call at
// 64 x 512^3, H200). So batched calls launch it with fewer batch slots, down to one wave of blocks
// (blocks_per_sm per SM, at least 1), whose blocks take the batch entries in turn. (H200, 64 x 512^3: its
// kernel's span 24.0 -> 21.7 us; auto minus fp16 per call 1.8-2.6 us against 3.6-4.1 in one pair of runs,
// within noise in another.)
dim3 tf32_exit_grid(dim3 grid, int blocks_per_sm, int sm_count) {
  const std::int64_t wave_slots =
      static_cast<std::int64_t>(sm_count) * blocks_per_sm / (static_cast<std::int64_t>(grid.x) * grid.y);
  return dim3(grid.x, grid.y, static_cast<unsigned>(std::clamp<std::int64_t>(wave_slots, 1, grid.z)));
}

#ifdef WMMAE_HAS_SM90A
// Whether the fp16 GEMM lets the kernels after it launch only as each block starts its last piece
// (GemmArgs::dependents_at_last_piece) instead of at its start: only where TORCH_WMMAE_LATE_DEPENDENTS=1 asks, for
// every wgmma fp16 GEMM with TMA stages but the one beside the resident pre-pass (the same bits). It was the rule for
// auto on persistent grids of one-tile batch entries whose tiles fold their line ranges, while auto's two exit kernels
// (the tf32 GEMM and the fallback check) followed that GEMM: launched at its start, they lengthened it by about 5 us
// each (H200, session 83: 512 x 128^2 x 64 45.8 -> 40.8-41.0 us per call back to back at the last piece). Such calls
// no longer launch them (GemmArgs::tile_line_ranges), and without them the placement changed nothing (session 92,
// same build, 512 x 128^2 x 64 auto 35.88 against 35.86 us, 2000 x 128^2 x 64 122.39 against 122.01); for fp16 it
// had been slower (512 x 128^2 x 64: 34.5 -> 34.8-35.1), as for grids of more than one tile (64 x 512^3, 8 x 1024^3:
// the same or about 1% slower).
bool late_dependents_apply() { return env_switch("TORCH_WMMAE_LATE_DEPENDENTS") == Switch::kOn; }

// The wgmma kernel of method M with fp32 stages by TMA (kTma, `maps`) or cp.async. tf32: the method, or auto's
// tiles that are not fp16-safe, on the plan's grid (no stream-K; auto: the fp16 GEMM skipped those tiles'
// pieces, this kernel takes them whole), in one wave's batch slots for auto (see tf32_exit_grid).
template <Method M, bool kARowMajor, bool kBRowMajor, bool kTma>
void launch_sm90(const GemmArgs& args, const sm90::TmaMaps& maps, const GemmLaunch& launch) {
  // (A or B by residue: in TMA stages only, never beside the resident pre-pass.)
  [[maybe_unused]] const bool a_by_residue = kTma && maps.a_by_residue;
  [[maybe_unused]] const bool b_by_residue = kTma && maps.b_by_residue;
  if constexpr (M == Method::tf32) {
    GemmArgs tf32_args = args;
    tf32_args.stream_k_blocks = 0;
    GemmLaunch tf32_launch = launch;
    if (args.method == Method::automatic) tf32_launch.grid = tf32_exit_grid(launch.grid, 1, launch.sm_count);
    constexpr std::size_t kSmem = sm90::Config<kARowMajor, kBRowMajor, kTma, Method::tf32>::kSmemBytes;
    if constexpr (kTma) {
      if (b_by_residue) {
        with_flag(a_by_residue, [&](auto a_residues) {
          constexpr bool kAResidues = decltype(a_residues)::value;
          launch_with_smem<sm90::corrected_gemm_sm90_tf32_kernel_b_by_residue<kARowMajor, kBRowMajor, kAResidues>>(
              sm90::Config<kARowMajor, kBRowMajor, true, Method::tf32, kAResidues, true>::kSmemBytes, tf32_launch,
              tf32_args, maps, *launch.a_residue_maps, *launch.b_residue_maps);
        });
        return;
      }
    }
    if constexpr (kTma) {
      if (a_by_residue) {
        launch_with_smem<sm90::corrected_gemm_sm90_tf32_kernel_a_by_residue<kARowMajor, kBRowMajor>>(
            sm90::Config<kARowMajor, kBRowMajor, true, Method::tf32, true>::kSmemBytes, tf32_launch, tf32_args, maps,
            *launch.a_residue_maps);
        return;
      }
    }
    launch_with_smem<sm90::corrected_gemm_sm90_tf32_kernel<kARowMajor, kBRowMajor, kTma>>(kSmem, tf32_launch,
                                                                                          tf32_args, maps);
  } else {
    using Cfg = sm90::Config<kARowMajor, kBRowMajor, kTma>;
    GemmLaunch fp16_launch = launch;
    if constexpr (kTma) {
      if (launch.persistent_batch_slots > 0) fp16_launch.grid.z = launch.persistent_batch_slots;
      TORCH_INTERNAL_ASSERT(!((a_by_residue || b_by_residue) && args.prepass_items_done != nullptr),
                            "an operand by residue beside the pre-pass");
      if (args.prepass_items_done != nullptr) {  // beside the resident pre-pass, whose blocks share its SMs
        constexpr auto kernel = sm90::corrected_gemm_sm90_kernel<kARowMajor, kBRowMajor, true, false, true, false>;
        prefer_max_shared_carveout<kernel>();
        launch_with_smem<kernel>(Cfg::kSmemBytes, fp16_launch, args, maps);
        return;
      }
    }
    // The first wave starts staggered (sm90::stagger_start) where it fills at least half of the SMs (fewer
    // blocks hardly meet each other's memory traffic) and each block has at least 12 k-stages of work: the
    // delay, up to 3 us, is a large part of shorter calls (about 20 us at 128 x 448 x 4096, 4 stages per
    // block), where the A/B could not resolve its effect. Never beside the resident pre-pass (above), whose
    // blocks start as their batch entries' lines are ready, one entry after the other (H100, 64 x 512^3 and
    // 8 x 1024^3: the same or up to 1% slower staggered).
    GemmArgs fp16_args = args;
    if constexpr (kTma) fp16_args.dependents_at_last_piece = late_dependents_apply();
    const std::int64_t blocks = std::int64_t{fp16_launch.grid.x} * fp16_launch.grid.y * fp16_launch.grid.z;
    const std::int64_t stages = gemm_tiles(args.m, args.n) * gemm_k_stages(args.k) * args.num_batches;
    const bool staggered = 2 * blocks >= launch.sm_count && stages >= 12 * blocks;
    fp16_args.start_stagger_blocks = staggered ? launch.sm_count : 0;
    // An instantiation per kind of flush: chunks read back or not, and the staged flush of odd widths (TMA
    // stages only: with cp.async stages the output's odd widths keep the element stores).
    const bool staged = kTma && staged_flush_applies(args);
    with_flags(sm90_read_back(args), staged, [&](auto read_back, auto odd_width) {
      constexpr bool kReadBack = decltype(read_back)::value, kOddWidth = decltype(odd_width)::value;
      if constexpr (kTma) {
        if (b_by_residue) {
          with_flag(a_by_residue, [&](auto a_residues) {
            constexpr bool kAResidues = decltype(a_residues)::value;
            launch_with_smem<sm90::corrected_gemm_sm90_kernel_b_by_residue<kARowMajor, kBRowMajor, kReadBack,
                                                                           kOddWidth, kAResidues>>(
                sm90::Config<kARowMajor, kBRowMajor, true, Method::fp16, kAResidues, true>::kSmemBytes, fp16_launch,
                fp16_args, maps, *launch.a_residue_maps, *launch.b_residue_maps);
          });
          return;
        }
      }
      if constexpr (kTma) {
        if (a_by_residue) {
          launch_with_smem<sm90::corrected_gemm_sm90_kernel_a_by_residue<kARowMajor, kBRowMajor, kReadBack, kOddWidth>>(
              sm90::Config<kARowMajor, kBRowMajor, true, Method::fp16, true>::kSmemBytes, fp16_launch,
              fp16_args, maps, *launch.a_residue_maps);
          return;
        }
      }
      if constexpr (kTma || !kOddWidth) {
        launch_with_smem<sm90::corrected_gemm_sm90_kernel<kARowMajor, kBRowMajor, kTma, kReadBack, false, kOddWidth>>(
            Cfg::kSmemBytes, fp16_launch, fp16_args, maps);
      }
    });
  }
}
#endif

template <Method M, bool kARowMajor, bool kBRowMajor, bool kCompact>
void launch_wmma(const GemmArgs& args, const GemmLaunch& launch) {
  using Cfg = GemmConfig<M, kARowMajor, kBRowMajor, kCompact>;
  constexpr auto kernel = corrected_gemm_kernel<M, kARowMajor, kBRowMajor, kCompact>;
  if (M == Method::tf32 && args.method == Method::automatic) {
    GemmLaunch exit_launch = launch;
    exit_launch.grid = tf32_exit_grid(launch.grid, blocks_per_sm<kernel>(kThreads, Cfg::kSmemBytes), launch.sm_count);
    launch_with_smem<kernel>(Cfg::kSmemBytes, exit_launch, args);
  } else {
    launch_with_smem<kernel>(Cfg::kSmemBytes, launch, args);
  }
}

}  // namespace

template <Method M, bool kARowMajor, bool kBRowMajor>
void launch_gemm_variant(const GemmArgs& args, const GemmLaunch& launch) {
  if (launch.kernels.sm90) {
#ifdef WMMAE_HAS_SM90A
    if (launch.tma_maps != nullptr) {
      launch_sm90<M, kARowMajor, kBRowMajor, true>(args, *launch.tma_maps, launch);
    } else {
      launch_sm90<M, kARowMajor, kBRowMajor, false>(args, sm90::TmaMaps{}, launch);
    }
#endif
  } else {
    if constexpr (M == Method::fp16) {  // (tf32's stages are 16 k in both configurations: one instantiation)
      if (launch.kernels.wmma_compact) return launch_wmma<M, kARowMajor, kBRowMajor, true>(args, launch);
    }
    launch_wmma<M, kARowMajor, kBRowMajor, false>(args, launch);
  }
}
}  // namespace wmmae_ops
