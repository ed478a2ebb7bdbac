"""quantcore's built-in ops, each defined once (`quantcore.opdef.OpDef`), registered in this order."""

from ..opdef import register_op
from .epilogue import DEQUANT_BIAS, QUANTIZED_GELU
from .gemm import QUANT_LINEAR, SCALED_MM
from .quant import ACT_DEQUANT, ACT_QUANT, WEIGHT_DEQUANT, WEIGHT_QUANT

BUILTIN = tuple(map(register_op, (ACT_QUANT, ACT_DEQUANT, WEIGHT_QUANT, WEIGHT_DEQUANT, SCALED_MM, QUANT_LINEAR,
                                  DEQUANT_BIAS, QUANTIZED_GELU)))
