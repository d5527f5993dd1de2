"""Turns a copy of the sources into a timeline build: thread 0 of each block of the wgmma GEMMs and of the float32
fallback's check writes %globaltimer stamps into a device buffer, so that `timeline.py` can show where a call's
time goes block by block (benchmarks/NOTES.md, session 84). For measurements only: it edits csrc/ in place, so
run it on a scratch copy of the tree (such as the device's), build, measure, and never commit the result.

    python tools/gemm_timeline/stamp_sources.py ROOT --edit-sources-in-place

The buffer (int64, STAMP_WORDS words) is found by each translation unit whose kernels stamp, at its first use in the
process, from the device address in WMMAE_TIMELINE_PTR. Its layout (the constants below; blocks past MAX_BLOCKS
write nothing):
- the fp16 GEMM, GEMM_STRIDE words per block from 0: %smid, start, then PIECE_STAMPS per piece p < MAX_PIECES
  (the block's p-th piece of work, a batch entry's tile; a piece of several chunks stamps its last) at
  2 + PIECE_STAMPS p: its top, then the ends of its wait for the grid before it (or for the resident pre-pass),
  of its line scales, of its first stage's barrier, of its stage loop and of its flush; the end at END_WORD. (Where
  the tiles fold their line ranges, the block waits for the grid before it once, before its first piece's top.)
- the tf32 GEMM (auto's exit GEMM or the method's), KERNEL_STAMPS words per block from TF32_BASE: %smid, start,
  end of the prior-grid wait (auto), end; the float32 fallback's check the same from FALLBACK_BASE.
timeline.py reads the fp16 GEMM (methods "fp16" and "auto").
Also, WMMAE_TIMELINE_SKIP_EXIT=1 leaves out auto's two exit kernels (the tf32 GEMM and the float32 fallback's
check), so that a run can show what they cost: its outputs are wrong wherever a tile is not fp16-safe. (Calls whose
tiles fold their own line ranges launch neither: the fp16 GEMM computes such tiles itself.)
An edit whose anchor text is missing fails loudly: mend the anchors here when the kernels change.
"""
from __future__ import annotations

import argparse
import os
import sys

# The buffer's layout, one definition for the stamps (below) and for timeline.py.
MAX_BLOCKS = 512           # blocks past these write nothing
GEMM_STRIDE = 128          # words per fp16 GEMM block: 0 %smid, 1 start, the pieces' stamps, END_WORD end
PIECE_STAMPS = 6           # per piece: its top, then the end of each of timeline.py's PHASES
MAX_PIECES = 20
END_WORD = GEMM_STRIDE - 1
KERNEL_STAMPS = 4          # per block of the tf32 GEMM and of the fallback's check: %smid, start, wait done, end
TF32_BASE = GEMM_STRIDE * MAX_BLOCKS
FALLBACK_BASE = TF32_BASE + KERNEL_STAMPS * MAX_BLOCKS
STAMP_WORDS = FALLBACK_BASE + KERNEL_STAMPS * MAX_BLOCKS
assert 2 + PIECE_STAMPS * MAX_PIECES <= END_WORD, "the pieces' stamps fit before the end word"

_HELPERS = f"""namespace wmmae_ops {{
namespace sm90 {{

// Timeline build (tools/gemm_timeline/stamp_sources.py): see that script for the buffer's layout. Each translation
// unit has its own copy of the pointer (its kernels' module), which its host code sets: timeline_take_buffer.
static __device__ unsigned long long* g_timeline = nullptr;
static void timeline_take_buffer() {{  // once per process and unit, from WMMAE_TIMELINE_PTR
  static bool taken = false;
  const char* address = std::getenv("WMMAE_TIMELINE_PTR");
  if (taken || address == nullptr) return;
  auto* buffer = reinterpret_cast<unsigned long long*>(std::strtoull(address, nullptr, 10));
  C10_CUDA_CHECK(cudaMemcpyToSymbol(g_timeline, &buffer, sizeof(buffer)));
  taken = true;
}}
__device__ __forceinline__ unsigned long long timeline_now() {{
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}}
__device__ __forceinline__ unsigned timeline_smid() {{
  unsigned s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}}
__device__ __forceinline__ void timeline_put(int base, int stride, int idx, unsigned long long v) {{
  unsigned long long* buffer = g_timeline;
  if (buffer == nullptr || threadIdx.x != 0) return;
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (block < {MAX_BLOCKS}) buffer[base + block * stride + idx] = v;
}}
// Word `idx` of this fp16 GEMM block, or of this tf32 GEMM / fallback block (base {TF32_BASE} / {FALLBACK_BASE}).
__device__ __forceinline__ void timeline_gemm(int idx, unsigned long long v) {{ timeline_put(0, {GEMM_STRIDE}, idx, v); }}
__device__ __forceinline__ void timeline_kernel(int base, int idx, unsigned long long v) {{
  timeline_put(base, {KERNEL_STAMPS}, idx, v);
}}
// Stamp `stamp` (0: top) of the block's piece-th piece.
__device__ __forceinline__ void timeline_piece(int piece, int stamp) {{
  if (piece < {MAX_PIECES}) timeline_gemm(2 + {PIECE_STAMPS} * piece + stamp, timeline_now());
}}
"""

_GEMM = "csrc/ops/corrected_gemm_sm90.cuh"
_FALLBACK = "csrc/ops/float32_fallback.cuh"
_HOST = "csrc/ops/corrected_matmul_cuda.cu"
_LAUNCH = "csrc/ops/corrected_gemm_launch.cuh"
_PIECE = "if constexpr (!kTf32) timeline_piece(timeline_pieces - 1, {});\n"  # (the piece counter is past it)



def _after(path: str, anchor: str, inserted: str) -> tuple[str, str, str]:
    """The edit that puts `inserted` right after `anchor`."""
    return path, anchor, anchor + inserted


# (file, anchor, replacement): each anchor must occur exactly once.
EDITS = [
    (_GEMM, "namespace wmmae_ops {\nnamespace sm90 {\n", _HELPERS),
    _after(_GEMM, "  constexpr bool kTf32 = kM == Method::tf32;\n",
           f"  if constexpr (kTf32) {{ timeline_kernel({TF32_BASE}, 0, timeline_smid()); "
           f"timeline_kernel({TF32_BASE}, 1, timeline_now()); }}\n"
           "  else { timeline_gemm(0, timeline_smid()); timeline_gemm(1, timeline_now()); }\n"
           "  int timeline_pieces = 0;\n"),
    (_GEMM,
     "      if (*args.tf32_tiles_pending == 0) return;\n",
     f"      timeline_kernel({TF32_BASE}, 2, timeline_now());\n"
     f"      if (*args.tf32_tiles_pending == 0) {{ timeline_kernel({TF32_BASE}, 3, timeline_now()); return; }}\n"),
    _after(_GEMM, "    const std::int64_t z = piece.z;\n", "    ++timeline_pieces;\n    " + _PIECE.format(0)),
    _after(_GEMM, "    } else {\n      wait_for_prior_grid();\n    }\n", "    " + _PIECE.format(1)),
    _after(_GEMM, ": load_scales();\n", "    " + _PIECE.format(2)),
    _after(_GEMM, "      stage_ring_prologue<kStages>(k_tiles, issue_stage);\n    }\n", "    " + _PIECE.format(3)),
    # (A piece of several chunks stamps its last chunk's loop and flush.)
    (_GEMM,
     "      flush(chunk_begin == 0, last_chunk, split_tile(last_chunk ? split_buf : next_split_buf(split_buf), 0));\n",
     "      " + _PIECE.format(4) +
     "      flush(chunk_begin == 0, last_chunk, split_tile(last_chunk ? split_buf : next_split_buf(split_buf), 0));\n"
     "      " + _PIECE.format(5)),
    _after(_GEMM, "    previous_k_tiles = k_tiles;\n  }\n",
           f"  if constexpr (kTf32) timeline_kernel({TF32_BASE}, 3, timeline_now());\n"
           f"  else timeline_gemm({END_WORD}, timeline_now());\n"),
    (_FALLBACK,
     "  allow_dependent_grid();  // the next call's first kernel\n  wait_for_prior_grid();   // the tf32 GEMM's outputs and wide_tiles_pending\n"
     "  if (*args.wide_tiles_pending == 0ull) return;\n",
     f"  sm90::timeline_kernel({FALLBACK_BASE}, 0, sm90::timeline_smid());\n"
     f"  sm90::timeline_kernel({FALLBACK_BASE}, 1, sm90::timeline_now());\n"
     "  allow_dependent_grid();  // the next call's first kernel\n  wait_for_prior_grid();   // the tf32 GEMM's outputs and wide_tiles_pending\n"
     f"  sm90::timeline_kernel({FALLBACK_BASE}, 2, sm90::timeline_now());\n"
     f"  if (*args.wide_tiles_pending == 0ull) {{ sm90::timeline_kernel({FALLBACK_BASE}, 3, sm90::timeline_now()); return; }}\n"),
    (_FALLBACK,
     "    if (item >= items) return;\n",
     f"    if (item >= items) {{ sm90::timeline_kernel({FALLBACK_BASE}, 3, sm90::timeline_now()); return; }}\n"),
    # The stamps' buffer, in each translation unit whose kernels stamp: the host side's (the fallback's check) and
    # the tile GEMMs' (corrected_gemm_launch.cuh, compiled into the corrected_gemm_*.cu units).
    _after(_HOST, "  const int sm_count = props.multiProcessorCount;\n", "  sm90::timeline_take_buffer();\n"),
    _after(_LAUNCH, "void launch_gemm_variant(const GemmArgs& args, const GemmLaunch& launch) {\n",
           "  sm90::timeline_take_buffer();\n"),
    (_HOST,
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
