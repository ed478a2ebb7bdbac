"""quantcore.nn: quantized layers for PyTorch models and block-FP8 checkpoints in the Hugging Face layout.

- `layers.py`: `QuantLinear` (block-quantized weight as frozen parameters, one `quant_linear` call per
  forward), `quantize_model`, and `convert_fp8_to_int8` (FP8 layers to INT8 blocks, with the error).
- `experts.py`: `QuantExperts`, a mixture-of-experts layer's gated-MLP experts with stacked block-quantized
  weights (routing, grouped GEMMs and the weighted sum as quantcore ops; masked or contiguous layout).
- `checkpoint.py`: `load_checkpoint` / `save_checkpoint` for checkpoint folders (config.json +
  safetensors shards) in the DeepSeek-V3 / transformers `fp8` and the `compressed-tensors` flavours,
  `quantize_from_config`, and `load_fp8_checkpoint` for bare safetensors files or a state dict.
- `schemes.py`: reading and writing `quantization_config`; `files.py`: `SafetensorsFiles`, tensors (or
  slices of them) by name from a file or a folder of shards.
The tensor-parallel layers (`ColumnParallelQuantLinear`, `RowParallelQuantLinear`, `shard_model`,
`load_tp_checkpoint`) are in `quantcore.parallel`, which builds on these.
"""

from .checkpoint import (LoadedKeys, load_checkpoint, load_fp8_checkpoint, quantize_from_config, save_checkpoint,
                         scale_to_fp32)
from .files import SafetensorsFiles
from .experts import ExpertsPath, QuantExperts
from .layers import QuantLinear, convert_fp8_to_int8, quantize_model, resolve_dtype
from .schemes import CompressedTensorsScheme, Fp8Scheme, LayerFormat, read_scheme, scheme_from_config

__all__ = [
    "QuantLinear", "QuantExperts", "ExpertsPath", "quantize_model", "resolve_dtype", "convert_fp8_to_int8",
    "load_checkpoint", "save_checkpoint", "quantize_from_config", "load_fp8_checkpoint", "LoadedKeys", "scale_to_fp32",
    "SafetensorsFiles", "Fp8Scheme", "CompressedTensorsScheme", "LayerFormat", "read_scheme", "scheme_from_config",
]

