"""`shard_model`: a model's linears replaced by their tensor-parallel forms, chosen by module-name patterns."""

from __future__ import annotations

import fnmatch
from typing import Any, Mapping

import torch
from torch import nn

from ..errors import InvalidInputError
from ..formats import DEFAULT_BLOCK
from ..nn import QuantLinear
from ..definitions import checks
from .layers import (ColumnParallelLinear, ColumnParallelQuantLinear, RowParallelLinear, RowParallelQuantLinear,
                     _Parallel)

# style -> (quantized class, float class, constructor options)
STYLES: dict[str, tuple[type[_Parallel], type[_Parallel], dict[str, Any]]] = {
    "column": (ColumnParallelQuantLinear, ColumnParallelLinear, {}),
    "column_gather": (ColumnParallelQuantLinear, ColumnParallelLinear, {"gather_output": True}),
    "row": (RowParallelQuantLinear, RowParallelLinear, {}),
    "row_split_input": (RowParallelQuantLinear, RowParallelLinear, {"input_is_parallel": False}),
}

# Megatron's pairing: a column-parallel layer feeds a row-parallel one, so the pair costs one all-reduce.
# Attention heads are split by the q/k/v projections (the model must then use n_heads/world heads per
# rank) and joined by the output projection; the MLP's up (and gate) projections split the hidden
# dim, the down projection joins it. Names of Hugging Face Llama/Qwen/Mistral/DeepSeek modules, DeepSeek-V3's
# reference code (MLA: the q and kv up-projections split heads; wq_a and wkv_a stay replicated) and
# examples/tiny_transformer.py. Fused projections (qkv_proj, gate_up_proj) are not here: an even split of
# a fused output would hand rank 0 all of q and none of v.
DEFAULT_PLAN: dict[str, str] = {
    "q_proj": "column", "k_proj": "column", "v_proj": "column", "o_proj": "row",
    "q_b_proj": "column", "kv_b_proj": "column",
    "gate_proj": "column", "up_proj": "column", "down_proj": "row",
    "wq": "column", "wk": "column", "wv": "column", "wo": "row", "wq_b": "column", "wkv_b": "column",
    "w1": "column", "w3": "column", "w2": "row",
}


def style_for(name: str, plan: Mapping[str, str]) -> str | None:
    """The style of the first pattern of `plan` matching the dotted module `name` or its tail ("wo" matches
    "layers.3.attn.wo", as `quantize_model(skip=...)` matches), or None: the module stays as it is."""
    for pattern, style in plan.items():
        if fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, "*." + pattern):
            return style
    return None


def shard_model(model: nn.Module, group: Any = None, plan: Mapping[str, str] | None = None, *,
                dtype: Any = "auto", block_size: tuple[int, int] = DEFAULT_BLOCK,
                out_dtype: torch.dtype | None = None, reduce_dtype: torch.dtype | None = None) -> nn.Module:
    """Replace, in place, the linears of `model` that `plan` names by their tensor-parallel forms over
    `group` (None: the default process group) and return `model`.

    plan: {fnmatch pattern: style}, matched in order against each module's dotted name or its tail;
    styles "column", "column_gather" (the full output all-gathered), "row" (input already split, as a
    column-parallel layer leaves it) and "row_split_input" (each rank slices the whole input). None:
    `DEFAULT_PLAN` (attention q/k/v column, o row; MLP gate/up column, down row). Linears no pattern
    matches stay whole on every rank (replicated).
    A `QuantLinear` becomes `ColumnParallelQuantLinear`/`RowParallelQuantLinear` with its own format,
    block and out_dtype; an `nn.Linear` becomes the quantized form with `dtype`, `block_size`, `out_dtype`
    (only this rank's slice is quantized), or with dtype=None the float form (`ColumnParallelLinear`,
    `RowParallelLinear`). reduce_dtype: the row-parallel layers' (None: each one's output dtype;
    torch.float32 sums fp32 partials). Shards that would cut a block raise `InvalidInputError` naming the
    module. A linear shared by several parents becomes one parallel layer under all its names (the
    names the plan matches must agree on the style).

    Every rank of the group calls this with the same model and plan. The attention's head count per
    rank (n_heads / world) is the model's business: shard_model changes linears only.
    """
    if not isinstance(model, nn.Module):
        raise InvalidInputError(f"shard_model: expected an nn.Module, got {type(model).__name__}")
    plan = DEFAULT_PLAN if plan is None else plan
    if not isinstance(plan, Mapping):
        raise InvalidInputError(f"shard_model: plan must be a mapping {{pattern: style}}, got {type(plan).__name__}")
    for pattern, style in plan.items():
        if style not in STYLES:
            raise InvalidInputError(f"shard_model: plan[{pattern!r}] is {style!r}; styles are {', '.join(STYLES)}")
    block = checks.block_pair("shard_model", block_size)
    # remove_duplicate=False lists a module shared by several parents under each name; it gets one style
    # (that of the names the plan matches, which must agree) and one parallel layer, under every name.
    names: dict[int, list[str]] = {}
    modules: dict[int, nn.Module] = {}
    for name, m in model.named_modules(remove_duplicate=False):
        if name and isinstance(m, (nn.Linear, QuantLinear)) and not isinstance(m, _Parallel):
            names.setdefault(id(m), []).append(name)
            modules[id(m)] = m
    for key, module in modules.items():
        styles = {name: style_for(name, plan) for name in names[key]}
        chosen = set(styles.values()) - {None}
        if not chosen:
            continue
        if len(chosen) > 1:
            raise InvalidInputError(f"shard_model: one linear is shared under names given different styles by the "
                                    f"plan ({styles}); give them one style")
        quantized, floating, options = STYLES[chosen.pop()]
        if quantized is RowParallelQuantLinear:
            options = {**options, "reduce_dtype": reduce_dtype}
        cls = quantized if isinstance(module, QuantLinear) or dtype is not None else floating
        name = next(n for n, s in styles.items() if s is not None)
        parallel = cls.from_module(module, group, name=name, dtype=dtype, block_size=block, out_dtype=out_dtype,
                                   **options)
        for name in names[key]:
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, parallel)
    return model
