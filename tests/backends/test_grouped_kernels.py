"""The grouped (mixture-of-experts) Triton GEMMs on the CPU under TRITON_INTERPRET=1.

Each expert's rows must be bit for bit the dense Triton `scaled_mm` of those rows with K unsplit (the
grouped kernels never split K; the dense GEMM is pinned unsplit here) and within the contract of the torch
reference (as the dense GEMM is: tests/backends/test_triton_kernels.py). FP8 operands lie in one binade, so
that every K block's dot is exact in fp32 whatever order the interpreter's numpy sums it in; the GPU suite
(tests/gpu/test_grouped_gpu.py) checks random data. Outputs are poisoned, so rows that no expert owns
must come back untouched.
"""

from __future__ import annotations

import torch

import pytest  # noqa: E402

triton = pytest.importorskip("triton")

from helpers import INTERPRETER_ONLY, randn  # noqa: E402
from quantcore import InvalidInputError  # noqa: E402
from quantcore.backends import torch as ref  # noqa: E402
from quantcore.backends.torch import grouped as ref_grouped  # noqa: E402
from quantcore.backends.triton import configs, launch  # noqa: E402
from quantcore.backends.triton import grouped  # noqa: E402
from quantcore.capability import SIMULATED  # noqa: E402

pytestmark = INTERPRETER_ONLY

FP8, I8 = torch.float8_e4m3fn, torch.int8
TOL = {FP8: 1e-5, I8: 1e-6}
# (format, profile, mma): INT8; FP8 on FP8 tensor cores; FP8 decoded to fp16 (GPUs without FP8 MMA).
VARIANTS = [(I8, "sm90", "int8"), (FP8, "sm90", "fp8"), (FP8, "sm80", "fp16")]


@pytest.fixture(autouse=True)
def unsplit(monkeypatch):
    """The dense GEMM with K whole, as the grouped kernels run it."""
    monkeypatch.setattr(configs, "_split", lambda profile, tiles, kbs, *args: (1, kbs))
    configs._forget()
    yield
    configs._forget()


@pytest.fixture(autouse=True)
def poisoned(monkeypatch):
    """Every output of a grouped launch starts as bytes no kernel writes: NaN, or -128 for INT8."""
    fresh = grouped._gemm_outputs

    def poison(new):
        t = new()
        t.view(torch.uint8).fill_(0x80 if t.dtype == I8 else 0xFF)
        return t
    monkeypatch.setattr(grouped, "_gemm_outputs", lambda *args: {
        name: (lambda new=new: poison(new)) for name, new in fresh(*args).items()})


def _one_binade(x):
    return x.sign() * (256 + 191 * torch.rand(x.shape, generator=torch.Generator().manual_seed(3)))


def _operands(gen, rows, E, N, K, qdtype, block_n=128, block_k=128):
    """Quantized activations [*rows, K] (scales per 1×block_k) and E stacked weights [E, N, K]."""
    values = _one_binade if qdtype == FP8 else (lambda t: t)
    a, a_s = ref.act_quant(values(randn((*rows, K), gen=gen)).reshape(-1, K), qdtype=qdtype, group_size=block_k,
                           ue8m0=False, eps=1e-4, scale_m_major=False)
    ws = [ref.weight_quant(values(randn((N, K), gen=gen)), qdtype=qdtype, block_n=block_n, block_k=block_k,
                           ue8m0=False, eps=1e-4) for _ in range(E)]
    return (a.view(*rows, K), a_s.view(*rows, a_s.shape[-1]), torch.stack([w for w, _ in ws]), torch.stack([s for _, s in ws]))


def _kw(block_n=128, block_k=128, bias=None, activation=None, out_dtype=torch.float32, out_quant=None, out_group=128,
        ue8m0_out=False):
    return dict(block_n=block_n, block_k=block_k, bias=bias, activation=activation, out_dtype=out_dtype,
                out_quant=out_quant, out_group=out_group, ue8m0_out=ue8m0_out, eps=1e-4)


def _on(profile, mma):
    return dict(profile=SIMULATED[profile], mma=mma)


def _parts(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


def _bits(t):
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def _check_expert(got: tuple, a, a_s, b, b_s, e, kw, on, tol):
    """Results `got` (out, or q and scale) of expert e's rows a, a_s: the dense GEMM's bits, the reference's
    values."""
    bias = None if kw["bias"] is None else kw["bias"][e]
    dense = launch.scaled_mm(a, a_s, b[e], b_s[e], **on, **dict(kw, bias=bias))
    for g, d in zip(got, _parts(dense), strict=True):
        assert g.dtype == d.dtype and g.shape == d.shape and torch.equal(_bits(g), _bits(d)), f"expert {e}"
    want = _parts(ref.scaled_mm(a, a_s, b[e], b_s[e], **dict(kw, bias=bias)))
    if kw["out_quant"] is None:
        assert _rel_err(got[0], want[0]) <= tol
    else:  # the fp32 accumulators agree to ~1e-7: scales closely, the codes within a step
        (q, s), (eq, es) = got, want
        assert float(((s - es).abs() / es).max()) <= 1e-5
        group = min(kw["out_group"], q.shape[1])
        assert _rel_err(ref.act_dequant(q, s, group_size=group, out_dtype=torch.float32),
                        ref.act_dequant(eq, es, group_size=group, out_dtype=torch.float32)) <= 1e-3


def _rel_err(out, expected):
    o, e = out.double(), expected.double()
    return float((o - e).norm() / e.norm())


def _untouched(out, rows) -> bool:
    """Whether rows `rows` of every result still hold the poison."""
    return all(bool((t[rows].view(torch.uint8) == (0x80 if t.dtype == I8 else 0xFF)).all()) for t in _parts(out))


def _contiguous_case(gen, counts, N, K, qdtype, profile, mma, kw, lead=2, tail=3):
    """grouped_mm over experts of `counts` rows, between `lead` and `tail` rows that no expert owns."""
    a, a_s, b, b_s = _operands(gen, (lead + sum(counts) + tail,), len(counts), N, K, qdtype, kw["block_n"],
                               kw["block_k"])
    offsets = torch.tensor([lead + sum(counts[:e]) for e in range(len(counts) + 1)], dtype=torch.int32)
    out = grouped.grouped_mm(a, a_s, b, b_s, offsets, **_on(profile, mma), **kw)
    tol = TOL[qdtype] if kw["out_dtype"] == torch.float32 else 1e-2
    for e, (lo, hi) in enumerate(zip(offsets.tolist(), offsets.tolist()[1:])):
        if hi > lo:
            _check_expert(tuple(t[lo:hi] for t in _parts(out)), a[lo:hi], a_s[lo:hi], b, b_s, e, kw,
                          _on(profile, mma), tol)
    assert _untouched(out, slice(0, lead)) and _untouched(out, slice(a.shape[0] - tail, None))


@pytest.mark.parametrize("qdtype,profile,mma", VARIANTS)
def test_contiguous_layout(gen, qdtype, profile, mma):
    """An empty expert, a one-row expert, one over three 16-row tiles (BLOCK_M from 12 rows an expert), N = 96."""
    _contiguous_case(gen, [0, 1, 40, 7], 96, 256, qdtype, profile, mma, _kw())


@pytest.mark.parametrize("group_m", [2, 3])
def test_contiguous_tile_order_covers_every_tile_once(gen, monkeypatch, group_m):
    """The L2 order numbers each expert's tiles GROUP_M row tiles at a time: experts of 2-7 row tiles (bands
    cut short at the end) by three column tiles (N = 300, a tail), every tile computed and written once."""
    monkeypatch.setattr(grouped, "_GROUP_M", group_m)
    _contiguous_case(gen, [3, 0, 100, 1, 37], 300, 256, I8, "sm90", "int8", _kw())


@pytest.mark.parametrize("qdtype,profile,mma,bias,kw", [
    (FP8, "sm90", "fp8", torch.bfloat16, dict(activation="gelu", out_dtype=torch.bfloat16)),
    (I8, "sm90", "int8", torch.float32, dict(activation="silu", out_quant=FP8, out_group=32, ue8m0_out=True)),
    (FP8, "sm80", "fp16", None, dict(block_n=64, activation="gelu_tanh", out_quant=I8, out_group=128)),
])
def test_contiguous_epilogues(gen, qdtype, profile, mma, bias, kw):
    """Bias per expert, each activation, bf16 out and both re-quantizations (a group wider than N), K = 300 ending
    in a partial block, and 64-row weight scale blocks (two scale rows in a 128-wide tile)."""
    E, N = 3, 96
    kw = _kw(bias=None if bias is None else randn((E, N), gen=gen).to(bias), **kw)
    _contiguous_case(gen, [5, 0, 20], N, 300, qdtype, profile, mma, kw)


@pytest.mark.parametrize("qdtype,profile,mma", VARIANTS)
def test_masked_layout(gen, qdtype, profile, mma):
    """masked_m 0, max_m, 1, a partial second 64-row tile, and one above max_m (counted as max_m); rows past
    masked_m[e] are left as they were."""
    E, max_m, N, K, kw = 5, 80, 96, 256, _kw()
    a, a_s, b, b_s = _operands(gen, (E, max_m), E, N, K, qdtype)
    masked_m = torch.tensor([0, max_m, 1, 70, 200], dtype=torch.int32)
    out = grouped.grouped_mm_masked(a, a_s, b, b_s, masked_m, **_on(profile, mma), **kw)
    assert out.shape == (E, max_m, N)
    for e, count in enumerate(min(c, max_m) for c in masked_m.tolist()):
        if count:
            _check_expert((out[e, :count],), a[e, :count], a_s[e, :count], b, b_s, e, kw, _on(profile, mma),
                          TOL[qdtype])
        assert _untouched(out[e], slice(count, None))


@pytest.mark.parametrize("qdtype", [FP8, I8])
@pytest.mark.parametrize("cfg", [configs.GemmConfig(16, 64, 4, 2, k_step=2), configs.GemmConfig(16, 64, 4, 2, block_ks=64)])
def test_k_loop_variants_as_the_tiled_dense_gemm(gen, monkeypatch, qdtype, cfg):
    """Two K blocks an iteration (3 blocks: a phantom last one) and K blocks in 64-wide steps: the dense tiled
    kernel's loop on the same tile, bit for bit."""
    monkeypatch.setattr(grouped, "tile", lambda *args, **kwargs: cfg)
    monkeypatch.setattr(configs, "gemm_config", lambda *args, **kwargs: cfg)
    monkeypatch.setattr(configs, "decode_m_max", lambda profile, mma: 0)
    _contiguous_case(gen, [3, 33], 80, 300, qdtype, "sm80", "int8" if qdtype == I8 else "fp16", _kw())


def test_no_rows():
    """No rows at all (nothing launched), and experts that own none of the rows (every program exits)."""
    a, a_s, b, b_s = _operands(torch.Generator().manual_seed(0), (0,), 2, 64, 128, I8)
    kw, on = _kw(out_quant=FP8), _on("sm90", "int8")
    q, s = grouped.grouped_mm(a, a_s, b, b_s, torch.zeros(3, dtype=torch.int32), **on, **kw)
    assert q.shape == (0, 64) and s.shape == (0, 1)
    a, a_s, _, _ = _operands(torch.Generator().manual_seed(0), (2, 4), 2, 64, 128, I8)
    out = grouped.grouped_mm_masked(a, a_s, b, b_s, torch.zeros(2, dtype=torch.int32), **on, **_kw())
    assert _untouched(out, slice(None))


def test_refusals():
    a, a_s, b, b_s = _operands(torch.Generator().manual_seed(0), (4,), 2, 64, 128, I8)
    offsets = torch.tensor([0, 1, 4], dtype=torch.int32)
    with pytest.raises(InvalidInputError, match="mma"):
        grouped.grouped_mm(a, a_s, b, b_s, offsets, **_on("sm90", "fp8"), **_kw())
    with pytest.raises(InvalidInputError, match="int32"):
        grouped.grouped_mm(a, a_s, b, b_s, offsets.long(), **_on("sm90", "int8"), **_kw())


@pytest.mark.parametrize("out_quant", [None, I8])
def test_reference_is_scaled_mm_per_expert_and_zeros_elsewhere(gen, out_quant):
    kw = _kw(bias=randn((3, 64), gen=gen), activation="silu", out_quant=out_quant, out_group=32)
    a, a_s, b, b_s = _operands(gen, (9,), 3, 64, 200, FP8)
    offsets = torch.tensor([1, 4, 4, 8], dtype=torch.int32)
    out = _parts(ref_grouped.grouped_mm(a, a_s, b, b_s, offsets, **kw))
    for e, rows in ((0, slice(1, 4)), (2, slice(4, 8))):
        want = _parts(ref.scaled_mm(a[rows], a_s[rows], b[e], b_s[e], **dict(kw, bias=kw["bias"][e])))
        assert all(torch.equal(_bits(t[rows]), _bits(w)) for t, w in zip(out, want, strict=True))
    assert all(not _bits(t[[0, 8]]).any() for t in out)
    masked = _parts(ref_grouped.grouped_mm_masked(a[:8].view(2, 4, -1), a_s[:8].view(2, 4, -1), b[:2], b_s[:2],
                                                  torch.tensor([3, 9], dtype=torch.int32), **kw))
    for e, count in ((0, 3), (1, 4)):
        want = _parts(ref.scaled_mm(a[4 * e:4 * e + count], a_s[4 * e:4 * e + count], b[e], b_s[e],
                                    **dict(kw, bias=kw["bias"][e])))
        assert all(torch.equal(_bits(t[e, :count]), _bits(w)) for t, w in zip(masked, want, strict=True))
    assert all(not _bits(t[0, 3]).any() for t in masked)


def test_tma_only_where_a_descriptor_can_read_the_operands():
    """TMA on sm_90 for K-contiguous operands whose rows are 16-byte aligned and whose leading dims flatten
    into rows; pointers for a K of 300 bytes a row, a transposed weight, a slab of padded experts, and on sm_80."""
    def ready(a, b, profile="sm90"):
        return grouped._tma_ready(a, b, SIMULATED[profile])
    a, b = torch.zeros(40, 256, dtype=I8), torch.zeros(4, 96, 256, dtype=I8)
    slab = torch.zeros(4, 8, 256, dtype=I8)
    assert ready(a, b) and ready(slab, b) and not ready(a, b, "sm80")
    assert not ready(torch.zeros(40, 300, dtype=I8), torch.zeros(4, 96, 300, dtype=I8))
    assert not ready(a, torch.zeros(4, 256, 96, dtype=I8).transpose(1, 2))
    assert not ready(torch.zeros(4, 9, 256, dtype=I8)[:, :8], b)


def test_decode_sized_launches_read_through_pointers_and_by_address(gen):
    """An expert's few decode rows (16-row tiles) load through pointers, so the plan reads its tensors by
    address and the native launch path can replay it; prefill-sized tiles (64 rows and more) use TMA, whose
    descriptors are made per call in Python."""
    def plan(rows_per_expert):
        a, a_s, b, b_s = _operands(gen, (4 * rows_per_expert,), 4, 128, 256, FP8)
        offsets = torch.arange(0, 5, dtype=torch.int32) * rows_per_expert
        return grouped.grouped_mm.prepare(a, a_s, b, b_s, offsets, **_on("sm90", "fp8"), **_kw())
    assert getattr(plan(2), "by_address", False)
    assert not getattr(plan(128), "by_address", False)
