"""Round-22 probe (H100): which tile a re-quantized output (groups of 128, fp32 scales) should take now that its
epilogue is lighter. Round 21 measured FP8 re-quantized outputs slower on 128×256 than on the default 128×128
tile at K ≤ 2048 (`gluon_launch.SPANNING_FP8_K`), and N = 2112, which no wide tile fills exactly, takes the
default tile. Per format, PROBE_M rows (default 4096) and bench shape: the plain GEMM on the tile it picks,
the re-quantized output on the default tile and on 128×256 in 64-column sub-tiles (a partial last column
tile where N is not a multiple of 256), timed interleaved (CUDA events, L2 flushed, median of 15), with
the two re-quantized outputs' bits compared.

Usage (repository root): PYTHONPATH=.:docs/bench/round9 python3 docs/bench/round22/tile_probe.py
"""
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "round9"))
from gluon_staged import FMTS, SHAPES, gll, operands, profile  # noqa: E402

from quantcore import capability  # noqa: E402
from quantcore.bench.timing import gpu_times_us  # noqa: E402

M = int(os.environ.get("PROBE_M", 4096))
print(torch.cuda.get_device_name(), capability.versions(), "M", M, flush=True)
print("fmt  N     K      plain us  rq default us  rq 128x256 us  default/plain  128x256/plain  same bits", flush=True)
for fname, fmt in FMTS.items():
    for N, K in SHAPES:
        a, a_s, w, w_s, _ = operands(M, N, K, fmt)
        runs = []
        for cfg, quant in ((None, None), (gll.DEFAULT, fmt), (gll.WIDE[0], fmt)):
            run = gll.scaled_mm.prepare(a, a_s, w, w_s, block_n=128, block_k=128, bias=None, activation=None,
                                        out_dtype=torch.bfloat16, out_quant=quant, out_group=128, ue8m0_out=False,
                                        eps=1e-4, profile=profile, config=cfg)
            runs.append(lambda run=run: run(a, a_s, w, w_s, None))
        outs = [runs[1](), runs[2]()]
        same = all(torch.equal(x.view(torch.uint8), y.view(torch.uint8)) for x, y in zip(*outs))
        t = gpu_times_us(runs)
        print(f"{fname:4s} {N:5d} {K:5d}  {t[0]:8.1f}  {t[1]:13.1f}  {t[2]:13.1f}  {t[1] / t[0]:13.3f}  "
              f"{t[2] / t[0]:13.3f}  {'yes' if same else 'NO'}", flush=True)
