"""Round-9 probe (H100): the Gluon GEMM's epilogue staged through shared memory (`GluonConfig.epi_rows`)
against the epilogue from the MMA's registers, and against the tiled Triton kernel.

ncu (round9/gluon_ncu_*.txt) put 42 % of the bias + GELU kernel's warp stall samples on instruction
fetch: the epilogue unrolled over the 64 elements a consumer thread holds, in each of the two consumer
warpgroups' copies of the code. Staged, each warpgroup stores its fp32 sub-tile to shared memory and
runs the epilogue on `epi_rows` rows at a time in a loop.

Per format (FP8, INT8), M in (512, 4096), the six bench shapes and epilogue (plain bf16, bf16 bias,
bias + SiLU, bias + GELU, a re-quantized output, bias + GELU re-quantized): GPU time of the default
tile with epi_rows 0 (registers), 8, 16 and 32, of `config_for`'s tile (wide at 4096 rows where N
allows) with 0 and 8, and of the tiled kernel; every staged output compared with the register
epilogue's of the same tile (bit for bit expected). Kernels are compiled first by worker processes
(harness.py).

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round9/gluon_staged.py [out.json]
GPU times: quantcore.bench.timing.gpu_time_us (CUDA events, L2 flushed, median of 15).
"""
import dataclasses
import traceback

import torch

from quantcore import capability, ops
from quantcore.backends.triton import gluon_launch as gll
from quantcore.bench.timing import gpu_time_us

import harness
from harness import geomean

SHAPES = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168), (7168, 16384), (32768, 512)]
FMTS = {"fp8": torch.float8_e4m3fn, "int8": torch.int8}
EPILOGUES = {"plain": dict(), "bias": dict(bias=True), "bias+silu": dict(bias=True, activation="silu"),
             "bias+gelu": dict(bias=True, activation="gelu"), "requant": dict(requant=True),
             "bias+gelu+requant": dict(bias=True, activation="gelu", requant=True)}
dev = "cuda"
profile = capability.profile_for(torch.device(dev))


def variants(M, N, epi):
    wide = gll.config_for(M, N, 128, 128 if epi.get("requant") else None)
    out = {f"default e{r}": dataclasses.replace(gll.DEFAULT, epi_rows=r) for r in (0, 8, 16, 32)}
    if wide != gll.DEFAULT:
        out.update({f"wide{wide.block_n} e{r}": dataclasses.replace(wide, epi_rows=r) for r in (0, 8)})
    return out


def operands(M, N, K, fmt):
    torch.manual_seed(0)
    a, a_s = ops.act_quant(torch.randn(M, K, device=dev, dtype=torch.bfloat16), dtype=fmt)
    w, w_s = ops.weight_quant(torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.05, dtype=fmt)
    return a, a_s, w, w_s, torch.randn(N, device=dev, dtype=torch.bfloat16)


def runner(cfg, a, a_s, w, w_s, bias, epi):
    run = gll.scaled_mm.prepare(a, a_s, w, w_s, block_n=128, block_k=128, bias=bias if epi.get("bias") else None,
                                activation=epi.get("activation"), out_dtype=torch.bfloat16,
                                out_quant=a.dtype if epi.get("requant") else None, out_group=128, ue8m0_out=False,
                                eps=1e-4, profile=profile, config=cfg)
    b = bias if epi.get("bias") else None
    return lambda: run(a, a_s, w, w_s, b)


def cases():
    for fname, fmt in FMTS.items():
        for M in (512, 4096):
            for N, K in SHAPES:
                yield fname, fmt, M, N, K


def warm(worker, workers):
    jobs = [(c, e, v) for c in cases() for e in EPILOGUES for v in variants(c[2], c[3], EPILOGUES[e])]
    for i, ((fname, fmt, M, N, K), e, v) in enumerate(jobs):
        if i % workers == worker:
            try:
                a, a_s, w, w_s, bias = operands(M, N, K, fmt)
                runner(variants(M, N, EPILOGUES[e])[v], a, a_s, w, w_s, bias, EPILOGUES[e])()
            except Exception:
                traceback.print_exc()
    torch.cuda.synchronize()


def same(x, y):
    if isinstance(x, tuple):
        return all(same(p, q) for p, q in zip(x, y))
    bits = (lambda t: t.view(torch.uint8) if t.element_size() == 1 else t)  # noqa: E731 (FP8 compared as bits)
    return torch.equal(bits(x), bits(y))


def measure():
    rows = []
    for fname, fmt, M, N, K in cases():
        a, a_s, w, w_s, bias = operands(M, N, K, fmt)
        for e, epi in EPILOGUES.items():
            try:
                row = dict(fmt=fname, M=M, N=N, K=K, epilogue=e, mismatch=[])
                outs = {}
                for name, cfg in variants(M, N, epi).items():
                    run = runner(cfg, a, a_s, w, w_s, bias, epi)
                    outs[name] = run()
                    row[name] = gpu_time_us(run)
                for name in outs:
                    base = name.split(" ")[0] + " e0"
                    if not same(outs[name], outs[base]):
                        row["mismatch"].append(name)
                kw = dict(bias=bias if epi.get("bias") else None, activation=epi.get("activation"))
                if epi.get("requant"):
                    kw.update(out_quant=fmt)
                row["tiled"] = gpu_time_us(lambda: ops.scaled_mm(a, a_s, w, w_s, backend="triton", **kw))
                rows.append(row)
                cells = " ".join(f"{k} {v:6.1f}" for k, v in row.items() if isinstance(v, float))
                print(f"{fname:4s} {M:4d}x{N:5d}x{K:<5d} {e:18s} {cells}"
                      + (f" MISMATCH {row['mismatch']}" if row["mismatch"] else ""), flush=True)
            except Exception:
                traceback.print_exc()
    print("\nGeomean over the six shapes: time / the plain GEMM's default e0 (same format, M)")
    for fname in FMTS:
        for M in (512, 4096):
            plain = {(r["N"], r["K"]): r["default e0"] for r in rows if r["fmt"] == fname and r["M"] == M
                     and r["epilogue"] == "plain"}
            for e in EPILOGUES:
                rs = [r for r in rows if r["fmt"] == fname and r["M"] == M and r["epilogue"] == e]
                if not rs:
                    continue
                keys = [k for k in rs[0] if isinstance(rs[0][k], float)]
                cells = []
                for k in keys:
                    vals = [r[k] / plain[(r["N"], r["K"])] for r in rs if k in r]
                    if len(vals) == len(rs):
                        cells.append(f"{k} {geomean(vals):.3f}")
                print(f"{fname} M={M} {e:18s} " + "; ".join(cells), flush=True)
    return rows


if __name__ == "__main__":
    harness.main(__file__, measure, warm)
