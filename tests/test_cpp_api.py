"""The C++ API (csrc/include/torch_wmmae/ops.h) and its CMake package, driven from pytest.

Builds the library and its ctest with CMake against the installed torch (with the CUDA kernels where a GPU
and nvcc are present), runs the ctest, installs the package, builds the example program and a program that
uses only the dispatcher against it with find_package(torch_wmmae), builds a program with the source tree
(add_subdirectory), and checks that C++ and Python give the same bits for the same inputs.
"""
import fcntl
import os
import pathlib
import re
import shutil
import subprocess

import pytest
import torch

import torch_wmmae

from conftest import NO_IMPLICIT_HALF, NVCC, REPO_ROOT

BUILD = REPO_ROOT / "build" / "cpp"
PREFIX = REPO_ROOT / "build" / "cpp-install"

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not found")


def _run(cmd, **kw):
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert result.returncode == 0, f"{' '.join(map(str, cmd))}\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result.stdout


def _with_cuda() -> bool:
    return torch.cuda.is_available() and NVCC is not None


def _toolkit_args() -> list:
    """CMake's CUDA toolkit: the one of NVCC, so that torch's CMake config and the kernels use one toolkit."""
    return [f"-DCUDAToolkit_ROOT={os.path.dirname(os.path.dirname(NVCC))}"] if NVCC else []


# torch's own CMake config needs the CUDA toolkit wherever torch is a CUDA build, even for a CPU-only library.
pytestmark = [pytestmark, pytest.mark.skipif(torch.version.cuda is not None and NVCC is None,
                                             reason="a CUDA build of torch, whose CMake config needs nvcc")]


@pytest.fixture(scope="module")
def cpp_build():
    prefix_path = torch.utils.cmake_prefix_path
    args = [f"-DCMAKE_PREFIX_PATH={prefix_path}", "-DCMAKE_BUILD_TYPE=Release"]
    args += _toolkit_args() + ([f"-DCMAKE_CUDA_COMPILER={NVCC}"] if NVCC else [])
    if _with_cuda():
        major, minor = torch.cuda.get_device_capability()
        args += ["-DTORCH_WMMAE_WITH_CUDA=ON", f"-DTORCH_CUDA_ARCH_LIST={major}.{minor}"]
    # One build at a time: pytest-xdist workers share BUILD (a second worker finds it built and only checks it).
    BUILD.mkdir(parents=True, exist_ok=True)
    with open(BUILD.parent / "cpp.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _run(["cmake", "-S", REPO_ROOT, "-B", BUILD, *args])
        _run(["cmake", "--build", BUILD, "-j", str(os.cpu_count() or 2)])
        _run(["cmake", "--install", BUILD, "--prefix", PREFIX])
    return BUILD


def _readme_device_example() -> str:
    """The CUDA code block of README's device-library section."""
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("## The device library", 1)[1]
    return re.search(r"```cuda\n(.*?)```", section, re.DOTALL)[1]


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_device_library_is_installed(cpp_build, tmp_path):
    """The installed package has the device library's headers: README's example kernel compiles against them
    alone (with PyTorch's flags against implicit half conversions), warnings as errors."""
    source = tmp_path / "example.cu"
    source.write_text(_readme_device_example())
    _run([NVCC, "-std=c++17", "-arch=sm_80", f"-I{PREFIX / 'include'}", *NO_IMPLICIT_HALF, "-Werror", "all-warnings",
          "-c", source, "-o", tmp_path / "example.o"])


def test_installed_package_has_the_python_version(cpp_build):
    """The CMake package's version is torch_wmmae.__version__ (CMakeLists.txt reads it from there)."""
    (version_file,) = PREFIX.glob("lib*/cmake/torch_wmmae/torch_wmmaeConfigVersion.cmake")
    version = re.search(r'^set\(PACKAGE_VERSION "([^"]+)"\)$', version_file.read_text(), re.MULTILINE)[1]
    assert version == torch_wmmae.__version__


def test_installed_package_requires_its_torch_release(cpp_build, tmp_path):
    """find_package(torch_wmmae) asks for the torch release the library was built against: a program configured
    with another release stops there with CMake's message naming the release, not at link or load time. (A stand-in
    Torch package of each release; the real one is used by the build tests below.)"""
    release = torch.__version__.split("+")[0]
    project = tmp_path / "project"
    project.mkdir()
    (project / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)\nproject(uses_wmmae LANGUAGES NONE)\nfind_package(torch_wmmae REQUIRED)\n")

    def configure(torch_version: str) -> subprocess.CompletedProcess:
        stand_in = tmp_path / f"torch-{torch_version}"
        stand_in.mkdir()
        (stand_in / "TorchConfig.cmake").write_text("set(TORCH_FOUND TRUE)\n")
        (stand_in / "TorchConfigVersion.cmake").write_text(
            f'set(PACKAGE_VERSION "{torch_version}")\n'
            'if(PACKAGE_VERSION VERSION_EQUAL PACKAGE_FIND_VERSION)\n'
            '  set(PACKAGE_VERSION_COMPATIBLE TRUE)\n  set(PACKAGE_VERSION_EXACT TRUE)\n'
            'elseif(PACKAGE_VERSION VERSION_GREATER PACKAGE_FIND_VERSION)\n  set(PACKAGE_VERSION_COMPATIBLE TRUE)\n'
            'endif()\n')
        return subprocess.run(["cmake", "-S", str(project), "-B", str(tmp_path / f"build-{torch_version}"),
                               f"-DCMAKE_PREFIX_PATH={PREFIX}", f"-DTorch_DIR={stand_in}"],
                              capture_output=True, text=True, timeout=120)

    same = configure(release)
    assert same.returncode == 0, same.stdout + same.stderr
    major, minor, patch = (int(x) for x in release.split(".")[:3])
    other = configure(f"{major}.{minor + 1}.{patch}")  # (newer: a plain version request would accept it)
    assert other.returncode != 0 and release in other.stderr and "Torch" in other.stderr, other.stderr


def test_installed_package_links_torch_by_its_targets(cpp_build):
    """The exported link interface names torch's imported targets (torch, torch_library), which find_dependency
    resolves to the program's own torch, and no file of the torch the library was built against."""
    (targets_file,) = PREFIX.glob("lib*/cmake/torch_wmmae/torch_wmmaeTargets.cmake")
    exported = targets_file.read_text()
    assert 'INTERFACE_LINK_LIBRARIES "torch;torch_library"' in exported
    assert os.path.dirname(torch.__file__) not in exported


def test_ctest_passes(cpp_build):
    out = _run(["ctest", "--test-dir", cpp_build, "--output-on-failure"])
    assert "100% tests passed" in out


def test_cpp_program_passes_every_check(cpp_build):
    """The program's own count: every check passed, and on a GPU machine the CUDA checks ran as well."""
    out = _run([cpp_build / "test_cpp_api"])
    counts = re.search(r"^(\d+) passed, (\d+) failed$", out, re.MULTILINE)
    assert counts, out
    passed, failed = int(counts[1]), int(counts[2])
    checks = [line for line in out.splitlines() if line.startswith(("ok  ", "FAIL"))]
    assert failed == 0 and passed == len(checks), out
    on_cuda = [line for line in checks if "on cuda:0" in line]
    if _with_cuda():
        assert on_cuda and "skip CUDA checks" not in out, out
        assert len(on_cuda) == len([line for line in checks if "on cpu" in line]) + 1, out  # + fragment_map
    else:
        assert not on_cuda and passed >= 7, out


def test_hopper_build_has_the_sm90a_kernels(cpp_build):
    """On an H100/H200 the library is built as sm_90a (9.0 -> 9.0a, as setup.py): without it the GPU would run
    the portable WMMA kernels, and the same-bits test below would not notice (both kernels give the same bits)."""
    if not _with_cuda() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an H100/H200 (compute capability 9.0) and nvcc")
    cuobjdump = os.path.join(os.path.dirname(NVCC), "cuobjdump")
    library = next(cpp_build.glob("libtorch_wmmae.so*"))
    elves = _run([cuobjdump, "--list-elf", library])
    assert "sm_90a" in elves, elves
    sass = _run([cuobjdump, "--dump-sass", "--gpu-architecture", "sm_90a", library])
    assert "corrected_gemm_sm90_kernel" in sass and "HGMMA" in sass


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_same_bits_as_python(cpp_build, tmp_path, device, seed):
    if device == "cuda" and not _with_cuda():
        pytest.skip("needs a CUDA GPU and nvcc")
    m, k, n = 33, 70, 21  # odd sizes: partial tiles on every side
    g = torch.Generator().manual_seed(seed)
    a = torch.empty(m, k).uniform_(-1, 1, generator=g)
    b = torch.randn(k, n, generator=g)
    (tmp_path / "a.bin").write_bytes(a.numpy().tobytes())
    (tmp_path / "b.bin").write_bytes(b.numpy().tobytes())
    dump = tmp_path / "cpp_result.bin"
    dump.write_bytes(b"")  # poisoned: a program that writes nothing leaves an empty file
    _run([cpp_build / "test_cpp_api", "--dump", dump, tmp_path / "a.bin", tmp_path / "b.bin", m, k, n, device])
    from_cpp = torch.frombuffer(bytearray(dump.read_bytes()), dtype=torch.float32).reshape(m, n)
    from_python = torch_wmmae.corrected_matmul(a.to(device), b.to(device), method="auto").cpu()
    assert torch.equal(from_cpp, from_python)
    # (and not a result both sides would give for any inputs: it is the product, to float32 accuracy)
    ref = a.double() @ b.double()
    assert ((from_cpp.double() - ref).norm() / ref.norm()).item() < 1e-6


def _build_against_installed_package(source: pathlib.Path, build: pathlib.Path, *cmake_args: str) -> None:
    """Configures and builds the CMake project `source` with find_package(torch_wmmae) from the installed package."""
    args = [f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path};{PREFIX}", *cmake_args]
    args += _toolkit_args()
    _run(["cmake", "-S", source, "-B", build, *args])
    _run(["cmake", "--build", build, "-j", str(os.cpu_count() or 2)])


def test_example_builds_against_the_installed_package(cpp_build, tmp_path):
    example_build = tmp_path / "example"
    _build_against_installed_package(REPO_ROOT / "examples" / "cpp", example_build)
    out = _run([example_build / "matmul_example"])
    ours = float(out.split("corrected_matmul relative error vs float64:")[1].split()[0])
    fp32 = float(out.split("torch::matmul fp32 relative error vs float64:")[1].split()[0])
    assert ours <= 4 * max(fp32, 2**-24), out


def test_program_using_only_the_dispatcher_keeps_the_library(cpp_build, tmp_path):
    """A program that calls the operators only through the dispatcher names no symbol of libtorch_wmmae.so; linked
    with --as-needed (the default of several distributions), the package's target must still keep the library,
    or the operators would not exist at run time."""
    build = tmp_path / "dispatcher_only"
    _build_against_installed_package(REPO_ROOT / "tests" / "cpp" / "dispatcher_only", build,
                                     "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--as-needed")
    out = _run([build / "dispatcher_only"])
    assert "corrected_matmul through the dispatcher: relative error" in out, out


def test_program_built_from_the_source_tree(tmp_path):
    """add_subdirectory (or FetchContent) of the repository: the program links the same target and gets the same
    include directories, the device library's included, as from the installed package. That build has the CPU
    kernels only (CMake's default), so the example program built beside it runs on the CPU, also on a GPU
    machine."""
    build = tmp_path / "from_source_tree"
    args = [f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}", f"-DTORCH_WMMAE_SOURCE={REPO_ROOT}",
            "-DCMAKE_BUILD_TYPE=Release"]
    _run(["cmake", "-S", REPO_ROOT / "tests" / "cpp" / "from_source_tree", "-B", build, *args])
    _run(["cmake", "--build", build, "-j", str(os.cpu_count() or 2)])
    out = _run([build / "from_source_tree"])
    assert float(out.split("relative error vs float64:")[1]) < 1e-6, out
    # The example program with this CPU-only library: on a GPU machine too it runs on the CPU, and says why.
    out = _run([build / "matmul_example"])
    no_kernels = "a GPU is present, but the library has no CUDA kernels"
    assert (no_kernels in out) == torch.cuda.is_available() and "cpu, 256 x 256 x 256" in out, out
    ours = float(out.split("corrected_matmul relative error vs float64:")[1].split()[0])
    assert ours < 1e-6, out


@pytest.mark.skipif(NVCC is None, reason="configuring the CUDA kernels needs nvcc")
@pytest.mark.parametrize("given", ["unset", "empty", "empty_environment", "9.0"])
def test_cmake_reads_the_arch_list_as_setup_py(tmp_path, given):
    """CMakeLists.txt's TORCH_CUDA_ARCH_LIST: an empty one (the CMake variable or the environment variable) is the
    default, 8.0 and 9.0a (sm_90a: the wgmma kernels), as unset and as in setup.py (test_package.py's
    test_cuda_arch_lists); 9.0 becomes 9.0a. Read from the configure step's own message (no build)."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_CUDA_ARCH_LIST"}
    args = [f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}", "-DTORCH_WMMAE_WITH_CUDA=ON",
            f"-DCMAKE_CUDA_COMPILER={NVCC}", *_toolkit_args()]
    if given == "empty":
        args.append("-DTORCH_CUDA_ARCH_LIST=")
    elif given == "empty_environment":
        env["TORCH_CUDA_ARCH_LIST"] = ""
    elif given != "unset":
        args.append(f"-DTORCH_CUDA_ARCH_LIST={given}")
    out = _run(["cmake", "-S", REPO_ROOT, "-B", tmp_path / "build", *args], env=env)
    want = "9.0a" if given == "9.0" else "8.0;9.0a"
    assert f"-- torch_wmmae: CUDA architectures {want}\n" in out, out[-3000:]


# (where the library is configured, TORCH_CUDA_ARCH_LIST in the environment) -> the -gencode flags of its CUDA
# sources: its own, also as a subdirectory of a project that found torch first, which leaves torch's flags for its
# own list (or this machine's default) and CMAKE_CUDA_ARCHITECTURES=OFF behind.
GENCODE_CASES = {
    "top_level_9.0+PTX": (False, "8.0;9.0+PTX", ["compute_80,code=sm_80", "compute_90a,code=sm_90a",
                                                 "compute_90,code=compute_90"]),
    "top_level_9.0a+PTX": (False, "9.0a+PTX", ["compute_90a,code=sm_90a", "compute_90,code=compute_90"]),
    "subdirectory_unset": (True, None, ["compute_80,code=sm_80", "compute_90a,code=sm_90a"]),
    "subdirectory_9.0": (True, "9.0", ["compute_90a,code=sm_90a"]),
    "subdirectory_8.6+PTX": (True, "8.6+PTX", ["compute_86,code=sm_86", "compute_86,code=compute_86"]),
}


@pytest.mark.skipif(NVCC is None, reason="configuring the CUDA kernels needs nvcc")
@pytest.mark.parametrize("case", list(GENCODE_CASES))
def test_cmake_gencode_flags_are_the_librarys_own(tmp_path, case):
    """The CUDA sources compile for the library's arch list (9.0 as sm_90a, 9.0+PTX and 9.0a+PTX with compute_90
    PTX), and WMMAE_HAS_SM90A is defined exactly where sm_90a code is built: as a subdirectory it took the parent's
    flags (torch's config adds them once per project), sm_90 without sm_90a, with WMMAE_HAS_SM90A defined (the
    wgmma kernel would trap on an H100), and without a list it refused the parent's CMAKE_CUDA_ARCHITECTURES=OFF.
    Read from the configure step's flags.make (no build)."""
    subdirectory, arch_list, want = GENCODE_CASES[case]
    env = {k: v for k, v in os.environ.items() if k != "TORCH_CUDA_ARCH_LIST"}
    if arch_list is not None:
        env["TORCH_CUDA_ARCH_LIST"] = arch_list
    args = [f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}", "-DTORCH_WMMAE_WITH_CUDA=ON",
            "-DTORCH_WMMAE_BUILD_TESTS=OFF", f"-DCMAKE_CUDA_COMPILER={NVCC}", *_toolkit_args()]
    source, library_dir = REPO_ROOT, tmp_path / "build"
    if subdirectory:
        source = tmp_path / "parent"
        source.mkdir()
        (source / "CMakeLists.txt").write_text(
            "cmake_minimum_required(VERSION 3.18)\nproject(parent LANGUAGES CXX)\nfind_package(Torch REQUIRED)\n"
            f"add_subdirectory({REPO_ROOT.as_posix()} torch_wmmae)\n")
        library_dir = library_dir / "torch_wmmae"
    _run(["cmake", "-S", source, "-B", tmp_path / "build", *args], env=env)
    flags = (library_dir / "CMakeFiles" / "torch_wmmae_shared.dir" / "flags.make").read_text()
    cuda_flags = "\n".join(line for line in flags.splitlines() if line.startswith(("CUDA_FLAGS", "CUDA_DEFINES")))
    assert re.findall(r"-gencode[= ]arch=(\S+)", cuda_flags) == want, cuda_flags
    assert ("-DWMMAE_HAS_SM90A" in cuda_flags) == ("compute_90a,code=sm_90a" in want), cuda_flags
