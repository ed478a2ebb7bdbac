"""Round-23 probe (H100): the plain Gluon GEMM (config_for's tile, bf16 output) of the tree on PYTHONPATH, timed
interleaved with cuBLAS block-wise FP8 (`torch._scaled_mm`) or, for INT8, `torch._int_mm` (which does no
scaling), on the six bench shapes at PROBE_MS rows (default 512,4096,16384), with a checksum of the output's
bits; one JSON line per case. Two trees run alternately by processes on one machine (`cublas_ab.sh`) give a
before/after of the Gluon GEMM and of its ratio to the baseline timed beside it.

Usage: PYTHONPATH=<tree> python3 docs/bench/round23/cublas_ab.py TAG >> out.jsonl; PROBE_FMTS=fp8 (or int8)
times one format only.
"""
import json
import os
import sys

import torch

from quantcore import capability, ops
from quantcore.backends.triton import gluon_launch as gl
from quantcore.bench import baselines, timing
from quantcore.bench.shapes import DEEPSEEK_NK

TAG = sys.argv[1]
PROFILE = capability.profile_for("cuda")
FMTS = {"fp8": torch.float8_e4m3fn, "int8": torch.int8}
MS = [int(m) for m in os.environ.get("PROBE_MS", "512,4096,16384").split(",")]


def checksum(bits: torch.Tensor) -> int:
    """A position-weighted sum of the output's 16-bit words, on the GPU."""
    flat = bits.reshape(-1).to(torch.int64)
    return int((flat * (torch.arange(flat.numel(), device=flat.device) % 65521 + 1)).sum())


for fmt in os.environ.get("PROBE_FMTS", "fp8,int8").split(","):
    for m in MS:
        for n, k in DEEPSEEK_NK:
            g = torch.Generator(device="cuda").manual_seed(m + n + k)
            a, a_s = ops.act_quant(torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g), dtype=FMTS[fmt])
            b, b_s = ops.weight_quant(torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g),
                                      dtype=FMTS[fmt])
            cfg = gl.config_for(m, n, k, 128, None)
            run = gl.scaled_mm.prepare(a, a_s, b, b_s, block_n=128, block_k=128, bias=None, activation=None,
                                       out_dtype=torch.bfloat16, out_quant=None, out_group=128, ue8m0_out=False,
                                       eps=1e-4, profile=PROFILE, config=cfg)
            ours = lambda: run(a, a_s, b, b_s)  # noqa: E731
            base = baselines.cublas_blockwise_fp8(a, a_s, b, b_s) if fmt == "fp8" else baselines.int_mm(a, b)
            us, base_us = timing.gpu_times_us([ours, base])
            print(json.dumps(dict(tag=TAG, fmt=fmt, m=m, n=n, k=k, tile=f"{cfg.block_m}x{cfg.block_n}", us=us,
                                  base_us=base_us, bits=checksum(ours().view(torch.int16)))), flush=True)
            del a, b
            torch.cuda.empty_cache()
