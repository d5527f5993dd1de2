"""Build torch_wmmae._C: the wmmae operator library (C++ CPU kernels, CUDA kernels when possible).

Install against the torch that is already installed: pip install --no-build-isolation .
CUDA sources are built whenever torch was built with CUDA and nvcc is found; a GPU is not needed.
Architectures: TORCH_CUDA_ARCH_LIST when set and not empty, otherwise DEFAULT_CUDA_ARCHS; 9.0 is built as
9.0a (see cuda_arch_list).
Set TORCH_WMMAE_CPU_ONLY=1 to skip the CUDA sources (faster builds while working on CPU code).
"""
import glob
import os
import re
import sys

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

try:
    from torch.utils import cpp_extension
except ImportError:  # (pip's build isolation: a fresh environment, without the torch the build must match)
    sys.exit("torch_wmmae builds against the torch installed where it will run, which pip's build isolation "
             "hides. Install torch first, then: pip install --no-build-isolation .")

# sm_80 and sm_90: the kernels use bf16/tf32 fragments (sm_80+); the device library itself also compiles
# for sm_75 (tests/test_device_library.py checks that).
DEFAULT_CUDA_ARCHS = "8.0;9.0"

ROOT = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(ROOT, "csrc")


def package_version() -> str:
    """torch_wmmae.__version__, the one definition (CMakeLists.txt reads it too), read without importing."""
    with open(os.path.join(ROOT, "torch_wmmae", "__init__.py")) as f:
        return re.search(r'^__version__ = "([^"]+)"$', f.read(), re.MULTILINE)[1]


ARCH_ENTRY = re.compile(r"^\d+\.\d+a?(\+PTX)?$")


def cuda_arch_list(spec: str) -> tuple:
    """(torch's arch list, extra nvcc flags) for a TORCH_CUDA_ARCH_LIST value (empty: DEFAULT_CUDA_ARCHS).

    9.0 is built as 9.0a: Hopper's own instructions (wgmma, which the fp16 corrected GEMM uses) exist only in
    sm_90a code, which runs on compute capability 9.0 (H100, H200). 9.0+PTX (and 9.0a+PTX) is sm_90a code plus
    compute_90 PTX: torch would write compute_90a PTX for 9.0a+PTX, which no later GPU can run. Torch's arch list cannot say
    that, and torch adds no -gencode flags of its own where nvcc's flags hold one, so the extra flags are then
    the -gencode flags of the whole list. Named architectures ("Hopper") and "native" are refused: torch expands
    them after this point, and 9.0 would then miss sm_90a."""
    archs, ptx_90 = [], False
    for entry in (spec.replace(" ", ";").split(";") if spec.strip() else DEFAULT_CUDA_ARCHS.split(";")):
        if not entry:
            continue
        if not ARCH_ENTRY.match(entry):
            sys.exit(f"torch_wmmae: TORCH_CUDA_ARCH_LIST entries must be compute capabilities such as 8.0, 9.0 or "
                     f"8.6+PTX, got {entry!r} in {spec!r}")
        if entry in ("9.0+PTX", "9.0a+PTX"):  # (compute_90 PTX for both: compute_90a PTX runs on no later GPU)
            archs.append("9.0a")
            ptx_90 = True
        elif entry == "9.0":
            archs.append("9.0a")
        else:
            archs.append(entry)
    if not ptx_90:
        return archs, []
    extra_flags = []
    for arch in archs:
        number = arch.replace("+PTX", "").replace(".", "")
        extra_flags.append(f"-gencode=arch=compute_{number},code=sm_{number}")
        if arch.endswith("+PTX"):
            extra_flags.append(f"-gencode=arch=compute_{number},code=compute_{number}")
    return archs, extra_flags + ["-gencode=arch=compute_90,code=compute_90"]


def nvcc_flags(archs: list, arch_flags: list) -> list:
    """Our nvcc flags for cuda_arch_list's result, beside torch's own (which add the -gencode flags of the arch list
    where arch_flags has none). tests/test_package.py compiles the CUDA sources with them."""
    # No --use_fast_math: the error-corrected split relies on IEEE rounding of every operation.
    flags = ["-O3", "-std=c++17", "-lineinfo", "-DWMMAE_WITH_CUDA", *arch_flags]
    if any(a.startswith("9.0a") for a in archs):
        flags.append("-DWMMAE_HAS_SM90A")  # the host may launch the wgmma kernel on sm_90 devices
    return flags


def torch_release() -> str:
    """The release of the installed torch (2.11.0 for 2.11.0+cu130)."""
    import torch

    return torch.__version__.split("+")[0]


def want_cuda() -> bool:
    cpu_only = os.environ.get("TORCH_WMMAE_CPU_ONLY", "")
    if cpu_only not in ("", "0", "1"):  # ("true" would otherwise build the CUDA sources, silently)
        sys.exit(f"torch_wmmae: TORCH_WMMAE_CPU_ONLY must be 1 (skip the CUDA sources) or 0, got {cpu_only!r}")
    if cpu_only == "1":
        return False
    import torch

    # (torch sets CUDA_HOME wherever /usr/local/cuda exists, also in images with the CUDA runtime but no nvcc)
    home = cpp_extension.CUDA_HOME
    has_nvcc = home is not None and os.path.isfile(os.path.join(home, "bin", "nvcc"))
    if torch.version.cuda is not None and not has_nvcc:  # (said, since the GPU would then run nothing of ours)
        print(f"torch_wmmae: WARNING: torch {torch.__version__} is a CUDA build, but no nvcc was found (CUDA_HOME "
              f"{home!r}): building the CPU kernels only; set CUDA_HOME to a CUDA {torch.version.cuda} toolkit for "
              "the CUDA kernels", file=sys.stderr)
    return torch.version.cuda is not None and has_nvcc


def extension():
    cpp_sources = sorted(glob.glob(os.path.join(CSRC, "*.cpp")) + glob.glob(os.path.join(CSRC, "ops", "*.cpp")))
    cxx_flags = ["-O3", "-std=c++17", "-Wall", "-Wextra", "-Wno-unused-parameter"]
    common = dict(include_dirs=[CSRC], extra_compile_args={"cxx": cxx_flags})
    rel = lambda paths: [os.path.relpath(p, ROOT) for p in paths]
    if not want_cuda():
        return cpp_extension.CppExtension("torch_wmmae._C", rel(cpp_sources), **common)
    # Without an arch list, cpp_extension asks the (possibly absent) GPU for its capability and fails.
    archs, arch_flags = cuda_arch_list(os.environ.get("TORCH_CUDA_ARCH_LIST", ""))
    os.environ["TORCH_CUDA_ARCH_LIST"] = ";".join(archs)
    cuda_sources = sorted(glob.glob(os.path.join(CSRC, "ops", "*.cu")))
    common["extra_compile_args"]["nvcc"] = nvcc_flags(archs, arch_flags)
    common["extra_compile_args"]["cxx"] = cxx_flags + ["-DWMMAE_WITH_CUDA"]
    return cpp_extension.CUDAExtension("torch_wmmae._C", rel(cpp_sources + cuda_sources), **common)


# A private copy of libstdc++ inside the extension crashes the first time an error message formats a number
# (its locale facets are never initialized, the process uses torch's libstdc++). Two ways to get one: a
# toolchain that links libstdc++ statically by default (seen with a g++ under /opt/gcc), and
# -Bsymbolic-functions (Debian/Ubuntu Python link flags) binding the template instantiations nvcc-compiled
# objects emit to themselves. So: drop those flags, and link the very libstdc++.so that torch loaded.
_BAD_LINK_FLAGS = ("-Wl,-Bsymbolic-functions", "-Wl,-Bsymbolic", "-static-libstdc++", "-static-libgcc")


def torch_libstdcxx():
    """Path of the libstdc++ shared library loaded with torch in this process (Linux), or None."""
    import torch  # noqa: F401  (loads libstdc++ through libtorch)

    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if os.path.basename(path).startswith("libstdc++.so"):
                    return path
    except OSError:
        pass
    return None


class BuildExtension(cpp_extension.BuildExtension):
    """torch's BuildExtension, without _BAD_LINK_FLAGS and with torch's own libstdc++.so linked."""

    def build_extensions(self):
        for attr in ("linker_so", "linker_so_cxx"):
            cmd = getattr(self.compiler, attr, None)
            if cmd:
                setattr(self.compiler, attr, [a for a in cmd if a not in _BAD_LINK_FLAGS])
        libstdcxx = torch_libstdcxx()
        if libstdcxx:
            for ext in self.extensions:
                ext.extra_link_args = list(ext.extra_link_args or []) + [libstdcxx]
        super().build_extensions()


class BuildPy(build_py):
    """Also puts the device library's headers (csrc/wmmae/*.hpp) into the package, as torch_wmmae/include/wmmae,
    where torch_wmmae.get_include() finds them in an installed package (an editable one reads csrc/ instead)."""

    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "torch_wmmae", "include", "wmmae")
        self.mkpath(target)
        for header in sorted(glob.glob(os.path.join(CSRC, "wmmae", "*.hpp"))):
            self.copy_file(header, os.path.join(target, os.path.basename(header)))


setup(
    name="torch_wmmae",
    version=package_version(),
    description="Tensor-core fragments built in registers, as PyTorch operators (the WMMA extension idea)",
    packages=find_packages(include=["torch_wmmae", "torch_wmmae.*"]),
    package_data={"torch_wmmae": ["py.typed"]},  # (the API's annotations are for type checkers too: PEP 561)
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildExtension, "build_py": BuildPy},
    python_requires=">=3.10",  # (as torch 2.11)
    # The extension belongs to the torch it was built against (see the README's top): pip then says so where
    # another torch is installed over it.
    install_requires=[f"torch=={torch_release()}"],
)
