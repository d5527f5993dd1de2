"""Shared helpers of the benchmark scripts: CUDA-event timing with warm-up and rotating inputs, and the
result files (JSON + markdown table, with GPU name, torch version and date)."""
from __future__ import annotations

import datetime
import json
import os
import statistics
from collections import deque
from typing import Callable, Sequence

import torch

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def _enqueued_behind_spin(enqueue: Callable[[], object], spin_cycles: int, who: str):
    """Queues a spin kernel that holds the GPU (the "blocking kernel" of NVIDIA's nvbench), then enqueue(),
    then synchronizes, and returns what enqueue() returned, once the spin was still running when enqueue()
    had returned, so that the GPU never waited for the host. Otherwise it tries again with a 4x longer spin."""
    for _ in range(6):
        torch.cuda._sleep(spin_cycles)
        spin_done = torch.cuda.Event()
        spin_done.record()
        result = enqueue()
        held = not spin_done.query()  # still spinning: everything was enqueued in time
        torch.cuda.synchronize()
        if held:
            return result
        spin_cycles *= 4
    raise RuntimeError(f"{who}: the host did not get ahead of the GPU")


def median_ms(fn: Callable[[int], object], n_inputs: int = 1, warmup: int = 3, reps: int = 20,
              host_ahead: bool = False) -> float:
    """Median time of fn(i) in milliseconds, i cycling over n_inputs input sets (so that repeated calls do
    not just re-read the L2 cache). Each call is timed with its own pair of CUDA events.

    host_ahead=False: the GPU is idle when the first call is enqueued, so a call whose GPU work is shorter
    than the host's time to enqueue it is timed at the host's pace (launch latency included).
    host_ahead=True: a spin kernel is queued first and holds the GPU until the host has enqueued every timed
    call (_enqueued_behind_spin), so the events measure the calls' GPU time: kernels and the gaps between
    them, without the host's launch latency.
    """
    for i in range(warmup):
        fn(i % n_inputs)
    torch.cuda.synchronize()

    def enqueue():
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for i, (start, end) in enumerate(events):
            start.record()
            fn(i % n_inputs)
            end.record()
        return events

    if host_ahead:  # ~100 us of spin per call at 2 GHz, against 20-60 us of host time per call
        events = _enqueued_behind_spin(enqueue, 200_000 * reps, "median_ms(host_ahead=True)")
    else:
        events = enqueue()
        torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def loop_ms(fn: Callable[[int], object], n_inputs: int = 1, calls: int = 40, rounds: int = 5) -> float:
    """Median over `rounds` of the mean time per call, in milliseconds, of `calls` calls of fn(i) enqueued back
    to back between one pair of CUDA events, the host kept ahead (_enqueued_behind_spin). Unlike median_ms,
    nothing is enqueued between the calls, so a call may overlap the one before it (as in a training step's
    sequence of ops)."""
    fn(0)
    torch.cuda.synchronize()

    def enqueue():
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(calls):
            fn(i % n_inputs)
        end.record()
        return start, end

    per_call = []
    for _ in range(rounds):
        start, end = _enqueued_behind_spin(enqueue, 200_000 * calls, "loop_ms")
        per_call.append(start.elapsed_time(end) / calls)
    return statistics.median(per_call)


def random_inputs(shape, dist: str, gen: torch.Generator) -> torch.Tensor:
    """U(-1, 1) ("uniform": torch.rand * 2 - 1) or N(0, 1) float32 values on the GPU."""
    if dist == "uniform":
        return torch.rand(shape, device="cuda", generator=gen) * 2 - 1
    return torch.randn(shape, device="cuda", generator=gen)


def rotating_operands(m: int, n: int, k: int, batch: int, l2_bytes: int, dist: str = "uniform") -> tuple:
    """(a_sets, b_sets): input sets of a (m x k) and b (k x n), batched where batch > 1, as many as make one
    rotation of inputs and outputs larger than ~3x the L2, but at most 8 (inputs_for_rotation): smaller
    problems rotate less (with the 50 MiB L2 of an H100/H200: 1024^3 about 2x the L2, the sweep's M = 128, K =
    4096 below 3x up to N of about 1000), so their inputs may partly stay in L2, for the op and its baseline
    alike; seeded by the shape."""
    shape_a = (batch, m, k) if batch > 1 else (m, k)
    shape_b = (batch, k, n) if batch > 1 else (k, n)
    sets = inputs_for_rotation(4 * batch * (m * k + k * n + m * n), l2_bytes)
    gen = torch.Generator(device="cuda").manual_seed(1234 + m + n + k)
    a_sets = [random_inputs(shape_a, dist, gen) for _ in range(sets)]
    b_sets = [random_inputs(shape_b, dist, gen) for _ in range(sets)]
    return a_sets, b_sets


def interleaved_median_ms(fns: Sequence[Callable[[], object]], warmup: int = 3, reps: int = 20,
                          host_ahead: bool = False) -> list:
    """Median time of each fn in milliseconds, the calls interleaved (fns[0], fns[1], ..., fns[0], ...) and
    each timed with its own pair of CUDA events: the fns see the same GPU state (clocks, other work), so
    their ratio is not a difference between two moments. host_ahead as for median_ms (True: the GPU time of
    calls shorter than the host's time to enqueue them, not the host's pace)."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    torch.cuda.synchronize()

    def enqueue():
        events = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
                  for _ in fns]
        for i in range(reps):
            for fn, ev in zip(fns, events):
                ev[i][0].record()
                fn()
                ev[i][1].record()
        return events

    if host_ahead:
        events = _enqueued_behind_spin(enqueue, 200_000 * reps * len(fns), "interleaved_median_ms(host_ahead=True)")
    else:
        events = enqueue()
        torch.cuda.synchronize()
    return [statistics.median(s.elapsed_time(e) for s, e in ev) for ev in events]


def tf32_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.matmul with TF32 allowed for this call only (faster than fp32, 10 mantissa bits): the TF32 baseline of
    scripts that otherwise keep it off."""
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        return torch.matmul(a, b)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


def holding_results(fn: Callable[[], object], bytes_per_result: int, l2_bytes: int) -> Callable[[], None]:
    """fn, with its last results kept alive (inputs_for_rotation of them), so that the caching allocator gives each
    call another output block: a function that allocates its output gets back the block its previous call freed, and
    an output smaller than the L2 would then be written into lines still in the L2, never all to memory."""
    held = deque(maxlen=inputs_for_rotation(bytes_per_result, l2_bytes))

    def call() -> None:
        held.append(fn())
    return call


def inputs_for_rotation(bytes_per_set: int, l2_bytes: int, max_sets: int = 8) -> int:
    """How many input sets make one rotation larger than ~3x the L2 cache, at most `max_sets`."""
    return max(1, min(max_sets, (3 * l2_bytes) // max(1, bytes_per_set) + 1))


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref||_F / ||ref||_F, with ref the float64 product."""
    return ((out.double() - ref).norm() / ref.norm()).item()


def require_out_for_partial_runs(parser, args, *options: str) -> None:
    """A run with any of `options` set (a short or selective run: --quick, --only, ...) writes only into the folder
    --out names: benchmarks/results keeps the full runs, which README quotes (a short run there replaced them)."""
    for option in options:
        if getattr(args, option.lstrip("-").replace("-", "_")) not in (None, False) and args.out is None:
            parser.error(f"{option} needs --out: benchmarks/results keeps the full runs (README quotes them)")


def header() -> dict:
    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": torch.cuda.get_device_name(0),
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def write_results(name: str, payload: dict, columns: Sequence[str], out_dir: str | None = None, title: str = "") -> None:
    out_dir = out_dir or RESULTS_DIR
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(payload, f, indent=1)
    lines = [f"# {title or name}", "", f"GPU: {payload['gpu']}, torch {payload['torch']}, {payload['date']}", ""]
    lines.append("| " + " | ".join(columns) + " |")
    lines.append("|" + "---|" * len(columns))
    for row in payload["rows"]:
        cells = []
        for c in columns:
            v = row.get(c, "")
            cells.append(f"{v:.3g}" if isinstance(v, float) else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
