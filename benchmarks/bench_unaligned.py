"""corrected_matmul on unaligned operands and odd output widths, by path, against torch.matmul fp32.

TMA reads an operand in place only where its start and line strides are multiples of 16 bytes; an odd K or N, or a
storage offset, breaks that. corrected_matmul then chooses between the small GEMM, the tile GEMMs reading copies
that TMA can read or reading A or B in place by residue of its lines (where its batch entries, if any, share those
residues), and (for an odd N, whose output rows are not 8-byte aligned) the fp16 GEMM's odd-width instantiation,
which stages its output rows through shared memory (README, Performance). Each row times the default and the paths
that its environment switches force, in one process (the switches are read at every call), rounds rotated; each time
is common.loop_ms (calls back to back between one pair of CUDA events, the host kept ahead). Inputs are U(-1, 1) and
rotate as in the main benchmark (common.inputs_for_rotation). Before timing, one call of each path is checked against
a float64 product (worst_err_over_fp32: the largest ratio of a path's error to torch.matmul fp32's; the run fails
past MAX_ERR_OVER_FP32, after writing its results) and its kernels are recorded (the JSON's `kernels`, by path: what
the switches made it run).
Writes benchmarks/results/unaligned.json and .md (or --out).
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys

import torch

import torch_wmmae
from common import header, inputs_for_rotation, loop_ms, rel_err, require_out_for_partial_runs, write_results

# (batch, m, n, k, A's storage offset in floats): odd N at K <= 128 (the flush's share of the time is largest) and
# beyond, up to the small GEMM's side of its rule (N <= 64) and past it; odd N with long K: split-K (4097^3), stream-K
# (1025^2 x 4096, 256 x 2049 x 4096) and chunks read back (8 x 1025^2 x 2048), whose atomics and chunks are staged too,
# and split-K on cp.async stages (128 x 4097 x 4096: tma_copies_pay), which have no odd-width instantiation; odd K (A's
# lines unaligned: read by residue) and an odd K and N; A one float past 16 bytes; an aligned control. Then other
# layouts (the last field): A = X.t() with an odd M (a backward pass's grad.t() @ x: A by residue of its k), and x @
# W.t() with an odd K (both operands by residue: A's rows, B's columns), also with W read once (M = 128). Then the
# backward pass of a linear layer with an odd in_features: grad @ W and grad.t() @ x (a row-major B of odd width: by
# residue of its k). Then batched operands whose batch stride is a multiple of 4 floats (every entry's lines at the same
# residues: by residue, with batched maps): an odd K (A by residue), an odd N (B by residue), and x @ W.t() per batch
# entry; and batched operands whose batch stride is not a multiple of 4 floats (contiguous entries of an odd number of
# floats): A, B, both, and x @ W.t(), copied by default, and two batches whose residue classes of the batch index have 4
# waves of tiles or more, which run as one call per class by default. Last, odd widths of 2^18 to 2^20 outputs at K <=
# 128, which leave the small GEMM for the tile GEMMs where those read no copy (B by residue, A in place), and one below
# 2^18.
SHAPES = [(1, 4097, 4097, 64, 0), (1, 4096, 4097, 64, 0), (1, 8193, 8193, 64, 0), (1, 4097, 4097, 128, 0),
          (1, 4097, 4097, 1000, 0), (1, 2049, 2049, 256, 0), (1, 1025, 1025, 64, 0), (8, 1025, 1025, 64, 0),
          (1, 769, 769, 64, 0), (1, 65536, 33, 64, 0), (1, 32768, 65, 64, 0), (1, 4097, 4097, 4097, 0),
          (1, 1025, 1025, 4096, 0), (1, 256, 2049, 4096, 0), (8, 1025, 1025, 2048, 0),
          (1, 1024, 1024, 99, 0), (1, 2048, 2048, 50, 0), (1, 4096, 4096, 33, 0), (1, 4096, 4096, 64, 1),
          (1, 2048, 2048, 2047, 0), (1, 8192, 8192, 8191, 0),
          (1, 128, 4097, 4096, 0), (1, 4096, 4096, 64, 0),
          (1, 1023, 1024, 16384, 0, "a_col"), (1, 2047, 2048, 2048, 0, "a_col"), (1, 4097, 4096, 4096, 0, "a_col"),
          (1, 16384, 1024, 1023, 0, "x_w_t"), (1, 2048, 2048, 2047, 0, "x_w_t"), (1, 4096, 4096, 4097, 0, "x_w_t"),
          (1, 128, 8192, 4097, 0, "x_w_t"),
          (1, 2048, 1023, 1024, 0), (1, 8192, 4095, 4096, 0), (1, 1024, 1023, 2048, 0, "a_col"),
          (1, 4096, 4095, 8192, 0, "a_col"),
          (8, 1024, 1024, 1023, 0), (4, 2048, 2047, 2048, 0), (8, 1024, 1024, 1023, 0, "x_w_t"),
          (8, 1023, 1024, 1023, 0), (8, 1024, 1023, 1023, 0), (4, 2047, 2047, 2047, 0), (64, 513, 513, 513, 0),
          (16, 255, 256, 255, 0), (8, 1025, 1024, 1023, 0, "x_w_t"), (128, 513, 513, 513, 0), (16, 2047, 2047, 2047, 0),
          (1, 1023, 1023, 64, 0), (1, 2049, 511, 96, 0), (1, 513, 1023, 128, 0),
          (1, 513, 513, 64, 0), (1, 511, 511, 64, 0)]
# A's and B's layouts: row-major both, A column-major (X.t()), B column-major (W.t()).
LAYOUTS = ("row", "a_col", "x_w_t")
# The paths: the default, the small GEMM wherever it can run (K <= 128, SMALL_GEMM_MAX_K), the tile GEMMs (never the
# small GEMM) with their odd-width staging and with element-by-element stores, the tile GEMMs reading a copy of A or of
# B where they would read it by residue, the tile GEMMs without the copies (cp.async stages), and, for batched operands
# whose batch stride is not a multiple of 4 floats, the tile GEMMs run as one call per residue class of the batch index
# wherever they can (by default only where each class has at least 4 waves of tiles).
SWITCHES = ("TORCH_WMMAE_SMALL_GEMM", "TORCH_WMMAE_STAGED_FLUSH", "TORCH_WMMAE_A_BY_RESIDUE",
            "TORCH_WMMAE_B_BY_RESIDUE", "TORCH_WMMAE_TMA_COPIES", "TORCH_WMMAE_BATCH_RESIDUE_CLASSES")
VARIANTS = {
    "default_us": {},
    "small_gemm_us": {"TORCH_WMMAE_SMALL_GEMM": "1"},
    "tile_staged_us": {"TORCH_WMMAE_SMALL_GEMM": "0"},
    "tile_element_stores_us": {"TORCH_WMMAE_SMALL_GEMM": "0", "TORCH_WMMAE_STAGED_FLUSH": "0"},
    "tile_a_copied_us": {"TORCH_WMMAE_SMALL_GEMM": "0", "TORCH_WMMAE_A_BY_RESIDUE": "0"},
    "tile_b_copied_us": {"TORCH_WMMAE_SMALL_GEMM": "0", "TORCH_WMMAE_B_BY_RESIDUE": "0"},
    "tile_cp_async_us": {"TORCH_WMMAE_SMALL_GEMM": "0", "TORCH_WMMAE_TMA_COPIES": "0"},
    "tile_batch_classes_us": {"TORCH_WMMAE_SMALL_GEMM": "0", "TORCH_WMMAE_BATCH_RESIDUE_CLASSES": "1"},
}
SMALL_GEMM_MAX_K = 128  # corrected_gemm_small.cuh's kSmallMaxK: beyond it TORCH_WMMAE_SMALL_GEMM=1 runs the tile GEMMs
# A path whose error is this many times torch.matmul fp32's is wrong, not unlucky: corrected_matmul's error is at most
# about 4x fp32's on any of these shapes (tests/hardening.py, parity_slack), a wrong tile or line ~10^5x.
MAX_ERR_OVER_FP32 = 8.0
COLUMNS = ["batch", "m", "n", "k", "a_offset", "layout", "method", *VARIANTS, "fp32_us", "default_speedup_vs_fp32",
           "worst_err_over_fp32"]


def kernels_of(fn) -> list:
    """The distinct names of the CUDA kernels (and copies, memsets) that fn() launches, by torch.profiler, with their
    template arguments (which tell the paths apart) but not their parameter lists."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({short_kernel_name(e.name) for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA})


def short_kernel_name(name: str) -> str:
    """A kernel's name without its return type and parameter list: "void ns::k<1, true>(Args)" -> "ns::k<1, true>".
    The parameter list is the first "(" outside the template arguments (which may hold "(": lambdas, operator()),
    right after the name ("Memset (Device)" is kept whole)."""
    name = name.removeprefix("void ")
    depth = 0
    for i, c in enumerate(name):
        depth += {"<": 1, ">": -1}.get(c, 0)
        if c == "(" and depth == 0 and i > 0 and name[i - 1] != " ":
            return name[:i]
    return name


def operand(shape, offset: int, gen: torch.Generator, transposed: bool = False) -> torch.Tensor:
    """U(-1, 1) values of `shape`, contiguous, starting `offset` floats into their storage; with `transposed`, the
    transpose of such a matrix of the transposed shape (column-major)."""
    stored = (*shape[:-2], shape[-1], shape[-2]) if transposed else shape
    storage = torch.rand(math.prod(stored) + offset, device="cuda", generator=gen) * 2 - 1
    matrix = storage[offset:].view(stored)
    return matrix.transpose(-1, -2) if transposed else matrix


def set_path(env: dict) -> None:
    for name in SWITCHES:
        os.environ.pop(name, None)
    os.environ.update(env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    parser.add_argument("--method", default="auto", choices=["auto", "fp16"])
    parser.add_argument("--rounds", type=int, default=3, help="rotated rounds of the paths per shape (median)")
    parser.add_argument("--only", nargs="*", default=None, metavar="BxMxNxK",
                        help="time only these shapes (batch x m x n x k, every layout and offset of each); "
                             "needs --out, so that the results folder keeps every shape")
    args = parser.parse_args()
    require_out_for_partial_runs(parser, args, "--only")
    if any(name in os.environ for name in SWITCHES):
        parser.error(f"unset {', '.join(SWITCHES)}: this benchmark sets them per path")
    torch.backends.cuda.matmul.allow_tf32 = False
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    try:
        for batch, m, n, k, offset, *layout in SHAPES:
            if args.only is not None and f"{batch}x{m}x{n}x{k}" not in args.only:
                continue
            layout = layout[0] if layout else "row"
            assert layout in LAYOUTS, layout
            gen = torch.Generator(device="cuda").manual_seed(4321 + m + n + k + offset)
            sets = inputs_for_rotation(4 * batch * (m * k + k * n + m * n), l2)
            pre = (batch,) if batch > 1 else ()
            a = [operand(pre + (m, k), offset, gen, transposed=layout == "a_col") for _ in range(sets)]
            b = [operand(pre + (k, n), 0, gen, transposed=layout == "x_w_t") for _ in range(sets)]
            calls = 40 if batch * m * n * k < 2**32 else 8
            odd_batch_stride = batch > 1 and (m * k % 4 != 0 or k * n % 4 != 0)
            times = {name: [] for name in [*VARIANTS, "fp32_us"]
                     if (name != "small_gemm_us" or k <= SMALL_GEMM_MAX_K)
                     and (name != "tile_batch_classes_us" or odd_batch_stride)}
            names = list(times)
            # Each path once, before timing: its error against a float64 product, and its kernels.
            reference = torch.matmul(a[0].double(), b[0].double())
            set_path({})
            fp32_err = rel_err(torch.matmul(a[0], b[0]), reference)
            errors, kernels = {}, {}
            for name in names:
                if name != "fp32_us":
                    set_path(VARIANTS[name])
                    call = lambda: torch_wmmae.corrected_matmul(a[0], b[0], method=args.method)
                    errors[name] = rel_err(call(), reference)
                    kernels[name] = kernels_of(call)
            set_path({})
            del reference
            for rnd in range(args.rounds):
                for name in names[rnd % len(names):] + names[:rnd % len(names)]:
                    if name == "fp32_us":
                        set_path({})
                        fn = lambda i: torch.matmul(a[i], b[i])
                    else:
                        set_path(VARIANTS[name])
                        fn = lambda i: torch_wmmae.corrected_matmul(a[i], b[i], method=args.method)
                    times[name].append(1000 * loop_ms(fn, sets, calls))
            row = dict(batch=batch, m=m, n=n, k=k, a_offset=offset, layout=layout, method=args.method,
                       **{name: statistics.median(t) for name, t in times.items()})
            row["default_speedup_vs_fp32"] = row["fp32_us"] / row["default_us"]
            row["worst_err_over_fp32"] = max(errors.values()) / fp32_err
            row["kernels"] = kernels
            rows.append(row)
            if row["worst_err_over_fp32"] > MAX_ERR_OVER_FP32:
                print(f"WRONG: errors by path {errors}, torch fp32 {fp32_err:.3g}", flush=True)
            print(f"{batch}x{m}x{n}x{k} A+{offset} {layout}: "
                  + "  ".join(f"{c} {t:.1f}" for c, t in row.items() if c in times), flush=True)
    finally:
        set_path({})
    write_results("unaligned", {**header(), "method": args.method, "rounds": args.rounds, "rows": rows}, COLUMNS,
                  args.out, "corrected_matmul on unaligned operands and odd widths, by path, vs torch.matmul fp32")
    wrong = [f"{r['batch']}x{r['m']}x{r['n']}x{r['k']} {r['layout']}" for r in rows
             if r["worst_err_over_fp32"] > MAX_ERR_OVER_FP32]
    if wrong:
        sys.exit(f"a path's error exceeds {MAX_ERR_OVER_FP32}x torch.matmul fp32's on {', '.join(wrong)}")


if __name__ == "__main__":
    main()
