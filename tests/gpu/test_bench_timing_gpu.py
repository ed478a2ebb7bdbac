"""The bench's interleaved GPU timing on a real GPU (speed itself is never asserted here)."""

from __future__ import annotations

import pytest
import torch

from quantcore.bench import timing

pytestmark = pytest.mark.gpu


def test_interleaved_gpu_times_are_each_fns_own_in_the_order_given():
    small, big = (torch.empty(n, dtype=torch.float32, device="cuda") for n in (2**18, 2**26))  # 1 MiB, 256 MiB
    calls = {"small": 0, "big": 0}

    def fill(name, t):
        def fn():
            calls[name] += 1
            t.fill_(1.0)
        return fn

    small_us, big_us = timing.gpu_times_us([fill("small", small), fill("big", big)], reps=5, warmup=2)
    assert calls == {"small": 7, "big": 7}  # the warm-up and every repetition time each fn once
    # Writing 256 times the bytes takes longer, whichever of the two a repetition starts with.
    assert 0 < small_us < big_us / 4, (small_us, big_us)
