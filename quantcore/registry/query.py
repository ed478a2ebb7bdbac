"""What selection looks at: a `Query`, built by each op's spec from a call's metadata.

The fields here are those every op has. An op whose implementations also differ by features of its
own extends the query and the constraints beside its spec (the GEMM: `specs.gemm_query`), as
xformers' op classes extend `not_supported_reasons`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..capability import DeviceProfile


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
