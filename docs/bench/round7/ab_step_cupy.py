"""One process of the cross-version A/B on the CuPy backend (`quantcore.priority("cupy")`): eager decode step,
bf16 beside FP8 and INT8 QuantLinear models,
interleaved rounds; prints per-variant median us/step and bf16/variant. PYTHONPATH picks the quantcore.
Batch 1 and 4: the rows the CuPy quant_linear fuses (round 7) at most."""
import copy, statistics, sys, time
import torch
import quantcore, quantcore.nn as qnn
from quantcore.bench import decoder
from quantcore.bench.timing import loop_us

ROUNDS, STEPS = int(sys.argv[2]), 64
tag = sys.argv[1]
dev = torch.device("cuda")
torch.manual_seed(0)
base = decoder.DecodeModel(4096, 4, 32000, dev)
with torch.no_grad():
    fp8 = qnn.quantize_model(copy.deepcopy(base), dtype=torch.float8_e4m3fn)
    int8 = qnn.quantize_model(copy.deepcopy(base), dtype=torch.int8)
for batch in (1, 4):
    states = {k: decoder.DecodeState.new(m, batch, 256) for k, m in (("bf16", base), ("fp8", fp8), ("int8", int8))}
    models = {"bf16": base, "fp8": fp8, "int8": int8}
    times = {k: [] for k in models}
    with torch.inference_mode(), quantcore.priority("cupy"):
        for _ in range(ROUNDS):
            for k, m in models.items():
                step = lambda: decoder.decode_step(m, states[k])
                for _ in range(4):
                    step()
                times[k].append(loop_us(step, STEPS))
    bf = statistics.median(times["bf16"])
    print(f"{tag:5s} batch {batch}: " + " | ".join(
        f"{k} {statistics.median(t):7.1f} us (x{bf / statistics.median(t):.3f})" for k, t in times.items()), flush=True)
