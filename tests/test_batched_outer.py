"""batched_outer(u, v=None, alpha=0, out_dtype=None) = u v^T + alpha I per batch index.

Reference: the float64 product (exact for fp16/bf16 inputs: 11- or 8-bit significands multiply exactly),
plus alpha on the diagonal, rounded once to the output dtype.
"""
from __future__ import annotations

import pytest
import torch

from torch_wmmae import batched_outer

from conftest import (TORCH_FUNC_TRANSFORMS, U32, assert_memory_savers_keep_gradients, compiled_autograd_graphs,
                      dispatched_ops, graph_calls,
                      assert_node_saves_only_the_other_operand, float32_matmuls, leaves,
                      poisoned_pool_where_possible, random_tensor, rel_err, requires_cuda)
from hardening import assert_outer_correct, is_gpu, outer_reference64

LOW = [torch.float16, torch.bfloat16]
SIZES = [1, 5, 16, 31, 48, 100, 256]
BATCHES = [(), (7,), (3, 5)]


def ulp(x: torch.Tensor) -> torch.Tensor:
    """The ulp of every element of x (in x's dtype), as float64."""
    a = x.detach().cpu().abs()
    return (torch.nextafter(a, torch.full_like(a, float("inf"))).double() - a.double())


def diag_mask(shape, device="cpu") -> torch.Tensor:
    n = shape[-1]
    return torch.eye(n, dtype=torch.bool, device=device).expand(shape)


def assert_rounded_reference(out, ref64, *, diag_ulps: int, offdiag_ulps: int):
    """out == ref64 rounded once to out.dtype, up to the given number of ulps on/off the diagonal."""
    out = out.cpu()
    want = ref64.to(out.dtype)
    if diag_ulps == 0 and offdiag_ulps == 0:
        assert torch.equal(out, want), f"max |diff| {(out.double() - want.double()).abs().max().item():.3e}"
        return
    diff = (out.double() - want.double()).abs()
    on = diag_mask(out.shape)
    tol = torch.where(on, diag_ulps * ulp(want), offdiag_ulps * ulp(want))
    assert (diff <= tol).all(), f"max diff {diff.max().item():.3e}"


def poisoned_outer(u, v=None, **kwargs) -> torch.Tensor:
    """batched_outer(u, v, **kwargs), its output carved on CUDA from memory filled with NaN of its dtype
    (poisoned_pool_where_possible): an element the kernel fails to write stays NaN."""
    out_dtype = kwargs.get("out_dtype") or torch.float32
    with poisoned_pool_where_possible(u.device, float("nan"), out_dtype, large=True):
        return batched_outer(u, v, **kwargs)


# --------------------------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch", BATCHES, ids=str)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_low_precision_inputs_exact(device, gen, dtype, n, batch):
    """fp16/bf16 inputs, alpha = 0: every element is one exact product rounded once to float32: exact."""
    u = random_tensor(gen, (*batch, n), "normal", device, dtype)
    v = random_tensor(gen, (*batch, n), "normal", device, dtype)
    out = poisoned_outer(u, v)
    assert out.shape == (*batch, n, n) and out.dtype == torch.float32 and out.is_contiguous()
    assert out.device == u.device
    assert_rounded_reference(out, outer_reference64(u, v, 0.0), diag_ulps=0, offdiag_ulps=0)


@pytest.mark.parametrize("batch", BATCHES, ids=str)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_low_precision_inputs_with_alpha(device, gen, dtype, n, batch):
    """alpha != 0: off-diagonal elements stay exact; the diagonal u_i v_i + alpha is rounded once (the CUDA
    kernel adds alpha to the exact product, or uses fmaf): correctly rounded on CPU and GPU."""
    u = random_tensor(gen, (*batch, n), "normal", device, dtype)
    v = random_tensor(gen, (*batch, n), "normal", device, dtype)
    alpha = float(torch.randn((), generator=gen, dtype=torch.float64)) * 3.7
    out = poisoned_outer(u, v, alpha=alpha)
    assert out.dtype == torch.float32
    assert_rounded_reference(out, outer_reference64(u, v, alpha), diag_ulps=0, offdiag_ulps=0)


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_alpha_cancelling_the_diagonal_product(device, dtype):
    """u_i v_i + alpha where the two nearly cancel (found by the fuzz test on an H200: an fp16 subnormal
    u_i = -5.1856e-06 times v_i = -27296 against alpha = -0.1373): the result is far smaller than either term
    and must still be the correctly rounded sum. The tensor core's own accumulate (alpha as the mma's C)
    lost an ulp of the larger term there, 32 ulps of the result. Also: a product that overflows float32
    against alpha = -Inf is -Inf, as in float64 (an overflowed product plus -Inf would be NaN)."""
    n = 16
    u = torch.linspace(-3.0, 3.0, n, dtype=torch.float64)
    v = torch.linspace(5.0, 0.25, n, dtype=torch.float64)
    u[4], v[4] = -5.185604095458984e-06, -27296.0
    u, v = u.to(dtype).to(device), v.to(dtype).to(device)
    alpha = -0.13733171175000178
    p = u[4].double() * v[4].double()
    assert (p + torch.tensor(alpha, dtype=torch.float32).double()).abs() < 0.05 * p.abs()  # they cancel
    out = poisoned_outer(u, v, alpha=alpha)
    assert_rounded_reference(out, outer_reference64(u, v, alpha), diag_ulps=0, offdiag_ulps=0)
    huge = torch.full((3,), 2.0**127 if dtype == torch.bfloat16 else 60000.0, dtype=dtype, device=device)
    big_alpha = float("-inf") if dtype == torch.bfloat16 else -3.0e38  # fp16: 60000^2 is finite in float32
    want = outer_reference64(huge, None, big_alpha).float()
    got = poisoned_outer(huge, alpha=big_alpha)
    assert torch.equal(got.cpu(), want), (got, want)


def test_float32_diagonal_rounded_once(device):
    """float32 inputs: the diagonal u_i v_i + alpha is rounded once to float32, as fmaf rounds it. Here
    u v = 64 + 2^-40 exactly, and with alpha = 2^30 the exact sum lies 2^-40 above the midpoint between two
    float32 values: rounded once it goes up (2^30 + 128); summed in float64 first it lands on the midpoint and
    then rounds to even (2^30), an ulp too low. The same negated goes down. The float64 reference of the other tests
    (outer_reference64) breaks such ties as the exact sum does (the CPU fuzz test met one: u_i^2 = 1.065e32 on a tie,
    alpha = 3.06)."""
    u = torch.tensor([[8392705 * 2.0**-23]], device=device)
    v = torch.tensor([[16769026 * 2.0**-18]], device=device)
    assert u.double() * v.double() == 64 + 2.0**-40
    for sign in (1.0, -1.0):
        out = poisoned_outer(sign * u, v, alpha=sign * 2.0**30)
        assert out.item() == sign * (2.0**30 + 128)
        assert torch.equal(out.cpu(), outer_reference64(sign * u, v, sign * 2.0**30).float())


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_alpha_where_float32_cannot_hold_the_product(device, dtype):
    """On the GPU a diagonal element is the mma's product plus alpha where that product is exact in float32
    and fmaf(u_i, v_i, alpha) of the inputs otherwise: zero products, bf16 products below float32's normal
    range (which the tensor core rounds) or above it, Inf and NaN. Each must still be u_i v_i + alpha rounded
    once; alpha = 2^-130 sits in float32's subnormal range, where 2^-140 + alpha is exact but a rounded or
    lost product would show."""
    inf, nan = float("inf"), float("nan")
    tiny, big = (2.0**-70, 2.0**100) if dtype == torch.bfloat16 else (2.0**-24, 60000.0)
    u = torch.tensor([tiny, -tiny, 3 * tiny, 0.0, -0.0, inf, -inf, nan, big, -big, 1.5, -2.0, 0.375, 7.0, tiny, 1.0])
    v = torch.tensor([tiny, tiny, 5 * tiny, 2.0, -3.0, 1.0, 0.0, 1.0, big, big, -0.5, 3.0, 0.0, -tiny, 2.0, nan])
    u, v = u.to(dtype).to(device), v.to(dtype).to(device)
    for alpha in (2.0**-130, -(2.0**-130), 1.0, -inf, inf):
        assert_outer_correct(poisoned_outer(u, v, alpha=alpha), u, v, alpha, None)
        assert_outer_correct(poisoned_outer(u.expand(3, 16), v.expand(3, 16), alpha=alpha), u.expand(3, 16),
                             v.expand(3, 16), alpha, None)


@pytest.mark.parametrize("batch", [(), (7,), (3, 5)], ids=str)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("alpha", [0.0, -1.25])
def test_float32_inputs(device, gen, n, batch, alpha):
    """fp32 inputs: within a few float32 ulps of the product: |out - ref| <= 4 u (|u_i v_j| + |alpha| d_ij)."""
    u = random_tensor(gen, (*batch, n), "normal", device)
    v = random_tensor(gen, (*batch, n), "normal", device)
    out = poisoned_outer(u, v, alpha=alpha)
    assert out.dtype == torch.float32 and out.shape == (*batch, n, n)
    ref = outer_reference64(u, v, alpha)
    scale = outer_reference64(u.abs(), v.abs(), abs(alpha))
    err = (out.cpu().double() - ref).abs()
    assert (err <= 4 * U32 * scale + 2.0**-126).all(), f"max err/scale {(err / scale).max().item():.3e}"
    if not is_gpu(device):  # the CPU computes in float64 and rounds once: correctly rounded
        assert torch.equal(out.cpu(), ref.float())


@pytest.mark.parametrize("n", [1, 16, 31, 100])
@pytest.mark.parametrize("alpha", [0.0, 0.5])
@pytest.mark.parametrize("out_dtype", LOW, ids=str)
@pytest.mark.parametrize("in_dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_low_precision_out_dtype(device, gen, in_dtype, out_dtype, alpha, n):
    """out_dtype fp16/bf16: the float64 reference rounded once to out_dtype (1 ulp allowed on the GPU)."""
    u = random_tensor(gen, (6, n), "normal", device, in_dtype)
    v = random_tensor(gen, (6, n), "normal", device, in_dtype)
    out = poisoned_outer(u, v, alpha=alpha, out_dtype=out_dtype)
    assert out.dtype == out_dtype and out.shape == (6, n, n) and out.is_contiguous()
    ulps = 1 if is_gpu(device) else 0
    assert_rounded_reference(out, outer_reference64(u, v, alpha), diag_ulps=ulps, offdiag_ulps=ulps)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_alpha_added_exactly_once_on_the_diagonal(device, gen, dtype):
    """Small non-zero integers: every product and every sum is exact in any precision, so the result must be
    u v^T + alpha I exactly on every device (alpha added once, and only on the diagonal)."""
    n = 48
    vals = torch.randint(1, 9, (4, n), generator=gen) * torch.where(torch.rand(4, n, generator=gen) < 0.5, -1, 1)
    u = vals.to(dtype).to(device)
    v = vals.flip(-1).to(dtype).to(device)
    alpha = 0.75
    out = poisoned_outer(u, v, alpha=alpha)
    expected = (vals.double().unsqueeze(-1) * vals.flip(-1).double().unsqueeze(-2) + alpha * torch.eye(n)).float()
    assert torch.equal(out.cpu(), expected)
    no_alpha = poisoned_outer(u, v)
    assert torch.equal((out - no_alpha).cpu(), alpha * torch.eye(n).expand(4, n, n))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("alpha", [0.0, 2.5])
def test_v_none_equals_v_u(device, gen, dtype, alpha):
    u = random_tensor(gen, (5, 37), "normal", device, dtype)
    a = poisoned_outer(u, alpha=alpha)
    b = poisoned_outer(u, u.clone(), alpha=alpha)
    if dtype == torch.float32:
        # float32 products are not exact: compare both to the reference at the float32 tolerance.
        scale = outer_reference64(u.abs(), None, abs(alpha))
        for out in (a, b):
            assert ((out.cpu().double() - outer_reference64(u, None, alpha)).abs() <= 4 * U32 * scale + 2.0**-126).all()
    else:
        assert torch.equal(a, b)
    if not is_gpu(device):
        assert torch.equal(a, b)


# --------------------------------------------------------------------------------------------------------
# Shapes and layouts
# --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "shape", [(0, 5), (3, 0, 4), (0,), (4, 0), (2, 3, 0)], ids=str
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_empty(device, dtype, shape):
    u = torch.ones(shape, dtype=dtype, device=device)  # values are irrelevant: nothing to compute
    out = poisoned_outer(u, alpha=1.0)
    assert out.shape == (*shape, shape[-1])
    assert out.numel() == 0 and out.dtype == torch.float32 and out.device == u.device


def _strided_inputs(gen, device, dtype, case):
    r = lambda *s: random_tensor(gen, s, "normal", device, dtype)  # noqa: E731
    if case == "last_dim_strided":
        return r(6, 80)[:, ::2], r(6, 120)[:, 1::3]
    if case == "storage_offset":
        return r(9, 50)[2:8, 5:45], r(7, 43)[1:, 3:]
    if case == "transposed":
        return r(40, 6).t(), r(40, 6).t()
    if case == "batch_permuted":
        return r(5, 40, 3).permute(2, 0, 1), r(3, 5, 40)
    if case == "expanded_batch":
        return r(1, 40).expand(4, 40), r(4, 40)
    if case == "expanded_elements":  # stride 0 along n: every element of u's rows the same
        return r(4, 1).expand(4, 40), r(4, 40)
    raise ValueError(case)


@pytest.mark.parametrize("case", ["last_dim_strided", "storage_offset", "transposed", "batch_permuted", "expanded_batch",
                                  "expanded_elements"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_strided_inputs(device, gen, dtype, case):
    u, v = _strided_inputs(gen, device, dtype, case)
    assert not (u.is_contiguous() and v.is_contiguous())
    out = poisoned_outer(u, v)
    assert out.is_contiguous() and out.shape == (*u.shape, u.shape[-1])
    assert_rounded_reference(out, outer_reference64(u, v, 0.0), diag_ulps=0, offdiag_ulps=0)
    assert torch.equal(out, poisoned_outer(u.contiguous(), v.contiguous()))


# --------------------------------------------------------------------------------------------------------
# Bad inputs
# --------------------------------------------------------------------------------------------------------
def _bad(device):
    f = lambda *s, dtype=torch.float16: torch.randn(s, device=device).to(dtype)  # noqa: E731
    return {
        "u_0d": ((f(),), {}, r"argument 'u' must have shape \(\.\.\., n\)"),
        "u_int": ((torch.ones(3, 4, dtype=torch.int32, device=device),), {}, r"argument 'u' must be float16, bfloat16 or float32"),
        "u_float64": ((f(3, 4, dtype=torch.float64),), {}, r"argument 'u' must be float16, bfloat16 or float32"),
        "shape": ((f(3, 4), f(3, 5)), {}, r"argument 'v' must have the shape of 'u'"),
        "shape_batch": ((f(3, 4), f(2, 4)), {}, r"argument 'v' must have the shape of 'u'"),
        "dtype": ((f(3, 4), f(3, 4, dtype=torch.bfloat16)), {}, r"argument 'v' must have the dtype of 'u'"),
        "out_float64": ((f(3, 4),), {"out_dtype": torch.float64}, r"argument 'out_dtype' must be float32, float16 or bfloat16"),
        "out_int": ((f(3, 4),), {"out_dtype": torch.int32}, r"argument 'out_dtype'"),
    }


@pytest.mark.parametrize("case", list(_bad("cpu")))
def test_bad_inputs(device, case):
    args, kwargs, pattern = _bad(device)[case]
    with pytest.raises(RuntimeError, match=pattern):
        batched_outer(*args, **kwargs)


@requires_cuda
@pytest.mark.gpu
def test_mixed_devices():
    u = torch.randn(3, 4, device="cuda").half()
    with pytest.raises(RuntimeError, match=r"arguments 'u' and 'v' must be on the same device"):
        batched_outer(u, u.cpu())
    with pytest.raises(RuntimeError, match=r"same device"):
        batched_outer(u.cpu(), u)


# --------------------------------------------------------------------------------------------------------
# Autograd: grad_u = g v, grad_v = g^T u (v = None: grad_u = (g + g^T) u), in float32, in the inputs' dtype
# --------------------------------------------------------------------------------------------------------
# The float32 dot products of n terms, then one rounding to the input dtype (half an ulp: 2^-11, 2^-8, 2^-24).
_GRAD_ROUNDING = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24}


def _outer64(u64, v64, alpha):
    n = u64.shape[-1]
    return u64.unsqueeze(-1) * v64.unsqueeze(-2) + alpha * torch.eye(n, dtype=torch.float64)


def _assert_gradient_close(got, want64, magnitude64, n):
    """|got - want| <= (n U32 + rounding to got's dtype) * magnitude, where magnitude = the same sum of |terms|."""
    assert got.dtype in _GRAD_ROUNDING and got.shape == want64.shape
    tol = ((n + 2) * U32 + _GRAD_ROUNDING[got.dtype]) * magnitude64 + 2.0**-126
    err = (got.detach().cpu().double() - want64).abs()
    assert (err <= tol).all(), f"max err/tol {(err / tol).max().item():.3f}"


@pytest.mark.parametrize("out_dtype", [None, torch.bfloat16], ids=str)
@pytest.mark.parametrize("with_v", [True, False], ids=["v", "v_none"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_gradients_match_float64(device, gen, dtype, with_v, out_dtype):
    n = 19
    u = random_tensor(gen, (3, 2, n), "normal", device, dtype).requires_grad_()
    v = random_tensor(gen, (3, 2, n), "normal", device, dtype).requires_grad_() if with_v else None
    out = batched_outer(u, v, alpha=0.7, out_dtype=out_dtype)
    g = random_tensor(gen, out.shape, "normal", device, out.dtype)
    inputs = (u, v) if with_v else (u,)
    grads = torch.autograd.grad(out, inputs, g)

    u64 = u.detach().cpu().double().requires_grad_()
    v64 = v.detach().cpu().double().requires_grad_() if with_v else u64
    inputs64 = (u64, v64) if with_v else (u64,)
    want = torch.autograd.grad(_outer64(u64, v64, 0.7), inputs64, g.cpu().double())
    # The same sums over |terms|: the scale of each gradient element's rounding error.
    ua = u64.detach().abs().requires_grad_()
    va = v64.detach().abs().requires_grad_() if with_v else ua
    magnitude = torch.autograd.grad(_outer64(ua, va, 0.0), (ua, va) if with_v else (ua,), g.cpu().double().abs())
    for got, ref, mag, x in zip(grads, want, magnitude, inputs):
        assert got.dtype == x.dtype and got.device == x.device
        _assert_gradient_close(got, ref, mag, n)


def _outer_gradient(grad_out, other, which):
    """The gradient of u (which = "u") or v of batched_outer(u, v) for the output's gradient grad_out, from the other
    input (float64), and the same sum of |terms|: grad_u = g v, grad_v = g^T u."""
    g = grad_out if which == "u" else grad_out.transpose(-1, -2)
    return (g @ other.unsqueeze(-1)).squeeze(-1), (g.abs() @ other.abs().unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("which", ["u", "v"])
def test_gradient_of_one_input(device, gen, which):
    u = random_tensor(gen, (4, 11), "normal", device).requires_grad_(which == "u")
    v = random_tensor(gen, (4, 11), "normal", device).requires_grad_(which == "v")
    grad_out = random_tensor(gen, (4, 11, 11), "normal", device)  # (not sum()'s ones, which are symmetric)
    batched_outer(u, v, alpha=-1.5).backward(grad_out)
    x, other = (u, v) if which == "u" else (v, u)
    assert other.grad is None
    _assert_gradient_close(x.grad, *_outer_gradient(grad_out.cpu().double(), other.detach().cpu().double(), which), 11)


@pytest.mark.parametrize("which", ["u", "v"])
def test_backward_computes_only_the_gradients_asked_for(device, gen, which):
    """Both inputs require gradients, the backward pass asks for one (torch.autograd.grad): one product of the
    output's gradient with a vector (a sum over its last dimension), not two with one dropped."""
    u = random_tensor(gen, (4, 11), "normal", device).requires_grad_()
    v = random_tensor(gen, (4, 11), "normal", device).requires_grad_()
    grad_out = random_tensor(gen, (4, 11, 11), "normal", device)
    out = batched_outer(u, v, alpha=-1.5)
    x, other = (u, v) if which == "u" else (v, u)
    grads = []
    ops = dispatched_ops(lambda: grads.extend(torch.autograd.grad(out, x, grad_out)))
    assert ops.count("aten::sum") == 1, ops
    _assert_gradient_close(grads[0], *_outer_gradient(grad_out.cpu().double(), other.detach().cpu().double(), which), 11)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("with_v", [True, False], ids=["v", "v_none"])
def test_compiled_autograd_of_an_eager_call(device, gen, with_v, dtype):
    """Compiled Autograd (the backward pass traced as one graph) over an op called eagerly: the C++ node hands it a
    function of the gradients (apply_with_saved), whose call is in the traced graph: the float64 gradients, within
    the float32 sums' error and the rounding to the inputs' dtype (v = None: u's gradient of both roles), and a pass
    that asks for u's gradient only computes it alone (one product of the output's gradient with a vector)."""
    u = random_tensor(gen, (4, 11), "normal", device).to(dtype).requires_grad_()
    v = random_tensor(gen, (4, 11), "normal", device).to(dtype).requires_grad_() if with_v else None
    grad_out = random_tensor(gen, (4, 11, 11), "normal", device)
    g64 = grad_out.cpu().double()
    u64 = u.detach().cpu().double()
    out = batched_outer(u, v, alpha=-1.5)
    graphs = compiled_autograd_graphs(lambda: out.backward(grad_out))
    assert any(name.startswith("CppNodeBatchedOuterBackward") for name in graph_calls(graphs)), graph_calls(graphs)
    if with_v:
        _assert_gradient_close(u.grad, *_outer_gradient(g64, v.detach().cpu().double(), "u"), 11)
        _assert_gradient_close(v.grad, *_outer_gradient(g64, u64, "v"), 11)
        u.grad = v.grad = None
        out = batched_outer(u, v, alpha=-1.5)
        ops = dispatched_ops(lambda: compiled_autograd_graphs(lambda: out.backward(grad_out, inputs=[u])))
        assert ops.count("aten::sum") == 1, ops
        assert v.grad is None
        _assert_gradient_close(u.grad, *_outer_gradient(g64, v.detach().cpu().double(), "u"), 11)
    else:  # grad_u = (g + g^T) u
        want, magnitude = _outer_gradient(g64 + g64.transpose(-1, -2), u64, "u")
        _assert_gradient_close(u.grad, want, magnitude, 22)


@pytest.mark.parametrize("which", ["u", "v"])
def test_node_saves_only_what_the_gradient_reads(device, gen, which):
    """grad_u reads v and grad_v reads u: where one input needs a gradient the node saves only the other, and the
    input that needs the gradient may change in place after the call."""
    u0 = random_tensor(gen, (4, 11), "normal", device).requires_grad_(which == "u")
    v0 = random_tensor(gen, (4, 11), "normal", device).requires_grad_(which == "v")

    def check_gradient(saved, grad_out):  # (as in test_gradient_of_one_input)
        _assert_gradient_close((u0 if which == "u" else v0).grad, *_outer_gradient(grad_out, saved, which), 11)

    op = lambda u, v: batched_outer(u, v, alpha=-1.5)  # noqa: E731
    assert_node_saves_only_the_other_operand(op, [u0 * 1.0, v0 * 1.0], "uv".index(which), check_gradient, gen)


@pytest.mark.parametrize("with_v", [True, False], ids=["v", "v_none"])
def test_memory_savers_keep_gradients(device, gen, with_v):
    """Checkpointing and save_on_cpu around the op; its node saves u and v, or u once where v is None."""
    u = random_tensor(gen, (5, 13), "normal", device, torch.float16).requires_grad_()
    if with_v:
        v = random_tensor(gen, (5, 13), "normal", device, torch.float16).requires_grad_()
        assert_memory_savers_keep_gradients(gen, lambda u, v: batched_outer(u, v, alpha=2.0), (u, v), saved=2)
    else:
        assert_memory_savers_keep_gradients(gen, lambda u: batched_outer(u, alpha=2.0), (u,), saved=1)


@pytest.mark.parametrize("with_v", [True, False], ids=["v", "v_none"])
def test_double_backward_matches_float64(device, gen, with_v):
    """The backward is made of differentiable ops: gradients of gradients work (create_graph=True). With v, the
    derivative of grad_u = g v by v; with v = None, that of grad_u = (g + g^T) u by u."""
    n = 13
    u = random_tensor(gen, (5, n), "normal", device).requires_grad_()
    v = random_tensor(gen, (5, n), "normal", device).requires_grad_() if with_v else None
    g = random_tensor(gen, (5, n, n), "normal", device)
    weight = random_tensor(gen, (5, n), "normal", device)
    (grad_u,) = torch.autograd.grad(batched_outer(u, v, alpha=2.0), u, g, create_graph=True)
    (second,) = torch.autograd.grad((grad_u * weight).sum(), v if with_v else u)

    u64 = u.detach().cpu().double().requires_grad_()
    v64 = v.detach().cpu().double().requires_grad_() if with_v else u64
    (ref_grad_u,) = torch.autograd.grad(_outer64(u64, v64, 2.0), u64, g.cpu().double(), create_graph=True)
    (ref,) = torch.autograd.grad((ref_grad_u * weight.cpu().double()).sum(), v64)
    # d/dv_j sum_i w_i sum_k g_ik v_k = sum_i w_i g_ij (and g_ij + g_ji for v = None): the same sums over |terms|.
    g_abs = g.cpu().double().abs()
    magnitude = torch.einsum("bi,bij->bj", weight.cpu().double().abs(), g_abs if with_v else g_abs + g_abs.mT)
    _assert_gradient_close(second, ref, magnitude, n)


@pytest.fixture
def tf32_matmuls():
    """float32 matmuls allowed to run in TF32 for the test, as a training script may set them."""
    with float32_matmuls(allow_tf32=True):
        yield


@pytest.mark.usefixtures("tf32_matmuls")
@pytest.mark.parametrize("with_v", [True, False], ids=["v", "v_none"])
def test_gradients_stay_float32_where_matmuls_may_use_tf32(device, gen, with_v):
    n = 64
    u = random_tensor(gen, (4, n), "normal", device).requires_grad_()
    v = random_tensor(gen, (4, n), "normal", device).requires_grad_() if with_v else None
    g = random_tensor(gen, (4, n, n), "normal", device)
    batched_outer(u, v).backward(g)
    u64, g64 = u.detach().cpu().double(), g.cpu().double()
    v64 = v.detach().cpu().double() if with_v else u64
    g_u = g64 if with_v else g64 + g64.mT
    want = (g_u * v64.unsqueeze(-2)).sum(-1)
    _assert_gradient_close(u.grad, want, (g_u.abs() * v64.abs().unsqueeze(-2)).sum(-1), n)


@pytest.mark.parametrize("out_dtype", [None, torch.bfloat16], ids=str)
@pytest.mark.parametrize("with_v", [True, False], ids=["v", "v_none"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_forward_mode_matches_float64(device, gen, dtype, with_v, out_dtype):
    """torch.autograd.forward_ad: the output's tangent is u_t v^T + u v_t^T (v = None: u_t u^T + u u_t^T), with
    one or both tangents, summed in float32 and rounded once to the output's dtype."""
    import torch.autograd.forward_ad as fwAD

    n = 17
    u, u_t, v, v_t = (random_tensor(gen, (3, 2, n), "normal", device, dtype) for _ in range(4))
    u64, u_t64, v64, v_t64 = (x.cpu().double() for x in (u, u_t, v, v_t))
    if not with_v:
        v, v64, v_t64 = None, u64, u_t64
    cases = [((u_t, None), _outer64(u_t64, v64, 0.0), _outer64(u_t64.abs(), v64.abs(), 0.0))]
    if with_v:
        cases += [((None, v_t), _outer64(u64, v_t64, 0.0), _outer64(u64.abs(), v_t64.abs(), 0.0)),
                  ((u_t, v_t), _outer64(u_t64, v64, 0.0) + _outer64(u64, v_t64, 0.0),
                   _outer64(u_t64.abs(), v64.abs(), 0.0) + _outer64(u64.abs(), v_t64.abs(), 0.0))]
    else:  # both terms come from u's tangent
        cases = [((u_t, None), _outer64(u_t64, u64, 0.0) + _outer64(u64, u_t64, 0.0),
                  _outer64(u_t64.abs(), u64.abs(), 0.0) + _outer64(u64.abs(), u_t64.abs(), 0.0))]
    for (tu, tv), want, magnitude in cases:
        with fwAD.dual_level():
            du = u if tu is None else fwAD.make_dual(u, tu)
            dv = v if tv is None else fwAD.make_dual(v, tv)
            primal, tangent = fwAD.unpack_dual(batched_outer(du, dv, alpha=0.7, out_dtype=out_dtype))
        assert tangent is not None and tangent.dtype == primal.dtype == (out_dtype or torch.float32)
        _assert_gradient_close(tangent, want, magnitude, 2)


def _transformed_loss(outer, with_v):
    """f(u, w) = sum(cos(u w^T + 0.5 I)), or with v = None f(u, w) = sum(cos((u u^T + 0.5 I) * w as a column))."""
    if with_v:
        return lambda u, w: outer(u, w, 0.5).cos().sum()
    return lambda u, w: (outer(u, None, 0.5) * w.unsqueeze(-1)).cos().sum()


@pytest.mark.parametrize("with_v", [True, False], ids=["v", "v_none"])
@pytest.mark.parametrize("transform", list(TORCH_FUNC_TRANSFORMS))
def test_torch_func_transforms_match_float64(device, gen, transform, with_v):
    """torch.func's transforms run the autograd kernel inside their own layers; every derivative (second
    derivatives too) matches the same transform of the float64 product."""
    u = random_tensor(gen, (2, 6), "normal", device)
    w = random_tensor(gen, (2, 6), "normal", device)
    got = TORCH_FUNC_TRANSFORMS[transform](
        _transformed_loss(lambda x, y, alpha: batched_outer(x, y, alpha=alpha), with_v))(u, w)
    want = TORCH_FUNC_TRANSFORMS[transform](
        _transformed_loss(lambda x, y, alpha: _outer64(x, x if y is None else y, alpha), with_v))(
            u.cpu().double(), w.cpu().double())
    assert len(leaves(got)) == len(leaves(want)) >= 2
    for x, y in zip(leaves(got), leaves(want)):
        assert x.shape == y.shape and x.dtype == torch.float32 and x.device.type == device
        assert rel_err(x, y) < 1e-5


@pytest.mark.usefixtures("vmap_rules_only")
@pytest.mark.parametrize("in_dims", [(0, 0), (1, None), (None, 2), (0, "none")], ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_vmap_is_one_batched_call(device, gen, dtype, in_dims):
    """torch.vmap uses the op's batching rule (one call; the fallback that loops over the samples is off), with
    u or v vmapped alone (the other shared by every sample) or v = None, and gives each sample's result."""
    batch, sample_shape = 4, (3, 9)
    u_dim, v_dim = in_dims

    def operand(dim):
        if dim is None:
            return random_tensor(gen, sample_shape, "normal", device, dtype)
        return torch.stack([random_tensor(gen, sample_shape, "normal", device, dtype) for _ in range(batch)], dim)

    u = operand(u_dim)
    v = None if v_dim == "none" else operand(v_dim)
    f = lambda x, y: batched_outer(x, y, alpha=1.5, out_dtype=torch.float16)
    got = torch.func.vmap(f, in_dims=(u_dim, None if v is None else v_dim))(u, v)
    pick = lambda x, d, i: x if d is None else x.select(d, i)
    want = torch.stack([_outer64(pick(u, u_dim, i).cpu().double(),
                                 pick(u if v is None else v, u_dim if v is None else v_dim, i).cpu().double(), 1.5)
                        for i in range(batch)])
    assert got.shape == want.shape and got.dtype == torch.float16
    assert_rounded_reference(got, want, diag_ulps=0 if dtype == torch.float16 else 1,
                             offdiag_ulps=0 if dtype == torch.float16 else 1)


@pytest.mark.usefixtures("vmap_rules_only")
def test_vmap_with_default_arguments_and_bad_samples(device, gen):
    """vmap of the plain call (the rule sees only the arguments given), and each sample's shapes checked with the
    op's messages: a sample's 0-d u is not taken for the vmapped vector, nor a v of another length."""
    u = random_tensor(gen, (4, 6), "normal", device)
    assert torch.equal(torch.func.vmap(batched_outer)(u), batched_outer(u))
    with pytest.raises(RuntimeError, match=r"batched_outer: argument 'u' must have shape \(\.\.\., n\), got a 0-d tensor"):
        torch.func.vmap(batched_outer)(u[:, 0])
    with pytest.raises(RuntimeError, match=r"batched_outer: argument 'v' must have the shape of 'u' \[6\], got \[5\]"):
        torch.func.vmap(batched_outer, in_dims=(0, None))(u, u[0, :5])


@pytest.mark.filterwarnings("ignore:Input #. requires gradient and is not a double precision")
@pytest.mark.parametrize("with_v", [True, False], ids=["v", "v_none"])
def test_gradcheck_reverse_forward_and_batched(device, gen, with_v):
    """torch.autograd.gradcheck against finite differences: reverse and forward mode, and both under vmap
    (batched gradients, as torch.func.jacrev / jacfwd compute them). float32, with steps of 1e-2 that the
    bilinear product takes without truncation error."""
    u = random_tensor(gen, (2, 5), "normal", device).requires_grad_()
    v = random_tensor(gen, (2, 5), "normal", device).requires_grad_()
    fn, inputs = ((lambda x, y: batched_outer(x, y, alpha=0.3)), (u, v)) if with_v else \
        ((lambda x: batched_outer(x, alpha=0.3)), (u,))
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-2, atol=1e-3, rtol=1e-3, check_forward_ad=True,
                                    check_batched_grad=True, check_batched_forward_grad=True)


def test_alpha_must_be_a_number(device, gen):
    u = random_tensor(gen, (3, 8), "normal", device, torch.float16)
    with pytest.raises(TypeError, match=r"batched_outer: argument 'alpha' must be a Python number, got a Tensor"):
        batched_outer(u, alpha=torch.tensor(0.5))


def test_inference_mode(device, gen):
    u = random_tensor(gen, (3, 8), "normal", device, torch.float16).requires_grad_()
    with torch.inference_mode():
        out = batched_outer(u, alpha=1.0)
    assert out.grad_fn is None and not out.requires_grad
    assert_rounded_reference(out, outer_reference64(u, None, 1.0), diag_ulps=0, offdiag_ulps=0)


def test_no_graph_without_requires_grad(device, gen):
    u = random_tensor(gen, (3, 8), "normal", device, torch.float16)
    assert batched_outer(u).grad_fn is None
    out = batched_outer(u.clone().requires_grad_())
    assert out.grad_fn is not None and out.requires_grad
    with torch.no_grad():
        assert batched_outer(u.clone().requires_grad_()).grad_fn is None


def test_compile_backward_matches_eager(device, gen):
    torch._dynamo.reset()

    def loss(u, v):
        return (batched_outer(u, v, alpha=0.5) * 2.0).sum() + batched_outer(u, out_dtype=torch.bfloat16).float().sum()

    compiled = torch.compile(loss, fullgraph=True)
    u = random_tensor(gen, (6, 21), "normal", device).requires_grad_()
    v = random_tensor(gen, (6, 21), "normal", device).requires_grad_()
    got = torch.autograd.grad(compiled(u, v), (u, v))
    want = torch.autograd.grad(loss(u, v), (u, v))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------------------------------------
# torch.library / torch.compile / CUDA graphs
# --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "case", ["fp16_default", "bf16_v_alpha", "fp32_out_half", "batched", "requires_grad", "v_requires_grad",
             "empty_transposed"]
)
def test_opcheck(device, gen, case):
    if case == "fp16_default":
        u = random_tensor(gen, (4, 16), "normal", device, torch.float16)
        args = (u, None, 0.0, None)
    elif case == "bf16_v_alpha":
        u = random_tensor(gen, (4, 9), "normal", device, torch.bfloat16)
        args = (u, random_tensor(gen, (4, 9), "normal", device, torch.bfloat16), 1.5, None)
    elif case == "fp32_out_half":
        u = random_tensor(gen, (3, 17), "normal", device)
        args = (u, u.clone(), -0.5, torch.float16)
    elif case == "batched":
        u = random_tensor(gen, (2, 3, 31), "normal", device, torch.float16)
        args = (u, None, 0.25, torch.float32)
    elif case == "requires_grad":
        u = random_tensor(gen, (3, 12), "normal", device, torch.bfloat16).requires_grad_()
        args = (u, None, 0.5, None)
    elif case == "v_requires_grad":
        u = random_tensor(gen, (2, 2, 7), "normal", device)
        args = (u, random_tensor(gen, (2, 2, 7), "normal", device).requires_grad_(), 0.0, torch.float16)
    else:  # a zero-size result of a transposed input: its strides must be those of the fake kernel
        args = (torch.empty(0, 4, dtype=torch.float16, device=device).t(), None, 1.0, None)
    torch.library.opcheck(torch.ops.wmmae.batched_outer.default, args)


def test_compile_fullgraph_matches_eager(device, gen):
    torch._dynamo.reset()

    def f(u, v):
        return batched_outer(u, v, alpha=0.5), batched_outer(u, alpha=-2.0, out_dtype=torch.bfloat16)

    compiled = torch.compile(f, fullgraph=True)
    u = random_tensor(gen, (5, 33), "normal", device, torch.float16)
    v = random_tensor(gen, (5, 33), "normal", device, torch.float16)
    for got, want in zip(compiled(u, v), f(u, v)):
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_compile_with_data_dependent_batch_sizes(device, gen):
    """Batch sizes known only when the graph runs (two boolean masks' counts: unbacked symbols): the fake
    kernel's check that v has u's shape becomes a runtime assert, not a guard that fullgraph=True cannot take."""
    torch._dynamo.reset()
    u = random_tensor(gen, (6, 9), "normal", device, torch.float16)
    v = random_tensor(gen, (5, 9), "normal", device, torch.float16)
    mask_u = torch.tensor([True, False, True, True, False, True], device=device)
    mask_v = torch.tensor([True, True, False, True, True], device=device)

    def f(u, mask_u, v, mask_v):
        return batched_outer(u[mask_u], v[mask_v], alpha=0.5)

    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
        got = compiled(u, mask_u, v, mask_v)
        assert torch.equal(got, f(u, mask_u, v, mask_v)) and got.shape == (4, 9, 9)
        # counts that differ: refused when the graph runs (the fake kernel's size check, now a runtime assert)
        with pytest.raises(RuntimeError, match=r"Runtime assertion failed for expression Eq\(u\d+, u\d+\)"):
            compiled(u, mask_u, v, torch.ones(5, dtype=torch.bool, device=device))


@requires_cuda
@pytest.mark.gpu
def test_cuda_graph_capture_replays(gen):
    n = 48
    static_u = random_tensor(gen, (6, n), "normal", "cuda", torch.float16)
    batched_outer(static_u, alpha=1.0)  # warm-up outside the capture (workspace, lazy init)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = batched_outer(static_u, alpha=1.0)
    for _ in range(3):
        fresh = random_tensor(gen, (6, n), "normal", "cuda", torch.float16)
        static_u.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        assert_rounded_reference(static_out, outer_reference64(fresh, None, 1.0), diag_ulps=0, offdiag_ulps=0)
