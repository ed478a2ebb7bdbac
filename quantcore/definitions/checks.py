"""Validation helpers shared by the specs. Each raises `InvalidInputError` naming the op, the argument,
what was wrong, what was expected and what to do instead."""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np
import torch

from .. import capability
from ..errors import InvalidInputError, NonFiniteInputError
from ..formats import FLOAT_DTYPES, SCALE_FORMATS, QuantFormat, dtype_name, format_named, format_of_dtype


def fail(op: str, message: str) -> InvalidInputError:
    """The error to raise: `raise fail(op, "...")`."""
    return InvalidInputError(f"{op}: {message}")


def _names(dtypes: Iterable[torch.dtype]) -> str:
    return ", ".join(dtype_name(d) for d in dtypes)


def tensor(op: str, name: str, t: Any, dtypes: Iterable[torch.dtype], min_dim: int = 1,
           empty_last: bool = False) -> torch.Tensor:
    """`t` is a tensor of one of `dtypes` with at least `min_dim` dims and, unless `empty_last` (a
    per-row vector, empty when there are no rows), no zero-sized trailing dim."""
    dtypes = tuple(dtypes)
    if not isinstance(t, torch.Tensor):
        raise fail(op, f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.is_nested:
        raise fail(op, f"{name} is a nested tensor; expected a dense one: pad it (torch.nested.to_padded_tensor) "
                       "or call the op per component")
    if t.layout != torch.strided:  # sparse (COO, CSR, CSC, BSR, BSC) and mkldnn tensors have no strides to launch on
        raise fail(op, f"{name} has layout {t.layout}; expected a dense tensor (torch.strided): pass {name}.to_dense()")
    if t.dtype not in dtypes:
        raise fail(op, f"{name} has dtype {dtype_name(t.dtype)}; expected one of {_names(dtypes)}")
    if t.dim() < min_dim:
        raise fail(op, f"{name} must have at least {min_dim} dimension(s), got shape {tuple(t.shape)}")
    if t.dim() and t.shape[-1] == 0 and not empty_last:
        raise fail(op, f"{name} has an empty last dimension (shape {tuple(t.shape)}); blocks need at least one element")
    if t.is_complex():
        raise fail(op, f"{name} must be a real tensor, got {dtype_name(t.dtype)}")
    return _resolved(op, name, t)


def _resolved(op: str, name: str, t: torch.Tensor) -> torch.Tensor:
    """`t` with its negative bit resolved: a lazily negated view (`torch._neg_view`, the imaginary part of a
    conjugated complex tensor) whose memory holds the values' negation, which a kernel reading the memory
    would take with the opposite sign. A copy, so its call's plan is not kept (such views are rare). Real
    tensors carry no conjugate bit (complex ones are refused above)."""
    if not t.is_neg():
        return t
    try:
        return t.resolve_neg()
    except (NotImplementedError, RuntimeError):  # no negation kernel for the dtype here (fp8 on the CPU)
        raise fail(op, f"{name} is a negative view ({dtype_name(t.dtype)}), which torch cannot materialize on "
                       f"{t.device}; pass a tensor that holds its values (negate the tensor it views)") from None


def matrix(op: str, name: str, t: Any, dtypes: Iterable[torch.dtype]) -> torch.Tensor:
    """`t` is a 2-D tensor with both dimensions >= 1."""
    t = tensor(op, name, t, dtypes, min_dim=2)
    if t.dim() != 2 or min(t.shape) == 0:
        raise fail(op, f"{name} must be 2-D [rows, cols] with both >= 1, got shape {tuple(t.shape)}")
    return t


def same_device(op: str, **tensors: torch.Tensor | None) -> torch.device:
    """All given tensors live on one device; returns it."""
    present = {k: v for k, v in tensors.items() if v is not None}
    devices = {str(v.device) for v in present.values()}
    if len(devices) > 1:
        where = ", ".join(f"{k} on {v.device}" for k, v in present.items())
        raise fail(op, f"tensors are on different devices ({where}); move them to one device")
    return next(iter(present.values())).device


def shape(op: str, name: str, t: torch.Tensor, expected: tuple[int, ...], why: str) -> None:
    """`t.shape == expected`, else an error saying why that shape is expected."""
    if tuple(t.shape) != tuple(expected):
        raise fail(op, f"{name} has shape {tuple(t.shape)}; expected {tuple(expected)} ({why})")


INT64_MAX = 2**63 - 1  # the custom ops' schemas carry ints as int64; torch's sizes are int64 too


def _shown(value: Any) -> str:
    """`repr(value)` for a message, cut short (an int such as 10**400 has hundreds of digits)."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}...({len(text)} characters)"


def positive_int(op: str, name: str, value: Any) -> int:
    """A block or group size: an int from 1 to 2**63 - 1 (bools refused; the custom ops' schemas carry
    it as a 64-bit int)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= INT64_MAX:
        raise fail(op, f"{name} must be an int from 1 to 2**63 - 1, got {_shown(value)} ({type(value).__name__})")
    return value


def within(block: int, size: int) -> int:
    """The block a kernel needs for a dimension of `size` >= 1: a larger block is the whole dimension,
    with the same single scale per block row, so it must cost what the dimension costs (a kernel or the
    reference would otherwise pad to, and allocate, the requested size)."""
    return min(block, size)


def block_pair(op: str, value: Any) -> tuple[int, int]:
    """A (Bn, Bk) weight block shape."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise fail(op, f"block_size must be a pair (Bn, Bk), got {value!r}")
    return positive_int(op, "block_size[0]", value[0]), positive_int(op, "block_size[1]", value[1])


_FP32_MAX = float(np.finfo(np.float32).max)


def eps(op: str, value: Any, qmax: float, name: str = "eps") -> float:
    """The amax floor (the argument `name`): a finite number > 0 whose fp32 value over `qmax` is a positive,
    finite fp32 scale (kernels use eps in fp32, so a Python-float check alone lets 1e-50 give scale 0 and
    1e300 scale Inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise fail(op, f"{name} must be a finite number > 0, got {_shown(value)}")
    with np.errstate(over="ignore", under="ignore"):
        # Compared first: an int such as 10**400 has no float (OverflowError); in fp32 it is Inf like 1e300.
        floor = np.float32(value) if value <= _FP32_MAX else np.float32(np.inf)
        scale = floor / np.float32(qmax)
    if not (np.isfinite(scale) and scale > 0):
        # The quotient rounds to 0 at or below qmax * 2^-150 (half the smallest fp32 subnormal).
        raise fail(op, f"{name}={_shown(value)} is {float(floor)!r} in fp32 and gives a scale {name}/qmax of "
                       f"{float(scale)!r} (qmax {qmax:g}); use an {name} above {qmax * 2.0 ** -150:.3g} and at most "
                       f"{_FP32_MAX:.7g} so that the fp32 scale is positive and finite")
    return float(value)


def flag(op: str, name: str, value: Any) -> bool:
    """A real bool: a truthy stand-in such as "no" or 1 would silently mean True."""
    if not isinstance(value, bool):
        raise fail(op, f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return value


def scale_fmt(op: str, value: Any) -> bool:
    """True for "ue8m0" (power-of-two scales), False for "fp32"."""
    if value not in SCALE_FORMATS:
        raise fail(op, f"scale_fmt must be one of {SCALE_FORMATS}, got {value!r}")
    return value == "ue8m0"


def choice(op: str, name: str, value: Any, allowed: tuple) -> Any:
    """`value` is one of `allowed`."""
    if value not in allowed:
        raise fail(op, f"{name} must be one of {allowed}, got {value!r}")
    return value


def out_float(op: str, name: str, dtype: Any) -> torch.dtype:
    """An output dtype among bf16, fp16, fp32."""
    if dtype not in FLOAT_DTYPES:
        raise fail(op, f"{name} must be one of {_names(FLOAT_DTYPES)}, got {dtype!r}")
    return dtype


def quant_format(op: str, name: str, dtype: Any, device: torch.device) -> QuantFormat:
    """A quantized dtype (torch.float8_e4m3fn, torch.int8, or "auto": FP8 where the GPU has FP8 MMA)."""
    if isinstance(dtype, str):
        auto = dtype == "auto"
        fmt = format_named(capability.preferred_format_name(capability.profile_for(device))) if auto else None
    else:
        fmt = format_of_dtype(dtype) if isinstance(dtype, torch.dtype) else None  # a list would be unhashable
    if fmt is None:
        raise fail(op, f"{name} must be torch.float8_e4m3fn, torch.int8 or \"auto\", got {dtype!r}")
    return fmt


def quantized(op: str, name: str, t: Any, min_dim: int = 1) -> tuple[torch.Tensor, QuantFormat]:
    """A tensor of a quantized dtype, and its format."""
    t = tensor(op, name, t, (torch.float8_e4m3fn, torch.int8), min_dim)
    fmt = format_of_dtype(t.dtype)
    return t, fmt  # type: ignore[return-value]


def finite(op: str, name: str, t: torch.Tensor) -> None:
    """Opt-in check (`check_finite=True`): refuse NaN/Inf instead of producing non-finite scales."""
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        raise NonFiniteInputError(f"{op}: {name} contains NaN or Inf; clean the input or pass check_finite=False "
                                  "to get non-finite scales for the affected blocks only")


def last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    """Kernels need unit stride along the last dim; other strides are passed through."""
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def rows(t: torch.Tensor) -> torch.Tensor:
    """[..., K] -> [M, K] without a copy when the leading dims are collapsible."""
    return last_dim_contiguous(t.reshape(-1, t.shape[-1]))
