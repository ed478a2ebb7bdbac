"""Property-based tests: every op on the torch backend against the independent float64 oracle, the
cases drawn by hypothesis (tests/properties.py). Shapes are small and the examples derandomized, so
that the module takes seconds and never flakes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import properties

PROPERTY = settings(max_examples=150, deadline=None, derandomize=True)


@PROPERTY
@given(data=st.data())
def test_act_quant_and_dequant(data):
    properties.check_act_quant_and_dequant(data, "torch")


@PROPERTY
@given(data=st.data())
def test_weight_quant_and_dequant(data):
    properties.check_weight_quant_and_dequant(data, "torch")


@PROPERTY
@given(data=st.data())
def test_scaled_mm(data):
    properties.check_scaled_mm(data, "torch")


@PROPERTY
@given(data=st.data())
def test_dequant_bias(data):
    properties.check_dequant_bias(data, "torch")


@PROPERTY
@given(data=st.data())
def test_quantized_gelu(data):
    properties.check_quantized_gelu(data, "torch")
