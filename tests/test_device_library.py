"""The header-only device library (csrc/wmmae/).

- On any machine with nvcc: every primitive compiles for every fragment type of sm_75, 80, 86, 89 and 90 with
  warnings as errors (tests/device/compile_check.cu), and misuses fail to compile with their own message
  (tests/device/misuse.cu).
- On a GPU: a test-only extension (tests/device/wmmae_device_tests.cu, built by this test run) checks every
  primitive against its plain-WMMA equivalent for every fragment type, the compile-time map against the
  map measured with load_matrix_sync, and the device forms of the fp16 splits against float64 arithmetic.
"""
import os
import subprocess

import pytest
import torch

import torch_wmmae
from conftest import NO_IMPLICIT_HALF, NVCC, REPO_ROOT, fp16_split_reference
from test_fragment_map import SM80_FRAGMENTS

ROOT = str(REPO_ROOT)
CSRC = os.path.join(ROOT, "csrc")
DEVICE_DIR = os.path.join(ROOT, "tests", "device")
CHECKS = ["foreach_ij coverage", "map inverse", "load_matrix_with_op(identity)", "partial tile, odd ldm",
          "load_vector", "load_vector scaled", "make_identity", "store_matrix_with_op", "multi-fragment load",
          "row quads", "store_vector", "foreach_diagonal", "fill_zero", "integer results", "scale rounded once",
          "wide alpha", "with_op ops used", "load_vector edges"]


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("arch", [75, 80, 86, 89, 90])
def test_library_compiles_without_warnings(arch, tmp_path):
    # (the include path a user's code gets: torch_wmmae.get_include(), csrc/ in this editable checkout)
    cmd = [NVCC, "-std=c++17", f"-arch=sm_{arch}", f"-I{torch_wmmae.get_include()}", *NO_IMPLICIT_HALF,
           "-Werror", "all-warnings", "-Xcompiler", "-Wall,-Werror", "-c", os.path.join(DEVICE_DIR, "compile_check.cu"),
           "-o", str(tmp_path / "check.o")]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


MISUSES = {
    "correct_use": (0, 90, None),
    "operand_with_layout_t": (1, 90, "a layout_t argument is for accumulators"),
    "unmeasured_layout_on_sm75": (2, 75, "is not known for the architecture being compiled"),
    "multi_load_of_different_layouts": (3, 90, "all fragments must share one register layout"),
    "accumulator_in_multi_load": (4, 90, "load an accumulator with load_matrix_with_op(frag, ptr, ldm, layout, op)"),
    "accumulator_after_an_operand_in_multi_load": (7, 90, "load_matrices_with_op takes operands (matrix_a, matrix_b) "
                                                          "only; load an accumulator with load_matrix_with_op"),
    "not_a_fragment": (5, 90, "this argument must be an nvcuda::wmma::fragment"),
    "sub_byte_fragment": (6, 90, "fragments of this element type are not supported"),
}


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("case", list(MISUSES))
def test_misuse_is_refused_at_compile_time(case, tmp_path):
    number, arch, message = MISUSES[case]
    cmd = [NVCC, "-std=c++17", f"-arch=sm_{arch}", f"-I{torch_wmmae.get_include()}", *NO_IMPLICIT_HALF,
           f"-DMISUSE={number}", "-c", os.path.join(DEVICE_DIR, "misuse.cu"), "-o", str(tmp_path / "misuse.o")]
    result = subprocess.run(cmd, capture_output=True, text=True)
    output = result.stdout + result.stderr
    if message is None:
        assert result.returncode == 0, output
    else:
        assert result.returncode != 0 and message in output, output
        # one error, the misuse's own static assertion: no second, misleading one, and none that follows from it
        # (a non-fragment given to every primitive: fragment_traits' placeholders keep their bodies compiling)
        assert output.count(": error") == 1 and "static assertion failed" in output, output


@pytest.fixture(scope="module")
def device_tests():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from torch.utils.cpp_extension import load

    load(name="wmmae_device_tests",
         sources=[os.path.join(DEVICE_DIR, "wmmae_device_tests.cu"), os.path.join(CSRC, "ops", "fragment_spec.cpp")],
         extra_include_paths=[CSRC], extra_cflags=["-O2", "-std=c++17"],
         extra_cuda_cflags=["-O2", "-std=c++17"], is_python_module=False, verbose=False)
    return torch.ops.wmmae_test


@pytest.mark.gpu
@pytest.mark.parametrize("use,m,n,k,dtype,layout", SM80_FRAGMENTS)
def test_primitives_match_plain_wmma(device_tests, seed, use, m, n, k, dtype, layout):
    errors, device_map = device_tests.check(use, m, n, k, dtype, layout, seed % (1 << 30))
    assert errors.numel() == len(CHECKS)
    failed = {name: int(e) for name, e in zip(CHECKS, errors.tolist()) if e}
    assert not failed, f"{use} m{m}n{n}k{k} {dtype} {layout}, seed {seed % (1 << 30)}: mismatches {failed}"
    # The compile-time map the device code uses == the map measured with load_matrix_sync. (The table itself is
    # checked against independent references in test_fragment_map.py.)
    measured = torch_wmmae.fragment_map(use, m, n, k, dtype, layout, device="cuda")
    assert torch.equal(device_map.cpu(), measured.cpu())


SPLIT_FORMS = ["split_fp16", "split_fp16x2", "split_fp16_compensated", "split_fp16x2_compensated"]


def split_test_values(gen: torch.Generator) -> torch.Tensor:
    """Random float32 values over fp16's range and below it (every exponent from 2^-30, all 24 significant bits,
    both signs, |v| < 65520 so that hi is finite), then edges: zeros, ties of the fp16 rounding, fp16's
    subnormals and largest values, float32 subnormals, Inf and NaN."""
    count = 1 << 14
    significand = 1.0 + torch.rand(count, generator=gen, dtype=torch.float64)
    exponent = torch.randint(-30, 16, (count,), generator=gen).double()
    sign = torch.randint(0, 2, (count,), generator=gen).double() * 2 - 1
    random_values = (sign * significand * 2.0**exponent).float()
    random_values = random_values[random_values.abs() < 65520.0]
    edges = torch.tensor([0.0, -0.0, 1.0, 1.0 + 2**-11, 1.0 + 3 * 2**-11, 1.0 + 2**-11 + 2**-23, -(1.0 + 2**-11),
                          2.0**-14, 2.0**-14 - 2**-37, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 2.0**-26, 65504.0, 65519.0,
                          -65519.0, 1e-40, -1e-45, float("inf"), float("-inf"), float("nan"), 0.1],
                         dtype=torch.float32)
    values = torch.cat([random_values, edges])
    return values[: values.numel() // 2 * 2]


@pytest.mark.gpu
def test_fp16_splits_on_the_device_match_float64_arithmetic(device_tests, gen):
    v = split_test_values(gen)
    out = device_tests.split_fp16(v.cuda()).cpu()
    for form, name in enumerate(SPLIT_FORMS):
        expected = fp16_split_reference(v, compensated="compensated" in name)
        for part, (got, want) in enumerate(zip(out[form], expected)):
            got_nan, want_nan = got.isnan(), want.isnan()
            # NaN payloads may differ; everything else must match to the bit (zeros' signs included).
            bad = (got_nan != want_nan) | (~want_nan & (got.view(torch.int16) != want.view(torch.int16)))
            assert not bad.any(), (f"{name} {'hi' if part == 0 else 'lo'}: {int(bad.sum())} of {v.numel()} "
                                   f"differ, e.g. v = {v[bad][:4].tolist()}: {got[bad][:4].tolist()} against "
                                   f"{want[bad][:4].tolist()}")
    assert v.isinf().any() and v.isnan().any() and (v.abs() < 2**-14).any()  # the edges are in
