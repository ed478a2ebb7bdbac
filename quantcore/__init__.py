"""quantcore: block-wise FP8/INT8 quantize, dequantize, block-scaled GEMM and fused epilogues.

`quantcore.ops` holds the ops; `quantcore.explain(op, ...)` says which implementation would run and
why; `quantcore.simulate("sm80")` and `quantcore.priority("cupy")` are context managers that change,
respectively, the device profile selection sees and the backend priority. Importing quantcore also
registers the ops as `torch.ops.quantcore.<name>` custom ops (`quantcore.library`, which `ops` reads), so that
`torch.export.load` of a program that uses them works after a plain `import quantcore`. Triton and
CuPy are imported only when one of their kernels first runs. `quantcore.warmup(model, batch_sizes)`
compiles and plans ahead what a model's first forward at each batch size would (`quantcore.nn.warmup`).
"""

from . import ops
from .capability import DeviceProfile, profile_for, simulate
from .errors import InvalidInputError, NonFiniteInputError, QuantcoreError, UnsupportedError
from .ops import explain
from .registry import NumericsWarning, priority

__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "warmup":  # imported on first use: quantcore.nn is more than `import quantcore` needs
        from .nn.warmup import warmup

        return warmup
    raise AttributeError(f"module 'quantcore' has no attribute {name!r}")


__all__ = [
    "ops", "explain", "simulate", "priority", "warmup", "profile_for", "DeviceProfile",
    "QuantcoreError", "InvalidInputError", "NonFiniteInputError", "UnsupportedError", "NumericsWarning",
]
