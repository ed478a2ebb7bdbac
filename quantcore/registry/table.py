"""The implementation table and the walk that picks from it.

Every implementation of every op: those added with `register` first, then the built-in backends'
`IMPLS`, then those of out-of-tree backends found through entry points (`plugins`). The built-in
and plug-in part is loaded once, on first use, and again after `forget`. `choose` walks the table in
a given order and keeps its answer per query and epoch.
"""

from __future__ import annotations

import functools
import importlib
from typing import Callable

from ..definitions import op as opdef
from ..definitions.query import Query
from ..errors import InvalidInputError, UnsupportedError
from . import plugins
from .impl import BACKEND_PACKAGES, Impl

REFERENCE = "torch"


@functools.lru_cache(maxsize=None)
def _loaded() -> tuple[dict[str, tuple[Impl, ...]], tuple[plugins.Plugin, ...]]:
    """(op -> built-in and plug-in implementations, each plugin's status)."""
    table: dict[str, list[Impl]] = {}
    found, status = plugins.load()
    builtin = [impl for package in BACKEND_PACKAGES
               for impl in importlib.import_module(f"quantcore.backends.{package}").IMPLS]
    for impl in (*builtin, *found):
        table.setdefault(impl.op, []).append(impl)
    return {op: tuple(impls) for op, impls in table.items()}, status


def plugin_status() -> tuple[plugins.Plugin, ...]:
    """Every entry point of the `quantcore.backends` group with what loading it gave."""
    return _loaded()[1]


def broken_plugins() -> dict[str, str]:
    """Plugins that failed to load: name -> error."""
    return {p.name: p.error for p in plugin_status() if p.error}


_registered: list[Impl] = []
_epoch = 0  # bumped whenever selections made so far may no longer hold
_invalidated: list[Callable[[], None]] = []


def on_invalidate(forget_plans: Callable[[], None]) -> Callable[[], None]:
    """Have `invalidate` call `forget_plans`: the runtime's caches of selections made before (the native
    replays of kept plans, which the epoch does not key) register this way, so the registry imports no
    layer above it."""
    _invalidated.append(forget_plans)
    return forget_plans


def epoch() -> int:
    """A counter that changes whenever earlier selections are invalidated (register, unregister,
    clear_caches); `quantcore.dispatch` keys its kept plans on it."""
    return _epoch


def invalidate() -> None:
    """Forget every cached selection (and, through the epoch, every kept plan; the custom ops' native
    kernels keep theirs apart, and forget them through `on_invalidate`)."""
    global _epoch
    _epoch += 1
    choose.cache_clear()
    for forget_plans in _invalidated:
        forget_plans()


def forget() -> None:
    """Load the built-in and plug-in implementations afresh on next use (newly installed plugins)."""
    _loaded.cache_clear()
    invalidate()


def register(impl: Impl) -> None:
    """Add an implementation from outside quantcore's backends (tried before built-ins of its backend name).
    Raises `InvalidInputError` when its launch function does not take the op's launch arguments."""
    if not isinstance(impl, Impl):
        raise InvalidInputError(f"register: expected a quantcore Impl, got {type(impl).__name__}")
    # Described-by-name launch functions are built-ins, checked by the tests: resolving them here
    # would import Triton or CuPy.
    if callable(impl.launch):
        opdef.check_launch(impl.op, impl.label, impl.launch, dict(impl.options))
    _registered.insert(0, impl)
    invalidate()


def unregister(impl: Impl) -> None:
    """Remove an implementation added with `register`."""
    if impl not in _registered:
        raise InvalidInputError(f"unregister: {impl!r} is not an implementation added with register(); the "
                                f"registered ones are {[i.label for i in _registered]}")
    _registered.remove(impl)
    invalidate()


def impls(op: str) -> tuple[Impl, ...]:
    """Every implementation of `op`: registered ones first, then the built-ins in registration order,
    then those of plugins."""
    return tuple(i for i in _registered if i.op == op) + _loaded()[0].get(op, ())


def opt_in_labels(op: str) -> set[str]:
    """Labels of the opt-in implementations of `op` (`Impl.opt_in`)."""
    return {i.label for i in impls(op) if i.opt_in}


def separate_epilogue_labels(op: str) -> set[str]:
    """Labels of the implementations of `op` that run a fused epilogue as passes of their own
    (`Impl.separate_epilogue`)."""
    return {i.label for i in impls(op) if i.separate_epilogue}


def backend_names() -> set[str]:
    """Every name `backend=` and priorities may use: the built-in backends, the backends of registered
    and plug-in implementations, and plugins that failed to load (they then have no implementation)."""
    loaded = {i.backend for found in _loaded()[0].values() for i in found}
    return set(BACKEND_PACKAGES) | loaded | {i.backend for i in _registered} | set(broken_plugins())


def compared(op: str) -> tuple[str, ...]:
    """What is compared with the reference for `op` (parity tests, bench, measured priorities): every
    other backend with an implementation of it, each variant its backend's name never reaches
    (`Impl.compared_alone`: "triton[gluon]"), and each variant of the reference on its own
    ("torch[cublas]"). Opt-in variants are not: they are held to their own declared bound, not the
    contract's tolerances, and a measured priority must never rank them."""
    found = [i for i in impls(op) if not i.opt_in]
    others = dict.fromkeys(i.backend for i in found if i.backend != REFERENCE)
    alone = dict.fromkeys(i.label for i in found if i.compared_alone)
    return (*others, *alone, *(i.label for i in found if i.backend == REFERENCE and i.variant))


def reference(op: str) -> Impl:
    """The reference implementation of `op`."""
    return next(i for i in impls(op) if i.backend == REFERENCE)


def ordered(op: str, order: tuple[str, ...]) -> list[Impl]:
    """Implementations in priority order. An entry names a backend (all its variants but the opt-in
    ones, in registration order) or one variant ("torch[cublas]"), which then ranks where it is named."""
    rank = {name: i for i, name in enumerate(order)}
    listed = [i for i in impls(op) if any(i.named_by(name) for name in order)]
    return sorted(listed, key=lambda i: rank.get(i.label, rank.get(i.backend)))


@functools.lru_cache(maxsize=4096)
def choose(query: Query, explicit: str | None, order: tuple[str, ...], epoch: int) -> Impl:
    """The first implementation of `query.op` with no reasons against `query`: among those named
    `explicit` when given (an opt-in variant only by its label), else in `order`. Raises
    `UnsupportedError` with every reason otherwise."""
    # `epoch` is part of the key: a selection computed while another thread (un)registers is stored
    # after that thread's cache_clear, under the old epoch, where no later lookup finds it.
    if explicit is not None:
        matching = [i for i in impls(query.op) if i.named_by(explicit)]
        broken = broken_plugins().get(explicit)
        if not matching:
            raise UnsupportedError(f"{query.op}: no implementation named {explicit!r}",
                                   {explicit: [f"plugin failed to load: {broken}"]} if broken else None)
        reasons: dict[str, list[str]] = {}
        for impl in matching:
            why = impl.not_supported_reasons(query)
            if not why:
                return impl
            merge(reasons, impl.label, why)
        raise UnsupportedError(
            f"{query.op}: backend {explicit!r} cannot run on {query.profile.name} ({query.profile.arch}) "
            f"for {query.fmt}; pass backend=None to choose automatically",
            reasons,
        )
    reasons = {}
    for impl in ordered(query.op, order):
        why = impl.not_supported_reasons(query)
        if not why:
            return impl
        merge(reasons, impl.label, why)
    raise UnsupportedError(f"{query.op}: no implementation can run on {query.profile.name}", reasons)


def merge(reasons: dict[str, list[str]], label: str, why: list[str]) -> None:
    """Add `why` under `label`, keeping what other implementations of that label said (one label may
    name several kernels, e.g. Triton's INT8 and FP8 GEMMs: each one's reason is part of the answer)."""
    kept = reasons.setdefault(label, [])
    kept.extend(r for r in why if r not in kept)
