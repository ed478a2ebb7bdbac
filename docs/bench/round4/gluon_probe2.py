"""Device probe 2 of the Gluon block-scaled GEMM (quantcore/backends/triton/kernels/gluon_gemm.py) on an H100:
the wide-tile configurations (GluonConfig block_n / sub_n / producer_regs / group_m) beside the default.

Run from the repository root:  PYTHONPATH=$PWD OUT=<dir> python3 .scratch/gluon_probe2.py
Optional: PROBE_BUDGET_S (default 165: M = 16384 runs only while the time lasts), PROBE_QUICK=1 (one shape).
Derived from docs/bench/round3/gluon_probe.py.

1. Correctness of every configuration on tails (M, N, K not multiples of the tiles, K not a multiple
   of 16, N not 16-byte aligned), the non-finite confinement, fused epilogues and a re-quantized output:
   each output against the torch reference (relative Frobenius error), and bit for bit against the
   default configuration's (the sub-tiled schedule multiplies the same K blocks with the same
   instructions per element and promotes with the same FMA: equal outputs are expected); re-quantized
   codes and scales bit for bit against the tiled Triton kernel's.
2. Timing (quantcore.bench.timing.gpu_time_us: CUDA events, L2 flushed, median) of every configuration,
   cuBLAS block-wise FP8 / torch._int_mm, at M = 4096 and 16384 on the six shapes, FP8 and INT8 (bf16
   out); each timed output also compared with the default's bit for bit, and the default's against the
   reference on a sample of rows.
One line per case; every exception is printed with its traceback and the run goes on. Writes
$OUT/gluon_probe2.json; ends with the geomean ratios per configuration.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback

import torch

T0 = time.time()
BUDGET_S = float(os.environ.get("PROBE_BUDGET_S", "165"))
OUT = os.environ.get("OUT", ".")
RECORDS: list[dict] = []


def log(*args):
    print(*args, flush=True)


def guarded(what, fn, *args, **kwargs):
    """fn(*args, **kwargs), or None after printing the exception with its traceback."""
    try:
        return fn(*args, **kwargs)
    except Exception:  # noqa: BLE001 - the probe must report everything and go on
        log(f"!! {what} FAILED:\n{traceback.format_exc()}")
        RECORDS.append(dict(kind="exception", what=what, traceback=traceback.format_exc()))
        return None


def environment():
    import triton

    import quantcore
    from quantcore import capability
    p = capability.profile_for("cuda")
    env = dict(device=torch.cuda.get_device_name(), cc=p.compute_capability, sm_count=p.sm_count,
               smem=p.smem_per_block, torch=torch.__version__, cuda=torch.version.cuda, triton=triton.__version__,
               quantcore=getattr(quantcore, "__version__", "?"))
    log("env:", env)
    return env


ENV = guarded("environment", environment) or {}

from quantcore import capability, ops  # noqa: E402
from quantcore.bench.baselines import cublas_blockwise_fp8, gemm_flops, int_mm  # noqa: E402
from quantcore.bench.timing import gpu_time_us  # noqa: E402
from quantcore.specs.tolerances import rel_error  # noqa: E402

gll = guarded("import gluon_launch", __import__, "quantcore.backends.triton.gluon_launch", fromlist=["x"])
CONFIGS = {}
if gll is not None:
    CONFIGS = {
        "base": gll.DEFAULT,  # 128x128, pipelined pairs of K blocks, as many stages as fit (6 with bf16 out)
        "n128s64": gll.GluonConfig(sub_n=64),  # 128x128 in two 64-column sub-tiles, overlapped within a K block
        "n192s64": gll.GluonConfig(block_n=192, sub_n=64),  # 128x192: 17% less A+B traffic per FLOP, 4 stages
        "n256s64": gll.GluonConfig(block_n=256, sub_n=64, producer_regs=24),  # 128x256: 25% less, 4 stages
        "g16": gll.GluonConfig(group_m=16),  # the default tile, 16 row tiles per L2 group
    }
# Correctness is checked on the configurations whose kernels differ (g16 only reorders tiles), on few
# compiled variants each: every variant is a Gluon compile of ~2 s, and the probe has ~3 minutes.
CHECKED = [name for name in CONFIGS if name != "g16"]
PROFILE = capability.profile_for("cuda")
FMTS = {"fp8": torch.float8_e4m3fn, "int8": torch.int8}
NK = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168), (7168, 16384), (32768, 512)]
SAMPLE_ROWS = 384


def gen(m, n, k, qdtype, seed=0, block=(128, 128)):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, generator=g, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, generator=g, device="cuda", dtype=torch.bfloat16)
    a, a_s = ops.act_quant(x, dtype=qdtype, group_size=block[1], backend="triton")
    b, b_s = ops.weight_quant(w, dtype=qdtype, block_size=block, backend="triton")
    return a, a_s, b, b_s


def rows_sample(m):
    """All rows for small M, else the first and last rows and a random middle sample."""
    if m <= 1024:
        return None
    g = torch.Generator().manual_seed(m)
    mid = torch.randint(128, m - 128, (SAMPLE_ROWS - 256,), generator=g)
    return torch.cat([torch.arange(128), mid, torch.arange(m - 128, m)]).cuda()


def reference(a, a_s, b, b_s, rows, block=(128, 128), **kw):
    if rows is not None:  # FP8 rows gathered as bytes (index kernels may lack the FP8 dtype)
        a, a_s = a.view(torch.uint8)[rows].view(a.dtype), a_s[rows]
    return ops.scaled_mm(a, a_s, b, b_s, block_size=block, out_dtype=torch.float32, backend="torch", **kw)


def err(out, ref, rows):
    if out is None or ref is None:
        return None
    o = out if rows is None else out[rows]
    return rel_error(o.float(), ref)


def same(x, y) -> bool:
    """Bit for bit (NaNs alike)."""
    if x.dtype.itemsize == 1:
        return bool(torch.equal(x.view(torch.uint8), y.view(torch.uint8)))
    bits = {2: torch.int16, 4: torch.int32}[x.dtype.itemsize]
    return bool(torch.equal(x.view(bits), y.view(bits)))


def gluon_runner(cfg, a, a_s, b, b_s, *, bias=None, activation=None, out_dtype=torch.bfloat16, block=(128, 128),
                 out_quant=None, out_group=128, ue8m0_out=False):
    """The prepared Gluon launch for these operands: run(a, a_s, b, b_s, bias) -> out (or (q, scale))."""
    return gll.scaled_mm.prepare(a, a_s, b, b_s, block_n=block[0], block_k=block[1], bias=bias, activation=activation,
                                 out_dtype=out_dtype, out_quant=out_quant, out_group=out_group, ue8m0_out=ue8m0_out,
                                 eps=1e-4, profile=PROFILE, config=cfg)


def tflops(m, n, k, us):
    return None if us is None else gemm_flops(m, n, k) / us / 1e6


def fmt_num(x, spec="7.1f"):
    return f"{x:{spec}}" if isinstance(x, (int, float)) else f"{'-':>7}"


def check_case(fmt, m, n, k, *, block=(128, 128), bias_dtype=None, activation=None, out_dtype=torch.float32,
               nonfinite=False):
    """Every configuration on one small case: error against the reference, bit for bit the default's."""
    qdtype = FMTS[fmt]
    if nonfinite:
        g = torch.Generator(device="cuda").manual_seed(5)
        x, w = torch.randn(m, k, generator=g, device="cuda"), torch.randn(n, k, generator=g, device="cuda")
        x[17, 300], w[513, 900] = float("nan"), float("inf")
        a, a_s = ops.act_quant(x, dtype=qdtype, group_size=block[1], backend="triton")
        b, b_s = ops.weight_quant(w, dtype=qdtype, block_size=block, backend="triton")
    else:
        a, a_s, b, b_s = gen(m, n, k, qdtype, seed=1, block=block)
    bias = torch.randn(n, device="cuda").to(bias_dtype) if bias_dtype else None
    ref = reference(a, a_s, b, b_s, None, block=block, bias=bias, activation=activation)
    fin = ref.isfinite()
    rec = dict(kind="check", fmt=fmt, m=m, n=n, k=k, block=block, bias=str(bias_dtype), activation=activation,
               out=str(out_dtype), nonfinite=nonfinite, err={}, same_as_base={}, same_pattern={})
    outs = {}
    for name in CHECKED:
        def one(name=name, cfg=CONFIGS[name]):
            out = gluon_runner(cfg, a, a_s, b, b_s, bias=bias, activation=activation, out_dtype=out_dtype,
                               block=block)(a, a_s, b, b_s, bias)
            outs[name] = out
            rec["err"][name] = rel_error(out[fin].float(), ref[fin])
            rec["same_pattern"][name] = bool(torch.equal(out.isfinite(), fin))
            if "base" in outs:
                rec["same_as_base"][name] = same(out, outs["base"])
        guarded(f"check {fmt} {m}x{n}x{k} {name}", one)
    tri = ops.scaled_mm(a, a_s, b, b_s, bias=bias, activation=activation, out_dtype=out_dtype, block_size=block,
                        backend="triton")
    rec["triton_err"] = rel_error(tri[fin].float(), ref[fin])
    errs = " ".join(f"{name}:{fmt_num(e, '.2e')}" for name, e in rec["err"].items())
    eq = " ".join(f"{name}:{'=' if s else 'DIFF'}" for name, s in rec["same_as_base"].items() if name != "base")
    bad = [name for name, s in rec["same_pattern"].items() if not s]
    log(f"check {fmt:>4} {m}x{n}x{k} block={block} bias={bias_dtype} act={activation} out={out_dtype}"
        f"{' nonfinite' if nonfinite else ''} | err {errs} triton:{rec['triton_err']:.2e} | vs base {eq}"
        f"{' | NON-FINITE PATTERN DIFFERS: ' + ','.join(bad) if bad else ''}")
    RECORDS.append(rec)


def requant_case(fmt, m, n, k, group, ue8m0):
    """A re-quantized output (bias, SiLU first) per configuration whose sub-tile the group divides:
    codes and scales bit for bit the tiled Triton kernel's."""
    qdtype = FMTS[fmt]
    a, a_s, b, b_s = gen(m, n, k, qdtype, seed=2)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    tq, ts = ops.scaled_mm(a, a_s, b, b_s, bias=bias, activation="silu", out_quant=qdtype, out_group_size=group,
                           out_scale_fmt="ue8m0" if ue8m0 else "fp32", backend="triton")
    f32_tiled = ops.scaled_mm(a, a_s, b, b_s, bias=bias, activation="silu", out_dtype=torch.float32, backend="triton")
    rec = dict(kind="requant", fmt=fmt, m=m, n=n, k=k, group=group, ue8m0=ue8m0, same_codes={}, same_scales={},
               same_fp32={})
    for name in CHECKED:
        if CONFIGS[name].sub % group:
            continue

        def one(name=name, cfg=CONFIGS[name]):
            q, s = gluon_runner(cfg, a, a_s, b, b_s, bias=bias, activation="silu", out_quant=qdtype, out_group=group,
                                ue8m0_out=ue8m0)(a, a_s, b, b_s, bias)
            f32 = gluon_runner(cfg, a, a_s, b, b_s, bias=bias, activation="silu", out_dtype=torch.float32)(
                a, a_s, b, b_s, bias)
            rec["same_fp32"][name] = same(f32, f32_tiled)
            rec["same_codes"][name] = same(q, tq)
            rec["same_scales"][name] = same(s, ts)
        guarded(f"requant {fmt} {m}x{n}x{k} g{group} {name}", one)
    res = " ".join(f"{name}:{'codes=' if rec['same_codes'][name] else 'codesDIFF'},"
                   f"{'scales=' if rec['same_scales'][name] else 'scalesDIFF'},"
                   f"{'fp32=' if rec['same_fp32'][name] else 'fp32DIFF'}" for name in rec["same_codes"])
    log(f"requant {fmt:>4} {m}x{n}x{k} group={group} ue8m0={ue8m0} vs tiled triton | {res}")
    RECORDS.append(rec)


def gemm_case(fmt, m, n, k, *, reps=20):
    """Timing of every configuration and the vendor baseline on one shape, outputs checked."""
    qdtype = FMTS[fmt]
    rec = dict(kind="gemm", fmt=fmt, m=m, n=n, k=k, gluon={}, same_as_base={})
    a, a_s, b, b_s = gen(m, n, k, qdtype)
    rows = rows_sample(m)
    ref = guarded(f"{fmt} {m}x{n}x{k} reference", reference, a, a_s, b, b_s, rows)
    base_out = None
    for name, cfg in CONFIGS.items():
        def one(name=name, cfg=cfg):
            nonlocal base_out
            run = gluon_runner(cfg, a, a_s, b, b_s)
            out = run(a, a_s, b, b_s)
            if base_out is None:
                base_out = out
                rec["base_err"] = err(out, ref, rows)
            else:
                rec["same_as_base"][name] = same(out, base_out)
                del out
            rec["gluon"][name] = gpu_time_us(lambda: run(a, a_s, b, b_s), reps=reps)
        guarded(f"{fmt} {m}x{n}x{k} gluon {name}", one)
    del base_out
    if fmt == "fp8":
        call = guarded(f"{fmt} {m}x{n}x{k} cublas", cublas_blockwise_fp8, a, a_s, b, b_s)
        rec["vendor_name"] = "cublas_blockwise"
    else:
        call = guarded(f"{fmt} {m}x{n}x{k} int_mm", int_mm, a, b)
        rec["vendor_name"] = "int_mm"
    rec["vendor"] = guarded(f"{fmt} {m}x{n}x{k} vendor time", gpu_time_us, call, reps=reps) if call else None
    report(rec)
    RECORDS.append(rec)
    del a, a_s, b, b_s, ref
    torch.cuda.empty_cache()


def report(rec):
    m, n, k = rec["m"], rec["n"], rec["k"]
    rates = {name: tflops(m, n, k, us) for name, us in rec["gluon"].items()}
    vendor = tflops(m, n, k, rec.get("vendor"))
    best = max((r, name) for name, r in rates.items() if r) if any(rates.values()) else (None, None)
    rec.update(gluon_tflops=rates, vendor_tflops=vendor, best=best[1], best_tflops=best[0],
               ratio_vendor={name: r / vendor for name, r in rates.items() if r and vendor})
    cfgs = " ".join(f"{name}={fmt_num(r, '5.0f')}" for name, r in rates.items())
    eq = "".join("" if s else f" {name}:DIFF" for name, s in rec["same_as_base"].items())
    log(f"{rec['fmt']:>4} M={m:<5} N={n:<5} K={k:<5} | {cfgs} | {rec.get('vendor_name')} {fmt_num(vendor, '5.0f')}"
        f" | best {best[1]} x{fmt_num(best[0] / vendor if best[0] and vendor else None, '.2f')}"
        f" | base err {fmt_num(rec.get('base_err'), '.1e')} | vs base {'all =' if not eq else eq}")


def write():
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "gluon_probe2.json")
    with open(path, "w") as f:
        json.dump(dict(env=ENV, configs={k: repr(v) for k, v in CONFIGS.items()}, records=RECORDS,
                       elapsed_s=time.time() - T0), f, indent=1, default=str)
    log(f"wrote {path} ({time.time() - T0:.0f} s)")


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def summary():
    for fmt in FMTS:
        for m in (4096, 16384):
            rs = [r for r in RECORDS if r.get("kind") == "gemm" and r["fmt"] == fmt and r["m"] == m and r["vendor"]]
            if not rs:
                continue
            parts = []
            for name in CONFIGS:
                xs = [r["ratio_vendor"][name] for r in rs if name in r["ratio_vendor"]]
                if xs:
                    parts.append(f"{name} x{geomean(xs):.2f} (worst x{min(xs):.2f})")
            best = [max(r["ratio_vendor"].values()) for r in rs if r["ratio_vendor"]]
            log(f"summary {fmt} M={m} / {rs[0]['vendor_name']} over {len(rs)} shapes: " + ", ".join(parts)
                + (f"; best per shape x{geomean(best):.2f} (worst x{min(best):.2f})" if best else ""))


def main():
    if not CONFIGS:
        log("no Gluon launch: nothing to probe")
        return
    quick = os.environ.get("PROBE_QUICK") == "1"
    # fp32 out: rows of 1001 elements take masked stores, the others TMA stores.
    for fmt in FMTS:
        for m, n, k in [(300, 1001, 1000), (129, 264, 7296), (600, 1000, 1040), (520, 2112, 7168)]:
            guarded(f"check {fmt} {m}x{n}x{k}", check_case, fmt, m, n, k)
        guarded(f"check {fmt} nonfinite", check_case, fmt, 300, 1000, 1000, nonfinite=True)
    guarded("check epilogue fp8", check_case, "fp8", 520, 2112, 7168, bias_dtype=torch.bfloat16, activation="gelu",
            out_dtype=torch.bfloat16)
    guarded("check block 96x64", check_case, "fp8", 600, 1000, 1040, block=(96, 64))
    guarded("requant fp8", requant_case, "fp8", 520, 2112, 7168, 64, True)
    write()
    shapes = NK[:1] if quick else NK
    for fmt in FMTS:
        for n, k in shapes:
            guarded(f"{fmt} 4096x{n}x{k}", gemm_case, fmt, 4096, n, k)
    write()
    for fmt in FMTS:
        for n, k in shapes:
            if time.time() - T0 > BUDGET_S:
                log(f"time budget ({BUDGET_S:.0f} s) spent: M=16384 {fmt} {n}x{k} and later skipped")
                break
            guarded(f"{fmt} 16384x{n}x{k}", gemm_case, fmt, 16384, n, k, reps=10)
    summary()
    write()


if __name__ == "__main__":
    guarded("main", main)
    sys.exit(0)
