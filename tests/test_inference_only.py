"""The ops are inference-only: no output requires grad, whichever backend ran and whichever inputs did."""

from __future__ import annotations

from helpers import outputs_of_every_op_on_grad_inputs


def test_reference_outputs_never_require_grad():
    outputs = outputs_of_every_op_on_grad_inputs("torch")
    assert len(outputs) == 8
    for op, tensors in outputs.items():
        assert [t.requires_grad for t in tensors] == [False] * len(tensors), op
