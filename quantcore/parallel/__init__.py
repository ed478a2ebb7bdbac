"""Tensor parallelism for quantized models over `torch.distributed`: column- and row-parallel linears
(quantized with `QuantLinear`'s storage, or in floating point), `shard_model` to convert a model from a
name-pattern plan, and `load_tp_checkpoint` to load an unsharded safetensors checkpoint reading only each
rank's slices. Any process group works: NCCL on GPUs, gloo on the CPU. See docs/integration.md."""

from .checkpoint import load_tp_checkpoint, read_safetensors
from .layers import (PARALLEL_LAYERS, ColumnParallelLinear, ColumnParallelQuantLinear, RowParallelLinear,
                     RowParallelQuantLinear, group_position, shard_bounds)
from .plan import DEFAULT_PLAN, STYLES, shard_model, style_for

__all__ = [
    "ColumnParallelQuantLinear", "RowParallelQuantLinear", "ColumnParallelLinear", "RowParallelLinear",
    "PARALLEL_LAYERS", "shard_model", "DEFAULT_PLAN", "STYLES", "style_for", "load_tp_checkpoint",
    "read_safetensors", "group_position", "shard_bounds",
]
