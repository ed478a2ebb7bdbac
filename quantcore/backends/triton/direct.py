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

On the Triton versions in `RAW_SUPPORTED` a kernel that needs no scratch memory and takes no tensor
descriptors is launched one step further down: `compiled.run` is then a Python wrapper that only
finds there is no scratch to allocate and forwards to the C launcher it holds, adding two flags and
two null scratch pointers; calling that C function with them skips the wrapper (on the H100 host,
5.9 µs against 7.2 µs a launch; launching with `cuLaunchKernel` through ctypes on parameters packed
once took 7.4: docs/bench/round5/r5_eager.txt). It is also handed the tensors' addresses as integers:
for a tensor it looks up and calls `data_ptr` and asks the driver what the pointer is
(`cuPointerGetAttribute`), a check that validation has made already; with seven tensors that was
9.0 µs a launch against 6.3 with addresses read in Python (docs/bench/round6/dev1.txt).
"""

from __future__ import annotations

import functools
import os
import re
import types
from typing import Any

import torch

from ... import capability

DIRECT_ENV = "QUANTCORE_TRITON_DIRECT"
# `CompiledKernel.run(grid0, grid1, grid2, stream, function, packed_metadata, launch_metadata,
# enter_hook, exit_hook, *every kernel argument in signature order)`: Triton 3.3 through 3.9.
SUPPORTED = ((3, 3), (3, 9))
# `CompiledKernel.run.launch(grid0, grid1, grid2, stream, function, cooperative, pdl, global_scratch,
# profile_scratch, packed_metadata, launch_metadata, enter_hook, exit_hook, *kernel arguments)`, the C
# launcher itself where the kernel has no tensor descriptors: Triton 3.6 (3.9 passes its arguments
# differently).
RAW_SUPPORTED = ((3, 6), (3, 6))


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
    launches pass tensors as they are; JIT launches see bf16/FP8 tensors as their integer bits."""

    __slots__ = ("fn", "grid", "constants", "device", "_run", "_function", "_packed", "_tail", "_raw", "_head",
                 "_tensors")

    def __init__(self, fn, grid: tuple[int, ...], constants: dict[str, Any], device: torch.device):
        self.fn, self.constants = fn, constants
        self.grid = (tuple(grid) + (1, 1))[:3]
        self.device = device.index if device.index is not None else 0
        self._run = self._raw = None

    def __call__(self, *args: Any) -> None:
        if self._raw is not None:
            n = self._tensors
            self._raw(*self.grid, torch._C._cuda_getCurrentRawStream(self.device), *self._head,
                      *map(torch.Tensor.data_ptr, args[:n]), *args[n:], *self._tail)
            return
        if self._run is not None:
            self._run(*self.grid, torch._C._cuda_getCurrentRawStream(self.device), self._function, self._packed,
                      None, None, None, *args, *self._tail)
            return
        compiled = self.fn[self.grid](*map(_kernel_view, args), **self.constants)
        if enabled():
            self._bind(compiled, args)

    def _bind(self, compiled: Any, args: tuple) -> None:
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
        if (_installed_supported(RAW_SUPPORTED) and callable(raw) and not isinstance(raw, types.FunctionType)
                and getattr(self._run, "global_scratch_size", None) == 0
                and getattr(self._run, "profile_scratch_size", None) == 0
                and hasattr(self._run, "launch_cooperative_grid") and hasattr(self._run, "launch_pdl")):
            # A C function (a Python one wraps tensor descriptors) and nothing to allocate per launch.
            self._raw = raw
            self._head = (self._function, self._run.launch_cooperative_grid, self._run.launch_pdl, None, None,
                          self._packed, None, None, None)
            # The leading tensor arguments, passed as addresses (a plan fixes which arguments are tensors).
            self._tensors = next((i for i, a in enumerate(args) if not isinstance(a, torch.Tensor)), nargs)

    @property
    def direct(self) -> bool:
        """Whether calls now bypass the JIT."""
        return self._run is not None

    @property
    def raw(self) -> bool:
        """Whether calls now go straight to Triton's C launcher (`RAW_SUPPORTED`)."""
        return self._raw is not None
