"""Self-check: ``python -m torch_wmmae``.

Runs every operator on fresh random data against independent references (float64 results, torch.matmul in
float32 with TF32 off, the analytic fragment tables), and the derivatives of corrected_matmul and batched_outer
(reverse and forward mode, torch.vmap) against those of the float64 products; prints a table, and exits
non-zero if any check fails.
On a GPU (with a build that has the CUDA kernels) it also times corrected_matmul against torch's float32
matmul. Without one it runs the CPU implementations on small sizes, in seconds.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import traceback

import torch

import torch_wmmae
from torch_wmmae import batched_outer, corrected_matmul, fragment_map, has_cuda_kernels

U32 = 2.0 ** -24  # float32 unit roundoff


class Report:
    def __init__(self):
        self.rows = []  # (section, check, status, detail); status in PASS / FAIL / INFO

    def add(self, section, check, ok, detail=""):
        status = "INFO" if ok is None else ("PASS" if ok else "FAIL")
        self.rows.append((section, check, status, detail))

    def run(self, section, check, fn):
        """Runs fn() -> (ok, detail); an exception is a failure."""
        try:
            ok, detail = fn()
        except Exception as exc:  # noqa: BLE001 (report every failure, keep checking)
            ok, detail = False, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            traceback.print_exc(file=sys.stdout)
        self.add(section, check, ok, detail)

    @property
    def failed(self):
        return [r for r in self.rows if r[2] == "FAIL"]

    def print_table(self):
        w0 = max(len(r[0]) for r in self.rows)
        w1 = max(len(r[1]) for r in self.rows)
        print()
        print(f"{'op':<{w0}}  {'check':<{w1}}  result  detail")
        print(f"{'-' * w0}  {'-' * w1}  ------  ------")
        for section, check, status, detail in self.rows:
            print(f"{section:<{w0}}  {check:<{w1}}  {status:<6}  {detail}")


def rel_err(out, ref):
    ref = ref.double()
    return (torch.linalg.vector_norm(out.double() - ref) / torch.linalg.vector_norm(ref)).item()


def fp32_floor(a, b, ref):
    """u * || |a||b| || / ||ab||: one rounding per product; guards against a float32 result exact by luck."""
    absprod = torch.matmul(a.double().abs(), b.double().abs())
    return U32 * (torch.linalg.vector_norm(absprod) / torch.linalg.vector_norm(ref)).item()


def slack(k: int) -> float:
    """How much larger than torch.matmul's float32 error ours may be (the test suite uses the same rules, plus
    3 for K <= 32, and documents the measurements): 1.5 for the fluctuation of two errors of the same size;
    4 for K >= 1000, where torch's float32 GEMM may sum in blocks (MKL's sgemm on the CPU keeps many SIMD
    partial sums; cuBLAS may split K), which grows its error much more slowly than one accumulator per
    output. The accuracy promised by the method, that of a float32 SIMT GEMM, is checked separately and
    strictly."""
    return 4.0 if k >= 1000 else 1.5


def simt_fp32(a, b):
    """A float32 SIMT GEMM's arithmetic: one float32 accumulator per output, a fused multiply-add per k
    (the product of two float32 values is exact in float64, then one rounding per step)."""
    a64, b64 = a.double(), b.double()
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float32, device=a.device)
    for i in range(a.shape[1]):
        acc = torch.addmm(acc.double(), a64[:, i : i + 1], b64[i : i + 1, :]).float()
    return acc


def gen_tensor(g, shape, dist, device, dtype=torch.float32):
    if dist == "N(0,1)":
        t = torch.randn(shape, generator=g, dtype=torch.float64)
    elif dist == "U(0,1)":
        t = torch.rand(shape, generator=g, dtype=torch.float64)
    else:
        t = torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1
    return t.to(dtype).to(device)


# --------------------------------------------------------------------------------------------------------
# corrected_matmul
# --------------------------------------------------------------------------------------------------------
def check_corrected_matmul(rep, device, g, size):
    m, n, k = size
    for dist in ("N(0,1)", "U(0,1)"):
        a = gen_tensor(g, (m, k), dist, device)
        b = gen_tensor(g, (k, n), dist, device)
        ref = torch.matmul(a.double(), b.double())
        err32 = rel_err(torch.matmul(a, b), ref)
        err_simt = rel_err(simt_fp32(a, b), ref)
        floor = fp32_floor(a, b, ref)
        s = slack(k)
        rep.add("corrected_matmul", f"torch fp32 {dist} {m}x{n}x{k}", None, f"rel err {err32:.2e}")
        rep.add("corrected_matmul", f"SIMT fp32 {dist} {m}x{n}x{k}", None, f"rel err {err_simt:.2e} (one accumulator, FMA)")
        for method in torch_wmmae.METHODS:
            def run(method=method):
                out = corrected_matmul(a, b, method=method)
                err = rel_err(out, ref)
                ok = out.shape == (m, n) and out.dtype == torch.float32
                ok = ok and err <= s * max(err32, floor) and err <= err_simt
                return ok, f"rel err {err:.2e} = {err / err32:.2f} x torch fp32 (limit {s:g}), {err / err_simt:.2f} x SIMT (limit 1)"

            rep.run("corrected_matmul", f"{method:<4} {dist} {m}x{n}x{k}", run)

    # Rows of a / columns of b spanning 2^41 (a = a' D, b = D^-1 b', D a diagonal of powers of two): "auto"
    # must switch to the tf32 split and stay accurate; the fp16 split is documented to lose accuracy here.
    mm, nn, kk = 128, 96, 512
    e = torch.randint(-20, 21, (kk,), generator=g).double()
    sa = torch.where(torch.rand(mm, kk, generator=g) < 0.5, -1.0, 1.0).double()
    sb = torch.where(torch.rand(kk, nn, generator=g) < 0.5, -1.0, 1.0).double()
    a = (sa * (1 + torch.rand(mm, kk, generator=g, dtype=torch.float64)) * torch.exp2(e)).float().to(device)
    b = (sb * (1 + torch.rand(kk, nn, generator=g, dtype=torch.float64)) * torch.exp2(-e)[:, None]).float().to(device)
    ref = torch.matmul(a.double(), b.double())
    err32 = rel_err(torch.matmul(a, b), ref)

    def wide():
        err = rel_err(corrected_matmul(a, b, method="auto"), ref)
        return err <= 4.0 * err32, f"rel err {err:.2e} vs fp32 {err32:.2e} (limit 4 x: 22-bit split)"

    rep.run("corrected_matmul", "auto, rows spanning 2^41", wide)

    def wide_fp16():  # (reported, not judged: the fp16 split is documented to lose accuracy here)
        err = rel_err(corrected_matmul(a, b, method="fp16"), ref)
        return None, f"rel err {err:.2e} (expected loss: use auto/tf32)"

    rep.run("corrected_matmul", "fp16, rows spanning 2^41", wide_fp16)


def time_cuda(fn, warmup=3, iters=20):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def benchmark_corrected_matmul(rep, g, size):
    m, n, k = size
    a = gen_tensor(g, (m, k), "N(0,1)", "cuda")
    b = gen_tensor(g, (k, n), "N(0,1)", "cuda")
    flops = 2.0 * m * n * k
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        t = time_cuda(lambda: torch.matmul(a, b))
        rep.add("timing", f"torch fp32 (TF32 off) {m}x{n}x{k}", None, f"{t * 1e3:.3f} ms  {flops / t / 1e12:.1f} TFLOP/s")
        torch.backends.cuda.matmul.allow_tf32 = True
        t = time_cuda(lambda: torch.matmul(a, b))
        rep.add("timing", f"torch tf32 (not fp32-accurate) {m}x{n}x{k}", None, f"{t * 1e3:.3f} ms  {flops / t / 1e12:.1f} TFLOP/s")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    for method in torch_wmmae.METHODS:
        t = time_cuda(lambda method=method: corrected_matmul(a, b, method=method))
        rep.add("timing", f"corrected_matmul {method} {m}x{n}x{k}", None, f"{t * 1e3:.3f} ms  {flops / t / 1e12:.1f} TFLOP/s")


# --------------------------------------------------------------------------------------------------------
# batched_outer
# --------------------------------------------------------------------------------------------------------
def check_batched_outer(rep, device, g):
    batch, n = 64, 48
    eye = torch.eye(n, dtype=torch.float64)
    diag = torch.eye(n, dtype=torch.bool).expand(batch, n, n)
    for dtype in (torch.float16, torch.bfloat16):
        u = gen_tensor(g, (batch, n), "N(0,1)", device, dtype)
        v = gen_tensor(g, (batch, n), "N(0,1)", device, dtype)
        prod = u.cpu().double().unsqueeze(-1) * v.cpu().double().unsqueeze(-2)  # exact in float64

        def exact(u=u, v=v, prod=prod):
            out = batched_outer(u, v).cpu()
            return torch.equal(out, prod.float()), "bitwise equal to the float64 product rounded once"

        rep.run("batched_outer", f"{str(dtype)[6:]} -> float32, alpha=0", exact)

        def with_alpha(u=u, v=v, prod=prod):
            alpha = 0.3712
            out = batched_outer(u, v, alpha=alpha).cpu()
            want = (prod + float(torch.tensor(alpha, dtype=torch.float32)) * eye).float()  # alpha is float32
            off_ok = torch.equal(out[~diag], want[~diag])
            a = want[diag].abs()
            ulp = torch.nextafter(a, torch.full_like(a, float("inf"))) - a
            d = (out[diag] - want[diag]).abs()
            ulps = (d / ulp).max().item()
            allowed = 0  # u_i v_i + alpha rounded once on the GPU (exact product plus alpha, or fmaf) and on the CPU (fmaf)
            return off_ok and ulps <= allowed, f"off-diagonal exact: {off_ok}; diagonal max {ulps:.0f} ulp (limit {allowed})"

        rep.run("batched_outer", f"{str(dtype)[6:]} -> float32, alpha!=0", with_alpha)

    u = gen_tensor(g, (batch, n), "N(0,1)", device)

    def fp32():
        out = batched_outer(u).cpu().double()
        u64 = u.cpu().double()
        ref = u64.unsqueeze(-1) * u64.unsqueeze(-2)
        worst = ((out - ref).abs() / ref.abs().clamp_min(2.0 ** -126)).max().item() / U32
        return worst <= 4, f"max {worst:.2f} u relative (limit 4 u)"

    rep.run("batched_outer", "float32 inputs", fp32)


# --------------------------------------------------------------------------------------------------------
# derivatives
# --------------------------------------------------------------------------------------------------------
def check_derivatives(rep, device, g):
    """Reverse and forward mode and torch.vmap of both ops (their C++ autograd and batching rules), against the
    same derivatives of the float64 products."""
    a, ta = (gen_tensor(g, (6, 5, 40), "N(0,1)", device) for _ in range(2))
    b, tb = (gen_tensor(g, (40, 7), "N(0,1)", device) for _ in range(2))
    u, tu = (gen_tensor(g, (6, 24), "N(0,1)", device) for _ in range(2))
    grad_out, grad_outer = gen_tensor(g, (6, 5, 7), "N(0,1)", device), gen_tensor(g, (6, 24, 24), "N(0,1)", device)
    a64, b64, ta64, tb64, u64, tu64 = (x.double() for x in (a, b, ta, tb, u, tu))
    outer64 = lambda x, y: x.unsqueeze(-1) * y.unsqueeze(-2)

    def worst(pairs):
        return max(rel_err(x, ref) for x, ref in pairs)

    def reverse():
        x, y, w = a.clone().requires_grad_(), b.clone().requires_grad_(), u.clone().requires_grad_()
        ga, gb = torch.autograd.grad(corrected_matmul(x, y), (x, y), grad_out)
        (gu,) = torch.autograd.grad(batched_outer(w), w, grad_outer)
        g64 = grad_outer.double()
        err = worst([(ga, grad_out.double() @ b64.t()), (gb, (a64.transpose(-1, -2) @ grad_out.double()).sum(0)),
                     (gu, ((g64 + g64.mT) * u64.unsqueeze(-2)).sum(-1))])
        return err < 1e-5, f"gradients of both ops: rel err {err:.2e} (limit 1e-5)"

    def forward():
        _, t = torch.func.jvp(corrected_matmul, (a, b), (ta, tb))
        _, tw = torch.func.jvp(lambda x: batched_outer(x), (u,), (tu,))
        err = worst([(t, ta64 @ b64 + a64 @ tb64), (tw, outer64(tu64, u64) + outer64(u64, tu64))])
        return err < 1e-5, f"tangents of both ops (torch.func.jvp): rel err {err:.2e} (limit 1e-5)"

    def vmapped():
        fallback = torch._C._functorch._is_vmap_fallback_enabled()
        torch._C._functorch._set_vmap_fallback_enabled(False)  # (so the rules, not a loop over the samples)
        try:
            out = torch.func.vmap(corrected_matmul, in_dims=(0, None))(a, b)
            outer = torch.func.vmap(lambda x: batched_outer(x))(u)
        finally:
            torch._C._functorch._set_vmap_fallback_enabled(fallback)
        err = worst([(out, a64 @ b64), (outer, outer64(u64, u64))])
        return err < 1e-5, f"torch.vmap of both ops (batching rules): rel err {err:.2e} (limit 1e-5)"

    rep.run("derivatives", "reverse mode", reverse)
    rep.run("derivatives", "forward mode", forward)
    rep.run("derivatives", "vmap", vmapped)


# --------------------------------------------------------------------------------------------------------
# fragment_map
# --------------------------------------------------------------------------------------------------------
def fragment_types():
    """Every WMMA fragment type of <mma.h> on sm_80+: (use, m, n, k, dtype, layout)."""
    keys = []
    for m, n, k in ((16, 16, 16), (32, 8, 16), (8, 32, 16)):
        keys += [(u, m, n, k, dt) for u in ("matrix_a", "matrix_b") for dt in ("half", "bf16", "int8", "uint8")]
        keys += [("accumulator", m, n, k, acc) for acc in ("float", "half", "int32")]
    keys += [("matrix_a", 16, 16, 8, "tf32"), ("matrix_b", 16, 16, 8, "tf32"), ("accumulator", 16, 16, 8, "float")]
    keys += [("matrix_a", 8, 8, 4, "double"), ("matrix_b", 8, 8, 4, "double"), ("accumulator", 8, 8, 4, "double")]
    out = []
    for key in keys:
        layouts = [None] if key[0] == "accumulator" else ["row_major", "col_major"]
        out += [(*key, layout) for layout in layouts]
    return out


def _covers_tile(t, use, m, n, k):
    rows, cols = {"matrix_a": (m, k), "matrix_b": (k, n), "accumulator": (m, n)}[use]
    counts = torch.zeros(rows * cols, dtype=torch.int64)
    idx = t[..., 0].long() * cols + t[..., 1].long()
    if (t < 0).any() or (t[..., 0] >= rows).any() or (t[..., 1] >= cols).any():
        return False
    counts.index_add_(0, idx.reshape(-1), torch.ones(idx.numel(), dtype=torch.int64))
    return bool((counts == counts[0]).all() and counts[0] > 0)


def check_fragment_map_cpu(rep):
    def table2():
        # Table 2 of Ootomo & Yokota (sm_70 matrix_a col_major, column-major indices i + 16 j): lane 0 as
        # printed in the paper, the starts of lanes 4 and 16, and the paper's structure: lanes 1..3 continue
        # lane 0 one column over (+16), lanes l and l|8 hold the same elements.
        t = fragment_map("matrix_a", 16, 16, 16, "half", "col_major", arch=70).long()
        idx = t[..., 0] + 16 * t[..., 1]
        lane0 = [0, 1, 2, 3, 64, 65, 66, 67, 128, 129, 130, 131, 192, 193, 194, 195]
        ok = idx[0].tolist() == lane0
        ok &= idx[4, :5].tolist() == [8, 9, 10, 11, 72] and idx[16, :4].tolist() == [4, 5, 6, 7]
        ok &= all(idx[l].tolist() == [v + 16 * l for v in lane0] for l in (1, 2, 3))
        ok &= all(torch.equal(idx[l], idx[l | 8]) for l in range(32))
        return ok, "lanes 0, 4, 16 as in the paper; l and l|8 equal"

    rep.run("fragment_map", "arch=70 matrix_a col_major = paper's Table 2", table2)

    def coverage():
        bad = [f for f in fragment_types() if not _covers_tile(fragment_map(*f, arch=80), *f[:4])]
        return not bad, f"{len(fragment_types())} fragment types, each tile element held equally often" + (
            f"; bad: {bad[:3]}" if bad else ""
        )

    rep.run("fragment_map", "arch=80 tables cover their tiles", coverage)


def check_fragment_map_gpu(rep):
    cap = torch.cuda.get_device_capability()
    arch = cap[0] * 10 + cap[1]
    if arch not in (80, 86, 89, 90):
        rep.add("fragment_map", f"measured on sm_{arch}", None, "no analytic table for this GPU; skipped")
        return

    def measured():
        mismatches, holes = [], []
        types = fragment_types()
        for f in types:
            got = fragment_map(*f, device="cuda").cpu()
            if (got == -1).any():
                holes.append(f)
            if not torch.equal(got, fragment_map(*f, arch=arch)):
                mismatches.append(f)
        detail = f"{len(types)} fragment types; {len(mismatches)} differ, {len(holes)} with load/store disagreement"
        if mismatches:
            detail += f"; first: {mismatches[0]}"
        return not mismatches and not holes, detail

    rep.run("fragment_map", f"measured on sm_{arch} == arch={arch} table", measured)


# --------------------------------------------------------------------------------------------------------
def _seed(text: str) -> int:
    """An argparse type: a seed torch.Generator.manual_seed takes."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer from 0 to 2^63 - 1, got {text!r}") from None
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"must be from 0 to 2^63 - 1, got {value}")
    return value


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_wmmae", description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=_seed, default=None, help="seed of the random inputs, 0 to 2^63 - 1 "
                        "(default: fresh)")
    parser.add_argument("--no-bench", action="store_true", help="skip the GPU timings")
    args = parser.parse_args(argv)

    seed = args.seed if args.seed is not None else torch.seed() % 2**31
    g = torch.Generator().manual_seed(seed)
    cuda_build = has_cuda_kernels()
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), torch_wmmae {torch_wmmae.__version__}")
    print(f"torch_wmmae build: {'with CUDA kernels' if cuda_build else 'CPU-only (no CUDA kernels)'}")
    if torch.cuda.is_available() and cuda_build:
        device = "cuda"
        print(f"device: {torch.cuda.get_device_name()} (sm_{''.join(map(str, torch.cuda.get_device_capability()))})")
    else:
        device = "cpu"
        why = "GPU present but this build has no CUDA kernels" if torch.cuda.is_available() else "no CUDA GPU"
        print(f"device: CPU ({why}): the CPU implementations, small sizes")
    print(f"seed: {seed}")

    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # the float32 baseline is true float32
    rep = Report()
    try:
        size = (2048, 2048, 2048) if device == "cuda" else (96, 80, 1024)
        check_corrected_matmul(rep, device, g, size)
        check_batched_outer(rep, device, g)
        check_derivatives(rep, device, g)
        if device == "cuda":
            check_fragment_map_gpu(rep)
        check_fragment_map_cpu(rep)
        if device == "cuda" and not args.no_bench:
            benchmark_corrected_matmul(rep, g, (2048, 2048, 2048))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved

    rep.print_table()
    if rep.failed:
        print(f"\n{len(rep.failed)} check(s) FAILED")
        return 1
    print(f"\nall {sum(r[2] == 'PASS' for r in rep.rows)} checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
