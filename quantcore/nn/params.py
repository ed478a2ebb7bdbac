"""What the quantized layers share about their parameters: frozen codes and block scales that a dtype
cast never touches, and a state-dict load that checks them before copying.

`QuantParams` is the base of `QuantLinear` and `QuantExperts`: each names its (codes, scales) pairs in
`QUANT_PAIRS`; `resolve_dtype` reads the `dtype=` argument both take.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from ..definitions import checks
from ..errors import InvalidInputError
from ..formats import dtype_name, format_named, format_of_dtype


def resolve_dtype(dtype: Any, device: torch.device | str, layer: str = "QuantLinear") -> torch.dtype:
    """The quantized storage dtype meant by `dtype` on `device`.

    `dtype`: torch.float8_e4m3fn, torch.int8, a format name ("fp8", "fp8_e4m3", "int8") or "auto":
    FP8 on GPUs with FP8 tensor cores (sm_89+) and on the CPU (where the reference computes it),
    INT8 on older GPUs (`quantcore.capability.preferred_format_name`).
    """
    named = format_named(dtype) if isinstance(dtype, str) else None
    return checks.quant_format(layer, "dtype", named.dtype if named else dtype, torch.device(device)).dtype


def dense_shape(layer: str, x: Any, name: str = "input", expected: str = "[..., in_features]") -> torch.Size:
    """The shape of a layer's argument `x` (`name`, shaped `expected`), refusing what has no dense one: a
    non-tensor, a nested tensor, a sparse or mkldnn one (a layer reshapes its input before its ops see it)."""
    if not isinstance(x, torch.Tensor) or x.is_nested or x.layout != torch.strided:
        got = ("a nested tensor" if x.is_nested else f"a {x.layout} tensor") if isinstance(x, torch.Tensor) \
            else type(x).__name__
        hint = "; call .to_dense() first" if isinstance(x, torch.Tensor) and not x.is_nested else ""
        raise InvalidInputError(f"{layer}: {name} must be a dense torch.Tensor {expected}, got {got}{hint}")
    return x.shape


def frozen(t: torch.Tensor) -> nn.Parameter:
    """`t` as a parameter that takes no gradient (quantized codes and scales are not trained)."""
    return nn.Parameter(t, requires_grad=False)


class QuantParams(nn.Module):
    """A module whose `QUANT_PAIRS` parameters, (codes, fp32 block scales) each, are never cast and are
    loaded from a state dict only whole, with exactly their dtype and shape."""

    QUANT_PAIRS: ClassVar[tuple[tuple[str, str], ...]]
    LAYER: ClassVar[str]  # how errors name the module

    def quant_params(self) -> tuple[str, ...]:
        """The names of the parameters a dtype cast leaves as they are."""
        return tuple(name for pair in self.QUANT_PAIRS for name in pair)

    def _apply(self, fn, recurse=True):
        # nn.Module.to(dtype), .half(), .bfloat16() cast every floating-point parameter, and e4m3 counts
        # as one: a cast would turn the codes into plain floats and round the fp32 scales. For those two,
        # ask `fn` where (and as what) it would put an empty tensor, and take only the device change.
        kept = [self._parameters[name] for name in self.quant_params()]

        def device_only(t):
            if any(t is k for k in kept):
                target = fn(t.new_empty(0))
                if target.dtype != t.dtype:
                    return t.to(target.device)
            return fn(t)

        return super()._apply(device_only, recurse)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # Checked here because the default loader copies with a cast (and assign=True keeps any dtype):
        # a bf16 weight would become e4m3 codes without scales, and a wrong shape would only be a
        # message among error_msgs.
        for key in (prefix + name for name in self._parameters):
            t = state_dict.get(key)
            if isinstance(t, torch.Tensor) and (t.is_nested or t.layout != torch.strided):  # no shape to compare
                raise InvalidInputError(f"{self.LAYER}: checkpoint tensor {key} is a "
                                        f"{'nested' if t.is_nested else t.layout} tensor; expected a dense one "
                                        "(.to_dense())")
        for codes, scales in self.QUANT_PAIRS:
            present = [name for name in (codes, scales) if prefix + name in state_dict]
            if len(present) == 1:
                missing = prefix + (scales if present[0] == codes else codes)
                raise InvalidInputError(f"{self.LAYER}: checkpoint has {prefix + present[0]} but not {missing}; a "
                                        "block-quantized weight needs both (the codes and their fp32 block scales)")
            if present:
                for name, what in ((codes, self.describe(codes)), (scales, self.describe(scales))):
                    p = self._parameters[name]
                    self.check_loaded(prefix + name, state_dict[prefix + name], p.dtype, tuple(p.shape), what)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def describe(self, name: str) -> str:
        """What parameter `name` holds, in words, for error messages."""
        raise NotImplementedError

    def check_loaded(self, key: str, t: Any, dtype: torch.dtype, shape: tuple[int, ...], what: str) -> None:
        """A checkpoint tensor for one of the quantized parameters has exactly the parameter's dtype and shape."""
        if not isinstance(t, torch.Tensor):
            raise InvalidInputError(f"{self.LAYER}: checkpoint entry {key} is a {type(t).__name__}, not a tensor")
        if t.dtype != dtype:
            if dtype == torch.float32:
                hint = "store the scales as float32 (quantcore.nn.load_checkpoint converts bf16, fp16 and ue8m0 ones)"
            elif format_of_dtype(t.dtype) is not None:
                hint = f"build the layer with dtype=torch.{dtype_name(t.dtype)} (quantize_model(model, dtype=...))"
            else:
                hint = "this is not a quantized weight: load it into the float model, then call quantize_model"
            raise InvalidInputError(f"{self.LAYER}: checkpoint tensor {key} has dtype {dtype_name(t.dtype)}; this "
                                    f"layer expects {dtype_name(dtype)} ({what}); {hint}")
        if tuple(t.shape) != shape:
            raise InvalidInputError(f"{self.LAYER}: checkpoint tensor {key} has shape {tuple(t.shape)}; this layer "
                                    f"expects {shape} ({what})")
