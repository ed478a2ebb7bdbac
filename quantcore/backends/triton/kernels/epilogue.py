"""Fused epilogues: the activations shared by the GEMM and quantized GELU, and dequant + bias.

Quantized GELU itself is the block-quantize kernel of `quant.py` reading quantized input with
ACTIVATION set: one pass, no separate kernel to keep in step with act_quant.
"""

import triton
import triton.language as tl

from ....capability import triton_interpreter
from .cast import load_f32, store_f32_as

# Whether the activations take their reciprocal as one PTX instruction: compiled kernels do; the
# interpreter runs no inline assembly and keeps Triton's division. Fixed at import, as
# `fp8.PACKED_DECODE` is.
PTX_MATH = tl.constexpr(not triton_interpreter())


@triton.jit
def rcp_approx(d):
    """1/d within 1 ulp for normal fp32 d with a normal reciprocal (the activations' d in [1, 256], the
    quantizers' scales, `quant.reciprocal`): `rcp.approx.ftz` compiled. Triton's `1.0 / d` is
    `div.full`, whose range checks for huge and tiny d cost ~4 instructions an element besides the
    reciprocal (ncu of the Gluon GEMM's GELU epilogue: 73 instructions an element,
    under Nsight Compute)."""
    if PTX_MATH:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [d], dtype=tl.float32, is_pure=True,
                                         pack=1)
    else:
        return 1.0 / d


@triton.jit
def div_rn_normal(n, d):
    """n / d for `activate`'s operands (d in [1, 256], |n| zero or from 2^-90): an approximate reciprocal, one
    Newton step, and the quotient's last bit corrected by its remainder, which an FMA computes exactly in
    that range (Markstein's final step), from an approximate reciprocal (`rcp_approx`, within 1 ulp).
    `tl.div_rn` lowers to such steps plus a check of the operands and a
    branch to a slow path for the rest of the range; in an epilogue of many elements per thread that branch
    keeps the compiler from interleaving them (the tiled GEMM with SiLU took 1.30 times the plain GEMM with
    `tl.div_rn`, 1.21 with this). That this is `tl.div_rn` bit for bit where
    `activate` divides is checked on all 2^32 fp32 inputs of `activate` on the GPU
    (tests/gpu/test_activation_division.py), not proven for the whole range."""
    r = rcp_approx(d)
    r = tl.fma(tl.fma(-d, r, 1.0), r, r)
    q = n * r
    return tl.fma(tl.fma(-d, q, n), r, q)


@triton.jit
def _erfcx(a, DIV: tl.constexpr):
    """erfc(a)·exp(a²) for fp32 a >= 0: the reference's `erfcx` (backends/torch/activation.py), with its
    polynomial's coefficients spelled out (Triton has no erfc/erfcx that the CPU interpreter runs)."""
    q = DIV(a - 2.0, a + 2.0)
    p = 6.351467163767666e-05 * q + 0.00016087623953353614
    p = p * q - 0.0003582834324333817
    p = p * q - 0.0013958703493699431
    p = p * q + 0.0012177372118458152
    p = p * q + 0.00868928711861372
    p = p * q - 0.008019089698791504
    p = p * q - 0.054211996495723724
    p = p * q + 0.16404947638511658
    p = p * q - 0.1660310924053192
    p = p * q - 0.09276376664638519
    p = p * q + 0.27697840332984924
    return DIV(1.0 + p, 1.0 + 2.0 * a)


@triton.jit
def _tail(s, ACTIVATION: tl.constexpr, DIV: tl.constexpr):
    """T(s) = s·gate(−s) for s = |x|, its exponentially small factor applied last as √ twice (the
    reference's `backends/torch/activation.py` says why); s capped at 128, where T is 0 in fp32."""
    s = tl.where(s > 128.0, 128.0, s)  # NaN fails the comparison and stays NaN
    if ACTIVATION == "gelu":
        a = s * 0.7071067811865476
        h = tl.exp(-0.5 * (a * a))
        return 0.5 * s * _erfcx(a, DIV) * h * h
    else:
        if ACTIVATION == "gelu_tanh":
            u = 0.7978845608028654 * (s + 0.044715 * (s * s * s))
        else:
            u = 0.5 * s
        h = tl.exp(-u)
        # s below 2^-60 is divided 2^64 times larger and scaled back exactly (the quotient is then normal;
        # there h is 1 and 1 + h·h is 2, so the scaled quotient is exact and the scaling rounds once).
        tiny = s < 8.673617379884035e-19
        q = DIV(tl.where(tiny, s * 18446744073709551616.0, s), 1.0 + h * h)
        return tl.where(tiny, q * 5.421010862427522e-20, q) * h * h


@triton.jit
def activate(x, ACTIVATION: tl.constexpr):
    """Apply ACTIVATION ("none", "gelu", "gelu_tanh", "silu") to an fp32 tensor, in fp32, in the
    contract's form (docs/numerics.md): x − T(|x|) for x >= 0, −T(|x|) below, accurate in the
    negative tail where 1 + erf(·) would cancel."""
    return activate_dividing(x, ACTIVATION, div_rn_normal)


@triton.jit
def activate_dividing(x, ACTIVATION: tl.constexpr, DIV: tl.constexpr):
    """`activate` with its divisions done by DIV(n, d) (correctly rounded: `div_rn_normal`, or `tl.div_rn`
    in the test that compares the two)."""
    if ACTIVATION == "none":
        return x
    else:
        t = _tail(tl.abs(x), ACTIVATION, DIV)
        # −T as t · −1, not -t: Triton 3.6 compiles a float's unary minus as 0 − t, which gives +0 where T
        # underflows to 0 (a deeply negative input), and the reference's −0 reaches an FP8 code's sign bit
        # (0x80 against 0x00; seen in silu_mul_quant on the H100).
        return tl.where(x >= 0, x - t, t * -1.0)


@triton.jit
def dequant_bias_kernel(g_ptr, sa_ptr, sb_ptr, bias_ptr, out_ptr, M, N,
                        stride_gm, stride_sa, stride_sb, stride_bias, stride_om,
                        G: tl.constexpr, BIAS: tl.constexpr, OUT: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """out[m, n] = fp32(g[m, n]) * sa[m] * sb[n] + fp32(bias[n]), left to right, cast to OUT.

    G and BIAS are element kinds (BIAS "none" drops the add). Launch with enable_fp_fusion=False:
    an FMA would round the product and the bias add once instead of twice.
    """
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    mask = m_mask[:, None] & n_mask[None, :]
    g = load_f32(g_ptr + offs_m[:, None] * stride_gm + offs_n[None, :], mask, G)
    sa = tl.load(sa_ptr + offs_m * stride_sa, mask=m_mask, other=0.0)
    sb = tl.load(sb_ptr + offs_n * stride_sb, mask=n_mask, other=0.0)
    out = g * sa[:, None] * sb[None, :]
    if BIAS != "none":
        out = out + load_f32(bias_ptr + offs_n * stride_bias, n_mask, BIAS)[None, :]
    store_f32_as(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], out, mask, OUT)
