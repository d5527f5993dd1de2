"""tools/sass_report.py: its reading of cuobjdump's listings on a made-up kernel, and, where the extension was
built with its sm_90a kernels and the CUDA toolkit is here, what NOTES and README say of the real SASS: the
wgmma GEMM's stage loop keeps everything in registers (no local memory) wherever it has the whole register
file, and so does the small GEMM's products' loop (no GPU needed: it reads the binary); and, where nvcc is,
tools/small_gemm_ptxas.sh's registers of the two small-GEMM kernels of tile 64 and of tile 32."""
from __future__ import annotations

import glob
import os
import re
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))

import sass_report  # noqa: E402
from conftest import SMALL_GEMM_KERNEL_ARGS  # noqa: E402

# Two kernels, in the listing format of `cuobjdump -sass` (an address comment, the instruction, an encoding
# comment): `gemm` has an outer loop (0x0010-0x00b0) around an inner one with the tensor-core instructions
# (0x0030-0x0080), one spill load inside that and a spill store outside it; `copy` has a loop without any.
SASS = """
Fatbin elf code:
================
arch = sm_90a

\tcode for sm_90a
\t\tFunction : _Z4gemmv
\t.headerflags\t@"EF_CUDA_SM90"
        /*0000*/                   STL [R1], R2 ;                 /* 0x0000000201007387 */
        /*0010*/                   MOV R3, RZ ;                   /* 0x000000ff00037202 */
        /*0020*/                   IADD3 R4, R4, 0x1, RZ ;        /* 0x0000000104047810 */
        /*0030*/                   HGMMA.64x128x16.F32 R24, gdesc[UR4], RZ ;  /* 0x00000000041879f0 */
        /*0040*/                   LDL R5, [R1] ;                 /* 0x0000000001057983 */
        /*0050*/                   FADD R6, R6, R7 ;              /* 0x0000000706067221 */
        /*0060*/                   ISETP.NE.AND P0, PT, R4, 0x10, PT ;  /* 0x000000100400780c */
        /*0070*/                   HGMMA.64x128x16.F32 R24, gdesc[UR8], R24 ;  /* 0x00000000081879f0 */
        /*0080*/               @P0 BRA 0x30 ;                     /* 0xfffffffc00000947 */
        /*0090*/                   ISETP.NE.AND P1, PT, R3, 0x4, PT ;  /* 0x000000040300780c */
        /*00a0*/                   STG.E [R8.64], R6 ;            /* 0x0000000608007986 */
        /*00b0*/               @P1 BRA 0x10 ;                     /* 0xfffffff400001947 */
        /*00c0*/                   EXIT ;                         /* 0x000000000000794d */
        /*00d0*/                   BRA 0xd0;                      /* 0xfffffffc00007947 */
\t\tFunction : _Z4copyv
\t.headerflags\t@"EF_CUDA_SM90"
        /*0000*/                   LDG.E R2, [R4.64] ;            /* 0x0000000404027981 */
        /*0010*/                   STG.E [R6.64], R2 ;            /* 0x0000000206007986 */
        /*0020*/               @P0 BRA 0x0 ;                      /* 0xfffffffc00000947 */
        /*0030*/                   EXIT ;                         /* 0x000000000000794d */
"""
RES_USAGE = """
Fatbin elf code:
================
arch = sm_90a

Resource usage:
 Common:
  GLOBAL:0
 Function _Z4gemmv:
  REG:255 STACK:8 SHARED:0 LOCAL:0 CONSTANT[0]:528 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _Z4copyv:
  REG:16 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:528 TEXTURE:0 SURFACE:0 SAMPLER:0
"""


def test_reads_made_up_listing():
    sass = sass_report.parse_sass(SASS)
    assert sorted(sass) == [("sm_90a", "_Z4copyv"), ("sm_90a", "_Z4gemmv")]
    assert [a for a, _ in sass[("sm_90a", "_Z4gemmv")]] == list(range(0, 0xE0, 0x10))
    rows = {r["kernel"]: r for r in sass_report.summarize(sass, sass_report.parse_res_usage(RES_USAGE))}
    gemm, copy = rows["gemm"], rows["copy"]
    # The inner loop, not the outer one that also holds the HGMMAs, nor the EXIT's self-branch after them.
    assert (gemm["loop"], gemm["loop_local"]) == (6, 1)
    assert (gemm["registers"], gemm["stack_bytes"], gemm["tensor_core"], gemm["local"]) == (255, 8, 2, 2)
    assert gemm["instructions"] == 14 and gemm["arch"] == "sm_90a"
    assert (copy["loop"], copy["loop_local"], copy["tensor_core"], copy["registers"]) == (None, None, 0, 16)
    table = sass_report.markdown(list(rows.values()), "# header")
    assert "| `gemm` | sm_90a | 255 | 8 | 14 | 2 | 2 | 6 | 1 |" in table
    assert "| `copy` | sm_90a | 16 | 0 | 4 | 0 | 0 | - | - |" in table


def test_opcode_ignores_predicates_and_matches_whole_mnemonics():
    assert sass_report.opcode("@!P0 LDL.64 R2, [R1+0x8]") == "LDL.64"
    assert sass_report._is("@P1 LDL.64 R2, [R1]", sass_report.LOCAL_OPS)
    assert not sass_report._is("LDLK R2, [R1]", sass_report.LOCAL_OPS)  # (no such op; a prefix is not a match)
    assert sass_report._is("HMMA.16816.F32 R4, R8, R12, R4", sass_report.TENSOR_CORE_OPS)


def test_short_name():
    assert sass_report.short_name(
        "wmmae_ops::sm90::corrected_gemm_sm90_kernel<true, false, true, false, true, false>"
        "(wmmae_ops::(anonymous namespace)::GemmArgs, wmmae_ops::sm90::TmaMaps)"
    ) == "corrected_gemm_sm90_kernel<true, false, true, false, true, false>"
    assert sass_report.short_name(
        "wmmae_ops::outer::batched_outer_kernel<__half, float, false>(wmmae_ops::outer::Args)"
    ) == "batched_outer_kernel<__half, float, false>"


def _extension_rows():
    import torch_wmmae

    binaries = glob.glob(os.path.join(os.path.dirname(torch_wmmae.__file__), "_C*.so"))
    tool = sass_report.find_cuobjdump()
    if not binaries or tool is None or not torch_wmmae.has_cuda_kernels():
        pytest.skip("needs the extension built with CUDA kernels and cuobjdump")
    rows = sass_report.binary_rows(binaries[0], tool)
    if not any(r["arch"] == "sm_90a" for r in rows):
        pytest.skip("the extension has no sm_90a code (built for other GPUs)")
    return rows


# The wgmma GEMM's instantiations with the whole register file, by kind, and the tensor-core instructions a stage has at
# least (three products of two k-steps, fp16, or of four, tf32). fp16: A row-major, B row-major, TMA stages, read-back,
# beside the resident pre-pass (false: the others are held to 240 registers), odd width; tf32: A row-major, B
# row-major, TMA stages. A read by residue (TMA stages): A row-major, B row-major, read-back, odd width; tf32: A
# row-major, B row-major. B read by residue (TMA stages): A row-major, B row-major, read-back, odd width, A by residue;
# tf32: A row-major, B row-major, A by residue.
_FLAG = "(true|false)"
WHOLE_REGISTER_FILE_KERNELS = {
    "fp16": (re.compile(rf"corrected_gemm_sm90_kernel<{_FLAG}, {_FLAG}, {_FLAG}, {_FLAG}, false, {_FLAG}>"), 6),
    "tf32": (re.compile(rf"corrected_gemm_sm90_tf32_kernel<{_FLAG}, {_FLAG}, {_FLAG}>"), 12),
    "fp16 by residue": (re.compile(rf"corrected_gemm_sm90_kernel_a_by_residue<{_FLAG}, {_FLAG}, {_FLAG}, {_FLAG}>"), 6),
    "tf32 by residue": (re.compile(rf"corrected_gemm_sm90_tf32_kernel_a_by_residue<{_FLAG}, {_FLAG}>"), 12),
    "fp16 B by residue": (
        re.compile(rf"corrected_gemm_sm90_kernel_b_by_residue<{_FLAG}, {_FLAG}, {_FLAG}, {_FLAG}, {_FLAG}>"), 6),
    "tf32 B by residue": (re.compile(rf"corrected_gemm_sm90_tf32_kernel_b_by_residue<{_FLAG}, {_FLAG}, {_FLAG}>"), 12),
}


def test_wgmma_stage_loops_do_not_spill():
    """The wgmma GEMM with the whole register file (every fp16 instantiation but those beside the resident
    pre-pass, which are held to 240 registers, and every tf32 one): its stage loop has no local-memory access,
    with TMA or cp.async stages, in any layout, with and without read-back chunks, for odd widths. (sass.md lists
    the others.)"""
    rows = [r for r in _extension_rows() if r["arch"] == "sm_90a"]
    checked = dict.fromkeys(WHOLE_REGISTER_FILE_KERNELS, 0)
    for r in rows:
        kind = next((kind for kind, (pattern, _) in WHOLE_REGISTER_FILE_KERNELS.items()
                     if pattern.fullmatch(r["kernel"])), None)
        if kind is None:
            continue
        checked[kind] += 1
        assert r["tensor_core"] >= WHOLE_REGISTER_FILE_KERNELS[kind][1], r
        assert r["loop"] is not None, r
        assert r["loop_local"] == 0, f"{r['kernel']}: {r['loop_local']} local-memory accesses in its stage loop"
    # fp16: A and B row- or column-major, TMA or cp.async stages, with and without read-back, and with TMA stages
    # for odd widths, with and without read-back; tf32: no read-back; by residue: A and B row- or column-major, with
    # and without read-back and odd widths (fp16), A and B row- or column-major (tf32); B by residue: the same, with A
    # by residue or not
    assert checked == {"fp16": 16 + 8, "tf32": 8, "fp16 by residue": 16, "tf32 by residue": 4, "fp16 B by residue": 32,
                       "tf32 B by residue": 8}


def test_small_gemm_product_loops_do_not_spill():
    """The small GEMM's kernels (every tile, K bucket, layout, and the two product loops of tile 64 at K <= 64 and of
    tile 32 at K <= 32): the loop around their tensor-core products has no local-memory access (a spill there costs
    on every k-step)."""
    rows = [r for r in _extension_rows() if r["arch"] == "sm_90a" and SMALL_GEMM_KERNEL_ARGS.fullmatch(r["kernel"])]
    for r in rows:
        assert r["tensor_core"] >= 3 and r["loop"] is not None, r
        assert r["loop_local"] == 0, f"{r['kernel']}: {r['loop_local']} local-memory accesses in its products' loop"
    # tile 16: K buckets 32, 64, 128; tile 32: 32 (two kernels), 64, 128; tile 64: 64 (two kernels), 128; four
    # layouts each
    assert len(rows) == 4 * (3 + 4 + 3), [r["kernel"] for r in rows]


def test_small_gemm_ptxas_tool_compiles_the_named_kernels():
    """tools/small_gemm_ptxas.sh compiles the small GEMM's kernels alone and reports ptxas's registers: the kernels
    with one hi*hi sum at a time fit the blocks per SM of their launch bounds, tile 64's five of 128 threads (at most
    102 registers) and tile 32's sixteen of 64 (64), the ones per k-step four (128) and fourteen (73)."""
    import shutil
    import subprocess

    nvcc = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    if not os.path.isfile(nvcc) or shutil.which("c++filt") is None:
        pytest.skip("needs nvcc and c++filt")
    tool = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "small_gemm_ptxas.sh")
    # kernel: (threads per block, blocks per SM)
    bounds = {"<64, 64, true, false, true>": (128, 5), "<64, 64, true, false, false>": (128, 4),
              "<32, 32, false, true, true>": (64, 16), "<32, 32, false, true, false>": (64, 14)}
    result = subprocess.run(["bash", tool, *bounds], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    registers = {m.group(1): int(m.group(2)) for m in
                 re.finditer(r"corrected_gemm_small_kernel(<[^>]*>): (\d+) registers", result.stdout)}
    assert set(registers) == set(bounds), result.stdout
    for kernel, (threads, blocks) in bounds.items():
        assert registers[kernel] <= 65536 // (threads * blocks), (kernel, registers)
