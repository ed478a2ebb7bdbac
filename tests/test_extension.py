"""quantcore extended from outside, with no edit to the package: a toy op (defined and registered
here, with a reference implementation) and a toy backend implementing it and one built-in op. Both
show up in `explain`, in the report, and the toy op runs through the dispatcher."""

from __future__ import annotations

import pytest
import torch

import quantcore
from quantcore import capability, definitions, library, registry, report
from quantcore.registry.impl import Constraints, Impl
from quantcore.registry import Query
from quantcore.definitions import checks
from quantcore.definitions.prepared import Prepared, keep

OP = "toy_double"


def toy_double(x: torch.Tensor, *, factor: float = 2.0, backend: registry.BackendChoice = None) -> torch.Tensor:
    """x [..., K] fp32 -> x · factor."""
    x = checks.tensor(OP, "x", x, (torch.float32,))
    if isinstance(factor, bool) or not isinstance(factor, (int, float)):
        raise checks.fail(OP, f"factor must be a number, got {factor!r}")
    profile = capability.profile_for(x.device)
    return Prepared(Query(OP, profile, "float32"), dict(x=x, factor=float(factor), profile=profile), keep)


def reference(x, *, factor, profile=None):
    return x * factor


def toy_backend(x, *, factor, profile):
    return x + x * (factor - 1)


def toy_act_quant(x, *, qdtype, group_size, ue8m0, eps, scale_m_major, profile):
    raise AssertionError("never selected here: the toy backend is not in the priority list")


@pytest.fixture
def toy():
    op = definitions.OpDef(toy_double, ("x",), ("x", "factor", "profile"), ("float32",))
    function = library.define(op)
    anywhere = Constraints(devices=("cpu", "cuda"), formats=("float32",))
    impls = [Impl(OP, registry.REFERENCE, reference, anywhere), Impl(OP, "toy", toy_backend, anywhere),
             Impl("act_quant", "toy", toy_act_quant, Constraints(devices=("cpu",)))]
    for impl in impls:
        registry.register(impl)
    yield function
    for impl in impls:
        registry.unregister(impl)
    library.undefine(op)


def test_the_toy_op_runs_through_the_dispatcher(toy):
    x = torch.randn(3, 5)
    assert torch.equal(toy(x), x * 2)
    assert torch.equal(toy(x, factor=3.0, backend="toy"), x + x * 2)
    with quantcore.priority("toy"):
        assert torch.equal(toy(x, factor=0.5), x + x * -0.5)
    with pytest.raises(quantcore.InvalidInputError, match="toy_double: factor must be a number"):
        toy(x, factor="2")


def test_the_toy_op_and_backend_are_explained(toy):
    x = torch.randn(3, 5)
    explained = quantcore.explain(OP, x)
    assert explained.selected == "torch"
    assert {c.impl: c.status for c in explained.candidates} == {"torch": "selected", "toy": "available"}
    act = {c.impl: c.status for c in quantcore.explain("act_quant", x).candidates}
    assert act["toy"] == "available" and act["torch"] == "selected"


def test_the_toy_op_and_backend_are_reported(toy):
    rows = {(r.op, r.impl, r.dtype): r.status for r in report.build().rows}
    assert rows[(OP, "torch", "float32")] == "selected" and rows[(OP, "toy", "float32")] == "available"
    assert rows[("act_quant", "toy", "int8")] == "available"


def test_a_toy_op_is_gone_once_undefined(toy):
    op = definitions.get(OP)
    library.undefine(op)
    try:
        with pytest.raises(quantcore.InvalidInputError, match="unknown op"):
            quantcore.explain(OP, torch.randn(2, 2))
    finally:
        definitions.register_op(op)
