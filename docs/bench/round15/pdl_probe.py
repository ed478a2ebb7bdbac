"""Round-15 probe (H100): the decode GEMM launched as a programmatic dependent (PDL), with its weight
rows prefetched into L2 before it waits for the kernel before it.

Variants (QUANTCORE_PDL at plan time, the registry reset between): "off" (as shipped before), or
"TRIGGER:N": PDL, the next kernel let launch at the program's start, after its wait for the kernel
before, or after its main loop (TRIGGER start / wait / end), at most N bytes of each program's weight
rows prefetched into L2 before the wait (0: none). Measured in
one process, ROUNDS interleaved rounds, median:
  - the linear stack (24 linears, dim 4096, no bias) at M = 1 and 8, FP8 and INT8, CUDA graph and eager;
  - the decode model (dim 4096, 4 layers) at batch 1 and 8, graph, beside bf16;
  - chains of 16 quant_linear calls of one shape on 16 distinct weights, in a graph: µs per call.
Every variant's outputs (stack, model logits of one step from a fresh state, chains, a weight quantized
right before its GEMM) are compared bit for bit with "off".

The PDL variants need the kernel change in pdl.diff (`git apply docs/bench/round15/pdl.diff` on c0f3824);
the first run (pdl_probe_first.txt) used its earlier form, variants "N" = PDL with the next launch let go
at the start and N bytes prefetched, and drew the freshly quantized weight's data unseeded.

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round15/pdl_probe.py [variants] [rounds]
"""
import copy
import os
import statistics
import sys

import torch

import quantcore
from quantcore import capability, ops, registry
from quantcore import nn as qnn
from quantcore.bench import decoder
from quantcore.bench.timing import copy_bandwidth_gbps, loop_us

VARIANTS = (sys.argv[1] if len(sys.argv) > 1 else "off,start:0,wait:0,end:0,end:8192").split(",")
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
dev = torch.device("cuda")
DT = {"fp8": torch.float8_e4m3fn, "int8": torch.int8}


def use(variant):
    os.environ["QUANTCORE_PDL"] = variant
    registry.reset()


def capture(step):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    graph.replay()
    torch.cuda.synchronize()
    return graph, out


print(torch.cuda.get_device_name(), torch.__version__, capability.versions(), flush=True)
gbps = copy_bandwidth_gbps()
print(f"copy {gbps:.0f} GB/s", flush=True)
torch.manual_seed(0)
results, outputs = {}, {}


def record(key, variant, us):
    results.setdefault(key, {}).setdefault(variant, []).append(us)


def same(key, variant, out):
    out = [t.clone() for t in (out if isinstance(out, (list, tuple)) else [out])]
    if variant == VARIANTS[0]:
        outputs[key] = out
    else:
        ref = outputs[key]
        ok = all(torch.equal(a.view(torch.uint8) if a.dtype.itemsize == 1 else a, b.view(torch.uint8) if b.dtype.itemsize == 1 else b) for a, b in zip(ref, out))
        if not ok:
            print(f"MISMATCH {key} {variant}", flush=True)
        results.setdefault(("equal",) + key, {}).setdefault(variant, []).append(ok)


with torch.inference_mode():
    # The linear stack.
    stack = decoder.linear_stack(4096, 4, dev)
    stacks = {q: qnn.quantize_model(copy.deepcopy(stack), dtype=d) for q, d in DT.items()}
    xs = {m: torch.randn(m, 4096, device=dev, dtype=torch.bfloat16) for m in (1, 8)}
    # The model.
    base = decoder.DecodeModel(4096, 4, 32000, dev)
    models = {"bf16": base, **{q: qnn.quantize_model(copy.deepcopy(base), dtype=d) for q, d in DT.items()}}
    # Chains: 16 distinct weights of one shape, applied to the same input.
    chains = {}
    for q, d in DT.items():
        for n, k in ((4096, 4096), (16384, 4096), (4096, 16384), (2112, 7168), (7168, 2048)):
            ws = [ops.weight_quant(torch.randn(n, k, device=dev, dtype=torch.bfloat16), dtype=d) for _ in range(16)]
            chains[(q, n, k)] = ws
    for r in range(ROUNDS):
        for v in VARIANTS:
            use(v)
            for q in DT:
                for m, x in xs.items():
                    step = lambda: stacks[q](x)
                    for _ in range(4):
                        out = step()
                    torch.cuda.synchronize()
                    if r == 0:
                        same(("stack", q, m), v, out)
                    record(("stack eager", q, m), v, loop_us(step, 64))
                    g, gout = capture(step)
                    if r == 0:
                        same(("stack graph", q, m), v, gout)
                    record(("stack graph", q, m), v, loop_us(g.replay, 64))
                    del g
            for q, model in models.items():
                if q == "bf16" and v != VARIANTS[0]:
                    continue
                for batch in (1, 8):
                    state = decoder.DecodeState.new(model, batch, 256)
                    logits = decoder.decode_step(model, state)
                    if r == 0 and q != "bf16":
                        same(("model", q, batch), v, logits)
                    g, _ = capture(lambda: decoder.decode_step(model, state))
                    record(("model graph", q, batch), v, loop_us(g.replay, 64))
                    del g, state
            for (q, n, k), ws in chains.items():
                x = torch.randn(1, k, device=dev, dtype=torch.bfloat16, generator=torch.Generator(dev).manual_seed(1))
                step = lambda: [ops.quant_linear(x, w, s) for w, s in ws]
                g, gout = capture(step)
                if r == 0:
                    same(("chain", q, n, k), v, gout)
                record(("chain graph /call", q, n, k), v, loop_us(g.replay, 32) / 16)
                del g
            # A weight quantized by the kernel right before its GEMM (the prefetch must never see it stale).
            for q, d in DT.items():
                gen = torch.Generator(dev).manual_seed(2)
                w16 = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16, generator=gen)
                xx = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16, generator=gen)
                outs = []
                for i in range(4):
                    w, s = ops.weight_quant(w16 * (i + 1), dtype=d)
                    outs.append(ops.quant_linear(xx, w, s))
                torch.cuda.synchronize()
                if r == 0:
                    same(("fresh weight", q), v, outs)
            torch.cuda.synchronize()
        print(f"round {r} done", flush=True)

    floors = {(q, n, k): (n * k + n * 2 + k * 2) / gbps / 1e3 for (q, n, k) in chains}
    print("\n| what | " + " | ".join(VARIANTS) + " | off / best |")
    print("|---|" + "---|" * (len(VARIANTS) + 1))
    for key, per in results.items():
        if key[0] == "equal":
            continue
        med = {v: statistics.median(t) for v, t in per.items()}
        extra = f" (floor {floors[key[1:]]:.1f})" if key[0].startswith("chain") else ""
        cells = " | ".join(f"{med[v]:.1f}" if v in med else "-" for v in VARIANTS)
        best = min(med.values())
        print(f"| {' '.join(map(str, key))}{extra} | {cells} | {med[VARIANTS[0]] / best:.3f} |")
    bad = [(k, v) for k, per in results.items() if k[0] == "equal" for v, t in per.items() if not all(t)]
    print("bit-equal to", VARIANTS[0], ":", "all" if not bad else bad)
