"""`quantcore bench --e2e` end to end on the CPU at a tiny size (CUDA graphs are skipped there)."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import quantcore.nn
from quantcore.bench import decoder, e2e, steps
from quantcore.cli import main

TINY = e2e.Config(dim=256, layers=1, batches=[1, 2], tokens=2, warmup=1, vocab=64, context=8)  # 2 heads of 128
D, H = 256, 1024
BF16_BYTES = 2 * (4 * D * D + D * H + H + H * D + D + 3 * D + 64 * D)  # linears, biases, norms, head
QUANTIZED_WEIGHTS = 4 * D * D + D * H + H * D  # elements: one byte each instead of two
SCALES = 4 * (2 * 2) + (8 * 2) + (2 * 8)  # one fp32 per 128×128 block of each quantized linear


@pytest.fixture(scope="module")
def result():
    return e2e.run_e2e(TINY, device="cpu", copy_gbps=10.0)


MODEL_ROWS = ("bf16", "fp8_e4m3", "int8", "fp8_e4m3+fused", "int8+fused")


def test_every_format_batch_and_mode_has_a_row(result):
    key = [(r.dtype, r.batch, r.mode) for r in result.model]
    assert key == [(d, b, m) for d in MODEL_ROWS for b in (1, 2) for m in ("eager", "graph")]
    assert [(r.dtype, r.batch, r.mode) for r in result.stack] == [
        (d, 1, m) for d in ("bf16", "fp8_e4m3", "int8") for m in ("eager", "graph")]
    assert result.device.kind == "cpu" and result.versions["torch"]


def test_eager_rows_are_measured_and_graph_rows_skipped_with_a_note(result):
    for r in result.model + result.stack:
        if r.mode == "graph":
            assert r.step_us is None and "CUDA graphs need a CUDA device" in r.note
            continue
        assert r.note == "" and math.isfinite(r.step_us) and r.step_us > 0
        assert r.tokens_per_s == pytest.approx(r.batch / r.step_us * 1e6)
        bf16 = next(b for b in result.model + result.stack if b.dtype == "bf16" and b.mode == "eager"
                    and b.batch == r.batch and (b in result.model) == (r in result.model))
        assert r.vs_bf16 == pytest.approx(bf16.step_us / r.step_us)


def test_bytes_and_floor(result):
    rows = {(r.dtype, r.batch, r.mode): r for r in result.model}
    assert rows[("bf16", 1, "eager")].weight_bytes == BF16_BYTES
    assert rows[("int8", 1, "eager")].weight_bytes == BF16_BYTES - QUANTIZED_WEIGHTS + 4 * SCALES
    assert rows[("int8+fused", 1, "eager")].weight_bytes == rows[("int8", 1, "eager")].weight_bytes
    for r in result.model:
        assert r.cache_bytes == 2 * TINY.layers * r.batch * TINY.context * TINY.dim * 2  # keys and values, bf16
        assert r.floor_us == pytest.approx((r.weight_bytes + r.cache_bytes) / 10.0 / 1e3)
    assert all(r.cache_bytes == 0 for r in result.stack)


def test_saved_result_reads_back_and_renders(result):
    again = e2e.E2EResult.model_validate_json(result.model_dump_json())
    assert again == result
    text = e2e.render(again)
    assert "| fp8_e4m3 | 2 | eager |" in text and "| int8 | 1 | graph |" in text
    assert "6 linears per step" in text and "4 of 256×256 (q, k, v, o), 256→1024 (up), 1024→256 (down)" in text
    assert "2 heads of 128" in text


def test_a_failing_configuration_is_recorded_not_raised(monkeypatch):
    quantize, step = quantcore.nn.quantize_model, decoder.decode_step

    def quantize_no_int8(model, *, dtype, **kwargs):
        if dtype is steps.DTYPES["int8"]:
            raise RuntimeError("int8 refused for the test")
        return quantize(model, dtype=dtype, **kwargs)

    def step_failing_at_batch_2(model, state):
        if state.tok.shape[0] == 2:
            raise RuntimeError("")  # an error without a message still makes a note
        return step(model, state)

    monkeypatch.setattr(quantcore.nn, "quantize_model", quantize_no_int8)
    monkeypatch.setattr(decoder, "decode_step", step_failing_at_batch_2)
    saved = []
    out = e2e.run_e2e(TINY, device="cpu", checkpoint=lambda partial: saved.append(len(partial.model + partial.stack)))
    assert saved == list(range(1, 27))  # the partial result after every row, failed ones included
    rows = {(r.dtype, r.batch, r.mode): r for r in out.model}
    assert all(r.note == "quantize_model: RuntimeError: int8 refused for the test" and r.step_us is None
               for r in out.model + out.stack if r.dtype.startswith("int8"))
    assert rows[("fp8_e4m3", 2, "eager")].note == "RuntimeError: " and rows[("fp8_e4m3", 2, "eager")].step_us is None
    assert rows[("fp8_e4m3", 1, "eager")].step_us > 0 and rows[("fp8_e4m3", 1, "eager")].floor_us is None  # no copy rate
    assert rows[("bf16", 2, "eager")].vs_bf16 is None


def test_cli_runs_saves_and_reprints(tmp_path, capsys):
    path = tmp_path / "e2e.json"
    args = ["bench", "--e2e", "--e2e-dim", "32", "--e2e-layers", "1", "--e2e-batch", "1", "--e2e-tokens", "1"]
    assert main([*args, "--json", str(path), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "| bf16 | 1 | eager |" in printed and '"kind": "e2e"' in path.read_text()
    assert main(["bench", "--from-json", str(path)]) == 0
    assert capsys.readouterr().out == printed
    assert main([*args, "--plot", str(tmp_path / "x.png")]) == 2
    assert "options of the op bench" in capsys.readouterr().err


def test_a_swiglu_model_runs_its_fused_producers():
    """With Llama's SwiGLU MLP the fused rows replace the norms and SiLU·up by the fused producers, whose
    quantized outputs the linears read; the step's logits are the unfused quantized model's up to the norms'
    rounding (nn.RMSNorm rounds once, after the weight) and SiLU·up's (fp32 where the unfused is bf16)."""
    torch.manual_seed(0)
    with torch.inference_mode():
        model = decoder.DecodeModel(256, 1, 64, torch.device("cpu"), "swiglu")
        fused = quantcore.nn.quantize_model(copy.deepcopy(model), dtype=torch.float8_e4m3fn,
                                            fuse_norms=decoder.FUSED_NORMS, fuse_silu_mul=decoder.FUSED_ACTS)
        plain = quantcore.nn.quantize_model(model, dtype=torch.float8_e4m3fn)
        block = fused.layers[0]
        assert isinstance(block.attn_norm, quantcore.nn.QuantRMSNorm) and isinstance(block.act, quantcore.nn.QuantSiLUMul)
        assert isinstance(fused.norm, torch.nn.RMSNorm)  # the head's norm feeds a bf16 linear: not fused
        logits = [decoder.decode_step(m, decoder.DecodeState.new(m, 2, context=4)) for m in (fused, plain)]
        assert logits[0].shape == (2, 64) and float((logits[0] - logits[1]).norm() / logits[1].norm()) < 0.05
    out = e2e.run_e2e(e2e.Config(dim=256, layers=1, batches=[1], tokens=1, warmup=1, vocab=64, context=4,
                                 mlp="swiglu"), device="cpu")
    assert [r.dtype for r in out.model if r.mode == "eager"] == list(MODEL_ROWS)
    assert all(r.step_us for r in out.model if r.mode == "eager")
    assert "SwiGLU" in e2e.render(out)


def test_a_step_sees_the_cache_up_to_its_position_only_and_advances_in_place():
    torch.manual_seed(0)
    with torch.inference_mode():
        model = decoder.DecodeModel(256, 2, 64, torch.device("cpu"))
        clean, dirty = (decoder.DecodeState.new(model, 2, context=4) for _ in range(2))
        for keys, values in dirty.caches:  # what a position not yet written holds must not matter
            keys.normal_(), values.normal_()
        for _ in range(3):
            a, b = decoder.decode_step(model, clean), decoder.decode_step(model, dirty)
            assert torch.equal(a, b) and torch.equal(clean.tok, b.argmax(-1, keepdim=True))
        assert int(clean.pos) == 3
        decoder.decode_step(model, clean)
        assert int(clean.pos) == 0  # wrapped at the cache's end
