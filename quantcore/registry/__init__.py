"""(op, backend) -> implementation, chosen by data.

- `impl`: `Impl` (one implementation of one op, its launch function named lazily) and `Constraints`
  (where it runs, as data); the built-in backend packages' names.
- `measured`: the GPUs' measured priority tables (shipped, and the user's).
- `table`: every implementation (registered, built-in, and out-of-tree ones found through the
  `quantcore.backends` entry points, `plugins`) and the cached walk that picks one.
- `priorities`: the order automatic selection tries backends in (default per device kind, measured
  tables, environment, context, per call); the reference ends every list, so it never dead-ends.
- `selection`: a call's `backend=` resolved to one implementation, warned about once when its numerics
  depart from the contract; `clear_caches()` and `reset()`.
- `explain`: why, for each implementation.

An explicit `backend="triton"` runs that backend or raises `UnsupportedError` with its reasons. What
`select` returns is what runs: the dispatcher launches it with its fixed `options` (its variant).
"""

from ..definitions.query import BackendChoice, Query, k_bucket, m_bucket
from .explain import Candidate, Explanation, explain_query
from .impl import (BACKEND_PACKAGES, REDUCED_FP8_ACCUMULATION, TENSOR_CORE_NUMERICS, Constraints, GemmConstraints,
                   Impl, on_reset)
from .plugins import Plugin
from .priorities import (DEFAULT_PRIORITY, PRIORITY_ENV, current_priority, explicit_priority, priority,
                         priority_context, priority_state, with_reference)
from .selection import NumericsWarning, clear_caches, reset, select
from .table import (REFERENCE, broken_plugins, compared, epoch, impls, plugin_status, reference, register,
                    unregister)

__all__ = [
    "BACKEND_PACKAGES", "REDUCED_FP8_ACCUMULATION", "TENSOR_CORE_NUMERICS", "Constraints", "GemmConstraints", "Impl",
    "on_reset", "Candidate", "Explanation", "explain_query", "Plugin", "DEFAULT_PRIORITY", "PRIORITY_ENV",
    "current_priority",
    "explicit_priority", "priority", "priority_context", "priority_state", "with_reference", "Query", "m_bucket",
    "k_bucket", "BackendChoice", "NumericsWarning", "clear_caches", "reset", "select", "REFERENCE", "broken_plugins",
    "compared", "epoch", "impls", "plugin_status", "reference", "register", "unregister",
]
