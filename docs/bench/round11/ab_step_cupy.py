"""Round-11 A/B on the CuPy backend (`quantcore.priority("cupy")`): the eager decode step of the decode
model (dim 4096, 4 layers) in bf16 beside FP8 and INT8 QuantLinear models, with the CuPy quant_linear
quantizing the activation once per launch where its rule says (ONCE_M_MAX, ONCE_NK_MAX) and without
(act_quant + the GEMM), interleaved rounds of 64 steps; median µs per step and bf16 / variant.

    PYTHONPATH=$PWD python3 docs/bench/round11/ab_step_cupy.py ROUNDS
"""
import copy
import statistics
import sys

import torch

import quantcore
import quantcore.nn as qnn
from quantcore import registry
from quantcore.backends.cupy import launch
from quantcore.bench import decoder
from quantcore.bench.timing import loop_us

ROUNDS, STEPS = int(sys.argv[1]), 64
dev = torch.device("cuda")
torch.manual_seed(0)
base = decoder.DecodeModel(4096, 4, 32000, dev)
with torch.no_grad():
    quantized = {q: qnn.quantize_model(copy.deepcopy(base), dtype=d)
                 for q, d in (("fp8", torch.float8_e4m3fn), ("int8", torch.int8))}
table = launch.ONCE_M_MAX
print(torch.cuda.get_device_name(), quantcore.capability.versions(), flush=True)
for batch in (8, 16, 32):
    variants = {"bf16": (base, table), **{f"{q} {mode}": (m, table if mode == "once" else 0)
                                          for q, m in quantized.items() for mode in ("once", "two")}}
    states = {k: decoder.DecodeState.new(m, batch, 256) for k, (m, _) in variants.items()}
    times = {k: [] for k in variants}
    with torch.inference_mode(), quantcore.priority("cupy"):
        for _ in range(ROUNDS):
            for k, (m, bound) in variants.items():
                if launch.ONCE_M_MAX != bound:
                    launch.ONCE_M_MAX = bound
                    registry.reset()
                step = lambda: decoder.decode_step(m, states[k])
                for _ in range(4):
                    step()
                times[k].append(loop_us(step, STEPS))
    bf = statistics.median(times["bf16"])
    print(f"batch {batch}: " + " | ".join(
        f"{k} {statistics.median(t):7.1f} us (x{bf / statistics.median(t):.3f})" for k, t in times.items()), flush=True)
