"""The mixture-of-experts ops, each defined once: the grouped block-scaled GEMMs (contiguous and masked
layouts) and the routing ops around them (permute with the activation quantization fused, un-permute
with the weighted sum). Each is its public signature and docstring, whose body is its spec (validation,
normalisation to the backend contract, the selection query), with its launch arguments, custom ops and
their fake kernels, and reported formats.

Expert weights are stacked: b [E, N, K] with b_scale [E, ceil(N/Bn), ceil(K/Bk)]. Routing data that lives
on the GPU (expert offsets, masked_m, expert ids) is trusted: checking it would read it back to the host,
a synchronization that a CUDA graph cannot hold. Where it lives on the CPU it is checked, and such a call
keeps no plan (`Prepared.read_values`): the next call's values are checked again. Every output's shape
depends on the inputs' shapes alone (T·k, E, max_m), never on the routing, so the fakes are exact and a
captured graph replays any routing.
"""

from __future__ import annotations

import math

import torch

from .. import capability
from ..formats import ACTIVATIONS, DEFAULT_BLOCK, DEFAULT_EPS, DEFAULT_GROUP, FLOAT_DTYPES, dtype_name, format_named
from . import checks
from .op import CustomOp, OpDef
from .prepared import Prepared, keep
from .query import BackendChoice, GroupedGemmQuery, Query, m_bucket
from .schema import F32, QUANT_FORMATS, blocks, example_operands

_QUANTIZED = (torch.float8_e4m3fn, torch.int8)
_IDS = (torch.int32, torch.int64)
_I32 = torch.int32
_GEMM_LAUNCH = ("a", "a_scale", "b", "b_scale", "{rows}", "block_n", "block_k", "bias", "activation", "out_dtype",
                "out_quant", "out_group", "ue8m0_out", "eps", "profile")


def _host_readable(t: torch.Tensor) -> bool:
    """Whether the spec may read `t`'s values: a plain tensor on the CPU (a fake or functional tensor has
    none, and a GPU tensor would cost a synchronization)."""
    return t.device.type == "cpu" and type(t) in (torch.Tensor, torch.nn.Parameter)


def _experts_weight(op: str, a: torch.Tensor, b, b_scale, bias, K: int, bn: int, bk: int):
    """The stacked weights b [E, N, K] (a's dtype), their scales and the per-expert bias: (E, N, b, b_scale,
    bias)."""
    b = checks.tensor(op, "b", b, _QUANTIZED)
    if b.dim() != 3 or min(b.shape) == 0:
        raise checks.fail(op, f"b has shape {tuple(b.shape)}; expected [E, N, K] with every size >= 1 (the experts' "
                              "weights stacked, each [N, K] as scaled_mm takes it)")
    if b.dtype != a.dtype:
        raise checks.fail(op, f"a is {dtype_name(a.dtype)} but b is {dtype_name(b.dtype)}; both operands must have "
                              "the same quantized dtype")
    E, N, Kb = b.shape
    if Kb != K:
        raise checks.fail(op, f"a has K={K} but b has shape {tuple(b.shape)}; b must be [E, N, K] (each expert's "
                              "weight as [N, K], not its transpose)")
    b_scale = checks.tensor(op, "b_scale", b_scale, (F32,), min_dim=3)
    if b_scale.dim() == 3 and b_scale.shape[0] != E:
        raise checks.fail(op, f"b_scale holds {b_scale.shape[0]} experts' scales but b holds {E} experts; stack the "
                              "scales of the same experts as the weights")
    checks.shape(op, "b_scale", b_scale, (E, math.ceil(N / bn), math.ceil(K / bk)),
                 f"one fp32 scale per {bn}x{bk} block of each expert's weight")
    if bias is not None:
        bias = checks.tensor(op, "bias", bias, FLOAT_DTYPES)
        checks.shape(op, "bias", bias, (E, N), "one bias row per expert, one value per output column")
    return E, N, checks.last_dim_contiguous(b), b_scale, bias


def _epilogue(op: str, fmt, activation, out_dtype, out_quant, out_group_size, out_scale_fmt, eps, device):
    """The fused epilogue's options, checked as scaled_mm checks them: (activation, out_dtype, the
    re-quantized output's format or None, its group, ue8m0, eps)."""
    act = checks.choice(op, "activation", activation, ACTIVATIONS)
    out = checks.out_float(op, "out_dtype", out_dtype)
    group = checks.positive_int(op, "out_group_size", out_group_size)
    ue8m0_out = checks.scale_fmt(op, out_scale_fmt)
    out_fmt = None if out_quant is None else checks.quant_format(op, "out_quant", out_quant, device)
    return act, out, out_fmt, group, ue8m0_out, checks.eps(op, eps, (out_fmt or fmt).qmax)


def _gemm_prepared(op: str, rows_name: str, a, a_scale, b, b_scale, rows, bias, E, N, K, bn, bk, fmt, epilogue,
                   m_rows: int, read_values: bool) -> Prepared:
    act, out, out_fmt, group, ue8m0_out, floor = epilogue
    profile = capability.profile_for(a.device)
    block_dims = (bn, bk) + ((group,) if out_fmt else ())
    return Prepared(
        GroupedGemmQuery(op, profile, fmt.name, out_fmt.name if out_fmt else None, block_dims, m_bucket(m_rows), (N, K),
                         block_k=bk, out_group=group if out_fmt else 0,
                         fused=bias is not None or act is not None or out_fmt is not None, experts=E),
        {"a": a, "a_scale": a_scale, "b": b, "b_scale": b_scale, rows_name: rows, "block_n": checks.within(bn, N),
         "block_k": bk, "bias": bias, "activation": act, "out_dtype": out,
         "out_quant": out_fmt.dtype if out_fmt else None, "out_group": group, "ue8m0_out": ue8m0_out, "eps": floor,
         "profile": profile},
        keep, empty=a.numel() == 0, read_values=read_values,
    )


def _counts(op: str, name: str, t, length: int, what: str) -> torch.Tensor:
    """An int32 vector of `length` row counts or boundaries (expert_offsets, masked_m)."""
    if isinstance(t, torch.Tensor) and t.dtype != _I32:
        raise checks.fail(op, f"{name} has dtype {dtype_name(t.dtype)}; expected int32 ({what}); convert it with "
                              ".to(torch.int32) where it is made (the kernels read 32-bit counts)")
    t = checks.tensor(op, name, t, (_I32,), empty_last=True)
    checks.shape(op, name, t, (length,), what)
    return checks.last_dim_contiguous(t)


def _routed_rows(op: str, a, a_scale, block_size, dims: int, expected: str):
    """The grouped GEMMs' activation checked: (a, its format, a_scale fp32, (Bn, Bk)); a has `dims` dims."""
    a, fmt = checks.quantized(op, "a", a)
    if a.dim() != dims:
        raise checks.fail(op, f"a has shape {tuple(a.shape)}; expected {expected}")
    return a, fmt, checks.tensor(op, "a_scale", a_scale, (F32,), empty_last=True), checks.block_pair(op, block_size)


def _routed_scales(op: str, a_scale: torch.Tensor, lead: tuple[int, ...], K: int, bk: int) -> None:
    checks.shape(op, "a_scale", a_scale, (*lead, math.ceil(K / bk)),
                 f"one fp32 scale per 1x{bk} group of a's rows; quantize the activation with group_size={bk}")


def grouped_mm(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
               expert_offsets: torch.Tensor, *, bias: torch.Tensor | None = None, activation: str | None = None,
               out_dtype: torch.dtype = torch.bfloat16, out_quant: torch.dtype | None = None,
               block_size: tuple[int, int] = DEFAULT_BLOCK, out_group_size: int = DEFAULT_GROUP,
               out_scale_fmt: str = "fp32", eps: float = DEFAULT_EPS, backend: BackendChoice = None):
    """Grouped block-scaled GEMM, contiguous layout (prefill): for each expert e, the rows r of a between
    expert_offsets[e] and expert_offsets[e + 1] get `scaled_mm(a[r], a_scale[r], b[e], b_scale[e],
    bias=bias[e], ...)`, bit for bit (the grouped kernels never split K: equal to scaled_mm where it runs
    with K unsplit), empty and one-row experts included.

    a: [M, K] fp8/int8, rows sorted by expert (`moe_permute` gives them so), with a_scale [M, ceil(K/Bk)]
    fp32 (act_quant with group_size=Bk); b: [E, N, K] same dtype with b_scale [E, ceil(N/Bn), ceil(K/Bk)]
    fp32; expert_offsets: int32 [E + 1] on a's device, non-decreasing from 0 to M; bias: [E, N] float or
    None. The epilogue and its options are scaled_mm's. Returns [M, N] out_dtype, or with out_quant
    (q [M, N], scale [M, ceil(N/out_group_size)] fp32).

    expert_offsets on the GPU is trusted, not checked (that would synchronize with the host); rows outside
    offsets[0]:offsets[E] are then left unspecified. On the CPU it is checked (InvalidInputError).
    """
    op = "grouped_mm"
    a, fmt, a_scale, (bn, bk) = _routed_rows(op, a, a_scale, block_size, 2, "[M, K]: the routed rows, sorted by "
                                             "expert (grouped_mm_masked takes [E, max_m, K])")
    M, K = a.shape
    E, N, b, b_scale, bias = _experts_weight(op, a, b, b_scale, bias, K, bn, bk)
    _routed_scales(op, a_scale, (M,), K, bk)
    offsets = _counts(op, "expert_offsets", expert_offsets, E + 1,
                      f"E + 1 = {E + 1} row boundaries for b's {E} experts")
    checks.same_device(op, a=a, a_scale=a_scale, b=b, b_scale=b_scale, expert_offsets=offsets, bias=bias)
    epilogue = _epilogue(op, fmt, activation, out_dtype, out_quant, out_group_size, out_scale_fmt, eps, a.device)
    readable = _host_readable(offsets)
    if readable:
        _check_offsets(op, offsets, M)
    return _gemm_prepared(op, "expert_offsets", checks.last_dim_contiguous(a), a_scale, b, b_scale, offsets, bias, E,
                          N, K, bn, bk, fmt, epilogue, M, readable)


def _check_offsets(op: str, offsets: torch.Tensor, M: int) -> None:
    values = offsets.tolist()
    if values[0] != 0 or values[-1] != M:
        raise checks.fail(op, f"expert_offsets runs from {values[0]} to {values[-1]}; expected 0 to M = {M} (expert "
                              "e's rows are a[offsets[e]:offsets[e + 1]], and every row belongs to one expert)")
    drops = [e for e in range(len(values) - 1) if values[e + 1] < values[e]]
    if drops:
        e = drops[0]
        raise checks.fail(op, f"expert_offsets decreases at expert {e} ({values[e]} then {values[e + 1]}); the "
                              "boundaries must be non-decreasing (a's rows sorted by expert, as moe_permute sorts)")


def grouped_mm_masked(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                      masked_m: torch.Tensor, *, bias: torch.Tensor | None = None, activation: str | None = None,
                      out_dtype: torch.dtype = torch.bfloat16, out_quant: torch.dtype | None = None,
                      block_size: tuple[int, int] = DEFAULT_BLOCK, out_group_size: int = DEFAULT_GROUP,
                      out_scale_fmt: str = "fp32", eps: float = DEFAULT_EPS, backend: BackendChoice = None):
    """Grouped block-scaled GEMM, masked layout (decode; fixed shapes for CUDA graphs): for each expert e,
    rows a[e, :masked_m[e]] get `scaled_mm` with b[e], b_scale[e] and bias[e], bit for bit as `grouped_mm`.

    a: [E, max_m, K] fp8/int8 with a_scale [E, max_m, ceil(K/Bk)] fp32; masked_m: int32 [E] on a's device,
    expert e's row count (one above max_m counts as max_m, a negative one as 0); b, b_scale, bias and the
    epilogue as `grouped_mm`'s. Returns [E, max_m, N] out_dtype, or with out_quant (q [E, max_m, N],
    scale [E, max_m, ceil(N/out_group_size)] fp32). Rows r >= masked_m[e] are not computed: their output is
    unspecified (the GPU kernels leave it unwritten). masked_m is read on the device only, never checked.
    """
    op = "grouped_mm_masked"
    a, fmt, a_scale, (bn, bk) = _routed_rows(op, a, a_scale, block_size, 3, "[E, max_m, K] (grouped_mm takes "
                                             "the contiguous [M, K] layout)")
    Ea, max_m, K = a.shape
    E, N, b, b_scale, bias = _experts_weight(op, a, b, b_scale, bias, K, bn, bk)
    if Ea != E:
        raise checks.fail(op, f"a has rows for {Ea} experts (shape {tuple(a.shape)}) but b holds {E}; a must be "
                              "[E, max_m, K] with b's E")
    _routed_scales(op, a_scale, (E, max_m), K, bk)
    masked_m = _counts(op, "masked_m", masked_m, E, "one row count per expert")
    checks.same_device(op, a=a, a_scale=a_scale, b=b, b_scale=b_scale, masked_m=masked_m, bias=bias)
    epilogue = _epilogue(op, fmt, activation, out_dtype, out_quant, out_group_size, out_scale_fmt, eps, a.device)
    return _gemm_prepared(op, "masked_m", checks.last_dim_contiguous(a), a_scale, b, b_scale, masked_m, bias, E, N,
                          K, bn, bk, fmt, epilogue, max_m, False)


# Fake kernels: shapes from the inputs' shapes alone (the row counts never change them).
def _grouped_fake(a, a_scale, b, b_scale, rows, bias=None, *, out_dtype=torch.bfloat16, **_):
    return a.new_empty(*a.shape[:-1], b.shape[1], dtype=out_dtype)


def _grouped_quant_fake(a, a_scale, b, b_scale, rows, bias=None, *, out_quant, out_group_size=DEFAULT_GROUP, **_):
    lead, N = a.shape[:-1], b.shape[1]
    groups = blocks(N, "grouped_mm", "out_group_size", out_group_size)
    return a.new_empty(*lead, N, dtype=out_quant), a.new_empty(*lead, groups, dtype=F32)


def _experts_example(E: int = 4, masked: bool = False):
    """An example call on m rows (per expert, masked: every row live so that every backend's outputs are
    defined) of E experts' n×k weights, the contiguous rows spread evenly over the experts."""
    def example(fmt, device="cpu", m=2, n=32, k=512):
        _, _, (a, a_s), _ = example_operands(fmt, device, m * E if masked else m, n, k)
        ws = [example_operands(fmt, device, 1, n, k)[3] for _ in range(E)]
        b, b_s = torch.stack([w for w, _ in ws]), torch.stack([s for _, s in ws])
        if masked:
            rows = torch.full((E,), m, dtype=_I32, device=device)
            return (a.view(E, m, k), a_s.view(E, m, -1), b, b_s, rows), {}
        rows = torch.tensor([e * m // E for e in range(E + 1)], dtype=_I32, device=device)
        return (a, a_s, b, b_s, rows), {}
    return example


def _grouped_def(spec, rows: str, masked: bool) -> OpDef:
    name = spec.__name__
    # One custom op per return type, as scaled_mm's: the float output's without the re-quantization options,
    # the re-quantized one's with out_quant required.
    return OpDef(
        spec, ("a", "a_scale", "b", "b_scale", rows, "bias"), tuple(a.format(rows=rows) for a in _GEMM_LAUNCH),
        QUANT_FORMATS, DEFAULT_BLOCK,
        (CustomOp(name, _grouped_fake, returns=1, omit=("out_quant", "out_group_size", "out_scale_fmt", "eps"),
                  serves=lambda arguments: arguments["out_quant"] is None),
         CustomOp(f"{name}_quant", _grouped_quant_fake, returns=2, omit=("out_dtype",), required=("out_quant",),
                  serves=lambda arguments: arguments["out_quant"] is not None)),
        _experts_example(masked=masked))


GROUPED_MM = _grouped_def(grouped_mm, "expert_offsets", False)
GROUPED_MM_MASKED = _grouped_def(grouped_mm_masked, "masked_m", True)


def _routing(op: str, x, topk_ids, num_experts, dtype, group_size, scale_fmt, eps):
    """The permute ops' shared checks: (x, topk_ids, E, format, group, ue8m0, eps, whether ids were read)."""
    x = checks.tensor(op, "x", x, FLOAT_DTYPES, min_dim=2)
    if x.dim() != 2:
        raise checks.fail(op, f"x has shape {tuple(x.shape)}; expected [T, H] (one row per token)")
    topk_ids = checks.tensor(op, "topk_ids", topk_ids, _IDS, min_dim=2)
    if topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0]:
        raise checks.fail(op, f"topk_ids has shape {tuple(topk_ids.shape)} for x of shape {tuple(x.shape)}; expected "
                              f"[T, k] = [{x.shape[0]}, k] (each token's k expert ids, as a router's topk gives them)")
    E = checks.positive_int(op, "num_experts", num_experts)
    checks.same_device(op, x=x, topk_ids=topk_ids)
    fmt = checks.quant_format(op, "dtype", dtype, x.device)
    group = checks.positive_int(op, "group_size", group_size)
    ue8m0 = checks.scale_fmt(op, scale_fmt)
    floor = checks.eps(op, eps, fmt.qmax)
    readable = _host_readable(topk_ids)
    if readable and topk_ids.numel():
        low, high = int(topk_ids.min()), int(topk_ids.max())
        if low < 0 or high >= E:
            bad = low if low < 0 else high
            raise checks.fail(op, f"topk_ids holds expert id {bad}, outside 0..{E - 1} (num_experts={E}); route every "
                                  "token to existing experts (on the GPU such a pair is dropped: no row, no weight)")
    return checks.last_dim_contiguous(x), topk_ids, E, fmt, group, ue8m0, floor, readable


def moe_permute(x: torch.Tensor, topk_ids: torch.Tensor, num_experts: int, *, dtype=torch.float8_e4m3fn,
                group_size: int = DEFAULT_GROUP, scale_fmt: str = "fp32", eps: float = DEFAULT_EPS,
                backend: BackendChoice = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Route tokens to their experts for `grouped_mm` (contiguous layout), quantizing each token once.

    x: [T, H] bf16/fp16/fp32; topk_ids: [T, k] int32/int64, each token's experts in 0..num_experts-1.
    The T·k (token, slot) pairs are sorted by expert with a counting sort on the device (histogram, prefix
    sum, scatter: no host synchronization, so a CUDA graph holds it), stable: within an expert, pairs keep
    the order t·k + j. Each token is quantized once per 1×group_size group (act_quant's numerics, dtype
    fp8/int8) and its codes and scales written to each of its k rows.

    Returns (a_q [T·k, H] dtype, a_scale [T·k, ceil(H/group_size)] fp32, expert_offsets int32 [E + 1],
    rows int32 [T·k]): expert e's rows are a_q[offsets[e]:offsets[e + 1]], and rows[i] = t·k + j names the
    pair sorted to row i (for `moe_unpermute`). An expert id outside 0..E-1 raises InvalidInputError where
    topk_ids is on the CPU; on the GPU it is not checked and such a pair is dropped: it gets no row
    (offsets[E] counts the kept pairs), the rows past offsets[E] hold rows[i] = -1 and unspecified codes.
    """
    op = "moe_permute"
    x, topk_ids, E, fmt, group, ue8m0, floor, readable = _routing(op, x, topk_ids, num_experts, dtype, group_size,
                                                                  scale_fmt, eps)
    profile = capability.profile_for(x.device)
    return Prepared(
        Query(op, profile, fmt.name, blocks=(group,), m_bucket=m_bucket(topk_ids.numel())),
        dict(x=x, topk_ids=topk_ids, num_experts=E, qdtype=fmt.dtype, group_size=checks.within(group, x.shape[1]),
             ue8m0=ue8m0, eps=floor, profile=profile),
        keep, empty=topk_ids.numel() == 0, read_values=readable,
    )


def moe_permute_masked(x: torch.Tensor, topk_ids: torch.Tensor, num_experts: int, max_m: int, *,
                       dtype=torch.float8_e4m3fn, group_size: int = DEFAULT_GROUP, scale_fmt: str = "fp32",
                       eps: float = DEFAULT_EPS, backend: BackendChoice = None
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Route tokens to their experts for `grouped_mm_masked` (decode): `moe_permute`'s sort and fused
    quantization into per-expert slabs of max_m rows, fixed shapes for CUDA graphs.

    x: [T, H] bf16/fp16/fp32; topk_ids: [T, k] int32/int64. Returns (a_q [E, max_m, H] dtype,
    a_scale [E, max_m, ceil(H/group_size)] fp32, masked_m int32 [E], rows int32 [E, max_m]): expert e's
    pairs, in t·k + j order, are rows a_q[e, :masked_m[e]], and rows[e, r] = t·k + j names the pair in row r
    (-1 past masked_m[e], whose codes and scales are unspecified).

    max_m must be at least the largest expert count: an expert holds at most T pairs when each token's k
    ids are distinct (as a router's topk gives them), so max_m = T always suffices. Pairs beyond max_m
    for an expert are dropped (masked_m[e] = min(count, max_m); the dropped pairs, the last in t·k + j
    order, get no row and no weight in `moe_unpermute`): the counts are on the device, so this is not
    checked. Expert ids outside 0..E-1: as `moe_permute`.
    """
    op = "moe_permute_masked"
    x, topk_ids, E, fmt, group, ue8m0, floor, readable = _routing(op, x, topk_ids, num_experts, dtype, group_size,
                                                                  scale_fmt, eps)
    max_m = checks.positive_int(op, "max_m", max_m)
    profile = capability.profile_for(x.device)
    return Prepared(
        Query(op, profile, fmt.name, blocks=(group,), m_bucket=m_bucket(topk_ids.numel())),
        dict(x=x, topk_ids=topk_ids, num_experts=E, max_m=max_m, qdtype=fmt.dtype,
             group_size=checks.within(group, x.shape[1]), ue8m0=ue8m0, eps=floor, profile=profile),
        keep, empty=topk_ids.numel() == 0, read_values=readable,
    )


def _permute_fake(x, topk_ids, *, num_experts, dtype=torch.float8_e4m3fn, group_size=DEFAULT_GROUP, **_):
    rows, H = topk_ids.shape[0] * topk_ids.shape[1], x.shape[1]
    groups = blocks(H, "moe_permute", "group_size", group_size)
    return (x.new_empty(rows, H, dtype=dtype), x.new_empty(rows, groups, dtype=F32),
            x.new_empty(num_experts + 1, dtype=_I32), x.new_empty(rows, dtype=_I32))


def _permute_masked_fake(x, topk_ids, *, num_experts, max_m, dtype=torch.float8_e4m3fn, group_size=DEFAULT_GROUP,
                         **_):
    H = x.shape[1]
    groups = blocks(H, "moe_permute_masked", "group_size", group_size)
    return (x.new_empty(num_experts, max_m, H, dtype=dtype), x.new_empty(num_experts, max_m, groups, dtype=F32),
            x.new_empty(num_experts, dtype=_I32), x.new_empty(num_experts, max_m, dtype=_I32))


def _permute_example(masked: bool, E: int = 4):
    """m tokens of k features, each routed to all E experts in a rotated order: every expert gets every
    token, so every output row is defined (masked: max_m = m)."""
    def example(fmt, device="cpu", m=2, n=32, k=512):
        x = example_operands(fmt, device, m, n, k)[0]
        ids = torch.stack([torch.roll(torch.arange(E), t) for t in range(m)]).to(device)
        kwargs = dict(num_experts=E, dtype=format_named(fmt).dtype) | (dict(max_m=m) if masked else {})
        return (x, ids), kwargs
    return example


MOE_PERMUTE = OpDef(
    moe_permute, ("x", "topk_ids"),
    ("x", "topk_ids", "num_experts", "qdtype", "group_size", "ue8m0", "eps", "profile"), QUANT_FORMATS,
    (DEFAULT_GROUP,), (CustomOp("moe_permute", _permute_fake, required=("num_experts",)),), _permute_example(False))
MOE_PERMUTE_MASKED = OpDef(
    moe_permute_masked, ("x", "topk_ids"),
    ("x", "topk_ids", "num_experts", "max_m", "qdtype", "group_size", "ue8m0", "eps", "profile"), QUANT_FORMATS,
    (DEFAULT_GROUP,),
    (CustomOp("moe_permute_masked", _permute_masked_fake, required=("num_experts", "max_m")),),
    _permute_example(True))


def moe_unpermute(y: torch.Tensor, rows: torch.Tensor, topk_weights: torch.Tensor, *,
                  out_dtype: torch.dtype | None = None, backend: BackendChoice = None) -> torch.Tensor:
    """The experts' outputs back in token order, weighted and summed: out[t] = Σ_j topk_weights[t, j] ·
    y[row of pair t·k + j], in fp32, slot j = 0, 1, …, k-1 in order (each term w·y rounded to fp32, then
    added: deterministic, the same bits on every backend), cast to out_dtype (None: y's dtype).

    y: [R, N] (contiguous layout, R = T·k) or [E, max_m, N] (masked layout), bf16/fp16/fp32; rows: int32
    of y's leading shape, as `moe_permute` / `moe_permute_masked` return it (rows[i] = t·k + j for a row
    holding pair (t, j), -1 for a row holding none); topk_weights: [T, k] bf16/fp16/fp32. A pair no row
    holds (dropped by the permute) adds nothing. Returns [T, N].

    Where rows is on the CPU it is checked (values in -1..T·k-1, each pair in at most one row); on the GPU
    values outside that range count as -1, and a pair in several rows is invalid input (which row is
    taken is unspecified).
    """
    op = "moe_unpermute"
    y = checks.tensor(op, "y", y, FLOAT_DTYPES, min_dim=2)
    if y.dim() not in (2, 3):
        raise checks.fail(op, f"y has shape {tuple(y.shape)}; expected [T*k, N] (contiguous) or [E, max_m, N] (masked)")
    rows = checks.tensor(op, "rows", rows, (_I32,), min_dim=1, empty_last=True)
    if tuple(rows.shape) != tuple(y.shape[:-1]):
        raise checks.fail(op, f"rows has shape {tuple(rows.shape)} for y of shape {tuple(y.shape)}; expected "
                              f"{tuple(y.shape[:-1])} (one source pair per row of y, as the permute returned it)")
    weights = checks.tensor(op, "topk_weights", topk_weights, FLOAT_DTYPES, min_dim=2)
    if weights.dim() != 2:
        raise checks.fail(op, f"topk_weights has shape {tuple(weights.shape)}; expected [T, k] (the router's weights)")
    out = y.dtype if out_dtype is None else checks.out_float(op, "out_dtype", out_dtype)
    checks.same_device(op, y=y, rows=rows, topk_weights=weights)
    pairs = weights.shape[0] * weights.shape[1]
    readable = _host_readable(rows)
    if readable and rows.numel():
        _check_rows(op, rows, pairs)
    y2, rows1 = checks.rows(y), checks.last_dim_contiguous(rows.reshape(-1))
    profile = capability.profile_for(y.device)
    return Prepared(
        Query(op, profile, dtype_name(y.dtype), m_bucket=m_bucket(weights.shape[0])),
        dict(y=y2, rows=rows1, topk_weights=weights, out_dtype=out, profile=profile),
        keep, empty=pairs == 0 or y2.shape[0] == 0, read_values=readable,
    )


def _check_rows(op: str, rows: torch.Tensor, pairs: int) -> None:
    flat = rows.reshape(-1)
    low, high = int(flat.min()), int(flat.max())
    if low < -1 or high >= pairs:
        raise checks.fail(op, f"rows holds {low if low < -1 else high}, outside -1..{pairs - 1} (topk_weights has "
                              f"T*k = {pairs} pairs); pass the rows the permute returned with these weights")
    held = flat[flat >= 0]
    if held.unique().numel() != held.numel():
        raise checks.fail(op, "rows names a pair in more than one row; each (token, slot) pair is routed to one row "
                              "(pass the rows the permute returned)")


def _unpermute_fake(y, rows, topk_weights, *, out_dtype=None, **_):
    return y.new_empty(topk_weights.shape[0], y.shape[-1], dtype=y.dtype if out_dtype is None else out_dtype)


def _unpermute_example(fmt, device="cpu", m=2, n=32, k=512, top=4):
    """y of m·top rows in dtype `fmt`, a shuffled rows map and positive weights."""
    gen = torch.Generator().manual_seed(0)
    dtype = next(d for d in FLOAT_DTYPES if dtype_name(d) == fmt)
    y = torch.randn(m * top, n, generator=gen).to(dtype)
    rows = torch.randperm(m * top, generator=gen).to(_I32)
    weights = torch.rand(m, top, generator=gen)
    return tuple(t.to(device) for t in (y, rows, weights)), {}


MOE_UNPERMUTE = OpDef(
    moe_unpermute, ("y", "rows", "topk_weights"), ("y", "rows", "topk_weights", "out_dtype", "profile"),
    tuple(map(dtype_name, FLOAT_DTYPES)), (), (CustomOp("moe_unpermute", _unpermute_fake),), _unpermute_example)
