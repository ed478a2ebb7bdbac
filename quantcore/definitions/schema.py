"""What several ops' definitions share: each custom op's `torch.library` schema, derived from the op's
own signature (as `torch.library.infer_schema` derives one from type hints), the fake kernels' block
count and the operands of the example calls."""

from __future__ import annotations

import inspect
import types
import typing
from typing import Any, Callable

import torch

from ..errors import InvalidInputError
from ..formats import FORMATS
from . import checks

F32 = torch.float32
QUANT_FORMATS = tuple(f.name for f in FORMATS)

# Annotation -> schema type of an option. A `backend` is a name or a priority list in Python but
# `str?` in the schema: the custom ops take a priority joined by commas (`quantcore.library`).
_TYPES: dict[Any, str] = {int: "int", float: "float", bool: "bool", str: "str", torch.dtype: "ScalarType",
                          tuple[int, int]: "int[2]"}
BACKEND_ARG = "backend"


def _schema_type(op: str, name: str, hint: Any, default: Any) -> str:
    optional = False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(args) < len(typing.get_args(hint))
        hint = args[0] if len(args) == 1 else None
    if hint is None or (hint is inspect.Parameter.empty and default is inspect.Parameter.empty):
        raise InvalidInputError(f"define: {op}'s option {name} has no type the schema can state; annotate it")
    if hint is inspect.Parameter.empty:  # unannotated: the default's type (`dtype=torch.float8_e4m3fn`)
        hint = type(default)
    if hint not in _TYPES:
        raise InvalidInputError(f"define: {op}'s option {name} is a {hint}; the schema takes {list(_TYPES)}")
    return _TYPES[hint] + ("?" if optional else "")


def _schema_default(value: Any) -> str:
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, tuple):
        return f"[{', '.join(map(repr, value))}]"
    return "None" if value is None else repr(value).replace("'", '"')


def derive(stub: Callable[..., Any], tensors: tuple[str, ...], returns: int | None = None, omit: tuple[str, ...] = (),
           required: tuple[str, ...] = ()) -> str:
    """The schema of a custom op of the function `stub`: its tensor arguments `tensors` positionally
    ("Tensor", or "Tensor? x=None" where the default is None), then, keyword-only, the options in
    `required` without their defaults, then the other options but those in `omit`, in signature order,
    each typed from its annotation (or its default's type) with its default; `returns` tensors (from
    the return annotation, a tensor or a tuple of them, when None)."""
    hints = typing.get_type_hints(stub)
    params = inspect.signature(stub).parameters
    parts = [f"Tensor? {t}=None" if params[t].default is None else f"Tensor {t}" for t in tensors]
    options = [n for n in params if n not in tensors and n not in omit]
    ordered = [*required, *(n for n in options if n not in required)]
    keywords = []
    for name in ordered:
        p = params[name]
        kind = "str?" if name == BACKEND_ARG else _schema_type(stub.__name__, name, hints.get(name, p.empty), p.default)
        if name in required:
            keywords.append(f"{kind.rstrip('?')} {name}")
        else:
            keywords.append(f"{kind} {name}={_schema_default(p.default)}")
    if returns is None:
        hint = hints.get("return")
        returns = len(typing.get_args(hint)) if typing.get_origin(hint) is tuple else 1
    out = "Tensor" if returns == 1 else f"({', '.join(['Tensor'] * returns)})"
    return f"({', '.join([*parts, '*', *keywords])}) -> {out}"


def blocks(n, op: str, name: str, size) -> int:
    """ceil(n / size) after checking `size` as the real op does (a bad size would divide by zero here
    first). Integer arithmetic, so that it also works on a dynamic-shape trace's symbolic sizes."""
    return -(-n // checks.positive_int(op, name, size))


def same_shape_fake(t, *_tensors, out_dtype=torch.bfloat16, **_):
    """The fake kernel of an op whose output has its first input's shape, in `out_dtype`."""
    return t.new_empty(t.shape, dtype=out_dtype)


def example_operands(fmt: str, device, m: int, n: int, k: int, block: int = 128):
    """Operands of the built-in ops' example calls (`OpDef.example`), seeded: x [m, k] and w [n, k] fp32
    with a per-row spread, and codes of format `fmt` of the same shapes with positive fp32 scales per
    1×`block` group of x's rows and `block`×`block` block of w: (x, w, (q, q_scale), (wq, w_scale)).
    Examples exercise selection and launches, not the quantizers, so the codes are drawn directly."""
    gen = torch.Generator().manual_seed(0)
    x, w = (torch.randn(r, k, generator=gen) * torch.exp(torch.randn(r, 1, generator=gen)) for r in (m, n))
    qdtype = next(f.dtype for f in FORMATS if f.name == fmt)

    def codes(r: int) -> torch.Tensor:
        if qdtype == torch.int8:
            return torch.randint(-127, 128, (r, k), generator=gen, dtype=torch.int8)
        return (torch.randn(r, k, generator=gen) * 64).clamp(-448, 448).to(qdtype)
    kb = -(-k // block)
    xq = (codes(m), torch.rand(m, kb, generator=gen) + 0.5)
    wq = (codes(n), torch.rand(-(-n // block), kb, generator=gen) + 0.5)
    return tuple(t.to(device) if isinstance(t, torch.Tensor) else tuple(u.to(device) for u in t)
                 for t in (x, w, xq, wq))


def example_of(*parts: str, quantize: bool = False):
    """An `OpDef.example` whose call takes `parts` of `example_operands`, in order: "x", "w" (float),
    "xq", "wq" (codes and scale); with `quantize`, the format's dtype as `dtype=`."""
    def example(fmt, device="cpu", m=2, n=32, k=512):
        x, w, xq, wq = example_operands(fmt, device, m, n, k)
        named = {"x": (x,), "w": (w,), "xq": xq, "wq": wq}
        return tuple(t for part in parts for t in named[part]), (dict(dtype=wq[0].dtype) if quantize else {})
    return example
