"""corrected_matmul called back to back, as in a training step's sequence of ops, against torch.matmul fp32 and TF32.

bench_corrected_matmul.py puts a pair of CUDA events around every call, so no call there can overlap the one
before it. Here `calls` calls run between one pair of events (common.loop_ms, the host kept ahead), so a
call's first kernel may start while the previous call's last one ends (programmatic dependent launch; see
allow_dependent_grid in csrc/ops/corrected_gemm_common.cuh). Each row also has the per-call events' median
(common.median_ms) of the same calls. Inputs are U(-1, 1) and rotate as in the main benchmark
(common.rotating_operands). Writes benchmarks/results/back_to_back.json and .md
(or --out).
"""
from __future__ import annotations

import argparse

import torch

import torch_wmmae
from common import header, loop_ms, median_ms, rotating_operands, tf32_matmul, write_results

# (batch, m, n, k): small calls, where a launch gap is a large part of the call, up to a mid-size square,
# the batched shapes of the main benchmark and the notes, and single and batched products with a short K (128, 64
# or 32, e.g. attention's head dimension), where each tile's fixed costs outweigh its products; and outputs of at most
# 64 x 64 per entry, which the small GEMM computes (corrected_gemm_small.cuh), among them grids of one or two waves
# of tile 64 and tile 32 that their kernels with more blocks per SM take (small_gemm_hh_per_fragment), and grids of
# few 64 x 64 outputs, which tile 32 takes (small_gemm_tile).
SHAPES = [(1, 128, 1024, 4096), (1, 1024, 1024, 1024), (1, 2048, 2048, 2048), (256, 128, 128, 128),
          (8, 1024, 1024, 1024), (64, 512, 512, 512), (512, 128, 128, 64), (512, 128, 128, 32),
          (32, 512, 512, 64), (64, 1024, 1024, 64), (64, 1024, 1024, 32), (2048, 64, 64, 64), (2048, 64, 64, 128),
          (8192, 32, 32, 32), (16384, 16, 16, 16), (1, 64, 64, 64), (600, 64, 64, 64), (1300, 64, 64, 32),
          (2000, 32, 32, 32), (100, 64, 64, 32), (1, 512, 512, 64), (1, 1024, 1024, 32), (1, 256, 256, 128),
          (1, 4096, 4096, 64)]
COLUMNS = ["m", "n", "k", "batch", "method", "loop_us", "per_call_us", "fp32_loop_us", "loop_speedup_vs_fp32",
           "tf32_loop_us", "loop_speedup_vs_tf32"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    parser.add_argument("--calls", type=int, default=40)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for batch, m, n, k in SHAPES:
        a, b = rotating_operands(m, n, k, batch, l2)
        sets = len(a)
        fp32_us = 1000 * loop_ms(lambda i: torch.matmul(a[i], b[i]), sets, args.calls)
        tf32_us = 1000 * loop_ms(lambda i: tf32_matmul(a[i], b[i]), sets, args.calls)
        for method in ("auto", "fp16"):
            call = lambda i: torch_wmmae.corrected_matmul(a[i], b[i], method=method)
            loop_us = 1000 * loop_ms(call, sets, args.calls)
            per_call_us = 1000 * median_ms(call, n_inputs=sets, warmup=3, reps=args.calls, host_ahead=True)
            rows.append(dict(m=m, n=n, k=k, batch=batch, method=method, loop_us=loop_us, per_call_us=per_call_us,
                             fp32_loop_us=fp32_us, loop_speedup_vs_fp32=fp32_us / loop_us, tf32_loop_us=tf32_us,
                             loop_speedup_vs_tf32=tf32_us / loop_us))
            print(f"{batch}x{m}x{n}x{k} {method:4s} back to back {loop_us:7.1f} us, per-call events "
                  f"{per_call_us:7.1f} us, torch fp32 / TF32 back to back {fp32_us:7.1f} / {tf32_us:7.1f} us")
    write_results("back_to_back", {**header(), "calls": args.calls, "rows": rows}, COLUMNS, args.out,
                  "corrected_matmul back to back vs torch.matmul fp32 and TF32")


if __name__ == "__main__":
    main()
