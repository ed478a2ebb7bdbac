"""Registry selection: constraints as data, priorities, explicit backends, simulated profiles."""

from __future__ import annotations

import threading
import warnings

import pytest
import torch

import quantcore
from quantcore import UnsupportedError, capability, ops, registry
from quantcore.registry.impl import Constraints, Impl
from quantcore.registry import Query
from quantcore.definitions.query import GemmQuery

PROFILES = ["cpu", "sm70", "sm75", "sm80", "sm86", "sm89", "sm90", "sm100"]


def query(op, profile, fmt="fp8_e4m3", blocks=(128, 128), out_fmt=None):
    return Query(op, capability.simulated_profile(profile), fmt, out_fmt, blocks)


# Automatic choice of the built-in backends per simulated profile (Triton and CuPy installed).
EXPECTED = {
    ("scaled_mm", "fp8_e4m3"): {"cpu": "torch", "sm70": "torch", "sm75": "cupy[w8a16]", "sm80": "triton[w8a16]",
                                "sm86": "triton[w8a16]", "sm89": "triton", "sm90": "triton", "sm100": "triton"},
    ("scaled_mm", "int8"): {"cpu": "torch", "sm70": "torch", "sm75": "cupy", "sm80": "triton", "sm86": "triton",
                            "sm89": "triton", "sm90": "triton", "sm100": "triton"},
    ("act_quant", "fp8_e4m3"): {"cpu": "torch", "sm70": "torch", "sm75": "cupy", "sm80": "triton", "sm86": "triton",
                                "sm89": "triton", "sm90": "triton", "sm100": "triton"},
}


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("op,fmt", list(EXPECTED))
def test_automatic_selection_per_profile(monkeypatch, profile, op, fmt):
    monkeypatch.setattr(capability, "module_available", lambda name: True)
    from quantcore.registry import impl
    monkeypatch.setattr(impl, "module_available", lambda name: True)
    impl = registry.select(query(op, profile, fmt, blocks=(128,) if op == "act_quant" else (128, 128)))
    assert impl.label == EXPECTED[(op, fmt)][profile]


def test_reference_is_reached_on_the_cpu():
    out = ops.act_quant(torch.randn(2, 128))
    assert out[0].dtype == torch.float8_e4m3fn
    assert quantcore.explain("act_quant", torch.randn(2, 128)).selected == "torch"


def fake(backend, op="act_quant", calls=None, **constraints):
    def launch(**kwargs):
        calls.append(backend)
        return torch.zeros(2, 128), torch.zeros(2, 1)
    return Impl(op, backend, launch, Constraints(**constraints))


@pytest.fixture
def fakes():
    calls = []
    made = [fake("fast", calls=calls, devices=("cpu",), formats=("int8",)),
            fake("slow", calls=calls, devices=("cpu",))]
    for impl in reversed(made):
        registry.register(impl)
    yield calls
    for impl in made:
        registry.unregister(impl)


def test_explicit_backend_that_cannot_run_lists_its_reasons(fakes):
    with pytest.raises(UnsupportedError) as err:
        ops.act_quant(torch.randn(2, 128), backend="fast")  # fp8: fast only does int8
    assert err.value.reasons == {"fast": ["format fp8_e4m3 not implemented (has int8)"]}
    assert "backend 'fast' cannot run" in str(err.value)


def test_priority_per_call_context_and_environment(fakes, monkeypatch):
    x = torch.randn(2, 128)
    ops.act_quant(x, dtype=torch.int8, backend=("fast", "slow"))
    ops.act_quant(x, dtype=torch.float8_e4m3fn, backend=("fast", "slow"))  # fast refuses fp8
    with quantcore.priority("slow", "fast"):
        ops.act_quant(x, dtype=torch.int8)
    monkeypatch.setenv("QUANTCORE_PRIORITY", "fast,slow")
    ops.act_quant(x, dtype=torch.int8)
    assert fakes == ["fast", "slow", "slow", "fast"]


def test_explicit_backend_runs_even_when_not_first(fakes):
    ops.act_quant(torch.randn(2, 128), dtype=torch.int8, backend="slow")
    assert fakes == ["slow"]


def test_default_priority_ignores_unlisted_fakes_and_explain_says_so(fakes):
    exp = quantcore.explain("act_quant", torch.randn(2, 128), dtype=torch.int8)
    assert exp.selected == "torch"
    status = {c.impl: (c.status, c.reasons) for c in exp.candidates}
    assert status["fast"] == ("available", ["not in the priority list"])
    assert status["cupy"][0] == "unavailable" and "not cpu" in status["cupy"][1][0]


def test_numerics_change_warns_once_and_is_explained(monkeypatch):
    calls = []
    emulated = Impl("act_dequant", "approx", lambda **kw: calls.append(1) or torch.zeros(2, 128),
                    Constraints(devices=("cpu",)), numerics="emulated: fp8 via int8")
    registry.register(emulated)
    try:
        q, s = ops.act_quant(torch.randn(2, 128))
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            ops.act_dequant(q, s, backend="approx")
            ops.act_dequant(q, s, backend="approx")
        assert [type(w.message) for w in seen] == [quantcore.NumericsWarning]
        assert "emulated: fp8 via int8" in str(seen[0].message)
        exp = quantcore.explain("act_dequant", q, s, backend="approx")
        assert exp.numerics == "emulated: fp8 via int8"
        assert {c.impl: c.status for c in exp.candidates}["approx"] == "selected"
        assert "[numerics: emulated: fp8 via int8]" in str(exp)
    finally:
        registry.unregister(emulated)


@pytest.mark.parametrize("profile", ["sm70"])
def test_explicit_backend_reasons_name_the_device(profile):
    with pytest.raises(UnsupportedError) as err:
        registry.select(query("scaled_mm", profile, "fp8_e4m3"), backend="cupy")
    text = str(err.value)
    assert capability.simulated_profile(profile).arch in text or "not installed" in text


def test_fallback_variant_reported_on_sm80():
    exp = registry.explain_query(query("scaled_mm", "sm80"))
    status = {c.impl: c.status for c in exp.candidates}
    assert status["triton"] == "unavailable"
    assert status["triton[w8a16]"] == "fallback"


def test_unknown_priority_name_is_refused():
    with pytest.raises(quantcore.InvalidInputError, match="unknown"):
        with quantcore.priority("tensorrt"):
            pass


def test_selection_is_cached():
    q = query("act_quant", "sm90", blocks=(128,))
    registry.select(q)
    before = registry.table.choose.cache_info().hits
    registry.select(q)
    assert registry.table.choose.cache_info().hits == before + 1


@pytest.mark.parametrize("label,limit", [("triton", 256), ("cupy", 2**31 - 1)])
def test_gemm_k_blocks_beyond_what_kernels_tile_are_refused(label, limit):
    """A K block of 2^31 would be Triton's K tile (and overflow CuPy's int argument): refused, so the
    registry falls back to the reference, which loops over K blocks without padding."""
    bk = 2**31
    q = GemmQuery("scaled_mm", capability.simulated_profile("sm90"), "int8", None, (128, bk), nk=(64, 100),
                  block_k=bk)
    impl = next(i for i in registry.impls("scaled_mm") if i.label == label)
    assert f"the K block must be at most {limit}, got {bk}" in impl.not_supported_reasons(q)
    ok = GemmQuery("scaled_mm", q.profile, "int8", None, (128, 128), nk=(64, 100), block_k=128)
    assert not any("K block" in r for r in impl.not_supported_reasons(ok))


def test_every_kernel_of_a_label_keeps_its_reason():
    """Triton's INT8 and FP8 GEMMs share the label "triton": forcing an INT8 GEMM with FP8 out_quant
    onto it must report the INT8 kernel's reason, not only the FP8 kernel's."""
    q = GemmQuery("scaled_mm", capability.simulated_profile("sm90"), "int8", "fp8_e4m3", (128, 128, 128),
                  nk=(64, 256), block_k=128, out_group=128)
    with pytest.raises(UnsupportedError) as err:
        registry.select(q, backend="triton")
    assert err.value.reasons["triton"] == ["format fp8_e4m3 not implemented (has int8)",
                                           "format int8 not implemented (has fp8_e4m3)"]
    assert "triton: format fp8_e4m3 not implemented (has int8)" in str(err.value)
    explained = {c.impl: c.reasons for c in registry.explain_query(q, backend="triton").candidates}
    assert explained["triton"] == ["format fp8_e4m3 not implemented (has int8)"]


def test_unregistering_what_was_never_registered_is_refused():
    impl = registry.impls("act_quant")[0]  # a built-in: never added with register()
    with pytest.raises(quantcore.InvalidInputError, match="unregister: .* is not an implementation added with register"):
        registry.unregister(impl)


def test_selection_racing_an_unregister_is_not_kept():
    """Thread A selects an implementation while the main thread unregisters it: A's result, computed
    from the old registry, must not be what later selections get."""
    entered, proceed = threading.Event(), threading.Event()

    class Racer(Impl):
        def not_supported_reasons(self, query):
            entered.set()
            assert proceed.wait(10)
            return []

    racer = Racer("act_quant", "triton", lambda **kw: None, Constraints(devices=("cpu",)))
    q = query("act_quant", "cpu", blocks=(128,))
    registry.register(racer)
    try:
        picked = []
        worker = threading.Thread(target=lambda: picked.append(registry.select(q, ("triton",))))
        worker.start()
        assert entered.wait(10)
    finally:
        registry.unregister(racer)
    proceed.set()
    worker.join(10)
    assert picked == [racer]  # computed before the unregister took effect
    assert registry.select(q, ("triton",)) is not racer


def test_gemm_block_constraints_are_data():
    q = GemmQuery("scaled_mm", capability.simulated_profile("sm90"), "fp8_e4m3", "int8", (128, 48, 256),
                  block_k=48, out_group=256)
    cupy = next(i for i in registry.impls("scaled_mm") if i.label == "cupy")
    assert cupy.not_supported_reasons(q)[-2:] == [
        "the K block must be a multiple of 32, got 48",
        "re-quantization groups must be powers of two <= 128, got 256"]


def test_contexts_belong_to_their_asyncio_task():
    """priority() and simulate() are context variables: concurrent tasks each see their own block."""
    import asyncio

    async def inside(name, ready, go):
        with quantcore.priority(name), quantcore.simulate("sm80"):
            ready.set()
            await go.wait()
            return registry.priority_state()[0], capability.simulation_state()[0]

    async def main():
        ready_a, ready_b, go = asyncio.Event(), asyncio.Event(), asyncio.Event()
        tasks = [asyncio.create_task(inside("cupy", ready_a, go)), asyncio.create_task(inside("triton", ready_b, go))]
        await ready_a.wait()
        await ready_b.wait()
        outside = registry.priority_state()[0], capability.simulation_state()[0]
        go.set()
        return outside, await asyncio.gather(*tasks)

    outside, (a, b) = asyncio.run(main())
    assert outside == (None, None)
    assert a == (("cupy",), "sm80") and b == (("triton",), "sm80")
