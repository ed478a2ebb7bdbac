"""`registry.reset()` clears the backends' own caches too; `registry.compared` lists what the parity
tests and the bench compare with the reference."""

from __future__ import annotations

import torch

from quantcore import capability, ops, registry

from quantcore.runtime import dispatch, plans

from quantcore.registry import measured
from quantcore.backends.triton import configs


def test_reset_clears_the_triton_backends_tuned_and_derived_configs():
    configs._tuned[("probe",)] = None
    configs.tile_2d(64, 300, capability.simulated_profile("sm90"))
    assert configs.tile_2d.cache_info().currsize
    registry.reset()
    assert not configs._tuned
    assert all(f.cache_info().currsize == 0 for f in (configs.tile_2d, configs.block_tiling, configs.decode_config,
                                                       configs.gemm_candidates))


def test_reset_rereads_measured_priorities_and_drops_kept_plans():
    """A table written by `bench --write-priority` is read again; kept plans hold tensors' metadata and
    launchers that the epoch already made unreachable: their memory is freed."""
    measured.table("NVIDIA H100 80GB HBM3")
    ops.act_quant(torch.randn(2, 128))
    assert measured._load.cache_info().currsize and plans.plans
    registry.reset()
    assert measured._load.cache_info().currsize == 0 and not plans.plans


def test_compared_backends_come_from_the_registry():
    assert registry.compared("act_quant") == ("triton", "cupy")
    assert registry.compared("scaled_mm") == ("triton", "cupy", "triton[gluon]", "torch[cublas]")
