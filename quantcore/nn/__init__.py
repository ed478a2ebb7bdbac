"""quantcore.nn: quantized layers for PyTorch models and block-FP8 checkpoints in the Hugging Face layout.

- `layers.py`: `QuantLinear` (block-quantized weight as frozen parameters, one `quant_linear` call per
  forward, or `scaled_mm` on an activation already quantized), `quantize_model`, and `convert_fp8_to_int8`
  (FP8 layers to INT8 blocks, with the error).
- `producers.py`: `QuantRMSNorm` and `QuantSiLUMul`, which return their output quantized for the
  QuantLinears they feed (`QuantizedActivation`): the fused `rms_norm_quant` and `silu_mul_quant`.
- `experts.py`: `QuantExperts`, a mixture-of-experts layer's gated-MLP experts with stacked block-quantized
  weights (routing, grouped GEMMs and the weighted sum as quantcore ops; masked or contiguous layout).
- `params.py`: what both quantized layers share (frozen codes and scales no dtype cast touches, checked
  state-dict loads, `resolve_dtype`).
- `warmup.py`: `warmup(model, batch_sizes)`, the compiles and plans of a server's first requests, ahead.
- `checkpoint.py`: `load_checkpoint` / `save_checkpoint` for checkpoint folders (config.json +
  safetensors shards) in the DeepSeek-V3 / transformers `fp8` and the `compressed-tensors` flavours,
  `quantize_from_config`, and `load_fp8_checkpoint` for bare safetensors files or a state dict.
- `schemes.py`: reading and writing `quantization_config`; `files.py`: `SafetensorsFiles`, tensors (or
  slices of them) by name from a file or a folder of shards; `expert_files.py`: experts stored per expert
  or stacked, read into and written from `QuantExperts`.

The tensor-parallel layers (`ColumnParallelQuantLinear`, `RowParallelQuantLinear`, `shard_model`,
`load_tp_checkpoint`) are in `quantcore.parallel`, which builds on these.
"""

from .checkpoint import (LoadedKeys, load_checkpoint, load_fp8_checkpoint, quantize_from_config, save_checkpoint,
                         scale_to_fp32)
from .experts import ExpertsPath, QuantExperts
from .files import SafetensorsFiles
from .layers import QuantLinear, convert_fp8_to_int8, quantize_model
from .params import resolve_dtype
from .producers import QuantizedActivation, QuantRMSNorm, QuantSiLUMul
from .schemes import CompressedTensorsScheme, Fp8Scheme, LayerFormat, read_scheme, scheme_from_config
from .warmup import warmup

__all__ = [
    "QuantLinear", "QuantExperts", "ExpertsPath", "quantize_model", "resolve_dtype", "convert_fp8_to_int8", "warmup",
    "QuantRMSNorm", "QuantSiLUMul", "QuantizedActivation",
    "load_checkpoint", "save_checkpoint", "quantize_from_config", "load_fp8_checkpoint", "LoadedKeys", "scale_to_fp32",
    "SafetensorsFiles", "Fp8Scheme", "CompressedTensorsScheme", "LayerFormat", "read_scheme", "scheme_from_config",
]

