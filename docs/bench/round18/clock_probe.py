"""Issue 14: does the Gluon GEMM run at a lower SM clock than cuBLAS's block-wise kernel under the H100's
700 W power cap (round 16 saw the clock between 1230 and 1980 MHz)? Per shape, each implementation runs
back to back for PHASE seconds, alternating, twice, while `nvidia-smi` samples the SM clock and the power
draw every 50 ms; per phase: the median clock and power of the samples inside it (the first 0.5 s
dropped), the time per call (host clock over the loop, one synchronize) and the energy per call.

Usage: python3 clock_probe.py OUT_DIR   (writes OUT_DIR/smi_clock.csv, prints one line per phase)
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

import torch

from quantcore import capability, ops
from quantcore.backends.triton import gluon_launch as gl
from quantcore.bench import baselines

PHASE = 3.0
PROFILE = capability.profile_for("cuda")
out_dir = sys.argv[1]
smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu",
                        "--format=csv,noheader,nounits", "-lms", "50", "-f", f"{out_dir}/smi_clock.csv"])
phases = []  # (shape, name, start, end, us per call)
try:
    for m, n, k in ((4096, 7168, 16384), (4096, 32768, 512), (16384, 24576, 1536)):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        a, a_s = ops.act_quant(x)
        b, b_s = ops.weight_quant(torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
        run = gl.scaled_mm.prepare(a, a_s, b, b_s, block_n=128, block_k=128, bias=None, activation=None,
                                   out_dtype=torch.bfloat16, out_quant=None, out_group=128, ue8m0_out=False, eps=1e-4,
                                   profile=PROFILE, config=gl.config_for(m, n, 128, None))
        fns = {"gluon": lambda run=run: run(a, a_s, b, b_s), "cublas": baselines.cublas_blockwise_fp8(a, a_s, b, b_s)}
        for fn in fns.values():
            fn()
        torch.cuda.synchronize()
        for _ in range(2):
            for name, fn in fns.items():
                start, calls = time.time(), 0
                while time.time() - start < PHASE:
                    for _ in range(20):
                        fn()
                    calls += 20
                    torch.cuda.synchronize()
                end = time.time()
                phases.append((f"{m}x{n}x{k}", name, start, end, (end - start) / calls * 1e6))
        del a, b, x
        torch.cuda.empty_cache()
finally:
    time.sleep(0.2)
    smi.terminate()
    smi.wait()


def _stamp(text: str) -> float:
    return time.mktime(time.strptime(text.split(".")[0], "%Y/%m/%d %H:%M:%S")) + float("0." + text.split(".")[1])


samples = []
for line in open(f"{out_dir}/smi_clock.csv"):
    parts = [p.strip() for p in line.split(",")]
    try:
        samples.append((_stamp(parts[0]), float(parts[1]), float(parts[2]), float(parts[3])))
    except (ValueError, IndexError):
        continue
print(f"{'shape':18s} {'impl':7s} {'us/call':>8s} {'SM MHz':>7s} {'W':>6s} {'mJ/call':>8s} {'degC':>5s} samples")
for shape, name, start, end, us in phases:
    inside = [s for s in samples if start + 0.5 <= s[0] <= end]
    if not inside:
        print(f"{shape:18s} {name:7s} {us:8.1f}  (no samples)")
        continue
    clock, power, temp = (statistics.median(s[i] for s in inside) for i in (1, 2, 3))
    print(f"{shape:18s} {name:7s} {us:8.1f} {clock:7.0f} {power:6.0f} {power * us / 1e3:8.2f} {temp:5.0f} {len(inside)}")
