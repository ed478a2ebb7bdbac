"""`QuantExperts`: the experts of a mixture-of-experts layer with block-quantized, stacked weights.

The experts are gated MLPs, `down(act(gate(x)) * up(x))`, as DeepSeek-V3, Qwen3-MoE and Mixtral have them.
Their weights are stacked across experts, the gate and up projections side by side as one gate_up
projection (vLLM's and DeepGEMM's layout): `gate_up_proj` [E, 2I, H] codes with `gate_up_proj_scale_inv`
[E, ceil(2I/Bn), ceil(H/Bk)] fp32, and `down_proj` [E, H, I] with `down_proj_scale_inv` [E, ceil(H/Bn),
ceil(I/Bk)], all frozen parameters, as `QuantLinear`'s weight and `weight_scale_inv`. These are the names
and shapes of transformers' (>= 5) experts modules (`Qwen3MoeExperts`, `DeepseekV3Experts`, ... and their
FP8 form), whose forward takes the same arguments: `from_module` and `quantize_model` replace one.

A forward takes the router's choice (`topk_ids`, `topk_weights`: the router and any shared expert stay
ordinary modules of the model) and runs five ops, each on the backend the registry picks:
`moe_permute` (sort the routed rows by expert, quantizing each token once) -> `grouped_mm` (gate_up) ->
`silu_mul_quant` (SiLU(gate) times up in fp32, quantized; another activation: computed, then `act_quant`)
-> `grouped_mm` (down) -> `moe_unpermute` (the weighted sum in slot order). Two layouts, chosen by the
routed row count (`QuantExperts.path`): masked (per-expert slabs of max_m rows, `moe_permute_masked` /
`grouped_mm_masked`) up to `masked_max_rows` (none by default), contiguous above. Both give each expert's rows the same
bits (FP8 on FP8 tensor cores: within that accumulation's tolerance, their tiles differing), and both
read the routing on the device only, so a forward can be captured in a CUDA graph and
replayed with new routing; under `torch.compile` it is the `torch.ops.quantcore` custom ops (exact fakes:
the shapes depend on T, k, E and max_m alone).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, NamedTuple

import torch
from torch import nn

from .. import ops
from ..backends.torch.activation import activate
from ..definitions import checks
from ..errors import InvalidInputError
from ..formats import DEFAULT_BLOCK, dtype_name
from .params import QuantParams, dense_shape, frozen, resolve_dtype

_LAYER = "QuantExperts"
GATED_ACTIVATIONS = ("silu", "gelu", "gelu_tanh")

# The masked layout up to this many routed rows (tokens × top-k), the contiguous one above: none by default.
# Measured on an H100 (2026-12-07, `quantcore bench --moe`, benchmarks/results/h100-moe*.json): the contiguous
# grouped GEMM took less GPU time than the masked one at T = 1 on every DeepSeek-V3 and Qwen3-30B-A3B projection
# (84 vs 98 µs, 47 vs 53, 16 vs 19, FP8) and about the same at T = 64 (2170 vs 2126, 1082 vs 1178, 141 vs 143);
# 4 Qwen3-30B-A3B MoE layers a decode step in a CUDA graph took 215 / 570 / 1072 µs contiguous against
# 234 / 566 / 1150 masked at batch 1 / 8 / 64 (eager 641 / 674 / 1133 against 817 / 704 / 1226). Both layouts
# replay in CUDA graphs; `QuantExperts.masked_max_rows` sets a bound per layer (the masked layout's fixed shapes).
MASKED_MAX_ROWS = 0
# The gate_up GEMM's output, read once by the activation: bf16, as DeepSeek-V3's and vLLM's MoE layers keep it.
INTERMEDIATE_DTYPE = torch.bfloat16


# transformers' activation modules by class name (`transformers.activations`, not imported: not a dependency).
_ACTIVATION_CLASSES = {"SiLU": "silu", "SiLUActivation": "silu", "GELUActivation": "gelu", "GELUTanh": "gelu_tanh",
                       "PytorchGELUTanh": "gelu_tanh", "NewGELUActivation": "gelu_tanh"}
# Attributes of transformers' experts modules that change the gating (clamps, soft caps, GPT-OSS's alpha).
_GATING_OPTIONS = ("limit", "alpha", "swiglu_limit", "swiglu_alpha", "gate_softcap", "up_softcap")


def is_stacked_experts(module: nn.Module) -> bool:
    """Whether `module` holds float experts stacked as QuantExperts keeps them (transformers >= 5's
    experts modules): 3-D floating-point `gate_up_proj` [E, 2I, H] and `down_proj` [E, H, I]."""
    gate_up, down = (module._parameters.get(name) for name in ("gate_up_proj", "down_proj"))
    if not all(isinstance(t, torch.Tensor) and t.dim() == 3 and t.is_floating_point() for t in (gate_up, down)):
        return False
    E, two_i, H = gate_up.shape
    return not isinstance(module, QuantExperts) and two_i % 2 == 0 and tuple(down.shape) == (E, H, two_i // 2)


def gated_activation(module: nn.Module) -> str:
    """The gate activation of a stacked-experts module, from its `act_fn`, as QuantExperts names it; an
    `InvalidInputError` for a gating QuantExperts does not compute (biases, clamps, other activations)."""
    name = type(module).__name__
    biased = [b for b in ("gate_up_proj_bias", "down_proj_bias") if getattr(module, b, None) is not None]
    options = [o for o in _GATING_OPTIONS if getattr(module, o, None) is not None]
    if biased or options:
        raise InvalidInputError(f"{_LAYER}: {name} has {', '.join(biased + options)}; QuantExperts computes "
                                "down(act(gate(x)) * up(x)) without biases, clamps or soft caps, so it cannot stand "
                                "in for this module: keep it in floating point (quantize_model's skip)")
    act = getattr(module, "act_fn", None)
    kind = type(act).__name__
    if isinstance(act, nn.GELU):
        return "gelu_tanh" if act.approximate == "tanh" else "gelu"
    if kind not in _ACTIVATION_CLASSES:
        raise InvalidInputError(f"{_LAYER}: {name}.act_fn is {kind}; QuantExperts computes SiLU, GELU or tanh-GELU "
                                "gates: keep this module in floating point (quantize_model's skip)")
    return _ACTIVATION_CLASSES[kind]


def _quantized(module: Any) -> tuple | None:
    """(codes dtype, block_size, scale_fmt) of a block-quantized linear (a QuantLinear), None otherwise."""
    if isinstance(module, QuantParams) and module.QUANT_PAIRS == (("weight", "weight_scale_inv"),):
        return module.weight.dtype, module.block_size, module.scale_fmt
    return None


class ExpertsPath(NamedTuple):
    """How a forward of `tokens` tokens routed to `top_k` experts each runs: `layout` "masked" or
    "contiguous", `max_m` the masked slabs' rows (None for contiguous), and `reason` in words."""

    layout: str
    max_m: int | None
    reason: str


def _op(name: str):
    """The public op, or under torch.compile its custom op (one graph node with an exact fake)."""
    return getattr(torch.ops.quantcore, name) if torch.compiler.is_compiling() else getattr(ops, name)


class QuantExperts(QuantParams):
    """E gated-MLP experts, `y_e(x) = down_e(act(gate_e(x)) * up_e(x))`, with block-quantized weights.

    num_experts E, hidden_size H, intermediate_size I: any sizes >= 1. dtype: the weights' and the
    activations' storage (torch.float8_e4m3fn, torch.int8, a format name or "auto", as `QuantLinear`'s);
    block_size (Bn, Bk): the weights' block, activations are quantized per 1×Bk. scale_fmt: "fp32" or
    "ue8m0" (power-of-two scales). activation: the gate's, "silu" (SwiGLU), "gelu" or "gelu_tanh".
    device: where the parameters are made (a `with torch.device("meta"):` block builds an empty layer).

    Parameters, all frozen: `gate_up_proj` [E, 2I, H] (rows :I the gate, I: the up projection) with
    `gate_up_proj_scale_inv` [E, ceil(2I/Bn), ceil(H/Bk)] fp32, `down_proj` [E, H, I] with
    `down_proj_scale_inv` [E, ceil(H/Bn), ceil(I/Bk)] fp32.

    `forward(x [..., H], topk_ids [..., k] int32/int64, topk_weights [..., k] float) -> [..., H]` in x's
    dtype: Σ_j topk_weights[t, j] · y_{topk_ids[t, j]}(x[t]), summed in fp32 in slot order. Expert ids
    must lie in 0..E-1 (checked where they are on the CPU; on the GPU a pair with another id adds nothing).
    """

    QUANT_PAIRS = (("gate_up_proj", "gate_up_proj_scale_inv"), ("down_proj", "down_proj_scale_inv"))
    LAYER = _LAYER
    masked_max_rows = MASKED_MAX_ROWS

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, *, dtype: Any = torch.float8_e4m3fn,
                 block_size: tuple[int, int] = DEFAULT_BLOCK, scale_fmt: str = "fp32", activation: str = "silu",
                 device: torch.device | str | None = None):
        super().__init__()
        self.num_experts = checks.positive_int(_LAYER, "num_experts", num_experts)
        self.hidden_size = checks.positive_int(_LAYER, "hidden_size", hidden_size)
        self.intermediate_size = checks.positive_int(_LAYER, "intermediate_size", intermediate_size)
        self.block_size = checks.block_pair(_LAYER, block_size)
        checks.scale_fmt(_LAYER, scale_fmt)
        self.scale_fmt = scale_fmt
        self.activation = checks.choice(_LAYER, "activation", activation, GATED_ACTIVATIONS)
        if num_experts * 2 * intermediate_size * max(hidden_size, 4) > checks.INT64_MAX:
            raise InvalidInputError(f"{_LAYER}: {num_experts} experts of {hidden_size} x {intermediate_size} have more "
                                    "bytes than torch can address (2**63 - 1); pass sizes whose product is smaller")
        qdtype = resolve_dtype(dtype, torch.get_default_device() if device is None else device, _LAYER)
        E, H, I = num_experts, hidden_size, intermediate_size
        bn, bk = self.block_size
        self.gate_up_proj = frozen(torch.zeros(E, 2 * I, H, dtype=qdtype, device=device))
        self.gate_up_proj_scale_inv = frozen(torch.ones(E, math.ceil(2 * I / bn), math.ceil(H / bk), device=device))
        self.down_proj = frozen(torch.zeros(E, H, I, dtype=qdtype, device=device))
        self.down_proj_scale_inv = frozen(torch.ones(E, math.ceil(H / bn), math.ceil(I / bk), device=device))

    @classmethod
    def from_stacked(cls, gate_up: torch.Tensor, down: torch.Tensor, *, dtype: Any = torch.float8_e4m3fn,
                     block_size: tuple[int, int] = DEFAULT_BLOCK, scale_fmt: str = "fp32",
                     activation: str = "silu") -> QuantExperts:
        """Quantize float expert weights stacked as the layer keeps them, on their device: gate_up [E, 2I, H]
        (each expert's gate rows, then its up rows) and down [E, H, I], bf16/fp16/fp32."""
        for name, t in (("gate_up", gate_up), ("down", down)):
            if not isinstance(t, torch.Tensor) or t.dim() != 3 or not t.is_floating_point():
                raise InvalidInputError(f"{_LAYER}.from_stacked: {name} must be a 3-D float tensor, got "
                                        f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        E, two_i, H = gate_up.shape
        if two_i % 2 or tuple(down.shape) != (E, H, two_i // 2):
            raise InvalidInputError(f"{_LAYER}.from_stacked: gate_up has shape {tuple(gate_up.shape)} and down "
                                    f"{tuple(down.shape)}; expected gate_up [E, 2I, H] (gate rows then up rows) and "
                                    f"down [E, H, I] for the same E, H and I")
        module = cls(E, H, two_i // 2, dtype=dtype, block_size=block_size, scale_fmt=scale_fmt, activation=activation,
                     device=gate_up.device)
        with torch.no_grad():
            for name, w in (("gate_up_proj", gate_up), ("down_proj", down)):
                parts = [torch.ops.quantcore.weight_quant(w[e].detach(), dtype=module.gate_up_proj.dtype,
                                                          block_size=list(module.block_size), scale_fmt=scale_fmt)
                         for e in range(E)]
                setattr(module, name, frozen(torch.stack([q for q, _ in parts])))
                setattr(module, name + "_scale_inv", frozen(torch.stack([s for _, s in parts])))
        return module

    @classmethod
    def from_module(cls, module: nn.Module, *, dtype: Any = torch.float8_e4m3fn,
                    block_size: tuple[int, int] = DEFAULT_BLOCK, scale_fmt: str = "fp32") -> QuantExperts:
        """Quantize a stacked-experts module as transformers (>= 5) builds them (`Qwen3MoeExperts`,
        `DeepseekV3Experts`, `MixtralExperts`, ...): float parameters `gate_up_proj` [E, 2I, H] and
        `down_proj` [E, H, I], no biases, `act_fn` SiLU or GELU; its forward(x, topk_ids, topk_weights)
        is the returned layer's. A meta module gives an empty meta layer (to load a checkpoint into)."""
        gate_up, down = (getattr(module, name, None) for name in ("gate_up_proj", "down_proj"))
        if not is_stacked_experts(module):
            raise InvalidInputError(f"{_LAYER}.from_module: {type(module).__name__} is not a stacked-experts module: "
                                    "expected 3-D float parameters gate_up_proj [E, 2I, H] and down_proj [E, H, I] "
                                    "(for a list of per-expert MLPs use QuantExperts.from_experts)")
        activation = gated_activation(module)
        if gate_up.is_meta:
            E, two_i, H = gate_up.shape
            return cls(E, H, two_i // 2, dtype=dtype, block_size=block_size, scale_fmt=scale_fmt,
                       activation=activation, device="meta")
        return cls.from_stacked(gate_up.detach(), down.detach(), dtype=dtype, block_size=block_size,
                                scale_fmt=scale_fmt, activation=activation)

    @classmethod
    def from_experts(cls, experts: Iterable[nn.Module], *, dtype: Any = torch.float8_e4m3fn,
                     block_size: tuple[int, int] = DEFAULT_BLOCK, scale_fmt: str = "fp32",
                     activation: str = "silu") -> QuantExperts:
        """Stack a list of expert MLPs (e.g. an `nn.ModuleList`), each with `gate_proj` and `up_proj` (H -> I)
        and `down_proj` (I -> H) projections without bias, as DeepSeek-V3's and Qwen3-MoE's experts have them.

        nn.Linear projections are quantized as `dtype`, `block_size` and `scale_fmt` say. `QuantLinear`s
        (a per-expert checkpoint loaded into such a model) are stacked as they are, bit for bit, in their
        own format (dtype, block_size and scale_fmt are then theirs; I must be a multiple of their Bn).
        The activation is not read from the modules: pass theirs."""
        experts = list(experts)
        if not experts:
            raise InvalidInputError(f"{_LAYER}.from_experts: no experts given")
        projections = []
        for i, m in enumerate(experts):
            linears = [getattr(m, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
            if not all(isinstance(lin, nn.Linear) or _quantized(lin) for lin in linears):
                raise InvalidInputError(f"{_LAYER}.from_experts: expert {i} ({type(m).__name__}) needs gate_proj, "
                                        "up_proj and down_proj nn.Linear (or QuantLinear) submodules")
            if any(lin.bias is not None for lin in linears):
                raise InvalidInputError(f"{_LAYER}.from_experts: expert {i} has a biased projection; QuantExperts "
                                        "keeps no biases (DeepSeek-V3's, Qwen3-MoE's and Mixtral's experts have none)")
            gate, up, dn = (lin.weight for lin in linears)
            if gate.shape != up.shape or dn.shape != gate.shape[::-1]:
                raise InvalidInputError(f"{_LAYER}.from_experts: expert {i} has gate {tuple(gate.shape)}, up "
                                        f"{tuple(up.shape)}, down {tuple(dn.shape)}; expected [I, H], [I, H], [H, I]")
            projections.append(linears)
        shapes = {tuple(tuple(lin.weight.shape) for lin in linears) for linears in projections}
        if len(shapes) > 1:
            raise InvalidInputError(f"{_LAYER}.from_experts: the experts' shapes differ ({sorted(map(str, shapes))}); "
                                    "stacked experts share H and I")
        kinds = {_quantized(lin) for linears in projections for lin in linears}
        if len(kinds) > 1:
            raise InvalidInputError(f"{_LAYER}.from_experts: the experts' projections are of several kinds "
                                    f"({sorted(map(str, kinds))}): float nn.Linears, or QuantLinears of one dtype, "
                                    "block_size and scale_fmt")
        kind = kinds.pop()
        if kind is None:
            return cls.from_stacked(torch.stack([torch.cat([g.weight, u.weight]) for g, u, _ in projections]).detach(),
                                    torch.stack([d.weight for _, _, d in projections]).detach(), dtype=dtype,
                                    block_size=block_size, scale_fmt=scale_fmt, activation=activation)
        qdtype, block, fmt = kind
        I, H = projections[0][0].weight.shape
        if I % block[0]:
            raise InvalidInputError(f"{_LAYER}.from_experts: the experts' QuantLinears have I = {I} rows, not a whole "
                                    f"number of their {block[0]}-row blocks, so the gate's and the up projection's "
                                    "scales cannot be stacked; pass the float experts to quantize them stacked")
        module = cls(len(projections), H, I, dtype=qdtype, block_size=block, scale_fmt=fmt, activation=activation,
                     device=projections[0][0].weight.device)
        for codes, scales in cls.QUANT_PAIRS:
            parts = [[lin for lin in linears[:2]] if codes == "gate_up_proj" else [linears[2]]
                     for linears in projections]
            for name, attr in ((codes, "weight"), (scales, "weight_scale_inv")):
                setattr(module, name, frozen(torch.stack([torch.cat([getattr(lin, attr) for lin in part])
                                                          for part in parts]).detach()))
        return module

    def path(self, tokens: int, top_k: int) -> ExpertsPath:
        """The layout a forward of `tokens` tokens with `top_k` experts each takes, and why: masked up to
        `masked_max_rows` routed rows (max_m = tokens: a router's top-k names an expert at most once per
        token, so no expert gets more rows; a token naming one twice has the rows beyond max_m dropped, as
        `moe_permute_masked` says), contiguous above."""
        rows = tokens * top_k
        if rows == 0:
            return ExpertsPath("contiguous", None, "no tokens: nothing to route")
        if rows <= self.masked_max_rows:
            return ExpertsPath("masked", tokens, f"{tokens} tokens x top-{top_k} = {rows} routed rows <= "
                               f"masked_max_rows ({self.masked_max_rows}): per-expert slabs of max_m = {tokens} rows "
                               "(a token routes to an expert at most once), the decode layout")
        return ExpertsPath("contiguous", None, f"{tokens} tokens x top-{top_k} = {rows} routed rows > masked_max_rows "
                           f"({self.masked_max_rows}): rows sorted by expert, no per-expert padding")

    def forward(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        """x [..., H] bf16/fp16/fp32, topk_ids [..., k] int32/int64, topk_weights [..., k] float -> [..., H] in
        x's dtype."""
        shape = dense_shape(_LAYER, x, "x", "[..., hidden_size]")
        dense_shape(_LAYER, topk_ids, "topk_ids", "[..., k]")
        dense_shape(_LAYER, topk_weights, "topk_weights", "[..., k]")
        if not shape or shape[-1] != self.hidden_size:
            raise InvalidInputError(f"{_LAYER}: input has {shape[-1] if shape else 'no'} features in its last dim "
                                    f"(shape {tuple(shape)}); this layer expects hidden_size={self.hidden_size}")
        lead = tuple(shape[:-1])
        for name, t in (("topk_ids", topk_ids), ("topk_weights", topk_weights)):
            if not isinstance(t, torch.Tensor) or t.dim() != len(lead) + 1 or tuple(t.shape[:-1]) != lead:
                raise InvalidInputError(f"{_LAYER}: {name} has shape "
                                        f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__} for x "
                                        f"of shape {tuple(shape)}; expected [{', '.join(map(str, lead))}, k]")
        if topk_ids.shape[-1] != topk_weights.shape[-1]:
            raise InvalidInputError(f"{_LAYER}: topk_ids has {topk_ids.shape[-1]} slots per token and topk_weights "
                                    f"{topk_weights.shape[-1]}; the router gives both [tokens, k]")
        k = topk_ids.shape[-1]
        x2, ids, weights = x.reshape(-1, shape[-1]), topk_ids.reshape(-1, k), topk_weights.reshape(-1, k)
        y, rows = self._experts(x2, ids, self.path(x2.shape[0], k))
        return _op("moe_unpermute")(y, rows, weights, out_dtype=x.dtype).reshape(shape)

    def _experts(self, x: torch.Tensor, topk_ids: torch.Tensor, path: ExpertsPath) -> tuple[torch.Tensor, torch.Tensor]:
        """(each routed row's expert output in x's dtype, the rows map), in `path`'s layout."""
        E, qdtype = self.num_experts, self.gate_up_proj.dtype
        block, group = list(self.block_size), self.block_size[1]
        params = self._parameters
        if path.layout == "masked":
            a, a_s, counts, rows = _op("moe_permute_masked")(x, topk_ids, num_experts=E, max_m=path.max_m,
                                                             dtype=qdtype, group_size=group, scale_fmt=self.scale_fmt)
            gemm = _op("grouped_mm_masked")
        else:
            a, a_s, counts, rows = _op("moe_permute")(x, topk_ids, num_experts=E, dtype=qdtype, group_size=group,
                                                      scale_fmt=self.scale_fmt)
            gemm = _op("grouped_mm")
        gate_up = gemm(a, a_s, params["gate_up_proj"], params["gate_up_proj_scale_inv"], counts,
                       out_dtype=INTERMEDIATE_DTYPE, block_size=block)
        if self.activation == "silu":  # one pass, the same bits; the masked slabs' rows past their counts skipped
            h, h_s = _op("silu_mul_quant")(gate_up, counts if path.layout == "masked" else None, dtype=qdtype,
                                           group_size=group, scale_fmt=self.scale_fmt)
        else:
            h, h_s = _op("act_quant")(self._gated(gate_up), dtype=qdtype, group_size=group, scale_fmt=self.scale_fmt)
        y = gemm(h, h_s, params["down_proj"], params["down_proj_scale_inv"], counts, out_dtype=x.dtype,
                 block_size=block)
        return y, rows

    def _gated(self, gate_up: torch.Tensor) -> torch.Tensor:
        """act(gate) * up in fp32 ([..., 2I] -> [..., I]), the activation in the contract's form
        (docs/numerics.md: accurate in the negative tail), each step rounded to fp32."""
        I = self.intermediate_size
        return activate(gate_up[..., :I].float(), self.activation) * gate_up[..., I:].float()

    def dequantized(self, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """The weights the layer computes with, as float (gate_up [E, 2I, H], down [E, H, I]) of `dtype`."""
        out = []
        for name in ("gate_up_proj", "down_proj"):
            q, s = getattr(self, name), getattr(self, name + "_scale_inv")
            out.append(torch.stack([torch.ops.quantcore.weight_dequant(q[e], s[e], block_size=list(self.block_size),
                                                                       out_dtype=dtype) for e in range(q.shape[0])]))
        return out[0], out[1]

    def extra_repr(self) -> str:
        ue8m0 = "" if self.scale_fmt == "fp32" else f", scale_fmt={self.scale_fmt}"
        return (f"num_experts={self.num_experts}, hidden_size={self.hidden_size}, "
                f"intermediate_size={self.intermediate_size}, dtype={dtype_name(self.gate_up_proj.dtype)}, "
                f"block_size={self.block_size}, activation={self.activation}{ue8m0}")

    def describe(self, name: str) -> str:
        """What parameter `name` holds, in words, for error messages."""
        bn, bk = self.block_size
        if name.endswith("_scale_inv"):
            return (f"the stacked experts' fp32 scales, one per {bn}x{bk} block; build the layer with the checkpoint's "
                    "sizes and block_size")
        return "the stacked experts' quantized codes; build the layer with the checkpoint's dtype and sizes"
