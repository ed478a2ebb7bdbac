"""`Impl`: one implementation of one op, described by data, launched lazily; `Constraints`: where it runs.

The constraints are plain fields so that one function (`Constraints.reasons`) turns them into the
reason strings used by the dispatcher, the errors, the report and the tests' skips. They read a
`definitions.query.Query`; the GEMM's `GemmConstraints` read a `GemmQuery` too. Each backend package
declares its `IMPLS` with these classes; the registry imports a backend package by name
(`BACKEND_PACKAGES`) on first use, never at import time, and its kernels only when one is launched.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from ..capability import module_available
from ..definitions.query import GemmQuery, Query

if TYPE_CHECKING:
    from ..capability import DeviceProfile

# The built-in backend packages under `quantcore.backends`, in the order the table lists their IMPLS.
BACKEND_PACKAGES = ("triton", "cupy", "torch")


# Measured on the H100: Hopper's FP8 wgmma keeps the running sum of a K block at reduced precision,
# so the fp32-output error is ~1.2e-4 instead of the contract's 1e-5 for Triton's tl.dot and for
# cuBLAS's block-wise kernel alike (mma.sync, as in the CuPy backend, stays at ~1e-8). Implementations
# on that path declare it; the registry warns once and the tests judge them by their own tolerance.
REDUCED_FP8_ACCUMULATION = "FP8 tensor-core accumulation within each K block at reduced precision (~1e-4 relative)"
# Departures that the GPU's tensor cores cause: on the CPU (Triton's interpreter, whose tl.dot is an fp32
# numpy product) the same kernel computes the contract exactly.
TENSOR_CORE_NUMERICS = (REDUCED_FP8_ACCUMULATION,)


@dataclass(frozen=True)
class Constraints:
    """Where an implementation can run. Every field is checked by `reasons`."""

    devices: tuple[str, ...] = ("cuda",)
    min_cc: tuple[int, int] | None = None
    max_cc: tuple[int, int] | None = None  # exclusive: for paths that newer GPUs do better natively
    formats: tuple[str, ...] = ("fp8_e4m3", "int8")
    requires: tuple[str, ...] = ()  # importable Python modules
    fp8_mma: bool = False  # needs e4m3 tensor cores when the format is FP8
    int8_mma: bool = False  # needs s8 tensor cores when the format is INT8
    bf16_mma: bool = False
    interpreter: bool = False  # also runs on the CPU under TRITON_INTERPRET=1
    block_sizes: tuple[int, ...] | None = None  # the only block/group sizes supported

    def reasons(self, q: Query) -> list[str]:
        """Why this implementation cannot run `q` (empty when it can)."""
        p = q.profile
        out: list[str] = []
        missing = [m for m in self.requires if not module_available(m)]
        if missing:
            out.append(f"{', '.join(missing)} not installed")
        on_interpreter = self.interpreter and p.kind == "cpu" and p.triton_interpreter
        if p.kind not in self.devices and not on_interpreter:
            hint = " (or the CPU with TRITON_INTERPRET=1)" if self.interpreter else ""
            out.append(f"runs on {'/'.join(self.devices)}{hint}, not {p.kind}")
        elif p.kind == "cuda":
            cc = p.compute_capability or (0, 0)
            if self.min_cc and cc < self.min_cc:
                out.append(f"needs compute capability >= {_cc(self.min_cc)}, device is {_cc(cc)}")
            if self.max_cc and cc >= self.max_cc:
                out.append(f"only for compute capability < {_cc(self.max_cc)} (native path preferred), "
                           f"device is {_cc(cc)}")
            if self.fp8_mma and "fp8_e4m3" in (q.fmt, q.out_fmt) and not p.fp8_mma:
                out.append(f"needs FP8 tensor cores (sm_89+), {p.arch} has none")
            if self.int8_mma and q.fmt == "int8" and not p.int8_mma:
                out.append(f"needs INT8 tensor cores (sm_75+), {p.arch} has none")
            if self.bf16_mma and not p.bf16_mma:
                out.append(f"needs bf16 tensor cores (sm_80+), {p.arch} has none")
        for fmt in (q.fmt, q.out_fmt):
            if fmt is not None and fmt not in self.formats:
                out.append(f"format {fmt} not implemented (has {', '.join(self.formats)})")
        if self.block_sizes is not None and any(b not in self.block_sizes for b in q.blocks):
            out.append(f"block/group sizes must be {self.block_sizes}, got {q.blocks}")
        return out


@dataclass(frozen=True)
class GemmConstraints(Constraints):
    """Where a GEMM implementation can run: the shared constraints, and the tiles it takes."""

    nk_multiple: tuple[int, int] | None = None  # (N, K) must be multiples of these (vendor kernels' alignment)
    block_k_multiple: int | None = None  # the K block must be a multiple of this (the K tile)
    block_k_pow2: bool = False  # ... and a power of two (a K tile spans whole K blocks)
    block_k_max: int | None = None  # ... and at most this (the K tile, or an int32 kernel argument)
    out_group_max: int | None = None  # re-quantization groups: powers of two up to this (one output tile)

    def reasons(self, q: Query) -> list[str]:
        """The shared reasons, then the GEMM's own for a `GemmQuery` (a plain query, such as the
        report's per format, has no shape to judge)."""
        out = super().reasons(q)
        if not isinstance(q, GemmQuery):
            return out
        if self.nk_multiple and q.nk and any(d % m for d, m in zip(q.nk, self.nk_multiple)):
            n, k = self.nk_multiple
            out.append(f"N must be a multiple of {n} and K of {k}, got (N, K) = {q.nk}")
        bk = q.block_k
        if bk and self.block_k_multiple and (bk % self.block_k_multiple or (self.block_k_pow2 and bk & (bk - 1))):
            kind = "a power of two >= " if self.block_k_pow2 else "a multiple of "
            out.append(f"the K block must be {kind}{self.block_k_multiple}, got {bk}")
        if bk and self.block_k_max and bk > self.block_k_max:
            out.append(f"the K block must be at most {self.block_k_max}, got {bk}")
        g = q.out_group
        if self.out_group_max and g and (g > self.out_group_max or g & (g - 1)):
            out.append(f"re-quantization groups must be powers of two <= {self.out_group_max}, got {g}")
        return out


_resets: list[Callable[[], None]] = []


def on_reset(clear: Callable[[], None]) -> Callable[[], None]:
    """Have `registry.reset()` call `clear`: a backend's own caches (tuned or derived launch choices)
    register this way when their module is imported, so the registry never imports a backend for it."""
    _resets.append(clear)
    return clear


def reset_backends() -> None:
    """Clear every cache registered with `on_reset`."""
    for clear in _resets:
        clear()


@functools.lru_cache(maxsize=None)
def _resolve(launch: str) -> Callable[..., Any]:
    module, _, name = launch.partition(":")
    builtin = module.partition(".")[0] in BACKEND_PACKAGES
    return getattr(importlib.import_module(f"quantcore.backends.{module}" if builtin else module), name)


def _cc(cc: tuple[int, int]) -> str:
    return f"{cc[0]}.{cc[1]}"


@dataclass(frozen=True)
class Impl:
    """One (op, backend) implementation.

    `launch` names the function as "module:function", resolved on first use so that describing an
    implementation never imports Triton or CuPy: the module relative to `quantcore.backends` for the
    built-in backends ("triton.launch"), an absolute one for out-of-tree backends; or it is the
    function itself. `options` are fixed keyword arguments the dispatcher adds to the launch's: they
    carry the variant the registry chose (the GEMMs' `mma`), so that no launch re-derives it from the
    device profile. `numerics` is
    "exact" or a short description of how it departs from the contract's arithmetic (an emulated
    path); the registry makes any departure visible. `opt_in`: a variant that trades the contract's
    exactness for speed by choice (`torch[bf16_dequant]`), not by necessity; it runs only where its
    label is named (`backend=`, a priority list, `QUANTCORE_PRIORITY`), never by automatic selection,
    by its backend's name alone or through a measured table. `compared_alone`: a variant its backend's
    name never reaches (registered after one that takes every call it takes, `triton[gluon]`), so it
    is compared with the reference, timed by the bench and ranked by measured tables under its own label.
    `separate_epilogue`: a GEMM that runs a fused epilogue (bias, activation, re-quantization) as passes
    of its own after the plain product (`torch[cublas]`), so that a measured ranking of plain GEMMs does
    not speak for it where there is an epilogue.
    """

    op: str
    backend: str
    launch: str | Callable[..., Any]
    constraints: Constraints = field(default_factory=Constraints)
    variant: str = ""
    numerics: str = "exact"
    fallback: str = ""  # set on paths that stand in for a faster native one: what they do instead
    options: tuple[tuple[str, Any], ...] = ()  # fixed keyword arguments this variant passes to launch
    opt_in: bool = False  # runs only where its label is named
    compared_alone: bool = False  # in `registry.compared` under its own label
    separate_epilogue: bool = False  # a fused epilogue runs as extra passes

    @property
    def label(self) -> str:
        """"triton" or "triton[w8a16]": unique per op."""
        return f"{self.backend}[{self.variant}]" if self.variant else self.backend

    def not_supported_reasons(self, query: Query) -> list[str]:
        """Reasons this implementation cannot run `query`; empty when it can."""
        return self.constraints.reasons(query)

    def named_by(self, name: str) -> bool:
        """Whether `name` (a `backend=` or priority entry) names this implementation: its label, or
        its backend's name unless it is opt-in."""
        return name == self.label or (name == self.backend and not self.opt_in)

    def numerics_on(self, profile: DeviceProfile) -> str:
        """`numerics` where it runs on `profile`: "exact" on the CPU for a departure that only GPU
        tensor cores cause (`TENSOR_CORE_NUMERICS`)."""
        return "exact" if profile.kind == "cpu" and self.numerics in TENSOR_CORE_NUMERICS else self.numerics

    def function(self) -> Callable[..., Any]:
        """The launch function (imports the backend's kernels on first call)."""
        return self.launch if callable(self.launch) else _resolve(self.launch)

    def __call__(self, **kwargs: Any) -> Any:
        return self.function()(**kwargs, **dict(self.options))
