"""The public functions generated from the op definitions look exactly like their specs, and each custom
op's schema is the signature's."""

from __future__ import annotations

import inspect
import typing

import pytest

from quantcore import InvalidInputError, library, ops
from quantcore.definitions.op import OpDef
from quantcore.definitions import BUILTIN


@pytest.mark.parametrize("op", BUILTIN, ids=lambda op: op.name)
def test_public_function_is_its_spec(op):
    fn = getattr(ops, op.name)
    assert fn is library.FUNCTIONS[op.name].public and fn.__module__ == "quantcore.ops"
    assert inspect.signature(fn) == inspect.signature(op.spec) and fn.__doc__ == op.spec.__doc__
    assert typing.get_type_hints(fn) == typing.get_type_hints(op.spec)


def test_a_stub_must_name_its_tensors_and_backend():
    def toy(x, *, backend=None):
        """x -> x."""
    with pytest.raises(InvalidInputError, match=r"toy has no argument\(s\) \['y'\]"):
        OpDef(toy, ("y",), ("x",), ())


def test_argument_names_must_not_clash_with_the_generated_body():
    def toy(x, *, _kept=1, backend=None):
        """x -> x."""
    with pytest.raises(InvalidInputError, match=r"toy's argument names \['_kept'\] start with '_'"):
        OpDef(toy, ("x",), ("x",), ())
