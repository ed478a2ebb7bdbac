"""Several threads, each on its own CUDA stream, calling act_quant, scaled_mm and quant_linear on their own
inputs at once: each gets what one thread alone gets (docs/runtime.md, "Threads and streams").

Decode-sized GEMMs split K through one workspace per device (runtime/workspace.py), which concurrent
streams would share: these tests switch it off (QUANTCORE_SHARED_WORKSPACE=0), as such a program must,
and compare with one thread under the same switch. Shapes from 1 to 4096 rows reach the decode kernels
(Triton's, CuPy's, the one-launch quantized linear), the tiled GEMMs, the Gluon GEMM and cuBLAS.

Run on a GPU machine: `python3 -m pytest -m gpu tests/gpu/test_threads_gpu.py`.
"""

from __future__ import annotations

import threading

import pytest
import torch

from quantcore import ops, registry
from quantcore.runtime import workspace

pytestmark = pytest.mark.gpu

THREADS = 4
ROUNDS = 20
SHAPES = [(1, 2112, 7168), (16, 7168, 2048), (64, 4096, 7168), (300, 1536, 7168), (4096, 4096, 7168)]


@pytest.fixture
def unshared(monkeypatch):
    """No launch takes the shared split-K workspace; plans kept before are made again under the switch."""
    monkeypatch.setenv(workspace.SHARED_ENV, "0")
    registry.reset()
    yield
    registry.reset()


def _inputs(seed, m, n, k, qdtype, device):
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(m, k, generator=gen, device=device, dtype=torch.bfloat16)
    w = torch.randn(n, k, generator=gen, device=device) * k ** -0.5
    return x, ops.weight_quant(w, dtype=qdtype, backend="torch")


def _calls(x, wq, ws, backend):
    """The ops each thread runs, as flat lists of tensors (codes as bytes)."""
    def act_quant():
        return ops.act_quant(x, dtype=wq.dtype, backend=backend)

    def scaled_mm():
        return (ops.scaled_mm(*ops.act_quant(x, dtype=wq.dtype, backend=backend), wq, ws, backend=backend),)

    def quant_linear():
        return (ops.quant_linear(x, wq, ws, backend=backend),)
    return [act_quant, scaled_mm, quant_linear]


def _bytes(out):
    return [t.view(torch.uint8) if t.element_size() == 1 else t for t in out]


@pytest.mark.parametrize("backend", [None, "triton", "cupy"])
@pytest.mark.parametrize("qdtype", [torch.float8_e4m3fn, torch.int8])
@pytest.mark.parametrize("mnk", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_threads_on_their_own_streams_get_what_one_thread_gets(unshared, backend, qdtype, mnk):
    device = torch.device("cuda", torch.cuda.current_device())
    inputs = [_inputs(seed, *mnk, qdtype, device) for seed in range(THREADS)]
    expected = [[_bytes(call()) for call in _calls(x, wq, ws, backend)] for x, (wq, ws) in inputs]
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream(device) for _ in range(THREADS)]
    got: dict[int, list] = {}
    errors: list = []
    start = threading.Barrier(THREADS)

    def worker(i):
        try:
            x, (wq, ws) = inputs[i]
            calls = _calls(x, wq, ws, backend)
            streams[i].wait_stream(torch.cuda.current_stream(device))  # the inputs, made on the default stream
            with torch.cuda.stream(streams[i]):
                start.wait()
                got[i] = [[_bytes(call()) for call in calls] for _ in range(ROUNDS)]
            streams[i].synchronize()
        except Exception as err:  # reported below, with the thread
            errors.append((i, err))

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors
    for i in range(THREADS):
        for r, outputs in enumerate(got[i]):
            for op, out, ref in zip(("act_quant", "scaled_mm", "quant_linear"), outputs, expected[i], strict=True):
                assert all(torch.equal(a, b) for a, b in zip(out, ref, strict=True)), (i, r, op)
