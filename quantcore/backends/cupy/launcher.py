"""Launching a loaded CuPy kernel straight through the driver, its constant arguments packed once.

`Function.__call__` converts every argument on each call (a numpy scalar per integer, a pointer
object per address), looks the stream up and enters a `cupy.cuda.Device` context: ~6 µs of host
time per launch on the H100, as much as a decode GEMM's GPU time. A `Launcher` is made once per
kept plan (`dispatch.py`), where grid, block, shared memory and every argument but the tensors'
addresses are fixed. It holds the kernel's parameter array (`cuLaunchKernel`'s `kernelParams`: one
pointer per parameter) pointing at two buffers: the constants, encoded when it is made, and one slot
per per-call address, which a call fills with one `pack_into` before `cuLaunchKernel`
(`cupy_backends.cuda.api.driver.launchKernel`).

Per call the launcher reads torch's current stream of its device (it can change between calls:
`torch.cuda.stream(...)`, graph capture) and checks that the current CUDA context is the one the
kernel was loaded in (the device's primary context, which torch uses); on another device or a
thread that has none yet, it enters `cupy.cuda.Device(index)` for the launch. The parameter buffers
are shared by the calls of one plan, so a lock spans filling them and the launch (the driver copies
the parameters when the launch is enqueued, in a graph capture too).

Each parameter gets an 8-byte slot holding its little-endian value: `i32`, `i64` and `f32` encode
constants; the driver reads as many bytes as the kernel's parameter has.
"""

from __future__ import annotations

import functools
import struct
import threading
from array import array
from typing import Any

import torch

from ...runtime.launch import NativeLaunch

POINTER = None  # a parameter taking one of the call's addresses, in order
_SLOT = 8  # bytes per parameter slot
_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")


def i32(v: int) -> int:
    """A C `int` parameter's slot value."""
    if not -2**31 <= v < 2**31:
        raise OverflowError(f"{v} does not fit a 32-bit kernel argument")
    return v & 0xFFFFFFFF


def i64(v: int) -> int:
    """A C `long long` parameter's slot value (an address too)."""
    if not -2**63 <= v < 2**64:
        raise OverflowError(f"{v} does not fit a 64-bit kernel argument")
    return v & 0xFFFFFFFFFFFFFFFF


def f32(v: float) -> int:
    """A C `float` parameter's slot value: its IEEE single bits (rounded to nearest from `v`)."""
    return _U32.unpack(_F32.pack(v))[0]


def _driver():
    from cupy_backends.cuda.api import driver

    return driver


@functools.lru_cache(maxsize=None)
def _primary_context(index: int) -> int:
    """The CUDA context current while device `index` is CuPy's current device (its primary context,
    where `compiler.get_function` loaded the kernels)."""
    import cupy

    with cupy.cuda.Device(index):
        return _driver().ctxGetCurrent()


def _stream_reader():
    """A function of a device index giving torch's current stream there, as a CUstream handle."""
    return torch._C._cuda_getCurrentRawStream


class Launcher:
    """`function` launched with `grid` x `block` threads and `smem` dynamic shared bytes on device
    `index`, with parameters `args`: slot values (`i32`, `i64`, `f32`) and `POINTER` entries, which
    each call fills from its arguments, in order."""

    __slots__ = ("function", "index", "_launch", "_current_context", "_current_stream", "_head", "_tail", "_context",
                 "_slots", "_pack", "_params", "_constants", "_lock", "_args")

    def __init__(self, function: Any, grid: tuple[int, ...], block: tuple[int, ...], args: tuple,
                 index: int, smem: int = 0):
        driver = _driver()
        self.function, self.index = function, index  # the Function keeps its module loaded
        self._launch, self._current_context = driver.launchKernel, driver.ctxGetCurrent
        self._current_stream = _stream_reader()
        # launchKernel(f, grid x, y, z, block x, y, z, shared bytes, stream, kernelParams, extra)
        self._head = (function.ptr, *(tuple(grid) + (1, 1))[:3], *(tuple(block) + (1, 1))[:3], smem)
        self._args = tuple(args)
        self._context = _primary_context(index)
        count = sum(a is POINTER for a in args)
        self._slots = array("Q", [0] * max(1, count))
        self._constants = array("Q", [a for a in args if a is not POINTER] or [0])
        self._pack = struct.Struct(f"<{count}Q").pack_into
        slot, constant = self._slots.buffer_info()[0], self._constants.buffer_info()[0]
        params = []
        for a in args:
            if a is POINTER:
                params.append(slot)
                slot += _SLOT
            else:
                params.append(constant)
                constant += _SLOT
        self._params = array("Q", params or [0])  # the arrays never resize: their addresses hold
        self._tail = (self._params.buffer_info()[0], 0)
        self._lock = threading.Lock()

    def native(self, names: tuple[str | None, ...]) -> list[NativeLaunch]:
        """This launch for the native path (`runtime.launch.NativeLaunch`), the `POINTER` parameters taking
        the run's tensors named by `names` (None: a null address), in order."""
        given = iter(names)
        params = tuple(next(given) if a is POINTER else a for a in self._args)
        function, gx, gy, gz, bx, by, bz, smem = self._head
        return [NativeLaunch(function, (gx, gy, gz), (bx, by, bz), smem, params)]

    def __call__(self, *addresses: int) -> None:
        with self._lock:
            self._pack(self._slots, 0, *addresses)
            stream = self._current_stream(self.index)
            if self._current_context() == self._context:
                self._launch(*self._head, stream, *self._tail)
                return
            import cupy

            with cupy.cuda.Device(self.index):
                self._launch(*self._head, stream, *self._tail)
