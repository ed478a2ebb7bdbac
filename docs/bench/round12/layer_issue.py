"""Round-12 probe (H100): the host's issue time of one layer call, without the GPU's: a loop of 200 calls
after a synchronize, the clock stopped before the final synchronize (200 launches stay within the
launch queue, so the host never waits for the GPU); median of 7 interleaved rounds, µs per call.
bf16 nn.Linear against QuantLinear (FP8, INT8) with this tree's tables ("one") and without the 128-row
once rule ("two"), at 64 and 128 rows, on the decode model's three layer shapes ([M, 1, K] inputs).

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round12/layer_issue.py
"""
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from quantcore import capability, registry
from quantcore import nn as qnn
from quantcore.backends.triton import configs
from quantcore.bench import decoder

dev = torch.device("cuda")
SHIPPED = configs._DIR
TWO = Path(tempfile.mkdtemp())
for f in SHIPPED.glob("*.json"):
    shutil.copy(f, TWO)
table = json.loads((SHIPPED / "sm_90.json").read_text())
table["decode"]["fused"] = [r for r in table["decode"]["fused"] if r["m_max"] <= table["decode"]["m_max"]]
(TWO / "sm_90.json").write_text(json.dumps(table))


def issue_us(fn, n=200):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


print(torch.cuda.get_device_name(), torch.__version__, capability.versions(), flush=True)
with torch.inference_mode():
    for N, K, bias in ((4096, 4096, False), (16384, 4096, True), (4096, 16384, True)):
        torch.manual_seed(0)
        lin = decoder._linear(K, N, bias, dev)
        layers = {"bf16": lin, **{q: qnn.QuantLinear.from_linear(lin, dtype=d)
                                  for q, d in (("fp8", torch.float8_e4m3fn), ("int8", torch.int8))}}
        for M in (64, 128):
            x = torch.randn(M, 1, K, device=dev, dtype=torch.bfloat16)
            variants = [("bf16", None), ("fp8", SHIPPED), ("fp8", TWO), ("int8", SHIPPED), ("int8", TWO)]
            times = {v: [] for v in variants}
            for _ in range(7):
                for name, tables in variants:
                    if tables is not None:
                        configs._DIR = tables
                        registry.reset()
                    fn = lambda: layers[name](x)
                    for _ in range(5):
                        fn()
                    times[(name, tables)].append(issue_us(fn))
            print(f"{M}x{N}x{K} bias={bias} issue us/call: " + " | ".join(
                f"{n} {'' if t is None else 'one' if t == SHIPPED else 'two'} {statistics.median(v):.1f}"
                for (n, t), v in times.items()), flush=True)
configs._DIR = SHIPPED
