"""The Triton kernels on the CPU under TRITON_INTERPRET=1, against the torch reference.

Quantize/dequantize must match bit for bit (an FP8 NaN matches any NaN code, a NaN scale any NaN);
GEMMs within the contract's tolerances; quantized GELU within one code of the reference (erf/exp are
not bit-reproducible across implementations). Inputs are random, never zero, except where a test
plants zero/NaN/Inf blocks on purpose.
"""

from __future__ import annotations

import functools
import itertools
import os
from dataclasses import replace

import torch

# Triton decides at @jit time whether kernels are interpreted, for the whole process: turn the
# interpreter on only where there is no GPU, or collecting this module would put the GPU suite's
# Triton kernels on the interpreter too.
import numpy as np  # noqa: E402
import pytest  # noqa: E402

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import properties  # noqa: E402
from binding import LaunchSpy, check_binding, kernel_mma, simulate_on_cpu, spy_triton_gemms  # noqa: E402

from helpers import (  # noqa: E402
    DIFFERENTIABLE, INTERPRETER_ONLY, TAIL_EPS, activation_inputs, assert_same_q, assert_same_scale, check_activation,
    judge_quantized_gelu, outputs_of_every_op_on_grad_inputs, powers_of_two, quantizer_scales, quantizer_values,
    randn, reference_quant_linear, tail_blocks, tail_gemm_operands)
from quantcore import InvalidInputError, definitions, ops, registry  # noqa: E402
from quantcore.backends import torch as ref  # noqa: E402
from quantcore.runtime import workspace  # noqa: E402
from quantcore.backends.triton import configs, launch  # noqa: E402
from quantcore.backends.triton.kernels.cast import bf16_encode  # noqa: E402
from quantcore.backends.triton.kernels.epilogue import activate  # noqa: E402
from quantcore.backends.triton.kernels.fp8 import (  # noqa: E402
    fp8e4m3_decode_f16, fp8e4m3_encode, ue8m0_round_up)
from quantcore.backends.triton.kernels.quant import (  # noqa: E402
    TINY_SCALE, block_scale, divide, scales_may_be_tiny)
from quantcore.capability import SIMULATED, cpu_profile  # noqa: E402

pytestmark = [
    INTERPRETER_ONLY,
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]


def _interpreter_index_fix():
    """Triton 3.6's interpreter calls int() on 1-element arrays to drive `range(runtime_bound)`,
    which numpy >= 2.4 refuses (triton-lang/triton#9171, fixed upstream by #9172). Apply the
    upstream fix here, in the tests only, while the installed interpreter still has the bug."""
    import inspect

    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if "int(self.handle.data))" not in inspect.getsource(original):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    interpreter._patch_lang_tensor = patched


_interpreter_index_fix()


def _interpreter_reduce_by_slices():
    """The interpreter folds a `tl.reduce` with a combine function of its own (fp8.nan_absmax's, in every
    quantizer) one element at a time, a Python call of the combine function per element: most of these tests'
    time. Fold on whole slices instead, the combine function (elementwise, as every Triton combine region is)
    applied to all output elements at once: along the axis in order, each output element getting the same
    combine calls in the same order; or, for `fp8.nan_maximum` (a maximum, NaN where either is: any order
    gives the same fold, as the GPU's tree of shuffles does), halving the axis each step. Here, in the tests
    only, while the installed interpreter folds element by element."""
    import inspect

    from triton.runtime import interpreter

    from quantcore.backends.triton.kernels.fp8 import nan_maximum

    reduce_ops = interpreter.ReduceOps
    elementwise = reduce_ops.generic_reduce
    if "np.unravel_index(i, input_shape)" not in inspect.getsource(elementwise):
        return

    def by_slices(self, input):
        original_axis = self.axis
        input, axis = self.unravel(input, self.axis)
        shape = input[0].handle.data.shape
        if shape[axis] == 0:
            return elementwise(self, input)
        parts = [np.moveaxis(arg.handle.data, axis, 0) for arg in input]  # [axis, *the output's shape]

        def combine(acc, values):
            out = self.combine_fn.fn(*(self.to_tensor(v, arg.dtype) for v, arg in zip((*acc, *values), input * 2)))
            return [np.asarray(o.handle.data if isinstance(o, tl.core.tensor) else o).reshape(np.shape(a)).astype(a.dtype)
                    for o, a in zip(out if isinstance(out, tuple) else (out,), acc)]

        if self.combine_fn.fn is nan_maximum.fn:
            while len(parts[0]) > 1:
                half = len(parts[0]) // 2
                pairs = combine([p[:half] for p in parts], [p[half:2 * half] for p in parts])
                parts = [np.concatenate([c, p[2 * half:]]) for c, p in zip(pairs, parts)]
        acc = [p[0] for p in parts]
        for k in range(1, len(parts[0])):
            acc = combine(acc, [p[k] for p in parts])
        ret = []
        for a, arg in zip(acc, input):  # packed as the interpreter packs its result
            data = np.asarray(a)
            if self.keep_dims:
                data = np.expand_dims(data, axis) if original_axis is not None else data.reshape((1,) * len(shape))
            elif original_axis is None:
                data = data.item()
            ret.append(self.to_tensor(data, arg.dtype))
        return ret

    reduce_ops.generic_reduce = by_slices


_interpreter_reduce_by_slices()

FP8, I8 = torch.float8_e4m3fn, torch.int8
QDTYPES = [FP8, I8]
SM90 = SIMULATED["sm90"]  # FP8 MMA path
SM80 = SIMULATED["sm80"]  # FP8 decoded to fp16 (USE_FP8_MMA=False), default.json tiles
PROFILES = {"sm90": SM90, "sm80": SM80, "cpu": cpu_profile()}


# ---------------------------------------------------------------------------------------------
# comparison helpers, and the sample of a parameter sweep


EXHAUSTIVE = os.environ.get("QUANTCORE_EXHAUSTIVE_SWEEPS") == "1"  # every case of the sampled sweeps below


def covering(*axes) -> list[tuple]:
    """A sample of the product of `axes` in which each value of each axis appears: as many cases as the
    longest axis has values, each axis's values in turn (a tuple value stands for several parameters). The
    axes are a test's independent switches (compile-time constants, dtypes, tail shapes): the sample takes
    every code path the product takes (tests/README.md). QUANTCORE_EXHAUSTIVE_SWEEPS=1: the whole product."""
    def flat(values):
        return sum((v if isinstance(v, tuple) else (v,) for v in values), ())

    return sampled([flat([axis[i % len(axis)] for axis in axes]) for i in range(max(map(len, axes)))],
                   [flat(values) for values in itertools.product(*axes)])


def sampled(sample: list, every: list) -> list:
    """A sweep's cases: `sample`, or `every` one with QUANTCORE_EXHAUSTIVE_SWEEPS=1."""
    return every if EXHAUSTIVE else sample

def assert_bits_equal(x, expected):
    """Float tensors equal bit for bit (signed zeros included); NaN matches any NaN."""
    assert x.dtype == expected.dtype and x.shape == expected.shape
    nan_x, nan_e = torch.isnan(x), torch.isnan(expected)
    assert torch.equal(nan_x, nan_e), "NaN positions differ"
    view = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}[x.dtype]
    a, b = x.view(view)[~nan_x], expected.view(view)[~nan_e]
    assert torch.equal(a, b), f"{int((a != b).sum())} values differ in their bits"


def rel_err(out, expected):
    """Relative Frobenius error over the positions where the reference is finite; inf if `out`
    is non-finite anywhere the reference is finite."""
    o, e = out.double(), expected.double()
    finite = torch.isfinite(e)
    if not bool(torch.isfinite(o[finite]).all()):
        return float("inf")
    return float((o[finite] - e[finite]).norm() / e[finite].norm())


def strided(x, extra=37):
    """The same values as a view whose row stride exceeds its width (the gap poisoned)."""
    poison = float("nan") if x.dtype.is_floating_point else 77
    wide = torch.full((x.shape[0], x.shape[1] + extra), poison, dtype=x.dtype)
    wide[:, : x.shape[1]] = x
    return wide[:, : x.shape[1]]


def one_binade(x):
    """x's signs with magnitudes in [256, 448): quantized (one scale per block, ~1), codes of 256-448
    whose K-block dots are exact in fp32 in any order (at most 128 products, multiples of 1024, below
    2^25). The interpreter multiplies through numpy, whose summation order follows the operands'
    orientation: the decode kernel's swapped dot and the tiled kernel's could otherwise round apart
    where the GPU's MMAs do not (tests/gpu checks random data there)."""
    return x.sign() * (256 + 191 * torch.rand(x.shape, generator=torch.Generator().manual_seed(3))).to(x.dtype)


def plant_specials(x, group):
    """NaN in block 0 of row 0, +Inf in block 1 of row 1, -Inf in block 0 of row 2, a zero block."""
    x = x.clone()
    x[0, min(3, x.shape[1] - 1)] = float("nan")
    if x.shape[0] > 1 and x.shape[1] > group:
        x[1, group] = float("inf")
    if x.shape[0] > 2:
        x[2, 0] = float("-inf")
        x[-1, : min(group, x.shape[1])] = 0
    return x


# ---------------------------------------------------------------------------------------------
# the bit codecs and the epilogue activations, directly

@triton.jit
def _codec_kernel(src, dst, n, CODEC: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(src + offs, mask=offs < n)
    if CODEC == "gelu" or CODEC == "gelu_tanh" or CODEC == "silu":
        y = activate(x, CODEC)
    elif CODEC == "fp8_encode":
        y = fp8e4m3_encode(x)
    elif CODEC == "fp8_decode":
        y = fp8e4m3_decode_f16(x)
    elif CODEC == "bf16":
        y = bf16_encode(x)
    else:
        y = ue8m0_round_up(x)
    tl.store(dst + offs, y, mask=offs < n)


def _run(codec, src, out_dtype):
    out = torch.empty(src.shape, dtype=out_dtype)
    _codec_kernel[(triton.cdiv(src.numel(), 4096),)](src, out, src.numel(), CODEC=codec, BLOCK=4096)
    return out


def _fp8_edge_values():
    """Every e4m3 value, the midpoints between neighbours and one fp32 ulp either side, values
    past 448 (464 is the first that would round to 480 unsaturated), subnormal-range and tiny
    values, ±0, ±Inf, NaN, and random fp32 bit patterns."""
    codes = torch.arange(0, 0x7F, dtype=torch.uint8).view(FP8).float()
    mids = (codes[1:] + codes[:-1]) / 2
    base = torch.cat([codes, mids, torch.tensor([447.9, 448.0, 455.99, 463.99, 464.0, 464.01, 480.0, 1e6,
                                                 3e38, 2.0 ** -10, 2.0 ** -10 * 1.0001, 2.0 ** -12, 1e-30,
                                                 1e-45, 0.0, float("inf")])])
    ulps = torch.cat([base, torch.nextafter(base, torch.tensor(float("inf"))),
                      torch.nextafter(base, torch.tensor(0.0))])
    rand_bits = torch.randint(-(2 ** 31), 2 ** 31 - 1, (20000,), generator=torch.Generator().manual_seed(5),
                              dtype=torch.int64).to(torch.int32).view(torch.float32)
    return torch.cat([ulps, -ulps, torch.tensor([float("nan"), -float("nan")]), rand_bits])


def test_fp8_encode_matches_torch_cast_bit_for_bit():
    v = _fp8_edge_values()
    got = _run("fp8_encode", v, torch.uint8)
    expected = v.clamp(-448, 448).to(FP8).view(torch.uint8)
    assert_same_q(got.view(FP8), expected.view(FP8))
    finite = torch.isfinite(v)
    assert torch.equal(got[finite], expected[finite])  # signed zeros included
    assert int(got[v.abs() >= 448].view(torch.uint8).bitwise_and(0x7F).max()) == 0x7E  # saturates, no NaN


@triton.jit
def _divide_kernel(x_ptr, s_ptr, out_ptr, n, POW2: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, divide(tl.load(x_ptr + offs, mask=offs < n), tl.load(s_ptr + offs, mask=offs < n),
                                    POW2), mask=offs < n)


@pytest.mark.parametrize("pow2", [False, True])
def test_quantizer_division_rounds_as_ieee_division(pow2):
    """`quant.divide` (a reciprocal per group, a product, an FMA's exact remainder and one correction; for
    power-of-two scales, `pow2`, the product alone) gives IEEE division's quotient wherever that is at least
    2^-17, and the same FP8 and INT8 codes everywhere (below, both are ±0), on ~2,000 scales over every
    exponent below 2^123 (their powers of two where `pow2`) × 256 values each; the interpreter's FMA rounds
    once, as the GPU's (tests/gpu/test_quantize_division.py checks it compiled)."""
    scales = powers_of_two(quantizer_scales()) if pow2 else quantizer_scales()
    x = quantizer_values(scales, 256, torch.Generator().manual_seed(1)).flatten()
    s = scales[:, None].expand(-1, 256).flatten().contiguous()
    got = torch.empty_like(x)
    _divide_kernel[(triton.cdiv(x.numel(), 4096),)](x, s, got, x.numel(), POW2=pow2, BLOCK=4096)
    expected = x / s
    big = ~(expected.abs() < 2.0**-17)  # NaN and ±Inf count as big
    differ = (got.view(torch.int32) != expected.view(torch.int32)) & ~(got.isnan() & expected.isnan()) & big
    assert not differ.any(), (x[differ][:4].tolist(), s[differ][:4].tolist(), got[differ][:4].tolist())
    for qdtype in (FP8, torch.int8):
        assert_same_q(ref.quant.encode(got, qdtype), ref.quant.encode(expected, qdtype))


@triton.jit
def _block_scale_kernel(amax_ptr, out_ptr, n, eps, QFMT: tl.constexpr, TINY_SCALES: tl.constexpr,
                        BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, block_scale(tl.load(amax_ptr + offs, mask=offs < n), eps, QFMT, False, TINY_SCALES),
             mask=offs < n)


@pytest.mark.parametrize("tiny", [False, True])
@pytest.mark.parametrize("qdtype", [FP8, torch.int8])
def test_block_scale_rounds_as_ieee_division(qdtype, tiny):
    """`quant.block_scale` is the reference's max(amax, eps) / qmax bit for bit: without TINY_SCALES (a
    constant reciprocal of qmax, the product and one correction by the FMA's exact remainder) at the smallest
    eps that allows, with them (`tl.div_rn`) at eps down to the smallest subnormal; on amax over every fp32
    exponent (significands 0, all ones, one and random), +Inf and NaN. The GPU's is checked on every amax
    (tests/gpu/test_quantize_division.py)."""
    qmax = 448.0 if qdtype == FP8 else 127.0
    eps = 2.0**-149 if tiny else qmax * TINY_SCALE.value * 2.0
    assert scales_may_be_tiny(eps, qdtype) == tiny
    g = torch.Generator().manual_seed(3)
    exps = torch.arange(0, 255, dtype=torch.int64)
    mants = torch.cat([torch.tensor([0, 0x7FFFFF, 1]), torch.randint(0, 0x800000, (61,), generator=g)])
    bits = (exps[:, None] << 23 | mants[None, :]).flatten()
    rand = torch.randint(0, 0x7F800000, (2**14,), generator=g)
    bits = torch.cat([bits, torch.tensor([0x7F800000, 0x7FC00000]), rand])
    amax = bits.to(torch.int32).view(torch.float32)
    got = torch.empty_like(amax)
    qfmt = "fp8" if qdtype == FP8 else "int8"
    _block_scale_kernel[(triton.cdiv(amax.numel(), 4096),)](amax, got, amax.numel(), eps, QFMT=qfmt,
                                                            TINY_SCALES=tiny, BLOCK=4096)
    expected = torch.where(amax < eps, torch.tensor(eps, dtype=torch.float32), amax) / qmax
    assert_same_scale(got, expected)


def test_fp8_decode_all_codes_exactly():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    got = _run("fp8_decode", codes, torch.float16).float()
    expected = codes.view(FP8).float()
    assert_bits_equal(got, expected)


def test_bf16_encode_matches_torch_round_to_nearest_even():
    v = torch.cat([_fp8_edge_values(), torch.tensor([3.3895313892515355e38, 3.4e38, 1 + 2.0 ** -8,
                                                      1 + 3 * 2.0 ** -8, -(1 + 2.0 ** -8), 1e-40])])
    got = _run("bf16", v, torch.int16).view(torch.bfloat16)
    assert_bits_equal(got, v.to(torch.bfloat16))


def test_ue8m0_rounds_up_to_powers_of_two_on_bits():
    s = torch.cat([torch.rand(5000, generator=torch.Generator().manual_seed(1)) * 10.0 ** torch.randint(
        -30, 30, (5000,), generator=torch.Generator().manual_seed(2)),
        torch.tensor([1.0, 0.5, 2.0 ** -126, 1e-40, 3.4e38, float("inf"), float("nan"), 0.0])])
    got = _run("ue8m0", s, torch.float32)
    assert_bits_equal(got, ref.quant.round_scale_ue8m0(s))


@pytest.mark.parametrize("name", ["gelu", "gelu_tanh", "silu"])
def test_activations_match_float64_over_the_whole_range(name):
    """The epilogue activation against the float64 oracle, the negative tail included (never −0 where
    the exact value is a non-zero fp32 number), as the reference's in tests/test_activations.py."""
    x = activation_inputs()
    check_activation(_run(name, x, torch.float32), x, name)


# ---------------------------------------------------------------------------------------------
# activation quantize and dequantize

# Per format: whole blocks (the unmasked path), a one-element last block on rows that are no power of two, and
# K short of one group.
@pytest.mark.parametrize("qdtype, M, K", sampled(
    [(q, *shape) for q in QDTYPES for shape in ((1, 128), (7, 129), (3, 64))],
    [(q, M, K) for q in QDTYPES for M in (1, 3, 7) for K in (1, 64, 127, 128, 129, 576)]))
def test_act_quant_tails(gen, qdtype, K, M):
    x = randn((M, K), dtype=torch.bfloat16, gen=gen)
    kw = dict(qdtype=qdtype, group_size=128, ue8m0=False, eps=1e-4, scale_m_major=False)
    q, s = launch.act_quant(x, profile=SM90, **kw)
    eq, es = ref.act_quant(x, **kw)
    assert_same_q(q, eq)
    assert_bits_equal(s, es)


@pytest.mark.parametrize("qdtype, in_dtype, group", covering(QDTYPES, [torch.bfloat16, torch.float16, torch.float32],
                                                             [128, 96, 32]))
def test_act_quant_dtypes_ue8m0_m_major_strided(gen, qdtype, in_dtype, group):
    x = strided(randn((7, 576), dtype=in_dtype, gen=gen, scale=30.0))
    kw = dict(qdtype=qdtype, group_size=group, ue8m0=True, eps=1e-4, scale_m_major=True)
    q, s = launch.act_quant(x, profile=PROFILES["cpu"], **kw)
    eq, es = ref.act_quant(x, **kw)
    assert s.stride() == (1, 7) and q.is_contiguous()
    assert_same_q(q, eq)
    assert_bits_equal(s, es)
    assert int((s.view(torch.int32) & 0x7FFFFF).abs().sum()) == 0


@pytest.mark.parametrize("qdtype", QDTYPES)
@pytest.mark.parametrize("ue8m0", [False, True])
def test_act_quant_nan_inf_zero_blocks(gen, qdtype, ue8m0):
    x = plant_specials(randn((5, 300), gen=gen), 128)
    kw = dict(qdtype=qdtype, group_size=128, ue8m0=ue8m0, eps=1e-4, scale_m_major=False)
    q, s = launch.act_quant(x, profile=SM90, **kw)
    eq, es = ref.act_quant(x, **kw)
    assert_same_q(q, eq)
    assert_bits_equal(s, es)
    assert torch.isnan(s[0, 0]) and torch.isinf(s[1, 1]) and torch.isinf(s[2, 0])
    assert torch.isfinite(s[0, 1:]).all() and torch.isfinite(s[1, 0])  # other blocks unaffected
    assert float(s[-1, 0]) == float(ref.quant.block_scale(torch.zeros(1), qdtype, ue8m0, 1e-4))


@pytest.mark.parametrize("eps", [1e-40, 7 * 2.0**-121, 7 * 2.0**-120])
def test_ue8m0_subnormal_scales_become_two_to_minus_126(gen, eps):
    x = randn((2, 256), gen=gen)
    x[:, 128:] = 0
    kw = dict(qdtype=FP8, group_size=128, ue8m0=True, eps=eps, scale_m_major=False)
    q, s = launch.act_quant(x, profile=SM90, **kw)
    eq, es = ref.act_quant(x, **kw)
    assert float(s[0, 1]) == 2.0**-126
    assert_same_q(q, eq)
    assert_bits_equal(s, es)


@pytest.mark.parametrize("qdtype, out_dtype", covering(QDTYPES, [torch.bfloat16, torch.float16, torch.float32]))
def test_act_dequant_any_scale_strides(gen, qdtype, out_dtype):
    x = plant_specials(randn((7, 576), gen=gen, scale=100.0), 128)
    q, s = ref.act_quant(x, qdtype=qdtype, group_size=128, ue8m0=False, eps=1e-4, scale_m_major=True)
    for scale in (s, s.contiguous(), strided(s.contiguous(), extra=3)):
        got = launch.act_dequant(strided(q.view(torch.uint8)).view(qdtype) if qdtype == FP8 else strided(q),
                                 scale, group_size=128, out_dtype=out_dtype, profile=SM90)
        assert_bits_equal(got, ref.act_dequant(q, s, group_size=128, out_dtype=out_dtype))


# ---------------------------------------------------------------------------------------------
# weights

@pytest.mark.parametrize("qdtype, ue8m0, block", covering([(q, u) for q in QDTYPES for u in (False, True)],
                                                        [((128, 128),), ((64, 128),), ((32, 96),)]))
def test_weight_quant_dequant_blocks_and_tails(gen, qdtype, ue8m0, block):
    w = plant_specials(randn((200, 300), dtype=torch.bfloat16, gen=gen), block[1])
    kw = dict(qdtype=qdtype, block_n=block[0], block_k=block[1], ue8m0=ue8m0, eps=1e-4)
    q, s = launch.weight_quant(strided(w), profile=SM90, **kw)
    eq, es = ref.weight_quant(w, **kw)
    assert s.shape == (-(-200 // block[0]), -(-300 // block[1]))
    assert_same_q(q, eq)
    assert_bits_equal(s, es)
    got = launch.weight_dequant(q, s.t().contiguous().t(), block_n=block[0], block_k=block[1],
                                out_dtype=torch.bfloat16, profile=SM80)
    assert_bits_equal(got, ref.weight_dequant(q, s, block_n=block[0], block_k=block[1],
                                              out_dtype=torch.bfloat16))


@pytest.mark.parametrize("qdtype, shape, block", covering(QDTYPES, [((256, 384), (128, 128)), ((64, 512), (1, 128))]))
def test_whole_block_tensors_take_the_unmasked_path(gen, qdtype, shape, block):
    assert configs.block_tiling(*shape, *block, SM90).even
    w = plant_specials(randn(shape, dtype=torch.bfloat16, gen=gen), block[1])
    kw = dict(qdtype=qdtype, block_n=block[0], block_k=block[1], ue8m0=False, eps=1e-4)
    q, s = launch.weight_quant(w, profile=SM90, **kw)
    eq, es = ref.weight_quant(w, **kw)
    assert_same_q(q, eq)
    assert_bits_equal(s, es)
    got = launch.weight_dequant(q, s, block_n=block[0], block_k=block[1], out_dtype=torch.float32, profile=SM90)
    assert_bits_equal(got, ref.weight_dequant(q, s, block_n=block[0], block_k=block[1], out_dtype=torch.float32))


@pytest.mark.parametrize("qdtype", QDTYPES)
def test_blocks_larger_than_the_dimension_tile_the_dimension(gen, qdtype):
    """A 2^31 group would be padded to a 2^31-element tile; the op hands the kernel the dimension."""
    huge = 2**31
    x = randn((2, 10), gen=gen)
    q, s = ops.act_quant(x, dtype=qdtype, group_size=huge, backend="triton")
    eq, es = ref.act_quant(x, qdtype=qdtype, group_size=10, ue8m0=False, eps=1e-4, scale_m_major=False)
    assert_same_q(q, eq)
    assert_bits_equal(s, es)
    assert_bits_equal(ops.act_dequant(q, s, group_size=huge, out_dtype=torch.float32, backend="triton"),
                      ref.act_dequant(eq, es, group_size=10, out_dtype=torch.float32))
    g, gs = ops.quantized_gelu(q, s, group_size=huge, backend="triton")
    assert g.shape == q.shape and gs.shape == (2, 1)
    w = randn((3, 5), gen=gen)
    wq, ws = ops.weight_quant(w, dtype=qdtype, block_size=(huge, huge), backend="triton")
    ewq, ews = ref.weight_quant(w, qdtype=qdtype, block_n=3, block_k=5, ue8m0=False, eps=1e-4)
    assert_same_q(wq, ewq)
    assert_bits_equal(ws, ews)
    assert_bits_equal(ops.weight_dequant(wq, ws, block_size=(huge, huge), backend="triton"),
                      ref.weight_dequant(ewq, ews, block_n=3, block_k=5, out_dtype=torch.bfloat16))


# ---------------------------------------------------------------------------------------------
# epilogues

@pytest.mark.parametrize("g_dtype, bias_dtype", covering([torch.bfloat16, torch.float16, torch.float32, torch.int32],
                                                        [None, torch.bfloat16, torch.float32, torch.float64]))
def test_dequant_bias_bit_exact(gen, g_dtype, bias_dtype):
    M, N = 7, 300
    g = randn((M, N), gen=gen, scale=1000.0)
    g = g.round().to(torch.int32) if g_dtype == torch.int32 else g.to(g_dtype)
    sa = randn((M, 1), gen=gen)[:, 0].abs()
    sb = randn((N, 2), gen=gen)[:, 0].abs()  # a strided vector
    bias = None if bias_dtype is None else randn((1, N), gen=gen)[0].to(bias_dtype)
    for out_dtype in (torch.bfloat16, torch.float32):
        got = launch.dequant_bias(strided(g), sa, sb, bias, out_dtype=out_dtype, profile=SM90)
        assert_bits_equal(got, ref.dequant_bias(g, sa, sb, bias, out_dtype=out_dtype))


@pytest.mark.parametrize("qdtype, approximate", covering(QDTYPES, ["none", "tanh"]))
def test_quantized_gelu_on_the_negative_tail(qdtype, approximate):
    q, s = ref.act_quant(tail_blocks(), qdtype=qdtype, group_size=128, ue8m0=False, eps=1e-4, scale_m_major=False)
    q2, s2 = launch.quantized_gelu(q, s, group_size=128, approximate=approximate, out_qdtype=qdtype, ue8m0=False,
                                   eps=TAIL_EPS, profile=SM90)
    judge_quantized_gelu(q, s, q2, s2, approximate, "int8" if qdtype == I8 else "fp8_e4m3")


@pytest.mark.parametrize("name", ["gelu", "gelu_tanh", "silu"])
def test_scaled_mm_epilogue_activation_on_the_negative_tail(name):
    x = activation_inputs()
    x = x[x != 0][::29].contiguous()  # 0 + (−0) is +0: the epilogue never sees a −0
    a, a_s, b, b_s = tail_gemm_operands(x, I8)
    kw = _gemm_kw(block_n=16, block_k=16, bias=x, activation=name)
    out = launch.scaled_mm(a, a_s, b, b_s, **_on("sm80", I8), **kw)
    for row in out:
        check_activation(row, x, name)


@pytest.mark.parametrize("qdtype, out_qdtype, approximate", covering([(q, o) for q in QDTYPES for o in QDTYPES],
                                                                     ["none", "tanh"]))
def test_quantized_gelu_within_one_code(gen, qdtype, out_qdtype, approximate):
    x = randn((7, 576), gen=gen, scale=3.0)
    q, s = ref.act_quant(x, qdtype=qdtype, group_size=128, ue8m0=False, eps=1e-4, scale_m_major=True)
    kw = dict(group_size=128, approximate=approximate, out_qdtype=out_qdtype, ue8m0=False, eps=1e-4)
    q2, s2 = launch.quantized_gelu(q, s, profile=SM90, **kw)
    eq, es = ref.quantized_gelu(q, s, **kw)
    assert q2.dtype == out_qdtype and s2.shape == es.shape
    assert float(((s2 - es).abs() / es).max()) <= 4e-7  # at most an ulp or so of the block's amax
    got = ref.act_dequant(q2, s2, group_size=128, out_dtype=torch.float32)
    want = ref.act_dequant(eq, es, group_size=128, out_dtype=torch.float32)
    assert rel_err(got, want) <= 1e-4
    codes, expected = q2.float(), eq.float()  # FP8 -0 vs +0 (erf(x) == -1 exactly or not) compare equal
    assert int((codes != expected).sum()) <= max(2, codes.numel() // 500)


# ---------------------------------------------------------------------------------------------
# GEMM

def _gemm_inputs(gen, M, N, K, qdtype, block_n, block_k, values=lambda t: t):
    a = values(randn((M, K), gen=gen))
    w = values(randn((N, K), gen=gen))
    aq, a_s = ref.act_quant(a, qdtype=qdtype, group_size=block_k, ue8m0=False, eps=1e-4, scale_m_major=True)
    bq, b_s = ref.weight_quant(w, qdtype=qdtype, block_n=block_n, block_k=block_k, ue8m0=False, eps=1e-4)
    return aq, a_s, bq, b_s


def _gemm_kw(block_n=128, block_k=128, bias=None, activation=None, out_dtype=torch.float32,
             out_quant=None, out_group=128, ue8m0_out=False):
    return dict(block_n=block_n, block_k=block_k, bias=bias, activation=activation, out_dtype=out_dtype,
                out_quant=out_quant, out_group=out_group, ue8m0_out=ue8m0_out, eps=1e-4)


TOL = {FP8: 1e-5, I8: 1e-6}


def _on(profile: str, qdtype) -> dict:
    """The launch's `profile` and the `mma` option of the Triton GEMM variant the registry picks there
    (tests/test_registry.py): INT8 MMA for INT8; FP8 MMA on sm_89+, FP8 decoded to fp16 below."""
    p = PROFILES[profile]
    return dict(profile=p, mma="int8" if qdtype == I8 else "fp8" if p.fp8_mma else "fp16")


@pytest.fixture
def few_programs(monkeypatch):
    """The block quantizers and dequantizers tiled as on the CPU's profile: a few programs where a GPU's tiling
    launches one a block, which the interpreter runs many times slower; each block's bits are the same on any
    tiling (the tests above judge the tilings). For the tests that judge what is around them: quant_linear's
    paths, the registry's binding."""
    tiling = configs.block_tiling
    monkeypatch.setattr(configs, "block_tiling", lambda R, C, br, bc, profile: tiling(R, C, br, bc, PROFILES["cpu"]))


def _tiled_only(monkeypatch):
    """Send every M to the tiled kernel (the decode kernel otherwise takes M <= 64)."""
    monkeypatch.setattr(configs, "decode_m_max", lambda profile, mma: 0)


# Each kernel and MMA (the profile's, per format) on one of the tail shapes, in turn.
@pytest.mark.parametrize("kernel, profile, qdtype, M, N, K", covering(
    [(k, p, q) for k in ("decode", "tiled") for p in ("sm90", "sm80") for q in QDTYPES],
    [(1, 33, 1), (3, 96, 129), (7, 200, 576), (3, 64, 127)]))
def test_scaled_mm_shapes_and_paths(gen, monkeypatch, kernel, profile, qdtype, M, N, K):
    if kernel == "tiled":
        _tiled_only(monkeypatch)
    aq, a_s, bq, b_s = _gemm_inputs(gen, M, N, K, qdtype, 128, 128)
    kw = _gemm_kw()
    got = launch.scaled_mm(aq, a_s, bq, b_s, **_on(profile, qdtype), **kw)
    assert rel_err(got, ref.scaled_mm(aq, a_s, bq, b_s, **kw)) <= TOL[qdtype]


@pytest.mark.parametrize("M, N, K, block_ks", covering([(70, 200, 300), (5, 33, 129)], [0, 64]))
def test_predecoded_w8a16_gemm_is_bit_identical_to_decoding_in_the_kernel(gen, monkeypatch, M, N, K, block_ks):
    """From configs.predecode's rows the tiled W8A16 GEMM reads a and b decoded to fp16 once per call
    (row strides K, whatever the inputs' strides): the same products summed in the same order, on
    the same tile and K step."""
    _tiled_only(monkeypatch)
    aq, a_s, bq, b_s = _gemm_inputs(gen, M, N, K, FP8, 128, 128)
    aq = strided(aq.view(torch.uint8)).view(FP8)
    aq.view(torch.uint8)[0, K // 2] = 0x7F  # a NaN code: row 0 is NaN either way
    kw = _gemm_kw()
    kinds, cfg = [], configs.GemmConfig(64, 64, 4, 2, block_ks=block_ks)
    monkeypatch.setattr(configs, "gemm_config", lambda *a, **kw: kinds.append(kw["mma"]) or cfg)
    in_kernel = launch.scaled_mm(aq, a_s, bq, b_s, **_on("sm80", FP8), **kw)
    monkeypatch.setattr(configs, "predecode", lambda profile, M, N, K: True)
    got = launch.scaled_mm(aq, a_s, bq, b_s, **_on("sm80", FP8), **kw)
    assert kinds == ["fp16", "fp16_predecoded"] and bool(got[0].isnan().all())
    assert_bits_equal(got, in_kernel)


@pytest.mark.parametrize("qdtype, block_ks", covering(QDTYPES, [32, 64]))
def test_k_blocks_multiplied_in_steps(gen, monkeypatch, qdtype, block_ks):
    """BLOCK_KS < BLOCK_K: each 128-wide K block in steps chained on one accumulator, promoted at the
    block's end, K = 300 ending in a partial block whose last steps lie wholly past K. INT8 sums are
    exact, so bit for bit the whole-block loop; FP8 (decoded to fp16 here) within the contract. On the
    GPU the chained MMAs are the whole block's instructions, bit for bit (tests/gpu/test_w8a16.py)."""
    _tiled_only(monkeypatch)
    aq, a_s, bq, b_s = _gemm_inputs(gen, 33, 200, 300, qdtype, 128, 128)
    kw, on = _gemm_kw(), _on("sm80", qdtype)
    outs = []
    for ks in (0, block_ks):
        monkeypatch.setattr(configs, "gemm_config", lambda *a, ks=ks, **k: configs.GemmConfig(32, 64, 4, 2, block_ks=ks))
        outs.append(launch.scaled_mm(aq, a_s, bq, b_s, **on, **kw))
    assert rel_err(outs[1], ref.scaled_mm(aq, a_s, bq, b_s, **kw)) <= TOL[qdtype]
    if qdtype == I8:
        assert_bits_equal(outs[1], outs[0])


def test_the_k_step_of_a_config():
    cfg = configs.GemmConfig(128, 128, 8, 3, block_ks=64)
    assert cfg.step_k(128, False) == 64 and cfg.step_k(128, True) == 128  # TMA loads whole blocks
    assert cfg.step_k(64, False) == 64 and cfg.step_k(96, False) == 96  # not a proper divisor: whole blocks
    assert configs.GemmConfig(128, 128, 8, 3, k_step=2, block_ks=64).step_k(128, False) == 128
    assert cfg.smem_bytes(128, "fp16_predecoded") == 3 * 256 * 64 * 2 + 1024
    assert configs.GemmConfig(128, 128, 8, 3).smem_bytes(128, "fp16_predecoded") == 3 * 256 * 128 * 2 + 1024


def test_predecode_from_its_rows_within_its_bytes():
    rule = configs._table("default")["predecode"]
    m, limit = rule["m_min"], rule["max_bytes"]
    assert configs.predecode(SM80, m, 4096, 7168) and not configs.predecode(SM80, m - 1, 4096, 7168)
    k = limit // (2 * (m + 4096))
    assert configs.predecode(SM80, m, 4096, k) and not configs.predecode(SM80, m, 4096, k + 1)
    assert not configs.predecode(SM90, 2 * m, 4096, 7168)  # GPUs with FP8 MMA have no such rule


@pytest.mark.parametrize("k_step, tma, qdtype", covering([(k, t) for k in (1, 2) for t in (False, True)], QDTYPES))
def test_scaled_mm_k_steps_and_tma_loads(gen, monkeypatch, qdtype, k_step, tma):
    """Two K blocks per iteration with an odd block count (the phantom block adds nothing), and tiles
    through TMA descriptors (K = 272: 16-byte rows, a 16-wide last block zero-filled past K)."""
    aq, a_s, bq, b_s = _gemm_inputs(gen, 5, 200, 272, qdtype, 128, 128)
    cfg = configs.GemmConfig(16, 64, 4, 2, k_step=k_step, tma=tma)
    monkeypatch.setattr(configs, "gemm_config", lambda *args, **kwargs: cfg)
    _tiled_only(monkeypatch)
    kw = _gemm_kw()
    assert launch._tma_ready(aq, bq, SM90)
    got = launch.scaled_mm(aq, a_s, bq, b_s, **_on("sm90", qdtype), **kw)
    assert rel_err(got, ref.scaled_mm(aq, a_s, bq, b_s, **kw)) <= TOL[qdtype]


@pytest.mark.parametrize("qdtype, block_n, block_k", covering(QDTYPES, [(64, 128), (128, 64), (96, 32), (32, 64)]))
def test_scaled_mm_block_shapes(gen, qdtype, block_n, block_k):
    """block_n need not equal block_k nor divide BLOCK_N (scales then gathered per column)."""
    aq, a_s, bq, b_s = _gemm_inputs(gen, 5, 200, 300, qdtype, block_n, block_k)
    kw = _gemm_kw(block_n=block_n, block_k=block_k)
    got = launch.scaled_mm(aq, a_s.contiguous(), bq, b_s, **_on("sm90", qdtype), **kw)
    assert rel_err(got, ref.scaled_mm(aq, a_s, bq, b_s, **kw)) <= TOL[qdtype]


@pytest.mark.parametrize("qdtype, activation, out_dtype, tol", covering(
    QDTYPES, [None, "gelu", "gelu_tanh", "silu"], [(torch.float32, None), (torch.float16, 1e-3), (torch.bfloat16, 1e-2)]))
def test_scaled_mm_epilogue_cast(gen, qdtype, activation, out_dtype, tol):
    aq, a_s, bq, b_s = _gemm_inputs(gen, 7, 200, 129, qdtype, 128, 128)
    bias = randn((1, 200), gen=gen)[0].to(torch.bfloat16)
    kw = _gemm_kw(bias=bias, activation=activation, out_dtype=out_dtype)
    got = launch.scaled_mm(aq, a_s, bq, b_s, **_on("sm90", qdtype), **kw)
    assert got.dtype == out_dtype
    assert rel_err(got, ref.scaled_mm(aq, a_s, bq, b_s, **kw)) <= (tol or TOL[qdtype])


@pytest.mark.parametrize("qdtype, out_quant, out_group, ue8m0_out", covering(
    [(q, o) for q in QDTYPES for o in QDTYPES], [(128, False), (32, True)]))
def test_scaled_mm_epilogue_requantize(gen, qdtype, out_quant, out_group, ue8m0_out):
    aq, a_s, bq, b_s = _gemm_inputs(gen, 7, 200, 129, qdtype, 128, 128)
    bias = randn((1, 200), gen=gen)[0]
    kw = _gemm_kw(bias=bias, activation="silu", out_quant=out_quant, out_group=out_group, ue8m0_out=ue8m0_out)
    q, s = launch.scaled_mm(aq, a_s, bq, b_s, **_on("sm80", qdtype), **kw)
    eq, es = ref.scaled_mm(aq, a_s, bq, b_s, **kw)
    assert q.dtype == out_quant and s.shape == (7, -(-200 // out_group))
    assert float(((s - es).abs() / es).max()) <= 1e-5  # the fp32 accumulators agree to ~1e-7
    got = ref.act_dequant(q, s, group_size=out_group, out_dtype=torch.float32)
    want = ref.act_dequant(eq, es, group_size=out_group, out_dtype=torch.float32)
    assert rel_err(got, want) <= 1e-3


def test_tiny_scales_are_ruled_out_from_eps_with_rounding_to_spare():
    """`quant.scales_may_be_tiny`: the default eps rules scales below 2^-64 out, a tiny one does not; and
    wherever it says no, eps / qmax in fp32 (the kernels' own division of eps, rounded) is at least 2^-64."""
    for dtype, qmax in ((FP8, 448.0), (I8, 127.0)):
        assert not scales_may_be_tiny(1e-4, dtype) and scales_may_be_tiny(1e-30, dtype)
        assert not scales_may_be_tiny(1e-30, None) and not scales_may_be_tiny(1e-30, torch.bfloat16)
        edge = qmax * 2.0**-63
        for eps in np.nextafter(np.float32(edge), np.float32(0)) * np.float32(2.0) ** np.arange(-2, 3):
            floor = torch.tensor(float(eps)) / torch.tensor(qmax)  # fp32 eps over fp32 qmax, correctly rounded
            assert scales_may_be_tiny(float(eps), dtype) or float(floor) >= 2.0**-64, (qmax, float(eps))


@pytest.mark.parametrize("out_quant", QDTYPES)
def test_scaled_mm_requantizes_subnormal_scales_as_act_quant(gen, out_quant):
    """Re-quantized outputs whose groups' scales are subnormal (operand scales times 2^-130, eps 1e-40): the
    launch compiles `divide`'s rescaling in for such an eps (TINY_SCALES), so the codes and scales are the
    reference act_quant's of the same GEMM's fp32 result; without it the reciprocal overflows."""
    aq, a_s, bq, b_s = _gemm_inputs(gen, 7, 256, 128, FP8, 128, 128)
    a_s = a_s * 2.0**-130
    kw = dict(_gemm_kw(), eps=1e-40)
    f32 = launch.scaled_mm(aq, a_s, bq, b_s, **_on("sm80", FP8), **kw)
    q, s = launch.scaled_mm(aq, a_s, bq, b_s, **_on("sm80", FP8), **dict(kw, out_quant=out_quant))
    eq, es = ref.act_quant(f32, qdtype=out_quant, group_size=128, ue8m0=False, eps=1e-40, scale_m_major=False)
    assert bool((es < 2.0**-126).any())  # subnormal scales, whose reciprocals overflow fp32
    assert_same_scale(s, es)
    assert_same_q(q, eq)


def test_scaled_mm_nan_block_poisons_only_its_rows(gen):
    x = randn((5, 256), gen=gen)
    x[2, 7] = float("nan")
    aq, a_s = ref.act_quant(x, qdtype=FP8, group_size=128, ue8m0=False, eps=1e-4, scale_m_major=False)
    _, _, bq, b_s = _gemm_inputs(gen, 1, 64, 256, FP8, 128, 128)
    got = launch.scaled_mm(aq, a_s, bq, b_s, **_on("sm90", FP8), **_gemm_kw())
    expected = ref.scaled_mm(aq, a_s, bq, b_s, **_gemm_kw())
    assert torch.isnan(got[2]).all() and torch.equal(torch.isnan(got), torch.isnan(expected))
    assert rel_err(got, expected) <= 1e-5


@pytest.mark.parametrize("qdtype, split_k", covering(QDTYPES, [1, 2, 5]))
def test_decode_split_k_sums_in_a_fixed_order(gen, monkeypatch, qdtype, split_k):
    """Every split of K agrees with the reference, and a repeated call is bit-identical (the partials
    meet in split order; the counters are back at zero after each launch)."""
    aq, a_s, bq, b_s = _gemm_inputs(gen, 3, 100, 600, qdtype, 128, 128)  # 5 K blocks
    cfg = configs.DecodeConfig(16, 64, 4, 2, split_k, -(-5 // split_k))
    monkeypatch.setattr(configs, "decode_config", lambda *args, **kwargs: cfg)
    kw = _gemm_kw(bias=randn((100,), gen=gen), activation="gelu")
    first = launch.scaled_mm(aq, a_s, bq, b_s, **_on("sm90", qdtype), **kw)
    assert rel_err(first, ref.scaled_mm(aq, a_s, bq, b_s, **kw)) <= TOL[qdtype]
    assert torch.equal(launch.scaled_mm(aq, a_s, bq, b_s, **_on("sm90", qdtype), **kw), first)


@pytest.mark.parametrize("k_step, split, tma, qdtype", covering(
    [(k, s, t) for k, s in ((1, 2), (1, 5), (2, 2)) for t in (False, True)], QDTYPES))
def test_tiled_split_k_sums_as_the_decode_kernel_split_alike(gen, monkeypatch, qdtype, k_step, split, tma):
    """The tiled GEMM with K (5 blocks, a 16-wide tail) split over its second grid axis: within the
    contract, the same bits again on a second call (the counters back at zero), and the bits of the decode
    kernel split alike (the same K blocks per split, the partials met in split order)."""
    values = one_binade if qdtype == FP8 else (lambda t: t)  # the two kernels' FP8 dots in the interpreter
    aq, a_s, bq, b_s = _gemm_inputs(gen, 5, 200, 528, qdtype, 128, 128, values=values)
    per = -(-5 // split) + (k_step == 2 and -(-5 // split) % 2)  # even splits for two blocks a step
    cfg = configs.GemmConfig(16, 64, 4, 2, k_step=k_step, tma=tma, split_k=-(-5 // per), kb_per_split=per)
    monkeypatch.setattr(configs, "gemm_config", lambda *args, **kwargs: cfg)
    kw, on = _gemm_kw(bias=randn((200,), gen=gen), activation="gelu"), _on("sm90", qdtype)
    _tiled_only(monkeypatch)
    seen = spy_triton_gemms(monkeypatch)
    tiled = launch.scaled_mm(aq, a_s, bq, b_s, **on, **kw)
    assert [c["SPLIT"] for c in seen] == [True]
    assert rel_err(tiled, ref.scaled_mm(aq, a_s, bq, b_s, **kw)) <= TOL[qdtype]
    assert torch.equal(launch.scaled_mm(aq, a_s, bq, b_s, **on, **kw), tiled)
    assert not any(c.any() for c in workspace.counters())
    monkeypatch.undo()
    monkeypatch.setattr(configs, "decode_config", lambda *a, **k: configs.DecodeConfig(16, 64, 4, 2, cfg.split_k, per))
    assert_bits_equal(launch.scaled_mm(aq, a_s, bq, b_s, **on, **kw), tiled)


def test_split_k_keeps_every_split_whole_and_non_empty():
    for tiles, kbs, waves, min_kb, step in [(32, 32, 1, 4, 1), (17, 56, 1, 4, 2), (132, 56, 1, 4, 1), (1, 5, 2, 1, 2),
                                            (4, 7, 1, 1, 2), (1, 1, 1, 1, 1)]:
        split, per = configs._split(SM90, tiles, kbs, waves, min_kb, step)
        assert per % step == 0 and (split - 1) * per < kbs <= split * per
        assert split == 1 or (per >= min_kb and split * tiles <= 2 * waves * SM90.sm_count)


# Each path once per profile and format: on sm_90 each program quantizing (1 row; 3 on 64-row weight blocks; 8),
# once per launch with K split (16 rows) and unsplit at the decode kernel's last row on 64-wide K blocks (64),
# once past the decode rows (70); on sm_80 each program quantizing (1, 3), act_quant + the decode kernel (5) and,
# for INT8, + the tiled kernel (70; FP8 decoded to fp16 takes the decode kernel there too). Every shape on both
# profiles, on the GPU: tests/gpu/test_decode.py.
QUANT_LINEAR_SHAPES = [(1, 300, (128, 128)), (3, 256, (64, 128)), (5, 256, (64, 128)), (8, 300, (128, 128)),
                       (16, 1000, (128, 128)), (33, 2000, (128, 128)), (64, 130, (128, 64)), (70, 300, (128, 128))]
QUANT_LINEAR_PATHS = {"sm90": [QUANT_LINEAR_SHAPES[i] for i in (0, 1, 3, 4, 6, 7)],
                      "sm80": [QUANT_LINEAR_SHAPES[i] for i in (0, 1, 2)]}


@pytest.mark.parametrize("profile, qdtype, M, K, block", sampled(
    [(p, q, *shape) for p, shapes in QUANT_LINEAR_PATHS.items() for q in QDTYPES for shape in shapes]
    + [("sm80", I8, *QUANT_LINEAR_SHAPES[7])],
    [(p, q, *shape) for p in ("sm90", "sm80") for q in QDTYPES for shape in QUANT_LINEAR_SHAPES]))
def test_quant_linear_is_act_quant_then_scaled_mm_bit_for_bit(gen, few_programs, profile, qdtype, M, K, block):
    """The decode kernel quantizing in each program (`configs.fused`: M <= 4 everywhere, <= 8 up to K =
    8192 on sm_90) or once per launch (sm_90 to 64 rows, K split or not, and past them), act_quant + the
    decode kernel (M <= 64) and + the tiled kernel (M > 64); a NaN group stays in its row. The flags of the
    once-quantized activation are back at zero after each launch."""
    x, w = randn((M, K), gen=gen, dtype=torch.bfloat16), randn((90, K), gen=gen)
    if qdtype == FP8 and M > configs.decode_m_max(PROFILES[profile], _on(profile, qdtype)["mma"]):
        x, w = one_binade(x), one_binade(w)  # the tiled kernel's dot against the decode kernel's swapped one
    x[M // 2, K // 3] = float("nan")
    wq, w_s = ref.weight_quant(w, qdtype=qdtype, block_n=block[0], block_k=block[1], ue8m0=False, eps=1e-4)
    bias = randn((90,), gen=gen)
    for ue8m0 in (False, True):
        aq, a_s = launch.act_quant(x, qdtype=qdtype, group_size=block[1], ue8m0=ue8m0, eps=1e-4,
                                   scale_m_major=False, profile=PROFILES[profile])
        kw = dict(block_n=block[0], block_k=block[1], bias=bias, activation="silu", out_dtype=torch.float32, eps=1e-4)
        want = launch.scaled_mm(aq, a_s, wq, w_s, out_quant=None, out_group=block[1], ue8m0_out=False,
                                **_on(profile, qdtype), **kw)
        got = launch.quant_linear(x, wq, w_s, ue8m0=ue8m0, **_on(profile, qdtype), **kw)
        assert torch.equal(got.nan_to_num(), want.nan_to_num()) and torch.equal(got.isnan(), want.isnan())
        assert got.isnan().any(dim=1).sum() == 1
        assert not any(c.any() for c in workspace.counters())


@pytest.mark.parametrize("qdtype, xdtype", covering(QDTYPES, [torch.float16, torch.float32]))
def test_activation_quantized_once_reads_any_float_row_strided(gen, few_programs, qdtype, xdtype):
    """The once-per-launch quantization (sm_90, 9 to 64 rows) on fp16 and fp32 activations that are
    column slices of a wider tensor (row stride != K): bit for bit act_quant + scaled_mm."""
    M, K = 12, 700
    assert configs.fused(SM90, M, 100, K) == "once"
    x = randn((M, K + 40), gen=gen, dtype=xdtype)[:, 40:]
    wq, w_s = ref.weight_quant(randn((100, K), gen=gen), qdtype=qdtype, block_n=128, block_k=128, ue8m0=False,
                               eps=1e-4)
    kw = dict(block_n=128, block_k=128, bias=None, activation=None, out_dtype=torch.bfloat16, eps=1e-4)
    aq, a_s = launch.act_quant(x, qdtype=qdtype, group_size=128, ue8m0=False, eps=1e-4, scale_m_major=False,
                               profile=SM90)
    want = launch.scaled_mm(aq, a_s, wq, w_s, out_quant=None, out_group=128, ue8m0_out=False, **_on("sm90", qdtype),
                            **kw)
    assert torch.equal(launch.quant_linear(x, wq, w_s, ue8m0=False, **_on("sm90", qdtype), **kw), want)


# ---------------------------------------------------------------------------------------------
# the registry's choice reaches the kernel: the GEMM runs the `mma` it is given, whatever the profile

# Each MMA under each profile; the kernels in turn.
@pytest.mark.parametrize("profile, qdtype, mma, kernel", covering(
    [(p, *qm) for p in ("sm90", "sm80", "cpu") for qm in ((I8, "int8"), (FP8, "fp8"), (FP8, "fp16"))],
    ["decode", "tiled"]))
def test_the_gemm_runs_the_mma_it_is_given_whatever_the_profile(gen, monkeypatch, kernel, profile, qdtype, mma):
    """FP8 MMA under the sm_80 profile and FP8 decoded to fp16 under sm_90's: the option decides,
    the profile (which has or lacks FP8 tensor cores) does not."""
    if kernel == "tiled":
        _tiled_only(monkeypatch)
    seen = spy_triton_gemms(monkeypatch)
    aq, a_s, bq, b_s = _gemm_inputs(gen, 3, 96, 256, qdtype, 128, 128)
    kw = _gemm_kw()
    got = launch.scaled_mm(aq, a_s, bq, b_s, profile=PROFILES[profile], mma=mma, **kw)
    assert [kernel_mma(c) for c in seen] == [mma]
    assert rel_err(got, ref.scaled_mm(aq, a_s, bq, b_s, **kw)) <= TOL[qdtype]


@pytest.mark.parametrize("qdtype,mma", [(I8, "fp8"), (I8, "fp16"), (FP8, "int8"), (FP8, "bf16")])
def test_an_mma_the_operands_cannot_take_is_refused(gen, qdtype, mma):
    aq, a_s, bq, b_s = _gemm_inputs(gen, 3, 96, 256, qdtype, 128, 128)
    with pytest.raises(InvalidInputError, match=f"mma='{mma}' cannot multiply"):
        launch.scaled_mm(aq, a_s, bq, b_s, profile=SM90, mma=mma, **_gemm_kw())


@pytest.mark.filterwarnings("ignore::quantcore.NumericsWarning")
@pytest.mark.parametrize("m", [2, 70])
@pytest.mark.parametrize("profile", ["cpu", "sm80", "sm86", "sm89", "sm90", "sm100"])
@pytest.mark.parametrize("op", ["scaled_mm", "quant_linear"])
def test_the_kernel_runs_the_variant_the_registry_names(monkeypatch, few_programs, op, profile, m):
    """Through the dispatcher, with CPU tensors given each simulated profile: for every `backend=`
    choice that lands on Triton, `explain()` and `select()` name the Impl launched with its options
    (binding.check_binding), the kernel compiled is that Impl's `mma`, and it computes the GEMM."""
    simulate_on_cpu(monkeypatch, profile)
    spy, seen = LaunchSpy(monkeypatch), spy_triton_gemms(monkeypatch)
    ran = set()
    for fmt in ("fp8_e4m3", "int8"):
        args, kwargs = definitions.get(op).example(fmt, m=m, k=256)
        expected = getattr(ops, op)(*args, backend="torch", **kwargs)
        for backend in (None, "triton", "triton[w8a16]"):
            seen.clear()
            chosen, out = check_binding(spy, op, args, kwargs, backend)
            if chosen is None or chosen.backend != "triton":
                continue
            # A one-launch quant_linear also prepares its two launches (what a graph capture runs): same MMA.
            assert seen and {kernel_mma(c) for c in seen} == {dict(chosen.options)["mma"]}, (backend, fmt)
            assert rel_err(out, expected) <= 1e-2  # bf16 output
            ran.add((chosen.label, dict(chosen.options)["mma"]))
    assert ran  # Triton ran under every profile listed (min_cc 8.0, or the interpreter)


def test_direct_launches_need_a_known_triton_and_a_gpu():
    from quantcore.backends.triton import direct

    assert direct.version_supported("3.6.0") and direct.version_supported("3.3.1+git1234")
    assert not direct.version_supported("3.2.0") and not direct.version_supported("4.0.0")
    assert not direct.version_supported("nightly")
    assert direct.version_supported("3.6.0", direct.RAW_SUPPORTED)
    assert not direct.version_supported("3.9.0", direct.RAW_SUPPORTED)
    assert not direct.version_supported("3.5.1", direct.RAW_SUPPORTED)
    assert not direct.enabled()  # the interpreter runs every launch through the JIT


def test_a_described_tensors_encoded_arguments_are_kept_per_address(monkeypatch):
    """The C launcher's leading arguments: addresses for plain tensors, and for a tensor in a
    descriptor's place its encoded arguments, encoded once per address and kept for the last
    DESCRIPTORS_KEPT addresses (on the GPU, tests/gpu/test_decode.py launches through it)."""
    from quantcore.backends.triton import direct

    monkeypatch.setattr(direct, "DESCRIPTORS_KEPT", 2)
    encoded = []

    def encode(t):
        encoded.append(t.data_ptr())
        return ("map", t.data_ptr(), *t.shape)

    launcher = direct.Launcher(None, (1,), {}, torch.device("cpu"), {1: lambda t: t})
    launcher._encoded = [None, (encode, {})]
    plain, tensors = torch.zeros(4), [torch.zeros(2, 3) for _ in range(3)]
    for t in tensors[:2] + tensors[:2]:
        assert launcher._addresses((plain, t)) == [plain.data_ptr(), "map", t.data_ptr(), 2, 3]
    assert encoded == [t.data_ptr() for t in tensors[:2]]  # each address encoded once
    launcher._addresses((plain, tensors[2]))  # a third address drops the first kept
    launcher._addresses((plain, tensors[1]))
    launcher._addresses((plain, tensors[0]))
    assert encoded == [t.data_ptr() for t in (*tensors, tensors[0])]

def test_only_the_differentiable_ops_outputs_require_grad():
    """The same rule as the reference's (tests/test_autograd.py)."""
    for op, tensors in outputs_of_every_op_on_grad_inputs("triton").items():
        assert [t.requires_grad for t in tensors] == [op in DIFFERENTIABLE] * len(tensors), op


@pytest.mark.parametrize("qdtype", [torch.int8, torch.float8_e4m3fn])
def test_quant_linear_gradients_on_triton(gen, qdtype):
    """Forward, the backward's recomputed pre-activation and dequantized weight all on Triton."""
    from quantcore.definitions.tolerances import GRADIENT, rel_error

    w, ws = ops.weight_quant(randn((40, 100), gen=gen), dtype=qdtype, block_size=(32, 32))
    x, bias = randn((3, 100), gen=gen).requires_grad_(), randn((40,), gen=gen).requires_grad_()
    y = ops.quant_linear(x, w, ws, bias, activation="gelu", out_dtype=torch.float32, block_size=(32, 32),
                         backend="triton")
    grad_out = randn((3, 40), gen=gen)
    ref, rx, rb = reference_quant_linear(x, w, ws, bias, "gelu", (32, 32))
    for got, want in zip(torch.autograd.grad(y, (x, bias), grad_out), torch.autograd.grad(ref, (rx, rb), grad_out)):
        assert rel_error(got, want) <= GRADIENT[torch.float32]


# ---------------------------------------------------------------------------------------------
# every op against the float64 oracle, cases drawn by hypothesis (tests/properties.py): a few, the
# interpreter being slow

# The K block is the kernel's K tile (32 at least: 8-bit MMAs), a re-quantization group fits one N tile,
# and the output keeps the operands' format (the constraints).
CHECKS = dict(properties.CHECKS, scaled_mm=functools.partial(
    properties.check_scaled_mm, k_blocks=st.sampled_from([32, 64]), out_groups=st.sampled_from([16, 32, 64, 128]),
    mixed_formats=False))


@pytest.mark.parametrize("op", list(CHECKS))
@settings(max_examples=25, deadline=None, derandomize=True)
@given(data=st.data())
def test_op_against_the_oracle(op, data):
    CHECKS[op](data, "triton")


# ---------------------------------------------------------------------------------------------
# configuration data

def test_decode_configs_split_k_evenly_and_fit_shared_memory():
    for profile in (SM90, SM80, SIMULATED["sm86"], SIMULATED["sm75"]):
        for M, N, K in [(1, 2112, 7168), (64, 7168, 2048), (16, 32768, 512), (4, 7168, 16384), (1, 33, 1)]:
            for min_block_n, mma in ((1, "fp8"), (256, "fp8"), (1, "fp16"), (256, "fp16")):
                cfg = configs.decode_config(profile, M, N, K, mma=mma, block_k=128, min_block_n=min_block_n)
                kbs = -(-K // 128)
                assert cfg.block_m >= max(M, 16) and cfg.block_n >= min_block_n
                assert (cfg.split_k - 1) * cfg.kb_per_split < kbs <= cfg.split_k * cfg.kb_per_split
                assert cfg.num_stages * (cfg.block_n + 4 * cfg.block_m) * 128 <= profile.smem_per_block
                assert cfg.smem_bytes(128, mma) <= profile.smem_per_block or cfg.num_stages == 1


def test_quant_linear_fuses_within_its_tables_bounds_only():
    """One launch where the table's rules hold M, K and N·K (sm_90: each program quantizing for M <= 4,
    or M <= 8 up to K = 8192, then once per launch to 64 rows for weights of up to 2^26 elements and to
    128 rows up to K = 4096), act_quant + the GEMM elsewhere; past the decode kernel's own M bound only
    once per launch (which runs K unsplit)."""
    shapes = ((1, 7168, 16384), (4, 7168, 16384), (8, 2112, 8192), (8, 2112, 8193), (64, 4096, 16384),
              (64, 16384, 4096), (64, 7168, 16384), (5, 7168, 16384), (65, 128, 128), (128, 16384, 4096),
              (128, 4096, 4097), (100, 32768, 4096), (129, 128, 128))
    assert [configs.fused(SM90, M, N, K) for M, N, K in shapes] == [
        "program", "program", "program", "once", "once", "once", None, None, "once", "once", None, None, None]
    assert [configs.fused(SM80, M, 64, K) for M, K in ((4, 16384), (5, 128), (8, 128))] == ["program", None, None]
    for profile in (SM90, SM80, SIMULATED["sm75"], SIMULATED["sm89"]):
        decode_bound = min(configs.decode_m_max(profile, mma) for mma in ("fp8", "int8", "fp16"))
        assert configs.fused(profile, decode_bound + 1, 128, 128) in (None, "once")


@pytest.mark.parametrize("qdtype, split", covering(QDTYPES, [3, 1]))
def test_quant_linear_past_the_decode_rows_is_one_launch_split_as_the_tiled_gemm(gen, monkeypatch, few_programs, qdtype,
                                                                                 split):
    """At 100 rows on sm_90 scaled_mm runs the tiled kernel and quant_linear, eagerly, the decode kernel
    quantizing once with K split as the tiled kernel splits it (unsplit, or 6 K blocks in 3 splits;
    prepared beside the two launches a capture would run): bit for bit act_quant + scaled_mm, K tail and
    fp16 activation included, the flags and counters back at zero; not for weight scales of 64 rows."""
    seen = spy_triton_gemms(monkeypatch)
    candidates = configs.gemm_candidates
    monkeypatch.setattr(configs, "gemm_candidates", lambda *a, **kw: tuple(
        replace(c, split_k=split, kb_per_split=-(-6 // split)) for c in candidates(*a, **kw)))
    M, K = 100, 700
    x, wq_src = randn((M, K), gen=gen, dtype=torch.float16), randn((90, K), gen=gen)
    if qdtype == FP8:
        x, wq_src = one_binade(x), one_binade(wq_src)
    wq, w_s = ref.weight_quant(wq_src, qdtype=qdtype, block_n=128, block_k=128, ue8m0=False, eps=1e-4)
    kw = dict(block_n=128, block_k=128, bias=randn((90,), gen=gen), activation="gelu", out_dtype=torch.bfloat16,
              eps=1e-4)
    got = launch.quant_linear(x, wq, w_s, ue8m0=False, **_on("sm90", qdtype), **kw)
    once = [c for c in seen if c.get("ONCE")]
    assert len(once) == 1 and once[0]["SPLIT_K"] == split and once[0]["BLOCK_M"] == 128
    assert [c["SPLIT"] for c in seen if "ONCE" not in c] == [split > 1]  # the tiled kernel, for captures
    seen.clear()
    aq, a_s = launch.act_quant(x, qdtype=qdtype, group_size=128, ue8m0=False, eps=1e-4, scale_m_major=False,
                               profile=SM90)
    want = launch.scaled_mm(aq, a_s, wq, w_s, out_quant=None, out_group=128, ue8m0_out=False, **_on("sm90", qdtype),
                            **kw)
    assert ["ONCE" in c for c in seen] == [False]
    assert torch.equal(got, want)
    assert not any(c.any() for c in workspace.counters())
    # Weight-scale blocks narrower than a tiled GEMM's columns: that GEMM may multiply its scales in another
    # order, so the two launches stay.
    seen.clear()
    wq, w_s = ref.weight_quant(wq_src, qdtype=qdtype, block_n=64, block_k=128, ue8m0=False, eps=1e-4)
    launch.quant_linear(x, wq, w_s, ue8m0=False, **_on("sm90", qdtype), **(kw | dict(block_n=64)))
    assert seen and not any(c.get("ONCE") for c in seen)


def test_gemm_candidates_fit_shared_memory_and_requant_groups():
    for profile in (SM90, SM80, SIMULATED["sm86"], SIMULATED["sm89"]):
        for M in (1, 64, 4096):
            for mma in ("fp8", "int8", "fp16"):
                cands = configs.gemm_candidates(profile, M, 7168, 2048, mma=mma, block_k=128, min_block_n=128)
                assert cands and all(c.block_n >= 128 for c in cands)
                assert all(c.smem_bytes(128, mma) <= profile.smem_per_block for c in cands)
    tiny = SIMULATED["sm75"].model_copy(update={"smem_per_block": 20 * 1024})
    (only,) = configs.gemm_candidates(tiny, 4096, 4096, 4096, mma="int8", block_k=128, min_block_n=1)
    assert only.smem_bytes(128, "int8") <= 20 * 1024


def test_autotune_picks_the_fastest_candidate_once(monkeypatch):
    monkeypatch.setenv(configs.AUTOTUNE_ENV, "1")
    calls = []
    cands = configs.gemm_candidates(SM90, 4096, 4096, 7168, mma="fp8", block_k=128, min_block_n=1)

    def bench(cfg):
        calls.append(cfg)
        return 1.0 if cfg == cands[-1] else 2.0

    key = dict(mma="fp8", block_k=128, min_block_n=1, variant=("test",), bench=bench)
    assert configs.gemm_config(SM90, 4096, 4096, 7168, **key) == cands[-1]
    assert configs.gemm_config(SM90, 4000, 4096, 7168, **key) == cands[-1]  # same M bucket: cached
    assert len(calls) == len(cands)


def test_block_tiling_covers_the_tensor():
    for R, C, br, bc in [(1, 7168, 1, 128), (4096, 7168, 1, 128), (7, 129, 1, 128), (24576, 1536, 128, 128),
                         (200, 300, 32, 96)]:
        t = configs.block_tiling(R, C, br, bc, SM90)
        assert t.grid[0] * t.rb * br >= R and t.grid[1] * t.cb * bc >= C
        assert t.br_pad >= br and t.bc_pad >= bc and t.num_warps in (1, 2, 4, 8, 16, 32)


def test_every_op_runs_again_from_its_kept_plan(gen):
    """The dispatcher keeps each prepared launch's per-call stage and calls it with the contract's
    tensor names: a second call of every op, from the kept plan, computes what the first did."""
    from quantcore import ops

    x, w = randn((3, 300), gen=gen), randn((70, 300), gen=gen)
    runs = []
    for _ in range(2):
        q, s = ops.act_quant(x, backend="triton")
        wq, ws = ops.weight_quant(w, backend="triton")
        runs.append([q.view(torch.uint8), s, wq.view(torch.uint8), ws, ops.act_dequant(q, s, backend="triton"),
                     ops.weight_dequant(wq, ws, backend="triton"),
                     *ops.quantized_gelu(q, s, out_dtype=I8, backend="triton"),
                     ops.scaled_mm(q, s, wq, ws, backend="triton"), ops.quant_linear(x, wq, ws, backend="triton"),
                     ops.dequant_bias(x, s[:, 0].contiguous(), w[0].contiguous(), backend="triton")])
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))


def _same(a, b):
    a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
    return all(torch.equal(x.view(torch.uint8) if x.element_size() == 1 else x,
                           y.view(torch.uint8) if y.element_size() == 1 else y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("op", [o.name for o in definitions.all_ops()])
def test_a_negative_view_is_read_as_the_values_it_holds(op, backend):
    """`torch._neg_view(t)` is -t whose memory holds t (so is the imaginary part of a conjugated complex
    tensor): each tensor input of each op as such a view gives what the materialized -t gives; the Triton
    kernels read the memory, and would take it with the opposite sign."""
    definition = definitions.get(op)
    fmt = "int8" if "int8" in definition.formats else "float32"
    args, kwargs = definition.example(fmt, m=3, n=20, k=160)
    # The grouped GEMMs' examples carry their scales at the default blocks: keep those.
    blocks = ({} if op.startswith("grouped_mm") else {"block_size": (16, 32)} if "block_size" in definition.defaults
              else {"group_size": 32} if "group_size" in definition.defaults else {})
    kwargs = {**kwargs, "backend": backend, **blocks}
    if op in ("scaled_mm", "quant_linear"):  # the examples' blocks are the defaults: quantize for these ones
        x, w = args[0] if op == "quant_linear" else randn((3, 160)), randn((20, 160))
        wq = ops.weight_quant(w, dtype=I8, block_size=(16, 32))
        args = (x, *wq) if op == "quant_linear" else (*ops.act_quant(x, dtype=I8, group_size=32), *wq)
    elif op in ("act_dequant", "quantized_gelu"):
        args = ops.act_quant(randn((3, 160)), dtype=I8, group_size=32)
    elif op == "weight_dequant":
        args = ops.weight_quant(randn((20, 160)), dtype=I8, block_size=(16, 32))
    function = getattr(ops, op)

    def fresh(*args):  # never from a plan kept for another call of the same metadata (the next test's gap)
        registry.clear_caches()
        return function(*args, **kwargs)

    for i, t in enumerate(args):
        # Index tensors (expert ids, offsets, rows) have no negated meaning: -id is not an expert.
        if isinstance(t, torch.Tensor) and t.dtype not in (torch.int32, torch.int64):
            viewed = torch._neg_view(t)
            assert viewed.is_neg()
            assert _same(fresh(*args[:i], viewed, *args[i + 1:]), fresh(*args[:i], -t, *args[i + 1:]))


def test_a_negative_view_of_a_kept_plans_metadata_is_read_as_its_values():
    x = randn((3, 160))
    ops.act_quant(x, dtype=I8, backend="triton")  # keeps the plan of x's metadata
    assert _same(ops.act_quant(torch._neg_view(x), dtype=I8, backend="triton"), ops.act_quant(-x, dtype=I8))
