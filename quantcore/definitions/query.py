"""What selection looks at: a `Query`, built by each op's spec from a call's metadata.

The fields of `Query` are those every op has. An op whose implementations also differ by features of
its own extends it here (the GEMM's `GemmQuery`), and the registry extends the constraints that read
it (`registry.impl.GemmConstraints`), as xformers' op classes extend `not_supported_reasons`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..capability import DeviceProfile

# A call's `backend=`: None or "auto" (automatic), a backend or variant name, or a priority order.
BackendChoice = str | Sequence[str] | None


@dataclass(frozen=True)
class Query:
    """The op, the effective device profile and the static features of a call.

    `fmt` is the quantized format read or written ("fp8_e4m3"/"int8"; a GEMM output's dtype name for
    dequant_bias); `out_fmt` a quantized output format where the op re-quantizes; `blocks` every
    block/group size of the call as the caller gave it (the scale layout; kernels receive blocks
    larger than a quantize op's dimension clamped to it); `m_bucket` the rows rounded up to a power
    of two (measured priorities differ by M).
    """

    op: str
    profile: DeviceProfile
    fmt: str
    out_fmt: str | None = None
    blocks: tuple[int, ...] = ()
    m_bucket: int = 0

    @property
    def measured_as(self) -> str:
        """The op whose measured priorities rank this call's implementations: its own."""
        return self.op

    @property
    def k_bucket(self) -> int | None:
        """The bucket of the call's K where its measured ranking depends on K too (a GEMM's), else None."""
        return None

    @property
    def fuses_epilogue(self) -> bool:
        """Whether the call has an epilogue that a measured ranking applies to only among implementations
        computing it in their kernel (`Impl.separate_epilogue` is the opposite)."""
        return False


def m_bucket(m: int) -> int:
    """Rows rounded up to a power of two, capped at 16384: the granularity of measured priorities."""
    return min(k_bucket(m), 16384)


def k_bucket(k: int) -> int:
    """A GEMM's K rounded up to a power of two (uncapped): the granularity of its per-K measured priorities."""
    return 1 << max(k - 1, 0).bit_length()


@dataclass(frozen=True)
class GemmQuery(Query):
    """A GEMM call: `nk` its (N, K), `block_k` its K block (= the activation group), `out_group` the
    re-quantization group of a GEMM with out_quant (0 without), `fused` whether it has an epilogue
    (bias, activation, re-quantization)."""

    nk: tuple[int, int] | None = None
    block_k: int = 0
    out_group: int = 0
    fused: bool = False

    @property
    def fuses_epilogue(self) -> bool:
        """A GEMM with an epilogue ranks as the plain one (the bench times plain GEMMs) among the
        implementations that compute the epilogue in their kernel. Measured on the H100, FP8 and INT8:
        with a bias, the ranking's first such implementation was the fastest in geometric mean over
        nine shapes at M = 128 and 4096. With an activation or
        a re-quantized output, since the Gluon kernel stages its activation epilogue through shared
        memory, the tiled kernel took 1.14-1.24x the Gluon kernel's time with SiLU or GELU and 1.08-2.67x
        with a re-quantized output (FP8, nine shapes, M = 128 and 16384), and
        1.06-1.28x over six shapes at 512 and 4096 rows (FP8 and INT8); INT8 at
        128 rows, which the table gives the tiled kernel, was faster there with SiLU or GELU (the Gluon
        kernel's time / the tiled kernel's 0.84-0.89 over seven shapes)."""
        return self.fused

    @property
    def k_bucket(self) -> int | None:
        """K rounded up to a power of two: the GEMMs' ranking changes with K as well as M (`measured.build_by_k`)."""
        return k_bucket(self.nk[1]) if self.nk else None

    @property
    def measured_as(self) -> str:
        """scaled_mm for both GEMM ops: the bench times scaled_mm, and quant_linear is act_quant and the
        same GEMM (at decode sizes one launch of the same kernel), whose time dominates, so quant_linear
        follows scaled_mm's ranking (skipping what has no quant_linear, as cuBLAS)."""
        return "scaled_mm"


@dataclass(frozen=True)
class GroupedGemmQuery(GemmQuery):
    """A grouped (mixture-of-experts) GEMM call: a `GemmQuery` whose (N, K) are one expert's, with
    `experts` the stacked weight's E. The tile constraints are the dense GEMM's (the grouped kernels run
    its tile program), but its ranking is its own: scaled_mm's measured table names cuBLAS, which has no
    grouped form, and ranks the dense Gluon GEMM, not its grouped one."""

    experts: int = 0

    @property
    def measured_as(self) -> str:
        return self.op
