"""corrected_matmul against torch.matmul in float32 (TF32 off) and TF32, in the same run.

Writes benchmarks/results/corrected_matmul.{json,md}: one row per shape, method and input distribution,
with TFLOP/s, the speed-up over torch.matmul float32 and the relative Frobenius errors against a float64
product. Every call is timed with its own CUDA events, median of the repetitions, two ways
(common.median_ms): `ms`, and from it `tflops`, `fp32_tflops`, `tf32_tflops` and `speedup_vs_fp32`, is the
GPU time per call with the host kept ahead (a spin kernel holds the GPU while the calls are enqueued), as in
a training step whose host runs ahead of the GPU; `call_ms`, `fp32_call_ms` and `call_speedup_vs_fp32`
time each call from an idle GPU, so that a small call is timed at the pace of the host that enqueues its
launches (our "auto" call enqueues five: the workspace's zeroing, the pre-pass, two GEMMs and the float32
fallback's check; torch.matmul one). Inputs are U(-1, 1) (torch.rand * 2 - 1: multiples of 2^-23, so no row
spans more than 2^23 and "auto" never needs its tf32 fallback) and, for "auto" on the square shapes, also
N(0, 1), whose rare tiny elements do send some tiles to the tf32 split.
    python benchmarks/bench_corrected_matmul.py [--quick] [--out DIR]
"""
from __future__ import annotations

import argparse
import time

import torch

import torch_wmmae
from common import header, median_ms, rel_err, require_out_for_partial_runs, rotating_operands, write_results

METHODS = ("auto", "fp16", "tf32")


def reference_rows(a: torch.Tensor, b: torch.Tensor, rows: int) -> torch.Tensor:
    """float64 product of the first `rows` rows: the errors are measured on those rows of a call of the timed
    shape (a call of only those rows could take another schedule: split-K or stream-K, another order of sums)."""
    return torch.matmul(a[..., :rows, :].double(), b.double())


def bench_shape(m: int, n: int, k: int, batch: int, l2: int, reps: int, methods=METHODS, err_rows: int = 512,
                dist: str = "uniform", settle=lambda: None) -> list:
    """One shape: torch.matmul in float32 and TF32, then each method. `settle` runs before the baseline and
    before each method, so that each starts from the same state of the GPU (see main)."""
    flop = 2.0 * batch * m * n * k
    a_sets, b_sets = rotating_operands(m, n, k, batch, l2, dist)
    sets = len(a_sets)
    rows = min(m, err_rows)
    ref = reference_rows(a_sets[0], b_sets[0], rows)

    def timed(fn, host_ahead=True):
        return median_ms(lambda i: fn(a_sets[i], b_sets[i]), n_inputs=sets, reps=reps, host_ahead=host_ahead)

    previous_tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        settle()
        fp32_ms, fp32_call_ms = timed(torch.matmul), timed(torch.matmul, host_ahead=False)
        fp32_err = rel_err(torch.matmul(a_sets[0], b_sets[0])[..., :rows, :], ref)
        torch.backends.cuda.matmul.allow_tf32 = True
        tf32_ms = timed(torch.matmul)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous_tf32
    # The launch grid of the CUDA GEMM for this problem (tiles x K splits, or the wgmma kernel's stream-K
    # blocks, or its persistent batched blocks), as the op chose it.
    props = torch.cuda.get_device_properties(0)
    tiles, k_splits, blocks, stream_k_blocks, persistent_blocks = torch.ops.wmmae._corrected_matmul_grid(
        m, n, k, batch, props.multi_processor_count, props.L2_cache_size)
    # The tile rows its consecutive tiles walk down, from the K of a split and the L2 size.
    tile_group_rows = torch.ops.wmmae._tile_group_rows(k, props.L2_cache_size, k_splits)
    out = []
    for method in methods:
        ours = lambda a, b: torch_wmmae.corrected_matmul(a, b, method=method)  # noqa: E731
        settle()
        ms, call_ms = timed(ours), timed(ours, host_ahead=False)
        err = rel_err(torch_wmmae.corrected_matmul(a_sets[0], b_sets[0], method=method)[..., :rows, :], ref)
        out.append(dict(m=m, n=n, k=k, batch=batch, method=method, dist=dist, ms=ms, tflops=flop / ms / 1e9,
                        fp32_tflops=flop / fp32_ms / 1e9, tf32_tflops=flop / tf32_ms / 1e9,
                        speedup_vs_fp32=fp32_ms / ms, call_ms=call_ms, fp32_call_ms=fp32_call_ms,
                        call_speedup_vs_fp32=fp32_call_ms / call_ms, rel_err=err, fp32_rel_err=fp32_err,
                        tiles=tiles, k_splits=k_splits, blocks=blocks, stream_k_blocks=stream_k_blocks,
                        persistent_blocks=persistent_blocks, tile_group_rows=tile_group_rows))
    del a_sets, b_sets
    torch.cuda.empty_cache()
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="fewer sizes and a coarse N sweep")
    p.add_argument("--out", default=None, help="output folder (default benchmarks/results)")
    p.add_argument("--sweep-step", type=int, default=None)
    p.add_argument("--cool", type=float, default=3.0,
                   help="idle seconds before each measurement of a square or batched shape: its torch baseline and "
                        "each method (see settle)")
    args = p.parse_args()
    require_out_for_partial_runs(p, args, "--quick", "--sweep-step")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    # Process warm-up, discarded: the first shape measured after other GPU work (tests, the batched_outer
    # benchmark) came out 10-25% slower than the same measurement repeated (H200: 1024^3 auto 0.80x against
    # 1.02-1.03x in six repeats), and one pass through it was not enough after an idle GPU (a build): 0.81x
    # against 1.42x in a fresh process. So every method runs through one shape for at least two seconds
    # before anything is recorded.
    deadline = time.perf_counter() + 2.0
    while time.perf_counter() < deadline:
        bench_shape(1024, 1024, 1024, 1, l2, reps=20)
    # A shape measured right after seconds of large GEMMs at the GPU's power limit found the GPU in another
    # state, which slowed torch.matmul more than corrected_matmul (H200, 64 x 512^3 right after 2 s of
    # 16384^3: torch fp32 39.1 TFLOP/s against 48.5 in a fresh process, ours 77.3 against 83.8; the batched
    # row used to follow 16384^3 here). So every square and batched shape starts from an idle GPU, and so does
    # each method there: timed right after auto's 40 calls, fp16 came out up to 10% slower than auto at 4096^3
    # (H200, session 73: 2.58x against 2.85x), though the two run the same GEMM on these inputs.
    def settle() -> None:
        torch.cuda.synchronize()
        time.sleep(args.cool)

    rows = []
    step = args.sweep_step or (1024 if args.quick else 64)  # (of the M = 128, K = 4096 sweep's N)

    def save(complete: bool) -> None:
        # Written after each part as well, so that a run stopped by a time limit still leaves what it measured
        # ("complete": false until the sweep's last point).
        payload = header() | {"complete": complete, "quick": args.quick, "sweep_step": step, "cool_s": args.cool,
                              "rows": rows}
        write_results("corrected_matmul", payload,
                      ["m", "n", "k", "batch", "method", "dist", "tflops", "fp32_tflops", "tf32_tflops",
                       "speedup_vs_fp32", "call_speedup_vs_fp32", "rel_err", "fp32_rel_err"], args.out,
                      "corrected_matmul vs torch.matmul")

    squares = (1024, 2048, 4096, 8192) if args.quick else (1024, 2048, 4096, 8192, 16384)
    for s in squares:
        rows += bench_shape(s, s, s, 1, l2, reps=10 if s >= 8192 else 20, settle=settle)
        rows += bench_shape(s, s, s, 1, l2, reps=10 if s >= 8192 else 20, methods=("auto",), dist="normal",
                            settle=settle)
        print(rows[-4:], flush=True)
    rows += bench_shape(512, 512, 512, 64, l2, reps=20, settle=settle)
    print(rows[-3:], flush=True)
    save(complete=False)
    from tqdm import tqdm

    for i, n in enumerate(tqdm(range(64, 47360 + 1, step), desc="M=128, K=4096 sweep")):
        rows += bench_shape(128, n, 4096, 1, l2, reps=10, methods=("auto",), err_rows=128)
        if i % 100 == 99:
            save(complete=False)
    print(f"sweep done: {len(rows)} rows", flush=True)
    save(complete=True)
    for r in rows:
        if r["n"] in (1024, 2048, 4096, 8192, 16384, 512) and (r["m"] == r["n"] or r["batch"] > 1):
            print(f"{r['batch']}x{r['m']}x{r['n']}x{r['k']} {r['method']:5s} {r['dist']:7s} {r['tflops']:7.1f} TFLOP/s "
                  f"x{r['speedup_vs_fp32']:.2f} vs fp32 ({r['fp32_tflops']:.1f}; from an idle GPU "
                  f"x{r['call_speedup_vs_fp32']:.2f}), err {r['rel_err']:.2e} (fp32 {r['fp32_rel_err']:.2e})")


if __name__ == "__main__":
    main()
