"""The paper's Figs. 3 and 5 on this GPU: batched v v^T of fp16 vectors (length 16 and 32, one warp per
product), written as float32 matrices, with the fragments made the WMMA-API-only way (zero-padded tile /
alpha*I tile in shared memory + load_matrix_sync) or with the extension (load_vector / make_identity).
Speed-up = time(WMMA only) / time(extension), measured in one run, the two calls interleaved and the host kept
ahead of the GPU (interleaved_median_ms(host_ahead=True)).

Writes benchmarks/results/paper_figs.{json,md,png}.
    python benchmarks/paper/bench_paper_figs.py [--quick] [--out DIR]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
from torch.utils.cpp_extension import load

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from common import (RESULTS_DIR, header, holding_results, interleaved_median_ms,  # noqa: E402
                    require_out_for_partial_runs, write_results)

PAPER = {3: "1.00-1.06x (V100 / RTX 2080)", 5: "1.00-1.15x (V100 / RTX 2080)"}


def build():
    load(name="wmmae_paper", sources=[os.path.join(HERE, "paper_kernels.cu")],
         extra_include_paths=[os.path.join(HERE, "..", "..", "csrc")], extra_cuda_cflags=["-O3", "-std=c++17"],
         is_python_module=False, verbose=False)
    return torch.ops.wmmae_paper.outer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=None, help="output folder (default benchmarks/results)")
    args = p.parse_args()
    require_out_for_partial_runs(p, args, "--quick")
    args.out = args.out or RESULTS_DIR
    from tqdm import tqdm

    outer = build()
    batches = [2**e for e in (range(14, 21, 2) if args.quick else range(14, 21))]
    cases = [(fig, n, batch) for fig in (3, 5) for n in (16, 32) for batch in batches]
    rows = []
    alpha = 1.5
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    for fig, n, batch in tqdm(cases, desc="paper figs"):
        identity = fig == 5
        v = torch.randn(batch, n, device="cuda").half()
        ref = v.double().unsqueeze(-1) * v.double().unsqueeze(-2)
        if identity:
            ref = ref + alpha * torch.eye(n, device="cuda", dtype=torch.float64)
        results = {ext: outer(v, ext, identity, alpha) for ext in (False, True)}
        for ext, out in results.items():  # products of fp16 values are exact; the diagonal sum is one rounding
            err = (out.double() - ref).abs().max().item()
            assert err <= (2**-23 * ref.abs().max().item() if identity else 0.0), (fig, n, batch, ext, err)
        del results
        # Interleaved (the same GPU state for both: a call's time moves by up to 10% between states, as much as
        # the speed-ups measured here), with the host ahead (the calls of batch 2^14 are shorter than the host's
        # time to enqueue them), and each call writing another output block (the outputs of n = 16 at batch 2^14
        # and 2^15, 16 and 32 MiB, would fit in the L2).
        out_bytes = batch * n * n * 4
        t_wmma, t_ext = interleaved_median_ms(
            [holding_results(lambda: outer(v, False, identity, alpha), out_bytes, l2),
             holding_results(lambda: outer(v, True, identity, alpha), out_bytes, l2)], host_ahead=True)
        nbytes = batch * n * 2 + out_bytes
        rows.append(dict(fig=fig, n=n, batch=batch, wmma_ms=t_wmma, extension_ms=t_ext, speedup=t_wmma / t_ext,
                         extension_tbps=nbytes / t_ext / 1e9, paper=PAPER[fig]))
        del v, ref
        torch.cuda.empty_cache()
    payload = header() | {"quick": args.quick, "rows": rows}
    write_results("paper_figs", payload, ["fig", "n", "batch", "wmma_ms", "extension_ms", "speedup", "extension_tbps", "paper"],
                  args.out, "Paper Figs. 3 (load_vector) and 5 (make_identity): speed-up of the extension over the WMMA API")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig_, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, fig in zip(axes, (3, 5)):
        for n in (16, 32):
            sel = [r for r in rows if r["fig"] == fig and r["n"] == n]
            ax.plot([r["batch"] for r in sel], [r["speedup"] for r in sel], marker="o", label=f"n = {n}")
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch")
        ax.set_title(f"Fig. {fig}: {'load_vector' if fig == 3 else 'load_vector + make_identity'}")
        ax.legend()
    axes[0].set_ylabel("speed-up over WMMA API only")
    fig_.suptitle(f"{payload['gpu']}, torch {payload['torch']} (paper: {PAPER[3]} / {PAPER[5]})", fontsize=9)
    fig_.tight_layout()
    fig_.savefig(os.path.join(args.out, "paper_figs.png"), dpi=120)
    for r in rows:
        print(f"Fig {r['fig']} n={r['n']:2d} batch={r['batch']:8d}: x{r['speedup']:.3f} ({r['extension_tbps']:.2f} TB/s)")


if __name__ == "__main__":
    main()
