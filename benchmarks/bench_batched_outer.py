"""batched_outer against the best PyTorch formulation, and against the device copy bandwidth, in one run.

Effective bandwidth = (bytes read + bytes written) / time. Per case, ours (alpha 0 and 1.5), a device copy that
reads and writes as many bytes, and every PyTorch formulation are timed with their calls interleaved, in three
rounds: each ratio (fraction of copy, alpha cost, speed-up over torch) is the median of the rounds' ratios, measured
in one GPU state (the same call can run 10% slower in one state than in another: NOTES.md, batch 2^17). Ours TB/s
is from the best round's median time; the copy's and PyTorch's TB/s are ours divided by those ratios, so that the
columns agree (tbps / copy_tbps = fraction_of_copy, tbps / torch_best_tbps = speedup_vs_torch), and the best
PyTorch variant is the one of the smallest median ratio.
Writes benchmarks/results/batched_outer.{json,md}.
    python benchmarks/bench_batched_outer.py [--quick] [--out DIR]
"""
from __future__ import annotations

import argparse
import statistics

import torch

import torch_wmmae
from common import header, interleaved_median_ms, median_ms, require_out_for_partial_runs, write_results


def copy_tbps() -> float:
    src = torch.rand(512 * 1024 * 1024, device="cuda")  # 2 GiB
    dst = torch.empty_like(src)
    ms = median_ms(lambda i: dst.copy_(src), warmup=10, reps=30)
    return 2 * src.numel() * 4 / ms / 1e9


def torch_variants(alpha: float):
    def bmm(u, v):
        out = torch.bmm(u.float().unsqueeze(-1), v.float().unsqueeze(-2))
        return out.diagonal(0, -2, -1).add_(alpha) if alpha else out

    def einsum(u, v):
        out = torch.einsum("bi,bj->bij", u.float(), v.float())
        return out.diagonal(0, -2, -1).add_(alpha) if alpha else out

    def broadcast(u, v):
        out = u.float().unsqueeze(-1) * v.float().unsqueeze(-2)
        return out.diagonal(0, -2, -1).add_(alpha) if alpha else out

    variants = {"bmm": bmm, "einsum": einsum, "broadcast": broadcast}
    if alpha:
        def baddbmm(u, v):
            n = u.shape[-1]
            eye = torch.eye(n, device=u.device).expand(u.shape[0], n, n)
            return torch.baddbmm(eye, u.float().unsqueeze(-1), v.float().unsqueeze(-2), alpha=1.0, beta=alpha)
        variants["baddbmm_eye"] = baddbmm
    return variants


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    require_out_for_partial_runs(p, args, "--quick")
    copy = copy_tbps()
    # Every output is at least 128 MiB (16 x 16 x 4 bytes x 2^17), over twice the 50 MiB L2 of an H100/H200, so a
    # call that gets back its predecessor's output block still writes it to memory (bench_paper_figs' smaller
    # outputs need common.holding_results).
    cases = [(16, 2**20), (32, 2**20), (64, 2**17), (48, 2**18), (100, 2**17)]
    if not args.quick:
        cases += [(16, 2**17), (32, 2**17), (64, 2**19), (256, 2**13)]
    rows = []
    for n, batch in cases:
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            if dtype == torch.bfloat16 and n not in (16, 64):
                continue
            gen = torch.Generator(device="cuda").manual_seed(n * 7 + batch)
            u = torch.randn(batch, n, device="cuda", generator=gen).to(dtype)
            v = torch.randn(batch, n, device="cuda", generator=gen).to(dtype)
            nbytes = 2 * u.numel() * u.element_size() + batch * n * n * 4
            # Ours with alpha = 0 and 1.5, a copy of nbytes / 2 (as many bytes read and written as ours) and
            # every PyTorch formulation, their calls interleaved, three rounds (see the module's docstring).
            src = torch.rand((nbytes // 2 + 3) // 4, device="cuda", generator=gen)
            dst = torch.empty_like(src)
            timed = {("ours", 0.0): lambda: torch_wmmae.batched_outer(u, v, alpha=0.0),
                     ("ours", 1.5): lambda: torch_wmmae.batched_outer(u, v, alpha=1.5),
                     ("copy", None): lambda: dst.copy_(src)}
            for alpha in (0.0, 1.5):
                for name, fn in torch_variants(alpha).items():
                    timed[(name, alpha)] = lambda fn=fn: fn(u, v)
            rounds = [dict(zip(timed, interleaved_median_ms(list(timed.values()), warmup=10, reps=30)))
                      for _ in range(3)]
            ratio = lambda num, den: statistics.median(r[num] / r[den] for r in rounds)  # noqa: E731
            copy_bytes = 2 * src.numel() * 4
            for alpha in (0.0, 1.5):
                ours = ("ours", alpha)
                best_name = min((name for name, a in timed if a == alpha and name != "ours"),
                                key=lambda name: ratio((name, alpha), ours))
                ms = min(r[ours] for r in rounds)
                tbps = nbytes / ms / 1e9
                fraction_of_copy = ratio(("copy", None), ours) * nbytes / copy_bytes
                speedup = ratio((best_name, alpha), ours)
                rows.append(dict(n=n, batch=batch, alpha=alpha, in_dtype=str(dtype).replace("torch.", ""), ms=ms,
                                 tbps=tbps, copy_tbps=tbps / fraction_of_copy, fraction_of_copy=fraction_of_copy,
                                 alpha_cost=0.0 if alpha == 0.0 else ratio(ours, ("ours", 0.0)) - 1,
                                 torch_best=best_name, torch_best_tbps=tbps / speedup, speedup_vs_torch=speedup))
                r = rows[-1]
                print(f"n={n:3d} batch={batch:8d} {r['in_dtype']:8s} alpha={alpha}: {tbps:.2f} TB/s "
                      f"({r['fraction_of_copy']:.0%} of copy, alpha cost {r['alpha_cost']:+.1%}), torch best "
                      f"{r['torch_best']} {r['torch_best_tbps']:.2f} -> x{r['speedup_vs_torch']:.2f}", flush=True)
            # No torch.cuda.empty_cache() between cases: PyTorch keeps its cache, as in a training process.
            # Releasing it made the next case cudaMalloc gigabytes again, and after a fresh multi-GB
            # allocation the GPU ran this 40 us call at ~42 instead of ~38.5 us for seconds (NOTES.md).
            del u, v, src, dst
    payload = header() | {"quick": args.quick, "copy_tbps": copy, "rows": rows}
    write_results("batched_outer", payload, ["n", "batch", "alpha", "in_dtype", "tbps", "copy_tbps", "fraction_of_copy",
                                             "alpha_cost", "torch_best", "torch_best_tbps", "speedup_vs_torch"], args.out,
                  f"batched_outer (fp32 output); fraction_of_copy against a copy of as many bytes in the same rounds "
                  f"(copy_tbps); a 2 GiB copy {copy:.2f} TB/s")


if __name__ == "__main__":
    main()
