"""Expert weights in checkpoint folders, read into and written from `QuantExperts`.

Checkpoints store a mixture-of-experts layer's experts in one of two ways, and `load_checkpoint` reads both:
- per expert, as DeepSeek-V3's and Qwen3-MoE's FP8 folders do and transformers' and vLLM's loaders read
  them: `<experts>.<e>.gate_proj|up_proj|down_proj.weight` ([I, H], [I, H], [H, I] codes; Mixtral's and
  MiniMax-M2's `w1|w3|w2`) with the block scale beside each (`weight_scale_inv` or `weight_scale`).
  `save_checkpoint` writes this, with the gate_proj/up_proj/down_proj names.
- stacked, as `QuantExperts` and transformers' FP8 experts modules hold them: `<experts>.gate_up_proj`
  [E, 2I, H] and `<experts>.down_proj` [E, H, I] with `<name>_scale_inv` (or `<name>_scale`) beside each.
Either is copied into a `QuantExperts` at `<experts>` (a stacked float experts module there is replaced by
an empty one first), each tensor into its slice of the stacked parameters as its shard is read: nothing
is dequantized, and no copy of the experts is made besides the layer's own.

Splitting gate_up into gate and up splits its scale grid at row I / Bn, so per-expert files need I to be
a whole number of Bn blocks (DeepSeek-V3: 2048, Qwen3-30B-A3B: 768, both of 128).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

import torch
from torch import nn

from ..errors import InvalidInputError
from ..formats import dtype_name
from .experts import QuantExperts, gated_activation, is_stacked_experts
from .params import frozen
from .schemes import LayerFormat, Scheme

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
# The same three as Mixtral's and MiniMax-M2's checkpoints name them: w1 the gate, w3 the up, w2 the down.
NAMINGS = (PROJECTIONS, ("w1", "w3", "w2"))
STACKED = ("gate_up_proj", "down_proj")
_SCALE_SUFFIXES = ("_scale_inv", "_scale")
_PER_EXPERT = re.compile(r"(?P<experts>.+)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj|w1|w2|w3)")


def per_expert(layer: str) -> tuple[str, int, str] | None:
    """(experts module name, expert index, projection as stored) of a per-expert linear's name, else None."""
    m = _PER_EXPERT.fullmatch(layer)
    return (m["experts"], int(m["e"]), m["proj"]) if m else None


def stacked_scales(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, str]:
    """{scale name: codes name} of the stacked 3-D expert weights among a checkpoint's tensor names."""
    found = {}
    for name, shape in shapes.items():
        prefix, _, leaf = name.rpartition(".")
        if leaf in STACKED and len(shape) == 3:
            for suffix in _SCALE_SUFFIXES:
                if name + suffix in shapes:
                    found[name + suffix] = name
    return found


@dataclass
class ExpertsLoad:
    """One `QuantExperts` a checkpoint fills: {checkpoint name: (parameter, index)} of every tensor it
    needs, and those already copied."""

    prefix: str
    module: QuantExperts
    slots: dict[str, tuple[str, tuple]]
    scales: frozenset[str]
    filled: set[str] = field(default_factory=set)

    def put(self, name: str, t: torch.Tensor) -> None:
        """Copy checkpoint tensor `name` (codes as stored, scales as fp32) into its slice of the layer."""
        param, index = self.slots[name]
        p = self.module._parameters[param]
        target = p[index] if index else p
        if t.dtype != p.dtype or tuple(t.shape) != tuple(target.shape):
            raise InvalidInputError(f"load_checkpoint: {name} is {dtype_name(t.dtype)} {tuple(t.shape)}; the experts "
                                    f"layer {self.prefix!r} ({self.module.extra_repr()}) takes {dtype_name(p.dtype)} "
                                    f"{tuple(target.shape)} there; build it with the checkpoint's sizes and block")
        if p.is_meta:  # an empty layer (built on the meta device) is made real where the tensors are read
            p = frozen(torch.empty(p.shape, dtype=p.dtype, device=t.device))
            setattr(self.module, param, p)
        with torch.no_grad():
            (p[index] if index else p).copy_(t)
        self.filled.add(name)

    def complete(self) -> list[str]:
        """The layer's parameters the checkpoint has filled whole."""
        partial = {param for name, (param, _) in self.slots.items() if name not in self.filled}
        return [param for param in self.module.quant_params() if param not in partial]


def _empty_experts(module: nn.Module, prefix: str, fmt: LayerFormat) -> QuantExperts:
    """The QuantExperts a checkpoint is loaded into at `prefix`: `module` itself, checked against the
    checkpoint's format, or an empty one in place of a stacked float experts module (meta stays meta)."""
    if isinstance(module, QuantExperts):
        if module.gate_up_proj.dtype != torch.float8_e4m3fn or \
                (module.block_size, module.scale_fmt) != (fmt.block_size, fmt.scale_fmt):
            raise InvalidInputError(f"load_checkpoint: {prefix!r} is a QuantExperts ({module.extra_repr()}); the "
                                    f"checkpoint stores it float8_e4m3fn with block_size={fmt.block_size} and "
                                    f"scale_fmt={fmt.scale_fmt!r}: build it so")
        return module
    E, two_i, H = module.gate_up_proj.shape
    return QuantExperts(E, H, two_i // 2, dtype=torch.float8_e4m3fn, block_size=fmt.block_size,
                        scale_fmt=fmt.scale_fmt, activation=gated_activation(module),
                        device=module.gate_up_proj.device)


def _experts_module(modules: Mapping[str, nn.Module], prefix: str) -> nn.Module | None:
    m = modules.get(prefix)
    return m if isinstance(m, QuantExperts) or (m is not None and is_stacked_experts(m)) else None


def plan_experts(model: nn.Module, layers: dict[str, tuple[LayerFormat, str]], shapes: Mapping[str, tuple],
                 scheme: Scheme) -> dict[str, ExpertsLoad]:
    """{checkpoint name: the ExpertsLoad it goes into} for the checkpoint's expert tensors whose experts
    module in `model` is a QuantExperts or a stacked float experts module (replaced in `model` by an empty
    QuantExperts here). The per-expert linears found are removed from `layers`; per-expert linears of a
    model that keeps its experts as separate modules (an nn.ModuleList) stay there, loaded as linears."""
    modules = dict(model.named_modules(remove_duplicate=False))
    grouped: dict[str, dict[str, tuple[int, str, LayerFormat, str]]] = {}
    for layer, (fmt, scale_name) in layers.items():
        parsed = per_expert(layer)
        if parsed and _experts_module(modules, parsed[0]) is not None:
            grouped.setdefault(parsed[0], {})[layer] = (parsed[1], parsed[2], fmt, scale_name)
    stacked: dict[str, dict[str, str]] = {}
    for scale, codes in stacked_scales(shapes).items():
        prefix, _, leaf = codes.rpartition(".")
        stacked.setdefault(prefix, {})[leaf] = scale
    plans = {}
    for prefix in sorted(set(grouped) | set(stacked)):
        module = _experts_module(modules, prefix)
        if module is None:
            got = "no module" if prefix not in modules else f"a {type(modules[prefix]).__name__}"
            raise InvalidInputError(f"load_checkpoint: the checkpoint stores stacked expert weights under "
                                    f"{prefix!r}, where the model has {got}; build the model with a QuantExperts "
                                    "(or transformers' stacked experts module) there")
        if prefix in grouped and prefix in stacked:
            raise InvalidInputError(f"load_checkpoint: the checkpoint stores the experts of {prefix!r} both per expert "
                                    "and stacked; a checkpoint holds one of the two")
        if prefix in grouped:
            load = _per_expert_plan(prefix, module, grouped[prefix])
            for layer in grouped[prefix]:
                del layers[layer]
        else:
            load = _stacked_plan(prefix, module, stacked[prefix], scheme)
        _replace(model, modules, prefix, load.module)
        plans.update((name, load) for name in load.slots)
    return plans


def _replace(model: nn.Module, modules: dict[str, nn.Module], prefix: str, new: nn.Module) -> None:
    if modules[prefix] is not new:
        parent, _, child = prefix.rpartition(".")
        setattr(model.get_submodule(parent), child, new)
        modules[prefix] = new


def _per_expert_plan(prefix: str, module: nn.Module, layers: dict[str, tuple[int, str, LayerFormat, str]]
                     ) -> ExpertsLoad:
    formats = {fmt for _, _, fmt, _ in layers.values()}
    if len(formats) > 1:
        raise InvalidInputError(f"load_checkpoint: the experts of {prefix!r} are stored in several formats "
                                f"{sorted(map(str, formats))}; one experts layer has one block and scale format")
    fmt = formats.pop()
    experts = _empty_experts(module, prefix, fmt)
    E, I, bn = experts.num_experts, experts.intermediate_size, experts.block_size[0]
    if I % bn:
        raise InvalidInputError(f"load_checkpoint: the experts of {prefix!r} have intermediate size {I}, not a whole "
                                f"number of {bn}-row blocks, so their stacked gate_up scales cannot hold the gate's "
                                "and the up projection's separate blocks; quantcore loads per-expert checkpoints "
                                f"whose intermediate size is a multiple of {bn}")
    beyond = sorted({e for e, _, _, _ in layers.values() if e >= E})
    if beyond:
        raise InvalidInputError(f"load_checkpoint: the checkpoint stores experts up to {beyond[-1]} under {prefix!r}, "
                                f"whose layer has {E}; build it with num_experts={beyond[-1] + 1}")
    scale_leaf = next(iter(layers.values()))[3].rpartition(".")[2]
    namings = {names for names in NAMINGS for _, proj, _, _ in layers.values() if proj in names}
    if len(namings) > 1:
        raise InvalidInputError(f"load_checkpoint: the experts of {prefix!r} are stored under both gate_proj/up_proj/"
                                "down_proj and w1/w3/w2 names; a checkpoint uses one of the two")
    names = dict(zip(PROJECTIONS, namings.pop()))
    slots, scales = {}, set()
    for e in range(E):
        for proj in PROJECTIONS:
            stored = f"{prefix}.{e}.{names[proj]}"
            scale_name = layers[stored][3] if stored in layers else f"{stored}.{scale_leaf}"
            for what, name in (("weight", f"{stored}.weight"), ("scale", scale_name)):
                param = "down_proj" if proj == "down_proj" else "gate_up_proj"
                rows = I if what == "weight" else I // bn
                index = (e,) if proj == "down_proj" else \
                    (e, slice(0, rows) if proj == "gate_proj" else slice(rows, 2 * rows))
                slots[name] = (param + ("_scale_inv" if what == "scale" else ""), index)
            scales.add(scale_name)
    return ExpertsLoad(prefix, experts, slots, frozenset(scales))


def _stacked_plan(prefix: str, module: nn.Module, stored: dict[str, str], scheme: Scheme) -> ExpertsLoad:
    fmt = scheme.layer(prefix)
    if fmt is None:
        raise InvalidInputError(f"load_checkpoint: {prefix!r} holds block-quantized stacked experts, but the config's "
                                f"{scheme.method} rules keep it in floating point; the checkpoint and its config.json "
                                "disagree")
    experts = _empty_experts(module, prefix, fmt)
    slots = {}
    for leaf in STACKED:
        if leaf not in stored:
            raise InvalidInputError(f"load_checkpoint: the checkpoint stores {prefix}.{STACKED[0]} and "
                                    f"{prefix}.{STACKED[1]} stacked, but has no block scale for {prefix}.{leaf}")
        slots[f"{prefix}.{leaf}"] = (leaf, ())
        slots[stored[leaf]] = (leaf + "_scale_inv", ())
    return ExpertsLoad(prefix, experts, slots, frozenset(stored.values()))


def expert_tensors(prefix: str, experts: QuantExperts, scale_name: str, scale_dtype: torch.dtype
                   ) -> list[tuple[str, torch.Tensor]]:
    """The tensors `save_checkpoint` writes for `experts` at `prefix`: per expert, as transformers and vLLM
    load them (views of the layer's parameters, copied one shard at a time as they are written)."""
    I, bn = experts.intermediate_size, experts.block_size[0]
    out = []
    for e in range(experts.num_experts):
        parts = {"gate_proj": (slice(0, I), slice(0, I // bn)), "up_proj": (slice(I, 2 * I), slice(I // bn, None))}
        for proj in PROJECTIONS:
            if proj == "down_proj":
                codes, scales = experts.down_proj[e], experts.down_proj_scale_inv[e]
            else:
                rows, scale_rows = parts[proj]
                codes, scales = experts.gate_up_proj[e, rows], experts.gate_up_proj_scale_inv[e, scale_rows]
            name = f"{prefix}.{e}.{proj}"
            out += [(f"{name}.weight", codes), (f"{name}.{scale_name}", scales.to(scale_dtype))]
    return out


def per_expert_names(prefix: str, experts: QuantExperts | None) -> list[str]:
    """The per-expert linears' names `expert_tensors` writes for `experts` at `prefix` (None: expert 0's),
    as a config's skip rules see them."""
    return [f"{prefix}.{e}.{proj}" for e in range(1 if experts is None else experts.num_experts)
            for proj in PROJECTIONS]
