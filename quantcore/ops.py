"""quantcore's public ops. Each validates its arguments (raising `InvalidInputError`), picks an
implementation through the registry and launches it; the validated plan is kept per argument
signature (`dispatch.py`), so repeated calls with same-shaped inputs skip straight to the launch.

`backend=None` (or "auto") chooses automatically; a name ("triton", "cupy", "torch") forces that
backend and raises `UnsupportedError` with its reasons when it cannot run; a sequence of names sets
the priority for this call. Scales are dequantization multipliers: x ≈ q * scale.

Gradients (docs/numerics.md): `quant_linear` gives x and bias one, `scaled_mm` with a float output
bias, straight through the activation quantization and the dequantized weight; with grad mode on and
an input requiring grad they run through their `torch.ops.quantcore` custom op, which autograd
records. Their quantized codes and scales are refused in the forward when they require grad. The
other ops' outputs never require grad, whatever the backend and the inputs.
"""

from __future__ import annotations

from . import opdef, registry
from .opdefs import epilogue, gemm, quant
from .registry import BackendChoice, Explanation
from .specs import checks

# Each op's signature, docstring, spec, schema and formats live in its `quantcore.opdefs` definition.
act_quant = quant.ACT_QUANT.function
act_dequant = quant.ACT_DEQUANT.function
weight_quant = quant.WEIGHT_QUANT.function
weight_dequant = quant.WEIGHT_DEQUANT.function
scaled_mm = gemm.SCALED_MM.function
quant_linear = gemm.QUANT_LINEAR.function
dequant_bias = epilogue.DEQUANT_BIAS.function
quantized_gelu = epilogue.QUANTIZED_GELU.function


def explain(op: str, *args, backend: BackendChoice = None, **kwargs) -> Explanation:
    """Which implementation `quantcore.ops.<op>(*args, **kwargs)` would run here, and why each other
    implementation was not chosen. Prints readably; `.model_dump()` gives the data."""
    known = [d.name for d in opdef.all_ops()]
    if op not in known:
        raise checks.fail("explain", f"unknown op {op!r}; expected one of {sorted(known)}")
    return registry.explain_query(opdef.get(op).spec(*args, **kwargs).query, backend)
