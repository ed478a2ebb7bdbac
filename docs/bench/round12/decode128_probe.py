"""Round-12 probe (H100): the decode GEMM to 128 rows, and quant_linear in one launch there.

From 65 rows a quantized linear is act_quant + the tiled GEMM (INT8) or the Gluon GEMM (FP8): two launches,
~50 µs of host time a call on the H100 host against ~20 for the one launch of 1-64 rows
(`layer_profile.txt`). Here the sm_90 table is patched (a copy of `configs/`, `configs._DIR`) so that the
decode kernel serves M <= 128 with one of VARIANTS (a rule for 65-128 rows put before the table's
any-M rules), and quant_linear quantizes once per launch up to 128 rows for every weight. Per format, M
(80, 128) and shape (the six DeepSeek-V3 ones and the decode model's three): GPU time (`timing.gpu_time_us`)
of scaled_mm on the decode kernel (each variant), on the shipped table's Triton kernel (tiled), on the
Gluon GEMM and on cuBLAS (FP8); the once quant_linear's GPU and eager time against the shipped two
launches' (the table's choice); and whether the once launch is bit for bit act_quant + scaled_mm on the
decode kernel. Then the model's eager step (dim 4096, 4 layers) at batch 128 and 96, bf16 against FP8
and INT8 with the shipped table and with the best variant (quantcore.priority("triton")), interleaved.

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round12/decode128_probe.py [out.json]
"""
import contextlib
import copy
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import torch

import quantcore
from quantcore import capability, ops, registry
from quantcore import nn as qnn
from quantcore.backends.triton import configs
from quantcore.bench import decoder
from quantcore.bench.timing import eager_time_us, gpu_time_us, loop_us

dev = torch.device("cuda")
SHAPES = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168), (7168, 16384), (32768, 512),
          (4096, 4096), (16384, 4096), (4096, 16384)]
VARIANTS = {"n64w4": ([64, 4, 4], 2), "n64w8": ([64, 8, 4], 2), "n128w8": ([128, 8, 3], 1)}
SHIPPED = configs._DIR
TMP = Path(tempfile.mkdtemp())


def use(variant):
    """The shipped tables (None) or the sm_90 table with the decode kernel to 128 rows as `variant`."""
    if variant is None:
        configs._DIR = SHIPPED
    else:
        for f in SHIPPED.glob("*.json"):
            shutil.copy(f, TMP)
        t = json.loads((SHIPPED / "sm_90.json").read_text())
        dec = t["decode"]
        dec["m_max"] = 128
        cfg, waves = VARIANTS[variant]
        at = next(i for i, r in enumerate(dec["rules"]) if r["m_max"] is None)
        dec["rules"].insert(at, {"mma": None, "m_max": 128, "n_max": None, "k_max": None, "config": cfg,
                                 "waves": waves, "min_kb_per_split": 2})
        dec["fused"] = [r if r.get("quantize") != "once" else {"m_max": 128, "quantize": "once"} for r in dec["fused"]]
        (TMP / "sm_90.json").write_text(json.dumps(t))
        configs._DIR = TMP
    registry.reset()


def same(u, v):
    return u.shape == v.shape and torch.equal(u, v)


print(torch.cuda.get_device_name(), torch.__version__, capability.versions(), flush=True)
rows = []
with torch.inference_mode():
    for qd in (torch.float8_e4m3fn, torch.int8):
        fmt = {torch.float8_e4m3fn: "fp8_e4m3", torch.int8: "int8"}[qd]
        for N, K in SHAPES:
            torch.manual_seed(0)
            w, ws = ops.weight_quant(torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.05, dtype=qd)
            bias = torch.randn(N, device=dev, dtype=torch.bfloat16) * 0.1
            for M in (80, 128):
                x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
                row = dict(fmt=fmt, M=M, N=N, K=K)
                use(None)
                a, a_s = ops.act_quant(x, dtype=qd)
                gemms = {"tiled": "triton", "gluon": "triton[gluon]"} | ({"cublas": "torch[cublas]"} if fmt == "fp8_e4m3" else {})
                for name, backend in gemms.items():
                    row[f"mm_{name}"] = gpu_time_us(lambda: ops.scaled_mm(a, a_s, w, ws, bias=bias, backend=backend))
                two = lambda: ops.quant_linear(x, w, ws, bias)
                row["ql_two_gpu"], row["ql_two_eager"] = gpu_time_us(two), eager_time_us(two)
                row["ql_two_impl"] = quantcore.explain("quant_linear", x, w, ws, bias).selected
                for v in VARIANTS:
                    use(v)
                    mm = lambda: ops.scaled_mm(a, a_s, w, ws, bias=bias, backend="triton")
                    once = lambda: ops.quant_linear(x, w, ws, bias, backend="triton")
                    row[f"mm_{v}"] = gpu_time_us(mm)
                    row[f"ql_{v}_gpu"], row[f"ql_{v}_eager"] = gpu_time_us(once), eager_time_us(once)
                    row[f"same_{v}"] = same(once(), mm())
                rows.append(row)
                best = min(VARIANTS, key=lambda v: row[f"mm_{v}"])
                print(f"{fmt} {M}x{N}x{K}: mm GPU " + " ".join(f"{k[3:]} {row[k]:.1f}" for k in row if k.startswith("mm_"))
                      + f" | ql two[{row['ql_two_impl']}] {row['ql_two_gpu']:.1f}/{row['ql_two_eager']:.1f} "
                      + " ".join(f"{v} {row[f'ql_{v}_gpu']:.1f}/{row[f'ql_{v}_eager']:.1f}" for v in VARIANTS)
                      + f" | same {[row[f'same_{v}'] for v in VARIANTS]} best {best}", flush=True)
    for v in VARIANTS:
        for fmt in ("fp8_e4m3", "int8"):
            sel = [r for r in rows if r["fmt"] == fmt]
            g = lambda key: statistics.geometric_mean([r[key] for r in sel])
            print(f"geomean {fmt} {v}: mm decode / tiled {g(f'mm_{v}') / g('mm_tiled'):.3f}, / gluon "
                  f"{g(f'mm_{v}') / g('mm_gluon'):.3f}; ql once / two GPU {g(f'ql_{v}_gpu') / g('ql_two_gpu'):.3f}, "
                  f"eager {g(f'ql_{v}_eager') / g('ql_two_eager'):.3f}", flush=True)
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps(rows, indent=1))

    best = min(VARIANTS, key=lambda v: statistics.geometric_mean([r[f"mm_{v}"] for r in rows]))
    print(f"model A/B with {best}", flush=True)
    torch.manual_seed(0)
    base = decoder.DecodeModel(4096, 4, 32000, dev)
    models = {"bf16": base, **{q: qnn.quantize_model(copy.deepcopy(base), dtype=d)
                               for q, d in (("fp8", torch.float8_e4m3fn), ("int8", torch.int8))}}
    variants = [("bf16", None), ("fp8", None), ("int8", None), ("fp8", best), ("int8", best)]
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
