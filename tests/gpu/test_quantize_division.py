"""The quantizers divide by their group's scale through `quant.divide` in Triton and `qc::Divisor` in the
CUDA kernels (a reciprocal per group, a multiply and two FMAs per element), which must round as IEEE
division. Compiled for the GPU, against `tl.div_rn` and `__fdiv_rn`, on ~2,000 scales spread over the fp32
exponents below 2^123 (subnormal, all-ones and power-of-two significands, +Inf, NaN) and 2^16 values each
within the quantizers' domain (|x| up to 448 scales: uniform, log-uniform, near the FP8 and INT8 rounding
boundaries, ±0, and ±Inf beside an infinite scale): the quotient has IEEE division's bits wherever that is
at least 2^-17 (below, its FP8 and INT8 codes are ±0 both ways), and its FP8 and INT8 codes are those of
IEEE division's quotient everywhere; for power-of-two scales (ue8m0) Triton's one product an element
likewise. Exhaustively, Triton's reciprocal of a scale (`quant.reciprocal`) on every positive normal fp32 below
2^123, and the scale itself divided by a known qmax (`quant.block_scale` without TINY_SCALES) on every fp32
amax, against `tl.div_rn`. Also: act_quant keeps −0's code, and the compiled INT8 encoders give the
reference's codes.

Run on a GPU machine: `python3 -m pytest -m gpu tests/gpu/test_quantize_division.py`.
"""

from __future__ import annotations

import pytest
import torch
from helpers import powers_of_two, quantizer_scales, quantizer_values

pytestmark = pytest.mark.gpu

BLOCK = 1024
PER_SCALE = 2**16


def _triton_kernel(pow2: bool):
    """(x [n], s [n], out [6, n] int32) -> None: out[0] / out[1] the quotients' bits by `quant.divide` (its
    path for power-of-two scales where `pow2`) / `tl.div_rn`, out[2] / out[3] their FP8 codes, out[4] /
    out[5] their INT8 codes."""
    import triton
    import triton.language as tl

    from quantcore.backends.triton.kernels.fp8 import fp8e4m3_encode_as
    from quantcore.backends.triton.kernels.quant import divide, int8_encode

    @triton.jit
    def both(x_ptr, s_ptr, out_ptr, POW2: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        n = tl.num_programs(0).to(tl.int64) * BLOCK
        x = tl.load(x_ptr + offs)
        s = tl.load(s_ptr + offs)
        new = divide(x, s, POW2)
        old = tl.div_rn(x, s)
        tl.store(out_ptr + offs, new.to(tl.int32, bitcast=True))
        tl.store(out_ptr + n + offs, old.to(tl.int32, bitcast=True))
        tl.store(out_ptr + 2 * n + offs, fp8e4m3_encode_as(new, True).to(tl.int32))
        tl.store(out_ptr + 3 * n + offs, fp8e4m3_encode_as(old, True).to(tl.int32))
        tl.store(out_ptr + 4 * n + offs, int8_encode(new, True).to(tl.int32))
        tl.store(out_ptr + 5 * n + offs, int8_encode(old, True).to(tl.int32))
    return lambda x, s, out: both[(x.numel() // BLOCK,)](x, s, out, POW2=pow2, BLOCK=BLOCK)


_CUDA_BOTH = r"""
#include "common.cuh"
extern "C" __global__ void both(const float* x, const float* s, int* out, long long n) {
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float fresh = qc::Divisor(s[i])(x[i]), old = __fdiv_rn(x[i], s[i]);
  out[i] = __float_as_int(fresh);
  out[n + i] = __float_as_int(old);
  out[2 * n + i] = qc::Fp8E4M3::encode(fresh);
  out[3 * n + i] = qc::Fp8E4M3::encode(old);
  out[4 * n + i] = qc::Int8::encode(fresh);
  out[5 * n + i] = qc::Int8::encode(old);
}
"""


def _cuda_function(source: str, name: str):
    """The extern "C" kernel `name` of `source`, compiled as the CUDA backend compiles its kernels (its own
    NVRTC call, beside the backend's headers: CuPy's RawKernel adds -ftz=true, which flushes subnormal
    scales to zero) for this GPU, as a `(grid, block, args)` callable."""
    cupy = pytest.importorskip("cupy")
    from quantcore.backends.cupy import compiler

    arch = compiler.device_arch(0)
    sources = dict(compiler.kernel_sources(), **{"quantize_division_test.cu": source})
    opts = (*compiler.BASE_OPTIONS, f"--gpu-architecture=sm_{arch}", *(f"-I{d}" for d in compiler.include_dirs()))
    compiled = compiler._compile(compiler._nvrtc(), sources, "quantize_division_test.cu", f"sm_{arch}", opts, (),
                                 True)
    module = cupy.cuda.function.Module()
    module.load(compiled.cubin)
    fn = module.get_function(name)

    def launch(grid, block, args):
        launch.module = module  # kept loaded while the function is used
        fn(grid, block, args)
        torch.cuda.synchronize()
    return launch


def _cupy_kernel():
    """The same for the CUDA kernels' `qc::Divisor` against `__fdiv_rn`."""
    import cupy

    fn = _cuda_function(_CUDA_BOTH, "both")
    return lambda x, s, out: fn(((x.numel() + 255) // 256,), (256,),
                                (cupy.asarray(x), cupy.asarray(s), cupy.asarray(out), cupy.int64(x.numel())))


@pytest.mark.parametrize("backend, pow2", [("triton", False), ("triton", True), ("cupy", False)])
def test_divide_rounds_as_ieee_division_and_gives_its_codes(backend, pow2):
    both = _triton_kernel(pow2) if backend == "triton" else _cupy_kernel()
    scales = quantizer_scales()
    scales = (powers_of_two(scales) if pow2 else scales).cuda()
    g = torch.Generator(device="cuda").manual_seed(1)
    checked = 0
    for chunk in scales.split(256):
        x = quantizer_values(chunk, PER_SCALE, g)
        s = chunk[:, None].expand_as(x).contiguous()
        out = torch.empty(6, x.numel(), dtype=torch.int32, device="cuda")
        both(x, s, out)
        torch.cuda.synchronize()
        new, old = out[0].view(torch.float32), out[1].view(torch.float32)
        both_nan = new.isnan() & old.isnan()
        big = ~(old.abs() < 2.0**-17)  # NaN and ±Inf count as big
        differ = (out[0] != out[1]) & ~both_nan & big
        assert not differ.any(), (
            f"{int(differ.sum())} quotients differ from IEEE division, e.g. x={x.flatten()[differ][:4].tolist()} "
            f"s={s.flatten()[differ][:4].tolist()}: {new[differ][:4].tolist()} vs {old[differ][:4].tolist()}")
        # FP8 NaN codes may differ in their sign bit only (the contract compares NaN codes as NaN).
        fp8_nan = ((out[2] & 0x7F) == 0x7F) & ((out[3] & 0x7F) == 0x7F)
        for name, rows in (("FP8", (2, 3)), ("INT8", (4, 5))):
            differ = (out[rows[0]] != out[rows[1]]) & ~(fp8_nan if name == "FP8" else False)
            assert not differ.any(), (
                f"{int(differ.sum())} {name} codes differ, e.g. x={x.flatten()[differ][:4].tolist()} "
                f"s={s.flatten()[differ][:4].tolist()}: quotients {new[differ][:4].tolist()} vs "
                f"{old[differ][:4].tolist()}, codes {out[rows[0]][differ][:4].tolist()} vs "
                f"{out[rows[1]][differ][:4].tolist()}")
        checked += x.numel()
    assert checked == scales.numel() * PER_SCALE


@pytest.mark.parametrize("backend", ["triton", "cupy"])
@pytest.mark.parametrize("qdtype", [torch.float8_e4m3fn, torch.int8])
def test_act_quant_keeps_the_sign_of_zero(backend, qdtype):
    """−0 among other values quantizes to FP8's −0 code (0x80), as the reference's division gives."""
    from helpers import assert_same_q, assert_same_scale

    from quantcore import ops

    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(0))
    x[:, ::3] = -0.0
    x[:, 1::3] = 0.0
    q, s = ops.act_quant(x.cuda(), dtype=qdtype, backend=backend)
    q_ref, s_ref = ops.act_quant(x, dtype=qdtype, backend="torch")
    assert_same_scale(s.cpu(), s_ref)
    assert_same_q(q.cpu(), q_ref)
    if qdtype == torch.float8_e4m3fn:
        assert bool((q.cpu().view(torch.uint8)[:, ::3] == 0x80).all())


_CUDA_CODES = r"""
#include "common.cuh"
extern "C" __global__ void codes(const float* v, signed char* out, long long n) {
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) out[i] = qc::Int8::encode(v[i]);
}
"""


@pytest.mark.parametrize("backend", ["triton", "triton-float", "cupy"])
def test_int8_encode_rounds_and_clamps_as_the_reference(backend):
    """`quant.int8_encode` compiled, by its packed conversion (`_INT8X2`, "triton") and by its float route
    ("triton-float", the interpreter's), and `qc::Int8::encode` (cvt.rni) give the reference's INT8 codes: ties
    to even and 0 for NaN over every quotient a group's scale allows (|v| at most 127·(1 + 2^-23): the
    Triton encoder has no clamp, docs/numerics.md), and the CUDA one, which clamps, ±127 past the range
    (±Inf included); on specials and 2^20 random values, each code at its own position (the packed route
    places two a register)."""
    from quantcore.backends.torch.quant import encode

    edge = torch.tensor(127.0).nextafter(torch.tensor(200.0))  # 127 + 1 ulp, above any quotient of amax / scale
    halves = torch.arange(-127, 127, dtype=torch.float32) + 0.5
    specials = torch.tensor([float("nan"), -0.0, 0.0, 127.49, -127.49, 127.0, -127.0, edge, -edge])
    g = torch.Generator().manual_seed(2)
    rand = (torch.rand(2**20, generator=g) * 254 - 127).float()
    v = torch.cat([halves, specials, rand])
    if backend == "cupy":
        past = torch.tensor([float("inf"), float("-inf"), 1e30, -1e30, 127.51, -127.51, 128.5, -130.5])
        v = torch.cat([v, past, (torch.rand(2**16, generator=g) * 300 - 150).float()])
    # A block of 4096: the packed route takes tensors of at least quant.PAIRED_MIN (2048) elements.
    block = 4 * BLOCK
    v = torch.cat([v, torch.zeros(-v.numel() % block)]).cuda()
    out = torch.empty(v.numel(), dtype=torch.int8, device="cuda")
    if backend.startswith("triton"):
        import triton
        import triton.language as tl

        from quantcore.backends.triton.kernels.quant import int8_encode

        @triton.jit
        def codes(v_ptr, out_ptr, HW: tl.constexpr, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(out_ptr + offs, int8_encode(tl.load(v_ptr + offs), HW))

        codes[(v.numel() // block,)](v, out, HW=backend == "triton", BLOCK=block)
    else:
        fn = _cuda_function(_CUDA_CODES, "codes")
        import cupy

        fn(((v.numel() + 255) // 256,), (256,), (cupy.asarray(v), cupy.asarray(out), cupy.int64(v.numel())))
    assert torch.equal(out.cpu(), encode(v.cpu(), torch.int8))


def _exhaustive_kernels():
    """Kernels counting, over a range of fp32 bit patterns, where `quant.reciprocal` differs from
    `tl.div_rn(1, s)` and where `quant.block_scale` without TINY_SCALES (the division by a known qmax)
    differs from it with them (`tl.div_rn`): counts[0] += inputs whose results differ in their bits, not both
    NaN; counts[1] = the largest such input's bits (0 if none)."""
    import triton
    import triton.language as tl

    from quantcore.backends.triton.kernels.quant import block_scale, reciprocal

    @triton.jit
    def tally(counts_ptr, bits, new, old):
        both_nan = (new != new) & (old != old)
        differ = (new.to(tl.uint32, bitcast=True) != old.to(tl.uint32, bitcast=True)) & ~both_nan
        tl.atomic_add(counts_ptr, tl.sum(differ.to(tl.int32)))
        tl.atomic_max(counts_ptr + 1, tl.max(tl.where(differ, bits, 0).to(tl.int32, bitcast=True)))

    @triton.jit
    def reciprocals(counts_ptr, first, last, BLOCK: tl.constexpr):
        bits = first + tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        bits = tl.minimum(bits, last).to(tl.uint32)
        s = bits.to(tl.float32, bitcast=True)
        tally(counts_ptr, bits, reciprocal(s), tl.div_rn(tl.where(True, 1.0, s), s))

    @triton.jit
    def scales(counts_ptr, first, eps, QFMT: tl.constexpr, BLOCK: tl.constexpr):
        bits = (first + tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)).to(tl.uint32)
        amax = bits.to(tl.float32, bitcast=True)
        tally(counts_ptr, bits, block_scale(amax, eps, QFMT, False, False), block_scale(amax, eps, QFMT, False, True))
    return reciprocals, scales


def test_reciprocal_is_ieee_division_on_every_scale():
    """Every positive normal fp32 scale below 2^123 (the quantizers' largest is 2^122, `quantizer_scales`;
    `divide` rescales those below 2^-64), +Inf and NaN."""
    reciprocals, _ = _exhaustive_kernels()
    counts = torch.zeros(2, dtype=torch.int32, device="cuda")
    first, last, chunk = 0x00800000, 0x7D000000, 2**28
    for start in range(first, last, chunk):
        reciprocals[(chunk // BLOCK,)](counts, start, last - 1, BLOCK=BLOCK)
    for special in (0x7F800000, 0x7FC00000):
        reciprocals[(1,)](counts, special, special, BLOCK=BLOCK)
    differ, example = counts.tolist()
    assert differ == 0, f"{differ} reciprocals differ from tl.div_rn's, e.g. of the scale bits {example:#010x}"


@pytest.mark.parametrize("qfmt, qmax", [("fp8", 448.0), ("int8", 127.0)])
def test_block_scale_by_a_known_qmax_is_ieee_division_on_every_amax(qfmt, qmax):
    """All 2^32 fp32 amax bit patterns, with the smallest eps for which a kernel compiles `block_scale` without
    TINY_SCALES (`quant.scales_may_be_tiny`)."""
    from quantcore.backends.triton.kernels.quant import TINY_SCALE, scales_may_be_tiny

    eps = qmax * TINY_SCALE.value * 2.0
    assert not scales_may_be_tiny(eps, torch.float8_e4m3fn if qfmt == "fp8" else torch.int8)
    _, scales = _exhaustive_kernels()
    counts = torch.zeros(2, dtype=torch.int32, device="cuda")
    chunk = 2**30
    for first in range(0, 2**32, chunk):
        scales[(chunk // BLOCK,)](counts, first, eps, QFMT=qfmt, BLOCK=BLOCK)
    differ, example = counts.tolist()
    assert differ == 0, f"{qfmt}: {differ} scales differ from tl.div_rn's, e.g. of the amax bits {example:#010x}"
