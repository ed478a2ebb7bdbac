"""Where the Gluon GEMM (`kernels/gluon_gemm.py`, launched by `gluon_launch.py`) can run, as reasons.

It is written against the Gluon of Triton 3.6 (`triton.experimental.gluon`: `warp_specialize`,
Hopper's `warpgroup_mma`, TMA and mbarriers) and uses wgmma, which only sm_90 has. Whether the
installed Triton is recent enough is read from its metadata and its files, never by importing it, so
that `explain()` and the report stay free of Triton imports, as for every other backend.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from ... import capability
from ...registry.impl import GemmConstraints

MIN_TRITON = (3, 6)
# The kernel's default tile N (`gluon_launch.GluonConfig`): a re-quantization group lies within one tile.
TILE_N = 128
# Gluon's Hopper language: wgmma, TMA and mbarriers (Triton 3.6 and later).
_HOPPER_GLUON = Path("experimental", "gluon", "language", "nvidia", "hopper", "__init__.py")


@functools.lru_cache(maxsize=None)
def gluon_missing(version: str | None) -> str | None:
    """Why Triton `version` (None: not installed) cannot build the Gluon GEMM, or None when it can."""
    if version is None:
        return None  # `requires` says that Triton is missing
    match = re.match(r"(\d+)\.(\d+)", version)
    if not match or (int(match[1]), int(match[2])) < MIN_TRITON:
        return (f"needs Triton >= {MIN_TRITON[0]}.{MIN_TRITON[1]} (Gluon's warp_specialize, warpgroup_mma and TMA "
                f"as the kernel uses them), installed {version}")
    spec = importlib.util.find_spec("triton")
    roots = [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    if not any((root / _HOPPER_GLUON).is_file() for root in roots):
        return f"the installed Triton {version} has no Gluon Hopper language (triton.experimental.gluon)"
    return None


@dataclass(frozen=True)
class GluonConstraints(GemmConstraints):
    """The GEMM constraints, with what the Gluon kernel adds: sm_90 exactly and a Triton with Gluon's
    Hopper API."""

    def reasons(self, q) -> list[str]:
        """The GEMM's reasons, then the Gluon kernel's own (those of the device and Triton on CUDA devices)."""
        out = super().reasons(q)
        p = q.profile
        if p.kind == "cuda":
            cc = p.compute_capability or (0, 0)
            if cc >= (10, 0):
                out.append(f"wgmma and its warpgroup register budget are sm_90's; device is {p.arch}")
            missing = gluon_missing(capability.versions()["triton"])
            if missing:
                out.append(missing)
        return out
