"""quantcore under torch.compile's CUDA-graph trees (`mode="reduce-overhead"`): every op, a QuantLinear and
a quantize_model-ed MLP at decode and prefill sizes give eager's bits, and nothing that quantcore keeps
(plans prepared during a graph's warm-up, their output templates, split-K workspaces) stays in a graph's
private pool, which the trees refuse ("Detected N tensor(s) in the cudagraph pool not tracked as outputs").

Run on a GPU machine: `python3 -m pytest -m gpu tests/gpu/test_compile_gpu.py`.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch._inductor.config
import torch._inductor.cudagraph_trees
from torch import nn

from quantcore import ops, registry
from quantcore.definitions import BUILTIN
from quantcore.nn import QuantLinear, quantize_model
from quantcore.runtime import workspace

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::quantcore.NumericsWarning")]

DECODE_AND_PREFILL = (1, 4, 64, 512)


@pytest.fixture
def fresh():
    """No kept plan, template anchor or workspace yet, so the graphs' warm-ups make them; the trees check
    their pools after every warm-up and recording (torch's default, set here in case it changes)."""
    def reset():
        torch._dynamo.reset()
        torch._inductor.cudagraph_trees.reset_cudagraph_trees()
        registry.clear_caches()
        workspace.retire()
    reset()
    with torch._inductor.config.patch({"triton.slow_path_cudagraph_asserts": True}):
        yield reset
    reset()


def _bits(out):
    return [o.view(torch.uint8) if o.dtype == torch.float8_e4m3fn else o for o in (out if isinstance(out, tuple)
                                                                                    else (out,))]


def _equal(a, b) -> bool:
    a, b = _bits(a), _bits(b)
    return len(a) == len(b) and all(x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y)
                                    for x, y in zip(a, b))


def _overhead(fn):
    return torch.compile(fn, mode="reduce-overhead", fullgraph=True)


@pytest.mark.parametrize("op", BUILTIN, ids=lambda op: op.name)
def test_every_op_in_a_cuda_graph_tree(fresh, op):
    """Each op, each format, at decode and larger M (a graph each): warm-up, recording and replays on fresh
    inputs equal eager bit for bit."""
    function = getattr(ops, op.name)
    for fmt in op.formats:
        compiled = {}  # one compiled function per set of options: some examples' options follow M (max_m)
        for m in (1, 64, 300):
            args, kwargs = op.example(fmt, device="cuda", m=m, n=576, k=7168)
            # Other values, as valid: float data flipped; integer routing data (expert offsets, ids) kept,
            # since a flipped offsets vector is no longer sorted.
            other = tuple(t.flip(0).contiguous() if t is not None and t.is_floating_point() else t for t in args)
            calls = [(args, kwargs), (other, kwargs)]
            key = repr(sorted(kwargs.items()))
            if key not in compiled:
                compiled[key] = _overhead(lambda *args, kwargs=kwargs: function(*args, **kwargs))
            for step in range(4):
                args, kwargs = calls[step % 2]
                got = compiled[key](*args)
                got = tuple(t.clone() for t in got) if isinstance(got, tuple) else got.clone()  # replays overwrite
                assert _equal(got, function(*args, **kwargs)), (fmt, m, step)
        fresh()


class MLP(nn.Module):
    """Two linears (gate-free, as the issue's): ReLU between them is exact in every implementation, so a
    compiled MLP must equal the eager one bit for bit."""

    def __init__(self, k: int, hidden: int, n: int):
        super().__init__()
        self.up, self.down = nn.Linear(k, hidden), nn.Linear(hidden, n)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def _models():
    torch.manual_seed(0)
    layer = QuantLinear.from_linear(nn.Linear(7168, 2112, device="cuda"), dtype="auto").to(torch.bfloat16)
    mlp = quantize_model(MLP(4096, 4096, 4096).cuda(), skip=()).to(torch.bfloat16)
    return {"QuantLinear": layer, "MLP": mlp}


@pytest.mark.parametrize("native", ["1", "0"])
@pytest.mark.parametrize("name", ["QuantLinear", "MLP"])
def test_quantized_models_in_a_cuda_graph_tree(fresh, monkeypatch, name, native):
    """Decode sizes and a prefill one, each its own graph (warm-up, recording, replays): eager's bits."""
    monkeypatch.setenv("QUANTCORE_NATIVE", native)
    model = _models()[name]
    compiled = _overhead(model)
    k = model.in_features if isinstance(model, QuantLinear) else model.up.in_features
    for m in DECODE_AND_PREFILL:
        for step in range(3):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            got = compiled(x).clone()
            assert torch.equal(got, model(x)), (m, step)


def test_trees_reset_and_compile_again(fresh):
    """After the trees are reset (their pools freed), a new compile of the same model warms up and
    records again: quantcore kept nothing of the old pools that the new graphs would trip on."""
    model = _models()["MLP"]
    x = torch.randn(4, 4096, device="cuda", dtype=torch.bfloat16)
    expected = model(x)
    for _ in range(2):
        compiled = _overhead(model)
        for _ in range(3):
            assert torch.equal(compiled(x).clone(), expected)
        torch._dynamo.reset()
        torch._inductor.cudagraph_trees.reset_cudagraph_trees()


@pytest.mark.parametrize("op", BUILTIN, ids=lambda op: op.name)
def test_plans_prepared_while_allocating_to_a_pool_leave_nothing_in_it(fresh, op):
    """The rule itself, without torch.compile: an op whose plan is prepared (template anchor and split-K
    workspace included) while this thread's allocations go to a private pool, as during a tree's
    warm-up, leaves no allocation in the pool once its outputs are gone. On a side stream, as the trees
    warm up, so that a pool routed by stream rather than by thread (older torch) is tested alike."""
    device = torch.cuda.current_device()
    for m in (1, 64):
        for fmt in op.formats:
            args, kwargs = op.example(fmt, device="cuda", m=m, n=2112, k=7168)
            pool = torch.cuda.MemPool()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream), torch.cuda.use_mem_pool(pool):
                out = getattr(ops, op.name)(*args, **kwargs)
            torch.cuda.synchronize()
            del out
            assert torch._C._cuda_checkPoolLiveAllocations(device, pool.id, set()), (op.name, fmt, m)
            registry.clear_caches()
            workspace.retire()

