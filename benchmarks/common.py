"""Shared helpers of the benchmark scripts: CUDA-event timing with warm-up and rotating inputs, and the
result files (JSON + markdown table, with GPU name, torch version and date)."""
from __future__ import annotations

import datetime
import json
import os
import statistics
from typing import Callable, Sequence

import torch

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def median_ms(fn: Callable[[int], object], n_inputs: int = 1, warmup: int = 3, reps: int = 20,
              host_ahead: bool = False) -> float:
    """Median time of fn(i) in milliseconds, i cycling over n_inputs input sets (so that repeated calls do
    not just re-read the L2 cache). Each call is timed with its own pair of CUDA events.

    host_ahead=False: the GPU is idle when the first call is enqueued, so a call whose GPU work is shorter
    than the host's time to enqueue it is timed at the host's pace (launch latency included).
    host_ahead=True: a spin kernel is queued first and holds the GPU until the host has enqueued every timed
    call (the "blocking kernel" of NVIDIA's nvbench), so the events measure the calls' GPU time: kernels and
    the gaps between them, without the host's launch latency. Checked: if the spin ends before the host has
    enqueued the last call, it is repeated with a longer spin.
    """
    for i in range(warmup):
        fn(i % n_inputs)
    torch.cuda.synchronize()
    spin_cycles = 200_000 * reps  # ~100 us per call at 2 GHz, against 20-60 us of host time per call
    for _ in range(6):
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        if host_ahead:
            torch.cuda._sleep(spin_cycles)
            spin_done = torch.cuda.Event()
            spin_done.record()
        for i in range(reps):
            starts[i].record()
            fn(i % n_inputs)
            ends[i].record()
        held = not host_ahead or not spin_done.query()  # still spinning: every call was enqueued in time
        torch.cuda.synchronize()
        if held:
            return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))
        spin_cycles *= 4
    raise RuntimeError("median_ms(host_ahead=True): the host did not get ahead of the GPU")


def loop_ms(fn: Callable[[int], object], n_inputs: int = 1, calls: int = 40, rounds: int = 5) -> float:
    """Median over `rounds` of the mean time per call, in milliseconds, of `calls` calls of fn(i) enqueued back
    to back between one pair of CUDA events, the host kept ahead by a spin kernel (see median_ms). Unlike
    median_ms, nothing is enqueued between the calls, so a call may overlap the one before it (as in a
    training step's sequence of ops)."""
    fn(0)
    torch.cuda.synchronize()
    per_call = []
    spin_cycles = 200_000 * calls
    while len(per_call) < rounds:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(spin_cycles)
        spin_done = torch.cuda.Event()
        spin_done.record()
        start.record()
        for i in range(calls):
            fn(i % n_inputs)
        end.record()
        held = not spin_done.query()
        torch.cuda.synchronize()
        if held:
            per_call.append(start.elapsed_time(end) / calls)
        elif spin_cycles > 200_000 * calls * 4**5:
            raise RuntimeError("loop_ms: the host did not get ahead of the GPU")
        else:
            spin_cycles *= 4
    return statistics.median(per_call)


def interleaved_median_ms(fns: Sequence[Callable[[], object]], warmup: int = 3, reps: int = 20) -> list:
    """Median time of each fn in milliseconds, the calls interleaved (fns[0], fns[1], ..., fns[0], ...) and
    each timed with its own pair of CUDA events: the fns see the same GPU state (clocks, other work), so
    their ratio is not a difference between two moments."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    torch.cuda.synchronize()
    events = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
              for _ in fns]
    for i in range(reps):
        for fn, ev in zip(fns, events):
            ev[i][0].record()
            fn()
            ev[i][1].record()
    torch.cuda.synchronize()
    return [statistics.median(s.elapsed_time(e) for s, e in ev) for ev in events]


def inputs_for_rotation(bytes_per_set: int, l2_bytes: int, max_sets: int = 8) -> int:
    """How many input sets make one rotation larger than ~3x the L2 cache."""
    return max(1, min(max_sets, (3 * l2_bytes) // max(1, bytes_per_set) + 1))


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
