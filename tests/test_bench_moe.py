"""`quantcore bench --moe`: the routings, the floor's bytes, the bf16 experts the steps compare against, every
contender of a grouped GEMM row built and run (timing stubbed: the CPU has no CUDA events), and the run end to
end on the CPU at shapes shrunk 16× through the command line."""

from __future__ import annotations

import json

import pytest
import torch

from quantcore import registry
from quantcore.bench import moe, shapes
from quantcore.bench.run import Record
from quantcore.cli import main
from quantcore.nn import QuantExperts, quantize_model

GEN = torch.Generator


@pytest.mark.parametrize("routing", moe.ROUTINGS)
def test_a_routing_names_distinct_experts_per_token(routing):
    ids = moe.route(500, 32, 8, routing, GEN().manual_seed(0))
    assert ids.shape == (500, 8) and ids.dtype == torch.int32
    assert int(ids.min()) >= 0 and int(ids.max()) < 32
    assert all(len(set(row)) == 8 for row in ids.tolist())


def test_zipf_routing_sends_most_tokens_to_few_experts():
    counts = {r: torch.bincount(moe.route(2000, 64, 8, r, GEN().manual_seed(1)).flatten().long(), minlength=64)
              for r in moe.ROUTINGS}
    top8 = {r: int(c.sort(descending=True).values[:8].sum()) / (2000 * 8) for r, c in counts.items()}
    assert top8["uniform"] < 0.2 < 0.4 < top8["zipf"]  # 8 of 64 experts: 1/8 of the rows when uniform


def test_the_floor_counts_each_expert_hit_once():
    ids = torch.tensor([[0, 3], [3, 5], [0, 5]])
    n, k = 256, 384
    expected = 3 * (n * k + 4 * 2 * 3) + 6 * (k + 4 * 3) + 2 * 6 * n
    assert moe.floor_bytes(ids, n, k) == expected


def test_the_models_are_their_configs_and_shrink_to_whole_blocks():
    assert {n: (s.hidden, s.inter, s.experts, s.top_k) for n, s in shapes.MOE_MODELS.items()} == {
        "deepseek-v3": (7168, 2048, 256, 8), "qwen3-30b-a3b": (2048, 768, 128, 8)}
    small = shapes.MOE_MODELS["deepseek-v3"].scaled(16)
    assert (small.hidden, small.inter, small.experts, small.top_k) == (512, 128, 16, 8)


def test_the_bf16_experts_compute_the_routed_sum_and_quantize_into_quant_experts():
    gen = GEN().manual_seed(2)
    experts = moe.TorchExperts(6, 128, 128, gen)
    x = torch.randn(5, 128, generator=gen).bfloat16()
    ids = moe.route(5, 6, 2, "uniform", gen)
    w = torch.rand(5, 2, generator=gen)
    expected = torch.zeros(5, 128)
    for t in range(5):
        for j in range(2):
            e = int(ids[t, j])
            gate, up = (experts.gate_up_proj[e].float() @ x[t].float()).chunk(2)
            expected[t] += w[t, j] * (experts.down_proj[e].float() @ (torch.nn.functional.silu(gate) * up))
    got = experts(x, ids, w)
    assert got.dtype == torch.bfloat16
    assert ((got.float() - expected).norm() / expected.norm()) < 0.02  # bf16 operands and outputs
    block = torch.nn.Sequential(experts)
    quantize_model(block, dtype=torch.float8_e4m3fn)
    assert isinstance(block[0], QuantExperts) and block[0].activation == "silu"


def test_every_contender_of_a_grouped_gemm_row_is_built_and_runs(monkeypatch):
    """On the CPU every quantcore backend the registry compares that can run here does (Triton, on its
    interpreter), the masked layout at decode sizes, the dense GEMM and torch's bf16 grouped GEMM; what
    cannot run here keeps its reason as the note. Timing is stubbed (one call each)."""
    def run_once(entries, work, unit, ceiling):
        records = []
        for rec, fn in entries:
            if fn is not None:
                fn()
            records.append(Record(**rec, unit=unit, us=1.0 if fn is not None else None))
        return records

    monkeypatch.setattr(moe, "timed_records", run_once)
    monkeypatch.setattr(moe.baselines, "read_ceiling_us", lambda nbytes: 0.5)
    shape = shapes.MOE_MODELS["qwen3-30b-a3b"].scaled(16)
    b, b_s = moe.expert_codes(shape, "gate_up", torch.float8_e4m3fn, GEN().manual_seed(4))
    assert b.shape == (shape.experts, 2 * shape.inter, shape.hidden) and b_s.shape == (shape.experts, 2, 1)
    records = moe._grouped_records(shape, 4, "zipf", "fp8_e4m3", b, b_s, GEN().manual_seed(3))
    by_impl = {r.impl: r for r in records}
    ours = registry.compared("grouped_mm")
    for name in (*ours, *(f"masked:{b}" for b in registry.compared("grouped_mm_masked"))):
        assert by_impl[name].us == 1.0 or "cannot run" in by_impl[name].note, name
    assert by_impl["triton"].us == 1.0 and by_impl["masked:triton"].us == 1.0  # Triton's interpreter, here
    assert by_impl["dense-scaled_mm"].us == 1.0 and by_impl["torch._grouped_mm-bf16"].us == 1.0
    assert by_impl["cublas-blockwise-loop"].us is None and by_impl["cublas-blockwise-loop"].note
    assert by_impl[shapes.READ_CEILING].unit == "GB/s" and by_impl["triton"].fraction == 0.5
    assert all(r.shape == [4, 2 * shape.inter, shape.hidden, shape.experts, shape.top_k] for r in records)
    b, b_s = moe.expert_codes(shape, "down", torch.int8, GEN().manual_seed(4))
    int8 = moe._grouped_records(shape, 128, "uniform", "int8", b, b_s, GEN().manual_seed(3))
    assert not any(r.impl.startswith(("masked:", "torch._", "cublas")) or r.impl == shapes.READ_CEILING for r in int8)


def test_the_run_end_to_end_through_the_command_line(tmp_path, capsys):
    path = tmp_path / "moe.json"
    assert main(["bench", "--moe", "qwen3-30b-a3b", "--moe-scale", "16", "--moe-layers", "1", "--moe-batch", "1", "2",
                 "--moe-steps", "1", "--json", str(path)]) == 0
    printed = capsys.readouterr().out
    saved = moe.MoEResult.model_validate_json(path.read_text())
    assert saved.kind == "moe" and saved.records == []
    assert "grouped GEMM rows skipped: they are timed with CUDA events on a GPU" in saved.notes
    assert [(r.dtype, r.batch, r.mode) for r in saved.steps] == [
        (d, b, m) for d in ("bf16", "fp8_e4m3", "int8") for b in (1, 2) for m in ("eager", "graph")]
    eager = [r for r in saved.steps if r.mode == "eager"]
    assert all(r.step_us and r.weight_bytes for r in eager)
    fp8, bf16 = (next(r for r in eager if r.dtype == d and r.batch == 1) for d in ("fp8_e4m3", "bf16"))
    assert fp8.weight_bytes < bf16.weight_bytes  # the experts hit, as stored: 1-byte codes against bf16
    assert "| 1 | eager |" in printed
    assert main(["bench", "--from-json", str(path)]) == 0
    assert capsys.readouterr().out == printed
    assert main(["bench", "--moe", "--stacks-m", "1"]) == 2
    assert json.loads(path.read_text())["config"]["scale"] == 16


@pytest.mark.parametrize("bound, layout", [(0, "contiguous"), (10**6, "masked")])
def test_the_steps_run_the_layout_the_bound_names(monkeypatch, tmp_path, bound, layout):
    """`--moe-masked-max-rows` sets every quantized step's QuantExperts bound: one run, one layout."""
    seen = set()
    path = QuantExperts.path

    def recording(self, *args, **kwargs):
        chosen = path(self, *args, **kwargs)
        seen.add(chosen.layout)
        return chosen
    monkeypatch.setattr(QuantExperts, "path", recording)
    assert main(["bench", "--moe", "--moe-no-ops", "--moe-scale", "16", "--moe-layers", "1", "--moe-batch", "2",
                 "--moe-steps", "1", "--moe-masked-max-rows", str(bound), "--json", str(tmp_path / "m.json")]) == 0
    assert seen == {layout}
    saved = moe.MoEResult.model_validate_json((tmp_path / "m.json").read_text())
    assert saved.config.masked_max_rows == bound


@pytest.mark.filterwarnings("ignore::quantcore.NumericsWarning")  # what is selected is what this test judges
def test_a_saved_run_writes_the_grouped_gemms_ranking_by_routed_rows(tmp_path, monkeypatch, capsys):
    """`--write-priority` of a --moe run: quantcore's contiguous grouped GEMMs ranked per bucket of T·k routed rows
    (the bucket a `grouped_mm` call's query has), the masked layout and the baselines left out, every other entry of
    the GPU model's table kept; the selection then follows it. (The times are placeholders, not measurements.)"""
    from quantcore import capability
    from quantcore.definitions.query import GroupedGemmQuery
    from quantcore.registry import measured

    monkeypatch.setenv("QUANTCORE_DATA_DIR", str(tmp_path / "data"))
    gpu = capability.simulated_profile("sm90").model_copy(update={"name": "NVIDIA H100 80GB HBM3"})
    times = {1: {"triton": 10, "triton[gluon]": 30, "masked:triton": 5, "torch._grouped_mm-bf16": 1},
             512: {"triton": 100, "triton[gluon]": 120, "dense-scaled_mm": 50},
             4096: {"triton": 1200, "triton[gluon]": 800, "cublas-blockwise-loop": 100}}
    records = [Record(op="grouped_mm", fmt="fp8_e4m3", shape=[tokens, 4096, 7168, 256, 8], impl=impl, us=us,
                      unit="TFLOP/s") for tokens, by_impl in times.items() for impl, us in by_impl.items()]
    result = moe.MoEResult(device=gpu, date="2026-12-08", command="quantcore bench --moe", copy_gbps=3000.0,
                           config=moe.MoEConfig(), records=records)
    path = tmp_path / "moe.json"
    path.write_text(result.model_dump_json())
    shipped = measured.load(gpu.name)
    assert main(["bench", "--from-json", str(path), "--write-priority"]) == 0
    written = tmp_path / "data" / "priority" / "nvidia-h100-80gb-hbm3.json"
    assert f"wrote {written}\n" in capsys.readouterr().out
    table = measured.load(gpu.name)
    assert table.path == str(written)
    assert table.priority["grouped_mm/fp8_e4m3"] == {8: ("triton", "triton[gluon]"), 4096: ("triton", "triton[gluon]"),
                                                     16384: ("triton[gluon]", "triton")}
    assert {k: v for k, v in table.priority.items() if k != "grouped_mm/fp8_e4m3"} == shipped.priority

    def selected(rows):
        q = GroupedGemmQuery("grouped_mm", gpu, "fp8_e4m3", None, (128, 128), registry.m_bucket(rows),
                             nk=(4096, 7168), block_k=128, out_group=0, fused=False, experts=256)
        return registry.select(q).label

    assert [selected(rows) for rows in (8, 4096, 32768, 131072)] == ["triton", "triton", "triton[gluon]", "triton[gluon]"]
    assert main(["bench", "--e2e", "--write-priority"]) == 2  # the end-to-end run ranks no implementation
    assert "--write-priority" in capsys.readouterr().err
