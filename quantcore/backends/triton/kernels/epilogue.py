"""Fused epilogues: the activations shared by the GEMM and quantized GELU, and dequant + bias.

Quantized GELU itself is the block-quantize kernel of `quant.py` reading quantized input with
ACTIVATION set: one pass, no separate kernel to keep in step with act_quant.
"""

import triton
import triton.language as tl

from .cast import load_f32, store_f32_as


@triton.jit
def activate(x, ACTIVATION: tl.constexpr):
    """Apply ACTIVATION ("none", "gelu", "gelu_tanh", "silu") to an fp32 tensor, in fp32.

    The formulas and operation order are torch's (`F.gelu`, `F.silu`), so results track the
    reference to an ulp or two of erf/exp.
    """
    if ACTIVATION == "gelu":
        return x * 0.5 * (1.0 + tl.math.erf(x * 0.7071067811865476))
    elif ACTIVATION == "gelu_tanh":
        inner = 0.7978845608028654 * (x + 0.044715 * (x * x * x))
        # tanh(y) = 1 - 2 / (exp(2y) + 1): exp saturates to Inf/0 at the ends, giving ±1 exactly;
        # Triton's interpreter has no tanh.
        e = tl.exp(2.0 * inner) + 1.0
        tanh = 1.0 - tl.div_rn(tl.full(e.shape, 2.0, tl.float32), e)
        return 0.5 * x * (1.0 + tanh)
    elif ACTIVATION == "silu":
        return tl.div_rn(x, 1.0 + tl.exp(-x))
    else:
        return x


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
