"""One spec per op: validation, normalisation to the backend contract, output shapes; plus tolerances."""

from .epilogue import dequant_bias, quantized_gelu
from .gemm import quant_linear, scaled_mm
from .quant import act_dequant, act_quant, weight_dequant, weight_quant

SPECS = {
    f.__name__: f
    for f in (act_quant, act_dequant, weight_quant, weight_dequant, scaled_mm, quant_linear, dequant_bias,
              quantized_gelu)
}

__all__ = ["SPECS", *SPECS]
