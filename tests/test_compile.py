"""quantcore under torch.compile: each public op traces with fullgraph=True into its custom op (one
node per call, whose fake gives the outputs), with M dynamic and no recompile for a new M; so do
QuantLinear, a quantize_model-ed model, the tensor-parallel layers of one process, a training step
and a non-strict torch.export. "aot_eager" traces through AOTAutograd with the fake kernels and runs
the graph eagerly; Inductor compiles one graph (its C++ compile takes seconds on the CPU)."""

from __future__ import annotations

import re

import pytest
import torch
import torch._dynamo
from torch import nn
from torch._dynamo.backends.registry import lookup_backend
from torch._dynamo.utils import counters

from helpers import randn
from quantcore import InvalidInputError, ops
from quantcore.library import CUSTOM_OPS
from quantcore.nn import QuantLinear, quantize_model
from quantcore.parallel import ColumnParallelQuantLinear, RowParallelQuantLinear

FP8, INT8 = torch.float8_e4m3fn, torch.int8


class Recorder:
    """A torch.compile backend that keeps each graph Dynamo hands it, then compiles it with `inner`."""

    def __init__(self, inner: str = "aot_eager"):
        self.graphs, self.inner = [], lookup_backend(inner)

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm.graph)
        return self.inner(gm, example_inputs)

    def calls(self) -> list:
        """The quantcore custom-op nodes of the graphs, in order."""
        return [n for g in self.graphs for n in g.nodes
                if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
                and n.target.namespace == "quantcore"]

    def names(self) -> list[str]:
        return [n.target._schema.name.split("::")[1] for n in self.calls()]


@pytest.fixture
def fullgraph():
    """torch.compile(fn, fullgraph=True, backend=...), any recompile an error."""
    torch._dynamo.reset()
    counters.clear()
    with torch._dynamo.config.patch(error_on_recompile=True):
        yield lambda fn, backend: torch.compile(fn, fullgraph=True, backend=backend)
    torch._dynamo.reset()


def every_op(x, w, bias):
    """Each public op once (scaled_mm twice: its float and its re-quantized output are two custom ops),
    with a priority tuple, "auto" and option values other than the defaults among the arguments."""
    q, s = ops.act_quant(x, dtype="auto", backend=("torch",))
    wq, ws = ops.weight_quant(w, dtype=INT8, block_size=(64, 32))
    wq8, ws8 = ops.weight_quant(w, dtype=FP8)
    y = ops.scaled_mm(q, s, wq8, ws8, bias=bias, activation="silu", out_dtype=torch.float32)
    yq, ys = ops.scaled_mm(q, s, wq8, ws8, out_quant=FP8, out_group_size=64, eps=1e-3)
    g, gs = ops.quantized_gelu(yq, ys, group_size=64, approximate="tanh")
    z = ops.quant_linear(x, wq, ws, bias, block_size=(64, 32), out_dtype=torch.float32, scale_fmt="ue8m0")
    # The fused producers, the norm with and without the residual add.
    n, ns = ops.rms_norm_quant(x, bias.new_ones(x.shape[-1]))
    n2, ns2, r = ops.rms_norm_quant(x, bias.new_ones(x.shape[-1]), x, eps=1e-5)
    a, a_s = ops.silu_mul_quant(x)
    # Mixture of experts: 4 experts stacking the FP8 weight, each token routed to 2 of them (ids from the
    # data, so that the routing is traced, not a constant), both layouts and both output kinds.
    b, b_s = wq8.expand(4, -1, -1), ws8.expand(4, -1, -1)
    ids = torch.stack([(x[:, 0] > 0).to(torch.int32), (x[:, 1] > 0).to(torch.int32) + 2], dim=1)
    weights = torch.softmax(x[:, :2], dim=1)
    pq, ps, offsets, rows = ops.moe_permute(x, ids, 4)
    moe = ops.moe_unpermute(ops.grouped_mm(pq, ps, b, b_s, offsets), rows, weights)
    gq, gs2 = ops.grouped_mm(pq, ps, b, b_s, offsets, out_quant=FP8)
    mq, ms, counts, mrows = ops.moe_permute_masked(x, ids, 4, 64)
    masked = ops.grouped_mm_masked(mq, ms, b, b_s, counts)
    mgq, mgs = ops.grouped_mm_masked(mq, ms, b, b_s, counts, out_quant=FP8)
    return (ops.act_dequant(q, s, out_dtype=torch.float32), ops.weight_dequant(wq, ws, block_size=(64, 32)),
            y, g, gs, ops.dequant_bias(z, s[..., 0], bias, out_dtype=torch.float16), n, ns, n2, ns2, r, a, a_s,
            moe, gq, gs2, mq, ms, counts, masked.flatten(0, 1)[mrows.flatten() >= 0], mgq.flatten(0, 1)[:0], mgs)


# The custom ops `every_op` calls, in order: all of them.
EVERY_CALL = ["act_quant", "weight_quant", "weight_quant", "scaled_mm", "scaled_mm_quant", "quantized_gelu",
              "quant_linear", "rms_norm_quant", "rms_norm_quant_residual", "silu_mul_quant", "moe_permute",
              "grouped_mm", "moe_unpermute", "grouped_mm_quant", "moe_permute_masked", "grouped_mm_masked",
              "grouped_mm_masked_quant", "act_dequant", "weight_dequant", "dequant_bias"]


def operands(gen, m: int) -> tuple:
    return randn((m, 160), gen=gen), randn((48, 160), gen=gen), randn((48,), gen=gen)


def same(got, expected) -> bool:
    """Equal bit for bit, with equal dtypes and shapes."""
    return len(got) == len(expected) and all(
        a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b) for a, b in zip(got, expected))


def test_every_op_is_its_custom_op_and_m_stays_dynamic(gen, fullgraph):
    assert set(EVERY_CALL) == set(CUSTOM_OPS)  # a new op joins `every_op`
    recorder = Recorder()
    fn = fullgraph(every_op, recorder)
    for m in (3, 17, 64):
        args = operands(gen, m)
        if m == 3:
            torch._dynamo.mark_dynamic(args[0], 0)
        assert same(fn(*args), every_op(*args)), m
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    assert recorder.names() == EVERY_CALL
    act_quant = recorder.calls()[0]
    # The priority tuple as the schema's comma-joined string, "auto" as the CPU's format.
    assert act_quant.kwargs["backend"] == "torch," and act_quant.kwargs["dtype"] == FP8


@pytest.mark.parametrize("options,match", [
    (dict(eps=-1.0), "eps must be a finite number > 0"),
    (dict(eps=1e-50), r"eps=1e-50 .* gives a scale"),
    (dict(out_scale_fmt="e5m2"), "scale_fmt must be one of"),
    (dict(out_group_size=0), "out_group_size must be an int from 1"),
    (dict(out_quant=FP8, out_dtype=torch.int32), "out_dtype must be one of"),
])
def test_options_the_schema_omits_are_validated(gen, fullgraph, options, match):
    """scaled_mm's float custom op takes no re-quantization option, its re-quantizing one no out_dtype; a
    traced call validates them all the same, with the eager call's error (TorchDynamo wraps it)."""
    x, w, _ = operands(gen, 4)
    q, s = ops.act_quant(x)
    wq, ws = ops.weight_quant(w)
    with pytest.raises(InvalidInputError, match=match):
        ops.scaled_mm(q, s, wq, ws, **options)
    with pytest.raises(Exception) as raised:
        fullgraph(lambda *args: ops.scaled_mm(*args, **options), "aot_eager")(q, s, wq, ws)
    chain = [raised.value]
    while chain[-1].__cause__ is not None or chain[-1].__context__ is not None:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    assert any(isinstance(e, InvalidInputError) and re.search(match, str(e)) for e in chain), chain


def test_valid_unused_options_compile(gen, fullgraph):
    x, w, _ = operands(gen, 4)
    q, s = ops.act_quant(x)
    wq, ws = ops.weight_quant(w)
    recorder = Recorder()
    got = fullgraph(lambda *a: ops.scaled_mm(*a, eps=0.5, out_scale_fmt="ue8m0"), recorder)(q, s, wq, ws)
    assert torch.equal(got, ops.scaled_mm(q, s, wq, ws)) and recorder.names() == ["scaled_mm"]


def test_every_op_under_inductor(gen, fullgraph):
    """Inductor keeps the custom ops as calls of their real kernels: the results are eager's, bit for bit."""
    recorder = Recorder("inductor")
    fn = fullgraph(every_op, recorder)
    for m in (5, 33):
        args = operands(gen, m)
        if m == 5:
            torch._dynamo.mark_dynamic(args[0], 0)
        assert same(fn(*args), every_op(*args)), m
    assert recorder.names() == EVERY_CALL


class MLP(nn.Module):
    def __init__(self, gen):
        super().__init__()
        self.up, self.down = nn.Linear(160, 256), nn.Linear(256, 96)
        for p in self.parameters():
            p.data = randn(p.shape, gen=gen) * 0.05

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


def test_quantized_model_and_quant_linear(gen, fullgraph):
    model = quantize_model(MLP(gen), dtype=FP8, skip=()).to(torch.bfloat16)
    recorder = Recorder()
    fn = fullgraph(model, recorder)
    for m in (2, 9, 40):
        x = randn((2, m, 160), gen=gen, dtype=torch.bfloat16)
        if m == 2:
            torch._dynamo.mark_dynamic(x, 1)
        assert torch.equal(fn(x), model(x)), m
    assert recorder.names() == ["quant_linear", "quant_linear"]
    assert counters["stats"]["unique_graphs"] == 1


def test_tensor_parallel_layers_of_one_process(gen, fullgraph):
    mlp = MLP(gen)
    model = nn.Sequential(ColumnParallelQuantLinear.from_module(mlp.up, dtype=INT8), nn.GELU(),
                          RowParallelQuantLinear.from_module(mlp.down, dtype=INT8))
    recorder = Recorder()
    x = randn((7, 160), gen=gen)
    assert torch.equal(fullgraph(model, recorder)(x), model(x))
    assert recorder.names() == ["quant_linear", "quant_linear"]


def test_training_step(gen, fullgraph):
    """A float layer trained through a quantized one: AOTAutograd traces the custom op's gradient
    (docs/numerics.md) into the compiled backward, which gives eager's gradients."""
    def build():
        torch.manual_seed(0)
        head = nn.Linear(64, 160)
        layer = QuantLinear.from_linear(nn.Linear(160, 48), dtype=FP8, out_dtype=torch.float32)
        layer.bias.requires_grad_(True)
        return nn.Sequential(head, nn.SiLU(), layer)
    eager, compiled = build(), build()
    recorder = Recorder()
    step = fullgraph(compiled, recorder)
    x = randn((6, 64), gen=gen)
    for model, run in ((eager, eager), (compiled, step)):
        (run(x) ** 2).sum().backward()
    for (name, a), b in zip(eager.named_parameters(), compiled.parameters()):
        if a.requires_grad:
            assert torch.equal(a.grad, b.grad), name
    assert recorder.names() == ["quant_linear"]


class OpsModule(nn.Module):
    def forward(self, x, w, bias):
        return every_op(x, w, bias)


def test_non_strict_export_records_the_custom_ops(gen):
    """torch.export's non-strict mode runs the public functions on fake tensors: they call their custom ops."""
    args = operands(gen, 6)
    program = torch.export.export(OpsModule(), args, strict=False)
    names = [n.target._schema.name.split("::")[1] for n in program.graph.nodes
             if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
             and n.target.namespace == "quantcore"]
    assert names == EVERY_CALL
    assert same(program.module()(*args), every_op(*args))
