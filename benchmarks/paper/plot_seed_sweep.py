"""The seed study: corrected_matmul (method "auto") on M=128, K=4096, N = 64 .. 47360 in steps of 64, against
torch.matmul fp32 and TF32, plotted against the number of thread blocks the GEMM launches. Reads the sweep
rows of benchmarks/results/corrected_matmul.json (no GPU needed) and writes benchmarks/results/paper_seed_sweep.png.

Each row records the launch grid the op chose (`tiles` 128x128 output tiles, `k_splits`, `blocks`, and
`stream_k_blocks` when the wgmma fp16 kernel runs its stream-K schedule instead of the grid; from
torch.ops.wmmae._corrected_matmul_grid at measurement time). The "auto" method launches the fp16 kernel (grid
or stream-K) and the tf32 kernel (grid); for these U(-1, 1) inputs every tile is fp16-safe and the tf32
kernel's blocks return at once.
    python benchmarks/paper/plot_seed_sweep.py [--json PATH] [--out PNG]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "..", "results")
SWEEP = dict(m=128, k=4096, batch=1, method="auto")  # what marks a sweep row (the JSON has no sweep field)


def sweep_rows(payload: dict) -> list[dict]:
    """The sweep rows, sorted by N, of a finished run (bench_corrected_matmul.py saves as it goes, marked
    "complete": false until the sweep's last point: a stopped run's sweep ends early)."""
    if payload.get("complete") is False:
        raise SystemExit("corrected_matmul.json is from an unfinished run (\"complete\": false): re-run "
                         "benchmarks/bench_corrected_matmul.py to its end")
    rows = [r for r in payload["rows"] if all(r.get(f) == v for f, v in SWEEP.items())]
    missing = [r["n"] for r in rows if "blocks" not in r]
    if missing:
        raise SystemExit(f"{len(missing)} sweep rows have no launch grid (tiles, k_splits, blocks): re-run "
                         "benchmarks/bench_corrected_matmul.py, which records it")
    return sorted(rows, key=lambda r: r["n"])


def sweep_range(rows: list[dict]) -> str:
    """N's range as the rows have it, e.g. "64 .. 47360 step 64" (a --quick run's step is 1024)."""
    ns = [r["n"] for r in rows]
    steps = {b - a for a, b in zip(ns, ns[1:])}
    return f"{ns[0]} .. {ns[-1]}" + (f" step {steps.pop()}" if len(steps) == 1 else "")


def summary(rows: list[dict], min_n: int = 2432) -> dict:
    """Figures quoted in the tables, every one over the rows of N >= min_n (the team's measured baselines, kept
    outside this repository, quote torch fp32 from N = 2432 on)."""
    big = [r for r in rows if r["n"] >= min_n]
    ratio = [r["speedup_vs_fp32"] for r in big]
    return dict(n_rows=len(rows), min_n=min_n, n_big=len(big),
                tflops=(min(r["tflops"] for r in big), max(r["tflops"] for r in big)),
                fp32_tflops=(min(r["fp32_tflops"] for r in big), max(r["fp32_tflops"] for r in big)),
                ratio=(min(ratio), statistics.median(ratio), max(ratio)),
                faster_share=sum(x >= 1.0 for x in ratio) / len(ratio),
                rel_err=max(r["rel_err"] for r in big), fp32_rel_err=max(r["fp32_rel_err"] for r in big),
                blocks=(min(r["blocks"] for r in big), max(r["blocks"] for r in big)))


def dips(rows: list[dict], key: str = "tflops", window: int = 5, drop: float = 0.10) -> dict[str, list[int]]:
    """The N of the points whose rate (`key`) lies more than `drop` below a better point within `window` steps:
    - "nearby": below the best point on either side (the strictest reading; a rate that rises steeply with N,
      as where the time per call is nearly flat, counts too);
    - "valleys": below the best point on each side, a dip in the usual sense;
    - "drops": below the best point at smaller N, the wave-quantization sawtooth (the rate falls as N grows).
    """
    v = [r[key] for r in rows]
    out: dict[str, list[int]] = {"nearby": [], "valleys": [], "drops": []}
    for i, r in enumerate(rows):
        left = max(v[max(0, i - window): i], default=0.0)
        right = max(v[i + 1: i + 1 + window], default=0.0)
        bar = (1.0 - drop) * max(left, right)
        if v[i] < bar:
            out["nearby"].append(r["n"])
        if v[i] < (1.0 - drop) * min(left, right):
            out["valleys"].append(r["n"])
        if v[i] < (1.0 - drop) * left:
            out["drops"].append(r["n"])
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--json", default=os.path.join(RESULTS, "corrected_matmul.json"))
    p.add_argument("--out", default=os.path.join(RESULTS, "paper_seed_sweep.png"))
    args = p.parse_args()
    with open(args.json) as f:
        payload = json.load(f)
    rows = sweep_rows(payload)
    if not rows:
        raise SystemExit(f"{args.json}: no sweep rows ({SWEEP})")
    sms = payload["sms"]

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(10, 11))
    ax = axes[0]
    stream_k = [r for r in rows if r.get("stream_k_blocks", 0) > 0]
    grid = [r for r in rows if r.get("stream_k_blocks", 0) == 0]
    sc = ax.scatter([r["blocks"] for r in grid], [r["tflops"] for r in grid], c=[r["k_splits"] for r in grid],
                    cmap="viridis", s=10, norm=matplotlib.colors.LogNorm())
    fig.colorbar(sc, ax=ax, label="split-K factor")
    if stream_k:  # their grid's blocks (what they would have launched), marked
        ax.scatter([r["blocks"] for r in stream_k], [r["tflops"] for r in stream_k], marker="x", s=12, lw=0.7,
                   color="C3", label=f"stream-K instead (up to {max(r['stream_k_blocks'] for r in stream_k)} blocks)")
        ax.legend(fontsize=8)
    top = max(r["blocks"] for r in rows)
    for w in range(1, top // sms + 1):
        ax.axvline(w * sms, color="gray", lw=0.5, ls=":")
    ax.set_xlabel(f"thread blocks of the split-K grid = output tiles x split-K (dotted: multiples of {sms} SMs)")
    ax.set_ylabel("corrected_matmul TFLOP/s")
    ax.set_title("corrected_matmul (auto) against the grid's blocks (one block per SM)", fontsize=9)

    ns = [r["n"] for r in rows]
    ax = axes[1]
    ax.plot(ns, [r["tflops"] for r in rows], lw=0.8, label="corrected_matmul (auto)")
    ax.plot(ns, [r["fp32_tflops"] for r in rows], lw=0.8, label="torch.matmul fp32 (TF32 off)")
    ax.plot(ns, [r["tf32_tflops"] for r in rows], lw=0.6, alpha=0.6, label="torch.matmul TF32 (not fp32-accurate)")
    ax.set_yscale("log")
    ax.set_ylabel("TFLOP/s")
    ax.legend(fontsize=8)
    ax.set_title("TFLOP/s against N", fontsize=9)

    ax = axes[2]
    ax.plot(ns, [r["speedup_vs_fp32"] for r in rows], lw=0.8, color="C0")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_ylabel("corrected_matmul / fp32")
    ax.set_xlabel("N (M = 128, K = 4096)")
    ax2 = ax.twinx()
    ax2.step(ns, [r["k_splits"] for r in rows], where="mid", lw=0.5, color="C3", alpha=0.6)
    ax2.set_ylabel("split-K factor (x: stream-K instead)", color="C3")
    ax2.set_yscale("log")
    ax2.scatter([r["n"] for r in stream_k], [r["k_splits"] for r in stream_k], marker="x", s=6, lw=0.5,
                color="C3")
    s = summary(rows)
    ax.set_title(f"speed-up over fp32 (N >= {s['min_n']}: median x{s['ratio'][1]:.2f}, "
                 f"range x{s['ratio'][0]:.2f}-x{s['ratio'][2]:.2f})", fontsize=9)
    fig.suptitle(f"Seed sweep, {payload['gpu']}, torch {payload['torch']}, {payload['date']}", fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"{len(rows)} sweep rows -> {args.out}; N >= {s['min_n']}: corrected {s['tflops'][0]:.1f}-"
          f"{s['tflops'][1]:.1f} TFLOP/s, fp32 {s['fp32_tflops'][0]:.1f}-{s['fp32_tflops'][1]:.1f}, ratio median "
          f"x{s['ratio'][1]:.2f}")
    big = [r for r in rows if r["n"] >= 1024]
    behind = [r["n"] for r in big if r["speedup_vs_fp32"] < 1.0]
    print(f"N >= 1024: {len(big) - len(behind)} of {len(big)} points at least as fast as fp32, behind at N = {behind}")
    if all("call_speedup_vs_fp32" in r for r in big):
        behind_call = [r["n"] for r in big if r["call_speedup_vs_fp32"] < 1.0]
        print(f"  timed from an idle GPU (call_ms): behind at N = {behind_call}")
    for key, name in (("tflops", "corrected_matmul"), ("fp32_tflops", "torch fp32")):
        found = dips(rows, key)
        print(f"{name}: points more than 10% below a better one within five steps: "
              + "; ".join(f"{kind} {len(at)} {at if len(at) <= 40 else ''}" for kind, at in found.items()))


if __name__ == "__main__":
    main()
