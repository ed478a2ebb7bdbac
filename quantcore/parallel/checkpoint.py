"""Loading an unsharded safetensors checkpoint into a tensor-parallel model, each rank reading only its
slices of the sharded layers' tensors (`safe_open(...).get_slice`)."""

from __future__ import annotations

import json
import os
from contextlib import ExitStack
from pathlib import Path
from typing import Mapping

import torch
from torch import nn

from ..errors import InvalidInputError
from .layers import _Parallel

INDEX_FILE = "model.safetensors.index.json"

# name -> (the full tensor's shape, this rank's index in it), or None to read the tensor whole
Wanted = Mapping[str, "tuple[tuple[int, ...], tuple[slice, ...] | None] | None"]


def read_safetensors(checkpoint: str | os.PathLike, wanted: Wanted) -> tuple[dict[str, torch.Tensor], set[str]]:
    """Read the tensors named in `wanted` from a safetensors checkpoint: one file, or a directory with
    `model.safetensors.index.json` (its "weight_map": name -> file), or a directory of `*.safetensors`
    files. A name given (full shape, index) is checked to have that shape in the file and only
    `index` of it is read (`get_slice`: the file's other bytes are never loaded); a name given None, or
    (shape, None), is read whole. Returns (the tensors found, on the CPU; every name the checkpoint
    holds). Raises `InvalidInputError` for a missing path or a tensor of another full shape."""
    from safetensors import safe_open  # optional dependency, needed only for files

    path = Path(checkpoint)
    if path.is_dir() and (path / INDEX_FILE).is_file():
        weight_map = json.loads((path / INDEX_FILE).read_text())["weight_map"]
        files = {name: path / file for name, file in weight_map.items()}
    else:
        listed = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
        if not listed or not all(f.is_file() for f in listed):
            raise InvalidInputError(f"read_safetensors: no safetensors file at {str(path)!r}; pass a .safetensors "
                                    f"file or a directory holding them (with or without {INDEX_FILE})")
        files = {}
        for f in listed:
            with safe_open(str(f), framework="pt") as handle:
                files.update(dict.fromkeys(handle.keys(), f))
    tensors = {}
    with ExitStack() as stack:
        opened = {}
        for name, spec in wanted.items():
            if name not in files:
                continue
            file = files[name]
            if file not in opened:
                opened[file] = stack.enter_context(safe_open(str(file), framework="pt"))
            shape, index = spec if spec is not None else (None, None)
            if index is None:
                tensors[name] = opened[file].get_tensor(name)
                continue
            part = opened[file].get_slice(name)
            if tuple(part.get_shape()) != tuple(shape):
                raise InvalidInputError(f"read_safetensors: checkpoint tensor {name} in {file.name} has shape "
                                        f"{tuple(part.get_shape())}; the model's unsharded layer expects "
                                        f"{tuple(shape)}")
            tensors[name] = part[index]
    return tensors, set(files)


def load_tp_checkpoint(model: nn.Module, checkpoint: str | os.PathLike, *,
                       strict: bool = True) -> tuple[list[str], list[str]]:
    """Load an unsharded safetensors checkpoint (a DeepSeek-V3 / Hugging Face FP8 one: `<layer>.weight`
    e4m3 [N, K], `<layer>.weight_scale_inv` fp32 [ceil(N/128), ceil(K/128)]; or a float one for float
    parallel layers) into `model` after `shard_model`: each tensor-parallel layer reads only its rows or
    columns of its weight, scale and bias; everything else is read whole (it is replicated).

    checkpoint: a file, or a directory of shards with or without `model.safetensors.index.json`.
    Returns (missing_keys, unexpected_keys); with strict=True either being non-empty raises
    `InvalidInputError`. The quantized layers check dtypes and shapes as `QuantLinear` does (a weight of
    another format is refused, not cast). For a model too large to build whole, build it on the meta
    device, `shard_model` it, `model.to_empty(device=...)`, then load.
    """
    if not isinstance(model, nn.Module):
        raise InvalidInputError(f"load_tp_checkpoint: expected an nn.Module, got {type(model).__name__}")
    wanted: dict[str, tuple | None] = dict.fromkeys(model.state_dict())
    for prefix, module in model.named_modules():
        if isinstance(module, _Parallel):
            wanted.update({f"{prefix}.{key}" if prefix else key: spec for key, spec in module.shard_indices().items()})
    tensors, present = read_safetensors(checkpoint, wanted)
    missing = sorted(set(wanted) - set(tensors))
    unexpected = sorted(present - set(wanted))
    if strict and (missing or unexpected):
        raise InvalidInputError(f"load_tp_checkpoint: the checkpoint does not match the model: missing "
                                f"{missing[:8]}{' ...' if len(missing) > 8 else ''}, unexpected "
                                f"{unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}; pass strict=False to "
                                "load what matches")
    model.load_state_dict(tensors, strict=False)
    return missing, unexpected
