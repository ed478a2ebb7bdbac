"""Device probe of the Gluon block-scaled GEMM (quantcore/backends/triton/kernels/gluon_gemm.py) on an H100.

Run from the repository root:  PYTHONPATH=$PWD OUT=<dir> python3 .scratch/gluon_probe.py
Optional: PROBE_BUDGET_S (default 200: M = 16384 runs only while the time lasts), PROBE_QUICK=1 (one shape).

Per case: compiles and runs each Gluon configuration through its launch (gluon_launch.scaled_mm, the
registry is not needed), checks it against the torch reference (ops.scaled_mm backend="torch", on a
sample of rows for large M) with the relative Frobenius error, beside the existing Triton kernel's,
and times it (quantcore.bench.timing.gpu_time_us: CUDA events, L2 flushed, median) beside cuBLAS
block-wise FP8 / torch._int_mm and the existing Triton kernel. One line per case; every exception is
printed with its traceback and the run goes on. Writes $OUT/gluon_probe.json.
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
BUDGET_S = float(os.environ.get("PROBE_BUDGET_S", "200"))
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

import quantcore  # noqa: E402
from quantcore import capability, ops  # noqa: E402
from quantcore.bench.baselines import cublas_blockwise_fp8, gemm_flops, int_mm  # noqa: E402
from quantcore.bench.timing import gpu_time_us  # noqa: E402
from quantcore.specs.tolerances import rel_error  # noqa: E402

gll = guarded("import gluon_launch", __import__, "quantcore.backends.triton.gluon_launch", fromlist=["x"])
CONFIGS = {}
if gll is not None:
    CONFIGS = {
        "maxpipe": gll.GluonConfig(pipeline=True),           # the default: as many stages as fit, pipelined pairs
        "maxplain": gll.GluonConfig(pipeline=False),         # one wgmma in flight per warpgroup (DeepGEMM's schedule)
        "s4pipe": gll.GluonConfig(stages=4, pipeline=True),  # a shorter ring
    }
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


def gluon_runner(cfg, a, a_s, b, b_s, *, bias=None, activation=None, out_dtype=torch.bfloat16, block=(128, 128)):
    """The prepared Gluon launch for these operands: run(a, a_s, b, b_s, bias) -> out."""
    return gll.scaled_mm.prepare(a, a_s, b, b_s, block_n=block[0], block_k=block[1], bias=bias, activation=activation,
                                 out_dtype=out_dtype, out_quant=None, out_group=128, ue8m0_out=False, eps=1e-4,
                                 profile=PROFILE, config=cfg)


def tflops(m, n, k, us):
    return None if us is None else gemm_flops(m, n, k) / us / 1e6


def fmt_num(x, spec="7.1f"):
    return f"{x:{spec}}" if isinstance(x, (int, float)) else f"{'-':>7}"


def gemm_case(fmt, m, n, k, *, time_it=True, reps=20):
    """Correctness and timing of every Gluon config, the Triton kernel and the vendor baseline on one shape."""
    qdtype = FMTS[fmt]
    rec = dict(kind="gemm", fmt=fmt, m=m, n=n, k=k, gluon={}, gluon_err={}, gluon_err_fp32=None)
    a, a_s, b, b_s = gen(m, n, k, qdtype)
    rows = rows_sample(m)
    ref = guarded(f"{fmt} {m}x{n}x{k} reference", reference, a, a_s, b, b_s, rows)

    tri = guarded(f"{fmt} {m}x{n}x{k} triton fp32", lambda: ops.scaled_mm(a, a_s, b, b_s, out_dtype=torch.float32,
                                                                          backend="triton"))
    rec["triton_err_fp32"] = err(tri, ref, rows)
    del tri
    for name, cfg in CONFIGS.items():
        def one(cfg=cfg):
            run = gluon_runner(cfg, a, a_s, b, b_s)
            out1 = run(a, a_s, b, b_s)
            out2 = run(a, a_s, b, b_s)  # the second call goes through the direct launcher
            if not torch.equal(out1.view(torch.int16), out2.view(torch.int16)):
                log(f"!! {fmt} {m}x{n}x{k} {name}: the second (direct) launch differs from the first")
                rec.setdefault("nondeterministic", []).append(name)
            rec["gluon_err"][name] = err(out1, ref, rows)
            rec.setdefault("gluon_nan", {})[name] = bool(out1.isnan().any())
            del out1, out2
            if time_it:
                rec["gluon"][name] = gpu_time_us(lambda: run(a, a_s, b, b_s), reps=reps)
        guarded(f"{fmt} {m}x{n}x{k} gluon {name}", one)
    if CONFIGS:
        def fp32_err():
            run = gluon_runner(next(iter(CONFIGS.values())), a, a_s, b, b_s, out_dtype=torch.float32)
            rec["gluon_err_fp32"] = err(run(a, a_s, b, b_s), ref, rows)
        guarded(f"{fmt} {m}x{n}x{k} gluon fp32 out", fp32_err)
    if time_it:
        rec["triton"] = guarded(f"{fmt} {m}x{n}x{k} triton time", gpu_time_us,
                                lambda: ops.scaled_mm(a, a_s, b, b_s, backend="triton"), reps=reps)
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
    best = max((r, name) for name, r in rates.items() if r) if any(rates.values()) else (None, None)
    vendor, tri = tflops(m, n, k, rec.get("vendor")), tflops(m, n, k, rec.get("triton"))
    rec.update(gluon_tflops=rates, best=best[1], best_tflops=best[0], vendor_tflops=vendor, triton_tflops=tri,
               ratio_vendor=best[0] / vendor if best[0] and vendor else None,
               ratio_triton=best[0] / tri if best[0] and tri else None)
    cfgs = " ".join(f"{name}={fmt_num(r, '6.0f')}" for name, r in rates.items())
    errs = " ".join(f"{name}:{fmt_num(e, '.1e')}" for name, e in rec["gluon_err"].items())
    log(f"{rec['fmt']:>4} M={m:<5} N={n:<5} K={k:<5} | gluon best {fmt_num(best[0], '6.0f')} ({best[1]}) [{cfgs}]"
        f" | triton {fmt_num(tri, '6.0f')} | {rec.get('vendor_name', 'vendor')} {fmt_num(vendor, '6.0f')}"
        f" | x{fmt_num(rec['ratio_vendor'], '.2f')} vendor, x{fmt_num(rec['ratio_triton'], '.2f')} triton"
        f" | err fp32 gluon {fmt_num(rec['gluon_err_fp32'], '.2e')} triton {fmt_num(rec.get('triton_err_fp32'), '.2e')}"
        f" | err bf16 {errs}")


def epilogue_case(fmt, m, n, k, *, bias_dtype, activation, out_dtype, block=(128, 128)):
    """A fused epilogue (bias, activation, out dtype) against the reference, default config."""
    qdtype = FMTS[fmt]
    a, a_s, b, b_s = gen(m, n, k, qdtype, seed=1, block=block)
    bias = torch.randn(n, device="cuda").to(bias_dtype) if bias_dtype else None
    ref = reference(a, a_s, b, b_s, None, block=block, bias=bias, activation=activation)
    run = gluon_runner(gll.DEFAULT, a, a_s, b, b_s, bias=bias, activation=activation, out_dtype=out_dtype, block=block)
    out = run(a, a_s, b, b_s, bias)
    tri = ops.scaled_mm(a, a_s, b, b_s, bias=bias, activation=activation, out_dtype=out_dtype, block_size=block,
                        backend="triton")
    rec = dict(kind="epilogue", fmt=fmt, m=m, n=n, k=k, bias=str(bias_dtype), activation=activation,
               out=str(out_dtype), block=block, gluon_err=rel_error(out.float(), ref),
               triton_err=rel_error(tri.float(), ref), nan=bool(out.isnan().any()))
    log(f"epilogue {fmt} {m}x{n}x{k} block={block} bias={bias_dtype} act={activation} out={out_dtype}: "
        f"err gluon {rec['gluon_err']:.2e} triton {rec['triton_err']:.2e} nan={rec['nan']}")
    RECORDS.append(rec)


def nonfinite_case(fmt):
    """A NaN in one activation block and an Inf in one weight block: the output's non-finite pattern
    must equal the reference's (rows of the NaN block, columns of the Inf block), the rest finite."""
    m, n, k = 300, 1000, 1000
    g = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(m, k, generator=g, device="cuda")
    w = torch.randn(n, k, generator=g, device="cuda")
    x[17, 300] = float("nan")
    w[513, 900] = float("inf")
    a, a_s = ops.act_quant(x, dtype=FMTS[fmt], backend="triton")
    b, b_s = ops.weight_quant(w, dtype=FMTS[fmt], backend="triton")
    ref = reference(a, a_s, b, b_s, None)
    out = gluon_runner(gll.DEFAULT, a, a_s, b, b_s, out_dtype=torch.float32)(a, a_s, b, b_s)
    same = bool(torch.equal(out.isfinite(), ref.isfinite()))
    fin = ref.isfinite()
    rec = dict(kind="nonfinite", fmt=fmt, same_pattern=same, nonfinite_ref=int((~fin).sum()),
               nonfinite_gluon=int((~out.isfinite()).sum()), err_finite=rel_error(out[fin], ref[fin]))
    log(f"nonfinite {fmt}: same pattern {same} (ref {rec['nonfinite_ref']}, gluon {rec['nonfinite_gluon']} "
        f"non-finite), err elsewhere {rec['err_finite']:.2e}")
    RECORDS.append(rec)


def registry_case():
    """The registry path, where the final commit adds it: backend='triton[gluon]' and explain()."""
    a, a_s, b, b_s = gen(512, 2112, 7168, torch.float8_e4m3fn)
    log("explain:", quantcore.explain("scaled_mm", a, a_s, b, b_s, backend="triton[gluon]"))
    out = ops.scaled_mm(a, a_s, b, b_s, out_dtype=torch.float32, backend="triton[gluon]")
    rec = dict(kind="registry", err=rel_error(out, reference(a, a_s, b, b_s, None)))
    log(f"registry triton[gluon] fp8 512x2112x7168: err {rec['err']:.2e}")
    auto = quantcore.explain("scaled_mm", a, a_s, b, b_s)
    rec["auto_selected"] = auto.selected
    log(f"automatic selection still runs {auto.selected}")
    RECORDS.append(rec)


def ql_case():
    """quant_linear through the Gluon variant's launch (Triton act_quant + Gluon GEMM) vs its two ops."""
    m, n, k = 1000, 2112, 7168
    g = torch.Generator(device="cuda").manual_seed(9)
    x = torch.randn(m, k, generator=g, device="cuda", dtype=torch.bfloat16)
    w, w_s = ops.weight_quant(torch.randn(n, k, generator=g, device="cuda"), backend="triton")
    out = gll.quant_linear(x, w, w_s, block_n=128, block_k=128, bias=None, activation=None, out_dtype=torch.float32,
                           ue8m0=False, eps=1e-4, profile=PROFILE)
    a, a_s = ops.act_quant(x, backend="triton")
    two = gluon_runner(gll.DEFAULT, a, a_s, w, w_s, out_dtype=torch.float32)(a, a_s, w, w_s)
    same = bool(torch.equal(out, two))
    log(f"quant_linear gluon == act_quant + gluon scaled_mm bit for bit: {same}")
    RECORDS.append(dict(kind="quant_linear", same=same))


def write():
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "gluon_probe.json")
    with open(path, "w") as f:
        json.dump(dict(env=ENV, configs={k: repr(v) for k, v in CONFIGS.items()}, records=RECORDS,
                       elapsed_s=time.time() - T0), f, indent=1, default=str)
    log(f"wrote {path} ({time.time() - T0:.0f} s)")


def summary():
    for fmt in FMTS:
        for m in (512, 4096, 16384):
            rs = [r for r in RECORDS if r.get("kind") == "gemm" and r["fmt"] == fmt and r["m"] == m
                  and r.get("ratio_vendor")]
            if rs:
                geo = math.exp(sum(math.log(r["ratio_vendor"]) for r in rs) / len(rs))
                worst = min(r["ratio_vendor"] for r in rs)
                log(f"summary {fmt} M={m}: best gluon / {rs[0]['vendor_name']} geomean x{geo:.2f}, worst x{worst:.2f} "
                    f"over {len(rs)} shapes")


def main():
    if not CONFIGS:
        log("no Gluon launch: nothing to probe")
        return
    quick = os.environ.get("PROBE_QUICK") == "1"
    # Tails first (correctness on odd sizes, K not a multiple of 16 included), then the bench shapes.
    for fmt in FMTS:
        for m, n, k in [(300, 1000, 1000), (129, 264, 7296), (1, 7168, 2048), (600, 1000, 1040)]:
            guarded(f"tail {fmt} {m}x{n}x{k}", gemm_case, fmt, m, n, k, time_it=False)
    for fmt in FMTS:
        guarded(f"nonfinite {fmt}", nonfinite_case, fmt)
    for fmt, m, n, k, bias, act, out, block in [
            ("fp8", 512, 2112, 7168, torch.bfloat16, "gelu", torch.float32, (128, 128)),
            ("fp8", 300, 1000, 1000, torch.float32, "silu", torch.float16, (128, 128)),
            ("int8", 512, 2112, 7168, torch.float16, "gelu_tanh", torch.bfloat16, (128, 128)),
            ("fp8", 512, 2112, 7168, None, None, torch.bfloat16, (64, 128)),
            ("int8", 300, 1000, 1000, None, None, torch.float32, (96, 64))]:
        guarded(f"epilogue {fmt} {act} {block}", epilogue_case, fmt, m, n, k, bias_dtype=bias, activation=act,
                out_dtype=out, block=block)
    guarded("quant_linear", ql_case)
    guarded("registry", registry_case)
    write()
    shapes = NK[:1] if quick else NK
    for m in (512, 4096):
        for fmt in FMTS:
            for n, k in shapes:
                guarded(f"{fmt} {m}x{n}x{k}", gemm_case, fmt, m, n, k)
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
