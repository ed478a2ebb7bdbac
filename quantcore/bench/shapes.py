"""The benchmark's shape sets (issue: DeepSeek-V3 GEMMs, seed 002's epilogue shapes, weight quantization), and
the routed experts of the mixture-of-experts models `quantcore bench --moe` times. Plain data: the command
line reads the names from here without importing torch.

The GEMM rows M = 1, 4, 16 and 64 are decode batches: the summary judges them against the memory floor."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

# The ops the bench measures (quant_linear is act_quant + scaled_mm, measured as those).
OPS = ("act_quant", "act_dequant", "quantized_gelu", "weight_quant", "weight_dequant", "dequant_bias", "scaled_mm",
       "rms_norm_quant", "silu_mul_quant")

DEEPSEEK_M = (1, 4, 16, 64, 128, 512, 4096, 16384)
DECODE_M = 64  # GEMMs of at most this many rows are judged against the memory floor, the read ceiling and bf16
READ_CEILING = "read-ceiling"  # the decode GEMM rows' record of a kernel that only reads the GEMM's bytes
DEEPSEEK_NK = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048))
EPILOGUE_N = (2560, 3840, 13824)
EPILOGUE_M = (1, 16, 256, 4096, 65536)
ACT_K = (7168, 2048)
ACT_M = (1, 128, 4096, 16384)
WEIGHT_NK = ((7168, 16384), (2112, 7168), (24576, 1536))
# The fused producers: decode to prefill rows; Llama-3-8B's and DeepSeek-V3's hidden sizes for the norm, and
# the MLP widths I of Llama-3-8B (14336), DeepSeek-V3's dense layers (18432) and its experts (2048).
PRODUCER_M = (1, 4, 16, 128, 1024, 4096, 16384)
NORM_H = (4096, 7168)
GATED_I = (14336, 18432, 2048)

QUICK = {  # a small set for a first look (`quantcore bench --quick`)
    "gemm": [(m, n, k) for m in (1, 128, 4096) for n, k in ((2112, 7168), (7168, 2048))],
    "act": [(m, 7168) for m in (1, 4096, 16384)],
    "weight": [(7168, 16384)],
    "epilogue": [(m, n) for m in (1, 4096, 65536) for n in (3840,)],
    "norm": [(m, 7168) for m in (1, 4096, 16384)],
    "gated": [(m, 14336) for m in (1, 4096, 16384)],
}
FULL = {
    "gemm": [(m, n, k) for m in DEEPSEEK_M for n, k in DEEPSEEK_NK],
    "act": [(m, k) for m in ACT_M for k in ACT_K],
    "weight": list(WEIGHT_NK),
    "epilogue": [(m, n) for m in EPILOGUE_M for n in EPILOGUE_N],
    "norm": [(m, h) for m in PRODUCER_M for h in NORM_H],
    "gated": [(m, i) for m in PRODUCER_M for i in GATED_I],
}


@dataclass(frozen=True)
class MoEShape:
    """A model's routed experts: hidden size H, expert width I, E experts, top-k per token."""

    name: str
    source: str
    hidden: int
    inter: int
    experts: int
    top_k: int

    def scaled(self, divisor: int) -> MoEShape:
        """Every size divided by `divisor` (H and I rounded up to whole 128 blocks, E and k up): the CPU's
        tests run the structure at sizes the reference computes in milliseconds."""
        def blocks(n: int) -> int:
            return max(128, 128 * math.ceil(n / divisor / 128))
        experts = max(2, math.ceil(self.experts / divisor))
        return replace(self, hidden=blocks(self.hidden), inter=blocks(self.inter), experts=experts,
                       top_k=min(self.top_k, experts))


MOE_MODELS = {
    "deepseek-v3": MoEShape("deepseek-v3", "deepseek-ai/DeepSeek-V3 config.json: hidden_size 7168, "
                            "moe_intermediate_size 2048, n_routed_experts 256, num_experts_per_tok 8",
                            7168, 2048, 256, 8),
    "qwen3-30b-a3b": MoEShape("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B config.json: hidden_size 2048, "
                              "moe_intermediate_size 768, num_experts 128, num_experts_per_tok 8", 2048, 768, 128, 8),
}
ROUTINGS = ("uniform", "zipf")
MOE_TOKENS = (1, 8, 64, 512, 4096, 16384)
