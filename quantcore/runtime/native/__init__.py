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
once per source and torch version (about 30 s), or ahead by `quantcore native`. Where the cache has it,
the first CUDA plan loads it (a fraction of a second). Where it does not, that plan starts the build on
a thread of its own and takes the Python path, as every call does until the build is done (a process
never waits for it before its first forward; one that ends sooner waits for it at exit, so that the
next finds it built): its end invalidates the kept plans (`registry.table.invalidate`), so that the
next call of each makes its plan again, as a native replay, and loads the extension. QUANTCORE_NATIVE=0
turns the path off (and the build with it). Where it cannot be built or loaded (no compiler, no CUDA
driver), one warning says so, `reason()` says why, and every call takes the Python path. A build records
the extension's size and SHA-256 beside it, and a process loads only a file that matches its record: a
damaged one (cut short, overwritten, emptied) is rebuilt, with a warning naming it.
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
from ...errors import caller_stacklevel
from ...registry import table

NATIVE_ENV = "QUANTCORE_NATIVE"
_SOURCE = Path(__file__).with_name("replay.cpp")
_lock = threading.Lock()  # held while building or loading
_starting = threading.Lock()
_background: list[threading.Thread] = []  # the build `module()` started, once a process
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
        if damaged:  # a fresh build announces itself where it starts (`_start`)
            warnings.warn(f"quantcore: not loading its native extension {', '.join(damaged)}; rebuilding it (about "
                          f"30 s)", stacklevel=caller_stacklevel())
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
    """The extension, loaded and configured; None where it is off, cannot be had (`reason`) or is being built
    in the background (see the module's docstring): a call that finds it neither loaded nor in the cache
    starts that build and returns None at once."""
    global _failure
    if not enabled() or _failure is not None:
        return None
    if not _build.cache_info().currsize and _built() is None:
        _start()
        return None
    with _lock:
        if _failure is not None:
            return None
        try:
            ext = _build()
        except Exception as e:  # a failed load, or a build started here by a racing process's half-written file
            _fail(e)
            return None
        missing = ext.driver_missing()
        if missing:
            _failure = f"CUDA driver: {missing}"
            return None
        _configure(ext)
        return ext


def _fail(error: Exception) -> None:
    global _failure
    _failure = f"{type(error).__name__}: {str(error).strip().splitlines()[-1] if str(error).strip() else ''}"
    # Once a process: its calls stay correct, only slower.
    warnings.warn(f"quantcore: its native launch path could not be built ({_failure}); kept plans are replayed "
                  f"in Python, a few µs more a call. `quantcore native` shows the whole error; {NATIVE_ENV}=0 skips "
                  "the attempt", stacklevel=caller_stacklevel())


def _start() -> None:
    """Start building the extension on a thread of its own, once a process."""
    with _starting:
        if _background:
            return
        warnings.warn("quantcore: building its native launch path in the background (once per torch version, about "
                      "30 s; `quantcore native` builds it ahead); calls take the Python path meanwhile; "
                      f"{NATIVE_ENV}=0 skips it", stacklevel=4)
        # Not a daemon: killed halfway, the build would leave torch's lock file in the cache folder, on which
        # every later build waits.
        thread = threading.Thread(target=_build_in_background, name="quantcore-native-build")
        _background.append(thread)
        thread.start()


def _build_in_background() -> None:
    try:
        with _lock:
            _build()
    except Exception as e:  # a missing compiler or headers, a failed build or load
        _fail(e)
        return
    table.invalidate()  # the plans kept meanwhile are Python runs: made again, they are native replays


def wait(timeout: float | None = None) -> bool:
    """Wait for a background build to end (a server that wants native replays from its first request, tests);
    whether none is running."""
    for thread in _background:
        thread.join(timeout)
    return not any(thread.is_alive() for thread in _background)


def status(kind: str) -> str:
    """How kept plans are launched on a device of `kind` ("cuda", "cpu"), for the report: without building
    the extension."""
    if kind != "cuda":
        return "Python (the native path launches CUDA kernels only)"
    if not enabled() or _failure is not None:
        return f"Python ({reason()})"
    if _loaded() is not None or _built() is not None:
        return "native (kept plans replayed in C++, quantcore/backends/native)"
    if any(thread.is_alive() for thread in _background):
        return "Python while the native path is built in the background (about 30 s), then native"
    return "native once built (in the background from the first CUDA call, about 30 s; then kept in the cache folder)"


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
