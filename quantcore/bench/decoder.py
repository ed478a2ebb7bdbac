"""What `quantcore bench --e2e` times: a decoder-only transformer's decode step whose state lives in
device tensors, so that one step can be captured in a CUDA graph and replayed, and a stack of bare
linears of the same sizes.

The model's MLP is a GELU one with biases, or Llama's SwiGLU (a fused gate_up projection, SiLU-and-multiply,
the down projection, no biases). Its blocks are written as vLLM writes Llama's: the norm before the MLP adds
the attention's output to the residual itself where it can (`add_norm`), so that a quantized model whose
norms and SiLU-and-multiply are the fused producers (`quantize_model(..., fuse_norms=FUSED_NORMS,
fuse_silu_mul=FUSED_ACTS)`) runs each of them as one kernel writing the quantized activation.

The decode state (`DecodeState`) holds the token, the position as a one-element int64 tensor, and a
bf16 KV cache of a fixed number of positions per layer. A step writes its keys and values into the
cache with `index_copy_` at that position, attends over the whole cache with a mask built from the
position tensor, picks the next token greedily into the token buffer and advances the position in
place (wrapping at the cache's end): no host value changes between steps, so a captured step replays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from ..nn import QuantRMSNorm

DTYPE = torch.bfloat16
HEAD_DIM = 128  # the head size of Llama-class models; smaller models get the largest divisor of dim
MLPS = ("gelu", "swiglu")
# What a quantized model's fused producers replace (`quantcore.nn.quantize_model` patterns): the norms
# before the attention and the MLP, whose outputs only quantized linears read, and SwiGLU's activation.
FUSED_NORMS = ("attn_norm", "ffn_norm")
FUSED_ACTS = ("act",)


def head_dim(dim: int) -> int:
    """Head size for a model width: 128 where it divides dim, else the largest power of two that does."""
    return math.gcd(dim, HEAD_DIM)


def _linear(n_in: int, n_out: int, bias: bool, device: torch.device) -> nn.Linear:
    layer = nn.Linear(n_in, n_out, bias=bias, device=device, dtype=DTYPE)
    # Variance-preserving weights keep activations O(1) through the stack (a stand-in for trained
    # weights): the default init shrinks them ~√3 per layer, to where the quantizers' eps floors them.
    nn.init.normal_(layer.weight, std=n_in ** -0.5)
    if bias:
        nn.init.normal_(layer.bias, std=0.02)
    return layer


@dataclass
class DecodeState:
    """The device tensors a decode step reads and updates in place: `tok` [B, 1] int64, `pos` [1]
    int64, per layer a (keys, values) cache [B, context, heads, head_dim] bf16."""

    tok: torch.Tensor
    pos: torch.Tensor
    caches: list[tuple[torch.Tensor, torch.Tensor]]
    positions: torch.Tensor  # arange(context): the mask is positions <= pos
    inv_freq: torch.Tensor  # rotary frequencies [head_dim / 2], fp32

    @classmethod
    def new(cls, model: DecodeModel, batch: int, context: int) -> DecodeState:
        """Zeroed state for `batch` sequences of `context` cached positions, on the model's device."""
        dev = model.lm_head.weight.device
        shape = (batch, context, model.heads, model.head_dim)
        return cls(tok=torch.zeros(batch, 1, dtype=torch.long, device=dev),
                   pos=torch.zeros(1, dtype=torch.long, device=dev),
                   caches=[(torch.zeros(shape, dtype=DTYPE, device=dev), torch.zeros(shape, dtype=DTYPE, device=dev))
                           for _ in model.layers],
                   positions=torch.arange(context, device=dev),
                   inv_freq=1.0 / 10000.0 ** (torch.arange(0, model.head_dim, 2, device=dev) / model.head_dim))

    def cache_bytes(self) -> int:
        """Bytes of KV cache a step reads (attention reads every cached position)."""
        return sum(k.nbytes + v.nbytes for k, v in self.caches)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).to(x.dtype)


class _Attention(nn.Module):
    def __init__(self, dim: int, device: torch.device):
        super().__init__()
        self.head_dim = head_dim(dim)
        self.heads = dim // self.head_dim
        self.wq, self.wk, self.wv, self.wo = (_linear(dim, dim, False, device) for _ in range(4))

    def forward(self, x, pos, cos, sin, mask, cache):
        batch = cache[0].shape[0]  # x may be a quantized pair, which QuantLinear takes but has no shape
        q, k, v = (w(x).view(batch, 1, self.heads, self.head_dim) for w in (self.wq, self.wk, self.wv))
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        keys, values = cache
        keys.index_copy_(1, pos, k)
        values.index_copy_(1, pos, v)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                             attn_mask=mask)
        return self.wo(out.transpose(1, 2).reshape(batch, 1, -1))


class SiLUMul(nn.Module):
    """Llama's `act_fn(gate) * up` of a fused gate_up projection's output [..., 2I], in its dtype."""

    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


def add_norm(norm: nn.Module, h: torch.Tensor, residual: torch.Tensor):
    """(norm(residual + h), residual + h): one fused call where `norm` adds the residual itself
    (QuantRMSNorm, as vLLM's fused_add_rms_norm), else the add and the norm; the same sum either way."""
    if isinstance(norm, QuantRMSNorm):
        return norm(h, residual)
    residual = residual + h
    return norm(residual), residual


class _Block(nn.Module):
    """Pre-norm block: attention (q, k, v, o without bias), then an MLP: GELU, dim → hidden → dim with
    biases, or SwiGLU, dim → 2·hidden (gate and up) → SiLU(gate)·up → dim without."""

    def __init__(self, dim: int, hidden: int, device: torch.device, mlp: str = "gelu"):
        super().__init__()
        self.attn_norm = nn.RMSNorm(dim, eps=1e-6, device=device, dtype=DTYPE)
        self.ffn_norm = nn.RMSNorm(dim, eps=1e-6, device=device, dtype=DTYPE)
        self.attn = _Attention(dim, device)
        swiglu = mlp == "swiglu"
        self.w1 = _linear(dim, 2 * hidden if swiglu else hidden, not swiglu, device)
        self.act = SiLUMul() if swiglu else nn.GELU()
        self.w2 = _linear(hidden, dim, not swiglu, device)

    def forward(self, x, pos, cos, sin, mask, cache):
        normed, x = add_norm(self.ffn_norm, self.attn(self.attn_norm(x), pos, cos, sin, mask, cache), x)
        return x + self.w2(self.act(self.w1(normed)))


class DecodeModel(nn.Module):
    """A bf16 decoder-only transformer (RMSNorm, rotary positions, multi-head attention, a GELU or SwiGLU
    MLP of hidden size 4·dim: `mlp`), one token per sequence per call; the output head is `lm_head`."""

    def __init__(self, dim: int, layers: int, vocab: int, device: torch.device, mlp: str = "gelu"):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, device=device, dtype=DTYPE)
        self.layers = nn.ModuleList(_Block(dim, 4 * dim, device, mlp) for _ in range(layers))
        self.norm = nn.RMSNorm(dim, eps=1e-6, device=device, dtype=DTYPE)
        self.lm_head = _linear(dim, vocab, False, device)
        self.head_dim = head_dim(dim)
        self.heads = dim // self.head_dim
        self.requires_grad_(False)

    def forward(self, state: DecodeState) -> torch.Tensor:
        """Logits [B, vocab] of the tokens `state.tok` at position `state.pos`; fills the KV cache there."""
        angles = state.pos.float()[:, None] * state.inv_freq  # [1, head_dim / 2]
        cos, sin = angles.cos().view(1, 1, 1, -1), angles.sin().view(1, 1, 1, -1)
        mask = (state.positions <= state.pos).view(1, 1, 1, -1)  # the cache up to this step's position
        h = self.embed(state.tok)
        for layer, cache in zip(self.layers, state.caches):
            h = layer(h, state.pos, cos, sin, mask, cache)
        return self.lm_head(self.norm(h))[:, -1]


def decode_step(model: DecodeModel, state: DecodeState) -> torch.Tensor:
    """One greedy decode step, all on the device: logits, next token into `state.tok`, position + 1
    (wrapping at the end of the cache, which keeps its size and so the step's cost fixed)."""
    logits = model(state)
    state.tok.copy_(logits.argmax(dim=-1, keepdim=True))
    state.pos.add_(1).remainder_(state.positions.numel())
    return logits


def linears(shapes: Iterable[tuple[int, int]], device: torch.device) -> list[nn.Linear]:
    """bf16 linears without bias of these (in_features, out_features), in order, initialized as the
    model's are (variance-preserving weights)."""
    return [_linear(i, o, False, device) for i, o in shapes]


def linear_stack(dim: int, layers: int, device: torch.device) -> nn.Sequential:
    """`layers` × 6 bf16 linears without bias, applied in sequence with nothing between them:
    4 of dim → dim (a layer's q, k, v, o), then dim → 4·dim (up) and 4·dim → dim (down)."""
    shapes = [(dim, dim)] * 4 + [(dim, 4 * dim), (4 * dim, dim)]
    return nn.Sequential(*linears(shapes * layers, device)).requires_grad_(False)
