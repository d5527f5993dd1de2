"""Large problems (issue #6, CUDA only, marker `large`): more than 2^31 elements in the output or in one
operand, where any 32-bit index or offset computation would wrap, and a batch count above the 65535 of a
CUDA grid dimension.

Each case is skipped unless the GPU has the memory it needs free (torch.cuda.mem_get_info); on an H200 all of
them run. Results are checked against float64 references where 32-bit offsets would go wrong first: the last
rows and columns, every output of the skinny cases, and random entries beyond flat index 2^31 (corrected_matmul
elementwise within the classical float32 bound and normwise no worse than torch.matmul in float32; batched_outer
with the accuracy contract of the fuzz test). Deselect with `-m "not large"`.
"""
from __future__ import annotations

import fcntl
import gc
import os
import tempfile

import pytest
import torch

from torch_wmmae import batched_outer, corrected_matmul

from conftest import U32, poisoned_output, rel_err, requires_cuda
from hardening import assert_matmul_within_dot_product_bound, assert_outer_correct, fp32_floor, parity_slack

pytestmark = [requires_cuda, pytest.mark.gpu, pytest.mark.large, pytest.mark.usefixtures("ieee_fp32")]

GB = 10**9
INT32_LIMIT = 2**31
BIG = 70_000  # 70000^2 = 4.9e9 elements > 2^31
OUTER_BATCH_64 = 2**19 + 3  # n = 64: 2^31 + 12288 output elements
OUTER_BATCH_100 = 215_000  # n = 100: 2.15e9 output elements
MANY_BATCHES = 70_000
BLOCK = 1024  # rows / columns per float64 reference block (0.57 GB at K = 70000; 4096 ran out of memory beside initcheck)
BATCHED_SHAPE = (2, 40_000, 32, 30_000)  # (batch, m, k, n): 1.2e9 outputs per batch entry, 2.4e9 in all
METHODS = ["auto", "fp16", "tf32"]


@pytest.fixture(autouse=True)
def _one_large_test_at_a_time():
    """Holds a lock that every pytest process of this machine shares, so that the xdist workers run these tests one
    at a time, and releases the memory of earlier tests. Each needs most of the GPU's memory, and require_free's
    check raced the other workers' allocations: under -n 8, two tests ran out of memory (session 117). Other files'
    GPU tests, which need far less, may still run beside them."""
    with open(os.path.join(tempfile.gettempdir(), "torch_wmmae_large_tests.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        gc.collect()
        torch.cuda.empty_cache()
        yield
        gc.collect()
        torch.cuda.empty_cache()


def require_free(nbytes: float) -> None:
    free, total = torch.cuda.mem_get_info()
    if free < nbytes:
        pytest.skip(f"needs {nbytes / GB:.1f} GB of free GPU memory, {free / GB:.1f} GB free of {total / GB:.1f} GB")


def cuda_gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


def check_block(got: torch.Tensor, a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    """got = a @ b for a block of the output: elementwise within (K + 16) u |a||b|, and its normwise error
    no worse than torch.matmul in float32 (TF32 off) on the same block, up to parity_slack."""
    assert_matmul_within_dot_product_bound(got.contiguous(), a, b, what=what)
    ref = a.double() @ b.double()
    err, err32 = rel_err(got, ref), rel_err(a @ b, ref)
    floor = fp32_floor(a.double().abs() @ b.double().abs(), ref)
    k = a.shape[-1]
    assert err <= parity_slack(k) * max(err32, floor), f"{what}rel err {err:.3e} vs float32 {err32:.3e} (floor {floor:.3e})"


def sample_rows(m: int, n: int, gen: torch.Generator, count: int = 12) -> torch.Tensor:
    """The first and last rows, the rows around flat index 2^31 of an (m, n) output, and random rows."""
    edge = [0, 1, INT32_LIMIT // n - 1, INT32_LIMIT // n, INT32_LIMIT // n + 1, m - 2, m - 1]
    rand = torch.randint(0, m, (count,), device="cuda", generator=gen)
    return torch.cat([torch.tensor([r for r in edge if 0 <= r < m], device="cuda"), rand]).unique()


def check_entries(out2d: torch.Tensor, a: torch.Tensor, b: torch.Tensor, gen: torch.Generator, what: str) -> None:
    """Random single entries of a 2-D output, half of them beyond flat index 2^31 (and the very last one),
    each against its own float64 dot product."""
    m, n = out2d.shape
    total = m * n
    idx = torch.cat([
        torch.randint(0, min(total, INT32_LIMIT), (256,), device="cuda", generator=gen),
        torch.randint(INT32_LIMIT, total, (256,), device="cuda", generator=gen) if total > INT32_LIMIT else torch.empty(0, dtype=torch.long, device="cuda"),
        torch.tensor([total - 1], device="cuda"),
    ])
    i, j = idx // n, idx % n
    a_i, b_j = a[i].double(), b[:, j].t().double()
    ref = (a_i * b_j).sum(-1)
    bound = (a.shape[-1] + 16) * U32 * (a_i.abs() * b_j.abs()).sum(-1)
    got = out2d.reshape(-1)[idx].double()
    bad = ~((got - ref).abs() <= bound)
    assert not bad.any().item(), (
        f"{what}{int(bad.sum())} of {idx.numel()} sampled entries wrong; first at flat index "
        f"{idx[bad][0].item()}: got {got[bad][0].item()!r}, float64 {ref[bad][0].item()!r}"
    )


# --------------------------------------------------------------------------------------------------------
# corrected_matmul
# --------------------------------------------------------------------------------------------------------
def test_matmul_output_beyond_2_31():
    """(a) C = A B with A 70000 x 64, B 64 x 70000: C has 4.9e9 elements (19.6 GB)."""
    m = n = BIG
    k = 64
    require_free(4 * m * n + 2 * GB)
    gen = cuda_gen(1)
    a = torch.randn(m, k, device="cuda", generator=gen)
    b = torch.randn(k, n, device="cuda", generator=gen)
    rows = sample_rows(m, n, gen)
    cols = torch.cat([torch.tensor([0, n - 1], device="cuda"), torch.randint(0, n, (6,), device="cuda", generator=gen)])
    for method in METHODS:
        out = poisoned_output(lambda: corrected_matmul(a, b, method=method), (m, n))
        what = f"method={method}: "
        check_block(out[rows], a[rows], b, what + "rows: ")
        check_block(out[:, cols], a, b[:, cols], what + "columns: ")
        check_entries(out, a, b, gen, what)
        del out
        torch.cuda.empty_cache()


def _big(shape, transposed, gen):
    """A float32 CUDA matrix of `shape`, stored row-major or (transposed) column-major."""
    if transposed:
        return torch.randn(shape[::-1], device="cuda", generator=gen).t()
    return torch.randn(shape, device="cuda", generator=gen)


@pytest.mark.parametrize("transposed", [False, True], ids=["row_major", "col_major"])
def test_matmul_a_beyond_2_31(transposed):
    """(b) A 70000 x 70000 (4.9e9 elements, 19.6 GB), B 70000 x 16: every output checked, in row blocks."""
    m = k = BIG
    n = 16
    require_free(4 * m * k + 10 * GB)  # A, and float64 copies of row blocks for the references
    gen = cuda_gen(2)
    a = _big((m, k), transposed, gen)
    b = torch.randn(k, n, device="cuda", generator=gen)
    for method in METHODS:
        out = poisoned_output(lambda: corrected_matmul(a, b, method=method), (m, n))
        for start in range(0, m, BLOCK):
            blk = slice(start, min(start + BLOCK, m))
            check_block(out[blk], a[blk], b, f"method={method} rows {blk.start}..{blk.stop}: ")
        del out


@pytest.mark.parametrize("transposed", [False, True], ids=["row_major", "col_major"])
def test_matmul_b_beyond_2_31(transposed):
    """(c) A 16 x 70000, B 70000 x 70000 (4.9e9 elements, 19.6 GB): every output checked, in column blocks."""
    m = 16
    k = n = BIG
    require_free(4 * k * n + 10 * GB)
    gen = cuda_gen(3)
    a = torch.randn(m, k, device="cuda", generator=gen)
    b = _big((k, n), transposed, gen)
    for method in METHODS:
        out = poisoned_output(lambda: corrected_matmul(a, b, method=method), (m, n))
        for start in range(0, n, BLOCK):
            blk = slice(start, min(start + BLOCK, n))
            check_block(out[:, blk], a, b[:, blk], f"method={method} columns {blk.start}..{blk.stop}: ")
        del out


def test_matmul_batched_output_beyond_2_31():
    """(e) Each of 2 batch entries below 2^31 elements, together above: (2, 40000, 32) @ (2, 32, 30000)."""
    batch, m, k, n = BATCHED_SHAPE
    require_free(4 * batch * m * n + 2 * GB)
    gen = cuda_gen(5)
    a = torch.randn(batch, m, k, device="cuda", generator=gen)
    b = torch.randn(batch, k, n, device="cuda", generator=gen)
    rows = sample_rows(m, n, gen)
    # the last rows of the last batch entry lie beyond flat index 2^31 of the whole output
    assert (batch - 1) * m * n + (m - 1) * n > INT32_LIMIT
    for method in METHODS:
        out = poisoned_output(lambda: corrected_matmul(a, b, method=method), (batch, m, n))
        for i in range(batch):
            check_block(out[i, rows], a[i, rows], b[i], f"method={method} batch {i} rows: ")
        check_block(out[-1, -3:], a[-1, -3:], b[-1], f"method={method} last rows: ")
        del out
        torch.cuda.empty_cache()


@pytest.mark.parametrize("method", METHODS)
def test_matmul_more_than_65535_batch_entries(method):
    """(f) 70000 batch entries: more than a CUDA grid's y/z dimension holds. torch.matmul's semantics allow any
    batch count (the CPU implementation has no limit)."""
    gen = cuda_gen(6)
    a = torch.randn(MANY_BATCHES, 3, 16, device="cuda", generator=gen)
    b = torch.randn(MANY_BATCHES, 16, 5, device="cuda", generator=gen)
    out = poisoned_output(lambda: corrected_matmul(a, b, method=method), (MANY_BATCHES, 3, 5))
    assert_matmul_within_dot_product_bound(out, a, b, what=f"method={method}: ")


FALLBACK_BATCH = 2**29 + 1000  # one tile each, 4 quadrants: 2^31 + 4000 items of the float32 fallback


def test_matmul_float32_fallback_beyond_2_31_items():
    """(g) The tf32 split's float32 fallback claims (batch entry, tile, quadrant) items from one counter: with
    2^29 + 1000 batch entries of 1 x 2 @ 2 x 1 whose rows span 2^160 (every tile beyond the split's limits,
    so every item is checked) it counts past 2^31. Where b's second element is 0 the output is the product of
    a's 2^-100-sized element alone, which the split keeps to 22 bits: nearly all such outputs are too small to
    absorb that, and the fallback computes them again, as float32 does (correctly rounded). Such entries lie
    throughout the batch, the last ones included. Checked: every output against float64; the share of exact
    lone products (99.96% on the CPU; 64% where the split keeps them, in rows spanning 2^140); the last
    entries' bits against the CPU implementation, which makes the same decisions one entry at a time."""
    batch = FALLBACK_BATCH
    require_free(36 * GB)  # a, b, the output, the workspace's line ranges (12 B per line), float64 chunks
    gen = cuda_gen(7)
    a = torch.empty(batch, 1, 2, device="cuda")
    a[..., 0].uniform_(1, 2, generator=gen).mul_(2.0**-100)
    a[..., 1].uniform_(-2, 2, generator=gen).mul_(2.0**60)
    b = torch.empty(batch, 2, 1, device="cuda").uniform_(-2, 2, generator=gen)
    alone = torch.rand(batch, device="cuda", generator=gen) < 0.01
    alone[-100:] = True
    b[alone, 1, 0] = 0.0
    out = poisoned_output(lambda: corrected_matmul(a, b, method="tf32"), (batch, 1, 1))
    k = 2
    for start in range(0, batch, 2**26):
        z = slice(start, min(start + 2**26, batch))
        a64, b64 = a[z].double(), b[z].double()
        ref = torch.matmul(a64, b64)
        err = (out[z].double() - ref).abs()
        bound = (k + 16) * U32 * torch.matmul(a64.abs(), b64.abs())
        bad = ~(err <= bound)
        assert not bad.any().item(), f"{int(bad.sum())} outputs outside (K+16)u|a||b| in entries {z.start}..{z.stop}"
        del a64, b64, ref, err, bound, bad
    lone = alone.nonzero().squeeze(1)
    exact = out[lone, 0, 0] == (a[lone, 0, 0].double() * b[lone, 0, 0].double()).float()
    assert exact.double().mean().item() >= 0.99, f"{int((~exact).sum())} of {lone.numel()} lone products not exact"
    last = torch.cat([lone[-1000:], torch.arange(batch - 1000, batch, device="cuda")]).unique()
    cpu = corrected_matmul(a[last].cpu(), b[last].cpu(), method="tf32")
    assert torch.equal(out[last].cpu(), cpu), "the last entries' outputs against the CPU implementation"


# --------------------------------------------------------------------------------------------------------
# batched_outer
# --------------------------------------------------------------------------------------------------------
OUTER_CASES = {  # name -> (n, batch, input dtype, out_dtype, alpha, with v)
    "n64_fp16_to_fp32": (64, OUTER_BATCH_64, torch.float16, None, 0.0, False),
    "n64_bf16_v_alpha": (64, OUTER_BATCH_64, torch.bfloat16, None, 0.5, True),
    "n64_fp32_to_fp32": (64, OUTER_BATCH_64, torch.float32, None, -1.25, True),
    "n64_fp16_to_fp16": (64, OUTER_BATCH_64, torch.float16, torch.float16, 1.0, False),
    "n64_fp32_to_bf16": (64, OUTER_BATCH_64, torch.float32, torch.bfloat16, 0.0, False),
    "n100_partial_tiles": (100, OUTER_BATCH_100, torch.float16, None, 2.0, True),
}


@pytest.mark.parametrize("case", list(OUTER_CASES))
def test_batched_outer_output_beyond_2_31(case):
    """(d) Outputs of more than 2^31 elements (8.6 GB in float32): sampled batch entries checked, including
    the first, those around flat index 2^31 and the last ones."""
    n, batch, dtype, out_dtype, alpha, with_v = OUTER_CASES[case]
    assert batch * n * n > INT32_LIMIT
    out_size = torch.empty(0, dtype=out_dtype or torch.float32).element_size()
    require_free(batch * n * n * out_size + 2 * GB)
    gen = cuda_gen(4)
    u = torch.randn(batch, n, device="cuda", generator=gen).to(dtype)
    v = torch.randn(batch, n, device="cuda", generator=gen).to(dtype) if with_v else None
    out = poisoned_output(lambda: batched_outer(u, v, alpha=alpha, out_dtype=out_dtype), (batch, n, n),
                          out_dtype or torch.float32)
    assert out.shape == (batch, n, n) and out.dtype == (out_dtype or torch.float32)
    crossing = INT32_LIMIT // (n * n)
    edge = [0, 1, crossing - 1, crossing, crossing + 1, batch - 3, batch - 2, batch - 1]
    edge = sorted({e for e in edge if 0 <= e < batch})
    idx = torch.cat([torch.tensor(edge, device="cuda"), torch.randint(0, batch, (64,), device="cuda", generator=gen)])
    assert_outer_correct(out[idx], u[idx], None if v is None else v[idx], alpha, out_dtype)
