"""NVRTC compilation of the CuPy backend's CUDA sources (`kernels/*.cu`, `*.cuh`).

Two entry points:

* `compile_source(filename, arch, name_expressions)` compiles one source for one architecture with
  NVRTC's own binding (`cupy_backends.cuda.libs.nvrtc`). It needs no GPU and no driver, so CI uses it
  to compile every kernel for every architecture and to read the PTX.
* `get_function(filename, name_expression, profile, device_index)` returns a launchable CuPy
  function for a device. The architecture is the *profile's* (`profile.compute_capability`), so a
  simulated sm_80 on an H100 runs the sm_80 code: an exact match loads a cubin built for `sm_XY`,
  an older target loads `compute_XY` PTX that the driver compiles for the device.

Kernels are C++ templates; each launch names one instantiation (e.g.
``"qc::quant_kernel<float, qc::Int8, 4, 32, 1>"``), which NVRTC instantiates and reports under its
mangled name. Sources are compiled without fast math (the numerics contract wants IEEE division and
no flush-to-zero). CuPy is imported only inside functions, so `import quantcore` never needs it.

Compilations are cached in memory and on disk, under `quantcore.userdirs.cache_dir()/nvrtc`
(`QUANTCORE_CACHE_DIR` moves it), one gzipped JSON file per compilation named by the SHA-256 of everything
that determines NVRTC's output: the kernel sources and headers, the file, the options (architecture
and include folder among them), the instantiations, cubin or not, NVRTC's version and the CUDA
headers' version. A GEMM instantiation costs NVRTC 1.5-2 s; a later process reads it back instead.
Files are written whole through a rename, so processes compiling at the same time never read a
partial one. Each carries a hash of that name's inputs and of its own PTX, cubin and mangled names,
checked on reading: an unreadable file, or one whose contents are not what its check says (edited,
damaged, copied under another name), counts as a miss and is compiled and written again; a cache
folder that cannot be written only costs the next process the compile. The CUDA headers come from the
installed NVIDIA wheels (their file records), a toolkit (CUDA_PATH, CUDA_HOME, CuPy's, /usr/local/cuda),
never from a folder on sys.path as such.
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import importlib.metadata
import importlib.resources
import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ... import userdirs
from ...errors import QuantcoreError, UnsupportedError

KERNEL_SUFFIXES = (".cu", ".cuh")
BASE_OPTIONS = ("--std=c++17",)


class KernelCompileError(QuantcoreError, RuntimeError):
    """NVRTC rejected a kernel source; `log` holds NVRTC's messages."""

    def __init__(self, message: str, log: str = ""):
        self.log = log
        super().__init__(f"{message}\n{log}" if log else message)


@dataclass(frozen=True)
class Compiled:
    """The result of one NVRTC compilation: PTX, a cubin when a real `sm_XY` target was asked for,
    the mangled name of each requested template instantiation, and NVRTC's log (warnings)."""

    ptx: bytes
    cubin: bytes | None
    lowered: dict[str, str]
    log: str


def _kernel_dir():
    return importlib.resources.files("quantcore.backends.cupy") / "kernels"


@functools.lru_cache(maxsize=None)
def kernel_sources() -> dict[str, str]:
    """Every CUDA source and header of the backend, file name -> text."""
    return {
        entry.name: entry.read_text(encoding="utf-8")
        for entry in _kernel_dir().iterdir()
        if entry.name.endswith(KERNEL_SUFFIXES)
    }


def kernel_files() -> tuple[str, ...]:
    """The compilable sources (`*.cu`), sorted; headers are provided to each of them."""
    return tuple(sorted(name for name in kernel_sources() if name.endswith(".cu")))


# ---------------------------------------------------------------- CUDA headers

_VERSION_RE = re.compile(r"#define\s+CUDART_VERSION\s+(\d+)")


def _wheel_includes() -> list[Path]:
    """The include folders the installed NVIDIA CUDA wheels ship (nvidia-cuda-runtime-cu12's
    nvidia/cuda_runtime/include, nvidia-cuda-nvrtc-cu12's, CUDA 13's nvidia/cu13/include), found through
    the wheels' own file records. Not by globbing `nvidia/*/include` over sys.path: its first entry is the
    running script's folder (or the working directory), where any `nvidia/x/include/cuda_fp16.h` would
    then be compiled into every kernel."""
    found: list[Path] = []
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if not name.startswith("nvidia-"):
            continue
        for file in dist.files or ():
            parts = file.parts
            if len(parts) == 4 and parts[0] == "nvidia" and parts[2] == "include" and parts[3] == "cuda_fp16.h":
                found.append(Path(dist.locate_file(file)).parent)
    return sorted(dict.fromkeys(found))


def _header_candidates() -> list[Path]:
    """Folders that may hold cuda_fp16.h / cuda_bf16.h: the installed pip wheels' (`_wheel_includes`), then a
    toolkit named by CUDA_PATH / CUDA_HOME, CuPy's own idea of the CUDA path, /usr/local/cuda."""
    out = _wheel_includes()
    for var in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(var):
            out.append(Path(os.environ[var]) / "include")
    try:
        import cupy

        cuda_path = cupy.cuda.get_cuda_path()
        if cuda_path:
            out.append(Path(cuda_path) / "include")
    except Exception:  # CuPy missing or unable to locate CUDA: other candidates remain
        pass
    out.append(Path("/usr/local/cuda/include"))
    return out


def _header_version(folder: Path) -> int | None:
    api = folder / "cuda_runtime_api.h"
    if not api.is_file():
        return None
    match = _VERSION_RE.search(api.read_text(errors="replace"))
    return int(match.group(1)) if match else None


@functools.lru_cache(maxsize=None)
def include_dirs() -> tuple[str, ...]:
    """The one folder whose cuda_fp16.h/cuda_bf16.h NVRTC should see: the first candidate whose
    CUDA major version matches NVRTC's, else the first with the headers at all. One folder only, so
    that headers of two CUDA versions never mix."""
    found = [d for d in dict.fromkeys(_header_candidates()) if (d / "cuda_fp16.h").is_file() and (d / "cuda_bf16.h").is_file()]
    if not found:
        return ()
    major = nvrtc_version()[0]
    same = [d for d in found if (_header_version(d) or 0) // 1000 == major]
    return (str((same or found)[0]),)


# ---------------------------------------------------------------- NVRTC

def _nvrtc():
    try:
        from cupy_backends.cuda.libs import nvrtc
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise UnsupportedError(f"CuPy's NVRTC binding is not available: {exc}") from exc
    return nvrtc


@functools.lru_cache(maxsize=None)
def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC library CuPy loads."""
    return tuple(_nvrtc().getVersion())


def supported_archs() -> tuple[int, ...]:
    """Architectures (75, 80, ...) this NVRTC can compile for."""
    return tuple(_nvrtc().getSupportedArchs())


def _arch_number(arch: Any) -> int:
    if isinstance(arch, tuple):
        return arch[0] * 10 + arch[1]
    return int(str(arch).lower().removeprefix("sm_").removeprefix("sm").removeprefix("compute_"))


_lock = threading.Lock()
_compiled: dict[tuple, Compiled] = {}


def compile_source(filename: str, arch: Any, name_expressions: Iterable[str] = (),
                   options: Iterable[str] = (), *, cubin: bool = False) -> Compiled:
    """Compile kernels/`filename` for `arch` ((9, 0), 90 or "sm_90") and instantiate each template
    in `name_expressions`. Works without a GPU. `cubin=True` targets the real `sm_XY` (PTX is kept
    too); otherwise the virtual `compute_XY`. Results are cached in memory and on disk (the module's
    docstring says how). Raises KernelCompileError with NVRTC's log when the source does not compile."""
    sources = kernel_sources()
    if filename not in sources:
        raise KernelCompileError(f"no kernel source {filename!r}; have {', '.join(kernel_files())}")
    number = _arch_number(arch)
    exprs = tuple(name_expressions)
    target = f"{'sm' if cubin else 'compute'}_{number}"
    opts = (*BASE_OPTIONS, f"--gpu-architecture={target}", *(f"-I{d}" for d in include_dirs()), *options)
    digest = hashlib.sha256("\0".join(f"{k}\0{v}" for k, v in sorted(sources.items())).encode()).hexdigest()
    key = (digest, filename, opts, exprs)
    with _lock:
        if key in _compiled:
            return _compiled[key]
    nvrtc = _nvrtc()
    if number not in supported_archs():
        raise UnsupportedError(f"NVRTC {'.'.join(map(str, nvrtc_version()))} cannot compile for sm_{number}")
    identity = _identity(digest, filename, opts, exprs)
    path = cache_path(identity)
    result = _read(path, identity, exprs)
    if result is None:
        result = _compile(nvrtc, sources, filename, target, opts, exprs, cubin)
        _write(path, identity, result)
    with _lock:
        _compiled[key] = result
    return result


def _identity(digest: str, filename: str, opts: tuple[str, ...], exprs: tuple[str, ...]) -> str:
    """A hash of everything that determines one compilation's output: the sources' `digest`, the file, the
    options (the target `compute_XY`/`sm_XY` and the include folder among them), the instantiations,
    NVRTC's version and the version of the CUDA headers NVRTC sees. It names the disk cache's file."""
    headers = [_header_version(Path(d)) for d in include_dirs()]
    parts = [digest, filename, *opts, "\1", *exprs, "\1", f"nvrtc {nvrtc_version()}", f"headers {headers}"]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def cache_path(identity: str) -> Path:
    """The disk cache's file for the compilation `identity` names."""
    return userdirs.cache_dir() / "nvrtc" / f"{identity}.json.gz"


def _check(identity: str, result: Compiled) -> str:
    """What an entry must carry to be taken as the compilation `identity` names: a hash of the identity and
    the output (PTX, cubin, each instantiation's mangled name), so that a file copied under another name,
    or whose PTX or names were changed, is compiled again rather than launched."""
    h = hashlib.sha256(identity.encode())
    for part in (result.ptx, result.cubin or b"", json.dumps(sorted(result.lowered.items())).encode()):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


def _read(path: Path, identity: str, exprs: tuple[str, ...]) -> Compiled | None:
    """A cached compilation, or None where there is none, it cannot be read, it lacks an instantiation, or
    its check (`_check`) is not that of `identity` and its contents."""
    try:
        data = json.loads(gzip.decompress(path.read_bytes()))
        result = Compiled(ptx=base64.b64decode(data["ptx"]),
                          cubin=None if data["cubin"] is None else base64.b64decode(data["cubin"]),
                          lowered=dict(data["lowered"]), log=str(data["log"]))
        check = data["check"]
    except (OSError, EOFError, ValueError, KeyError, TypeError):  # gzip raises OSError/EOFError when cut short
        return None
    if check != _check(identity, result) or not set(exprs) <= set(result.lowered):
        return None
    return result


def _write(path: Path, identity: str, result: Compiled) -> None:
    data = {"ptx": base64.b64encode(result.ptx).decode(), "lowered": result.lowered, "log": result.log,
            "cubin": None if result.cubin is None else base64.b64encode(result.cubin).decode(),
            "check": _check(identity, result)}
    try:
        # PTX compresses about tenfold: a GEMM file's instantiations are megabytes of text.
        userdirs.write_atomically(path, gzip.compress(json.dumps(data).encode(), mtime=0))
    except OSError:  # a read-only or full cache folder: the compile stands, the next process repeats it
        pass


def _compile(nvrtc, sources: dict[str, str], filename: str, target: str, opts: tuple[str, ...],
             exprs: tuple[str, ...], cubin: bool) -> Compiled:
    """One NVRTC compilation (raising KernelCompileError with NVRTC's log when it fails)."""
    headers = {k: v for k, v in sources.items() if k.endswith(".cuh")}
    prog = nvrtc.createProgram(sources[filename], filename, [v.encode() for v in headers.values()],
                               [k.encode() for k in headers])
    try:
        for expr in exprs:
            nvrtc.addNameExpression(prog, expr)
        try:
            nvrtc.compileProgram(prog, list(opts))
        except nvrtc.NVRTCError as exc:
            raise KernelCompileError(f"NVRTC failed on {filename} for {target} ({exc})",
                                     _text(nvrtc.getProgramLog(prog))) from None
        return Compiled(
            ptx=nvrtc.getPTX(prog),
            cubin=nvrtc.getCUBIN(prog) if cubin else None,
            lowered={expr: _text(nvrtc.getLoweredName(prog, expr)) for expr in exprs},
            log=_text(nvrtc.getProgramLog(prog)),
        )
    finally:
        nvrtc.destroyProgram(prog)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


# ---------------------------------------------------------------- loading on a device

_MAX_DYNAMIC_SMEM_ATTR = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_functions: dict[tuple, Any] = {}


@functools.lru_cache(maxsize=None)
def device_arch(device_index: int) -> int:
    """The real compute capability of a CUDA device as 90, 80, ..."""
    import cupy

    return int(cupy.cuda.Device(device_index).compute_capability)


def get_function(filename: str, name_expression: str, profile: Any, device_index: int, smem: int = 0) -> Any:
    """A `cupy.cuda.function.Function` for one template instantiation in kernels/`filename`, built
    for the profile's architecture and loaded on `device_index`. `smem` > 48 KiB raises the
    function's dynamic shared-memory limit (opt-in)."""
    target = _arch_number(profile.compute_capability)
    real = device_arch(device_index)
    if target > real:
        raise UnsupportedError(f"cannot run sm_{target} code (profile {profile.name}) on an sm_{real} device")
    key = (filename, name_expression, target, device_index)
    fn, smem_set = _functions.get(key, (None, 0))
    if fn is None:
        import cupy

        compiled = compile_source(filename, target, (name_expression,), cubin=target == real)
        with cupy.cuda.Device(device_index):
            module = cupy.cuda.function.Module()
            # cuModuleLoadData reads PTX as a C string; NVRTC's PTX comes without the terminator.
            module.load(compiled.cubin if compiled.cubin is not None else compiled.ptx.rstrip(b"\0") + b"\0")
            fn = module.get_function(compiled.lowered[name_expression])
    if smem > max(smem_set, 48 * 1024):
        import cupy

        cupy.cuda.driver.funcSetAttribute(fn.ptr, _MAX_DYNAMIC_SMEM_ATTR, smem)
        smem_set = smem
    _functions[key] = (fn, smem_set)
    return fn
