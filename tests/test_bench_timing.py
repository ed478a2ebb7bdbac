"""Host-clock timing of the bench (runs on the CPU: the synchronize is skipped there)."""

from __future__ import annotations

import time

import torch

from quantcore import definitions
from quantcore.backends import torch as reference
from quantcore.bench import baselines, timing


def test_eager_time_is_the_time_per_call_of_a_back_to_back_loop():
    calls = []

    def fn():
        calls.append(None)
        time.sleep(1e-4)

    # A budget far above 30 calls' time: on a loaded machine one 100 µs sleep can take past the
    # default budget / n (3.3 ms), and fewer calls would be made.
    us = timing.eager_time_us(fn, n=30, warmup=5, budget_s=10.0)
    assert 100 <= us < 5000, us  # each call sleeps 100 µs
    assert len(calls) == 1 + 5 + 30  # the probe, the warm-up, the timed loop


def test_eager_time_makes_fewer_calls_when_one_is_long():
    calls = []

    def slow():
        calls.append(None)
        time.sleep(0.02)

    us = timing.eager_time_us(slow, n=200, warmup=20, budget_s=0.1)
    assert us >= 20_000
    assert len(calls) <= 1 + 2 * 5  # about budget_s / 20 ms calls, warm-up capped alike


def test_eager_times_interleave_the_fns_in_rotating_order(monkeypatch):
    def sleeper(seconds):
        return lambda: time.sleep(seconds)

    a, b = sleeper(1e-4), sleeper(2e-3)
    us = timing.eager_times_us([a, b], rounds=3, budget_s=30.0)
    assert 100 <= us[0] < 2000 <= us[1], us  # each fn's own time per call, in the order given

    order, measured = [], {a: [5.0, 1.0, 3.0], b: [7.0, 9.0, 8.0]}
    monkeypatch.setattr(timing, "eager_time_us", lambda fn, **_: (order.append(fn), measured[fn].pop(0))[1])
    assert timing.eager_times_us([a, b], rounds=3) == [3.0, 8.0]  # the median round of each
    assert order == [a, b, b, a, a, b]  # round 2 starts from b, round 3 from a again


def test_bench_times_the_others_when_one_implementation_fails(monkeypatch):
    import importlib

    bench_run = importlib.import_module("quantcore.bench.run")  # the module, not the function of that name
    calls = []

    def fails():
        raise RuntimeError("CUDA error: out of memory")

    def fake_gpu_times(fns, **_):  # the CPU machine has no CUDA events: host time stands in
        return [timing.loop_us(fn, 3) for fn in fns]

    monkeypatch.setattr(timing, "gpu_times_us", fake_gpu_times)
    monkeypatch.setattr(timing, "gpu_time_us", lambda fn, **_: fake_gpu_times([fn])[0])
    times = bench_run.time_interleaved([lambda: calls.append("a"), None, fails])
    assert isinstance(times[0], tuple) and times[0][0] >= 0 and times[0][1] >= 0
    assert times[1] is None
    assert isinstance(times[2], RuntimeError)
    records = bench_run.timed_records([(dict(op="act_quant", fmt="int8", shape=[1, 128], impl="x"), lambda: None),
                                       (dict(op="act_quant", fmt="int8", shape=[1, 128], impl="y"), fails)],
                                      1e6, "GB/s", 1000.0)
    assert records[0].us is not None and records[0].fraction == records[0].rate / 1000.0
    assert records[1].us is None and records[1].note == "RuntimeError: CUDA error: out of memory"


def test_compiled_references_keep_their_graphs_apart():
    """Each op's compiled reference keeps its own graphs: compiled through the shared `torch.no_grad`
    wrapper, the ops' graphs filled one cache of eight and later calls ran the reference eagerly."""
    torch._dynamo.reset()
    for qdtype in (torch.float8_e4m3fn, torch.int8):
        for m, k in ((1, 256), (16, 256), (16, 384)):
            x = torch.randn(m, k, dtype=torch.bfloat16)
            codes, scales = torch.zeros(m, k, dtype=qdtype), torch.rand(m, k // 128)
            for op, args, options in (("act_quant", (x,), {"dtype": qdtype}), ("act_dequant", (codes, scales), {}),
                                      ("quantized_gelu", (codes, scales), {})):
                kwargs = definitions.get(op).spec(*args, **options).kwargs
                got = baselines.compiled_call(op, kwargs, backend="eager")()  # raises at the recompile limit
                expected = getattr(reference, op)(**kwargs)
                for g, e in zip(*(r if isinstance(r, tuple) else (r,) for r in (got, expected))):
                    assert torch.equal(_bits(g), _bits(e)), (op, qdtype, m, k)


def _bits(t):
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t
