"""The linear stacks of `quantcore bench --stacks`: per model, the (in_features, out_features) of one
transformer layer's linears in the order the layer applies them, derived from the model's published
configuration (the Hugging Face config.json field names below), so that every shape can be checked
against its source. Plain data, no torch: the command line reads the names from here.

The projections are counted fused as serving engines load them (vLLM, SGLang): q, k and v as one qkv
linear, gate and up as one gate_up linear; a layer's other work (attention, RoPE, norms, SiLU·mul) is
left out, which is what a stack of bare linears measures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Linear:
    """One linear of a layer: its role and its [out_features, in_features] weight's sizes."""

    name: str
    in_features: int
    out_features: int


@dataclass(frozen=True)
class Stack:
    """A model layer's linears (`linears`, in order) and the model (`source`) whose config gives them."""

    name: str
    source: str
    linears: tuple[Linear, ...]

    def scaled(self, divisor: int) -> Stack:
        """The same stack with every size divided by `divisor`, rounded up: the CPU's tests time the
        real stacks' structure at sizes the reference backend runs in milliseconds."""
        def shrink(n: int) -> int:
            return math.ceil(n / divisor)
        return replace(self, linears=tuple(Linear(lin.name, shrink(lin.in_features), shrink(lin.out_features))
                                           for lin in self.linears))


def _gqa_attention(c: dict[str, int]) -> tuple[Linear, ...]:
    """Grouped-query attention's projections: qkv (q of heads × head_dim, k and v of kv_heads × head_dim
    each) and o (back to the hidden size)."""
    hidden, q = c["hidden_size"], c["num_attention_heads"] * c["head_dim"]
    kv = c["num_key_value_heads"] * c["head_dim"]
    return Linear("qkv", hidden, q + 2 * kv), Linear("o", q, hidden)


def _gated_mlp(c: dict[str, int]) -> tuple[Linear, ...]:
    """A gated (SwiGLU) MLP: gate_up (gate and up of intermediate_size each), down (back to the hidden size)."""
    hidden, inter = c["hidden_size"], c["intermediate_size"]
    return Linear("gate_up", hidden, 2 * inter), Linear("down", inter, hidden)


# meta-llama/Meta-Llama-3-8B config.json (it has no head_dim: hidden_size / num_attention_heads = 128).
LLAMA_3_8B = dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                  intermediate_size=14336)
# Qwen/Qwen3-8B and Qwen/Qwen3-14B config.json (head_dim 128 is given: 40 heads of it are 5120 in the 14B).
QWEN3_8B = dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                intermediate_size=12288)
QWEN3_14B = dict(hidden_size=5120, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
                 intermediate_size=17408)
# deepseek-ai/DeepSeek-V3 config.json. intermediate_size is the MLP of the first_k_dense_replace = 3 dense
# layers (the others are MoE layers of 2048-wide experts, which --stacks does not time).
DEEPSEEK_V3 = dict(hidden_size=7168, intermediate_size=18432, num_attention_heads=128, q_lora_rank=1536,
                   kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)


def _deepseek_mla(c: dict[str, int]) -> tuple[Linear, ...]:
    """DeepSeek-V3's multi-head latent attention projections, as its modeling code applies them
    without weight absorption: q_a_proj (hidden → q_lora_rank), q_b_proj (→ heads × (nope + rope) head
    dims), kv_a_proj_with_mqa (hidden → kv_lora_rank + the shared rope key), kv_b_proj (kv_lora_rank →
    heads × (nope key + value)), o_proj (heads × v_head_dim → hidden). Engines that fuse q_a and kv_a
    into one 7168 → 2112 linear (the op bench's 2112×7168 shape) read the same weights in one launch
    fewer; DeepSeek's own decode absorbs kv_b into the attention, reading its weight there instead."""
    heads, hidden = c["num_attention_heads"], c["hidden_size"]
    return (Linear("q_a", hidden, c["q_lora_rank"]),
            Linear("q_b", c["q_lora_rank"], heads * (c["qk_nope_head_dim"] + c["qk_rope_head_dim"])),
            Linear("kv_a", hidden, c["kv_lora_rank"] + c["qk_rope_head_dim"]),
            Linear("kv_b", c["kv_lora_rank"], heads * (c["qk_nope_head_dim"] + c["v_head_dim"])),
            Linear("o", heads * c["v_head_dim"], hidden))


STACKS: dict[str, Stack] = {s.name: s for s in (
    Stack("llama-3-8b", "meta-llama/Meta-Llama-3-8B", _gqa_attention(LLAMA_3_8B) + _gated_mlp(LLAMA_3_8B)),
    Stack("qwen3-8b", "Qwen/Qwen3-8B", _gqa_attention(QWEN3_8B) + _gated_mlp(QWEN3_8B)),
    Stack("qwen3-14b", "Qwen/Qwen3-14B", _gqa_attention(QWEN3_14B) + _gated_mlp(QWEN3_14B)),
    Stack("deepseek-v3-mlp", "deepseek-ai/DeepSeek-V3, a dense layer's MLP", _gated_mlp(DEEPSEEK_V3)),
    Stack("deepseek-v3-mla", "deepseek-ai/DeepSeek-V3, the attention (MLA) projections", _deepseek_mla(DEEPSEEK_V3)),
)}
