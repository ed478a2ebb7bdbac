"""Every GPU implementation against the torch reference on the same GPU, on DeepSeek-V3 shapes with
tails, on the real device and simulated as older GPUs (so pre-FP8 paths run for real).

Run on a GPU machine: `python3 -m pytest -m gpu tests/gpu`.
"""

from __future__ import annotations

import contextlib
import functools

import pytest
import torch

import quantcore
from helpers import TAIL_EPS, activation_inputs, check_activation, judge_quantized_gelu, tail_blocks, tail_gemm_operands
from helpers import same_codes as same_q
from quantcore import UnsupportedError, ops, registry
from quantcore.definitions.tolerances import REQUANT_SCALE_RTOL, gemm_tolerance, rel_error, requant_within_one_step

pytestmark = pytest.mark.gpu

FMTS = {torch.float8_e4m3fn: "fp8_e4m3", torch.int8: "int8"}
PROFILES = [None, "sm80", "sm75"]  # None: the real device
DEEPSEEK_NK = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168)]
# Tails: tiny M and odd K on the pointer path; on Hopper's TMA path (M > 512) a K tail of 16 and an odd
# count of K blocks (two blocks per iteration leave a phantom one).
GEMM_SHAPES = [(m, n, k) for m in (1, 64, 4096) for n, k in DEEPSEEK_NK] + [(7, 129, 129), (65, 200, 576),
                                                                            (3, 4096, 127), (600, 1000, 1040),
                                                                            (520, 264, 7296)]
QUANT_SHAPES = [(1, 7168), (64, 2048), (4096, 1536), (4096, 7168), (7, 129), (33, 576), (5, 1), (3, 127)]


def poison() -> None:
    """Fill freed cached memory with 0xFF so an unwritten output element shows up (NaN / -1)."""
    junk = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    junk.fill_(0xFF)
    del junk


def run(backend, profile, fn, *args, **kwargs):
    """Call `fn` forcing `backend` under a simulated `profile`; skip (with the reasons) where it cannot run."""
    poison()
    with quantcore.simulate(profile) if profile else contextlib.nullcontext():
        try:
            return fn(*args, backend=backend, **kwargs)
        except UnsupportedError as err:
            pytest.skip(f"{backend} on {profile or 'this GPU'}: {err.reasons}")


def exact_accumulation(backend, profile, *args) -> bool:
    """Whether the scaled_mm implementation `backend` picks here declares exact (fp32/int32) accumulation."""
    with quantcore.simulate(profile) if profile else contextlib.nullcontext():
        return quantcore.explain("scaled_mm", *args, backend=backend).numerics == "exact"


def rand(shape, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(*shape, generator=g, device="cuda")
    return (x * torch.exp(torch.randn(*shape[:-1], 1, generator=g, device="cuda"))).to(dtype)


def same_scale(a, b):
    return a.shape == b.shape and torch.equal(a.nan_to_num(0, 1, -1), b.nan_to_num(0, 1, -1)) and torch.equal(
        a.isnan(), b.isnan())


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("backend", registry.compared("act_quant"))
@pytest.mark.parametrize("scale_fmt", ["fp32", "ue8m0"])
@pytest.mark.parametrize("qdtype", list(FMTS))
@pytest.mark.parametrize("shape", QUANT_SHAPES)
def test_act_quant_and_dequant(backend, profile, qdtype, scale_fmt, shape):
    x = rand(shape)
    x[0, 0] = float("nan") if shape[1] > 130 else x[0, 0]
    ref_q, ref_s = ops.act_quant(x, dtype=qdtype, scale_fmt=scale_fmt, backend="torch")
    for layout in ("row", "m_major"):
        q, s = run(backend, profile, ops.act_quant, x, dtype=qdtype, scale_fmt=scale_fmt, scale_layout=layout)
        assert same_q(q, ref_q) and same_scale(s.contiguous(), ref_s), layout
    for out_dtype in (torch.bfloat16, torch.float32):
        ref = ops.act_dequant(ref_q, ref_s, out_dtype=out_dtype, backend="torch")
        y = run(backend, profile, ops.act_dequant, ref_q, ref_s, out_dtype=out_dtype)
        assert torch.equal(y.nan_to_num(7), ref.nan_to_num(7))


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("backend", registry.compared("act_quant"))
@pytest.mark.parametrize("qdtype", list(FMTS))
@pytest.mark.parametrize("eps", [1e-40, 7 * 2.0**-121, 7 * 2.0**-120])
def test_ue8m0_scales_at_the_subnormal_edge(backend, profile, qdtype, eps):
    """eps/qmax subnormal or at 2^-126: every backend rounds the scale up to the smallest normal power
    of two, as the reference does (docs/numerics.md); kernels must not flush the subnormal to 0."""
    x = rand((5, 384))
    x[:, 128:256] = 0
    ref_q, ref_s = ops.act_quant(x, dtype=qdtype, scale_fmt="ue8m0", eps=eps, backend="torch")
    q, s = run(backend, profile, ops.act_quant, x, dtype=qdtype, scale_fmt="ue8m0", eps=eps)
    assert float(ref_s[0, 1]) >= 2.0**-126
    assert same_q(q, ref_q) and same_scale(s, ref_s)
    w = rand((200, 300), seed=1)
    w[:128, :128] = 0
    ref_wq, ref_ws = ops.weight_quant(w, dtype=qdtype, scale_fmt="ue8m0", eps=eps, backend="torch")
    wq, ws = run(backend, profile, ops.weight_quant, w, dtype=qdtype, scale_fmt="ue8m0", eps=eps)
    assert same_q(wq, ref_wq) and same_scale(ws, ref_ws)


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("backend", registry.compared("weight_quant"))
@pytest.mark.parametrize("qdtype", list(FMTS))
@pytest.mark.parametrize("shape", [(2112, 7168), (24576, 1536), (129, 200), (7, 1)])
def test_weight_quant_and_dequant(backend, profile, qdtype, shape):
    w = rand(shape, seed=1)
    ref_q, ref_s = ops.weight_quant(w, dtype=qdtype, backend="torch")
    q, s = run(backend, profile, ops.weight_quant, w, dtype=qdtype)
    assert same_q(q, ref_q) and same_scale(s, ref_s)
    ref = ops.weight_dequant(ref_q, ref_s, backend="torch")
    assert torch.equal(run(backend, profile, ops.weight_dequant, ref_q, ref_s), ref)


@functools.lru_cache(maxsize=64)  # the float64 reference GEMM is the slow part: compute it once per case
def gemm_case(m, n, k, qdtype):
    a, a_s = ops.act_quant(rand((m, k), seed=2), dtype=qdtype, backend="torch")
    b, b_s = ops.weight_quant(rand((n, k), seed=3), dtype=qdtype, backend="torch")
    ref = ops.scaled_mm(a, a_s, b, b_s, out_dtype=torch.float32, backend="torch")
    return a, a_s, b, b_s, ref


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("backend", registry.compared("scaled_mm"))
@pytest.mark.parametrize("qdtype", list(FMTS))
@pytest.mark.parametrize("mnk", GEMM_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_scaled_mm_deepseek_shapes(backend, profile, qdtype, mnk):
    a, a_s, b, b_s, ref = gemm_case(*mnk, qdtype)
    for out_dtype in (torch.float32, torch.bfloat16):
        out = run(backend, profile, ops.scaled_mm, a, a_s, b, b_s, out_dtype=out_dtype)
        assert out.dtype == out_dtype and out.shape == ref.shape
        assert not out.isnan().any()
        err = rel_error(out, ref)
        exact = exact_accumulation(backend, profile, a, a_s, b, b_s)
        assert err <= gemm_tolerance(FMTS[qdtype], out_dtype, exact), (out_dtype, err)


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("backend", registry.compared("scaled_mm"))
@pytest.mark.parametrize("qdtype", list(FMTS))
@pytest.mark.parametrize("activation", [None, "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("mnk", [(64, 2112, 7168), (7, 129, 200)], ids=lambda s: "x".join(map(str, s)))
def test_scaled_mm_epilogues(backend, profile, qdtype, activation, mnk):
    a, a_s, b, b_s, _ = gemm_case(*mnk, qdtype)
    bias = rand((mnk[1],), seed=4)
    ref = ops.scaled_mm(a, a_s, b, b_s, bias=bias, activation=activation, out_dtype=torch.float32, backend="torch")
    for out_dtype in (torch.float32, torch.float16):
        out = run(backend, profile, ops.scaled_mm, a, a_s, b, b_s, bias=bias, activation=activation,
                  out_dtype=out_dtype)
        exact = exact_accumulation(backend, profile, a, a_s, b, b_s)
        assert rel_error(out, ref) <= gemm_tolerance(FMTS[qdtype], out_dtype, exact)
    for out_quant in FMTS:
        q, s = run(backend, profile, ops.scaled_mm, a, a_s, b, b_s, bias=bias, activation=activation,
                   out_quant=out_quant)
        _, ref_s = ops.act_quant(ref, dtype=out_quant, backend="torch")
        if exact:
            assert torch.allclose(s, ref_s, rtol=REQUANT_SCALE_RTOL, atol=0)
        else:  # one amax may be off by several times the GEMM's Frobenius error: judge the scales as a whole
            assert rel_error(s, ref_s) <= gemm_tolerance(FMTS[qdtype], torch.float32, exact)
        full = s.repeat_interleave(128, dim=-1)[:, : mnk[1]]
        # The fused re-quantization must encode what the kernel accumulated: judged against the reference
        # where accumulation is exact, else against this implementation's own fp32 result (whose distance
        # from float64 was judged above; near zero it exceeds FP8's finest step, 2^-9 of the scale).
        target = ref if exact else run(backend, profile, ops.scaled_mm, a, a_s, b, b_s, bias=bias,
                                       activation=activation, out_dtype=torch.float32)
        assert requant_within_one_step(q.float() * full, target, full, FMTS[out_quant])


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("backend", registry.compared("dequant_bias"))
@pytest.mark.parametrize("g_dtype", [torch.bfloat16, torch.float16, torch.float32, torch.int32])
@pytest.mark.parametrize("mn", [(4096, 13824), (1, 2560), (33, 3840), (5, 129)])
def test_dequant_bias(backend, profile, g_dtype, mn):
    m, n = mn
    g = torch.randint(-2**20, 2**20, mn, device="cuda", dtype=torch.int32) if g_dtype == torch.int32 else rand(mn).to(g_dtype)
    sa, sb, bias = rand((m,), torch.float32).abs(), rand((n,), torch.float32).abs(), rand((n,), seed=5)
    for out_dtype in (torch.bfloat16, torch.float32):
        ref = ops.dequant_bias(g, sa, sb, bias, out_dtype=out_dtype, backend="torch")
        out = run(backend, profile, ops.dequant_bias, g, sa, sb, bias, out_dtype=out_dtype)
        assert torch.equal(out, ref), "one fp32 evaluation order: results must match bit for bit"


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("backend", registry.compared("quantized_gelu"))
@pytest.mark.parametrize("qdtype", list(FMTS))
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("shape", [(4096, 2048), (7, 129), (64, 7168)])
def test_quantized_gelu(backend, profile, qdtype, approximate, shape):
    q, s = ops.act_quant(rand(shape, seed=6), dtype=qdtype, backend="torch")
    ref_q, ref_s = ops.quantized_gelu(q, s, approximate=approximate, backend="torch")
    q2, s2 = run(backend, profile, ops.quantized_gelu, q, s, approximate=approximate)
    x = ops.act_dequant(q, s, out_dtype=torch.float32, backend="torch")
    exact = torch.nn.functional.gelu(x.double(), approximate=approximate)
    assert torch.allclose(s2, ref_s, rtol=REQUANT_SCALE_RTOL, atol=0)
    full = s2.repeat_interleave(128, dim=-1)[:, : shape[1]]
    assert requant_within_one_step(q2.float() * full, exact, full, FMTS[qdtype])
    mismatch = (q2.float() != ref_q.float()).float().mean().item()
    assert mismatch <= 1e-3, f"{mismatch:.2%} of values differ from the reference"


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("backend", registry.compared("quantized_gelu"))
@pytest.mark.parametrize("qdtype", list(FMTS))
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_quantized_gelu_negative_tail(backend, profile, qdtype, approximate):
    """Blocks spanning −3 … −12 and on down to −20, where 1 + erf(·) cancels in fp32: judged as
    test_quantized_gelu, the exact values from the float64 oracle, with a small eps so that each
    block's own amax sets its scale."""
    q, s = ops.act_quant(tail_blocks().repeat(8, 1).cuda(), dtype=qdtype, backend="torch")
    ref_q, ref_s = ops.quantized_gelu(q, s, approximate=approximate, eps=TAIL_EPS, backend="torch")
    q2, s2 = run(backend, profile, ops.quantized_gelu, q, s, approximate=approximate, eps=TAIL_EPS)
    assert torch.allclose(s2, ref_s, rtol=REQUANT_SCALE_RTOL, atol=0)
    judge_quantized_gelu(q.cpu(), s.cpu(), q2.cpu(), s2.cpu(), approximate, FMTS[qdtype])
    mismatch = (q2.float() != ref_q.float()).float().mean().item()
    assert mismatch <= 1e-3, f"{mismatch:.2%} of values differ from the reference"


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("backend", registry.compared("scaled_mm"))
@pytest.mark.parametrize("qdtype", list(FMTS))
@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "silu"])
def test_scaled_mm_activation_negative_tail(backend, profile, qdtype, activation):
    """The epilogue's activation from −20 to 20, dense in the negative tail: the accumulator is exactly
    0 in any precision and bias = x, so the activation's input is x itself. Every value (reference's
    and backend's) within the contract's activation tolerance of the float64 oracle, none −0 where
    the exact value is a non-zero fp32 number."""
    x = activation_inputs()
    x = x[x != 0][::3]
    x = x[: x.numel() // 16 * 16].contiguous().cuda()  # N a multiple of 16 for cuBLAS
    operands = tail_gemm_operands(x, qdtype, block=128)
    kw = dict(bias=x, activation=activation, out_dtype=torch.float32)
    ref = ops.scaled_mm(*operands, **kw, backend="torch")
    out = run(backend, profile, ops.scaled_mm, *operands, **kw)
    assert not out.isnan().any()
    for row in (*ref.cpu(), *out.cpu()):
        check_activation(row, x.cpu(), activation)


@pytest.mark.parametrize("scale_fmt", ["fp32", "ue8m0"])
@pytest.mark.parametrize("qdtype", list(FMTS))
def test_reference_on_the_gpu_equals_the_reference_on_the_cpu(qdtype, scale_fmt):
    # The parity oracle is the reference run on the GPU; it must compute the very same bits as the
    # CPU reference that tests/oracle.py checks (IEEE division included).
    x = rand((4096, 7168 + 5))
    q, s = ops.act_quant(x, dtype=qdtype, scale_fmt=scale_fmt, backend="torch")
    cq, cs = ops.act_quant(x.cpu(), dtype=qdtype, scale_fmt=scale_fmt, backend="torch")
    assert same_q(q.cpu(), cq) and same_scale(s.cpu(), cs)
    w = rand((2112, 7168), seed=7)
    wq, ws = ops.weight_quant(w, dtype=qdtype, scale_fmt=scale_fmt, backend="torch")
    cwq, cws = ops.weight_quant(w.cpu(), dtype=qdtype, scale_fmt=scale_fmt, backend="torch")
    assert same_q(wq.cpu(), cwq) and same_scale(ws.cpu(), cws)
