"""`QuantLinear` and `quantize_model`: block-quantized linear layers for PyTorch models.

`QuantLinear` keeps its weight block-quantized (FP8 e4m3 or INT8, one fp32 scale per Bn×Bk block)
under the names DeepSeek-V3 and Hugging Face checkpoints use — `weight` [N, K] and
`weight_scale_inv` [ceil(N/Bn), ceil(K/Bk)] — as frozen parameters, so `model.parameters()`, FSDP,
accelerate's device maps and PEFT's module walks see them and a plain `load_state_dict` loads such a
checkpoint. The forward is one `quantcore.ops.quant_linear` call: the activation quantized per 1×Bk
group and the block-scaled GEMM with the bias fused (one kernel launch at decode sizes on Triton).
Under `torch.compile` it is the `torch.ops.quantcore.quant_linear` custom op instead, so the model
compiles with `fullgraph=True` and the implementation is chosen per call (M stays dynamic).
"""

from __future__ import annotations

import fnmatch
import math
from typing import Any, Callable, Iterable

import torch
from torch import nn

from .. import capability, ops
from ..convert import RequantError, fp8_to_int8_blocks
from ..definitions import checks
from ..definitions.gemm import QUANT_LINEAR, SCALED_MM
from ..definitions.op import requires_grad
from ..errors import InvalidInputError
from ..formats import DEFAULT_BLOCK, dtype_name
from ..runtime.dispatch import Site
from .experts import QuantExperts, is_stacked_experts
from .params import QuantParams, dense_shape, frozen, resolve_dtype
from .producers import QuantizedActivation, QuantRMSNorm, QuantSiLUMul

_LAYER = "QuantLinear"  # how errors name the module


class QuantLinear(QuantParams):
    """`y = x @ W^T + b` with W block-quantized and x quantized per 1×Bk group on the fly.

    in_features K, out_features N: any sizes >= 1 (partial blocks are supported).
    dtype: the weight's storage, see `resolve_dtype` ("auto" is resolved for `device` here, once).
    block_size: (Bn, Bk), the weight's block; activations are quantized per 1×Bk (the GEMM needs
    the activation group to equal the weight's K block). out_dtype: None (the default) returns the
    input's dtype, as `nn.Linear` does, so `model.to(torch.bfloat16)` gives bf16 outputs; bf16, fp16
    or fp32 fixes the output dtype whatever the input. scale_fmt: the activations' scale format,
    "fp32" or "ue8m0" (power-of-two scales, as DeepSeek-V3.1's `scale_fmt: "ue8m0"` checkpoints use).
    device: where the parameters are made (None: the default device, so a `with torch.device("meta"):`
    block builds an empty layer for `load_state_dict(..., assign=True)`).

    Parameters, all frozen (requires_grad=False): `weight` [N, K] in `dtype`, `weight_scale_inv`
    [ceil(N/Bn), ceil(K/Bk)] fp32 (the dequantization multipliers, as DeepSeek-V3 stores them) and
    `bias` [N] (fp32 unless loaded or converted otherwise) or None. Input x: [..., K] bf16/fp16/fp32;
    output [..., N]. `module.to(dtype)`, `.half()` and the like cast the bias but never the quantized
    weight or its fp32 scales; `.to(device)` moves them all.
    """

    QUANT_PAIRS = (("weight", "weight_scale_inv"),)
    LAYER = _LAYER

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, dtype: Any = "auto",
                 block_size: tuple[int, int] = DEFAULT_BLOCK, out_dtype: torch.dtype | None = None,
                 scale_fmt: str = "fp32", device: torch.device | str | None = None):
        super().__init__()
        self.in_features = checks.positive_int(_LAYER, "in_features", in_features)
        self.out_features = checks.positive_int(_LAYER, "out_features", out_features)
        if out_features * max(in_features, 4) > checks.INT64_MAX:  # the weight's bytes, the fp32 bias's
            raise InvalidInputError(f"{_LAYER}: a {out_features} x {in_features} layer has more bytes than torch can "
                                    "address (2**63 - 1); pass sizes whose product is smaller")
        self._block_size = checks.block_pair(_LAYER, block_size)
        self.out_dtype, self.scale_fmt = out_dtype, scale_fmt  # checked by their setters
        with_bias = checks.flag(_LAYER, "bias", bias)
        if device is not None:
            device = capability.existing_device(device, _LAYER)
        qdtype = resolve_dtype(dtype, torch.get_default_device() if device is None else device)
        grid = (math.ceil(out_features / self._block_size[0]), math.ceil(in_features / self._block_size[1]))
        self.weight = frozen(torch.zeros(out_features, in_features, dtype=qdtype, device=device))
        self.weight_scale_inv = frozen(torch.ones(grid, dtype=torch.float32, device=device))
        self.register_parameter("bias", frozen(torch.zeros(out_features, device=device)) if with_bias else None)

    # What the forward computes with besides the parameters: the block is the scale grid's, fixed; the
    # others may change, checked, and a change of scale_fmt drops the call sites' kept plans (out_dtype
    # is part of their signatures).
    @property
    def block_size(self) -> tuple[int, int]:
        """(Bn, Bk): the weight's block, fixed when the layer is made (`weight_scale_inv` has one scale per block)."""
        return self._block_size

    @block_size.setter
    def block_size(self, value: Any) -> None:
        raise InvalidInputError(f"{_LAYER}: block_size is fixed when the layer is made (weight_scale_inv holds one "
                                f"scale per {self._block_size[0]}x{self._block_size[1]} block of the weight); to "
                                f"change it to {value!r}, make a new layer (QuantLinear.from_linear or "
                                "quantize_model with block_size=...)")

    @property
    def out_dtype(self) -> torch.dtype | None:
        """The output dtype: bf16, fp16, fp32, or None (the input's dtype, as nn.Linear's)."""
        return self._out_dtype

    @out_dtype.setter
    def out_dtype(self, value: torch.dtype | None) -> None:
        self._out_dtype = None if value is None else checks.out_float(_LAYER, "out_dtype", value)

    @property
    def scale_fmt(self) -> str:
        """The activations' scale format, "fp32" or "ue8m0" (power-of-two scales)."""
        return self._scale_fmt

    @scale_fmt.setter
    def scale_fmt(self, value: str) -> None:
        checks.scale_fmt(_LAYER, value)
        self._scale_fmt, self._site, self._pair_site = value, Site("quant_linear"), Site("scaled_mm")

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, dtype: Any = "auto", block_size: tuple[int, int] = DEFAULT_BLOCK,
                    out_dtype: torch.dtype | None = None, scale_fmt: str = "fp32") -> QuantLinear:
        """Quantize an `nn.Linear` on its own device (a meta linear gives an empty meta layer).
        out_dtype None: the output follows the input, as the linear's did. scale_fmt: the weight's
        and the activations' scale format ("ue8m0": powers of two). The bias keeps its dtype."""
        if not isinstance(linear, nn.Linear):
            raise InvalidInputError(f"QuantLinear.from_linear: expected an nn.Linear, got {type(linear).__name__}")
        w = linear.weight.detach()
        module = cls(linear.in_features, linear.out_features, linear.bias is not None, dtype=dtype,
                     block_size=block_size, out_dtype=out_dtype, scale_fmt=scale_fmt, device=w.device)
        q, scale = torch.ops.quantcore.weight_quant(w, dtype=module.weight.dtype, block_size=list(module.block_size),
                                                    scale_fmt=scale_fmt)
        module.weight, module.weight_scale_inv = frozen(q), frozen(scale)
        if linear.bias is not None:
            module.bias = frozen(linear.bias.detach().clone())
        return module

    def forward(self, x: torch.Tensor | QuantizedActivation | tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """x [..., K] bf16/fp16/fp32 -> [..., N] in out_dtype, or in x's dtype when out_dtype is None.

        x may also be the activation already quantized per 1×Bk in the weight's format, by a fused producer
        (`QuantRMSNorm`, `QuantSiLUMul`): a `QuantizedActivation` (q, scale, dtype) or a pair (q, scale), q
        [..., K] and scale [..., ceil(K/Bk)] fp32. The layer then skips its own quantization (`scaled_mm` on
        the pair), bit for bit its result on the float activation the pair quantizes; out_dtype None gives
        the QuantizedActivation's dtype (bf16 for a bare pair)."""
        if isinstance(x, tuple):
            return self._quantized_input(x)
        shape = dense_shape(_LAYER, x)
        if not shape or shape[-1] != self.in_features:  # a 0-d input has no last dim
            raise InvalidInputError(f"{_LAYER}: input has {shape[-1] if shape else 'no'} features in its last dim "
                                    f"(shape {tuple(shape)}); this layer expects in_features={self.in_features}")
        # Parameters straight from `_parameters`: `self.bias` goes through nn.Module.__getattr__, a
        # Python-level fallback far slower than a dict lookup, on every decode step.
        return self._gemm(x, self._parameters["bias"], self._out_dtype or x.dtype)  # None alone falls through

    def _gemm(self, x: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
        """The layer's quant_linear call with `bias` into `out_dtype` (the tensor-parallel layers pass
        their own bias and dtype)."""
        params = self._parameters
        w, w_scale = params["weight"], params["weight_scale_inv"]
        # Traced (torch.compile, torch.export) the op's function is its custom op; with an input requiring grad
        # autograd records it: the function does both, and the site below neither.
        if torch.compiler.is_compiling() or (torch.is_grad_enabled() and requires_grad(x, w, w_scale, bias)):
            return ops.quant_linear(x, w, w_scale, bias, out_dtype=out_dtype, block_size=self.block_size,
                                    scale_fmt=self.scale_fmt)
        # Eagerly the layer's own call site keeps its plan (`runtime.dispatch.Site`): x changes between
        # calls; the parameters change when replaced, moved or loaded with assign=True (their addresses)
        # and, at the same address, when given another view of their memory (`.data = p.data[:n]`,
        # `t_()`; their shapes and strides). A decode step then pays a few attribute reads here instead of
        # the dispatcher's key over all four tensors.
        try:
            signature = (x.shape, x.stride(), x.dtype, x.device, x.data_ptr() & 15, x.is_neg(), out_dtype,
                         w.data_ptr(), w.shape, w.stride(), w_scale.data_ptr(), w_scale.shape, w_scale.stride(),
                         None if bias is None else (bias.data_ptr(), bias.shape, bias.stride()))
        except RuntimeError:  # a sparse or mkldnn tensor has no strides or address: the op's checks name it
            return ops.quant_linear(x, w, w_scale, bias, out_dtype=out_dtype, block_size=self._block_size,
                                    scale_fmt=self._scale_fmt)
        return self._site(signature, (x, w, w_scale, bias), lambda: QUANT_LINEAR.options(
            out_dtype=out_dtype, block_size=self._block_size, scale_fmt=self._scale_fmt))

    def _quantized_input(self, x: tuple) -> torch.Tensor:
        """forward's path for a QuantizedActivation or a (q, scale) pair: the checks that name this layer,
        then `scaled_mm` with the bias, through a call site of its own as `_gemm`'s."""
        if not (isinstance(x, QuantizedActivation) or len(x) == 2):
            raise InvalidInputError(f"{_LAYER}: a quantized input is a QuantizedActivation or a pair (q, scale); got "
                                    f"a tuple of {len(x)}")
        q, scale = x[0], x[1]
        dtype = x.dtype if isinstance(x, QuantizedActivation) else torch.bfloat16
        params = self._parameters
        w, w_scale, bias = params["weight"], params["weight_scale_inv"], params["bias"]
        if (not isinstance(q, torch.Tensor) or not isinstance(scale, torch.Tensor) or q.dtype != w.dtype or not q.dim()
                or q.shape[-1] != self.in_features):
            got = (f"{dtype_name(q.dtype)} codes of shape {tuple(q.shape)}" if isinstance(q, torch.Tensor)
                   else type(q).__name__) + ("" if isinstance(scale, torch.Tensor) else " without a scale tensor")
            raise InvalidInputError(f"{_LAYER}: the quantized input is {got}; this layer expects "
                                    f"{dtype_name(w.dtype)} codes [..., {self.in_features}] with their scales, from a "
                                    "producer built with its dtype, group size (its block_size[1]) and scale_fmt")
        out_dtype = self._out_dtype or dtype
        if torch.compiler.is_compiling():
            return torch.ops.quantcore.scaled_mm(q, scale, w, w_scale, bias, out_dtype=out_dtype,
                                                 block_size=list(self.block_size))
        if torch.is_grad_enabled() and requires_grad(bias):  # recorded by autograd
            return ops.scaled_mm(q, scale, w, w_scale, bias=bias, out_dtype=out_dtype, block_size=self.block_size)
        signature = (q.shape, q.stride(), q.dtype, q.device, q.data_ptr() & 15, q.is_neg(), scale.shape,
                     scale.stride(), scale.dtype, scale.device, scale.data_ptr() & 15, scale.is_neg(), out_dtype,
                     w.data_ptr(), w.shape, w.stride(), w_scale.data_ptr(), w_scale.shape, w_scale.stride(),
                     None if bias is None else (bias.data_ptr(), bias.shape, bias.stride()))
        return self._pair_site(signature, (q, scale, w, w_scale, bias), lambda: SCALED_MM.options(
            out_dtype=out_dtype, block_size=self.block_size))

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight the layer computes with, as a float [N, K] tensor of `dtype`."""
        return torch.ops.quantcore.weight_dequant(self.weight, self.weight_scale_inv,
                                                  block_size=list(self.block_size), out_dtype=dtype)

    def extra_repr(self) -> str:
        fixed = "" if self.out_dtype is None else f", out_dtype={dtype_name(self.out_dtype)}"
        ue8m0 = "" if self.scale_fmt == "fp32" else f", scale_fmt={self.scale_fmt}"
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"dtype={dtype_name(self.weight.dtype)}, block_size={self.block_size}{fixed}{ue8m0}")

    def describe(self, name: str) -> str:
        """What parameter `name` holds, in words, for error messages."""
        if name == "weight":
            return "the quantized weight [out_features, in_features]"
        return (f"one fp32 scale per {self._block_size[0]}x{self._block_size[1]} block of the weight; build the layer "
                "with the checkpoint's block_size")


def replace_linears(model: nn.Module, chosen: Callable[[str], bool],
                    make: Callable[[str, nn.Linear], nn.Module]) -> nn.Module:
    """Replace, in place, every `nn.Linear` of `model` whose dotted name is `chosen` by `make(name, linear)`
    (`replace_where` for linears)."""
    return replace_where(model, lambda m: isinstance(m, nn.Linear), chosen, make)


def replace_where(model: nn.Module, accept: Callable[[nn.Module], bool], chosen: Callable[[str], bool],
                  make: Callable[[str, Any], nn.Module]) -> nn.Module:
    """Replace, in place, every submodule `m` of `model` with `accept(m)` whose dotted name is `chosen` by
    `make(name, m)`.

    A module shared by several parents is listed under each name (remove_duplicate=False), made once
    (under its first chosen name), and the one replacement is set under every chosen name.
    """
    targets = [(name, m) for name, m in model.named_modules(remove_duplicate=False)
               if name and accept(m) and chosen(name)]
    made: dict[int, nn.Module] = {}
    for name, module in targets:
        if id(module) not in made:
            made[id(module)] = make(name, module)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, made[id(module)])
    return model


def _skipped(name: str, patterns: Iterable[str]) -> bool:
    """A pattern matches the full dotted name or its tail: "lm_head" skips "lm_head" and "model.lm_head"."""
    return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(name, "*." + p) for p in patterns)


def _patterns(argument: str, value: Any) -> tuple[str, ...]:
    """Module-name patterns given as one str or an iterable of str."""
    # A lone pattern as one (iterated, it would be split into characters).
    patterns = (value,) if isinstance(value, str) else _listed(value)
    if patterns is None or not all(isinstance(p, str) for p in patterns):
        raise InvalidInputError(f"quantize_model: {argument} must be module-name patterns (a str or an iterable of "
                                f"str), got {value!r}")
    return patterns


def _replace_modules(model: nn.Module, argument: str, patterns: tuple[str, ...],
                     make: Callable[[str, nn.Module], nn.Module]) -> None:
    """Replace, in place, every module of `model` whose dotted name a pattern of `patterns` (the argument
    `argument`) matches by `make(name, module)`, a shared module once; a pattern matching nothing is an error
    (a misspelt name would otherwise leave the model unfused without a word)."""
    made: dict[int, nn.Module] = {}
    for pattern in patterns:
        targets = [(name, m) for name, m in model.named_modules(remove_duplicate=False)
                   if name and _skipped(name, (pattern,))]
        if not targets:
            raise InvalidInputError(f"quantize_model: the {argument} pattern {pattern!r} matches no module of the "
                                    "model")
        for name, module in targets:
            if id(module) not in made:
                made[id(module)] = module if isinstance(module, (QuantRMSNorm, QuantSiLUMul)) else make(name, module)
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name), child, made[id(module)])


def _listed(items: Any) -> tuple | None:
    """The items of an iterable, or None for what cannot be iterated (a 0-d tensor is an Iterable that raises)."""
    try:
        return tuple(items)
    except TypeError:
        return None


def quantize_model(model: nn.Module, *, dtype: Any = "auto", skip: Iterable[str] = ("lm_head",),
                   block_size: tuple[int, int] = DEFAULT_BLOCK, out_dtype: torch.dtype | None = None,
                   scale_fmt: str = "fp32", fuse_norms: Iterable[str] = (),
                   fuse_silu_mul: Iterable[str] = ()) -> nn.Module:
    """Replace every `nn.Linear` of `model` in place by a `QuantLinear` (see `QuantLinear.from_linear`),
    every stacked-experts module (transformers >= 5's `Qwen3MoeExperts`, `DeepseekV3Experts`, ...: 3-D
    `gate_up_proj` and `down_proj`) by a `QuantExperts` (`QuantExperts.from_module`), and return `model`.

    skip: module-name patterns (fnmatch globs, matched against the dotted name or its tail, e.g.
    "lm_head", "layers.0.*", "*.gate") whose linears stay in floating point. dtype: as `resolve_dtype`,
    resolved per layer for the device its weight is on (move the model to its device first).
    out_dtype: each layer's output dtype; None (the default) follows each call's input.
    scale_fmt: "fp32" or "ue8m0" (power-of-two weight and activation scales).

    fuse_norms: patterns naming RMSNorm modules (torch's nn.RMSNorm or Hugging Face's) to replace by
    `QuantRMSNorm`s, which return their output quantized in this call's format (dtype, block_size[1] as the
    group, scale_fmt). fuse_silu_mul: patterns naming modules that compute silu(gate)·up of a fused gate_up
    [..., 2I], replaced by `QuantSiLUMul`. Name only modules whose output feeds quantized linears alone (not
    a residual sum, an un-quantized head or anything else that reads a float tensor): the replacements
    return `QuantizedActivation`s, which only QuantLinear takes. A pattern matching no module is an error.
    """
    if not isinstance(model, nn.Module):
        raise InvalidInputError(f"quantize_model: expected an nn.Module, got {type(model).__name__}")
    patterns = _patterns("skip", skip)
    norms, gated = _patterns("fuse_norms", fuse_norms), _patterns("fuse_silu_mul", fuse_silu_mul)
    block = checks.block_pair("quantize_model", block_size)
    # Checked here too, not only per layer: a model without linears would accept them silently.
    checks.scale_fmt("quantize_model", scale_fmt)
    if out_dtype is not None:
        checks.out_float("quantize_model", "out_dtype", out_dtype)
    replace_linears(model, lambda name: not _skipped(name, patterns),
                    lambda name, linear: QuantLinear.from_linear(linear, dtype=dtype, block_size=block,
                                                                 out_dtype=out_dtype, scale_fmt=scale_fmt))
    replace_where(model, is_stacked_experts, lambda name: not _skipped(name, patterns),
                  lambda name, experts: QuantExperts.from_module(experts, dtype=dtype, block_size=block,
                                                                 scale_fmt=scale_fmt))
    produced = dict(dtype=dtype, group_size=block[1], scale_fmt=scale_fmt)
    _replace_modules(model, "fuse_norms", norms, lambda name, norm: QuantRMSNorm.from_norm(norm, **produced))
    device = next((t.device for t in (*model.parameters(), *model.buffers())), None)
    _replace_modules(model, "fuse_silu_mul", gated, lambda name, _: QuantSiLUMul(device=device, **produced))
    return model


def convert_fp8_to_int8(model: nn.Module) -> dict[str, RequantError]:
    """Convert every FP8 `QuantLinear` and `QuantExperts` of `model` in place to INT8 blocks of the same
    block size, and return each converted weight's error (`quantcore.convert.RequantError`) by name: a
    linear's by its module name, an experts layer's per expert and projection as checkpoints name them
    (`<experts>.<e>.gate_up_proj`, `<experts>.<e>.down_proj`).

    For GPUs without FP8 tensor cores (sm_80, sm_86), where the INT8 GEMM is the fast path and FP8 runs
    decoded to fp16: load the FP8 checkpoint, then convert. Each block is re-quantized from its exact
    dequantized values (`quantcore.convert.fp8_to_int8_blocks`), which changes the numerics: the
    returned errors say by how much, for the caller to report or to refuse (then reload). A layer
    shared under several names is converted once, under its first name. INT8 and float layers are
    left as they are.
    """
    if not isinstance(model, nn.Module):
        raise InvalidInputError(f"convert_fp8_to_int8: expected an nn.Module, got {type(model).__name__}")
    errors = {}
    for name, layer in model.named_modules():
        if isinstance(layer, QuantLinear) and layer.weight.dtype == torch.float8_e4m3fn:
            q, scale, errors[name] = fp8_to_int8_blocks(layer.weight, layer.weight_scale_inv, block_size=layer.block_size)
            layer.weight, layer.weight_scale_inv = frozen(q), frozen(scale)
        elif isinstance(layer, QuantExperts) and layer.gate_up_proj.dtype == torch.float8_e4m3fn:
            for codes, scales in layer.QUANT_PAIRS:
                w, s = layer._parameters[codes], layer._parameters[scales]
                converted = [fp8_to_int8_blocks(w[e], s[e], block_size=layer.block_size) for e in range(w.shape[0])]
                errors.update((f"{name}.{e}.{codes}", err) for e, (_, _, err) in enumerate(converted))
                setattr(layer, codes, frozen(torch.stack([q for q, _, _ in converted])))
                setattr(layer, scales, frozen(torch.stack([sc for _, sc, _ in converted])))
    return errors
