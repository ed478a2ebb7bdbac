"""What quantcore is measured against: torch.compile of the reference, and the vendor kernels torch
exposes (cuBLAS block-wise FP8 through `scaled_mm`, `torch._int_mm`, bf16 `mm`)."""

from __future__ import annotations

import functools
import inspect
import math

import torch
import torch.nn.functional as F

from ..backends import torch as reference
from ..backends.torch.cublas import blockwise_fp8_mm


@functools.lru_cache(maxsize=None)
def compiled_reference(op: str, backend: str = "inductor"):
    """`torch.compile` of the reference launch function for `op` (dynamic shapes).

    The function itself is compiled, not its `torch.no_grad` wrapper: every such wrapper runs one
    shared code object, and torch._dynamo keeps at most `recompile_limit` (8) graphs per code object,
    so the ops' graphs crowded each other out and, past the eighth, every op's compiled reference ran
    eagerly without a word. The bench's inputs never require grad."""
    return torch.compile(inspect.unwrap(getattr(reference, op)), dynamic=True, backend=backend)


def compiled_call(op: str, kwargs: dict, backend: str = "inductor"):
    """`compiled_reference(op)` called on `kwargs` once (compiling it for them) and returned as a call
    of no arguments. Raises where torch._dynamo would run the reference eagerly instead (its recompile
    limit reached), so that no eager time is ever reported as torch.compile's."""
    compiled = compiled_reference(op, backend)
    # Older torch has neither the switch nor the error (it falls back silently there).
    strict = {"fail_on_recompile_limit_hit": True} if hasattr(torch._dynamo.config, "fail_on_recompile_limit_hit") else {}
    try:
        with torch._dynamo.config.patch(**strict):
            compiled(**kwargs)
    except getattr(torch._dynamo.exc, "FailOnRecompileLimitHit", ()) as err:
        raise RuntimeError(f"torch.compile would run the {op} reference eagerly here: {err}") from err
    return lambda: compiled(**kwargs)


def cublas_blockwise_fp8(a, a_scale, b, b_scale, out_dtype=torch.bfloat16):
    """cuBLAS block-wise FP8 (1×128 activations, 128×128 weights) as torch exposes it on sm_90; the
    padding to cuBLAS's alignment is timed with the call. Raises torch's error where it is refused."""
    def call():
        return blockwise_fp8_mm(a, a_scale, b, b_scale, out_dtype)
    call()
    return call


def cublas_tensorwise_fp8(a, b, out_dtype=torch.bfloat16):
    """cuBLAS FP8 with one scale per tensor: the FP8 tensor-core ceiling for this shape."""
    one = torch.ones((), device=a.device)
    pad_m = -a.shape[0] % 16
    a_p = F.pad(a.view(torch.uint8), (0, 0, 0, pad_m)).view(a.dtype) if pad_m else a

    def call():
        return torch._scaled_mm(a_p, b.t(), one, one, out_dtype=out_dtype)
    call()
    return call


def int_mm(a, b):
    """`torch._int_mm` alone (int8 × int8 → int32); cuBLAS needs M > 16, so small M is padded to 17."""
    pad_m = max(0, 17 - a.shape[0]) + (-max(a.shape[0], 17) % 8)
    a_p = F.pad(a, (0, 0, 0, pad_m)) if pad_m else a
    bt = b.t()

    def call():
        return torch._int_mm(a_p, bt)
    call()
    return call


def bf16_mm(m: int, n: int, k: int, device="cuda"):
    """cuBLAS bf16 on the same shape: the dense tensor-core reference rate."""
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=device, dtype=torch.bfloat16)
    return lambda: x @ w.t()


def read_ceiling_us(nbytes: int) -> float:
    """GPU time of one kernel that only reads `nbytes` (`bench.stream`): what a decode GEMM moving as
    many bytes could take at best on the bench's timer, launch and ramp included."""
    from . import stream

    return stream.read_us(nbytes)


def gemm_flops(m: int, n: int, k: int) -> float:
    """2·M·N·K."""
    return 2.0 * m * n * k


def act_bytes(m: int, k: int, group: int = 128, in_bytes: int = 2) -> int:
    """Bytes moved by an activation (de)quantization: high-precision in/out, 1-byte q, fp32 scales."""
    return m * k * (in_bytes + 1) + 4 * m * math.ceil(k / group)


def gemm_floor_bytes(m: int, n: int, k: int, *, in_bytes: int = 1, out_bytes: int = 2, block: int = 128) -> int:
    """Least bytes a block-scaled GEMM moves: the N×K weight and the M×K activation (1-byte codes),
    the M×N output (bf16) and the fp32 scales (1×block per activation row, block×block of the weight)."""
    kb = math.ceil(k / block)
    return (n * k + m * k) * in_bytes + m * n * out_bytes + 4 * (m * kb + math.ceil(n / block) * kb)
