"""What quantcore is measured against: torch.compile of the reference, the vendor kernels torch
exposes (cuBLAS block-wise FP8 through `scaled_mm`, `torch._int_mm`, bf16 `mm`), and for the fused
producers the unfused torch code they replace (eager, compiled, and compiled beside quantcore's act_quant)."""

from __future__ import annotations

import functools
import inspect
import math

import torch
import torch.nn.functional as F

from .. import ops
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


def llama_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm.forward: the norm a model runs before quantizing its output."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def torch_silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """`act_fn(gate) * up` as Llama's MLP writes it, in the input's dtype."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def _unfused(op: str):
    """The unfused torch code of a fused producer as one function of its operands and act_quant's options:
    Llama's RMSNorm (with the residual added first) or SiLU-and-multiply, then the reference act_quant."""
    act_quant = inspect.unwrap(reference.act_quant)

    def rms_norm_quant(x, weight, residual, eps, quant):
        y = llama_rms_norm(x if residual is None else x + residual, weight, eps)
        return act_quant(y.reshape(-1, y.shape[-1]), **quant)

    def silu_mul_quant(gate_up, quant):
        y = torch_silu_mul(gate_up)
        return act_quant(y.reshape(-1, y.shape[-1]), **quant)
    return rms_norm_quant if op == "rms_norm_quant" else silu_mul_quant


@functools.lru_cache(maxsize=None)
def _compiled(fn_name: str):
    """torch.compile (dynamic shapes, Inductor) of an unfused producer or of its float part alone."""
    fns = {"rms_norm_quant": _unfused("rms_norm_quant"), "silu_mul_quant": _unfused("silu_mul_quant"),
           "rms_norm": llama_rms_norm, "silu_mul": torch_silu_mul}
    return torch.compile(fns[fn_name], dynamic=True)


def producer_baselines(op: str, args: tuple, kwargs: dict) -> dict:
    """The unfused code a fused producer call (`ops.<op>(*args, **kwargs)`) replaces, as calls of no
    arguments by name: "torch-unfused" (eager torch: Llama's norm or act_fn(gate)·up, then the reference
    act_quant), "torch.compile" (that function compiled) and "compiled+act_quant" (the float part compiled,
    then quantcore's act_quant: two launches). Each is called once here (compiling it)."""
    quant = dict(qdtype=kwargs.get("dtype", torch.float8_e4m3fn), group_size=kwargs.get("group_size", 128),
                 ue8m0=kwargs.get("scale_fmt", "fp32") == "ue8m0", eps=kwargs.get("eps" if op == "silu_mul_quant"
                                                                                  else "quant_eps", 1e-4),
                 scale_m_major=False)
    act = dict(dtype=quant["qdtype"], group_size=quant["group_size"], scale_fmt=kwargs.get("scale_fmt", "fp32"))
    if op == "rms_norm_quant":
        x, weight, residual = (*args, None)[:3]
        eps = kwargs.get("eps", 1e-6)
        operands = (x, weight, residual, eps, quant)
        norm = _compiled("rms_norm")
        split = lambda: ops.act_quant(norm(x if residual is None else x + residual, weight, eps), **act)  # noqa: E731
    else:
        operands = (args[0], quant)
        silu_mul = _compiled("silu_mul")
        split = lambda: ops.act_quant(silu_mul(args[0]), **act)  # noqa: E731
    eager, compiled = _unfused(op), _compiled(op)
    calls = {"torch-unfused": lambda: eager(*operands), "torch.compile": lambda: compiled(*operands),
             "compiled+act_quant": split}
    for call in calls.values():
        call()
    return calls


def producer_bytes(op: str, m: int, width: int, group: int = 128, in_bytes: int = 2) -> int:
    """Least bytes a fused producer moves: rms_norm_quant (width H) reads x and the weight and writes the
    codes and scales; silu_mul_quant (width 2I) reads gate_up and writes I codes per row and their scales."""
    if op == "rms_norm_quant":
        return act_bytes(m, width, group, in_bytes) + in_bytes * width
    half = width // 2
    return m * width * in_bytes + m * half + 4 * m * math.ceil(half / group)
