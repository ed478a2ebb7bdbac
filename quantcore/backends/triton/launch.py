"""The launch functions of the backend contract (docs/backend-contract.md), on Triton kernels.

Inputs arrive validated by `quantcore.ops`: one device, supported dtypes, agreeing shapes, last dim
of every 2-D operand with stride 1. Kernels see FP8 tensors as uint8 and bf16 tensors as int16
views (see `kernels/fp8.py`, `kernels/cast.py`); everything else as is. This module imports
Triton at its top; quantcore imports it only when a Triton implementation is first launched.

Each function is `prepared` (`runtime.launch.prepared`): its body runs once per kept plan and computes what
depends only on shapes, strides and options (tiles, grids, constants, a `direct.Launcher` per
kernel), and returns the per-call part: allocate the outputs, launch.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import triton
import triton.testing

try:  # host-side TMA descriptors (Triton >= 3.3)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # older Triton: pointer loads only
    TensorDescriptor = None

from ... import capability
from ...errors import InvalidInputError
from ...runtime import workspace
from ...runtime.launch import allocator, by_address, compose, eagerly, prepared, prepared_quant_linear, transposed
from . import configs
from .direct import Launcher
from .gluon import TILE_N as GLUON_TILE_N
from .kernels.decode import decode_mm_kernel
from .kernels.epilogue import dequant_bias_kernel
from .kernels.gemm import block_scaled_mm_kernel
from .kernels.quant import block_dequant_kernel, block_quant_kernel, fp8_decode_kernel, scales_may_be_tiny


_KIND = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.int32: "int32",
         torch.float8_e4m3fn: "fp8", torch.int8: "int8"}
_GROUP_M = 8  # row tiles per L2 group in the GEMM's program order
_MMA_KINDS = {"int8": ("int8",), "fp8": ("fp8", "fp16")}  # the GEMM variants' `mma` per operand kind


_NATIVE_BIAS = (torch.float32, torch.float16, torch.bfloat16)


def _bias_kind(bias) -> str:
    """The element kind a kernel reads the bias as: its own, or fp32 for other float dtypes (`_kernel_bias`)."""
    if bias is None:
        return "none"
    return _KIND[bias.dtype] if bias.dtype in _NATIVE_BIAS else "fp32"


def _native_bias(bias) -> bool:
    """Whether a kernel reads `bias` as it is (absent, or fp32/fp16/bf16); otherwise each call converts it
    (`_kernel_bias`), reading it as a tensor, so its run is not `by_address`."""
    return bias is None or bias.dtype in _NATIVE_BIAS


def _kernel_bias(bias):
    """The bias as a kernel reads it: fp32/fp16/bf16 as is, any other float dtype rounded to fp32."""
    return bias if _native_bias(bias) else bias.float()


def _bias_expression(bias, name: str = "bias") -> str | None:
    """A generated run's expression for the kernel's bias argument (`Launcher.statement`), the argument
    `name` laid out as `bias`: None when absent, else the bias as the kernel reads it (`_kernel_bias`). A
    converted bias is freed once its address is read, before the launch: the caching allocator hands its
    memory out again only to work queued after that launch on the same stream."""
    if bias is None:
        return None
    return name if _native_bias(bias) else f"{name}.float()"


def _blocks_quantizer(params, src, src_scale, new_q, new_scale, *, block, ue8m0, eps, activation, profile):
    """The run of `params` (the op's argument names: the source, then its scale when it is itself quantized)
    -> (new_q(), new_scale()), fresh q and scale holding the source quantized per block[0]×block[1]
    (dequantized first with its scale when given, src_scale None otherwise), `activation` applied in
    between, for tensors laid out as `src` and `src_scale`."""
    q, scale = new_q(), new_scale()
    R, C = src.shape
    outputs = {"_q": new_q, "_scale": new_scale}
    if src.numel() == 0:
        return by_address(compose(", ".join(params), outputs, "", {}, "_q, _scale"))
    t = configs.block_tiling(R, C, block[0], block[1], profile)
    ss = src if src_scale is None else src_scale
    launch = Launcher(block_quant_kernel, t.grid, dict(
        BR=block[0], BC=block[1], RB=t.rb, CB=t.cb, BR_PAD=t.br_pad, BC_PAD=t.bc_pad, SRC=_KIND[src.dtype],
        QFMT=_KIND[q.dtype], UE8M0=bool(ue8m0), ACTIVATION=activation, HW_FP8=_hw_fp8(profile), EVEN=t.even,
        num_warps=t.num_warps), src.device,
        fixed=(R, C, src.stride(0), ss.stride(0), ss.stride(-1), q.stride(0), scale.stride(0), scale.stride(1), eps))

    scale_of_src = params[1] if len(params) > 1 else None
    return by_address(launch.function(", ".join(params), (params[0], scale_of_src, "_q", "_scale"), outputs,
                                      "_q, _scale"))


def _blocks_dequantizer(q, scale, *, block, out_dtype, profile):
    """A function (q, scale) -> fp32(q) * scale per block[0]×block[1], as a new out_dtype tensor."""
    (R, C), device = q.shape, q.device
    new_out = allocator((R, C), out_dtype, device)
    if q.numel() == 0:
        return by_address(compose("q, scale", {"_out": new_out}, "", {}, "_out"))
    t = configs.block_tiling(R, C, block[0], block[1], profile)
    launch = Launcher(block_dequant_kernel, t.grid, dict(
        BR=block[0], BC=block[1], RB=t.rb, CB=t.cb, BR_PAD=t.br_pad, BC_PAD=t.bc_pad, QFMT=_KIND[q.dtype],
        OUT=_KIND[out_dtype], HW_FP8=_hw_fp8(profile), EVEN=t.even, num_warps=t.num_warps), device,
        fixed=(R, C, q.stride(0), scale.stride(0), scale.stride(1), C))
    return by_address(launch.function("q, scale", ("q", "scale", "_out"), {"_out": new_out}, "_out"))


@prepared
def act_quant(x, *, qdtype, group_size, ue8m0, eps, scale_m_major, profile):
    """Quantize activations per 1×group_size block along the last dim.

    x [M, K] bf16/fp16/fp32 -> (q [M, K] qdtype contiguous, scale [M, ceil(K/G)] fp32). With
    `scale_m_major` the scale is the transpose of a contiguous [ceil(K/G), M] buffer (strides (1, M)).
    """
    (M, K), device = x.shape, x.device
    kb = triton.cdiv(K, group_size)

    new_q, new_scale = allocator((M, K), qdtype, device), allocator((kb, M) if scale_m_major else (M, kb),
                                                                     torch.float32, device)
    if scale_m_major:
        new_scale = transposed(new_scale)
    return _blocks_quantizer(("x",), x, None, new_q, new_scale, block=(1, group_size), ue8m0=ue8m0, eps=eps,
                             activation="none", profile=profile)


@prepared
def act_dequant(q, scale, *, group_size, out_dtype, profile):
    """fp32(q) * scale per 1×group_size block, cast to out_dtype.

    q [M, K] fp8_e4m3fn/int8, scale [M, ceil(K/G)] fp32 (any strides) -> x [M, K] out_dtype
    (bf16/fp16/fp32).
    """
    return _blocks_dequantizer(q, scale, block=(1, group_size), out_dtype=out_dtype, profile=profile)


@prepared
def weight_quant(w, *, qdtype, block_n, block_k, ue8m0, eps, profile):
    """Quantize a weight per block_n×block_k block.

    w [N, K] bf16/fp16/fp32 -> (q [N, K] qdtype contiguous, scale [ceil(N/Bn), ceil(K/Bk)] fp32).
    """
    (N, K), device = w.shape, w.device

    new_q = allocator((N, K), qdtype, device)
    new_scale = allocator((triton.cdiv(N, block_n), triton.cdiv(K, block_k)), torch.float32, device)
    return _blocks_quantizer(("w",), w, None, new_q, new_scale, block=(block_n, block_k), ue8m0=ue8m0, eps=eps,
                             activation="none", profile=profile)


@prepared
def weight_dequant(q, scale, *, block_n, block_k, out_dtype, profile):
    """fp32(q) * scale per block_n×block_k block, cast to out_dtype.

    q [N, K] fp8_e4m3fn/int8, scale [ceil(N/Bn), ceil(K/Bk)] fp32 (any strides) -> w [N, K] out_dtype.
    """
    return _blocks_dequantizer(q, scale, block=(block_n, block_k), out_dtype=out_dtype, profile=profile)


@prepared
def quantized_gelu(q, scale, *, group_size, approximate, out_qdtype, ue8m0, eps, profile):
    """GELU of dequantized activations, re-quantized per 1×group_size, in one pass.

    q [M, K] fp8_e4m3fn/int8, scale [M, ceil(K/G)] fp32 (any strides), approximate "none"/"tanh"
    -> (q2 [M, K] out_qdtype contiguous, scale2 [M, ceil(K/G)] fp32 contiguous).
    """
    (M, K), device = q.shape, q.device

    new_q, new_scale = allocator((M, K), out_qdtype, device), allocator((M, triton.cdiv(K, group_size)),
                                                                         torch.float32, device)
    return _blocks_quantizer(("q", "scale"), q, scale, new_q, new_scale, block=(1, group_size), ue8m0=ue8m0,
                             eps=eps, activation="gelu_tanh" if approximate == "tanh" else "gelu", profile=profile)


@prepared
def dequant_bias(g, scale_a, scale_b, bias, *, out_dtype, profile):
    """out = fp32(g) * scale_a[m] * scale_b[n] + fp32(bias[n]), evaluated left to right.

    g [M, N] bf16/fp16/fp32/int32, scale_a [M] fp32, scale_b [N] fp32, bias [N] bf16/fp16/fp32 or None
    -> out [M, N] out_dtype (bf16/fp16/fp32).
    """
    (M, N), device = g.shape, g.device
    new_out = allocator((M, N), out_dtype, device)
    params = "g, scale_a, scale_b, bias=None"
    if g.numel() == 0:
        return by_address(compose(params, {"_out": new_out}, "", {}, "_out"))
    block_m, block_n, warps = configs.tile_2d(M, N, profile)
    launch = Launcher(dequant_bias_kernel, (triton.cdiv(M, block_m), triton.cdiv(N, block_n)), dict(
        G=_KIND[g.dtype], BIAS=_bias_kind(bias), OUT=_KIND[out_dtype],
        BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, enable_fp_fusion=False), device,
        fixed=(M, N, g.stride(0), scale_a.stride(0), scale_b.stride(0), 0 if bias is None else bias.stride(0), N))
    run = launch.function(params, ("g", "scale_a", "scale_b", _bias_expression(bias), "_out"), {"_out": new_out},
                          "_out")
    return by_address(run) if _native_bias(bias) else run


def _gemm_outputs(M, N, device, out_dtype, out_quant, out_group, lead=None) -> dict[str, Callable[[], torch.Tensor]]:
    """The allocators of a GEMM's result as `runtime.launch.compose` takes them: {"_out": ...}, and "_scale" for a
    re-quantized one, with leading dims `lead` instead of M where given (`runtime.launch.prepared`)."""
    rows = (M,) if lead is None else tuple(lead)
    if out_quant is None:
        return {"_out": allocator((*rows, N), out_dtype, device)}
    return {"_out": allocator((*rows, N), out_quant, device),
            "_scale": allocator((*rows, triton.cdiv(N, out_group)), torch.float32, device)}


@prepared
def scaled_mm(a, a_scale, b, b_scale, *, block_n, block_k, bias, activation, out_dtype, out_quant,
              out_group, ue8m0_out, eps, profile, mma, lead=None):
    """Block-scaled GEMM a @ b^T with a fused epilogue.

    a [M, K] and b [N, K] fp8_e4m3fn or int8 (same), a_scale [M, ceil(K/Bk)] fp32 and
    b_scale [ceil(N/Bn), ceil(K/Bk)] fp32 (any strides), bias [N] bf16/fp16/fp32 or None, activation
    None/"gelu"/"gelu_tanh"/"silu". Returns out [M, N] out_dtype (bf16/fp16/fp32) when out_quant is
    None, else (q [M, N] out_quant, scale [M, ceil(N/out_group)] fp32) re-quantized per 1×out_group.
    `mma` is the variant the registry chose: "int8", "fp8" (FP8 tensor cores) or "fp16" (FP8 decoded
    exactly to fp16); the profile never overrides it.
    block_k must be a power of two >= 16 (it is the K tile); out_group a power of two. `lead`: the
    results' leading dims in place of M (`runtime.launch.prepared`).
    """
    M, N = a.shape[0], b.shape[0]
    example = _gemm_outputs(M, N, a.device, out_dtype, out_quant, out_group)
    out, out_scale = example["_out"](), example["_scale"]() if "_scale" in example else None
    gemm = _gemm(a, a_scale, b, b_scale, bias, out, out_scale, block_n=block_n, block_k=block_k, activation=activation,
                 out_group=out_group, ue8m0_out=ue8m0_out, eps=eps, profile=profile, mma=mma)
    quantized = out_quant is not None
    operands = ("a", "a_scale", "b", "b_scale", None if bias is None else "bias", "_out",
                "_scale" if quantized else None)
    return gemm("a, a_scale, b, b_scale, bias=None", operands,
                _gemm_outputs(M, N, a.device, out_dtype, out_quant, out_group, lead),
                "_out, _scale" if quantized else "_out")


@prepared
def quant_linear(x, w, w_scale, *, block_n, block_k, bias, activation, out_dtype, ue8m0, eps, profile, mma,
                 lead=None):
    """act_quant(x) per 1×block_k group into w's format, then scaled_mm with w: in one launch where
    `configs.fused` says so (`fused_linear`), else as the two ops above.

    x [M, K] bf16/fp16/fp32, w [N, K] fp8_e4m3fn/int8, w_scale [ceil(N/Bn), ceil(K/Bk)] fp32, bias [N]
    or None -> out [M, N] out_dtype. `ue8m0` and `eps` are the activation quantization's; `mma` and
    `lead` as scaled_mm's.
    """
    options = dict(block_n=block_n, block_k=block_k, bias=bias, activation=activation, out_dtype=out_dtype,
                   ue8m0=ue8m0, eps=eps, profile=profile, mma=mma, lead=lead)
    return fused_linear(x, w, w_scale, lambda: prepared_quant_linear(act_quant, scaled_mm, x, w, w_scale, **options),
                        **options)


def fused_linear(x, w, w_scale, composed, *, block_n, block_k, bias, activation, out_dtype, ue8m0, eps, profile, mma,
                 lead=None, unsplit_only=False):
    """The `run(x, w, w_scale, bias=None)` of a prepared quant_linear whose two launches `composed()` makes
    (act_quant + a GEMM): one launch of the decode GEMM quantizing the activation itself where
    `configs.fused` says so, bit for bit the two, else those. Each program quantizes its rows' K range,
    or the programs quantize it once per launch between them; that one takes more GPU time than the two
    launches and saves a launch's host time, ~20 µs a call on the H100's host, so
    it is taken outside graph captures only. Past the decode GEMM's rows the launch splits K as the
    tiled GEMM does there (`configs.split_as`): each split sums its K blocks in one program, in order,
    the splits meet in split order, and the decode kernel split alike gives the same bits
   . `unsplit_only`: only there, with K unsplit
    (the Gluon variant, whose GEMM never splits K).
    """
    M, K = x.shape
    N = w.shape[0]
    mode = configs.fused(profile, M, N, K)
    beyond = M > configs.decode_m_max(profile, mma)
    if (beyond and mode != "once") or (unsplit_only and not beyond):
        return composed()
    # The tiled GEMM's tile choice never changes its split (configs.gemm_candidates): its first candidate's is it.
    like = None if unsplit_only or not beyond else configs.gemm_candidates(profile, M, N, K, mma=mma, block_k=block_k,
                                                                           min_block_n=1)[0]
    # Past the decode rows the decode kernel's tiles (64 columns) and the tiled or Gluon GEMM's must each
    # scale all their columns by one weight scale, so that all form the same products: with narrower scale
    # blocks some multiply by the two scales in turn (GPU-checked: Bn = 64 differed, and 256-wide tiles).
    if beyond and block_n % (GLUON_TILE_N if like is None else like.block_n):
        return composed()
    out = mode and torch.empty((M, N), dtype=out_dtype, device=x.device)  # the kernel's view of the result
    gemm = mode and _gemm(x, None, w, w_scale, bias, out, None, block_n=block_n, block_k=block_k, activation=activation,
                          out_group=block_k, ue8m0_out=False, eps=eps, profile=profile, mma=mma, a_ue8m0=ue8m0,
                          once=mode == "once", like=like)
    if not gemm:
        return composed()
    new_out = allocator((*((M,) if lead is None else lead), w.shape[0]), out_dtype, x.device)
    operands = ("x", None, "w", "w_scale", None if bias is None else "bias", "_out", None)
    fused = gemm("x, w, w_scale, bias=None", operands, {"_out": new_out}, "_out")
    return fused if mode == "program" else eagerly(fused, composed(), x.device)


def _gemm(a, a_scale, b, b_scale, bias, out, out_scale, *, block_n, block_k, activation, out_group, ue8m0_out, eps,
          profile, mma, a_ue8m0=False, once=False, like=None):
    """The GEMM for operands laid out as these, as `bind(params, operands, outputs, result)`: the prepared
    run `def run({params})` (`runtime.launch.compose`) that allocates `outputs`, runs the GEMM on `operands` (the
    names, among the parameters and outputs, of a, a_scale, b, b_scale, bias, out and out_scale; None for
    an absent one) and returns `result`. The decode kernel for M <= the profile's decode bound (and, with
    K split as the GemmConfig `like` splits it, None: K whole, for an activation quantized `once` beyond
    it), else the tiled one. `a` is quantized (with a_scale), or a float activation that the decode
    kernel quantizes itself (a_scale None; a_ue8m0 and eps are then act_quant's): each program its rows'
    K range, or `once` for all of them through a workspace. None where that workspace cannot be had (it
    would grow while a graph is captured)."""
    M, K = a.shape
    N = b.shape[0]
    if out.numel() == 0:
        return _binder(lambda *_tensors: None, True)
    qfmt = _KIND[b.dtype]
    if mma not in _MMA_KINDS[qfmt]:
        raise InvalidInputError(f"triton {qfmt} GEMM: mma={mma!r} cannot multiply {qfmt} operands; expected one of "
                                f"{_MMA_KINDS[qfmt]} (the Impl's `mma` option)")
    quantized_out = out_scale is not None
    constants = dict(
        QFMT=qfmt, USE_FP8_MMA=mma == "fp8", SCALE_BN=block_n,
        BIAS=_bias_kind(bias), ACTIVATION=activation or "none",
        OUT=_KIND[out.dtype], OUT_GROUP=out_group if quantized_out else 1, UE8M0_OUT=bool(ue8m0_out),
        TINY_SCALES=scales_may_be_tiny(eps, out.dtype),
        HW_FP8=_hw_fp8(profile), BLOCK_K=block_k)
    bias_stride = 0 if bias is None else bias.stride(0)
    out_scale_stride = out_scale.stride(0) if quantized_out else 0
    decode_rows = configs.decode_m_max(profile, mma)
    if M <= decode_rows or once:
        cfg = configs.decode_config(profile, M, N, K, mma=mma, block_k=block_k,
                                    min_block_n=out_group if quantized_out else 1)
        if M > decode_rows:
            # A quantized linear in one launch where scaled_mm runs the tiled or Gluon kernel: K split as that
            # kernel splits it, so that each output's K blocks are summed as it sums them.
            cfg = configs.split_as(cfg, like)
        quantized = a_scale is not None
        rows = cfg.block_m if quantized else min(cfg.block_m, triton.next_power_of_2(M))
        work = _workspace(a.device, cfg, N, (M, K, block_k, b.dtype) if once else None)
        if work is None:
            return None
        ws, counters, codes, cfg = work
        # Read only `once`: else stand-ins of out's type that hold no memory (the plan keeps them, and `out` is
        # made while preparing: kept, it would outlive a CUDA-graph tree's warm-up in the graph's pool).
        codes = codes or (out.new_empty(0),) * 3
        a_strides = (a_scale.stride(0), a_scale.stride(1)) if quantized else (0, 0)
        launch = Launcher(decode_mm_kernel, (triton.cdiv(N, cfg.block_n), cfg.split_k), dict(
            constants, A=_KIND[a.dtype], UE8M0_A=bool(a_ue8m0), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
            SPLIT_K=cfg.split_k, STAGES=cfg.num_stages, QROWS=rows, ONCE=once,
            KB_VEC=max(2, triton.next_power_of_2(cfg.kb_per_split)), num_warps=cfg.num_warps,
            num_stages=cfg.num_stages), a.device,
            fixed=(ws, counters, *codes, M, N, K, cfg.kb_per_split, a.stride(0), *a_strides, b.stride(0),
                   b_scale.stride(0), b_scale.stride(1), bias_stride, out.stride(0), out_scale_stride, eps, eps))

        def bind(params, operands, outputs, result):
            leading = (*operands[:4], _bias_expression(bias, operands[4]), *operands[5:])
            run = launch.function(params, leading, outputs, result)
            return by_address(run) if _native_bias(bias) else run
        return bind

    constants.update(GROUP_M=_GROUP_M)
    # FP8 decoded to fp16 once per call (exact), into contiguous buffers the kernel reads as they are.
    predecoded = mma == "fp16" and configs.predecode(profile, M, N, K)
    mma = "fp16_predecoded" if predecoded else mma
    rows = (K, K) if predecoded else (a.stride(0), b.stride(0))
    scalars = (*rows, a_scale.stride(0), a_scale.stride(1), b_scale.stride(0), b_scale.stride(1),
               bias_stride, out.stride(0), out_scale_stride, eps)
    decode_a, decode_b = (_fp8_decoder(t, profile) for t in (a, b)) if predecoded else (None, None)

    def tiled(cfg: configs.GemmConfig):
        tma = cfg.tma and _tma_ready(a, b, profile)
        tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
        pair = cfg.split_k > 1 and workspace.buffers(a.device, cfg.split_k * tiles * cfg.block_m * cfg.block_n, tiles)
        if not pair:  # unsplit, or the buffers cannot grow now (a stream being captured): this plan runs unsplit
            cfg, pair = configs.unsplit(cfg), (None, None)
        # With TMA the launcher makes (or keeps) the descriptors of a and b, given again in their places.
        descriptors = {2: functools.partial(TensorDescriptor.from_tensor, block_shape=[cfg.block_m, block_k]),
                       3: functools.partial(TensorDescriptor.from_tensor, block_shape=[cfg.block_n, block_k])}
        launch = Launcher(block_scaled_mm_kernel, (tiles, cfg.split_k), dict(
            constants, TMA=tma, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, K_STEP=cfg.k_step,
            BLOCK_KS=cfg.step_k(block_k, tma), SPLIT=cfg.split_k > 1, num_warps=cfg.num_warps,
            num_stages=cfg.num_stages), a.device, descriptors if tma else None,
            fixed=(*pair, M, N, K, cfg.kb_per_split, *scalars))

        def run(a, a_scale, b, b_scale, bias, out, out_scale):
            if predecoded:
                a, b = decode_a(a), decode_b(b)
            launch(a, b, a if tma else None, b if tma else None, a_scale, b_scale,
                   out if bias is None else _kernel_bias(bias), out, out if out_scale is None else out_scale)
        # Descriptors read the operands' shapes and strides.
        return by_address(run) if not tma and _native_bias(bias) else run

    def bench(cfg: configs.GemmConfig) -> float:
        run = tiled(cfg)
        return triton.testing.do_bench(lambda: run(a, a_scale, b, b_scale, bias, out, out_scale))

    run = tiled(configs.gemm_config(profile, M, N, K, block_k=block_k, min_block_n=out_group if quantized_out else 1,
                                    mma=mma, variant=(_KIND[out.dtype], activation), bench=bench))
    return _binder(run, getattr(run, "by_address", False))


def _fp8_decoder(t, profile):
    """A function (codes laid out as `t`, [R, C] e4m3) -> a new contiguous fp16 tensor of their values."""
    (R, C), device = t.shape, t.device
    block_r, block_c, warps = configs.tile_2d(R, C, profile)
    launch = Launcher(fp8_decode_kernel, (triton.cdiv(R, block_r), triton.cdiv(C, block_c)),
                      dict(BLOCK_R=block_r, BLOCK_C=block_c, num_warps=warps), device, fixed=(R, C, t.stride(0)))
    return launch.function("t", ("t", "_out"), {"_out": allocator((R, C), torch.float16, device)}, "_out")


def _binder(launch: Callable[..., None], by_addresses: bool) -> Callable[..., Callable[..., Any]]:
    """`_gemm`'s result for a launch function (a, a_scale, b, b_scale, bias, out, out_scale): one more
    Python frame a call than a launch of its own (`Launcher.function`); `by_addresses`: whether it reads
    nothing of its tensors but their addresses."""
    def bind(params, operands, outputs, result):
        run = compose(params, outputs, f"    _launch({', '.join(o or 'None' for o in operands)})\n",
                      {"_launch": launch}, result)
        return by_address(run) if by_addresses else run
    return bind


def _workspace(device: torch.device, cfg: configs.DecodeConfig, N: int, once: tuple | None):
    """(fp32 partials, int32 counters, (codes, scales, flags) or None, cfg) of a decode launch, all views
    of the buffers of `runtime.workspace`: partials and counters (None when unsplit) for its split-K
    reduction, and, where `once` = (M, K, block_k, code dtype), the workspace of an activation quantized
    once in the launch (`kernels/quantize_once.py`). Where the buffers cannot grow (a stream being
    captured) a split launch runs unsplit instead, and one that needs `once` gets None."""
    tiles = triton.cdiv(N, cfg.block_n) if cfg.split_k > 1 else 0
    partials = cfg.split_k * tiles * cfg.block_n * cfg.block_m
    if once is not None:
        M, K, block_k, dtype = once
        work = workspace.once_buffers(device, partials, tiles, M, K, block_k)
        if work is None:
            return None
        ws, counters, codes, scales, flags = work
        return ws, counters, (codes.view(torch.int8) if dtype == torch.int8 else codes, scales, flags), cfg
    if not tiles:
        return None, None, None, cfg
    pair = workspace.buffers(device, partials, tiles)
    return (None, None, None, configs.unsplit(cfg)) if pair is None else (*pair, None, cfg)


def _hw_fp8(profile) -> bool:
    """FP8 conversion instructions exist (sm_89+, the GPUs with FP8 MMA); the interpreter's cast
    mis-rounds, so it keeps the integer codec even when it runs a simulated GPU's paths."""
    return profile.kind == "cuda" and bool(profile.fp8_mma) and not capability.triton_interpreter()


def flat_rows(t: torch.Tensor) -> bool:
    """Whether `t` [..., R, K] reads as one [rows, K] matrix through a TMA descriptor: K contiguous, rows 16-byte
    aligned, leading dims (stacked experts) that flatten into the rows."""
    return (t.stride(-1) == 1 and t.stride(-2) % 16 == 0
            and all(t.stride(d) == t.shape[d + 1] * t.stride(d + 1) for d in range(t.dim() - 2)))


def _tma_ready(a, b, profile) -> bool:
    """Whether a and b can be read through TMA descriptors: a Hopper-class device (a simulated
    older GPU gets its own path) and 16-byte aligned bases and row strides (TMA's rules)."""
    return (TensorDescriptor is not None and profile.kind == "cuda"
            and tuple(profile.compute_capability or (0, 0)) >= (9, 0)
            and all(t.data_ptr() % 16 == 0 and t.stride(0) % 16 == 0 for t in (a, b)))
