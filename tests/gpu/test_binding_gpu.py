"""The registry's choice is binding on the GPU, kernels and all: for every op × simulated profile ×
format × `backend=` choice, what `explain()` and `select()` name is the Impl the dispatcher launches
with its fixed options (binding.check_binding), the Triton GEMM compiles the `mma` its Impl names,
and the real kernels' results agree with the reference. Profiles newer than the device are skipped:
CuPy compiles for the simulated architecture, which an older GPU cannot load.

Run on a GPU machine: `python3 -m pytest -m gpu tests/gpu`.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

import quantcore
from binding import LaunchSpy, check_binding, choices, kernel_mma, spy_triton_gemms
from quantcore import capability, definitions
from quantcore.definitions import BUILTIN
from quantcore.definitions.tolerances import rel_error

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::quantcore.NumericsWarning")]

GEMMS = ("scaled_mm", "quant_linear")


def agrees(out, expected) -> bool:
    """Each output tensor has the reference's shape and dtype and is within 1e-2 of it (relative
    Frobenius): bf16 GEMM outputs, codes and scales (bit-equal, or a code apart in a few places)."""
    outs, wanted = (out, expected) if isinstance(out, tuple) else ((out,), (expected,))
    return all(o.shape == e.shape and o.dtype == e.dtype and rel_error(o.float(), e.float()) <= 1e-2
               for o, e in zip(outs, wanted, strict=True))


@pytest.mark.parametrize("m", [1, 300])
@pytest.mark.parametrize("profile", [None, *capability.SIMULATED])  # None: the device itself
@pytest.mark.parametrize("op", [op.name for op in BUILTIN])
def test_what_selection_names_is_what_runs(monkeypatch, op, profile, m):
    if m == 1 and op not in GEMMS:
        pytest.skip("one row count suffices outside the GEMMs (whose decode and tiled kernels differ)")
    if profile and capability.SIMULATED[profile].compute_capability > torch.cuda.get_device_capability():
        pytest.skip(f"{profile} is newer than this GPU")
    spy = LaunchSpy(monkeypatch)
    kernels = spy_triton_gemms(monkeypatch) if capability.module_available("triton") else []
    launched = set()
    with quantcore.simulate(profile) if profile else contextlib.nullcontext():
        for fmt in definitions.get(op).formats:
            args, kwargs = definitions.get(op).example(fmt, "cuda", m=m, n=256, k=1024)
            expected = getattr(quantcore.ops, op)(*args, backend="torch", **kwargs)
            for backend in choices(op):
                kernels.clear()
                chosen, out = check_binding(spy, op, args, kwargs, backend)
                if chosen is None:
                    continue
                launched.add(chosen.label)
                if chosen.backend == "triton" and op in GEMMS and "mma" in dict(chosen.options):  # not Gluon's
                    assert [kernel_mma(c) for c in kernels] == [dict(chosen.options)["mma"]], (backend, fmt)
                assert agrees(out, expected), (chosen.label, fmt)
    assert launched - {"torch"} or profile == "sm70", launched  # a GPU backend ran wherever one can
