"""`python -m quantcore.bench.generate` on the CPU at small sizes: the eager rows of bf16 and FP8 weights (the
compiled ones run on a GPU), their JSON, and how agreement with the eager tokens is counted."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from quantcore.bench import generate  # noqa: E402


def test_agreement_counts_the_new_tokens_before_the_first_that_differs():
    eager = torch.tensor([[7, 1, 2, 3, 4], [7, 5, 6, 7, 8]])
    later = eager.clone()
    later[1, 3] = 0  # the second sequence parts at its third new token
    assert generate._agreeing(eager, eager, 4) == 4
    assert generate._agreeing(later, eager, 4) == 2
    later[0, 1] = 9
    assert generate._agreeing(later, eager, 4) == 0


def test_eager_rows_on_the_cpu(tmp_path, capsys):
    out = tmp_path / "generate.json"
    assert generate.main(["--hidden", "64", "--intermediate", "128", "--layers", "1", "--heads", "2", "--kv-heads",
                          "1", "--vocab", "128", "--prompt", "4", "--new", "3", "--reps", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["weights"], r["mode"]) for r in rows] == [("bf16", "eager"), ("fp8", "eager")]
    assert all(r["tokens_per_s"] > 0 and r["tokens_agreeing"] == r["new_tokens"] == 3 for r in rows)
    assert "| fp8 | eager |" in capsys.readouterr().out
