"""Round-15 probe (H100): the model's eager decode step at 64-256 rows, where FP8 ran 0.92x bf16 in
round 13's `--e2e` (batch 128), and whether the one-launch quant_linear of 65-128 rows (the sm_90
table's last "fused" rule, "once") still pays there.

Variants: bf16; FP8 and INT8 with the shipped table ("shipped") and with that rule removed ("two":
act_quant + the GEMM from 65 rows). Per batch, ROUNDS interleaved rounds: the eager step (4 warm-up
steps, a loop of 32 with one synchronize, µs per step), its GPU time (one step issued behind a 20 ms
sleep kernel, CUDA events around it: the GPU's own time with the host ahead) and the host's issue
time of that step; median. The model: dim 4096, 4 layers (quantcore.bench.decoder).

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round15/eager_batch_probe.py [rounds]
"""
import copy
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from quantcore import capability, registry
from quantcore import nn as qnn
from quantcore.backends.triton import configs
from quantcore.bench import decoder
from quantcore.bench.timing import loop_us

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
dev = torch.device("cuda")
SHIPPED = configs._DIR
TWO = Path(tempfile.mkdtemp())
for f in SHIPPED.glob("*.json"):
    shutil.copy(f, TWO)
table = json.loads((SHIPPED / "sm_90.json").read_text())
table["decode"]["fused"] = [r for r in table["decode"]["fused"] if r["m_max"] <= 64]
(TWO / "sm_90.json").write_text(json.dumps(table))
TABLES = {"shipped": SHIPPED, "two": TWO}


def use(name):
    configs._DIR = TABLES[name]
    registry.reset()


def gpu_step_us(step):
    """GPU time of one eager step issued while the GPU is busy with a sleep: the host is ahead of it."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    torch.cuda._sleep(20_000_000)
    t0 = time.perf_counter()
    start.record()
    step()
    end.record()
    issue = (time.perf_counter() - t0) * 1e6
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3, issue


print(torch.cuda.get_device_name(), torch.__version__, capability.versions(), flush=True)
torch.manual_seed(0)
base = decoder.DecodeModel(4096, 4, 32000, dev)
with torch.inference_mode():
    models = {"bf16": base, **{q: qnn.quantize_model(copy.deepcopy(base), dtype=d)
                               for q, d in (("fp8", torch.float8_e4m3fn), ("int8", torch.int8))}}
    variants = [("bf16", "shipped")] + [(q, t) for q in ("fp8", "int8") for t in TABLES]
    for batch in (64, 96, 128, 256):
        states = {k: decoder.DecodeState.new(m, batch, 256) for k, m in models.items()}
        eager, gpu, issue = ({v: [] for v in variants} for _ in range(3))
        for _ in range(ROUNDS):
            for q, t in variants:
                use(t)
                step = lambda: decoder.decode_step(models[q], states[q])
                for _ in range(4):
                    step()
                eager[(q, t)].append(loop_us(step, 32))
                g, i = gpu_step_us(step)
                gpu[(q, t)].append(g)
                issue[(q, t)].append(i)
        bf = statistics.median(eager[variants[0]])
        for q, t in variants:
            e = statistics.median(eager[(q, t)])
            print(f"batch {batch:3d} {q:4s} {t:7s}: eager {e:7.1f} us/step (bf16 / this {bf / e:.3f}), "
                  f"GPU {statistics.median(gpu[(q, t)]):7.1f}, host issue {statistics.median(issue[(q, t)]):7.1f}",
                  flush=True)
configs._DIR = SHIPPED
registry.reset()
