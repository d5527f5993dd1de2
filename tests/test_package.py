"""The package surface: exports, operator schemas, the build flavour, and the `python -m torch_wmmae` check."""
from __future__ import annotations

import os
import pathlib
import re
import runpy
import subprocess
import sys

import pytest
import torch

import torch_wmmae

from conftest import DEVICES, HAS_CUDA, child_process_env

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


def _readme_python_blocks() -> list[str]:
    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", readme, re.DOTALL)


@pytest.mark.parametrize("device", DEVICES)
def test_readme_examples_run(device, tmp_path):
    """README's Python examples, run as written (on the CPU with "cuda" read as "cpu", less the line that measures
    the GPU's fragment layout), and what their comments say of the results."""
    code = "\n".join(_readme_python_blocks())
    if device == "cpu":
        code = "\n".join(line for line in code.splitlines() if not ("fragment_map(" in line and "device=" in line))
        code = code.replace('"cuda"', '"cpu"')
    script = tmp_path / "readme_examples.py"  # (a file of their own: torch.compile reads the source of f)
    script.write_text(code)
    scope = runpy.run_path(str(script))
    assert scope["c"].dtype == torch.float32 and scope["c"].device.type == device  # the autocast line's result
    assert scope["p"].shape == (10000, 32, 32) and scope["p"].dtype == torch.float32
    assert scope["p16"].dtype == torch.bfloat16
    assert scope["per_sample"].shape == (8, 4096, 512)
    assert scope["t"].shape == (32, 16, 2) and scope["t"].dtype == torch.int32  # Volta's A: 16 elements a lane
    dev = torch.device(device)
    first, second = scope["f"](torch.randn(3, 4, device=dev), torch.randn(4, 5, device=dev), torch.randn(2, 3, device=dev))
    assert first.shape == (3, 5) and second.shape == (2, 3, 3)
