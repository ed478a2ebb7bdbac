"""Round-14 probe (H100): the Gluon GEMM's staged epilogue in a partition of its own (4 warps fed
through shared memory by the consumer warpgroups, `gluon_gemm._epilogue`) against the epilogue from
the MMA's registers and against the plain GEMM.

Per format (FP8, INT8), M in MS, the six bench shapes and epilogue (plain bf16, bf16 bias, bias + SiLU,
bias + GELU, a re-quantized output, bias + GELU re-quantized): GPU time of the default tile with the
epilogue in the consumers' registers (e0) and staged 8 or 16 rows a step (e8, e16) with producer /
epilogue register budgets, and of `config_for`'s wide tile at 4096 rows where N allows; every staged
output compared with the register epilogue's of the same tile (bit for bit expected). Variants whose
GluonConfig fields this tree lacks are left out, so that the same script times an older tree.

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round14/epilogue_probe.py [out.json], with
PROBE_MS (rows, default 512,4096) and PROBE_STAGED (split: the own-rows sweep; final: the defaults and
the picked configuration; else the first comparison) in the environment.
GPU times: quantcore.bench.timing.gpu_time_us (CUDA events, L2 flushed, median of 15).
"""
import dataclasses
import os
import sys
import traceback
from pathlib import Path

import torch

from quantcore import capability
from quantcore.backends.triton import gluon_launch as gll
from quantcore.bench.timing import gpu_time_us

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "round9"))
import harness  # noqa: E402
from gluon_staged import FMTS, SHAPES, operands, same  # noqa: E402  (round 9's operands and bitwise comparison)
from harness import geomean  # noqa: E402
MS = [int(m) for m in os.environ.get("PROBE_MS", "512,4096").split(",")]
EPILOGUES = {"plain": dict(), "bias": dict(bias=True), "bias+silu": dict(bias=True, activation="silu"),
             "bias+gelu": dict(bias=True, activation="gelu"), "requant": dict(requant=True),
             "bias+gelu+requant": dict(bias=True, activation="gelu", requant=True)}
# PROBE_STAGED=split: the consumers' own share of the staged epilogue (GluonConfig.own_rows) swept, with the
# epilogue partition of 4 warps beside pipelined consumers or of 8 beside unpipelined ones (split_warps.txt;
# the 8-warp field, `epilogue_warps`, was removed after it, and its variants are now left out). split.txt
# came from the list before it: own_rows 0, 8, 16, 24, 32, 48, 64 at 8 rows a step ("e8o…") and 0-64 by 16
# at 16 rows with 64 partition registers ("e16o…"), producer 24 ("e0p24" the register epilogue).
if os.environ.get("PROBE_STAGED") == "split":
    STAGED = {"e0p24": dict(epi_rows=0, producer_regs=24), "e0np": dict(epi_rows=0, producer_regs=24, pipeline=False)}
    STAGED.update({f"e8w4o{o}": dict(epi_rows=8, producer_regs=24, own_rows=o) for o in (0, 16, 32)})
    STAGED.update({f"e8w8o{o}": dict(epi_rows=8, producer_regs=24, own_rows=o, epilogue_warps=8, pipeline=False)
                   for o in (0, 8, 16, 32)})
    EPILOGUES.pop("bias")
    WIDE = False
elif os.environ.get("PROBE_STAGED") == "final":
    # What the library runs: the staged epilogue at its defaults, and the configuration scaled_mm picks
    # itself ("picked": config None); on an older tree the same names time that tree's choices.
    STAGED = {"e8": dict(epi_rows=8)}
    WIDE = False
else:
    STAGED = {"e8": dict(epi_rows=8), "e8p24": dict(epi_rows=8, producer_regs=24),
              "e16p24": dict(epi_rows=16, producer_regs=24, epilogue_regs=64)}
    WIDE = True
dev = "cuda"
profile = capability.profile_for(torch.device(dev))
FIELDS = {f.name for f in dataclasses.fields(gll.GluonConfig)}


def variants(M, N, epi):
    out = {"default e0": dataclasses.replace(gll.DEFAULT, epi_rows=0)}
    out.update({f"default {k}": dataclasses.replace(gll.DEFAULT, **v) for k, v in STAGED.items() if set(v) <= FIELDS
                and (WIDE or bool(v["epi_rows"]) == bool(epi))})
    if os.environ.get("PROBE_STAGED") == "final":
        out["picked"] = None
    wide = gll.config_for(M, N, 128, 128 if epi.get("requant") else None)
    if WIDE and M >= 4096 and wide.block_n != 128:
        out.update({f"wide{wide.block_n} e0": dataclasses.replace(wide, epi_rows=0),
                    f"wide{wide.block_n} e8": dataclasses.replace(wide, epi_rows=8)})
    return out


def runner(cfg, a, a_s, w, w_s, bias, epi):
    run = gll.scaled_mm.prepare(a, a_s, w, w_s, block_n=128, block_k=128, bias=bias if epi.get("bias") else None,
                                activation=epi.get("activation"), out_dtype=torch.bfloat16,
                                out_quant=a.dtype if epi.get("requant") else None, out_group=128, ue8m0_out=False,
                                eps=1e-4, profile=profile, config=cfg)
    b = bias if epi.get("bias") else None
    return lambda: run(a, a_s, w, w_s, b)


def cases():
    for fname, fmt in FMTS.items():
        for M in MS:
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
                    if not same(outs[name], outs["default e0" if name == "picked" else name.split(" ")[0] + " e0"]):
                        row["mismatch"].append(name)
                rows.append(row)
                cells = " ".join(f"{k} {v:6.1f}" for k, v in row.items() if isinstance(v, float))
                print(f"{fname:4s} {M:4d}x{N:5d}x{K:<5d} {e:18s} {cells}"
                      + (f" MISMATCH {row['mismatch']}" if row["mismatch"] else ""), flush=True)
            except Exception:
                traceback.print_exc()
    print("\nGeomean over the six shapes: time / the plain GEMM's default e0 (same format, M)")
    for fname in FMTS:
        for M in MS:
            plain = {(r["N"], r["K"]): r["default e0"] for r in rows if r["fmt"] == fname and r["M"] == M
                     and r["epilogue"] == "plain"}
            for e in EPILOGUES:
                rs = [r for r in rows if r["fmt"] == fname and r["M"] == M and r["epilogue"] == e]
                if not rs:
                    continue
                cells = []
                for k in [k for k in rs[0] if isinstance(rs[0][k], float)]:
                    vals = [r[k] / plain[(r["N"], r["K"])] for r in rs if k in r]
                    if len(vals) == len(rs):
                        cells.append(f"{k} {geomean(vals):.3f}")
                print(f"{fname} M={M} {e:18s} " + "; ".join(cells), flush=True)
    return rows


if __name__ == "__main__":
    harness.main(__file__, measure, warm)
