"""The native launch path on the GPU (`quantcore.backends.native`): kept plans replayed in C++ compute
what their Python runs compute, bit for bit, for every op and backend at decode and larger sizes; the
custom ops' CUDA kernels replay kept plans without entering Python, and leave them to Python under a
simulation, for invalid input and while a graph is captured.

Run on a GPU machine: `python3 -m pytest -m gpu tests/gpu`.
"""

from __future__ import annotations

import pytest
import torch

import quantcore
from quantcore import definitions, ops, registry
from quantcore.runtime import dispatch, plans
from quantcore.runtime import native
from quantcore.definitions import BUILTIN


# One xdist worker runs these (the `native` group) and builds the extension once for the run (`_built`).
pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::quantcore.NumericsWarning"),
              pytest.mark.xdist_group("native")]

BACKENDS = ("triton", "cupy")


@pytest.fixture(scope="module", autouse=True)
def _built():
    """The extension built into the run's cache folder (empty at first, conftest's `quantcore_cache`) before the
    first test: `native.module()` alone starts a background build and answers None until it is done."""
    native.build()


@pytest.fixture(autouse=True)
def _fresh_plans():
    registry.clear_caches()
    yield
    registry.clear_caches()


def _bits(out):
    return [o.view(torch.uint8) if o.dtype == torch.float8_e4m3fn else o for o in (out if isinstance(out, tuple)
                                                                                    else (out,))]


def _calls(op, fmt, m, bias):
    """(op function, tensors, options) of each call to compare: the op's example and, for the GEMMs (grouped
    ones too), with a bf16 bias."""
    args, kwargs = op.example(fmt, device="cuda", m=m, n=576, k=1024)
    yield args, kwargs
    if "bias" in op.tensors and bias and len(args) <= op.tensors.index("bias"):
        rows = (args[2].shape[0],) if op.name.startswith("grouped_mm") else ()  # a grouped GEMM's bias: [E, N]
        yield args, {**kwargs, "bias": torch.randn(*rows, 576, device="cuda").to(torch.bfloat16)}


@pytest.mark.parametrize("m", [1, 300])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", BUILTIN, ids=lambda op: op.name)
def test_native_replays_compute_what_python_runs_compute(monkeypatch, op, backend, m):
    assert native.module() is not None, native.reason()
    for fmt in op.formats:
        for args, kwargs in _calls(op, fmt, m, bias=True):
            results = {}
            for mode in ("0", "1"):
                monkeypatch.setenv(native.NATIVE_ENV, mode)
                registry.clear_caches()
                results[mode] = [_bits(getattr(quantcore.ops, op.name)(*args, **kwargs, backend=backend)) for _ in range(3)]
                tensors = (*args, *(kwargs[t] for t in op.tensors[len(args):] if t in kwargs))
                options = {k: v for k, v in kwargs.items() if k not in op.tensors}
                plan = dispatch.kept(op.name, tensors + (None,) * (len(op.tensors) - len(tensors)), options, backend)
                replayed = type(plan.launch).__name__ == "Replay" and plan.launch.ready
                # At one row every op's plan is replayed natively; at 300 the tiled GEMMs, dense and grouped,
                # read through TMA descriptors made in Python and stay there.
                if mode == "1" and (m == 1 or op.name not in ("scaled_mm", "quant_linear", "grouped_mm",
                                                              "grouped_mm_masked")):
                    assert replayed, (op.name, fmt, backend, kwargs.keys())
                if mode == "0":
                    assert not replayed
            for python, replayed in zip(results["0"], results["1"]):
                assert all(torch.equal(a, b) for a, b in zip(python, replayed, strict=True))


def _custom_calls(backend):
    x = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
    q, s = ops.act_quant(x, backend="torch")
    w, ws = ops.weight_quant(torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16), backend="torch")
    bias = torch.randn(512, device="cuda", dtype=torch.bfloat16)
    qc = torch.ops.quantcore
    return {
        "act_quant": lambda: qc.act_quant(x, backend=backend),
        "act_quant m_major": lambda: qc.act_quant(x, scale_layout="m_major", backend=backend),
        "scaled_mm": lambda: qc.scaled_mm(q, s, w, ws, bias, backend=backend),
        "quant_linear": lambda: qc.quant_linear(x, w, ws, None, backend=backend),
        "quant_linear bias": lambda: qc.quant_linear(x, w, ws, bias, backend=backend),
        "act_dequant": lambda: qc.act_dequant(q, s, backend=backend),
    }


@pytest.mark.parametrize("backend", BACKENDS)
def test_custom_ops_replay_kept_plans_without_python(backend):
    """After a call has kept its plan, the same call of `torch.ops.quantcore` replays it in C++: with the
    dispatcher's Python plans dropped, it makes none again, and its results are the same bits; under a
    simulation the call runs in Python (a plan is kept again), as do calls with inputs requiring grad."""
    assert native.module() is not None, native.reason()
    for name, call in _custom_calls(backend).items():
        first = _bits(call())
        plans.plans.clear()
        for inference in (False, True):
            with torch.inference_mode(inference):
                assert all(torch.equal(a, b) for a, b in zip(first, _bits(call()), strict=True)), name
        assert not plans.plans, name
        with quantcore.simulate("sm_90"):
            assert all(torch.equal(a, b) for a, b in zip(first, _bits(call()), strict=True)), name
        assert plans.plans, name
        plans.plans.clear()
        registry.clear_caches()  # the registry's selections changed: the native kernels forget theirs
        call()
        assert plans.plans, name


def test_custom_ops_whose_plans_stay_python(monkeypatch):
    """Calls whose kept plan is a Python run (the tiled GEMM at 300 rows; any plan made with the path turned
    off after the extension was loaded) run through the Python kernels, call after call."""
    assert native.module() is not None, native.reason()
    w, ws = ops.weight_quant(torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16))
    for rows, mode in ((300, "1"), (1, "0")):
        monkeypatch.setenv(native.NATIVE_ENV, mode)
        registry.clear_caches()
        x = torch.randn(rows, 1024, device="cuda", dtype=torch.bfloat16)
        expected = ops.quant_linear(x, w, ws)
        for _ in range(3):
            assert torch.equal(torch.ops.quantcore.quant_linear(x, w, ws, None), expected)
        plan = dispatch.kept("quant_linear", (x, w, ws, None), {}, None)
        assert plan is not None and not native.replayed(plan.launch)


def test_custom_ops_raise_the_python_errors_and_record_gradients():
    assert native.module() is not None, native.reason()
    x = torch.randn(2, 1024, device="cuda", dtype=torch.bfloat16)
    w, ws = ops.weight_quant(torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(quantcore.InvalidInputError, match="group_size"):
        torch.ops.quantcore.act_quant(x, group_size=0)
    xg = x.clone().requires_grad_(True)
    out = torch.ops.quantcore.quant_linear(xg, w, ws, None)
    assert out.requires_grad
    out.float().sum().backward()
    assert xg.grad is not None and xg.grad.shape == x.shape
    assert torch.equal(out.detach(), torch.ops.quantcore.quant_linear(x, w, ws, None))


@pytest.mark.parametrize("backend", BACKENDS)
def test_native_replays_and_custom_ops_in_a_cuda_graph(backend):
    """Captured native replays and custom-op calls follow their inputs on replay (an `eagerly` run captures
    its Python composition)."""
    x = torch.randn(4, 4096, device="cuda", dtype=torch.bfloat16)
    w, ws = ops.weight_quant(torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16))
    calls = [lambda: ops.quant_linear(x, w, ws, backend=backend),
             lambda: torch.ops.quantcore.quant_linear(x, w, ws, None, backend=backend),
             lambda: ops.act_quant(x, backend=backend)[0]]
    for call in calls:
        for _ in range(3):
            call()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = call()
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(_bits(out)[0], _bits(call())[0])


def test_every_op_has_a_custom_op_with_a_native_kernel():
    assert native.module() is not None, native.reason()
    for op in definitions.all_ops():
        for custom in op.custom_ops:
            name = f"quantcore::{custom.name}"
            assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "CUDA"), name
            assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "AutogradCUDA"), name


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
@pytest.mark.parametrize("backend", BACKENDS)
def test_native_replays_on_a_device_that_is_not_the_current_one(monkeypatch, backend):
    """With GPU 0 current, calls on GPU 1 allocate and launch on GPU 1 (the replay's device guard), natively
    as in Python, through `quantcore.ops` and `torch.ops.quantcore`, and leave GPU 0 current."""
    assert native.module() is not None, native.reason()
    torch.cuda.set_device(0)
    x = torch.randn(1, 1024, device="cuda:1", dtype=torch.bfloat16)
    w, ws = ops.weight_quant(torch.randn(512, 1024, device="cuda:1", dtype=torch.bfloat16), backend="torch")
    calls = [lambda: ops.act_quant(x, backend=backend), lambda: ops.quant_linear(x, w, ws, backend=backend),
             lambda: torch.ops.quantcore.quant_linear(x, w, ws, None, backend=backend)]
    results = {}
    for mode in ("0", "1"):
        monkeypatch.setenv(native.NATIVE_ENV, mode)
        registry.clear_caches()
        results[mode] = [[_bits(call()) for _ in range(3)] for call in calls]
        assert torch.cuda.current_device() == 0
    for python, replayed in zip(results["0"], results["1"]):
        for a, b in zip(python, replayed):
            assert all(t.device == torch.device("cuda:1") for t in b)
            assert all(torch.equal(p, r) for p, r in zip(a, b, strict=True))
    plan = dispatch.kept("act_quant", (x,), {}, backend)
    assert type(plan.launch).__name__ == "Replay" and plan.launch.ready
