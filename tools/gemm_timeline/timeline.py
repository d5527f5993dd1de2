"""Where a corrected_matmul call's GPU time goes, block by block, on a timeline build (stamp_sources.py): runs
`calls` calls back to back (the host kept ahead), keeps the stamps of the last one, and prints for each piece
index p (the p-th batch entry or tile of each block) the medians over the fp16 GEMM's blocks of the piece's
phases and the spread of its start, the GEMM's span, and when the tf32 GEMM's and the float32 fallback check's
blocks ran. Times in us from the first GEMM block's start. Methods "fp16" and "auto" (their fp16 GEMM).

    python tools/gemm_timeline/timeline.py --method auto --shape 512 128 128 64 [--reps 3] [--json out.json]
        [--between-calls noop]

Environment switches (TORCH_WMMAE_*, and the timeline build's WMMAE_TIMELINE_SKIP_EXIT) apply as in any call:
compare variants in separate processes. --between-calls noop puts a tiny kernel (torch.cuda._sleep) between the
calls, so that no call's first kernel overlaps the previous call's last (programmatic dependent launch).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks"))
from stamp_sources import (END_WORD, FALLBACK_BASE, GEMM_STRIDE, KERNEL_STAMPS, MAX_BLOCKS,  # noqa: E402
                           MAX_PIECES, PIECE_STAMPS, STAMP_WORDS, TF32_BASE)

# What each piece's stamps after its top end (stamp_sources.py's layout).
PHASES = ("prior grid", "lines", "first stage", "loop", "flush")
assert len(PHASES) == PIECE_STAMPS - 1


def gemm_summary(stamps: list[int]) -> dict:
    blocks = [stamps[b * GEMM_STRIDE:(b + 1) * GEMM_STRIDE] for b in range(MAX_BLOCKS)
              if stamps[b * GEMM_STRIDE + 1] != 0]
    if not blocks:
        raise RuntimeError("timeline: no fp16 GEMM block stamped (not a timeline build, or not the wgmma GEMM)")
    t0 = min(r[1] for r in blocks)
    us = lambda t: (t - t0) / 1e3  # noqa: E731
    end = max(r[END_WORD] for r in blocks)
    pieces = []
    for e in range(MAX_PIECES):
        first = 2 + PIECE_STAMPS * e
        rows = [r[first:first + PIECE_STAMPS] for r in blocks if all(r[first:first + PIECE_STAMPS])]
        if not rows:
            break
        pieces.append({"entry": e, "blocks": len(rows), "top": statistics.median(us(x[0]) for x in rows),
                       "top_spread": max(us(x[0]) for x in rows) - min(us(x[0]) for x in rows),
                       **{name: statistics.median((x[i + 1] - x[i]) / 1e3 for x in rows)
                          for i, name in enumerate(PHASES)}})
    summary = {"blocks": len(blocks), "span": us(end), "first_end": us(min(r[END_WORD] for r in blocks)),
               "pieces": pieces}
    for name, base in (("tf32", TF32_BASE), ("fallback", FALLBACK_BASE)):
        rows = [stamps[base + KERNEL_STAMPS * b:base + KERNEL_STAMPS * (b + 1)] for b in range(MAX_BLOCKS)
                if stamps[base + KERNEL_STAMPS * b + 1] != 0]
        if rows and all(r[3] for r in rows):
            summary[name] = {"blocks": len(rows), "start_first": us(min(r[1] for r in rows)),
                             "start_median": statistics.median(us(r[1]) for r in rows),
                             "start_last": us(max(r[1] for r in rows)),
                             "end_last": us(max(r[3] for r in rows)),
                             "started_before_gemm_end": sum(1 for r in rows if r[1] < end)}
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--method", default="auto")
    parser.add_argument("--shape", nargs=4, type=int, metavar=("BATCH", "M", "N", "K"), required=True)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json")
    parser.add_argument("--between-calls", choices=("none", "noop"), default="none")
    args = parser.parse_args()
    buffer = torch.zeros(STAMP_WORDS, dtype=torch.int64, device="cuda")
    os.environ["WMMAE_TIMELINE_PTR"] = str(buffer.data_ptr())  # read by the first call
    import torch_wmmae
    from common import _enqueued_behind_spin

    print(f"torch_wmmae from {os.path.dirname(torch_wmmae.__file__)}")  # (a timeline build: see stamp_sources.py)

    batch, m, n, k = args.shape
    gen = torch.Generator(device="cuda").manual_seed(batch + m + n + k)
    a = [torch.rand((batch, m, k), device="cuda", generator=gen) * 2 - 1 for _ in range(4)]
    b = [torch.rand((batch, k, n), device="cuda", generator=gen) * 2 - 1 for _ in range(4)]

    def call(i):
        if args.between_calls == "noop":
            torch.cuda._sleep(1)
        return torch_wmmae.corrected_matmul(a[i % 4], b[i % 4], method=args.method)
    for i in range(5):
        call(i)
    torch.cuda.synchronize()
    runs = []
    for rep in range(args.reps):
        buffer.zero_()
        _enqueued_behind_spin(lambda: [call(i) for i in range(args.calls)], 200_000 * args.calls, "timeline")
        s = gemm_summary(buffer.cpu().tolist())
        runs.append(s)
        print(f"run {rep}: {s['blocks']} GEMM blocks, span {s['span']:.1f}, first block done at {s['first_end']:.1f}")
    for p in runs[-1]["pieces"]:
        print(f"  entry {p['entry']} ({p['blocks']} blocks): top {p['top']:.1f} (spread {p['top_spread']:.1f}) "
              + " / ".join(f"{name} {p[name]:.2f}" for name in PHASES))
    for name in ("tf32", "fallback"):
        if name in runs[-1]:
            x = runs[-1][name]
            print(f"  {name}: {x['blocks']} blocks, start {x['start_first']:.1f} / {x['start_median']:.1f} / "
                  f"{x['start_last']:.1f}, done {x['end_last']:.1f}, {x['started_before_gemm_end']} started before "
                  "the GEMM's end")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"method": args.method, "shape": args.shape, "between_calls": args.between_calls,
                       "runs": runs}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
