"""Launching a compiled Triton kernel directly, without the JIT's per-call work.

`kernel[grid](*args, **constants)` binds and specialises every argument, hashes the specialisation
and looks the compiled kernel up on each call: ~20 µs of host time on an H100 machine, more than
most of quantcore's kernels take on the GPU. A `Launcher` is made once per kept plan (`dispatch.py`),
where every argument's type, value class and alignment is fixed; its first call goes through the JIT
(compiling or finding the kernel) and keeps the compiled kernel, later calls hand the arguments
straight to the compiled kernel's launcher. That launcher and its calling convention are Triton
internals, so the direct path is taken only for Triton versions in `SUPPORTED` (checked against the
one installed, and tested on the GPU), never under the interpreter, and not when
QUANTCORE_TRITON_DIRECT=0; otherwise every call goes through the JIT as before. Direct launches
skip Triton's launch hooks (its profiler sees JIT launches only).

On the Triton versions in `RAW_SUPPORTED` a kernel that needs no scratch memory is launched one step
further down (one that takes tensor descriptors as the next paragraph says): `compiled.run` is then a
Python wrapper that only finds there is no scratch to allocate and forwards to the C launcher it holds,
adding two flags and two null scratch pointers; calling that C function with them skips the wrapper (on
the H100 host, 5.9 µs against 7.2 µs a launch; launching with `cuLaunchKernel` through ctypes on
parameters packed once took 7.4). It is also handed the tensors'
addresses as integers: for a tensor it looks up and calls `data_ptr` and asks the driver what the
pointer is (`cuPointerGetAttribute`), a check that validation has made already; with seven tensors that
was 9.0 µs a launch against 6.3 with addresses read in Python.

Kernels that take TMA descriptors are handed the tensors the descriptors describe (`descriptors`:
argument position -> the function that makes a tensor's descriptor; a plan fixes the shape, strides, box
and layout, so a descriptor depends on nothing but the tensor's address). On `RAW_SUPPORTED` versions
`compiled.run.launch` is then Triton's Python wrapper that builds each descriptor's `TensorDescriptor`
and encodes its `CUtensorMap` on every call (building a Gluon descriptor took 6.1 µs on the H100 host,
and a Gluon GEMM has three); the launcher keeps, per position, the
encoded arguments (Triton's own `make_tensordesc_arg`) of the last addresses it saw and calls the C
launcher the wrapper holds with them.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import struct
import types
from typing import Any

import torch

from ... import capability
from ...runtime.launch import NativeLaunch, compose

DIRECT_ENV = "QUANTCORE_TRITON_DIRECT"
# `CompiledKernel.run(grid0, grid1, grid2, stream, function, packed_metadata, launch_metadata,
# enter_hook, exit_hook, *every kernel argument in signature order)`: Triton 3.3 through 3.9.
SUPPORTED = ((3, 3), (3, 9))
# `CompiledKernel.run.launch(grid0, grid1, grid2, stream, function, cooperative, pdl, global_scratch,
# profile_scratch, packed_metadata, launch_metadata, enter_hook, exit_hook, *kernel arguments)`, the C
# launcher itself where the kernel has no tensor descriptors: Triton 3.6 (3.9 passes its arguments
# differently).
RAW_SUPPORTED = ((3, 6), (3, 6))
# Encoded descriptor arguments kept per position: the addresses of every weight of a model's layers
# of one shape and of a few activations and outputs.
DESCRIPTORS_KEPT = 1024


def version_supported(version: str, within: tuple[tuple[int, int], tuple[int, int]] = SUPPORTED) -> bool:
    """Whether Triton `version` ("3.6.0", "3.4.0+git…") lies in the (major, minor) range `within`:
    by default, whether it launches compiled kernels the way `Launcher` does."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return bool(match) and within[0] <= (int(match[1]), int(match[2])) <= within[1]


@functools.lru_cache(maxsize=None)
def _installed_supported(within: tuple[tuple[int, int], tuple[int, int]] = SUPPORTED) -> bool:
    import triton

    return version_supported(triton.__version__, within)


def enabled() -> bool:
    """Whether launches may bypass the JIT in this process now."""
    return (os.environ.get(DIRECT_ENV, "1") != "0" and not capability.triton_interpreter()
            and _installed_supported())


_data_ptr = torch.Tensor.data_ptr
# Looked up once, not per launch (absent from CPU builds, where nothing launches directly).
_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_current_device = getattr(torch._C, "_cuda_getDevice", None)

_KERNEL_VIEW = {torch.bfloat16: torch.int16, torch.float8_e4m3fn: torch.uint8}


def _kernel_view(t: Any) -> Any:
    """A tensor as the JIT should type it (bf16 as int16 bits, FP8 as uint8 bits; same memory), else `t`."""
    if isinstance(t, torch.Tensor) and t.dtype in _KERNEL_VIEW:
        return t.view(_KERNEL_VIEW[t.dtype])
    return t


class Launcher:
    """`fn[grid](*args, **constants)` for one kept plan: `args` are the kernel's leading, non-constexpr
    parameters (tensors or scalars whose classes the plan fixes); `constants` its constexprs and launch
    options (num_warps, ...). The compiled kernel already knows the tensors' element types, so direct
    launches pass tensors as they are; JIT launches see bf16/FP8 tensors as their integer bits.
    `descriptors`: argument position -> a function making the TMA descriptor of the tensor (or None,
    passed on as None) the caller gives at that position (see the module docstring). `fixed`: the
    trailing non-constexpr arguments that the plan fixes (sizes, strides, eps, and tensors it keeps:
    workspaces), given after the caller's on every launch: a direct launch passes them on with the
    constexprs' values in one tuple, tensors as their addresses, where a caller's
    `launch(*tensors, *scalars)` built and split a longer one each time."""

    __slots__ = ("fn", "grid", "constants", "device", "descriptors", "fixed", "_run", "_function", "_packed",
                 "_tail", "_raw", "_head", "_tensors", "_encoded", "_rest", "_compiled", "_launched", "_cuda")

    def __init__(self, fn, grid: tuple[int, ...], constants: dict[str, Any], device: torch.device,
                 descriptors: dict[int, Any] | None = None, fixed: tuple = ()):
        self.fn, self.constants, self.descriptors, self.fixed = fn, constants, descriptors or {}, tuple(fixed)
        self.grid = (tuple(grid) + (1, 1))[:3]
        self.device = device.index if device.index is not None else 0
        self._cuda = device.type == "cuda"
        self._run = self._raw = self._encoded = self._compiled = None
        self._launched = False

    def __call__(self, *args: Any) -> None:
        # Triton compiles, loads and launches on the current device: the launcher's must be current.
        if self._cuda and _current_device() != self.device:
            with torch.cuda.device(self.device):
                self._launch(*args)
            return
        self._launch(*args)

    def _launch(self, *args: Any) -> None:
        if self._raw is not None:
            n = self._tensors
            leading = map(_data_ptr, args[:n]) if self._encoded is None else self._addresses(args[:n])
            self._raw(*self.grid, _current_stream(self.device), *self._head, *leading, *args[n:], *self._rest)
            return
        args += self.fixed
        described = self._described(args) if self.descriptors else args
        if self._run is not None:
            self._run(*self.grid, _current_stream(self.device), self._function, self._packed,
                      None, None, None, *described, *self._tail)
            return
        compiled = self.fn[self.grid](*map(_kernel_view, described), **self.constants)
        self._launched = True
        if enabled():
            self._bind(compiled, args)

    def statement(self, leading: tuple[str | None, ...]) -> tuple[str, dict[str, Any]]:
        """Source of a launch with the leading tensor arguments `leading` (Python expressions of tensors; None
        for one the kernel does not read: the first expression on the JIT path, address 0 on the C launcher)
        and the names it uses, for `runtime.launch.compose`. Its first call goes through `__call__`; once that has
        bound the C launcher (`raw`, no descriptors), later calls call it themselves: no Python frame
        between the caller's and the launch (`__call__` was one more, with its splits and checks)."""
        stand_in = next(e for e in leading if e is not None)
        jit = ", ".join(e or stand_in for e in leading)
        raw = ", ".join("0" if e is None else f"_data_ptr({e})" for e in leading)
        grid = ", ".join(map(str, self.grid))
        namespace: dict[str, Any] = {"_raw": None, "_head": None, "_rest": None, "_stream": _current_stream,
                                     "_data_ptr": _data_ptr, "_device": _current_device, "_on": torch.cuda.device}

        def first(*tensors: Any) -> None:
            self(*tensors)
            if self._raw is not None and self._encoded is None:
                namespace.update(_raw=self._raw, _head=self._head, _rest=self._rest)
        namespace["_first"] = first
        launch = f"_raw({grid}, _stream({self.device}), *_head, {raw}, *_rest)"
        source = (f"    if _raw is None:\n        _first({jit})\n    elif _device() == {self.device}:\n"
                  f"        {launch}\n    else:\n        with _on({self.device}):\n            {launch}\n")
        return source, namespace

    def function(self, params: str, leading: tuple[str | None, ...], outputs: dict[str, Any],
                 result: str) -> Any:
        """`runtime.launch.compose` of this launch (`statement`): `def run({params})` allocating `outputs` (name ->
        allocator), launching with `leading` and returning `result`; described for the native path
        (`native`) once bound."""
        return compose(params, outputs, *self.statement(leading), result, functools.partial(self.native, leading))

    def native(self, leading: tuple[str | None, ...]) -> list[NativeLaunch] | bool | None:
        """This launch for the native path (`runtime.launch.NativeLaunch`) with the leading tensor arguments
        named `leading`, as the C launcher takes it: None before the first launch, False where it is not
        launched through the C launcher (`raw`) or takes an argument of a type a parameter slot cannot
        hold. The C launcher of the `RAW_SUPPORTED` versions passes the kernel its non-constexpr arguments
        in signature order, then the global and profile scratch addresses (null here: `_bind` takes no
        kernel that needs scratch)."""
        if self._raw is None or self._encoded is not None:
            return False if self._launched else None
        compiled = self._compiled
        signature = getattr(getattr(compiled, "src", None), "signature", None)
        meta = getattr(compiled, "metadata", None)
        if (not isinstance(signature, dict) or getattr(meta, "num_ctas", 1) != 1 or self._head[1] or self._head[2]
                or len(signature) != len(leading) + len(self._rest)):
            return False
        params: list[str | int | None] = []
        for ty, value in zip(signature.values(), (*leading, *self._rest)):
            if ty == "constexpr":
                continue
            slot = _slot(ty, value)
            if slot is False:
                return False
            params.append(slot)
        return [NativeLaunch(compiled.function, self.grid, (32 * meta.num_warps, 1, 1), meta.shared,
                             (*params, None, None))]

    def _described(self, args: tuple) -> tuple:
        """`args` with a descriptor in place of each tensor at a `descriptors` position."""
        return tuple(self.descriptors[i](a) if a is not None and i in self.descriptors else a
                     for i, a in enumerate(args))

    def _addresses(self, tensors: tuple) -> list:
        """The C launcher's leading arguments: a tensor's address, or a described tensor's encoded
        descriptor arguments, kept per address (`DESCRIPTORS_KEPT` per position)."""
        leading = []
        for t, kept in zip(tensors, self._encoded):
            if kept is None:
                leading.append(t.data_ptr())
                continue
            address = t.data_ptr()
            encoded = kept[1].get(address)
            if encoded is None:
                if len(kept[1]) >= DESCRIPTORS_KEPT:
                    del kept[1][next(iter(kept[1]))]
                encoded = kept[1][address] = kept[0](t)
            leading.extend(encoded)
        return leading

    def _bind(self, compiled: Any, args: tuple) -> None:
        self._compiled = compiled
        nargs = len(args)
        names = getattr(self.fn, "arg_names", None)
        if names is None or not all(hasattr(compiled, a) for a in ("run", "function", "packed_metadata")):
            return  # not the internals this class knows: stay on the JIT path
        missing = [n for n in names[nargs:] if n not in self.constants]
        if missing:
            return
        self._tail = tuple(self.constants[n] for n in names[nargs:])
        self._function, self._packed, self._run = compiled.function, compiled.packed_metadata, compiled.run
        raw = getattr(self._run, "launch", None)
        described = [i for i, a in enumerate(args) if i in self.descriptors and a is not None]
        encoded = None
        if described and callable(raw):
            raw, encoded = self._unwrapped(raw, described)
        if (_installed_supported(RAW_SUPPORTED) and callable(raw) and not isinstance(raw, types.FunctionType)
                and getattr(self._run, "global_scratch_size", None) == 0
                and getattr(self._run, "profile_scratch_size", None) == 0
                and hasattr(self._run, "launch_cooperative_grid") and hasattr(self._run, "launch_pdl")):
            # A C function (Python ones wrap tensor descriptors) and nothing to allocate per launch.
            # The leading tensor arguments (described ones included), passed as addresses or encoded
            # descriptors (a plan fixes which arguments are tensors).
            tensors = next((i for i, a in enumerate(args) if not isinstance(a, torch.Tensor)), nargs)
            if encoded is not None:
                if described[-1] >= tensors:  # a described tensor after a scalar: not this path
                    return
                encoded += [None] * (tensors - len(encoded))
            self._head = (self._function, self._run.launch_cooperative_grid, self._run.launch_pdl, None, None,
                          self._packed, None, None, None)
            self._rest = tuple(_data_ptr(a) if isinstance(a, torch.Tensor) else a for a in self.fixed) + self._tail
            self._tensors, self._encoded = tensors, encoded
            # Last: a launch in another thread takes the C launcher as soon as it sees `_raw`, reading the above
            # (two threads' first launches may both bind: each publishes a whole binding).
            self._raw = raw

    def _unwrapped(self, wrapper: Any, described: list[int]) -> tuple[Any, list | None]:
        """(the C launcher inside Triton 3.6's descriptor wrapper, the leading arguments' encodings: per
        argument None, or (encode, kept) for a described one), or (None, None) if it is not that wrapper."""
        if not (_installed_supported(RAW_SUPPORTED) and isinstance(wrapper, types.FunctionType)):
            return None, None
        names = inspect.getclosurevars(wrapper)
        launcher, metas = names.nonlocals.get("launcher"), names.nonlocals.get("tensordesc_meta")
        make = names.globals.get("make_tensordesc_arg")
        # Without its metadata a descriptor is passed as its tensor and sizes: not encoded once.
        if (launcher is None or make is None or not isinstance(metas, list) or len(metas) != len(described)
                or not all(isinstance(m, dict) for m in metas)):
            return None, None
        meta = dict(zip(described, metas))
        return launcher, [(functools.partial(_encode, make, self.descriptors[i], meta[i]), {}) if i in meta else None
                          for i in range(described[-1] + 1)]

    @property
    def direct(self) -> bool:
        """Whether calls now bypass the JIT."""
        return self._run is not None

    @property
    def raw(self) -> bool:
        """Whether calls now go straight to Triton's C launcher (`RAW_SUPPORTED`)."""
        return self._raw is not None


_INTEGERS = ("i1", "i8", "i16", "i32", "i64", "u1", "u8", "u16", "u32", "u64")


def _slot(ty: Any, value: Any) -> str | int | None | bool:
    """A kernel argument of Triton signature type `ty` as a `NativeLaunch` parameter: a tensor's name or
    None for a pointer the call gives, else the slot bits of its value; False where no 8-byte slot holds it."""
    if not isinstance(ty, str):
        return False
    if ty.startswith("*"):
        return value if value is None or isinstance(value, (str, int)) else False
    if isinstance(value, str) or value is None:
        return False
    if ty in _INTEGERS:
        return int(value)
    if ty in ("fp32", "f32"):
        return struct.unpack("<I", struct.pack("<f", value))[0]
    if ty == "fp64":
        return struct.unpack("<Q", struct.pack("<d", value))[0]
    return False


def _encode(make: Any, describe: Any, meta: Any, tensor: torch.Tensor) -> tuple:
    """The C launcher's arguments for `tensor`'s descriptor: Triton's `make_tensordesc_arg` of it."""
    return tuple(make(describe(tensor), meta))
