"""Loading an unsharded safetensors checkpoint into a tensor-parallel model, each rank reading only its
slices of the sharded layers' tensors (`safe_open(...).get_slice`)."""

from __future__ import annotations

import os
from typing import Mapping

import torch
from torch import nn

from ..errors import InvalidInputError
from ..nn.checkpoint import verify_scales
from ..nn.files import SafetensorsFiles
from .layers import _Parallel

# name -> (the full tensor's shape, this rank's index in it), or None to read the tensor whole
Wanted = Mapping[str, "tuple[tuple[int, ...], tuple[slice, ...] | None] | None"]


def read_safetensors(checkpoint: str | os.PathLike, wanted: Wanted) -> tuple[dict[str, torch.Tensor], set[str]]:
    """Read the tensors named in `wanted` from a safetensors checkpoint (`quantcore.nn.SafetensorsFiles`:
    one file, or a directory with or without `model.safetensors.index.json`). A name given (full shape,
    index) is checked to have that shape in the file and only `index` of it is read (`get_slice`: the
    file's other bytes are never loaded); a name given None, or (shape, None), is read whole. Returns
    (the tensors found, on the CPU; every name the checkpoint holds). Raises `InvalidInputError` for a
    missing path or a tensor of another full shape."""
    tensors = {}
    with SafetensorsFiles(checkpoint, op="read_safetensors") as files:
        held = set(files.names())
        for name, spec in wanted.items():
            if name not in held:
                continue
            shape, index = spec if spec is not None else (None, None)
            if index is not None and files.shape(name) != tuple(shape):
                raise InvalidInputError(f"read_safetensors: checkpoint tensor {name} in {files.shard_of(name).name} has "
                                        f"shape {files.shape(name)}; the model's unsharded layer expects {tuple(shape)}")
            tensors[name] = files.get(name, index)
    return tensors, held


def load_tp_checkpoint(model: nn.Module, checkpoint: str | os.PathLike, *, strict: bool = True,
                       check_scales: bool = True) -> tuple[list[str], list[str]]:
    """Load an unsharded safetensors checkpoint (a DeepSeek-V3 / Hugging Face FP8 one: `<layer>.weight`
    e4m3 [N, K], `<layer>.weight_scale_inv` fp32 [ceil(N/128), ceil(K/128)]; or a float one for float
    parallel layers) into `model` after `shard_model`: each tensor-parallel layer reads only its rows or
    columns of its weight, scale and bias; everything else is read whole (it is replicated).

    checkpoint: a file, or a directory of shards with or without `model.safetensors.index.json`.
    Returns (missing_keys, unexpected_keys); with strict=True either being non-empty raises
    `InvalidInputError`. The quantized layers check dtypes and shapes as `QuantLinear` does (a weight of
    another format is refused, not cast); check_scales (the default) refuses, naming it, a block scale
    whose rank slice holds a value that is not finite and > 0. For a model too large to build whole,
    build it on the meta device, `shard_model` it, `model.to_empty(device=...)`, then load.
    """
    if not isinstance(model, nn.Module):
        raise InvalidInputError(f"load_tp_checkpoint: expected an nn.Module, got {type(model).__name__}")
    wanted: dict[str, tuple | None] = dict.fromkeys(model.state_dict())
    for prefix, module in model.named_modules():
        if isinstance(module, _Parallel):
            wanted.update({f"{prefix}.{key}" if prefix else key: spec for key, spec in module.shard_indices().items()})
    tensors, present = read_safetensors(checkpoint, wanted)
    if check_scales:
        verify_scales(tensors, "load_tp_checkpoint")
    missing = sorted(set(wanted) - set(tensors))
    unexpected = sorted(present - set(wanted))
    if strict and (missing or unexpected):
        raise InvalidInputError(f"load_tp_checkpoint: the checkpoint does not match the model: missing "
                                f"{missing[:8]}{' ...' if len(missing) > 8 else ''}, unexpected "
                                f"{unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}; pass strict=False to "
                                "load what matches")
    model.load_state_dict(tensors, strict=False)
    return missing, unexpected
