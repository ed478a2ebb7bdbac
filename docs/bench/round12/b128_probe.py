"""Round-12 probe (H100): where the eager decode step of the quantized model loses to bf16 at batch 64-128.

(1) Per layer shape of the decode model (4096x4096 without bias, 4096->16384 and 16384->4096 with bias), at
M = 64 and 128 rows ([M, 1, K] inputs as the model gives them): eager time per call (`timing.eager_time_us`)
and GPU time (`timing.gpu_time_us`) of bf16 nn.Linear, FP8 and INT8 QuantLinear, and of the two ops a
QuantLinear runs there (`ops.act_quant`, `ops.scaled_mm`), with the implementation `explain` selects.
(2) The model's eager step (dim 4096, 4 layers) at batch 64 and 128: bf16, FP8 and INT8, ROUNDS interleaved
rounds of 32 steps, median; and a CUDA-graph replay of each. (3) torch.profiler of 8 eager steps at batch
128, bf16 and FP8: the ops by self CPU time and by device time.

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round12/b128_probe.py [rounds]
"""
import copy
import statistics
import sys

import torch
import torch.nn.functional as F

import quantcore
from quantcore import capability, ops
from quantcore import nn as qnn
from quantcore.bench import decoder
from quantcore.bench.timing import eager_time_us, gpu_time_us, loop_us

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
dev = torch.device("cuda")
print(torch.cuda.get_device_name(), torch.__version__, capability.versions(), flush=True)
QD = {"fp8": torch.float8_e4m3fn, "int8": torch.int8}

with torch.inference_mode():
    for N, K, bias in ((4096, 4096, False), (16384, 4096, True), (4096, 16384, True)):
        torch.manual_seed(0)
        lin = decoder._linear(K, N, bias, dev)
        layers = {"bf16": lin, **{q: qnn.QuantLinear.from_linear(lin, dtype=d) for q, d in QD.items()}}
        for M in (64, 128):
            x = torch.randn(M, 1, K, device=dev, dtype=torch.bfloat16)
            cells = []
            for name, layer in layers.items():
                fn = lambda: layer(x)
                cells.append(f"{name} {eager_time_us(fn):6.1f}/{gpu_time_us(fn):6.1f}")
            for q in QD:
                L = layers[q]
                x2 = x.view(M, K)
                xq, xs = ops.act_quant(x2, dtype=QD[q])
                b = L.bias
                aq = lambda: ops.act_quant(x2, dtype=QD[q])
                mm = lambda: ops.scaled_mm(xq, xs, L.weight, L.weight_scale_inv, bias=b)
                sel_a = quantcore.explain("act_quant", x2, dtype=QD[q]).selected
                e = quantcore.explain("scaled_mm", xq, xs, L.weight, L.weight_scale_inv, bias=b)
                cells.append(f"{q} act_quant[{sel_a}] {eager_time_us(aq):5.1f}/{gpu_time_us(aq):5.1f} "
                             f"scaled_mm[{e.selected} {e.options}] {eager_time_us(mm):5.1f}/{gpu_time_us(mm):5.1f}")
            print(f"{M}x{N}x{K} bias={bias} eager/GPU us: " + " | ".join(cells), flush=True)

    torch.manual_seed(0)
    base = decoder.DecodeModel(4096, 4, 32000, dev)
    models = {"bf16": base, **{q: qnn.quantize_model(copy.deepcopy(base), dtype=d) for q, d in QD.items()}}
    for batch in (64, 128):
        states = {k: decoder.DecodeState.new(m, batch, 256) for k, m in models.items()}
        times = {k: [] for k in models}
        for _ in range(ROUNDS):
            for k, m in models.items():
                step = lambda: decoder.decode_step(m, states[k])
                for _ in range(4):
                    step()
                times[k].append(loop_us(step, 32))
        graphs = {}
        for k, m in models.items():
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    decoder.decode_step(m, states[k])
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                decoder.decode_step(m, states[k])
            graphs[k] = loop_us(g.replay, 64)
        bf = statistics.median(times["bf16"])
        print(f"batch {batch} eager: " + " | ".join(f"{k} {statistics.median(t):7.1f} us (x{bf / statistics.median(t):.3f})"
                                                  for k, t in times.items())
              + " || graph: " + " | ".join(f"{k} {t:7.1f}" for k, t in graphs.items()), flush=True)

    from torch.profiler import ProfilerActivity, profile
    for k in ("bf16", "fp8"):
        m = models[k]
        state = decoder.DecodeState.new(m, 128, 256)
        for _ in range(4):
            decoder.decode_step(m, state)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(8):
                decoder.decode_step(m, state)
            torch.cuda.synchronize()
        ka = prof.key_averages()
        print(f"== profile {k} batch 128, 8 steps, by self CPU time", flush=True)
        print(ka.table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=60), flush=True)
        print(f"== profile {k} batch 128, by device time", flush=True)
        print(ka.table(sort_by="self_device_time_total", row_limit=14, max_name_column_width=60), flush=True)
