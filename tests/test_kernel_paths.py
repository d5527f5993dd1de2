"""One small call for every kernel instantiation and run-time path of the CUDA ops, each checked against a
float64 reference: the suite that compute-sanitizer's slow tools (racecheck, initcheck) can run whole
(tools/sanitize.sh). On the CPU the same calls check the reference kernels.

corrected_matmul: GEMM kernel family (default; on H100/H200 without TMA; portable WMMA) x method (fp16,
tf32, auto) x layout of a and b (row- or column-major, which picks both the GEMM instantiation and the
exponent pre-pass's path: contiguous or strided lines) x split-K (allowed, or off in deterministic mode), on
a problem of one output tile with K = 2100 (two accumulation chunks and a partial one), plus partial tiles
with broadcast batch dimensions, the wgmma kernel's TMA stages, its batched chunk read-back, and the
exponent pre-pass over strided lines.
batched_outer: input dtype x output dtype x n (16: direct tiles and several items per unit; 48 and 100:
staged output bands, 100 with partial tiles; 300: several slices per vector) x aligned inputs (asynchronous
staging) or inputs one element off (synchronous staging); fp32 inputs with values outside the exact bf16x3
range (the CUDA-core path).
"""
from __future__ import annotations

import contextlib
import math
import os
import re
from typing import NamedTuple

import pytest
import torch

import torch_wmmae
from conftest import (DEVICES, READ_BACK_KERNEL, SMALL_GEMM_KERNEL_ARGS, deterministic,
                      device_gemm_grid, extension_cubin_archs, extension_has_sm90a_code, launched_kernels,
                      outputs_at_risk, persistent_slots_batch, poisoned_cuda_pool, poisoned_pool_where_possible,
                      profiler_records_kernels, random_signs, random_tensor, random_tensor_in_layout, rel_err,
                      requires_cuda, runs_sm90_gemm, U32)
from hardening import assert_matmul_within_dot_product_bound, assert_outer_correct

METHODS = ["fp16", "tf32", "auto"]


# The CPU kernels, and on CUDA both GEMM kernel families: the default (wgmma on H100/H200 builds with sm_90a,
# its fp32 stages by TMA where the operands allow, else WMMA), the wgmma kernel with cp.async stages only
# (TORCH_WMMAE_SM90_TMA=0), the default with the wgmma kernel's stream-K schedule wherever it can run
# (TORCH_WMMAE_STREAM_K=1), and, through TORCH_WMMAE_PORTABLE_GEMM=1, the WMMA kernels that other GPUs run: with
# the shared memory of an H100/H200, and with an A100's (TORCH_WMMAE_SMEM_PER_BLOCK, where the fp16 GEMM's stages
# are 16 k: GemmConfig's kCompact).
A100_SMEM_PER_BLOCK = "166912"
GEMM_TARGETS = ["cpu", *[pytest.param(name, marks=[requires_cuda, pytest.mark.gpu])
                         for name in ("cuda", "cuda_no_tma", "cuda_stream_k", "cuda_portable_gemm",
                                      "cuda_portable_a100_smem")]]


FOLD_SWITCH = "TORCH_WMMAE_FOLD_BATCH"


@pytest.fixture(autouse=True)
def _batch_kept(monkeypatch):
    """The batched kernels' paths, as each case names them: a b broadcast over a packed batch would otherwise fold into
    one product of batch x M rows (the 2-D cases' paths), except in the tests of that fold, which unset this."""
    monkeypatch.setenv(FOLD_SWITCH, "0")


@pytest.fixture(autouse=True)
def _gemms_for_vectors_too(monkeypatch):
    """The GEMMs' paths also for the cases of one output row or column, which exercise their edges (a partial tile
    of width 1, A's lines by residue with M = 1, ...): such calls otherwise take the matrix-vector path
    (test_matrix_vector.py)."""
    monkeypatch.setenv("TORCH_WMMAE_MATRIX_VECTOR", "0")


@pytest.fixture(params=GEMM_TARGETS)
def gemm_device(request, monkeypatch) -> str:
    """The device of a corrected_matmul call, with the GEMM kernel family selected."""
    portable = request.param.startswith("cuda_portable")
    monkeypatch.setenv("TORCH_WMMAE_PORTABLE_GEMM", "1" if portable else "0")
    if request.param == "cuda_portable_a100_smem":
        monkeypatch.setenv("TORCH_WMMAE_SMEM_PER_BLOCK", A100_SMEM_PER_BLOCK)
    else:
        monkeypatch.delenv("TORCH_WMMAE_SMEM_PER_BLOCK", raising=False)
    monkeypatch.setenv("TORCH_WMMAE_SM90_TMA", "0" if request.param == "cuda_no_tma" else "1")
    if request.param == "cuda_stream_k":
        monkeypatch.setenv("TORCH_WMMAE_STREAM_K", "1")
    else:
        monkeypatch.delenv("TORCH_WMMAE_STREAM_K", raising=False)
    return "cpu" if request.param == "cpu" else "cuda"


@pytest.mark.parametrize("method", ["tf32", "auto"])
@pytest.mark.parametrize("a_col", [False, True], ids=["a_row", "a_col"])
@pytest.mark.parametrize("b_col", [False, True], ids=["b_row", "b_col"])
def test_corrected_matmul_float32_fallback_paths(gemm_device, gen, method, a_col, b_col):
    """The float32 fallback after every tf32 GEMM instantiation (float32_fallback.cuh): with every output at risk
    (conftest.outputs_at_risk) every tile is computed again with float32 FMAs, over two chunks of K and a
    partial one, after a split-K GEMM where it runs one: the CPU emulation's bits, float32's accuracy."""
    a, b = outputs_at_risk(gen, (48, 2100), (2100, 40))
    a_dev = (a.mT.contiguous().mT if a_col else a).to(gemm_device)
    b_dev = (b.mT.contiguous().mT if b_col else b).to(gemm_device)
    out = torch_wmmae.corrected_matmul(a_dev, b_dev, method=method)
    if gemm_device != "cpu" or a_col or b_col:  # (the CPU with both row-major would be the same call again)
        assert torch.equal(out.cpu(), torch_wmmae.corrected_matmul(a, b, method=method))
    assert_matmul_within_dot_product_bound(out, a_dev, b_dev)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("a_col", [False, True], ids=["a_row", "a_col"])
@pytest.mark.parametrize("b_col", [False, True], ids=["b_row", "b_col"])
@pytest.mark.parametrize("split_k", [True, False], ids=["split_k_allowed", "deterministic"])
def test_corrected_matmul_paths(gemm_device, gen, method, a_col, b_col, split_k):
    a = random_tensor_in_layout((48, 2100), a_col, gen, gemm_device)
    b = random_tensor_in_layout((2100, 40), b_col, gen, gemm_device)
    assert a.is_contiguous() != a_col and b.is_contiguous() != b_col
    with deterministic(not split_k):
        out = torch_wmmae.corrected_matmul(a, b, method=method)
    assert_matmul_within_dot_product_bound(out, a, b, f"{method} a_col={a_col} b_col={b_col}")


def _rows_in_k_windows(a: torch.Tensor) -> torch.Tensor:
    """a (contiguous) with each row zero outside its own window of consecutive k: the windows tile K in order,
    so that every k-step of the product (the first and the last of each chunk and each split included) is in
    some row's window."""
    m, k = a.shape
    window = torch.arange(k, device=a.device) // -(-k // m)
    return torch.where(window == torch.arange(m, device=a.device)[:, None], a, torch.zeros((), device=a.device))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("a_col", [False, True], ids=["a_row", "a_col"])
@pytest.mark.parametrize("b_col", [False, True], ids=["b_row", "b_col"])
@pytest.mark.parametrize("split_k", [True, False], ids=["split_k_allowed", "deterministic"])
def test_corrected_matmul_corrects_every_k_step(gemm_device, gen, method, a_col, b_col, split_k):
    """300 x 2100 @ 2100 x 40 (3 tiles of rows) where row i of a is nonzero only at k = 7i .. 7i + 6: each
    output sums 7 products, so its error allowance is that of 7 terms, not of 2100
    (assert_matmul_within_dot_product_bound counts nonzero products). A product that skipped the correction
    terms of any single k (the last of a chunk, of a split or of K, say) would put the worst output of that
    window's rows 60 to 150 times outside its allowance (the check's test below), where the allowance of 2100
    terms would let it pass or nearly."""
    a = _rows_in_k_windows(random_tensor(gen, (300, 2100), "normal", gemm_device))
    if a_col:
        a = a.mT.contiguous().mT
    b = random_tensor_in_layout((2100, 40), b_col, gen, gemm_device)
    assert a.is_contiguous() != a_col and b.is_contiguous() != b_col
    assert ((a != 0).sum(1) == 7).all()
    with deterministic(not split_k):
        out = torch_wmmae.corrected_matmul(a, b, method=method)
    assert_matmul_within_dot_product_bound(out, a, b, f"{method} a_col={a_col} b_col={b_col}")


@pytest.mark.parametrize("k", [0, 1023, 2099])
def test_k_window_check_catches_one_k_without_corrections(gen, k):
    """The test above can fail: the float64 product of its inputs with one k's terms reduced to the fp16
    split's hi * hi (their corrections dropped) fails the check."""
    a = _rows_in_k_windows(random_tensor(gen, (300, 2100), "normal", dtype=torch.float64))
    b = random_tensor(gen, (2100, 40), "normal", dtype=torch.float64)
    hi_a, hi_b = a[:, k].half().double(), b[k].half().double()
    dropped = (a @ b - (a[:, k, None] * b[k] - hi_a[:, None] * hi_b)).float()
    with pytest.raises(AssertionError, match="outside"):
        assert_matmul_within_dot_product_bound(dropped, a.float(), b.float())


@pytest.mark.parametrize("method", METHODS)
def test_corrected_matmul_partial_tiles_broadcast_batch(gemm_device, gen, method):
    a = random_tensor(gen, (3, 1, 130, 70), "normal", gemm_device)
    b = random_tensor(gen, (2, 70, 129), "normal", gemm_device)
    out = torch_wmmae.corrected_matmul(a, b, method=method)
    assert out.shape == (3, 2, 130, 129)
    assert_matmul_within_dot_product_bound(out, a.expand(3, 2, 130, 70), b.expand(3, 2, 70, 129), method)


# The GEMM kernel families on CUDA (GEMM_TARGETS without the CPU, which has no tiles).
CUDA_GEMM_TARGETS = GEMM_TARGETS[1:]


@pytest.mark.parametrize("gemm_device", CUDA_GEMM_TARGETS, indirect=True)
@pytest.mark.parametrize("method", METHODS)
def test_tile_order_keeps_every_bit(gemm_device, gen, monkeypatch, method):
    """The order in which a GEMM's blocks take their tiles (tile_origin: groups of TORCH_WMMAE_TILE_GROUP_ROWS
    tile rows, or the host's choice from K and the L2 size) moves no output bit: 1000 x 700 is 8 x 6 tiles, so
    groups of 3 rows end in a partial group of 2, and groups of 1 or 64 walk rows or columns only."""
    a = random_tensor(gen, (1000, 300), "normal", gemm_device)
    b = random_tensor(gen, (300, 700), "normal", gemm_device)
    outs = {}
    with deterministic():  # no split-K: its atomics add in any order
        for rows in ("1", "3", "64", None):
            if rows is None:
                monkeypatch.delenv("TORCH_WMMAE_TILE_GROUP_ROWS", raising=False)
            else:
                monkeypatch.setenv("TORCH_WMMAE_TILE_GROUP_ROWS", rows)
            outs[rows] = torch_wmmae.corrected_matmul(a, b, method=method)
    for rows, out in outs.items():
        assert torch.equal(out, outs[None]), f"groups of {rows} tile rows"
    assert_matmul_within_dot_product_bound(outs[None], a, b, method)


@pytest.mark.parametrize("gemm_device", CUDA_GEMM_TARGETS, indirect=True)
@pytest.mark.parametrize("method", ["tf32", "auto"])
def test_tile_order_keeps_the_float32_fallbacks_bits(gemm_device, gen, monkeypatch, method):
    """The float32 fallback finds its tiles through tile_origin too: in any group height it recomputes each
    tile that the GEMM left it, with the CPU emulation's bits (3 x 3 tiles, groups of 2 rows and of 1)."""
    a, b = outputs_at_risk(gen, (300, 2100), (2100, 260))
    want = torch_wmmae.corrected_matmul(a, b, method=method)
    for rows in ("2", "1"):
        monkeypatch.setenv("TORCH_WMMAE_TILE_GROUP_ROWS", rows)
        out = torch_wmmae.corrected_matmul(a.to(gemm_device), b.to(gemm_device), method=method)
        assert torch.equal(out.cpu(), want), f"groups of {rows} tile rows"


@pytest.mark.parametrize("gemm_device", CUDA_GEMM_TARGETS, indirect=True)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("splits", ["2", "5"])
def test_forced_k_splits(gemm_device, gen, monkeypatch, method, splits):
    """TORCH_WMMAE_K_SPLITS sets the split count of the tile grid (the path that the long-K rule takes for K
    above 4096 at 4 waves of tiles; unforced, this shape would run stream-K), which the shapes of the other
    tests never take: 8 x 6 tiles, K = 2100
    in 2 (two accumulation chunks and part of one per split) or 5 (a short last split), with the exponent
    pre-pass zeroing the output that the splits add into (under TORCH_WMMAE_STREAM_K=1, stream-K's schedule
    instead). float32's accuracy, and about that of the unsplit call (relative Frobenius errors against float64,
    over 700,000 outputs)."""
    a = random_tensor(gen, (1000, 2100), "normal", gemm_device)
    b = random_tensor(gen, (2100, 700), "normal", gemm_device)
    monkeypatch.setenv("TORCH_WMMAE_K_SPLITS", "1")
    whole = torch_wmmae.corrected_matmul(a, b, method=method)
    monkeypatch.setenv("TORCH_WMMAE_K_SPLITS", splits)
    assert torch.ops.wmmae._corrected_matmul_grid(1000, 700, 2100, 1, 132)[1] == int(splits)
    out = torch_wmmae.corrected_matmul(a, b, method=method)
    assert_matmul_within_dot_product_bound(out, a, b, f"{method}, K in {splits}")
    ref = a.double() @ b.double()
    assert rel_err(out, ref) <= 1.25 * rel_err(whole, ref) + 1e-9, (rel_err(out, ref), rel_err(whole, ref))


# (Without the stream-K target: the rule this test is about chooses no stream-K.)
@pytest.mark.parametrize("gemm_device", [t for t in CUDA_GEMM_TARGETS if t.values[0] != "cuda_stream_k"],
                         indirect=True)
@pytest.mark.parametrize("method", METHODS)
def test_long_k_split_of_a_small_grid(gemm_device, gen, monkeypatch, method):
    """A large output with K > 4096 on a grid of fewer than 4 waves, whose split fills its waves: the rule splits K
    in 2 without stream-K by itself (2048^2 x 4160: 256 tiles, 512 blocks; on an H100 SXM or H200, 132 SMs, 97%
    of 4 waves). float32's accuracy, and about that of the unsplit call."""
    plan = device_gemm_grid(2048, 2048, 4160)
    if plan[1:4] != [2, 512, 0]:
        pytest.skip(f"this GPU's plan does not split 2048^2 x 4160: {plan}")
    a = random_tensor(gen, (2048, 4160), "normal", gemm_device)
    b = random_tensor(gen, (4160, 2048), "normal", gemm_device)
    monkeypatch.setenv("TORCH_WMMAE_K_SPLITS", "1")
    whole = torch_wmmae.corrected_matmul(a, b, method=method)
    monkeypatch.delenv("TORCH_WMMAE_K_SPLITS")
    out = torch_wmmae.corrected_matmul(a, b, method=method)
    assert_matmul_within_dot_product_bound(out, a, b, f"{method}, long-K split of a small grid")
    ref = a.double() @ b.double()
    assert rel_err(out, ref) <= 1.25 * rel_err(whole, ref) + 1e-9, (rel_err(out, ref), rel_err(whole, ref))


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("value", ["-1", "0", "99999999999999999999999", "2000000000", " 166912", "+166912", "160k"])
def test_smem_per_block_switch_rejects_what_is_not_a_byte_count(gen, monkeypatch, value):
    """TORCH_WMMAE_SMEM_PER_BLOCK caps the shared memory the kernels may take; a value that is not a plain positive
    number of bytes (up to 2^30) is an error naming the variable (strtoull took "-1" as 2^64 - 1 and saturated past
    its range: no cap)."""
    monkeypatch.setenv("TORCH_WMMAE_SMEM_PER_BLOCK", value)
    a, b = (random_tensor(gen, (64, 64), "normal", "cuda") for _ in range(2))
    with pytest.raises(RuntimeError, match=rf"TORCH_WMMAE_SMEM_PER_BLOCK must be a positive integer \(bytes\) of at "
                                           rf"most 1073741824, got '{re.escape(value)}'"):
        torch_wmmae.corrected_matmul(a, b)


# Switches that a 64^3 product reads on the GPU (the kernel choice on H100/H200; the small GEMM's choices on any
# GPU), each with a value it does not take and the values it does.
GPU_SWITCH_VALUES = {
    "TORCH_WMMAE_PORTABLE_GEMM": ("yes", "0 or 1"),
    "TORCH_WMMAE_SM90_TMA": ("off", "0 or 1"),
    "TORCH_WMMAE_SMALL_GEMM": ("2", "0 or 1"),
    "TORCH_WMMAE_SMALL_TILE": ("48", "16, 32 or 64"),
}


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("switch", list(GPU_SWITCH_VALUES))
def test_gpu_switches_refuse_what_they_do_not_take(gen, monkeypatch, switch):
    """A kernel switch set to a value it does not take is an error naming the variable and the values it takes,
    not read as unset (test_yes_no_switches_take_0_or_1 checks the function on the CPU); empty means unset: the same
    bits as unset."""
    if switch in ("TORCH_WMMAE_PORTABLE_GEMM", "TORCH_WMMAE_SM90_TMA") and not runs_sm90_gemm():
        pytest.skip("read where the wgmma GEMM can run (H100/H200)")
    a, b = (random_tensor(gen, (64, 64), "normal", "cuda") for _ in range(2))
    monkeypatch.delenv(SMALL_GEMM_SWITCH, raising=False)  # (the small GEMM, by the default rule, as asked here)
    monkeypatch.delenv(switch, raising=False)
    kernels = _launched_kernels(lambda: torch_wmmae.corrected_matmul(a, b))
    if profiler_records_kernels():
        assert any(SMALL_GEMM_KERNEL in k for k in _own_kernels(kernels)), kernels
    unset = torch_wmmae.corrected_matmul(a, b)
    monkeypatch.setenv(switch, "")
    assert torch.equal(torch_wmmae.corrected_matmul(a, b), unset)
    value, takes = GPU_SWITCH_VALUES[switch]
    monkeypatch.setenv(switch, value)
    with pytest.raises(RuntimeError, match=rf"{switch} must be {takes} \(or unset\), got '{value}'"):
        torch_wmmae.corrected_matmul(a, b)


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("value", ["0", "-2", "four", "3.5"])
def test_tile_group_rows_switch_rejects_what_is_not_a_positive_integer(gen, monkeypatch, value):
    monkeypatch.setenv("TORCH_WMMAE_TILE_GROUP_ROWS", value)
    a, b = (random_tensor(gen, (64, 64), "normal", "cuda") for _ in range(2))
    with pytest.raises(RuntimeError, match=f"TORCH_WMMAE_TILE_GROUP_ROWS must be a positive integer.*'{value}'"):
        torch_wmmae.corrected_matmul(a, b)


# The ways a GEMM block writes its output tile (the wgmma kernel's flush): whole tiles and tiles at the
# output's edge (partial rows and columns), each with 16-byte aligned rows (a width of 0 mod 4: float4s) and
# with a width of 2 mod 4 (float2s), with one chunk of K (direct stores) or split K (atomics); a row and a
# column scaled so that their unscaling 2^-(shift_a + shift_b) leaves float's normal range, an odd output
# width (no aligned pairs of columns), and several chunks of K summed in the output;
# (m, k, n), split-K allowed, line scale factors for a row of a and a column of b.
FLUSH_CASES = {
    "whole_tiles": ((256, 96, 256), False, 1.0, 1.0),
    "whole_tiles_split_k": ((128, 4096, 256), True, 1.0, 1.0),
    "whole_tiles_unaligned_rows": ((256, 96, 258), False, 1.0, 1.0),
    "whole_tiles_unaligned_rows_split_k": ((128, 4096, 258), True, 1.0, 1.0),
    "edge_tiles": ((200, 96, 300), False, 1.0, 1.0),
    "edge_tiles_unaligned_rows": ((200, 96, 302), False, 1.0, 1.0),
    "edge_tiles_split_k": ((130, 4096, 194), True, 1.0, 1.0),
    "edge_tiles_aligned_rows_split_k": ((130, 4096, 196), True, 1.0, 1.0),
    "large_line_scales": ((256, 96, 256), False, 2.0**-80, 2.0**70),
    "large_line_scales_split_k": ((128, 4096, 256), True, 2.0**-80, 2.0**70),
    "odd_width": ((256, 96, 257), False, 1.0, 1.0),
    "chunks": ((256, 2100, 256), False, 1.0, 1.0),
}


@pytest.mark.parametrize("case", list(FLUSH_CASES))
def test_corrected_matmul_flush_paths(gemm_device, gen, case):
    (m, k, n), split_k, a_row_scale, b_col_scale = FLUSH_CASES[case]
    a = random_tensor(gen, (m, k), "normal", gemm_device)
    b = random_tensor(gen, (k, n), "normal", gemm_device)
    a[3] *= a_row_scale
    b[:, 130] *= b_col_scale
    if gemm_device == "cuda" and split_k:
        assert device_gemm_grid(m, n, k)[1] > 1, "the shape must split K"
    # (On CUDA, where the caching allocator runs (not under compute-sanitizer), the output comes from memory filled
    # with NaN: an element no flush writes stays NaN, or 0 where split-K's pre-pass zeroed it; the bound refuses both.)
    with deterministic(not split_k), poisoned_pool_where_possible(gemm_device, float("nan")):
        out = torch_wmmae.corrected_matmul(a, b, method="fp16")
    assert_matmul_within_dot_product_bound(out, a, b, case)


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("schedule", ["split_k", "stream_k"])
def test_corrected_matmul_split_k_output_starts_from_garbage(gen, monkeypatch, method, schedule):
    """With split-K or stream-K the GEMM adds into the output, which the pre-pass zeroes first: an output
    block that the caching allocator hands back full of NaN must not leak into the result."""
    monkeypatch.setenv("TORCH_WMMAE_STREAM_K", "1" if schedule == "stream_k" else "0")
    a = random_tensor(gen, (48, 2100), "normal", "cuda")
    b = random_tensor(gen, (2100, 40), "normal", "cuda")
    tiles, splits, _, stream_k_blocks, _ = device_gemm_grid(48, 40, 2100)
    assert splits > 1 and (stream_k_blocks > 1) == (schedule == "stream_k"), "the shape must split K"
    with poisoned_cuda_pool(float("nan")):  # the call's output (and workspace) are carved from NaN
        out = torch_wmmae.corrected_matmul(a, b, method=method)
    assert_matmul_within_dot_product_bound(out, a, b, method)


# (batch, m, n, k, a column-major): the grid pre-pass with split-K (A's rows contiguous, B's columns strided,
# float4s), with A's rows strided and odd (one element per thread), and the resident pre-pass (batched, TMA).
WORKSPACE_CASES = {"split_k": (1, 128, 1024, 4096, False), "a_col_odd": (1, 301, 200, 99, True),
                   "resident": (4, 256, 256, 256, False)}


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("case", list(WORKSPACE_CASES))
def test_corrected_matmul_workspace_starts_from_garbage(gen, case):
    """The pre-pass merges the line ranges into a workspace that the call allocates and zeroes first (in a
    kernel that the pre-pass overlaps, waiting for it before its first merge). A workspace block that the
    caching allocator hands back full of large exponent codes must not leak into the scales: with them the
    fp16 split would scale every line by 2^-86, and the result would be mostly zeros."""
    batch, m, n, k, a_col = WORKSPACE_CASES[case]
    a = random_tensor(gen, (batch, k, m), "uniform", "cuda").transpose(-1, -2) if a_col else \
        random_tensor(gen, (batch, m, k), "uniform", "cuda")
    b = random_tensor(gen, (batch, k, n), "uniform", "cuda")
    if batch == 1:
        a, b = a[0], b[0]
    assert 4 * batch * m * n <= 1 << 20, "the output must come from the small-block pool too"
    # The call's output and workspace are carved from exponent code 1100 (exponent 100: see RangeArrays).
    with poisoned_cuda_pool(1100, torch.int32):
        out = torch_wmmae.corrected_matmul(a, b, method="fp16")
    assert_matmul_within_dot_product_bound(out, a, b, case)


def _launched_kernels(fn) -> list[str]:
    """The names of the CUDA kernels that fn() launches."""
    return [name for name, _ in launched_kernels(fn)]


def _own_kernels(names: list[str]) -> list[str]:
    """This package's kernels among `names`: not, e.g., the poison fills of the tests' outputs."""
    return [name for name in names if "wmmae" in name]


def _calls_by_switch(monkeypatch, name: str, values, call, deterministic_mode: bool = True,
                     pool=contextlib.nullcontext) -> tuple[dict, dict]:
    """call() once with the environment switch `name` at each of `values` ("default": unset), under
    deterministic(deterministic_mode) and inside a fresh pool() (e.g. poisoned_cuda_pool), which the profiler's
    region lies in (a memory pool made and freed inside it came with the profiler's rare crashes: sessions 96-97):
    what it returned and the names of the CUDA kernels it launched, by value."""
    outs, kernels = {}, {}
    for value in values:
        if value == "default":
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
        with deterministic(deterministic_mode), pool():
            kernels[value] = _launched_kernels(lambda: outs.setdefault(value, call()))
    return outs, kernels


def _same_bits_by_switch(monkeypatch, switch: str, values, a, b, method: str, what: str,
                         deterministic_mode: bool = True, exact: bool = True, inf_rows: tuple = (),
                         inf_cols: tuple = ()) -> dict:
    """corrected_matmul(a, b, method) at each of the switch's `values` (as _calls_by_switch, each call inside a fresh
    NaN-poisoned pool, so that an output left unwritten shows), under deterministic(deterministic_mode): the same bits
    at each value where `exact` (False where more than two atomics add into an output, in any order), and within the
    float32 dot product bound; on inf_rows (rows of a 2-D `a` that hold an Inf, where that bound says nothing) or
    inf_cols (columns of a 2-D `b` that do) the float64 product's +-Infs instead. The names of the kernels each call
    launched, by value."""
    call = lambda: torch_wmmae.corrected_matmul(a, b, method=method)
    # (Operand copies may exceed the pool's small blocks. Under compute-sanitizer, where the pool would skip, the
    # tool watches the accesses instead.)
    pool = lambda: poisoned_pool_where_possible("cuda", float("nan"), large=True)
    outs, kernels = _calls_by_switch(monkeypatch, switch, values, call, deterministic_mode, pool=pool)
    first, *others = values
    for value in others:
        if exact:
            torch.testing.assert_close(outs[value], outs[first], rtol=0, atol=0, msg=f"{what}: {switch}={value}")
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    finite = torch.ones(a.shape[-2], dtype=torch.bool, device=a.device)
    finite_cols = torch.ones(b.shape[-1], dtype=torch.bool, device=b.device)
    assert not (inf_rows and inf_cols), "(an Inf row meets an Inf column in a NaN or an Inf)"
    if inf_rows:
        assert a.dim() == 2, "inf_rows: rows of a 2-D a"
        finite[list(inf_rows)] = False
        ref = torch.matmul(a[~finite].double(), b.double())
        assert torch.isinf(ref).all(), "each of inf_rows is +-Inf in every column"
    if inf_cols:
        assert a.dim() == 2 and b.dim() == 2, "inf_cols: columns of a 2-D b"
        finite_cols[list(inf_cols)] = False
        ref = torch.matmul(a.double(), b[:, ~finite_cols].double())
        assert torch.isinf(ref).all(), "each of inf_cols is +-Inf in every row"
    for value in values if not exact else (first,):
        out = outs[value]
        if inf_rows:
            assert torch.equal(out[~finite], ref.float()), f"{what}, {switch}={value}: the rows of an Inf"
        if inf_cols:
            assert torch.equal(out[:, ~finite_cols], ref.float()), f"{what}, {switch}={value}: the columns of an Inf"
        assert_matmul_within_dot_product_bound(out[..., finite, :][..., finite_cols],
                                               a.expand(*batch, *a.shape[-2:])[..., finite, :],
                                               b.expand(*batch, *b.shape[-2:])[..., finite_cols],
                                               f"{what}, {switch}={value}")
    return kernels


def _sees_sm90_kernels() -> bool:
    """Whether a test can check by name which wgmma kernels a call launched (not under compute-sanitizer)."""
    return runs_sm90_gemm() and profiler_records_kernels()


KERNEL_CHOICES = {"sm90", "sm90_tma", "overlap_launches", "wmma_compact"}


def test_kernel_choice_on_the_cpu_is_empty():
    assert torch.ops.wmmae._corrected_matmul_kernel_choice(torch.empty(0)) == []


@requires_cuda
@pytest.mark.gpu
def test_kernel_choice_follows_the_switches_and_names_the_launched_kernels(gen, monkeypatch):
    """_corrected_matmul_kernel_choice says what corrected_matmul decides on the device: the wgmma kernels
    only on compute capability 9.0, TMA stages only with them, neither under TORCH_WMMAE_PORTABLE_GEMM=1, no TMA
    under TORCH_WMMAE_SM90_TMA=0. Where the profiler records kernels, a call launches exactly what it says."""
    for key in ("TORCH_WMMAE_PORTABLE_GEMM", "TORCH_WMMAE_SM90_TMA"):
        monkeypatch.delenv(key, raising=False)
    like = torch.empty(0, device="cuda")
    choice = torch.ops.wmmae._corrected_matmul_kernel_choice(like)
    assert set(choice) <= KERNEL_CHOICES and len(set(choice)) == len(choice), choice
    if "sm90" in choice:
        assert torch.cuda.get_device_capability() == (9, 0)
        assert "overlap_launches" in choice  # (sm_90a code runs on this device)
    assert "sm90_tma" not in choice or "sm90" in choice
    monkeypatch.setenv("TORCH_WMMAE_SM90_TMA", "0")
    no_tma = torch.ops.wmmae._corrected_matmul_kernel_choice(like)
    assert no_tma == [c for c in choice if c != "sm90_tma"], (choice, no_tma)
    monkeypatch.setenv("TORCH_WMMAE_PORTABLE_GEMM", "1")
    portable = torch.ops.wmmae._corrected_matmul_kernel_choice(like)
    assert "sm90" not in portable and "sm90_tma" not in portable, portable
    for key in ("TORCH_WMMAE_PORTABLE_GEMM", "TORCH_WMMAE_SM90_TMA"):
        monkeypatch.delenv(key, raising=False)
    if not profiler_records_kernels():
        return
    a = random_tensor(gen, (130, 72), "normal", "cuda")  # (TMA can read both: see TMA_CASES["aligned"])
    b = random_tensor(gen, (72, 136), "normal", "cuda")
    ran = _launched_kernels(lambda: torch_wmmae.corrected_matmul(a, b, method="fp16"))
    assert any("corrected_gemm_sm90_kernel" in name for name in ran) == ("sm90" in choice), (choice, ran)
    assert any(TMA_KERNEL.search(name) for name in ran) == ("sm90_tma" in choice), (choice, ran)


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("a_col", [False, True], ids=["a_row", "a_col"])
@pytest.mark.parametrize("b_col", [False, True], ids=["b_row", "b_col"])
def test_portable_gemm_with_an_a100s_shared_memory_keeps_every_bit(gen, monkeypatch, method, a_col, b_col):
    """A GPU that allows a block less shared memory than the WMMA kernel's wide configuration needs (an A100:
    166,912 bytes against up to 231,456) runs the fp16 GEMM with stages of 16 k instead of 32 (kCompact). The
    k-steps' products and the chunks of K are the same, so are the outputs' bits: partial tiles, two chunks of
    K and a partial one, every layout (deterministic mode: no split of K, whose atomics add in any order)."""
    monkeypatch.setenv("TORCH_WMMAE_PORTABLE_GEMM", "1")
    monkeypatch.delenv("TORCH_WMMAE_SMEM_PER_BLOCK", raising=False)
    a = random_tensor_in_layout((150, 2100), a_col, gen, "cuda")
    b = random_tensor_in_layout((2100, 140), b_col, gen, "cuda")
    like = torch.empty(0, device="cuda")
    assert "wmma_compact" not in torch.ops.wmmae._corrected_matmul_kernel_choice(like)
    with deterministic():
        wide = torch_wmmae.corrected_matmul(a, b, method=method)
    monkeypatch.setenv("TORCH_WMMAE_SMEM_PER_BLOCK", A100_SMEM_PER_BLOCK)
    assert "wmma_compact" in torch.ops.wmmae._corrected_matmul_kernel_choice(like)
    with deterministic():
        compact = torch_wmmae.corrected_matmul(a, b, method=method)
    assert torch.equal(compact, wide)
    assert_matmul_within_dot_product_bound(compact, a, b)


@requires_cuda
@pytest.mark.gpu
def test_portable_gemm_refuses_a_gpu_without_enough_shared_memory(gen, monkeypatch):
    """Where even the compact configuration does not fit (an RTX 4090 or L40 allows a block 101,376 bytes) the
    call fails before any launch with a message that names the need, the GPU and its limit; the wgmma kernels of
    an H100/H200 are not limited by the variable. A value that is not a number of bytes is refused."""
    a = random_tensor(gen, (33, 70), "normal", "cuda")
    b = random_tensor(gen, (70, 21), "normal", "cuda")
    monkeypatch.setenv("TORCH_WMMAE_PORTABLE_GEMM", "1")
    monkeypatch.setenv("TORCH_WMMAE_SMEM_PER_BLOCK", "101376")
    name = re.escape(torch.cuda.get_device_name())
    with pytest.raises(RuntimeError, match=rf"needs (\d+) bytes of shared memory per block, and this {name} "
                                           rf"\(compute capability \d+\.\d+\) allows 101376") as refused:
        torch_wmmae.corrected_matmul(a, b)
    # The need named is the compact configuration's, which an A100 has room for.
    needed = int(re.search(r"needs (\d+) bytes", str(refused.value))[1])
    assert 101376 < needed <= int(A100_SMEM_PER_BLOCK), needed
    monkeypatch.setenv("TORCH_WMMAE_SMEM_PER_BLOCK", "96k")
    with pytest.raises(RuntimeError, match=r"TORCH_WMMAE_SMEM_PER_BLOCK must be a positive integer \(bytes\).*'96k'"):
        torch_wmmae.corrected_matmul(a, b)
    monkeypatch.setenv("TORCH_WMMAE_PORTABLE_GEMM", "0")
    monkeypatch.setenv("TORCH_WMMAE_SMEM_PER_BLOCK", "101376")
    if runs_sm90_gemm():
        assert_matmul_within_dot_product_bound(torch_wmmae.corrected_matmul(a, b), a, b)


@requires_cuda
@pytest.mark.gpu
def test_an_sm90a_build_runs_the_wgmma_kernels_on_hopper(monkeypatch):
    """On an H100/H200 an extension with sm_90a code must choose the wgmma kernels with TMA stages and overlapped
    launches (and one without must not): checked against the binary itself, so that a build that lost its sm_90a
    code cannot pass the sm_90 tests by skipping them (they follow the op's report, runs_sm90_gemm)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs a GPU of compute capability 9.0")
    has_sm90a = extension_has_sm90a_code()
    if has_sm90a is None:
        pytest.skip("needs cuobjdump and the built extension")
    for key in ("TORCH_WMMAE_PORTABLE_GEMM", "TORCH_WMMAE_SM90_TMA"):
        monkeypatch.delenv(key, raising=False)
    choice = torch.ops.wmmae._corrected_matmul_kernel_choice(torch.empty(0, device="cuda"))
    if has_sm90a:
        assert {"sm90", "sm90_tma", "overlap_launches"} <= set(choice), choice
    else:
        # Only a build for other GPUs lacks it (setup.py builds 9.0 as 9.0a); plain sm_90 code means the build
        # lost the 'a', and with it the wgmma kernels that the sm_90 tests would then skip.
        assert "sm_90" not in extension_cubin_archs(), "sm_90 code without sm_90a: the build lost 9.0a"
        assert "sm90" not in choice, choice


def _strided_matrix(gen, shape, line_stride: int, offset: int, col_major: bool) -> torch.Tensor:
    """N(0, 1) float32 of `shape` (..., rows, cols) whose inner dimension (columns when row-major, rows when
    column-major) is contiguous, lines `line_stride` elements apart, at a storage offset in elements."""
    *batch, rows, cols = shape
    lines = cols if col_major else rows
    storage = random_tensor(gen, (offset + math.prod(batch) * lines * line_stride,), "normal", "cuda")
    batch_strides = [lines * line_stride * math.prod(batch[i + 1:]) for i in range(len(batch))]
    matrix_strides = (1, line_stride) if col_major else (line_stride, 1)
    return storage.as_strided(shape, (*batch_strides, *matrix_strides), offset)


# (a, b) as (shape, line stride, storage offset, column-major), and whether the wgmma kernel can take its
# stages by TMA: inner dimension contiguous, 16-byte aligned start and line stride, at most one batch
# dimension (broadcast allowed).
TMA_CASES = {
    "aligned": (((130, 72), 72, 0, False), ((72, 136), 136, 0, False), True),
    "batched_a_broadcast_b": (((3, 130, 72), 76, 4, False), ((72, 136), 140, 8, False), True),
    "broadcast_a_batched_b": (((130, 72), 72, 0, False), ((2, 72, 136), 136, 0, False), True),
    "unaligned_start": (((130, 72), 72, 1, False), ((72, 136), 136, 0, False), False),
    "row_stride_not_16_bytes": (((130, 72), 72, 0, False), ((72, 133), 133, 0, False), False),
    # batch (2, 3) with a broadcast along the 3 and b along the 2: no single batch stride per operand
    "two_batch_dims": (((2, 1, 130, 72), 72, 0, False), ((3, 72, 136), 136, 0, False), False),
    # column-major operands, as in the backward pass (a.t(), b.t()): partial boxes along m, n and k
    "a_col": (((130, 72), 132, 0, True), ((72, 136), 136, 0, False), True),
    "b_col": (((130, 72), 72, 0, False), ((72, 136), 76, 0, True), True),
    "both_col_batched": (((2, 130, 72), 136, 4, True), ((2, 72, 136), 72, 0, True), True),
    "a_col_unaligned_start": (((130, 72), 132, 2, True), ((72, 136), 136, 0, False), False),
    "b_col_stride_not_16_bytes": (((130, 72), 72, 0, False), ((72, 136), 73, 0, True), False),
}
# (With TMA stages: the instantiations of kTma, and those that read A or B by residue, TmaMaps::a_by_residue and
# b_by_residue.)
TMA_KERNEL = re.compile(r"corrected_gemm_sm90_kernel<(true|false), (true|false), true, (true|false), (true|false), "
                        r"(true|false)>|corrected_gemm_sm90_kernel_[ab]_by_residue<")
TMA_COPIES_SWITCH = "TORCH_WMMAE_TMA_COPIES"


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("case", list(TMA_CASES))
def test_corrected_matmul_tma_stages(gen, monkeypatch, case):
    """TMA stages and cp.async stages give the same bits (same arithmetic, other copy engine), both correct. The
    kernel takes TMA in place exactly where the operands allow it; elsewhere, by default, it reads copies that TMA
    can read (tma_readable_copy: the same values, so the same bits) where the batch has at most one dimension,
    and with TORCH_WMMAE_TMA_COPIES=0 it copies its stages with cp.async instead."""
    (*a_layout, a_col), (*b_layout, b_col), eligible = TMA_CASES[case]
    a = _strided_matrix(gen, *a_layout, col_major=a_col)
    b = _strided_matrix(gen, *b_layout, col_major=b_col)
    assert (a.stride(-2) == 1) == a_col and (b.stride(-2) == 1) == b_col
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    outs, kernels = {}, {}
    for name, tma, copies in (("tma", "1", None), ("in_place", "1", "0"), ("cp_async", "0", None)):
        monkeypatch.setenv("TORCH_WMMAE_SM90_TMA", tma)
        if copies is None:
            monkeypatch.delenv(TMA_COPIES_SWITCH, raising=False)
        else:
            monkeypatch.setenv(TMA_COPIES_SWITCH, copies)
        with deterministic():  # no split-K: the sums are formed in one order
            kernels[name] = _launched_kernels(
                lambda: outs.setdefault(name, torch_wmmae.corrected_matmul(a, b, method="fp16")))
    assert torch.equal(outs["tma"], outs["cp_async"]) and torch.equal(outs["in_place"], outs["cp_async"])
    assert_matmul_within_dot_product_bound(outs["tma"], a.expand(*batch, *a.shape[-2:]),
                                           b.expand(*batch, *b.shape[-2:]), case)
    if _sees_sm90_kernels():
        read_by_tma = {name: any(TMA_KERNEL.search(k) for k in kernels[name]) for name in kernels}
        assert read_by_tma == {"tma": eligible or len(batch) <= 1, "in_place": eligible, "cp_async": False}, kernels
        if read_by_tma["tma"]:  # the instantiation of the operands' layouts (a copy keeps its operand's)
            a_row, b_row = str(not a_col).lower(), str(not b_col).lower()
            layout = f"corrected_gemm_sm90_kernel<{a_row}, {b_row}, true, "
            by_residue = f"_by_residue<{a_row}, {b_row}, "  # (A's or B's kernels: the layouts come first)
            assert any(layout in name or by_residue in name for name in kernels["tma"]), kernels["tma"]


TF32_KERNEL = re.compile(r"corrected_gemm_sm90_tf32_kernel<(true|false), (true|false), (true|false)>")
TF32_TMA_KERNEL = re.compile(r"corrected_gemm_sm90_tf32_kernel<(true|false), (true|false), true>|"
                             r"corrected_gemm_sm90_tf32_kernel_[ab]_by_residue<")
GEMM_KERNEL = re.compile(r"corrected_gemm_sm90(_tf32)?_kernel(_[ab]_by_residue)?<")


# Operands that TMA cannot read in place, which the tile GEMMs read from copies that it can (tma_readable_copy):
# (a, b) as (shape, line stride, storage offset, column-major), the method, and the product's GEMM: "folds" (K <=
# 128, few tiles: one kernel, tile_line_ranges_apply), "prepass" (a pre-pass first; K > 128) or "cp_async" (no
# copies: a batch of two dimensions, or an operand of at least 8 MiB that one line of output tiles reads,
# tma_copies_pay, except an operand whose batch entries share their lines' residues, which TMA reads by residue of its
# lines: operand_by_residue_applies). Odd K and N (lines of
# 33, 133, 301, 1001 and 8193 floats), storage offsets, column-major operands, a batch with an operand broadcast
# (copied once), and the tf32 method.
TMA_COPY_CASES = {
    "b_lines_odd": (((130, 72), 72, 0, False), ((72, 133), 133, 0, False), "fp16", "folds"),
    "a_lines_odd_k33": (((300, 33), 33, 0, False), ((33, 136), 136, 0, False), "auto", "folds"),
    "a_offset_batched": (((3, 130, 64), 64, 1, False), ((3, 64, 136), 136, 0, False), "fp16", "folds"),
    "a_col_offset_b_col_odd": (((130, 72), 132, 2, True), ((72, 136), 73, 0, True), "auto", "folds"),
    "b_broadcast_odd": (((4, 130, 72), 72, 0, False), ((72, 133), 133, 0, False), "fp16", "folds"),
    "both_odd_k1001": (((130, 1001), 1001, 0, False), ((1001, 133), 133, 0, False), "auto", "prepass"),
    "tf32_b_odd": (((130, 200), 200, 0, False), ((200, 133), 133, 0, False), "tf32", "prepass"),
    "two_batch_dims_odd": (((2, 1, 130, 72), 72, 0, False), ((3, 72, 133), 133, 0, False), "fp16", "cp_async"),
    "b_9mb_read_once_batched": (((2, 128, 301), 301, 0, False), ((2, 301, 8193), 8193, 0, False), "fp16",
                                "cp_async"),
    "b_9mb_read_once_by_residue": (((128, 300), 300, 0, False), ((300, 8193), 8193, 0, False), "fp16", "prepass"),
    "b_9mb_read_twice": (((129, 300), 300, 0, False), ((300, 8193), 8193, 0, False), "fp16", "prepass"),
    "a_9mb_read_once_by_residue": (((8193, 301), 301, 0, False), ((301, 128), 128, 0, False), "auto", "prepass"),
    "a_col_9mb_read_once_by_residue": (((8193, 301), 8193, 0, True), ((301, 128), 128, 0, False), "auto",
                                       "prepass"),
}


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("case", list(TMA_COPY_CASES))
def test_corrected_matmul_tma_copies(gen, monkeypatch, case):
    """Where TMA cannot read an operand in place, the tile GEMMs read a copy that it can (by default, unless that
    operand is large and read once; the same bits as with TORCH_WMMAE_TMA_COPIES=0, which copies the stages with
    cp.async), with TMA stages, and where K allows, folding the tiles' line ranges from them in one GEMM kernel; the
    inputs are left as they were."""
    (*a_layout, a_col), (*b_layout, b_col), method, path = TMA_COPY_CASES[case]
    a = _strided_matrix(gen, *a_layout, col_major=a_col)
    b = _strided_matrix(gen, *b_layout, col_major=b_col)
    a_before, b_before = a.clone(), b.clone()
    kernels = _same_bits_by_switch(monkeypatch, TMA_COPIES_SWITCH, ("default", "0"), a, b, method, case)
    assert torch.equal(a, a_before) and torch.equal(b, b_before)
    if _sees_sm90_kernels():
        reads = lambda names: [bool(TMA_KERNEL.search(k) or TF32_TMA_KERNEL.search(k)) for k in names
                               if GEMM_KERNEL.search(k)]
        assert reads(kernels["0"]) and not any(reads(kernels["0"])), kernels["0"]
        assert reads(kernels["default"]) and all(reads(kernels["default"])) == (path != "cp_async"), kernels
        ran = _own_kernels(kernels["default"])
        assert (len(ran) == 1) == (path == "folds"), ran
        assert any(PREPASS_KERNEL in k for k in ran) == (path != "folds"), ran


A_BY_RESIDUE_SWITCH = "TORCH_WMMAE_A_BY_RESIDUE"
# Batched operands whose batch stride is not a multiple of 4 floats: one call per residue class of the batch index,
# each by residue, wherever that reads every operand in place (by default only for large classes).
BY_CLASS = {"TORCH_WMMAE_BATCH_RESIDUE_CLASSES": "1"}
# (A by residue: the kernels named for it, and those of B by residue with kAResidues, their last argument.)
BY_RESIDUE_KERNEL = re.compile(r"corrected_gemm_sm90(_tf32)?_kernel_(a_by_residue<|b_by_residue<[^>]*true>)")
TF32_BY_RESIDUE_KERNEL = re.compile(r"corrected_gemm_sm90_tf32_kernel_(a_by_residue<|b_by_residue<[^>]*true>)")


class ByResidueCase(NamedTuple):
    a: tuple  # as in TMA_CASES: (shape, line stride, storage offset, column-major)
    b: tuple
    method: str
    by_residue: bool = True  # whether the operand under test is read by residue (else copied, as with its switch at 0)
    a_by_residue: bool = False  # (B_BY_RESIDUE_CASES) whether A is read by residue too (its lines unaligned as well)
    wide_row: bool = False  # A's row 5 spans 2^80 (auto: its tiles not fp16-safe: the tf32 GEMM or FMAs take them)
    folds: bool = False  # K <= 128: the tiles fold their own line ranges (no pre-pass kernel, no tf32 kernel)
    inf_row: bool = False  # A's row 7 holds an Inf
    inf_col: bool = False  # B's column 9 holds a -Inf
    env: dict = {}  # further switches (never mutated)
    deterministic: bool = True  # deterministic mode: no split-K or stream-K, whose atomics add into the output
    atomics_in_any_order: bool = False  # more than two atomics add into an output: the bits may differ


def _by_residue_calls(gen, monkeypatch, c: ByResidueCase, switch: str, what: str) -> dict:
    """The case's operands (with its wide row and Infs) through _same_bits_by_switch at `switch` unset and 0, with the
    small GEMM off (the tile GEMMs, which small calls would otherwise not reach) and the case's switches; the operands
    are left as they were. The names of the kernels each call launched."""
    a = _strided_matrix(gen, *c.a[:-1], col_major=c.a[-1])
    b = _strided_matrix(gen, *c.b[:-1], col_major=c.b[-1])
    if c.wide_row:
        a[..., 5, ::2] *= 2.0 ** -40
        a[..., 5, 1::2] *= 2.0 ** 40
    if c.inf_row:
        a[7, a.shape[1] // 2] = float("inf")
    if c.inf_col:
        b[b.shape[0] // 2, 9] = float("-inf")
    a_before, b_before = a.clone(), b.clone()
    monkeypatch.setenv(SMALL_GEMM_SWITCH, "0")
    for name, value in c.env.items():
        monkeypatch.setenv(name, value)
    kernels = _same_bits_by_switch(monkeypatch, switch, ("default", "0"), a, b, c.method, what,
                                   deterministic_mode=c.deterministic, exact=not c.atomics_in_any_order,
                                   inf_rows=(7,) if c.inf_row else (), inf_cols=(9,) if c.inf_col else ())
    assert torch.equal(a, a_before) and torch.equal(b, b_before)
    return kernels


# Row-major A whose rows TMA cannot read as one map (an odd K, a storage offset, a row stride of 75 floats), which the
# tile GEMMs read by residue of its rows instead of copying it: every residue of K and of the offset; K <= 128 (the
# tiles fold their own line ranges, and auto's tiles that are not fp16-safe are FMAs from the stages) and longer (the
# pre-pass); M = 4 and 5 (residues of one or two rows), M = 3 (too few rows: copied); tile rows past M; B aligned,
# column-major with odd K (copied: x @ W^T), or of odd width (copied, and the output staged); chunks of 1024 read
# back; split-K and stream-K; an Inf; the tf32 method and auto's tf32 tiles. Column-major A (the a.t() of a backward
# pass) whose columns TMA cannot read as one map, by residue of its k: the same kinds of cases ("a_col_"), with M = 1
# and every residue of M and of the offset, K = 4 (one k of each residue) and K = 3 (copied). Batched: A's batch stride
# a multiple of 4 floats (every entry's rows at the same residues: by residue, with B batched or broadcast, folding
# or not: copied where the residue classes of the batch index would be small (the default here), else one call per
# class, each by residue (TORCH_WMMAE_BATCH_RESIDUE_CLASSES=1: 2, 3 and 5 entries, column-major too, auto's tf32 tiles,
# and split-K, which zeroes a class's entries 4 apart; with M = 3, too few rows, copied).
BY_RESIDUE_CASES = {
    "k33_folds_auto": ByResidueCase(((300, 33), 33, 0, False), ((33, 136), 136, 0, False), "auto", folds=True),
    "k127_offset_1_folds_fp16": ByResidueCase(((257, 127), 127, 1, False), ((127, 200), 200, 0, False), "fp16",
                                              folds=True),
    "k65_folds_auto_fma_tiles": ByResidueCase(((300, 65), 65, 0, False), ((65, 136), 136, 0, False), "auto",
                                              wide_row=True, folds=True),
    "k1001_fp16_inf": ByResidueCase(((130, 1001), 1001, 0, False), ((1001, 136), 136, 0, False), "fp16",
                                    inf_row=True),
    "k1002_b_col_auto": ByResidueCase(((257, 1002), 1002, 0, False), ((1002, 200), 1002, 0, True), "auto"),
    "k1003_tf32": ByResidueCase(((130, 1003), 1003, 0, False), ((1003, 136), 136, 0, False), "tf32"),
    "k1003_auto_inf": ByResidueCase(((130, 1003), 1003, 0, False), ((1003, 136), 136, 0, False), "auto",
                                    inf_row=True),
    "offset_1": ByResidueCase(((300, 64), 64, 1, False), ((64, 200), 200, 0, False), "fp16", folds=True),
    "offset_2_stride_75": ByResidueCase(((257, 72), 75, 2, False), ((72, 136), 136, 0, False), "auto", folds=True),
    "offset_3_k301": ByResidueCase(((130, 301), 301, 3, False), ((301, 136), 136, 0, False), "auto"),
    "m4": ByResidueCase(((4, 1001), 1001, 0, False), ((1001, 136), 136, 0, False), "fp16"),
    "m5_odd_width": ByResidueCase(((5, 1001), 1001, 0, False), ((1001, 133), 133, 0, False), "fp16"),
    "m3_copied": ByResidueCase(((3, 1001), 1001, 0, False), ((1001, 136), 136, 0, False), "fp16", by_residue=False),
    "x_at_w_t_odd_width": ByResidueCase(((200, 333), 333, 0, False), ((333, 131), 333, 0, True), "auto"),
    "chunks_read_back": ByResidueCase(((300, 2101), 2101, 0, False), ((2101, 136), 136, 0, False), "fp16"),
    "chunks_read_back_odd_width": ByResidueCase(((130, 2101), 2101, 0, False), ((2101, 133), 133, 0, False), "fp16"),
    "wide_row_auto_tf32_tiles": ByResidueCase(((300, 1001), 1001, 0, False), ((1001, 136), 136, 0, False), "auto",
                                              wide_row=True),
    "split_k": ByResidueCase(((130, 4101), 4101, 0, False), ((4101, 136), 136, 0, False), "fp16",
                             deterministic=False, atomics_in_any_order=True),
    "stream_k": ByResidueCase(((200, 3001), 3001, 0, False), ((3001, 301), 301, 0, False), "fp16",
                              env={"TORCH_WMMAE_STREAM_K": "1"}, deterministic=False, atomics_in_any_order=True),
    "a_col_m301_folds_auto": ByResidueCase(((301, 64), 301, 0, True), ((64, 136), 136, 0, False), "auto", folds=True),
    "a_col_offset_1_folds_fp16": ByResidueCase(((257, 100), 260, 1, True), ((100, 200), 200, 0, False), "fp16",
                                               folds=True),
    "a_col_folds_auto_fma_tiles": ByResidueCase(((300, 65), 303, 0, True), ((65, 136), 136, 0, False), "auto",
                                                wide_row=True, folds=True),
    "a_col_k1001_fp16_inf": ByResidueCase(((130, 1001), 131, 0, True), ((1001, 136), 136, 0, False), "fp16",
                                          inf_row=True),
    "a_col_tf32": ByResidueCase(((130, 1003), 133, 0, True), ((1003, 136), 136, 0, False), "tf32"),
    "a_col_offset_2_auto_inf": ByResidueCase(((130, 1003), 130, 2, True), ((1003, 136), 136, 0, False), "auto",
                                             inf_row=True),
    "a_col_offset_3_b_col": ByResidueCase(((257, 300), 257, 3, True), ((300, 200), 300, 0, True), "auto"),
    "a_col_m1": ByResidueCase(((1, 1001), 3, 0, True), ((1001, 136), 136, 0, False), "fp16"),
    "a_col_k4": ByResidueCase(((301, 4), 301, 0, True), ((4, 136), 136, 0, False), "fp16", folds=True),
    "a_col_k3_copied": ByResidueCase(((301, 3), 301, 0, True), ((3, 136), 136, 0, False), "fp16", by_residue=False,
                                     folds=True),
    "a_col_odd_width": ByResidueCase(((130, 1001), 131, 0, True), ((1001, 133), 133, 0, False), "auto"),
    "a_col_chunks_read_back": ByResidueCase(((300, 2101), 301, 0, True), ((2101, 136), 136, 0, False), "fp16"),
    "a_col_wide_row_auto_tf32_tiles": ByResidueCase(((300, 1001), 301, 0, True), ((1001, 136), 136, 0, False), "auto",
                                                    wide_row=True),
    "a_col_split_k": ByResidueCase(((130, 4101), 131, 0, True), ((4101, 136), 136, 0, False), "fp16",
                                   deterministic=False, atomics_in_any_order=True),
    "a_col_stream_k": ByResidueCase(((200, 3001), 201, 0, True), ((3001, 301), 301, 0, False), "fp16",
                                    env={"TORCH_WMMAE_STREAM_K": "1"}, deterministic=False, atomics_in_any_order=True),
    "batched_k1001_fp16": ByResidueCase(((2, 300, 1001), 1001, 0, False), ((2, 1001, 136), 136, 0, False), "fp16"),
    "batched_broadcast_b_auto_tf32_tiles": ByResidueCase(((2, 300, 1001), 1001, 0, False), ((1001, 136), 136, 0, False),
                                                         "auto", wide_row=True),
    "batched_offset_1_folds": ByResidueCase(((3, 128, 64), 64, 1, False), ((3, 64, 128), 128, 0, False), "auto",
                                            folds=True),
    "batched_stride_odd_copied": ByResidueCase(((2, 301, 1001), 1001, 0, False), ((2, 1001, 136), 136, 0, False),
                                               "fp16", by_residue=False),
    "batched_stride_odd_by_class": ByResidueCase(((2, 301, 1001), 1001, 0, False), ((2, 1001, 136), 136, 0, False),
                                                 "fp16", env=BY_CLASS),
    "batched_5_stride_odd_broadcast_b_auto_tf32_tiles": ByResidueCase(((5, 301, 1001), 1001, 0, False),
                                                                      ((1001, 136), 136, 0, False), "auto",
                                                                      wide_row=True, env=BY_CLASS),
    "batched_5_stride_odd_split_k": ByResidueCase(((5, 130, 4101), 4101, 0, False), ((5, 4101, 136), 136, 0, False),
                                                  "fp16", env=BY_CLASS, deterministic=False,
                                                  atomics_in_any_order=True),
    "batched_stride_odd_m3_copied": ByResidueCase(((2, 3, 1001), 1001, 0, False), ((2, 1001, 136), 136, 0, False),
                                                  "fp16", by_residue=False, env=BY_CLASS),
    "a_col_batched": ByResidueCase(((2, 300, 1000), 301, 0, True), ((2, 1000, 136), 136, 0, False), "fp16"),
    "a_col_batched_3_stride_odd": ByResidueCase(((3, 301, 1001), 301, 0, True), ((3, 1001, 136), 136, 0, False),
                                                "auto", env=BY_CLASS),
}


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("case", list(BY_RESIDUE_CASES))
def test_corrected_matmul_a_by_residue(gen, monkeypatch, case):
    """Where the tile GEMMs would copy an A that TMA cannot read as one map, they read it in place by residue of its
    lines (four maps, TmaMaps::a_by_residue: rows where A is row-major, k where column-major): the same bits as the
    copy (TORCH_WMMAE_A_BY_RESIDUE=0), within the float32 bound, every output written (the pool is NaN-poisoned), A
    left as it was; the by-residue kernels run exactly where they should."""
    c = BY_RESIDUE_CASES[case]
    kernels = _by_residue_calls(gen, monkeypatch, c, A_BY_RESIDUE_SWITCH, case)
    if _sees_sm90_kernels():
        ran, copied = _own_kernels(kernels["default"]), _own_kernels(kernels["0"])
        assert any(GEMM_KERNEL.search(k) for k in ran) and any(GEMM_KERNEL.search(k) for k in copied), (ran, copied)
        assert any(BY_RESIDUE_KERNEL.search(k) for k in ran) == c.by_residue, ran
        # (auto's tf32 GEMM runs after the fp16 one, and returns at once where every tile was fp16-safe)
        tf32_gemm = c.by_residue and c.method != "fp16" and not c.folds
        assert any(TF32_BY_RESIDUE_KERNEL.search(k) for k in ran) == tf32_gemm, ran
        assert not any(BY_RESIDUE_KERNEL.search(k) for k in copied), copied
        assert all(TMA_KERNEL.search(k) or TF32_TMA_KERNEL.search(k) for k in copied if GEMM_KERNEL.search(k)), copied
        assert any(PREPASS_KERNEL in k for k in ran) == (not c.folds), ran


B_BY_RESIDUE_SWITCH = "TORCH_WMMAE_B_BY_RESIDUE"
# (B by residue: its kernels' arguments are A row-major, B row-major, for fp16 read-back and odd width, and A by
# residue.)
B_BY_RESIDUE_KERNEL = re.compile(r"corrected_gemm_sm90(_tf32)?_kernel_b_by_residue<(true|false), (true|false), "
                                 r"(?:(?:true|false), ){0,2}(true|false)>")
TF32_B_BY_RESIDUE_KERNEL = re.compile(r"corrected_gemm_sm90_tf32_kernel_b_by_residue<")


# Column-major B (the W.t() of x @ W.t(), or a view with a storage offset) whose columns TMA cannot read as one map,
# which the tile GEMMs read by residue of its columns instead of copying it: every residue of the column stride and of
# the offset; K <= 128 (the tiles fold their own line ranges, with an Inf in B: the fold's exact pass at a shift; auto's
# tiles that are not fp16-safe are FMAs from the stages) and longer (the pre-pass); N = 4 and 5 (residues of one or two
# columns), N = 3 (too few columns: copied); A aligned (row- or column-major) or by residue itself (rows, or k where
# column-major); odd widths; chunks of 1024 read back; split-K and stream-K; an Inf in A and in B; the tf32 method and
# auto's tf32 tiles; a B of 9 MiB read once (M <= 128), which without residues keeps cp.async stages. Row-major B (the W
# of grad @ W, the x of grad.t() @ x) whose rows TMA cannot read as one map (an odd width, a row stride that is not a
# multiple of 4, a storage offset), by residue of its k: the same kinds of cases ("b_row_"), with K = 4 (one k of each
# residue) and K = 3 (copied), and an even width of unaligned rows. Batched, in either layout, with a batch stride of a
# multiple of 4 floats (by residue, A too) or not (copied where the residue classes of the batch index would be small,
# the default here, else one call per class, each by residue, A too: TORCH_WMMAE_BATCH_RESIDUE_CLASSES=1).
B_BY_RESIDUE_CASES = {
    "k33_folds_auto": ByResidueCase(((300, 33), 36, 0, False), ((33, 136), 33, 0, True), "auto", folds=True),
    "k127_offset_1_folds_fp16": ByResidueCase(((257, 127), 128, 0, False), ((127, 200), 128, 1, True), "fp16",
                                              folds=True),
    "k65_folds_auto_fma_tiles": ByResidueCase(((300, 65), 68, 0, False), ((65, 136), 65, 0, True), "auto",
                                              wide_row=True, folds=True),
    "k65_folds_auto_inf_in_b": ByResidueCase(((300, 65), 68, 0, False), ((65, 136), 65, 0, True), "auto",
                                             inf_col=True, folds=True),
    "k1001_fp16_inf_in_b": ByResidueCase(((130, 1001), 1004, 0, False), ((1001, 136), 1001, 0, True), "fp16",
                                         inf_col=True),
    "k1002_auto": ByResidueCase(((257, 1002), 1004, 0, False), ((1002, 200), 1002, 0, True), "auto"),
    "k1003_tf32": ByResidueCase(((130, 1003), 1004, 0, False), ((1003, 136), 1003, 0, True), "tf32"),
    "k1003_auto_inf_in_a": ByResidueCase(((130, 1003), 1004, 0, False), ((1003, 136), 1003, 0, True), "auto",
                                         inf_row=True),
    "offset_2_stride_75_folds": ByResidueCase(((257, 72), 72, 0, False), ((72, 136), 75, 2, True), "auto",
                                              folds=True),
    "offset_3_k301": ByResidueCase(((130, 301), 304, 0, False), ((301, 136), 304, 3, True), "auto"),
    "n4": ByResidueCase(((130, 1001), 1004, 0, False), ((1001, 4), 1001, 0, True), "fp16"),
    "n5_odd_width": ByResidueCase(((130, 1001), 1004, 0, False), ((1001, 5), 1001, 0, True), "fp16"),
    "n3_copied": ByResidueCase(((130, 1001), 1004, 0, False), ((1001, 3), 1001, 0, True), "fp16", by_residue=False),
    "x_at_w_t_odd_k_and_width": ByResidueCase(((200, 333), 333, 0, False), ((333, 131), 333, 0, True), "auto",
                                              a_by_residue=True),
    "x_at_w_t_odd_k_folds": ByResidueCase(((300, 101), 101, 0, False), ((101, 136), 101, 0, True), "auto",
                                          a_by_residue=True, folds=True),
    "a_col_by_residue_k1001": ByResidueCase(((130, 1001), 131, 0, True), ((1001, 136), 1001, 0, True), "fp16",
                                            a_by_residue=True),
    "a_col_by_residue_tf32": ByResidueCase(((130, 1001), 131, 0, True), ((1001, 136), 1001, 0, True), "tf32",
                                           a_by_residue=True),
    "a_col_aligned_auto": ByResidueCase(((130, 1001), 132, 0, True), ((1001, 136), 1001, 0, True), "auto"),
    "chunks_read_back": ByResidueCase(((300, 2101), 2104, 0, False), ((2101, 136), 2101, 0, True), "fp16"),
    "chunks_read_back_odd_width": ByResidueCase(((130, 2101), 2104, 0, False), ((2101, 133), 2101, 0, True),
                                                "fp16"),
    "wide_row_auto_tf32_tiles": ByResidueCase(((300, 1001), 1004, 0, False), ((1001, 136), 1001, 0, True), "auto",
                                              wide_row=True),
    "split_k": ByResidueCase(((130, 4101), 4104, 0, False), ((4101, 136), 4101, 0, True), "fp16",
                             deterministic=False, atomics_in_any_order=True),
    "stream_k": ByResidueCase(((200, 3001), 3004, 0, False), ((3001, 301), 3001, 0, True), "fp16",
                              env={"TORCH_WMMAE_STREAM_K": "1"}, deterministic=False, atomics_in_any_order=True),
    "read_once_9mb": ByResidueCase(((128, 4097), 4100, 0, False), ((4097, 600), 4097, 0, True), "auto"),
    "b_row_n133_folds_auto": ByResidueCase(((300, 64), 64, 0, False), ((64, 133), 133, 0, False), "auto", folds=True),
    "b_row_offset_1_folds_fp16": ByResidueCase(((257, 127), 128, 0, False), ((127, 200), 200, 1, False), "fp16",
                                               folds=True),
    "b_row_folds_auto_fma_tiles": ByResidueCase(((300, 65), 68, 0, False), ((65, 137), 137, 0, False), "auto",
                                                wide_row=True, folds=True),
    "b_row_folds_auto_inf_in_b": ByResidueCase(((300, 65), 68, 0, False), ((65, 137), 137, 0, False), "auto",
                                               inf_col=True, folds=True),
    "b_row_k1001_fp16_inf_in_b": ByResidueCase(((130, 1001), 1004, 0, False), ((1001, 133), 133, 0, False), "fp16",
                                               inf_col=True),
    "b_row_k1002_auto": ByResidueCase(((257, 1002), 1004, 0, False), ((1002, 201), 201, 0, False), "auto"),
    "b_row_tf32": ByResidueCase(((130, 1003), 1004, 0, False), ((1003, 135), 135, 0, False), "tf32"),
    "b_row_auto_inf_in_a": ByResidueCase(((130, 1003), 1004, 0, False), ((1003, 135), 135, 0, False), "auto",
                                         inf_row=True),
    "b_row_offset_2_stride_75_folds": ByResidueCase(((257, 72), 72, 0, False), ((72, 70), 75, 2, False), "auto",
                                                    folds=True),
    "b_row_offset_3_even_width": ByResidueCase(((130, 301), 304, 0, False), ((301, 136), 138, 3, False), "auto"),
    "b_row_k4": ByResidueCase(((301, 4), 4, 0, False), ((4, 133), 133, 0, False), "fp16", folds=True),
    "b_row_k3_copied": ByResidueCase(((301, 3), 4, 0, False), ((3, 133), 133, 0, False), "fp16", by_residue=False,
                                     folds=True),
    "b_row_n5": ByResidueCase(((130, 1001), 1004, 0, False), ((1001, 5), 5, 0, False), "fp16"),
    "b_row_a_by_residue": ByResidueCase(((200, 333), 333, 0, False), ((333, 131), 131, 0, False), "auto",
                                        a_by_residue=True),
    "b_row_a_by_residue_folds": ByResidueCase(((300, 101), 101, 0, False), ((101, 133), 133, 0, False), "auto",
                                              a_by_residue=True, folds=True),
    "b_row_a_col_by_residue": ByResidueCase(((130, 1001), 131, 0, True), ((1001, 133), 133, 0, False), "fp16",
                                            a_by_residue=True),
    "b_row_a_col_by_residue_tf32": ByResidueCase(((130, 1001), 131, 0, True), ((1001, 133), 133, 0, False), "tf32",
                                                 a_by_residue=True),
    "b_row_a_col_aligned_auto": ByResidueCase(((130, 1001), 132, 0, True), ((1001, 133), 133, 0, False), "auto"),
    "b_row_chunks_read_back": ByResidueCase(((300, 2101), 2104, 0, False), ((2101, 136), 138, 0, False), "fp16"),
    "b_row_chunks_read_back_odd_width": ByResidueCase(((130, 2101), 2104, 0, False), ((2101, 133), 133, 0, False),
                                                      "fp16"),
    "b_row_wide_row_auto_tf32_tiles": ByResidueCase(((300, 1001), 1004, 0, False), ((1001, 133), 133, 0, False),
                                                    "auto", wide_row=True),
    "b_row_split_k": ByResidueCase(((130, 4101), 4104, 0, False), ((4101, 133), 133, 0, False), "fp16",
                                   deterministic=False, atomics_in_any_order=True),
    "b_row_stream_k": ByResidueCase(((200, 3001), 3004, 0, False), ((3001, 301), 301, 0, False), "fp16",
                                    env={"TORCH_WMMAE_STREAM_K": "1"}, deterministic=False, atomics_in_any_order=True),
    "b_row_read_once_9mb": ByResidueCase(((128, 4097), 4100, 0, False), ((4097, 601), 601, 0, False), "auto"),
    "b_row_batched": ByResidueCase(((2, 130, 1000), 1000, 0, False), ((2, 1000, 133), 133, 0, False), "fp16"),
    "b_row_batched_auto_tf32_tiles": ByResidueCase(((2, 300, 1000), 1000, 0, False), ((2, 1000, 133), 133, 0, False),
                                                   "auto", wide_row=True),
    "b_row_batched_stride_odd_copied": ByResidueCase(((2, 130, 1001), 1004, 0, False), ((2, 1001, 133), 133, 0, False),
                                                     "fp16", by_residue=False),
    "b_row_batched_stride_odd_by_class": ByResidueCase(((2, 130, 1001), 1004, 0, False),
                                                       ((2, 1001, 133), 133, 0, False), "fp16", env=BY_CLASS),
    "b_col_batched_3_stride_odd": ByResidueCase(((3, 130, 1001), 1004, 0, False), ((3, 1001, 137), 1001, 0, True),
                                                "auto", env=BY_CLASS),
    "b_col_batched": ByResidueCase(((2, 130, 1001), 1004, 0, False), ((2, 1001, 136), 1001, 0, True), "auto"),
    "both_batched_by_residue": ByResidueCase(((2, 300, 333), 333, 0, False), ((2, 333, 136), 333, 0, True), "auto",
                                             a_by_residue=True),
    "both_batched_6_stride_odd": ByResidueCase(((6, 301, 333), 333, 0, False), ((6, 333, 137), 333, 0, True), "auto",
                                               a_by_residue=True, env=BY_CLASS),
}


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("case", list(B_BY_RESIDUE_CASES))
def test_corrected_matmul_b_by_residue(gen, monkeypatch, case):
    """Where the tile GEMMs would copy a B that TMA cannot read as one map (or, read once, copy its stages with
    cp.async), they read it in place by residue of its lines (four maps, TmaMaps::b_by_residue: columns where B is
    column-major, k where row-major): the same bits as with TORCH_WMMAE_B_BY_RESIDUE=0, within the float32 bound, every
    output written (the pool is NaN-poisoned), B left as it was; the by-residue kernels run exactly where they should,
    in B's layout, with A by residue where its lines need it."""
    c = B_BY_RESIDUE_CASES[case]
    kernels = _by_residue_calls(gen, monkeypatch, c, B_BY_RESIDUE_SWITCH, case)
    if _sees_sm90_kernels():
        ran, copied = _own_kernels(kernels["default"]), _own_kernels(kernels["0"])
        assert any(GEMM_KERNEL.search(k) for k in ran) and any(GEMM_KERNEL.search(k) for k in copied), (ran, copied)
        by_residue = [m for m in map(B_BY_RESIDUE_KERNEL.search, ran) if m]
        assert bool(by_residue) == c.by_residue, ran
        assert all(m.groups()[1:] == (str(not c.a[-1]).lower(), str(not c.b[-1]).lower(), str(c.a_by_residue).lower())
                   for m in by_residue), ran
        # (auto's tf32 GEMM runs after the fp16 one, and returns at once where every tile was fp16-safe)
        tf32_gemm = c.by_residue and c.method != "fp16" and not c.folds
        assert any(TF32_B_BY_RESIDUE_KERNEL.search(k) for k in ran) == tf32_gemm, ran
        assert not any(B_BY_RESIDUE_KERNEL.search(k) for k in copied), copied
        assert any(PREPASS_KERNEL in k for k in ran) == (not c.folds), ran


STAGED_FLUSH_SWITCH = "TORCH_WMMAE_STAGED_FLUSH"
# The wgmma fp16 GEMM's odd-width instantiations (kOddWidth: the last template argument; kReadBack, the one before
# the resident pre-pass's, plain or reading back), which stage their rows.
# (And those that read A or B by residue: A row-major, B row-major, kReadBack, kOddWidth, and for B then A by residue.)
ODD_WIDTH_KERNEL = re.compile(r"corrected_gemm_sm90_kernel_[ab]_by_residue<(true|false), (true|false), (true|false), "
                              r"true[,>]|"
                              r"corrected_gemm_sm90_kernel<(true|false), (true|false), true, (true|false), false, "
                              r"true>")
ODD_WIDTH_READ_BACK_KERNEL = re.compile(r"corrected_gemm_sm90_kernel_[ab]_by_residue<(true|false), (true|false), true, "
                                        r"true[,>]|"
                                        r"corrected_gemm_sm90_kernel<(true|false), (true|false), true, true, false, "
                                        r"true>")


class StagedFlushCase(NamedTuple):
    a: tuple  # as in TMA_CASES: (shape, row stride, storage offset, column-major)
    b: tuple
    method: str
    odd_width_kernel: bool  # whether an odd-width instantiation runs
    read_back: bool = False  # whether a read-back instantiation runs (several chunks of K, no atomics)
    row_scale: float = 1.0  # A's row 5 times this (2^70: its tiles' shifts leave the flush's fast path)
    env: dict = {}  # further switches (never mutated)
    deterministic: bool = True  # deterministic mode: no split-K or stream-K, whose atomics add into the output
    atomics_in_any_order: bool = False  # (not deterministic) more than two add into an output: bits may differ


# The output's width is odd in all but one, so that its rows are not 8-byte aligned. Outputs below 2^22 elements sum
# K in chunks of 1024 (32 stages), larger ones in chunks of 4096: one chunk up to there; several make a read-back
# instantiation run (K = 2100: 32 + 32 + 2 stages, the odd-width one; 4100: 128 + 1, the plain one, which chunks of
# 4096 keep: staged_flush_applies), or with TORCH_WMMAE_READ_BACK=0 the plain odd-width one read back element by
# element. Outside deterministic mode split-K adds each split's chunks into the output by atomics, and stream-K each
# share's (shares of about 62 stages: across a chunk boundary, where the flush waits at a block barrier before it
# stages: the other warpgroup's products may still read the buffer). The tf32 method has no odd-width instantiation.
STAGED_FLUSH_CASES = {
    "edge_tiles": StagedFlushCase(((130, 72), 72, 0, False), ((72, 133), 133, 0, False), "fp16", True),
    "whole_row_tiles": StagedFlushCase(((256, 72), 72, 0, False), ((72, 385), 385, 0, False), "fp16", True),
    "batched": StagedFlushCase(((3, 130, 64), 64, 0, False), ((3, 64, 257), 257, 0, False), "fp16", True),
    "a_col_auto": StagedFlushCase(((300, 200), 300, 0, True), ((200, 131), 131, 0, False), "auto", True),
    "b_col_k1001_auto": StagedFlushCase(((130, 1001), 1001, 0, False), ((1001, 133), 1004, 0, True), "auto", True),
    "both_col": StagedFlushCase(((300, 72), 300, 0, True), ((72, 131), 72, 0, True), "fp16", True),
    "tf32": StagedFlushCase(((130, 200), 200, 0, False), ((200, 133), 133, 0, False), "tf32", False),
    "width_1": StagedFlushCase(((300, 72), 72, 0, False), ((72, 1), 1, 0, False), "fp16", True),
    "row_scaled_2e70": StagedFlushCase(((130, 72), 72, 0, False), ((72, 133), 133, 0, False), "fp16", True,
                                       row_scale=2.0 ** 70),
    "even_width": StagedFlushCase(((130, 72), 72, 0, False), ((72, 134), 134, 0, False), "fp16", False),
    # several chunks, read back
    "chunks_of_1024": StagedFlushCase(((130, 2100), 2100, 0, False), ((2100, 133), 133, 0, False), "fp16", True,
                                      read_back=True),
    "chunks_of_1024_b_col_auto": StagedFlushCase(((300, 2100), 2100, 0, False), ((2100, 131), 2100, 0, True), "auto",
                                                 True, read_back=True),
    "chunks_batched_row_scaled": StagedFlushCase(((2, 130, 1100), 1100, 0, False), ((2, 1100, 131), 131, 0, False),
                                                 "fp16", True, read_back=True, row_scale=2.0 ** 70),
    # (B column-major, so that TMA reads both in place: the 16 MiB output and no copy fit the pool's large segment)
    "chunks_of_4096_tail_of_one_stage": StagedFlushCase(((2049, 4100), 4100, 0, False), ((4100, 2049), 4100, 0, True),
                                                        "fp16", False, read_back=True),
    "chunks_without_read_back": StagedFlushCase(((130, 2100), 2100, 0, False), ((2100, 133), 133, 0, False), "fp16",
                                                True, env={"TORCH_WMMAE_READ_BACK": "0"}),
    "chunks_tf32": StagedFlushCase(((130, 2100), 2100, 0, False), ((2100, 133), 133, 0, False), "tf32", False),
    # atomics
    "split_k_two_splits": StagedFlushCase(((256, 512), 512, 0, False), ((512, 1025), 1025, 0, False), "fp16", True,
                                          deterministic=False),
    "split_k": StagedFlushCase(((130, 4100), 4100, 0, False), ((4100, 133), 133, 0, False), "fp16", True,
                               deterministic=False, atomics_in_any_order=True),
    "split_k_auto_a_col": StagedFlushCase(((130, 4100), 130, 0, True), ((4100, 133), 133, 0, False), "auto", True,
                                          deterministic=False, atomics_in_any_order=True),
    "stream_k_across_chunks": StagedFlushCase(((200, 3000), 3000, 0, False), ((3000, 301), 301, 0, False), "fp16",
                                              True, env={"TORCH_WMMAE_STREAM_K": "1"}, deterministic=False,
                                              atomics_in_any_order=True),
}


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("case", list(STAGED_FLUSH_CASES))
def test_corrected_matmul_staged_flush(gen, monkeypatch, case):
    """Where the output's width is odd, the wgmma GEMM's odd-width instantiations stage its rows, which are not 8-byte
    aligned, through shared memory (by default); TORCH_WMMAE_STAGED_FLUSH=0 runs the plain ones, which store them
    element by element: the same bits (where at most two atomics add into an output), within the float32 bound, with
    every output written (the pool is NaN-poisoned), on edge and whole tiles, batched, in every layout, with a width
    of 1, beside tiles whose shifts leave the fast path; for a piece's only chunk, chunks of 1024 read back, and
    atomics (split-K, stream-K across chunk boundaries); and the other instantiations where the method is tf32 or
    chunks of 4096 are read back."""
    c = STAGED_FLUSH_CASES[case]
    a = _strided_matrix(gen, *c.a[:-1], col_major=c.a[-1])
    a[..., 5, :] *= c.row_scale
    b = _strided_matrix(gen, *c.b[:-1], col_major=c.b[-1])
    monkeypatch.setenv(SMALL_GEMM_SWITCH, "0")  # (the tile GEMMs, which odd widths would otherwise not reach)
    for name, value in c.env.items():
        monkeypatch.setenv(name, value)
    if not c.deterministic and not c.atomics_in_any_order:  # two atomics add onto zero in either order to the same bits
        assert device_gemm_grid(a.shape[-2], b.shape[-1], a.shape[-1])[1] <= 2
    kernels = _same_bits_by_switch(monkeypatch, STAGED_FLUSH_SWITCH, ("default", "0"), a, b, c.method, case,
                                   deterministic_mode=c.deterministic, exact=not c.atomics_in_any_order)
    if _sees_sm90_kernels():
        ran, plain = _own_kernels(kernels["default"]), _own_kernels(kernels["0"])
        assert any(GEMM_KERNEL.search(k) for k in ran) and not any(SMALL_GEMM_KERNEL in k for k in ran), ran
        assert any(ODD_WIDTH_KERNEL.search(k) for k in ran) == c.odd_width_kernel, ran
        assert any(ODD_WIDTH_READ_BACK_KERNEL.search(k) for k in ran) == (c.odd_width_kernel and c.read_back), ran
        assert any(READ_BACK_KERNEL.search(k) for k in ran) == c.read_back, ran
        assert not any(ODD_WIDTH_KERNEL.search(k) for k in plain), plain
        assert any(READ_BACK_KERNEL.search(k) for k in plain) == c.read_back, plain


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("a_col", [False, True], ids=["a_row", "a_col"])
@pytest.mark.parametrize("b_col", [False, True], ids=["b_row", "b_col"])
def test_tf32_method_on_the_wgmma_kernel(gen, monkeypatch, a_col, b_col):
    """On H100/H200 the tf32 method (and auto's tiles that are not fp16-safe) runs the wgmma kernel with tf32
    products: with TMA or cp.async stages (the same bits), in every layout, on partial tiles with K = 1000 (not
    a multiple of 32), within the dot-product bound; the portable WMMA kernel too. Auto with a row of A whose
    exponents span 2^60 sends that row's tiles to it, and only those: the other tiles keep the fp16 bits."""
    if not runs_sm90_gemm():
        pytest.skip("needs the sm_90a GEMM kernels (H100/H200)")
    a = random_tensor_in_layout((200, 1000), a_col, gen, "cuda")
    b = random_tensor_in_layout((1000, 152), b_col, gen, "cuda")  # (rows of 608 bytes: TMA reads them)
    outs, kernels = {}, {}
    for name, env in (("tma", {"TORCH_WMMAE_SM90_TMA": "1"}), ("cp_async", {"TORCH_WMMAE_SM90_TMA": "0"}),
                      ("portable", {"TORCH_WMMAE_PORTABLE_GEMM": "1"})):
        for key in ("TORCH_WMMAE_SM90_TMA", "TORCH_WMMAE_PORTABLE_GEMM"):
            monkeypatch.delenv(key, raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        with deterministic():  # no split-K: one order of the sums
            kernels[name] = _launched_kernels(
                lambda: outs.setdefault(name, torch_wmmae.corrected_matmul(a, b, method="tf32")))
        assert_matmul_within_dot_product_bound(outs[name], a, b, name)
    assert torch.equal(outs["tma"], outs["cp_async"])
    if _sees_sm90_kernels():
        tf32_tma = [TF32_KERNEL.search(k) for k in kernels["tma"] if TF32_KERNEL.search(k)]
        assert [m.group(3) for m in tf32_tma] == ["true"], kernels["tma"]
        assert [m.group(1, 2) for m in tf32_tma] == [(str(not a_col).lower(), str(not b_col).lower())]
        assert any(TF32_KERNEL.search(k) and "false>" in k for k in kernels["cp_async"]), kernels["cp_async"]
        assert not any(TF32_KERNEL.search(k) for k in kernels["portable"]), kernels["portable"]

    for key in ("TORCH_WMMAE_SM90_TMA", "TORCH_WMMAE_PORTABLE_GEMM"):
        monkeypatch.delenv(key, raising=False)
    wide = a.clone()
    wide[3, 7] *= 2.0**60  # row 3's exponents now span about 2^60: its tiles (the first row of tiles) go to tf32
    with deterministic():
        ran = _launched_kernels(lambda: outs.setdefault("auto", torch_wmmae.corrected_matmul(wide, b)))
        fp16 = torch_wmmae.corrected_matmul(wide, b, method="fp16")
    if _sees_sm90_kernels():
        assert any(TF32_KERNEL.search(k) for k in ran), ran
    assert_matmul_within_dot_product_bound(outs["auto"], wide, b, "auto")
    assert torch.equal(outs["auto"][128:], fp16[128:])  # the second row of tiles is fp16-safe


# The pre-pass beside the GEMM (resident_prepass_sm90.cuh), which batched calls take where TMA reads both
# operands (TORCH_WMMAE_RESIDENT_PREPASS=0 turns it off): (a as (shape, line stride,
# column-major), b likewise, magnitudes, whether it can run). Partial tiles
# and stages (m, n not multiples of 128; K not a multiple of 32 or of the 128-wide bands), every layout
# (k-inner and line-inner stage tiles), padded lines, a broadcast b, more items than SMs (each block several,
# across batch entries), magnitudes over 2^+-40 with an Inf and a NaN (the exact re-read of a band), and
# where it must not run: a single matrix, and split-K (the grid pre-pass zeroes the output).
RESIDENT_CASES = {
    "row_row": (((6, 200, 300), 304, False), ((6, 300, 136), 136, False), "normal", True),
    "a_col": (((3, 130, 520), 132, True), ((3, 520, 72), 72, False), "normal", True),
    "b_col": (((3, 130, 260), 260, False), ((3, 260, 257), 260, True), "normal", True),
    "both_col": (((2, 256, 100), 256, True), ((2, 100, 128), 100, True), "normal", True),
    "broadcast_b": (((5, 130, 520), 520, False), ((520, 72), 72, False), "normal", True),
    "many_batch_entries": (((300, 64, 64), 64, False), ((300, 64, 64), 64, False), "normal", True),
    "wide_range_inf_nan": (((4, 130, 300), 300, False), ((4, 300, 136), 300, True), "wide", True),
    "single_matrix": (((130, 300), 300, False), ((300, 136), 136, False), "normal", False),
    "split_k": (((2, 64, 8192), 8192, False), ((2, 8192, 64), 64, False), "normal", False),
}
RESIDENT_PREPASS_KERNEL = "resident_prepass_kernel"
BESIDE_PREPASS_GEMM = re.compile(r"corrected_gemm_sm90_kernel<(true|false), (true|false), true, false, true, false>")


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("method", ["fp16", "auto"])
@pytest.mark.parametrize("case", list(RESIDENT_CASES))
def test_corrected_matmul_resident_prepass(gen, monkeypatch, case, method):
    """The pre-pass beside the GEMM finds the same line ranges as the grid pre-pass (so the same output
    bits), the output is correct (for fp16 on magnitudes spanning 2^80, which it does not cover by design:
    where its NaN and Inf land), and it runs exactly where it applies."""
    (a_shape, a_ld, a_col), (b_shape, b_ld, b_col), magnitudes, applies = RESIDENT_CASES[case]
    a = _strided_matrix(gen, a_shape, a_ld, 0, col_major=a_col)
    b = _strided_matrix(gen, b_shape, b_ld, 0, col_major=b_col)
    if magnitudes == "wide":
        _make_wide(gen, a, b, inf_k=100, nan_k=250)  # (bands 0 and 1 of 128 k)
    # (K = 64 of many_batch_entries: the GEMM's tiles would fold their line ranges themselves.)
    monkeypatch.setenv("TORCH_WMMAE_TILE_RANGES", "0")
    # By default, and turned off:
    outs, kernels = _calls_by_switch(monkeypatch, "TORCH_WMMAE_RESIDENT_PREPASS", ("default", "0"),
                                     lambda: torch_wmmae.corrected_matmul(a, b, method=method), case != "split_k")
    if case != "split_k":  # (split-K's atomics add in any order)
        torch.testing.assert_close(outs["default"], outs["0"], rtol=0, atol=0, equal_nan=True)
    if _sees_sm90_kernels():
        assert any(RESIDENT_PREPASS_KERNEL in name for name in kernels["default"]) == applies, kernels["default"]
        assert any(BESIDE_PREPASS_GEMM.search(name) for name in kernels["default"]) == applies, kernels["default"]
    for name in kernels["0"]:
        assert RESIDENT_PREPASS_KERNEL not in name and not BESIDE_PREPASS_GEMM.search(name), kernels["0"]
    for switch, out in outs.items():  # (both: split-K's are not compared bit for bit above)
        _assert_matmul_on_magnitudes(out, a, b, magnitudes, method, f"{case} {switch}")


def _make_wide(gen, a: torch.Tensor, b: torch.Tensor, inf_k: int | None = None, nan_k: int | None = None) -> None:
    """Scales a and b in place by 2^U(-40, 40) per element, and puts an Inf into row 7 of a's second batch entry
    (at k = inf_k, default K // 2) and a NaN into column 9 of b's third (at k = nan_k, default K - 1), or of
    their last entries where there are fewer."""
    for t in (a, b):
        t.mul_(torch.exp2(torch.rand(t.shape, generator=gen, dtype=torch.float64) * 80 - 40).float().cuda())
    k = a.shape[-1]
    a[tuple(min(1, n - 1) for n in a.shape[:-2]) + (7, k // 2 if inf_k is None else inf_k)] = float("inf")
    b[tuple(min(2, n - 1) for n in b.shape[:-2]) + (k - 1 if nan_k is None else nan_k, 9)] = float("nan")


def _assert_matmul_on_magnitudes(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, magnitudes: str, method: str,
                                 case: str) -> None:
    """out is a @ b (batch dimensions broadcast): within the dot-product bound on "normal" inputs; on "wide"
    ones (_make_wide), NaN and Inf where float64 has them and, for "auto" and "tf32", the dot-product bound on
    every finite output (fp16 is not
    accurate on such spans, by design, and an Inf meeting an element that vanishes in fp16 gives NaN (README):
    there only where the non-finite values land is checked)."""
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a_full, b_full = a.expand(*batch, *a.shape[-2:]), b.expand(*batch, *b.shape[-2:])
    if magnitudes != "wide":
        assert_matmul_within_dot_product_bound(out, a_full, b_full, case)
        return
    ref = torch.matmul(a_full.double(), b_full.double())
    finite = torch.isfinite(ref)
    assert torch.isnan(ref).any() and torch.isinf(ref).any(), "the case must reach both NaN and Inf outputs"
    if method == "fp16":
        assert torch.isnan(out[torch.isnan(ref)]).all(), "NaN wherever float64 has NaN"
        inf = torch.isinf(ref)
        assert ((out[inf].double() == ref[inf]) | torch.isnan(out[inf])).all(), "Inf (or NaN) where float64 has Inf"
        assert torch.isfinite(out[finite]).all(), "finite wherever float64 is finite"
    else:
        assert torch.equal(torch.isnan(out), torch.isnan(ref)), "NaN exactly where float64 has NaN"
        assert torch.equal(out[torch.isinf(ref)], ref[torch.isinf(ref)].float()), "Inf as in float64"
        # Elementwise, as for normal inputs: the dot-product bound |out - ref| <= (K + 16) u (|a| |b|) on every finite
        # output (one norm over all of them would be the largest outputs', and let the small ones be wrong).
        # A finite float64 output has only finite terms, so its bound is finite too.
        magnitude = torch.matmul(a_full.double().abs(), b_full.double().abs())
        err, tol = (out.double() - ref).abs(), (a.shape[-1] + 16) * U32 * magnitude
        worst = (err[finite] / tol[finite]).max().item()
        assert (err[finite] <= tol[finite]).all(), f"{case}: error {worst:.3f} x the bound on 2^+-40 magnitudes"


def _assert_auto_took_tf32_on(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, tf32_tiles: torch.Tensor) -> None:
    """"auto"'s output `out` of a @ b (no split of K) has the tf32 method's bits on the outputs of `tf32_tiles`
    (a mask: the 128-row tiles that hold a row spanning more than fp16 can), where fp16 gives other bits, and
    the fp16 method's on the other tiles. The dot-product bound alone cannot tell the two apart there: the
    row's element 2^30 makes its allowance far larger than fp16's loss."""
    with deterministic():
        want = {method: torch_wmmae.corrected_matmul(a, b, method=method) for method in ("fp16", "tf32")}
    assert tf32_tiles.any() and not torch.equal(want["fp16"][tf32_tiles], want["tf32"][tf32_tiles])
    assert torch.equal(out[tf32_tiles], want["tf32"][tf32_tiles]), "auto's tiles of the wide row are not tf32's"
    assert torch.equal(out[~tf32_tiles], want["fp16"][~tf32_tiles]), "auto's other tiles are not fp16's"


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("method", ["fp16", "auto"])
@pytest.mark.parametrize("layout", ["row_row", "col_col", "broadcast_b"])
@pytest.mark.parametrize("k", [100, 64], ids=["k100", "k64"])
def test_corrected_matmul_persistent_batch_slots(gen, monkeypatch, method, layout, k):
    """Short batched tiles on the wgmma kernel with TMA stages: one round of blocks, each looping over batch
    entries z, z + slots, ... (_corrected_matmul_grid's last entry), each tile's last stages issuing the next
    one's first (k = 100: 4 stages, the last partial; k = 64: 2, fewer than the ring's 3 ahead, so each tile
    issues its own). "auto" with one row of a middle entry spanning 2^60: the fp16 kernel skips that entry's
    first row of tiles, whose stages the tile before it issued, and the tf32 kernel takes them. The same bits
    as the cp.async stages, which launch the full grid (TMA and cp.async stages give the same bits without
    split-K), partial tiles included, and the dot-product bound."""
    m, n = 200, 136  # 2 x 2 tiles
    batch = persistent_slots_batch(m, n, k)
    if batch == 0:
        pytest.skip("the rule does not make this shape persistent on this GPU")
    a = _strided_matrix(gen, (batch, m, k), m if layout == "col_col" else k, 0, col_major=layout == "col_col")
    if method == "auto":
        a[batch // 2, 7, 1] = 2.0**30
        a[batch // 2, 7, 2] = 2.0**-30
    b_shape = (k, n) if layout == "broadcast_b" else (batch, k, n)
    b = _strided_matrix(gen, b_shape, k if layout == "col_col" else n, 0, col_major=layout == "col_col")
    # (The subject is the pre-pass path: the tiles' own line ranges with persistent slots are
    # TILE_RANGE_FMA_CASES' "2x2_tiles_persistent_k100".)
    monkeypatch.setenv("TORCH_WMMAE_TILE_RANGES", "0")
    outs, kernels = {}, {}
    for stages in ("1", "0"):
        monkeypatch.setenv("TORCH_WMMAE_SM90_TMA", stages)
        with deterministic():
            kernels[stages] = _launched_kernels(
                lambda: outs.setdefault(stages, torch_wmmae.corrected_matmul(a, b, method=method)))
    if _sees_sm90_kernels():
        for stages, tma in (("1", "true"), ("0", "false")):
            gemm = re.compile(rf"corrected_gemm_sm90_kernel<(true|false), (true|false), {tma},")
            assert any(gemm.search(name) for name in kernels[stages]), kernels[stages]
    torch.testing.assert_close(outs["1"], outs["0"], rtol=0, atol=0)
    assert_matmul_within_dot_product_bound(outs["1"], a, b.expand(batch, k, n), layout)
    if method == "auto":
        tf32_tiles = torch.zeros(outs["1"].shape, dtype=torch.bool, device="cuda")
        tf32_tiles[batch // 2, :128] = True
        _assert_auto_took_tf32_on(outs["1"], a, b, tf32_tiles)


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("shape, resident", [((64, 512, 512, 512), True), ((8, 1024, 1024, 1024), True),
                                             ((32, 256, 1024, 512), True), ((256, 128, 128, 160), True),
                                             ((16, 512, 512, 2048), False)],
                         ids=["64x512^3", "8x1024^3", "32x256x1024x512", "256x128^2x160", "16x512x512x2048"])
def test_corrected_matmul_resident_prepass_rule(gen, monkeypatch, shape, resident):
    """By default the pre-pass runs beside the GEMM in batched calls that TMA reads (all measured faster that
    way, or equal), but not where the GEMM reads its chunks' partial sums back (K > 1024, small outputs)."""
    if not _sees_sm90_kernels():
        pytest.skip("the resident pre-pass runs on the wgmma kernel only, and this test needs the profiler's "
                    "kernel names")
    monkeypatch.delenv("TORCH_WMMAE_RESIDENT_PREPASS", raising=False)
    batch, m, n, k = shape
    a = random_tensor(gen, (batch, m, k), "uniform", "cuda")
    b = random_tensor(gen, (batch, k, n), "uniform", "cuda")
    out = {}
    kernels = _launched_kernels(lambda: out.setdefault("c", torch_wmmae.corrected_matmul(a, b)))
    assert any(RESIDENT_PREPASS_KERNEL in name for name in kernels) == resident, kernels
    assert_matmul_within_dot_product_bound(out["c"], a, b, str(shape))


# The line ranges folded by the fp16 GEMM's tiles from their own stages (GemmArgs::tile_line_ranges), where K fits
# in the stages a tile issues at its start (K <= 128) and TMA reads both operands in place; no pre-pass runs then.
# By default where a batch entry's output is one tile or the call has few waves of tiles (every case here; the rule:
# test_corrected_matmul_tile_line_ranges_rule); TORCH_WMMAE_TILE_RANGES=1 wherever it can run, =0 nowhere. (a as
# (shape, line stride, column-major), b likewise, magnitudes, whether it can run.) Every layout (k-inner and
# line-inner stage tiles), K from 1 to 128 (partial stages: TMA's zeros past K; K > 96: the fourth stage, which a tile
# issues into the slot of the previous piece's last), partial tiles, a single matrix and a batch (one tile per entry,
# and entries of several tiles that fold the same lines), a broadcast b, magnitudes over 2^+-40 with an Inf and a NaN
# (the exact re-fold), and where it cannot run: K = 129, and an operand that TMA cannot read (a line stride of 137
# elements).
TILE_RANGE_CASES = {
    "k64_row_row_batched": (((6, 200, 64), 64, False), ((6, 64, 136), 136, False), "normal", True),
    "k1_row_row": (((130, 1), 4, False), ((1, 260), 260, False), "normal", True),
    "k48_one_tile": (((100, 48), 48, False), ((48, 120), 120, False), "normal", True),
    "k17_a_col": (((3, 130, 17), 132, True), ((3, 17, 72), 72, False), "normal", True),
    "k32_b_col_broadcast": (((5, 130, 32), 32, False), ((32, 257), 36, True), "normal", True),
    "k96_both_col": (((2, 256, 96), 256, True), ((2, 96, 128), 96, True), "normal", True),
    "k64_one_tile_per_entry": (((300, 128, 64), 64, False), ((300, 64, 128), 128, False), "normal", True),
    "k96_one_tile_per_entry_a_col": (((20, 120, 96), 120, True), ((20, 96, 128), 128, False), "normal", True),
    # 300 entries of 3 stages: persistent batch slots on an H100/H200 (up to 227 SMs), where each tile's stages
    # come from the tile before it
    "k96_one_tile_per_entry_persistent": (((300, 128, 96), 96, False), ((300, 96, 128), 128, False), "normal", True),
    "k128_one_tile_per_entry_persistent": (((300, 128, 128), 128, False), ((300, 128, 128), 128, False), "normal",
                                           True),
    "k97_both_col": (((3, 260, 97), 260, True), ((3, 97, 130), 100, True), "normal", True),
    "k113_one_tile_wide_inf_nan": (((6, 120, 113), 120, True), ((6, 113, 100), 116, True), "wide", True),
    "k72_wide_inf_nan": (((4, 130, 72), 72, False), ((4, 72, 136), 72, True), "wide", True),
    "k40_one_tile_wide_inf_nan": (((4, 128, 40), 40, False), ((4, 40, 100), 40, True), "wide", True),
    "k129": (((4, 130, 129), 132, False), ((4, 129, 136), 136, False), "normal", False),
    "k64_no_tma": (((4, 130, 64), 64, False), ((4, 64, 136), 137, False), "normal", False),
}
PREPASS_KERNEL = "prepass_kernel"  # (the grid pre-pass, prepass_kernel, and resident_prepass_kernel)


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("method", ["fp16", "auto"])
@pytest.mark.parametrize("case", list(TILE_RANGE_CASES))
def test_corrected_matmul_tile_line_ranges(gen, monkeypatch, case, method):
    """The GEMM's tiles find the same line ranges in their stages as the pre-pass does in global memory (so the
    same output bits, but for auto's tiles that are not fp16-safe, which take float32 FMAs where the tiles fold and
    the tf32 GEMM after a pre-pass), the output is correct, and no pre-pass runs exactly where the rule (or the
    switch) says: there the call's one kernel is the GEMM (no workspace, so no zeroing either)."""
    (a_shape, a_ld, a_col), (b_shape, b_ld, b_col), magnitudes, can = TILE_RANGE_CASES[case]
    a = _strided_matrix(gen, a_shape, a_ld, 0, col_major=a_col)
    b = _strided_matrix(gen, b_shape, b_ld, 0, col_major=b_col)
    if magnitudes == "wide":
        _make_wide(gen, a, b)
    # (An operand that TMA cannot read stays so: test_corrected_matmul_tma_copies has the tiles fold from copies.)
    monkeypatch.setenv(TMA_COPIES_SWITCH, "0")
    outs, kernels = _calls_by_switch(monkeypatch, "TORCH_WMMAE_TILE_RANGES", ("default", "1", "0"),
                                     lambda: torch_wmmae.corrected_matmul(a, b, method=method))
    folds = {"default": can, "1": can, "0": False}
    # The default folds as the switch at 1 does (every case here), so the same bits; folded or not, the same bits
    # but for auto's tiles that are not fp16-safe (float32 FMAs where the tiles fold, the tf32 GEMM after a pre-pass:
    # their bits are test_corrected_matmul_tile_line_ranges_auto_takes_float32_fmas's).
    torch.testing.assert_close(outs["default"], outs["1"], rtol=0, atol=0, equal_nan=True)
    if method == "fp16" or magnitudes == "normal" or not can:
        torch.testing.assert_close(outs["1"], outs["0"], rtol=0, atol=0, equal_nan=True)
    for switch, out in outs.items():
        _assert_matmul_on_magnitudes(out, a, b, magnitudes, method, f"{case} {switch}")
    if _sees_sm90_kernels():
        for switch, folded in folds.items():
            assert any(PREPASS_KERNEL in name for name in kernels[switch]) != folded, (switch, kernels[switch])
            ran = _own_kernels(kernels[switch])
            assert (len(ran) == 1 and TMA_KERNEL.search(ran[0]) is not None) == folded, (switch, ran)


# The default rule of the tiles' own line ranges (tile_line_ranges_apply), at its bounds: (m, n, k, waves, extra
# entries), the batch being `waves` waves of tiles (a tile per SM) plus `extra` entries; whether fp16 and auto fold.
TILE_RANGE_RULE_CASES = {
    "2x2_tiles_8_waves": ((256, 256, 64, 8, 0), True, True),
    "2x2_tiles_8_waves_and_an_entry": ((256, 256, 64, 8, 1), False, True),
    "2x2_tiles_16_waves": ((256, 256, 64, 16, 0), False, True),
    "2x2_tiles_16_waves_and_an_entry": ((256, 256, 64, 16, 1), False, False),
    "one_tile_17_waves": ((128, 128, 64, 17, 0), True, True),  # (each line folded once: any number of entries)
    "2x3_tiles_k128": ((256, 384, 128, 1, 0), True, True),
    "2x2_tiles_k129": ((256, 256, 129, 1, 0), False, False),  # (K beyond the tile's stages: never)
}


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("method", ["fp16", "auto"])
@pytest.mark.parametrize("case", list(TILE_RANGE_RULE_CASES))
def test_corrected_matmul_tile_line_ranges_rule(gen, monkeypatch, case, method):
    """By default the tiles fold their own line ranges (no pre-pass) where a batch entry's output is one tile, or where
    the call has at most 8 waves of tiles (fp16) or 16 (auto, which so also saves the tf32 GEMM and the fallback
    check); beyond that, each tile folding its shared lines again costs more than a pre-pass. Either way the same
    bits and the dot-product bound: magnitudes in [1, 2) keep every tile fp16-safe (U(-1, 1) drawn in float64 holds,
    among millions of elements, some below 2^-28, whose line auto computes with float32 FMAs where the tiles fold
    and with the tf32 split after a pre-pass)."""
    if not _sees_sm90_kernels() or "sm90_tma" not in torch.ops.wmmae._corrected_matmul_kernel_choice(
            torch.empty(0, device="cuda")):
        pytest.skip("the rule is the wgmma kernel's with TMA stages, and this test needs the profiler's kernel names")
    (m, n, k, waves, extra), fp16_folds, auto_folds = TILE_RANGE_RULE_CASES[case]
    tiles_per_entry = device_gemm_grid(m, n, k)[0]
    batch = waves * torch.cuda.get_device_properties(0).multi_processor_count // tiles_per_entry + extra
    a = (random_signs(gen, (batch, m, k)) * (1 + torch.rand(batch, m, k, generator=gen))).float().cuda()
    b = (random_signs(gen, (batch, k, n)) * (1 + torch.rand(batch, k, n, generator=gen))).float().cuda()
    # (Deterministic mode: no split of K, which would rule the folds out whatever the tile count.)
    outs, kernels = _calls_by_switch(monkeypatch, "TORCH_WMMAE_TILE_RANGES", ("default", "0"),
                                     lambda: torch_wmmae.corrected_matmul(a, b, method=method))
    folds = fp16_folds if method == "fp16" else auto_folds
    assert any(PREPASS_KERNEL in name for name in kernels["default"]) != folds, kernels["default"]
    assert any(PREPASS_KERNEL in name for name in kernels["0"]), kernels["0"]
    torch.testing.assert_close(outs["default"], outs["0"], rtol=0, atol=0)
    assert_matmul_within_dot_product_bound(outs["default"], a, b, case)


# (batch, m, n, k) for auto's tiles that are not fp16-safe where the tiles fold their line ranges (by default: one
# tile per entry, or few waves of tiles); batch 0: 2 x SMs + 3 entries, which the plan runs as persistent batch slots
# (one tile per entry: three rounds; 2 x 2 tiles: about nine), where the tile before a wide one issued its stages
# (K = 96: all three; K = 100 and 128: the first three, and the wide one the fourth) and the wide one reads them for
# its FMAs. K = 17, 100 and 113: a partial stage.
TILE_RANGE_FMA_CASES = {
    "one_tile": (1, 128, 128, 64),
    "one_tile_batched_k17": (5, 100, 120, 17),
    "one_tile_persistent_k96": (0, 128, 128, 96),
    "one_tile_persistent_k128": (0, 128, 128, 128),
    "one_tile_batched_k113": (5, 100, 120, 113),
    "3x4_tiles": (1, 300, 400, 64),
    "3x4_tiles_batched": (5, 300, 400, 40),
    "2x2_tiles_persistent_k100": (0, 200, 136, 100),
}
TF32_EXIT_KERNELS = ("corrected_gemm_sm90_tf32_kernel", "float32_fallback_kernel")


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("a_col", [False, True], ids=["a_row", "a_col"])
@pytest.mark.parametrize("b_col", [False, True], ids=["b_row", "b_col"])
@pytest.mark.parametrize("case", list(TILE_RANGE_FMA_CASES))
def test_corrected_matmul_tile_line_ranges_auto_takes_float32_fmas(gen, monkeypatch, case, a_col, b_col):
    """auto where the tiles fold their line ranges (by default: these calls have one tile per entry or few tiles): a
    tile with a line that fp16 cannot hold (a row spanning 2^60; a column with an Inf; a row with a NaN) is computed
    by the fp16 GEMM itself from the stages it holds, with one float32 fused multiply-add per product in k order
    (those bits, exactly: _fma_sequence_reference), every other tile with the fp16 method's bits; in every layout,
    and with no pre-pass, tf32 GEMM or fallback check launched (the poisoned pool: every output written)."""
    batch, m, n, k = TILE_RANGE_FMA_CASES[case]
    if batch == 0:
        batch = 2 * torch.cuda.get_device_properties(0).multi_processor_count + 3
        if not device_gemm_grid(m, n, k, batch)[4]:
            pytest.skip("the plan does not make this shape persistent on this GPU")
    monkeypatch.delenv("TORCH_WMMAE_TILE_RANGES", raising=False)
    padded = lambda inner: (inner + 3) // 4 * 4 + 4  # line strides that TMA can read (16-byte multiples)
    a = _strided_matrix(gen, (batch, m, k), padded(m if a_col else k), 0, col_major=a_col)
    b = _strided_matrix(gen, (batch, k, n), padded(k if b_col else n), 0, col_major=b_col)
    wide_z, inf_z, nan_z = batch // 2, batch - 1, 0
    a[wide_z, 7, 1], a[wide_z, 7, 2] = 2.0**30, 2.0**-30  # a row spanning 2^60
    b[inf_z, k // 2, n - 9] = float("inf")                  # a column with an Inf
    a[nan_z, m - 1, k - 1] = float("nan")                   # a row with a NaN
    outs = {}
    # (A NaN-poisoned pool where the output fits its 2 MiB segment with room to spare.)
    pool = poisoned_cuda_pool(float("nan")) if 4 * batch * m * n <= 1 << 20 else contextlib.nullcontext()
    with deterministic():
        fp16 = torch_wmmae.corrected_matmul(a, b, method="fp16").cpu()
        with pool:
            kernels = _launched_kernels(lambda: outs.setdefault("auto", torch_wmmae.corrected_matmul(a, b)))
    if _sees_sm90_kernels():
        assert any(TMA_KERNEL.search(name) for name in kernels), kernels
        assert not any(name in ran for ran in kernels for name in (PREPASS_KERNEL,) + TF32_EXIT_KERNELS), kernels
    tile = lambda i: slice(i // 128 * 128, i // 128 * 128 + 128)  # the 128 lines of i's tile
    expected = fp16.clone()
    for z, rows, cols in ((wide_z, tile(7), slice(None)), (inf_z, slice(None), tile(n - 9)),
                          (nan_z, tile(m - 1), slice(None))):
        expected[z, rows, cols] = _fma_sequence_reference(a[z], b[z])[rows, cols]
    torch.testing.assert_close(outs["auto"].cpu(), expected, rtol=0, atol=0, equal_nan=True)
    assert not torch.equal(expected[wide_z], fp16[wide_z])  # (else the test could not tell the paths apart)
    _assert_matmul_on_magnitudes(outs["auto"], a, b, "wide", "auto", case)


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("magnitudes", ["normal", "wide"])
def test_corrected_matmul_late_dependents_keep_bits(gen, monkeypatch, magnitudes):
    """auto on three rounds of one-tile batch entries (whose tiles fold their own line ranges), calls back to back on
    one stream, the fp16 GEMM letting the kernels after it launch at its start (unset and TORCH_WMMAE_LATE_DEPENDENTS=0)
    or as each block starts its last piece (=1, late_dependents_apply): the same bits; on "wide" inputs (_make_wide)
    most tiles take the GEMM's float32 FMAs and meet an Inf and a NaN. (Where the blocks let them launch changes no
    bits by design: this checks that every placement completes with the right output, and that the calls take the
    tiles' own line ranges.)"""
    for key in ("TORCH_WMMAE_TILE_RANGES", "TORCH_WMMAE_SM90_TMA", "TORCH_WMMAE_PORTABLE_GEMM"):
        monkeypatch.delenv(key, raising=False)
    batch = 3 * torch.cuda.get_device_properties(0).multi_processor_count  # three rounds of batch slots
    if "sm90_tma" not in torch.ops.wmmae._corrected_matmul_kernel_choice(torch.empty(0, device="cuda")):
        pytest.skip("the rule applies to the wgmma kernel with TMA stages")
    if not device_gemm_grid(128, 128, 64, batch)[4]:
        pytest.skip("the plan does not make this shape persistent on this GPU")
    a = random_tensor(gen, (batch, 128, 64), "normal", "cuda")
    b = random_tensor(gen, (batch, 64, 128), "normal", "cuda")
    if magnitudes == "wide":
        _make_wide(gen, a, b)
    outs, kernels = _calls_by_switch(monkeypatch, "TORCH_WMMAE_LATE_DEPENDENTS", ("0", "default", "1"),
                                     lambda: [torch_wmmae.corrected_matmul(a, b) for _ in range(3)])
    for switch, calls in outs.items():
        for out in calls:
            torch.testing.assert_close(out, outs["0"][0], rtol=0, atol=0, equal_nan=True, msg=switch)
    if _sees_sm90_kernels():  # the fp16 GEMM with TMA stages, folding its own line ranges: no pre-pass
        for switch, ran in kernels.items():
            assert any(TMA_KERNEL.search(name) for name in ran), (switch, ran)
            assert not any(PREPASS_KERNEL in name for name in ran), (switch, ran)
    _assert_matmul_on_magnitudes(outs["default"][0], a, b, magnitudes, "auto", "late dependents")


@requires_cuda
@pytest.mark.gpu
def test_corrected_matmul_resident_prepass_over_many_calls(gen, monkeypatch):
    """The block scheduler places the resident pre-pass's blocks as it likes, sometimes two or more on one SM
    (which then has no room for a GEMM block); such a block exits at once and the others take every item from
    a shared counter. Over many calls, with whatever placements they get, every item is folded exactly once:
    one element of each row of a and column of b is 2^40 times larger, so a band of lines left out would
    leave their fp16 scales far too large, and the output would differ from the grid pre-pass's."""
    batch, m, k, n = 32, 256, 512, 256
    monkeypatch.delenv("TORCH_WMMAE_RESIDENT_PREPASS", raising=False)
    a = random_tensor(gen, (batch, m, k), "normal", "cuda")
    b = random_tensor(gen, (batch, k, n), "normal", "cuda")
    # Each output is poisoned once checked: the caching allocator hands its block to the next call, which would
    # otherwise find the same bits there already and hide a tile that no block wrote.
    with deterministic():  # (no split-K, which the resident pre-pass does not run beside)
        if _sees_sm90_kernels():
            out = {}
            kernels = _launched_kernels(lambda: out.setdefault("c", torch_wmmae.corrected_matmul(a, b, method="fp16")))
            assert any(RESIDENT_PREPASS_KERNEL in name for name in kernels), kernels
            out["c"].fill_(float("nan"))
            del out
        plain = torch_wmmae.corrected_matmul(a, b, method="fp16")
        assert_matmul_within_dot_product_bound(plain, a, b, "plain")
        plain.fill_(float("nan"))
        del plain
        for z in range(batch):
            _with_large_element_per_line(a[z], 0)
            _with_large_element_per_line(b[z], 1)
        for call in range(40):
            monkeypatch.delenv("TORCH_WMMAE_RESIDENT_PREPASS", raising=False)
            resident = torch_wmmae.corrected_matmul(a, b, method="fp16")
            monkeypatch.setenv("TORCH_WMMAE_RESIDENT_PREPASS", "0")
            grid = torch_wmmae.corrected_matmul(a, b, method="fp16")
            assert torch.isfinite(resident).all() and torch.isfinite(grid).all(), f"call {call}"
            torch.testing.assert_close(resident, grid, rtol=0, atol=0, msg=f"call {call}")
            resident.fill_(float("nan"))
            grid.fill_(float("nan"))
            del resident, grid


@requires_cuda
@pytest.mark.gpu
def test_corrected_matmul_resident_prepass_in_cuda_graph(gen, monkeypatch):
    """A call with the pre-pass beside the GEMM replays from a CUDA graph with fresh inputs (the launch
    order, the counts' zeroing and the dependent launches are captured) and gives the eager bits."""
    monkeypatch.delenv("TORCH_WMMAE_RESIDENT_PREPASS", raising=False)
    a = random_tensor(gen, (6, 200, 300), "normal", "cuda")
    b = random_tensor(gen, (6, 300, 136), "normal", "cuda")
    with deterministic():  # (no split-K, which the resident pre-pass does not run beside)
        if _sees_sm90_kernels():
            kernels = _launched_kernels(lambda: torch_wmmae.corrected_matmul(a, b))
            assert any(RESIDENT_PREPASS_KERNEL in name for name in kernels), kernels
        torch_wmmae.corrected_matmul(a, b)  # warm-up outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = torch_wmmae.corrected_matmul(a, b)
        for _ in range(3):
            a.copy_(random_tensor(gen, a.shape, "normal", "cuda"))
            b.copy_(random_tensor(gen, b.shape, "normal", "cuda"))
            out.fill_(float("nan"))
            graph.replay()
            eager = torch_wmmae.corrected_matmul(a, b)
            assert torch.equal(out, eager)
            assert_matmul_within_dot_product_bound(out, a, b, "graph replay")


# A chain of operations on one stream, each reading what the one before it wrote: corrected_matmul's output
# (its last kernel, the GEMM or auto's tf32 exit grid, lets the next grid on the stream start early), a copy
# (cudaMemcpyAsync) or a kernel of torch's. A call's first kernel (the workspace's zeroing) is launched to
# overlap the kernel before it and waits for that grid before it writes or lets the call's next kernel start;
# without that wait it would zero the workspace of the call before (the same memory, from the caching
# allocator) while that call's GEMM still reads it, and the pre-pass after it would read a call's input
# before it was written. Where the call is one kernel (the small GEMM, or a GEMM whose tiles fold their line
# ranges), that kernel is launched likewise and waits for the grid before it before it reads A or B.
CHAIN_STEPS = ["auto", "fp16", "copy", "tf32", "auto", "torch_kernel", "fp16", "auto", "tf32", "copy", "auto"]


def _run_chain(x, bs, sync_each_step: bool) -> list:
    """[(input, b, output)] of every corrected_matmul step of CHAIN_STEPS, starting from x; the steps take
    their b from bs in turn."""
    steps = []
    for step in CHAIN_STEPS:
        if step == "copy":
            y = torch.empty_like(x)
            y.copy_(x)
        elif step == "torch_kernel":
            y = x.neg()
        else:
            b = bs[len(steps) % len(bs)]
            y = torch_wmmae.corrected_matmul(x, b, method=step)
            steps.append((x, b, y))
        x = y
        if sync_each_step:
            torch.cuda.synchronize()
    return steps


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("batch,rows,n", [(12, 256, 256), (1, 1000, 1000), (1, 136, 136), (64, 128, 128),
                                          (2, 1000, 128), (600, 64, 64), (200, 64, 64), (2000, 20, 20)],
                         ids=["batched", "n1000", "n136", "tiles_fold_k128", "tiles_fold_k128_8_per_entry",
                              "small_gemm64", "small_gemm64_partial_wave", "small_gemm20"])
@pytest.mark.parametrize("split_k", [True, False], ids=["split_k_allowed", "deterministic"])
def test_corrected_matmul_chain_reads_what_the_operation_before_wrote(gen, monkeypatch, batch, rows, n, split_k):
    """Every step is within the dot-product bound of its own input; deterministic chains give the same bits
    as the same chain with the host waiting after every step (nothing overlaps then) and as its CUDA graph.
    The steps' outputs alternate between magnitudes about 2^20 apart, so that a line scale taken from the
    wrong data (a workspace zeroed too early, an input read before it was written) overflows or flushes the
    fp16 split and fails the bound. Each step multiplies the rows x n output of the step before by an n x n
    matrix. In the tiles_fold cases the fp16 and auto steps' tiles fold their own line ranges (K = 128; one tile
    per entry, or 8 tiles per entry in few waves: the step is the GEMM alone, which waits for the step before
    before its first loads). The small_gemm cases' fp16 and auto steps run the small GEMM (launched to
    overlap the kernel before it, like a call's first kernel), their tf32 steps the tile GEMMs; on H100/H200 the
    partial wave's grid (200 blocks, 4 per SM) lets the next step launch only as its blocks exit, the others (600
    blocks of tile 64, 5 per SM with the hi*hi sums per fragment on 132 SMs: small_gemm_hh_per_fragment; 2000 of
    tile 32, 16 per SM likewise) once their blocks have waited for the step before (small_gemm_dependents_at_exit)."""
    if n <= 64:
        monkeypatch.delenv(SMALL_GEMM_SWITCH, raising=False)
    unit = random_tensor(gen, (batch, n, n), "normal", "cuda") / math.sqrt(n)  # (keeps the magnitudes)
    bs = (unit * 2.0**20, unit * 2.0**-20)
    x0 = random_tensor(gen, (batch, rows, n), "normal", "cuda")
    with deterministic(not split_k):
        overlapped = _run_chain(x0, bs, sync_each_step=False)
        torch.cuda.synchronize()
        for i, (x, b, y) in enumerate(overlapped):
            assert_matmul_within_dot_product_bound(y, x, b, f"step {i}: ")
        if split_k:
            return  # (split-K's and stream-K's atomics add in any order)
        if n == 128 and _sees_sm90_kernels():  # (the tiles_fold cases: an fp16 or auto step is the GEMM alone)
            for method in ("fp16", "auto"):
                call = lambda: torch_wmmae.corrected_matmul(x0, bs[0], method=method)
                ran = _own_kernels(_launched_kernels(call))
                assert len(ran) == 1 and TMA_KERNEL.search(ran[0]) is not None, (method, ran)
        for i, (step, synced) in enumerate(zip(overlapped, _run_chain(x0, bs, sync_each_step=True))):
            assert torch.equal(step[2], synced[2]), f"step {i}"
        x_in = x0.clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            x_in.neg_()  # (a kernel node before the first call's first kernel)
            captured = _run_chain(x_in, bs, sync_each_step=False)
        for replay in range(2):
            x_in.copy_(random_tensor(gen, x0.shape, "normal", "cuda"))
            for _, _, y in captured:
                y.fill_(float("nan"))
            graph.replay()
            eager = _run_chain(x_in, bs, sync_each_step=False)  # (the replay negated x_in in place)
            for i, (step, step_eager) in enumerate(zip(captured, eager)):
                assert torch.equal(step[2], step_eager[2]), f"replay {replay}, step {i}"


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("k", [1000, 2100, 5000], ids=lambda k: f"k{k}")
@pytest.mark.parametrize("b_col", [False, True], ids=["b_row", "b_col"])
@pytest.mark.parametrize("kernel", ["default", "default_tf32", "portable_fp16", "portable_tf32"])
def test_corrected_matmul_chunk_read_back(gen, monkeypatch, k, b_col, kernel):
    """Without split-K a block sums K in chunks of 1024 and keeps the partial sums in the output, which later
    chunks read back: the wgmma kernel's fp16 instantiations in one batch (kReadBack, which runs exactly where a
    block has more than one chunk, K > 1024 here), its tf32 ones and the WMMA kernels (both methods; what other
    GPUs run) element by element. On partial tiles too, and with an Inf in a row of a."""
    monkeypatch.setenv("TORCH_WMMAE_PORTABLE_GEMM", "1" if kernel.startswith("portable") else "0")
    method = "tf32" if kernel.endswith("tf32") else "fp16"
    a = random_tensor(gen, (130, k), "normal", "cuda")
    b = random_tensor_in_layout((k, 129), b_col, gen, "cuda")
    a[5, k // 2] = float("inf")
    out = {}
    with deterministic():  # no split-K
        kernels = _launched_kernels(lambda: out.setdefault("c", torch_wmmae.corrected_matmul(a, b, method=method)))
    ref = torch.matmul(a.double(), b.double())
    assert torch.isinf(ref[5]).all() and torch.equal(out["c"][5], ref[5].float())  # +-Inf, signs as in torch
    finite = torch.ones(130, dtype=torch.bool, device="cuda")
    finite[5] = False
    assert_matmul_within_dot_product_bound(out["c"][finite], a[finite], b, f"k={k}")
    if kernel == "default" and _sees_sm90_kernels():
        assert any(READ_BACK_KERNEL.search(name) for name in kernels) == (k > 1024), kernels


@pytest.mark.parametrize("gemm_device", CUDA_GEMM_TARGETS, indirect=True)
@pytest.mark.parametrize("method", ["fp16", "auto"])
@pytest.mark.parametrize("shape", [(2048, 4160, 2048), (300, 2100, 260)], ids=["chunks_of_4096", "chunks_of_1024"])
def test_chunk_read_back_keeps_every_bit(gemm_device, gen, monkeypatch, method, shape):
    """An unsplit block that sums several chunks of K reads its partial sums back between them: the wgmma
    kernel in one batch (its kReadBack instantiation, the default) or, with TORCH_WMMAE_READ_BACK=0, element by
    element (as the WMMA kernel does), with the same arithmetic, so the same bits. A large output (2048^2:
    chunks of 4096, K = 4160 in two, the second of 64) and a small one (chunks of 1024, K = 2100 in three, a
    partial tile at the edge), in deterministic mode (no split of K)."""
    m, k, n = shape
    a = random_tensor(gen, (m, k), "normal", gemm_device)
    b = random_tensor(gen, (k, n), "normal", gemm_device)
    outs, kernels = {}, {}
    with deterministic():
        for read_back in ("default", "0"):
            if read_back == "default":
                monkeypatch.delenv("TORCH_WMMAE_READ_BACK", raising=False)
            else:
                monkeypatch.setenv("TORCH_WMMAE_READ_BACK", read_back)
            kernels[read_back] = _launched_kernels(
                lambda key=read_back: outs.setdefault(key, torch_wmmae.corrected_matmul(a, b, method=method)))
    assert torch.equal(outs["default"], outs["0"])
    assert_matmul_within_dot_product_bound(outs["default"], a, b, f"{method} {shape}")
    if os.environ["TORCH_WMMAE_PORTABLE_GEMM"] == "0" and _sees_sm90_kernels():
        assert any(READ_BACK_KERNEL.search(name) for name in kernels["default"]), kernels["default"]
        assert not any(READ_BACK_KERNEL.search(name) for name in kernels["0"]), kernels["0"]


# Stream-K (TORCH_WMMAE_STREAM_K=1): (a shape, b shape, a column-major, b column-major). Every block's share
# of the (tile, k-stage) units is cut where it crosses into the next tile; the cases make shares that start
# and end inside tiles (pieces shorter than the TMA ring too, which issue their own first stages), run across
# partial tiles and across batch entries, span a chunk boundary of K (chunks of 1024 = 32 stages: shares of
# about 62 stages), or end up to 4 stages past one (about 35: one chunk), and read both layouts (TMA and
# cp.async). On 132 SMs the first two also give one block an empty share (shares shorter than the gap that
# stream_k_share leaves after a tile): that block exits without a piece.
STREAM_K_CASES = {
    "shares_cross_tiles": ((200, 3000), (3000, 300), False, False),
    "shares_cross_batch_entries": ((3, 130, 700), (700, 129), False, False),
    "long_shares_cross_chunks": ((512, 16384), (16384, 512), False, False),
    "shares_a_little_over_a_chunk": ((512, 9216), (9216, 512), False, False),
    "a_col_b_col": ((200, 3000), (3000, 300), True, True),
    "b_col_odd_sizes": ((17, 1000), (1000, 1000), False, True),
}


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("method", ["fp16", "auto"])
@pytest.mark.parametrize("stages", ["tma", "cp_async"])
@pytest.mark.parametrize("case", list(STREAM_K_CASES))
def test_corrected_matmul_stream_k(gen, monkeypatch, case, stages, method):
    """The stream-K schedule covers every (tile, k-stage) of the product exactly once: a unit missed or taken
    twice puts the elements of that tile far outside the dot-product bound. "auto" with one row of a spanning
    2^62 sends that row's tiles to the tf32 kernel (its own grid, its tiles whole; the float32 fallback after
    it), the others stay with stream-K. That element meets b's zero row, so the row's products are of N(0, 1)
    terms only, which fp16's scale for the row (set by 2^62) flushes: the fp16 method fails the bound there,
    so auto passes it only by taking tf32. (Bits are no check here: auto's tf32 kernel keeps the plan's split
    of K, 3 to 10 splits added by atomics in these cases, where the tf32 method in deterministic mode, the only
    reference without stream-K, sums each tile unsplit; on the H200 the last bits differed in every case.)"""
    a_shape, b_shape, a_col, b_col = STREAM_K_CASES[case]
    monkeypatch.setenv("TORCH_WMMAE_STREAM_K", "1")
    monkeypatch.setenv("TORCH_WMMAE_SM90_TMA", "1" if stages == "tma" else "0")
    a = random_tensor_in_layout(a_shape, a_col, gen, "cuda")
    b = random_tensor_in_layout(b_shape, b_col, gen, "cuda")
    if method == "auto":
        a[..., 7, 0] = 2.0**62
        b[..., 0, :] = 0.0
    m, k = a_shape[-2:]
    n = b_shape[-1]
    batch = math.prod(a_shape[:-2])
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    tiles, _, _, blocks, _ = device_gemm_grid(m, n, k, batch)
    assert 1 < blocks <= sms and tiles * batch * ((k + 31) // 32) >= 8 * blocks
    out = torch_wmmae.corrected_matmul(a, b, method=method)
    b_full = b.expand(*a.shape[:-2], *b.shape)
    assert_matmul_within_dot_product_bound(out, a, b_full, case)
    if method == "auto":
        with pytest.raises(AssertionError, match="outside"):
            assert_matmul_within_dot_product_bound(torch_wmmae.corrected_matmul(a, b, method="fp16"), a, b_full)


def _with_large_element_per_line(t: torch.Tensor, lines_dim: int, factor: float = 2.0**40) -> torch.Tensor:
    """t (a view) with one element of each line along `lines_dim` (a row of a, a column of b) scaled by `factor`,
    at a position along K that moves with the line, the last line's at the end of K: a pre-pass that skipped
    any line or chunk of one would leave that line's fp16 scale too large, and the product would overflow."""
    lines, k = t.shape[lines_dim], t.shape[1 - lines_dim]
    line = torch.arange(lines, device=t.device)
    kk = (line * 37 + 5) % k
    kk[-1] = k - 1
    t[(line, kk) if lines_dim == 0 else (kk, line)] *= factor
    return t


# How the pre-pass reads an operand's lines: strided lines in float4s (aligned, the line count and stride
# multiples of 4) or one element at a time, because the sizes are odd or because the view starts one
# element into its storage (no float4 is aligned); contiguous lines with each of these shapes and offsets.
PREPASS_READS = {"float4": (2100, 0), "odd_sizes": (2101, 0), "offset": (2100, 1)}


def _operand_view(gen, rows: int, cols: int, column_major: bool, offset: int, device: str) -> torch.Tensor:
    """An N(0, 1) rows x cols view, row- or column-major, `offset` elements into its storage."""
    storage = random_tensor(gen, (rows * cols + offset,), "normal", device)
    strides = (1, rows) if column_major else (cols, 1)
    return storage.as_strided((rows, cols), strides, offset)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", ["fp16", "auto"])
@pytest.mark.parametrize("operand", ["b_columns", "a_rows"])
@pytest.mark.parametrize("contiguous", [False, True], ids=["strided_lines", "contiguous_lines"])
@pytest.mark.parametrize("reads", list(PREPASS_READS))
def test_corrected_matmul_prepass_reads_every_element(device, gen, method, operand, contiguous, reads):
    """The exponent pre-pass over every kind of line (rows of a, columns of b; contiguous in memory or
    strided; read in float4s or not) must count every element, or its line's fp16 scale is wrong and the
    product overflows. 1024 / 52 lines (1023 / 51 with odd sizes): partial blocks of lines; K = 2100 or
    2101: a partial chunk per line."""
    k, offset = PREPASS_READS[reads]
    odd = k % 2
    if operand == "b_columns":
        a = random_tensor(gen, (48, k), "normal", device)
        b = _with_large_element_per_line(_operand_view(gen, k, 1024 - odd, contiguous, offset, device), 1)
    else:
        a = _with_large_element_per_line(_operand_view(gen, 52 - odd, k, not contiguous, offset, device), 0)
        b = random_tensor(gen, (k, 40), "normal", device)
    out = torch_wmmae.corrected_matmul(a, b, method=method)
    assert torch.isfinite(out).all()
    assert_matmul_within_dot_product_bound(out, a, b, f"{operand} {method} contiguous={contiguous} {reads}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("a_col", [False, True], ids=["a_row", "a_col"])
@pytest.mark.parametrize("b_col", [False, True], ids=["b_row", "b_col"])
def test_corrected_matmul_prepass_reads_every_batch_entry(device, gen, a_col, b_col):
    """Batched operands whose strided lines are read in float4s: every batch entry's lines at its own batch
    offset (a: 16 of 20 lines of each entry, so the view starts 4 lines into its storage). Both operands have
    a large element per line, so it is 2^12 (a span fp16 keeps accurate; a missed one still overflows:
    2^12 * 2^12 * |x| > 65504)."""
    a = random_tensor(gen, (3, 516, 20), "normal", device)[:, :, 4:].transpose(1, 2) if a_col else \
        random_tensor(gen, (3, 20, 516), "normal", device)[:, 4:, :]
    b = random_tensor(gen, (3, 36, 516), "normal", device).transpose(1, 2) if b_col else \
        random_tensor(gen, (3, 516, 36), "normal", device)
    for i in range(3):
        _with_large_element_per_line(a[i], 0, 2.0**12)
        _with_large_element_per_line(b[i], 1, 2.0**12)
    out = torch_wmmae.corrected_matmul(a, b, method="fp16")
    assert torch.isfinite(out).all()
    assert_matmul_within_dot_product_bound(out, a, b, f"batched a_col={a_col} b_col={b_col}")


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("operand", ["a_rows", "b_columns"])
@pytest.mark.parametrize("k", [33, 2100], ids=["one_batch", "three_chunks"])
def test_corrected_matmul_prepass_many_contiguous_lines(gen, operand, k):
    """Enough contiguous lines (rows of row-major a, columns of column-major b) that the pre-pass reads four
    per warp (64 per SM, and 3 more: a partial group of lines); K = 33 (a part of one batch of loads) or 2100
    (three chunks of 1024, the last partial). Every line has a large element (a missed one leaves its line's
    scale too large and the product overflows), and two lines hold an Inf and a NaN: their elements are
    folded again exactly, and their products are non-finite as in torch.matmul while the lines beside them
    stay accurate."""
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    lines = 64 * sms + 3
    bad = torch.tensor([5, lines - 2], device="cuda")  # the NaN line and the Inf line
    dim = 0 if operand == "a_rows" else 1  # the output's dimension along the lines
    if operand == "a_rows":
        a = _with_large_element_per_line(random_tensor(gen, (lines, k), "normal", "cuda"), 0)
        b = random_tensor(gen, (k, 40), "normal", "cuda")
        a[lines - 2, k // 2] = float("inf")
        a[5, k - 1] = float("nan")
    else:
        a = random_tensor(gen, (48, k), "normal", "cuda")
        b = _with_large_element_per_line(random_tensor(gen, (lines, k), "normal", "cuda").t(), 1)
        b[k // 2, lines - 2] = float("inf")
        b[k - 1, 5] = float("nan")
    for method in ("fp16", "auto"):
        out = torch_wmmae.corrected_matmul(a, b, method=method)
        ref = torch.matmul(a.double(), b.double()).float()
        torch.testing.assert_close(out.index_select(dim, bad), ref.index_select(dim, bad), equal_nan=True,
                                   rtol=0, atol=0, msg=f"{operand} {method}: non-finite lines")
        good = torch.ones(lines, dtype=torch.bool, device="cuda")
        good[bad] = False
        if operand == "a_rows":
            assert_matmul_within_dot_product_bound(out[good], a[good], b, f"{operand} {method} K={k}")
        else:
            assert_matmul_within_dot_product_bound(out[:, good], a, b[:, good], f"{operand} {method} K={k}")


# --------------------------------------------------------------------------------------------------------
# corrected_matmul's small GEMM (corrected_gemm_small.cuh): outputs of at most 64 x 64 per batch entry, K <= 128
# --------------------------------------------------------------------------------------------------------
SMALL_GEMM_SWITCH = "TORCH_WMMAE_SMALL_GEMM"
SMALL_TILE_SWITCH = "TORCH_WMMAE_SMALL_TILE"
SMALL_GEMM_KERNEL = "corrected_gemm_small_kernel"


@pytest.fixture(autouse=True)
def _tile_gemms_unless_asked(monkeypatch):
    """This module's calls run the tile GEMMs (whose paths it tests) unless a test asks for the small GEMM: many
    of its products are small enough that the default rule would give them to it."""
    monkeypatch.setenv(SMALL_GEMM_SWITCH, "0")


# (a, b) as (shape, line stride, storage offset, column-major) (_strided_matrix), and whether the default rule takes the
# small GEMM (small_gemm_applies: an entry's output at most 64 x 64, or the call's at most 256^2 elements with M, N <=
# 256, or "no_tma": where the wgmma GEMM runs, could not read an operand by TMA in place, and would not read a copy (two
# batch dimensions) or the output's width is odd (from 2^18 elements, only where the tile GEMMs would read a copy) or M
# or N is at most 32, the call's output at most 2^20 elements, and beyond that where M or N is at most 32 or N is odd
# with K <= 64 (and N <= 64 where the tile GEMMs read copies, whose flush stages an odd width); else only
# TORCH_WMMAE_SMALL_GEMM=1 does). Its tiles are 16 x 16, 32 x 32 or 64 x 64 (_small_gemm_tile): cases of each, with K
# along each operand's rows and columns, and K at and past the ends of each tile's K buckets (_small_gemm_k_bucket: 32
# (not tile 64), 64, 128); each case also runs with every tile forced (TORCH_WMMAE_SMALL_TILE), so that tile 64, which
# the default takes only for grids of more than half as many blocks as SMs, runs every case, and smaller tiles take
# outputs of several of their tiles.
SMALL_GEMM_CASES = {
    "k64_one_tile": (((3, 64, 64), 64, 0, False), ((3, 64, 64), 64, 0, False), True),
    "k1": (((2, 9, 1), 1, 0, False), ((2, 1, 12), 12, 0, False), True),
    "k16_tile16": (((5, 16, 16), 16, 0, False), ((5, 16, 16), 16, 0, False), True),
    "k128_tile16_b_col": (((3, 7, 128), 128, 0, False), ((3, 128, 11), 128, 0, True), True),
    "k20_tile16_a_col_b_offset": (((4, 13, 20), 16, 0, True), ((4, 20, 16), 20, 3, False), True),
    "k32_tile32_both_col": (((4, 32, 32), 32, 0, True), ((4, 32, 32), 32, 0, True), True),
    "k128_tile32_a_col": (((3, 24, 128), 28, 0, True), ((3, 128, 32), 32, 0, False), True),
    "k33_odd_both_col_offsets": (((5, 17, 33), 20, 1, True), ((5, 33, 15), 35, 3, True), True),
    "k128_broadcast_b_offset": (((4, 64, 128), 131, 2, False), ((128, 50), 50, 0, False), True),
    "k16_a_col_b_row_offset": (((2, 64, 16), 64, 0, True), ((2, 16, 64), 70, 5, False), True),
    "k100_vector_rows": (((6, 1, 100), 100, 0, False), ((6, 100, 64), 64, 0, False), True),
    # 16-byte copies whose last chunk is part outside the matrix (K = 46 along A's rows, 62 of B's columns)
    "k46_partial_chunks": (((3, 30, 46), 48, 0, False), ((3, 46, 62), 64, 0, False), True),
    "k46_partial_chunks_both_col": (((3, 30, 46), 32, 0, True), ((3, 46, 62), 48, 0, True), True),
    "k96_tiles_of_130x200": (((2, 130, 96), 96, 0, False), ((2, 96, 200), 96, 0, True), True),
    # the call-size bound: 256^2 outputs (taken), three entries of 130 x 200 (78,000 outputs) and M = 257 (not)
    "k128_256x256": (((1, 256, 128), 128, 0, False), ((1, 128, 256), 256, 0, False), True),
    "k96_3_tiles_of_130x200": (((3, 130, 96), 96, 0, False), ((3, 96, 200), 96, 0, True), False),
    "k64_257x100": (((1, 257, 64), 64, 0, False), ((1, 64, 100), 100, 0, False), False),
    # operands TMA cannot read in place up to the bound of 2^20 outputs, and just beyond it (1025 x 1024): B's lines
    # of 301 floats (an odd output width) and two batch dimensions (no copies) are taken; A's lines of 50 floats and
    # a start 4 bytes past 16 are not (the tile GEMMs read copies: test_small_gemm_where_the_tile_gemms_read_no_copies),
    # but for outputs of 32 rows or columns (taken; not 64)
    "k50_a_lines_unaligned_1024x1024": (((1, 1024, 50), 50, 0, False), ((1, 50, 1024), 1024, 0, False), False),
    "k64_b_lines_unaligned_300x301": (((300, 64), 64, 0, False), ((64, 301), 301, 0, False), "no_tma"),
    # (from 2^18 outputs, an odd width where the tile GEMMs read no copy, B by residue and A in place, by residue too,
    # or batched with batch strides of a multiple of 4 floats: not taken; below 2^18 outputs, or B's batch entries at
    # other residues (copied): taken)
    "k64_b_lines_odd_769x769": (((769, 64), 64, 0, False), ((64, 769), 769, 0, False), False),
    "k63_a_and_b_lines_odd_769x769": (((769, 63), 63, 0, False), ((63, 769), 769, 0, False), False),
    "k64_b_lines_odd_batched_2x513x513": (((2, 513, 64), 64, 0, False), ((2, 64, 513), 513, 0, False), False),
    "k64_b_lines_odd_513x513": (((513, 64), 64, 0, False), ((64, 513), 513, 0, False), False),
    "k64_b_lines_odd_511x511": (((511, 64), 64, 0, False), ((64, 511), 511, 0, False), "no_tma"),
    "k65_b_lines_odd_batched_2x513x513": (((2, 513, 65), 68, 0, False), ((2, 65, 513), 513, 0, False), "no_tma"),
    "k128_a_offset_2x512x512": (((2, 512, 128), 128, 1, False), ((2, 128, 512), 512, 0, False), False),
    "k64_two_batch_dims_300x300": (((2, 1, 300, 64), 64, 0, False), ((3, 64, 300), 300, 0, False), "no_tma"),
    "k63_a_lines_unaligned_4096x32": (((4096, 63), 63, 0, False), ((63, 32), 32, 0, False), "no_tma"),
    "k63_a_lines_unaligned_32x4096": (((32, 63), 63, 0, False), ((63, 4096), 4096, 0, False), "no_tma"),
    "k63_a_lines_unaligned_64x4096": (((64, 63), 63, 0, False), ((63, 4096), 4096, 0, False), False),
    "k99_a_lines_unaligned_1025x1024": (((1025, 99), 99, 0, False), ((99, 1024), 1024, 0, False), False),
    # beyond 2^20 outputs: an odd N of at most 64 with K <= 64 (taken; not with N = 1025, whose rows the tile GEMMs
    # stage, nor K = 65) and M or N at most 32 (taken)
    "k64_b_lines_odd_16700x63": (((16700, 64), 64, 0, False), ((64, 63), 63, 0, False), "no_tma"),
    "k64_b_lines_odd_1025x1025": (((1025, 64), 64, 0, False), ((64, 1025), 1025, 0, False), False),
    "k65_b_lines_odd_1025x1025": (((1025, 65), 68, 0, False), ((65, 1025), 1025, 0, False), False),
    "k31_a_lines_unaligned_40000x32": (((40000, 31), 31, 0, False), ((31, 32), 32, 0, False), "no_tma"),
    "k32_tile16_both_col": (((3, 16, 32), 16, 0, True), ((3, 32, 16), 32, 0, True), True),
    "k33_tile16_b_offset": (((3, 11, 33), 33, 0, False), ((3, 33, 14), 14, 1, False), True),
    "k64_tile16_a_col": (((3, 16, 64), 16, 0, True), ((3, 64, 10), 10, 0, False), True),
    "k48_tile32": (((4, 32, 48), 48, 0, False), ((4, 48, 32), 32, 0, False), True),
    "k64_tile32_b_col": (((2, 25, 64), 64, 0, False), ((2, 64, 32), 64, 0, True), True),
    "k65_tile32_offsets_b_col": (((2, 20, 65), 68, 1, False), ((2, 65, 31), 65, 2, True), True),
    "k65_tile64_a_col": (((2, 64, 65), 64, 0, True), ((2, 65, 40), 40, 0, False), True),
}


def _small_gemm_tile(m: int, n: int, k: int, entries: int, sm_count: int) -> int:
    """The small GEMM's tile for `entries` m x n outputs (small_gemm_tile): the smallest of 16, 32 and 64 that holds
    one (64 beyond), but 32 instead of 64 where tile 64's blocks would be at most half as many as the SMs, or at K
    <= 32 at most as many."""
    if max(m, n) <= 32:
        return 16 if max(m, n) <= 16 else 32
    blocks = -(-m // 64) * -(-n // 64) * entries
    return 32 if 2 * blocks <= sm_count or (k <= 32 and blocks <= sm_count) else 64


def _small_gemm_k_bucket(tile: int, k: int) -> int:
    """The largest K of the small GEMM's kernel for a tile and K: tiles 16 and 32 have kernels for K <= 32, <= 64
    and <= 128 (fewer registers at a smaller K), tile 64 for K <= 64 and <= 128."""
    return next(bucket for bucket in ((64, 128) if tile == 64 else (32, 64, 128)) if k <= bucket)


def _fma_sequence_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b (2-D) as one float32 fused multiply-add per product in k order from +0: each step rounds the exact
    acc + a_ik b_kj to float32 once. float64 holds each product exactly and two-sum gives the exact error of their
    sum, which decides the rounding where float64's own rounding lands on a float32 tie."""
    a64, b64 = a.double().cpu(), b.double().cpu()
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float32)
    for i in range(a.shape[1]):
        x, p = acc.double(), a64[:, i : i + 1] * b64[i : i + 1, :]
        s = x + p
        v = s - x
        err = (x - (s - v)) + (p - v)
        nearest = s.float()
        beyond = torch.where(s > nearest.double(), torch.full_like(nearest, math.inf), torch.full_like(nearest, -math.inf))
        other = torch.nextafter(nearest, beyond)  # the float on s's other side
        tie = torch.isfinite(s) & (nearest.double() != s) & ((s - nearest.double()) == (other.double() - s))
        toward_other = tie & (err != 0) & ((err > 0) == (other.double() > s))
        acc = torch.where(toward_other, other, nearest)
    return acc


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("method", ["fp16", "auto"])
@pytest.mark.parametrize("magnitudes", ["normal", "wide"])
@pytest.mark.parametrize("case", list(SMALL_GEMM_CASES))
def test_corrected_matmul_small_gemm(gen, monkeypatch, case, magnitudes, method):
    """Small products run as one kernel, the small GEMM, by default where each batch entry's output fits a 64 x 64
    tile or the call's output is at most 256^2 elements with M, N <= 256, or on H100/H200 at most 2^20 elements
    where TMA could not read an operand in place and the tile GEMMs would stay slow on a copy (SMALL_GEMM_CASES'
    "no_tma"; and with TORCH_WMMAE_SMALL_GEMM=1 on more tiles), in the smallest of its tiles that holds the output
    (16, 32 or 64; 32 for a 64 x 64 output on small grids) and its kernel for the K bucket that holds K, over any
    strides, offsets and broadcasts; it writes every output (a NaN-poisoned pool) and is correct: within the
    dot-product bound, and on "wide" inputs (_make_wide: 2^+-40, an Inf, a NaN) auto keeps float32 accuracy and
    float64's NaN and Inf. Its fp16 method gives the tile GEMMs' bits (the same scaling, split and order of
    tensor-core sums), and every tile forced gives the default's bits (auto's wide tiles aside: which outputs
    share a tile with a line that is not fp16-safe depends on the tile)."""
    (a_shape, a_ld, a_off, a_col), (b_shape, b_ld, b_off, b_col), by_default = SMALL_GEMM_CASES[case]
    if by_default == "no_tma":
        by_default = runs_sm90_gemm()
    a = _strided_matrix(gen, a_shape, a_ld, a_off, col_major=a_col)
    b = _strided_matrix(gen, b_shape, b_ld, b_off, col_major=b_col)
    if magnitudes == "wide":
        if a.shape[-2] <= 7 or b.shape[-1] <= 9:
            pytest.skip("_make_wide's Inf and NaN lie outside these shapes")
        _make_wide(gen, a, b)
    entries = math.prod(torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    large_output = 4 * entries * a.shape[-2] * b.shape[-1] > 1 << 20  # (beyond the pool's small blocks)

    call = lambda: torch_wmmae.corrected_matmul(a, b, method=method)
    pool = lambda: poisoned_cuda_pool(float("nan"), large=large_output)

    sm_count = torch.cuda.get_device_properties(a.device).multi_processor_count
    monkeypatch.delenv(SMALL_TILE_SWITCH, raising=False)
    outs, kernels = _calls_by_switch(monkeypatch, SMALL_GEMM_SWITCH, ("default", "1", "0"), call, pool=pool)
    monkeypatch.setenv(SMALL_GEMM_SWITCH, "1")
    tiles = ("16", "32", "64")
    forced, forced_kernels = _calls_by_switch(monkeypatch, SMALL_TILE_SWITCH, tiles, call, pool=pool)
    if profiler_records_kernels():
        for tile in tiles:
            ran = _own_kernels(forced_kernels[tile])
            bucket = _small_gemm_k_bucket(int(tile), a.shape[-1])
            assert len(ran) == 1 and f"{SMALL_GEMM_KERNEL}<{tile}, {bucket}," in ran[0], (tile, ran)
        for switch, small in (("default", by_default), ("1", True), ("0", False)):
            ran = _own_kernels(kernels[switch])
            if small:  # one kernel: no pre-pass, workspace zeroing or exit kernels
                assert len(ran) == 1 and SMALL_GEMM_KERNEL in ran[0], (switch, ran)
                tile = _small_gemm_tile(a.shape[-2], b.shape[-1], a.shape[-1], entries, sm_count)
                bucket = _small_gemm_k_bucket(tile, a.shape[-1])
                assert f"{SMALL_GEMM_KERNEL}<{tile}, {bucket}," in ran[0], (switch, tile, bucket, ran)
            else:
                assert not any(SMALL_GEMM_KERNEL in name for name in ran), (switch, ran)
    for switch, out in [("default", outs["default"]), ("1", outs["1"])] + [(f"tile {t}", forced[t]) for t in tiles]:
        _assert_matmul_on_magnitudes(out, a, b, magnitudes, method, f"{case} {switch}")
    if by_default:
        torch.testing.assert_close(outs["default"], outs["1"], rtol=0, atol=0, equal_nan=True)
    if method == "fp16" or magnitudes == "normal":  # (auto's wide tiles: float32 FMAs here, tf32 in the tile GEMMs)
        torch.testing.assert_close(outs["1"], outs["0"], rtol=0, atol=0, equal_nan=True,
                                   msg="the fp16 method's bits differ between the small GEMM and the tile GEMMs")
        for tile in tiles:
            torch.testing.assert_close(forced[tile], outs["1"], rtol=0, atol=0, equal_nan=True, msg=f"tile {tile}")


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("a_col", [False, True], ids=["a_row", "a_col"])
@pytest.mark.parametrize("b_col", [False, True], ids=["b_row", "b_col"])
@pytest.mark.parametrize("m,n,k", [(40, 56, 120), (24, 30, 97), (12, 16, 64)], ids=["tile64", "tile32", "tile16"])
def test_small_gemm_auto_takes_float32_fmas_where_a_line_is_not_fp16_safe(gen, monkeypatch, a_col, b_col, m, n, k):
    """auto in the small GEMM: a tile with a line that fp16 cannot hold (a row spanning 2^60; a column with an Inf;
    a row with a NaN) is computed with one float32 fused multiply-add per product in k order (those bits, exactly:
    _fma_sequence_reference), the other tiles of the call with the fp16 method's bits: with the default tile
    (_small_gemm_tile: 32 for the 40 x 56 outputs of these six entries) and with each tile forced, the outputs of
    a planted line's tile and no others."""
    monkeypatch.delenv(SMALL_GEMM_SWITCH, raising=False)
    batch = 6
    a = random_tensor_in_layout((batch, m, k), a_col, gen, "cuda")
    b = random_tensor_in_layout((batch, k, n), b_col, gen, "cuda")
    a[1, 7, 1], a[1, 7, 2] = 2.0**30, 2.0**-30  # entry 1: a row spanning 2^60
    b[3, 5, 9] = float("inf")                   # entry 3: an Inf
    a[4, m - 1, k - 1] = float("nan")           # entry 4: a NaN
    monkeypatch.delenv(SMALL_TILE_SWITCH, raising=False)
    with deterministic():
        fp16 = torch_wmmae.corrected_matmul(a, b, method="fp16")
    fma = {z: _fma_sequence_reference(a[z], b[z]) for z in (1, 3, 4)}
    sm_count = torch.cuda.get_device_properties(a.device).multi_processor_count
    for forced in ("default", "16", "32", "64"):
        if forced == "default":
            monkeypatch.delenv(SMALL_TILE_SWITCH, raising=False)
            tile = _small_gemm_tile(m, n, k, batch, sm_count)
        else:
            monkeypatch.setenv(SMALL_TILE_SWITCH, forced)
            tile = int(forced)
        with deterministic():
            auto = torch_wmmae.corrected_matmul(a, b, method="auto").cpu()
        expected = fp16.cpu()
        rows = lambda r: slice(r // tile * tile, r // tile * tile + tile)  # a line's tile of outputs
        expected[1, rows(7)], expected[4, rows(m - 1)] = fma[1][rows(7)], fma[4][rows(m - 1)]
        expected[3, :, rows(9)] = fma[3][:, rows(9)]
        torch.testing.assert_close(auto, expected, rtol=0, atol=0, equal_nan=True, msg=f"tile {forced}")
    assert not torch.equal(fma[1], fp16[1].cpu())  # (else the test could not tell the paths apart)
    assert_matmul_within_dot_product_bound(fp16[[0, 2, 5]], a[[0, 2, 5]], b[[0, 2, 5]], "fp16-safe entries")


SMALL_GEMM_HH_SWITCH = "TORCH_WMMAE_SMALL_HH_PER_FRAGMENT"


def _hh_per_fragment_expected(tile: int, blocks: int, k: int, sm_count: int) -> bool:
    """small_gemm_hh_per_fragment on H100/H200, where the launch bounds fit tile 64's K <= 64 kernels four (hi*hi sums
    per k-step) and five (per fragment) blocks per SM, tile 32's K <= 32 kernels fourteen and sixteen (shared memory
    allows more): the second where it takes fewer waves of blocks, and at K > 32 at most two."""
    per_k_step, per_fragment = (4, 5) if tile == 64 else (14, 16)
    waves = lambda per_sm: -(-blocks // (per_sm * sm_count))
    return waves(per_fragment) < waves(per_k_step) and (waves(per_fragment) <= 2 or k <= 32)


# (tile, batch, k): on 132 SMs, tile 64 (five blocks per SM or four) at 100 entries one wave either way, 600 one
# wave instead of two, 700 two either way, 1300 two instead of three, 1600 at K = 32 three instead of four; tile 32
# (sixteen or fourteen) at 1000 one wave either way, 2000 one instead of two, 2200 two either way. (Grids of at
# most 2200 blocks: the racecheck and initcheck runs take this file whole.)
HH_PER_FRAGMENT_CASES = [(64, 100, 64), (64, 100, 33), (64, 600, 64), (64, 600, 33), (64, 700, 64), (64, 700, 33),
                         (64, 1300, 64), (64, 1300, 33), (64, 1600, 32), (64, 1600, 64), (32, 1000, 32),
                         (32, 2000, 32), (32, 2000, 17), (32, 2200, 32)]


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("method", ["fp16", "auto"])
@pytest.mark.parametrize("layout", ["a_row_b_col", "a_col_b_row"])
@pytest.mark.parametrize("tile,batch,k", HH_PER_FRAGMENT_CASES, ids=lambda x: str(x))
def test_small_gemm_hi_sums_per_fragment_or_per_k_step(gen, monkeypatch, tile, batch, k, layout, method):
    """Tile 64 at K <= 64 and tile 32 at K <= 32 have two kernels each, the hi*hi sums held per k-step or per output
    fragment (more blocks per SM, more fragment loads): the same operations per output in the same order, so the
    same bits, each correct; by default (on H100/H200) the second runs where it takes fewer waves of blocks, at K >
    32 at most two (_hh_per_fragment_expected)."""
    monkeypatch.delenv(SMALL_GEMM_SWITCH, raising=False)
    monkeypatch.delenv(SMALL_TILE_SWITCH, raising=False)
    a_col, b_col = layout.startswith("a_col"), layout.endswith("b_col")
    a = _strided_matrix(gen, (batch, tile, k), tile if a_col else k, 0, col_major=a_col)
    b = _strided_matrix(gen, (batch, k, tile), k if b_col else tile, 0, col_major=b_col)
    a[:, ::7] *= 2.0**24  # rows and columns far from 1, which the lines' powers of two bring into fp16's range
    b[..., ::5] *= 2.0**-30
    call = lambda: torch_wmmae.corrected_matmul(a, b, method=method)
    outs, kernels = _calls_by_switch(monkeypatch, SMALL_GEMM_HH_SWITCH, ("default", "1", "0"), call)
    assert_matmul_within_dot_product_bound(outs["1"], a, b, f"per fragment, batch {batch}")
    for switch in ("default", "0"):
        assert torch.equal(outs[switch], outs["1"]), switch
    if profiler_records_kernels():
        props = torch.cuda.get_device_properties(a.device)
        sm_count = props.multi_processor_count
        assert _small_gemm_tile(tile, tile, k, batch, sm_count) == tile  # (else the case would test another tile)
        expected = {"1": True, "0": False}
        if (props.major, props.minor) == (9, 0):
            expected["default"] = _hh_per_fragment_expected(tile, batch, k, sm_count)
        for switch, per_fragment in expected.items():
            ran = [m.groups() for name in kernels[switch] for m in [SMALL_GEMM_KERNEL_ARGS.search(name)] if m]
            assert len(ran) == 1 and ran[0][:2] == (str(tile), str(_small_gemm_k_bucket(tile, k))), (switch, ran)
            assert ran[0][4] == ("true" if per_fragment else "false"), (switch, ran)


@requires_cuda
@pytest.mark.gpu
def test_small_gemm_loops_over_batches_past_the_grid_limit(gen, monkeypatch):
    """More batch entries than a grid's y extent takes (65535): each block loops over entries y, y + 65535, ..."""
    monkeypatch.delenv(SMALL_GEMM_SWITCH, raising=False)
    a = random_tensor(gen, (65535 + 300, 1, 5), "normal", "cuda")
    b = random_tensor(gen, (65535 + 300, 5, 2), "normal", "cuda")
    with poisoned_cuda_pool(float("nan")):  # (the output, 0.5 MB, comes from the pool's small blocks)
        out = torch_wmmae.corrected_matmul(a, b)
    assert_matmul_within_dot_product_bound(out, a, b, "batch past 65535")


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("switch,a_line", [("TORCH_WMMAE_SM90_TMA", 64), (TMA_COPIES_SWITCH, 50)],
                         ids=["tma_off", "copies_off"])
def test_small_gemm_where_the_tile_gemms_read_no_copies(gen, monkeypatch, switch, a_line):
    """Where the wgmma GEMM would copy its stages with cp.async, with its TMA stages switched off
    (TORCH_WMMAE_SM90_TMA=0) or, for A's lines of 50 floats, which TMA cannot read in place, with the copies that it
    can read switched off (TORCH_WMMAE_TMA_COPIES=0), the default rule gives calls of up to 2^20 outputs to the small
    GEMM (512^2 x 64, or x 50 with A's lines of 50 floats, here), which it does not with the switch on; the fp16
    method's bits are the same either way."""
    if not runs_sm90_gemm():
        pytest.skip("the rule is that of the wgmma GEMM (H100/H200)")
    monkeypatch.delenv(SMALL_GEMM_SWITCH, raising=False)
    a = _strided_matrix(gen, (512, a_line), a_line, 0, col_major=False)
    b = random_tensor(gen, (a.shape[1], 512), "normal", "cuda")
    kernels = _same_bits_by_switch(monkeypatch, switch, ("0", "1"), a, b, "fp16", f"A's lines of {a_line}")
    if profiler_records_kernels():
        ran = _own_kernels(kernels["0"])
        assert len(ran) == 1 and SMALL_GEMM_KERNEL in ran[0], ran
        ran = _own_kernels(kernels["1"])
        assert len(ran) == 1 and TMA_KERNEL.search(ran[0]) is not None, ran


# --------------------------------------------------------------------------------------------------------
# corrected_matmul with b broadcast over a's packed batch: one matrix product of batch x M rows (fold_batch_into_rows)
# --------------------------------------------------------------------------------------------------------
def _fold_case(gen, case):
    """(a, b) of a case: b one matrix (or vector) broadcast over a's batch, a's entries packed rows or not."""
    normal = lambda *shape: random_tensor(gen, shape, "normal", "cuda")
    if case == "x_at_w_t":  # column-major b, as the W.t() of a linear layer
        return normal(4, 130, 72), normal(136, 72).t()
    if case == "odd_batch_stride":  # 77 x 33 floats per entry: no batch stride of 16 bytes
        return normal(5, 77, 33), normal(33, 40)
    if case == "one_row_per_entry":  # M = 1, entries 5 rows apart (any batch stride folds)
        return normal(7, 5, 40)[:, 2:3], normal(40, 50)
    if case == "two_batch_dims":  # (2, 3) merge into one batch of 6
        return normal(2, 3, 50, 64), normal(64, 70)
    if case == "storage_offsets":
        return normal(4 * 60 * 48 + 3)[3:].view(4, 60, 48), normal(49, 30)[1:]
    if case == "matrix_vector":  # a 1-D b: out [6, 100]
        return normal(6, 100, 64), normal(64)
    if case == "column_major_a_of_k_1":  # a's rows 1 float apart: [5 x 40, 1] with row stride 1
        return normal(5, 1, 40).transpose(-1, -2), normal(1, 30)
    if case == "entries_not_packed":  # every other entry of a: the batch stays
        return normal(8, 40, 36)[::2], normal(36, 20)
    if case == "broadcast_a":  # a broadcast too (batch stride 0, M > 1): the batch stays
        return normal(1, 60, 48).expand(3, 60, 48), normal(48, 30)
    if case == "broadcast_a_of_one_row":  # M = 1 and a batch stride of 0: the batch stays (rows 0 apart: no TMA)
        return normal(1, 1, 48).expand(5, 1, 48), normal(48, 30)
    raise ValueError(case)


FOLD_CASES = ["x_at_w_t", "odd_batch_stride", "one_row_per_entry", "two_batch_dims", "storage_offsets",
              "matrix_vector", "column_major_a_of_k_1", "entries_not_packed", "broadcast_a", "broadcast_a_of_one_row"]


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case", FOLD_CASES)
def test_corrected_matmul_folds_the_batch_into_rows(gen, monkeypatch, case, method):
    """Where b is one matrix broadcast over a's batch and a's entries are its rows continued (one batch stride of M
    rows, or M = 1), the call is one product of batch x M rows (as torch.matmul's); the cases with a's entries not
    packed or a broadcast too keep their batch. Here each case is correct both ways, folded (the default) and with the
    batch kept (TORCH_WMMAE_FOLD_BATCH=0): into a NaN-poisoned pool, within the float32 bound, within 2^-20 of each
    other, a's and b's values untouched. (Which way a call went shows in its memory only:
    test_folded_batch_reads_an_odd_stride_batch_in_place.)"""
    a, b = _fold_case(gen, case)
    a_before, b_before = a.clone(), b.clone()
    outs = {}
    for setting in ("folded", "kept"):
        if setting == "folded":
            monkeypatch.delenv(FOLD_SWITCH, raising=False)
        else:
            monkeypatch.setenv(FOLD_SWITCH, "0")
        with poisoned_cuda_pool(float("nan")):
            outs[setting] = torch_wmmae.corrected_matmul(a, b, method=method)
        assert outs[setting].shape == torch.matmul(a, b).shape
        assert_matmul_within_dot_product_bound(outs[setting], a, b, f"{case} {setting}")
    assert torch.equal(a, a_before) and torch.equal(b, b_before)
    assert rel_err(outs["folded"], outs["kept"].double()) < 2**-20


IN_DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
OUT_DTYPES = {"out_f32": torch.float32, "out_f16": torch.float16, "out_bf16": torch.bfloat16}


def _vectors(gen, batch: int, n: int, dtype, offset: bool, device: str) -> torch.Tensor:
    """(batch, n) vectors, contiguous; with `offset`, a view that starts one element into its storage, so
    that no 16-byte copy can be aligned."""
    base = random_tensor(gen, (batch * n + 1,), "normal", device, dtype)
    return base[int(offset):][: batch * n].view(batch, n)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("in_dtype", list(IN_DTYPES))
@pytest.mark.parametrize("out_dtype", list(OUT_DTYPES))
@pytest.mark.parametrize("n,batch", [(16, 37), (48, 9), (100, 5), (300, 2)], ids=lambda x: str(x))
@pytest.mark.parametrize("offset", [False, True], ids=["aligned", "offset"])
def test_batched_outer_paths(device, gen, in_dtype, out_dtype, n, batch, offset):
    u = _vectors(gen, batch, n, IN_DTYPES[in_dtype], offset, device)
    v = _vectors(gen, batch, n, IN_DTYPES[in_dtype], not offset, device)
    # (On CUDA, where the caching allocator runs (not under compute-sanitizer), the outputs, at most 720 KB each,
    # come from memory filled with NaN: an element the kernel does not write stays NaN, which assert_outer_correct
    # refuses.)
    with poisoned_pool_where_possible(device, float("nan"), OUT_DTYPES[out_dtype]):
        out = torch_wmmae.batched_outer(u, v, alpha=0.75, out_dtype=OUT_DTYPES[out_dtype])
        same = torch_wmmae.batched_outer(u, alpha=0.75, out_dtype=OUT_DTYPES[out_dtype])  # v = u: staged once
    assert_outer_correct(out, u, v, 0.75, OUT_DTYPES[out_dtype])
    assert_outer_correct(same, u, None, 0.75, OUT_DTYPES[out_dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [16, 100])
def test_batched_outer_fp32_values_outside_the_split_range(device, gen, n):
    u = random_tensor(gen, (6, n), "normal", device)
    v = random_tensor(gen, (6, n), "normal", device)
    u[0, 3], u[1, 5], u[2, 7] = float("inf"), float("nan"), 3.0e38  # bf16 rounding of 3e38 overflows
    v[3, 2], v[4, 9] = 2.0**-130, 1.0e-38  # subnormal, and a normal value whose lower terms would be subnormal
    out = torch_wmmae.batched_outer(u, v, alpha=-2.0)
    assert_outer_correct(out, u, v, -2.0, None)
