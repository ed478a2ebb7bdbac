"""Which backends automatic selection tries, in which order.

Priority is a list of backend names: the default per device kind below, refined on a real GPU by its
measured table, replaced by the environment (`QUANTCORE_PRIORITY=cupy,triton`), by a context
(`with priority("cupy"):`) or per call (`backend=("cupy", "triton")`). The reference is appended to
any list that does not place it, so automatic selection never dead-ends.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from typing import Iterator, Sequence

from ..definitions.query import Query
from ..errors import InvalidInputError
from . import measured, table

PRIORITY_ENV = "QUANTCORE_PRIORITY"
DEFAULT_PRIORITY: dict[str, tuple[str, ...]] = {
    "cuda": ("triton", "cupy", "torch"),
    "cpu": ("torch", "triton"),
}

# A context variable, not a thread-local: each thread and each asyncio task sees its own `priority` blocks.
# Set only by `priority`; read by `priority_state` and, for its plan key, by `quantcore.runtime`.
priority_context: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar("quantcore_priority",
                                                                                         default=None)


@contextlib.contextmanager
def priority(*backends: str) -> Iterator[None]:
    """Within the block, automatic selection tries `backends` in this order (reference last)."""
    check_names(backends, "priority")
    token = priority_context.set(tuple(backends))
    try:
        yield
    finally:
        priority_context.reset(token)


def check_names(names: Sequence, argument: str = "backend") -> None:
    """Every entry names a known backend ("triton") or one of its variants ("torch[cublas]")."""
    not_str = [n for n in names if not isinstance(n, str)]
    known = table.backend_names()
    if not_str:
        raise InvalidInputError(f"{argument}: backend names must be str, got {not_str!r}; "
                                f"expected names among {sorted(known)}")
    bad = [n for n in names if n.partition("[")[0] not in known]
    if bad:
        raise InvalidInputError(f"{argument}: unknown {bad}; expected names among {sorted(known)}")


def priority_state() -> tuple:
    """What `current_priority` reads besides the query: the `priority` block in force and the
    environment's `QUANTCORE_PRIORITY` (the plan key reads both directly, `quantcore.runtime.plans`)."""
    return priority_context.get(), os.environ.get(PRIORITY_ENV)


def current_priority(query: Query) -> tuple[str, ...]:
    """The priority in force for a call: context, then environment, then the measured table of this
    GPU model (not while simulating another; per M, and for a GEMM per K where the table has it), then
    the default for the device kind. A measured table never brings in an opt-in variant (only a
    priority the user names does): one found in a table, written by hand, is dropped; nor, for a call
    with a fused epilogue (a GEMM's bias, activation or re-quantized output: `Query.fuses_epilogue`),
    one that runs the epilogue as passes of its own (`Impl.separate_epilogue`)."""
    explicit = explicit_priority()
    if explicit:
        order = explicit[0]
        check_names(order)
    else:
        p = query.profile
        found = None if p.kind != "cuda" or p.simulated_from else measured.lookup(
            p.name, query.measured_as, query.fmt, query.m_bucket, query.k_bucket)
        if found:
            skipped = table.opt_in_labels(query.op)
            if query.fuses_epilogue:
                skipped |= table.separate_epilogue_labels(query.op)
            found = tuple(n for n in found if n not in skipped)
        default = DEFAULT_PRIORITY.get(p.kind, (table.REFERENCE,))
        order = (*found, *[n for n in default if n not in found]) if found else default
    return with_reference(order)


def explicit_priority() -> tuple[tuple[str, ...], str] | None:
    """(the priority a user set, where it was set): a `priority` block, else `QUANTCORE_PRIORITY` where
    it names a backend; None where neither sets one (the measured table or the default then applies)."""
    context, env = priority_state()
    if context:
        return context, "quantcore.priority()"
    names = tuple(n.strip() for n in (env or "").split(",") if n.strip())
    return (names, PRIORITY_ENV) if names else None


def with_reference(order: tuple[str, ...]) -> tuple[str, ...]:
    """The reference ends every priority list unless the list already places it."""
    return order if table.REFERENCE in order else (*order, table.REFERENCE)
