"""An independent float64 computation of the numerics contract, written without the reference's code.

fp32 results are obtained by computing in float64 and rounding once to fp32: for + − × ÷ of fp32
operands this equals the IEEE fp32 operation (float64 has more than 2·24+2 bits). FP8 encoding
rounds to the nearest of the 256 e4m3fn codes, ties to the even code.
"""

from __future__ import annotations

import math

import numpy as np
import torch

QMAX = {torch.float8_e4m3fn: 448.0, torch.int8: 127.0}
_E4M3 = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).double().numpy()
_FINITE_CODES = np.array([c for c in range(128) if np.isfinite(_E4M3[c])])  # non-negative codes 0..0x7E
_FINITE_VALUES = _E4M3[_FINITE_CODES]


def f32(a: np.ndarray) -> np.ndarray:
    """Round float64 values once to fp32 (kept as float64 for further exact arithmetic)."""
    return np.asarray(a, dtype=np.float64).astype(np.float32).astype(np.float64)


def encode_e4m3(v: np.ndarray) -> np.ndarray:
    """float64 values -> e4m3fn codes (uint8): saturate to ±448, nearest, ties to even code, the sign kept
    (a negative value that rounds to zero is −0, 0x80, as torch's cast and the hardware's conversion give);
    NaN -> 0x7F."""
    mag = np.minimum(np.abs(v), 448.0)
    idx = np.searchsorted(_FINITE_VALUES, mag)
    lo = np.clip(idx - 1, 0, len(_FINITE_VALUES) - 1)
    hi = np.clip(idx, 0, len(_FINITE_VALUES) - 1)
    dlo, dhi = np.abs(mag - _FINITE_VALUES[lo]), np.abs(_FINITE_VALUES[hi] - mag)
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (_FINITE_CODES[hi] % 2 == 0))
    codes = np.where(pick_hi, _FINITE_CODES[hi], _FINITE_CODES[lo]).astype(np.uint8)
    codes = np.where(np.signbit(v), codes | 0x80, codes)
    return np.where(np.isnan(v), 0x7F, codes).astype(np.uint8)


def decode(q: torch.Tensor) -> np.ndarray:
    """Quantized tensor -> float64 values."""
    return q.double().numpy() if q.dtype == torch.int8 else _E4M3[q.view(torch.uint8).numpy()]


def scales(amax: np.ndarray, qdtype: torch.dtype, ue8m0: bool, eps: float) -> np.ndarray:
    """fp32 scale per block (float64 storage): max(amax, fp32(eps)) / qmax; ue8m0: the smallest normal
    fp32 power of two >= it, 2**max(ceil(log2), -126)."""
    s = f32(np.fmax(amax, f32(eps)) / QMAX[qdtype])
    s = np.where(np.isnan(amax), np.nan, s)
    if ue8m0:
        with np.errstate(divide="ignore", invalid="ignore"):
            s = np.where(np.isfinite(s), np.exp2(np.maximum(np.ceil(np.log2(s)), -126)), s)
    return s


def quantize_values(x: np.ndarray, s: np.ndarray, qdtype: torch.dtype) -> torch.Tensor:
    """x, s broadcastable float64 -> quantized tensor (int8 or e4m3 codes viewed as fp8)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        v = f32(x / s)
    if qdtype == torch.int8:
        r = np.clip(np.round(v), -127, 127)  # numpy rounds half to even
        return torch.from_numpy(np.where(np.isnan(r), 0, r).astype(np.int8))
    return torch.from_numpy(encode_e4m3(v)).view(torch.float8_e4m3fn)


def act_quant(x: torch.Tensor, qdtype, group: int, ue8m0: bool = False, eps: float = 1e-4):
    """[..., K] -> (q, scale) per 1×group along the last dim."""
    xs = x.double().numpy().reshape(-1, x.shape[-1])
    M, K = xs.shape
    kb = math.ceil(K / group)
    s = np.empty((M, kb))
    for j in range(kb):
        blk = np.abs(xs[:, j * group:(j + 1) * group])
        s[:, j] = np.where(np.isnan(blk).any(1), np.nan, blk.max(1) if blk.size else 0)
    s = scales(s, qdtype, ue8m0, eps)
    q = quantize_values(xs, np.repeat(s, group, axis=1)[:, :K], qdtype)
    return q.reshape(x.shape), torch.from_numpy(s).float().reshape(*x.shape[:-1], kb)


def weight_quant(w: torch.Tensor, qdtype, bn: int, bk: int, ue8m0: bool = False, eps: float = 1e-4):
    """[N, K] -> (q, scale [ceil(N/bn), ceil(K/bk)])."""
    ws = w.double().numpy()
    N, K = ws.shape
    nb, kb = math.ceil(N / bn), math.ceil(K / bk)
    s = np.empty((nb, kb))
    for i in range(nb):
        for j in range(kb):
            blk = np.abs(ws[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk])
            s[i, j] = np.nan if np.isnan(blk).any() else blk.max()
    s = scales(s, qdtype, ue8m0, eps)
    full = np.repeat(np.repeat(s, bn, 0), bk, 1)[:N, :K]
    return quantize_values(ws, full, qdtype), torch.from_numpy(s).float()


def dequant(q: torch.Tensor, scale_full: np.ndarray, out_dtype) -> torch.Tensor:
    """fp32(q) * scale (one fp32 multiply, exact in float64 then rounded) cast to out_dtype."""
    with np.errstate(invalid="ignore"):  # 0 · Inf scale: NaN, as the contract has it
        return torch.from_numpy(f32(decode(q) * scale_full)).to(out_dtype)


def dequant_bias(g: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor, bias=None) -> torch.Tensor:
    """fp32(g)·sa[m]·sb[n] + fp32(bias[n]), left to right, each operation an fp32 rounding: fp32 [M, N]."""
    out = f32(f32(f32(g.double().numpy()) * sa.double().numpy()[:, None]) * sb.double().numpy()[None, :])
    if bias is not None:
        out = f32(out + bias.double().numpy()[None, :])
    return torch.from_numpy(out).float()


_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _tanh_u(x: np.ndarray) -> np.ndarray:
    return math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp(-z) -> inf for very negative z gives the right 0
        return 1 / (1 + np.exp(-z))


def gelu(x: np.ndarray, approximate: str = "none") -> np.ndarray:
    """GELU in float64, accurate in the negative tail too (1 + erf or 1 + tanh would cancel there
    even in float64, below x ≈ −8)."""
    if approximate == "tanh":
        return x * _sigmoid(2 * _tanh_u(x))
    return 0.5 * x * _erfc(-x / math.sqrt(2))


def activation(x: np.ndarray, name: str | None) -> np.ndarray:
    """The GEMM epilogue's activation in float64."""
    if name is None:
        return x
    if name == "silu":
        return x * _sigmoid(x)
    return gelu(x, "tanh" if name == "gelu_tanh" else "none")


def activation_condition(x: np.ndarray, name: str) -> np.ndarray:
    """|x·f'(x) / f(x)| of the activation f = x·g(x): how much a relative change of x (its fp32
    rounding, say) is amplified in f(x). It is 1 + x·g'(x)/g(x), which grows like x² for GELU in the
    negative tail."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if name == "gelu":
            log_slope = np.exp(-x * x / 2) / math.sqrt(2 * math.pi) / (0.5 * _erfc(-x / math.sqrt(2)))
        elif name == "silu":
            log_slope = 1 - _sigmoid(x)
        else:
            log_slope = (1 - _sigmoid(2 * _tanh_u(x))) * 2 * math.sqrt(2 / math.pi) * (1 + 3 * 0.044715 * x ** 2)
        return np.abs(1 + np.nan_to_num(x * log_slope, nan=0.0))


def scaled_mm(a, a_scale, b, b_scale, bn: int, bk: int, bias=None, act=None) -> np.ndarray:
    """Σ_kb dot_kb · a_s · b_s + bias, activation — all in float64, [M, N]."""
    A, B = decode(a).reshape(-1, a.shape[-1]), decode(b)
    As = a_scale.double().numpy().reshape(A.shape[0], -1)
    Bs = np.repeat(b_scale.double().numpy(), bn, 0)[: B.shape[0]]
    out = np.zeros((A.shape[0], B.shape[0]))
    for kb in range(As.shape[1]):
        ks = slice(kb * bk, (kb + 1) * bk)
        out += (A[:, ks] @ B[:, ks].T) * As[:, kb:kb + 1] * Bs[:, kb][None, :]
    if bias is not None:
        out += bias.double().numpy()
    return activation(out, act)


def _to_dtype(a: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """fp32 values (float64 storage) rounded to nearest even in `dtype` (bf16, fp16, fp32), as float64."""
    return torch.from_numpy(np.ascontiguousarray(a)).to(dtype).double().numpy()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None = None, eps: float = 1e-6):
    """The contract's RMSNorm in float64, every operation rounded once to fp32: [..., H] -> (y as float64
    values of torch.promote_types(x.dtype, weight.dtype), new_residual as x's dtype or None).

    The sum of squares follows the contract's order: squares padded with zeros to a power of two, summed
    pairwise, neighbours first, level by level."""
    H = x.shape[-1]
    v = x.double().numpy().reshape(-1, H)
    new_residual = None
    if residual is not None:
        v = _to_dtype(f32(v + residual.double().numpy().reshape(-1, H)), x.dtype)
        new_residual = torch.from_numpy(v).to(x.dtype).reshape(x.shape)
    squares = f32(v * v)
    width = 1 << (H - 1).bit_length()
    level = np.concatenate([squares, np.zeros((v.shape[0], width - H))], axis=1)
    while level.shape[1] > 1:
        level = f32(level[:, ::2] + level[:, 1::2])
    mean_square = f32(level[:, 0] / H)
    with np.errstate(divide="ignore", invalid="ignore"):
        rstd = f32(1.0 / f32(np.sqrt(f32(mean_square + f32(eps)))))
        normed = _to_dtype(f32(v * rstd[:, None]), x.dtype)
    out_dtype = torch.promote_types(x.dtype, weight.dtype)
    with np.errstate(invalid="ignore"):
        y = _to_dtype(f32(weight.double().numpy()[None, :] * normed), out_dtype)
    return y.reshape(x.shape), new_residual


def silu_mul(gate_up: torch.Tensor) -> np.ndarray:
    """silu(gate)·up of [..., 2I] in float64 (no intermediate rounding): [..., I]."""
    g = gate_up.double().numpy()
    half = g.shape[-1] // 2
    with np.errstate(invalid="ignore"):
        return activation(g[..., :half], "silu") * g[..., half:]
def routed_rows(topk_ids: torch.Tensor, E: int, max_m: int | None = None) -> tuple[list[list[int]], list[int]]:
    """The routing, by plain loops: per expert, its (token, slot) pairs t·k + j in increasing order (at most
    max_m of them when given, the later ones dropped); and each expert's pair count before the drop. Ids
    outside 0..E-1 belong to no expert."""
    ids = topk_ids.tolist()
    k = len(ids[0]) if ids else 0
    per_expert = [[t * k + j for t, row in enumerate(ids) for j, e in enumerate(row) if e == x] for x in range(E)]
    counts = [len(p) for p in per_expert]
    return ([p[:max_m] for p in per_expert] if max_m is not None else per_expert), counts


def unpermute(y: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor) -> np.ndarray:
    """Σ_j w[t, j] · y[row of pair t·k + j] with every product and sum rounded to fp32, j in order, a pair in
    no row skipped: fp32 values [T, N] (float64 storage)."""
    T, k = weights.shape
    Y, W = y.double().numpy().reshape(-1, y.shape[-1]), weights.double().numpy()
    where = {p: s for s, p in enumerate(rows.reshape(-1).tolist()) if p >= 0}
    out = np.zeros((T, Y.shape[1]))
    for t in range(T):
        for j in range(k):
            if t * k + j in where:
                out[t] = f32(out[t] + f32(W[t, j] * Y[where[t * k + j]]))
    return out
