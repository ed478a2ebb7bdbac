"""Several threads calling the ops at once (on the CPU, the torch backend: the Triton interpreter is not
thread-safe); and the switch that keeps concurrent streams of a GPU off the shared split-K workspace
(tests/gpu/test_threads_gpu.py runs them on streams)."""

from __future__ import annotations

import threading

import torch

from helpers import randn
from quantcore import ops
from quantcore.runtime import workspace


def _work(seed: int):
    """Each thread's own calls: shapes of its own and shapes every thread shares (the same kept plans)."""
    gen = torch.Generator().manual_seed(seed)
    x, w = randn((1 + seed % 3, 256), gen=gen), randn((96, 256), gen=gen)
    wq, ws = ops.weight_quant(w, dtype=torch.int8, block_size=(32, 128), backend="torch")
    calls = [lambda: ops.act_quant(x, dtype=torch.int8, backend="torch"),
             lambda: ops.scaled_mm(*ops.act_quant(x, dtype=torch.int8, backend="torch"), wq, ws, block_size=(32, 128),
                                   backend="torch"),
             lambda: ops.quant_linear(x, wq, ws, block_size=(32, 128), out_dtype=torch.float32, backend="torch")]
    return calls


def _flat(out):
    return [t.view(torch.uint8) if t.element_size() == 1 else t for t in (out if isinstance(out, tuple) else (out,))]


def test_threads_calling_the_same_ops_get_what_one_thread_gets():
    threads = 6
    expected = {seed: [_flat(call()) for call in _work(seed)] for seed in range(threads)}
    got, errors, start = {}, [], threading.Barrier(threads)

    def worker(seed):
        try:
            calls = _work(seed)
            start.wait()
            got[seed] = [[_flat(call()) for call in calls] for _ in range(10)]
        except Exception as err:  # reported below, with the thread's seed
            errors.append((seed, err))

    pool = [threading.Thread(target=worker, args=(seed,)) for seed in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors
    for seed, rounds in got.items():
        for outputs in rounds:
            for out, ref in zip(outputs, expected[seed], strict=True):
                assert all(torch.equal(a, b) for a, b in zip(out, ref, strict=True)), seed


def test_the_shared_workspace_can_be_switched_off(monkeypatch):
    device = torch.device("cpu")
    assert workspace.buffers(device, 64, 4) is not None
    monkeypatch.setenv(workspace.SHARED_ENV, "0")
    assert workspace.buffers(device, 64, 4) is None
    assert workspace.once_buffers(device, 64, 4, 2, 256, 128) is None


def test_threads_sharing_a_layer_each_get_their_own_shapes_result():
    """One QuantLinear called from several threads with inputs of different shapes: its call site's kept plan
    is replaced by each, and no thread may take another's plan for its own input (switches between
    threads forced often, where the race would be)."""
    import sys

    from quantcore.nn import QuantLinear

    layer = QuantLinear.from_linear(torch.nn.Linear(256, 64), dtype=torch.int8)
    inputs = [randn((1 + i, 256), gen=torch.Generator().manual_seed(i)) for i in range(4)]
    with torch.no_grad():
        expected = [layer(x) for x in inputs]
        got, errors, start = {i: [] for i in range(4)}, [], threading.Barrier(4)

        def worker(i):
            try:
                start.wait()
                for _ in range(100):
                    got[i].append(layer(inputs[i]))
            except Exception as err:  # reported below, with the thread
                errors.append((i, err))

        interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)
        try:
            pool = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
            for t in pool:
                t.start()
            for t in pool:
                t.join()
        finally:
            sys.setswitchinterval(interval)
    assert not errors
    assert all(torch.equal(y, expected[i]) for i, ys in got.items() for y in ys)
