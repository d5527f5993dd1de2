"""Property tests of batched_outer (issue #6): random sizes, batch shapes (empty, 0-sized, several dims),
dtypes, v / None, out_dtype, alpha (0, random, large, Inf/NaN), strided and offset views, and values with
NaN, Inf, huge and tiny magnitudes, subnormals.

Every result is checked against the float64 reference u v^T + alpha I computed from the inputs, with the
accuracy contract of the issue (see hardening.assert_outer_correct): fp16/bf16 inputs -> float32 exact;
float32 inputs within 4 u (|u_i v_j| + |alpha| d_ij) + 2^-126; fp16/bf16 outputs the (GPU: float32)
result rounded once; NaN and Inf exactly where the float64 reference has them. The CPU implementation must
be correctly rounded (bit-exact). Input buffers are padded with NaN around strided views: a kernel that reads
outside the view produces NaN where the reference has none, and a write into an input is detected bitwise.

TORCH_WMMAE_HYPOTHESIS_EXAMPLES sets the number of examples per device (default 40, 100 on a machine with a
GPU; e.g. 1000 for a deeper GPU run, 5 under compute-sanitizer).
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torch_wmmae import batched_outer

from conftest import DEVICES, HAS_CUDA, random_signs
from hardening import assert_outer_correct, env_int

EXAMPLES = env_int("TORCH_WMMAE_HYPOTHESIS_EXAMPLES", 100 if HAS_CUDA else 40)
IN_DTYPES = [torch.float16, torch.bfloat16, torch.float32]
OUT_DTYPES = [None, torch.float32, torch.float16, torch.bfloat16]
DISTS = ["normal", "wide", "tiny", "huge", "specials", "mixed"]
LAYOUTS = ["contiguous", "transposed", "strided", "offset", "expanded"]
SIZES = [0, 1, 2, 3, 5, 7, 13, 15, 16, 17, 31, 32, 33, 47, 48, 64, 97, 100, 127, 128, 130]
# A batch dimension: 1 to 6, sometimes 0 (an empty batch).
BATCH_SIZES = st.integers(0, 15).map(lambda x: x if x <= 6 else 1 + x % 6)
MAX_OUTPUT_ELEMENTS = 2**20  # keeps the float64 references of one example small on a CPU

# Exponent ranges (base 2) of the magnitude distributions, per dtype: "wide" spans many binades
# (float32: 2^U(-60, 60) as in the issue), "tiny" is the subnormal range, "huge" reaches the largest finite value.
EXPONENTS = {
    torch.float32: {"wide": (-60, 60), "tiny": (-149, -126), "huge": (120, 128)},
    torch.bfloat16: {"wide": (-60, 60), "tiny": (-133, -126), "huge": (120, 128)},
    torch.float16: {"wide": (-24, 15), "tiny": (-24, -14), "huge": (12, 16)},
}
SPECIALS = torch.tensor([math.nan, math.inf, -math.inf, 0.0, -0.0], dtype=torch.float64)


# --------------------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------------------
def _magnitudes(gen, numel, dtype, dist):
    lo, hi = EXPONENTS[dtype][dist]
    mag = torch.exp2(torch.rand(numel, generator=gen, dtype=torch.float64) * (hi - lo) + lo)
    return (random_signs(gen, (numel,)) * mag).clamp(-torch.finfo(dtype).max, torch.finfo(dtype).max)


def random_values(gen, shape, dtype, dist) -> torch.Tensor:
    """Fresh random values of `shape` in `dtype` (CPU), drawn from the distribution `dist`."""
    numel = math.prod(shape)
    if dist in ("wide", "tiny", "huge"):
        vals = _magnitudes(gen, numel, dtype, dist)
    elif dist == "normal":
        vals = torch.randn(numel, generator=gen, dtype=torch.float64)
    elif dist == "specials":  # N(0, 1) with about 1 in 8 elements NaN, +-Inf or +-0
        vals = torch.randn(numel, generator=gen, dtype=torch.float64)
        pick = torch.rand(numel, generator=gen) < 0.125
        vals = torch.where(pick, SPECIALS[torch.randint(0, len(SPECIALS), (numel,), generator=gen)], vals)
    elif dist == "mixed":  # every element from any of the above
        choices = torch.stack([
            torch.randn(numel, generator=gen, dtype=torch.float64),
            _magnitudes(gen, numel, dtype, "wide"),
            _magnitudes(gen, numel, dtype, "tiny"),
            _magnitudes(gen, numel, dtype, "huge"),
            SPECIALS[torch.randint(0, len(SPECIALS), (numel,), generator=gen)],
        ])
        vals = choices[torch.randint(0, len(choices), (numel,), generator=gen), torch.arange(numel)]
    else:
        raise ValueError(dist)
    return vals.to(dtype).reshape(shape)


def place(vals: torch.Tensor, layout: str, device, gen) -> tuple[torch.Tensor, torch.Tensor]:
    """A view on `device` holding `vals` with the given memory layout, and the buffer it lives in (padded with
    NaN where the layout leaves gaps). "expanded" repeats the first batch entry (stride 0): the returned view
    then holds those values, not all of `vals`."""
    shape = tuple(vals.shape)
    n = shape[-1]
    if layout == "transposed" and len(shape) >= 2:
        dims = list(reversed(range(len(shape))))
        base = vals.permute(dims).contiguous().to(device)
        return base.permute(dims), base
    if layout == "strided":  # every other (or third) element of a NaN-padded last dimension
        step = 2 + int(torch.randint(0, 2, (), generator=gen))
        base = torch.full((*shape[:-1], step * n + 1), math.nan, dtype=vals.dtype)
        base[..., 1 : 1 + step * n : step] = vals
        base = base.to(device)
        return base[..., 1 : 1 + step * n : step], base
    if layout == "offset":  # contiguous, at an odd storage offset (misaligned for paired loads) in NaN padding
        offset = 1 + 2 * int(torch.randint(0, 8, (), generator=gen))
        base = torch.full((offset + vals.numel() + 5,), math.nan, dtype=vals.dtype)
        base[offset : offset + vals.numel()] = vals.reshape(-1)
        base = base.to(device)
        return base[offset : offset + vals.numel()].view(shape), base
    if layout == "expanded" and len(shape) >= 2 and shape[0] > 1:
        base = vals[:1].contiguous().to(device)
        return base.expand(shape), base
    base = vals.contiguous().to(device)
    return base, base


def draw_alpha(gen, kind: str) -> float:
    if kind == "zero":
        return 0.0
    if kind == "random":
        return float(torch.randn((), generator=gen, dtype=torch.float64) * 2.0 ** (torch.rand((), generator=gen).item() * 8 - 4))
    if kind == "large":
        return float(random_signs(gen, ()) * 2.0 ** (20 + 80 * torch.rand((), generator=gen, dtype=torch.float64)))
    if kind == "special":  # Inf, NaN, a subnormal float32 value, a value that overflows float32
        return [math.inf, -math.inf, math.nan, 2.0**-140, -1e39][int(torch.randint(0, 5, (), generator=gen))]
    raise ValueError(kind)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()]).cpu()


# --------------------------------------------------------------------------------------------------------
# The property test
# --------------------------------------------------------------------------------------------------------
@st.composite
def outer_cases(draw):
    n = draw(st.one_of(st.sampled_from(SIZES), st.integers(1, 130)))
    batch = draw(st.lists(BATCH_SIZES, max_size=3))
    while batch and math.prod(batch) * max(n, 1) ** 2 > MAX_OUTPUT_ELEMENTS:
        batch = batch[1:]
    return dict(
        shape=(*batch, n),
        in_dtype=draw(st.sampled_from(IN_DTYPES)),
        out_dtype=draw(st.sampled_from(OUT_DTYPES)),
        with_v=draw(st.booleans()),
        alpha_kind=draw(st.sampled_from(["zero", "random", "large", "special"])),
        dists=(draw(st.sampled_from(DISTS)), draw(st.sampled_from(DISTS))),
        layouts=(draw(st.sampled_from(LAYOUTS)), draw(st.sampled_from(LAYOUTS))),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


def run_case(device, case):
    gen = torch.Generator().manual_seed(case["seed"])
    dtype = case["in_dtype"]
    u, u_base = place(random_values(gen, case["shape"], dtype, case["dists"][0]), case["layouts"][0], device, gen)
    v = v_base = None
    if case["with_v"]:
        v, v_base = place(random_values(gen, case["shape"], dtype, case["dists"][1]), case["layouts"][1], device, gen)
    alpha = draw_alpha(gen, case["alpha_kind"])
    before = [_bits(b) for b in (u_base, v_base) if b is not None]
    out = batched_outer(u, v, alpha=alpha, out_dtype=case["out_dtype"])
    assert_outer_correct(out, u, v, alpha, case["out_dtype"])
    after = [_bits(b) for b in (u_base, v_base) if b is not None]
    assert all(torch.equal(x, y) for x, y in zip(before, after)), "the op wrote into an input buffer"


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=outer_cases())
def test_random_cases_meet_the_accuracy_contract(device, case):
    run_case(device, case)


# --------------------------------------------------------------------------------------------------------
# Every pair of edge values, in one 16 x 16 tile
# --------------------------------------------------------------------------------------------------------
def _edge_values(dtype) -> list[float]:
    """16 finite values of `dtype` at its edges: smallest and largest subnormal, smallest normal, the largest
    finite value (and, for float32, the largest value that does not round to Inf in bf16 and the smallest
    that does), very large and very small magnitudes, signed zeros, and ordinary values."""
    fi = torch.finfo(dtype)
    sub_min = fi.smallest_normal * fi.eps  # smallest subnormal: 2^-149, 2^-133, 2^-24
    common = [sub_min, -(fi.smallest_normal - sub_min), fi.smallest_normal, fi.max, -fi.max, 0.0, -0.0, 1.0, -1.5,
              1.0 / 3.0]
    if dtype == torch.float32:
        bf16_max = torch.finfo(torch.bfloat16).max
        rounds_to_inf = float(torch.nextafter(torch.tensor(bf16_max + 2.0**119, dtype=torch.float32),
                                              torch.tensor(math.inf)))  # just above bf16's rounding threshold
        extra = [bf16_max, -rounds_to_inf, 2.0**100, -(2.0**-100), 1.2345 * 2.0**-60, -1.777 * 2.0**60]
    elif dtype == torch.bfloat16:
        extra = [2.0**100, -(2.0**-100), 2.0**-126 * 3, -(2.0**127), 1.5 * 2.0**-60, 1e30]
    else:
        extra = [2.0**15, -(2.0**-20), 1000.0, -0.1, 3.140625, 2.0**-10]
    values = common + extra
    assert len(values) == 16
    return values


# Where the CUDA kernel splits a float32 value exactly into three bf16 terms (batched_outer_kernel.cuh's
# bf16x3_exact): zero, or magnitudes in [2^-109, 2^127). A 16 x 16 tile whose values all lie there takes the
# tensor-core path; one value outside sends the tile to float32 on the CUDA cores.
BF16X3_EXACT_RANGE = (2.0**-109, 2.0**127)


def _in_bf16x3_range(x: float) -> bool:
    return x == 0.0 or BF16X3_EXACT_RANGE[0] <= abs(x) < BF16X3_EXACT_RANGE[1]


def _split_range_values() -> list[float]:
    """16 float32 values at the edges of the exact bf16x3 range: its smallest magnitude (and one with a full
    significand there, whose low terms are subnormal), the largest below 2^127 (whose high term rounds up to
    2^127, so that products of two overflow in more than one term), values that need all three terms or whose
    terms carry, signed zeros, and products near float32's smallest normal (1.1 * 2^-63 squared)."""
    below_2_127 = float(torch.nextafter(torch.tensor(2.0**127, dtype=torch.float32), torch.tensor(0.0)))
    return [2.0**-109, -(2.0**-109) * (1 + 2.0**-23), below_2_127, -1.5 * 2.0**126, 0.0, -0.0, 1.0,
            1 + 2.0**-23, -(1 - 2.0**-24), 1.0 / 3.0, -1.5, 1.2345 * 2.0**-60, -1.777 * 2.0**60,
            2.0**100 * (1 + 2.0**-8 + 2.0**-16 + 2.0**-23), -(2.0**-100), 1.1 * 2.0**-63]


# (input dtype, values): float32 has three sets, the others two ("split_range" is float32's tensor-core path).
EDGE_CASES = [(dtype, values) for dtype in IN_DTYPES
              for values in (["split_range"] if dtype == torch.float32 else []) + ["finite", "with_nan_inf"]]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("alpha", [0.0, 0.75])
@pytest.mark.parametrize("out_dtype", OUT_DTYPES[1:], ids=str)
@pytest.mark.parametrize("in_dtype, values", EDGE_CASES, ids=[f"{d}-{v}" for d, v in EDGE_CASES])
def test_all_pairs_of_edge_values(device, in_dtype, values, out_dtype, alpha):
    """u and v hold the same 16 edge values in different orders, so the 16 x 16 result holds every pair of
    them (u_i v_j for all i, j) in one tile. "finite": the dtype's edges, its subnormals and largest values
    included (float32's lie outside the exact bf16x3 range, so the GPU computes that tile in float32 on the
    CUDA cores); "split_range" (float32): the edges of that range, all inside it, so that the GPU takes the
    tensor-core path with the bf16x3 split; "with_nan_inf": "finite" with three values NaN, Inf, -Inf."""
    edge = _split_range_values() if values == "split_range" else _edge_values(in_dtype)
    if values == "with_nan_inf":
        edge[7:10] = [math.nan, math.inf, -math.inf]
    u = torch.tensor(edge, dtype=torch.float64).to(in_dtype)
    if in_dtype == torch.float32 and values != "with_nan_inf":
        assert all(map(_in_bf16x3_range, u.tolist())) == (values == "split_range")
    perm = torch.tensor([(5 * i + 3) % 16 for i in range(16)])
    v = u[perm]
    u2, v2 = torch.stack([u, u.flip(0)]).to(device), torch.stack([v, -v]).to(device)  # a batch of two
    out = batched_outer(u2, v2, alpha=alpha, out_dtype=out_dtype)
    assert_outer_correct(out, u2, v2, alpha, out_dtype)
