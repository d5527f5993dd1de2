"""corrected_matmul and torch.matmul held for seconds, with the SM clock and board power beside them.

bench_corrected_matmul.py times 20 calls at a time, a burst from a GPU that has idled. A training loop keeps
the GPU busy for much longer, and on an H100/H200 corrected_matmul's fp16 GEMM then runs at the 700 W power
limit, at a lower SM clock. This script runs each kind of call back to back for a few seconds (after a pause
to cool down), times windows of about 0.1 s with CUDA events, and samples nvidia-smi every 50 ms (SM clock,
power, throttle reasons). Inputs rotate as in the main benchmark (sets larger than the L2 in all).

Writes benchmarks/results/sustained.json and .md (or --out).
"""
from __future__ import annotations

import argparse
import datetime
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import torch_wmmae
from common import header, inputs_for_rotation, require_out_for_partial_runs, tf32_matmul, write_results

WINDOW_S = 0.1
POWER_CAP_REASON = 0x4  # nvidia-smi clocks_throttle_reasons: software power cap


def operands(batch: int, n: int, dtype: torch.dtype, l2_bytes: int) -> list:
    shape = (batch, n, n) if batch > 1 else (n, n)
    per_set = 2 * batch * n * n * torch.tensor([], dtype=dtype).element_size()
    return [tuple((torch.rand(shape, device="cuda") * 2 - 1).to(dtype) for _ in range(2))
            for _ in range(inputs_for_rotation(per_set, l2_bytes))]


def held_rate(fn, sets: list, flop: float, seconds: float) -> list:
    """(start, end, TFLOP/s) of consecutive ~WINDOW_S windows of calls, for `seconds`."""
    fn(*sets[0])
    torch.cuda.synchronize()
    t = time.time()
    fn(*sets[0])
    torch.cuda.synchronize()
    calls = max(1, int(WINDOW_S / (time.time() - t)))
    windows, i, end = [], 0, time.time() + seconds
    while time.time() < end:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.time()
        start.record()
        for _ in range(calls):
            fn(*sets[i % len(sets)])
            i += 1
        stop.record()
        stop.synchronize()
        windows.append((t0, time.time(), flop * calls / start.elapsed_time(stop) / 1e9))
    return windows


def smi_samples(path: str) -> list:
    """(time, SM MHz, W, throttle reasons) from nvidia-smi's CSV lines."""
    samples = []
    with open(path) as f:
        for line in f:
            p = [x.strip() for x in line.split(",")]
            try:
                t = datetime.datetime.strptime(p[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                samples.append((t, float(p[1].split()[0]), float(p[2].split()[0]), int(p[3], 16)))
            except (ValueError, IndexError):
                continue
    return samples


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=3.0,
                   help="how long each kind of call is held (the board power reading lags: at 4096^3, 0.5 s "
                        "showed 254 W where 3 s showed 691)")
    p.add_argument("--cool", type=float, default=2.0, help="idle seconds before each")
    p.add_argument("--out", default=None, help="output folder (default benchmarks/results)")
    p.add_argument("--only", default=None,
                   help="run only the cases whose 'label batch x n^3' contains this text (e.g. 'fp16 1 x 16384'); "
                        "needs --out")
    args = p.parse_args()
    require_out_for_partial_runs(p, args, "--only")
    if not torch.cuda.is_available():
        sys.exit("bench_sustained.py needs a CUDA GPU")
    torch.backends.cuda.matmul.allow_tf32 = False
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    fp16 = lambda a, b: torch_wmmae.corrected_matmul(a, b, method="fp16")  # noqa: E731
    cases = [  # (label, batch, n, dtype, function)
        ("corrected_matmul fp16", 1, 4096, torch.float32, fp16),
        ("torch fp32", 1, 4096, torch.float32, torch.matmul),
        ("torch tf32", 1, 4096, torch.float32, tf32_matmul),
        ("corrected_matmul fp16", 1, 16384, torch.float32, fp16),
        ("torch fp32", 1, 16384, torch.float32, torch.matmul),
        ("torch tf32", 1, 16384, torch.float32, tf32_matmul),
        ("torch fp16 (reference: 3 products' energy)", 1, 8192, torch.float16, torch.matmul),
        ("corrected_matmul auto", 64, 512, torch.float32, torch_wmmae.corrected_matmul),
        ("torch fp32", 64, 512, torch.float32, torch.matmul),
    ]
    if args.only is not None:
        cases = [c for c in cases if args.only in f"{c[0]} {c[1]} x {c[2]}^3"]
        if not cases:
            sys.exit(f"--only {args.only!r} matches no case")
    phases, samples = [], []
    with tempfile.TemporaryDirectory() as tmp:
        smi_path = os.path.join(tmp, "smi.csv")
        with open(smi_path, "w") as smi_out:
            smi = None
            if shutil.which("nvidia-smi"):
                props = torch.cuda.get_device_properties(0)  # nvidia-smi numbers GPUs its own way: by PCI address
                pci = f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"
                smi = subprocess.Popen(
                    ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active",
                     "--format=csv,noheader", "-lms", "50", "-i", pci], stdout=smi_out)
            for label, batch, n, dtype, fn in cases:
                sets = operands(batch, n, dtype, l2)
                torch.cuda.synchronize()
                time.sleep(args.cool)
                windows = held_rate(fn, sets, 2.0 * batch * n ** 3, args.seconds)
                phases.append((label, batch, n, windows))
                del sets
                print(f"{label} {batch} x {n}^3: median {statistics.median(w[2] for w in windows):.1f} TFLOP/s",
                      flush=True)
            if smi is not None:
                smi.terminate()
                smi.wait()
        samples = smi_samples(smi_path)
    rows = []
    for label, batch, n, windows in phases:
        rates = [w[2] for w in windows]
        held = [s for s in samples if windows[0][0] <= s[0] <= windows[-1][1]]
        row = {"case": label, "batch": batch, "n": n, "first_window_tflops": round(rates[0], 1),
               "median_tflops": round(statistics.median(rates), 1), "windows": len(rates)}
        if held:
            row["sm_mhz_median"] = statistics.median(s[1] for s in held)
            row["power_w_median"] = round(statistics.median(s[2] for s in held))
            row["power_capped_share"] = round(sum(1 for s in held if s[3] & POWER_CAP_REASON) / len(held), 2)
            row["pj_per_flop"] = round(row["power_w_median"] / row["median_tflops"], 2)  # W / (TFLOP/s)
        rows.append(row)
    payload = dict(header(), seconds=args.seconds, window_s=WINDOW_S, only=args.only, rows=rows)
    write_results("sustained", payload,
                  ["case", "batch", "n", "first_window_tflops", "median_tflops", "sm_mhz_median", "power_w_median",
                   "power_capped_share", "pj_per_flop"],
                  args.out, title="Held load: rate, SM clock and board power (bench_sustained.py)")


if __name__ == "__main__":
    main()
