"""The header-only device library (csrc/wmmae/).

- On any machine with nvcc: every primitive compiles for every fragment type of sm_75, 80, 86, 89 and 90 with
  warnings as errors (tests/device/compile_check.cu), and misuses fail to compile with their own message
  (tests/device/misuse.cu).
- On a GPU: a test-only extension (tests/device/wmmae_device_tests.cu, built by this test run) checks every
  primitive against its plain-WMMA equivalent for every fragment type, and the compile-time map against the
  map measured with load_matrix_sync.
"""
import os
import shutil
import subprocess

import pytest
import torch

import torch_wmmae
from conftest import NO_IMPLICIT_HALF, REPO_ROOT
from test_fragment_map import SM80_FRAGMENTS

ROOT = str(REPO_ROOT)
CSRC = os.path.join(ROOT, "csrc")
DEVICE_DIR = os.path.join(ROOT, "tests", "device")
CHECKS = ["foreach_ij coverage", "map inverse", "load_matrix_with_op(identity)", "partial tile, odd ldm",
          "load_vector", "load_vector scaled", "make_identity", "store_matrix_with_op", "multi-fragment load",
          "row quads", "store_vector", "foreach_diagonal", "fill_zero", "integer results"]


def _nvcc():
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    path = os.path.join(home, "bin", "nvcc")
    return path if os.path.exists(path) else shutil.which("nvcc")


@pytest.mark.skipif(_nvcc() is None, reason="nvcc not found")
@pytest.mark.parametrize("arch", [75, 80, 86, 89, 90])
def test_library_compiles_without_warnings(arch, tmp_path):
    cmd = [_nvcc(), "-std=c++17", f"-arch=sm_{arch}", f"-I{CSRC}", *NO_IMPLICIT_HALF, "-Werror", "all-warnings",
           "-Xcompiler", "-Wall,-Werror", "-c", os.path.join(DEVICE_DIR, "compile_check.cu"), "-o",
           str(tmp_path / "check.o")]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


MISUSES = {
    "correct_use": (0, 90, None),
    "operand_with_layout_t": (1, 90, "a layout_t argument is for accumulators"),
    "unmeasured_layout_on_sm75": (2, 75, "is not known for the architecture being compiled"),
    "multi_load_of_different_layouts": (3, 90, "all fragments must share one register layout"),
    "accumulator_in_multi_load": (4, 90, "load an accumulator with load_matrix_with_op(frag, ptr, ldm, layout, op)"),
    "not_a_fragment": (5, 90, "this argument must be an nvcuda::wmma::fragment"),
    "sub_byte_fragment": (6, 90, "fragments of this element type are not supported"),
}


@pytest.mark.skipif(_nvcc() is None, reason="nvcc not found")
@pytest.mark.parametrize("case", list(MISUSES))
def test_misuse_is_refused_at_compile_time(case, tmp_path):
    number, arch, message = MISUSES[case]
    cmd = [_nvcc(), "-std=c++17", f"-arch=sm_{arch}", f"-I{CSRC}", *NO_IMPLICIT_HALF, f"-DMISUSE={number}", "-c",
           os.path.join(DEVICE_DIR, "misuse.cu"), "-o", str(tmp_path / "misuse.o")]
    result = subprocess.run(cmd, capture_output=True, text=True)
    output = result.stdout + result.stderr
    if message is None:
        assert result.returncode == 0, output
    else:
        assert result.returncode != 0 and message in output, output
        assert output.count("static assertion failed") == 1, output  # one message: no misleading second one


@pytest.fixture(scope="module")
def device_tests():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from torch.utils.cpp_extension import load

    load(name="wmmae_device_tests",
         sources=[os.path.join(DEVICE_DIR, "wmmae_device_tests.cu"), os.path.join(CSRC, "ops", "fragment_spec.cpp")],
         extra_include_paths=[CSRC], extra_cflags=["-O2", "-std=c++17"],
         extra_cuda_cflags=["-O2", "-std=c++17"], is_python_module=False, verbose=False)
    return torch.ops.wmmae_test.check


@pytest.mark.gpu
@pytest.mark.parametrize("use,m,n,k,dtype,layout", SM80_FRAGMENTS)
def test_primitives_match_plain_wmma(device_tests, seed, use, m, n, k, dtype, layout):
    errors, device_map = device_tests(use, m, n, k, dtype, layout, seed % (1 << 30))
    assert errors.numel() == len(CHECKS)
    failed = {name: int(e) for name, e in zip(CHECKS, errors.tolist()) if e}
    assert not failed, f"{use} m{m}n{n}k{k} {dtype} {layout}, seed {seed % (1 << 30)}: mismatches {failed}"
    # The compile-time map the device code uses == the map measured with load_matrix_sync. (The table itself is
    # checked against independent references in test_fragment_map.py.)
    measured = torch_wmmae.fragment_map(use, m, n, k, dtype, layout, device="cuda")
    assert torch.equal(device_map.cpu(), measured.cpu())
