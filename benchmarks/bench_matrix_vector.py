"""corrected_matmul's matrix-vector path (M = 1 or N = 1, or tiny products of at most 8 x 8 outputs: float64 sums on
the CUDA cores) against torch.matmul in float32 (TF32 off) and against the same calls on the GEMMs
(TORCH_WMMAE_MATRIX_VECTOR=0), in the same run.

Writes benchmarks/results/matrix_vector.{json,md}: per shape and layout, the GPU time per call (CUDA events, the
three calls interleaved, median of the repetitions, inputs rotated through more than the L2; `auto` for the
GEMMs), the matrix's read rate (both operands' for a tiny product), and per input distribution (U(0, 1), U(-1, 1),
N(0, 1)) the relative Frobenius errors against a float64 product. Every method takes the path, so `auto` stands for
all three.
    python benchmarks/bench_matrix_vector.py [--out DIR]
"""
from __future__ import annotations

import argparse
import os

import torch

import torch_wmmae
from common import header, inputs_for_rotation, interleaved_median_ms, rel_err, write_results

SWITCH = "TORCH_WMMAE_MATRIX_VECTOR"

# (name, M, N, K, batch, layout): "B row-major" (x @ W with W [K, N]), "B column-major" (x @ W.t() with W [N, K],
# a linear layer's forward pass at batch 1), "A row-major" (W @ x).
CASES = [
    ("1 x 1000 x 4096", 1, 1000, 4096, 1, "B row-major"),
    ("1 x 1000 x 4096", 1, 1000, 4096, 1, "B column-major"),
    ("1000 x 1 x 4096", 1000, 1, 4096, 1, "A row-major"),
    ("1 x 4096 x 4096", 1, 4096, 4096, 1, "B row-major"),
    ("1 x 4096 x 4096", 1, 4096, 4096, 1, "B column-major"),
    ("4096 x 1 x 4096", 4096, 1, 4096, 1, "A row-major"),
    ("1 x 16384 x 4096", 1, 16384, 4096, 1, "B row-major"),
    ("1 x 16384 x 4096", 1, 16384, 4096, 1, "B column-major"),
    ("16384 x 1 x 4096", 16384, 1, 4096, 1, "A row-major"),
    ("1 x 1000 x 65536", 1, 1000, 65536, 1, "B row-major"),
    ("1 x 1000 x 65536", 1, 1000, 65536, 1, "B column-major"),
    ("1000 x 1 x 65536", 1000, 1, 65536, 1, "A row-major"),
    ("1 x 1 x 1048576", 1, 1, 1 << 20, 1, "A row-major"),
    ("1 x 4 x 65536", 1, 4, 65536, 1, "B row-major"),
    ("1 x 4 x 65536", 1, 4, 65536, 1, "B column-major"),
    ("7 x 1 x 65536", 7, 1, 65536, 1, "A row-major"),
    ("8 x 1 x 65536", 8, 1, 65536, 1, "A row-major"),
    ("4096 x (1 x 1 x 1024)", 1, 1, 1024, 4096, "A row-major"),
    ("4 x 4 x 65536", 4, 4, 65536, 1, "B row-major"),
    ("8 x 8 x 4096", 8, 8, 4096, 1, "B column-major"),
    ("64 x (8 x 8 x 512)", 8, 8, 512, 64, "B row-major"),
    ("256 x (8 x 8 x 256)", 8, 8, 256, 256, "B row-major"),
    ("1024 x (8 x 8 x 64)", 8, 8, 64, 1024, "B column-major"),
    ("4096 x (1 x 1 x 32)", 1, 1, 32, 4096, "A row-major"),
    ("64 x (1 x 512 x 512)", 1, 512, 512, 64, "B row-major"),
    ("64 x (512 x 1 x 512)", 512, 1, 512, 64, "A row-major"),
]
DISTS = ("positive", "uniform", "normal")


def draw(shape, dist: str, gen: torch.Generator) -> torch.Tensor:
    if dist == "normal":
        return torch.randn(shape, device="cuda", generator=gen)
    u = torch.rand(shape, device="cuda", generator=gen)
    return u if dist == "positive" else u * 2 - 1


def operands(m: int, n: int, k: int, batch: int, layout: str, dist: str, gen: torch.Generator):
    lead = (batch,) if batch > 1 else ()
    a = draw(lead + (m, k), dist, gen)
    if layout == "B column-major":
        b = draw(lead + (n, k), dist, gen).transpose(-1, -2)
    else:
        b = draw(lead + (k, n), dist, gen)
    return a, b


def ours(a, b, path_on: bool):
    os.environ[SWITCH] = "1" if path_on else "0"
    return torch_wmmae.corrected_matmul(a, b)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None, help="output folder (default benchmarks/results)")
    p.add_argument("--reps", type=int, default=30)
    args = p.parse_args()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    gen = torch.Generator(device="cuda").manual_seed(2026)
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    for name, m, n, k, batch, layout in CASES:
        row = dict(shape=name, layout=layout, m=m, n=n, k=k, batch=batch)
        for dist in DISTS:
            a, b = operands(m, n, k, batch, layout, dist, gen)
            ref = torch.matmul(a.double(), b.double())
            row[f"err_{dist}"] = rel_err(ours(a, b, True), ref)
            row[f"gemm_err_{dist}"] = rel_err(ours(a, b, False), ref)
            row[f"fp32_err_{dist}"] = rel_err(torch.matmul(a, b), ref)
            del a, b, ref
        # the matrix: B where M = 1, A where N = 1; both operands of a tiny product
        matrix_bytes = 4 * batch * k * (n if m == 1 else m if n == 1 else m + n)
        sets = inputs_for_rotation(4 * batch * (m * k + k * n + m * n), l2)
        inputs = [operands(m, n, k, batch, layout, "uniform", gen) for _ in range(sets)]
        turn = {"fp32": 0, "ours": 0, "gemm": 0}

        def rotating(key, fn):
            def call():
                a, b = inputs[turn[key] % sets]
                turn[key] += 1
                return fn(a, b)
            return call

        fp32_ms, ours_ms, gemm_ms = interleaved_median_ms(
            [rotating("fp32", torch.matmul), rotating("ours", lambda a, b: ours(a, b, True)),
             rotating("gemm", lambda a, b: ours(a, b, False))], reps=args.reps, host_ahead=True)
        row.update(ms=ours_ms, fp32_ms=fp32_ms, gemm_ms=gemm_ms, speedup_vs_fp32=fp32_ms / ours_ms,
                   speedup_vs_gemm=gemm_ms / ours_ms, matrix_gbps=matrix_bytes / ours_ms / 1e6,
                   fp32_matrix_gbps=matrix_bytes / fp32_ms / 1e6)
        rows.append(row)
        print({key: (f"{v:.3g}" if isinstance(v, float) else v) for key, v in row.items()}, flush=True)
        del inputs
        torch.cuda.empty_cache()
    os.environ.pop(SWITCH, None)
    columns = ["shape", "layout", "ms", "fp32_ms", "gemm_ms", "speedup_vs_fp32", "speedup_vs_gemm", "matrix_gbps",
               "fp32_matrix_gbps"] + [f"{w}err_{d}" for d in DISTS for w in ("", "fp32_", "gemm_")]
    write_results("matrix_vector", header() | {"rows": rows}, columns, args.out,
                  "corrected_matmul's matrix-vector path vs torch.matmul float32 and vs its GEMMs")


if __name__ == "__main__":
    main()
