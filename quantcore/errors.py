"""Typed errors raised by quantcore.

`InvalidInputError` is a `ValueError`: the caller passed something the op cannot accept.
`UnsupportedError` is a `NotImplementedError`: the input is valid but no (or not the requested)
implementation can run it here; it carries the reasons of every backend that was considered.
`ConfigError` is a `ValueError`: an environment variable quantcore reads has a value it cannot use.
"""

from __future__ import annotations


class QuantcoreError(Exception):
    """Base class of every error quantcore raises on purpose."""


class InvalidInputError(QuantcoreError, ValueError):
    """An argument has the wrong dtype, shape, device, layout or value."""


class UnsupportedError(QuantcoreError, NotImplementedError):
    """No implementation can run this call; `reasons` maps backend name -> list of reasons."""

    def __init__(self, message: str, reasons: dict[str, list[str]] | None = None):
        self.reasons = dict(reasons or {})
        lines = [message]
        for backend, why in self.reasons.items():
            lines.append(f"  {backend}: " + "; ".join(why))
        super().__init__("\n".join(lines))


class ConfigError(QuantcoreError, ValueError):
    """An environment variable quantcore reads (QUANTCORE_CACHE_DIR, QUANTCORE_DATA_DIR, ...) is unusable."""


class NonFiniteInputError(InvalidInputError):
    """Raised instead of producing non-finite scales when a caller opts in with `check_finite=True`."""
