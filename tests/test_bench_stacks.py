"""`quantcore bench --stacks`: the shape table against the models' configs, and the run end to end on
the CPU at shapes shrunk 64× (CUDA graphs are skipped there)."""

from __future__ import annotations

import math

import pytest

from quantcore.bench import stack_run, stacks
from quantcore.cli import main

# The shapes as the models' config.json files give them, worked out by hand: (name, in_features, out_features).
EXPECTED = {
    "llama-3-8b": [("qkv", 4096, 4096 + 2 * 8 * 128), ("o", 4096, 4096), ("gate_up", 4096, 2 * 14336),
                   ("down", 14336, 4096)],
    "qwen3-8b": [("qkv", 4096, 6144), ("o", 4096, 4096), ("gate_up", 4096, 24576), ("down", 12288, 4096)],
    "qwen3-14b": [("qkv", 5120, 40 * 128 + 2 * 8 * 128), ("o", 5120, 5120), ("gate_up", 5120, 34816),
                  ("down", 17408, 5120)],
    "deepseek-v3-mlp": [("gate_up", 7168, 2 * 18432), ("down", 18432, 7168)],
    "deepseek-v3-mla": [("q_a", 7168, 1536), ("q_b", 1536, 128 * (128 + 64)), ("kv_a", 7168, 512 + 64),
                        ("kv_b", 512, 128 * (128 + 128)), ("o", 128 * 128, 7168)],
}
SCALE, LAYERS, MS, GBPS = 64, 2, [1, 16], 10.0
TINY = stack_run.StacksConfig(stacks=["llama-3-8b", "deepseek-v3-mla"], layers=LAYERS, ms=MS, tokens=1, warmup=1,
                              scale=SCALE)


def test_the_stacks_are_the_models_layers():
    assert {name: [(lin.name, lin.in_features, lin.out_features) for lin in s.linears]
            for name, s in stacks.STACKS.items()} == EXPECTED
    assert EXPECTED["llama-3-8b"][0][2] == 6144 and EXPECTED["qwen3-14b"][0][2] == 7168  # the numbers
    llama = stacks.LLAMA_3_8B
    assert llama["hidden_size"] == llama["num_attention_heads"] * llama["head_dim"]  # Llama's config implies head_dim
    for name in ("llama-3-8b", "qwen3-8b", "qwen3-14b"):  # attention and MLP map hidden to hidden; down reads half
        qkv, o, gate_up, down = stacks.STACKS[name].linears
        assert o.out_features == gate_up.in_features == down.out_features == qkv.in_features
        assert gate_up.out_features == 2 * down.in_features


def test_scaled_stacks_round_up():
    kv_a = stacks.STACKS["deepseek-v3-mla"].scaled(SCALE).linears[2]
    assert (kv_a.in_features, kv_a.out_features) == (7168 // 64, math.ceil(576 / 64))


@pytest.fixture(scope="module")
def result():
    return stack_run.run_stacks(TINY, device="cpu", copy_gbps=GBPS)


def test_every_stack_m_format_and_mode_has_a_row(result):
    assert [run.name for run in result.stacks] == TINY.stacks
    for run in result.stacks:
        assert run.linears == [(n, math.ceil(i / SCALE), math.ceil(o / SCALE)) for n, i, o in EXPECTED[run.name]]
        assert [(r.dtype, r.batch, r.mode) for r in run.rows] == [
            (d, m, mode) for d in ("bf16", "fp8_e4m3", "int8") for m in MS for mode in ("eager", "graph")]
    assert "CUDA graphs skipped: the device is not a CUDA GPU" in result.notes


def test_rows_carry_the_floor_and_its_fraction(result):
    for run in result.stacks:
        shapes = [(i, o) for _, i, o in run.linears] * LAYERS
        bf16_weights = sum(2 * i * o for i, o in shapes)
        quantized = sum(i * o + 4 * math.ceil(o / 128) * math.ceil(i / 128) for i, o in shapes)  # codes, fp32 scales
        eager_bf16 = {r.batch: r for r in run.rows if r.dtype == "bf16" and r.mode == "eager"}
        for r in run.rows:
            assert r.weight_bytes == (bf16_weights if r.dtype == "bf16" else quantized)
            assert r.activation_bytes == sum(2 * r.batch * (i + o) for i, o in shapes) and r.cache_bytes == 0
            assert r.floor_us == pytest.approx((r.weight_bytes + r.activation_bytes) / GBPS / 1e3)
            if r.mode == "graph":
                assert r.step_us is None and r.floor_fraction is None and "CUDA graphs need" in r.note
                continue
            assert r.note == "" and r.step_us > 0
            assert r.floor_fraction == pytest.approx(r.floor_us / r.step_us)
            assert r.vs_bf16 == pytest.approx(eager_bf16[r.batch].step_us / r.step_us)


def test_saved_result_reads_back_and_renders(result):
    again = stack_run.StacksResult.model_validate_json(result.model_dump_json())
    assert again == result
    text = stack_run.render(again)
    assert ("**llama-3-8b** (meta-llama/Meta-Llama-3-8B): 2 × (qkv 64→96, o 64→64, gate_up 64→448, down 224→64); "
            "weights MB: bf16 0.2") in text
    assert "kv_a 112→9" in text and "Every size divided by 64" in text
    r = next(r for r in result.stacks[1].rows if (r.dtype, r.batch, r.mode) == ("int8", 16, "eager"))
    assert f"| {r.floor_us:.1f} | {r.floor_fraction:.2f} | {r.vs_bf16:.2f} |" in text
    assert text.count("| 16 | graph | — |") == 2 and "| skipped: CUDA graphs need a CUDA device |" in text


def test_cli_runs_saves_reprints_and_refuses_other_runs_options(tmp_path, capsys):
    path = tmp_path / "stacks.json"
    args = ["bench", "--stacks", "deepseek-v3-mlp", "--stacks-scale", "64", "--stacks-m", "16", "--stacks-layers", "1",
            "--stacks-tokens", "1"]
    assert main([*args, "--json", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "**deepseek-v3-mlp**" in printed and "| 16 | eager |" in printed and '"kind": "stacks"' in path.read_text()
    assert main(["bench", "--from-json", str(path)]) == 0
    assert capsys.readouterr().out == printed
    for wrong, message in ((["--stacks", "--e2e-dim", "8"], "--e2e-dim: options of --e2e, not of a --stacks run"),
                           (["--stacks", "--quick"], "--quick: options of the op bench"),
                           (["--e2e", "--stacks-m", "1"], "--stacks-m: options of --stacks, not of an end-to-end run"),
                           (["--stacks-scale", "2"], "--stacks-scale: options of --stacks, not of the op bench"),
                           (["--e2e", "--stacks"], "--e2e and --stacks are separate runs"),
                           (["--e2e", "--from-json", str(path)], "holds no --e2e run")):
        assert main(["bench", *wrong]) == 2
        assert message in capsys.readouterr().err
