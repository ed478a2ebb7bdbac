"""Kept plans: what a validated call keeps so that a repeated call of the same signature only launches.

A plan is the launch of the implementation selection chose, prepared for the call's metadata, and how
to rebind a later call's tensors into it. Plans are kept per plan key: the op, the backend choice, the
selection state (`STATE`: the registry's epoch, the simulation and priority contexts and environment
variables), per tensor its dtype, shape, strides, device and address mod 16, and per option its type
and value. The key has one definition, `runtime.entry.entry`, generated per op as one tuple display in
the op's own public function (`keys` holds each op's key function for the dispatcher); the C++ replay of
the custom ops (`runtime.native`) keys on the same parts in the same order, and a `dispatch.Site` keys on
a cheaper signature its caller guarantees changes whenever the key would.
"""

from __future__ import annotations

import os
from typing import Any, Callable, NamedTuple

import torch

from .. import capability
from ..errors import GENERATED
from ..registry import on_reset, priorities, table
from . import native

_MAX_PLANS = 4096
# The tensor types whose calls are kept: subclasses (fake, functional, ...) are validated on every call.
PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


class Uncacheable(Exception):
    """A call whose plan is not kept (raised by a plan key, caught by its caller)."""


# A call whose plan is not kept: Uncacheable, TypeError (an unhashable option, or a sequence option that is
# none), RuntimeError (sparse and other layouts have no strides).
UNKEPT = (Uncacheable, TypeError, RuntimeError)


class Plan(NamedTuple):
    """A validated call's launch and how a later call of the same key rebinds its tensors into it."""

    launch: Callable[..., Any]
    static: dict[str, Any]  # kernel arguments other than the bound tensors ({} for prepared launches)
    # (argument, input index, view or None: the input itself); None: a plan for this call only
    bindings: tuple[tuple[str, int, tuple | None], ...] | None
    finish: Callable[[Any], Any] | None  # None: the launch's results are the call's as they are
    # k when the launch takes the call's first k inputs themselves as its first k parameters and
    # nothing else (`_positional`): the common case, replayed as `launch(*args[:k])`
    direct: int | None = None


plans: dict[tuple, Plan] = {}
on_reset(plans.clear)  # registry.reset(): kept plans are stale after it (the epoch says so) and hold memory
keys: dict[str, Callable[..., tuple]] = {}  # op name -> its plan key function, `entry.entry`'s


def keep(key: tuple, plan: Plan) -> None:
    """Keep `plan` under `key`, starting afresh when the store is full."""
    if len(plans) >= _MAX_PLANS:
        plans.clear()
    plans[key] = plan


def key(op: str, args: tuple, options: dict[str, Any], backend: Any) -> tuple:
    """The plan key of a call, as the op's public function computes it inline (`entry.entry`)."""
    return keys[op](*args, **options, backend=backend)


def run(plan: Plan, args: tuple) -> Any:
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
STATE = ("_epoch(), _simulation.get(), _priority.get(), _environ._data.get(_SIMULATE_ENV), "
          "_environ._data.get(_PRIORITY_ENV)")
NAMESPACE: dict[str, Any] = {
    "_epoch": table.epoch, "_simulation": capability.simulation_context, "_priority": priorities.priority_context,
    "_environ": os.environ, "_SIMULATE_ENV": os.environ.encodekey(capability.SIMULATE_ENV),
    "_PRIORITY_ENV": os.environ.encodekey(priorities.PRIORITY_ENV)}
exec(compile(f"def state():\n    return {STATE}\n", GENERATED, "exec"), NAMESPACE)
state: Callable[[], tuple] = NAMESPACE.pop("state")  # the registry's epoch, the simulation and the priority in force
# The custom ops' native kernels replay kept plans where the contexts are unset, keyed on these variables.
native.on_load(lambda ext: ext.set_state(capability.simulation_context, priorities.priority_context,
                                         [capability.SIMULATE_ENV, priorities.PRIORITY_ENV, native.NATIVE_ENV]))


def choice_key(backend: Any) -> Any:
    """A `backend=` other than None or a name, as a plan key's part."""
    if isinstance(backend, (list, tuple)):
        return type(backend), tuple(backend)
    raise Uncacheable  # a bad value: the full path raises the error that names it


AT_DEFAULT = object()  # a plan key's part for an option that is its function's default object


def immutable(value: Any) -> bool:
    """Whether `value` cannot change after the function's definition (so `is` it means its value too)."""
    if isinstance(value, tuple):
        return all(immutable(v) for v in value)
    return value is None or type(value) in (bool, int, float, str, torch.dtype)


