"""quantcore's public ops. Each validates its arguments (raising `InvalidInputError`), picks an
implementation through the registry and launches it; the validated plan is kept per argument
signature (`quantcore.runtime`), so repeated calls with same-shaped inputs skip straight to the launch.

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

from . import definitions, registry
from .definitions import checks
from .library import FUNCTIONS
from .registry import BackendChoice, Explanation

# Each op's signature, docstring and validation live in its `quantcore.definitions` module.
act_quant = FUNCTIONS["act_quant"].public
act_dequant = FUNCTIONS["act_dequant"].public
weight_quant = FUNCTIONS["weight_quant"].public
weight_dequant = FUNCTIONS["weight_dequant"].public
scaled_mm = FUNCTIONS["scaled_mm"].public
quant_linear = FUNCTIONS["quant_linear"].public
dequant_bias = FUNCTIONS["dequant_bias"].public
quantized_gelu = FUNCTIONS["quantized_gelu"].public
rms_norm_quant = FUNCTIONS["rms_norm_quant"].public
silu_mul_quant = FUNCTIONS["silu_mul_quant"].public
# Mixture of experts: grouped GEMMs over stacked expert weights and the routing around them.
grouped_mm = FUNCTIONS["grouped_mm"].public
grouped_mm_masked = FUNCTIONS["grouped_mm_masked"].public
moe_permute = FUNCTIONS["moe_permute"].public
moe_permute_masked = FUNCTIONS["moe_permute_masked"].public
moe_unpermute = FUNCTIONS["moe_unpermute"].public


def explain(op: str, *args, backend: BackendChoice = None, **kwargs) -> Explanation:
    """Which implementation `quantcore.ops.<op>(*args, **kwargs)` would run here, and why each other
    implementation was not chosen. Prints readably; `.model_dump()` gives the data."""
    known = [d.name for d in definitions.all_ops()]
    if op not in known:
        raise checks.fail("explain", f"unknown op {op!r}; expected one of {sorted(known)}")
    return registry.explain_query(definitions.get(op).spec(*args, **kwargs).query, backend)
