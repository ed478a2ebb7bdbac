"""Device profiles and simulation."""

from __future__ import annotations

import pytest
import torch

import quantcore
from quantcore import capability


@pytest.mark.parametrize("name,fp8,int8,bf16", [
    ("sm70", False, False, False), ("sm75", False, True, False), ("sm80", False, True, True),
    ("sm86", False, True, True), ("sm89", True, True, True), ("sm90", True, True, True), ("sm100", True, True, True),
])
def test_simulated_profiles_capabilities(name, fp8, int8, bf16):
    p = capability.simulated_profile(name)
    assert (p.fp8_mma, p.int8_mma, p.bf16_mma) == (fp8, int8, bf16)
    assert p.kind == "cuda" and p.arch == "sm_" + name[2:] and p.smem_per_block > 0


def test_cpu_profile():
    p = capability.profile_for("cpu")
    assert p.kind == "cpu" and p.compute_capability is None and not p.fp8_mma


def test_simulation_by_context_and_environment(monkeypatch):
    assert capability.active_simulation() is None
    with quantcore.simulate("sm_80") as p:
        assert p.arch == "sm_80" and capability.active_simulation() == "sm80"
        with quantcore.simulate("sm75"):
            assert capability.report_profile().arch == "sm_75"
        assert capability.report_profile().arch == "sm_80"
    monkeypatch.setenv("QUANTCORE_SIMULATE", "sm89")
    assert capability.report_profile().arch == "sm_89"


def test_cpu_tensors_are_never_simulated():
    with quantcore.simulate("sm90"):
        assert capability.profile_for(torch.device("cpu")).kind == "cpu"


@pytest.mark.parametrize("device,match", [("nope", "'nope' is not a device"), ("cuda:64", "no CUDA device cuda:64 here")])
def test_profile_for_a_device_that_is_not_here_is_refused(device, match):
    with pytest.raises(quantcore.InvalidInputError, match=f"profile_for: {match}"):
        capability.profile_for(device)


def test_unknown_profile_is_refused():
    with pytest.raises(quantcore.InvalidInputError, match="unknown profile 'sm99'"):
        capability.simulated_profile("sm99")


def test_auto_dtype_follows_the_profile():
    assert capability.preferred_format_name(capability.simulated_profile("sm90")) == "fp8_e4m3"
    assert capability.preferred_format_name(capability.simulated_profile("sm80")) == "int8"
    q, _ = quantcore.ops.act_quant(torch.randn(2, 128), dtype="auto")
    assert q.dtype == torch.float8_e4m3fn  # the CPU reference computes FP8


def test_versions_never_fail_and_travel_with_the_profile():
    v = capability.versions()
    assert v["torch"] == torch.__version__ and set(v) >= {"triton", "cupy", "nvrtc"}
    p = capability.simulated_profile("sm80")
    assert p.versions == v and p.model_dump()["versions"] == v
    assert hash(p) == hash(capability.simulated_profile("sm80"))


def test_import_needs_neither_triton_nor_cupy():
    import subprocess
    import sys
    code = ("import sys; sys.modules['triton'] = None; sys.modules['cupy'] = None; import quantcore, torch; "
            "quantcore.ops.act_quant(torch.randn(2, 128)); print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"
