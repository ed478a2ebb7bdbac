"""Property-based tests: every op on the torch backend against the independent float64 oracle, the
cases drawn by hypothesis (tests/properties.py). Shapes are small and the examples derandomized, so
that the module takes seconds and never flakes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import properties


@pytest.mark.parametrize("op", list(properties.CHECKS))
@settings(max_examples=150, deadline=None, derandomize=True)
@given(data=st.data())
def test_op_against_the_oracle(op, data):
    properties.CHECKS[op](data, "torch")
