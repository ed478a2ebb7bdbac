"""Round-10 probe (H100): the eager decode step (dim 4096, 4 layers, `bench.decoder`) at batch 16, 32 and 64,
bf16 beside FP8 and INT8 QuantLinear models whose linears of 9 to 64 rows run in one launch ("once",
this round) or in two ("two": the table's "once" rule dropped, as up to round 9), in one process:
ROUNDS interleaved rounds, each variant 4 warm-up steps then a loop of 64 steps (host clock, one
synchronize), the registry reset before each so that the plans follow the switch. Median µs per step
and bf16 / variant.

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round10/ab_step.py [rounds]
"""
import copy
import statistics
import sys

import torch

from quantcore import nn as qnn
from quantcore import registry
from quantcore.backends.triton import configs
from quantcore.bench import decoder
from quantcore.bench.timing import loop_us

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
dev = torch.device("cuda")
table = configs.fused
without_once = lambda profile, M, K: None if table(profile, M, K) == "once" else table(profile, M, K)
torch.manual_seed(0)
base = decoder.DecodeModel(4096, 4, 32000, dev)
with torch.no_grad():
    quantized = {q: qnn.quantize_model(copy.deepcopy(base), dtype=d) for q, d in (("fp8", torch.float8_e4m3fn),
                                                                                 ("int8", torch.int8))}
variants = {"bf16": (base, table), **{f"{q} {mode}": (m, fused) for q, m in quantized.items()
                                      for mode, fused in (("once", table), ("two", without_once))}}
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
for batch in (16, 32, 64):
    states = {k: decoder.DecodeState.new(m, batch, 256) for k, (m, _) in variants.items()}
    times = {k: [] for k in variants}
    with torch.inference_mode():
        for _ in range(ROUNDS):
            for k, (m, fused) in variants.items():
                configs.fused = fused
                registry.reset()
                step = lambda: decoder.decode_step(m, states[k])
                for _ in range(4):
                    step()
                times[k].append(loop_us(step, 64))
    bf = statistics.median(times["bf16"])
    print(f"batch {batch}: " + " | ".join(f"{k} {statistics.median(t):7.1f} us (x{bf / statistics.median(t):.3f})"
                                          for k, t in times.items()), flush=True)
