"""quantcore: block-wise FP8/INT8 quantize, dequantize, block-scaled GEMM and fused epilogues.

`quantcore.ops` holds the ops; `quantcore.explain(op, ...)` says which implementation would run and
why; `quantcore.simulate("sm80")` and `quantcore.priority("cupy")` are context managers that change,
respectively, the device profile selection sees and the backend priority. Importing quantcore also
registers the ops as `torch.ops.quantcore.<name>` custom ops (`quantcore.library`, which `ops` reads), so that
`torch.export.load` of a program that uses them works after a plain `import quantcore`. Triton and
CuPy are imported only when one of their kernels first runs. `quantcore.warmup(model, batch_sizes)`
compiles and plans ahead what a model's first forward at each batch size would (`quantcore.nn.warmup`).
"""

import os as _os
import sys as _sys

__version__ = "0.1.0"


__all__ = [
    "ops", "explain", "simulate", "priority", "warmup", "profile_for", "DeviceProfile",
    "QuantcoreError", "InvalidInputError", "NonFiniteInputError", "UnsupportedError", "ConfigError", "NumericsWarning",
]

_FROM = {"ops": ".ops", "explain": ".ops", "simulate": ".capability", "priority": ".registry",
         "profile_for": ".capability", "DeviceProfile": ".capability", "NumericsWarning": ".registry",
         "QuantcoreError": ".errors", "InvalidInputError": ".errors", "NonFiniteInputError": ".errors",
         "UnsupportedError": ".errors", "ConfigError": ".errors",
         "warmup": ".nn.warmup"}  # quantcore.nn loads on warmup's first use


def __getattr__(name: str):
    if name not in _FROM:
        raise AttributeError(f"module 'quantcore' has no attribute {name!r}")
    import importlib

    module = importlib.import_module(_FROM[name], __name__)
    value = module if name == "ops" else getattr(module, name)
    globals()[name] = value
    return value


# The `quantcore` command (its console script) loads what each subcommand needs itself, so that
# `quantcore --version` and `--help` answer without importing torch; any other process registers the
# custom ops at import, as torch.export.load of a saved program needs.
if _os.path.basename(_sys.argv[0] if _sys.argv else "") != "quantcore":
    from . import ops  # noqa: E402,F401
