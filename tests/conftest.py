"""Shared helpers of the torch_wmmae test suite.

Every test that can run on both backends takes the ``device`` fixture (or parametrizes over ``DEVICES``):
"cpu" always, "cuda" when a GPU is present, so that the same tests check the CUDA kernels on a GPU machine.
Random inputs come from a ``torch.Generator`` seeded per test (from the test's id), so every test draws its
own data and a failure reproduces exactly.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import glob
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import torch
import torch.utils.checkpoint

import torch_wmmae  # noqa: F401  (registers torch.ops.wmmae)

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]  # (the repository, or an unpacked sdist)
HAS_CUDA = torch.cuda.is_available()

requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")

# "cuda" is listed everywhere and skipped without a GPU (not silently dropped), so the test ids are the same
# on every machine.
DEVICES = ["cpu", pytest.param("cuda", marks=[requires_cuda, pytest.mark.gpu])]

# Unit roundoff of float32 (half an ulp of 1.0).
U32 = 2.0 ** -24

# PyTorch's nvcc flags against implicit half/bf16 conversions: code compiled by the tests must not rely on them.
NO_IMPLICIT_HALF = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__"]


def _find_nvcc() -> str | None:
    """The nvcc of the toolkit that torch's extensions build with (CUDA_HOME/bin), else the one on PATH; None where
    there is none (torch sets CUDA_HOME wherever /usr/local/cuda exists, also where it holds no nvcc)."""
    from torch.utils import cpp_extension

    if cpp_extension.CUDA_HOME and os.path.isfile(os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc")):
        return os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc")
    return shutil.which("nvcc")


NVCC = _find_nvcc()


def pytest_configure(config):
    # Raised inside torch (opcheck / torch.compile internals), not by this package.
    config.addinivalue_line("filterwarnings", "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
    # (torch.func.jvp and forward-mode AD script a helper on first use)
    config.addinivalue_line("filterwarnings", "ignore:`torch.jit.script` is deprecated:DeprecationWarning")


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


def _seed_from(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:6], "little")


@pytest.fixture
def seed(request) -> int:
    """A seed of its own for every test (and parametrization): the hash of the test id."""
    return _seed_from(request.node.nodeid)


@pytest.fixture
def gen(seed) -> torch.Generator:
    """A CPU generator seeded for this test; draw on the CPU, then move to the device."""
    return torch.Generator().manual_seed(seed)


# torch.func's transforms of a scalar function f(x, y) of two tensors, differentiated in both; hessian, jacfwd and
# jacrev of jacrev take second derivatives (forward over reverse, reverse over reverse). The derivative tests of
# both ops apply each to the op and to its float64 reference.
TORCH_FUNC_TRANSFORMS = {
    "grad": lambda f: torch.func.grad(f, argnums=(0, 1)),
    "vjp": lambda f: lambda x, y: torch.func.vjp(f, x, y)[1](torch.ones((), dtype=x.dtype, device=x.device)),
    "jacrev": lambda f: torch.func.jacrev(f, argnums=(0, 1)),
    "jacfwd": lambda f: torch.func.jacfwd(f, argnums=(0, 1)),
    "hessian": lambda f: torch.func.hessian(f, argnums=(0, 1)),
    "jacrev_of_jacrev": lambda f: torch.func.jacrev(torch.func.jacrev(f, argnums=(0, 1)), argnums=(0, 1)),
    "jvp": lambda f: lambda x, y: torch.func.jvp(f, (x, y), (torch.ones_like(x), torch.ones_like(y))),
}


def leaves(tree) -> list:
    """The tensors of a (nested) result, such as a transform's tuples of derivatives, in order."""
    return torch.utils._pytree.tree_leaves(tree)


def assert_node_saves_only_the_other_operand(op, operands, differentiated: int, check_gradient,
                                             gen: torch.Generator) -> None:
    """op(*operands) with only operands[differentiated] needing a gradient (both are non-leaves, so that they
    may change in place): its graph node saves one tensor, the other operand, which that gradient reads. The
    differentiated operand may then change in place and the backward still runs; check_gradient(saved, grad_out)
    then checks the gradient against the saved operand's values and the output's gradient (both float64, on the
    CPU; the output's gradient drawn from gen, so that a transposed or permuted product cannot pass as it could
    with out.sum()'s ones). A change of the saved operand is refused, as for torch.matmul."""
    saved_operand = operands[1 - differentiated]
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        out = op(*operands)
    assert len(packed) == 1 and packed[0].data_ptr() == saved_operand.data_ptr()
    saved = saved_operand.detach().cpu().double()
    operands[differentiated].add_(1.0)
    grad_out = random_tensor(gen, out.shape, "normal", out.device, out.dtype)
    out.backward(grad_out)
    check_gradient(saved, grad_out.double().cpu())
    out = op(*operands)
    saved_operand.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def assert_memory_savers_keep_gradients(gen: torch.Generator, op, inputs, saved: int) -> None:
    """Training code's memory savers around an op: its graph node saves `saved` tensors (each passes once through
    saved-tensor hooks), and activation checkpointing (reentrant or not) and save_on_cpu give a plain backward's
    gradients, bit for bit (in deterministic mode: no sums split over atomics)."""
    packed = []

    def pack(t):
        packed.append(t)
        return t

    with deterministic():
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = op(*inputs)
        assert len(packed) == saved
        grad_out = random_tensor(gen, out.shape, "normal", out.device, out.dtype)

        def gradients(out):  # (.backward: the reentrant checkpoint refuses autograd.grad)
            for x in inputs:
                x.grad = None
            out.backward(grad_out)
            return [x.grad for x in inputs]

        want = gradients(out)
        for name, run in {
            "checkpoint": lambda: torch.utils.checkpoint.checkpoint(op, *inputs, use_reentrant=False),
            "reentrant checkpoint": lambda: torch.utils.checkpoint.checkpoint(op, *inputs, use_reentrant=True),
            "save_on_cpu": lambda: _under(torch.autograd.graph.save_on_cpu(), op, inputs),
        }.items():
            got = gradients(run())
            assert all(torch.equal(g, w) for g, w in zip(got, want)), name


def _under(context, op, inputs):
    with context:
        return op(*inputs)


@pytest.fixture
def vmap_rules_only():
    """torch.vmap raises where an op has no batching rule, instead of looping over the samples one call each."""
    enabled = torch._C._functorch._is_vmap_fallback_enabled()
    torch._C._functorch._set_vmap_fallback_enabled(False)
    yield
    torch._C._functorch._set_vmap_fallback_enabled(enabled)


@contextlib.contextmanager
def float32_matmuls(allow_tf32: bool):
    """float32 matmuls in true float32 (allow_tf32=False) or allowed to run in TF32, for the block."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision())
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    torch.set_float32_matmul_precision("high" if allow_tf32 else "highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved[0]
        torch.set_float32_matmul_precision(saved[1])


@pytest.fixture
def ieee_fp32():
    """torch.matmul in true float32 on the GPU (no TF32): the accuracy baseline of corrected_matmul."""
    with float32_matmuls(allow_tf32=False):
        yield


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref||_F / ||ref||_F, computed in float64."""
    out = out.detach().double()
    ref = ref.detach().double().to(out.device)
    den = torch.linalg.vector_norm(ref).item()
    num = torch.linalg.vector_norm(out - ref).item()
    return num / den if den > 0 else num


def fp16_split_reference(v: torch.Tensor, compensated: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """split.hpp's fp16 split of float32 `v`, written out in float64 (the independent reference of the device
    splits and of the CPU emulation): hi = v rounded to fp16; lo = (v - hi) 2^11, or with the compensation
    (split_fp16_compensated) v 2^11 - hi (2^11 - 2^-13), both exact in float64, rounded once to float32 and
    then to fp16. Returns (hi, lo) as float16."""
    hi = v.half()
    d, h = v.double(), hi.double()
    lo = d * 2048.0 - h * (2048.0 - 2.0**-13) if compensated else (d - h) * 2048.0
    return hi, lo.float().half()


def random_tensor(gen: torch.Generator, shape, dist: str = "normal", device="cpu", dtype=torch.float32):
    """Fresh random data: "uniform" U(-1, 1), "normal" N(0, 1), "positive" U(0, 1)."""
    if dist == "uniform":
        t = torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1
    elif dist == "normal":
        t = torch.randn(shape, generator=gen, dtype=torch.float64)
    elif dist == "positive":
        t = torch.rand(shape, generator=gen, dtype=torch.float64)
    else:
        raise ValueError(dist)
    return t.to(dtype).to(device)


def random_signs(gen: torch.Generator, shape) -> torch.Tensor:
    return torch.where(torch.rand(shape, generator=gen) < 0.5, -1.0, 1.0).double()


def outputs_at_risk(gen: torch.Generator, a_shape, b_shape) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 a and b (on the CPU) whose corrected_matmul outputs are all at risk in the tf32 split
    (split_output_at_risk), so that "tf32" and "auto" recompute every tile with float32 FMAs: small values
    (random signs times 2^U(-60, -20)), and in every row of a one element 2^62 (k = 0) that meets zeros in b,
    in every column of b one (k = 1) that meets zeros in a. Every line spans more than 2^80, every row and
    column more than 2^180 together, and each output, of the small values' products only, is about 2^-124 of
    what the scaling allows."""
    def small(shape):
        return random_signs(gen, shape) * torch.exp2(torch.rand(shape, generator=gen, dtype=torch.float64) * 40 - 60)
    a, b = small(a_shape), small(b_shape)
    a[..., 0] = random_signs(gen, a.shape[:-1]) * 2.0**62
    a[..., 1] = 0.0
    b[..., 0, :] = 0.0
    b[..., 1, :] = random_signs(gen, b.shape[:-2] + b.shape[-1:]) * 2.0**62
    return a.float(), b.float()


def random_tensor_in_layout(shape, reversed_order: bool, gen: torch.Generator, device="cpu") -> torch.Tensor:
    """N(0, 1) float32 of `shape`, stored with its dimensions in reversed order when `reversed_order` (a
    column-major matrix for 2-D shapes; non-contiguous)."""
    if reversed_order and len(shape) >= 2:
        t = torch.randn(list(reversed(shape)), generator=gen, dtype=torch.float64).float().to(device)
        return t.permute(*reversed(range(len(shape))))
    return torch.randn(shape, generator=gen, dtype=torch.float64).float().to(device)


@contextlib.contextmanager
def deterministic(enabled: bool = True):
    """torch.use_deterministic_algorithms(enabled) for the block (corrected_matmul does not split K then)."""
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(enabled)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous)


def cuda_caching_allocator_on() -> bool:
    """Whether PyTorch's caching allocator serves CUDA memory (compute-sanitizer runs turn it off)."""
    return os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") != "1"


# Memory pools that tests made (poisoned_cuda_pool, poisoned_output), each with its device, kept until none of
# its blocks holds a tensor (_release_idle_pools): tests keep their outputs past the pool's block (a `with` around the
# call, the checks after it), so a pool is never destroyed with blocks in use. Nothing here calls MemPool.snapshot():
# the rare segmentation faults of whole-file runs (sessions 96-108, always in small-GEMM tests) were last seen inside
# it, at the end of poisoned_cuda_pool (before that in the profiler, and once at a pool's first allocation). Whether a
# pool still holds a tensor is asked as CUDA graph trees ask it (the caching allocator's live allocations of a pool).
_POOLS_IN_USE: list = []


def keep_pool_until_idle(pool: "torch.cuda.MemPool") -> "torch.cuda.MemPool":
    """Keeps `pool` (made on the current device) alive until none of its blocks holds a tensor; returns it."""
    _POOLS_IN_USE.append((pool, torch.cuda.current_device()))
    return pool


def _pool_has_live_blocks(pool, device: int) -> bool:
    return not torch._C._cuda_checkPoolLiveAllocations(device, pool.id, set())


@pytest.fixture(autouse=True)
def _release_idle_pools():
    """After each test, the kept pools whose tensors are all gone are released (a failed test's frames may still
    hold some: those pools wait for a later test)."""
    yield
    if _POOLS_IN_USE:
        gc.collect()
        _POOLS_IN_USE[:] = [entry for entry in _POOLS_IN_USE if _pool_has_live_blocks(*entry)]


def _segments_allocated() -> int:
    """How many segments the caching allocator has ever allocated on the current device (any pool)."""
    return torch.cuda.memory_stats().get("segment.all.allocated", 0)


@contextlib.contextmanager
def poisoned_cuda_pool(value, dtype=torch.float32, large: bool = False):
    """Allocations of the block come from a private pool whose only memory is one 2 MiB segment of small
    blocks (allocations of at most 1 MiB) and, with `large`, one 20 MiB segment for larger ones (the caching
    allocator's segment for requests from 1 to 10 MiB), filled with `value` and freed first: an output or
    workspace that a kernel fails to write keeps the poison. Checks at the end that the block allocated no other
    segment (the caching allocator's count of segments allocated). Skips where the caching allocator is off
    (compute-sanitizer runs), since the pool then hands out fresh memory. The pool outlives the block until its
    tensors are gone (keep_pool_until_idle)."""
    if not cuda_caching_allocator_on():
        pytest.skip("needs the caching allocator")
    pool = keep_pool_until_idle(torch.cuda.MemPool())
    with torch.cuda.use_mem_pool(pool):
        segments_before = _segments_allocated()
        sizes = [1 << 20] * 2 + ([20 << 20] if large else [])
        poison = [torch.full((size // dtype.itemsize,), value, dtype=dtype, device="cuda") for size in sizes]
        del poison
        poisoned_segments = _segments_allocated()
        assert poisoned_segments - segments_before == 1 + large, "the poison did not fill exactly its own segments"
        yield pool
    assert _segments_allocated() == poisoned_segments, "the call allocated outside the poisoned segments"


def poisoned_pool_where_possible(device, value, dtype=torch.float32, large: bool = False):
    """poisoned_cuda_pool(value, dtype, large) for a CUDA call where the caching allocator runs; elsewhere (the CPU,
    or compute-sanitizer, which turns the allocator off and watches the accesses itself) no pool, instead of the
    skip poisoned_cuda_pool would make."""
    if torch.device(device).type == "cuda" and cuda_caching_allocator_on():
        return poisoned_cuda_pool(value, dtype, large)
    return contextlib.nullcontext()


def poisoned_output(call, shape, dtype=torch.float32) -> torch.Tensor:
    """call()'s output, which must land in memory just filled with NaN: for outputs too large for
    poisoned_cuda_pool's segments (test_large's gigabytes), a private pool whose only free block is a poisoned one
    of the output's size, which the call must allocate first (checked by address). An element the kernels fail to
    write stays NaN, where fresh memory could hold an earlier call's right answer for the same inputs. (Without
    the caching allocator, as under compute-sanitizer, a plain call.)"""
    if not cuda_caching_allocator_on():
        out = call()
    else:
        with torch.cuda.use_mem_pool(keep_pool_until_idle(torch.cuda.MemPool())):
            poison = torch.full(shape, float("nan"), dtype=dtype, device="cuda")
            address = poison.data_ptr()
            del poison
            out = call()
        assert out.data_ptr() == address, "the output did not land in the poisoned memory"
    assert out.shape == shape, (tuple(out.shape), shape)
    return out


def dispatched_ops(fn) -> list[str]:
    """The operators fn() calls, by name (e.g. "wmmae::corrected_matmul"), as a TorchDispatchMode sees them: below
    autograd, so a backward pass's own calls too (the engine carries the mode to its device threads)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    names = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            names.append(func._schema.name)
            return func(*args, **(kwargs or {}))

    with Record():
        fn()
    return names


def compiled_autograd_graphs(backward, fresh: bool = True) -> list:
    """Runs backward() (a backward pass) under Compiled Autograd, which traces it as one graph and compiles that with
    Dynamo (backend "eager"), and returns the FX graphs Dynamo compiled. fresh: Dynamo's and Compiled Autograd's
    caches emptied first (else an earlier pass's graph serves where its cache key matches). Under a
    TorchDispatchMode (dispatched_ops) Dynamo compiles nothing: the traced graph runs as traced, and none is
    returned."""
    from torch._dynamo import compiled_autograd

    if fresh:
        torch._dynamo.reset()
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    with compiled_autograd._enable(torch.compile(backend=record)):
        backward()
    return graphs


def graph_calls(graphs) -> list[str]:
    """The names of what the graphs call (call_function nodes' targets)."""
    return [getattr(node.target, "__name__", str(node.target)) for gm in graphs for node in gm.graph.nodes
            if node.op == "call_function"]


def launched_kernels(fn) -> list[tuple[str, int]]:
    """(name, device index) of every CUDA kernel (and memset or copy) that fn() launches, on any device. Earlier
    tests' cyclic garbage (a failed test's frames hold its memory pools and tensors) is collected first, and the
    collector stays off until the events are parsed: the profiler's rare aborts came during a collection."""
    gc.collect()
    gc.disable()
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn()
            for index in range(torch.cuda.device_count()):
                torch.cuda.synchronize(index)
        return [(e.name, e.device_index) for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    finally:
        gc.enable()


@functools.lru_cache(maxsize=None)
def profiler_records_kernels() -> bool:
    """Whether torch.profiler sees CUDA kernels in this process (not under compute-sanitizer, which holds
    CUPTI's one subscription): tests check which kernels ran only where it does."""
    return torch.cuda.is_available() and bool(launched_kernels(lambda: torch.ones(8, device="cuda").add_(1)))


def runs_sm90_gemm(device="cuda") -> bool:
    """Whether corrected_matmul runs the wgmma kernels on `device` (a build with sm_90a code on an H100/H200),
    as the op itself decides it: unlike kernel names from torch.profiler, this holds under compute-sanitizer."""
    return torch.cuda.is_available() and "sm90" in torch.ops.wmmae._corrected_matmul_kernel_choice(
        torch.empty(0, device=device))


# The wgmma fp16 kernel's instantiations that read a chunk's partial sums back in one batch (kReadBack), for even
# output widths or odd ones (kOddWidth, which stages them); also those that read A by residue (A row-major, B
# row-major, kReadBack, kOddWidth) or B by residue (the same, then A by residue).
READ_BACK_KERNEL = re.compile(r"corrected_gemm_sm90_kernel<(true|false), (true|false), (true|false), true, false, "
                              r"(true|false)>|corrected_gemm_sm90_kernel_[ab]_by_residue<(true|false), (true|false), "
                              r"true, (true|false)[,>]")

# The small GEMM's kernels (corrected_gemm_small.cuh), their template arguments: tile, K bucket, A row-major,
# B row-major, hi*hi sums per fragment.
SMALL_GEMM_KERNEL_ARGS = re.compile(
    r"corrected_gemm_small_kernel<(\d+), (\d+), (true|false), (true|false), (true|false)>")


def device_gemm_grid(m: int, n: int, k: int, batch: int = 1, device="cuda") -> list[int]:
    """corrected_matmul's launch grid (_corrected_matmul_grid) on `device`: its SM count and L2 size."""
    props = torch.cuda.get_device_properties(device)
    return torch.ops.wmmae._corrected_matmul_grid(m, n, k, batch, props.multi_processor_count, props.L2_cache_size)


@functools.lru_cache(maxsize=None)
def extension_cubin_archs() -> set | None:
    """The architectures of the built extension's device code (e.g. {"sm_90a"}), from the "arch =" lines of
    cuobjdump's listing under "Fatbin elf code" (not the cubins' names, which may omit the "a"; not the PTX's
    entries, e.g. sm_90 for TORCH_CUDA_ARCH_LIST="9.0+PTX"; None: no cuobjdump or no binary), independently of
    what the op reports."""
    sys.path.insert(0, str(REPO_ROOT / "tools"))
    import sass_report

    binaries = glob.glob(os.path.join(os.path.dirname(torch_wmmae.__file__), "_C*.so"))
    tool = sass_report.find_cuobjdump()
    if not binaries or tool is None:
        return None
    listing = subprocess.run([tool, "--dump-resource-usage", binaries[0]], capture_output=True, text=True,
                             check=True).stdout
    return set(re.findall(r"^Fatbin elf code:\n=+\narch = (sm_\w+)$", listing, re.MULTILINE))


def extension_has_sm90a_code() -> bool | None:
    """Whether the built extension holds sm_90a code (extension_cubin_archs; None: unknown)."""
    archs = extension_cubin_archs()
    return None if archs is None else "sm_90a" in archs


def persistent_slots_batch(m: int, n: int, k: int, device="cuda") -> int:
    """A batch of m x k @ k x n products that corrected_matmul's plan runs as persistent batch slots on `device`
    (three rounds of SMs / 4 slots, as many as the full grid's waves: _corrected_matmul_grid's last entry), or
    0 where the plan keeps the grid."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    batch = 2 * (sms // 4) + 3
    return batch if device_gemm_grid(m, n, k, batch, device)[4] else 0


def child_process_env(**extra: str) -> dict:
    """The environment for a Python child process that must import the torch_wmmae these tests imported (an
    in-place build too, not whatever else is on the child's path)."""
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(torch_wmmae.__file__)))
    path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}
