"""Round-21 probe (H100): the re-quantized epilogue per tile. `compile`: each configuration compiled offline
through tests/backends/test_gluon_compile.py with the installed Triton's ptxas (SASS instructions, local
loads and stores, ptxas's wgmma-serialization warnings, spills, registers); `time`: FP8 and INT8 at
4096×32768×512 and 4096×7168×2048, the default tile, 128×256 in 64-column sub-tiles and 128×128 in
64-column sub-tiles, each plain and re-quantized per 1×128 and 1×64, timed interleaved (CUDA events, L2
flushed, median of 15). tile_probe_first.txt: with the kernel's first version of groups over sub-tiles;
tile_probe.txt: after its scales were stored from their own layout.

Usage (repository root, tests/ on PYTHONPATH): python3 docs/bench/round21/tile_probe.py compile|time
"""
import sys, re, json, subprocess, os, dataclasses
sys.path.insert(0, "tests/backends"); sys.path.insert(0, "docs/bench/round9")
if sys.argv[1] == "compile":
    from test_gluon_compile import compiled
    from triton.backends.nvidia.compiler import get_ptxas
    B = os.path.dirname(get_ptxas(90).path)
    cases = {
     "wide plain": dict(config=dict(block_n=256, sub_n=64, producer_regs=24)),
     "wide rq128": dict(out_quant="float8_e4m3fn", config=dict(block_n=256, sub_n=64, producer_regs=24)),
     "wide rq64": dict(out_quant="float8_e4m3fn", out_group=64, config=dict(block_n=256, sub_n=64, producer_regs=24)),
     "128/64 rq128": dict(out_quant="float8_e4m3fn", config=dict(sub_n=64)),
     "default rq128": dict(out_quant="float8_e4m3fn"),
     "default plain": dict(),
    }
    for name, c in cases.items():
        k = compiled(M=4096, N=7168, K=2048, qdtype="float8_e4m3fn", **c)
        tmp = "/tmp/" + name.replace(" ", "_").replace("/", "_")
        open(tmp + ".ptx", "w").write(k["ptx"])
        log = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name", "sm_90a", tmp + ".ptx", "-o", tmp + ".cubin"], capture_output=True, text=True).stderr
        sass = subprocess.run([B + "/nvdisasm", "-c", tmp + ".cubin"], capture_output=True, text=True).stdout
        ins = [l for l in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", l)]
        spills, regs = re.findall(r"(\d+) bytes spill stores", log), re.findall(r"Used (\d+) registers", log)
        warn = "C751" in log
        print(f"{name:14s} SASS {len(ins)} STL {sum('STL' in l for l in ins)} LDL {sum('LDL' in l for l in ins)} "
              f"warn {warn} spills {spills} regs {regs}", flush=True)
        if "C751" in log: print(log[-1500:])
    sys.exit()
import torch
from gluon_staged import operands, profile
from quantcore.backends.triton import gluon_launch as gll
from quantcore.bench.timing import gpu_times_us
CFG = {"default": gll.DEFAULT, "wide256": gll.WIDE[0], "128/64": gll.GluonConfig(sub_n=64)}
for fmt in (torch.float8_e4m3fn, torch.int8):
    for N, K in ((32768, 512), (7168, 2048)):
        a, a_s, w, w_s, bias = operands(4096, N, K, fmt)
        fns, names = [], []
        for cname, cfg in CFG.items():
            for group in (None, 128, 64):
                run = gll.scaled_mm.prepare(a, a_s, w, w_s, block_n=128, block_k=128, bias=None, activation=None,
                                            out_dtype=torch.bfloat16, out_quant=None if group is None else fmt,
                                            out_group=group or 128, ue8m0_out=False, eps=1e-4, profile=profile, config=cfg)
                fns.append(lambda run=run: run(a, a_s, w, w_s, None)); names.append(f"{cname} {'plain' if group is None else 'rq' + str(group)}")
        for f in fns: f()
        ts = gpu_times_us(fns)
        print(str(fmt)[6:], N, K, "  ".join(f"{n} {t:.1f}" for n, t in zip(names, ts)), flush=True)
