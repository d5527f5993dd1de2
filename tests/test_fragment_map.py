"""fragment_map: which tile element (row, col) each lane's frag.x[i] holds.

References written here independently of csrc/wmmae/layout.hpp:
- the per-element formulas of the project notes (FACTS.md section 1), re-typed as lambdas below;
- the number of elements of every fragment type, from CUDA's <mma.h> (__frag_base<T, num_elements>);
- Table 2 of Ootomo & Yokota for the sm_70 matrix_a col_major fragment (tests/data, see its header).
On a GPU, the measured layout (load_matrix_sync of an index-encoded tile) must equal the analytic table.
"""
from __future__ import annotations

import itertools
import pathlib

import pytest
import torch

from torch_wmmae import fragment_map

from conftest import HAS_CUDA, requires_cuda

DATA = pathlib.Path(__file__).parent / "data"

# --------------------------------------------------------------------------------------------------------
# Every WMMA fragment type of <mma.h> for sm_80+, with frag.num_elements as declared there.
# (use, m, n, k, dtype) -> num_elements
# --------------------------------------------------------------------------------------------------------
NUM_ELEMENTS = {}
for (m, n, k), (a_n, b_n) in {(16, 16, 16): (8, 8), (32, 8, 16): (16, 4), (8, 32, 16): (4, 16)}.items():
    NUM_ELEMENTS[("matrix_a", m, n, k, "half")] = 16
    NUM_ELEMENTS[("matrix_b", m, n, k, "half")] = 16
    for dt in ("bf16", "int8", "uint8"):
        NUM_ELEMENTS[("matrix_a", m, n, k, dt)] = a_n
        NUM_ELEMENTS[("matrix_b", m, n, k, dt)] = b_n
    for acc in ("float", "half", "int32"):
        NUM_ELEMENTS[("accumulator", m, n, k, acc)] = 8
NUM_ELEMENTS[("matrix_a", 16, 16, 8, "tf32")] = 4
NUM_ELEMENTS[("matrix_b", 16, 16, 8, "tf32")] = 4
NUM_ELEMENTS[("accumulator", 16, 16, 8, "float")] = 8
NUM_ELEMENTS[("matrix_a", 8, 8, 4, "double")] = 1
NUM_ELEMENTS[("matrix_b", 8, 8, 4, "double")] = 1
NUM_ELEMENTS[("accumulator", 8, 8, 4, "double")] = 2


def _with_layouts(keys):
    out = []
    for use, m, n, k, dt in keys:
        layouts = [None] if use == "accumulator" else ["row_major", "col_major"]
        out += [(use, m, n, k, dt, layout) for layout in layouts]
    return out


SM80_FRAGMENTS = _with_layouts(NUM_ELEMENTS)
SM80_ARCHS = [80, 86, 89, 90]


def frag_id(f):
    use, m, n, k, dt, layout = f
    return f"{use}-m{m}n{n}k{k}-{dt}" + (f"-{layout}" if layout else "")


def tile_shape(use, m, n, k):
    return {"matrix_a": (m, k), "matrix_b": (k, n), "accumulator": (m, n)}[use]


def table_of(formula, num_elements):
    """[32, num_elements, 2] int32 from a (lane, x) -> (row, col) lambda."""
    return torch.tensor(
        [[list(formula(lane, x)) for x in range(num_elements)] for lane in range(32)], dtype=torch.int32
    )


# --------------------------------------------------------------------------------------------------------
# FACTS.md section 1, re-typed: (lane l, element x) -> (row, col). B's row is k, its col is n.
# --------------------------------------------------------------------------------------------------------
SM80_A16 = lambda l, x: (l // 4 + 8 * ((x >> 1) & 1), 2 * (l % 4) + (x & 1) + 8 * ((x >> 2) & 1))  # noqa: E731
SM80_B16 = lambda l, x: (2 * (l % 4) + (x & 1) + 8 * ((x >> 1) & 1), l // 4 + 8 * ((x >> 2) & 1))  # noqa: E731
SM80_C16 = SM80_A16  # "C (float or half, 8 elements): same formula as A"
SM80_A_TF32 = lambda l, x: (l // 4 + 8 * (x & 1), l % 4 + 4 * ((x >> 1) & 1))  # noqa: E731
SM80_B_TF32 = lambda l, x: (l % 4 + 4 * (x & 1), l // 4 + 8 * ((x >> 1) & 1))  # noqa: E731

_b = lambda l, i: (l >> i) & 1  # noqa: E731
SM70 = {
    ("matrix_a", "col_major"): lambda l, x: (8 * _b(l, 2) + 4 * _b(l, 4) + (x & 3), (l & 3) + 4 * (x >> 2)),
    ("matrix_a", "row_major"): lambda l, x: ((l & 3) + 8 * _b(l, 2) + 4 * _b(l, 4), x),
    ("matrix_b", "col_major"): lambda l, x: (x, (l & 3) + 8 * _b(l, 3) + 4 * _b(l, 4)),
    ("matrix_b", "row_major"): lambda l, x: ((l & 3) + 4 * (x >> 2), 8 * _b(l, 3) + 4 * _b(l, 4) + (x & 3)),
    ("accumulator", "float"): lambda l, x: (
        (l & 1) + 2 * _b(x, 1) + 4 * _b(l, 4) + 8 * _b(l, 2),
        (x & 1) + 2 * _b(l, 1) + 4 * _b(x, 2) + 8 * _b(l, 3),
    ),
    ("accumulator", "half"): lambda l, x: ((l & 3) + 4 * _b(l, 4) + 8 * _b(l, 2), x + 8 * _b(l, 3)),
}

# (use, m, n, k, dtype, formula, num_elements) checked against FACTS for sm_80/86/89/90 (both operand layouts).
FACTS_SM80 = [
    ("matrix_a", 16, 16, 16, "half", SM80_A16, 16),
    ("matrix_b", 16, 16, 16, "half", SM80_B16, 16),
    ("matrix_a", 16, 16, 16, "bf16", SM80_A16, 8),
    ("matrix_b", 16, 16, 16, "bf16", SM80_B16, 8),
    ("accumulator", 16, 16, 16, "float", SM80_C16, 8),
    ("accumulator", 16, 16, 16, "half", SM80_C16, 8),
    ("matrix_a", 16, 16, 8, "tf32", SM80_A_TF32, 4),
    ("matrix_b", 16, 16, 8, "tf32", SM80_B_TF32, 4),
    ("accumulator", 16, 16, 8, "float", SM80_C16, 8),
]
# sm_75: "the m16n16k16 formulas are the same as sm_80's" (no bf16 or tf32 on Turing).
FACTS_SM75 = [f for f in FACTS_SM80 if f[3] == 16 and f[4] in ("half", "float")]


def _layouts(use):
    return [None] if use == "accumulator" else ["row_major", "col_major"]


@pytest.mark.parametrize("arch", SM80_ARCHS)
@pytest.mark.parametrize("case", FACTS_SM80, ids=lambda c: f"{c[0]}-m{c[1]}n{c[2]}k{c[3]}-{c[4]}")
def test_sm80_tables_match_facts(arch, case):
    use, m, n, k, dt, formula, num = case
    for layout in _layouts(use):
        got = fragment_map(use, m, n, k, dt, layout, arch=arch)
        assert got.dtype == torch.int32 and got.device.type == "cpu"
        assert torch.equal(got, table_of(formula, num)), f"{use} {dt} {layout}"


@pytest.mark.parametrize("case", FACTS_SM75, ids=lambda c: f"{c[0]}-m{c[1]}n{c[2]}k{c[3]}-{c[4]}")
def test_sm75_tables_match_facts(case):
    use, m, n, k, dt, formula, num = case
    for layout in _layouts(use):
        assert torch.equal(fragment_map(use, m, n, k, dt, layout, arch=75), table_of(formula, num))


def test_sm80_half_operands_repeat_their_first_eight_elements():
    """"Element x+8 repeats element x" for the 16-element half operands on sm_80+."""
    for use in ("matrix_a", "matrix_b"):
        t = fragment_map(use, 16, 16, 16, "half", "row_major", arch=80)
        assert torch.equal(t[:, 8:], t[:, :8])
        assert len({tuple(e) for e in t[:, :8].reshape(-1, 2).tolist()}) == 256  # the first 8 cover the tile


# --------------------------------------------------------------------------------------------------------
# Generic properties of every sm_80+ fragment type
# --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("frag", SM80_FRAGMENTS, ids=frag_id)
def test_sm80_table_properties(frag):
    use, m, n, k, dt, layout = frag
    rows, cols = tile_shape(use, m, n, k)
    num = NUM_ELEMENTS[(use, m, n, k, dt)]
    tables = {arch: fragment_map(use, m, n, k, dt, layout, arch=arch) for arch in SM80_ARCHS}
    t = tables[80]
    assert t.shape == (32, num, 2) and t.dtype == torch.int32
    assert t.is_contiguous()
    assert (t[..., 0] >= 0).all() and (t[..., 0] < rows).all()
    assert (t[..., 1] >= 0).all() and (t[..., 1] < cols).all()
    # Every tile element is held, each the same number of times.
    assert (32 * num) % (rows * cols) == 0
    copies = 32 * num // (rows * cols)
    counts = torch.zeros(rows, cols, dtype=torch.int64)
    counts.index_put_((t[..., 0].long().reshape(-1), t[..., 1].long().reshape(-1)), torch.ones(32 * num, dtype=torch.int64), accumulate=True)
    assert (counts == copies).all(), f"coverage counts {counts.unique().tolist()}, expected {copies}"
    # One layout for all of sm_80, 86, 89, 90.
    for arch in SM80_ARCHS:
        assert torch.equal(tables[arch], t), f"arch {arch} differs from 80"


@pytest.mark.parametrize(
    "key", [key for key in NUM_ELEMENTS if key[0] != "accumulator"], ids=lambda k: f"{k[0]}-m{k[1]}n{k[2]}k{k[3]}-{k[4]}"
)
def test_sm80_register_layout_independent_of_memory_layout(key):
    """sm_80+: row_major and col_major operand fragments share the register layout."""
    row = fragment_map(*key, "row_major", arch=90)
    col = fragment_map(*key, "col_major", arch=90)
    assert torch.equal(row, col)


@pytest.mark.parametrize("use", ["matrix_a", "matrix_b", "accumulator"])
def test_fragment_map_takes_exactly_the_fragment_types_of_mma_h(use):
    """Over every shape and element type that <mma.h> uses anywhere, fragment_map(arch=80) gives a table of
    frag.num_elements entries per lane exactly for the fragment types that <mma.h> declares (NUM_ELEMENTS),
    and names the fragment in its error for every other combination."""
    shapes = [(16, 16, 16), (32, 8, 16), (8, 32, 16), (16, 16, 8), (8, 8, 4)]
    dtypes = ["half", "bf16", "tf32", "int8", "uint8", "double", "float", "int32"]
    layouts = [None] if use == "accumulator" else ["row_major", "col_major"]
    accepted = 0
    for (m, n, k), dt, layout in itertools.product(shapes, dtypes, layouts):
        key = (use, m, n, k, dt)
        if key in NUM_ELEMENTS:
            assert fragment_map(*key, layout, arch=80).shape == (32, NUM_ELEMENTS[key], 2), key
            accepted += 1
        else:
            with pytest.raises(RuntimeError, match=f"CUDA has no WMMA fragment {use} m{m}n{n}k{k} {dt}"):
                fragment_map(*key, layout, arch=80)
    assert accepted == len(layouts) * sum(key[0] == use for key in NUM_ELEMENTS)


# --------------------------------------------------------------------------------------------------------
# sm_70 (Volta)
# --------------------------------------------------------------------------------------------------------
def _read_table2():
    lines = [ln for ln in (DATA / "sm70_matrix_a_col_major_table2.txt").read_text().splitlines() if ln.strip()]
    assert lines[0].startswith("#"), "the data file must state its provenance in a header comment"
    rows = [[int(v) for v in ln.split()] for ln in lines if not ln.startswith("#")]
    assert len(rows) == 32 and all(len(r) == 16 for r in rows)
    return torch.tensor(rows, dtype=torch.int64)


def test_sm70_matrix_a_col_major_reproduces_table2():
    """The analytic sm_70 table against the data file: the paper's quoted entries (checked here verbatim) and
    the lanes derived from the structure the paper states (see the file's header for their provenance)."""
    table2 = _read_table2()
    # The lanes quoted verbatim from the paper.
    assert table2[0].tolist() == [0, 1, 2, 3, 64, 65, 66, 67, 128, 129, 130, 131, 192, 193, 194, 195]
    assert table2[4, :5].tolist() == [8, 9, 10, 11, 72]
    assert table2[16, :4].tolist() == [4, 5, 6, 7]
    t = fragment_map("matrix_a", 16, 16, 16, "half", "col_major", arch=70).long()
    assert t.shape == (32, 16, 2)
    col_major_index = t[..., 0] + 16 * t[..., 1]
    assert torch.equal(col_major_index, table2)


@pytest.mark.parametrize("key", list(SM70), ids=lambda k: f"{k[0]}-{k[1]}")
def test_sm70_tables_match_facts(key):
    use, which = key
    if use == "accumulator":
        got = fragment_map(use, 16, 16, 16, which, arch=70)
        num = 8
    else:
        got = fragment_map(use, 16, 16, 16, "half", which, arch=70)
        num = 16
    assert got.shape == (32, num, 2) and got.dtype == torch.int32
    assert torch.equal(got, table_of(SM70[key], num))


@pytest.mark.parametrize("use,layout,partner_bit", [
    ("matrix_a", "col_major", 8), ("matrix_a", "row_major", 8), ("matrix_b", "col_major", 4), ("matrix_b", "row_major", 4),
])
def test_sm70_operand_elements_held_by_exactly_two_lanes(use, layout, partner_bit):
    """Volta: each A element is held by lanes l and l|8, each B element by lanes l and l|4."""
    t = fragment_map(use, 16, 16, 16, "half", layout, arch=70)
    holders = {}
    for lane, x in itertools.product(range(32), range(16)):
        holders.setdefault(tuple(t[lane, x].tolist()), set()).add(lane)
    assert set(holders) == {(r, c) for r in range(16) for c in range(16)}
    for lanes in holders.values():
        assert len(lanes) == 2
        lo, hi = sorted(lanes)
        assert hi == lo | partner_bit and lo & partner_bit == 0
    for lane in range(32):  # no repeats inside a lane
        assert len({tuple(e) for e in t[lane].tolist()}) == 16


@pytest.mark.parametrize("acc", ["float", "half"])
def test_sm70_accumulator_elements_held_once(acc):
    t = fragment_map("accumulator", 16, 16, 16, acc, arch=70)
    elems = [tuple(e) for e in t.reshape(-1, 2).tolist()]
    assert sorted(elems) == [(r, c) for r in range(16) for c in range(16)]


def test_sm70_layout_differs_from_sm80():
    """The point of arch=70: Volta's register layout is not Ampere's (and depends on the memory layout)."""
    a70r = fragment_map("matrix_a", 16, 16, 16, "half", "row_major", arch=70)
    a70c = fragment_map("matrix_a", 16, 16, 16, "half", "col_major", arch=70)
    assert not torch.equal(a70r, a70c)
    assert not torch.equal(a70r, fragment_map("matrix_a", 16, 16, 16, "half", "row_major", arch=80))


# --------------------------------------------------------------------------------------------------------
# Bad arguments
# --------------------------------------------------------------------------------------------------------
BAD = {
    "unknown_use": (("mat_a", 16, 16, 16, "half", "row_major"), {"arch": 80}, RuntimeError, r"argument 'use' must be"),
    "unknown_dtype": (("matrix_a", 16, 16, 16, "fp8", "row_major"), {"arch": 80}, RuntimeError, r"argument 'dtype' must be one of"),
    "unknown_layout": (("matrix_a", 16, 16, 16, "half", "diagonal"), {"arch": 80}, RuntimeError, r"argument 'layout' must be 'row_major' or 'col_major'"),
    "layout_for_accumulator": (("accumulator", 16, 16, 16, "float", "row_major"), {"arch": 80}, RuntimeError, r"accumulator fragments have no layout"),
    "missing_layout": (("matrix_b", 16, 16, 16, "half"), {"arch": 80}, RuntimeError, r"argument 'layout'.*is required for matrix_b"),
    "float_operand": (("matrix_a", 16, 16, 16, "float", "row_major"), {"arch": 80}, RuntimeError, r"CUDA has no WMMA fragment matrix_a m16n16k16 float"),
    "bf16_accumulator": (("accumulator", 16, 16, 16, "bf16"), {"arch": 90}, RuntimeError, r"CUDA has no WMMA fragment accumulator"),
    "tf32_k16": (("matrix_a", 16, 16, 16, "tf32", "row_major"), {"arch": 80}, RuntimeError, r"CUDA has no WMMA fragment"),
    "shape": (("matrix_a", 16, 16, 32, "half", "row_major"), {"arch": 80}, RuntimeError, r"CUDA has no WMMA fragment matrix_a m16n16k32"),
    "bad_tile_size": (("matrix_a", 16, 0, 16, "half", "row_major"), {"arch": 80}, RuntimeError, r"m, n, k must be WMMA tile sizes"),
    "arch70_bf16": (("matrix_a", 16, 16, 16, "bf16", "row_major"), {"arch": 70}, RuntimeError, r"no analytic sm_70 table.*compute capability 8.0 or newer"),
    "arch70_int32_acc": (("accumulator", 16, 16, 16, "int32"), {"arch": 70}, RuntimeError, r"compute capability 8.0 or newer"),
    "arch75_m32n8k16": (("matrix_a", 32, 8, 16, "half", "row_major"), {"arch": 75}, RuntimeError, r"no analytic sm_75 table.*compute capability 8.0 or newer"),
    "arch75_bf16": (("matrix_b", 16, 16, 16, "bf16", "col_major"), {"arch": 75}, RuntimeError, r"compute capability 8.0 or newer"),
    "arch75_tf32": (("matrix_a", 16, 16, 8, "tf32", "row_major"), {"arch": 75}, RuntimeError, r"compute capability 8.0 or newer"),
    # a fragment no GPU has: the same message for every arch, not that of a missing table
    "arch70_float_operand": (("matrix_a", 16, 16, 16, "float", "row_major"), {"arch": 70}, RuntimeError, r"^fragment_map: CUDA has no WMMA fragment matrix_a m16n16k16 float"),
    "arch75_shape": (("matrix_b", 16, 16, 32, "half", "col_major"), {"arch": 75}, RuntimeError, r"^fragment_map: CUDA has no WMMA fragment matrix_b m16n16k32"),
    "unknown_arch": (("matrix_a", 16, 16, 16, "half", "row_major"), {"arch": 60}, RuntimeError, r"argument 'arch' must be one of 70, 75, 80, 86, 89, 90"),
    "neither": (("matrix_a", 16, 16, 16, "half", "row_major"), {}, ValueError, r"exactly one of arch="),
    "both": (("matrix_a", 16, 16, 16, "half", "row_major"), {"arch": 80, "device": "cuda"}, ValueError, r"exactly one of arch="),
    "cpu_device": (("matrix_a", 16, 16, 16, "half", "row_major"), {"device": "cpu"}, RuntimeError, r"on the CPU pass arch="),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_arguments(case):
    args, kwargs, exc, pattern = BAD[case]
    with pytest.raises(exc, match=pattern):
        fragment_map(*args, **kwargs)


# --------------------------------------------------------------------------------------------------------
# torch.library / torch.compile
# --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args",
    [
        ("matrix_a", 16, 16, 16, "half", "row_major", 80, None),
        ("matrix_b", 32, 8, 16, "bf16", "col_major", 90, None),
        ("accumulator", 8, 8, 4, "double", None, 86, None),
        ("matrix_a", 16, 16, 16, "half", "col_major", 70, None),
    ],
    ids=["a-half", "b-bf16", "acc-double", "sm70"],
)
def test_opcheck(args):
    # opcheck handles this op without tensor inputs (its fake-tensor and aot-dispatch checks run the fake
    # kernel and compare metadata with the real result).
    torch.library.opcheck(torch.ops.wmmae.fragment_map.default, args)


@pytest.mark.parametrize("frag", [f for f in SM80_FRAGMENTS if f[4] in ("half", "tf32", "double")], ids=frag_id)
def test_fake_kernel_metadata(frag):
    """Under FakeTensorMode the fake kernel must give the real table's shape, dtype and device."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    use, m, n, k, dt, layout = frag
    real = fragment_map(use, m, n, k, dt, layout, arch=80)
    with FakeTensorMode():
        fake = torch.ops.wmmae.fragment_map.default(use, m, n, k, dt, layout, 80, None)
    assert isinstance(fake, FakeTensor)
    assert fake.shape == real.shape and fake.dtype == real.dtype and fake.device == real.device


def test_fake_kernel_for_a_cuda_device():
    """The fake kernel needs no GPU: a measurement on cuda:0 is a [32, n, 2] int32 tensor on cuda:0."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.ops.wmmae.fragment_map.default("matrix_b", 8, 32, 16, "int8", "row_major", None, torch.device("cuda", 0))
    assert fake.shape == (32, 16, 2) and fake.dtype == torch.int32 and fake.device == torch.device("cuda", 0)


@pytest.mark.parametrize("arch,device,message", [
    (None, None, "on the CPU pass arch="),
    (None, torch.device("cpu"), "on the CPU pass arch="),
    (80, torch.device("meta"), "must be a CPU or CUDA device"),
])
def test_fake_kernel_refuses_what_the_op_refuses(arch, device, message):
    """A CPU table needs arch, and only CPU and CUDA devices are taken: the fake kernel refuses these calls with
    the op's message (a compiled call fails when traced, not later when it runs)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    args = ("matrix_a", 16, 16, 16, "half", "row_major", arch, device)
    with pytest.raises(RuntimeError, match=message):
        torch.ops.wmmae.fragment_map.default(*args)
    with FakeTensorMode(), pytest.raises(RuntimeError, match=message):
        torch.ops.wmmae.fragment_map.default(*args)


def test_compile_fullgraph():
    torch._dynamo.reset()

    def f(x):
        a = fragment_map("matrix_a", 16, 16, 16, "half", "row_major", arch=90)
        c = fragment_map("accumulator", 16, 16, 8, "float", arch=80)
        v = fragment_map("matrix_a", 16, 16, 16, "half", "col_major", arch=70)
        return a * x, c + 1, v[..., 0] + 16 * v[..., 1]

    compiled = torch.compile(f, fullgraph=True)
    x = torch.tensor(3, dtype=torch.int32)
    for got, want in zip(compiled(x), f(x)):
        assert torch.equal(got, want)


# --------------------------------------------------------------------------------------------------------
# GPU: the measured layout equals the analytic table
# --------------------------------------------------------------------------------------------------------
def _sm80_gpu():
    return HAS_CUDA and torch.cuda.get_device_capability()[0] >= 8


requires_sm80_gpu = pytest.mark.skipif(not _sm80_gpu(), reason="needs a CUDA GPU of compute capability 8.0 or newer")


@requires_cuda
@requires_sm80_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("frag", SM80_FRAGMENTS, ids=frag_id)
def test_measured_equals_analytic(frag):
    use, m, n, k, dt, layout = frag
    measured = fragment_map(use, m, n, k, dt, layout, device="cuda")
    assert measured.device.type == "cuda"
    measured = measured.cpu()
    assert measured.dtype == torch.int32
    assert not (measured == -1).any(), "load_matrix_sync and store_matrix_sync disagree on some elements"
    assert torch.equal(measured, fragment_map(use, m, n, k, dt, layout, arch=90))
    assert torch.equal(measured, fragment_map(use, m, n, k, dt, layout, arch=80))


@requires_cuda
@requires_sm80_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dev", ["cuda", "cuda:0", "torch.device('cuda', 0)"])
def test_measured_device_spellings(dev):
    device = torch.device("cuda", 0) if dev.startswith("torch") else dev
    with torch.cuda.device(0):
        got = fragment_map("matrix_a", 16, 16, 16, "half", "row_major", device=device)
    assert got.device == torch.device("cuda", 0)
    assert not (got == -1).any()
    assert torch.equal(got.cpu(), table_of(SM80_A16, 16))


@requires_cuda
@requires_sm80_gpu
@pytest.mark.gpu
def test_opcheck_cuda():
    torch.library.opcheck(
        torch.ops.wmmae.fragment_map.default, ("accumulator", 16, 16, 16, "float", None, None, torch.device("cuda", 0))
    )
