"""The public function of each op, generated from its definition, and its plan key.

The function has the spec's signature, defaults, annotations and docstring, and a body compiled from
source so that no argument binding happens at call time. Traced by TorchDynamo (`torch.compile`,
`torch.export`'s strict mode) it is its custom op and nothing else (`as_custom_op`, which
`quantcore.library` gives): the body's first statement asks `torch.compiler.is_dynamo_compiling()`,
which Dynamo folds to True and which eagerly is one call returning False (the rest of the body reads
context variables, which Dynamo cannot trace). Eagerly, a differentiable op then asks
`torch.is_grad_enabled()` and, when an input requires grad, runs through its custom op so that
autograd records the call (`with_gradient`); then the kept plan of the call's key, if any, is launched
inline; else, outside a trace (a non-strict `torch.export` runs the function on its fake tensors, and
reaches this line), `dispatch.call` validates, selects and keeps the plan.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, NamedTuple

import torch

from ..definitions.op import OpDef, requires_grad
from ..definitions.schema import BACKEND_ARG
from ..errors import GENERATED
from . import dispatch, plans
from .plans import AT_DEFAULT, NAMESPACE, PLAIN_TENSORS, STATE, UNKEPT, Uncacheable, choice_key, immutable, run


class Entry(NamedTuple):
    """An op's replay of a kept plan, inline in its public function (`generate`): `body`, statements indented
    by four spaces that return the call's result from the kept plan of its key, if any, and `namespace`,
    the names they use; `key(*tensors, **options, backend=...)`, that key (`plans.key`)."""

    body: str
    namespace: dict[str, Any]
    key: Callable[..., tuple]


def entry(op: str, tensors: tuple[str, ...], optional: tuple[str, ...], defaults: dict[str, Any],
          sequences: tuple[str, ...]) -> Entry:
    """The kept-plan replay and the plan key of the op named `op`, whose public function takes the tensor
    arguments `tensors` (those in `optional` may be None) and the options named by `defaults` (name ->
    the function's default object; those in `sequences` are sequences), under these names.

    The key is one flat tuple: the op, the backend choice, the selection state (`STATE`), per tensor
    its dtype, shape, strides, device and address mod 16 (None for an absent optional one), then per
    option `AT_DEFAULT` when it is the function's own default object (immutable: its type and value are
    the default's), else (its type, its value) (validation tells `128` from `128.0` and `True`, so the
    key must too; a sequence as (type, its elements' types, a tuple of them): `(128.0, 128)` equals
    `(128, 128)`, and the custom ops' schema passes lists). It is generated per op as one tuple display,
    in the op's own function: built in a loop over the arguments and options, four Python calls deep, it
    cost a kept call a fifth of its host time. Calls of tensor subclasses (fake, functional, ...) and with
    `check_finite` set are never kept."""
    signature = "{0}.dtype, {0}.shape, {0}.stride(), {0}.device, {0}.data_ptr() & 15"
    parts = [repr(op), "backend if backend is None or type(backend) is str else _choice_key(backend)", STATE]
    parts += [f"*((None,) if {t} is None else ({signature.format(t)},))" if t in optional else signature.format(t)
              for t in tensors]
    shortcut = {}
    for o, default in defaults.items():
        piece = f"(type({o}), tuple(map(type, {o})), tuple({o}))" if o in sequences else f"(type({o}), {o})"
        if immutable(default):
            shortcut[f"_default_{o}"] = default
            piece = f"_AT_DEFAULT if {o} is _default_{o} else {piece}"
        parts.append(piece)
    key = f"({', '.join(parts)})"
    # A negative view (`torch._neg_view`) has a plain tensor's metadata but its memory holds the values'
    # negation: the spec resolves it into a copy, so its calls are never kept, nor replay a kept plan.
    kept = [f"({t} is None or type({t}) in _PLAIN and not {t}.is_neg())" if t in optional
            else f"type({t}) in _PLAIN and not {t}.is_neg()" for t in tensors]
    kept += ["not check_finite"] if "check_finite" in defaults else []
    condition = " and ".join(kept)
    args = f"({''.join(f'{t}, ' for t in tensors)})"
    # Its locals are underscored: an op's own arguments never are (`OpDef` refuses such names).
    body = (f"    if {condition}:\n"
            f"        try:\n"
            f"            _kept = _plans[{key}]\n"
            f"        except _UNKEPT_OR_NEW:\n"
            f"            pass\n"
            f"        else:\n"
            f"            if _kept.direct is None:\n"
            f"                return _run(_kept, {args})\n"
            f"            _out = _kept.launch(*{args}[:_kept.direct])\n"
            f"            return _out if _kept.finish is None else _kept.finish(_out)\n")
    namespace = {**NAMESPACE, **shortcut, "_AT_DEFAULT": AT_DEFAULT, "_PLAIN": PLAIN_TENSORS, "_plans": plans.plans,
                 "_run": run, "_choice_key": choice_key, "_Uncacheable": Uncacheable,
                 "_UNKEPT_OR_NEW": (*UNKEPT, KeyError)}
    scope = dict(namespace)
    exec(compile(f"def key({', '.join((*tensors, *defaults))}, backend):\n    if not ({condition}):\n"
         f"        raise _Uncacheable\n    return {key}\n", GENERATED, "exec"), scope)
    return Entry(body, namespace, scope["key"])


class Functions(NamedTuple):
    """An op's generated functions: `public` (`quantcore.ops.<name>`) and `kernel`, the same without
    asking about gradients (the custom ops' real kernel, which runs below autograd)."""

    public: Callable[..., Any]
    kernel: Callable[..., Any]


def generate(op: OpDef, with_gradient: Callable[..., Any] | None = None,
             as_custom_op: Callable[..., Any] | None = None) -> Functions:
    """The functions of `op` (see the module's docstring), its plan key registered for the dispatcher.
    `with_gradient(name, tensors, options, backend)` runs a call whose input requires grad (a
    differentiable op's; ignored for others); `as_custom_op(name, tensors, options, backend)` makes a
    traced call the op's custom op (None: the public function is not traceable). The kernel asks
    neither: it is what the custom ops run."""
    params = inspect.signature(op.spec).parameters
    source, keyword_only = [], False
    for p in params.values():
        if p.kind is p.KEYWORD_ONLY and not keyword_only:
            source.append("*")
            keyword_only = True
        source.append(p.name if p.default is p.empty else f"{p.name}=_defaults[{p.name!r}]")
    optional = tuple(t for t in op.tensors if params[t].default is None)
    sequences = tuple(n for n, d in op.defaults.items() if isinstance(d, (tuple, list)))
    replay = entry(op.name, op.tensors, optional, op.defaults, sequences)
    options = ", ".join(f"{n!r}: {n}" for n in op.defaults)  # the order `OpDef.options` gives too
    tensors = "".join(f"{t}, " for t in op.tensors)
    # The spec's module globals too, so that `typing.get_type_hints` resolves the copied annotations; but not
    # its `__name__`: TorchDynamo would guard this namespace's names as attributes of that module.
    spec_globals = {n: v for n, v in op.spec.__globals__.items() if n != "__name__"}
    namespace = {**spec_globals, **replay.namespace, "_call": dispatch.call,
                 "_defaults": {n: p.default for n, p in params.items()}, "_grad_enabled": torch.is_grad_enabled,
                 "_requires_grad": requires_grad, "_with_gradient": with_gradient, "_as_custom_op": as_custom_op,
                 "_dynamo": torch.compiler.is_dynamo_compiling, "_tracing": torch.compiler.is_compiling}
    arguments = f"{op.name!r}, ({tensors}), {{{options}}}, {BACKEND_ARG}"
    grad = (f"    if _grad_enabled() and _requires_grad({tensors}):\n        return _with_gradient({arguments})\n"
            if op.differentiable and with_gradient is not None else "")

    def traced(question: str) -> str:
        return f"    if {question}():\n        return _as_custom_op({arguments})\n" if as_custom_op else ""
    public = (traced("_dynamo") + grad, traced("_tracing"))  # (the body's first statements, its last but one)
    functions = []
    # The public function, then the kernel, which asks nothing about tracing or gradients (one function where
    # the public one asks nothing either).
    for prelude, tail in dict.fromkeys((public, ("", ""))):
        text = f"def {op.name}({', '.join(source)}):\n{prelude}{replay.body}{tail}    return _call({arguments})\n"
        exec(compile(text, GENERATED, "exec"), namespace)
        fn = namespace[op.name]
        fn.__doc__, fn.__annotations__ = op.spec.__doc__, dict(op.spec.__annotations__)
        fn.__module__, fn.__qualname__ = "quantcore.ops", op.name
        functions.append(fn)
    plans.keys[op.name] = replay.key
    return Functions(functions[0], functions[-1])
