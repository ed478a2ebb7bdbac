"""Round-15 probe (H100): the decode GEMM's programs per SM ("waves" of the sm_90 table's decode rules).

ncu on quant_linear at 1×4096×16384 FP8 (`decode_ncu.py`, `ncu_decode_4096_16384.txt`) showed 256
programs of 4 warps (achieved occupancy 12 % of a theoretical 44 %), DRAM at 65 %, and the warps
stalled on the activation's load and the quantization's cross-warp amax, K block after K block: the
weight stream waits on a per-block latency chain that more programs per SM would overlap. Variants
scale every decode rule's `waves` (and so its K split) by a factor; "r0" also lets the first rule
(N 7168-8192, K <= 2048, unsplit before) split to 4 K blocks. In a CUDA graph, chains of 16 calls on
16 distinct weights of one shape: µs per call, ROUNDS interleaved rounds, median; quant_linear at
M = 1 and 4 (the activation quantized in the kernel), scaled_mm at M = 16 (codes). Each variant's
quant_linear is checked bit for bit against its own act_quant + scaled_mm.

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round15/waves_probe.py [variants] [rounds]
"""
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from quantcore import capability, ops, registry
from quantcore.backends.triton import configs
from quantcore.bench.timing import copy_bandwidth_gbps, loop_us

VARIANTS = (sys.argv[1] if len(sys.argv) > 1 else "1,1.5,2,3,4,2r0").split(",")
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
dev = torch.device("cuda")
SHIPPED = configs._DIR
DIRS = {}
for v in VARIANTS:
    d = Path(tempfile.mkdtemp())
    for f in SHIPPED.glob("*.json"):
        shutil.copy(f, d)
    table = json.loads((SHIPPED / "sm_90.json").read_text())
    factor = float(v.rstrip("r0"))
    for i, rule in enumerate(table["decode"]["rules"]):
        rule["waves"] = rule["waves"] * factor
        if v.endswith("r0") and i == 0:
            rule["min_kb_per_split"] = 4
    (d / "sm_90.json").write_text(json.dumps(table))
    DIRS[v] = d


def use(v):
    configs._DIR = DIRS[v]
    registry.reset()


def capture(step):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


print(torch.cuda.get_device_name(), torch.__version__, capability.versions(), flush=True)
gbps = copy_bandwidth_gbps()
print(f"copy {gbps:.0f} GB/s", flush=True)
SHAPES = ((4096, 4096), (16384, 4096), (4096, 16384), (2112, 7168), (7168, 2048), (24576, 1536), (32768, 512),
          (7168, 16384))
CASES = [("fp8", 1, "ql"), ("int8", 1, "ql"), ("fp8", 4, "ql"), ("fp8", 16, "mm")]
DT = {"fp8": torch.float8_e4m3fn, "int8": torch.int8}
gen = torch.Generator(dev).manual_seed(0)
weights = {(q, n, k): [ops.weight_quant(torch.randn(n, k, device=dev, dtype=torch.bfloat16, generator=gen) * 0.05,
                                        dtype=d) for _ in range(16)]
           for q, d in DT.items() for n, k in SHAPES}
times, bad = {}, []
with torch.inference_mode():
    for r in range(ROUNDS):
        for v in VARIANTS:
            use(v)
            for q, m, op in CASES:
                for n, k in SHAPES:
                    ws = weights[(q, n, k)]
                    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16, generator=gen)
                    if op == "ql":
                        if r == 0:
                            a, a_s = ops.act_quant(x, dtype=DT[q])
                            if not torch.equal(ops.quant_linear(x, *ws[0]), ops.scaled_mm(a, a_s, *ws[0])):
                                bad.append((v, q, m, n, k))
                        step = lambda: [ops.quant_linear(x, w, s) for w, s in ws]
                    else:
                        a, a_s = ops.act_quant(x, dtype=DT[q])
                        step = lambda: [ops.scaled_mm(a, a_s, w, s) for w, s in ws]
                    g = capture(step)
                    times.setdefault((q, m, op, n, k), {}).setdefault(v, []).append(loop_us(g.replay, 32) / 16)
                    del g
        print(f"round {r} done", flush=True)
    print("\n| case | floor | " + " | ".join(VARIANTS) + " | shipped / best |")
    print("|---|---|" + "---|" * (len(VARIANTS) + 1))
    geo = {v: [] for v in VARIANTS}
    for (q, m, op, n, k), per in times.items():
        med = {v: statistics.median(t) for v, t in per.items()}
        floor = (n * k + m * k * 2 + m * n * 2) / gbps / 1e3
        for v in VARIANTS:
            geo[v].append(med[VARIANTS[0]] / med[v])
        print(f"| {q} {op} {m}x{n}x{k} | {floor:.1f} | " + " | ".join(f"{med[v]:.1f}" for v in VARIANTS)
              + f" | {med[VARIANTS[0]] / min(med.values()):.3f} |")
    print("geomean shipped / variant: " + ", ".join(
        f"{v} {statistics.geometric_mean(g):.3f}" for v, g in geo.items()))
    print("quant_linear == act_quant + scaled_mm:", "all" if not bad else bad)
configs._DIR = SHIPPED
