"""The GEMM's own selection features: what its spec tells the registry beyond the shared `Query`
(`GemmQuery`: N and K, the K block, the re-quantization group, whether an epilogue is fused) and what
its implementations declare about them (`GemmConstraints`, reasons added to the shared ones), as
xformers' op classes extend `not_supported_reasons`. scaled_mm and quant_linear build a `GemmQuery`;
every backend declares its GEMMs with `GemmConstraints`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..backends.base import Constraints
from ..registry.query import Query, k_bucket as bucket_of_k


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
        nine shapes at M = 128 and 4096 (docs/bench/round8/epilogue_select.txt). With an activation or
        a re-quantized output, since the Gluon kernel stages its activation epilogue through shared
        memory, the tiled kernel took 1.14-1.24x the Gluon kernel's time with SiLU or GELU and 1.08-2.67x
        with a re-quantized output (FP8, nine shapes, M = 128 and 16384; round9/epilogue_select.txt), and
        1.06-1.28x over six shapes at 512 and 4096 rows (FP8 and INT8; round9/gluon_staged.txt); INT8 at
        128 rows, which the table gives the tiled kernel, was faster there with SiLU or GELU (the Gluon
        kernel's time / the tiled kernel's 0.84-0.89 over seven shapes)."""
        return self.fused

    @property
    def k_bucket(self) -> int | None:
        """K rounded up to a power of two: the GEMMs' ranking changes with K as well as M (`measured.build_by_k`)."""
        return bucket_of_k(self.nk[1]) if self.nk else None

    @property
    def measured_as(self) -> str:
        """scaled_mm for both GEMM ops: the bench times scaled_mm, and quant_linear is act_quant and the
        same GEMM (at decode sizes one launch of the same kernel), whose time dominates, so quant_linear
        follows scaled_mm's ranking (skipping what has no quant_linear, as cuBLAS)."""
        return "scaled_mm"


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
