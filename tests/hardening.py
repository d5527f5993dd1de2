"""Shared checks of the hardening tests (issue #6): test_fuzz_batched_outer, test_bad_inputs, test_stress,
test_large and test_multi_gpu.

The references are independent of the package: float64 arithmetic on the inputs (u v^T + alpha I is exact in
float64 for every input dtype: the products of two float32 values have at most 48 significant bits), and
torch.matmul in float64 for corrected_matmul.
"""
from __future__ import annotations

import math
import os

import torch

import torch_wmmae
from conftest import U32, float32_matmuls, random_tensor, rel_err

# float32's smallest normal number: where its subnormal range begins.
FP32_TINY = 2.0**-126
# One ulp of float32's subnormal range.
FP32_SUBNORMAL_ULP = 2.0**-149


def env_int(name: str, default: int) -> int:
    """An integer from the environment (tests scale their work with it), `default` when unset."""
    value = os.environ.get(name, "")
    return int(value) if value.strip() else default


def is_gpu(device) -> bool:
    return torch.device(device).type == "cuda"


def _f64(x: float) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


def analytic_arch(device) -> int:
    """The fragment_map(arch=...) table that the GPU `device` must measure: its compute capability where an
    analytic table exists (sm_80, 86, 89, 90 share one layout), else 80."""
    major, minor = torch.cuda.get_device_capability(torch.device(device))
    cc = 10 * major + minor
    return cc if cc in (80, 86, 89, 90) else 80


# --------------------------------------------------------------------------------------------------------
# batched_outer
# --------------------------------------------------------------------------------------------------------
def as_float32_value(alpha: float) -> float:
    """alpha as the op uses it: rounded to a float32 value (inf when it overflows float32)."""
    return float(torch.tensor(alpha, dtype=torch.float64).float())


def _sum_rounded_once_to_float32_ties(product: torch.Tensor, a32: float) -> torch.Tensor:
    """product + a32 in float64 (product exact: one of two 24-bit significands), except where that sum is a tie of
    float32 rounding (halfway between two float32 values) and not exact: there the float32 neighbour on the exact
    sum's side. Rounding the result to float32 then rounds the exact sum once, as fmaf does: a float64 sum of a large
    product and a small alpha can land on the tie (alpha lost), which float32 rounding would break to even instead of
    towards alpha (a CPU fuzz case: u_i = -1.032e16, alpha = 3.06)."""
    total = product + a32
    back = total - product  # TwoSum: total + error == product + a32 exactly
    error = (product - (total - back)) + (a32 - back)
    nearest = total.float()
    other = torch.nextafter(nearest, torch.where(total > nearest.double(), torch.inf, -torch.inf).float())
    tie = torch.isfinite(total) & torch.isfinite(other) & (total == (nearest.double() + other.double()) / 2)
    towards_error = torch.where(error > 0, torch.maximum(nearest, other), torch.minimum(nearest, other)).double()
    return torch.where(tie & (error != 0), towards_error, total)


def outer_reference64(u: torch.Tensor, v: torch.Tensor | None, alpha: float) -> torch.Tensor:
    """u v^T + alpha I in float64, on the CPU (ties of float32 rounding on the diagonal broken as the exact sum
    would break them: _sum_rounded_once_to_float32_ties). alpha is added on the diagonal only (an infinite alpha must
    not turn the off-diagonal zeros of alpha * I into NaN)."""
    u64 = u.detach().cpu().double()
    v64 = u64 if v is None else v.detach().cpu().double()
    out = u64.unsqueeze(-1) * v64.unsqueeze(-2)
    a32 = as_float32_value(alpha)
    if a32 != 0.0:
        diagonal = out.diagonal(0, -2, -1)
        diagonal.copy_(_sum_rounded_once_to_float32_ties(diagonal.clone(), a32))
    return out


def outer_fp32_tolerance(u, v, alpha: float, ref: torch.Tensor, on_gpu: bool) -> torch.Tensor:
    """How far the op's float32 intermediate result may be from the float64 reference, per element.

    - CPU: 0. The CPU implementation computes in float64 and rounds once: correctly rounded.
    - GPU, fp16/bf16 inputs: 0 off the diagonal (an fp16/bf16 product is exact in float32; in float32's
      subnormal range the tensor core rounds the product itself: one subnormal ulp). On the diagonal with
      alpha != 0: 0 (u_i v_i + alpha rounded once: the mma's product plus alpha where that product is exact,
      fmaf of the inputs elsewhere; Inf and NaN as in float64).
    - GPU, float32 inputs: 4 u (|u_i v_j| + |alpha| d_ij) + 2^-126, as in test_batched_outer.
    """
    if not on_gpu:
        return torch.zeros_like(ref)
    n = ref.shape[-1]
    diag = torch.eye(n, dtype=torch.bool).expand(ref.shape)
    a32 = as_float32_value(alpha)
    if u.dtype == torch.float32:
        u64 = u.detach().cpu().double().abs()
        v64 = u64 if v is None else v.detach().cpu().double().abs()
        scale = u64.unsqueeze(-1) * v64.unsqueeze(-2) + torch.where(diag, _f64(abs(a32)), _f64(0.0))
        return 4 * U32 * scale + FP32_TINY
    subnormal = torch.where(ref.abs() < FP32_TINY, _f64(FP32_SUBNORMAL_ULP), _f64(0.0))
    if a32 == 0.0:
        return subnormal
    return torch.where(diag, _f64(0.0), subnormal)


def _describe_outer_failure(mask, out, out_dtype, ref, lo, hi, u, v, alpha) -> str:
    bad = mask.nonzero()
    idx = tuple(bad[0].tolist())
    i, j = idx[-2], idx[-1]
    u_c = u.detach().cpu()
    v_c = u_c if v is None else v.detach().cpu()
    ui = u_c[idx[:-2] + (i,)].item()
    vj = v_c[idx[:-2] + (j,)].item()
    return (
        f"{bad.shape[0]} bad element(s) of {tuple(out.shape)}; first at {idx}: u_i={ui!r} v_j={vj!r} "
        f"alpha={alpha!r} ({u.dtype} -> {out_dtype}, {u.device}): got {out[idx].item()!r}, float64 reference "
        f"{ref[idx].item()!r}, allowed [{lo[idx].item()!r}, {hi[idx].item()!r}]"
    )


def assert_outer_correct(out: torch.Tensor, u: torch.Tensor, v: torch.Tensor | None, alpha: float,
                         out_dtype: torch.dtype | None) -> None:
    """The accuracy contract of batched_outer (issue #6), for any inputs including NaN, Inf, subnormals:

    - shape (..., n, n), dtype out_dtype (float32 by default), contiguous, on u's device;
    - NaN exactly where the float64 reference is NaN, the same signed Inf where it is infinite;
    - elsewhere the result is the float64 reference with the float32 error of `outer_fp32_tolerance`,
      rounded once to out_dtype: out in [R(ref - tol), R(ref + tol)], R = rounding to out_dtype (monotone,
      so this allows exactly the double rounding float32 -> fp16/bf16 of a float32 result within tol).
      On the CPU tol = 0: out == R(ref), bit for bit, so a zero has the reference's sign wherever tol = 0
      (where the tensor core sums a product with zeros, -0 may come out +0, as tol allows).
    """
    want_dtype = torch.float32 if out_dtype is None else out_dtype
    assert out.dtype == want_dtype, f"dtype {out.dtype}, expected {want_dtype}"
    assert out.shape == (*u.shape, u.shape[-1]), f"shape {tuple(out.shape)} for u of shape {tuple(u.shape)}"
    assert out.device == u.device
    assert out.is_contiguous()
    if out.numel() == 0:
        return
    ref = outer_reference64(u, v, alpha)
    got = out.detach().cpu()
    got64 = got.double()
    nan_ref, inf_ref = torch.isnan(ref), torch.isinf(ref)
    nan_mismatch = torch.isnan(got64) != nan_ref
    inf_mismatch = inf_ref & (got64 != ref)
    finite = ~(nan_ref | inf_ref)
    tol = torch.where(finite, outer_fp32_tolerance(u, v, alpha, ref, is_gpu(u.device)), _f64(0.0))
    ref_f = torch.where(finite, ref, _f64(0.0))
    lo = (ref_f - tol).to(want_dtype).double()
    hi = (ref_f + tol).to(want_dtype).double()
    lo = torch.where(finite, lo, ref)
    hi = torch.where(finite, hi, ref)
    out_of_range = finite & ~((got64 >= lo) & (got64 <= hi))
    zero_sign = finite & (tol == 0) & (ref == 0) & (torch.signbit(got64) != torch.signbit(ref))  # (-0 == +0)
    for mask, what in ((nan_mismatch, "NaN positions"), (inf_mismatch, "Inf values"), (out_of_range, "values"),
                       (zero_sign, "signs of zero")):
        assert not mask.any(), f"{what} differ: " + _describe_outer_failure(mask, got64, want_dtype, ref, lo, hi, u, v, alpha)


# --------------------------------------------------------------------------------------------------------
# corrected_matmul
# --------------------------------------------------------------------------------------------------------
def fp32_floor(absprod: torch.Tensor, ref: torch.Tensor) -> float:
    """u * || |a| |b| ||_F / ||a b||_F (absprod = |a| |b|, ref = a b): the error of rounding every product once,
    relative to the result. Guards a comparison against a float32 result that is (nearly) exact by luck."""
    den = torch.linalg.vector_norm(ref).item()
    return U32 * torch.linalg.vector_norm(absprod).item() / den if den > 0 else U32


def parity_slack(k: int) -> float:
    """How much larger than torch.matmul's float32 error ours may be, measured on test_corrected_matmul's
    data with the CPU implementation (20-30 seeds per case; worst observed ratio in brackets).

    - 1.5 in general: two errors of the same order of magnitude drawn from the same inputs fluctuate around
      each other [K=100: <= 0.66; 15x17, K=16/17: <= 1.25].
    - 3.0 for K <= 32: the float32 result is a handful of roundings (a SIMD dot product rounds each product
      and ~log2(K) partial sums), and with few outputs its error can be far below an ulp by luck; ours adds
      the sequential sum of one k-step plus the split's own error per product (test_corrected_matmul's SPLIT_SLACK)
      [1x1, K=16, U(0,1): 2.69].
    - 4.0 for K >= 1000: torch.matmul's float32 GEMM may sum in blocks (MKL's sgemm on the CPU always keeps
      many SIMD partial sums; cuBLAS may split K for skinny shapes), which grows its error far more slowly
      than one accumulator per output (a GPU SGEMM thread, and our k-step loop) [CPU, 64x64, K=4096,
      U(0,1): fp16 2.65, tf32 3.74; K=1000: 1.58]. test_beats_simt_fp32_accumulation checks the claim of the
      published method directly: ours is MORE accurate than one-accumulator float32 (3-4x on the CPU).
    """
    if k <= 32:
        return 3.0
    if k >= 1000:
        return 4.0
    return 1.5


# Normwise error of corrected_matmul against torch.matmul's float32 (TF32 off) on the same device, or against
# u || |a| |b| || / || a b || where that is larger: at most about 4 for matrices (test_corrected_matmul's slack),
# up to 8.7 for one output of K = 1 or 2 (the split's own error, over millions of samples). A product without
# the correction terms is 20 to thousands of times further off (fp16 alone keeps 11 bits).
NORMWISE_SLACK = 12.0


def assert_matmul_within_dot_product_bound(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, what: str = "") -> None:
    """torch.matmul's shape, float32, contiguous, and float32 accuracy two ways:
    - elementwise, the classical float32 dot-product bound |out - ref| <= (K' + 16) u (|a| |b|): K' sequential
      roundings plus the split's error per product (as in the property test of test_corrected_matmul), where
      K' counts the output's nonzero products (adding an exact zero rounds nothing): K for dense operands,
      fewer where zeros in a or b leave an output only a few terms, so that a product which mishandles
      those terms (drops their corrections, say) cannot hide behind the rounding allowance of all K;
    - normwise, within NORMWISE_SLACK of a float32 GEMM of the same operands: the elementwise bound grows like
      K while rounding errors grow like sqrt(K), so from K of about 1000 on it alone would pass a product
      without the correction terms.
    References in float64 on a's device."""
    a64, b64 = a.detach().double(), b.detach().double()
    ref = torch.matmul(a64, b64)
    assert out.shape == ref.shape, f"{what}shape {tuple(out.shape)}, torch.matmul gives {tuple(ref.shape)}"
    assert out.dtype == torch.float32 and out.is_contiguous() and out.device == a.device
    if out.numel() == 0:
        return
    absprod = torch.matmul(a64.abs(), b64.abs())
    if (a64 == 0).any().item() or (b64 == 0).any().item():
        terms = torch.matmul((a64 != 0).double(), (b64 != 0).double())
    else:
        terms = a.shape[-1]
    bound = (terms + 16) * U32 * absprod
    err = (out.double() - ref).abs()
    bad = ~(err <= bound)
    if bad.any().item():
        idx = tuple(bad.nonzero()[0].tolist())
        raise AssertionError(
            f"{what}{int(bad.sum().item())} element(s) outside (K'+16)u|a||b| for {tuple(a.shape)} @ "
            f"{tuple(b.shape)}; first at {idx}: got {out[idx].item()!r}, float64 {ref[idx].item()!r}, "
            f"bound {bound[idx].item():.3e}"
        )
    if torch.linalg.vector_norm(ref).item() == 0:
        return
    with float32_matmuls(allow_tf32=False):
        err32 = rel_err(torch.matmul(a.detach(), b.detach()), ref)
    if not math.isfinite(err32):  # (float32 overflowed where the float64 reference did not: the floor decides)
        err32 = 0.0
    floor = fp32_floor(absprod, ref)
    err = rel_err(out, ref)
    assert err <= NORMWISE_SLACK * max(err32, floor), (
        f"{what}normwise error {err:.3e} against float32's {err32:.3e} (floor {floor:.3e}) for {tuple(a.shape)} @ "
        f"{tuple(b.shape)}"
    )


# --------------------------------------------------------------------------------------------------------
# A device context that still works
# --------------------------------------------------------------------------------------------------------
def assert_device_still_usable(device, gen: torch.Generator) -> None:
    """Runs small, correct calls of every op on `device` and checks them against references; on a GPU then
    synchronizes, so that an asynchronous error of an earlier (bad) call (an illegal address, a launch
    failure) surfaces here and the CUDA context is shown to be usable."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:  # "cuda" means the current device; tensors report its index
        dev = torch.device("cuda", torch.cuda.current_device())
    a = random_tensor(gen, (19, 37), "normal", dev)
    b = random_tensor(gen, (37, 11), "normal", dev)
    assert_matmul_within_dot_product_bound(torch_wmmae.corrected_matmul(a, b), a, b)
    u = random_tensor(gen, (3, 21), "normal", dev, torch.float16)
    assert_outer_correct(torch_wmmae.batched_outer(u, alpha=0.0), u, None, 0.0, None)
    if dev.type == "cuda":
        table = torch_wmmae.fragment_map("accumulator", 16, 16, 16, "float", device=dev)
        assert table.device == dev
        want = torch_wmmae.fragment_map("accumulator", 16, 16, 16, "float", arch=analytic_arch(dev))
        assert torch.equal(table.cpu(), want)
        torch.cuda.synchronize(dev)
