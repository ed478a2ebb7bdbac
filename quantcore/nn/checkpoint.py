"""Block-FP8 checkpoints in the Hugging Face layout, both ways.

`load_checkpoint(model, folder)` reads a checkpoint folder as transformers, vLLM, DeepSeek-V3 and
llm-compressor write it — `config.json` with a `quantization_config` (`schemes.py`: the
`quant_method: "fp8"` and `"compressed-tensors"` flavours), safetensors shards with or without
`model.safetensors.index.json` (`files.py`) — shard by shard into a model, converting the `nn.Linear`
layers the checkpoint stores quantized into `QuantLinear`s. `save_checkpoint(model, folder)` writes
one back in either flavour. `quantize_from_config` quantizes a float model the way a config says.
`load_fp8_checkpoint` loads bare safetensors files (or a state dict) with no config.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import re
from pathlib import Path
from typing import Any, Mapping, NamedTuple

import torch
from torch import nn

from ..errors import InvalidInputError
from ..formats import dtype_name
from .expert_files import ExpertsLoad, expert_tensors, per_expert_names, plan_experts, stacked_scales
from .experts import QuantExperts, is_stacked_experts
from .files import INDEX_FILE, NUMBERED_SHARD, SafetensorsFiles, safetensors_module, write_folder
from .layers import QuantLinear, replace_linears, replace_where
from .params import frozen
from .schemes import (CONFIG_FILE, CompressedTensorsScheme, Fp8Scheme, LayerFormat, Scheme, read_scheme,
                      scheme_from_config)

FORMATS = ("fp8", "compressed-tensors")
_E8M0 = getattr(torch, "float8_e8m0fnu", None)  # torch >= 2.7
SCALE_DTYPES = tuple(d for d in (torch.float32, torch.bfloat16, torch.float16, _E8M0) if d is not None)
_FP8_DTYPES = tuple(d for d in (torch.float8_e4m3fn, torch.float8_e5m2, getattr(torch, "float8_e4m3fnuz", None),
                                getattr(torch, "float8_e5m2fnuz", None)) if d is not None)
_SCALE_LEAVES = ("weight_scale_inv", "weight_scale")


class LoadedKeys(NamedTuple):
    """What `load_checkpoint` could not match: model keys the checkpoint lacks, checkpoint keys the model lacks."""

    missing_keys: list[str]
    unexpected_keys: list[str]


def _split(name: str) -> tuple[str, str]:
    prefix, _, leaf = name.rpartition(".")
    return prefix, leaf


def _join(prefix: str, leaf: str) -> str:
    return f"{prefix}.{leaf}" if prefix else leaf


def scale_to_fp32(t: torch.Tensor, key: str = "scale") -> torch.Tensor:
    """A checkpoint's block scale as the fp32 dequantization multiplier `QuantLinear` keeps.

    Exact for every dtype checkpoints use: fp32; bf16 and fp16 (compressed-tensors stores scales in
    the model's dtype) widen exactly; float8_e8m0fnu (ue8m0) byte e is 2^(e-127), a power of two that
    fp32 holds (2^-127 as a subnormal), and its NaN byte stays NaN. Other dtypes raise.
    """
    if t.dtype not in SCALE_DTYPES:
        raise InvalidInputError(f"load_checkpoint: block scale {key} has dtype {dtype_name(t.dtype)}; expected one of "
                                f"{', '.join(dtype_name(d) for d in SCALE_DTYPES)}")
    return t.to(torch.float32)


def verify_scales(state: Mapping[str, Any], op: str) -> None:
    """Raise `InvalidInputError` naming the first block scale of `state` (a `weight_scale_inv` or
    `weight_scale` tensor) that holds a value that is not finite and > 0."""
    for name, t in state.items():
        if _split(name)[1] in _SCALE_LEAVES and isinstance(t, torch.Tensor):
            _verify_scale(name, t, op)


def _verify_scale(name: str, t: torch.Tensor, op: str) -> None:
    # A dequantization multiplier that is 0, negative, infinite or NaN zeroes, flips or poisons its whole
    # block: no quantizer writes one, so the file is damaged or hostile. ue8m0's NaN byte 0xFF reads as NaN.
    # A meta tensor holds no values to check (a model made on the meta device loads its shapes only).
    if t.is_meta or t.is_nested or t.layout != torch.strided:
        return
    values = t if t.dtype == torch.float32 else t.float()
    bad = ~((values > 0) & (values < math.inf))
    if bad.any():
        at = tuple(bad.nonzero()[0].tolist())
        raise InvalidInputError(f"{op}: block scale {name} holds {int(bad.sum())} value(s) that are not finite and > 0 "
                                f"(first: {values[at].item()} at {at}); a dequantization multiplier is a positive "
                                "finite number, so the checkpoint is damaged or was written wrong: re-download or "
                                "re-convert it, or pass check_scales=False to load it as it is")


def quantized_layers(files: SafetensorsFiles, scheme: Scheme) -> dict[str, tuple[LayerFormat, str]]:
    """{layer name: (its format, the name its scale is stored under)} for every `<layer>.weight` the
    checkpoint stores with a block scale (`weight_scale_inv` or `weight_scale`), checked against the
    config and, from the shard headers alone, against the scale grid its block implies."""
    layers = {}
    shapes = files.shapes()
    for name in shapes:
        prefix, leaf = _split(name)
        stored = [_join(prefix, s) for s in _SCALE_LEAVES if _join(prefix, s) in shapes]
        if leaf != "weight" or not stored:
            continue
        if len(stored) > 1:
            raise InvalidInputError(f"load_checkpoint: {prefix!r} has both {stored[0]} and {stored[1]}; a checkpoint "
                                    "stores one block scale per weight")
        fmt = scheme.layer(prefix)
        if fmt is None:
            raise InvalidInputError(f"load_checkpoint: {name} is stored block-quantized (with {stored[0]}), but the "
                                    f"config's {scheme.method} rules (modules_to_not_convert / ignore) keep {prefix!r} "
                                    "in floating point; the checkpoint and its config.json disagree")
        shape, scale_shape = shapes[name], shapes[stored[0]]
        if len(shape) != 2:
            raise InvalidInputError(f"load_checkpoint: {name} has shape {shape}; quantcore loads 2-D [N, K] linear "
                                    "weights, and experts per expert or stacked as gate_up_proj [E, 2I, H] and "
                                    "down_proj [E, H, I]")
        bn, bk = fmt.block_size
        grid = (math.ceil(shape[0] / bn), math.ceil(shape[1] / bk))
        if scale_shape != grid:
            raise InvalidInputError(f"load_checkpoint: {stored[0]} has shape {scale_shape}, but a {bn}x{bk} block scale "
                                    f"of the weight {name} {shape} is {grid} (one per block); per-tensor and "
                                    "per-channel FP8 are not block-wise, and the block must be the config's")
        layers[prefix] = (fmt, stored[0])
    return layers


def _normalized(files: SafetensorsFiles, name: str, layers: Mapping[str, tuple[LayerFormat, str]],
                check_scales: bool, stacked: Mapping[str, str]):
    """(name, tensor) as the quantized layers keep it: scales renamed `weight_scale_inv` (stacked experts':
    `<codes>_scale_inv`), made fp32 and, with `check_scales`, checked to be finite and > 0."""
    t = files.get(name)
    prefix, leaf = _split(name)
    layer = layers.get(prefix)
    if name in stacked or (layer is not None and name == layer[1]):
        return (stacked[name] + "_scale_inv" if name in stacked else _join(prefix, "weight_scale_inv"),
                _fp32_scale(name, t, check_scales))
    if (layer is not None and leaf == "weight") or name in stacked.values():
        if t.dtype != torch.float8_e4m3fn:
            raise InvalidInputError(f"load_checkpoint: {name} has a block scale but dtype {dtype_name(t.dtype)}; "
                                    "block-FP8 checkpoints store the weight as float8_e4m3fn")
    elif t.dtype in _FP8_DTYPES:
        raise InvalidInputError(f"load_checkpoint: {name} is {dtype_name(t.dtype)} without a block scale "
                                f"({_join(prefix, 'weight_scale_inv')} or {_join(prefix, 'weight_scale')}); loading "
                                "it would cast FP8 codes into a float parameter")
    return name, t


def _fp32_scale(name: str, t: torch.Tensor, check_scales: bool) -> torch.Tensor:
    t = scale_to_fp32(t, name)
    if check_scales:
        _verify_scale(name, t, "load_checkpoint")
    return t


def _put_expert(files: SafetensorsFiles, name: str, load: ExpertsLoad, check_scales: bool) -> None:
    t = files.get(name)
    load.put(name, _fp32_scale(name, t, check_scales) if name in load.scales else t)


def _empty_layer(linear: nn.Linear, fmt: LayerFormat) -> QuantLinear:
    """A QuantLinear to load into, on the linear's device (meta stays meta); the bias keeps its dtype."""
    layer = QuantLinear(linear.in_features, linear.out_features, linear.bias is not None, dtype=torch.float8_e4m3fn,
                        block_size=fmt.block_size, scale_fmt=fmt.scale_fmt, device=linear.weight.device)
    if linear.bias is not None:
        layer.bias = frozen(linear.bias.detach())
    return layer


def _prepare(model: nn.Module, layers: Mapping[str, tuple[LayerFormat, str]]) -> None:
    """Turn the model's linears the checkpoint stores quantized into QuantLinears; check existing ones."""
    modules = dict(model.named_modules(remove_duplicate=False))
    for prefix, (fmt, _) in layers.items():
        m = modules.get(prefix)
        if isinstance(m, QuantLinear) and (m.block_size, m.scale_fmt) != (fmt.block_size, fmt.scale_fmt):
            raise InvalidInputError(f"load_checkpoint: {prefix!r} is a QuantLinear with block_size={m.block_size} and "
                                    f"scale_fmt={m.scale_fmt!r}; the checkpoint stores it with block_size="
                                    f"{fmt.block_size} and scale_fmt={fmt.scale_fmt!r}: build it so, or leave it an "
                                    "nn.Linear and load_checkpoint converts it")
        if m is not None and not isinstance(m, (QuantLinear, nn.Linear)):
            raise InvalidInputError(f"load_checkpoint: the checkpoint stores {prefix!r} as a block-quantized linear "
                                    f"layer, but the model's {prefix!r} is a {type(m).__name__}")
    # A layer shared under several names is converted under all of them, also those the file omits.
    formats = {id(modules[prefix]): fmt for prefix, (fmt, _) in layers.items() if prefix in modules}
    replace_linears(model, lambda name: id(modules[name]) in formats,
                    lambda name, linear: _empty_layer(linear, formats[id(linear)]))


def _aliases(model: nn.Module) -> dict[str, list[str]]:
    """{state-dict key: the other keys of the same tensor} (a shared layer, tied weights)."""
    by_tensor: dict[int, list[str]] = {}
    for key, t in model.state_dict(keep_vars=True).items():
        by_tensor.setdefault(id(t), []).append(key)
    return {k: [a for a in keys if a != k] for keys in by_tensor.values() if len(keys) > 1 for k in keys}


def _few(keys: list[str]) -> str:
    return ", ".join(keys[:8]) + (f" and {len(keys) - 8} more" if len(keys) > 8 else "") if keys else "none"


def load_checkpoint(model: nn.Module | None, folder: str | os.PathLike, *, device: torch.device | str = "cpu",
                    strict: bool = True, assign: bool | None = None, check_scales: bool = True):
    """Load a block-FP8 Hugging Face checkpoint folder into `model`, or read it as a state dict.

    folder: `config.json` whose `quantization_config` is `quant_method: "fp8"` (DeepSeek-V3,
    transformers, vLLM: `weight_block_size`, `modules_to_not_convert`, `scale_fmt`) or
    `"compressed-tensors"` with FP8_BLOCK-style groups, and safetensors shards (followed through
    `model.safetensors.index.json` when present). A linear is quantized when the checkpoint stores its
    weight (float8_e4m3fn, [N, K]) with a block scale — `weight_scale_inv` or `weight_scale`, in fp32,
    bf16, fp16 or float8_e8m0fnu, converted exactly to the fp32 `weight_scale_inv` [ceil(N/Bn),
    ceil(K/Bk)] QuantLinear keeps; the config must agree (a layer it excludes but the files store
    quantized raises). `scale_fmt: "ue8m0"` makes the layers quantize activations with power-of-two scales.

    model: its `nn.Linear` layers stored quantized become `QuantLinear`s of the checkpoint's block
    (on the linear's device; meta stays meta); existing `QuantLinear`s must have the checkpoint's
    block_size and scale_fmt. Mixture-of-experts weights, stored per expert
    (`<experts>.<e>.gate_proj|up_proj|down_proj.weight` + scale, as DeepSeek-V3 and Qwen3-MoE store
    them) or stacked (`<experts>.gate_up_proj` [E, 2I, H], `<experts>.down_proj` [E, H, I] + scales),
    load into the `QuantExperts` at `<experts>`, or into one that replaces a stacked float experts
    module there (transformers >= 5's), each tensor copied into its slice as its shard is read
    (`quantcore.nn.expert_files`); a model whose experts are separate modules (an nn.ModuleList of
    MLPs) gets a QuantLinear per expert projection instead. Shards are read one at a time onto
    `device` and loaded (a layer's weight and scale together); `assign` (None: True when the model has meta tensors, e.g. built under
    `with torch.device("meta"):`) takes the checkpoint's tensors as the parameters instead of
    copying. strict: raise `InvalidInputError` listing keys the model and checkpoint do not share
    (about keys only: missing shard files, shards outside the folder or a numbered series with a gap
    always raise). check_scales: raise `InvalidInputError` naming a block scale that holds a value
    that is not finite and > 0 (NaN, ±inf, 0, negative; ue8m0's NaN byte 0xFF); False skips that pass
    over the scales. device: "cpu" or a device this machine has (`InvalidInputError` otherwise).
    Returns `LoadedKeys(missing_keys, unexpected_keys)`.

    model None: returns the checkpoint as a state dict {name: tensor} in QuantLinear's names and
    dtypes (every tensor in memory at once).
    """
    if model is not None and not isinstance(model, nn.Module):
        raise InvalidInputError(f"load_checkpoint: expected an nn.Module or None, got {type(model).__name__}")
    scheme = read_scheme(folder)
    with SafetensorsFiles(folder, device=device, op="load_checkpoint") as files:
        layers = quantized_layers(files, scheme)
        stacked = stacked_scales(files.shapes())
        if model is None:
            return dict(_normalized(files, name, layers, check_scales, stacked) for name in files.names())
        experts = plan_experts(model, layers, files.shapes(), scheme)
        _prepare(model, layers)
        if assign is None:
            assign = any(t.is_meta for t in itertools.chain(model.parameters(), model.buffers()))
        expected = list(model.state_dict().keys())
        aliases = _aliases(model)
        loaded: set[str] = set()
        unexpected: list[str] = []
        pending: dict[str, torch.Tensor] = {}

        def flush(final: bool) -> None:
            # A layer's codes and scales go into one load_state_dict call: QuantLinear checks them together.
            ready = [k for k in pending if final or not _awaits_partner(k, pending, layers)]
            chunk = {k: pending.pop(k) for k in ready}
            for k in list(chunk):
                for alias in aliases.get(k, ()):
                    chunk.setdefault(alias, chunk[k])
            result = model.load_state_dict(chunk, strict=False, assign=assign)
            unexpected.extend(result.unexpected_keys)
            loaded.update(set(chunk) - set(result.unexpected_keys))

        for _, names in files.shards():
            for name in names:
                if name in experts:
                    _put_expert(files, name, experts[name], check_scales)
                else:
                    pending.update([_normalized(files, name, layers, check_scales, stacked)])
            flush(final=False)
        flush(final=True)
        for load in {id(load): load for load in experts.values()}.values():
            loaded.update(_join(load.prefix, p) for p in load.complete())
    missing = [k for k in expected if k not in loaded]
    if strict and (missing or unexpected):
        raise InvalidInputError(f"load_checkpoint: the checkpoint at {str(folder)!r} does not match the model: "
                                f"missing {_few(missing)}; unexpected {_few(unexpected)}; pass strict=False to load "
                                "what matches")
    return LoadedKeys(missing, unexpected)


def _awaits_partner(key: str, pending: Mapping[str, Any], layers: Mapping[str, Any]) -> bool:
    prefix, leaf = _split(key)
    pair = QuantLinear.QUANT_PAIRS[0]
    return prefix in layers and leaf in pair and not all(_join(prefix, p) in pending for p in pair)


def quantize_from_config(model: nn.Module, quantization_config: Mapping[str, Any] | str | os.PathLike) -> nn.Module:
    """Replace, in place, the `nn.Linear` layers a `quantization_config` quantizes by FP8 `QuantLinear`s
    of its block size and scale format, and its stacked-experts modules (transformers >= 5's) by FP8
    `QuantExperts`, and return `model`.

    quantization_config: the dict (config.json's entry), or a checkpoint folder holding config.json.
    Layers are chosen with the config's own rules (`modules_to_not_convert`, default ("lm_head",), or
    compressed-tensors' `targets` and `ignore`). Weights are quantized with `QuantLinear.from_linear`;
    a model on the meta device gets empty layers. Save the result with `save_checkpoint`.
    """
    scheme = read_scheme(quantization_config) if isinstance(quantization_config, (str, os.PathLike)) \
        else scheme_from_config(quantization_config)

    def make(name: str, linear: nn.Linear) -> QuantLinear:
        fmt = scheme.layer(name)
        return QuantLinear.from_linear(linear, dtype=torch.float8_e4m3fn, block_size=fmt.block_size,
                                       scale_fmt=fmt.scale_fmt)

    def expert(name: str) -> LayerFormat | None:  # the rules see experts as checkpoints name them, per expert
        return scheme.layer(per_expert_names(name, None)[0])

    def make_experts(name: str, experts: nn.Module) -> QuantExperts:
        fmt = expert(name)
        return QuantExperts.from_module(experts, dtype=torch.float8_e4m3fn, block_size=fmt.block_size,
                                        scale_fmt=fmt.scale_fmt)

    replace_linears(model, lambda name: scheme.layer(name) is not None, make)
    return replace_where(model, is_stacked_experts, lambda name: expert(name) is not None, make_experts)


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20,
          "gib": 2**30, "tib": 2**40}


def _size_bytes(value: int | str) -> int:
    """A shard size limit: an int of bytes or a string such as "5GB" (10^9) or "500MiB" (2^20).

    huggingface_hub's parse_size_to_int reads the same decimal units (it has no KiB..TiB) but is not a
    dependency: the `hf` extra is safetensors alone, and this is one regular expression."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", value) if isinstance(value, str) else None
    if match is None or match.group(2).lower() not in _UNITS or float(match.group(1)) <= 0:
        raise InvalidInputError(f"save_checkpoint: max_shard_size must be a positive number of bytes or a size such "
                                f"as '5GB' or '500MiB', got {value!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def _scheme_for(model: nn.Module, format: str, scale_dtype: torch.dtype, allow_partial_blocks: bool
                ) -> tuple[Scheme, dict[str, QuantLinear], dict[str, QuantExperts]]:
    """The scheme `model` is written in, and its QuantLinears and QuantExperts by name; raises, before
    anything is written, for what the format or the ecosystem's loaders cannot take."""
    op = "save_checkpoint"
    named = list(model.named_modules(remove_duplicate=False))
    quant = {name: m for name, m in named if isinstance(m, QuantLinear)}
    experts = {name: m for name, m in named if isinstance(m, QuantExperts)}
    floats = tuple(name for name, m in named if isinstance(m, nn.Linear) and name)
    if not quant and not experts:
        raise InvalidInputError(f"{op}: the model has no QuantLinear or QuantExperts; quantize it first "
                                "(quantize_model or quantize_from_config)")
    layers = {**{name: m.weight for name, m in quant.items()}, **{name: m.gate_up_proj for name, m in experts.items()}}
    int8 = [name for name, w in layers.items() if w.dtype != torch.float8_e4m3fn]
    if int8:
        raise InvalidInputError(f"{op}: {_few(int8)} store {dtype_name(layers[int8[0]].dtype)} weights; the fp8 "
                                "and compressed-tensors block formats hold float8_e4m3fn only: quantize with "
                                "dtype=torch.float8_e4m3fn (or save the state_dict with torch.save)")
    kinds = {(m.block_size, m.scale_fmt) for m in (*quant.values(), *experts.values())}
    if len(kinds) > 1:
        raise InvalidInputError(f"{op}: the quantized layers mix block sizes and scale formats {sorted(kinds)}; a "
                                "checkpoint config describes one (requantize with a single block_size and scale_fmt)")
    (bn, bk), scale_fmt = kinds.pop()
    if format == "compressed-tensors" and scale_fmt == "ue8m0":
        raise InvalidInputError(f"{op}: compressed-tensors has no ue8m0 activation scales (the layers use "
                                "scale_fmt='ue8m0'); write format='fp8', whose scale_fmt: 'ue8m0' says so")
    split = [f"{name} (I = {m.intermediate_size})" for name, m in experts.items() if m.intermediate_size % bn]
    if split:
        raise InvalidInputError(f"{op}: the experts {_few(split)} have an intermediate size that is not a whole number "
                                f"of {bn}-row blocks, so their gate and up projections share blocks and cannot be "
                                "written per expert as transformers and vLLM load them; quantize with a block_size "
                                "whose Bn divides I (or save the state_dict with torch.save)")
    partial = [f"{name} [{m.out_features}, {m.in_features}]" for name, m in quant.items()
               if m.out_features % bn or m.in_features % bk]
    partial += [f"{name} (H = {m.hidden_size}, I = {m.intermediate_size})" for name, m in experts.items()
                if m.hidden_size % bn or m.hidden_size % bk or m.intermediate_size % bk]
    if partial and not allow_partial_blocks:
        raise InvalidInputError(f"{op}: {_few(partial)} are not a whole number of {bn}x{bk} blocks (N or K not a "
                                "multiple of the block); transformers and vLLM refuse such checkpoints (transformers: "
                                "'Weight shape (320, 256) not divisible by scale grid (3, 2)'). Skip those layers, "
                                "choose a block that divides them, or pass allow_partial_blocks=True to write them "
                                "anyway (quantcore.nn.load_checkpoint reads them)")
    if scale_dtype == _E8M0 and _E8M0 is not None:
        scales = {**{name: [m.weight_scale_inv] for name, m in quant.items()},
                  **{name: [m.gate_up_proj_scale_inv, m.down_proj_scale_inv] for name, m in experts.items()}}
        inexact = [name for name, ts in scales.items() if not all(torch.equal(t.to(_E8M0).float(), t) for t in ts)]
        if inexact:
            raise InvalidInputError(f"{op}: the scales of {_few(inexact)} are not all finite powers of two, so "
                                    "float8_e8m0fnu cannot hold them; quantize with scale_fmt='ue8m0' or keep "
                                    "scale_dtype=torch.float32")
    elif scale_dtype != torch.float32:
        raise InvalidInputError(f"{op}: scale_dtype must be torch.float32 or torch.float8_e8m0fnu, got {scale_dtype!r}")
    scheme = Fp8Scheme((bn, bk), scale_fmt, floats) if format == "fp8" else \
        CompressedTensorsScheme.fp8_block((bn, bk), floats)
    clash = [name for name in (*quant, *(n for prefix, m in experts.items() for n in per_expert_names(prefix, m)))
             if scheme.layer(name) is None]
    if clash:
        raise InvalidInputError(f"{op}: the float linears' names {floats} also match quantized layer(s) {clash} under "
                                f"the {format} config's skip rules (transformers matches a prefix or a suffix), so a "
                                "loader would keep those in float; rename the float layer or quantize it too")
    return scheme, quant, experts


def _tensors(model: nn.Module, scheme: Scheme, quant: Mapping[str, QuantLinear],
             experts: Mapping[str, QuantExperts], scale_dtype: torch.dtype) -> list[tuple[str, torch.Tensor]]:
    """The state dict in the checkpoint's names and dtypes, experts per expert; a tensor shared by several
    names (a shared layer, tied weights) once, under its first name, as safetensors' save_model writes it."""
    out, seen, storages, written = [], set(), set(), set()
    for name, t in model.state_dict().items():
        if t.is_meta:
            raise InvalidInputError(f"save_checkpoint: {name} is on the meta device (never loaded); load or "
                                    "initialise the model before saving it")
        prefix, leaf = _split(name)
        if prefix in experts and leaf in experts[prefix].quant_params():
            if id(experts[prefix]) not in written:
                written.add(id(experts[prefix]))
                out += expert_tensors(prefix, experts[prefix], scheme.scale_name, scale_dtype)
            continue
        if prefix in quant and leaf == "weight_scale_inv":
            name, t = _join(prefix, scheme.scale_name), t.to(scale_dtype)
        if t.numel():
            view = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
            if view in seen:
                continue
            if view[0] in storages:  # a different view of stored memory: safetensors wants it separate
                t = t.clone()
            seen.add(view)
            storages.add(view[0])
        out.append((name, t))
    return out


def _shards(tensors: list[tuple[str, torch.Tensor]], limit: int) -> list[list[tuple[str, torch.Tensor]]]:
    """`tensors` in order, cut into shards of at most `limit` bytes; a larger tensor gets a shard of its
    own. These are huggingface_hub's split_torch_state_dict_into_shards rules, written out here because
    huggingface_hub is not a dependency (the `hf` extra is safetensors alone)."""
    shards, current, size = [], [], 0
    for name, t in tensors:
        nbytes = t.numel() * t.element_size()
        if nbytes > limit:
            shards.append([(name, t)])
            continue
        if current and size + nbytes > limit:
            shards.append(current)
            current, size = [], 0
        current.append((name, t))
        size += nbytes
    return shards + [current] if current else shards


def _old_checkpoint(folder: Path) -> tuple[list[str], list[str]]:
    """The files of `folder` a checkpoint save replaces (config.json first, then the index and the
    shards as transformers names them), and its other safetensors files, which loaders would read
    with the new shards."""
    if not folder.is_dir():
        return [], []
    names = {p.name for p in folder.iterdir()}
    ours = [n for n in (CONFIG_FILE, INDEX_FILE) if n in names] + \
        sorted(n for n in names if n == "model.safetensors" or NUMBERED_SHARD.fullmatch(n))
    return ours, sorted(n for n in names if n.endswith(".safetensors") and n not in ours)


def save_checkpoint(model: nn.Module, folder: str | os.PathLike, *, format: str = "fp8",
                    config: Mapping[str, Any] | None = None, max_shard_size: int | str = "5GB",
                    scale_dtype: torch.dtype = torch.float32, allow_partial_blocks: bool = False,
                    overwrite: bool = False) -> Path:
    """Write `model` as a Hugging Face checkpoint folder that transformers and vLLM load; returns the folder.

    model: its QuantLinears and QuantExperts (FP8 e4m3, one block size and scale format for all) are
    written as `<layer>.weight` plus the block scale (experts per expert,
    `<experts>.<e>.gate_proj|up_proj|down_proj.weight`, as DeepSeek-V3 and Qwen3-MoE store them):
    `weight_scale_inv` for format "fp8" (DeepSeek-V3 / transformers `FineGrainedFP8Config` / vLLM
    `Fp8Config`), `weight_scale` for "compressed-tensors" (FP8_BLOCK-style group, dynamic 1×Bk
    activation groups); every other tensor of its state dict as it is. Its remaining `nn.Linear`s are listed as kept in float (`modules_to_not_convert` and
    `ignored_layers`, or `ignore`). A tensor shared by several names is written once.
    folder: gets `config.json` (`config`, default `model.config.to_dict()` when the model has one,
    else {}, with its `quantization_config` set), safetensors shards of at most `max_shard_size`
    (bytes, or "5GB", "500MiB"; one tensor larger than that gets a shard of its own) named as
    transformers names them, and `model.safetensors.index.json` when there are several.
    scale_dtype: torch.float32, or torch.float8_e8m0fnu when every scale is a power of two
    (scale_fmt="ue8m0"). allow_partial_blocks: transformers and vLLM refuse weights that are not a
    whole number of blocks, so such layers raise `InvalidInputError`, naming them, before anything is
    written; True writes them anyway (quantcore reads them).

    The files are written beside `folder` and synced first (`quantcore.nn.files.write_folder`): a new
    or empty folder gets them all with one rename, so a save that is killed, interrupted or runs out
    of disk leaves it as it was; `CheckpointWriteError` (an `OSError`) names the folder when the disk
    is full. A folder holding config.json, the index or model shards is refused with
    `InvalidInputError`, touching nothing, unless `overwrite=True`: then those files are replaced
    (config.json removed first and written last, so a save killed meanwhile leaves no loadable mix
    of old and new) and the folder's other files, such as a tokenizer, are kept. Any other
    *.safetensors file in the folder is refused either way, since loaders would read it with the
    new shards.
    """
    if not isinstance(model, nn.Module):
        raise InvalidInputError(f"save_checkpoint: expected an nn.Module, got {type(model).__name__}")
    if format not in FORMATS:
        raise InvalidInputError(f"save_checkpoint: format must be one of {FORMATS}, got {format!r}")
    limit = _size_bytes(max_shard_size)
    scheme, quant, experts = _scheme_for(model, format, scale_dtype, allow_partial_blocks)
    if config is None:
        own = getattr(model, "config", None)
        config = own.to_dict() if hasattr(own, "to_dict") else {}
    if not isinstance(config, Mapping):
        raise InvalidInputError(f"save_checkpoint: config must be a mapping (config.json's entries) or None, got "
                                f"{type(config).__name__}")
    config = dict(config) | {"quantization_config": scheme.to_config()}
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise InvalidInputError(f"save_checkpoint: {str(folder)!r} is a file; a checkpoint is written into a folder")
    old, foreign = _old_checkpoint(folder)
    if foreign:
        raise InvalidInputError(f"save_checkpoint: {str(folder)!r} holds {_few(foreign)}, which no quantcore "
                                "checkpoint writes and which loaders would read with the new shards; move them out "
                                "or save into a new or empty folder")
    if old and not overwrite:
        raise InvalidInputError(f"save_checkpoint: {str(folder)!r} already holds a checkpoint's files ({_few(old)}), "
                                "which this save would replace; pass overwrite=True to replace them (the folder's "
                                "other files are kept), or save into a new or empty folder")
    save_file = safetensors_module("safetensors.torch", "save_checkpoint").save_file
    tensors = _tensors(model, scheme, quant, experts, scale_dtype)
    shards = _shards(tensors, limit)
    files = ["model.safetensors"] if len(shards) == 1 else \
        [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    size = sum(t.numel() * t.element_size() for _, t in tensors)
    writers = {file: functools.partial(_write_shard, save_file, shard) for file, shard in zip(files, shards)}
    if len(shards) > 1:
        index = {"metadata": {"total_size": size},
                 "weight_map": {name: file for file, shard in zip(files, shards) for name, _ in shard}}
        writers[INDEX_FILE] = functools.partial(_write_json, index)
    writers[CONFIG_FILE] = functools.partial(_write_json, config)  # last: the file loaders start from
    write_folder(folder, writers, stale=old, op="save_checkpoint", size=size)
    return folder


def _write_shard(save_file: Any, shard: list[tuple[str, torch.Tensor]], path: Path) -> None:
    save_file({name: _own_memory(t.detach().to("cpu")) for name, t in shard}, str(path), metadata={"format": "pt"})


def _own_memory(t: torch.Tensor) -> torch.Tensor:
    """`t` contiguous in memory of its own: safetensors refuses tensors that share memory (the experts'
    per-expert views of one stacked parameter), so a view is copied, one shard's worth at a time."""
    t = t.contiguous()
    return t if t.untyped_storage().nbytes() == t.numel() * t.element_size() else t.clone()


def _write_json(value: Any, path: Path) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")


def load_fp8_checkpoint(model: nn.Module, checkpoint: str | os.PathLike | Mapping[str, torch.Tensor], *,
                        strict: bool = True, check_scales: bool = True):
    """Load DeepSeek-V3 / Hugging Face FP8 tensors into `model` (converted with `quantize_model`), with no config.

    checkpoint: a `.safetensors` file, a directory of them (following `model.safetensors.index.json`
    when present), or a state dict. Quantized layers read `<name>.weight` (e4m3, [N, K]) and
    `<name>.weight_scale_inv` (fp32, [ceil(N/Bn), ceil(K/Bk)]); other tensors load as usual. Returns
    `load_state_dict`'s (missing_keys, unexpected_keys). Raises `InvalidInputError` naming the key when a
    quantized tensor has the wrong dtype or shape, and, with `check_scales` (the default), when a block
    scale holds a value that is not finite and > 0. For a folder with a config.json, `load_checkpoint`
    also reads the config, converts the linears and streams the shards.
    """
    if isinstance(checkpoint, Mapping):
        state = dict(checkpoint)
    elif not isinstance(checkpoint, (str, os.PathLike)):
        raise InvalidInputError(f"load_fp8_checkpoint: checkpoint must be a path (a .safetensors file or a folder) "
                                f"or a state dict, got {type(checkpoint).__name__}")
    else:
        with SafetensorsFiles(checkpoint, op="load_fp8_checkpoint") as files:
            state = {name: files.get(name) for name in files.names()}
    if check_scales:
        verify_scales(state, "load_fp8_checkpoint")
    return model.load_state_dict(state, strict=strict)
