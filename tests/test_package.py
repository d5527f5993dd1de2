"""The package surface: exports, schemas, type annotations, the build flavour, the `python -m torch_wmmae` check,
the import error of a library that does not load, the CUDA sources compiled without sm_90a, the source distribution."""
from __future__ import annotations

import inspect
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import textwrap

import pytest
import torch

import torch_wmmae

from conftest import NVCC, REPO_ROOT, child_process_env, requires_cuda

SCHEMAS = {
    "corrected_matmul": 'wmmae::corrected_matmul(Tensor a, Tensor b, str method="auto") -> Tensor',
    "batched_outer": "wmmae::batched_outer(Tensor u, Tensor? v=None, float alpha=0., ScalarType? out_dtype=None) -> Tensor",
    "fragment_map": "wmmae::fragment_map(str use, int m, int n, int k, str dtype, str? layout=None, int? arch=None, "
    "Device? device=None) -> Tensor",
}


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_schema(name):
    packet = getattr(torch.ops.wmmae, name)
    assert packet.overloads() == ["default"]
    assert str(packet.default._schema) == SCHEMAS[name]


def test_exports():
    for name in ("corrected_matmul", "batched_outer", "fragment_map", "has_cuda_kernels", "get_include", "METHODS"):
        assert name in torch_wmmae.__all__ and hasattr(torch_wmmae, name)
    assert torch_wmmae.METHODS == ("auto", "fp16", "tf32")
    assert isinstance(torch_wmmae.__version__, str)


def test_build_takes_the_package_version():
    """setup.py's version is torch_wmmae.__version__ (its one definition; test_cpp_api.py checks CMake's)."""
    proc = subprocess.run([sys.executable, "setup.py", "--version"], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=120, env=child_process_env(TORCH_WMMAE_CPU_ONLY="1"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == torch_wmmae.__version__


# TORCH_CUDA_ARCH_LIST -> (torch's arch list, extra nvcc flags) of setup.py's cuda_arch_list.
ARCH_LISTS = {
    "9.0": (["9.0a"], []),
    "8.0;9.0": (["8.0", "9.0a"], []),
    "8.0 8.6+PTX 9.0": (["8.0", "8.6+PTX", "9.0a"], []),
    # sm_90a code and portable compute_90 PTX (torch's 9.0a+PTX would be compute_90a PTX, which later GPUs cannot
    # run), in -gencode flags for the whole list: torch adds none of its own beside them
    "9.0+PTX": (["9.0a"], ["-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_90,code=compute_90"]),
    "8.0;8.6+PTX;9.0+PTX": (["8.0", "8.6+PTX", "9.0a"],
                            ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_86,code=sm_86",
                             "-gencode=arch=compute_86,code=compute_86", "-gencode=arch=compute_90a,code=sm_90a",
                             "-gencode=arch=compute_90,code=compute_90"]),
    "9.0a": (["9.0a"], []),
    "9.0a+PTX": (["9.0a"], ["-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_90,code=compute_90"]),
    "": (["8.0", "9.0a"], []),  # set but empty: the default, as unset
}


def _from_setup_py(code: str, stdin: str = ""):
    """What `code` prints as JSON (its last line), run in a child process with setup.py's functions in `setup` (the
    script read with --version, CPU-only: it builds nothing), json and sys imported, and `or_refusal(fn, *args)`:
    fn's result, or the message of setup.py's refusal (its sys.exit)."""
    prologue = textwrap.dedent("""
        import json, runpy, sys
        sys.argv = ["setup.py", "--version"]
        setup = runpy.run_path("setup.py")
        def or_refusal(fn, *args):
            try:
                return fn(*args)
            except SystemExit as refusal:
                return str(refusal)
    """)
    proc = subprocess.run([sys.executable, "-c", prologue + textwrap.dedent(code)], cwd=REPO_ROOT, input=stdin,
                          capture_output=True, text=True, timeout=120, env=child_process_env(TORCH_WMMAE_CPU_ONLY="1"))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_cuda_arch_lists():
    """setup.py's reading of TORCH_CUDA_ARCH_LIST: 9.0 becomes 9.0a (the wgmma kernels), 9.0+PTX keeps PTX that
    newer GPUs can run, an empty value is the default, and a named architecture or "native" is refused with a
    message (torch would expand it after the 9.0a rewrite, and an H100 would run the portable kernels)."""
    refused = ("Hopper", "native", "9", "8.0;Ampere")
    got = _from_setup_py("""
        print(json.dumps({spec: or_refusal(setup["cuda_arch_list"], spec) for spec in json.loads(sys.stdin.read())}))
    """, stdin=json.dumps([*ARCH_LISTS, *refused]))
    for spec, (archs, flags) in ARCH_LISTS.items():
        assert got[spec] == [archs, flags], spec
    for spec in refused:
        assert isinstance(got[spec], str) and "must be compute capabilities" in got[spec], (spec, got[spec])


def test_cpu_only_switch_takes_0_or_1():
    """TORCH_WMMAE_CPU_ONLY=1 skips the CUDA sources, 0 or unset builds them where torch and nvcc can; another value
    (such as "true") is refused with a message rather than read as 0."""
    refused = ("true", "yes", "2", " 1")
    got = _from_setup_py("""
        import os
        def read(value):
            os.environ["TORCH_WMMAE_CPU_ONLY"] = value
            return or_refusal(setup["want_cuda"])
        print(json.dumps({value: read(value) for value in json.loads(sys.stdin.read())}))
    """, stdin=json.dumps(["1", "0", "", *refused]))
    assert got["1"] is False
    assert isinstance(got["0"], bool) and got["0"] == got[""]
    for value in refused:
        assert isinstance(got[value], str) and "must be 1" in got[value] and repr(value) in got[value], (value, got)


def _reads_sm90a_switch(path: pathlib.Path, seen: set) -> bool:
    """Whether path or a header it includes (of ours, by quotes) tests WMMAE_HAS_SM90A."""
    seen.add(path)
    text = path.read_text()
    headers = (path.parent / name for name in re.findall(r'^#include "([^"]+)"', text, re.MULTILINE))
    return "WMMAE_HAS_SM90A" in text or any(
        _reads_sm90a_switch(h.resolve(), seen) for h in headers if h.resolve() not in seen)


# The CUDA sources whose code depends on whether the build has sm_90a code.
SM90A_DEPENDENT_SOURCES = sorted(p.name for p in (REPO_ROOT / "csrc" / "ops").glob("*.cu")
                                 if _reads_sm90a_switch(p.resolve(), set()))


@pytest.fixture(scope="module")
def nvcc_command_without_sm_90a():
    """nvcc's command line (all but the source) of a build for GPUs other than the H100/H200: TORCH_CUDA_ARCH_LIST
    "8.0" (no 9.0: no sm_90a code, WMMAE_HAS_SM90A not defined), setup.py's flags and torch's, compute_80 PTX
    (the device code compiled, ptxas left out: a few seconds less per unit)."""
    from torch.utils import cpp_extension

    archs, flags = _from_setup_py("""
        archs, arch_flags = setup["cuda_arch_list"]("8.0")
        print(json.dumps([archs, setup["nvcc_flags"](archs, arch_flags)]))
    """)
    assert archs == ["8.0"] and "-DWMMAE_HAS_SM90A" not in flags
    gencode = ["-gencode=arch=compute_80,code=compute_80"]
    includes = [f"-I{path}" for path in cpp_extension.include_paths(device_type="cuda")]
    includes += [f"-I{sysconfig.get_paths()['include']}", f"-I{REPO_ROOT / 'csrc'}"]
    return [NVCC, "-cuda", *cpp_extension.COMMON_NVCC_FLAGS, *flags, *gencode, *includes]


@pytest.mark.skipif(NVCC is None or torch.version.cuda is None, reason="needs nvcc and a CUDA build of torch")
@pytest.mark.parametrize("source", SM90A_DEPENDENT_SOURCES)
def test_cuda_sources_compile_without_sm_90a(nvcc_command_without_sm_90a, source):
    """A build for GPUs other than the H100/H200 compiles: each CUDA source whose code depends on WMMAE_HAS_SM90A
    through nvcc's front end (-cuda: the whole unit parsed, the host side generated; a fraction of a compile) with
    that build's flags. (Before session 118 the host side of corrected_matmul used two of the sm_90a path's helpers
    outside their #ifdef, and such a build stopped there; the builds that the tests run all have 9.0.) Nor does
    it warn about our code."""
    assert "corrected_matmul_cuda.cu" in SM90A_DEPENDENT_SOURCES  # (the walk through the includes finds the switch)
    command = nvcc_command_without_sm_90a + [str(REPO_ROOT / "csrc" / "ops" / source), "-o", os.devnull]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[:4000]  # (the first errors: the later ones follow from them)
    ours = [line for line in result.stderr.splitlines() if "warning" in line and "csrc/" in line]
    assert not ours, "\n".join(ours)  # (e.g. sm_90a-only helpers left unused: #177-D)


def _same_headers(include_dir: pathlib.Path) -> None:
    """include_dir/wmmae holds the device library exactly: every csrc/wmmae header, byte for byte, nothing else."""
    source = {p.name: p.read_bytes() for p in (REPO_ROOT / "csrc" / "wmmae").glob("*.hpp")}
    shipped = {p.name: p.read_bytes() for p in (include_dir / "wmmae").iterdir()}
    assert "wmmae.hpp" in source and shipped == source


def test_get_include_holds_the_device_library():
    _same_headers(pathlib.Path(torch_wmmae.get_include()))


def test_has_cuda_kernels_is_bool():
    assert isinstance(torch_wmmae.has_cuda_kernels(), bool)


def test_cpu_kernels_registered():
    for name in SCHEMAS:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"wmmae::{name}", "CPU")


@requires_cuda
@pytest.mark.skipif(os.environ.get("TORCH_WMMAE_CPU_ONLY") == "1", reason="built CPU-only on purpose")
@pytest.mark.gpu
def test_gpu_machine_has_cuda_kernels():
    """On a GPU machine the CUDA kernels must have been built (else every CUDA test would be meaningless)."""
    assert torch_wmmae.has_cuda_kernels()
    for name in SCHEMAS:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"wmmae::{name}", "CUDA")


def test_self_check_module_runs():
    """`python -m torch_wmmae` runs its checks and exits 0."""
    proc = subprocess.run(
        [sys.executable, "-m", "torch_wmmae"], capture_output=True, text=True, timeout=600, env=child_process_env()
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "torch" in proc.stdout and "PASS" in proc.stdout and "FAIL" not in proc.stdout


@pytest.mark.parametrize("seed", ["18446744073709551616", "-1", "x"])
def test_self_check_refuses_a_bad_seed(seed):
    """A seed torch.Generator cannot take is a usage error (exit status 2, the option named), not a traceback."""
    proc = subprocess.run([sys.executable, "-m", "torch_wmmae", "--no-bench", "--seed", seed], capture_output=True,
                          text=True, timeout=300, env=child_process_env())
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "error: argument --seed: must be" in proc.stderr and "Traceback" not in proc.stderr


def test_build_without_torch_says_to_turn_off_build_isolation():
    """pip's isolated build runs setup.py in a fresh environment without torch (pyproject.toml does not ask for
    one: it would fetch a torch other than the one the extension must match). setup.py stops with what to do."""
    script = ("import runpy, sys; sys.modules['torch'] = None; sys.argv = ['setup.py', '--version']; "
              "runpy.run_path('setup.py', run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "pip install --no-build-isolation ." in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    tomllib = pytest.importorskip("tomllib")  # (Python 3.11+)
    requires = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    assert requires and not any(r.startswith("torch") for r in requires), requires


def test_api_is_typed():
    """The package says it is typed (PEP 561: a py.typed marker beside its modules), so every public function
    annotates each parameter and its result."""
    assert (pathlib.Path(torch_wmmae.__file__).parent / "py.typed").is_file()
    functions = [f for f in map(lambda name: getattr(torch_wmmae, name), torch_wmmae.__all__) if inspect.isfunction(f)]
    assert len(functions) == 5
    for f in functions:
        signature = inspect.signature(f)
        assert signature.return_annotation is not inspect.Signature.empty, f.__name__
        for p in signature.parameters.values():
            assert p.annotation is not inspect.Parameter.empty, f"{f.__name__}: {p.name}"


# What a source distribution must hold: the build's files, the CMake package, and the test suite with what its
# tests run or read (MANIFEST.in says the same to setuptools). CI's entry point and git's files stay out.
SDIST_DIRS = ("csrc", "cmake", "torch_wmmae", "tests", "examples", "benchmarks", "tools")
SDIST_TOP_FILES = ("setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "CMakeLists.txt")
BUILD_OUTPUTS = (".so", ".o", ".pyc")


def source_files() -> set:
    """The files of SDIST_DIRS and SDIST_TOP_FILES in this tree, less build outputs and caches."""
    files = {name for name in SDIST_TOP_FILES if (REPO_ROOT / name).is_file()}
    for folder in SDIST_DIRS:
        for path in (REPO_ROOT / folder).rglob("*"):
            rel = path.relative_to(REPO_ROOT)
            if path.is_file() and not path.name.endswith(BUILD_OUTPUTS) and not any(
                    part in ("__pycache__", ".pytest_cache", ".hypothesis") for part in rel.parts):
                files.add(rel.as_posix())
    return files


def test_source_distribution_holds_the_sources_and_builds(tmp_path):
    """`setup.py sdist` packs every source file (the build reads any header under csrc/; the tests read the
    examples, tools and committed results) and no build output or test cache, and the extension builds from the unpacked
    sdist, carries the device library's headers, and runs (and, being CPU-only, says so when asked for a GPU). The
    build is CPU-only to keep the test short: the file check covers the CUDA sources."""
    # From a copy of those files: setuptools also packs whatever an earlier build's egg-info lists.
    checkout = tmp_path / "checkout"
    files = source_files()
    assert "csrc/wmmae/wmmae.hpp" in files and "MANIFEST.in" in files
    for name in files:
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / name, checkout / name)
    # The caches a test run leaves in a working tree (git ignores them; MANIFEST.in's graft would not).
    caches = ["tests/.hypothesis/constants/0123abcd", "tests/.pytest_cache/v/cache/lastfailed", ".pytest_cache/README.md"]
    for name in caches:
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).write_text("cache")
    env = child_process_env(TORCH_WMMAE_CPU_ONLY="1")
    dist = tmp_path / "dist"
    proc = subprocess.run([sys.executable, "setup.py", "-q", "sdist", "--dist-dir", str(dist)], cwd=checkout,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (archive,) = dist.glob("torch_wmmae-*.tar.gz")
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        top = members[0].name.split("/")[0]
        packed = {m.name.split("/", 1)[1] for m in members}
        tar.extractall(tmp_path, filter="data")
    missing = files - packed
    assert not missing, f"not in the sdist: {sorted(missing)}"
    built = [name for name in packed if name.endswith(BUILD_OUTPUTS) or name.startswith("build/")]
    assert not built, f"build outputs in the sdist: {built}"
    cached = [name for name in packed if ".hypothesis" in name or ".pytest_cache" in name]
    assert not cached, f"test caches in the sdist: {cached}"

    # Built as an install would lay it out (packages, their data and the extension in one tree), away from the
    # sources: get_include() must find the headers the package carries.
    source, lib = tmp_path / top, tmp_path / "lib"
    proc = subprocess.run([sys.executable, "setup.py", "-q", "build", "--build-lib", str(lib)], cwd=source, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    _same_headers(lib / "torch_wmmae" / "include")
    check = textwrap.dedent(f"""
        import torch, torch_wmmae
        assert torch_wmmae.__file__.startswith({str(lib)!r}), torch_wmmae.__file__
        assert torch_wmmae.get_include() == {str(lib / 'torch_wmmae' / 'include')!r}, torch_wmmae.get_include()
        g = torch.Generator().manual_seed(5)
        a, b = torch.rand(17, 33, generator=g), torch.rand(33, 9, generator=g)
        out, ref = torch_wmmae.corrected_matmul(a, b), (a.double() @ b.double()).float()
        assert out.shape == (17, 9) and torch.allclose(out, ref, rtol=1e-6, atol=1e-6), (out - ref).abs().max()
        # A CPU-only build says so when asked to measure a GPU (CI's own build has the CUDA kernels, where
        # test_bad_inputs.py's test of this message skips).
        assert torch_wmmae.has_cuda_kernels() is False
        try:
            torch_wmmae.fragment_map("matrix_a", 16, 16, 16, "half", "row_major", device="cuda:0")
        except RuntimeError as e:
            assert "this build of torch_wmmae has no CUDA kernels" in str(e), e
        else:
            raise AssertionError("fragment_map measured a GPU without CUDA kernels")
    """)
    proc = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(lib)})
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_a_library_built_against_another_torch_gets_a_clear_import_error(tmp_path):
    """An operator library that does not load (here one with a symbol no library defines, as one built
    against another torch has) makes `import torch_wmmae` say so, name this process's torch and how to
    rebuild, and chain the loader's error."""
    package = tmp_path / "torch_wmmae"
    shutil.copytree(pathlib.Path(torch_wmmae.__file__).parent, package,
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    source = tmp_path / "stale.c"
    source.write_text("extern void wmmae_symbol_of_another_torch(void);\n"
                      "void *PyInit__C(void) { wmmae_symbol_of_another_torch(); return 0; }\n")
    library = package / ("_C" + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True, timeout=120)
    proc = subprocess.run([sys.executable, "-c", "import torch_wmmae"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert proc.returncode != 0
    message = proc.stderr.strip().splitlines()[-1]
    assert message.startswith("ImportError: torch_wmmae: the operator library torch_wmmae/_C did not load"), proc.stderr
    for part in ("undefined symbol: wmmae_symbol_of_another_torch", f"torch {torch.__version__} in",
                 "pip install --no-build-isolation -e ."):
        assert part in message, message
    assert "The above exception was the direct cause" in proc.stderr
