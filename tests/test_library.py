"""The torch.library custom ops: schemas and fake kernels (opcheck), torch.compile without graph
breaks or recompiles for a new M, and errors that surface unchanged through the dispatcher."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters
from torch._subclasses.fake_tensor import FakeTensorMode

import quantcore.library  # noqa: F401  (registers torch.ops.quantcore)
from helpers import randn
from quantcore import InvalidInputError, NonFiniteInputError, UnsupportedError, definitions, ops

qc = torch.ops.quantcore
FP8, INT8 = torch.float8_e4m3fn, torch.int8
QDTYPES = [FP8, INT8]
# Leading dims and last dims with tails (K not a multiple of the 128 group) and single rows.
ACT_SHAPES = [(1, 1), (3, 130), (2, 5, 256), (2, 1, 3, 129)]


OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def check(op, args, kwargs=None):
    """opcheck: schema (no mutation or aliasing of inputs), autograd registration, fake vs real kernel
    (shapes, dtypes, strides), AOT dispatch with dynamic shapes.

    test_schema runs every aten call inside the kernel under SchemaCheckMode, which compares each
    call's inputs before and after with torch.allclose: not implemented for float8 on the CPU
    (torch 2.13). It runs for the INT8 cases, whose kernels take the same code paths."""
    kwargs = kwargs or {}
    outs = op(*args, **kwargs)
    tensors = [*args, *kwargs.values(), *(outs if isinstance(outs, tuple) else (outs,))]
    fp8 = any(isinstance(t, torch.Tensor) and t.dtype == FP8 for t in tensors)
    torch.library.opcheck(op, args, kwargs, test_utils=[t for t in OPCHECK_TESTS if not (fp8 and t == "test_schema")])


@pytest.mark.parametrize("shape", ACT_SHAPES)
@pytest.mark.parametrize("qdtype", QDTYPES)
@pytest.mark.parametrize("layout", ["row", "m_major"])
def test_act_quant_and_dequant(gen, shape, qdtype, layout):
    x = randn(shape, gen=gen, dtype=torch.bfloat16)
    check(qc.act_quant.default, (x,), dict(dtype=qdtype, scale_layout=layout, scale_fmt="ue8m0"))
    q, s = qc.act_quant(x, dtype=qdtype, scale_layout=layout)
    # fp32 output of a tail is where the reference returns a strided view; the op's is contiguous.
    for out_dtype in (torch.bfloat16, torch.float32):
        check(qc.act_dequant.default, (q, s), dict(out_dtype=out_dtype))


def test_m_major_scale_is_the_transpose_of_a_contiguous_buffer(gen):
    x = randn((2, 3, 300), gen=gen)
    _, s = qc.act_quant(x, scale_layout="m_major")
    with FakeTensorMode() as mode:
        _, fake = qc.act_quant(mode.from_tensor(x), scale_layout="m_major")
    assert s.shape == fake.shape == (2, 3, 3)
    assert s.stride() == fake.stride() == (3, 1, 6)  # [KB, M] contiguous, viewed as [..., KB]


@pytest.mark.parametrize("qdtype", QDTYPES)
@pytest.mark.parametrize("shape,block", [((1, 1), [128, 128]), ((200, 300), [128, 128]), ((65, 33), [64, 32])])
def test_weight_quant_and_dequant(gen, qdtype, shape, block):
    w = randn(shape, gen=gen)
    check(qc.weight_quant.default, (w,), dict(dtype=qdtype, block_size=block))
    q, s = qc.weight_quant(w, dtype=qdtype, block_size=block)
    for out_dtype in (torch.bfloat16, torch.float32):
        check(qc.weight_dequant.default, (q, s), dict(block_size=block, out_dtype=out_dtype))


def gemm_operands(lead, N, K, qdtype, gen):
    a, a_s = ops.act_quant(randn((*lead, K), gen=gen), dtype=qdtype)
    b, b_s = ops.weight_quant(randn((N, K), gen=gen), dtype=qdtype)
    return a, a_s, b, b_s


@pytest.mark.parametrize("qdtype", QDTYPES)
@pytest.mark.parametrize("lead,N,K", [((1,), 1, 1), ((3,), 200, 300), ((2, 4), 130, 256)])
def test_scaled_mm(gen, qdtype, lead, N, K):
    a, a_s, b, b_s = gemm_operands(lead, N, K, qdtype, gen)
    bias = randn((N,), gen=gen, dtype=torch.bfloat16)
    check(qc.scaled_mm.default, (a, a_s, b, b_s))
    check(qc.scaled_mm.default, (a, a_s, b, b_s, bias), dict(activation="gelu", out_dtype=torch.float32))
    check(qc.scaled_mm_quant.default, (a, a_s, b, b_s, bias), dict(out_quant=qdtype, activation="silu"))
    check(qc.scaled_mm_quant.default, (a, a_s, b, b_s), dict(out_quant=INT8, out_group_size=64,
                                                             out_scale_fmt="ue8m0"))
    check(qc.scaled_mm.default, (a, a_s, b, b_s, bias.requires_grad_()), dict(activation="gelu"))


@pytest.mark.parametrize("qdtype", QDTYPES)
@pytest.mark.parametrize("lead,N,K", [((1,), 1, 1), ((2, 4), 130, 256)])
def test_quant_linear(gen, qdtype, lead, N, K):
    _, _, w, w_s = gemm_operands(lead, N, K, qdtype, gen)
    x = randn((*lead, K), gen=gen, dtype=torch.bfloat16)
    check(qc.quant_linear.default, (x, w, w_s))
    check(qc.quant_linear.default, (x, w, w_s, randn((N,), gen=gen)), dict(activation="gelu_tanh",
                                                                          out_dtype=torch.float32))
    # With inputs requiring grad, opcheck also compares AOTAutograd's gradients with eager autograd's.
    check(qc.quant_linear.default, (x.requires_grad_(), w, w_s, randn((N,), gen=gen).requires_grad_()),
          dict(activation="silu"))


@pytest.mark.parametrize("lead", [(5,), (2, 3)])
@pytest.mark.parametrize("g_dtype", [torch.int32, torch.bfloat16, torch.float32])
def test_dequant_bias(gen, lead, g_dtype):
    N = 130
    g = (randn((*lead, N), gen=gen) * 100).to(g_dtype)
    scale_a, scale_b = randn(lead, gen=gen).abs(), randn((N,), gen=gen).abs()
    check(qc.dequant_bias.default, (g, scale_a, scale_b))
    check(qc.dequant_bias.default, (g, scale_a[..., None], scale_b[None], randn((N,), gen=gen)),
          dict(out_dtype=torch.float16))


@pytest.mark.parametrize("shape", ACT_SHAPES)
@pytest.mark.parametrize("out_dtype", [None, INT8])
def test_quantized_gelu(gen, shape, out_dtype):
    q, s = ops.act_quant(randn(shape, gen=gen))
    check(qc.quantized_gelu.default, (q, s), dict(out_dtype=out_dtype, approximate="tanh"))


@pytest.mark.parametrize("shape", [(1, 1), (3, 130), (2, 5, 256)])
@pytest.mark.parametrize("qdtype", QDTYPES)
def test_rms_norm_quant(gen, shape, qdtype):
    x, residual = (randn(shape, gen=gen, dtype=torch.bfloat16) for _ in range(2))
    weight = randn(shape[-1:], gen=gen)
    check(qc.rms_norm_quant.default, (x, weight), dict(dtype=qdtype, scale_layout="m_major", scale_fmt="ue8m0"))
    check(qc.rms_norm_quant_residual.default, (x, weight, residual), dict(dtype=qdtype, eps=1e-5, group_size=64))


@pytest.mark.parametrize("shape", [(1, 2), (3, 260), (2, 5, 512)])
@pytest.mark.parametrize("qdtype", QDTYPES)
def test_silu_mul_quant(gen, shape, qdtype):
    gate_up = randn(shape, gen=gen, dtype=torch.bfloat16)
    check(qc.silu_mul_quant.default, (gate_up,), dict(dtype=qdtype, scale_layout="m_major"))
    experts = gate_up.reshape(shape[0], -1, shape[-1])
    counts = torch.arange(shape[0], dtype=torch.int32)
    check(qc.silu_mul_quant.default, (experts, counts), dict(dtype=qdtype, group_size=64, scale_fmt="ue8m0"))


def test_every_public_op_is_registered():
    quantized_out = {"scaled_mm_quant", "grouped_mm_quant", "grouped_mm_masked_quant", "rms_norm_quant_residual"}
    assert set(quantcore.library.CUSTOM_OPS) == {op.name for op in definitions.BUILTIN} | quantized_out
    assert all(hasattr(torch.ops.quantcore, name) for name in quantcore.library.CUSTOM_OPS)


def test_ops_match_quantcore_ops(gen):
    """The custom ops compute exactly what quantcore.ops computes (the same implementation runs)."""
    x = randn((3, 260), gen=gen)
    a, a_s = qc.act_quant(x, dtype=INT8)
    b, b_s = qc.weight_quant(randn((70, 260), gen=gen), dtype=INT8, block_size=[64, 128])
    ea, es = ops.act_quant(x, dtype=INT8)
    assert torch.equal(a, ea) and torch.equal(a_s, es)
    y = qc.scaled_mm(a, a_s, b, b_s, None, block_size=[64, 128], out_dtype=torch.float32)
    assert torch.equal(y, ops.scaled_mm(a, a_s, b, b_s, block_size=(64, 128), out_dtype=torch.float32))


class OpsModel(torch.nn.Module):
    """A block built from the custom ops alone: quantize, GEMM with bias and a re-quantized output,
    quantized GELU, a second GEMM, dequantize."""

    def __init__(self, gen, K=200, H=300):
        super().__init__()
        for name, shape in (("w1", (H, K)), ("w2", (K, H))):
            q, s = ops.weight_quant(randn(shape, gen=gen))
            self.register_buffer(name, q)
            self.register_buffer(name + "_s", s)
        self.register_buffer("b1", randn((H,), gen=gen))

    def forward(self, x):
        q, s = qc.act_quant(x)
        h, hs = qc.scaled_mm_quant(q, s, self.w1, self.w1_s, self.b1, out_quant=FP8)
        h, hs = qc.quantized_gelu(h, hs)
        y = qc.scaled_mm(h, hs, self.w2, self.w2_s, None, out_dtype=torch.float32)
        return y + qc.act_dequant(q, s, out_dtype=torch.float32)


# "aot_eager" traces through AOTAutograd with the fake kernels (functionalization, dynamic shapes)
# and runs the graph eagerly. Inductor also compiles these graphs on the CPU (the custom ops stay
# opaque calls) but spends ~15 s in its C++ compiler; test_nn.py compiles a QuantLinear with it once.
@pytest.fixture
def compiled():
    torch._dynamo.reset()
    counters.clear()
    with torch._dynamo.config.patch(error_on_recompile=True):
        yield lambda fn: torch.compile(fn, fullgraph=True, backend="aot_eager")
    torch._dynamo.reset()


def test_compiled_model_matches_eager_for_every_m(gen, compiled):
    model = OpsModel(gen)
    fn = compiled(model)
    for M in (3, 17, 64):
        x = randn((2, M, 200), gen=gen)
        if M == 3:
            torch._dynamo.mark_dynamic(x, 1)  # M: one graph for every number of rows
        assert torch.equal(fn(x), model(x))
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["graph_break"]


def test_compiled_m_major_layout_feeds_dequant(gen, compiled):
    def f(x):
        q, s = qc.act_quant(x, dtype=INT8, scale_layout="m_major")
        return qc.act_dequant(q, s, out_dtype=torch.float32) * 2

    fn = compiled(f)
    for M in (4, 9):
        x = randn((M, 257), gen=gen)
        if M == 4:
            torch._dynamo.mark_dynamic(x, 0)
        assert torch.equal(fn(x), f(x))


def test_errors_pass_through_the_dispatcher(gen):
    x = randn((2, 64), gen=gen)
    with pytest.raises(InvalidInputError, match="act_quant: dtype"):
        qc.act_quant(x, dtype=torch.float16)
    with pytest.raises(NonFiniteInputError):
        qc.act_quant(torch.full((2, 64), float("nan")), check_finite=True)
    with pytest.raises(UnsupportedError, match="cupy"):
        qc.act_quant(x, backend="cupy")
    with FakeTensorMode() as mode, pytest.raises(InvalidInputError, match="group_size"):
        qc.act_quant(mode.from_tensor(x), group_size=0)


def test_backend_argument(gen):
    x = randn((2, 300), gen=gen)
    forced = qc.act_quant(x, backend="torch")
    priority = qc.act_quant(x, backend="triton,torch")  # a priority list, reference last
    assert all(torch.equal(a, b) for a, b in zip(forced, priority))


def test_inference_calls_skip_the_redispatch_only_where_nothing_else_would_run(gen, monkeypatch):
    """Without an input requiring grad the Autograd kernel calls the real kernel itself, not through a
    second dispatch, for plain tensors with no dispatch mode or trace active; a dispatch mode and a
    TorchScript trace still see the op, and its result is the same either way."""
    from torch.utils._python_dispatch import TorchDispatchMode

    x = randn((3, 260), gen=gen)
    redispatched = []
    real = torch._C._AutoDispatchBelowAutograd

    def counting():
        redispatched.append(1)
        return real()
    monkeypatch.setattr(torch._C, "_AutoDispatchBelowAutograd", counting)
    expected = ops.act_quant(x)
    assert all(torch.equal(a, b) for a, b in zip(qc.act_quant(x), expected)) and not redispatched

    class Recording(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(func)
            return func(*args, **(kwargs or {}))

    with Recording() as mode:
        got = qc.act_quant(x)
    assert qc.act_quant.default in mode.seen and redispatched
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    traced = torch.jit.trace(lambda t: qc.act_quant(t)[1], (x,), check_trace=False)
    assert "quantcore::act_quant" in str(traced.graph)
    q, s = qc.act_quant(x.to("meta"))  # the meta device's kernel is the fake
    assert q.device.type == "meta" and s.shape == expected[1].shape


# The loading process imports quantcore alone, with Triton and CuPy unimportable.
_LOAD_EXPORTED = """
import sys
for name in ("triton", "cupy", "cupy_backends"):
    sys.modules[name] = None
import torch
import quantcore
program = torch.export.load(sys.argv[1])
x, expected = torch.load(sys.argv[2])
y = program.module()(x)
print(torch.equal(y, expected), tuple(y.shape), "quantcore.library" in sys.modules)
"""


def test_exported_program_loads_and_runs_after_import_quantcore(gen, tmp_path):
    model = OpsModel(gen)
    x = randn((2, 5, 200), gen=gen)
    program = torch.export.export(model, (x,), dynamic_shapes=({1: torch.export.Dim("m")},))
    torch.export.save(program, tmp_path / "model.pt2")
    other = randn((2, 9, 200), gen=gen)  # another M: the saved graph is dynamic in it
    torch.save((other, model(other)), tmp_path / "io.pt")
    out = subprocess.run([sys.executable, "-c", _LOAD_EXPORTED, str(tmp_path / "model.pt2"), str(tmp_path / "io.pt")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "(2,", "9,", "200)", "True"]
