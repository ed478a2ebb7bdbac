"""FP8 -> INT8 weight conversion (quantcore.convert) against an independent numpy float64 computation:
codes and scales bit for bit, the error statistics, the bounds the INT8 grid guarantees, chunking,
and the errors for bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from quantcore import InvalidInputError, convert, ops

FP8 = torch.float8_e4m3fn


def fp8_weight(n, k, block, gen, spread=1.0):
    """A random FP8 weight with its scales; row magnitudes spread over exp(±spread·N(0,1)) so that
    small values sit far below their block's amax (where INT8 flushes them), one block all zero."""
    w = torch.randn(n, k, generator=gen) * torch.exp(spread * torch.randn(n, 1, generator=gen))
    if n > block[0] or k > block[1]:
        w[: block[0], : block[1]] = 0
    return ops.weight_quant(w, dtype=FP8, block_size=block, backend="torch")


def oracle(q8, scale, block, eps):
    """Per block in numpy: exact values q·s in float64, the fp32 scale, half-to-even INT8 codes."""
    bn, bk = min(block[0], q8.shape[0]), min(block[1], q8.shape[1])
    v = q8.float().numpy().astype(np.float64)
    s = scale.numpy()
    q, s_new = np.zeros(v.shape, np.int8), np.zeros(s.shape, np.float32)
    err2, ref2 = np.zeros(s.shape), np.zeros(s.shape)
    flushed = 0
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            idx = np.s_[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk]
            blk = v[idx] * np.float64(s[i, j])
            s_new[i, j] = np.maximum(np.float32(np.abs(blk).max()), np.float32(eps)) / np.float32(127)
            q[idx] = np.clip(np.round(blk / np.float64(s_new[i, j])), -127, 127)
            diff = q[idx] * np.float64(s_new[i, j]) - blk
            err2[i, j], ref2[i, j] = (diff ** 2).sum(), (blk ** 2).sum()
            flushed += int(((q[idx] == 0) & (blk != 0)).sum())
    return q, s_new, err2, ref2, flushed, v * np.repeat(np.repeat(s.astype(np.float64), bn, 0), bk, 1)[: v.shape[0], : v.shape[1]]


@pytest.mark.parametrize("n, k, block", [(300, 520, (128, 128)), (7, 33, (4, 16)), (1, 5, (128, 128)),
                                         (129, 256, (64, 128))])
def test_matches_an_independent_float64_computation(gen, n, k, block):
    q8, s8 = fp8_weight(n, k, block, gen)
    q, s, err = convert.fp8_to_int8_blocks(q8, s8, block_size=block)
    eq, es, err2, ref2, flushed, exact = oracle(q8, s8, block, 1e-4)
    assert q.dtype == torch.int8 and q.shape == (n, k) and s.shape == s8.shape
    assert np.array_equal(q.numpy(), eq)
    assert np.array_equal(s.numpy().view(np.int32), es.view(np.int32))
    assert err.rel_fro == pytest.approx(np.sqrt(err2.sum() / ref2.sum()), rel=1e-12)
    rel = np.sqrt(np.divide(err2, ref2, out=np.zeros_like(err2), where=ref2 > 0))
    assert err.worst_block == np.unravel_index(rel.argmax(), rel.shape) and err.worst_block_rel == pytest.approx(rel.max())
    assert err.max_abs == pytest.approx(np.abs(eq * np.repeat(np.repeat(es.astype(np.float64), min(block[0], n), 0),
                                                             min(block[1], k), 1)[:n, :k] - exact).max(), rel=1e-12)
    assert (err.flushed, err.nonzero, err.blocks) == (flushed, int((exact != 0).sum()), s8.numel())
    assert "relative error" in str(err)


def test_int8_grid_bounds_hold(gen):
    q8, s8 = fp8_weight(384, 640, (128, 128), gen, spread=2.0)
    q, s, err = convert.fp8_to_int8_blocks(q8, s8)
    exact = q8.double() * s8.double().repeat_interleave(128, 0).repeat_interleave(128, 1)
    steps = s.double().repeat_interleave(128, 0).repeat_interleave(128, 1)
    assert bool(((q.double() * steps - exact).abs() <= steps / 2).all())  # half an INT8 step (ties are common)
    amax_codes = q.abs().reshape(3, 128, 5, 128).amax(dim=(1, 3))
    assert bool((amax_codes[1:] == 127).all()) and amax_codes[0, 0] == 0  # amax maps to 127; the zero block
    assert s[0, 0] == torch.tensor(1e-4, dtype=torch.float32) / 127
    assert 0 < err.flushed < err.nonzero
    # The statistic is what the dequantized weights show (dequantization rounds to fp32 once).
    converted = ops.weight_dequant(q, s, out_dtype=torch.float32, backend="torch").double()
    assert float((converted - exact).norm() / exact.norm()) == pytest.approx(err.rel_fro, rel=1e-5)


def test_values_on_the_int8_grid_convert_without_error(gen):
    # Codes -1, 0, 1 with scale 127/1024: the block amax 127/1024 gives scale' 2^-10 exactly, so every
    # value is an INT8 code times scale'.
    codes = torch.randint(-1, 2, (64, 256), generator=gen).float()
    codes[0, 0], codes[0, 128] = 1, -1
    q, s, err = convert.fp8_to_int8_blocks(codes.to(FP8), torch.full((1, 2), 127 / 1024), block_size=(64, 128))
    assert torch.equal(q, (127 * codes).to(torch.int8)) and torch.equal(s, torch.full((1, 2), 2.0 ** -10))
    assert (err.rel_fro, err.max_abs, err.flushed, err.nonzero) == (0.0, 0.0, 0, int(codes.count_nonzero()))


def test_chunks_give_the_same_result(gen, monkeypatch):
    q8, s8 = fp8_weight(300, 520, (128, 128), gen)
    whole = convert.fp8_to_int8_blocks(q8, s8)
    monkeypatch.setattr(convert, "_CHUNK_ELEMENTS", 1)  # one block row per step
    parts = convert.fp8_to_int8_blocks(q8, s8)
    assert torch.equal(whole[0], parts[0]) and torch.equal(whole[1], parts[1])
    # Field by field: pytest.approx takes no nested structure (the block index is a tuple).
    whole_err, parts_err = whole[2].model_dump(), parts[2].model_dump()
    assert whole_err.keys() == parts_err.keys()
    for field, value in whole_err.items():
        assert parts_err[field] == pytest.approx(value), field


@pytest.mark.parametrize("make, message", [
    (lambda q, s: (q.float(), s), "w has dtype"),
    (lambda q, s: (q, s[:, :1]), "scale has shape"),
    (lambda q, s: (q, s.double()), "scale has dtype"),
    (lambda q, s: (q.view(torch.uint8).index_fill(1, torch.tensor([3]), 0xFF).view(FP8), s), "NaN codes"),
    (lambda q, s: (q, s.index_fill(0, torch.tensor([0]), float("inf"))), "NaN or Inf"),
])
def test_bad_input_is_refused(gen, make, message):
    q8, s8 = fp8_weight(200, 300, (128, 128), gen)
    with pytest.raises(InvalidInputError, match=message) as info:
        convert.fp8_to_int8_blocks(*make(q8, s8))
    assert str(info.value).startswith("fp8_to_int8_blocks:")


def test_bad_options_are_refused(gen):
    q8, s8 = fp8_weight(64, 64, (128, 128), gen)
    with pytest.raises(InvalidInputError, match="block_size"):
        convert.fp8_to_int8_blocks(q8, s8, block_size=128)
    with pytest.raises(InvalidInputError, match="eps"):
        convert.fp8_to_int8_blocks(q8, s8, eps=0.0)


def test_convert_fp8_to_int8_converts_every_fp8_layer_in_place_and_reports_its_error():
    from torch import nn

    from quantcore.nn import QuantLinear, convert_fp8_to_int8, quantize_model

    torch.manual_seed(0)
    shared = nn.Linear(256, 128)
    model = nn.ModuleDict({"a": nn.Linear(300, 200), "b": shared, "b_again": shared, "head": nn.Linear(128, 10)})
    quantize_model(model, dtype=torch.float8_e4m3fn, skip=("head",), block_size=(64, 128))
    model["c"] = QuantLinear.from_linear(nn.Linear(128, 64), dtype=torch.int8)
    x = torch.randn(3, 300)
    before = model["a"](x)
    fp8 = {name: (model[name].weight.clone(), model[name].weight_scale_inv.clone()) for name in ("a", "b")}
    int8_before = model["c"].weight.clone()

    errors = convert_fp8_to_int8(model)

    assert sorted(errors) == ["a", "b"]  # the shared layer once; INT8 and float layers untouched
    for name, (w, scale) in fp8.items():
        q, s, err = convert.fp8_to_int8_blocks(w, scale, block_size=(64, 128))
        layer = model[name]
        assert layer.weight.dtype == torch.int8 and torch.equal(layer.weight, q) and torch.equal(layer.weight_scale_inv, s)
        assert errors[name] == err and not layer.weight.requires_grad
    assert model["b_again"] is model["b"] and torch.equal(model["c"].weight, int8_before)
    assert model["head"].weight.dtype == torch.float32
    after = model["a"](x)  # the INT8 GEMM runs: close to the FP8 layer, within the conversion's error
    assert float((after - before).norm() / before.norm()) < 5e-2
    with pytest.raises(InvalidInputError, match="convert_fp8_to_int8: expected an nn.Module"):
        convert_fp8_to_int8("model")


def test_convert_fp8_to_int8_converts_experts_per_expert():
    """A QuantExperts' stacked FP8 weights become INT8 expert by expert, as fp8_to_int8_blocks converts each
    expert's matrix; the errors are named per expert and projection; the layer then runs its INT8 path."""
    from torch import nn

    from quantcore.nn import QuantExperts, convert_fp8_to_int8

    gen = torch.Generator().manual_seed(1)
    layer = QuantExperts.from_stacked(torch.randn(3, 256, 128, generator=gen), torch.randn(3, 128, 128, generator=gen),
                                      dtype=torch.float8_e4m3fn)
    model = nn.ModuleDict({"experts": layer})
    x, ids, w = torch.randn(4, 128, generator=gen), torch.tensor([[0, 1], [1, 2], [2, 0], [0, 2]]), torch.rand(4, 2)
    before = layer(x, ids, w)
    fp8 = {name: layer._parameters[name].clone() for name in layer.quant_params()}
    errors = convert_fp8_to_int8(model)
    assert sorted(errors) == [f"experts.{e}.{p}" for e in range(3) for p in ("down_proj", "gate_up_proj")]
    for e in range(3):
        q, s, err = convert.fp8_to_int8_blocks(fp8["down_proj"][e], fp8["down_proj_scale_inv"][e])
        assert torch.equal(layer.down_proj[e], q) and torch.equal(layer.down_proj_scale_inv[e], s)
        assert errors[f"experts.{e}.down_proj"] == err
    assert layer.gate_up_proj.dtype == torch.int8 and not layer.gate_up_proj.requires_grad
    after = layer(x, ids, w)
    assert float((after - before).norm() / before.norm()) < 5e-2
