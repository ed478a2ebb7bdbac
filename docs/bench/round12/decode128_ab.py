"""Round-12 probe 2 (H100): is the decode kernel at 65-128 rows bit for bit the tiled and Gluon GEMMs when
it does not split K, and what the one launch does to the model's eager step.

(1) Per format, M (80, 128) and shape (`decode128_probe.SHAPES`): scaled_mm on the decode kernel with K
split as the table's rule splits it ("split") and unsplit ("unsplit"), against the shipped tiled
("triton") and Gluon GEMMs: which outputs are equal bit for bit, and the GPU time of the unsplit decode
GEMM and of quant_linear quantizing once in it. (2) The model's eager step (dim 4096, 4 layers) at batch
96 and 128: bf16; FP8 and INT8 as shipped (two launches from 65 rows); and quant_linear in one launch on
the decode kernel, split and unsplit (`quantcore.priority("triton")`), five interleaved rounds of 32
steps, median.

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round12/decode128_ab.py
"""
import contextlib
import copy
import json
import shutil
import statistics
import tempfile
from pathlib import Path

import torch

import quantcore
from quantcore import capability, ops, registry
from quantcore import nn as qnn
from quantcore.backends.triton import configs
from quantcore.bench import decoder
from quantcore.bench.timing import gpu_time_us, loop_us

dev = torch.device("cuda")
SHAPES = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168), (7168, 16384), (32768, 512),
          (4096, 4096), (16384, 4096), (4096, 16384)]
VARIANTS = {"split": 2, "unsplit": 10**6}  # min_kb_per_split of the 65-128-row rule [64, 4, 4], waves 2
SHIPPED = configs._DIR
TMP = Path(tempfile.mkdtemp())


def use(variant):
    if variant is None:
        configs._DIR = SHIPPED
    else:
        for f in SHIPPED.glob("*.json"):
            shutil.copy(f, TMP)
        t = json.loads((SHIPPED / "sm_90.json").read_text())
        dec = t["decode"]
        dec["m_max"] = 128
        at = next(i for i, r in enumerate(dec["rules"]) if r["m_max"] is None)
        dec["rules"].insert(at, {"mma": None, "m_max": 128, "n_max": None, "k_max": None, "config": [64, 4, 4],
                                 "waves": 2, "min_kb_per_split": VARIANTS[variant]})
        dec["fused"] = [r if r.get("quantize") != "once" else {"m_max": 128, "quantize": "once"} for r in dec["fused"]]
        (TMP / "sm_90.json").write_text(json.dumps(t))
        configs._DIR = TMP
    registry.reset()


print(torch.cuda.get_device_name(), torch.__version__, capability.versions(), flush=True)
with torch.inference_mode():
    for qd in (torch.float8_e4m3fn, torch.int8):
        for N, K in SHAPES:
            torch.manual_seed(0)
            w, ws = ops.weight_quant(torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.05, dtype=qd)
            bias = torch.randn(N, device=dev, dtype=torch.bfloat16) * 0.1
            for M in (80, 128):
                x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
                use(None)
                a, a_s = ops.act_quant(x, dtype=qd)
                outs = {b: ops.scaled_mm(a, a_s, w, ws, bias=bias, backend=b) for b in ("triton", "triton[gluon]")}
                times = {}
                for v in VARIANTS:
                    use(v)
                    outs[v] = ops.scaled_mm(a, a_s, w, ws, bias=bias, backend="triton")
                    outs[f"once {v}"] = ops.quant_linear(x, w, ws, bias, backend="triton")
                    if v == "unsplit":
                        times["mm"] = gpu_time_us(lambda: ops.scaled_mm(a, a_s, w, ws, bias=bias, backend="triton"))
                        times["once"] = gpu_time_us(lambda: ops.quant_linear(x, w, ws, bias, backend="triton"))
                names = list(outs)
                classes = []
                for n in names:
                    home = next((c for c in classes if torch.equal(outs[c[0]], outs[n])), None)
                    (home.append(n) if home is not None else classes.append([n]))
                print(f"{qd} {M}x{N}x{K}: equal classes {classes}; unsplit GPU us mm {times['mm']:.1f} "
                      f"once {times['once']:.1f}", flush=True)

    torch.manual_seed(0)
    base = decoder.DecodeModel(4096, 4, 32000, dev)
    models = {"bf16": base, **{q: qnn.quantize_model(copy.deepcopy(base), dtype=d)
                               for q, d in (("fp8", torch.float8_e4m3fn), ("int8", torch.int8))}}
    variants = [("bf16", None)] + [(q, v) for q in ("fp8", "int8") for v in (None, *VARIANTS)]
    for batch in (96, 128):
        states = {k: decoder.DecodeState.new(m, batch, 256) for k, m in models.items()}
        times = {v: [] for v in variants}
        for _ in range(5):
            for q, v in variants:
                use(v)
                with (quantcore.priority("triton") if v else contextlib.nullcontext()):
                    step = lambda: decoder.decode_step(models[q], states[q])
                    for _ in range(4):
                        step()
                    times[(q, v)].append(loop_us(step, 32))
        bf = statistics.median(times[("bf16", None)])
        print(f"batch {batch} eager: " + " | ".join(f"{q} {v or 'shipped'} {statistics.median(t):7.1f} us "
                                                  f"(x{bf / statistics.median(t):.3f})" for (q, v), t in times.items()),
              flush=True)
