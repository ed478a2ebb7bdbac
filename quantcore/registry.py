"""(op, backend) -> implementation, chosen by data.

Priority is a list of backend names: the default per device kind below, replaced by the
environment (`QUANTCORE_PRIORITY=cupy,triton`), by a context (`with priority("cupy"):`) or per call
(`backend=("cupy", "triton")`). The reference ("torch") is appended to any list that does not
place it, so automatic selection never dead-ends. An explicit `backend="triton"` runs that backend or raises
`UnsupportedError` with its reasons. Implementations whose numerics depart from the contract
(emulated paths) are reported by `explain()` and warned about once.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import warnings
from typing import Iterator, Sequence

from pydantic import BaseModel

from . import capability, measured, opdef
from .backends import BACKEND_PACKAGES
from .backends.base import Impl, Query, reset_backends
from .errors import InvalidInputError, UnsupportedError

REFERENCE = "torch"
PRIORITY_ENV = "QUANTCORE_PRIORITY"
DEFAULT_PRIORITY: dict[str, tuple[str, ...]] = {
    "cuda": ("triton", "cupy", "torch"),
    "cpu": ("torch", "triton"),
}

BackendChoice = str | Sequence[str] | None


class NumericsWarning(UserWarning):
    """An implementation whose arithmetic departs from the numerics contract was selected."""


class Candidate(BaseModel):
    """One implementation as seen by `explain()`: its status and the reasons it cannot run."""

    impl: str
    status: str  # selected | fallback | available | unavailable
    numerics: str
    reasons: list[str]


class Explanation(BaseModel):
    """Which implementation a call would run on this device, and why each other one was not chosen."""

    op: str
    device: str
    arch: str
    format: str
    selected: str | None
    numerics: str | None
    candidates: list[Candidate]

    def __str__(self) -> str:
        head = f"{self.op} [{self.format}] on {self.device} ({self.arch}): "
        head += f"runs {self.selected}" if self.selected else "nothing can run"
        if self.numerics and self.numerics != "exact":
            head += f" (numerics: {self.numerics})"
        rows = [f"  {c.impl:<18} {c.status:<11} {'; '.join(c.reasons)}"
                + (f" [numerics: {c.numerics}]" if c.numerics != "exact" else "") for c in self.candidates]
        return "\n".join([head, *rows])


# A context variable, not a thread-local: each thread and each asyncio task sees its own `priority` blocks.
_priority: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar("quantcore_priority", default=None)


@contextlib.contextmanager
def priority(*backends: str) -> Iterator[None]:
    """Within the block, automatic selection tries `backends` in this order (reference last)."""
    _check_names(backends, "priority")
    token = _priority.set(tuple(backends))
    try:
        yield
    finally:
        _priority.reset(token)


def _check_names(names: Sequence, argument: str = "backend") -> None:
    """Every entry names a known backend ("triton") or one of its variants ("torch[cublas]")."""
    known = set(BACKEND_PACKAGES) | {i.backend for i in _registered}
    not_str = [n for n in names if not isinstance(n, str)]
    if not_str:
        raise InvalidInputError(f"{argument}: backend names must be str, got {not_str!r}; "
                                f"expected names among {sorted(known)}")
    bad = [n for n in names if n.partition("[")[0] not in known]
    if bad:
        raise InvalidInputError(f"{argument}: unknown {bad}; expected names among {sorted(known)}")


def priority_state() -> tuple:
    """What `current_priority` reads besides the query (context and environment): part of the key
    under which `quantcore.dispatch` keeps validated plans."""
    return _priority.get(), capability.environment(PRIORITY_ENV)


def current_priority(query: Query) -> tuple[str, ...]:
    """The priority in force for a call: context, then environment, then the measured table of this
    GPU model (not while simulating another; not for fused epilogues, which the bench does not time:
    an implementation fastest at a plain GEMM may run the epilogue as extra passes), then the
    default for the device kind."""
    context, env = priority_state()
    if context:
        order = context
    elif env:
        order = tuple(n.strip() for n in env.split(",") if n.strip())
        _check_names(order)
    else:
        p = query.profile
        found = None if p.kind != "cuda" or p.simulated_from or query.fused else measured.lookup(
            p.name, query.op, query.fmt, query.m_bucket)
        default = DEFAULT_PRIORITY.get(p.kind, (REFERENCE,))
        order = (*found, *[n for n in default if n not in found]) if found else default
    return _with_reference(order)


def _with_reference(order: tuple[str, ...]) -> tuple[str, ...]:
    """The reference ends every priority list unless the list already places it."""
    return order if REFERENCE in order else (*order, REFERENCE)


@functools.lru_cache(maxsize=None)
def _all_impls() -> dict[str, tuple[Impl, ...]]:
    table: dict[str, list[Impl]] = {}
    for package in BACKEND_PACKAGES:
        for impl in importlib.import_module(f"quantcore.backends.{package}").IMPLS:
            table.setdefault(impl.op, []).append(impl)
    return {op: tuple(impls) for op, impls in table.items()}


_registered: list[Impl] = []
_epoch = 0  # bumped whenever selections made so far may no longer hold


def epoch() -> int:
    """A counter that changes whenever earlier selections are invalidated (register, unregister,
    clear_caches); `quantcore.dispatch` keys its kept plans on it."""
    return _epoch


def _invalidate() -> None:
    """Forget every cached selection and kept plan."""
    global _epoch
    _epoch += 1
    _select_cached.cache_clear()


def clear_caches() -> None:
    """Forget every cached selection and kept plan, and which numerics warnings were issued."""
    _invalidate()
    _warned.clear()


def reset() -> None:
    """`clear_caches()`, and the backends' own caches of derived launch choices (the Triton backend's
    tuned GEMM configurations and tile choices, for one): a fresh start without a fresh process."""
    clear_caches()
    reset_backends()


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
    _invalidate()


def unregister(impl: Impl) -> None:
    """Remove an implementation added with `register`."""
    _registered.remove(impl)
    _invalidate()


def impls(op: str) -> tuple[Impl, ...]:
    """Every implementation of `op`: registered ones first, then the built-ins in registration order."""
    return tuple(i for i in _registered if i.op == op) + _all_impls().get(op, ())


def compared(op: str) -> tuple[str, ...]:
    """What is compared with the reference for `op` (parity tests, bench, measured priorities): every
    other backend with an implementation of it, and each variant of the reference on its own
    ("torch[cublas]")."""
    found = impls(op)
    others = dict.fromkeys(i.backend for i in found if i.backend != REFERENCE)
    return (*others, *(i.label for i in found if i.backend == REFERENCE and i.variant))


def reference(op: str) -> Impl:
    """The reference implementation of `op`."""
    return next(i for i in impls(op) if i.backend == REFERENCE)


def _ordered(op: str, order: tuple[str, ...]) -> list[Impl]:
    """Implementations in priority order. An entry names a backend (all its variants, in registration
    order) or one variant ("torch[cublas]"), which then ranks where it is named."""
    rank = {name: i for i, name in enumerate(order)}
    listed = [i for i in impls(op) if i.label in rank or i.backend in rank]
    return sorted(listed, key=lambda i: rank.get(i.label, rank.get(i.backend)))


def _resolve_choice(query: Query, backend: BackendChoice) -> tuple[str | None, tuple[str, ...]]:
    """(explicit label or None, priority order) for a call's `backend=` argument."""
    if backend is None or backend == "auto":
        return None, current_priority(query)
    if isinstance(backend, str):
        _check_names([backend])
        return backend, ()
    if not isinstance(backend, (list, tuple)):
        raise InvalidInputError(f"backend: expected None, \"auto\", a backend name or a list/tuple of names "
                                f"(a priority order), got {backend!r} ({type(backend).__name__})")
    names = tuple(backend)
    _check_names(names)
    return None, _with_reference(names)


@functools.lru_cache(maxsize=4096)
def _select_cached(query: Query, explicit: str | None, order: tuple[str, ...], epoch: int) -> Impl:
    # `epoch` is part of the key: a selection computed while another thread (un)registers is stored
    # after that thread's cache_clear, under the old epoch, where no later lookup finds it.
    if explicit is not None:
        matching = [i for i in impls(query.op) if explicit in (i.backend, i.label)]
        if not matching:
            raise UnsupportedError(f"{query.op}: no implementation named {explicit!r}")
        reasons: dict[str, list[str]] = {}
        for impl in matching:
            why = impl.not_supported_reasons(query)
            if not why:
                return impl
            _merge(reasons, impl.label, why)
        raise UnsupportedError(
            f"{query.op}: backend {explicit!r} cannot run on {query.profile.name} ({query.profile.arch}) "
            f"for {query.fmt}; pass backend=None to choose automatically",
            reasons,
        )
    reasons = {}
    for impl in _ordered(query.op, order):
        why = impl.not_supported_reasons(query)
        if not why:
            return impl
        _merge(reasons, impl.label, why)
    raise UnsupportedError(f"{query.op}: no implementation can run on {query.profile.name}", reasons)


def _merge(reasons: dict[str, list[str]], label: str, why: list[str]) -> None:
    """Add `why` under `label`, keeping what other implementations of that label said (one label may
    name several kernels, e.g. Triton's INT8 and FP8 GEMMs: each one's reason is part of the answer)."""
    kept = reasons.setdefault(label, [])
    kept.extend(r for r in why if r not in kept)


_warned: set[tuple[str, str, str]] = set()


def select(query: Query, backend: BackendChoice = None) -> Impl:
    """The implementation that runs `query` (cached per query and priority)."""
    explicit, order = _resolve_choice(query, backend)
    impl = _select_cached(query, explicit, order, _epoch)
    numerics = impl.numerics_on(query.profile)
    if numerics != "exact":
        key = (query.op, impl.label, query.profile.arch)
        if key not in _warned:
            _warned.add(key)
            warnings.warn(
                f"quantcore.{query.op}: {impl.label} on {query.profile.arch} computes {query.fmt} "
                f"with changed numerics: {numerics}",
                NumericsWarning,
                stacklevel=3,
            )
    return impl


def _one_per_label(candidates: list[Impl], fmt: str) -> list[Impl]:
    """Entries of one label split by format are one row: keep those implementing `fmt` (or the first,
    to say that none does)."""
    kept = []
    for impl in candidates:
        same = [i for i in candidates if i.label == impl.label]
        serving = [i for i in same if fmt in i.constraints.formats] or same[:1]
        if impl in serving:
            kept.append(impl)
    return kept


def explain_query(query: Query, backend: BackendChoice = None) -> Explanation:
    """Every implementation of `query.op` with its status for this query."""
    explicit, order = _resolve_choice(query, backend)
    try:
        chosen: Impl | None = _select_cached(query, explicit, order, _epoch)
    except UnsupportedError:
        chosen = None
    candidates = []
    ranked = _ordered(query.op, order) if explicit is None else list(impls(query.op))
    others = [i for i in impls(query.op) if i not in ranked]
    for impl in _one_per_label(ranked + others, query.fmt):
        why = impl.not_supported_reasons(query)
        if impl is chosen:
            # A fallback: a stand-in variant, or a later backend because the first one for this format can't run.
            first = next((i for i in ranked if query.fmt in i.constraints.formats), impl)
            degraded = bool(impl.fallback) or (explicit is None and impl.backend != first.backend)
            status = "fallback" if degraded else "selected"
            if impl.fallback:
                why = [impl.fallback]
        elif why:
            status = "unavailable"
        else:
            status = "available"
            if explicit is not None:
                why = [f"not requested (backend={explicit!r})"]
            elif impl in others:
                why = ["not in the priority list"]
            else:
                why = ["lower priority"]
        candidates.append(Candidate(impl=impl.label, status=status, numerics=impl.numerics_on(query.profile),
                                    reasons=why))
    p = query.profile
    device = p.name + (f" simulated on {p.simulated_from}" if p.simulated_from else "")
    return Explanation(
        op=query.op, device=device, arch=p.arch, format=query.fmt,
        selected=chosen.label if chosen else None, numerics=chosen.numerics_on(p) if chosen else None,
        candidates=candidates,
    )
