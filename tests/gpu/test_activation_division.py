"""The Triton activations (`backends/triton/kernels/epilogue.py`) divide with `div_rn_normal`, which
equals `tl.div_rn` only within a range of operands: on every one of the 2^32 fp32 inputs of each
activation, `activate` gives the bits it gives dividing with `tl.div_rn` (NaN inputs: NaN both ways).

Run on a GPU machine: `python3 -m pytest -m gpu tests/gpu/test_activation_division.py`.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

BLOCK = 4096


def _kernel():
    import triton
    import triton.language as tl

    from quantcore.backends.triton.kernels.epilogue import activate, activate_dividing

    @triton.jit
    def ieee_div(n, d):
        return tl.div_rn(n, d)

    @triton.jit
    def compare(counts_ptr, first, ACTIVATION: tl.constexpr, BLOCK: tl.constexpr):
        """counts[0] += inputs whose results differ in their bits, not both NaN; counts[1] += those
        where exactly one is NaN; counts[2] = the largest differing input's bits (0 if none)."""
        bits = (first + tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)).to(tl.uint32)
        x = bits.to(tl.float32, bitcast=True)
        new = activate(x, ACTIVATION)
        old = activate_dividing(x, ACTIVATION, ieee_div)
        both_nan = (new != new) & (old != old)
        differ = (new.to(tl.uint32, bitcast=True) != old.to(tl.uint32, bitcast=True)) & ~both_nan
        one_nan = (new != new) != (old != old)
        tl.atomic_add(counts_ptr, tl.sum(differ.to(tl.int32)))
        tl.atomic_add(counts_ptr + 1, tl.sum(one_nan.to(tl.int32)))
        tl.atomic_max(counts_ptr + 2, tl.max(tl.where(differ, bits, 0).to(tl.int32, bitcast=True)))
    return compare


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "silu"])
def test_every_fp32_input_gives_the_bits_of_ieee_division(activation):
    compare = _kernel()
    counts = torch.zeros(3, dtype=torch.int32, device="cuda")
    chunk = 2**30  # inputs per launch
    for first in range(0, 2**32, chunk):
        compare[(chunk // BLOCK,)](counts, first, ACTIVATION=activation, BLOCK=BLOCK)
    differ, one_nan, example = counts.tolist()
    assert (differ, one_nan) == (0, 0), (
        f"{activation}: {differ} inputs differ in their bits, {one_nan} NaN on one side only; e.g. input bits "
        f"{example & 0xFFFFFFFF:#010x} (the largest as a signed int)")
