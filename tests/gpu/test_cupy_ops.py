"""The CuPy backend through `quantcore.ops` on the GPU: a kept plan run on new tensors of the same layout
gives the reference's result for every op; the split-K GEMM and quant_linear captured in a CUDA graph
replay the eager bits; and the variant `explain()` names is the one that runs, on this GPU and
simulated as sm_80 and sm_75 (the launch's `mma` option is spied on).

Run on a GPU machine: `python3 -m pytest -m gpu tests/gpu`.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("cupy")

import quantcore  # noqa: E402
from quantcore import capability, ops, registry  # noqa: E402
from quantcore.runtime import workspace  # noqa: E402
from quantcore.backends.cupy import launch  # noqa: E402
from quantcore.definitions.tolerances import REQUANT_SCALE_RTOL, gemm_tolerance, rel_error  # noqa: E402

from test_parity import FMTS, rand, same_q, same_scale  # noqa: E402

FP8, I8 = torch.float8_e4m3fn, torch.int8


def _gemm_operands(m, n, k, qdtype, seed):
    a, a_s = ops.act_quant(rand((m, k), seed=seed), dtype=qdtype, backend="torch")
    b, b_s = ops.weight_quant(rand((n, k), seed=seed + 1), dtype=qdtype, backend="torch")
    return a, a_s, b, b_s


def _quantized(shape, qdtype, seed):
    return ops.act_quant(rand(shape, seed=seed), dtype=qdtype, backend="torch")


# op -> (a function of a seed giving the op's arguments, options, a judge of (result, reference)).
def _equal(out, ref):
    return torch.equal(out.nan_to_num(7), ref.nan_to_num(7))


def _same_quantized(out, ref):
    return same_q(out[0], ref[0]) and same_scale(out[1].contiguous(), ref[1])


def _gelu_close(out, ref):
    (q2, s2), (rq, rs) = out, ref
    return torch.allclose(s2, rs, rtol=REQUANT_SCALE_RTOL, atol=0) and (q2.float() != rq.float()).float().mean() <= 1e-3


def _gemm_close(fmt, out_dtype):
    return lambda out, ref: rel_error(out, ref) <= gemm_tolerance(fmt, out_dtype, True)


CASES = {
    "act_quant": (lambda s: (rand((33, 1000), seed=s),), dict(dtype=FP8, scale_layout="m_major"), _same_quantized),
    "weight_quant": (lambda s: (rand((300, 1000), seed=s),), dict(dtype=I8), _same_quantized),
    "act_dequant": (lambda s: _quantized((33, 1000), I8, s), dict(out_dtype=torch.bfloat16), _equal),
    "weight_dequant": (lambda s: ops.weight_quant(rand((300, 1000), seed=s), backend="torch"),
                       dict(out_dtype=torch.float32), _equal),
    "quantized_gelu": (lambda s: _quantized((33, 1000), FP8, s), dict(approximate="tanh"), _gelu_close),
    "dequant_bias": (lambda s: (rand((33, 1000), seed=s), rand((33,), torch.float32, s + 1).abs(),
                                rand((1000,), torch.float32, s + 2).abs(), rand((1000,), seed=s + 3)),
                     dict(out_dtype=torch.float32), _equal),
    # M = 1 on 2112 x 7168: split K; a bf16 bias, converted per call.
    "scaled_mm": (lambda s: _gemm_operands(1, 2112, 7168, FP8, s),
                  dict(bias=rand((2112,), seed=2), activation="silu", out_dtype=torch.float32),
                  _gemm_close("fp8_e4m3", torch.float32)),
    "quant_linear": (lambda s: (rand((1, 7168), seed=s), *ops.weight_quant(rand((2112, 7168), seed=s + 1), dtype=I8,
                                                                              backend="torch")),
                     dict(out_dtype=torch.bfloat16), _gemm_close("int8", torch.bfloat16)),
}


@pytest.mark.parametrize("op", list(CASES))
def test_a_kept_plan_on_new_tensors_gives_the_reference(monkeypatch, op):
    make, options, judge = CASES[op]
    fn = getattr(launch, op)
    prepares = []
    real = fn.prepare
    monkeypatch.setattr(fn, "prepare", lambda *a, **kw: prepares.append(1) or real(*a, **kw))
    public = getattr(ops, op)
    for seed in (10, 20):
        args = make(seed)
        out = public(*args, **options, backend="cupy")
        assert judge(out, public(*args, **options, backend="torch")), seed
    assert len(prepares) == 1, "the second call did not run on the kept plan"


def _replay_matches_eager(call, static, fresh_inputs):
    """Capture `call(*static)` in a CUDA graph after an eager warm-up on the capture stream, then for
    each of `fresh_inputs` copy it into `static`, replay, and compare with an eager call, bit for bit."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call(*static)  # the plan is made here, eagerly: the split-K workspace exists before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = call(*static)
    for fresh in fresh_inputs:
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        graph.replay()
        assert torch.equal(out, call(*fresh))
    torch.cuda.synchronize()
    assert not any(c.any() for c in workspace.counters()), "a launch left a split-K counter set"


@pytest.mark.parametrize("qdtype", list(FMTS))
def test_split_k_gemm_and_quant_linear_replay_the_eager_bits(qdtype):
    M, N, K = 1, 2112, 7168
    profile = capability.profile_for("cuda")
    assert launch.gemm_splits(M, N, K, 128, launch.gemm_tile(M), profile.sm_count)[1] > 1
    kw = dict(bias=None, activation="gelu", out_dtype=torch.float32, backend="cupy")
    operands = [_gemm_operands(M, N, K, qdtype, seed) for seed in (1, 2, 3)]
    _replay_matches_eager(lambda *t: ops.scaled_mm(*t, **kw), [t.clone() for t in operands[0]], operands[1:])
    w, w_s = operands[0][2:]
    xs = [(rand((M, K), seed=seed),) for seed in (4, 5, 6)]
    _replay_matches_eager(lambda x: ops.quant_linear(x, w, w_s, out_dtype=torch.bfloat16, backend="cupy"),
                          [xs[0][0].clone()], xs[1:])


@pytest.mark.parametrize("profile", [None, "sm80", "sm75"])
@pytest.mark.parametrize("qdtype", list(FMTS))
@pytest.mark.parametrize("op", ["scaled_mm", "quant_linear"])
def test_the_variant_explain_names_is_the_one_that_runs(monkeypatch, profile, qdtype, op):
    ran = []
    real = launch._gemm
    monkeypatch.setattr(launch, "_gemm", lambda *a, mma, **kw: ran.append(mma) or real(*a, mma=mma, **kw))
    a, a_s, b, b_s = _gemm_operands(16, 512, 1024, qdtype, seed=7)
    args = (a, a_s, b, b_s) if op == "scaled_mm" else (rand((16, 1024), seed=8), b, b_s)
    with quantcore.simulate(profile) if profile else contextlib.nullcontext():
        named = quantcore.explain(op, *args, backend="cupy").selected
        getattr(ops, op)(*args, backend="cupy")
        fp8_mma = capability.profile_for("cuda").fp8_mma
    fmt = FMTS[qdtype]
    (impl,) = [i for i in registry.impls(op) if i.label == named and fmt in i.constraints.formats]
    assert ran and set(ran) == {dict(impl.options)["mma"]}  # (quant_linear: one GEMM, or a fused try first)
    expected = "int8" if qdtype == I8 else "fp8" if fp8_mma else "fp16"
    assert set(ran) == {expected} and named == ("cupy[w8a16]" if expected == "fp16" else "cupy")


@pytest.mark.parametrize("profile", [None, "sm80", "sm75"])
@pytest.mark.parametrize("qdtype", list(FMTS))
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("m,n,k", [(1, 2112, 7168), (4, 4000, 1000), (8, 129, 7296), (2, 7168, 16384),
                                   (16, 2112, 7168), (32, 4000, 1000), (33, 4000, 1000), (16, 7168, 16384)])
def test_quant_linear_fuses_its_quantization_bit_for_bit(monkeypatch, profile, qdtype, x_dtype, m, n, k):
    """Up to FUSED_M_MAX rows quant_linear is one launch whose prologue quantizes x (a row-strided view
    here, with a NaN in one row's group and another group of zeros), bit for bit act_quant + scaled_mm
    on this backend; where the activation's codes do not fit shared memory beside the weight's stages
    (K = 16384 at two rows on an H100 or as an A100), the two launches. Up to ONCE_M_MAX rows, for
    weights of at most ONCE_NK_MAX elements, one launch quantizing x once, the same bits, its flags
    back at zero after each launch; beyond, the two launches."""
    calls, real = [], launch._gemm

    def spy(*args, **kwargs):  # (asked for the fused prologue, got a launch)
        gemm = real(*args, **kwargs)
        calls.append((kwargs.get("a_quant") is not None, gemm is not None))  # (a try at one launch, made)
        return gemm
    monkeypatch.setattr(launch, "_gemm", spy)
    x = rand((m, k + 64), seed=20).to(x_dtype)[:, 32:32 + k]
    x[0, 300] = float("nan")
    x[-1, 128:256] = 0
    _, _, w, w_s = _gemm_operands(m, n, k, qdtype, seed=21)
    bias = rand((n,), seed=22)
    with quantcore.simulate(profile) if profile else contextlib.nullcontext():
        for options in (dict(out_dtype=torch.float32), dict(activation="silu", scale_fmt="ue8m0")):
            calls.clear()
            got = ops.quant_linear(x, w, w_s, bias, backend="cupy", **options)
            made, one_launch = list(calls), calls[:1] == [(True, True)]  # (quantized once: composed prepared too)
            a, a_s = ops.act_quant(x, dtype=qdtype, scale_fmt=options.get("scale_fmt", "fp32"), backend="cupy")
            want = ops.scaled_mm(a, a_s, w, w_s, bias=bias, activation=options.get("activation"),
                                 out_dtype=options.get("out_dtype", torch.bfloat16), backend="cupy")
            # Composed: the fused launch tried and refused, or not tried.
            assert made in ([(True, True)], [(True, True), (False, True)], [(True, False), (False, True)],
                            [(False, True)]), made
            if launch.FUSED_M_MAX < m <= launch.ONCE_M_MAX and n * k <= launch.ONCE_NK_MAX:
                assert made == [(True, True), (False, True)], made  # quantized once; composed kept for captures
            elif profile != "sm75":  # (a T4's 64 KiB of shared memory leaves less room: some shapes fuse there)
                assert one_launch == (m <= launch.FUSED_M_MAX and k != 16384), made
            assert torch.equal(got.nan_to_num(7), want.nan_to_num(7)) and bool(got[0].isnan().all())
            assert not any(c.any() for c in workspace.counters())


def test_a_captured_quant_linear_runs_act_quant_then_the_gemm(monkeypatch):
    """At 16 rows the CuPy quant_linear is one launch eagerly (the activation quantized once inside the
    GEMM) and, captured into a graph, act_quant then the GEMM (less GPU time): the same bits, replays
    following the input."""
    calls, real = [], launch._kernel

    def recording(filename, expr, *args, **kwargs):
        inner = real(filename, expr, *args, **kwargs)

        def call(*addresses):
            calls.append(expr.split("<")[0] + (" once" if expr.endswith(", true>") else ""))
            return inner(*addresses)
        return call
    monkeypatch.setattr(launch, "_kernel", recording)
    registry.reset()  # plans kept by earlier tests hold the real launchers, and these must not outlive it
    w, w_s = ops.weight_quant(rand((1024, 3072), seed=7))
    x = rand((16, 3072), seed=8)
    try:
        eager = ops.quant_linear(x, w, w_s, backend="cupy")
        assert calls == ["qc::gemm_kernel once"]
        calls.clear()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = ops.quant_linear(x, w, w_s, backend="cupy")
        assert calls == ["qc::quant_kernel", "qc::gemm_kernel"]
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
        x.copy_(rand((16, 3072), seed=9))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, ops.quant_linear(x, w, w_s, backend="cupy"))
    finally:
        registry.reset()