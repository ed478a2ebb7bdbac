"""The ops, each defined once (`op.OpDef`): signature, validation, output shapes, custom-op schema
and fake, formats. The bottom of quantcore's layers but the foundation modules (`capability`,
`formats`, `errors`): a definition imports nothing that selects, launches or implements an op."""

from .epilogue import DEQUANT_BIAS, QUANTIZED_GELU
from .experts import GROUPED_MM, GROUPED_MM_MASKED, MOE_PERMUTE, MOE_PERMUTE_MASKED, MOE_UNPERMUTE
from .gemm import QUANT_LINEAR, SCALED_MM
from .op import OpDef, all_ops, get, register_op
from .producers import RMS_NORM_QUANT, SILU_MUL_QUANT
from .quant import ACT_DEQUANT, ACT_QUANT, WEIGHT_DEQUANT, WEIGHT_QUANT

# The built-in ops, registered in this order (the report's and the custom ops').
BUILTIN = tuple(map(register_op, (ACT_QUANT, ACT_DEQUANT, WEIGHT_QUANT, WEIGHT_DEQUANT, SCALED_MM, QUANT_LINEAR,
                                  DEQUANT_BIAS, QUANTIZED_GELU, RMS_NORM_QUANT, SILU_MUL_QUANT, GROUPED_MM,
                                  GROUPED_MM_MASKED, MOE_PERMUTE, MOE_PERMUTE_MASKED, MOE_UNPERMUTE)))

__all__ = ["BUILTIN", "OpDef", "all_ops", "get", "register_op"]
