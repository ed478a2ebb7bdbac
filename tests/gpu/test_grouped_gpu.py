"""The grouped (mixture-of-experts) GEMMs on the GPU, Triton and CuPy: each expert's rows bit for bit what
`quantcore.ops.scaled_mm` on the same backend computes for those rows, on DeepSeek-like shapes with uneven
routing (empty experts, one row, decode-sized, past the decode kernel's 64 rows and the TMA tiles' 512); the
masked layout; and the masked launch captured in a CUDA graph, replayed on new counts and activations.
The warp-specialized Gluon variant (`triton[gluon]`, sm_90, contiguous layout) likewise against its own
scaled_mm, on its 128-row tiles and the wide tile it takes from 4096 rows, eager and replayed in a CUDA graph.

The grouped kernels never split K, and scaled_mm splits it where its output tiles leave SMs idle (summing
the same K blocks in another order), so scaled_mm runs unsplit here (`helpers.whole_k`).

Run on a GPU machine: `python3 -m pytest -m gpu tests/gpu/test_grouped_gpu.py`.
"""

from __future__ import annotations

import importlib

import pytest
import torch

import quantcore
from quantcore import ops
from quantcore.backends import torch as ref
from quantcore.capability import profile_for

from helpers import assert_gemm_rows_agree, whole_k  # noqa: F401 (a fixture: pytestmark uses it)
from test_parity import poison, rand, run

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("whole_k")]

FP8, I8 = torch.float8_e4m3fn, torch.int8
BACKENDS = ["triton", "cupy"]
# Rows per expert: empty, one, decode-sized, 64 / 65 (the decode kernels' bound), past 512 (the TMA tiles').
COUNTS = [0, 1, 3, 17, 64, 65, 128, 300, 7, 0, 513, 2, 40, 90, 200, 33]


def _grouped(backend):
    pytest.importorskip(backend)
    return importlib.import_module(f"quantcore.backends.{backend}.grouped")


def _activations(qdtype, rows, K, seed=0):
    """Quantized activations [*rows, K] with 1×128 scales [*rows, ceil(K/128)]."""
    a, a_s = ref.act_quant(rand((*rows, K), torch.float32, seed).view(-1, K), qdtype=qdtype, group_size=128,
                           ue8m0=False, eps=1e-4, scale_m_major=False)
    return a.view(*rows, K), a_s.view(*rows, a_s.shape[-1])


def _operands(qdtype, rows, E, N, K):
    """`_activations` and E stacked weights [E, N, K] with 128×128 scales."""
    ws = [ref.weight_quant(rand((N, K), torch.float32, 1 + e), qdtype=qdtype, block_n=128, block_k=128, ue8m0=False,
                           eps=1e-4) for e in range(E)]
    return (*_activations(qdtype, rows, K), torch.stack([w for w, _ in ws]), torch.stack([s for _, s in ws]))


def _launch_options(backend, a, a_s, b, b_s, **epilogue):
    """The grouped launch's options for `epilogue` (ops.scaled_mm's keywords), with the `mma` of the scaled_mm
    variant that `backend` runs here."""
    explained = quantcore.explain("scaled_mm", a, a_s, b[0], b_s[0], backend=backend)
    return dict(block_n=128, block_k=128, bias=epilogue.get("bias"), activation=epilogue.get("activation"),
                out_dtype=epilogue.get("out_dtype", torch.bfloat16), out_quant=epilogue.get("out_quant"),
                out_group=epilogue.get("out_group_size", 128), ue8m0_out=False, eps=1e-4,
                profile=profile_for(a.device), mma=explained.options["mma"])


def _parts(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


def _bits(t):
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def _assert_scaled_mm_rows(backend, got: tuple, a, a_s, b, b_s, e, epilogue):
    bias = epilogue.get("bias")
    want = _parts(ops.scaled_mm(a, a_s, b[e], b_s[e], **dict(epilogue, bias=None if bias is None else bias[e]),
                                backend=backend))
    for g, w in zip(got, want, strict=True):
        if a.dtype == FP8 and g.is_floating_point() and g.element_size() > 1:  # a float output of FP8 operands
            assert_gemm_rows_agree(g, w, f"expert {e} ({a.shape[0]} rows)")
            continue
        assert g.dtype == w.dtype and g.shape == w.shape
        same = _bits(g) == _bits(w)
        assert bool(same.all()), f"expert {e} ({a.shape[0]} rows): {int((~same).sum())} elements differ"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("qdtype", [FP8, I8])
@pytest.mark.parametrize("N,K,epilogue", [
    (4096, 7168, {}),
    (512, 7168, {}),
    (512, 7168, dict(bias=True, activation="silu", requantize=True)),  # a bf16 bias; q and scales in a's format
])
def test_contiguous_is_scaled_mm_per_expert(backend, qdtype, N, K, epilogue):
    grouped = _grouped(backend)
    a, a_s, b, b_s = _operands(qdtype, (sum(COUNTS),), len(COUNTS), N, K)
    if epilogue:
        epilogue = dict(activation=epilogue["activation"], out_quant=qdtype,
                        bias=rand((len(COUNTS), N), torch.bfloat16, seed=99))
    offsets = torch.tensor([sum(COUNTS[:e]) for e in range(len(COUNTS) + 1)], dtype=torch.int32, device="cuda")
    poison()
    out = _parts(grouped.grouped_mm(a, a_s, b, b_s, offsets, **_launch_options(backend, a, a_s, b, b_s, **epilogue)))
    for e, (lo, hi) in enumerate(zip(offsets.tolist(), offsets.tolist()[1:])):
        if hi > lo:
            _assert_scaled_mm_rows(backend, tuple(t[lo:hi] for t in out), a[lo:hi], a_s[lo:hi], b, b_s, e, epilogue)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("qdtype", [FP8, I8])
@pytest.mark.parametrize("N,K", [(4096, 7168), (7168, 2048)])
def test_masked_is_scaled_mm_per_expert(backend, qdtype, N, K):
    grouped = _grouped(backend)
    E, max_m = 8, 96
    a, a_s, b, b_s = _operands(qdtype, (E, max_m), E, N, K)
    masked_m = torch.tensor([0, 1, 96, 5, 64, 65, 17, 200], dtype=torch.int32, device="cuda")  # 200: max_m
    poison()
    out = grouped.grouped_mm_masked(a, a_s, b, b_s, masked_m, **_launch_options(backend, a, a_s, b, b_s))
    for e, count in enumerate(min(c, max_m) for c in masked_m.tolist()):
        if count:
            _assert_scaled_mm_rows(backend, (out[e, :count],), a[e, :count], a_s[e, :count], b, b_s, e, {})


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("qdtype", [FP8, I8])
def test_masked_launch_replays_in_a_cuda_graph(backend, qdtype):
    """Captured once, replayed after the counts and activations changed in place: the rows an eager launch
    computes for the new inputs, bit for bit, with no host synchronization inside the capture."""
    grouped = _grouped(backend)
    E, max_m, N, K = 8, 32, 512, 7168
    a, a_s, b, b_s = _operands(qdtype, (E, max_m), E, N, K)
    masked_m = torch.tensor([3, 0, 32, 1, 7, 16, 0, 2], dtype=torch.int32, device="cuda")
    run = grouped.grouped_mm_masked.prepare(a, a_s, b, b_s, masked_m, **_launch_options(backend, a, a_s, b, b_s))
    run(a, a_s, b, b_s, masked_m)  # compiles and binds the direct launch outside the capture
    run(a, a_s, b, b_s, masked_m)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run(a, a_s, b, b_s, masked_m)
    for old, new in zip((a, a_s), _activations(qdtype, (E, max_m), K, seed=7)):
        old.copy_(new)
    masked_m.copy_(torch.tensor([32, 5, 0, 9, 1, 0, 31, 4], dtype=torch.int32))
    graph.replay()
    eager = run(a, a_s, b, b_s, masked_m)
    torch.cuda.synchronize()
    for e, count in enumerate(masked_m.tolist()):
        assert torch.equal(_bits(captured[e, :count]), _bits(eager[e, :count])), f"expert {e}"
        if count:
            _assert_scaled_mm_rows(backend, (captured[e, :count],), a[e, :count], a_s[e, :count], b, b_s, e, {})


GLUON = "triton[gluon]"
# Rows per expert around the Gluon kernel's 128-row tiles: COUNTS, then a whole tile, one row past it, several.
GLUON_COUNTS = COUNTS + [128, 129, 384, 1000]
# From 4096 rows in all and N a multiple of 256, the wide 128x256 tile (config_for), staggered at K <= 2048.
WIDE_COUNTS = [0, 700, 1, 1500, 129, 2000]


def _offsets(counts):
    return torch.tensor([sum(counts[:e]) for e in range(len(counts) + 1)], dtype=torch.int32, device="cuda")


@pytest.mark.parametrize("qdtype", [FP8, I8])
@pytest.mark.parametrize("counts,N,K,epilogue", [
    (GLUON_COUNTS, 4096, 7168, {}),
    (GLUON_COUNTS, 2112, 2048, {}),  # N's last column tile part empty: its columns read the next expert's weight
    (GLUON_COUNTS, 512, 7168, dict(bias=True, activation="silu", requantize=True)),  # the staged epilogue
    (GLUON_COUNTS, 4096, 2048, dict(bias=True, requantize=True)),  # the bias staged by the producer, re-quantized
    (WIDE_COUNTS, 4096, 2048, {}),
], ids=["4096x7168", "2112x2048", "silu-requantized", "bias-requantized", "wide"])
def test_gluon_contiguous_is_its_scaled_mm_per_expert(qdtype, counts, N, K, epilogue):
    """Each expert's rows of the Gluon grouped GEMM are those of the Gluon scaled_mm on them (FP8 float outputs within
    the reduced-precision accumulation's tolerance where the two pick tiles of different widths), with tiles that end
    inside an expert, empty experts and rows of other experts read past each tile's end never stored."""
    a, a_s, b, b_s = _operands(qdtype, (sum(counts),), len(counts), N, K)
    if epilogue:
        epilogue = dict(activation=epilogue.get("activation"), out_quant=qdtype,
                        bias=rand((len(counts), N), torch.bfloat16, seed=99))
    offsets = _offsets(counts)
    out = _parts(run(GLUON, None, ops.grouped_mm, a, a_s, b, b_s, offsets, **epilogue))
    assert quantcore.explain("grouped_mm", a, a_s, b, b_s, offsets, backend=GLUON).selected == GLUON
    for e, (lo, hi) in enumerate(zip(offsets.tolist(), offsets.tolist()[1:])):
        if hi > lo:
            _assert_scaled_mm_rows(GLUON, tuple(t[lo:hi] for t in out), a[lo:hi], a_s[lo:hi], b, b_s, e, epilogue)


@pytest.mark.parametrize("qdtype", [FP8, I8])
def test_gluon_contiguous_replays_in_a_cuda_graph(qdtype):
    """The Gluon grouped GEMM reads the offsets on the device: captured once, replayed after the offsets and the
    activations changed in place (other experts' rows, an expert emptied), it computes what an eager call does."""
    counts, N, K = [3, 0, 300, 129, 1, 200, 0, 64], 1024, 2048
    a, a_s, b, b_s = _operands(qdtype, (sum(counts),), len(counts), N, K)
    offsets = _offsets(counts)
    run(GLUON, None, ops.grouped_mm, a, a_s, b, b_s, offsets)  # skips where the variant cannot run
    launch = importlib.import_module("quantcore.backends.triton.gluon_launch")
    options = dict(block_n=128, block_k=128, bias=None, activation=None, out_dtype=torch.bfloat16, out_quant=None,
                   out_group=128, ue8m0_out=False, eps=1e-4, profile=profile_for(a.device))
    prepared = launch.grouped_mm.prepare(a, a_s, b, b_s, offsets, **options)
    prepared(a, a_s, b, b_s, offsets)  # compiles and binds the direct launch outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = prepared(a, a_s, b, b_s, offsets)
    for old, new in zip((a, a_s), _activations(qdtype, (sum(counts),), K, seed=7)):
        old.copy_(new)
    counts = [0, 130, 2, 400, 0, 128, 36, 1]  # the same rows in all
    offsets.copy_(_offsets(counts))
    graph.replay()
    eager = prepared(a, a_s, b, b_s, offsets)
    torch.cuda.synchronize()
    for e, (lo, hi) in enumerate(zip(offsets.tolist(), offsets.tolist()[1:])):
        assert torch.equal(_bits(captured[lo:hi]), _bits(eager[lo:hi])), f"expert {e}"
        if hi > lo:
            _assert_scaled_mm_rows(GLUON, (captured[lo:hi],), a[lo:hi], a_s[lo:hi], b, b_s, e, {})
