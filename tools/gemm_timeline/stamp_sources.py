"""Turns a copy of the sources into a timeline build: thread 0 of each block of the wgmma GEMMs and of the float32
fallback's check writes %globaltimer stamps into a device buffer, so that `timeline.py` can show where a call's
time goes block by block (benchmarks/NOTES.md, session 84). For measurements only: it edits csrc/ in place, so
run it on a scratch copy of the tree (such as the device's), build, measure, and never commit the result.

    python tools/gemm_timeline/stamp_sources.py ROOT --edit-sources-in-place

The buffer (int64, STAMP_WORDS words) is found by the first corrected_matmul call of the process, from the
device address in WMMAE_TIMELINE_PTR. Layout, per block (blocks past 511 write nothing):
- words [0, 65536): the fp16 GEMM, 128 per block: 0 %smid, 1 start, 2 + 6 e + phase for batch entry (piece)
  e < 20, 127 end. Phases: 0 the piece's top, 1 its wait for the grid before it (or for the resident pre-pass)
  done, 2 its line scales ready, 3 its first stage's barrier (TMA stages), 4 its stage loop done, 5 its flush
  done.
- words [65536, 67584): the tf32 GEMM (auto's exit GEMM or the method's), 4 per block: %smid, start, end of the
  prior-grid wait (auto), end.
- words [67584, 69632): the float32 fallback's check, 4 per block, as the tf32 GEMM.
Also, WMMAE_TIMELINE_SKIP_EXIT=1 leaves out auto's two exit kernels (the tf32 GEMM and the float32 fallback's
check), so that a run can show what they cost: its outputs are wrong wherever a tile is not fp16-safe.
An edit whose anchor text is missing fails loudly: mend the anchors here when the kernels change.
"""
from __future__ import annotations

import argparse
import os
import sys

STAMP_WORDS = 69632

_HELPERS = """namespace wmmae_ops {
namespace sm90 {

// Timeline build (tools/gemm_timeline/stamp_sources.py): see that script for the buffer's layout.
__device__ unsigned long long* g_timeline = nullptr;
__device__ __forceinline__ unsigned long long timeline_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned timeline_smid() {
  unsigned s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}
__device__ __forceinline__ void timeline_put(int base, int stride, int idx, unsigned long long v) {
  unsigned long long* buffer = g_timeline;
  if (buffer == nullptr || threadIdx.x != 0) return;
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (block < 512) buffer[base + block * stride + idx] = v;
}
"""

# (file, anchor, replacement): each anchor must occur exactly once.
EDITS = [
    ("csrc/ops/corrected_gemm_sm90.cuh", "namespace wmmae_ops {\nnamespace sm90 {\n", _HELPERS),
    ("csrc/ops/corrected_gemm_sm90.cuh",
     "  constexpr bool kTf32 = kM == Method::tf32;\n",
     "  constexpr bool kTf32 = kM == Method::tf32;\n"
     "  if constexpr (kTf32) { timeline_put(65536, 4, 0, timeline_smid()); timeline_put(65536, 4, 1, timeline_now()); }\n"
     "  else { timeline_put(0, 128, 0, timeline_smid()); timeline_put(0, 128, 1, timeline_now()); }\n"
     "  int timeline_piece = 0;\n"),
    ("csrc/ops/corrected_gemm_sm90.cuh",
     "      if (*args.tf32_tiles_pending == 0) return;\n",
     "      timeline_put(65536, 4, 2, timeline_now());\n"
     "      if (*args.tf32_tiles_pending == 0) { timeline_put(65536, 4, 3, timeline_now()); return; }\n"),
    ("csrc/ops/corrected_gemm_sm90.cuh",
     "    const std::int64_t z = piece.z;\n",
     "    const std::int64_t z = piece.z;\n"
     "    const int stamp = timeline_piece < 20 ? 2 + 6 * timeline_piece : -1;\n"
     "    ++timeline_piece;\n"
     "    if (!kTf32 && stamp >= 0) timeline_put(0, 128, stamp, timeline_now());\n"),
    ("csrc/ops/corrected_gemm_sm90.cuh",
     "    } else {\n      wait_for_prior_grid();\n    }\n",
     "    } else {\n      wait_for_prior_grid();\n    }\n"
     "    if (!kTf32 && stamp >= 0) timeline_put(0, 128, stamp + 1, timeline_now());\n"),
    ("csrc/ops/corrected_gemm_sm90.cuh",
     "                                                                      : load_line_scales<kM>(args, scales, z, m0, n0);\n",
     "                                                                      : load_line_scales<kM>(args, scales, z, m0, n0);\n"
     "    if (!kTf32 && stamp >= 0) timeline_put(0, 128, stamp + 2, timeline_now());\n"),
    ("csrc/ops/corrected_gemm_sm90.cuh",
     "      if (k_tiles > 0) wait_tma_stage(0);\n      __syncthreads();\n",
     "      if (k_tiles > 0) wait_tma_stage(0);\n      __syncthreads();\n"
     "      if (!kTf32 && stamp >= 0) timeline_put(0, 128, stamp + 3, timeline_now());\n"),
    ("csrc/ops/corrected_gemm_sm90.cuh",
     "      fence_registers(corr);\n      flush(chunk_begin == 0, chunk_end == k_tiles);\n",
     "      fence_registers(corr);\n"
     "      if (!kTf32 && stamp >= 0) timeline_put(0, 128, stamp + 4, timeline_now());\n"
     "      flush(chunk_begin == 0, chunk_end == k_tiles);\n"
     "      if (!kTf32 && stamp >= 0) timeline_put(0, 128, stamp + 5, timeline_now());\n"),
    ("csrc/ops/corrected_gemm_sm90.cuh",
     "    previous_k_tiles = k_tiles;\n  }\n",
     "    previous_k_tiles = k_tiles;\n  }\n"
     "  if constexpr (kTf32) timeline_put(65536, 4, 3, timeline_now());\n"
     "  else timeline_put(0, 128, 127, timeline_now());\n"),
    ("csrc/ops/float32_fallback.cuh",
     "  allow_dependent_grid();  // the next call's zeroing\n  wait_for_prior_grid();   // the tf32 GEMM's outputs and wide_tiles_pending\n"
     "  if (*args.wide_tiles_pending == 0ull) return;\n",
     "  sm90::timeline_put(67584, 4, 0, sm90::timeline_smid());\n"
     "  sm90::timeline_put(67584, 4, 1, sm90::timeline_now());\n"
     "  allow_dependent_grid();  // the next call's zeroing\n  wait_for_prior_grid();   // the tf32 GEMM's outputs and wide_tiles_pending\n"
     "  sm90::timeline_put(67584, 4, 2, sm90::timeline_now());\n"
     "  if (*args.wide_tiles_pending == 0ull) { sm90::timeline_put(67584, 4, 3, sm90::timeline_now()); return; }\n"),
    ("csrc/ops/corrected_matmul_cuda.cu",
     "  const int sm_count = props.multiProcessorCount;\n",
     "  const int sm_count = props.multiProcessorCount;\n"
     "  {  // timeline build: the stamps' buffer, once per process\n"
     "    static bool timeline_set = false;\n"
     "    const char* address = std::getenv(\"WMMAE_TIMELINE_PTR\");\n"
     "    if (!timeline_set && address != nullptr) {\n"
     "      auto* buffer = reinterpret_cast<unsigned long long*>(std::strtoull(address, nullptr, 10));\n"
     "      C10_CUDA_CHECK(cudaMemcpyToSymbol(sm90::g_timeline, &buffer, sizeof(buffer)));\n"
     "      timeline_set = true;\n"
     "    }\n"
     "  }\n"),
    ("csrc/ops/corrected_matmul_cuda.cu",
     "  if (method != Method::fp16) {\n",
     "  if (method == Method::tf32 ||\n"
     "      (method == Method::automatic && std::getenv(\"WMMAE_TIMELINE_SKIP_EXIT\") == nullptr)) {\n"),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", help="the tree to edit (a scratch copy)")
    parser.add_argument("--edit-sources-in-place", action="store_true", required=True,
                        help="required: says that ROOT is a copy whose sources may be changed")
    args = parser.parse_args()
    texts = {}
    for path, anchor, replacement in EDITS:
        full = os.path.join(args.root, path)
        text = texts.setdefault(full, open(full).read())
        if text.count(anchor) != 1:
            sys.exit(f"stamp_sources: {path}: the anchor occurs {text.count(anchor)} times, not once:\n{anchor}")
        texts[full] = text.replace(anchor, replacement)
    for full, text in texts.items():
        with open(full, "w") as f:
            f.write(text)
    print(f"stamp_sources: {len(EDITS)} edits in {len(texts)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
