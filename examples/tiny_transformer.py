"""A tiny decoder-only transformer, quantized with quantcore, generating with a KV cache.

The model is defined here (RMSNorm, rotary positions, multi-head attention with a KV cache, a GELU
MLP with biases) and initialised deterministically from a seed: nothing is downloaded. The script
builds it in bf16, quantizes a deep copy with `quantcore.nn.quantize_model` (every linear but the
output head), then reports

- the logits' relative Frobenius error and top-1 agreement of the quantized model against the bf16
  one, teacher-forced on the same random prompt batch;
- tokens/s of `generate` (batched, KV cache, Gumbel-max sampling) for both models;
- which quantcore implementation ran the quantized layers' ops.

    python3 examples/tiny_transformer.py                       # CPU: the torch reference
    python3 examples/tiny_transformer.py --device cuda --json tiny.json

A random model's next-token distribution is flat compared with a trained one's, so its top-1
agreement is a pessimistic figure: near-ties between the two largest logits are common.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

import quantcore
from quantcore.nn import QuantLinear, quantize_model


@dataclass(frozen=True)
class Config:
    """Model sizes. `max_batch` and `max_seq_len` size the KV cache."""

    vocab: int = 512
    dim: int = 256
    n_layers: int = 4
    n_heads: int = 4
    mlp_ratio: int = 4
    max_seq_len: int = 256
    max_batch: int = 8
    rope_theta: float = 10000.0


def rotations(cfg: Config, start_pos: int, length: int, device: torch.device) -> torch.Tensor:
    """Complex rotary rotations [length, head_dim/2] for positions start_pos.., in fp32.

    Computed per forward rather than held as a buffer, which `model.to(torch.bfloat16)` would cast."""
    head_dim = cfg.dim // cfg.n_heads
    freqs = 1.0 / cfg.rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
    positions = torch.arange(start_pos, start_pos + length, dtype=torch.float32, device=device)
    angles = torch.outer(positions, freqs)
    return torch.polar(torch.ones_like(angles), angles)


def apply_rotary(x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """x [B, S, H, D] rotated pairwise by rot [S, D/2], computed in fp32."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * rot[None, :, None, :]).flatten(3).to(x.dtype)


class Attention(nn.Module):
    """Multi-head attention whose keys and values are cached per position for incremental decoding."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.n_heads, self.head_dim = cfg.n_heads, cfg.dim // cfg.n_heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(cfg.dim, cfg.dim, bias=False) for _ in range(4))
        cache = (cfg.max_batch, cfg.max_seq_len, cfg.n_heads, self.head_dim)
        self.register_buffer("k_cache", torch.zeros(cache), persistent=False)
        self.register_buffer("v_cache", torch.zeros(cache), persistent=False)

    def forward(self, x: torch.Tensor, start_pos: int, rot: torch.Tensor) -> torch.Tensor:
        B, S, _ = x.shape
        end = start_pos + S
        q, k, v = (w(x).view(B, S, self.n_heads, self.head_dim) for w in (self.wq, self.wk, self.wv))
        q, k = apply_rotary(q, rot), apply_rotary(k, rot)
        self.k_cache[:B, start_pos:end] = k
        self.v_cache[:B, start_pos:end] = v
        keys, values = self.k_cache[:B, :end], self.v_cache[:B, :end]
        # Query i sits at position start_pos + i and sees every cached position up to its own.
        mask = torch.ones(S, end, dtype=torch.bool, device=x.device).tril(diagonal=start_pos)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                             attn_mask=mask)
        return self.wo(out.transpose(1, 2).reshape(B, S, -1))


class Block(nn.Module):
    """Pre-norm transformer block: attention, then a GELU MLP with biases."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.attn_norm, self.ffn_norm = nn.RMSNorm(cfg.dim, eps=1e-6), nn.RMSNorm(cfg.dim, eps=1e-6)
        self.attn = Attention(cfg)
        self.w1 = nn.Linear(cfg.dim, cfg.mlp_ratio * cfg.dim)
        self.w2 = nn.Linear(cfg.mlp_ratio * cfg.dim, cfg.dim)

    def forward(self, x: torch.Tensor, start_pos: int, rot: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), start_pos, rot)
        return x + self.w2(F.gelu(self.w1(self.ffn_norm(x))))


class Transformer(nn.Module):
    """tokens [B, S] int64 at positions start_pos.. -> logits [B, S, vocab] fp32."""

    def __init__(self, cfg: Config, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.dim, eps=1e-6)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        self._init(seed)

    @torch.no_grad()
    def _init(self, seed: int) -> None:
        # Variance-preserving init, residual branches scaled down with depth, so activations and
        # logits keep O(1) spread through the random network (a stand-in for trained weights).
        gen = torch.Generator(self.embed.weight.device).manual_seed(seed)  # built under `with torch.device(...)`
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.02, generator=gen)
            elif p.dim() == 2:
                std = 1.0 if name.startswith("embed") else p.shape[1] ** -0.5
                if name.endswith(("wo.weight", "w2.weight")):
                    std /= math.sqrt(2 * self.cfg.n_layers)
                p.normal_(0.0, std, generator=gen)

    def forward(self, tokens: torch.Tensor, start_pos: int = 0) -> torch.Tensor:
        rot = rotations(self.cfg, start_pos, tokens.shape[1], tokens.device)
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h, start_pos, rot)
        return self.lm_head(self.norm(h)).float()


def sample(logits: torch.Tensor, temperature: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Next tokens [B] from logits [B, V]: Gumbel-max sampling (argmax of p / E with E ~ Exp(1),
    equivalent to sampling from p), or greedy argmax at temperature 0."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits / temperature, dim=-1)
    return probs.div_(torch.empty_like(probs).exponential_(1, generator=generator)).argmax(dim=-1)


@torch.inference_mode()
def generate(model: Transformer, prompts: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """Continue prompts [B, P] (int64, one length for the batch) by max_new_tokens tokens.

    The prompt is run once (prefill), then one token per step against the KV cache. Returns the new
    tokens [B, max_new_tokens]."""
    B, P = prompts.shape
    cfg = model.cfg
    if B > cfg.max_batch or P + max_new_tokens > cfg.max_seq_len:
        raise ValueError(f"generate: batch {B} and length {P}+{max_new_tokens} exceed the cache "
                         f"({cfg.max_batch} sequences of {cfg.max_seq_len} positions)")
    out = torch.empty(B, max_new_tokens, dtype=torch.long, device=prompts.device)
    logits = model(prompts, 0)[:, -1]
    for i in range(max_new_tokens):
        out[:, i] = sample(logits, temperature, generator)
        if i + 1 < max_new_tokens:
            logits = model(out[:, i : i + 1], P + i)[:, -1]
    return out


@torch.inference_mode()
def fidelity(reference: Transformer, quantized: Transformer, tokens: torch.Tensor) -> dict[str, float]:
    """Teacher-forced comparison on tokens [B, T]: the logits' relative Frobenius error (float64) and the
    fraction of positions whose argmax agrees."""
    ref, out = reference(tokens, 0).double(), quantized(tokens, 0).double()
    return {
        "logits_rel_error": float((out - ref).norm() / ref.norm()),
        "top1_agreement": float((out.argmax(-1) == ref.argmax(-1)).double().mean()),
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def tokens_per_second(model: Transformer, prompts: torch.Tensor, new_tokens: int, temperature: float,
                      seed: int, repeats: int = 3) -> float:
    """Generated tokens per second of `generate` (prefill included), best of `repeats` after a warm-up."""
    device = prompts.device
    generate(model, prompts, min(new_tokens, 4), temperature, torch.Generator(device).manual_seed(seed))
    best = math.inf
    for _ in range(repeats):
        gen = torch.Generator(device).manual_seed(seed)
        _sync(device)
        start = time.perf_counter()
        generate(model, prompts, new_tokens, temperature, gen)
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return prompts.shape[0] * new_tokens / best


def implementations(layer: QuantLinear, rows: dict[str, int]) -> dict[str, dict[str, str]]:
    """Which quantcore implementation runs the layer's two ops, per phase (the choice may depend on
    the number of rows M: prefill has B·P rows, a decoding step B)."""
    found = {}
    for phase, m in rows.items():
        x = torch.randn(m, layer.in_features, dtype=torch.bfloat16, device=layer.weight.device)
        xq, xs = quantcore.ops.act_quant(x, dtype=layer.weight.dtype, group_size=layer.block_size[1])
        found[phase] = {
            "act_quant": quantcore.explain("act_quant", x, dtype=layer.weight.dtype,
                                           group_size=layer.block_size[1]).selected,
            "scaled_mm": quantcore.explain("scaled_mm", xq, xs, layer.weight, layer.weight_scale_inv,
                                           bias=layer.bias, block_size=layer.block_size).selected,
        }
    return found


def run(device: str = "cpu", dtype: str = "auto", tokens: int = 32, batch: int = 4, prompt_len: int = 32,
        temperature: float = 1.0, seed: int = 0, cfg: Config = Config()) -> dict:
    """Build, quantize, compare and time; returns the results as a JSON-ready dict."""
    dev = torch.device(device)
    reference = Transformer(cfg, seed).to(device=dev, dtype=torch.bfloat16).eval()
    quantized = quantize_model(copy.deepcopy(reference), dtype=dtype)
    prompts = torch.randint(0, cfg.vocab, (batch, prompt_len), generator=torch.Generator().manual_seed(seed + 1))
    prompts = prompts.to(dev)
    layer = next(m for m in quantized.modules() if isinstance(m, QuantLinear))
    result = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "quantcore": quantcore.__version__,
        "config": asdict(cfg),
        "dtype": str(layer.weight.dtype).removeprefix("torch."),
        "batch": batch, "prompt_len": prompt_len, "new_tokens": tokens, "temperature": temperature,
        "implementation": implementations(layer, {"prefill": batch * prompt_len, "decode": batch}),
        **fidelity(reference, quantized, prompts),
    }
    result["tokens_per_s"] = {name: tokens_per_second(m, prompts, tokens, temperature, seed)
                              for name, m in (("bf16", reference), ("quantized", quantized))}
    return result


def render(result: dict) -> str:
    """A short table of the results."""
    tps = result["tokens_per_s"]
    rows = [
        f"device {result['device']}, torch {result['torch']}, weights {result['dtype']}, "
        f"batch {result['batch']}, prompt {result['prompt_len']}, new tokens {result['new_tokens']}",
        *(f"{phase:<8} act_quant: {impl['act_quant']}, scaled_mm: {impl['scaled_mm']}"
          for phase, impl in result["implementation"].items()),
        f"{'logits rel. error':<22} {result['logits_rel_error']:.4f}",
        f"{'top-1 agreement':<22} {result['top1_agreement']:.3f}",
        f"{'tokens/s bf16':<22} {tps['bf16']:.1f}",
        f"{'tokens/s quantized':<22} {tps['quantized']:.1f}",
    ]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> dict:
    """Command line entry point; returns the results (also printed, and written with --json)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", default="auto", choices=("auto", "fp8", "int8"))
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per sequence")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=1.0, help="0: greedy")
    parser.add_argument("--dim", type=int, default=Config.dim, help="model width (hidden = 4 x dim)")
    parser.add_argument("--layers", type=int, default=Config.n_layers)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    cfg = Config(dim=args.dim, n_layers=args.layers, max_batch=max(args.batch, Config.max_batch),
                 max_seq_len=max(args.prompt_len + args.tokens, Config.max_seq_len))
    result = run(args.device, args.dtype, args.tokens, args.batch, args.prompt_len, args.temperature, args.seed, cfg)
    print(render(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
