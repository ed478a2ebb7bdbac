"""Round-29 probe (H100): the plain Gluon GEMM with and without `yield_patch`'s rewrite of the promotion FMAs'
hints, run back to back for PHASE seconds each, alternating, twice per case, in one process (the patched cubin
loaded beside the compiled one and swapped into the plan's launcher), while `nvidia-smi` samples the SM clock
and the power draw every 50 ms: the time per call under the 700 W cap, where the interleaved probe
(`yield_probe.py`) lets the clock recover between repetitions. Both functions' outputs are compared bit for bit.

Usage: python3 yield_sustained.py OUT_DIR [VARIANT=dg]
"""
import os
import sys

import torch
from triton.runtime import driver

sys.path.insert(0, os.path.dirname(__file__))
import yield_patch  # noqa: E402
from sustained import Phases  # noqa: E402
from quantcore import capability, ops  # noqa: E402
from quantcore.backends.triton import gluon_launch as gl  # noqa: E402
from quantcore.backends.triton.direct import Launcher  # noqa: E402

PROFILE = capability.profile_for("cuda")
out_dir = sys.argv[1]
VARIANT = sys.argv[2] if len(sys.argv) > 2 else "dg"
CASES = [("int8", 16384, 4096, 7168), ("int8", 4096, 24576, 1536), ("int8", 16384, 32768, 512),
         ("int8", 16384, 7168, 16384), ("fp8", 16384, 7168, 16384), ("fp8", 16384, 4096, 7168)]
FMTS = {"fp8": torch.float8_e4m3fn, "int8": torch.int8}


def launcher_of(run) -> Launcher:
    return next(c.cell_contents for c in run.__closure__ if isinstance(c.cell_contents, Launcher))


notes = []
with Phases(f"{out_dir}/smi_yield.csv") as phases:
    for fmt, m, n, k in CASES:
        g = torch.Generator(device="cuda").manual_seed(m + n + k)
        a, a_s = ops.act_quant(torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g), dtype=FMTS[fmt])
        b, b_s = ops.weight_quant(torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g), dtype=FMTS[fmt])
        run = gl.scaled_mm.prepare(a, a_s, b, b_s, block_n=128, block_k=128, bias=None, activation=None,
                                   out_dtype=torch.bfloat16, out_quant=None, out_group=128, ue8m0_out=False, eps=1e-4,
                                   profile=PROFILE, config=gl.config_for(m, n, k, 128, None))
        run(a, a_s, b, b_s)
        L = launcher_of(run)
        compiled = L._compiled
        new, changed = yield_patch.patched(compiled.kernel, compiled.name, VARIANT)
        _, function, *_ = driver.active.utils.load_binary(compiled.name, new, compiled.metadata.shared,
                                                           torch.cuda.current_device())
        heads = {"none": L._head, VARIANT: (function, ) + L._head[1:]}
        outs = {}
        for name, head in heads.items():
            L._head = head
            outs[name] = run(a, a_s, b, b_s).view(torch.int16).clone()
        same = all(torch.equal(o, outs["none"]) for o in outs.values())
        notes.append(f"{fmt} {m}x{n}x{k}: {changed} FFMAs rewritten, same bits: {same}")
        torch.cuda.synchronize()
        for _ in range(2):
            for name, head in heads.items():
                L._head = head
                phases.run(f"{fmt} {m}x{n}x{k}", name, lambda: run(a, a_s, b, b_s))
        L._head = heads["none"]
        del a, b, outs
        torch.cuda.empty_cache()
print("\n".join(notes))
print(phases.table("hints"))
