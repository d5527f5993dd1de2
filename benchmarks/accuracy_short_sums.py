"""corrected_matmul's error over short sums, where the split's own error shows, against float32's.

Over long sums the rounding of the sum dominates and corrected_matmul is more accurate than torch.matmul in
float32 (bench_corrected_matmul.py's rel_err columns). Over a few terms each product's split error (a few units
of u = 2^-24) is larger than float32's one rounding. This script measures both on N(0, 1) inputs: the largest
and the mean error of an output relative to sum_k |a_ik| |b_kj|, in units of u, against a float64 reference.
Shapes: many independent 1 x K x 1 products for short K, 256 x K x 256 outputs from K = 32 on. The 1 x K x 1
products run on the split GEMMs (TORCH_WMMAE_MATRIX_VECTOR=0): calls of one output row or column otherwise sum in
float64 (README: "Matrix-vector products"), which rounds once, as float32's single product does.

It runs on the CPU (the op's CPU kernel, which follows the GPU's arithmetic; torch.matmul is MKL's sgemm there)
and, with a GPU, on CUDA with the same inputs (torch.matmul in float32 with TF32 off), and records how far
corrected_matmul's CUDA outputs lie from its CPU outputs (the share of outputs whose bits differ, the largest
difference relative to |a| |b|). Writes benchmarks/results/short_sums.json and .md
(or --out).
    python benchmarks/accuracy_short_sums.py [--outputs 4194304] [--out DIR]
"""
from __future__ import annotations

import argparse
import datetime
import os

import torch

import torch_wmmae
from common import write_results

U = 2.0 ** -24
os.environ["TORCH_WMMAE_MATRIX_VECTOR"] = "0"  # the split's own error, which is what this measures (see above)
SHAPES = [(1, 1), (1, 8), (1, 32), (256, 32), (256, 256)]  # (M = N, K)
CHUNK_OUTPUTS = 1 << 18  # outputs per call: bounds the memory of the 1 x K x 1 batches


def relative_errors(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, ref: torch.Tensor | None = None) -> torch.Tensor:
    """|c - ref| / (|a| |b|) per output, in float64; ref defaults to the exact product a b."""
    a64, b64 = a.double(), b.double()
    ref = a64 @ b64 if ref is None else ref.double()
    return (c.double() - ref).abs() / (a64.abs() @ b64.abs())


def measure(mn: int, k: int, outputs: int, method: str, devices: list, gen: torch.Generator) -> dict:
    batch = max(1, CHUNK_OUTPUTS // (mn * mn))
    names = [f"{who}_{d}" for d in devices for who in ("ours", "fp32")]
    worst, total = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0.0)
    differing, max_apart, done = 0, 0.0, 0
    while done < outputs:
        a = torch.randn(batch, mn, k, generator=gen)
        b = torch.randn(batch, k, mn, generator=gen)
        results = {}
        for d in devices:
            results[f"ours_{d}"] = torch_wmmae.corrected_matmul(a.to(d), b.to(d), method=method).cpu()
            results[f"fp32_{d}"] = torch.matmul(a.to(d), b.to(d)).cpu()
        if "cuda" in devices:  # how far the CUDA kernels' outputs lie from the CPU kernel's
            ours_cuda, ours_cpu = results["ours_cuda"], results["ours_cpu"]
            differing += (ours_cuda != ours_cpu).sum().item()
            max_apart = max(max_apart, relative_errors(ours_cuda, a, b, ref=ours_cpu).max().item() / U)
        for name, c in results.items():
            err = relative_errors(c, a, b)
            worst[name] = max(worst[name], err.max().item() / U)
            total[name] += err.sum().item() / U
        done += batch * mn * mn
    row = dict(m=mn, n=mn, k=k, outputs=done, method=method)
    for name in names:
        row[f"max_u_{name}"] = worst[name]
        row[f"mean_u_{name}"] = total[name] / done
    if "cuda" in devices:
        row["cuda_differing_from_cpu"] = differing / done  # the share of outputs whose bits differ
        row["max_u_cuda_from_cpu"] = max_apart  # the largest difference, relative to |a| |b| as the errors
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--outputs", type=int, default=1 << 22, help="outputs per shape (default 4194304)")
    p.add_argument("--method", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="result directory (default benchmarks/results)")
    args = p.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = False  # torch's float32 GEMM, not TF32
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() and torch_wmmae.has_cuda_kernels() else [])
    gen = torch.Generator().manual_seed(args.seed)
    rows = []
    for mn, k in SHAPES:
        rows.append(measure(mn, k, args.outputs, args.method, devices, gen))
        print(rows[-1], flush=True)
    payload = {
        "gpu": torch.cuda.get_device_name(0) if "cuda" in devices else "none (CPU only)",
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "seed": args.seed,
        "rows": rows,
    }
    columns = ["m", "n", "k", "outputs", "method"]
    columns += [f"{s}_u_{who}_{d}" for d in devices for who in ("ours", "fp32") for s in ("max", "mean")]
    columns += ["cuda_differing_from_cpu", "max_u_cuda_from_cpu"] if "cuda" in devices else []
    write_results("short_sums", payload, columns, args.out,
                  title="corrected_matmul over short sums: error relative to |a| |b|, in units of 2^-24")


if __name__ == "__main__":
    main()
