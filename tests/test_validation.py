"""Bad inputs raise typed errors whose messages name the op and the problem."""

from __future__ import annotations

import pytest
import torch

from quantcore import InvalidInputError, NonFiniteInputError, UnsupportedError, explain, ops, priority, simulate

F8, I8 = torch.float8_e4m3fn, torch.int8
x = torch.randn(4, 256)
q8 = x.to(F8)
s2 = torch.ones(4, 2)
w = torch.randn(256, 256)
wq = w.to(F8)
ws = torch.ones(2, 2)
g = torch.randn(4, 256)


def enter(context) -> None:
    with context:
        pass

BAD = [
    # (id, call, message fragment)
    ("act_quant-not-tensor", lambda: ops.act_quant([1.0, 2.0]), "act_quant: x must be a torch.Tensor"),
    ("act_quant-int-input", lambda: ops.act_quant(torch.ones(2, 8, dtype=torch.int32)), "x has dtype int32"),
    ("act_quant-fp8-input", lambda: ops.act_quant(q8), "x has dtype float8_e4m3fn"),
    ("act_quant-scalar", lambda: ops.act_quant(torch.tensor(1.0)), "at least 1 dimension"),
    ("act_quant-empty-K", lambda: ops.act_quant(torch.ones(3, 0)), "empty last dimension"),
    ("act_quant-bad-dtype", lambda: ops.act_quant(x, dtype=torch.float16), "dtype must be torch.float8_e4m3fn"),
    ("act_quant-bad-dtype-name", lambda: ops.act_quant(x, dtype="fp4"), "dtype must be"),
    ("act_quant-group-zero", lambda: ops.act_quant(x, group_size=0),
     "group_size must be an int from 1 to 2**63 - 1, got 0 (int)"),
    ("act_quant-group-float", lambda: ops.act_quant(x, group_size=128.0), "group_size must be an int"),
    ("act_quant-group-bool", lambda: ops.act_quant(x, group_size=True), "group_size must be an int"),
    ("act_quant-scale-fmt", lambda: ops.act_quant(x, scale_fmt="e8m0"), "scale_fmt must be one of"),
    ("act_quant-eps-zero", lambda: ops.act_quant(x, eps=0.0), "eps must be a finite number > 0"),
    ("act_quant-eps-nan", lambda: ops.act_quant(x, eps=float("nan")), "eps must be a finite number"),
    ("act_quant-eps-underflows", lambda: ops.act_quant(x, eps=1e-50), "gives a scale eps/qmax of 0.0 (qmax 448)"),
    ("act_quant-eps-overflows", lambda: ops.act_quant(x, eps=1e300), "is inf in fp32"),
    ("act_quant-eps-int8-range", lambda: ops.act_quant(x, dtype=I8, eps=1e-44), "use an eps above 8.9e-44"),
    ("weight_quant-eps", lambda: ops.weight_quant(w, eps=1e-50), "weight_quant: eps=1e-50 is 0.0 in fp32"),
    ("quantized_gelu-eps", lambda: ops.quantized_gelu(q8, s2, out_dtype=I8, eps=1e300), "(qmax 127)"),
    ("scaled_mm-eps-requant", lambda: ops.scaled_mm(q8, s2, wq, ws, out_quant=I8, eps=1e-44), "(qmax 127)"),
    ("scaled_mm-eps-unused", lambda: ops.scaled_mm(q8, s2, wq, ws, eps=1e300), "scaled_mm: eps=1e+300 is inf"),
    ("act_quant-layout", lambda: ops.act_quant(x, scale_layout="col"), "scale_layout must be one of"),
    ("act_dequant-float-q", lambda: ops.act_dequant(x, s2), "q has dtype float32"),
    ("act_dequant-scale-dtype", lambda: ops.act_dequant(q8, s2.half()), "scale has dtype float16"),
    ("act_dequant-scale-shape", lambda: ops.act_dequant(q8, torch.ones(4, 3)), "expected (4, 2)"),
    ("act_dequant-group-mismatch", lambda: ops.act_dequant(q8, s2, group_size=64), "pass the group_size used"),
    ("act_dequant-out-dtype", lambda: ops.act_dequant(q8, s2, out_dtype=torch.int8), "out_dtype must be one of"),
    ("weight_quant-1d", lambda: ops.weight_quant(torch.randn(16)), "must have at least 2 dimension"),
    ("weight_quant-3d", lambda: ops.weight_quant(torch.randn(2, 16, 16)), "w must be 2-D"),
    ("weight_quant-block", lambda: ops.weight_quant(w, block_size=128), "block_size must be a pair"),
    ("weight_quant-block-zero", lambda: ops.weight_quant(w, block_size=(128, 0)), "block_size[1] must be an int from 1"),
    ("weight_dequant-scale-shape", lambda: ops.weight_dequant(wq, torch.ones(2, 3)), "expected (2, 2)"),
    ("weight_dequant-block-mismatch", lambda: ops.weight_dequant(wq, ws, block_size=(64, 128)), "block_size used"),
    ("scaled_mm-float-a", lambda: ops.scaled_mm(x, s2, wq, ws), "a has dtype float32"),
    ("scaled_mm-mixed", lambda: ops.scaled_mm(q8, s2, w.to(I8), ws), "same quantized dtype"),
    ("scaled_mm-K-mismatch", lambda: ops.scaled_mm(q8, s2, wq[:, :128], ws[:, :1]), "b must be [N, K]"),
    ("scaled_mm-group-mismatch", lambda: ops.scaled_mm(q8, torch.ones(4, 4), wq, ws), "group_size=128"),
    ("scaled_mm-b-scale", lambda: ops.scaled_mm(q8, s2, wq, torch.ones(3, 2)), "b_scale has shape (3, 2)"),
    ("scaled_mm-bias-shape", lambda: ops.scaled_mm(q8, s2, wq, ws, bias=torch.ones(255)), "bias has shape"),
    ("scaled_mm-bias-dtype", lambda: ops.scaled_mm(q8, s2, wq, ws, bias=torch.ones(256, dtype=torch.int32)),
     "bias has dtype int32"),
    ("scaled_mm-activation", lambda: ops.scaled_mm(q8, s2, wq, ws, activation="relu"), "activation must be one of"),
    ("scaled_mm-out-quant", lambda: ops.scaled_mm(q8, s2, wq, ws, out_quant=torch.bfloat16), "out_quant must be"),
    ("scaled_mm-out-group", lambda: ops.scaled_mm(q8, s2, wq, ws, out_quant=F8, out_group_size=-1),
     "out_group_size must be"),
    ("scaled_mm-a-scale-dtype", lambda: ops.scaled_mm(q8, s2.double(), wq, ws), "a_scale has dtype float64"),
    ("dequant_bias-dtype", lambda: ops.dequant_bias(g.to(I8), torch.ones(4), torch.ones(256)), "g has dtype int8"),
    ("dequant_bias-scale-a", lambda: ops.dequant_bias(g, torch.ones(5), torch.ones(256)), "scale_a has shape (5,)"),
    ("dequant_bias-scale-b", lambda: ops.dequant_bias(g, torch.ones(4), torch.ones(2, 256)), "scale_b has shape"),
    ("dequant_bias-scale-b-dtype", lambda: ops.dequant_bias(g, torch.ones(4), torch.ones(256).half()),
     "scale_b has dtype float16"),
    ("dequant_bias-bias", lambda: ops.dequant_bias(g, torch.ones(4), torch.ones(256), torch.ones(255)),
     "bias has shape (255,)"),
    ("quantized_gelu-approx", lambda: ops.quantized_gelu(q8, s2, approximate="erf"), "approximate must be one of"),
    ("quantized_gelu-out", lambda: ops.quantized_gelu(q8, s2, out_dtype=torch.float16), "out_dtype must be"),
    ("quantized_gelu-scale", lambda: ops.quantized_gelu(q8, torch.ones(4, 1)), "scale has shape (4, 1)"),
    ("explain-unknown-op", lambda: explain("fp8_gemm", x), "unknown op 'fp8_gemm'"),
    ("unknown-backend", lambda: ops.act_quant(x, backend="cutlass"), "backend: unknown ['cutlass']"),
    ("backend-int", lambda: ops.act_quant(x, backend=5), "backend: expected None, \"auto\", a backend name"),
    ("backend-bytes", lambda: ops.act_quant(x, backend=b"torch"), "backend: expected None"),
    ("backend-set", lambda: ops.act_quant(x, backend={"torch"}), "a list/tuple of names"),
    ("backend-list-of-int", lambda: ops.act_quant(x, backend=["torch", 5]), "backend: backend names must be str"),
    ("priority-int", lambda: enter(priority(5)), "priority: backend names must be str, got [5]"),
    ("simulate-none", lambda: enter(simulate(None)), "simulate: the profile name must be a str"),
    ("act_quant-group-int64", lambda: ops.act_quant(x, group_size=2**63),
     "group_size must be an int from 1 to 2**63 - 1"),
    ("act_quant-eps-huge-int", lambda: ops.act_quant(x, eps=10**400),
     "act_quant: eps=1000000000000000000000000000000000000000...(401 characters) is inf in fp32"),
    ("act_quant-eps-negative-huge-int", lambda: ops.act_quant(x, eps=-10**400), "eps must be a finite number > 0"),
    ("act_quant-csr", lambda: ops.act_quant(x.to_sparse_csr()), "act_quant: x has layout torch.sparse_csr; expected a "
                                                               "dense tensor (torch.strided): pass x.to_dense()"),
    ("act_quant-csc", lambda: ops.act_quant(x.to_sparse_csc()), "x has layout torch.sparse_csc"),
    ("act_quant-bsr", lambda: ops.act_quant(x.to_sparse_bsr((2, 2))), "x has layout torch.sparse_bsr"),
    ("act_quant-coo", lambda: ops.act_quant(x.to_sparse()), "x has layout torch.sparse_coo"),
    ("act_dequant-csr-scale", lambda: ops.act_dequant(q8, s2.to_sparse_csr()), "act_dequant: scale has layout"),
    ("scaled_mm-csc-b-scale", lambda: ops.scaled_mm(q8, s2, wq, ws.to_sparse_csc()), "scaled_mm: b_scale has layout"),
    ("act_quant-nested", lambda: ops.act_quant(torch.nested.nested_tensor([torch.randn(2, 8), torch.randn(3, 8)])),
     "act_quant: x is a nested tensor; expected a dense one"),
    ("act_quant-complex", lambda: ops.act_quant(torch.randn(2, 8, dtype=torch.complex64)), "x has dtype complex64"),
    ("act_dequant-negative-fp8-view", lambda: ops.act_dequant(torch._neg_view(q8), s2),
     "act_dequant: q is a negative view (float8_e4m3fn), which torch cannot materialize on cpu"),
    ("act_quant-check-finite-str", lambda: ops.act_quant(x, check_finite="no"),
     "act_quant: check_finite must be True or False, got 'no'"),
    ("weight_quant-check-finite-int", lambda: ops.weight_quant(w, check_finite=1),
     "weight_quant: check_finite must be True or False, got 1"),
]


@pytest.mark.parametrize("call,fragment", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_raises_typed_error_naming_the_problem(call, fragment):
    with pytest.raises(InvalidInputError) as err:
        call()
    assert isinstance(err.value, ValueError)
    assert fragment in str(err.value)


def test_there_are_at_least_thirty_distinct_bad_inputs():
    assert len({b[0] for b in BAD}) >= 30


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without mkldnn")
def test_an_mkldnn_tensor_is_refused():
    with pytest.raises(InvalidInputError, match="act_quant: x has layout torch._mkldnn; expected a dense tensor"):
        ops.act_quant(x.to_mkldnn())


def test_messages_name_the_op():
    with pytest.raises(InvalidInputError, match=r"^scaled_mm: "):
        ops.scaled_mm(q8, s2, wq, ws, activation="relu")


def test_devices_must_match():
    meta = torch.ones(4, 2, device="meta")
    with pytest.raises(InvalidInputError, match="different devices"):
        ops.act_dequant(q8, meta)


def test_non_finite_opt_in_error_is_an_invalid_input():
    bad = torch.full((2, 128), float("inf"))
    with pytest.raises(NonFiniteInputError, match="weight_quant: w contains NaN or Inf"):
        ops.weight_quant(bad, check_finite=True)


def test_forcing_a_backend_that_cannot_run_says_why():
    with pytest.raises(UnsupportedError) as err:
        ops.act_quant(x, backend="cupy")
    assert isinstance(err.value, NotImplementedError)
    assert "cupy" in err.value.reasons and "runs on cuda, not cpu" in str(err.value)
