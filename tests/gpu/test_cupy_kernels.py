"""CuPy kernels against the torch reference on the GPU: bit-exact quantize/dequantize/dequant + bias,
quantized GELU and the GEMM within the contract's tolerances, on DeepSeek-V3 shapes with tails, on the
real profile and on the simulated sm_80 (GEMM) and sm_75 paths. Also the kernel specifics: 16-byte
vector path vs the scalar path, misaligned pointers and strides, M-major scales, the decode tiles and
their single-launch split-K (split order, determinism, counters left at zero, CUDA graph replays)."""

from __future__ import annotations

import functools

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("cupy")

from quantcore import capability, registry  # noqa: E402
from quantcore.definitions.query import GemmQuery  # noqa: E402
from quantcore.backends import torch as ref  # noqa: E402
from quantcore.backends.cupy import launch  # noqa: E402
from quantcore.backends.torch.activation import activate  # noqa: E402
from quantcore.definitions.tolerances import REQUANT_SCALE_RTOL  # noqa: E402

FP8, I8 = torch.float8_e4m3fn, torch.int8
QDTYPES = (FP8, I8)
PROFILES = ("real", "sm80", "sm75")
# The memory-bound kernels have no sm_80-specific code; sm_75 covers the software bf16 conversions.
MEM_PROFILES = ("real", "sm75")
DEEPSEEK_NK = ((2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168))
GEMM_TOL = {FP8: 1e-5, I8: 1e-6}


def _profile(name):
    if name == "real":
        return capability.profile_for("cuda")
    with capability.simulate(name):
        return capability.profile_for("cuda")


def _randn(shape, dtype=torch.float32, scale=1.0, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(*shape, generator=g, device="cuda")
    x = x * torch.exp(torch.randn(*shape[:-1], 1, generator=g, device="cuda")) * scale
    return x.to(dtype)


def _misaligned(x):
    """The same values, one element past a 16-byte boundary and with a padded row stride."""
    buf = torch.empty(x.shape[0], x.shape[1] + 3, dtype=x.dtype, device=x.device)
    view = buf[:, 1 : x.shape[1] + 1]
    view.copy_(x)
    return view


@pytest.fixture(autouse=True)
def poisoned(monkeypatch):
    """Every fresh allocation starts as NaN (0xFF bytes for FP8, -128 for INT8), so an output
    element a kernel forgets to write fails the comparison."""
    real_empty = torch.empty

    def empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        if t.dtype == FP8:
            t.view(torch.uint8).fill_(0xFF)
        elif t.dtype in (torch.float32, torch.bfloat16, torch.float16):
            t.fill_(float("nan"))
        elif t.dtype == I8:
            t.fill_(-128)  # never produced by quantization
        elif t.dtype == torch.int32:
            t.fill_(-1)
        return t

    monkeypatch.setattr(torch, "empty", empty)


def assert_same(a, b):
    """Bit-exact equality of quantized codes or floats (NaN == NaN; the two FP8 NaN codes 0x7F/0xFF
    are one NaN: a NaN's sign is not portable, e.g. x86's default NaN is negative, CUDA's positive)."""
    assert a.shape == b.shape and a.dtype == b.dtype
    if a.dtype == FP8:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
        nan_a, nan_b = (a & 0x7F) == 0x7F, (b & 0x7F) == 0x7F
        bad = ((a != b) & ~(nan_a & nan_b)).sum().item()
    elif a.dtype == I8:
        bad = (a != b).sum().item()
    else:
        bad = (~((a == b) | (a.isnan() & b.isnan()))).sum().item()
    assert bad == 0, f"{bad} of {a.numel()} elements differ"


def rel_err(x, y):
    x, y = x.double(), y.double()
    return ((x - y).norm() / y.norm().clamp_min(1e-30)).item()


def _on_cpu(fn, *tensors, **kw):
    """Run a torch reference op on the CPU and bring its outputs back (strides kept).

    The quantize references divide by qmax with `tensor / float`, which torch's CUDA kernels turn
    into a multiplication by the reciprocal (one ulp off the IEEE quotient for ~60% of FP8 scales);
    on the CPU it is the contract's IEEE division."""
    out = fn(*(t.cpu() for t in tensors), **kw)
    return tuple(o.to("cuda") for o in out) if isinstance(out, tuple) else out.to("cuda")


def _with_specials(x, group):
    """Put NaN, +Inf and an all-zero block into some rows' blocks (other blocks stay finite)."""
    x = x.clone()
    if x.shape[0] >= 3 and x.shape[1] > group:
        x[0, 1] = float("nan")
        x[1, group] = float("inf")
        x[2, :group] = 0
    return x


# ---------------------------------------------------------------- quantize / dequantize

ACT_SHAPES = ((1, 7168), (64, 2048), (4096, 1536), (37, 7000), (5, 1001))


@pytest.mark.parametrize("prof", MEM_PROFILES)
@pytest.mark.parametrize("shape", ACT_SHAPES)
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16, torch.float32))
@pytest.mark.parametrize("qdtype", QDTYPES)
@pytest.mark.parametrize("ue8m0", (False, True))
def test_act_quant(prof, shape, dtype, qdtype, ue8m0):
    x = _with_specials(_randn(shape, dtype, seed=shape[1]), 128)
    kw = dict(qdtype=qdtype, group_size=128, ue8m0=ue8m0, eps=1e-4)
    for m_major in (False, True):
        q, s = launch.act_quant(x, **kw, scale_m_major=m_major, profile=_profile(prof))
        rq, rs = _on_cpu(ref.act_quant, x, **kw, scale_m_major=m_major)
        assert_same(q, rq)
        assert_same(s, rs)
        if shape[0] > 1:  # a single row's stride is arbitrary
            assert s.stride() == rs.stride()


@pytest.mark.parametrize("qdtype", QDTYPES)
@pytest.mark.parametrize("group", (128, 32, 96, 7))
def test_act_quant_vector_and_scalar_paths(qdtype, group):
    """Aligned bf16 rows take 16-byte vectors; a misaligned view, odd K or an odd group the scalar path."""
    x = _randn((33, 2048), torch.bfloat16, seed=group)
    kw = dict(qdtype=qdtype, group_size=group, ue8m0=False, eps=1e-4, scale_m_major=False)
    prof = _profile("real")
    for inp, aligned in ((x, True), (_misaligned(x), False), (x[:, :2047], False)):
        vec = launch._vector_width(8, (inp.shape[1], launch._row_stride(inp), group), (inp,))
        assert vec == (8 if aligned and group % 8 == 0 else 1)
        q, s = launch.act_quant(inp, **kw, profile=prof)
        rq, rs = _on_cpu(ref.act_quant, inp, **kw)
        assert_same(q, rq)
        assert_same(s, rs)


def _weight(nk, dtype, block):
    return _with_specials(_randn(nk, dtype, scale=0.02, seed=nk[0]), block[1])


@functools.lru_cache(maxsize=None)
def _weight_quant_cpu(nk, dtype, block, qdtype, ue8m0):
    """The CPU reference, once per input (the profiles share it: it takes seconds at 24576 x 1536)."""
    return _on_cpu(ref.weight_quant, _weight(nk, dtype, block), qdtype=qdtype, block_n=block[0],
                   block_k=block[1], ue8m0=ue8m0, eps=1e-4)


WEIGHT_CASES = tuple((nk, (128, 128)) for nk in DEEPSEEK_NK) + tuple(
    ((300, 200), block) for block in ((128, 128), (64, 96), (1, 32)))


@pytest.mark.parametrize("prof", MEM_PROFILES)
@pytest.mark.parametrize("nk, block", WEIGHT_CASES)
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
@pytest.mark.parametrize("qdtype", QDTYPES)
@pytest.mark.parametrize("ue8m0", (False, True))
def test_weight_quant(prof, nk, block, dtype, qdtype, ue8m0):
    q, s = launch.weight_quant(_weight(nk, dtype, block), qdtype=qdtype, block_n=block[0], block_k=block[1],
                               ue8m0=ue8m0, eps=1e-4, profile=_profile(prof))
    rq, rs = _weight_quant_cpu(nk, dtype, block, qdtype, ue8m0)
    assert_same(q, rq)
    assert_same(s, rs)


@pytest.mark.parametrize("prof", MEM_PROFILES)
@pytest.mark.parametrize("shape", ACT_SHAPES)
@pytest.mark.parametrize("out_dtype", (torch.bfloat16, torch.float16, torch.float32))
@pytest.mark.parametrize("qdtype", QDTYPES)
def test_act_dequant(prof, shape, out_dtype, qdtype):
    x = _randn(shape, torch.float32, seed=7)
    q, s = ref.act_quant(x, qdtype=qdtype, group_size=128, ue8m0=False, eps=1e-4, scale_m_major=True)
    for qin in (q, _misaligned(q)):
        out = launch.act_dequant(qin, s, group_size=128, out_dtype=out_dtype, profile=_profile(prof))
        assert_same(out, ref.act_dequant(qin, s, group_size=128, out_dtype=out_dtype))


@pytest.mark.parametrize("prof", MEM_PROFILES)
@pytest.mark.parametrize("nk", DEEPSEEK_NK + ((300, 200),))
@pytest.mark.parametrize("out_dtype", (torch.bfloat16, torch.float32))
@pytest.mark.parametrize("qdtype", QDTYPES)
def test_weight_dequant(prof, nk, out_dtype, qdtype):
    w = _randn(nk, torch.float32, scale=0.02, seed=3)
    kw = dict(block_n=128, block_k=128)
    q, s = ref.weight_quant(w, qdtype=qdtype, ue8m0=False, eps=1e-4, **kw)
    out = launch.weight_dequant(q, s, **kw, out_dtype=out_dtype, profile=_profile(prof))
    assert_same(out, ref.weight_dequant(q, s, **kw, out_dtype=out_dtype))


# ---------------------------------------------------------------- fused epilogues

@pytest.mark.parametrize("prof", MEM_PROFILES)
@pytest.mark.parametrize("mn", ((1, 2112), (64, 7168), (4096, 2048), (33, 1001)))
@pytest.mark.parametrize("gdtype", (torch.bfloat16, torch.float16, torch.float32, torch.int32))
@pytest.mark.parametrize("out_dtype", (torch.bfloat16, torch.float32))
@pytest.mark.parametrize("bias_dtype", (None, torch.bfloat16, torch.float32, torch.float16, torch.float64, "strided"))
def test_dequant_bias(prof, mn, gdtype, out_dtype, bias_dtype):
    """Biases of every float dtype the kernel reads as it is (bf16, fp32, fp16; "strided": bf16 at stride 2),
    and one it converts per call (fp64)."""
    M, N = mn
    if gdtype == torch.int32:
        g = torch.randint(-2**20, 2**20, mn, device="cuda", dtype=torch.int32)
    else:
        g = _randn(mn, gdtype, seed=N)
    sa = _randn((M, 1), seed=1)[:, 0].abs()
    sb = _randn((1, 2 * N), seed=2)[0, ::2].abs()  # strided per-channel scales
    if bias_dtype == "strided":
        bias = _randn((1, 2 * N), torch.bfloat16, seed=3)[0, ::2]
    else:
        bias = None if bias_dtype is None else _randn((1, N), bias_dtype, seed=3)[0]
    for gin in (g, _misaligned(g)):
        out = launch.dequant_bias(gin, sa, sb, bias, out_dtype=out_dtype, profile=_profile(prof))
        assert_same(out, ref.dequant_bias(gin, sa, sb, bias, out_dtype=out_dtype))


@pytest.mark.parametrize("prof", MEM_PROFILES)
@pytest.mark.parametrize("shape", ((1, 7168), (4096, 2048), (37, 7000)))
@pytest.mark.parametrize("qdtype", QDTYPES)
@pytest.mark.parametrize("out_qdtype", QDTYPES)
@pytest.mark.parametrize("approximate", ("none", "tanh"))
def test_quantized_gelu(prof, shape, qdtype, out_qdtype, approximate):
    x = _randn(shape, seed=11)
    q, s = ref.act_quant(x, qdtype=qdtype, group_size=128, ue8m0=False, eps=1e-4, scale_m_major=False)
    for ue8m0 in (False, True):
        kw = dict(group_size=128, approximate=approximate, out_qdtype=out_qdtype, ue8m0=ue8m0, eps=1e-4)
        q2, s2 = launch.quantized_gelu(q, s, **kw, profile=_profile(prof))
        # The reference's steps with the GELU on the GPU (the contract's form, the kernel's operations in
        # the same order; torch's exp need not match CUDA's expf to the bit) and the re-quantize on the CPU.
        x = ref.act_dequant(q, s, group_size=128, out_dtype=torch.float32)
        y = activate(x, "gelu_tanh" if approximate == "tanh" else "gelu")
        rq2, rs2 = _on_cpu(ref.act_quant, y, qdtype=out_qdtype, group_size=128, ue8m0=ue8m0, eps=1e-4,
                           scale_m_major=False)
        assert torch.allclose(s2, rs2, rtol=REQUANT_SCALE_RTOL, atol=0)
        mismatch = (q2.float() != rq2.float()).float().mean().item()
        assert mismatch <= 1e-3, f"{mismatch:.2%} of codes differ from the reference's"


# ---------------------------------------------------------------- GEMM

def _gemm_inputs(M, N, K, qdtype, block=(128, 128), seed=0):
    a, a_s = ref.act_quant(_randn((M, K), seed=seed), qdtype=qdtype, group_size=block[1], ue8m0=False,
                           eps=1e-4, scale_m_major=True)
    b, b_s = ref.weight_quant(_randn((N, K), scale=0.02, seed=seed + 1), qdtype=qdtype, block_n=block[0],
                              block_k=block[1], ue8m0=False, eps=1e-4)
    return a, a_s, b, b_s


def _cupy_mm(profile):
    """launch.scaled_mm on `profile` (a name of PROFILES or a DeviceProfile) with the MMA kind that the
    registry binds to the operands' format there (the `mma` option of the CuPy variant it selects)."""
    profile = _profile(profile) if isinstance(profile, str) else profile

    def mm(a, *args, **kwargs):
        query = GemmQuery("scaled_mm", profile, "int8" if a.dtype == I8 else "fp8_e4m3", blocks=(128, 128), block_k=128)
        mma = dict(registry.select(query, backend="cupy").options)["mma"]
        return launch.scaled_mm(a, *args, **kwargs, mma=mma, profile=profile)
    return mm


def _mm(a, a_s, b, b_s, fn, block=(128, 128), **epilogue):
    kw = dict(block_n=block[0], block_k=block[1], bias=None, activation=None, out_dtype=torch.float32,
              out_quant=None, out_group=128, ue8m0_out=False, eps=1e-4)
    kw.update(epilogue)
    return fn(a, a_s, b, b_s, **kw)


# The DeepSeek-V3 shapes and issue 11's decode targets.
GEMM_NK = DEEPSEEK_NK + ((7168, 16384), (32768, 512))


@pytest.mark.parametrize("prof", PROFILES)
@pytest.mark.parametrize("M", (1, 4, 16, 64, 4096))
@pytest.mark.parametrize("nk", GEMM_NK)
@pytest.mark.parametrize("qdtype", QDTYPES)
def test_scaled_mm_deepseek(prof, M, nk, qdtype):
    N, K = nk
    a, a_s, b, b_s = _gemm_inputs(M, N, K, qdtype)
    out = _mm(a, a_s, b, b_s, _cupy_mm(prof))
    expect = _mm(a, a_s, b, b_s, ref.scaled_mm)
    assert not out.isnan().any()
    assert rel_err(out, expect) <= GEMM_TOL[qdtype]


# (N, K, (block_n, block_k)) with tails for the decode tiles: N not a multiple of the 64-wide tile, K
# not a multiple of 128 (7056 and 1552: a 16-byte tail on the cp.async path; 5000 and 2085: byte
# loads), K blocks of 32, 64 and 96 (several per 128-byte stage, or straddling stages), block_n !=
# 128 (one tile's columns use several b_scale rows). On an H100 all but the last split K, into 4 to
# 27 splits; the last has enough N tiles to run unsplit.
DECODE_TAILS = (
    (2000, 7056, (128, 128)),
    (300, 5000, (96, 96)),
    (1100, 2080, (64, 32)),
    (4100, 7168, (128, 64)),
    (72, 2085, (48, 128)),
    (24100, 1552, (128, 128)),
)


@pytest.mark.parametrize("prof", PROFILES)
@pytest.mark.parametrize("M", (1, 5, 20, 33, 64))
@pytest.mark.parametrize("case", DECODE_TAILS)
@pytest.mark.parametrize("qdtype", QDTYPES)
def test_scaled_mm_decode_tails(prof, M, case, qdtype):
    """Every decode tile (M = 1, 5 -> 16 rows; 20 -> 32; 33, 64 -> 64) with partial rows, columns,
    K blocks and stages, split or not."""
    N, K, block = case
    a, a_s, b, b_s = _gemm_inputs(M, N, K, qdtype, block, seed=N + M)
    out = _mm(a, a_s, b, b_s, _cupy_mm(prof), block)
    expect = _mm(a, a_s, b, b_s, ref.scaled_mm, block)
    assert not out.isnan().any()
    assert rel_err(out, expect) <= GEMM_TOL[qdtype]


EPILOGUES = (
    dict(bias=torch.bfloat16, activation="gelu", out_dtype=torch.bfloat16),
    dict(bias=torch.float16, activation="gelu_tanh", out_dtype=torch.float16),  # at stride 2
    dict(bias=None, activation="silu", out_quant=FP8, out_group=128, ue8m0_out=True),
    dict(bias=torch.float32, activation=None, out_quant=I8, out_group=4),
)


@pytest.mark.parametrize("prof", PROFILES)
@pytest.mark.parametrize("mnk", ((1, 2112, 7168), (16, 4096, 7168), (64, 7168, 2048), (37, 300, 1000),
                                 (200, 264, 640)))
@pytest.mark.parametrize("qdtype", QDTYPES)
@pytest.mark.parametrize("epi", range(len(EPILOGUES)))
def test_scaled_mm_epilogues(prof, mnk, qdtype, epi):
    """Bias, activations, casts and the fused re-quantize; K = 1000 is not a multiple of 16 (byte
    loader), (200, 264, 640) uses 64 x 64 weight blocks. Every M <= 64 runs a decode tile through
    split-K (the last split to count runs the epilogue), a 128-wide re-quantize group on a 128-wide
    decode tile."""
    M, N, K = mnk
    block = (64, 64) if K == 640 else (128, 128)
    a, a_s, b, b_s = _gemm_inputs(M, N, K, qdtype, block, seed=M)
    spec = dict(EPILOGUES[epi])
    if spec["bias"] is not None:
        stride = 2 if spec["bias"] == torch.float16 else 1
        spec["bias"] = _randn((1, stride * N), spec["bias"], seed=5)[0, ::stride]
    out = _mm(a, a_s, b, b_s, _cupy_mm(prof), block, **spec)
    expect = _mm(a, a_s, b, b_s, ref.scaled_mm, block, **spec)
    if spec.get("out_quant") is None:
        assert not out.isnan().any()
        tol = GEMM_TOL[qdtype] if out.dtype == torch.float32 else 1e-2
        assert rel_err(out, expect) <= tol
    else:
        (q, s), (rq, rs) = out, expect
        G = spec["out_group"]
        deq = lambda q_, s_: q_.float() * s_.repeat_interleave(G, 1)[:, :N]  # noqa: E731
        assert rel_err(s, rs) <= 1e-5
        assert rel_err(deq(q, s), deq(rq, rs)) <= 2e-2


# ---------------------------------------------------------------- single-launch split-K

def _splits(M, N, K, block_k, profile):
    """(K blocks per split, splits) of the launcher's plan for a plain (not re-quantized) output."""
    return launch.gemm_splits(M, N, K, block_k, launch.gemm_tile(M), profile.sm_count)


@pytest.mark.parametrize("qdtype", QDTYPES)
@pytest.mark.parametrize("mnk", ((1, 2112, 7168), (16, 4096, 7168), (64, 300, 5000)))
def test_scaled_mm_split_k_order(qdtype, mnk):
    """The split GEMM is, to the bit, the fp32 sum in split order (0 + p0) + p1 + ... of the same
    GEMM over each split's K range, each run unsplit (a profile of one SM never splits)."""
    M, N, K = mnk
    prof = _profile("real")
    per_split, splits = _splits(M, N, K, 128, prof)
    assert splits > 1
    a, a_s, b, b_s = _gemm_inputs(M, N, K, qdtype, seed=K)
    one_sm = prof.model_copy(update={"sm_count": 1})
    total = torch.zeros(M, N, dtype=torch.float32, device="cuda")
    for z in range(splits):
        kb = slice(z * per_split, (z + 1) * per_split)
        ks = slice(kb.start * 128, min(K, kb.stop * 128))
        part = _mm(a[:, ks], a_s[:, kb], b[:, ks], b_s[:, kb], _cupy_mm(one_sm))
        total = total + part
    assert_same(_mm(a, a_s, b, b_s, _cupy_mm(prof)), total)


@pytest.mark.parametrize("qdtype", QDTYPES)
@pytest.mark.parametrize("mnk", ((1, 2112, 7168), (4, 7168, 2048), (16, 300, 5000), (64, 4096, 7168)))
def test_scaled_mm_split_k_deterministic(qdtype, mnk):
    """The same call gives the same bits every time, whichever split happens to count last."""
    M, N, K = mnk
    a, a_s, b, b_s = _gemm_inputs(M, N, K, qdtype, seed=M)
    fn = _cupy_mm("real")
    spec = dict(bias=_randn((1, N), seed=9)[0], activation="silu", out_dtype=torch.float32)
    first = _mm(a, a_s, b, b_s, fn, **spec)
    for _ in range(5):
        assert_same(_mm(a, a_s, b, b_s, fn, **spec), first)


def _counters_zero():
    torch.cuda.synchronize()
    from quantcore.runtime import workspace

    for counters in workspace.counters():
        assert not counters.any(), "a launch left a split-K counter set"


@pytest.mark.parametrize("qdtype", QDTYPES)
def test_scaled_mm_split_k_back_to_back(qdtype):
    """Calls with different tiles, tile counts and split counts back to back on one stream, with no
    synchronize between them, all come out right and leave every counter at zero: a counter left
    set would make a later call finish a tile before all its partials are there."""
    prof = _profile("real")
    shapes = ((1, 2112, 7168), (16, 300, 5000), (4, 4096, 7168), (64, 7168, 2048), (1, 2112, 7168))
    inputs = [_gemm_inputs(M, N, K, qdtype, seed=i) for i, (M, N, K) in enumerate(shapes)]
    expect = [_mm(*x, ref.scaled_mm) for x in inputs]
    assert any(_splits(*mnk, 128, prof)[1] > 1 for mnk in shapes)
    for _ in range(2):
        outs = [_mm(*x, _cupy_mm(prof)) for x in inputs]
        for out, ref_out in zip(outs, expect):
            assert rel_err(out, ref_out) <= GEMM_TOL[qdtype]
        _counters_zero()


@pytest.mark.parametrize("qdtype", QDTYPES)
def test_scaled_mm_split_k_cuda_graph(qdtype):
    """A captured split-K GEMM replays right, again and again, with new inputs each time. The
    warm-up on the capture stream compiles the kernel and allocates that stream's workspace and
    counters, so nothing in the graph zeroes the counters: each replay relies on the previous
    launch having left them at zero."""
    M, N, K = 1, 2112, 7168
    prof = _profile("real")
    assert _splits(M, N, K, 128, prof)[1] > 1
    fn = _cupy_mm(prof)
    static = [t.clone() for t in _gemm_inputs(M, N, K, qdtype, seed=0)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        _mm(*static, fn)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = _mm(*static, fn)
    for seed in range(1, 4):
        fresh = _gemm_inputs(M, N, K, qdtype, seed=seed)
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        graph.replay()
        assert_same(out, _mm(*fresh, fn))
    _counters_zero()
