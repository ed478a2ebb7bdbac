"""The CuPy backend: every op as CUDA C++ (`kernels/*.cu`) compiled by NVRTC for the device's
architecture, launched on torch's current stream through raw pointers (`launch.py`). It reaches
down to Turing (sm_75), where the GEMM uses the m8n8k16 INT8 MMA."""

from __future__ import annotations

from ..base import Constraints, Impl

_MEMORY_BOUND = ("act_quant", "act_dequant", "weight_quant", "weight_dequant", "quantized_gelu")
_BASE = dict(min_cc=(7, 0), requires=("cupy",))

IMPLS = (
    *(Impl(op, "cupy", f"cupy.launch:{op}", Constraints(**_BASE)) for op in _MEMORY_BOUND),
    Impl("dequant_bias", "cupy", "cupy.launch:dequant_bias",
         Constraints(**_BASE, formats=("bfloat16", "float16", "float32", "int32"))),
    Impl("scaled_mm", "cupy", "cupy.launch:scaled_mm",
         Constraints(**{**_BASE, "min_cc": (7, 5)}, fp8_mma=True, int8_mma=True)),
)
