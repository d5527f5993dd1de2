"""Several devices (issue #6): the ops run on the device of their inputs whatever the current device is, their
outputs stay there, mixed devices raise a clear error, and DistributedDataParallel training through
corrected_matmul's autograd works (tests/distributed/ddp_train.py, launched with torch.distributed.run).

The GPU tests need 2 CUDA devices. The DDP script also runs on the CPU (gloo, 2 processes), which checks the
script and the CPU implementation's autograd under DDP on any machine.
"""
from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys

import pytest
import torch

from torch_wmmae import batched_outer, corrected_matmul, fragment_map

from conftest import (READ_BACK_KERNEL, child_process_env, deterministic, device_gemm_grid, launched_kernels,
                      outputs_at_risk, persistent_slots_batch, profiler_records_kernels, random_tensor, rel_err,
                      runs_sm90_gemm)
from hardening import analytic_arch, assert_device_still_usable, assert_matmul_within_dot_product_bound, assert_outer_correct

TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2
requires_two_gpus = pytest.mark.skipif(not TWO_GPUS, reason="needs 2 CUDA GPUs")
DDP_SCRIPT = pathlib.Path(__file__).parent / "distributed" / "ddp_train.py"
# Required on our multi-GPU machines: no NVLink multicast / NVLS.
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
ACC16 = ("accumulator", 16, 16, 16, "float")


def check_ops_on(dev: torch.device, gen: torch.Generator) -> None:
    """Both ops (forward, every method, and backward) and fragment_map on `dev`: outputs on `dev`, correct."""
    a = random_tensor(gen, (129, 300), "normal", dev)
    b = random_tensor(gen, (300, 65), "normal", dev)
    for method in ("auto", "fp16", "tf32"):
        out = corrected_matmul(a, b, method=method)
        assert out.device == dev
        assert_matmul_within_dot_product_bound(out, a, b, what=f"{dev} method={method}: ")
    a_req, b_req = a.clone().requires_grad_(), b.clone().requires_grad_()
    grad_out = random_tensor(gen, (129, 65), "normal", dev)
    corrected_matmul(a_req, b_req).backward(grad_out)
    assert a_req.grad.device == dev and b_req.grad.device == dev
    assert rel_err(a_req.grad, grad_out.double() @ b.double().t()) < 1e-5
    assert rel_err(b_req.grad, a.double().t() @ grad_out.double()) < 1e-5

    u = random_tensor(gen, (7, 48), "normal", dev, torch.float16)
    v = random_tensor(gen, (7, 48), "normal", dev, torch.float16)
    out = batched_outer(u, v, alpha=0.5)
    assert out.device == dev
    assert_outer_correct(out, u, v, 0.5, None)
    u32 = random_tensor(gen, (5, 100), "normal", dev)
    out = batched_outer(u32, out_dtype=torch.bfloat16)
    assert out.device == dev
    assert_outer_correct(out, u32, None, 0.0, torch.bfloat16)
    u_req, v_req = u.clone().requires_grad_(), v.clone().requires_grad_()
    g = random_tensor(gen, (7, 48, 48), "normal", dev)
    batched_outer(u_req, v_req, alpha=0.5).backward(g)
    assert u_req.grad.device == dev and v_req.grad.device == dev and u_req.grad.dtype == torch.float16
    g64 = g.double()
    assert rel_err(u_req.grad, (g64 @ v.double().unsqueeze(-1)).squeeze(-1)) < 1e-3  # (fp16 gradients)
    assert rel_err(v_req.grad, (g64.mT @ u.double().unsqueeze(-1)).squeeze(-1)) < 1e-3

    table = fragment_map(*ACC16, device=dev)
    assert table.device == dev
    assert torch.equal(table.cpu(), fragment_map(*ACC16, arch=analytic_arch(dev)))


@pytest.mark.parametrize("current,target", [(0, 1), (1, 0)])
@pytest.mark.usefixtures("ieee_fp32")
@requires_two_gpus
@pytest.mark.gpu
def test_ops_run_on_the_inputs_device(gen, current, target):
    """Inputs on cuda:target while cuda:current is the current device (`with torch.cuda.device(current)`):
    everything runs on cuda:target, outputs and gradients stay there, and the current device is unchanged."""
    dev = torch.device("cuda", target)
    with torch.cuda.device(current):
        check_ops_on(dev, gen)
        torch.cuda.synchronize(dev)
        assert torch.cuda.current_device() == current


@requires_two_gpus
@pytest.mark.gpu
def test_fragment_map_plain_cuda_means_the_current_device():
    for index in (0, 1):
        with torch.cuda.device(index):
            table = fragment_map(*ACC16, device="cuda")
            assert table.device == torch.device("cuda", index)
            assert torch.equal(table.cpu(), fragment_map(*ACC16, arch=analytic_arch(index)))


@requires_two_gpus
@pytest.mark.gpu
@pytest.mark.usefixtures("ieee_fp32")
def test_both_devices_at_once_give_the_same_bits(gen):
    """The same inputs on cuda:0 and cuda:1, launched back to back without synchronizing: identical results
    (corrected_matmul in deterministic mode, where it does not split K; batched_outer always)."""
    a = random_tensor(gen, (200, 3000), "normal")
    b = random_tensor(gen, (3000, 150), "normal")
    u = random_tensor(gen, (2000, 64), "normal", dtype=torch.float16)
    with deterministic():
        outs = []
        for index in (0, 1):
            dev = torch.device("cuda", index)
            ad, bd, ud = a.to(dev), b.to(dev), u.to(dev)
            outs.append((corrected_matmul(ad, bd), batched_outer(ud, alpha=1.5), batched_outer(ad[:, :100], out_dtype=torch.float16)))
        results = [[t.cpu() for t in o] for o in outs]
    for x, y in zip(*results):
        assert torch.equal(x, y)
    assert_matmul_within_dot_product_bound(results[0][0], a, b)
    # The GPU contract (one ulp of tensor-core accumulation on the diagonal), so the CUDA tensors.
    assert_outer_correct(outs[0][1], u.to(outs[0][1].device), None, 1.5, None)
    assert_outer_correct(outs[0][2], a[:, :100].to(outs[0][2].device), None, 0.0, torch.float16)


# Each schedule of corrected_matmul's CUDA GEMM (see README, Performance, "The kernel"): (a shape, b shape,
# environment, deterministic mode, method, a kernel that must run on Hopper builds). Beside the resident
# pre-pass, with persistent batch slots (the batch is set per GPU), auto's tiles that are not fp16-safe (its
# tf32 GEMM), a grid whose first wave starts staggered (at least half as many blocks as SMs, 12 k-stages each:
# the device's SM count sets the delays), stream-K and split-K (atomics: bound only, not bits), and the float32
# fallback computing every quadrant again (outputs at risk: conftest.outputs_at_risk; the CPU emulation's bits).
# A large output (2048^2, chunks of 4096) with K = 4160: unsplit in deterministic mode, its blocks read their
# partial sums back in one batch (the kReadBack instantiation); otherwise the long-K split in 2 (the GPU's SM
# count and L2 size decide it, so the test checks the plan of each GPU). Small products: the small GEMM, auto's
# wide entry with float32 FMAs.
SCHEDULES = {
    "resident_prepass": ((6, 200, 300), (6, 300, 136), {}, True, "fp16", "resident_prepass_kernel"),
    "persistent_batch_slots": ((None, 200, 100), (None, 100, 136), {}, True, "fp16", None),
    "auto_tf32_tiles": ((6, 200, 300), (6, 300, 136), {}, True, "auto", "corrected_gemm_sm90_tf32_kernel"),
    "staggered_grid": ((2048, 2048), (2048, 2048), {}, True, "fp16", None),
    "stream_k": ((200, 3000), (3000, 300), {"TORCH_WMMAE_STREAM_K": "1"}, False, "fp16", None),
    "split_k": ((2, 64, 8192), (2, 8192, 64), {}, False, "fp16", None),
    "float32_fallback": ((2, 150, 70), (70, 140), {}, True, "tf32", "float32_fallback_kernel"),
    "read_back_in_one_batch": ((2048, 4160), (4160, 2048), {}, True, "fp16", READ_BACK_KERNEL),
    "long_k_split": ((2048, 4160), (4160, 2048), {}, False, "fp16", None),
    "small_gemm": ((6, 50, 100), (6, 100, 60), {}, True, "auto", "corrected_gemm_small_kernel"),
}


@pytest.mark.parametrize("current,target", [(0, 1), (1, 0)])
@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.usefixtures("ieee_fp32")
@requires_two_gpus
@pytest.mark.gpu
def test_every_gemm_schedule_runs_on_the_inputs_device(gen, monkeypatch, schedule, current, target):
    """Inputs on cuda:target while cuda:current is current: every kernel of the call runs on cuda:target
    (the resident pre-pass's counts, the workspace, the TMA maps and the per-device launch settings are that
    device's), the result is within the dot-product bound, and where the schedule is deterministic it has
    the bits of the same call on the other GPU."""
    a_shape, b_shape, env, exact, method, kernel = SCHEDULES[schedule]
    for key in ("TORCH_WMMAE_STREAM_K", "TORCH_WMMAE_RESIDENT_PREPASS", "TORCH_WMMAE_SM90_TMA",
                "TORCH_WMMAE_PORTABLE_GEMM", "TORCH_WMMAE_SMALL_GEMM"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    dev, other = torch.device("cuda", target), torch.device("cuda", current)
    if a_shape[0] is None:
        batch = persistent_slots_batch(a_shape[1], b_shape[2], a_shape[2], dev)
        if not batch:
            pytest.skip("the plan runs no persistent batch slots on this GPU")
        a_shape, b_shape = (batch, *a_shape[1:]), (batch, *b_shape[1:])
    if schedule == "float32_fallback":
        a, b = (t.to(dev) for t in outputs_at_risk(gen, a_shape, b_shape))
    else:
        a = random_tensor(gen, a_shape, "normal", dev)
        b = random_tensor(gen, b_shape, "normal", dev)
    if method == "auto":  # one row of entry 3 spans 2^60: its row of tiles goes to the tf32 GEMM
        a[3, 7, 1], a[3, 7, 2] = 2.0**30, 2.0**-30
    out = {}
    with torch.cuda.device(current), deterministic(exact):
        if schedule == "long_k_split":
            plans = [device_gemm_grid(a_shape[-2], b_shape[-1], a_shape[-1], device=d)[1::2] for d in (dev, other)]
            if plans != [[2, 0], [2, 0]]:  # ([K splits, stream-K blocks])
                pytest.skip(f"these GPUs' plans do not split 2048^2 x 4160 in 2 without stream-K: {plans}")
        kernels = launched_kernels(lambda: out.setdefault(target, corrected_matmul(a, b, method=method)))
        out[current] = corrected_matmul(a.to(other), b.to(other), method=method)
        torch.cuda.synchronize(other)
        assert torch.cuda.current_device() == current
    if profiler_records_kernels():
        assert kernels and all(index == target for _, index in kernels), kernels
        if kernel and runs_sm90_gemm(dev):
            assert any(re.search(kernel, name) for name, _ in kernels), kernels
    assert out[target].device == dev
    assert_matmul_within_dot_product_bound(out[target], a, b, f"{schedule} on {dev}: ")
    if exact:
        assert torch.equal(out[target].cpu(), out[current].cpu())
    if schedule == "float32_fallback":
        assert torch.equal(out[target].cpu(), corrected_matmul(a.cpu(), b.cpu(), method=method))


MIXED = {
    "matmul": (lambda d0, d1, gen: corrected_matmul(random_tensor(gen, (3, 4), device=d0), random_tensor(gen, (4, 2), device=d1)),
               r"arguments 'a' and 'b' must be on the same device, got a on cuda:0 and b on cuda:1"),
    "matmul_reversed": (lambda d0, d1, gen: corrected_matmul(random_tensor(gen, (3, 4), device=d1), random_tensor(gen, (4, 2), device=d0), method="tf32"),
                        r"arguments 'a' and 'b' must be on the same device, got a on cuda:1 and b on cuda:0"),
    "outer": (lambda d0, d1, gen: batched_outer(random_tensor(gen, (3, 4), device=d0, dtype=torch.float16),
                                                random_tensor(gen, (3, 4), device=d1, dtype=torch.float16)),
              r"arguments 'u' and 'v' must be on the same device, got u on cuda:0 and v on cuda:1"),
    "outer_raw_fp32": (lambda d0, d1, gen: torch.ops.wmmae.batched_outer(random_tensor(gen, (3, 4), device=d1),
                                                                          random_tensor(gen, (3, 4), device=d0), 1.0, None),
                       r"arguments 'u' and 'v' must be on the same device"),
}


@requires_two_gpus
@pytest.mark.gpu
@pytest.mark.parametrize("case", list(MIXED))
def test_mixed_cuda_devices_raise(gen, case):
    call, pattern = MIXED[case]
    with pytest.raises(RuntimeError, match=pattern):
        call(torch.device("cuda", 0), torch.device("cuda", 1), gen)
    for index in (0, 1):
        assert_device_still_usable(torch.device("cuda", index), gen)


# --------------------------------------------------------------------------------------------------------
# DistributedDataParallel
# --------------------------------------------------------------------------------------------------------
def run_ddp(tmp_path, backend: str, device: str, extra_env: dict) -> dict:
    out = tmp_path / "ddp.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(DDP_SCRIPT),
           "--backend", backend, "--device", device, "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env=child_process_env(OMP_NUM_THREADS="1", **extra_env))
    assert proc.returncode == 0, f"exit code {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    report = json.loads(out.read_text())
    assert report["world"] == 2
    losses, ref_losses = report["losses"], report["reference_losses"]
    assert len(losses) == 20
    # (a) training makes progress
    assert losses[-1] < 0.5 * losses[0] and sum(losses[-5:]) < sum(losses[:5]), losses
    # (b) the same parameters on both ranks, bit for bit
    assert report["identical_on_ranks"]
    # (c) the trajectory of single-process float32 training on the full batches
    assert report["param_rel_diff"] < 1e-4, report
    assert report["loss_rel_diff"] < 1e-4, (losses, ref_losses)
    return report


@requires_two_gpus
@pytest.mark.gpu
def test_ddp_nccl_two_gpus(tmp_path):
    report = run_ddp(tmp_path, "nccl", "cuda", NCCL_ENV)
    assert report["device"] == "cuda:0"


def test_ddp_gloo_two_cpu_processes(tmp_path):
    report = run_ddp(tmp_path, "gloo", "cpu", {})
    assert report["device"] == "cpu"
