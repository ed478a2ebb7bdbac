"""What a spec hands the dispatcher: the selection query, the launch arguments and how to shape results."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .query import Query


@dataclass(frozen=True)
class Prepared:
    """A validated call. `kwargs` follow the backend contract (2-D operands, leading dims flattened);
    `finish` restores the caller's leading dims and layout; `empty` is set when there is nothing to
    compute (M == 0), in which case the reference produces the empty outputs. `read_values`: the spec
    validated tensor values it read on the host (routing data on the CPU: expert offsets, expert ids),
    so the plan holds for this call only; a later call with other values must be validated again."""

    query: Query
    kwargs: dict[str, Any]
    finish: Callable[[Any], Any]
    empty: bool = False
    read_values: bool = False


def keep(out: Any) -> Any:
    """`finish` for results that need no reshaping."""
    return out


def leading(lead: tuple[int, ...]) -> Callable[[Any], Any]:
    """`finish` that gives each result tensor (one, or a tuple) the caller's leading dims `lead` back,
    keeping its last dim; `keep` when the caller's input already was 2-D."""
    if len(lead) == 1:
        return keep

    def finish(out: Any) -> Any:
        if isinstance(out, tuple):
            return tuple(t.reshape(*lead, t.shape[-1]) for t in out)
        return out.reshape(*lead, out.shape[-1])

    finish.lead = tuple(lead)  # type: ignore[attr-defined]  (a launch that shapes its results itself takes it)
    return finish
