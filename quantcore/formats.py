"""Quantized formats, scale formats and the block shapes quantcore understands.

These are data: each format is the torch dtype that stores it and the largest magnitude it
represents (`qmax`), which is what a block's scale maps its amax onto.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DEFAULT_EPS = 1e-4  # DeepSeek-V3's floor under amax; keeps all-zero blocks finite
DEFAULT_GROUP = 128
DEFAULT_BLOCK = (128, 128)

SCALE_FORMATS = ("fp32", "ue8m0")
SCALE_LAYOUTS = ("row", "m_major")
ACTIVATIONS = (None, "gelu", "gelu_tanh", "silu")
# The activations' constants, shared by every backend's forward and by the gradients (docs/numerics.md).
SQRT1_2 = 0.7071067811865476
SQRT_2_OVER_PI = 0.7978845608028654
GELU_TANH_CUBIC = 0.044715
GELU_APPROXIMATIONS = ("none", "tanh")
FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class QuantFormat:
    """A quantized element format: `name`, storage `dtype`, largest representable magnitude `qmax`."""

    name: str
    dtype: torch.dtype
    qmax: float


FP8_E4M3 = QuantFormat("fp8_e4m3", torch.float8_e4m3fn, 448.0)
INT8 = QuantFormat("int8", torch.int8, 127.0)
FORMATS = (FP8_E4M3, INT8)
_BY_DTYPE = {f.dtype: f for f in FORMATS}
_BY_NAME = {f.name: f for f in FORMATS} | {"fp8": FP8_E4M3, "float8_e4m3fn": FP8_E4M3}


def format_of_dtype(dtype: torch.dtype) -> QuantFormat | None:
    """The QuantFormat stored as `dtype`, or None when `dtype` is not a quantized format."""
    return _BY_DTYPE.get(dtype)


def format_named(name: str) -> QuantFormat | None:
    """The QuantFormat called `name` ("fp8_e4m3", "fp8", "int8"), or None."""
    return _BY_NAME.get(name)


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.bfloat16` -> "bfloat16", for messages and reports."""
    return str(dtype).removeprefix("torch.")
