"""The fused producers on the GPU: every implementation against the torch reference on the same GPU, on
Llama- and DeepSeek-sized rows (H = 4096, 7168; 2I = 2·2048, 2·14336, 2·18432) from 1 to 4096 rows and on
tails, on the real device and simulated as sm_80 (without FP8 conversion instructions); the residual, the
masked MoE rows, CUDA-graph replay, and QuantLinear fed the quantized pair.

rms_norm_quant must be the reference bit for bit (codes, scales, the new residual); silu_mul_quant within
one code of it (SiLU's exp is each platform's), the same code almost everywhere, and scales within the
re-quantization tolerance.

Run on a GPU machine: `python3 -m pytest -m gpu tests/gpu/test_producers_gpu.py`.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from quantcore import ops, registry  # noqa: E402
from quantcore.backends.torch.producers import rms_norm, silu_mul  # noqa: E402
from quantcore.definitions.tolerances import REQUANT_SCALE_RTOL  # noqa: E402
from quantcore.nn import QuantizedActivation, QuantLinear  # noqa: E402

from test_parity import rand, run, same_q, same_scale  # noqa: E402

FP8, I8 = torch.float8_e4m3fn, torch.int8
PROFILES = [None, "sm80"]
NORM_M = (1, 7, 64, 4096)
NORM_H = (4096, 7168, 200, 5120)
GATED_I = (14336, 18432, 2048, 200)


def assert_same(out, ref):
    assert len(out) == len(ref)
    assert same_q(out[0], ref[0]), int((out[0].view(torch.uint8) != ref[0].view(torch.uint8)).sum())
    assert same_scale(out[1].contiguous(), ref[1].contiguous())
    if len(out) == 3:  # the new residual: NaN where x + residual is (a NaN's payload is free)
        assert torch.equal(out[2].isnan(), ref[2].isnan()) and torch.equal(out[2].nan_to_num(0), ref[2].nan_to_num(0))


def norm_operands(M, H, dtype=torch.bfloat16, w_dtype=torch.bfloat16, seed=0):
    x, residual = rand((M, H), dtype, seed), rand((M, H), dtype, seed + 1)
    g = torch.Generator(device="cuda").manual_seed(seed + 2)
    weight = (1 + 0.2 * torch.randn(H, generator=g, device="cuda")).to(w_dtype)
    return x, weight, residual


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("backend", registry.compared("rms_norm_quant"))
@pytest.mark.parametrize("H", NORM_H)
@pytest.mark.parametrize("M", NORM_M)
def test_rms_norm_quant_is_the_reference_bit_for_bit(backend, profile, M, H):
    x, weight, residual = norm_operands(M, H, seed=M + H)
    x[0, min(5, H - 1)] = float("nan") if M > 1 else x[0, 0]  # a NaN row: every group's scale NaN
    for res, qdtype, fmt, layout in ((None, FP8, "fp32", "row"), (residual, I8, "ue8m0", "m_major"),
                                     (residual, FP8, "fp32", "m_major")):
        kw = dict(dtype=qdtype, scale_fmt=fmt, scale_layout=layout)
        ref = ops.rms_norm_quant(x, weight, res, backend="torch", **kw)
        assert_same(run(backend, profile, ops.rms_norm_quant, x, weight, res, **kw), ref)
        if res is not None:  # the composition the contract names, on this backend's own act_quant
            y, _ = rms_norm(x, weight, res, 1e-6)
            q, s = run(backend, profile, ops.act_quant, y, **kw)
            assert_same((q, s), ref[:2])


@pytest.mark.parametrize("backend", registry.compared("rms_norm_quant"))
@pytest.mark.parametrize("dtype,w_dtype,group", [(torch.float16, torch.float32, 128),
                                                 (torch.float32, torch.bfloat16, 96), (torch.bfloat16, torch.float16, 64)])
def test_rms_norm_quant_dtypes_groups_and_strided_rows(backend, dtype, w_dtype, group):
    x, weight, residual = norm_operands(33, 7168 + 64, dtype, w_dtype, seed=3)
    x, residual = x[:, :7168], residual[:, 64:]  # rows strided
    for res in (None, residual):
        kw = dict(dtype=FP8, group_size=group, eps=1e-5)
        assert_same(run(backend, None, ops.rms_norm_quant, x, weight[:7168], res, **kw),
                    ops.rms_norm_quant(x, weight[:7168], res, backend="torch", **kw))


def far_codes(out, ref) -> str:
    """Why `out` is not close to `ref` ("" when it is): within one code of the reference everywhere and the
    same code in all but 1e-3 of the elements; scales within the re-quantization tolerance (SiLU's exp differs
    between platforms in its last bit). A group whose amax sits at a power of two may round its ue8m0 scale the
    other way, halving or doubling every code of it: such groups (exactly 2x apart) are allowed in at most 1e-4
    of the groups, and their codes skipped."""
    (q, s), (rq, rs) = out, ref
    if q.numel() == 0:
        return "" if q.shape == rq.shape and s.shape == rs.shape else f"shapes {q.shape} {s.shape}"
    s, rs = s.contiguous(), rs.contiguous()
    flipped = (s == 2 * rs) | (rs == 2 * s)
    if float(flipped.float().mean()) > 1e-4:
        return f"{int(flipped.sum())} of {flipped.numel()} scales a power of two apart"
    a, b = q.float(), rq.float()
    if q.dtype == FP8:  # neighbouring e4m3 codes differ by one in their bits' integer value
        a, b = q.view(torch.uint8).float(), rq.view(torch.uint8).float()
    groups = s.shape[-1]
    kept = (~flipped).repeat_interleave(-(-q.shape[-1] // groups), dim=-1)[..., :q.shape[-1]]
    a, b = a[kept], b[kept]
    far = (a - b).abs() > 1
    if bool(far.any()):
        at = far.nonzero()[:4].flatten().tolist()
        return f"{int(far.sum())} codes more than one apart, e.g. {a[at].tolist()} vs {b[at].tolist()}"
    if float((a != b).float().mean()) > 1e-3:
        return f"{int((a != b).sum())} of {a.numel()} codes differ"
    bad = ~torch.isclose(s[~flipped], rs[~flipped], rtol=REQUANT_SCALE_RTOL, atol=0)
    if bool(bad.any()):
        return f"{int(bad.sum())} scales off, e.g. {s[~flipped][bad][:4].tolist()} vs {rs[~flipped][bad][:4].tolist()}"
    return ""


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("backend", registry.compared("silu_mul_quant"))
@pytest.mark.parametrize("I", GATED_I)
@pytest.mark.parametrize("M", (1, 16, 4096))
def test_silu_mul_quant_within_one_code_of_the_reference(backend, profile, M, I):
    gate_up = rand((M, 2 * I), seed=M + I)
    for qdtype, fmt, layout in ((FP8, "fp32", "row"), (I8, "ue8m0", "m_major")):
        kw = dict(dtype=qdtype, scale_fmt=fmt, scale_layout=layout)
        out = run(backend, profile, ops.silu_mul_quant, gate_up, **kw)
        ref = ops.silu_mul_quant(gate_up, backend="torch", **kw)
        assert not (why := far_codes(out, ref)), (qdtype, why)
        if fmt == "fp32":  # this backend's act_quant of the reference's fp32 product: the same function
            assert not (why := far_codes(out, run(backend, profile, ops.act_quant, silu_mul(gate_up), **kw))), why


@pytest.mark.parametrize("backend", registry.compared("silu_mul_quant"))
def test_masked_rows_match_where_counted(backend):
    E, max_m, I = 8, 64, 2048
    gate_up = rand((E, max_m, 2 * I), seed=9)
    counts = torch.tensor([0, 1, 5, 64, 70, 17, 2, -3], dtype=torch.int32, device="cuda")
    q, s = run(backend, None, ops.silu_mul_quant, gate_up, counts, scale_layout="m_major")
    rq, rs = ops.silu_mul_quant(gate_up, backend="torch", scale_layout="m_major")
    for e, n in enumerate(counts.clamp(0, max_m).tolist()):
        assert not (why := far_codes((q[e, :n], s[e, :n]), (rq[e, :n], rs[e, :n]))), (e, why)


@pytest.mark.parametrize("backend", registry.compared("rms_norm_quant"))
def test_a_captured_graph_replays_the_eager_bits(backend):
    x, weight, residual = norm_operands(16, 4096, seed=11)
    gate_up = rand((16, 2 * 14336), seed=12)
    step = lambda: (*ops.rms_norm_quant(x, weight, residual, backend=backend),  # noqa: E731
                    *ops.silu_mul_quant(gate_up, backend=backend))
    eager = step()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            captured = step()
    torch.cuda.current_stream().wait_stream(side)
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(captured, eager):
        assert torch.equal(a.view(torch.uint8) if a.dtype == FP8 else a, b.view(torch.uint8) if b.dtype == FP8 else b)


@pytest.mark.parametrize("qdtype", [FP8, I8])
@pytest.mark.parametrize("M", (1, 16, 512))
def test_quant_linear_on_the_quantized_pair_is_the_layer_on_the_float_input(qdtype, M):
    """QuantLinear fed (q, scale) from the fused norm gives the bits it gives for the norm's float output,
    which it quantizes itself (act_quant with its Bk and scale format, then the same GEMM)."""
    torch.manual_seed(M)
    linear = torch.nn.Linear(4096, 6144, device="cuda", dtype=torch.bfloat16)
    layer = QuantLinear.from_linear(linear, dtype=qdtype)
    x, weight, residual = norm_operands(M, 4096, seed=M)
    q, s, _ = ops.rms_norm_quant(x, weight, residual, dtype=qdtype)
    y, _ = rms_norm(x, weight, residual, 1e-6)
    expected = layer(y)
    assert torch.equal(layer(QuantizedActivation(q, s, torch.bfloat16)), expected)
    assert torch.equal(layer((q, s)), expected)
