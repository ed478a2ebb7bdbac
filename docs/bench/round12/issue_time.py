"""Round-12 probe (H100): is the eager decode step host-bound, and what does each model cost the host?

The model (dim 4096, 4 layers) in bf16, FP8 and INT8 (this tree's tables), batch 1, 8 and 128: per step,
the host's issue time (a loop of 32 steps after a synchronize, clock stopped before the final
synchronize) and the time per step with that synchronize (what `loop_us` measures); median of 7
interleaved rounds. Where issue time ≈ step time the host bounds the step.

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round12/issue_time.py
"""
import copy
import statistics
import time

import torch

from quantcore import capability
from quantcore import nn as qnn
from quantcore.bench import decoder

dev = torch.device("cuda")
print(torch.cuda.get_device_name(), torch.__version__, capability.versions(), flush=True)
torch.manual_seed(0)
base = decoder.DecodeModel(4096, 4, 32000, dev)
with torch.inference_mode():
    models = {"bf16": base, **{q: qnn.quantize_model(copy.deepcopy(base), dtype=d)
                               for q, d in (("fp8", torch.float8_e4m3fn), ("int8", torch.int8))}}
    for batch in (1, 8, 128):
        states = {k: decoder.DecodeState.new(m, batch, 256) for k, m in models.items()}
        issue, total = {k: [] for k in models}, {k: [] for k in models}
        for _ in range(7):
            for k, m in models.items():
                for _ in range(4):
                    decoder.decode_step(m, states[k])
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(32):
                    decoder.decode_step(m, states[k])
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                t2 = time.perf_counter()
                issue[k].append((t1 - t0) / 32 * 1e6)
                total[k].append((t2 - t0) / 32 * 1e6)
        print(f"batch {batch}: " + " | ".join(f"{k} issue {statistics.median(issue[k]):7.1f} us, step "
                                              f"{statistics.median(total[k]):7.1f} us" for k in models), flush=True)
