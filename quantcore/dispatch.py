"""The call path of `quantcore.ops`: validate, select, launch, and remember the validated plan.

`call(op, args, options, backend)` takes the op's tensors (and None for absent optional tensors)
positionally and its other options, none of them tensors, by keyword.

Validation and selection depend only on the arguments' metadata (dtypes, shapes, strides, devices,
options) and on the simulation and priority in force. Their outcome is therefore kept per such
signature: a repeated call puts its tensors into the kept plan (each kernel argument is one of the
inputs or a view of one, re-made with the same view metadata) and launches, skipping the spec's
checks and the registry. The signature holds each option's type beside its value (validation tells
`128` from `128.0` and `True`, so the plan key must too), the element types of a sequence option
(`block_size`: `(128.0, 128)` equals `(128, 128)`) and each tensor's address modulo 16
(kernels are specialised on the alignment of their pointers). Each op's public function computes that
key inline and launches the kept plan itself (`entry`, generated per op); only a call without one
comes here.

A launch function that carries a `prepare` attribute (`prepare(**kwargs) -> run(**tensors)`) is
prepared once per plan: everything that depends only on the signature (grids, tile choice, the
compiled kernel and its constant arguments) is computed then, and a repeated call costs the key,
the binding, and `run`: its output allocations and one kernel launch. This is what keeps a
`quantcore.ops` call within a few microseconds of a bare launch. Calls that validate by reading
data (`check_finite=True`), tensors that are not plain strided tensors, plans whose kernel arguments
are copies rather than views, and calls whose inputs share memory are never kept.
"""

from __future__ import annotations

import inspect
import os
from typing import Any, Callable, NamedTuple

import torch

from . import capability, opdef, registry
from .backends import native
from .backends.base import on_reset
from .registry import BackendChoice
from .specs.base import keep

_MAX_PLANS = 4096
# The tensor types whose calls are kept: subclasses (fake, functional, ...) are validated on every call.
PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


class _Uncacheable(Exception):
    pass


# A call whose plan is not kept: _Uncacheable, TypeError (an unhashable option, or a sequence option that is
# none), RuntimeError (sparse and other layouts have no strides).
_UNKEPT = (_Uncacheable, TypeError, RuntimeError)


class _Plan(NamedTuple):
    launch: Callable[..., Any]
    static: dict[str, Any]  # kernel arguments other than the bound tensors ({} for prepared launches)
    # (argument, input index, view or None: the input itself); None: a plan for this call only
    bindings: tuple[tuple[str, int, tuple | None], ...] | None
    finish: Callable[[Any], Any] | None  # None: the launch's results are the call's as they are
    # k when the launch takes the call's first k inputs themselves as its first k parameters and
    # nothing else (`_positional`): the common case, replayed as `launch(*args[:k])`
    direct: int | None = None


_plans: dict[tuple, _Plan] = {}
on_reset(_plans.clear)  # registry.reset(): kept plans are stale after it (the epoch says so) and hold memory


def call(op: str, args: tuple, options: dict[str, Any], backend: BackendChoice) -> Any:
    """Run `op` (a defined op's name, `quantcore.opdef`) on positional `args` and keyword `options`. The
    ops' own functions replay a kept plan before calling this (`entry`)."""
    return _run(_plan(op, args, options, backend), args)


def _plan(op: str, args: tuple, options: dict[str, Any], backend: BackendChoice) -> _Plan:
    """The call's plan: the kept one for its key, else a new one (kept when it can be replayed)."""
    try:
        key = _key(op, args, options, backend)
        plan = _plans.get(key)
    except _UNKEPT:
        return _prepare(op, args, options, backend)
    if plan is None:
        plan = _prepare(op, args, options, backend)
        if plan.bindings is not None:
            if len(_plans) >= _MAX_PLANS:
                _plans.clear()
            _plans[key] = plan
    return plan


def _run(plan: _Plan, args: tuple) -> Any:
    """Launch `plan` on this call's `args`."""
    if plan.direct is not None:
        out = plan.launch(*args[:plan.direct])
        return out if plan.finish is None else plan.finish(out)
    kwargs = dict(plan.static)
    for name, index, view in plan.bindings or ():
        t = args[index]
        if view is None:
            kwargs[name] = t
        elif view[2]:
            kwargs[name] = t.as_strided(view[0], view[1], t.storage_offset() + view[2])
        else:  # at the argument's own offset, which as_strided takes by default (a cheaper call)
            kwargs[name] = t.as_strided(view[0], view[1])
    out = plan.launch(**kwargs)
    return out if plan.finish is None else plan.finish(out)


# What selection reads besides the call, read on every call for the plan key: the contexts directly, and
# the environment's variables as CPython keeps them (os.environ's `_data`, names encoded by its
# `encodekey`): a dict lookup each, without `os.environ.get`'s encode-and-decode. Source, so that each
# op's generated key (`entry`) reads them inline.
_STATE = ("_epoch(), _simulation.get(), _priority.get(), _environ._data.get(_SIMULATE_ENV), "
          "_environ._data.get(_PRIORITY_ENV)")
_NAMESPACE: dict[str, Any] = {
    "_epoch": registry.epoch, "_simulation": capability.simulation_context, "_priority": registry.priority_context,
    "_environ": os.environ, "_SIMULATE_ENV": os.environ.encodekey(capability.SIMULATE_ENV),
    "_PRIORITY_ENV": os.environ.encodekey(registry.PRIORITY_ENV)}
exec(f"def _state():\n    return {_STATE}\n", _NAMESPACE)
_state: Callable[[], tuple] = _NAMESPACE["_state"]  # the registry's epoch, the simulation and the priority in force
# The custom ops' native kernels replay kept plans where the contexts are unset, keyed on these variables.
native.on_load(lambda ext: ext.set_state(capability.simulation_context, registry.priority_context,
                                         [capability.SIMULATE_ENV, registry.PRIORITY_ENV, native.NATIVE_ENV]))


class Site:
    """One place in a program that calls `op` again and again with arguments of the same metadata (a
    layer's forward, with its parameters among the arguments): it reuses its last call's plan while
    the caller's `signature` of the call and the registry's state are unchanged, skipping `call`'s key.

    `signature` is the caller's to compute, cheaper than the key because the caller knows what can
    change between its calls: it must change whenever the key would, so it holds the shape, strides,
    dtype, device and address mod 16 of each tensor that can change, every option that can change,
    and, for tensors whose metadata changes only with their memory (a module's parameters, replaced
    or moved as a whole), their address."""

    __slots__ = ("op", "_signature", "_plan")

    def __init__(self, op: str):
        self.op, self._signature, self._plan = op, None, None

    def __reduce__(self):  # copied or pickled with its owner (a module), as a new site: plans hold kernels
        return Site, (self.op,)

    def __call__(self, signature: tuple, args: tuple, options: Callable[[], dict[str, Any]],
                 backend: BackendChoice = None) -> Any:
        """`call(op, args, options(), backend)`; `options` is called only when the plan is not reused."""
        signature = (signature, backend, _state())
        plan = self._plan
        if plan is None or signature != self._signature:
            plan = _plan(self.op, args, options(), backend)
            self._signature, self._plan = (signature, plan) if plan.bindings is not None else (None, None)
        if plan.direct is not None:  # `_run`'s first lines, inline: a layer's call pays one Python frame less
            out = plan.launch(*args[:plan.direct])
            return out if plan.finish is None else plan.finish(out)
        return _run(plan, args)


def kept(op: str, args: tuple, options: dict[str, Any], backend: BackendChoice) -> _Plan | None:
    """The kept plan of a call of `op` with tensors `args`, the options `options` (the others at the
    public function's defaults) and `backend`, if any."""
    try:
        return _plans.get(_key(op, args, {**opdef.get(op).defaults, **options}, backend))
    except _UNKEPT:
        return None


def _key(op: str, args: tuple, options: dict[str, Any], backend: BackendChoice) -> tuple:
    """The plan key of a call, as the op's public function computes it inline (`entry`)."""
    definition = opdef.get(op)
    return definition.key(*args, **options, backend=backend)


def _choice_key(backend: BackendChoice) -> Any:
    """A `backend=` other than None or a name, as a plan key's part."""
    if isinstance(backend, (list, tuple)):
        return type(backend), tuple(backend)
    raise _Uncacheable  # a bad value: the full path raises the error that names it


_AT_DEFAULT = object()  # a plan key's part for an option that is its function's default object


def _immutable(value: Any) -> bool:
    """Whether `value` cannot change after the function's definition (so `is` it means its value too)."""
    if isinstance(value, tuple):
        return all(_immutable(v) for v in value)
    return value is None or type(value) in (bool, int, float, str, torch.dtype)


class Entry(NamedTuple):
    """An op's replay of a kept plan, inline in its public function (`opdef`): `body`, statements indented
    by four spaces that return the call's result from the kept plan of its key, if any, and `namespace`,
    the names they use; `key(*tensors, **options, backend=...)`, that key (`_key`)."""

    body: str
    namespace: dict[str, Any]
    key: Callable[..., tuple]


def entry(op: str, tensors: tuple[str, ...], optional: tuple[str, ...], defaults: dict[str, Any],
          sequences: tuple[str, ...]) -> Entry:
    """The kept-plan replay and the plan key of the op named `op`, whose public function takes the tensor
    arguments `tensors` (those in `optional` may be None) and the options named by `defaults` (name ->
    the function's default object; those in `sequences` are sequences), under these names.

    The key is one flat tuple: the op, the backend choice, the selection state (`_STATE`), per tensor
    its dtype, shape, strides, device and address mod 16 (None for an absent optional one), then per
    option `_AT_DEFAULT` when it is the function's own default object (immutable: its type and value are
    the default's), else (its type, its value) (validation tells `128` from `128.0` and `True`, so the
    key must too; a sequence as (type, its elements' types, a tuple of them): `(128.0, 128)` equals
    `(128, 128)`, and the custom ops' schema passes lists). It is generated per op as one tuple display,
    in the op's own function: built by `call` in a loop over the arguments and options, four Python calls
    deep, it cost a kept act_dequant call 2.6 µs of 12.5 on the H100 host (docs/performance.md, round
    17). Calls of tensor subclasses (fake, functional, ...) and with `check_finite` set are never kept."""
    signature = "{0}.dtype, {0}.shape, {0}.stride(), {0}.device, {0}.data_ptr() & 15"
    parts = [repr(op), "backend if backend is None or type(backend) is str else _choice_key(backend)", _STATE]
    parts += [f"*((None,) if {t} is None else ({signature.format(t)},))" if t in optional else signature.format(t)
              for t in tensors]
    shortcut = {}
    for o, default in defaults.items():
        piece = f"(type({o}), tuple(map(type, {o})), tuple({o}))" if o in sequences else f"(type({o}), {o})"
        if _immutable(default):
            shortcut[f"_default_{o}"] = default
            piece = f"_AT_DEFAULT if {o} is _default_{o} else {piece}"
        parts.append(piece)
    key = f"({', '.join(parts)})"
    kept = [f"({t} is None or type({t}) in _PLAIN)" if t in optional else f"type({t}) in _PLAIN" for t in tensors]
    kept += ["not check_finite"] if "check_finite" in defaults else []
    condition = " and ".join(kept)
    args = f"({''.join(f'{t}, ' for t in tensors)})"
    # Its locals are underscored: an op's own arguments never are (`opdef` refuses such names).
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
    namespace = {**_NAMESPACE, **shortcut, "_AT_DEFAULT": _AT_DEFAULT, "_PLAIN": PLAIN_TENSORS, "_plans": _plans,
                 "_run": _run, "_choice_key": _choice_key, "_Uncacheable": _Uncacheable,
                 "_UNKEPT_OR_NEW": (*_UNKEPT, KeyError)}
    scope = dict(namespace)
    exec(f"def key({', '.join((*tensors, *defaults))}, backend):\n    if not ({condition}):\n"
         f"        raise _Uncacheable\n    return {key}\n", scope)
    return Entry(body, namespace, scope["key"])


def _prepare(op: str, args: tuple, options: dict[str, Any], backend: BackendChoice) -> _Plan:
    """The full path: validate (raising on bad input), select, and describe how to rebind."""
    prepared = opdef.get(op).spec(*args, **options)
    impl = registry.select(prepared.query, backend)
    if prepared.empty:  # no rows: every backend would return the same empty tensors
        impl = registry.reference(op)
    static = {k: v for k, v in prepared.kwargs.items() if not isinstance(v, torch.Tensor)} | dict(impl.options)
    tensors = {k: v for k, v in prepared.kwargs.items() if isinstance(v, torch.Tensor)}
    sources = {name: _source(t, args) for name, t in tensors.items()}
    storages = [x.untyped_storage().data_ptr() for x in args if isinstance(x, torch.Tensor)]
    # Not replayable: a copy made by the spec (no source), or inputs sharing memory in this call (a
    # kernel argument could then be traced to the wrong input, which later calls need not alias).
    launch, finish = impl.function(), prepared.finish
    if hasattr(launch, "prepare"):
        lead = getattr(finish, "lead", None)
        if lead is not None and getattr(launch, "shapes_results", False):
            launch, finish = launch.prepare(**static, **tensors, lead=lead), keep
        else:
            launch = launch.prepare(**static, **tensors)
        static = {}
    if finish is keep:
        finish = None
    if prepared.empty or None in sources.values() or len(set(storages)) < len(storages):
        return _Plan(launch, static | tensors, None, finish)
    if getattr(launch, "by_address", False):  # a view at its input's own address is, to it, the input
        sources = {name: (i, None if view is None or not view[2] else view) for name, (i, view) in sources.items()}
    bindings = tuple((name, *src) for name, src in sources.items())
    direct = None if static else _positional(launch, bindings)
    if direct is not None:  # a run taking the call's leading inputs: replayed in C++ once it can be
        launch = native.replay(launch, next(t.device for t in args if isinstance(t, torch.Tensor)))
    return _Plan(launch, static, bindings, finish, direct)


def _positional(launch: Callable[..., Any], bindings: tuple[tuple[str, int, tuple | None], ...]) -> int | None:
    """k when the kernel arguments are the call's first k inputs themselves, in order, and `launch`
    takes them as its first k positional parameters; else None."""
    if any(view is not None for *_, view in bindings) or [i for _, i, _ in bindings] != list(range(len(bindings))):
        return None
    try:
        params = list(inspect.signature(launch).parameters.values())[:len(bindings)]
    except (TypeError, ValueError):  # no signature to read (a builtin)
        return None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if [p.name for p in params] != [name for name, _, _ in bindings] or any(p.kind not in positional for p in params):
        return None
    return len(bindings)


def _source(t: torch.Tensor, args: tuple) -> tuple[int, tuple | None] | None:
    """(index of the argument `t` is, or is a view of; None when `t` has that argument's own layout,
    else (size, stride, storage-offset delta)), or None when `t` views no tensor argument."""
    inputs = [(i, x) for i, x in enumerate(args) if isinstance(x, torch.Tensor)]
    for i, x in inputs:
        if t is x:
            return i, None
    for i, x in inputs:
        if t.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() and t.dtype == x.dtype:
            if (t.shape, t.stride(), t.storage_offset()) == (x.shape, x.stride(), x.storage_offset()):
                return i, None
            return i, (tuple(t.shape), tuple(t.stride()), t.storage_offset() - x.storage_offset())
    return None
