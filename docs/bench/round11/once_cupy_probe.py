"""Round-11 probe (H100): (1) the CuPy quant_linear quantizing its activation once per launch (gemm.cu's
ONCE) against act_quant + the GEMM (two launches), beside Triton's quant_linear as the table runs it;
(2) the host cost of `torch.ops.quantcore` against `quantcore.ops`, with the custom ops as this tree
defines them (a `torch.library.Library` and an Autograd kernel) and as the previous tree did
(`torch.library.custom_op`, `library_before.py`, registered here under the namespace qc_before).

(1): FP8 and INT8 weights, M = 8, 16, 32, 64, the six DeepSeek-V3 decode (N, K) and the decode model's
three: GPU time (`timing.gpu_time_us`) and eager time per call (`timing.eager_time_us`) through
`ops.quant_linear(backend=...)`, CuPy's modes forced through `launch.ONCE_M_MAX` / `ONCE_NK_MAX`
(plans reset in between), and whether the one launch is bit for bit the two.
(2): eager time per call at M = 1 under torch.inference_mode(), torch.no_grad() and grad mode (no input
requiring grad), Triton backend.

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round11/once_cupy_probe.py [out.json] [cupy] [custom]
once_cupy_probe.txt: the first kernel (its A scales M-major, read from L2 only; ONCE_M_MAX was 64,
so "once" ran to 64 rows); once_cupy_probe_prefetch.txt: that kernel with scale_prefetch.diff applied
(since reverted), "once" then stopping at ONCE_M_MAX = 32 (its 64-row "once" column is the two
launches); once_cupy_probe_l1.txt: the final kernel (scales K-block-major, read through L1), "once"
forced to 64 rows.
"""
import json
import os
import sys

import torch

import quantcore
from quantcore import capability, ops, registry
from quantcore.backends.cupy import launch as cupy_launch
from quantcore.bench import timing

dev = torch.device("cuda")
SHAPES = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168), (7168, 16384), (32768, 512),
          (4096, 4096), (16384, 4096), (4096, 16384)]
ONCE = (cupy_launch.ONCE_M_MAX, cupy_launch.ONCE_NK_MAX)


def same(u, v):
    """Whether two results (a tensor or a tuple of them) are equal, bit for bit."""
    u, v = (u if isinstance(u, tuple) else (u,)), (v if isinstance(v, tuple) else (v,))
    return len(u) == len(v) and all(torch.equal(i, j) for i, j in zip(u, v))


def cupy_mode(mode):
    registry.reset()
    cupy_launch.ONCE_M_MAX, cupy_launch.ONCE_NK_MAX = {"two": (0, 0), "once": (64, 2**40)}.get(mode, ONCE)


print(torch.cuda.get_device_name(), torch.__version__, capability.versions(), flush=True)
rows = []
parts = sys.argv[2:] or ["cupy", "custom"]
with torch.inference_mode():
    for qdtype in (torch.float8_e4m3fn, torch.int8) if "cupy" in parts else ():
        for N, K in SHAPES:
            torch.manual_seed(0)
            w, w_s = ops.weight_quant(torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.05, dtype=qdtype)
            for M in (8, 16, 32, 64):
                x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
                row = dict(fmt=str(qdtype).split(".")[-1], M=M, N=N, K=K)
                outs = {}
                for mode, backend in (("two", "cupy"), ("once", "cupy"), ("triton", "triton")):
                    cupy_mode(mode)
                    call = lambda: ops.quant_linear(x, w, w_s, backend=backend)
                    outs[mode] = call()
                    row[f"{mode}_gpu"] = round(timing.gpu_time_us(call), 2)
                    row[f"{mode}_eager"] = round(timing.eager_time_us(call), 2)
                row["exact"] = same(outs["once"], outs["two"])
                rows.append(row)
                print(row, flush=True)
    cupy_mode("table")

if "custom" in parts:
    source = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "library_before.py")).read()
    before = {"__name__": "quantcore.library_before", "__package__": "quantcore"}
    exec(compile(source.replace('NAMESPACE = "quantcore"', 'NAMESPACE = "qc_before"'), "library_before.py", "exec"),
         before)
    qc, old = torch.ops.quantcore, torch.ops.qc_before
    torch.manual_seed(0)
    x = torch.randn(1, 7168, device=dev, dtype=torch.bfloat16)
    w, w_s = ops.weight_quant(torch.randn(2112, 7168, device=dev, dtype=torch.bfloat16) * 0.05)
    a, a_s = ops.act_quant(x)
    calls = {
        "act_quant": (lambda: ops.act_quant(x), lambda: qc.act_quant(x), lambda: old.act_quant(x)),
        "scaled_mm": (lambda: ops.scaled_mm(a, a_s, w, w_s), lambda: qc.scaled_mm(a, a_s, w, w_s),
                      lambda: old.scaled_mm(a, a_s, w, w_s)),
        "quant_linear": (lambda: ops.quant_linear(x, w, w_s), lambda: qc.quant_linear(x, w, w_s),
                         lambda: old.quant_linear(x, w, w_s)),
    }
    bf16 = torch.randn(2112, 7168, device=dev, dtype=torch.bfloat16)
    for mode, context in (("inference_mode", torch.inference_mode), ("no_grad", torch.no_grad),
                          ("grad mode", torch.enable_grad)):
        with context():
            for round_ in range(3):  # interleaved: the host drifts
                for name, (plain, now, was) in calls.items():
                    r = dict(mode=mode, round=round_, op=name, ops=round(timing.eager_time_us(plain), 2),
                             custom_op_now=round(timing.eager_time_us(now), 2),
                             custom_op_before=round(timing.eager_time_us(was), 2),
                             bf16_linear=round(timing.eager_time_us(lambda: torch.nn.functional.linear(x, bf16)), 2),
                             same=same(plain(), now()) and same(plain(), was()))
                    rows.append(r)
                    print(r, flush=True)
if len(sys.argv) > 1 and sys.argv[1].endswith(".json"):
    with open(sys.argv[1], "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), versions=capability.versions(), rows=rows), f, indent=1)
