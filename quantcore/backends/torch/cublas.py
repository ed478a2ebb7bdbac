"""FP8 block-scaled GEMM through cuBLAS, as torch exposes it on sm_90 (1×128 activation scales,
128×128 weight scales), with quantcore's epilogue applied in fp32 afterwards.

cuBLAS reads activation scales M-major, with rows padded to a multiple of 4; torch checks the
scales' K-block count against K itself (no padding: an activation scale padded from 1 to 4 K blocks
was refused on the H100, "scale_a must have shape 4 x 1"), so the variant takes K in whole groups of
four K blocks, where that count needs none. It is registered as the torch backend's `cublas` variant and chosen
where the measured priorities say it is fastest.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .gemm import epilogue


def _pad_rows(t: torch.Tensor, multiple: int, value: float = 0.0) -> torch.Tensor:
    pad = -t.shape[0] % multiple
    if not pad:
        return t
    if t.dtype == torch.float8_e4m3fn:  # F.pad has no FP8 kernel: pad the bytes
        return F.pad(t.view(torch.uint8), (0, 0, 0, pad)).view(t.dtype)
    return F.pad(t, (0, 0, 0, pad), value=value)


def blockwise_fp8_mm(a, a_scale, b, b_scale, out_dtype):
    """cuBLAS a [M, K] @ b [N, K]^T with block-wise scales; returns [M, N] out_dtype."""
    M = a.shape[0]
    a_p = _pad_rows(a, 4)
    a_s = _pad_rows(a_scale.float(), 4, 1.0).t().contiguous().t()
    b_s = b_scale.float().t()
    if hasattr(F, "scaled_mm"):
        out = F.scaled_mm(a_p, b.t(), a_s, F.ScalingType.BlockWise1x128, b_s, F.ScalingType.BlockWise128x128,
                          output_dtype=out_dtype)
    else:  # older torch infers the block-wise recipe from the scale shapes
        out = torch._scaled_mm(a_p, b.t(), a_s, b_s, out_dtype=out_dtype)
    return out[:M]


@torch.no_grad()
def scaled_mm(a, a_scale, b, b_scale, *, block_n, block_k, bias, activation, out_dtype, out_quant, out_group,
              ue8m0_out, eps, profile=None):
    """The backend contract's scaled_mm on cuBLAS (FP8, 128×128 blocks, N a multiple of 16, K of 128)."""
    plain = bias is None and activation is None and out_quant is None
    if plain:  # cuBLAS rounds its fp32 accumulator once to out_dtype, as the contract does
        return blockwise_fp8_mm(a, a_scale, b, b_scale, out_dtype)
    acc = blockwise_fp8_mm(a, a_scale, b, b_scale, torch.float32)
    return epilogue(acc, bias=bias, activation=activation, out_dtype=out_dtype, out_quant=out_quant,
                    out_group=out_group, ue8m0_out=ue8m0_out, eps=eps)
