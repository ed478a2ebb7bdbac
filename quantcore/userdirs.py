"""Where quantcore keeps files of its own outside the installed package, by platform convention.

`cache_dir()`: compiled kernels (NVRTC output), safe to delete at any time. `data_dir()`: what a user
made and wants kept, such as measured priority tables (`quantcore bench --write-priority`). Each is
overridden by an environment variable naming the folder itself:

| platform | cache (`QUANTCORE_CACHE_DIR`) | data (`QUANTCORE_DATA_DIR`) |
|---|---|---|
| Linux and other POSIX | `$XDG_CACHE_HOME/quantcore` (`~/.cache/quantcore`) | `$XDG_DATA_HOME/quantcore` (`~/.local/share/quantcore`) |
| macOS | `~/Library/Caches/quantcore` | `~/Library/Application Support/quantcore` |
| Windows | `%LOCALAPPDATA%\\quantcore\\Cache` | `%LOCALAPPDATA%\\quantcore` |

The variables must name absolute folders: a relative one would move with the working directory, so
one process would fill several caches and miss its own entries (`ConfigError` names the variable).
The folders are not created here; writers create them.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path

from .errors import ConfigError

CACHE_ENV = "QUANTCORE_CACHE_DIR"
DATA_ENV = "QUANTCORE_DATA_DIR"
APP = "quantcore"


def _base(xdg: str, xdg_default: str, mac: str) -> Path:
    """The platform's folder for one kind of file, before the application's name."""
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    if sys.platform == "darwin":
        return Path.home() / "Library" / mac
    value = os.environ.get(xdg, "")
    return Path(value) if os.path.isabs(value) else Path.home() / xdg_default  # XDG: relative values are ignored


def _override(env: str, what: str) -> Path | None:
    """The folder environment variable `env` names, if it is set and not empty."""
    value = os.environ.get(env)
    if not value:
        return None
    if not os.path.isabs(value):
        raise ConfigError(f"{env}={value!r} is a relative path; set it to an absolute folder for quantcore's {what} "
                          f"(e.g. {os.path.abspath(value)!r}), or unset it to use the platform's default")
    return Path(value)


def cache_dir() -> Path:
    """quantcore's cache folder (`QUANTCORE_CACHE_DIR`, else the platform's user cache folder)."""
    override = _override(CACHE_ENV, "cache (compiled kernels)")
    if override is not None:
        return override
    base = _base("XDG_CACHE_HOME", ".cache", "Caches") / APP
    return base / "Cache" if sys.platform == "win32" else base


def data_dir() -> Path:
    """quantcore's data folder (`QUANTCORE_DATA_DIR`, else the platform's user data folder)."""
    override = _override(DATA_ENV, "data (measured priority tables)")
    if override is not None:
        return override
    return _base("XDG_DATA_HOME", ".local/share", "Application Support") / APP


def write_atomically(path: Path, data: bytes) -> None:
    """Write `path` whole or not at all, also with other processes writing it at the same time: the
    bytes go to a temporary file in the same folder, which then replaces `path` (an atomic rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
