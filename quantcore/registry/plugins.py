"""Out-of-tree backends, found through the `quantcore.backends` entry-point group.

A distribution declares, in its pyproject.toml,

    [project.entry-points."quantcore.backends"]
    mybackend = "mybackend_quantcore"

naming a module (or "module:attribute") that holds `IMPLS`, a tuple of `Impl` as a built-in backend
package does (or that is such a tuple itself). Its launch functions are callables, or
"package.module:function" names resolved on first launch, so that describing the backend stays
cheap. The registry loads every entry point once, on its first use (`registry.reset()` loads them
afresh). A plugin that fails to import, holds no `IMPLS`, or whose implementations name no defined
op or have launch functions that do not take their op's launch arguments, is left out whole:
`import quantcore` and selection go on without it, and `explain()` and the report show its error.

The entry point's name is, by convention, the backend name its implementations carry. A plugin's
backend runs where a priority names it (`QUANTCORE_PRIORITY=mybackend,triton`,
`quantcore.priority("mybackend")`, `backend="mybackend"`); automatic selection keeps to the defaults.
"""

from __future__ import annotations

import importlib.metadata

from pydantic import BaseModel

from ..definitions import op as opdef
from .impl import Impl
from ..errors import InvalidInputError

GROUP = "quantcore.backends"


class Plugin(BaseModel):
    """One entry point of the group: its name and target, and what loading it gave (the number of
    implementations it added, or why it added none)."""

    name: str
    value: str
    impls: int = 0
    error: str | None = None


def load() -> tuple[tuple[Impl, ...], tuple[Plugin, ...]]:
    """Every plugin's implementations, and each plugin's status, in the order of their names."""
    try:
        points = importlib.metadata.entry_points(group=GROUP)
    except Exception as err:  # a broken distribution's metadata must not break selection
        return (), (Plugin(name=GROUP, value="", error=_describe(err)),)
    impls: list[Impl] = []
    status = []
    for point in sorted(points, key=lambda p: p.name):
        try:
            found = _impls_of(point)
        except Exception as err:  # whatever a plugin raises, it is reported, not propagated
            status.append(Plugin(name=point.name, value=point.value, error=_describe(err)))
            continue
        impls += found
        status.append(Plugin(name=point.name, value=point.value, impls=len(found)))
    return tuple(impls), tuple(status)


def _impls_of(point: importlib.metadata.EntryPoint) -> tuple[Impl, ...]:
    loaded = point.load()
    found = getattr(loaded, "IMPLS", loaded)
    if not isinstance(found, (tuple, list)) or not all(isinstance(i, Impl) for i in found):
        raise InvalidInputError(f"{point.value} must be a module with IMPLS, a tuple of quantcore Impl "
                                f"(or such a tuple), got {type(found).__name__}")
    for impl in found:
        if callable(impl.launch):
            opdef.check_launch(impl.op, impl.label, impl.launch, dict(impl.options))
        else:  # named launches are resolved on first use: importing them here would load the kernels
            opdef.get(impl.op)
    return tuple(found)


def _describe(err: Exception) -> str:
    return f"{type(err).__name__}: {err}"
