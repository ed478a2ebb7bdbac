"""quantcore.nn: quantized layers for PyTorch models.

- `layers.py`: `QuantLinear` (block-quantized weight as frozen parameters, one `quant_linear` call per
  forward) and `quantize_model`.
- `checkpoint.py`: `load_fp8_checkpoint` for safetensors files or a state dict.
"""

from .checkpoint import load_fp8_checkpoint
from .layers import QuantLinear, quantize_model, resolve_dtype

__all__ = ["QuantLinear", "quantize_model", "resolve_dtype", "load_fp8_checkpoint"]
