"""Host-clock timing of the bench (runs on the CPU: the synchronize is skipped there)."""

from __future__ import annotations

import time

from quantcore.bench import timing


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
