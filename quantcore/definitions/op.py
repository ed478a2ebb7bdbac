"""`OpDef`: everything quantcore knows about one op, in one place, and the table of defined ops.

An op is one function, its `spec`: the public signature and docstring, and a body that validates a
call and normalises it to the backend contract (a `Prepared`). Beside it: the keyword arguments its
launch functions take (the contract), its `torch.library` custom ops (fake kernel, output layout and,
where it has one, gradient: one custom op per return type; the schema is derived from the signature)
and the formats the report shows. `quantcore.runtime.entry` generates the public function from the
spec's signature, so that no argument binding happens at call time and a call with a kept plan
replays it inline; the spec's body runs only for a call without one.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

from ..errors import InvalidInputError
from . import schema
from .schema import BACKEND_ARG


def contiguous(out: Any, options: dict[str, Any]) -> Any:
    """The real kernel's outputs in the layout of a fake whose outputs are all contiguous (a no-op for
    conforming backends; the reference returns a strided view for fp32 dequantize outputs with a tail)."""
    if isinstance(out, tuple):
        return tuple(t.contiguous() for t in out)
    return out.contiguous()


def always(options: dict[str, Any]) -> bool:
    """A custom op that serves every call of its op."""
    return True


@dataclass(frozen=True)
class Gradient:
    """How a custom op differentiates. `inputs` name the tensor arguments that get a gradient; any
    other tensor argument that requires grad is refused in the forward (`InvalidInputError`): its
    gradient is not defined. `backward(tensors, options, grad, needs)` receives the op's tensor
    arguments by name, its keyword-only arguments as the schema has them, the output's gradient and
    the names whose gradient is wanted; it returns {name: gradient}. It must be traceable (only
    torch ops and `torch.ops.quantcore.*` calls), so that compiled training graphs hold it too.
    `hint` ends the refusal's message."""

    inputs: tuple[str, ...]
    backward: Callable[..., dict[str, Any]]
    hint: str = ""  # appended to the refusal: where a gradient for what was refused can be had


@dataclass(frozen=True)
class CustomOp:
    """One `torch.ops.quantcore.<name>`: its fake kernel (the outputs' shapes, dtypes and strides from the
    inputs' alone), `layout(out, options)`, which gives the real outputs the fake's strides, and its
    `gradient`; without one the op is not differentiable and its outputs never require grad. Its schema
    is the op's signature (`schema.derive`): `returns` tensors (None: from the return annotation),
    without the options in `omit`, and with those in `required` first and without defaults.
    `serves(arguments)` says whether a `quantcore.ops` call with these arguments (tensors and options, by
    name) is this custom op's (the public `scaled_mm` is either of two, one per return type, and
    `rms_norm_quant` one per whether a residual is given); an op's custom ops serve disjoint calls."""

    name: str
    fake: Callable[..., Any]
    layout: Callable[[Any, dict[str, Any]], Any] = contiguous
    gradient: Gradient | None = None
    returns: int | None = None
    omit: tuple[str, ...] = ()
    required: tuple[str, ...] = ()
    serves: Callable[[dict[str, Any]], bool] = always


@dataclass(frozen=True)
class OpDef:
    """One op. `spec` is its public signature, docstring and validation (returning a `Prepared`);
    `tensors` names its tensor arguments (None where an optional one is absent); every other argument
    but `backend` is an option. `launch_args` are the keyword names the dispatcher passes a launch
    function (the spec's `Prepared.kwargs`; an implementation's fixed `options` come on top). `formats`
    are the input formats the report lists, with `report_blocks` as the block sizes of its queries.
    `example(fmt, device="cpu", m=2, n=32, k=512)` -> (args, kwargs) is one call of the op reading `fmt`
    (m rows, an n×k weight): what the launch-contract and binding tests run for every format, and a
    sample for plugins and docs."""

    spec: Callable[..., Any]
    tensors: tuple[str, ...]
    launch_args: tuple[str, ...]
    formats: tuple[str, ...]
    report_blocks: tuple[int, ...] = ()
    custom_ops: tuple[CustomOp, ...] = ()
    example: Callable[..., tuple[tuple, dict[str, Any]]] | None = None
    defaults: dict[str, Any] = field(init=False, repr=False, compare=False)  # every option's default, in order

    def __post_init__(self) -> None:
        params = inspect.signature(self.spec).parameters
        unknown = [t for t in (*self.tensors, BACKEND_ARG) if t not in params]
        if unknown:
            raise InvalidInputError(f"define: {self.name} has no argument(s) {unknown}")
        private = [n for n in params if n.startswith("_")]
        if private:  # the generated public function's own names are underscored
            raise InvalidInputError(f"define: {self.name}'s argument names {private} start with '_'; rename them")
        odd = [p.name for p in params.values() if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if odd:
            raise InvalidInputError(f"define: {self.name}'s arguments {odd} must be plain or keyword-only ones")
        object.__setattr__(self, "defaults", {n: p.default for n, p in params.items()
                                              if n not in self.tensors and n != BACKEND_ARG})

    @property
    def name(self) -> str:
        return self.spec.__name__

    def options(self, **given: Any) -> dict[str, Any]:
        """The options of a call with keyword arguments `given` (the others at their defaults), as the
        public function hands them to the dispatcher: every option, in the signature's order."""
        unknown = [n for n in given if n not in self.defaults]
        if unknown:
            raise InvalidInputError(f"{self.name}: no option(s) {unknown}; its options are {list(self.defaults)}")
        return {n: given.get(n, d) for n, d in self.defaults.items()}

    def prepare(self, args: tuple, options: dict[str, Any]) -> Any:
        """The spec of a call given as the dispatcher has it: the tensors positionally, in `tensors`'
        order (whatever the signature makes keyword-only), and the options by name."""
        return self.spec(**dict(zip(self.tensors, args)), **options)

    def schema(self, custom: CustomOp) -> str:
        """The `torch.library` schema of one of this op's custom ops."""
        return schema.derive(self.spec, self.tensors, custom.returns, custom.omit, custom.required)

    @property
    def differentiable(self) -> bool:
        """Whether some call of this op has a gradient (one of its custom ops has a `Gradient`)."""
        return any(c.gradient is not None for c in self.custom_ops)


def requires_grad(*tensors: Any) -> bool:
    """Whether any argument is a tensor that requires grad (a loop: cheaper than any() over a generator)."""
    for t in tensors:
        if getattr(t, "requires_grad", False):
            return True
    return False


_ops: dict[str, OpDef] = {}


def register_op(op: OpDef) -> OpDef:
    """Make `op` known to selection, `explain` and the report (`quantcore.library.define` also gives it
    its public function). Returns `op`."""
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
