"""Round-13 A/B (H100): the model's decode step with K split in the tiled GEMM at 65-512 rows (this
tree's sm_90 table) against the table before it (`git show HEAD~:…/sm_90.json` passed as the first
argument's file: 64x64 / 128x64 pointer-load tiles unsplit to 128 rows, 64x128 TMA tiles unsplit to 512),
in one process: dim 4096, 4 layers; batch 64 (the decode kernel either way: a control), 96, 128 and 256;
bf16, FP8 and INT8, and FP8 under quantcore.priority("triton") (the tiled kernel, where the H100's
measured table ranks the Gluon GEMM first from 128 rows). Eager: ROUNDS interleaved rounds, each variant
4 warm-up steps then a loop of 32 (host clock, one synchronize), the registry reset before each; median
µs per step and bf16 / variant. CUDA graph: one captured step replayed 64 times, in ROUNDS rounds too.

Run from the repository root:
  git show <before>:quantcore/backends/triton/configs/sm_90.json > /tmp/sm_90_before.json
  PYTHONPATH=$PWD python3 docs/bench/round13/ab_split.py /tmp/sm_90_before.json [rounds]
"""
import contextlib
import copy
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import torch

import quantcore
from quantcore import capability, registry
from quantcore import nn as qnn
from quantcore.backends.triton import configs
from quantcore.bench import decoder
from quantcore.bench.timing import loop_us

ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 5
dev = torch.device("cuda")
SHIPPED = configs._DIR
BEFORE = Path(tempfile.mkdtemp())
for f in SHIPPED.glob("*.json"):
    shutil.copy(f, BEFORE)
shutil.copy(sys.argv[1], BEFORE / "sm_90.json")
TABLES = {"split": SHIPPED, "before": BEFORE}


@contextlib.contextmanager
def use(table, priority):
    configs._DIR = TABLES[table]
    registry.reset()
    with quantcore.priority(priority) if priority else contextlib.nullcontext():
        yield


def graph_us(step):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph, loop_us(graph.replay, 64)


print(torch.cuda.get_device_name(), torch.__version__, capability.versions(), flush=True)
torch.manual_seed(0)
base = decoder.DecodeModel(4096, 4, 32000, dev)
with torch.inference_mode():
    models = {"bf16": base, **{q: qnn.quantize_model(copy.deepcopy(base), dtype=d)
                               for q, d in (("fp8", torch.float8_e4m3fn), ("int8", torch.int8))}}
    variants = [("bf16", "split", None)] + [(q, t, p) for q, p in (("fp8", None), ("fp8", "triton"), ("int8", None))
                                             for t in TABLES]
    for batch in (64, 96, 128, 256):
        states = {k: decoder.DecodeState.new(m, batch, 256) for k, m in models.items()}
        eager = {v: [] for v in variants}
        graphs = {v: [] for v in variants}
        for _ in range(ROUNDS):
            for q, t, p in variants:
                with use(t, p):
                    step = lambda: decoder.decode_step(models[q], states[q])
                    for _ in range(4):
                        step()
                    eager[(q, t, p)].append(loop_us(step, 32))
                    graph, us = graph_us(step)
                    graphs[(q, t, p)].append(us)
                    del graph
        for name, times in (("eager", eager), ("graph", graphs)):
            bf = statistics.median(times[variants[0]])
            print(f"batch {batch} {name}: " + " | ".join(
                f"{q}{'' if q == 'bf16' else ' ' + t}{'[' + p + ']' if p else ''} {statistics.median(v):7.1f} us "
                f"(x{bf / statistics.median(v):.3f})" for (q, t, p), v in times.items()), flush=True)
configs._DIR = SHIPPED
registry.reset()
