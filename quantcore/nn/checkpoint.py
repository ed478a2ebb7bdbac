"""Loading DeepSeek-V3 / Hugging Face FP8 tensors into a model converted with `quantize_model`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

import torch
from torch import nn

from ..errors import InvalidInputError


def load_fp8_checkpoint(model: nn.Module, checkpoint: str | os.PathLike | Mapping[str, torch.Tensor], *,
                        strict: bool = True):
    """Load a DeepSeek-V3 / Hugging Face FP8 checkpoint into `model` (converted with `quantize_model`).

    checkpoint: a `.safetensors` file, a directory of them (shards), or a state dict. Quantized layers
    read `<name>.weight` (e4m3, [N, K]) and `<name>.weight_scale_inv` (fp32, [ceil(N/128), ceil(K/128)]);
    other tensors load as usual. Returns `load_state_dict`'s (missing_keys, unexpected_keys).
    Raises `InvalidInputError` naming the key when a quantized tensor has the wrong dtype or shape.
    """
    if isinstance(checkpoint, Mapping):
        state = dict(checkpoint)
    else:
        from safetensors.torch import load_file  # optional dependency, needed only for files

        path = Path(checkpoint)
        files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
        if not files or not all(f.is_file() for f in files):
            raise InvalidInputError(f"load_fp8_checkpoint: no safetensors file at {str(path)!r}; pass a .safetensors "
                                    "file, a directory holding them, or a state dict")
        state = {}
        for f in files:
            state.update(load_file(str(f)))
    return model.load_state_dict(state, strict=strict)
