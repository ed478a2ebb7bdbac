"""Round-12 A/B (H100): the model's eager decode step with quant_linear of 65-128 rows in one launch
(this tree's sm_90 table) against two launches (the same table without its 128-row "once" rule), in one
process: dim 4096, 4 layers, batch 64 (unchanged: a control), 96 and 128; bf16, FP8, INT8; ROUNDS
interleaved rounds, each variant 4 warm-up steps then a loop of 32 (host clock, one synchronize), the
registry reset before each; median µs per step and bf16 / variant. Also the CUDA-graph step of each
(one captured step replayed 64 times), which captures act_quant + the GEMM either way. With `all`: batch
96 and 128 only, and a third table, "all", whose 128-row rule has no K or N·K bound (every linear of the
model in one launch).

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round12/ab_step128.py [rounds] [all]
"""
import copy
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from quantcore import capability, registry
from quantcore import nn as qnn
from quantcore.backends.triton import configs
from quantcore.bench import decoder
from quantcore.bench.timing import loop_us

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
ALL = "all" in sys.argv[2:]
dev = torch.device("cuda")
SHIPPED = configs._DIR
TMP = Path(tempfile.mkdtemp())
for f in SHIPPED.glob("*.json"):
    shutil.copy(f, TMP)
table = json.loads((SHIPPED / "sm_90.json").read_text())
table["decode"]["fused"] = [r for r in table["decode"]["fused"] if r["m_max"] <= table["decode"]["m_max"]]
(TMP / "sm_90.json").write_text(json.dumps(table))
TABLES = {"one": SHIPPED, "two": TMP}
if ALL:
    TABLES["all"] = Path(tempfile.mkdtemp())
    for f in SHIPPED.glob("*.json"):
        shutil.copy(f, TABLES["all"])
    table = json.loads((SHIPPED / "sm_90.json").read_text())
    table["decode"]["fused"] = [r if r["m_max"] != 128 else {"m_max": 128, "quantize": "once"}
                                for r in table["decode"]["fused"]]
    (TABLES["all"] / "sm_90.json").write_text(json.dumps(table))


def use(tables):
    configs._DIR = tables
    registry.reset()


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
    return loop_us(graph.replay, 64)


print(torch.cuda.get_device_name(), torch.__version__, capability.versions(), flush=True)
torch.manual_seed(0)
base = decoder.DecodeModel(4096, 4, 32000, dev)
with torch.inference_mode():
    models = {"bf16": base, **{q: qnn.quantize_model(copy.deepcopy(base), dtype=d)
                               for q, d in (("fp8", torch.float8_e4m3fn), ("int8", torch.int8))}}
    variants = [("bf16", "one")] + [(q, t) for q in ("fp8", "int8") for t in TABLES]
    for batch in (96, 128) if ALL else (64, 96, 128):
        states = {k: decoder.DecodeState.new(m, batch, 256) for k, m in models.items()}
        times = {v: [] for v in variants}
        for _ in range(ROUNDS):
            for q, t in variants:
                use(TABLES[t])
                step = lambda: decoder.decode_step(models[q], states[q])
                for _ in range(4):
                    step()
                times[(q, t)].append(loop_us(step, 32))
        graphs = {}
        for q, t in variants:
            use(TABLES[t])
            graphs[(q, t)] = graph_us(lambda: decoder.decode_step(models[q], states[q]))
        bf, bfg = statistics.median(times[("bf16", "one")]), graphs[("bf16", "one")]
        print(f"batch {batch} eager: " + " | ".join(f"{q} {t if q != 'bf16' else ''} {statistics.median(v):7.1f} us "
                                                  f"(x{bf / statistics.median(v):.3f})" for (q, t), v in times.items()),
              flush=True)
        print(f"batch {batch} graph: " + " | ".join(f"{q} {t if q != 'bf16' else ''} {v:7.1f} us (x{bfg / v:.3f})"
                                                  for (q, t), v in graphs.items()), flush=True)
use(SHIPPED)
