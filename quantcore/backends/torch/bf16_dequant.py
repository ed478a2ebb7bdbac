"""The opt-in `torch[bf16_dequant]` GEMM: exactness traded for the vendor's bf16 GEMM.

Both operands are dequantized to bf16 by `quantcore.ops.act_dequant` (a, per 1×Bk group) and
`weight_dequant` (b, per Bn×Bk block) — `fp32(q)·scale` rounded once to bf16, bit for bit the same on
every backend, so the call takes the device's own kernels (the reference's two-pass torch code was
four times slower on the H100) — then multiplied by one bf16 GEMM with an fp32 result (cuBLAS through
`torch.mm(..., out_dtype=torch.float32)` on CUDA; on the CPU, where torch has no bf16 GEMM with an
fp32 output, an fp32 matmul of the same bf16 values, which computes the same function), and the
reference's epilogue runs on that fp32 result. The contract's per-K-block fp32 promotion with both
scales becomes one scaled-operand product per element, so numerics change (`NUMERICS`, derived in
docs/numerics.md): it runs only where named (`Impl.opt_in`).

A plain bf16 output (no bias, activation or re-quantization) comes straight from cuBLAS's bf16 GEMM
where torch forbids it reduced-precision reductions
(`torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False`): each fp32 sum is then
rounded once to bf16, as the epilogue's cast would, without writing and re-reading the fp32 result.
Under torch's default cuBLAS may add split-K partial sums in bf16, outside the bound.

bf16 also for fp16 outputs: fp16's range would overflow `q·scale` above 65504 and lose the relative
bound below 2^-14 (small weights' scales put values there), where bf16 keeps fp32's range.
"""

from __future__ import annotations

import torch

from ... import definitions
from ...runtime.dispatch import call
from ...runtime.launch import composed_quant_linear
from .gemm import epilogue
from .quant import act_quant

NUMERICS = ("operands rounded to bf16 after scaling (fp32 q·scale -> bf16), a bf16 GEMM with fp32 sums: "
            "|error| <= (2^-7 + 2^-15 + K·2^-23)·Σ_k |a_k·b_k| per output (docs/numerics.md)")


def vendor_gemm_reasons(kind: str) -> list[str]:
    """Why this torch cannot run the bf16 GEMM with an fp32 result on a device of `kind`."""
    if kind == "cuda" and "dtype" not in torch.ops.aten.mm.overloads():
        return [f"needs torch >= 2.8 on CUDA (torch.mm with out_dtype=float32 from bf16), torch is {torch.__version__}"]
    return []


def matmul_fp32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [M, K] @ b [N, K]^T of bf16 operands -> fp32 [M, N]: their products (exact in fp32) summed in fp32."""
    if a.is_cuda:
        return torch.mm(a, b.t(), out_dtype=torch.float32)
    return torch.mm(a.float(), b.float().t())


def dequantized(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor, block_n: int,
                block_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(â [M, K], b̂ [N, K]) bf16: a per 1×block_k group and b per block_n×block_k block dequantized."""
    # Through the dispatcher, which picks the device's fastest dequantization.
    return (_dispatched("act_dequant", (a, a_scale), group_size=block_k, out_dtype=torch.bfloat16),
            _dispatched("weight_dequant", (b, b_scale), block_size=(block_n, block_k), out_dtype=torch.bfloat16))


def _dispatched(op: str, tensors: tuple, **options) -> torch.Tensor:
    return call(op, tensors, definitions.get(op).options(**options), None)


def _bf16_sums_rounded_once(t: torch.Tensor) -> bool:
    """Whether the vendor's bf16-output GEMM on `t`'s device rounds each fp32 sum once to bf16."""
    return t.is_cuda and not torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction


@torch.no_grad()
def scaled_mm(a, a_scale, b, b_scale, *, block_n, block_k, bias, activation, out_dtype, out_quant, out_group,
              ue8m0_out, eps, profile=None):
    """The backend contract's scaled_mm on bf16-dequantized operands (any format, blocks and shape);
    the epilogue as the reference's, on the GEMM's fp32 result."""
    a16, b16 = dequantized(a, a_scale, b, b_scale, block_n, block_k)
    if out_dtype == torch.bfloat16 and bias is None and activation is None and out_quant is None \
            and _bf16_sums_rounded_once(a16):
        return torch.mm(a16, b16.t())
    acc = matmul_fp32(a16, b16)
    return epilogue(acc, bias=bias, activation=activation, out_dtype=out_dtype, out_quant=out_quant,
                    out_group=out_group, ue8m0_out=ue8m0_out, eps=eps)


quant_linear = composed_quant_linear(act_quant, scaled_mm)
