"""What ptxas made of the kernels: registers, stack (spill) bytes, tensor-core instructions and local-memory
accesses per kernel, and for each kernel with a loop around its tensor-core instructions (the stage loop of a
GEMM) that loop's length and the local-memory accesses inside it, where a spill costs on every iteration.

    python tools/sass_report.py [torch_wmmae/_C*.so | file.cubin] [--out benchmarks/results/sass.md] [--commit REV]

Reads `cuobjdump -sass` and `cuobjdump -res-usage` of the binary (CUDA toolkit), needs no GPU.
"""
from __future__ import annotations

import argparse
import datetime
import glob
import os
import re
import shutil
import subprocess
import sys

TENSOR_CORE_OPS = ("HGMMA", "HMMA")
LOCAL_OPS = ("LDL", "STL")

_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)")
_ARCH = re.compile(r"^\s*arch = (sm_\w+)")
_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);")
_BACKWARD_TARGET = re.compile(r"\bBRA\b[^;]*?\b(0x[0-9a-f]+)")
_RES_FUNCTION = re.compile(r"^\s*Function\s+(\S+?):?\s*$")
_RES_FIELD = re.compile(r"(REG|STACK|SHARED|LOCAL):(\d+)")


def opcode(text: str) -> str:
    """The mnemonic of one SASS instruction text, without its predicate (`@P0`, `@!PT`)."""
    words = text.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0] if words else ""


def _is(text: str, mnemonics) -> bool:
    op = opcode(text)
    return any(op == m or op.startswith(m + ".") for m in mnemonics)


def _kernel_lines(text: str, function: re.Pattern):
    """(arch, mangled kernel name, line) for each line of a cuobjdump listing that follows a kernel's header
    (`function`'s match) in an ELF section of that arch (`arch = sm_..`)."""
    arch, name = "?", None
    for line in text.splitlines():
        m = _ARCH.match(line)
        if m:
            arch, name = m.group(1), None
            continue
        m = function.match(line)
        if m:
            name = m.group(1)
        elif name is not None:
            yield arch, name, line


def parse_sass(text: str) -> dict[tuple[str, str], list[tuple[int, str]]]:
    """{(arch, mangled kernel name): [(address, instruction text), ...]} of `cuobjdump -sass` output."""
    kernels: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for arch, name, line in _kernel_lines(text, _FUNCTION):
        m = _INSTRUCTION.search(line)
        if m:
            kernels.setdefault((arch, name), []).append((int(m.group(1), 16), m.group(2).strip()))
    return kernels


def parse_res_usage(text: str) -> dict[tuple[str, str], dict[str, int]]:
    """{(arch, mangled kernel name): {"REG": .., "STACK": .., "SHARED": .., "LOCAL": ..}} of `cuobjdump -res-usage`."""
    usage: dict[tuple[str, str], dict[str, int]] = {}
    for arch, name, line in _kernel_lines(text, _RES_FUNCTION):
        if "REG:" in line and (arch, name) not in usage:
            usage[(arch, name)] = {k: int(v) for k, v in _RES_FIELD.findall(line)}
    return usage


def tensor_core_loop(code: list[tuple[int, str]]) -> list[tuple[int, str]] | None:
    """The innermost loop around tensor-core instructions: of the ranges [target, branch] that a backward branch
    closes, the shortest that holds a tensor-core instruction (None: there is none)."""
    best = None
    for address, text in code:
        if not _is(text, ("BRA",)):
            continue
        m = _BACKWARD_TARGET.search(text)
        if not m or int(m.group(1), 16) >= address:
            continue
        start = int(m.group(1), 16)
        body = [(a, t) for a, t in code if start <= a <= address]
        if any(_is(t, TENSOR_CORE_OPS) for _, t in body) and (best is None or len(body) < len(best)):
            best = body
    return best


def demangle(names: list[str]) -> dict[str, str]:
    if not names or shutil.which("c++filt") is None:
        return {n: n for n in names}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return dict(zip(names, out.splitlines()))


def short_name(demangled: str) -> str:
    """`wmmae_ops::sm90::corrected_gemm_sm90_kernel<true, ...>(GemmArgs, ...)` -> `corrected_gemm_sm90_kernel<true,
    ...>`: namespaces and the parameter list dropped."""
    name = re.sub(r"\((?:[^()]|\([^()]*\))*\)\s*$", "", demangled)  # the parameter list
    name = re.sub(r"\(anonymous namespace\)::", "", name)
    head, sep, args = name.partition("<")
    return head.split("::")[-1] + sep + re.sub(r"\b\w+::", "", args)


def summarize(sass: dict[tuple[str, str], list], usage: dict[tuple[str, str], dict[str, int]]) -> list[dict]:
    names = demangle(sorted({name for _, name in sass}))
    rows = []
    for arch, mangled in sorted(sass, key=lambda key: (short_name(names[key[1]]), key[0])):
        code = sass[(arch, mangled)]
        loop = tensor_core_loop(code)
        res = usage.get((arch, mangled), {})
        rows.append({
            "kernel": short_name(names[mangled]),
            "arch": arch,
            "registers": res.get("REG"),
            "stack_bytes": res.get("STACK"),
            "instructions": len(code),
            "tensor_core": sum(_is(t, TENSOR_CORE_OPS) for _, t in code),
            "local": sum(_is(t, LOCAL_OPS) for _, t in code),
            "loop": len(loop) if loop else None,
            "loop_local": sum(_is(t, LOCAL_OPS) for _, t in loop) if loop else None,
        })
    return rows


def markdown(rows: list[dict], header: str) -> str:
    lines = [header, "",
             "| kernel | arch | registers | stack bytes | instructions | HGMMA/HMMA | LDL/STL | tensor-core loop | LDL/STL in it |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    dash = "-"
    for r in rows:
        loop = dash if r["loop"] is None else r["loop"]
        loop_local = dash if r["loop_local"] is None else r["loop_local"]
        lines.append(f"| `{r['kernel']}` | {r['arch']} | {r['registers']} | {r['stack_bytes']} | {r['instructions']} | "
                     f"{r['tensor_core']} | {r['local']} | {loop} | {loop_local} |")
    return "\n".join(lines) + "\n"


def _run(args: list[str]) -> str:
    return subprocess.run(args, capture_output=True, text=True, check=True).stdout


def find_cuobjdump() -> str | None:
    """cuobjdump on PATH, else beside nvcc or in the CUDA toolkit ($CUDA_HOME, $CUDA_PATH, /usr/local/cuda);
    None if absent."""
    found = shutil.which("cuobjdump")
    nvcc = shutil.which("nvcc")
    bins = [os.path.dirname(nvcc) if nvcc else None] + [
        os.path.join(home, "bin") if home else None
        for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda")]
    for directory in bins:
        if found is None and directory and os.path.isfile(os.path.join(directory, "cuobjdump")):
            found = os.path.join(directory, "cuobjdump")
    return found


def binary_rows(binary: str, cuobjdump: str = "cuobjdump") -> list[dict]:
    """summarize() of a shared library's or cubin's listings."""
    return summarize(parse_sass(_run([cuobjdump, "-sass", binary])), parse_res_usage(_run([cuobjdump, "-res-usage", binary])))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("binary", nargs="?", help="a shared library or cubin (default: torch_wmmae/_C*.so)")
    parser.add_argument("--out", help="also write the markdown table here")
    parser.add_argument("--commit", help="the source commit to name in the header (default: git rev-parse HEAD; "
                        "give it where the checkout's git metadata is not that of the sources, e.g. a copied tree)")
    args = parser.parse_args(argv)
    binary = args.binary or next(iter(sorted(glob.glob(os.path.join("torch_wmmae", "_C*.so")))), None)
    if binary is None:
        parser.error("no binary given and no torch_wmmae/_C*.so built here")
    cuobjdump = find_cuobjdump()
    if cuobjdump is None:
        parser.error("cuobjdump not found (CUDA toolkit: PATH, $CUDA_HOME or /usr/local/cuda)")
    rows = binary_rows(binary, cuobjdump)
    version = _run(["nvcc", "--version"]).strip().splitlines()[-1] if shutil.which("nvcc") else "nvcc not found"
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                           text=True).stdout.strip()
    header = (f"# SASS of `{os.path.basename(binary)}`\n\n{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
              f"source at commit {commit or '?'}, {version}. Made by `tools/sass_report.py`. Stack bytes hold spills (and any local arrays); the "
              "tensor-core loop is the innermost loop around HGMMA/HMMA (a GEMM's stage loop), where a local-memory "
              "access costs on every iteration.")
    text = markdown(rows, header)
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
