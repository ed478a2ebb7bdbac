"""Reference routing of mixture-of-experts layers: the permute (a stable sort of the (token, slot) pairs by
expert, each token quantized once by the reference `act_quant` and copied to its rows) and the un-permute
(the weighted sum in slot order). The GPU kernels compute the same bits; this one may synchronize.

Rows that hold no pair (masked slabs past an expert's count, the contiguous tail after dropped pairs) are
zeros here, scales included, with rows = -1; the kernels leave their codes and scales unwritten.
"""

from __future__ import annotations

import math

import torch

from .quant import act_quant

_I32 = torch.int32


def _sorted_pairs(topk_ids: torch.Tensor, E: int):
    """(expert of each pair [P] int64, with E for a dropped pair, the pairs in sorted order [P], each expert's
    pair count [E] int64, where sorted pair i begins its expert's run: the expert's first position [P])."""
    flat = topk_ids.reshape(-1).to(torch.int64)
    expert = torch.where((flat >= 0) & (flat < E), flat, E)  # an id outside 0..E-1 is dropped: sorted last
    order = torch.sort(expert, stable=True).indices  # stable: token order t·k + j within an expert
    counts = torch.zeros(E + 1, dtype=torch.int64, device=flat.device).scatter_add_(0, expert, torch.ones_like(expert))
    starts = torch.cumsum(counts, 0) - counts
    return expert, order, counts[:E], starts


def _quantized_tokens(x, *, qdtype, group_size, ue8m0, eps):
    return act_quant(x, qdtype=qdtype, group_size=group_size, ue8m0=ue8m0, eps=eps, scale_m_major=False)


@torch.no_grad()
def moe_permute(x, topk_ids, *, num_experts, qdtype, group_size, ue8m0, eps, profile=None):
    """x [T, H] float, topk_ids [T, k] int -> (a_q [T·k, H] qdtype, a_scale [T·k, ceil(H/G)] fp32,
    expert_offsets int32 [E + 1], rows int32 [T·k]): the pairs sorted by expert (stable), each token's
    codes and scales copied to its rows; a pair whose id is outside 0..E-1 gets no row."""
    T, H = x.shape
    E, P = num_experts, topk_ids.numel()
    q, s = _quantized_tokens(x, qdtype=qdtype, group_size=group_size, ue8m0=ue8m0, eps=eps)
    expert, order, counts, _ = _sorted_pairs(topk_ids, E)
    kept = int(counts.sum())
    pairs = order[:kept]  # the dropped pairs sort after every expert's
    tokens = pairs // topk_ids.shape[1]
    a_q = torch.zeros(P, H, dtype=qdtype, device=x.device)
    a_s = torch.zeros(P, math.ceil(H / group_size), dtype=torch.float32, device=x.device)
    rows = torch.full((P,), -1, dtype=_I32, device=x.device)
    a_q[:kept], a_s[:kept], rows[:kept] = q[tokens], s[tokens], pairs.to(_I32)
    offsets = torch.zeros(E + 1, dtype=_I32, device=x.device)
    offsets[1:] = torch.cumsum(counts, 0).to(_I32)
    return a_q, a_s, offsets, rows


@torch.no_grad()
def moe_permute_masked(x, topk_ids, *, num_experts, max_m, qdtype, group_size, ue8m0, eps, profile=None):
    """x [T, H] float, topk_ids [T, k] int -> (a_q [E, max_m, H] qdtype, a_scale [E, max_m, ceil(H/G)] fp32,
    masked_m int32 [E], rows int32 [E, max_m]): expert e's pairs in token order in its first rows, those past
    max_m dropped (masked_m = min(count, max_m)), rows = -1 in the rows left over."""
    T, H = x.shape
    E = num_experts
    q, s = _quantized_tokens(x, qdtype=qdtype, group_size=group_size, ue8m0=ue8m0, eps=eps)
    expert, order, counts, starts = _sorted_pairs(topk_ids, E)
    sorted_expert = expert[order]
    rank = torch.arange(order.numel(), device=x.device) - starts[sorted_expert]
    live = (sorted_expert < E) & (rank < max_m)
    pairs, slots = order[live], (sorted_expert * max_m + rank)[live]
    tokens = pairs // topk_ids.shape[1]
    a_q = torch.zeros(E * max_m, H, dtype=qdtype, device=x.device)
    a_s = torch.zeros(E * max_m, math.ceil(H / group_size), dtype=torch.float32, device=x.device)
    rows = torch.full((E * max_m,), -1, dtype=_I32, device=x.device)
    a_q[slots], a_s[slots], rows[slots] = q[tokens], s[tokens], pairs.to(_I32)
    return (a_q.view(E, max_m, H), a_s.view(E, max_m, -1), torch.clamp(counts, max=max_m).to(_I32),
            rows.view(E, max_m))


@torch.no_grad()
def moe_unpermute(y, rows, topk_weights, *, out_dtype, profile=None):
    """y [R, N] float (either layout's rows, flattened), rows int32 [R], topk_weights [T, k] float -> out [T, N]
    out_dtype: out[t] = Σ_j fp32(w[t, j]) · fp32(y[row of t·k + j]) in fp32, j in order, each product rounded
    to fp32 and then added (no fused multiply-add); a pair in no row adds nothing, not even a zero."""
    T, k = topk_weights.shape
    N = y.shape[1]
    pairs = T * k
    valid = (rows >= 0) & (rows < pairs)
    source = torch.full((pairs,), -1, dtype=torch.int64, device=y.device)
    source[rows[valid].long()] = torch.arange(rows.numel(), device=y.device)[valid]
    source = source.view(T, k)
    weights, acc = topk_weights.float(), torch.zeros(T, N, dtype=torch.float32, device=y.device)
    if y.shape[0] == 0:  # no row holds a pair
        return acc.to(out_dtype)
    for j in range(k):
        s = source[:, j]
        term = weights[:, j:j + 1] * y[s.clamp(min=0)].float()
        acc = torch.where((s >= 0)[:, None], acc + term, acc)
    return acc.to(out_dtype)
