"""The package surface: exports, schemas, type annotations, the build flavour, the `python -m torch_wmmae` check."""
from __future__ import annotations

import inspect
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import torch_wmmae

from conftest import HAS_CUDA, child_process_env

SCHEMAS = {
    "corrected_matmul": 'wmmae::corrected_matmul(Tensor a, Tensor b, str method="auto") -> Tensor',
    "batched_outer": "wmmae::batched_outer(Tensor u, Tensor? v=None, float alpha=0., ScalarType? out_dtype=None) -> Tensor",
    "fragment_map": "wmmae::fragment_map(str use, int m, int n, int k, str dtype, str? layout=None, int? arch=None, "
    "Device? device=None) -> Tensor",
}


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_schema(name):
    packet = getattr(torch.ops.wmmae, name)
    assert packet.overloads() == ["default"]
    assert str(packet.default._schema) == SCHEMAS[name]


def test_exports():
    for name in ("corrected_matmul", "batched_outer", "fragment_map", "has_cuda_kernels", "METHODS"):
        assert name in torch_wmmae.__all__ and hasattr(torch_wmmae, name)
    assert torch_wmmae.METHODS == ("auto", "fp16", "tf32")
    assert isinstance(torch_wmmae.__version__, str)


def test_has_cuda_kernels_is_bool():
    assert isinstance(torch_wmmae.has_cuda_kernels(), bool)


def test_cpu_kernels_registered():
    for name in SCHEMAS:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"wmmae::{name}", "CPU")


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.skipif(os.environ.get("TORCH_WMMAE_CPU_ONLY") == "1", reason="built CPU-only on purpose")
@pytest.mark.gpu
def test_gpu_machine_has_cuda_kernels():
    """On a GPU machine the CUDA kernels must have been built (else every CUDA test would be meaningless)."""
    assert torch_wmmae.has_cuda_kernels()
    for name in SCHEMAS:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"wmmae::{name}", "CUDA")


def test_self_check_module_runs():
    """`python -m torch_wmmae` runs its checks and exits 0."""
    proc = subprocess.run(
        [sys.executable, "-m", "torch_wmmae"], capture_output=True, text=True, timeout=600, env=child_process_env()
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "torch" in proc.stdout and "PASS" in proc.stdout and "FAIL" not in proc.stdout



def test_api_is_typed():
    """The package says it is typed (PEP 561: a py.typed marker beside its modules), so every public function
    annotates each parameter and its result."""
    assert (pathlib.Path(torch_wmmae.__file__).parent / "py.typed").is_file()
    functions = [f for f in map(lambda name: getattr(torch_wmmae, name), torch_wmmae.__all__) if inspect.isfunction(f)]
    assert len(functions) == 4
    for f in functions:
        signature = inspect.signature(f)
        assert signature.return_annotation is not inspect.Signature.empty, f.__name__
        for p in signature.parameters.values():
            assert p.annotation is not inspect.Parameter.empty, f"{f.__name__}: {p.name}"
