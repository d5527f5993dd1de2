"""The paper's Figs. 8, 9 and 10 on this GPU: an error-corrected fp32 GEMM C = A B (m x m x m, fp32 row-major,
fp16 hi + fp16 residual * 2^11, three m16n16k16 products per k-step) with 32x32 output blocks of 256 threads,
in six kernels that differ only in how the hi/lo fragments are made (paper_gemm_kernels.cu):

    shared_memory     threads split the fp32 tile into fp16 hi/lo tiles in shared memory, load_matrix_sync
    registers         wmmae::load_matrices_with_op: one pass over the fp32 tile fills hi and lo
    registers_single  wmmae::load_matrix_with_op once per fragment (two passes)
each without and with a skew of +4 floats per shared-memory row.

    Fig. 8:  speed-up of registers over shared_memory     = t(shared_memory) / t(registers)
    Fig. 9:  speed-up of one pass over one per fragment   = t(registers_single) / t(registers)
    Fig. 10: speed-up of the skew over none (registers)   = t(skew 0) / t(skew 4)

Before timing, every size is checked (raising on failure): the six kernels give bitwise identical results
(the same arithmetic), whose relative Frobenius error against a float64 product (all rows up to m = 2048, 512
rows spread over the matrix above) is at most max(1.25 x cuBLAS fp32's, 2e-7). Each kernel and cuBLAS are timed twice
per size (in one order, then the reverse) and the lower median is kept, to cancel clock drift; with the host kept
ahead of the GPU (median_ms(host_ahead=True)), so that small sizes are timed at the GPU's pace, not the host's.

Writes benchmarks/results/paper_gemm.{json,md,png}.
    python benchmarks/paper/bench_paper_gemm.py [--quick] [--out DIR]
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import torch
from torch.utils.cpp_extension import load

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from common import (RESULTS_DIR, header, inputs_for_rotation,  # noqa: E402
                    median_ms, rel_err, require_out_for_partial_runs, write_results)

VARIANTS = {"shared_memory": 0, "registers": 1, "registers_single": 2}
SKEWS = (0, 4)
CONFIGS = [(name, skew) for name in VARIANTS for skew in SKEWS]
PAPER = {
    8: "speed-up on sm_75 (Turing), slow-down on sm_70 (Volta); numbers not stated here",
    9: "not stated here",
    10: "skew found slower, dropped (numbers not stated here)",
}


def key(name: str, skew: int) -> str:
    return f"{name}_s{skew}"


def build():
    load(name="wmmae_paper_gemm", sources=[os.path.join(HERE, "paper_gemm_kernels.cu")],
         extra_include_paths=[os.path.join(HERE, "..", "..", "csrc")], extra_cuda_cflags=["-O3", "-std=c++17"],
         is_python_module=False, verbose=False)
    return torch.ops.wmmae_paper_gemm.gemm


def require(ok: bool, message: str) -> None:
    if not ok:
        raise RuntimeError(message)


def check_rows(m: int) -> torch.Tensor:
    """Rows compared with the float64 product: all of them up to m = 2048, above that 512 rows spread evenly
    from the first to the last (every column block, row blocks all over the matrix)."""
    if m <= 2048:
        return torch.arange(m, device="cuda")
    return torch.linspace(0, m - 1, 512, device="cuda").round().long().unique()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="m = 2^7, 2^9, 2^11, 2^12, 2^13 only")
    p.add_argument("--out", default=None, help="output folder (default benchmarks/results)")
    args = p.parse_args()
    require_out_for_partial_runs(p, args, "--quick")
    args.out = args.out or RESULTS_DIR
    from tqdm import tqdm

    gemm = build()
    torch.backends.cuda.matmul.allow_tf32 = False  # the cuBLAS baseline is true fp32
    sizes = [2**e for e in ((7, 9, 11, 12, 13) if args.quick else range(7, 16))]  # full: up to 2^15 (12 GiB)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    bar = tqdm(total=len(sizes) * 2 * (len(CONFIGS) + 1), desc="paper gemm")
    rows = []
    for m in sizes:
        reps = 20 if m <= 2048 else (10 if m <= 8192 else (5 if m <= 16384 else 3))
        warmup = 3 if m <= 8192 else 1  # one call at m = 2^15 takes about 3 s
        flop = 2.0 * m**3
        sets = inputs_for_rotation(4 * 2 * m * m, l2)
        gen = torch.Generator(device="cuda").manual_seed(4321 + m)
        a_sets = [torch.rand(m, m, device="cuda", generator=gen) * 2 - 1 for _ in range(sets)]
        b_sets = [torch.rand(m, m, device="cuda", generator=gen) * 2 - 1 for _ in range(sets)]
        a, b = a_sets[0], b_sets[0]

        # Correctness first: the float64 reference on a row sample, cuBLAS fp32 on the same rows.
        idx = check_rows(m)
        ref = a[idx].double() @ b.double()
        cublas_err = rel_err(torch.matmul(a, b)[idx], ref)
        first = None
        for name, skew in CONFIGS:
            out = gemm(a, b, VARIANTS[name], skew)
            if first is None:
                first = out
                err = rel_err(out[idx], ref)
                require(math.isfinite(err) and err <= max(1.25 * cublas_err, 2e-7),
                        f"m={m} {key(name, skew)}: relative error {err:.3e} (cuBLAS fp32 {cublas_err:.3e})")
            else:
                require(torch.equal(out, first), f"m={m}: {key(name, skew)} differs from {key(*CONFIGS[0])} "
                        f"(max |diff| {(out - first).abs().max().item():.3e}); the variants must be bitwise equal")
            del out
        del first, ref
        torch.cuda.empty_cache()

        def timed(fn):
            # (host ahead: the small sizes' calls are shorter than the host's time to enqueue them)
            return median_ms(lambda i: fn(a_sets[i], b_sets[i]), n_inputs=sets, warmup=warmup, reps=reps,
                             host_ahead=True)

        # cuBLAS and every variant timed in one order and then the reverse, each keeping its lower median.
        calls = [("cublas", torch.matmul)] + [
            (key(name, skew), lambda x, y, name=name, skew=skew: gemm(x, y, VARIANTS[name], skew))
            for name, skew in CONFIGS]
        ms = {}
        for order in (calls, calls[::-1]):
            for label, fn in order:
                ms[label] = min(timed(fn), ms.get(label, math.inf))
                bar.update()
        cublas_ms = ms.pop("cublas")
        row = dict(m=m, rel_err=err, cublas_rel_err=cublas_err, cublas_ms=cublas_ms, cublas_tflops=flop / cublas_ms / 1e9)
        for k_, t in ms.items():
            row[f"{k_}_ms"] = t
            row[f"{k_}_tflops"] = flop / t / 1e9
        for s in SKEWS:
            row[f"fig8_s{s}"] = ms[key("shared_memory", s)] / ms[key("registers", s)]
            row[f"fig9_s{s}"] = ms[key("registers_single", s)] / ms[key("registers", s)]
        for name in VARIANTS:
            row[f"fig10_{name}"] = ms[key(name, 0)] / ms[key(name, 4)]
        rows.append(row)
        del a_sets, b_sets, a, b
        torch.cuda.empty_cache()
    bar.close()

    payload = header() | {
        "quick": args.quick,
        "design": "32x32 output block, 256 threads: 4 warp tiles of 16x16 x 2 K-halves (sum through shared "
                  "memory), BK = 32, 3-stage cp.async ring of fp32 tiles, at most 48 registers (5 blocks per SM)",
        "configs": [key(*c) for c in CONFIGS],
        "speedups": {"fig8": "t(shared_memory) / t(registers)", "fig9": "t(registers_single) / t(registers)",
                     "fig10": "t(skew 0) / t(skew 4)"},
        "paper": {str(k_): v for k_, v in PAPER.items()},
        "rows": rows,
    }
    columns = (["m", "cublas_tflops"] + [f"{key(*c)}_tflops" for c in CONFIGS] +
               ["fig8_s0", "fig8_s4", "fig9_s0", "fig9_s4", "fig10_registers", "fig10_shared_memory",
                "rel_err", "cublas_rel_err"])
    write_results("paper_gemm", payload, columns, args.out,
                  "Paper Figs. 8-10: error-corrected GEMM, fragments from shared memory vs load_matrix_with_op")
    plot(payload, os.path.join(args.out, "paper_gemm.png"))
    for r in rows:
        print(f"m={r['m']:6d}: registers {r['registers_s0_tflops']:6.1f} TFLOP/s, shared_memory "
              f"{r['shared_memory_s0_tflops']:6.1f}, cuBLAS fp32 {r['cublas_tflops']:6.1f}; Fig 8 x{r['fig8_s0']:.3f} "
              f"(skew x{r['fig8_s4']:.3f}), Fig 9 x{r['fig9_s0']:.3f}, Fig 10 x{r['fig10_registers']:.3f}; "
              f"err {r['rel_err']:.2e} (cuBLAS {r['cublas_rel_err']:.2e})")


def plot(payload: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = payload["rows"]
    ms = [r["m"] for r in rows]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    ax = axes[0][0]
    ax.plot(ms, [r["cublas_tflops"] for r in rows], "k--", marker="s", label="cuBLAS fp32 (torch.matmul)")
    for name, skew in CONFIGS:
        ax.plot(ms, [r[f"{key(name, skew)}_tflops"] for r in rows], marker="o", ls="-" if skew == 0 else ":",
                label=f"{name}, skew {skew}")
    ax.set_ylabel("TFLOP/s (2 m^3 / time)")
    ax.set_title("error-corrected GEMM, 32x32 blocks", fontsize=8)
    ax.legend(fontsize=7)
    panels = [
        (axes[0][1], 8, [(f"fig8_s{s}", f"skew {s}") for s in SKEWS], "t(shared_memory) / t(registers)"),
        (axes[1][0], 9, [(f"fig9_s{s}", f"skew {s}") for s in SKEWS], "t(registers_single) / t(registers)"),
        (axes[1][1], 10, [(f"fig10_{n}", n) for n in VARIANTS], "t(skew 0) / t(skew 4)"),
    ]
    titles = {8: "Fig. 8: load_matrix_with_op vs shared memory", 9: "Fig. 9: one pass for hi and lo vs one per fragment",
              10: "Fig. 10: skew (+4 floats per row) vs none"}
    for ax, fig_no, series, ylabel in panels:
        for field, label in series:
            ax.plot(ms, [r[field] for r in rows], marker="o", label=label)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{titles[fig_no]}\npaper: {PAPER[fig_no]}", fontsize=8)
        ax.legend(fontsize=7)
    for ax in axes.flat:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("m (m x m x m)")
    fig.suptitle(f"{payload['gpu']}, torch {payload['torch']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
