"""Every bad argument a user can pass to the three ops (issue #6) raises an error whose message names the
argument, and leaves the device usable.

On the GPU, every bad call is followed by small correct calls of all three ops, checked against references,
and a device synchronization (hardening.assert_device_still_usable): an asynchronous error left behind by
the bad call (an illegal address, a failed launch) would surface there, and the CUDA context must still work.

Cases marked xfail(strict=True) are known gaps in the messages (reported on issue #6; the raw ops called with
no tensor argument at all, which the dispatcher rejects before any kernel of ours runs): they fail loudly
once the message is fixed, so that the mark is removed.
"""
from __future__ import annotations

import re
import warnings

import pytest
import torch

import torch_wmmae
from torch_wmmae import batched_outer, corrected_matmul, fragment_map

try:  # (NumPy bools are refused too; without NumPy those cases are left out)
    import numpy as np
except ImportError:
    np = None

from conftest import DEVICES, requires_cuda
from hardening import analytic_arch, assert_device_still_usable

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64

pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state")


def _factory(device, gen):
    """t(*shape, dtype=float32): fresh random values (never all zeros) of any dtype on `device`."""

    def t(*shape, dtype=F32):
        x = torch.randn(shape, generator=gen, dtype=F64) * 4
        if dtype.is_complex:
            return x.to(dtype).to(device)
        if not dtype.is_floating_point:
            x = x.round()
        return x.to(dtype).to(device)

    return t


def _nested(*tensors, layout=torch.strided):
    """A nested tensor of the given tensors: torch.strided (the NestedTensor dispatch keys) or torch.jagged (a
    Python tensor subclass)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # (the prototype-stage notice)
        return torch.nested.nested_tensor(list(tensors), layout=layout)


def _not_named(reason):
    """A case whose error does not name the argument yet."""
    return pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason)


def _expect(exc, pattern, call, device, gen):
    with pytest.raises(exc) as info:
        call()
    message = str(info.value)
    assert re.search(pattern, message), (
        f"{type(info.value).__name__} does not name the argument (pattern {pattern!r}): {message[:400]}"
    )
    assert_device_still_usable(device, gen)


# --------------------------------------------------------------------------------------------------------
# corrected_matmul(a, b, method)
# --------------------------------------------------------------------------------------------------------
A_DTYPE = r"argument 'a' must be float32"
B_DTYPE = r"argument 'b' must be float32"
METHOD = r"argument 'method'"  # (torch's schema check of its type words it so as well)
METHOD_VALUE = METHOD + r" must be 'auto', 'fp16' or 'tf32', got "  # (the op's own check of its value)
INNER = r"inner dimensions do not match"

# name -> (args builder t -> (a, b, method), exception, pattern)
MATMUL_CASES = {
    "a_float64": (lambda t: (t(3, 4, dtype=F64), t(4, 2), "auto"), RuntimeError, A_DTYPE),
    "b_float64": (lambda t: (t(3, 4), t(4, 2, dtype=F64), "auto"), RuntimeError, B_DTYPE),
    "a_float16": (lambda t: (t(3, 4, dtype=F16), t(4, 2), "auto"), RuntimeError, A_DTYPE),
    "b_float16": (lambda t: (t(3, 4), t(4, 2, dtype=F16), "fp16"), RuntimeError, B_DTYPE),
    "a_bfloat16": (lambda t: (t(3, 4, dtype=BF16), t(4, 2), "tf32"), RuntimeError, A_DTYPE),
    "both_float16": (lambda t: (t(3, 4, dtype=F16), t(4, 2, dtype=F16), "auto"), RuntimeError, A_DTYPE),
    "a_int32": (lambda t: (t(3, 4, dtype=torch.int32), t(4, 2), "auto"), RuntimeError, A_DTYPE),
    "b_int64": (lambda t: (t(3, 4), t(4, 2, dtype=torch.int64), "auto"), RuntimeError, B_DTYPE),
    "a_bool": (lambda t: (t(3, 4, dtype=torch.bool), t(4, 2), "auto"), RuntimeError, A_DTYPE),
    "b_complex64": (lambda t: (t(3, 4), t(4, 2, dtype=torch.complex64), "auto"), RuntimeError, B_DTYPE),
    "a_0d": (lambda t: (t(), t(4)), RuntimeError, r"argument 'a' must have at least 1 dimension"),
    "b_0d": (lambda t: (t(4), t()), RuntimeError, r"argument 'b' must have at least 1 dimension"),
    "both_0d": (lambda t: (t(), t()), RuntimeError, r"argument 'a' must have at least 1 dimension"),
    "inner_2d": (lambda t: (t(3, 4), t(5, 2)), RuntimeError, INNER + r".*'a' has shape \[3, 4\].*'b' has shape \[5, 2\]"),
    "inner_1d_1d": (lambda t: (t(4), t(5)), RuntimeError, INNER),
    "inner_1d_2d": (lambda t: (t(4), t(5, 3)), RuntimeError, INNER),
    "inner_2d_1d": (lambda t: (t(3, 4), t(3)), RuntimeError, INNER),
    "inner_batched": (lambda t: (t(2, 3, 4), t(2, 3, 4)), RuntimeError, INNER),
    "inner_empty": (lambda t: (t(3, 0), t(1, 2)), RuntimeError, INNER),
    "batch_mismatch": (lambda t: (t(2, 3, 4), t(3, 4, 5)), RuntimeError, r"batch dimensions of 'a' \[2\] and 'b' \[3\] do not broadcast"),
    "batch_mismatch_4d": (lambda t: (t(2, 2, 3, 4), t(3, 1, 4, 5)), RuntimeError, r"batch dimensions of 'a' \[2, 2\] and 'b' \[3, 1\] do not broadcast"),
    "method_unknown": (lambda t: (t(3, 4), t(4, 2), "bf16"), RuntimeError, METHOD_VALUE + "'bf16'"),
    "method_uppercase": (lambda t: (t(3, 4), t(4, 2), "TF32"), RuntimeError, METHOD_VALUE + "'TF32'"),
    "method_empty": (lambda t: (t(3, 4), t(4, 2), ""), RuntimeError, METHOD_VALUE + "''"),
    "method_space": (lambda t: (t(3, 4), t(4, 2), " auto"), RuntimeError, METHOD_VALUE + "' auto'"),
    "method_fp32": (lambda t: (t(3, 4), t(4, 2), "fp32"), RuntimeError, METHOD_VALUE + "'fp32'"),
    "method_int": (lambda t: (t(3, 4), t(4, 2), 1), RuntimeError, METHOD),
    "method_none": (lambda t: (t(3, 4), t(4, 2), None), RuntimeError, METHOD),
    "a_list": (lambda t: ([[1.0] * 4] * 3, t(4, 2)), RuntimeError, r"argument 'a'"),
    "b_scalar": (lambda t: (t(3, 4), 2.0), RuntimeError, r"argument 'b'"),
    "a_none": (lambda t: (None, t(4, 2)), RuntimeError, r"argument 'a'"),
    "b_none": (lambda t: (t(3, 4), None), RuntimeError, r"argument 'b'"),
    # No tensor argument at all: the dispatcher rejects it before the op, with a message naming no argument.
    "both_none": (lambda t: (None, None), RuntimeError, r"argument 'a'"),
    # Sparse, quantized, MKL-DNN and nested tensors reach the op's kernels for their dispatch keys
    # (csrc/registration.cpp).
    "a_sparse": (lambda t: (t(3, 4).to_sparse(), t(4, 2)), RuntimeError,
                 r"argument 'a' must be a dense \(strided\) tensor, got torch.sparse_coo"),
    "b_sparse_csr": (lambda t: (t(3, 4), t(4, 2).to_sparse_csr()), RuntimeError,
                     r"argument 'b' must be a dense \(strided\) tensor, got torch.sparse_csr"),
    "a_quantized": (lambda t: (torch.quantize_per_tensor(t(3, 4), 0.1, 0, torch.qint8), t(4, 2)), RuntimeError, A_DTYPE),
    "b_mkldnn": (lambda t: (t(3, 4), t(4, 2).cpu().to_mkldnn()), RuntimeError,
                 r"argument 'b' must be a dense \(strided\) tensor, got torch._mkldnn"),
    "a_nested": (lambda t: (_nested(t(3, 4), t(2, 4)), t(4, 2)), RuntimeError,
                 r"argument 'a' must be a dense \(strided\) tensor, got a nested tensor"),
    "b_nested_jagged": (lambda t: (t(3, 4), _nested(t(4, 2), t(4, 2), layout=torch.jagged)), RuntimeError,
                        r"argument 'b' must be a dense \(strided\) tensor, got a nested tensor"),
}
# (The raw op only: the Python API checks its tensor arguments before the dispatcher.)
MATMUL_RAW_XFAIL = {
    "both_none": "NotImplementedError 'There were no tensor arguments to this function' from the dispatcher",
}


def _cases(table, raw_xfails):
    """(case, raw) pairs: raw calls torch.ops.wmmae.* directly, otherwise the Python API."""
    return [pytest.param(name, raw, id=f"{name}-{'raw_op' if raw else 'api'}",
                         marks=_not_named(raw_xfails[name]) if raw and name in raw_xfails else ())
            for name in table for raw in (False, True)]


def _matmul_call(args, raw):
    a, b, *rest = args
    method = rest[0] if rest else "auto"
    if raw:
        return lambda: torch.ops.wmmae.corrected_matmul(a, b, method)
    return lambda: corrected_matmul(a, b, method=method)


@pytest.mark.parametrize("case,raw", _cases(MATMUL_CASES, MATMUL_RAW_XFAIL))
@pytest.mark.parametrize("device", DEVICES)
def test_corrected_matmul(device, gen, case, raw):
    build, exc, pattern = MATMUL_CASES[case]
    args = build(_factory(device, gen))
    _expect(exc, pattern, _matmul_call(args, raw), device, gen)


# --------------------------------------------------------------------------------------------------------
# batched_outer(u, v=None, alpha=0, out_dtype=None)
# --------------------------------------------------------------------------------------------------------
U_DTYPE = r"argument 'u' must be float16, bfloat16 or float32"
V_SHAPE = r"argument 'v' must have the shape of 'u'"
V_DTYPE = r"argument 'v' must have the dtype of 'u'"
OUT_DTYPE = r"argument 'out_dtype'"

# name -> (args builder t -> (u, v, alpha, out_dtype), exception, pattern)
OUTER_CASES = {
    "u_0d": (lambda t: (t(dtype=F16), None, 0.0, None), RuntimeError, r"argument 'u' must have shape \(\.\.\., n\)"),
    "u_0d_with_v": (lambda t: (t(dtype=F16), t(dtype=F16), 0.0, None), RuntimeError, r"argument 'u' must have shape"),
    "u_float64": (lambda t: (t(3, 4, dtype=F64), None, 0.0, None), RuntimeError, U_DTYPE),
    "u_int32": (lambda t: (t(3, 4, dtype=torch.int32), None, 0.0, None), RuntimeError, U_DTYPE),
    "u_int64": (lambda t: (t(3, 4, dtype=torch.int64), None, 1.0, None), RuntimeError, U_DTYPE),
    "u_bool": (lambda t: (t(3, 4, dtype=torch.bool), None, 0.0, None), RuntimeError, U_DTYPE),
    "u_complex64": (lambda t: (t(3, 4, dtype=torch.complex64), None, 0.0, None), RuntimeError, U_DTYPE),
    "u_float8": (lambda t: (t(3, 4, dtype=torch.float8_e4m3fn), None, 0.0, None), RuntimeError, U_DTYPE),
    "u_and_v_float64": (lambda t: (t(3, 4, dtype=F64), t(3, 4, dtype=F64), 0.0, None), RuntimeError, U_DTYPE),
    "v_n": (lambda t: (t(3, 4, dtype=F16), t(3, 5, dtype=F16), 0.0, None), RuntimeError, V_SHAPE),
    "v_batch": (lambda t: (t(3, 4, dtype=F16), t(2, 4, dtype=F16), 0.0, None), RuntimeError, V_SHAPE),
    "v_extra_dim": (lambda t: (t(3, 4, dtype=F16), t(1, 3, 4, dtype=F16), 0.0, None), RuntimeError, V_SHAPE),
    "v_broadcastable": (lambda t: (t(3, 4, dtype=F16), t(1, 4, dtype=F16), 0.0, None), RuntimeError, V_SHAPE),
    "v_1d_for_2d": (lambda t: (t(3, 4), t(4), 0.0, None), RuntimeError, V_SHAPE),
    "v_0d": (lambda t: (t(3, 4), t(), 0.0, None), RuntimeError, V_SHAPE),
    "v_transposed_shape": (lambda t: (t(4, 6, dtype=BF16), t(6, 4, dtype=BF16), 0.0, None), RuntimeError, V_SHAPE),
    "v_bf16_u_fp16": (lambda t: (t(3, 4, dtype=F16), t(3, 4, dtype=BF16), 0.0, None), RuntimeError, V_DTYPE),
    "v_fp16_u_fp32": (lambda t: (t(3, 4), t(3, 4, dtype=F16), 0.0, None), RuntimeError, V_DTYPE),
    "v_float64": (lambda t: (t(3, 4, dtype=F16), t(3, 4, dtype=F64), 0.0, None), RuntimeError, V_DTYPE),
    "v_int32": (lambda t: (t(3, 4), t(3, 4, dtype=torch.int32), 0.0, None), RuntimeError, V_DTYPE),
    "out_float64": (lambda t: (t(3, 4, dtype=F16), None, 0.0, F64), RuntimeError, OUT_DTYPE + r" must be float32, float16 or bfloat16"),
    "out_int32": (lambda t: (t(3, 4, dtype=F16), None, 0.0, torch.int32), RuntimeError, OUT_DTYPE),
    "out_int8": (lambda t: (t(3, 4), None, 0.0, torch.int8), RuntimeError, OUT_DTYPE),
    "out_bool": (lambda t: (t(3, 4), None, 0.0, torch.bool), RuntimeError, OUT_DTYPE),
    "out_complex64": (lambda t: (t(3, 4, dtype=BF16), None, 0.0, torch.complex64), RuntimeError, OUT_DTYPE),
    "out_float8": (lambda t: (t(3, 4, dtype=F16), None, 0.0, torch.float8_e5m2), RuntimeError, OUT_DTYPE),
    "out_string": (lambda t: (t(3, 4, dtype=F16), None, 0.0, "float16"), (RuntimeError, TypeError), OUT_DTYPE),
    "alpha_string": (lambda t: (t(3, 4, dtype=F16), None, "1.0", None), RuntimeError, r"argument 'alpha'"),
    "alpha_none": (lambda t: (t(3, 4, dtype=F16), None, None, None), RuntimeError, r"argument 'alpha'"),
    "alpha_complex": (lambda t: (t(3, 4, dtype=F16), None, 1j, None), RuntimeError, r"argument 'alpha'"),
    "u_list": (lambda t: ([1.0, 2.0], None, 0.0, None), RuntimeError, r"argument 'u'"),
    "v_list": (lambda t: (t(2, dtype=F16), [1.0, 2.0], 0.0, None), RuntimeError, r"argument 'v'"),
    "v_scalar": (lambda t: (t(2, dtype=F16), 2.0, 0.0, None), RuntimeError, r"argument 'v'"),
    # No tensor argument at all: the dispatcher rejects it before the op, with a message naming no argument.
    "u_none": (lambda t: (None, None, 0.0, None), RuntimeError, r"argument 'u'"),
    # Sparse, quantized, MKL-DNN and nested tensors reach the op's kernels for their dispatch keys
    # (csrc/registration.cpp).
    "u_sparse": (lambda t: (t(3, 4).to_sparse(), None, 0.0, None), RuntimeError,
                 r"argument 'u' must be a dense \(strided\) tensor, got torch.sparse_coo"),
    "v_sparse": (lambda t: (t(3, 4), t(3, 4).to_sparse(), 0.0, None), RuntimeError, r"argument 'v'"),
    "u_quantized": (lambda t: (torch.quantize_per_tensor(t(3, 4), 0.1, 0, torch.quint8), None, 0.0, None), RuntimeError, U_DTYPE),
    "v_mkldnn": (lambda t: (t(3, 4), t(3, 4).cpu().to_mkldnn(), 0.0, None), RuntimeError, r"argument 'v'"),
    "u_nested": (lambda t: (_nested(t(3, 4, dtype=F16), t(2, 4, dtype=F16)), None, 0.0, None), RuntimeError,
                 r"argument 'u' must be a dense \(strided\) tensor, got a nested tensor"),
    "v_nested_jagged": (lambda t: (t(2, 4, dtype=F16), _nested(t(2, 4, dtype=F16), t(2, 4, dtype=F16), layout=torch.jagged),
                                   0.0, None), RuntimeError, r"argument 'v' must be a dense \(strided\) tensor, got a nested tensor"),
}
OUTER_RAW_XFAIL = {
    "u_none": "NotImplementedError 'There were no tensor arguments to this function' from the dispatcher",
}


def _outer_call(args, raw):
    u, v, alpha, out_dtype = args
    if raw:
        return lambda: torch.ops.wmmae.batched_outer(u, v, alpha, out_dtype)
    return lambda: batched_outer(u, v, alpha=alpha, out_dtype=out_dtype)


@pytest.mark.parametrize("case,raw", _cases(OUTER_CASES, OUTER_RAW_XFAIL))
@pytest.mark.parametrize("device", DEVICES)
def test_batched_outer(device, gen, case, raw):
    build, exc, pattern = OUTER_CASES[case]
    args = build(_factory(device, gen))
    _expect(exc, pattern, _outer_call(args, raw), device, gen)


@pytest.mark.parametrize("alpha", [True] + ([np.bool_(False)] if np is not None else []),
                         ids=["bool"] + (["numpy_bool"] if np is not None else []))
def test_batched_outer_api_refuses_a_bool_alpha(gen, alpha):
    """The Python API refuses a bool alpha (the raw op's float takes True as 1.0: the dispatcher's rule)."""
    u = _factory("cpu", gen)(3, 4)
    _expect(TypeError, r"argument 'alpha' must be a real number, got a bool", lambda: batched_outer(u, alpha=alpha),
            "cpu", gen)


def test_batched_outer_alpha_beyond_float(gen):
    """An int alpha beyond float's range: the Python API names alpha and says why; the raw op gets the
    dispatcher's message, which names alpha but calls the int an int."""
    u = _factory("cpu", gen)(3, 4)
    _expect(OverflowError, r"argument 'alpha' does not fit a float: 1000", lambda: batched_outer(u, alpha=10**400),
            "cpu", gen)
    _expect(RuntimeError, r"argument 'alpha'", lambda: torch.ops.wmmae.batched_outer(u, None, 10**400, None), "cpu", gen)


@pytest.mark.parametrize("out_dtype", [6, 5, "float16", 1.0])
def test_batched_outer_api_takes_out_dtype_as_a_torch_dtype(gen, out_dtype):
    """The schema's `ScalarType?` also takes PyTorch's integer dtype codes (6 is float32, 5 float16), as every
    PyTorch op's dtype argument does, so the raw op would quietly read 6 as float32; the API refuses anything
    but a torch.dtype or None."""
    u = _factory("cpu", gen)(3, 4, dtype=F16)
    with pytest.raises(TypeError, match=r"^batched_outer: argument 'out_dtype' must be a torch\.dtype or None, got "):
        batched_outer(u, out_dtype=out_dtype)


# --------------------------------------------------------------------------------------------------------
# fragment_map(use, m, n, k, dtype, layout=None, *, arch=None, device=None)
# --------------------------------------------------------------------------------------------------------
GOOD = ("matrix_a", 16, 16, 16, "half", "row_major")
TILE = r"m, n, k must be WMMA tile sizes"


def _with(**changes):
    names = ["use", "m", "n", "k", "dtype", "layout"]
    args = dict(zip(names, GOOD))
    args.update(changes)
    return tuple(args[name] for name in names)


# name -> (positional args, exception, pattern); called with arch= on "cpu" and device= on "cuda"
FRAGMENT_CASES = {
    "use_unknown": (_with(use="matrix_c"), RuntimeError, r"argument 'use' must be 'matrix_a', 'matrix_b' or 'accumulator', got 'matrix_c'"),
    "use_uppercase": (_with(use="Matrix_A"), RuntimeError, r"argument 'use'"),
    "use_none": (_with(use=None), RuntimeError, r"argument 'use'"),
    "use_int": (_with(use=0), RuntimeError, r"argument 'use'"),
    "dtype_unknown": (_with(dtype="fp16"), RuntimeError, r"argument 'dtype' must be one of .*got 'fp16'"),
    "dtype_torch_name": (_with(dtype="float16"), RuntimeError, r"argument 'dtype'"),
    "dtype_torch_dtype": (_with(dtype=torch.float16), RuntimeError, r"argument 'dtype'"),
    "layout_missing": (_with(layout=None), RuntimeError, r"argument 'layout' \('row_major' or 'col_major'\) is required"),
    "layout_unknown": (_with(layout="row"), RuntimeError, r"argument 'layout' must be 'row_major' or 'col_major', got 'row'"),
    "layout_int": (_with(layout=1), RuntimeError, r"argument 'layout'"),
    "layout_for_accumulator": (_with(use="accumulator", dtype="float", layout="row_major"), RuntimeError, r"accumulator fragments have no layout; pass layout=None"),
    "m_zero": (_with(m=0), RuntimeError, TILE + r".*got m=0"),
    "n_negative": (_with(n=-16), RuntimeError, TILE + r".*n=-16"),
    "k_65": (_with(k=65), RuntimeError, TILE + r".*k=65"),
    "m_2_40": (_with(m=2**40), RuntimeError, TILE + r".*m=1099511627776"),
    "m_wraps_int32": (_with(m=2**32 + 16), RuntimeError, TILE + r".*m=4294967312"),
    "m_string": (_with(m="16"), RuntimeError, r"argument 'm'"),
    "k_float": (_with(k=16.0), RuntimeError, r"argument 'k'"),
    "m_bool": (_with(m=True), RuntimeError, r"argument 'm' must be an int, got a bool"),
    "n_beyond_int64": (_with(n=2**64), RuntimeError, r"argument 'n' must be a WMMA tile size, got 18446744073709551616"),
    "no_such_shape": (_with(k=15), RuntimeError, r"no WMMA fragment matrix_a m16n16k15 half"),
    "no_such_shape_8": (_with(m=8, n=8, k=8), RuntimeError, r"no WMMA fragment matrix_a m8n8k8 half"),
    "tf32_k16": (_with(dtype="tf32"), RuntimeError, r"no WMMA fragment matrix_a m16n16k16 tf32"),
    "bf16_accumulator": (_with(use="accumulator", dtype="bf16", layout=None), RuntimeError, r"no WMMA fragment accumulator m16n16k16 bf16"),
    "double_16": (_with(dtype="double"), RuntimeError, r"no WMMA fragment matrix_a m16n16k16 double"),
}
if np is not None:
    FRAGMENT_CASES["m_numpy_bool"] = (_with(m=np.bool_(True)), RuntimeError, r"argument 'm' must be an int, got a bool")


def _where(device):
    return {"arch": 80} if device == "cpu" else {"device": device}


@pytest.mark.parametrize("case", list(FRAGMENT_CASES))
@pytest.mark.parametrize("device", DEVICES)
def test_fragment_map(device, gen, case):
    args, exc, pattern = FRAGMENT_CASES[case]
    _expect(exc, pattern, lambda: fragment_map(*args, **_where(device)), device, gen)


# Arguments that choose where the table comes from (arch= / device=): the same on every machine.
WHERE_CASES = {
    "arch_71": ({"arch": 71}, RuntimeError, r"argument 'arch' must be one of 70, 75, 80, 86, 89, 90, got 71"),
    "arch_100": ({"arch": 100}, RuntimeError, r"argument 'arch' must be one of .*got 100"),
    "arch_negative": ({"arch": -1}, RuntimeError, r"argument 'arch'.*got -1"),
    "arch_string": ({"arch": "80"}, RuntimeError, r"argument 'arch'"),
    "arch_float": ({"arch": 80.0}, RuntimeError, r"argument 'arch'"),
    "arch_bool": ({"arch": True}, RuntimeError, r"argument 'arch' must be an int, got a bool"),
    "arch_beyond_int64": ({"arch": 2**64}, RuntimeError, r"argument 'arch' must be a compute capability, got 18446744073709551616"),
    "arch_and_device": ({"arch": 80, "device": "cpu"}, ValueError, r"exactly one of arch= .* and device="),
    "neither": ({}, ValueError, r"exactly one of arch= .* and device="),
    "device_cpu_without_arch": ({"device": "cpu"}, RuntimeError, r"on the CPU pass arch= .* instead of device=; device= takes a CUDA device"),
    "device_meta": ({"device": "meta"}, RuntimeError, r"argument 'device' must be a CPU or CUDA device, got meta"),
    "device_unknown_type": ({"device": "bogus"}, RuntimeError, r"argument 'device' must be a torch.device or a device string, got 'bogus'"),
    "device_float": ({"device": 3.5}, (RuntimeError, TypeError), r"argument 'device' must be a torch.device or a device string, got 3.5"),
}


@pytest.mark.parametrize("case", list(WHERE_CASES))
def test_fragment_map_arch_and_device(gen, case):
    where, exc, pattern = WHERE_CASES[case]
    _expect(exc, pattern, lambda: fragment_map(*GOOD, **where), "cpu", gen)


@pytest.mark.parametrize("use,dtype,layout,arch", [("matrix_a", "bf16", "row_major", 75), ("accumulator", "int32", None, 75),
                                                   ("matrix_b", "bf16", "col_major", 70), ("accumulator", "int32", None, 70),
                                                   ("matrix_a", "half", "row_major", 70)])
def test_fragment_map_tables_that_do_not_exist(gen, use, dtype, layout, arch):
    """(arch, fragment) pairs without an analytic table name the arch and say that measuring needs sm_80+; the
    m16n16k16 half operands of sm_70 exist but not in other shapes."""
    m, n, k = (32, 8, 16) if (arch, dtype) == (70, "half") else (16, 16, 16)
    _expect(RuntimeError, rf"no analytic sm_{arch} table for .*compute capability 8.0 or newer",
            lambda: fragment_map(use, m, n, k, dtype, layout, arch=arch), "cpu", gen)


@pytest.mark.skipif(torch_wmmae.has_cuda_kernels(), reason="this build has the CUDA kernels")
def test_fragment_map_on_cuda_without_cuda_kernels(gen):
    """A build without the CUDA kernels (or a machine without a GPU) says so when asked to measure a GPU. (Runs on
    a CPU-only build; CI's build has the kernels, and test_package.py's sdist test checks its CPU-only build.)"""
    with pytest.raises(RuntimeError, match=r"this build of torch_wmmae has no CUDA kernels"):
        fragment_map(*GOOD, device="cuda:0")
    assert_device_still_usable("cpu", gen)


@pytest.mark.skipif(not torch_wmmae.has_cuda_kernels() or torch.cuda.is_available(),
                    reason="a build with the CUDA kernels on a machine without a GPU (as CI)")
@pytest.mark.parametrize("where", ["cuda", "cuda:0"])
@pytest.mark.parametrize("entry", ["python", "raw_op"])
def test_fragment_map_on_cuda_without_a_gpu(gen, where, entry):
    """The CUDA kernels are built but there is no GPU to measure: the error names the device argument, also
    through the raw op (as LibTorch calls it), where "cuda" comes without an index."""
    if entry == "python":
        call = lambda: fragment_map(*GOOD, device=where)  # noqa: E731
    else:
        call = lambda: torch.ops.wmmae.fragment_map(*GOOD, None, torch.device(where))  # noqa: E731
    _expect(RuntimeError, r"argument 'device' is cuda(:0)?, but this machine has 0 CUDA device", call, "cpu", gen)


# --------------------------------------------------------------------------------------------------------
# CUDA only: mixed devices, an invalid device index, arch together with a CUDA device
# --------------------------------------------------------------------------------------------------------
SAME_DEVICE_AB = r"arguments 'a' and 'b' must be on the same device"
SAME_DEVICE_UV = r"arguments 'u' and 'v' must be on the same device"


def _mixed_case(case, gen):
    cpu, cuda = _factory("cpu", gen), _factory("cuda", gen)
    if case == "a_cpu_b_cuda":
        return lambda: corrected_matmul(cpu(3, 4), cuda(4, 2)), SAME_DEVICE_AB
    if case == "a_cuda_b_cpu":
        return lambda: corrected_matmul(cuda(3, 4), cpu(4, 2), method="tf32"), SAME_DEVICE_AB
    if case == "a_cuda_b_cpu_1d":
        return lambda: corrected_matmul(cuda(4), cpu(4)), SAME_DEVICE_AB
    if case == "a_cuda_b_cpu_0d":  # a 0-d CPU tensor is not the scalar that torch's own ops accept here
        return lambda: corrected_matmul(cuda(4), cpu()), r"argument 'b' must have at least 1 dimension"
    if case == "a_cuda_b_cpu_batched_raw":
        return lambda: torch.ops.wmmae.corrected_matmul(cuda(2, 3, 4), cpu(2, 4, 5), "fp16"), SAME_DEVICE_AB
    if case == "u_cuda_v_cpu":
        return lambda: batched_outer(cuda(3, 4, dtype=F16), cpu(3, 4, dtype=F16)), SAME_DEVICE_UV
    if case == "u_cpu_v_cuda":
        return lambda: batched_outer(cpu(3, 4, dtype=F16), cuda(3, 4, dtype=F16), alpha=1.0), SAME_DEVICE_UV
    if case == "u_cpu_v_cuda_raw_fp32":
        return lambda: torch.ops.wmmae.batched_outer(cpu(5, 17), cuda(5, 17), 0.0, F16), SAME_DEVICE_UV
    raise ValueError(case)


MIXED_CASES = ["a_cpu_b_cuda", "a_cuda_b_cpu", "a_cuda_b_cpu_1d", "a_cuda_b_cpu_0d", "a_cuda_b_cpu_batched_raw",
               "u_cuda_v_cpu", "u_cpu_v_cuda", "u_cpu_v_cuda_raw_fp32"]


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("case", MIXED_CASES)
def test_mixed_cpu_and_cuda(gen, case):
    call, pattern = _mixed_case(case, gen)
    _expect(RuntimeError, pattern, call, "cuda", gen)


@requires_cuda
@pytest.mark.gpu
def test_fragment_map_invalid_cuda_index(gen):
    bad = f"cuda:{torch.cuda.device_count()}"
    _expect(RuntimeError, r"argument 'device' is cuda:\d+, but this machine has \d+ CUDA device",
            lambda: fragment_map(*GOOD, device=bad), "cuda", gen)


@requires_cuda
@pytest.mark.gpu
def test_fragment_map_raw_op_with_arch_and_cuda_device(gen):
    """The Python wrapper raises ValueError for arch= with device=; the raw op's CUDA kernel names both."""
    call = lambda: torch.ops.wmmae.fragment_map(*GOOD, 80, torch.device("cuda", 0))  # noqa: E731
    _expect(RuntimeError, r"pass either arch= .* or device= .*not both", call, "cuda", gen)
    measured = fragment_map(*GOOD, device="cuda")
    assert torch.equal(measured.cpu(), fragment_map(*GOOD, arch=analytic_arch("cuda")))


def test_fragment_map_fake_refuses_arch_with_a_cuda_device(gen):
    """The raw op's fake kernel refuses arch= beside a CUDA device as its CUDA kernel does
    (test_fragment_map_raw_op_with_arch_and_cuda_device), so that a traced or exported call fails when it is
    traced, not when it runs; with device= alone it has the table's shape."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        with pytest.raises(RuntimeError, match=r"pass either arch= .* or device= .*not both"):
            torch.ops.wmmae.fragment_map(*GOOD, 80, torch.device("cuda", 0))
        fake = torch.ops.wmmae.fragment_map(*GOOD, None, torch.device("cuda", 0))
    assert fake.shape == fragment_map(*GOOD, arch=80).shape and fake.device == torch.device("cuda", 0)
    assert_device_still_usable("cpu", gen)


# --------------------------------------------------------------------------------------------------------
# The fake kernels (torch.compile, meta tensors) name the argument too
# --------------------------------------------------------------------------------------------------------
FAKE_CASES = {
    "matmul_a_float64": (lambda t: corrected_matmul(t(3, 4, dtype=F64), t(4, 2)), r"argument 'a' must be float32"),
    "matmul_b_float16": (lambda t: corrected_matmul(t(3, 4), t(4, 2, dtype=F16)), r"argument 'b' must be float32"),
    "matmul_method": (lambda t: corrected_matmul(t(3, 4), t(4, 2), method="bf16"), r"argument 'method' must be 'auto', 'fp16' or 'tf32', got 'bf16'"),
    "matmul_a_0d": (lambda t: corrected_matmul(t(), t(4)), r"argument 'a' must have at least 1 dimension, got a 0-d tensor"),
    "matmul_inner": (lambda t: corrected_matmul(t(3, 4), t(5, 2)), r"inner dimensions do not match: 'a' has shape \[3, 4\] and 'b' has shape \[5, 2\]"),
    "matmul_batch": (lambda t: corrected_matmul(t(2, 3, 4), t(3, 4, 5)), r"batch dimensions of 'a' \[2\] and 'b' \[3\] do not broadcast"),
    "matmul_batch_2": (lambda t: corrected_matmul(t(5, 1, 3, 4), t(2, 4, 4, 2)), r"batch dimensions of 'a' \[5, 1\] and 'b' \[2, 4\]"),
    "outer_u_0d": (lambda t: batched_outer(t(dtype=F16)), r"argument 'u' must have shape \(\.\.\., n\), got a 0-d tensor"),
    "outer_u_float64": (lambda t: batched_outer(t(3, 4, dtype=F64)), r"argument 'u' must be float16, bfloat16 or float32, got torch\.float64"),
    "outer_v_shape": (lambda t: batched_outer(t(3, 4, dtype=F16), t(3, 5, dtype=F16)), r"argument 'v' must have the shape of 'u'"),
    "outer_v_dtype": (lambda t: batched_outer(t(3, 4, dtype=F16), t(3, 4, dtype=BF16)), r"argument 'v' must have the dtype of 'u'"),
    "outer_out_dtype": (lambda t: batched_outer(t(3, 4, dtype=F16), out_dtype=F64), r"argument 'out_dtype' must be float32, float16 or bfloat16, got torch\.float64"),
    "outer_v_dtype_f32": (lambda t: batched_outer(t(3, 4), t(3, 4, dtype=F16)), r"argument 'v' must have the dtype of 'u' \(torch\.float32\), got torch\.float16"),
    "matmul_b_complex": (lambda t: corrected_matmul(t(3, 4), t(4, 2, dtype=torch.complex64)), r"argument 'b' must be float32, got torch\.complex64"),
}
@pytest.mark.parametrize("case", list(FAKE_CASES))
def test_fake_kernels(gen, case):
    call, pattern = FAKE_CASES[case]
    t = _factory("meta", gen)
    _expect(RuntimeError, pattern, lambda: call(t), "cpu", gen)


@pytest.mark.parametrize("case", list(FAKE_CASES))
def test_fake_and_eager_messages_agree(gen, case):
    """A compiled call fails with the eager call's message, word for word (dtypes as Python prints them)."""
    call, _ = FAKE_CASES[case]
    with pytest.raises(RuntimeError) as fake:
        call(_factory("meta", gen))
    with pytest.raises(RuntimeError) as eager:
        call(_factory("cpu", gen))
    first_line = lambda e: str(e.value).splitlines()[0]  # noqa: E731  (the C++ error may add a backtrace)
    assert first_line(fake) == first_line(eager)


@pytest.mark.parametrize("op", ["matmul", "matmul_reversed", "outer"])
def test_a_meta_tensor_beside_a_cpu_tensor_is_refused(gen, op):
    """The dispatcher sends a call with one meta operand to the fake kernel: that kernel checks the devices
    as the real one does, instead of returning an uninitialized CPU tensor."""
    meta, cpu = _factory("meta", gen), _factory("cpu", gen)
    if op == "outer":
        call, pattern = lambda: batched_outer(cpu(3, 4, dtype=F16), meta(3, 4, dtype=F16)), r"'u' and 'v' must be on the same device"
    else:
        a, b = (cpu(3, 4), meta(4, 2)) if op == "matmul" else (meta(3, 4), cpu(4, 2))
        call, pattern = lambda: corrected_matmul(a, b), r"'a' and 'b' must be on the same device"
    with pytest.raises(RuntimeError, match=pattern):
        call()


def test_meta_inputs_of_good_calls_work(gen):
    """The other side of the fake-kernel checks: valid meta inputs give torch.matmul's / u.shape + (n,)."""
    t = _factory("meta", gen)
    assert corrected_matmul(t(2, 1, 5, 7), t(3, 7, 4)).shape == (2, 3, 5, 4)
    out = batched_outer(t(6, 9, dtype=BF16), out_dtype=F16)
    assert out.shape == (6, 9, 9) and out.dtype == F16 and out.device.type == "meta"
