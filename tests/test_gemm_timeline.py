"""tools/gemm_timeline: the stamp edits still find each of their anchors exactly once in the current sources (so
that the timeline build of benchmarks/NOTES.md, session 84, can be made again after the kernels change), the
script refuses to edit without its flag, and the summary reads phases and spans from a made-up buffer of stamps
(no GPU needed)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

TOOLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "gemm_timeline")
ROOT = os.path.join(TOOLS, "..", "..")
sys.path.insert(0, TOOLS)

import stamp_sources  # noqa: E402
import timeline  # noqa: E402


def _copy_sources(tmp_path):
    for path in {path for path, _, _ in stamp_sources.EDITS}:
        os.makedirs(tmp_path / os.path.dirname(path), exist_ok=True)
        shutil.copy(os.path.join(ROOT, path), tmp_path / path)


def test_stamp_sources_applies_to_the_current_sources(tmp_path):
    _copy_sources(tmp_path)
    before = {path: (tmp_path / path).read_text() for path, _, _ in stamp_sources.EDITS}
    done = subprocess.run([sys.executable, os.path.join(TOOLS, "stamp_sources.py"), str(tmp_path),
                           "--edit-sources-in-place"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for path, anchor, replacement in stamp_sources.EDITS:
        after = (tmp_path / path).read_text()
        assert after != before[path]
        assert replacement in after
    gemm = (tmp_path / "csrc/ops/corrected_gemm_sm90.cuh").read_text()
    # the device side writes the layout that timeline.py reads (one definition: stamp_sources' constants)
    assert f"timeline_gemm(2 + {timeline.PIECE_STAMPS} * piece + stamp" in gemm
    assert f"if (piece < {timeline.MAX_PIECES})" in gemm and f"if (block < {timeline.MAX_BLOCKS})" in gemm
    assert f"timeline_gemm({timeline.END_WORD}, timeline_now())" in gemm
    assert f"timeline_put(0, {timeline.GEMM_STRIDE}, idx, v)" in gemm
    for stamp in range(timeline.PIECE_STAMPS):  # every stamp of a piece is written somewhere
        assert f"timeline_piece(timeline_pieces - 1, {stamp});" in gemm
    fallback = (tmp_path / "csrc/ops/float32_fallback.cuh").read_text()
    assert fallback.count(f"timeline_kernel({timeline.FALLBACK_BASE}, 3,") == 2  # both of its returns
    host = (tmp_path / "csrc/ops/corrected_matmul_cuda.cu").read_text()
    # every translation unit whose kernels stamp takes the buffer: the host side's and the tile GEMMs'
    assert "WMMAE_TIMELINE_PTR" in gemm
    assert "sm90::timeline_take_buffer();" in host
    assert "sm90::timeline_take_buffer();" in (tmp_path / "csrc/ops/corrected_gemm_launch.cuh").read_text()
    # the switch leaves out auto's exit kernels only: the tf32 method still runs its GEMM
    assert ("if (method == Method::tf32 ||\n"
            "      (method == Method::automatic && std::getenv(\"WMMAE_TIMELINE_SKIP_EXIT\") == nullptr)) {\n"
            "    launch_gemm<Method::tf32>") in host


def test_stamp_layout_fits():
    assert 2 + timeline.PIECE_STAMPS * timeline.MAX_PIECES <= timeline.END_WORD < timeline.GEMM_STRIDE
    assert timeline.TF32_BASE >= timeline.GEMM_STRIDE * timeline.MAX_BLOCKS
    assert timeline.FALLBACK_BASE >= timeline.TF32_BASE + timeline.KERNEL_STAMPS * timeline.MAX_BLOCKS
    assert timeline.STAMP_WORDS == timeline.FALLBACK_BASE + timeline.KERNEL_STAMPS * timeline.MAX_BLOCKS
    assert len(timeline.PHASES) == timeline.PIECE_STAMPS - 1


def test_stamp_sources_refuses_without_its_flag_and_on_a_missing_anchor(tmp_path):
    _copy_sources(tmp_path)
    script = os.path.join(TOOLS, "stamp_sources.py")
    refused = subprocess.run([sys.executable, script, str(tmp_path)], capture_output=True, text=True)
    assert refused.returncode != 0 and "--edit-sources-in-place" in refused.stderr
    path = tmp_path / "csrc/ops/float32_fallback.cuh"
    original = path.read_text()
    path.write_text(original.replace("wait_for_prior_grid();   // the tf32 GEMM's outputs", "wait_for_prior_grid();"))
    missing = subprocess.run([sys.executable, script, str(tmp_path), "--edit-sources-in-place"], capture_output=True,
                             text=True)
    assert missing.returncode != 0 and "anchor occurs 0 times" in missing.stderr
    # nothing was written: the edits of the other files are all or none
    assert "timeline_put" not in (tmp_path / "csrc/ops/corrected_gemm_sm90.cuh").read_text()


def test_timeline_summary_reads_made_up_stamps():
    stamps = [0] * stamp_sources.STAMP_WORDS
    # two GEMM blocks starting at 1000 and 1400 ns, two pieces each; phases of 100, 400, 250, 2000 and 1500 ns
    for block, start in enumerate((1000, 1400)):
        row = block * timeline.GEMM_STRIDE
        stamps[row], stamps[row + 1] = 7 + block, start
        for entry in range(2):
            top = start + 200 + entry * 5000
            for phase, t in enumerate((top, top + 100, top + 500, top + 750, top + 2750, top + 4250)):
                stamps[row + 2 + timeline.PIECE_STAMPS * entry + phase] = t
        stamps[row + timeline.END_WORD] = start + 10000
    stamps[timeline.TF32_BASE + 1: timeline.TF32_BASE + 4] = [9000, 9500, 11900]  # before the GEMM's end (11400)
    # a third block whose second piece lacks its first-stage stamp (as where a stamp is not reached) is left out
    # of that piece's medians
    row = 2 * timeline.GEMM_STRIDE
    stamps[row + 1], stamps[row + timeline.END_WORD] = 1200, 9000
    for entry in range(2):
        top = 1400 + entry * 5000
        for phase, t in enumerate((top, top + 100, top + 500, top + 750, top + 2750, top + 4250)):
            stamps[row + 2 + timeline.PIECE_STAMPS * entry + phase] = t if (entry, phase) != (1, 3) else 0
    s = timeline.gemm_summary(stamps)
    assert s["blocks"] == 3 and s["span"] == pytest.approx(10.4) and s["first_end"] == pytest.approx(8.0)
    assert [(p["entry"], p["blocks"]) for p in s["pieces"]] == [(0, 3), (1, 2)]
    first = s["pieces"][0]
    assert first["top"] == pytest.approx(0.4) and first["top_spread"] == pytest.approx(0.4)
    assert [first[name] for name in timeline.PHASES] == pytest.approx([0.1, 0.4, 0.25, 2.0, 1.5])
    assert s["pieces"][1]["top"] == pytest.approx(5.4)
    assert s["tf32"]["blocks"] == 1 and s["tf32"]["started_before_gemm_end"] == 1
    assert s["tf32"]["end_last"] == pytest.approx(10.9)
    assert "fallback" not in s


def test_timeline_summary_says_when_nothing_was_stamped():
    with pytest.raises(RuntimeError, match="no fp16 GEMM block stamped"):
        timeline.gemm_summary([0] * stamp_sources.STAMP_WORDS)
