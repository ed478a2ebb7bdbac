"""Bad inputs drawn by hypothesis against the public surface: every op of `quantcore.definitions.all_ops()`
through `quantcore.ops`, `QuantLinear`, `QuantExperts`, `quantize_model` and `load_fp8_checkpoint` on state
dicts. Only
`QuantcoreError`s may come out (and `TORCH_ERRORS`, torch's own, each for a reason quantcore cannot
see first); a view that holds the same values as a plain tensor (negated, strided, transposed, offset)
must give the plain tensor's result. Draws: wrong dtypes, shapes, devices ("meta"), layouts (sparse,
nested, mkldnn), NaN/Inf, non-tensors, and absurd options (negative, huge, float, bool, unknown strings,
None, containers). The torch backend, plus a few draws on the Triton interpreter; bounded to seconds."""

from __future__ import annotations

import importlib.util
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere (see test_triton_kernels)

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch import nn  # noqa: E402

from quantcore import QuantcoreError, definitions, ops, registry  # noqa: E402
from quantcore.nn import QuantExperts, QuantLinear, load_fp8_checkpoint, quantize_model  # noqa: E402



def fuzz(examples: int):
    """Hypothesis settings of a fuzz test: `examples` draws, the same ones every run."""
    return settings(max_examples=examples, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))

F8 = torch.float8_e4m3fn

# torch's own errors that may come out, with why quantcore does not raise them itself:
TORCH_ERRORS = {
    # nn.Module.load_state_dict reports missing and unexpected keys and the size or type mismatches of the
    # model's float parameters itself (QuantLinear checks its quantized ones first, typed).
    "load_state_dict": (RuntimeError, "Error(s) in loading state_dict for"),
}

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int32, torch.int64,
          torch.uint8, torch.bool, torch.complex64, F8, torch.float8_e5m2)
BAD_VALUES = (-1, 0, 2**63, 2**64, 10**400, -10**400, 128.0, 0.5, float("nan"), float("inf"), True, False, None,
              "", "fp32x", "auto", "none", [128], (128,), (128, 128, 1), (128.0, 128), [128, -1], (0, 128),
              torch.int8, torch.float32, torch.complex64, np.int64(128), np.float32(1e-4), torch.tensor(128), object(),
              {"a": 1}, b"fp32", 1e-50, 1e300, -1e-4)
BACKENDS = ("cutlass", 5, ["torch", 5], ("torch",), "torch,triton", "", " ", ("nope",), None, "auto", {"torch"})


def outcome(call, same_as=None) -> str:
    """"typed", "accepted", "untyped <error>" or "silently wrong" (the result is not `same_as()`'s)."""
    try:
        out = call()
    except QuantcoreError:
        return "typed"
    except Exception as err:  # what this test looks for
        if any(isinstance(err, kind) and str(err).startswith(start) for kind, start in TORCH_ERRORS.values()):
            return "torch's"
        return f"untyped {type(err).__name__}: {str(err)[:300]}"
    if same_as is not None:
        try:
            expected = same_as()
        except QuantcoreError:
            return "accepted"  # the plain tensor is refused (an fp8 one can be neither negated nor viewed so)
        if not _same(out, expected):
            return "silently wrong"
    return "accepted"


def _same(a, b) -> bool:
    a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x.element_size() == 1:
            x, y = x.view(torch.uint8), y.view(torch.uint8)
        if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(torch.nan_to_num(x), torch.nan_to_num(y)):
            return False
    return True


def _judge(result: str, what: str) -> None:
    assert not result.startswith(("untyped", "silently")), f"{what}: {result}"


# ---------------------------------------------------------------- tensors

def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.float().to(dtype) if t.dtype != dtype else t


def _values(t: torch.Tensor, value: float) -> torch.Tensor:
    if not t.is_floating_point() or t.element_size() == 1:
        return t
    out = t.clone()
    out.view(-1)[:: max(1, out.numel() // 3)] = value
    return out


def _dense_ok(t: torch.Tensor) -> torch.Tensor:
    """`t`, or a float32 copy where torch cannot make a sparse or nested tensor of its dtype (fp8 on the CPU)."""
    return t.float() if t.dtype in (F8, torch.float8_e5m2) else t


# Mutations that make a tensor argument wrong, or at least unusual: name -> (tensor, draw) -> the argument.
BAD_TENSORS = {
    "dtype": lambda t, draw: _as(t, draw(st.sampled_from(DTYPES))),
    "not a tensor": lambda t, draw: draw(st.sampled_from([None, 3, 1.5, "x", t.tolist(), np.zeros(t.shape), (t,)])),
    "last dim cut": lambda t, draw: t[..., :-1] if t.dim() and t.shape[-1] > 1 else t[..., :0],
    "leading dim added": lambda t, draw: t[None],
    "flattened": lambda t, draw: t.reshape(-1),
    "0-d": lambda t, draw: t.reshape(-1)[0],
    "no rows": lambda t, draw: t[:0],
    "empty last dim": lambda t, draw: t[..., :0],
    "transposed shape": lambda t, draw: t.t() if t.dim() == 2 else t,
    "meta": lambda t, draw: t.to("meta"),
    "sparse coo": lambda t, draw: _dense_ok(t).to_sparse(),
    "sparse csr": lambda t, draw: _dense_ok(t).to_sparse_csr() if t.dim() == 2 else _dense_ok(t).to_sparse(),
    "sparse csc": lambda t, draw: _dense_ok(t).to_sparse_csc() if t.dim() == 2 else _dense_ok(t).to_sparse(),
    "nested": lambda t, draw: torch.nested.nested_tensor([_dense_ok(t)] * 2),
    "mkldnn": lambda t, draw: t.float().to_mkldnn() if torch.backends.mkldnn.is_available() else t.to("meta"),
    "values": lambda t, draw: _values(t, draw(st.sampled_from([float("nan"), float("inf"), -float("inf"), 3e38,
                                                               1e-45]))),
    "requires grad": lambda t, draw: t.detach().requires_grad_() if t.is_floating_point() else t,
}


def _offset(t: torch.Tensor) -> torch.Tensor:
    flat = torch.empty(t.numel() + 1, dtype=t.dtype)
    flat[1:] = t.reshape(-1)
    return flat[1:].view(t.shape)  # the same values one element further on: another address mod 16


# Views that hold exactly the plain tensor's values: the op must compute what it computes for the plain one.
SAME_VALUES = {
    "negative view": lambda t: torch._neg_view(t.neg()),
    "conjugate's imaginary part": lambda t: torch.complex(torch.zeros_like(t), -t).conj().imag,
    "strided last dim": lambda t: torch.stack([t, t], -1)[..., 0],
    "column-major": lambda t: t.t().contiguous().t() if t.dim() == 2 else t,
    "offset address": _offset,
}


def _viewable(name: str, t: torch.Tensor) -> bool:
    if name == "negative view":
        return t.element_size() > 1 or not t.is_floating_point()  # no negation of fp8 on the CPU
    if name == "conjugate's imaginary part":
        return t.dtype == torch.float32
    return True


def _example(op: str):
    definition = definitions.get(op)
    fmt = "int8" if "int8" in definition.formats else definition.formats[0]
    args, kwargs = definition.example(fmt, m=3, n=16, k=256)
    return definition, list(args), dict(kwargs)


OPS = [op.name for op in definitions.all_ops()]


def fresh(call):
    """`call` as its own first call: no plan kept by an earlier draw is replayed (a negative view of a kept
    plan's metadata would be: tests/backends/test_triton_kernels.py's xfail)."""
    def first():
        registry.clear_caches()
        return call()
    return first


@pytest.mark.parametrize("op", OPS)
@fuzz(40)
@given(data=st.data())
def test_bad_tensors_raise_typed_errors(op, data):
    definition, args, kwargs = _example(op)
    i = data.draw(st.sampled_from([i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]), label="argument")
    name = data.draw(st.sampled_from(list(BAD_TENSORS)), label="mutation")
    args[i] = BAD_TENSORS[name](args[i], data.draw)
    _judge(outcome(fresh(lambda: getattr(ops, op)(*args, **kwargs))), f"{op}: {definition.tensors[i]} {name}")


@pytest.mark.parametrize("op", OPS)
@fuzz(40)
@given(data=st.data())
def test_absurd_options_raise_typed_errors(op, data):
    definition, args, kwargs = _example(op)
    names = data.draw(st.lists(st.sampled_from([*definition.defaults, "backend"]), min_size=1, max_size=2,
                               unique=True), label="options")
    for name in names:
        kwargs[name] = data.draw(st.sampled_from(BACKENDS if name == "backend" else BAD_VALUES), label=name)
    _judge(outcome(fresh(lambda: getattr(ops, op)(*args, **kwargs))), f"{op}: {kwargs}")


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1" or importlib.util.find_spec("triton") is None,
    reason="the Triton interpreter, on a machine without a GPU"))])
@pytest.mark.parametrize("op", OPS)
@fuzz(6)
@given(data=st.data())
def test_a_view_of_the_same_values_gives_the_same_result(op, backend, data):
    definition, args, kwargs = _example(op)
    i = data.draw(st.sampled_from([i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]), label="argument")
    name = data.draw(st.sampled_from([n for n in SAME_VALUES if _viewable(n, args[i])]), label="view")
    viewed = [*args[:i], SAME_VALUES[name](args[i]), *args[i + 1:]]
    function = getattr(ops, op)
    _judge(outcome(fresh(lambda: function(*viewed, **kwargs, backend=backend)),
                   fresh(lambda: function(*args, **kwargs, backend=backend))),
           f"{op} on {backend}: {definition.tensors[i]} as a {name}")


# ---------------------------------------------------------------- modules

SIZES = (0, -1, 1, 33, 2**62, 2**63, 10**400, 1.5, True, "8", None)


@fuzz(120)
@given(in_features=st.sampled_from(SIZES), out_features=st.sampled_from(SIZES), data=st.data())
def test_quant_linear_construction(in_features, out_features, data):
    options = data.draw(st.fixed_dictionaries({}, optional={
        "bias": st.sampled_from([True, False, "no", 1, None]),
        "dtype": st.sampled_from(["auto", "fp8", "int8", "fp4", torch.float16, F8, None, 5]),
        "block_size": st.sampled_from(BAD_VALUES + ((16, 16),)),
        "out_dtype": st.sampled_from([None, torch.float16, torch.int8, "bf16", 5]),
        "scale_fmt": st.sampled_from(["fp32", "ue8m0", "e8m0", None]),
        "device": st.sampled_from(["meta", "cpu", "cuda", "cuda:abc", "gpu", -1, 1.5, torch.device("meta")]),
    }), label="options")
    if options.get("device") in ("cpu", None) and not (isinstance(in_features, int) and in_features < 2**20):
        options["device"] = "meta"  # a layer that fits an address space but not this machine is torch's to refuse
    _judge(outcome(lambda: QuantLinear(in_features, out_features, **options)), f"QuantLinear({in_features}, "
           f"{out_features}, {options})")


@fuzz(40)
@given(data=st.data())
def test_quant_linear_forward_and_attributes(data):
    layer = QuantLinear.from_linear(nn.Linear(64, 24), dtype=torch.int8, block_size=(16, 32))
    x = torch.randn(3, 64)
    layer(x)  # a kept plan, which what follows must not reuse wrongly
    if data.draw(st.booleans(), label="an attribute"):
        name = data.draw(st.sampled_from(["block_size", "scale_fmt", "out_dtype"]), label="attribute")
        value = data.draw(st.sampled_from(BAD_VALUES + ("ue8m0", torch.float16)), label="value")
        _judge(outcome(lambda: setattr(layer, name, value)), f"QuantLinear.{name} = {value!r}")
    else:
        name = data.draw(st.sampled_from(list(BAD_TENSORS)), label="mutation")
        x = BAD_TENSORS[name](x, data.draw)
    _judge(outcome(lambda: layer(x)), f"QuantLinear forward after {name}")


@fuzz(60)
@given(data=st.data())
def test_quantize_model(data):
    model = data.draw(st.sampled_from([nn.Sequential(nn.Linear(64, 24), nn.GELU(), nn.Linear(24, 8)), None,
                                       torch.randn(2), nn.Linear(64, 24).to("meta")]), label="model")
    options = data.draw(st.fixed_dictionaries({}, optional={
        name: st.sampled_from(BAD_VALUES + extra) for name, extra in (
            ("dtype", ("int8", "fp8")), ("skip", ("lm_head", ["0"], ("*",))), ("block_size", ((16, 16),)),
            ("out_dtype", (torch.float16,)), ("scale_fmt", ("ue8m0",)))}), label="options")
    _judge(outcome(lambda: quantize_model(model, **options)), f"quantize_model({type(model).__name__}, {options})")


def _state_dict_mutations(state, data):
    key = data.draw(st.sampled_from(sorted(state)), label="key")
    how = data.draw(st.sampled_from(["drop", "extra", "tensor", "not a tensor", "strict"]), label="how")
    if how == "drop":
        del state[key]
    elif how == "extra":
        state[key + "_extra"] = state[key]
    elif how == "tensor":
        mutation = data.draw(st.sampled_from(list(BAD_TENSORS)), label="mutation")
        state[key] = BAD_TENSORS[mutation](state[key], data.draw)
    elif how == "not a tensor":
        state[key] = data.draw(st.sampled_from([None, 1.0, "weight", [1, 2]]), label="value")
    return data.draw(st.sampled_from([True, False, "yes", None])) if how == "strict" else True


@fuzz(60)
@given(data=st.data())
def test_load_fp8_checkpoint_on_state_dicts(data):
    source = quantize_model(nn.Sequential(nn.Linear(64, 24), nn.Linear(24, 8)), dtype=F8, block_size=(16, 32))
    target = quantize_model(nn.Sequential(nn.Linear(64, 24), nn.Linear(24, 8)), dtype=F8, block_size=(16, 32))
    state = dict(source.state_dict())
    strict = _state_dict_mutations(state, data)
    _judge(outcome(lambda: load_fp8_checkpoint(target, state, strict=strict)), f"load_fp8_checkpoint({sorted(state)})")


# ---------------------------------------------------------------- experts

@fuzz(80)
@given(data=st.data())
def test_quant_experts_construction(data):
    sizes = [data.draw(st.sampled_from(SIZES + (2, 64)), label=name) for name in ("experts", "hidden", "inter")]
    options = data.draw(st.fixed_dictionaries({}, optional={
        "dtype": st.sampled_from(["auto", "fp8", "int8", "fp4", torch.float16, F8, None, 5]),
        "block_size": st.sampled_from(BAD_VALUES + ((16, 16),)),
        "scale_fmt": st.sampled_from(["fp32", "ue8m0", "e8m0", None]),
        "activation": st.sampled_from(["silu", "gelu", "relu", None, 1]),
        "device": st.sampled_from(["meta", "cuda", "gpu", -1, torch.device("meta")]),
    }), label="options")
    options.setdefault("device", "meta")  # sizes that fit an address space but not this machine are torch's
    _judge(outcome(lambda: QuantExperts(*sizes, **options)), f"QuantExperts({sizes}, {options})")


def _experts() -> QuantExperts:
    gen = torch.Generator().manual_seed(0)
    return QuantExperts.from_stacked(torch.randn(4, 64, 64, generator=gen), torch.randn(4, 64, 32, generator=gen),
                                     dtype=torch.int8, block_size=(16, 32))


@fuzz(60)
@given(data=st.data())
def test_quant_experts_forward(data):
    layer = _experts()
    args = {"x": torch.randn(5, 64), "topk_ids": torch.tensor([[0, 1], [1, 2], [2, 3], [3, 0], [0, 2]]),
            "topk_weights": torch.rand(5, 2)}
    layer(*args.values())
    name = data.draw(st.sampled_from(list(args)), label="argument")
    how = data.draw(st.sampled_from([*BAD_TENSORS, "ids out of range"]), label="mutation")
    if how == "ids out of range":
        args["topk_ids"] = args["topk_ids"] + data.draw(st.sampled_from([-5, 4, 2**40]), label="shift")
    else:
        args[name] = BAD_TENSORS[how](args[name], data.draw)
    _judge(outcome(lambda: layer(*args.values())), f"QuantExperts forward, {name} {how}")


@fuzz(60)
@given(data=st.data())
def test_quant_experts_state_dicts(data):
    state = dict(_experts().state_dict())
    strict = _state_dict_mutations(state, data)
    target = _experts()
    _judge(outcome(lambda: target.load_state_dict(state, strict=strict is True)), f"QuantExperts.load({sorted(state)})")
