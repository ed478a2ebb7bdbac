"""The call path of `quantcore.ops`: validate, select, launch, and keep the validated plan.

`call(op, args, options, backend)` takes the op's tensors (and None for absent optional tensors)
positionally and its other options, none of them tensors, by keyword.

Validation and selection depend only on the arguments' metadata (dtypes, shapes, strides, devices,
options) and on the simulation and priority in force. Their outcome is therefore kept per such
signature (`plans`): a repeated call puts its tensors into the kept plan (each kernel argument is one
of the inputs or a view of one, re-made with the same view metadata) and launches, skipping the spec's
checks and the registry. Each op's public function computes that key inline and launches the kept
plan itself (`entry`, generated per op); only a call without one comes here.

A launch function that carries a `prepare` attribute (`prepare(**kwargs) -> run(**tensors)`,
`runtime.launch.prepared`) is prepared once per plan: everything that depends only on the signature
(grids, tile choice, the compiled kernel and its constant arguments) is computed then, and a repeated
call costs the key, the binding, and `run`: its output allocations and one kernel launch. Calls that
validate by reading data (`check_finite=True`; routing data on the CPU, `Prepared.read_values`),
tensors that are not plain strided tensors, plans whose kernel arguments are copies rather than views,
and calls whose inputs share memory are never kept.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch

from .. import definitions, registry
from ..definitions.prepared import keep as keep_results
from ..definitions.query import BackendChoice
from . import native
from .plans import UNKEPT, Plan, keep, key, plans, run, state


def call(op: str, args: tuple, options: dict[str, Any], backend: BackendChoice) -> Any:
    """Run `op` (a defined op's name, `quantcore.opdef`) on positional `args` and keyword `options`. The
    ops' own functions replay a kept plan before calling this (`entry`)."""
    return run(_plan(op, args, options, backend), args)


def _plan(op: str, args: tuple, options: dict[str, Any], backend: BackendChoice) -> Plan:
    """The call's plan: the kept one for its key, else a new one (kept when it can be replayed)."""
    try:
        k = key(op, args, options, backend)
        plan = plans.get(k)
    except UNKEPT:
        return _prepare(op, args, options, backend)
    if plan is None:
        plan = _prepare(op, args, options, backend)
        if plan.bindings is not None:
            keep(k, plan)
    return plan


class Site:
    """One place in a program that calls `op` again and again with arguments of the same metadata (a
    layer's forward, with its parameters among the arguments): it reuses its last call's plan while
    the caller's `signature` of the call and the registry's state are unchanged, skipping `call`'s key.

    `signature` is the caller's to compute, cheaper than the key because the caller knows what can
    change between its calls: it must change whenever the key would, so it holds the shape, strides,
    dtype, device and address mod 16 of each tensor that can change, every option that can change,
    and, for tensors whose metadata changes only with their memory (a module's parameters, replaced
    or moved as a whole), their address."""

    __slots__ = ("op", "_kept")

    def __init__(self, op: str):
        # (signature, plan) in one attribute: threads sharing a site (one layer called from several) read
        # and replace the pair at once, never one call's plan with another call's signature.
        self.op, self._kept = op, None

    def __reduce__(self):  # copied or pickled with its owner (a module), as a new site: plans hold kernels
        return Site, (self.op,)

    def __call__(self, signature: tuple, args: tuple, options: Callable[[], dict[str, Any]],
                 backend: BackendChoice = None) -> Any:
        """`call(op, args, options(), backend)`; `options` is called only when the plan is not reused."""
        signature = (signature, backend, state())
        kept = self._kept
        if kept is not None and signature == kept[0]:
            plan = kept[1]
        else:
            plan = _plan(self.op, args, options(), backend)
            self._kept = (signature, plan) if plan.bindings is not None else None
        if plan.direct is not None:  # `_run`'s first lines, inline: a layer's call pays one Python frame less
            out = plan.launch(*args[:plan.direct])
            return out if plan.finish is None else plan.finish(out)
        return run(plan, args)


def kept(op: str, args: tuple, options: dict[str, Any], backend: BackendChoice) -> Plan | None:
    """The kept plan of a call of `op` with tensors `args`, the options `options` (the others at the
    public function's defaults) and `backend`, if any."""
    try:
        return plans.get(key(op, args, {**definitions.get(op).defaults, **options}, backend))
    except UNKEPT:
        return None


def _prepare(op: str, args: tuple, options: dict[str, Any], backend: BackendChoice) -> Plan:
    """The full path: validate (raising on bad input), select, and describe how to rebind."""
    prepared = definitions.get(op).prepare(args, options)
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
            launch, finish = launch.prepare(**static, **tensors, lead=lead), keep_results
        else:
            launch = launch.prepare(**static, **tensors)
        static = {}
    if finish is keep_results:
        finish = None
    if prepared.empty or prepared.read_values or None in sources.values() or len(set(storages)) < len(storages):
        return Plan(launch, static | tensors, None, finish)
    if getattr(launch, "by_address", False):  # a view at its input's own address is, to it, the input
        sources = {name: (i, None if view is None or not view[2] else view) for name, (i, view) in sources.items()}
    bindings = tuple((name, *src) for name, src in sources.items())
    direct = None if static else _positional(launch, bindings)
    if direct is not None:  # a run taking the call's leading inputs: replayed in C++ once it can be
        launch = native.replay(launch, next(t.device for t in args if isinstance(t, torch.Tensor)))
    return Plan(launch, static, bindings, finish, direct)


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
