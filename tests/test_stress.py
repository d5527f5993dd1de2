"""Stress (issue #6, CUDA only): thousands of calls of both ops with random shapes, methods, dtypes and strided
views, spread round-robin over 4 CUDA streams.

- Inputs are made either on the side stream that runs the op, or on the current stream; then the side stream
  waits for the current one and the inputs are record_stream()-ed on the side stream, so that deleting them
  right after the launch (as most calls here do) cannot hand their memory to another stream too early.
- A random subset of the results (about 1 in 8) is checked against float64 references after waiting for an
  event recorded on the stream that produced it.
- torch.cuda.memory_allocated() after the loop (all results dropped, gc run) must equal its value before, and
  a final synchronize must raise nothing (no asynchronous error).

The same random calls also come from 8 host threads at once, each on its own stream, from the process's
first call on: the host side's lazily set state (kernel attributes, occupancy, the tensor-map encoder, cached
plans) must be safe to set from several threads.

TORCH_WMMAE_STRESS_CALLS scales the number of calls (default 2000).
"""
from __future__ import annotations

import gc
import os
import random
import subprocess
import sys
import textwrap

import pytest
import torch

from torch_wmmae import batched_outer, corrected_matmul

from conftest import child_process_env, deterministic, device_gemm_grid, requires_cuda
from hardening import assert_matmul_within_dot_product_bound, assert_outer_correct, env_int

pytestmark = [requires_cuda, pytest.mark.gpu]

CALLS = env_int("TORCH_WMMAE_STRESS_CALLS", 2000)
NUM_STREAMS = 4
CHECK_PROBABILITY = 1 / 8
DRAIN_EVERY = 32  # pending checks are drained in groups (each check synchronizes the host)
METHODS = ["auto", "fp16", "tf32"]
OUTER_DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def _matrix(gen, rows, cols, layout):
    """A (rows, cols) float32 CUDA tensor: contiguous, a transposed view, or a strided slice of a larger one."""
    if layout == "transposed":
        return torch.randn(cols, rows, device="cuda", generator=gen).t()
    if layout == "sliced":
        big = torch.randn(rows + 3, 2 * cols + 5, device="cuda", generator=gen)
        return big[2 : 2 + rows, 3 : 3 + 2 * cols : 2]
    return torch.randn(rows, cols, device="cuda", generator=gen)


def make_call(rng: random.Random, gen: torch.Generator):
    """A random call: (kind, inputs tuple, keyword arguments). Tensors are made on the current stream."""
    if rng.random() < 0.5:
        m, n = rng.choice([1, 7, 16, 33, rng.randint(1, 256)]), rng.choice([1, 9, 16, 64, rng.randint(1, 256)])
        k = rng.choice([1, 16, 100, rng.randint(1, 1024)])
        a = _matrix(gen, m, k, rng.choice(["contiguous", "transposed", "sliced"]))
        b = _matrix(gen, k, n, rng.choice(["contiguous", "transposed", "sliced"]))
        if rng.random() < 0.25:  # batched, b broadcast over the batch
            batch = rng.randint(2, 5)
            a = torch.stack([a] + [torch.randn(a.shape, device="cuda", generator=gen) for _ in range(batch - 1)])
        return "matmul", (a, b), {"method": rng.choice(METHODS)}
    n = rng.choice([1, 16, 17, 32, 48, 100, rng.randint(1, 130)])
    batch = rng.randint(1, 64)
    dtype = rng.choice(OUTER_DTYPES)
    u = torch.randn(batch, n, device="cuda", generator=gen).to(dtype)
    if rng.random() < 0.3:  # a strided view
        u = torch.randn(batch, 2 * n, device="cuda", generator=gen).to(dtype)[:, ::2]
    v = torch.randn(batch, n, device="cuda", generator=gen).to(dtype) if rng.random() < 0.5 else None
    kwargs = {"alpha": rng.choice([0.0, 1.5, -0.25]), "out_dtype": rng.choice([None, torch.float16, torch.bfloat16])}
    return "outer", (u, v), kwargs


def run_call(kind, inputs, kwargs):
    if kind == "matmul":
        return corrected_matmul(*inputs, **kwargs)
    return batched_outer(*inputs, **kwargs)


def check_call(kind, inputs, kwargs, out):
    if kind == "matmul":
        a, b = (x.cpu() for x in inputs)
        assert_matmul_within_dot_product_bound(out.cpu(), a, b, what=f"method={kwargs['method']}: ")
    else:
        u, v = inputs
        assert_outer_correct(out, u, v, kwargs["alpha"], kwargs["out_dtype"])


def _tensors(inputs):
    return [x for x in inputs if isinstance(x, torch.Tensor)]


def drain(pending):
    """Checks every pending result after its stream's event (the current stream waits for it)."""
    while pending:
        event, kind, inputs, kwargs, out = pending.pop(0)
        torch.cuda.current_stream().wait_event(event)
        check_call(kind, inputs, kwargs, out)


def launch(i, rng, gen, streams, pending, check):
    stream = streams[i % len(streams)]
    if rng.random() < 0.5:  # inputs made on the side stream itself: ordered with the op
        with torch.cuda.stream(stream):
            kind, inputs, kwargs = make_call(rng, gen)
            out = run_call(kind, inputs, kwargs)
    else:  # inputs made on the current stream: the side stream waits, and owns them until it is done
        kind, inputs, kwargs = make_call(rng, gen)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            out = run_call(kind, inputs, kwargs)
        for x in _tensors(inputs):
            x.record_stream(stream)
    if check:
        event = torch.cuda.Event()
        event.record(stream)
        pending.append((event, kind, inputs, kwargs, out))
    # Otherwise inputs and output go out of scope here, while the stream may still be using them.


def warm_up(gen, streams):
    """Every op, method and dtype once on every stream (lazy initialization, per-stream state), checked."""
    for stream in streams:
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            a, b = _matrix(gen, 40, 300, "contiguous"), _matrix(gen, 300, 24, "transposed")
            for method in METHODS:
                check_call("matmul", (a, b), {"method": method}, corrected_matmul(a, b, method=method))
            for dtype in OUTER_DTYPES:
                u = torch.randn(9, 37, device="cuda", generator=gen).to(dtype)
                kwargs = {"alpha": 1.5, "out_dtype": torch.float16}
                check_call("outer", (u, None), kwargs, batched_outer(u, **kwargs))
    torch.cuda.synchronize()


def test_many_calls_on_four_streams():
    rng = random.Random(20261121)
    gen = torch.Generator(device="cuda").manual_seed(6)
    streams = [torch.cuda.Stream() for _ in range(NUM_STREAMS)]
    warm_up(gen, streams)
    gc.collect()
    baseline = torch.cuda.memory_allocated()

    pending = []
    for i in range(CALLS):
        check = rng.random() < CHECK_PROBABILITY or i == CALLS - 1
        launch(i, rng, gen, streams, pending, check)
        if len(pending) >= DRAIN_EVERY:
            drain(pending)
    drain(pending)
    torch.cuda.synchronize()  # an asynchronous error of any call raises here
    gc.collect()
    assert torch.cuda.memory_allocated() == baseline, (
        f"memory_allocated grew from {baseline} to {torch.cuda.memory_allocated()} bytes over {CALLS} calls"
    )


def _long_k_operands(gen):
    """a (64 x 8192), b (8192 x 96): few output tiles, long K (a split-K shape); a_wide: a's elements scaled
    by up to 2^+-20, so that its rows span up to 2^40 and "auto" must take the tf32 split there (not fp16-safe)."""
    a = torch.randn(64, 8192, device="cuda", generator=gen)
    b = torch.randn(8192, 96, device="cuda", generator=gen)
    a_wide = a * torch.exp2(torch.randint(-20, 21, a.shape, device="cuda", generator=gen).float())
    return a, b, a_wide


def _on_concurrent_streams(rounds, calls):
    """calls() on each of NUM_STREAMS fresh side streams in turn, `rounds` times (result i from stream
    i % NUM_STREAMS); the side streams start after the current stream's work, and it waits for theirs."""
    streams = [torch.cuda.Stream() for _ in range(NUM_STREAMS)]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    results = []
    for _ in range(rounds):
        for s in streams:
            with torch.cuda.stream(s):
                results.append(calls())
    for s in streams:
        torch.cuda.current_stream().wait_stream(s)
    return results


def test_same_inputs_on_four_concurrent_streams_agree():
    """The same calls, issued concurrently on 4 streams many times: every result is bitwise identical
    (corrected_matmul in deterministic mode, where it does not split K) and correct. State shared between
    concurrent calls (a static workspace, a flag array) would make results differ."""
    gen = torch.Generator(device="cuda").manual_seed(7)
    a, b, a_wide = _long_k_operands(gen)
    u = torch.randn(4096, 48, device="cuda", generator=gen).half()
    u32 = torch.randn(1024, 100, device="cuda", generator=gen)
    with deterministic():
        results = _on_concurrent_streams(12, lambda: (
            corrected_matmul(a, b), corrected_matmul(a_wide, b, method="auto"),
            batched_outer(u, alpha=0.5), batched_outer(u32, out_dtype=torch.bfloat16)))
        torch.cuda.synchronize()
    first = results[0]
    for i, r in enumerate(results[1:], 1):
        for j, (x, y) in enumerate(zip(first, r)):
            assert torch.equal(x, y), f"call {i} (stream {i % NUM_STREAMS}), output {j} differs from call 0"
    assert_matmul_within_dot_product_bound(first[0].cpu(), a.cpu(), b.cpu())
    assert_matmul_within_dot_product_bound(first[1].cpu(), a_wide.cpu(), b.cpu())
    assert_outer_correct(first[2], u, None, 0.5, None)
    assert_outer_correct(first[3], u32, None, 0.0, torch.bfloat16)


@pytest.mark.parametrize("schedule", ["split_k", "stream_k"])
def test_split_k_calls_on_four_concurrent_streams_are_each_correct(monkeypatch, schedule):
    """The test above without deterministic mode: K split across blocks (split-K, or the wgmma kernel's
    stream-K schedule where it runs), partial sums added by atomics into each call's own output, which its
    pre-pass zeroes beside its own workspace (line exponents, flags), from 4 streams at once. Bits may differ
    between calls (atomics add in any order), so every result is checked against the float64 reference:
    one call's partial sums landing in another's output, or a workspace shared between calls, puts whole
    K-splits of error into both."""
    monkeypatch.setenv("TORCH_WMMAE_STREAM_K", "1" if schedule == "stream_k" else "0")
    gen = torch.Generator(device="cuda").manual_seed(8)
    a, b, a_wide = _long_k_operands(gen)
    _, splits, _, stream_k_blocks, _ = device_gemm_grid(a.shape[0], b.shape[1], a.shape[1])
    assert splits > 1 and (stream_k_blocks > 1) == (schedule == "stream_k"), "the shape must split K"
    results = _on_concurrent_streams(6, lambda: (
        corrected_matmul(a, b), corrected_matmul(a_wide, b, method="auto"), corrected_matmul(a, b, method="tf32")))
    for i, (plain, wide, tf32) in enumerate(results):
        what = f"call {i} (stream {i % NUM_STREAMS}, {schedule}, {stream_k_blocks} stream-K blocks): "
        assert_matmul_within_dot_product_bound(plain, a, b, what)
        assert_matmul_within_dot_product_bound(wide, a_wide, b, what + "auto, wide rows: ")
        assert_matmul_within_dot_product_bound(tf32, a, b, what + "tf32: ")


# A fresh process, so that the threads make its first calls of every kernel together.
_THREADED_CALLS = textwrap.dedent("""
    import random, sys, threading
    import torch
    from test_stress import METHODS, OUTER_DTYPES, _matrix, check_call, make_call, run_call
    threads, calls = int(sys.argv[1]), int(sys.argv[2])
    start = threading.Barrier(threads)
    errors = []

    def worker(t):
        try:
            rng, gen = random.Random(t), torch.Generator(device="cuda").manual_seed(t)
            first = [("matmul", (_matrix(gen, 40, 300, "contiguous"), _matrix(gen, 300, 24, "transposed")),
                      {"method": METHODS[(t + i) % 3]}) for i in range(3)]
            first += [("outer", (torch.randn(9, 37, device="cuda", generator=gen).to(OUTER_DTYPES[(t + i) % 3]),
                                 None), {"alpha": 1.5, "out_dtype": None}) for i in range(3)]
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            start.wait()
            with torch.cuda.stream(stream):  # (this thread's current stream: the calls and their inputs)
                for i in range(len(first) + calls):
                    kind, inputs, kwargs = first[i] if i < len(first) else make_call(rng, gen)
                    out = run_call(kind, inputs, kwargs)
                    if i < len(first) or rng.random() < 0.25:
                        stream.synchronize()
                        check_call(kind, inputs, kwargs, out)
            stream.synchronize()
        except BaseException as e:
            errors.append(f"thread {t}: {e!r}")

    workers = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    torch.cuda.synchronize()
    print("\\n".join(errors) or f"{threads} threads x {calls} calls: ok")
    sys.exit(1 if errors else 0)
""")


def test_first_calls_from_eight_host_threads():
    env = child_process_env()
    env["PYTHONPATH"] += os.pathsep + os.path.dirname(os.path.abspath(__file__))
    calls = max(8, CALLS // 40)
    result = subprocess.run([sys.executable, "-c", _THREADED_CALLS, "8", str(calls)], capture_output=True, text=True,
                            timeout=900, env=env)
    assert result.returncode == 0 and f"8 threads x {calls} calls: ok" in result.stdout, (
        result.stdout[-4000:] + result.stderr[-4000:])

