"""(query, backend choice) -> the implementation that runs it; and the registry's caches.

An explicit `backend="triton"` runs that backend or raises `UnsupportedError` with its reasons;
`backend=None`/"auto" walks the priority in force. Implementations whose numerics depart from the
contract (emulated paths) are warned about once.
"""

from __future__ import annotations

import warnings

from ..definitions.query import BackendChoice, Query
from ..errors import InvalidInputError, caller_stacklevel
from . import measured, table
from .impl import Impl, reset_backends
from .priorities import check_names, current_priority, with_reference


class NumericsWarning(UserWarning):
    """An implementation whose arithmetic departs from the numerics contract was selected."""


def resolve_choice(query: Query, backend: BackendChoice) -> tuple[str | None, tuple[str, ...]]:
    """(explicit label or None, priority order) for a call's `backend=` argument."""
    if backend is None or backend == "auto":
        return None, current_priority(query)
    if isinstance(backend, str):
        check_names([backend])
        return backend, ()
    if not isinstance(backend, (list, tuple)):
        raise InvalidInputError(f"backend: expected None, \"auto\", a backend name or a list/tuple of names "
                                f"(a priority order), got {backend!r} ({type(backend).__name__})")
    names = tuple(backend)
    check_names(names)
    return None, with_reference(names)


_warned: set[tuple[str, str, str]] = set()


def select(query: Query, backend: BackendChoice = None) -> Impl:
    """The implementation that runs `query` (cached per query and priority); it is launched with its
    fixed `options`, which carry its variant (the Triton GEMM's `mma`, for one) to the launch."""
    explicit, order = resolve_choice(query, backend)
    impl = table.choose(query, explicit, order, table.epoch())
    numerics = impl.numerics_on(query.profile)
    if numerics != "exact":
        key = (query.op, impl.label, query.profile.arch)
        if key not in _warned:
            _warned.add(key)
            warnings.warn(
                f"quantcore.{query.op}: {impl.label} on {query.profile.arch} computes {query.fmt} "
                f"with changed numerics: {numerics}",
                NumericsWarning,
                stacklevel=caller_stacklevel(),
            )
    return impl


def clear_caches() -> None:
    """Forget every cached selection and kept plan, and which numerics warnings were issued."""
    table.invalidate()
    _warned.clear()


def reset() -> None:
    """A fresh start without a fresh process: `clear_caches()`; the implementation table, loaded
    afresh on next use (plugins installed since are found); the measured priority tables, read again;
    and every cache registered with `registry.impl.on_reset` (the Triton backend's tuned GEMM
    configurations and tile choices, the dispatcher's kept plans). Caches of facts that cannot go stale
    (compiled kernels keyed by their source and target, the device's properties) are kept."""
    table.forget()
    clear_caches()
    measured.forget()
    reset_backends()
