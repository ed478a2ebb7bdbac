"""One call of every built-in op in each format it is defined for: what the launch-contract test
and the binding tests (CPU, interpreter, GPU) run. A new op adds its call here."""

from __future__ import annotations

import torch

from helpers import randn
from quantcore import ops

QDTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "int8": torch.int8}
G_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "int32": torch.int32}


def call_of(op: str, fmt: str, device: str = "cpu", m: int = 2, n: int = 32, k: int = 512) -> tuple[tuple, dict]:
    """(args, kwargs) of a call of built-in `op` reading `fmt` on `device`: m rows, an [n, k] weight,
    128-wide blocks (k a multiple of 512 and n of 16, so that the cuBLAS variant can take the GEMM)."""
    gen = torch.Generator().manual_seed(0)
    x, w = randn((m, k), gen=gen, device=device), randn((n, k), gen=gen, device=device)
    if op == "dequant_bias":
        g = (torch.randint(-2**20, 2**20, (m, n), generator=gen, dtype=torch.int32).to(device) if fmt == "int32"
             else randn((m, n), gen=gen, device=device).to(G_DTYPES[fmt]))
        scales = torch.rand(m, generator=gen).to(device), torch.rand(n, generator=gen).to(device)
        return (g, *scales, randn((n,), gen=gen, device=device)), {}
    qdtype = QDTYPES[fmt]
    if op in ("act_quant", "weight_quant"):
        return ((x if op == "act_quant" else w),), dict(dtype=qdtype)
    q, s = ops.act_quant(x, dtype=qdtype, backend="torch")
    wq, ws = ops.weight_quant(w, dtype=qdtype, backend="torch")
    return {"act_dequant": (q, s), "weight_dequant": (wq, ws), "scaled_mm": (q, s, wq, ws),
            "quant_linear": (x, wq, ws), "quantized_gelu": (q, s)}[op], {}
