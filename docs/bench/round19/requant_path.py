"""Round-19 probe (H100): where the Gluon GEMM's re-quantized epilogue runs, now that the quantizer divides
through a reciprocal per group (`quant.divide`): in the consumers' registers (epi_rows=0) or staged through
the epilogue partition (epi_rows=8), on the default tile, FP8 and INT8 codes per 1×128, 4096 rows, the six
bench shapes; each timed interleaved with the plain GEMM scaled_mm picks (gpu_times_us: CUDA events, L2
flushed, median of 15), and the two outputs compared bit for bit.

Usage: PYTHONPATH=$PWD python3 docs/bench/round19/requant_path.py
"""
import dataclasses
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import epilogue_ab as E  # noqa: E402
from quantcore.bench.timing import gpu_times_us  # noqa: E402

gll = E.gll
print(torch.cuda.get_device_name(), E.capability.versions(), flush=True)
ratios = {}
for fname, fmt in E.FMTS.items():
    for N, K in E.SHAPES:
        a, a_s, w, w_s, bias = E.operands(E.M, N, K, fmt)
        plain = E.runner(None, a, a_s, w, w_s, bias, {})
        runs = {}
        for name, rows in (("registers", 0), ("staged", 8)):
            cfg = dataclasses.replace(gll.DEFAULT, epi_rows=rows)
            run = gll.scaled_mm.prepare(a, a_s, w, w_s, block_n=128, block_k=128, bias=None, activation=None,
                                        out_dtype=torch.bfloat16, out_quant=fmt, out_group=128, ue8m0_out=False,
                                        eps=1e-4, profile=E.profile, config=cfg)
            runs[name] = (lambda run=run: run(a, a_s, w, w_s, None))
        t = gpu_times_us([plain] + list(runs.values()))
        (qa, sa), (qb, sb) = (r() for r in runs.values())
        same = torch.equal(qa.view(torch.uint8), qb.view(torch.uint8)) and torch.equal(sa, sb)
        for name, tt in zip(runs, t[1:]):
            ratios.setdefault((fname, name), []).append(tt / t[0])
        print(f"{fname:4s} {E.M}x{N:5d}x{K:<5d} plain {t[0]:7.1f}  registers {t[1]:7.1f} ({t[1] / t[0]:.3f})  "
              f"staged {t[2]:7.1f} ({t[2] / t[0]:.3f})  same bits {same}", flush=True)
for (fname, name), v in ratios.items():
    print(f"{fname} {name}: geomean time / plain {math.exp(sum(map(math.log, v)) / len(v)):.3f}")
