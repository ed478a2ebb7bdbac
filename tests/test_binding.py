"""The registry's choice is binding, for every op × simulated profile × format × `backend=` choice:
what `explain()` and `select()` name is the Impl the dispatcher launches, with its fixed options
(the GEMM variants' `mma`). On this CPU machine a GPU profile is simulated by giving CPU tensors
that profile, and every launch is replaced by the reference (CuPy cannot run here); the Triton
kernels' own use of the option is checked under the interpreter (tests/backends/test_triton_kernels.py)
and everything on a GPU by tests/gpu/test_binding_gpu.py."""

from __future__ import annotations

import pytest

from binding import LaunchSpy, check_binding, choices, simulate_on_cpu
from quantcore import capability, definitions, registry
from quantcore.definitions import BUILTIN
from quantcore.definitions.query import GemmQuery

PROFILES = ["cpu", *capability.SIMULATED]
# What each MMA kind needs: fp16 tensor cores are on every GPU quantcore targets (sm_70+).
MMA_ON = {"int8": lambda p: p.int8_mma, "fp8": lambda p: p.fp8_mma, "fp16": lambda p: p.compute_capability >= (7, 0)}

pytestmark = pytest.mark.filterwarnings("ignore::quantcore.NumericsWarning")


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("op", [op.name for op in BUILTIN])
def test_what_selection_names_is_what_the_dispatcher_launches(monkeypatch, op, profile):
    simulate_on_cpu(monkeypatch, profile)
    spy = LaunchSpy(monkeypatch, stub=lambda impl: spy.reference_stub(impl))
    launched = set()
    for fmt in definitions.get(op).formats:
        args, kwargs = definitions.get(op).example(fmt)
        for backend in choices(op):
            chosen, _ = check_binding(spy, op, args, kwargs, backend)
            launched.add(chosen and chosen.label)
    assert "torch" in launched  # the reference at least ran: the loop did launch


def test_the_gemm_variants_differ_by_their_mma_option_only_where_the_profile_has_that_mma():
    """Every Impl carrying an `mma` option is eligible only on profiles with that kind of tensor
    core, so that the option the launch receives is one the device can run."""
    with_mma = [i for op in ("scaled_mm", "quant_linear") for i in registry.impls(op) if "mma" in dict(i.options)]
    assert {dict(i.options)["mma"] for i in with_mma} >= {"int8", "fp8", "fp16"}
    for impl in with_mma:
        mma = dict(impl.options)["mma"]
        for name in capability.SIMULATED:
            p = capability.simulated_profile(name)
            for fmt in impl.constraints.formats:
                q = GemmQuery(impl.op, p, fmt, blocks=(128, 128), nk=(256, 512), block_k=128)
                if not impl.constraints.reasons(q):
                    assert MMA_ON[mma](p), (impl.label, mma, name)
                    assert (mma == "int8") == (fmt == "int8"), (impl.label, mma, fmt)
