"""The native launch path: kept plans replayed in C++.

A `quantcore.ops` call whose plan is kept (`quantcore.runtime.dispatch`) still spends its host time in Python:
the prepared run's output allocations (`torch.empty_like`, ~0.9 µs each on the H100 host) and the
backend's launcher (Triton's C launcher parses every argument, ~3.4 µs), and a `torch.ops.quantcore`
call adds the dispatcher's boxing into Python and the Autograd kernel's questions. `replay.cpp` does those steps in C++:

- `Replay(run, describe, device)` stands for a prepared run that allocates its outputs and launches
  kernels whose parameters are constants, the run's inputs' addresses and its outputs' addresses
  (`runtime.launch.compose` says which runs are so: `run.native`). Its first calls run `run`; once
  `describe()` gives the description (Triton compiles a kernel on its first launch), it allocates as
  `at::empty_strided` does on CUDA, without its dispatch, and launches with `cuLaunchKernel` itself.
  Each launch's parameter count and sizes are checked against the driver's account of the kernel
  (`cuFuncGetParamInfo`) before it is taken.
  A run that launches something else while a CUDA graph is being captured (`launch.eagerly`) runs in
  Python while the driver says the stream is being captured.
- `install(...)` registers each custom op's CUDA and AutogradCUDA kernels: a call with no input requiring
  grad, in the default selection state (no simulation or priority context), whose arguments' key has a
  kept replay, runs it without entering Python; the others run the ops' Python kernels as before.

The extension is compiled from source with `torch.utils.cpp_extension` into quantcore's cache folder,
once per source and torch version (about 30 s), the first time a CUDA plan is kept in a process, or
ahead by `quantcore native`; QUANTCORE_NATIVE=0 turns the path off (and the build with it). A build
records the extension's size and SHA-256 beside it, and a process loads only a file that matches its
record: a damaged one (cut short, overwritten, emptied) is rebuilt, with a warning naming it. Where it
cannot be built or loaded (no compiler, no CUDA driver), `reason()` says why and every call takes the
Python path.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

try:
    import fcntl
except ImportError:  # Windows: builds in one cache folder are not serialized there
    fcntl = None

import torch

from ... import userdirs
from ...registry import table

NATIVE_ENV = "QUANTCORE_NATIVE"
_SOURCE = Path(__file__).with_name("replay.cpp")
_lock = threading.Lock()
_failure: str | None = None


def enabled() -> bool:
    """Whether the native path may be used in this process now (QUANTCORE_NATIVE is not "0")."""
    return os.environ.get(NATIVE_ENV, "1") != "0"


def _name() -> str:
    """The extension's module name: one per source and torch version."""
    digest = hashlib.sha256(_SOURCE.read_bytes() + torch.__version__.encode()).hexdigest()[:12]
    return f"quantcore_native_{digest}"


def _folder() -> Path:
    return userdirs.cache_dir() / "native" / _name()


def _built() -> Path | None:
    """The compiled extension in the cache, if it is there and is the file its build recorded (`_damage`)."""
    folder = _folder()
    if not folder.is_dir():
        return None
    return next((so for so in sorted(folder.glob(f"{folder.name}*.so")) if _damage(so) is None), None)


def _record(so: Path) -> Path:
    """The record of a build: `so`'s size and SHA-256, beside it."""
    return so.with_suffix(".json")


def _fingerprint(so: Path) -> dict[str, Any]:
    data = so.read_bytes()
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _damage(so: Path) -> str | None:
    """Why `so` must not be loaded (None: it is the file its build wrote). Checked before the loader maps
    it: a file cut short kills the process with SIGBUS on its first call, and garbage fails every import."""
    try:
        recorded = json.loads(_record(so).read_text())
        found = _fingerprint(so)
    except (OSError, ValueError):
        recorded = None
    if not isinstance(recorded, dict):
        return "no readable record of its build"
    if recorded.get("size") != found["size"]:
        return f"{found['size']} bytes where its build wrote {recorded.get('size')}"
    if recorded.get("sha256") != found["sha256"]:
        return "its contents are not those its build wrote (SHA-256)"
    return None


_BUILD_LOCK = ".quantcore-build.lock"


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Hold the build folder against other processes (released by the system if this one dies, unlike
    torch's own lock file, which a killed build leaves behind for every later build to wait on)."""
    with open(folder / _BUILD_LOCK, "a") as handle:
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _import(name: str, so: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, so)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.lru_cache(maxsize=None)
def _build() -> Any:
    """The compiled extension module (built first where the cache holds no intact one)."""
    name, folder = _name(), _folder()
    built = _built()
    if built is not None:  # load it without asking ninja whether it is up to date (the name says it is)
        return _import(name, built)
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder):
        built = _built()  # built by another process while this one waited
        if built is not None:
            return _import(name, built)
        damaged = [f"{so} ({why})" for so in sorted(folder.glob(f"{name}*.so")) if (why := _damage(so))]
        if damaged:
            warnings.warn(f"quantcore: not loading its native extension {', '.join(damaged)}; rebuilding it (about "
                          f"30 s)", stacklevel=4)
        else:
            warnings.warn("quantcore: compiling its native launch path (once per torch version, about 30 s); "
                          f"{NATIVE_ENV}=0 skips it", stacklevel=4)
        # From nothing: ninja would take a damaged object file or extension for up to date, and a lock file
        # of torch's left by a killed build would hold this one forever (no other build runs: the lock).
        for entry in folder.iterdir():
            if entry.is_dir():
                shutil.rmtree(entry)
            elif entry.name != _BUILD_LOCK:
                entry.unlink()
        from torch.utils import cpp_extension

        module = cpp_extension.load(name=name, sources=[str(_SOURCE)], build_directory=str(folder),
                                    extra_cflags=["-O2"], verbose=False)
        so = Path(module.__file__)
        userdirs.write_atomically(_record(so), json.dumps(_fingerprint(so)).encode())
        return module


def build() -> Path:
    """Compile the extension into the cache folder now, where it is not there yet (where an image is made,
    say; it needs no GPU), and load it; its path. Raises what the build raises."""
    with _lock:
        _build()
    return _built() or _folder()


def module() -> Any | None:
    """The extension, built and loaded on first use; None where it is off or cannot be had (`reason`)."""
    global _failure
    if not enabled() or _failure is not None:
        return None
    with _lock:
        if _failure is not None:
            return None
        try:
            ext = _build()
        except Exception as e:  # a missing compiler or headers, a failed build or load
            _failure = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
            # Once a process: its calls stay correct, only slower (docs/performance.md, round 20).
            warnings.warn(f"quantcore: its native launch path could not be built ({_failure}); kept plans are "
                          f"replayed in Python, a few µs more a call. `quantcore native` shows the whole error; "
                          f"{NATIVE_ENV}=0 skips the attempt", stacklevel=3)
            return None
        missing = ext.driver_missing()
        if missing:
            _failure = f"CUDA driver: {missing}"
            return None
        _configure(ext)
        return ext


def status(kind: str) -> str:
    """How kept plans are launched on a device of `kind` ("cuda", "cpu"), for the report: without building
    the extension."""
    if kind != "cuda":
        return "Python (the native path launches CUDA kernels only)"
    if not enabled() or _failure is not None:
        return f"Python ({reason()})"
    if _loaded() is not None or _built() is not None:
        return "native (kept plans replayed in C++, quantcore/backends/native)"
    return "native once built (compiled on the first CUDA call, about 30 s; then kept in the cache folder)"


def reason() -> str | None:
    """Why the native path is not in use (None when it is, or has not been tried yet in this process)."""
    if not enabled():
        return f"{NATIVE_ENV}=0"
    return _failure


_configured: list[Callable[[Any], None]] = []


def on_load(configure: Callable[[Any], None]) -> None:
    """Have `configure(ext)` called once the extension is loaded (at once if it is): the custom ops'
    kernels and the selection state are installed so, by the layers that own them."""
    _configured.append(configure)
    ext = _loaded()
    if ext is not None:
        configure(ext)


def _loaded() -> Any | None:
    return _build() if _build.cache_info().currsize and _failure is None else None


@functools.lru_cache(maxsize=None)
def _configure(ext: Any) -> None:
    for configure in _configured:
        configure(ext)


def replay(run: Callable[..., Any], device: torch.device) -> Callable[..., Any]:
    """`run` (a prepared run taking its inputs positionally) as a native `Replay` where it describes itself
    (`run.native`) and the extension is at hand; else `run`."""
    describe = getattr(run, "native", None)
    if describe is None or device.type != "cuda":
        return run
    ext = module()
    if ext is None:
        return run
    return ext.Replay(run, describe, device.index if device.index is not None else torch.cuda.current_device())


def replayed(launch: Any) -> bool:
    """Whether a plan's `launch` is a native replay that launches by itself (not a Python run: a plan made
    with the path off, or one whose run does not describe itself)."""
    ext = _loaded()
    return ext is not None and isinstance(launch, ext.Replay) and launch.ready


def clear() -> None:
    """Forget the custom ops' kept replays (the registry's selections changed)."""
    ext = _loaded()
    if ext is not None:
        ext.clear()


table.on_invalidate(clear)
