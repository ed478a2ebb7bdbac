"""Every implementation's launch function takes what the dispatcher passes it: the op's launch
arguments (its spec's `Prepared.kwargs`) and the implementation's fixed options. Registered callables
are checked by `registry.register`; the built-ins, described as "module:function", here."""

from __future__ import annotations

import importlib

import pytest

from quantcore import InvalidInputError, definitions, registry
from quantcore.registry import BACKEND_PACKAGES
from quantcore.registry.impl import Constraints, Impl

BUILTIN_IMPLS = [impl for package in BACKEND_PACKAGES
                 for impl in importlib.import_module(f"quantcore.backends.{package}").IMPLS]


@pytest.mark.parametrize("impl", BUILTIN_IMPLS, ids=lambda i: f"{i.op}-{i.label}-{i.launch}")
def test_builtin_launch_signatures(impl):
    module = impl.launch.partition(":")[0]
    pytest.importorskip(f"quantcore.backends.{module}")  # CuPy or Triton may be missing here
    definitions.op.check_launch(impl.op, impl.label, impl.function(), dict(impl.options))


def test_launch_args_are_what_the_specs_prepare():
    for op in definitions.all_ops():  # every op defines its example call (OpDef.example)
        for fmt in op.formats:
            args, kwargs = op.example(fmt)
            assert tuple(op.spec(*args, **kwargs).kwargs) == op.launch_args, (op.name, fmt)


def _launch(x, *, qdtype, group_size, ue8m0, eps, profile, layout):
    return None


@pytest.mark.parametrize("launch,words", [
    (_launch, ["does not take ['scale_m_major']", "requires ['layout']"]),
    (type("Prepared", (), {"prepare": staticmethod(_launch), "__call__": lambda self: None})(),
     ["does not take ['scale_m_major']"]),
])
def test_register_refuses_a_launch_function_of_another_signature(launch, words):
    with pytest.raises(InvalidInputError) as err:
        registry.register(Impl("act_quant", "toy", launch, Constraints(devices=("cpu",))))
    assert "toy of act_quant" in str(err.value) and all(w in str(err.value) for w in words)
    assert "toy" not in {i.backend for i in registry.impls("act_quant")}


def test_register_counts_fixed_options_as_passed():
    impl = Impl("act_quant", "toy", lambda x, *, layout, **contract: None, Constraints(devices=("cpu",)),
                options=(("layout", "row"),))
    registry.register(impl)
    registry.unregister(impl)
    with pytest.raises(InvalidInputError, match="requires \\['layout'\\]"):
        registry.register(Impl("act_quant", "toy", impl.launch, Constraints(devices=("cpu",))))


def test_register_refuses_an_unknown_op():
    with pytest.raises(InvalidInputError, match="no defined op"):
        registry.register(Impl("act_quantize", "toy", lambda **kw: None))
