"""Why: every implementation of an op with its status for one query, from the same reasons that
selection, errors, the report and test skips use."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from ..definitions.query import BackendChoice, Query
from ..errors import UnsupportedError
from . import table
from .impl import Impl
from .selection import resolve_choice


class Candidate(BaseModel):
    """One implementation as seen by `explain()`: its status and the reasons it cannot run."""

    impl: str
    status: str  # selected | fallback | available | unavailable
    numerics: str
    reasons: list[str]


class Explanation(BaseModel):
    """Which implementation a call would run on this device (with the fixed options it is launched
    with: its variant), why each other one was not chosen, and which plugins failed to load."""

    op: str
    device: str
    arch: str
    format: str
    selected: str | None
    options: dict[str, Any] = {}
    numerics: str | None
    candidates: list[Candidate]
    broken_plugins: dict[str, str] = {}

    def __str__(self) -> str:
        head = f"{self.op} [{self.format}] on {self.device} ({self.arch}): "
        head += f"runs {self.selected}" if self.selected else "nothing can run"
        if self.options:
            head += f" ({', '.join(f'{k}={v}' for k, v in self.options.items())})"
        if self.numerics and self.numerics != "exact":
            head += f" (numerics: {self.numerics})"
        width = max([18, *(len(c.impl) for c in self.candidates)])
        rows = [f"  {c.impl:<{width}} {c.status:<11} {'; '.join(c.reasons)}"
                + (f" [numerics: {c.numerics}]" if c.numerics != "exact" else "") for c in self.candidates]
        rows += [f"  plugin {name} failed to load: {error}" for name, error in self.broken_plugins.items()]
        return "\n".join([head, *rows])


def opt_in_reason(impl: Impl) -> str:
    """Why an opt-in implementation that could run was not chosen."""
    return (f"opt-in, changes numerics: runs only when named (backend={impl.label!r}, or a priority list "
            "naming it)")


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
    explicit, order = resolve_choice(query, backend)
    try:
        chosen: Impl | None = table.choose(query, explicit, order, table.epoch())
    except UnsupportedError:
        chosen = None
    candidates = []
    ranked = table.ordered(query.op, order) if explicit is None else list(table.impls(query.op))
    others = [i for i in table.impls(query.op) if i not in ranked]
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
            if impl.opt_in and not any(impl.named_by(n) for n in ((explicit,) if explicit else order)):
                why = [opt_in_reason(impl)]
            elif explicit is not None:
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
        selected=chosen.label if chosen else None, options=dict(chosen.options) if chosen else {},
        numerics=chosen.numerics_on(query.profile) if chosen else None, candidates=candidates, broken_plugins=table.broken_plugins(),
    )
