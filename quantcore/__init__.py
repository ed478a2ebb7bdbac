"""quantcore: block-wise FP8/INT8 quantize, dequantize, block-scaled GEMM and fused epilogues.

`quantcore.ops` holds the ops; `quantcore.explain(op, ...)` says which implementation would run and
why; `quantcore.simulate("sm80")` and `quantcore.priority("cupy")` are context managers that change,
respectively, the device profile selection sees and the backend priority. Importing quantcore also
registers the ops as `torch.ops.quantcore.<name>` custom ops (`quantcore.library`, which `ops` reads), so that
`torch.export.load` of a program that uses them works after a plain `import quantcore`. Triton and
CuPy are imported only when one of their kernels first runs.
"""

from . import ops
from .capability import DeviceProfile, profile_for, simulate
from .errors import ConfigError, InvalidInputError, NonFiniteInputError, QuantcoreError, UnsupportedError
from .ops import explain
from .registry import NumericsWarning, priority

__version__ = "0.1.0"

__all__ = [
    "ops", "explain", "simulate", "priority", "profile_for", "DeviceProfile",
    "QuantcoreError", "InvalidInputError", "NonFiniteInputError", "UnsupportedError", "ConfigError", "NumericsWarning",
]
