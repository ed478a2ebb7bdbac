"""Round-22 probe (on the GPU machine, its Triton 3.6 ptxas): the wide tile (128x256 in 64-column sub-tiles) at
4096x32768x512 FP8, plain, with a bf16 bias and with a bias and a re-quantized output, compiled through
tests/backends/test_gluon_compile.py; per kernel the SASS count, local stores and loads, ptxas's spill bytes,
and for each local store (STL) the instruction that last wrote its register. bias_spill.txt is its output.

Usage (repository root, OUT a writable folder): PYTHONPATH=. OUT=dir python3 docs/bench/round22/bias_spill.py
"""
import os
import re
import subprocess
import sys

sys.path.insert(0, "tests/backends")
from test_gluon_compile import compiled
from triton.backends.nvidia.compiler import get_ptxas
ptxas = get_ptxas(90).path
B = os.path.dirname(ptxas)
W = dict(block_n=256, sub_n=64, producer_regs=24)
cases = {"wide plain": dict(), "wide bias": dict(bias="bfloat16"), "wide bias rq": dict(bias="bfloat16", out_quant="float8_e4m3fn")}
out = os.environ["OUT"]
for name, c in cases.items():
    k = compiled(M=4096, N=32768, K=512, qdtype="float8_e4m3fn", config=W, **c)
    tmp = out + "/" + name.replace(" ", "_")
    open(tmp + ".ptx", "w").write(k["ptx"])
    subprocess.run([ptxas, "--gpu-name", "sm_90a", tmp + ".ptx", "-o", tmp + ".cubin"], check=True)
    sass = subprocess.run([B + "/nvdisasm", "-c", tmp + ".cubin"], capture_output=True, text=True).stdout
    open(tmp + ".sass", "w").write(sass)
    lines = [l for l in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", l)]
    # each STL and the instruction that last wrote its source register before it
    stl = [i for i, l in enumerate(lines) if "STL" in l]
    print(name, "SASS", len(lines), "STL", len(stl), "LDL", sum("LDL" in l for l in lines),
          re.findall(r"(\d+) bytes spill stores", k["ptxas"]), flush=True)
    for i in stl:
        src = re.findall(r"STL[^\]]*\], (R\d+)", lines[i])
        prev = next((lines[j].strip()[:70] for j in range(i - 1, max(i - 40, 0), -1) if src and re.search(r"\s" + src[0] + r"\b,", lines[j])), "")
        print("   ", lines[i].strip()[:60], "<-", prev)
