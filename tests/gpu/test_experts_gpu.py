"""Mixture-of-experts ops and `QuantExperts` on the GPU, Triton and CuPy, on DeepSeek-V3's expert shapes
(H = 7168, I = 2048, 32 of its 256 experts, top-8) and Qwen3-30B-A3B's (H = 2048, I = 768, E = 128, top-8) at T = 1, 8
and 64 tokens (and 512 for the contiguous routing):

- the routing ops bit for bit the torch reference on the same GPU (codes, scales, offsets / masked_m, rows;
  the weighted sum's bits), as the contract says (integer sort, act_quant's numerics, a fixed fp32 order);
- the grouped GEMMs, fed by the permute, bit for bit `ops.scaled_mm` on the same backend per expert (K
  unsplit, as the grouped kernels run it: `helpers.whole_k`), both layouts;
- QuantExperts: the masked and the contiguous layouts give the same bits, within bf16 reach of the layer on
  the reference; the FP8 experts on a simulated sm_80 run the w8a16 variants; a decode step (masked) captured
  in a CUDA graph and replayed with new tokens and routing gives what an eager forward gives.

Run on a GPU machine: `python3 -m pytest -m gpu tests/gpu/test_experts_gpu.py`.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch

import quantcore
from quantcore import capability, definitions, ops, registry
from quantcore.definitions.tolerances import rel_error
from quantcore.nn import QuantExperts

from helpers import assert_gemm_rows_agree, whole_k  # noqa: F401 (a fixture: pytestmark uses it)
from test_parity import poison, rand

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::quantcore.NumericsWarning"),
              pytest.mark.usefixtures("whole_k")]

FP8, I8 = torch.float8_e4m3fn, torch.int8
BACKENDS = ["triton", "cupy"]
# H, I, E: the models' expert shapes; DeepSeek-V3 with 32 of its 256 experts, so that the suite's parallel
# workers fit one GPU (its stacked FP8 weights alone would take 7 GiB a worker).
MODELS = {"deepseek-v3": (7168, 2048, 32), "qwen3-30b-a3b": (2048, 768, 128)}
TOP = 8


def _bits(t):
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def _router(T: int, E: int, seed: int = 0):
    """A router's output: each token's top-8 of random scores biased towards the first experts (some hot, many
    empty at small T), softmax weights over the chosen ones (fp32)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    scores = torch.rand(T, E, generator=g, device="cuda") + torch.linspace(1.0, 0.0, E, device="cuda")
    weights, ids = scores.topk(TOP, dim=1)
    return ids, torch.softmax(weights, dim=1)


@functools.lru_cache(maxsize=2)
def _layer(model: str, qdtype: torch.dtype) -> QuantExperts:
    """QuantExperts of the model's shapes, each expert's weights quantized from Gaussian values (one expert at
    a time: DeepSeek-V3's stacked weights are 30 GB in fp32)."""
    H, I, E = MODELS[model]
    layer = QuantExperts(E, H, I, dtype=qdtype, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(5)
    for name, (n, k) in (("gate_up_proj", (2 * I, H)), ("down_proj", (H, I))):
        codes, scales = getattr(layer, name), getattr(layer, name + "_scale_inv")
        for e in range(E):
            q, s = ops.weight_quant(torch.randn(n, k, generator=g, device="cuda") / math.sqrt(k), dtype=qdtype,
                                    backend="torch")
            codes[e].copy_(q)
            scales[e].copy_(s)
    return layer


def _check_permute(got, want):
    (q, s, bounds, rows), (eq, es, ebounds, erows) = got, want
    assert torch.equal(bounds, ebounds) and torch.equal(rows, erows)
    held = rows >= 0
    assert torch.equal(_bits(q[held]), _bits(eq[held])) and torch.equal(_bits(s[held]), _bits(es[held]))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("T", [1, 8, 64, 512])
@pytest.mark.parametrize("qdtype,scale_fmt", [(FP8, "fp32"), (I8, "ue8m0")])
def test_routing_is_the_reference(backend, model, T, qdtype, scale_fmt):
    H, _, E = MODELS[model]
    x = rand((T, H), torch.bfloat16, seed=T)
    ids, weights = _router(T, E, seed=T)
    options = dict(dtype=qdtype, scale_fmt=scale_fmt)
    poison()
    contiguous = ops.moe_permute(x, ids, E, **options, backend=backend)
    _check_permute(contiguous, ops.moe_permute(x, ids, E, **options, backend="torch"))
    if T <= 64:
        poison()
        masked = ops.moe_permute_masked(x, ids.int(), E, T, **options, backend=backend)
        _check_permute(masked, ops.moe_permute_masked(x, ids.int(), E, T, **options, backend="torch"))
        y = rand((E, T, H), torch.bfloat16, seed=1)
        assert torch.equal(_bits(ops.moe_unpermute(y, masked[3], weights, backend=backend)),
                           _bits(ops.moe_unpermute(y, masked[3], weights, backend="torch")))
    y = rand((T * TOP, H), torch.bfloat16, seed=2)
    for out_dtype in (None, torch.float32):
        poison()
        got = ops.moe_unpermute(y, contiguous[3], weights, out_dtype=out_dtype, backend=backend)
        assert torch.equal(_bits(got), _bits(ops.moe_unpermute(y, contiguous[3], weights, out_dtype=out_dtype,
                                                                 backend="torch")))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("T", [1, 8, 64])
def test_invalid_ids_are_dropped_on_the_device(backend, T):
    """Ids outside 0..E-1, unchecked on the GPU: their pairs get no row (the reference's rule), in both layouts."""
    H, _, E = MODELS["qwen3-30b-a3b"]
    x = rand((T, H), torch.bfloat16, seed=3)
    ids, weights = _router(T, E, seed=3)
    ids[:, 0] = -1
    ids[0, 1] = E + 5
    launch_options = dict(num_experts=E, qdtype=FP8, group_size=128, ue8m0=False, eps=1e-4,
                          profile=capability.profile_for(x.device))
    impl = registry.select(definitions.get("moe_permute").spec(x, ids.clamp(0, E - 1), E).query, backend)
    reference = registry.reference("moe_permute")
    _check_permute(impl(x=x, topk_ids=ids, **launch_options), reference(x=x, topk_ids=ids, **launch_options))
    impl = registry.select(definitions.get("moe_permute_masked").spec(x, ids.clamp(0, E - 1), E, T).query,
                           backend)
    reference = registry.reference("moe_permute_masked")
    _check_permute(impl(x=x, topk_ids=ids, max_m=T, **launch_options),
                   reference(x=x, topk_ids=ids, max_m=T, **launch_options))


def _assert_scaled_mm_rows(backend, got, a, a_s, b, b_s, e, **options):
    want = ops.scaled_mm(a, a_s, b[e], b_s[e], **options, backend=backend)
    assert_gemm_rows_agree(got, want, f"expert {e} ({a.shape[0]} rows)")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("T", [1, 8, 64])
@pytest.mark.parametrize("qdtype", [FP8, I8])
def test_grouped_gemms_are_scaled_mm_per_expert(backend, model, T, qdtype):
    """The gate_up projection of routed tokens, in both layouts, and the down projection of its activation:
    each expert's rows bit for bit scaled_mm on them; the layouts agree."""
    H, I, E = MODELS[model]
    layer = _layer(model, qdtype)
    x = rand((T, H), torch.bfloat16, seed=T)
    ids, _ = _router(T, E, seed=T)
    a, a_s, offsets, rows = ops.moe_permute(x, ids, E, dtype=qdtype)
    slab, slab_s, masked_m, slab_rows = ops.moe_permute_masked(x, ids, E, T, dtype=qdtype)
    poison()
    out = ops.grouped_mm(a, a_s, layer.gate_up_proj, layer.gate_up_proj_scale_inv, offsets, backend=backend)
    poison()
    masked = ops.grouped_mm_masked(slab, slab_s, layer.gate_up_proj, layer.gate_up_proj_scale_inv, masked_m,
                                   backend=backend)
    h, h_s = ops.act_quant(out[:, :I].float() * out[:, I:].float(), dtype=qdtype)
    down = ops.grouped_mm(h, h_s, layer.down_proj, layer.down_proj_scale_inv, offsets, out_dtype=torch.float32,
                          backend=backend)
    bounds, counts = offsets.tolist(), masked_m.tolist()
    for e in range(E):
        lo, hi = bounds[e], bounds[e + 1]
        assert counts[e] == hi - lo
        if hi > lo:
            _assert_scaled_mm_rows(backend, out[lo:hi], a[lo:hi], a_s[lo:hi], layer.gate_up_proj,
                                   layer.gate_up_proj_scale_inv, e)
            assert_gemm_rows_agree(masked[e, :hi - lo], out[lo:hi], f"expert {e}: the layouts")
            assert torch.equal(slab_rows[e, :hi - lo], rows[lo:hi])
            _assert_scaled_mm_rows(backend, down[lo:hi], h[lo:hi], h_s[lo:hi], layer.down_proj,
                                   layer.down_proj_scale_inv, e, out_dtype=torch.float32)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("T", [1, 8, 64])
@pytest.mark.parametrize("qdtype", [FP8, I8])
def test_quant_experts_layouts_agree_and_match_the_reference(backend, model, T, qdtype):
    H, _, E = MODELS[model]
    layer = _layer(model, qdtype)
    x = rand((T, H), torch.bfloat16, seed=T)
    ids, weights = _router(T, E, seed=T)
    outs = {}
    try:
        with quantcore.priority(backend):
            for layout, bound in (("masked", 10**9), ("contiguous", 0)):
                layer.masked_max_rows = bound
                assert layer.path(T, TOP).layout == layout
                poison()
                outs[layout] = layer(x, ids, weights)
    finally:
        del layer.masked_max_rows  # the class's rule again (the layer is shared by the tests)
    # The same bits, but for FP8 on FP8 tensor cores: the layouts' tiles pick different MMA instructions, whose
    # reduced-precision accumulation differs by an ulp (measured on the H100 at T = 64), and the intermediate's
    # codes can then differ by one.
    if qdtype == FP8 and capability.profile_for(x.device).fp8_mma:
        assert rel_error(outs["masked"], outs["contiguous"]) <= 1e-2
    else:
        assert torch.equal(outs["masked"], outs["contiguous"])
    with quantcore.priority("torch"):
        expected = layer(x, ids, weights)
    assert rel_error(outs["masked"], expected) <= 1e-2


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("profile", ["sm80", "sm86"])
def test_fp8_experts_on_older_gpus_run_the_w8a16_variants(backend, profile):
    H, _, E = MODELS["qwen3-30b-a3b"]
    layer = _layer("qwen3-30b-a3b", FP8)
    T = 8
    x = rand((T, H), torch.bfloat16, seed=T)
    ids, weights = _router(T, E, seed=T)
    a, a_s, offsets, _ = ops.moe_permute(x, ids, E)
    with quantcore.simulate(profile), quantcore.priority(backend):
        explained = quantcore.explain("grouped_mm", a, a_s, layer.gate_up_proj, layer.gate_up_proj_scale_inv, offsets)
        assert explained.selected == f"{backend}[w8a16]" and explained.options["mma"] == "fp16"
        got = layer(x, ids, weights)
    with quantcore.priority("torch"):
        expected = layer(x, ids, weights)
    assert rel_error(got, expected) <= 1e-2


@pytest.mark.parametrize("layout", ["masked", "contiguous"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("model", list(MODELS))
def test_a_decode_step_replays_in_a_cuda_graph(backend, model, layout):
    """A forward of 8 tokens in either layout captured once, replayed after new tokens, ids and weights were
    copied into its inputs: what an eager forward of the new inputs gives, bit for bit (neither layout reads
    the routing on the host)."""
    H, _, E = MODELS[model]
    layer = _layer(model, FP8)
    T = 8
    layer.masked_max_rows = T * TOP if layout == "masked" else 0
    assert layer.path(T, TOP).layout == layout
    x = rand((T, H), torch.bfloat16, seed=11)
    ids, weights = _router(T, E, seed=11)
    with quantcore.priority(backend):
        for _ in range(2):  # compiles the kernels and keeps the plans outside the capture
            layer(x, ids, weights)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = layer(x, ids, weights)
        new_ids, new_weights = _router(T, E, seed=12)
        x.copy_(rand((T, H), torch.bfloat16, seed=12))
        ids.copy_(new_ids)
        weights.copy_(new_weights)
        graph.replay()
        eager = layer(x, ids, weights)
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
