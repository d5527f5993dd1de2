"""Python API of the wmmae operators: thin wrappers over torch.ops.wmmae, each with its fake (meta) kernel
for torch.compile and its torch.vmap rule beside it. The autograd of corrected_matmul and batched_outer is
registered in C++ (csrc/ops/*_autograd.cpp): reverse and forward mode, inside torch.func's transforms too."""
from __future__ import annotations

import sys
from typing import Optional, Union

import torch
from torch import Tensor

__all__ = ["corrected_matmul", "batched_outer", "fragment_map", "METHODS"]

METHODS = ("auto", "fp16", "tf32")


def _require_tensor(op: str, name: str, value) -> None:
    """The dispatcher's own message for a non-tensor argument. (Where no argument is a tensor, as in
    ``corrected_matmul(None, None)``, the dispatcher cannot choose a kernel and says only that there were no
    tensor arguments.) A tracer's stand-in for a tensor (``torch.fx.symbolic_trace``'s Proxy: an object whose type
    has ``__torch_function__``) passes to the op, which records it. (The type, not has_torch_function: that is true
    of any value while a TorchFunctionMode, e.g. ``with torch.device(...)``, is active.)"""
    if not isinstance(value, Tensor):
        if hasattr(type(value), "__torch_function__"):
            return
        raise RuntimeError(
            f"wmmae::{op}() Expected a value of type 'Tensor' for argument '{name}' but instead found type "
            f"'{type(value).__name__}'."
        )
    if value.is_nested:  # (through the raw ops, strided ones meet the C++ checks and jagged ones _refuse_jagged)
        raise RuntimeError(f"{op}: argument '{name}' must be a dense (strided) tensor, got a nested tensor")


def _refuse_jagged(cls, func, types, args, kwargs):
    """A raw op (``torch.ops.wmmae.*``) called with a jagged nested tensor: the Python API's message, where the
    subclass's own dispatch would raise a NotImplementedError that names no argument."""
    op = func._schema.name.split("::")[-1]
    named = [*zip((arg.name for arg in func._schema.arguments), args), *kwargs.items()]
    for name, value in named:
        if isinstance(value, Tensor):
            _require_tensor(op, name, value)
    raise NotImplementedError(f"{op}: jagged nested tensors are not supported")


try:  # (a private module: without it the raw ops keep the subclass's NotImplementedError)
    from torch.nested._internal.nested_tensor import NestedTensor as _JaggedNestedTensor
except ImportError:
    _JaggedNestedTensor = None
if _JaggedNestedTensor is not None:
    for _op in ("wmmae::corrected_matmul", "wmmae::batched_outer"):
        torch.library.register_torch_dispatch(_op, _JaggedNestedTensor, _refuse_jagged)


def _is_bool(value) -> bool:
    """A Python or NumPy bool, which the dispatcher would take for the number 0 or 1. (Without numpy imported, no
    value is a NumPy bool.)"""
    numpy = sys.modules.get("numpy")
    return isinstance(value, bool) or (numpy is not None and isinstance(value, numpy.bool_))


def _sample(x: Tensor, dim: Optional[int]) -> Tensor:
    """A shape-only (meta) tensor of one sample of x, vmapped at dim (None: not vmapped), for a vmap rule to
    run its op's fake-kernel checks on the shapes of a sample."""
    shape = x.shape if dim is None else x.shape[:dim] + x.shape[dim + 1:]
    return x.new_empty(shape, device="meta")


# --------------------------------------------------------------------------------------------------------
# corrected_matmul
# --------------------------------------------------------------------------------------------------------
def corrected_matmul(a: Tensor, b: Tensor, *, method: str = "auto") -> Tensor:
    """Float32 matrix product on tensor cores with error correction: ``torch.matmul(a, b)`` at FP32 accuracy.

    Shapes follow :func:`torch.matmul` (1-D, 2-D, batched, broadcast batch dimensions); both operands must be
    float32 on the same device (inside ``torch.autocast``, float16 and bfloat16 operands are cast to float32).
    The result is a contiguous float32 tensor.

    Each fp32 value is split into a high part and a residual that tensor cores multiply; three products per
    k-step (the residual-times-residual term is dropped) recover fp32 accuracy: each product keeps 22 of its
    operands' 24 bits, a few float32 roundings, which only short sums (K below about 32) show; over longer
    sums the result is at least as accurate as a one-accumulator float32 GEMM (README, "methods and their
    accuracy"). Differentiable to any order, in reverse mode (``backward``, ``torch.autograd.grad``) and forward
    mode (``torch.autograd.forward_ad``), also under ``torch.func`` (``grad``, ``vjp``, ``jacrev``, ``jvp``,
    ``jacfwd``, ``hessian``); every derivative is a ``corrected_matmul`` with the same method. ``torch.vmap``
    runs one batched call. On CUDA, where the op splits K across blocks (too few output tiles to fill the GPU,
    or K > 4096 on many tiles or a large output), float32 atomics add the splits, so the last bits may differ
    from run to run; ``torch.use_deterministic_algorithms(True)`` turns the split off.

    Args:
        method: ``"fp16"`` splits into fp16 hi + fp16 residual scaled by 2^11, after scaling each row of ``a``
            and column of ``b`` by a power of two; accurate while the exponents of each row/column span at
            most 28 (magnitudes within 2^29; smaller elements of wider rows lose bits) and its largest
            element is at least 2^-113; an Inf meeting an element that vanishes in fp16 gives NaN where
            float32 gives Inf. ``"tf32"`` splits into tf32 hi + tf32 residual after a power-of-two scaling of
            each row/column that keeps clear of fp32's subnormals and overflow: accurate for every finite
            fp32 input (to 22 of 24 bits per element); where rows and columns span so many binades that
            small elements and products lose bits in fp32's subnormals (a 128x128 output tile whose lines
            span more than 2^150, or 2^180 row and column together), the tile's outputs are checked on the
            device and each 64x64 quadrant of it with an output made of such products is computed again
            with float32 fused multiply-adds (slow, but only there). ``"auto"`` (default) uses fp16 where
            every row and column involved is fp16-safe and tf32 elsewhere; it decides on the device (no
            host sync).
    """
    _require_tensor("corrected_matmul", "a", a)
    _require_tensor("corrected_matmul", "b", b)
    return torch.ops.wmmae.corrected_matmul.default(a, b, method)


def _check_corrected_matmul_args(a: Tensor, b: Tensor, method: str, *, dtypes: bool = True) -> list:
    # The C++ checks of the method, dtypes, devices and shapes, with their messages, so that eager and compiled
    # calls fail alike (and a meta tensor beside a real one is refused, not given an output of garbage). The
    # layout checks run with the real kernel. Returns the output's shape (torch.matmul's rules), built here
    # rather than by torch.matmul on meta tensors, whose decompositions add guards the op does not need (a
    # batched a @ a 1-D b with a dynamic K failed torch.export on "min(K, 4*K) == K").
    # (Imported here, where a tracer runs: at the package's import it pulled in sympy, most of the import's time.)
    from torch.fx.experimental.symbolic_shapes import guard_or_false

    torch._check(method in METHODS, lambda: f"corrected_matmul: argument 'method' must be 'auto', 'fp16' or 'tf32', got '{method}'")
    torch._check(a.dim() >= 1, lambda: "corrected_matmul: argument 'a' must have at least 1 dimension, got a 0-d tensor")
    torch._check(b.dim() >= 1, lambda: "corrected_matmul: argument 'b' must have at least 1 dimension, got a 0-d tensor")
    if dtypes:
        torch._check(a.dtype == torch.float32, lambda: f"corrected_matmul: argument 'a' must be float32, got {a.dtype}")
        torch._check(b.dtype == torch.float32, lambda: f"corrected_matmul: argument 'b' must be float32, got {b.dtype}")
    torch._check(
        a.device == b.device,
        lambda: f"corrected_matmul: arguments 'a' and 'b' must be on the same device, got a on {a.device} and b on {b.device}",
    )
    b_k = -1 if b.dim() == 1 else -2
    torch._check(
        a.shape[-1] == b.shape[b_k],
        lambda: f"corrected_matmul: inner dimensions do not match: 'a' has shape {list(a.shape)} and 'b' has shape "
        f"{list(b.shape)} (a.size(-1) must equal b.size({b_k}))",
    )
    a_batch = tuple(a.shape[:-2]) if a.dim() > 1 else ()
    b_batch = tuple(b.shape[:-2]) if b.dim() > 2 else ()
    rank = max(len(a_batch), len(b_batch))
    batch = []
    for x, y in zip((1,) * (rank - len(a_batch)) + a_batch, (1,) * (rank - len(b_batch)) + b_batch):
        # One check per dimension, and a size that may be 1 only where that is known: a data-dependent size
        # (unbacked under torch.compile) then gets a runtime assert instead of a guard that cannot be decided,
        # as torch.matmul's own broadcasting does.
        if guard_or_false(x == 1):
            batch.append(y)
            continue
        batch.append(x)
        if guard_or_false(y == 1):
            continue
        torch._check(
            x == y,
            lambda: f"corrected_matmul: the batch dimensions of 'a' {list(a_batch)} and 'b' {list(b_batch)} do not "
            f"broadcast ('a' has shape {list(a.shape)}, 'b' {list(b.shape)})",
        )
    return batch + ([a.shape[-2]] if a.dim() > 1 else []) + ([b.shape[-1]] if b.dim() > 1 else [])


@torch.library.register_fake("wmmae::corrected_matmul")
def _corrected_matmul_fake(a: Tensor, b: Tensor, method: str = "auto") -> Tensor:
    return a.new_empty(_check_corrected_matmul_args(a, b, method))  # (contiguous, as the op's output)


@torch.library.register_vmap("wmmae::corrected_matmul")
def _corrected_matmul_vmap(info, in_dims, a: Tensor, b: Tensor, method: str = "auto"):
    # One call with the vmapped dimension as the leading batch dimension: matmul's own broadcasting then pairs
    # the samples. Each sample's 1-D operand is made a matrix first (and the added dimension dropped from the
    # result), and the batched operands get size-1 batch dimensions after the vmapped one, so that it lines up
    # in front of every sample's batch dimensions.
    a_dim, b_dim = in_dims[0], in_dims[1]
    if a_dim is None and b_dim is None:
        return torch.ops.wmmae.corrected_matmul.default(a, b, method), None
    # The op's checks on one sample's shapes, with its messages: the call below sees only the batched ones (and
    # would take a sample's 0-d operand for the vmapped vector itself). Not the dtypes: under torch.autocast
    # the operands are still 16-bit here (vmap's rule runs before the autocast kernel), and the call below
    # casts them, or refuses them with the op's message outside autocast.
    _check_corrected_matmul_args(_sample(a, a_dim), _sample(b, b_dim), method, dtypes=False)
    a_rank, b_rank = a.dim() - (a_dim is not None), b.dim() - (b_dim is not None)  # of one sample
    a = a if a_dim is None else a.movedim(a_dim, 0)
    b = b if b_dim is None else b.movedim(b_dim, 0)
    if a_rank == 1:
        a = a.unsqueeze(-2)
    if b_rank == 1:
        b = b.unsqueeze(-1)
    batch_rank = max(a_rank, b_rank, 2) - 2  # of one sample's result
    if a_dim is not None:
        a = a.reshape(a.shape[:1] + (1,) * (batch_rank - (a.dim() - 3)) + a.shape[1:])
    if b_dim is not None:
        b = b.reshape(b.shape[:1] + (1,) * (batch_rank - (b.dim() - 3)) + b.shape[1:])
    out = torch.ops.wmmae.corrected_matmul.default(a, b, method)
    if a_rank == 1:
        out = out.squeeze(-2)
    if b_rank == 1:
        out = out.squeeze(-1)
    return out, 0


# --------------------------------------------------------------------------------------------------------
# batched_outer
# --------------------------------------------------------------------------------------------------------
_OUTER_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def batched_outer(
    u: Tensor, v: Optional[Tensor] = None, *, alpha: float = 0.0, out_dtype: Optional[torch.dtype] = None
) -> Tensor:
    """Batched outer products plus a scaled identity: ``out[b] = u[b] v[b]^T + alpha * I``.

    Args:
        u, v: tensors of shape ``(..., n)`` with the same shape and dtype (float16, bfloat16 or float32);
            ``v`` defaults to ``u``.
        alpha: a Python number, added once to every diagonal element as a float32 value.
        out_dtype: ``torch.float32`` (default), ``torch.float16`` or ``torch.bfloat16``.

    Differentiable in ``u`` and ``v``, in reverse and forward mode, also under ``torch.func``'s transforms:
    ``grad_u = g v`` and ``grad_v = g^T u`` for an incoming gradient ``g``, computed in float32 and returned in
    the inputs' dtype; the tangent ``u_t v^T + u v_t^T`` in float32, rounded once to ``out_dtype``.
    ``torch.vmap`` runs one batched call.

    Returns a contiguous tensor of shape ``(..., n, n)``. fp16/bf16 inputs: each element is the exact
    ``u_i v_j`` (plus ``alpha`` on the diagonal) rounded once to float32, then to ``out_dtype`` if that is
    16-bit (on the GPU an off-diagonal bf16 product below float32's normal range may be one subnormal ulp
    off: the tensor core rounds it itself); float32 inputs are accurate to a few float32 ulps.
    """
    _require_tensor("batched_outer", "u", u)
    if isinstance(v, Tensor):
        _require_tensor("batched_outer", "v", v)
    if out_dtype is not None and not isinstance(out_dtype, torch.dtype):  # (the schema also takes dtype codes)
        raise TypeError(f"batched_outer: argument 'out_dtype' must be a torch.dtype or None, got "
                        f"{type(out_dtype).__name__} {out_dtype!r}")
    if isinstance(alpha, Tensor):  # (the schema takes a number: a tensor would pass as its value, without gradient)
        raise TypeError("batched_outer: argument 'alpha' must be a Python number, got a Tensor (it would get no "
                        "gradient, and torch.compile cannot trace it); pass alpha.item() to use its value")
    if _is_bool(alpha):  # (the schema would take True as 1.0)
        raise TypeError(f"batched_outer: argument 'alpha' must be a real number, got a bool ({alpha})")
    if isinstance(alpha, int):  # (an int beyond float's range would get the dispatcher's message about an int)
        try:
            alpha = float(alpha)
        except OverflowError as e:
            raise OverflowError(f"batched_outer: argument 'alpha' does not fit a float: {alpha}") from e
    return torch.ops.wmmae.batched_outer.default(u, v, alpha, out_dtype)


@torch.library.register_fake("wmmae::batched_outer")
def _batched_outer_fake(u: Tensor, v: Optional[Tensor] = None, alpha: float = 0.0, out_dtype=None) -> Tensor:
    # The C++ checks of dtypes, devices and shapes, with their messages and in their order, so that eager and
    # compiled calls fail alike (and a meta tensor beside a real one is refused). The layout checks run with the
    # real kernel.
    torch._check(u.dim() >= 1, lambda: "batched_outer: argument 'u' must have shape (..., n), got a 0-d tensor")
    torch._check(u.dtype in _OUTER_DTYPES, lambda: f"batched_outer: argument 'u' must be float16, bfloat16 or float32, got {u.dtype}")
    if v is not None:
        torch._check(
            v.device == u.device,
            lambda: f"batched_outer: arguments 'u' and 'v' must be on the same device, got u on {u.device} and v on {v.device}",
        )
        torch._check(v.dtype == u.dtype, lambda: f"batched_outer: argument 'v' must have the dtype of 'u' ({u.dtype}), got {v.dtype}")
        same_shape = lambda: f"batched_outer: argument 'v' must have the shape of 'u' {list(u.shape)}, got {list(v.shape)}"
        torch._check(v.dim() == u.dim(), same_shape)
        for x, y in zip(u.shape, v.shape):  # (one check per size: a runtime assert where a size is data-dependent)
            torch._check(x == y, same_shape)
    dtype = torch.float32 if out_dtype is None else out_dtype
    torch._check(dtype in _OUTER_DTYPES, lambda: f"batched_outer: argument 'out_dtype' must be float32, float16 or bfloat16, got {dtype}")
    return u.new_empty((*u.shape, u.shape[-1]), dtype=dtype)


@torch.library.register_vmap("wmmae::batched_outer")
def _batched_outer_vmap(info, in_dims, u: Tensor, v: Optional[Tensor] = None, alpha: float = 0.0, out_dtype=None):
    # The vmapped dimension as the leading batch dimension of one call; an operand that is not vmapped is
    # expanded to the batch size (u and v must have the same shape).
    u_dim, v_dim = in_dims[0], in_dims[1] if len(in_dims) > 1 else None  # (in_dims omits arguments left at default)
    if u_dim is None and v_dim is None:
        return torch.ops.wmmae.batched_outer.default(u, v, alpha, out_dtype), None
    # The op's checks on one sample's shapes, with its messages: after the expansion below the op would see only
    # the batched ones (and would take a sample's 0-d u for the vmapped vector itself).
    _batched_outer_fake(_sample(u, u_dim), None if v is None else _sample(v, v_dim), alpha, out_dtype)
    u = u.expand(info.batch_size, *u.shape) if u_dim is None else u.movedim(u_dim, 0)
    if v is not None:
        v = v.expand(info.batch_size, *v.shape) if v_dim is None else v.movedim(v_dim, 0)
    return torch.ops.wmmae.batched_outer.default(u, v, alpha, out_dtype), 0


# --------------------------------------------------------------------------------------------------------
# fragment_map
# --------------------------------------------------------------------------------------------------------
def fragment_map(
    use: str,
    m: int,
    n: int,
    k: int,
    dtype: str,
    layout: Optional[str] = None,
    *,
    arch: Optional[int] = None,
    device: Optional[Union[str, torch.device]] = None,
) -> Tensor:
    """Which tile element each lane's ``frag.x[i]`` holds, for a ``nvcuda::wmma::fragment``.

    Returns an int32 tensor ``[32, num_elements, 2]``: entry ``[lane, i]`` is the ``(row, col)`` of the
    element in the tile (A is m x k, B is k x n, accumulators are m x n).

    Args:
        use: ``"matrix_a"``, ``"matrix_b"`` or ``"accumulator"``.
        m, n, k: the fragment shape, e.g. 16, 16, 16.
        dtype: ``"half"``, ``"bf16"``, ``"tf32"``, ``"int8"``, ``"uint8"``, ``"double"`` for operands;
            ``"float"``, ``"half"``, ``"int32"``, ``"double"`` for accumulators.
        layout: ``"row_major"`` or ``"col_major"`` for operands, ``None`` for accumulators.
        arch: compute capability (70, 75, 80, 86, 89, 90): the analytic table, on the CPU. The tables of 70
            and 75 cover only m16n16k16 ``"half"`` operands and ``"float"`` or ``"half"`` accumulators.
        device: a CUDA device of compute capability 8.0 or newer: the layout measured on that GPU with
            ``load_matrix_sync``.
    Exactly one of ``arch`` and ``device`` must be given.
    """
    if (arch is None) == (device is None):
        raise ValueError("fragment_map: pass exactly one of arch= (analytic table) and device= (measure the GPU)")
    for name, value in (("m", m), ("n", n), ("k", k), ("arch", arch)):
        # (the dispatcher takes a bool for an int, and says "expected int, found int" for one beyond int64)
        if _is_bool(value):
            raise RuntimeError(f"fragment_map: argument '{name}' must be an int, got a bool ({value})")
        if isinstance(value, int) and not -(2**63) <= value < 2**63:
            what = "a compute capability" if name == "arch" else "a WMMA tile size"
            raise RuntimeError(f"fragment_map: argument '{name}' must be {what}, got {value}")
    try:
        dev = torch.device(device) if device is not None else None
    except (RuntimeError, TypeError) as e:
        raise type(e)(f"fragment_map: argument 'device' must be a torch.device or a device string, got {device!r}: {e}") from e
    if dev is not None and dev.type == "cuda" and dev.index is None:
        if torch.cuda.device_count() == 0:  # (current_device() would fail with a message naming no argument)
            raise RuntimeError("fragment_map: argument 'device' is cuda, but this machine has 0 CUDA device(s)")
        dev = torch.device("cuda", torch.cuda.current_device())
    return torch.ops.wmmae.fragment_map.default(use, m, n, k, dtype, layout, arch, dev)


@torch.library.register_fake("wmmae::fragment_map")
def _fragment_map_fake(use, m, n, k, dtype, layout=None, arch=None, device=None):
    # The shape comes from the real op's CPU table, asked outside fake mode. For a CUDA device the sm_80+ one, which
    # every GPU this package runs on shares with its measured one (an arch beside it is refused, as the CUDA kernel
    # refuses it). Elsewhere the call as it is, for the op's own checks (a CPU table needs arch; only CPU and CUDA
    # devices are taken).
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    on_cuda = device is not None and torch.device(device).type == "cuda"
    table_arch = 80 if on_cuda else arch
    with unset_fake_temporarily():
        table = torch.ops.wmmae.fragment_map.default(use, m, n, k, dtype, layout, table_arch, None if on_cuda else device)
    # (as the CUDA kernel, after the fragment's own checks)
    torch._check(not (on_cuda and arch is not None),
                 lambda: "fragment_map: pass either arch= (analytic table) or device= (measure the GPU), not both")
    return torch.empty(table.shape, dtype=torch.int32, device=device if device is not None else "cpu")
