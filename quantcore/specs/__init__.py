"""One spec per op: validation, normalisation to the backend contract, output shapes; plus tolerances."""

from .epilogue import dequant_bias, quantized_gelu
from .gemm import quant_linear, scaled_mm
from .quant import act_dequant, act_quant, weight_dequant, weight_quant

__all__ = ["SPECS", "act_quant", "act_dequant", "weight_quant", "weight_dequant", "scaled_mm", "quant_linear",
           "dequant_bias", "quantized_gelu"]


def __getattr__(name: str):
    # `SPECS` (op name -> spec) is read off the built-in op definitions, which sit above this package
    # and import it: computed on use, so that a new op is listed where it is defined and nowhere else.
    if name == "SPECS":
        from ..opdefs import BUILTIN
        return {op.name: op.spec for op in BUILTIN}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
