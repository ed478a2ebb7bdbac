"""Decode-sized GEMMs (M <= 64) and the one-launch quantized linear (to 128 rows) on the GPU: parity with the
reference on DeepSeek-V3 decode shapes with tails, bit-identity of quant_linear with act_quant +
scaled_mm (past 64 rows with K split as the tiled GEMM splits it), determinism of the split-K reduction
(decode and tiled kernels), CUDA-graph replay, and the direct Triton launch.

Run on a GPU machine: `python3 -m pytest -m gpu tests/gpu`.
"""

from __future__ import annotations

import contextlib
import itertools

import pytest
import torch

import quantcore
from quantcore import ops, registry
from quantcore.definitions.tolerances import gemm_tolerance, rel_error

from test_parity import FMTS, rand, run

pytestmark = pytest.mark.gpu

DECODE_NK = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168), (7168, 16384), (32768, 512)]
DECODE_SHAPES = [(m, n, k) for m in (1, 4, 16, 64) for n, k in DECODE_NK] + [
    (3, 4000, 1000), (17, 200, 576), (64, 129, 7296), (2, 7168, 127)]


def operands(m, n, k, qdtype, block=(128, 128)):
    a, a_s = ops.act_quant(rand((m, k), seed=2), dtype=qdtype, group_size=block[1], backend="torch")
    b, b_s = ops.weight_quant(rand((n, k), seed=3), dtype=qdtype, block_size=block, backend="torch")
    return a, a_s, b, b_s


def exact(backend, profile, *args) -> bool:
    with quantcore.simulate(profile) if profile else contextlib.nullcontext():
        return quantcore.explain("scaled_mm", *args, backend=backend).numerics == "exact"


@pytest.mark.parametrize("backend", registry.compared("scaled_mm"))
@pytest.mark.parametrize("qdtype", list(FMTS))
@pytest.mark.parametrize("mnk", DECODE_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_decode_shapes(backend, qdtype, mnk):
    a, a_s, b, b_s = operands(*mnk, qdtype)
    bias = rand((mnk[1],), seed=4)
    for activation in (None, "silu"):
        ref = ops.scaled_mm(a, a_s, b, b_s, bias=bias, activation=activation, out_dtype=torch.float32,
                            backend="torch")
        out = run(backend, None, ops.scaled_mm, a, a_s, b, b_s, bias=bias, activation=activation,
                  out_dtype=torch.float32)
        assert not out.isnan().any()
        assert rel_error(out, ref) <= gemm_tolerance(FMTS[qdtype], torch.float32, exact(backend, None, a, a_s, b, b_s))


@pytest.mark.parametrize("profile", [None, "sm80"])
@pytest.mark.parametrize("backend", registry.compared("quant_linear"))
@pytest.mark.parametrize("qdtype", list(FMTS))
@pytest.mark.parametrize("block", [(128, 128), (64, 128)])
@pytest.mark.parametrize("m", [1, 3, 5, 16, 64, 65, 128, 300])
def test_quant_linear_is_act_quant_then_scaled_mm_bit_for_bit(backend, profile, qdtype, block, m):
    n, k = 2112, 1000
    x = rand((m, k), seed=5)
    _, _, w, w_s = operands(m, n, k, qdtype, block)
    bias = rand((n,), seed=6)
    for options in (dict(out_dtype=torch.bfloat16), dict(activation="gelu", out_dtype=torch.float32, scale_fmt="ue8m0")):
        got = run(backend, profile, ops.quant_linear, x, w, w_s, bias, block_size=block, **options)
        # A GEMM-only variant ("triton[gluon]") quantizes with its backend's act_quant.
        a, a_s = run(backend.partition("[")[0], profile, ops.act_quant, x, dtype=qdtype, group_size=block[1],
                     scale_fmt=options.get("scale_fmt", "fp32"))
        want = run(backend, profile, ops.scaled_mm, a, a_s, w, w_s, bias=bias, block_size=block,
                   activation=options.get("activation"), out_dtype=options["out_dtype"])
        assert torch.equal(got, want)


@pytest.mark.parametrize("qdtype", list(FMTS))
@pytest.mark.parametrize("m", [4, 128])
def test_split_k_is_deterministic(qdtype, m):
    """Few column tiles: K is split, in the decode kernel (4 rows) and the tiled one (128 rows on sm_90)."""
    a, a_s, b, b_s = operands(m, 2112, 7168, qdtype)
    first = ops.scaled_mm(a, a_s, b, b_s, out_dtype=torch.float32, backend="triton")
    for _ in range(20):
        assert torch.equal(ops.scaled_mm(a, a_s, b, b_s, out_dtype=torch.float32, backend="triton"), first)
    # Another shape in between uses the same counters: they must be back at zero.
    c, c_s, d, d_s = operands(16, 4096, 7168, qdtype)
    ops.scaled_mm(c, c_s, d, d_s, backend="triton")
    assert torch.equal(ops.scaled_mm(a, a_s, b, b_s, out_dtype=torch.float32, backend="triton"), first)


@pytest.mark.parametrize("m", [1, 16, 100])
@pytest.mark.parametrize("backend", registry.compared("quant_linear"))
def test_cuda_graph_replays_the_quantized_linear(backend, m):
    """Replays of a captured quant_linear follow the input and equal its eager calls; on the H100 at 16
    and 100 rows the eager call quantizes the activation once per launch (at 100 K unsplit, on both Triton
    variants), whose flags must be back at zero for each replay."""
    w, w_s = ops.weight_quant(rand((4096, 4096), seed=7))
    x = rand((m, 4096), seed=8)
    bias = rand((4096,), seed=9)
    with quantcore.priority(backend):
        eager = ops.quant_linear(x, w, w_s, bias)  # warm-up: compiles, allocates the split-K workspace
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = ops.quant_linear(x, w, w_s, bias)
        for seed in (10, 11):
            x.copy_(rand((m, 4096), seed=seed))
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, ops.quant_linear(x, w, w_s, bias))
    assert not torch.equal(out, eager)


@pytest.mark.parametrize("m, gemm", [(16, "decode_mm_kernel"), (100, "block_scaled_mm_kernel")])
def test_a_captured_quant_linear_runs_act_quant_then_the_gemm(monkeypatch, m, gemm):
    """At 16 and 100 rows on the H100 the Triton quant_linear is one launch eagerly (the activation
    quantized once inside the decode GEMM) and, captured into a graph, act_quant then scaled_mm's GEMM
    (less GPU time): the same bits."""
    from quantcore.backends.triton import launch

    w, w_s = ops.weight_quant(rand((1024, 3072), seed=7))
    x = rand((m, 3072), seed=8)
    calls = []

    class Recording(launch.Launcher):  # each launcher's first launch goes through its __call__
        def __call__(self, *args):
            calls.append((self.fn.fn.__name__, self.constants.get("ONCE", False)))
            return super().__call__(*args)
    monkeypatch.setattr(launch, "Launcher", Recording)
    registry.reset()  # plans kept by earlier tests hold the real launchers, and these must not outlive it
    try:
        with quantcore.priority("triton"):
            eager = ops.quant_linear(x, w, w_s)
            assert calls == [("decode_mm_kernel", True)]
            calls.clear()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = ops.quant_linear(x, w, w_s)
            assert calls == [("block_quant_kernel", False), (gemm, False)]
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, eager)
    finally:
        registry.reset()


@pytest.mark.parametrize("k, n, batches", [(7168, 2112, (1, 8, 128, 300)), (3072, 1024, (100,))])
@pytest.mark.parametrize("qdtype", list(FMTS))
def test_layer_eagerly_and_in_a_cuda_graph_is_the_op(qdtype, k, n, batches):
    """QuantLinear's kept call site (`dispatch.Site`) on decoder-shaped inputs [B, 1, K], with a bias:
    bit for bit ops.quant_linear, eagerly (driver launches; one launch at 1-8 and at 100 rows, two at 128
    and 300 rows of K = 7168, on the Gluon GEMM for FP8 at 128 and both formats at 300) and replayed from a
    CUDA graph, and replayed by the dispatcher directly: no per-call view of x, no reshape of the result."""
    from quantcore.nn import QuantLinear

    lin = torch.nn.Linear(k, n, device="cuda", dtype=torch.bfloat16).requires_grad_(False)
    layer = QuantLinear.from_linear(lin, dtype=qdtype)
    with torch.inference_mode():
        for batch in batches:
            x = rand((batch, 1, k), seed=20 + batch)
            op = lambda: ops.quant_linear(x, layer.weight, layer.weight_scale_inv, layer.bias)
            for _ in range(3):
                assert torch.equal(layer(x), op())
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.stream(side):
                layer(x)
                with torch.cuda.graph(graph, stream=side):
                    out = layer(x)
            torch.cuda.current_stream().wait_stream(side)
            x.copy_(rand((batch, 1, k), seed=30 + batch))
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, op())
            # The replay takes x [B, 1, K] itself (no flattening view) and returns [B, 1, N] (no reshape).
            plan = layer._site._kept[1]
            assert plan.direct == 4 and plan.finish is None  # the results as the launch returns them


def test_direct_and_jit_launches_compute_the_same(monkeypatch):
    """Every Triton op launched through the JIT (QUANTCORE_TRITON_DIRECT=0) and directly: same bits."""
    from quantcore.backends.triton import direct

    assert direct.enabled(), "the installed Triton should be one the direct launcher supports"
    x = rand((16, 7168), seed=12)
    w = rand((2112, 7168), seed=13)
    results = {}
    for mode in ("0", "1"):
        monkeypatch.setenv(direct.DIRECT_ENV, mode)
        registry.clear_caches()  # new plans, so new launchers
        outs = []
        for _ in range(3):  # the first call compiles; later ones launch directly where enabled
            q, s = ops.act_quant(x, backend="triton")
            wq, ws = ops.weight_quant(w, backend="triton")
            outs = [q, s, wq, ws, ops.act_dequant(q, s, backend="triton"), ops.weight_dequant(wq, ws, backend="triton"),
                    *ops.quantized_gelu(q, s, backend="triton"), ops.scaled_mm(q, s, wq, ws, backend="triton"),
                    ops.quant_linear(x, wq, ws, backend="triton"),
                    ops.dequant_bias(x, s[:, 0].contiguous(), w[0].float(), backend="triton")]
        results[mode] = [o.view(torch.uint8) if o.dtype == torch.float8_e4m3fn else o for o in outs]
    assert all(torch.equal(a, b) for a, b in zip(results["0"], results["1"], strict=True))


def test_launcher_goes_direct_after_its_first_call(monkeypatch):
    import triton
    import triton.language as tl

    from quantcore.backends.triton import direct

    @triton.jit
    def add_one(x_ptr, y_ptr, n, scale, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * scale + 1, mask=offs < n)

    x = torch.arange(1000, device="cuda", dtype=torch.float32)
    for (mode, goes_direct), fixed in itertools.product((("1", True), ("0", False)), ((), (1000, 2.5))):
        monkeypatch.setenv(direct.DIRECT_ENV, mode)
        # The trailing scalars given on every call, or fixed once (`fixed`).
        launcher = direct.Launcher(add_one, (8,), dict(BLOCK=128, num_warps=4), x.device, fixed=fixed)
        for stream in (torch.cuda.current_stream(), torch.cuda.Stream(), torch.cuda.current_stream()):
            with torch.cuda.stream(stream):  # each launch on the stream current then
                y = torch.full_like(x, -1.0)
                launcher(x, y, *(() if fixed else (1000, 2.5)))
                assert torch.equal(y, x * 2.5 + 1)
        assert launcher.direct is goes_direct
        # Straight to the C launcher where the Triton version's is known (no scratch, no descriptors here).
        raw = goes_direct and direct.version_supported(triton.__version__, direct.RAW_SUPPORTED)
        assert launcher.raw is raw
        if fixed:  # a generated run calls that C launcher itself from its second launch on
            run = direct.Launcher(add_one, (8,), dict(BLOCK=128, num_warps=4), x.device, fixed=fixed).function(
                "x", ("x", "_y"), {"_y": lambda: torch.full_like(x, -1.0)}, "_y")
            for stream in (torch.cuda.current_stream(), torch.cuda.Stream(), torch.cuda.current_stream()):
                with torch.cuda.stream(stream):
                    assert torch.equal(run(x), x * 2.5 + 1)
            assert (run.__globals__["_raw"] is not None) is raw


@pytest.mark.parametrize("backend, m", [("triton", 4096), ("triton[gluon]", 128), ("triton[gluon]", 300)])
@pytest.mark.parametrize("qdtype", list(FMTS))
def test_launches_with_tma_descriptors_keep_them_per_address(monkeypatch, backend, m, qdtype):
    """GEMMs whose kernels take TMA descriptors (the tiled kernel at large M, the Gluon kernel with a
    TMA store, and with masked stores at N = 1001) launch straight to Triton's C launcher on
    RAW_SUPPORTED versions, with each descriptor encoded once per address and kept; through the same
    kept plan, operands at new and reused addresses (more than the launcher keeps) and a CUDA graph give
    bit for bit what the JIT launch gives."""
    import triton

    from quantcore.backends.triton import direct

    monkeypatch.setattr(direct, "DESCRIPTORS_KEPT", 2)
    n, k = (1001, 1024) if m == 300 else (2112, 1536)
    cases = [operands(m, n, k, qdtype) for _ in range(3)]
    seen = []
    real = direct.Launcher.__call__

    def spy(self, *args):
        seen.append(self)
        return real(self, *args)
    monkeypatch.setattr(direct.Launcher, "__call__", spy)
    outs = {}
    for mode in ("0", "1"):
        monkeypatch.setenv(direct.DIRECT_ENV, mode)
        registry.clear_caches()  # new plans, so new launchers
        outs[mode] = [run(backend, None, ops.scaled_mm, *c) for c in cases + cases[::-1] + cases]
    assert all(torch.equal(a, b) for a, b in zip(outs["0"], outs["1"], strict=True))
    launcher = seen[-1]
    assert launcher.descriptors and launcher.direct
    assert launcher.raw is direct.version_supported(triton.__version__, direct.RAW_SUPPORTED)
    graph, static = torch.cuda.CUDAGraph(), cases[1]
    with torch.cuda.graph(graph):
        captured = ops.scaled_mm(*static, backend=backend)
    graph.replay()
    assert torch.equal(captured, outs["1"][1])
