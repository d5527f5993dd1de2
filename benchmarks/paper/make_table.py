"""One table of the paper figures reproduced here: our measured speed-up ranges next to the paper's, plus the
seed sweep summary. Reads benchmarks/results/paper_figs.json (Figs. 3, 5), paper_gemm.json (Figs. 8-10) and
corrected_matmul.json (seed sweep); a missing file gives "not measured". Writes benchmarks/results/paper_table.md.
    python benchmarks/paper/make_table.py [--results DIR] [--out PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "..", "results")

# What the paper reports, as far as issue #5 states it; nothing beyond that is claimed here.
PAPER = {
    3: "1.00-1.06x (V100 / RTX 2080)",
    5: "1.00-1.15x (V100 / RTX 2080)",
    8: "speed-up on sm_75 (Turing), slow-down on sm_70 (Volta); numbers not stated here",
    9: "not stated here",
    10: "the skew was slower and was dropped; numbers not stated here",
}
NOT_MEASURED = "not measured"


def load(results: str, name: str) -> dict | None:
    path = os.path.join(results, f"{name}.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def span(values: list[float]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return NOT_MEASURED
    return (f"{min(values):.2f}-{max(values):.2f}x (median {statistics.median(values):.2f}x, "
            f"{len(values)} sizes)")


def gpu(payload: dict | None) -> str:
    return f"{payload['gpu']}, {payload['date']}" if payload else "-"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--results", default=RESULTS)
    p.add_argument("--out", default=None, help="default: RESULTS/paper_table.md")
    args = p.parse_args()
    out = args.out or os.path.join(args.results, "paper_table.md")

    lines = ["# Paper figures: measured speed-ups next to the paper's", "",
             "Speed-up > 1 means the first-named way is faster. Ranges are over the sizes of each benchmark "
             "(batch for Figs. 3/5, m for Figs. 8-10). Sources: `paper_figs.json` "
             "(`bench_paper_figs.py`), `paper_gemm.json` (`bench_paper_gemm.py`), `corrected_matmul.json` "
             "(`bench_corrected_matmul.py`, seed sweep, plotted by `plot_seed_sweep.py`). \"Corrected GEMM\": fp32 "
             "m x m x m, fp16 hi + residual * 2^11, three m16n16k16 products per k-step, 32x32 output blocks of 256 "
             "threads (`paper_gemm_kernels.cu`).", "",
             "| figure | what is compared | speed-up = | measured | GPU | paper |", "|---|---|---|---|---|---|"]

    figs = load(args.results, "paper_figs")
    for fig, what in ((3, "`load_vector` vs zero-padded shared-memory tile + `load_matrix_sync` (batched v v^T)"),
                      (5, "`load_vector` + `make_identity` vs shared-memory tiles (batched v v^T + alpha I)")):
        for n in (16, 32):
            sel = [r["speedup"] for r in figs["rows"] if r["fig"] == fig and r["n"] == n] if figs else []
            lines.append(f"| Fig. {fig}, n = {n} | {what} | t(WMMA only) / t(extension) | "
                         f"{span(sel) if sel else NOT_MEASURED} | {gpu(figs)} | {PAPER[fig]} |")

    gemm = load(args.results, "paper_gemm")
    rows = gemm["rows"] if gemm else []

    def col(field: str) -> str:
        return span([r.get(field) for r in rows]) if rows else NOT_MEASURED

    gemm_what = "corrected GEMM: "
    for skew in (0, 4):
        lines.append(f"| Fig. 8, skew {skew} | {gemm_what}`load_matrices_with_op` (split while loading the fp32 "
                     f"tile) vs fp16 hi/lo tiles in shared memory + `load_matrix_sync` | "
                     f"t(shared_memory) / t(registers) | {col(f'fig8_s{skew}')} | {gpu(gemm)} | {PAPER[8]} |")
    for skew in (0, 4):
        lines.append(f"| Fig. 9, skew {skew} | {gemm_what}one `load_matrices_with_op` pass for hi and lo vs "
                     f"`load_matrix_with_op` per fragment | t(registers_single) / t(registers) | "
                     f"{col(f'fig9_s{skew}')} | {gpu(gemm)} | {PAPER[9]} |")
    for name, label in (("registers", "registers variant"), ("shared_memory", "shared_memory variant (context)")):
        lines.append(f"| Fig. 10, {label} | {gemm_what}+4 floats of skew per shared-memory row vs none | "
                     f"t(skew 0) / t(skew 4) | {col(f'fig10_{name}')} | {gpu(gemm)} | {PAPER[10]} |")

    seed = load(args.results, "corrected_matmul")
    measured, sweep_ns = NOT_MEASURED, "64 .. 47360 step 64"  # (the benchmark's full sweep)
    if seed:
        from plot_seed_sweep import summary, sweep_range, sweep_rows

        sweep = sweep_rows(seed)
        if sweep:
            sweep_ns = sweep_range(sweep)
            s = summary(sweep)
            measured = (f"N >= {s['min_n']}: median {s['ratio'][1]:.2f}x, range {s['ratio'][0]:.2f}-"
                        f"{s['ratio'][2]:.2f}x; >= 1x at {100 * s['faster_share']:.0f}% of N; "
                        f"{s['tflops'][0]:.1f}-{s['tflops'][1]:.1f} TFLOP/s vs fp32 {s['fp32_tflops'][0]:.1f}-"
                        f"{s['fp32_tflops'][1]:.1f}; {s['blocks'][0]}-{s['blocks'][1]} blocks; max error "
                        f"{s['rel_err']:.1e} (fp32 {s['fp32_rel_err']:.1e})")
    lines.append(f"| seed sweep | `corrected_matmul` (auto) vs `torch.matmul` fp32, M = 128, K = 4096, N = {sweep_ns} "
                 f"| t(fp32) / t(corrected_matmul) | {measured} | {gpu(seed)} | "
                 f"- (not a paper figure) |")
    lines += ["", "Plots: `paper_figs.png`, `paper_gemm.png`, `paper_seed_sweep.png` (TFLOP/s against launched "
              "thread blocks = 128x128 output tiles x split-K factor, as the benchmark recorded them)."]
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
