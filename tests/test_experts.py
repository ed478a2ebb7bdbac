"""Mixture-of-experts ops on the CPU: the grouped GEMMs (bit for bit scaled_mm per expert, and the float64
oracle), the routing (against plain loops and the oracle's fp32 steps, and a permute / un-permute round
trip), their validation, their custom ops (opcheck), and `QuantExperts` (against float MLPs, bit for bit
its own op composition, both layouts, torch.compile). The Triton kernels are compared with these references
under the interpreter in tests/backends/test_routing_kernels.py, the GPU in tests/gpu/test_experts_gpu.py."""

from __future__ import annotations

import math

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

import oracle
from helpers import randn
from quantcore import InvalidInputError, capability, ops, registry
from quantcore.backends.torch import routing as ref_routing
from quantcore.backends.torch.activation import activate
from quantcore.definitions.query import GroupedGemmQuery
from quantcore.definitions.tolerances import gemm_tolerance, rel_error
from quantcore.registry import impl as impl_module
from quantcore.nn import QuantExperts

from test_library import check

qc = torch.ops.quantcore
FP8, I8 = torch.float8_e4m3fn, torch.int8
FMTS = {FP8: "fp8_e4m3", I8: "int8"}
# E = 4 experts, top-2 of T = 5 tokens: expert 3 gets no token, expert 1 two, experts 0 and 2 four each.
E, H, N, T, TOP = 4, 256, 96, 5, 2
IDS = torch.tensor([[0, 2], [2, 1], [0, 2], [1, 0], [2, 0]])


def _bits(t):
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def _same(a, b) -> bool:
    parts = zip(a, b, strict=True) if isinstance(a, tuple) else ((a, b),)
    return all(x.dtype == y.dtype and x.shape == y.shape and torch.equal(_bits(x), _bits(y)) for x, y in parts)


def _experts(gen, qdtype, E=E, N=N, K=H, block=(128, 128)):
    """E stacked quantized weights [E, N, K] and their block scales."""
    ws = [ops.weight_quant(randn((N, K), gen=gen), dtype=qdtype, block_size=block) for _ in range(E)]
    return torch.stack([w for w, _ in ws]), torch.stack([s for _, s in ws])


def _offsets(counts) -> torch.Tensor:
    return torch.tensor([sum(counts[:e]) for e in range(len(counts) + 1)], dtype=torch.int32)


# ---------------------------------------------------------------- grouped GEMMs

EPILOGUES = [dict(), dict(bias=torch.bfloat16, activation="silu", out_dtype=torch.float32),
             dict(out_quant=I8, out_group_size=32, activation="gelu")]


@pytest.mark.parametrize("qdtype", [FP8, I8])
@pytest.mark.parametrize("epilogue", EPILOGUES, ids=["plain", "bias-silu", "requant"])
def test_grouped_mm_is_scaled_mm_per_expert(gen, qdtype, epilogue):
    """Both layouts: each expert's rows get scaled_mm's bits, an empty and a one-row expert included; K = 300
    ends in a partial block."""
    counts, K = [3, 0, 1, 6], 300
    b, b_s = _experts(gen, qdtype, K=K)
    epilogue = dict(epilogue)
    if "bias" in epilogue:
        epilogue["bias"] = randn((E, N), gen=gen).to(epilogue["bias"])
    bias = epilogue.pop("bias", None)
    a, a_s = ops.act_quant(randn((sum(counts), K), gen=gen), dtype=qdtype)
    offsets = _offsets(counts)
    out = ops.grouped_mm(a, a_s, b, b_s, offsets, bias=bias, **epilogue)
    max_m = max(counts)
    slab = torch.zeros(E, max_m, K, dtype=qdtype)
    slab_s = torch.ones(E, max_m, a_s.shape[1])
    for e, (lo, hi) in enumerate(zip(offsets.tolist(), offsets.tolist()[1:])):
        slab[e, :hi - lo], slab_s[e, :hi - lo] = a[lo:hi], a_s[lo:hi]
    masked = ops.grouped_mm_masked(slab, slab_s, b, b_s, torch.tensor(counts, dtype=torch.int32), bias=bias,
                                   **epilogue)
    for e, (lo, hi) in enumerate(zip(offsets.tolist(), offsets.tolist()[1:])):
        want = ops.scaled_mm(a[lo:hi], a_s[lo:hi], b[e], b_s[e], bias=None if bias is None else bias[e], **epilogue)
        rows = (lambda t: t[lo:hi])
        assert _same(tuple(map(rows, out)) if isinstance(out, tuple) else out[lo:hi], want), e
        mine = (lambda t: t[e, :hi - lo])
        assert _same(tuple(map(mine, masked)) if isinstance(masked, tuple) else masked[e, :hi - lo], want), e


@pytest.mark.parametrize("qdtype", [FP8, I8])
def test_grouped_mm_matches_float64_per_expert(gen, qdtype):
    counts = [2, 5, 0, 1]
    b, b_s = _experts(gen, qdtype, N=130)
    a, a_s = ops.act_quant(randn((sum(counts), H), gen=gen), dtype=qdtype)
    offsets = _offsets(counts).tolist()
    out = ops.grouped_mm(a, a_s, b, b_s, _offsets(counts), out_dtype=torch.float32)
    for e, (lo, hi) in enumerate(zip(offsets, offsets[1:])):
        if hi > lo:
            expected = torch.from_numpy(oracle.scaled_mm(a[lo:hi], a_s[lo:hi], b[e], b_s[e], 128, 128))
            assert rel_error(out[lo:hi], expected) <= gemm_tolerance(FMTS[qdtype], torch.float32)


def test_non_finite_rows_stay_in_their_blocks(gen):
    """A NaN in one token's activation makes that token's rows non-finite, in its experts only."""
    b, b_s = _experts(gen, FP8)
    x = randn((T, H), gen=gen)
    x[1, 5] = float("nan")
    a, a_s, offsets, rows = ops.moe_permute(x, IDS, E)
    out = ops.grouped_mm(a, a_s, b, b_s, offsets, out_dtype=torch.float32)
    poisoned = (rows // TOP) == 1
    assert not torch.isfinite(out[poisoned]).any(dim=1).any() and torch.isfinite(out[~poisoned]).all()
    assert torch.isnan(a_s[poisoned, 0]).all() and torch.isfinite(a_s[poisoned, 1]).all()


# ---------------------------------------------------------------- routing

@pytest.mark.parametrize("qdtype", [FP8, I8])
@pytest.mark.parametrize("scale_fmt", ["fp32", "ue8m0"])
@pytest.mark.parametrize("id_dtype", [torch.int64, torch.int32])
def test_moe_permute_against_plain_loops(gen, qdtype, scale_fmt, id_dtype):
    """Stable sort by expert (token order within one), each row the quantization of its token (act_quant's
    codes and scales, the oracle's), H = 300 ending in a partial group."""
    x = randn((T, 300), gen=gen, dtype=torch.bfloat16)
    a, a_s, offsets, rows = ops.moe_permute(x, IDS.to(id_dtype), E, dtype=qdtype, scale_fmt=scale_fmt)
    per_expert, counts = oracle.routed_rows(IDS, E)
    assert offsets.dtype == rows.dtype == torch.int32
    assert offsets.tolist() == [sum(counts[:e]) for e in range(E + 1)]
    assert rows.tolist() == [p for pairs in per_expert for p in pairs]
    q, s = oracle.act_quant(x, qdtype, 128, ue8m0=scale_fmt == "ue8m0")
    tokens = rows.long() // TOP
    assert _same((a, a_s), (q[tokens], s[tokens]))


@pytest.mark.parametrize("max_m", [5, 3])
def test_moe_permute_masked_against_plain_loops(gen, max_m):
    """Per-expert slabs; with max_m = 3 experts 0 and 2 (four pairs each) drop their last pair."""
    x = randn((T, H), gen=gen)
    a, a_s, masked_m, rows = ops.moe_permute_masked(x, IDS, E, max_m, dtype=I8)
    per_expert, counts = oracle.routed_rows(IDS, E, max_m)
    assert masked_m.tolist() == [min(c, max_m) for c in counts]
    assert rows.tolist() == [pairs + [-1] * (max_m - len(pairs)) for pairs in per_expert]
    q, s = oracle.act_quant(x, I8, 128)
    for e, pairs in enumerate(per_expert):
        tokens = torch.tensor(pairs, dtype=torch.long) // TOP
        assert _same((a[e, :len(pairs)], a_s[e, :len(pairs)]), (q[tokens], s[tokens]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_moe_unpermute_against_fp32_steps(gen, dtype):
    """Both layouts, in the oracle's order: each product rounded to fp32, then added, slot by slot."""
    w = torch.rand(T, TOP, generator=gen).to(dtype)
    x = randn((T, H), gen=gen)
    for y, rows in ((randn((T * TOP, N), gen=gen, dtype=dtype), ops.moe_permute(x, IDS, E)[3]),
                    (randn((E, 3, N), gen=gen, dtype=dtype), ops.moe_permute_masked(x, IDS, E, 3)[3])):
        out = ops.moe_unpermute(y, rows, w, out_dtype=torch.float32)
        assert torch.equal(out, torch.from_numpy(oracle.unpermute(y, rows, w)).float())
        assert _same(ops.moe_unpermute(y, rows, w), out.to(dtype))


def test_permute_then_unpermute_of_the_identity(gen):
    """The routed rows dequantized (an identity GEMM) and summed back: Σ_j w·x of each token's quantized
    row, in slot order, bit for bit; and the quantization's error from the float sum."""
    x = randn((T, H), gen=gen)
    w = torch.rand(T, TOP, generator=gen)
    a, a_s, _, rows = ops.moe_permute(x, IDS, E, dtype=I8)
    out = ops.moe_unpermute(ops.act_dequant(a, a_s, out_dtype=torch.float32), rows, w)
    xq = ops.act_dequant(*ops.act_quant(x, dtype=I8), out_dtype=torch.float32)
    expected = torch.zeros(T, H)
    for j in range(TOP):
        expected = expected + w[:, j:j + 1] * xq
    assert torch.equal(out, expected)
    assert rel_error(out, (w.sum(1, keepdim=True) * x)) <= 1e-2


def test_the_device_path_drops_invalid_ids(gen):
    """What the GPU does with ids the CPU refuses (the reference launch, below the spec's check): a pair
    with an id outside 0..E-1 gets no row and adds nothing; the contiguous tail is rows = -1."""
    x = randn((T, H), gen=gen)
    ids = IDS.clone()
    ids[1, 0], ids[3, 1] = -1, E
    kw = dict(num_experts=E, qdtype=I8, group_size=128, ue8m0=False, eps=1e-4)
    a, a_s, offsets, rows = ref_routing.moe_permute(x, ids, **kw)
    assert offsets[-1] == T * TOP - 2 and rows[-2:].tolist() == [-1, -1] and 2 not in rows.tolist()
    _, _, masked_m, slab_rows = ref_routing.moe_permute_masked(x, ids, max_m=T, **kw)
    assert masked_m.tolist() == [3, 2, 3, 0] and 7 not in slab_rows.tolist() and 2 not in slab_rows.tolist()
    w = torch.rand(T, TOP, generator=gen)
    y = randn((T * TOP, N), gen=gen)
    out = ops.moe_unpermute(y, rows, w, out_dtype=torch.float32)
    assert torch.equal(out[1], (w[1, 1] * y[rows.tolist().index(3)]).float())


# ---------------------------------------------------------------- validation

def _grouped_args(gen, qdtype=I8):
    b, b_s = _experts(gen, qdtype)
    a, a_s = ops.act_quant(randn((6, H), gen=gen), dtype=qdtype)
    return a, a_s, b, b_s, _offsets([2, 0, 3, 1])


BAD_GROUPED = [
    (lambda a, s, b, bs, o: (a, s, b, bs, o.long()), "expert_offsets has dtype int64; expected int32"),
    (lambda a, s, b, bs, o: (a, s, b, bs, o[:-1]), r"expert_offsets has shape \(4,\); expected \(5,\)"),
    (lambda a, s, b, bs, o: (a, s, b, bs, o.to("meta")), r"tensors are on different devices .*expert_offsets on meta"),
    (lambda a, s, b, bs, o: (a, s, b, bs, torch.tensor([0, 2, 1, 5, 6], dtype=torch.int32)),
     "expert_offsets decreases at expert 1"),
    (lambda a, s, b, bs, o: (a, s, b, bs, torch.tensor([1, 2, 2, 5, 6], dtype=torch.int32)),
     "expert_offsets runs from 1 to 6"),
    (lambda a, s, b, bs, o: (a, s, b, bs, torch.tensor([0, 2, 2, 5, 5], dtype=torch.int32)),
     "expert_offsets runs from 0 to 5; expected 0 to M = 6"),
    (lambda a, s, b, bs, o: (a, s, b, bs[:3], o), "b_scale holds 3 experts' scales but b holds 4"),
    (lambda a, s, b, bs, o: (a[:, :200], s, b, bs, o), "a has K=200"),
    (lambda a, s, b, bs, o: (a, s, b.float(), bs, o), "b has dtype float32"),
    (lambda a, s, b, bs, o: (a, s, b[0], bs, o), r"b has shape \(96, 256\); expected \[E, N, K\]"),
    (lambda a, s, b, bs, o: (a, s[:, :1], b, bs, o), "a_scale has shape"),
    (lambda a, s, b, bs, o: (a.view(torch.uint8), s, b, bs, o), "a has dtype uint8"),
]


@pytest.mark.parametrize("case", range(len(BAD_GROUPED)))
def test_grouped_mm_refuses(gen, case):
    change, words = BAD_GROUPED[case]
    with pytest.raises(InvalidInputError, match=f"grouped_mm: {words}"):
        ops.grouped_mm(*change(*_grouped_args(gen)))


def test_grouped_mm_masked_and_bias_refusals(gen):
    a, a_s, b, b_s, _ = _grouped_args(gen)
    slab, slab_s, masked_m = a[:4].view(2, 2, H), a_s[:4].view(2, 2, -1), torch.tensor([1, 2], dtype=torch.int32)
    with pytest.raises(InvalidInputError, match="a has rows for 2 experts .* b holds 4"):
        ops.grouped_mm_masked(slab, slab_s, b, b_s, masked_m)
    with pytest.raises(InvalidInputError, match="masked_m has dtype int64"):
        ops.grouped_mm_masked(slab, slab_s, b[:2], b_s[:2], masked_m.long())
    with pytest.raises(InvalidInputError, match=r"grouped_mm_masked: a has shape \(4, 256\)"):
        ops.grouped_mm_masked(a[:4], a_s[:4], b[:2], b_s[:2], masked_m)
    with pytest.raises(InvalidInputError, match=r"bias has shape \(96,\); expected \(4, 96\)"):
        ops.grouped_mm(a, a_s, b, b_s, _offsets([2, 0, 3, 1]), bias=torch.zeros(N))


def test_routing_refusals(gen):
    x = randn((T, H), gen=gen)
    ids = IDS.clone()
    ids[0, 0] = 4
    with pytest.raises(InvalidInputError, match=r"moe_permute: topk_ids holds expert id 4, outside 0\.\.3"):
        ops.moe_permute(x, ids, E)
    with pytest.raises(InvalidInputError, match="expert id -1"):
        ops.moe_permute_masked(x, IDS - 1, E, 4)
    with pytest.raises(InvalidInputError, match="topk_ids has dtype float32"):
        ops.moe_permute(x, IDS.float(), E)
    with pytest.raises(InvalidInputError, match=r"topk_ids has shape \(4, 2\)"):
        ops.moe_permute(x, IDS[:4], E)
    with pytest.raises(InvalidInputError, match="num_experts must be an int from 1"):
        ops.moe_permute(x, IDS, 0)
    with pytest.raises(InvalidInputError, match="max_m must be an int from 1"):
        ops.moe_permute_masked(x, IDS, E, 0)
    _, _, _, rows = ops.moe_permute(x, IDS, E)
    y, w = randn((T * TOP, N), gen=gen), torch.rand(T, TOP)
    with pytest.raises(InvalidInputError, match=r"rows has shape \(9,\) for y"):
        ops.moe_unpermute(y, rows[:9], w)
    with pytest.raises(InvalidInputError, match="rows holds 10, outside -1..9"):
        ops.moe_unpermute(y, torch.where(rows == 0, 10, rows), w)
    with pytest.raises(InvalidInputError, match="more than one row"):
        ops.moe_unpermute(y, torch.where(rows == 0, 1, rows), w)
    with pytest.raises(InvalidInputError, match="rows has dtype int64"):
        ops.moe_unpermute(y, rows.long(), w)


def test_cpu_routing_data_is_checked_on_every_call(gen):
    """A call whose routing data was read on the host keeps no plan: the next call's values are checked too."""
    a, a_s, b, b_s, offsets = _grouped_args(gen)
    ops.grouped_mm(a, a_s, b, b_s, offsets)
    with pytest.raises(InvalidInputError, match="decreases"):
        ops.grouped_mm(a, a_s, b, b_s, torch.tensor([0, 3, 2, 5, 6], dtype=torch.int32))
    x = randn((T, H), gen=gen)
    ops.moe_permute(x, IDS, E)
    with pytest.raises(InvalidInputError, match="expert id 7"):
        ops.moe_permute(x, torch.full_like(IDS, 7), E)


@pytest.mark.filterwarnings("ignore::quantcore.NumericsWarning")
@pytest.mark.parametrize("profile,fmt,expected", [
    ("sm90", "fp8_e4m3", "triton"), ("sm89", "int8", "triton"), ("sm86", "fp8_e4m3", "triton[w8a16]"),
    ("sm80", "fp8_e4m3", "triton[w8a16]"), ("sm75", "fp8_e4m3", "cupy[w8a16]"), ("sm75", "int8", "cupy"),
    ("sm70", "fp8_e4m3", "torch")])
def test_grouped_gemms_fall_back_where_the_dense_gemm_does(monkeypatch, profile, fmt, expected):
    """FP8 experts on GPUs without FP8 tensor cores run FP8 decoded to fp16 (the w8a16 variants), as the dense
    GEMM does, with the MMA option of the variant; the reference where no kernel runs."""
    for module in (capability, impl_module):
        monkeypatch.setattr(module, "module_available", lambda _: True)
    for op in ("grouped_mm", "grouped_mm_masked"):
        query = GroupedGemmQuery(op, capability.simulated_profile(profile), fmt, None, (128, 128), 16, (4096, 7168),
                                 block_k=128, experts=256)
        chosen = registry.select(query)
        assert chosen.label == expected, (op, registry.explain_query(query))
        mma = dict(chosen.options).get("mma")
        assert mma == (None if expected == "torch" else "int8" if fmt == "int8" else
                       "fp8" if profile in ("sm89", "sm90") else "fp16")


# ---------------------------------------------------------------- custom ops

def test_custom_ops(gen):
    """Schemas and exact fakes. INT8, where opcheck's schema test runs (its allclose has no float8 on the CPU);
    the FP8 outputs' fakes take the dtype option as INT8's do, checked once."""
    qdtype = I8
    x = randn((T, H), gen=gen, dtype=torch.bfloat16)
    b, b_s = _experts(gen, qdtype)
    check(qc.moe_permute.default, (x, IDS), dict(num_experts=E, dtype=qdtype))
    check(qc.moe_permute_masked.default, (x, IDS), dict(num_experts=E, max_m=T, dtype=FP8, scale_fmt="ue8m0"))
    a, a_s, offsets, rows = qc.moe_permute(x, IDS, num_experts=E, dtype=qdtype)
    bias = randn((E, N), gen=gen)
    check(qc.grouped_mm.default, (a, a_s, b, b_s, offsets, bias), dict(activation="silu"))
    check(qc.grouped_mm_quant.default, (a, a_s, b, b_s, offsets), dict(out_quant=FP8, out_group_size=32))
    # Masked slabs full to max_m, so that every output row is defined and the fake's comparison is exact.
    slab, slab_s = a[:8].reshape(E, 2, H), a_s[:8].reshape(E, 2, -1)
    full = torch.full((E,), 2, dtype=torch.int32)
    check(qc.grouped_mm_masked.default, (slab, slab_s, b, b_s, full), dict(out_dtype=torch.float32))
    check(qc.grouped_mm_masked_quant.default, (slab, slab_s, b, b_s, full, bias), dict(out_quant=qdtype))
    y = randn((T * TOP, N), gen=gen, dtype=torch.bfloat16)
    check(qc.moe_unpermute.default, (y, rows, torch.rand(T, TOP)), dict(out_dtype=torch.float32))


# ---------------------------------------------------------------- QuantExperts

I = 96


def _float_experts(gen, E=E, H=H, I=I):
    return (torch.randn(E, 2 * I, H, generator=gen) / math.sqrt(H), torch.randn(E, H, I, generator=gen) / math.sqrt(I))


def _float_forward(gate_up, down, x, ids, w):
    """Σ_j w·down(silu(gate x) · up x) per token, in float64, from the float weights."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e, xt = int(ids[t, j]), x[t].double()
            h = torch.nn.functional.silu(gate_up[e, :I].double() @ xt) * (gate_up[e, I:].double() @ xt)
            out[t] += w[t, j].double() * (down[e].double() @ h)
    return out


@pytest.mark.parametrize("qdtype,tol", [(FP8, 0.1), (I8, 0.04)])
def test_quant_experts_close_to_the_float_mlps(gen, qdtype, tol):
    gate_up, down = _float_experts(gen)
    layer = QuantExperts.from_stacked(gate_up, down, dtype=qdtype)
    x, w = randn((T, H), gen=gen, dtype=torch.bfloat16), torch.rand(T, TOP, generator=gen)
    y = layer(x, IDS, w)
    assert y.dtype == torch.bfloat16 and y.shape == (T, H)
    assert rel_error(y, _float_forward(gate_up, down, x, IDS, w)) <= tol


@pytest.mark.parametrize("layout", ["masked", "contiguous"])
def test_quant_experts_is_its_op_composition(gen, layout):
    """Bit for bit the six ops in the reference, in either layout; and both layouts give the same bits."""
    layer = QuantExperts.from_stacked(*_float_experts(gen), dtype=FP8, scale_fmt="ue8m0")
    x, w = randn((T, H), gen=gen), torch.rand(T, TOP, generator=gen)
    layer.masked_max_rows = 64 if layout == "masked" else 0
    assert layer.path(T, TOP).layout == layout
    options = dict(dtype=FP8, group_size=128, scale_fmt="ue8m0", backend="torch")
    if layout == "masked":
        a, a_s, counts, rows = ops.moe_permute_masked(x, IDS, E, T, **options)
        gemm = ops.grouped_mm_masked
    else:
        a, a_s, counts, rows = ops.moe_permute(x, IDS, E, **options)
        gemm = ops.grouped_mm
    h = gemm(a, a_s, layer.gate_up_proj, layer.gate_up_proj_scale_inv, counts, backend="torch")
    hq, hs = ops.act_quant(activate(h[..., :I].float(), "silu") * h[..., I:].float(), **options)
    y = gemm(hq, hs, layer.down_proj, layer.down_proj_scale_inv, counts, out_dtype=torch.float32, backend="torch")
    expected = ops.moe_unpermute(y, rows, w, backend="torch")
    got = layer(x, IDS, w)
    assert torch.equal(got, expected)
    layer.masked_max_rows = 0 if layout == "masked" else 64
    assert torch.equal(layer(x, IDS, w), got)


def test_quant_experts_construction_and_state(gen):
    """from_experts equals from_stacked; leading dims; dtype casts keep the codes; a state dict round trip;
    a checkpoint tensor of the wrong dtype is refused."""
    gate_up, down = _float_experts(gen, E=2)
    mlps = torch.nn.ModuleList()
    for e in range(2):
        mlp = torch.nn.Module()
        for name, weight in (("gate_proj", gate_up[e, :I]), ("up_proj", gate_up[e, I:]), ("down_proj", down[e])):
            linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
            linear.weight.data.copy_(weight)
            setattr(mlp, name, linear)
        mlps.append(mlp)
    layer = QuantExperts.from_experts(mlps, dtype=I8)
    stacked = QuantExperts.from_stacked(gate_up, down, dtype=I8)
    assert all(torch.equal(p, q) for p, q in zip(layer.state_dict().values(), stacked.state_dict().values()))
    assert all(not p.requires_grad for p in layer.parameters())
    x, ids, w = randn((2, 3, H), gen=gen), torch.randint(0, 2, (2, 3, 1)), torch.rand(2, 3, 1)
    assert torch.equal(layer(x, ids, w), layer(x.view(6, H), ids.view(6, 1), w.view(6, 1)).view(2, 3, H))
    codes = layer.down_proj.clone()
    layer.to(torch.bfloat16)
    assert torch.equal(layer.down_proj, codes) and layer.down_proj_scale_inv.dtype == torch.float32
    fresh = QuantExperts(2, H, I, dtype=I8)
    fresh.load_state_dict(layer.state_dict())
    assert torch.equal(fresh(x, ids, w), layer(x, ids, w))
    with pytest.raises(InvalidInputError, match="down_proj has dtype bfloat16; this layer expects int8"):
        fresh.load_state_dict({**layer.state_dict(), "down_proj": down.bfloat16()})
    with pytest.raises(InvalidInputError, match="has gate_up_proj but not gate_up_proj_scale_inv"):
        fresh.load_state_dict({k: v for k, v in layer.state_dict().items() if k != "gate_up_proj_scale_inv"})


def test_quant_experts_path_and_errors(gen):
    layer = QuantExperts(E, H, I, dtype=I8)
    assert layer.path(1, 8).layout == "contiguous"  # the default bound: none
    layer.masked_max_rows = 64
    assert layer.path(8, 8) == ("masked", 8, layer.path(8, 8).reason) and "max_m = 8" in layer.path(8, 8).reason
    above = layer.path(9, 8)
    assert above.layout == "contiguous" and "72 routed rows > masked_max_rows (64)" in above.reason
    assert layer.path(0, 8).layout == "contiguous"
    x = randn((T, H), gen=gen)
    with pytest.raises(InvalidInputError, match="hidden_size=256"):
        layer(x[:, :100], IDS, torch.rand(T, TOP))
    with pytest.raises(InvalidInputError, match="topk_ids has 2 slots per token and topk_weights 3"):
        layer(x, IDS, torch.rand(T, 3))
    with pytest.raises(InvalidInputError, match="expert id 4"):
        layer(x, IDS + 2, torch.rand(T, TOP))
    with pytest.raises(InvalidInputError, match="activation must be one of"):
        QuantExperts(E, H, I, activation="relu")
    with pytest.raises(InvalidInputError, match="biased projection"):
        linears = dict(gate_proj=torch.nn.Linear(4, 2), up_proj=torch.nn.Linear(4, 2), down_proj=torch.nn.Linear(2, 4))
        QuantExperts.from_experts([torch.nn.ModuleDict(linears)])


def test_quant_experts_compiles_into_custom_ops(gen):
    """fullgraph on aot_eager: the custom ops with their fakes, equal to eager; a second token count that
    keeps the layout compiles once more at most, and nothing breaks the graph."""
    layer = QuantExperts.from_stacked(*_float_experts(gen), dtype=I8)
    torch._dynamo.reset()
    counters.clear()
    fn = torch.compile(layer, fullgraph=True, backend="aot_eager")
    for tokens in (5, 40):
        x, ids = randn((tokens, H), gen=gen, dtype=torch.bfloat16), torch.randint(0, E, (tokens, TOP), generator=gen)
        w = torch.rand(tokens, TOP, generator=gen)
        assert torch.equal(fn(x, ids, w), layer(x, ids, w))
    assert not counters["graph_break"]
    torch._dynamo.reset()
