"""What a spec hands the dispatcher: the selection query, the launch arguments and how to shape results."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..backends.base import Query


@dataclass(frozen=True)
class Prepared:
    """A validated call. `kwargs` follow the backend contract (2-D operands, leading dims flattened);
    `finish` restores the caller's leading dims and layout; `empty` is set when there is nothing to
    compute (M == 0), in which case the reference produces the empty outputs."""

    query: Query
    kwargs: dict[str, Any]
    finish: Callable[[Any], Any]
    empty: bool = False


def keep(out: Any) -> Any:
    """`finish` for results that need no reshaping."""
    return out
