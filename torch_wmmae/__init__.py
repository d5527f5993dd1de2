"""torch_wmmae: NVIDIA tensor-core fragments built in registers, as PyTorch operators.

Ops (also reachable as ``torch.ops.wmmae.*``):
- :func:`corrected_matmul`: float32 matmul on tensor cores with error correction (FP32 accuracy).
- :func:`batched_outer`: batched ``u v^T + alpha * I``.
- :func:`fragment_map`: which tile element each lane of a WMMA fragment holds.

The device library (``wmmae/wmmae.hpp``, header-only) for CUDA code of one's own: :func:`get_include`.
"""
import os

import torch  # (first: loads libc10/libtorch, which _C links against)

try:
    from . import _C  # noqa: F401  (loads the operator library: registers torch.ops.wmmae)
except ImportError as error:  # (the loader's own message, e.g. an undefined symbol, does not say what to do)
    raise ImportError(
        f"torch_wmmae: the operator library torch_wmmae/_C did not load ({error}). It must be built against the "
        f"torch of this process, torch {torch.__version__} in {os.path.dirname(torch.__file__)}; one built "
        "against another torch fails to load, often with an undefined symbol. Rebuild it against this torch: "
        "`pip install --no-build-isolation -e .` in the source tree, or `pip install --no-build-isolation "
        "--force-reinstall --no-deps <sdist>`."
    ) from error
from .ops import METHODS, batched_outer, corrected_matmul, fragment_map

__all__ = ["corrected_matmul", "batched_outer", "fragment_map", "METHODS", "has_cuda_kernels", "get_include"]
__version__ = "0.1.0"


def get_include() -> str:
    """The directory to add to the include path of CUDA code that uses the device library:
    ``#include "wmmae/wmmae.hpp"`` (e.g. ``torch.utils.cpp_extension.load(..., extra_include_paths=[get_include()])``).
    An installed package carries the headers (``torch_wmmae/include``); an editable install uses the source tree's
    ``csrc``."""
    package = os.path.dirname(os.path.abspath(__file__))
    for candidate in (os.path.join(package, "include"), os.path.join(os.path.dirname(package), "csrc")):
        if os.path.isfile(os.path.join(candidate, "wmmae", "wmmae.hpp")):
            return candidate
    raise FileNotFoundError(f"torch_wmmae: the device library's headers are neither in {package}/include nor in a "
                            "source tree beside the package; reinstall the package")


def has_cuda_kernels() -> bool:
    """True when this build contains the CUDA kernels (built with nvcc against a CUDA-enabled torch)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key("wmmae::corrected_matmul", "CUDA")
