"""Typed errors raised by quantcore.

`InvalidInputError` is a `ValueError`: the caller passed something the op cannot accept.
`UnsupportedError` is a `NotImplementedError`: the input is valid but no (or not the requested)
implementation can run it here; it carries the reasons of every backend that was considered.
`MissingDependencyError` is an `ImportError`: an optional package the call needs is not installed.
`CheckpointWriteError` is an `OSError` (its `errno` kept): the system refused to write a checkpoint.
`ConfigError` is a `ValueError`: an environment variable quantcore reads has a value it cannot use.
"""

from __future__ import annotations

import os
import sys

# Where quantcore's own frames come from: its source files and the functions it compiles from source
# (their code objects are named "<quantcore ...>").
_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
GENERATED = "<quantcore>"


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


def caller_stacklevel() -> int:
    """The `stacklevel` that makes a warning issued by the function calling this point at the first frame
    outside quantcore and torch: the user's line, however deep inside quantcore the warning is raised and
    whether it was reached through an `nn.Module` call or `torch.ops`. (Python 3.12's `skip_file_prefixes`
    does this, but quantcore supports 3.10.)"""
    torch = sys.modules.get("torch")
    skipped = (_PACKAGE,) + ((os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,)
                             if getattr(torch, "__file__", None) else ())
    level, frame = 2, sys._getframe(2)
    while frame is not None and (frame.f_code.co_filename.startswith(skipped)
                                 or frame.f_code.co_filename == GENERATED):
        level += 1
        frame = frame.f_back
    return level


class ConfigError(QuantcoreError, ValueError):
    """An environment variable quantcore reads (QUANTCORE_CACHE_DIR, QUANTCORE_DATA_DIR, ...) is unusable."""


class NonFiniteInputError(InvalidInputError):
    """Raised instead of producing non-finite scales when a caller opts in with `check_finite=True`."""


class MissingDependencyError(QuantcoreError, ImportError):
    """An optional package the call needs is not installed; the message says which extra to install."""


class CheckpointWriteError(QuantcoreError, OSError):
    """Writing a checkpoint failed in the file system (disk full, no permission); `errno` is the cause's."""
