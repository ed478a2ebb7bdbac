"""`registry.reset()` clears the backends' own caches too; `registry.compared` lists what the parity
tests and the bench compare with the reference."""

from __future__ import annotations

from quantcore import capability, registry
from quantcore.backends.triton import configs


def test_reset_clears_the_triton_backends_tuned_and_derived_configs():
    configs._tuned[("probe",)] = None
    configs.tile_2d(64, 300, capability.simulated_profile("sm90"))
    assert configs.tile_2d.cache_info().currsize
    registry.reset()
    assert not configs._tuned
    assert all(f.cache_info().currsize == 0 for f in (configs.tile_2d, configs.block_tiling, configs.decode_config,
                                                       configs.gemm_candidates))


def test_compared_backends_come_from_the_registry():
    assert registry.compared("act_quant") == ("triton", "cupy")
    assert registry.compared("scaled_mm") == ("triton", "cupy", "torch[cublas]")
