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
(kernels are specialised on the alignment of their pointers).

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
from typing import Any, Callable, NamedTuple

import torch

from . import capability, opdef, registry
from .backends.base import on_reset
from .registry import BackendChoice
from .specs.base import keep

_MAX_PLANS = 4096
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_SEQUENCES = (tuple, list)
_SEQUENCE_OPTIONS = opdef.SEQUENCE_OPTIONS


class _Uncacheable(Exception):
    pass


class _Plan(NamedTuple):
    launch: Callable[..., Any]
    static: dict[str, Any]  # kernel arguments other than the bound tensors ({} for prepared launches)
    # (argument, input index, view or None: the input itself); None: a plan for this call only
    bindings: tuple[tuple[str, int, tuple | None], ...] | None
    finish: Callable[[Any], Any]
    # k when the launch takes the call's first k inputs themselves as its first k parameters and
    # nothing else (`_positional`): the common case, replayed as `launch(*args[:k])`
    direct: int | None = None


_plans: dict[tuple, _Plan] = {}
on_reset(_plans.clear)  # registry.reset(): kept plans are stale after it (the epoch says so) and hold memory


def call(op: str, args: tuple, options: dict[str, Any], backend: BackendChoice) -> Any:
    """Run `op` (a defined op's name, `quantcore.opdef`) on positional `args` and keyword `options`."""
    return _run(_plan(op, args, options, backend), args)


def _plan(op: str, args: tuple, options: dict[str, Any], backend: BackendChoice) -> _Plan:
    """The call's plan: the kept one for its key, else a new one (kept when it can be replayed)."""
    try:
        key = _key(op, args, options, backend)
        plan = _plans.get(key)
    except (_Uncacheable, TypeError):  # TypeError: an unhashable option (a list, say)
        key, plan = None, None
    if plan is None:
        plan = _prepare(op, args, options, backend)
        if key is not None and plan.bindings is not None:
            if len(_plans) >= _MAX_PLANS:
                _plans.clear()
            _plans[key] = plan
    return plan


def _run(plan: _Plan, args: tuple) -> Any:
    """Launch `plan` on this call's `args`."""
    if plan.direct is not None:
        return plan.finish(plan.launch(*args[:plan.direct]))
    kwargs = dict(plan.static)
    for name, index, view in plan.bindings or ():
        t = args[index]
        if view is None:
            kwargs[name] = t
        elif view[2]:
            kwargs[name] = t.as_strided(view[0], view[1], t.storage_offset() + view[2])
        else:  # at the argument's own offset, which as_strided takes by default (a cheaper call)
            kwargs[name] = t.as_strided(view[0], view[1])
    return plan.finish(plan.launch(**kwargs))


def _state() -> tuple:
    """What selection reads besides the call: the registry's epoch, the simulation and the priority in force."""
    return registry.epoch(), capability.simulation_state(), registry.priority_state()


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
        if plan.direct is not None:  # `_run`'s first line, inline: a layer's call pays one Python frame less
            return plan.finish(plan.launch(*args[:plan.direct]))
        return _run(plan, args)


def _key(op: str, args: tuple, options: dict[str, Any], backend: BackendChoice) -> tuple:
    # Each op passes the same option names in the same order, so their values alone identify them.
    if options.get("check_finite"):
        raise _Uncacheable
    values = tuple(options.values())
    types = tuple(map(type, values))
    if list in types:  # block_size=[128, 128] (the custom ops' schema passes lists): hashable as a tuple
        values = tuple(tuple(v) if type(v) is list else v for v in values)
    for i in _SEQUENCE_OPTIONS.get(op, ()):  # its elements' types too: validation refuses (128.0, 128)
        if types[i] in _SEQUENCES:
            types = (*types, *map(type, values[i]))
    # The tensors' signatures inline (not a helper per tensor): this runs on every call, and a
    # Python call per argument is a tenth of the whole dispatch at decode sizes.
    signatures = []
    try:
        for t in args:
            if t is None:
                signatures.append(None)
            elif type(t) in _PLAIN:
                signatures.append((t.dtype, t.shape, t.stride(), t.device, t.data_ptr() & 15))
            else:  # subclasses (fake, functional, ...) and non-tensors: validate every call
                raise _Uncacheable
    except RuntimeError:  # sparse and other layouts have no strides
        raise _Uncacheable from None
    return (op, _choice_key(backend), *_state(), *signatures, *types, *values)


def _choice_key(backend: BackendChoice) -> Any:
    if backend is None or type(backend) is str:
        return backend
    if isinstance(backend, (list, tuple)):
        return type(backend), tuple(backend)
    raise _Uncacheable  # a bad value: the full path raises the error that names it


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
    if prepared.empty or None in sources.values() or len(set(storages)) < len(storages):
        return _Plan(launch, static | tensors, None, finish)
    if getattr(launch, "by_address", False):  # a view at its input's own address is, to it, the input
        sources = {name: (i, None if view is None or not view[2] else view) for name, (i, view) in sources.items()}
    bindings = tuple((name, *src) for name, src in sources.items())
    return _Plan(launch, static, bindings, finish, None if static else _positional(launch, bindings))


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
