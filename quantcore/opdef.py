"""`OpDef`: everything quantcore knows about one op, in one place, and the table of defined ops.

An op is its public function's signature and docstring (a stub whose body is never run), the spec
that validates a call and normalises it to the backend contract, the keyword arguments its launch
functions take (the contract), its `torch.library` custom ops (schema and fake kernel: one per
return type) and the formats the report shows. `define` turns the stub into the public function,
generated so that a call costs what a hand-written `dispatch.call(...)` line costs.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from .errors import InvalidInputError

BACKEND_ARG = "backend"


def contiguous(out: Any, options: dict[str, Any]) -> Any:
    """The real kernel's outputs in the layout of a fake whose outputs are all contiguous (a no-op for
    conforming backends; the reference returns a strided view for fp32 dequantize outputs with a tail)."""
    if isinstance(out, tuple):
        return tuple(t.contiguous() for t in out)
    return out.contiguous()


@dataclass(frozen=True)
class CustomOp:
    """One `torch.ops.quantcore.<name>`: its schema, its fake kernel (the outputs' shapes, dtypes and
    strides from the inputs' alone) and `layout(out, options)`, which gives the real outputs the
    fake's strides."""

    name: str
    schema: str
    fake: Callable[..., Any]
    layout: Callable[[Any, dict[str, Any]], Any] = contiguous


@dataclass(frozen=True)
class OpDef:
    """One op. `tensors` names the public function's tensor arguments (None where an optional one is
    absent), passed to the spec positionally; every other argument but `backend` is an option.
    `launch_args` are the keyword names the dispatcher passes a launch function (the spec's
    `Prepared.kwargs`; an implementation's fixed `options` come on top). `formats` are the input formats
    the report lists, with `report_blocks` as the block sizes of its queries."""

    stub: Callable[..., Any]
    spec: Callable[..., Any]
    tensors: tuple[str, ...]
    launch_args: tuple[str, ...]
    formats: tuple[str, ...]
    report_blocks: tuple[int, ...] = ()
    custom_ops: tuple[CustomOp, ...] = ()
    function: Callable[..., Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "function", _generate(self))

    @property
    def name(self) -> str:
        return self.stub.__name__


def _generate(op: OpDef) -> Callable[..., Any]:
    """The public function of `op`: the stub's signature, defaults, annotations and docstring, with
    the body `return call(name, (tensors...), {options...}, backend)` compiled from source so that no
    argument binding happens at call time."""
    from .dispatch import call  # dispatch looks ops up here: imported when the first op is defined

    params = inspect.signature(op.stub).parameters
    unknown = [t for t in (*op.tensors, BACKEND_ARG) if t not in params]
    if unknown:
        raise InvalidInputError(f"define: {op.name} has no argument(s) {unknown}")
    source, keyword_only = [], False
    for p in params.values():
        if p.kind is p.KEYWORD_ONLY and not keyword_only:
            source.append("*")
            keyword_only = True
        elif p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            raise InvalidInputError(f"define: {op.name}'s argument {p.name} must be a plain or keyword-only one")
        source.append(p.name if p.default is p.empty else f"{p.name}=_defaults[{p.name!r}]")
    options = ", ".join(f"{n!r}: {n}" for n in params if n not in op.tensors and n != BACKEND_ARG)
    tensors = "".join(f"{t}, " for t in op.tensors)
    # The stub's module globals too, so that `typing.get_type_hints` resolves the copied annotations.
    namespace = {**op.stub.__globals__, "_call": call, "_defaults": {n: p.default for n, p in params.items()}}
    exec(f"def {op.name}({', '.join(source)}):\n"
         f"    return _call({op.name!r}, ({tensors}), {{{options}}}, {BACKEND_ARG})\n", namespace)
    fn = namespace[op.name]
    fn.__doc__, fn.__annotations__ = op.stub.__doc__, dict(op.stub.__annotations__)
    fn.__module__, fn.__qualname__ = "quantcore.ops", op.name
    return fn


_ops: dict[str, OpDef] = {}


def register_op(op: OpDef) -> OpDef:
    """Make `op` known to dispatch, `explain` and the report (`quantcore.ops` holds the built-in ones;
    call `op.function` for another). Returns `op`."""
    if not isinstance(op, OpDef):
        raise InvalidInputError(f"register_op: expected a quantcore OpDef, got {type(op).__name__}")
    if op.name in _ops:
        raise InvalidInputError(f"register_op: an op named {op.name!r} is already defined")
    _ops[op.name] = op
    return op


def unregister_op(op: OpDef) -> None:
    """Forget an op added with `register_op`."""
    if _ops.get(op.name) is not op:
        raise InvalidInputError(f"unregister_op: {op.name!r} is not this registered op")
    del _ops[op.name]


def get(name: str) -> OpDef:
    """The op named `name`."""
    if name not in _ops:
        raise InvalidInputError(f"unknown op {name!r}; expected one of {sorted(_ops)}")
    return _ops[name]


def all_ops() -> tuple[OpDef, ...]:
    """Every defined op, built-in ones first, in definition order."""
    return tuple(_ops.values())


def check_launch(op: str, label: str, launch: Callable[..., Any], fixed: Iterable[str] = ()) -> None:
    """Raise `InvalidInputError` unless `launch` (or its `prepare`, for a `prepared` one) takes every
    keyword the dispatcher passes implementation `label` of `op` (the op's `launch_args` and the
    implementation's `fixed` options) and requires no other."""
    if op not in _ops:
        raise InvalidInputError(f"register: {label} implements {op!r}, which is no defined op; "
                                f"expected one of {sorted(_ops)} or an op added with register_op")
    passed = (*_ops[op].launch_args, *fixed)
    params = inspect.signature(getattr(launch, "prepare", launch)).parameters.values()
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params)
    extra = [] if takes_any else [n for n in passed if n not in named]
    missing = [p.name for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
               and p.name not in passed]
    if extra or missing:
        what = getattr(launch, "__qualname__", repr(launch))
        problems = ([f"does not take {extra}, which the dispatcher passes"] if extra else []) + (
            [f"requires {missing}, which the dispatcher never passes"] if missing else [])
        raise InvalidInputError(f"register: {label} of {op}: launch function {what} {' and '.join(problems)}; "
                                f"it is called with the keywords {list(passed)}")
