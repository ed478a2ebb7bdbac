"""`quantcore bench --stacks` on a real GPU at shrunk shapes: every row, graph ones included, is timed
and has its floor fraction (speed itself is never asserted here)."""

from __future__ import annotations

import pytest

from quantcore.bench import stack_run

pytestmark = pytest.mark.gpu


def test_every_row_is_timed_eager_and_replayed_from_a_graph():
    cfg = stack_run.StacksConfig(stacks=["llama-3-8b", "deepseek-v3-mla"], layers=2, ms=[1, 16], tokens=2, warmup=1,
                                 scale=8)  # every size a multiple of 8 (kv_a: 576 → 72), as real shapes are
    result = stack_run.run_stacks(cfg, device="cuda")
    assert result.copy_gbps and not result.notes
    for run in result.stacks:
        assert len(run.rows) == 3 * 2 * 2  # formats × M × modes
        for r in run.rows:
            assert r.note == "" and r.step_us > 0 and r.floor_fraction > 0, r
            assert r.vs_bf16 > 0
