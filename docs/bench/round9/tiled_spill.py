"""Round-9 offline check (the CPU machine: Triton 3.9, its ptxas for sm_90a, no GPU): registers and spills
of the tiled GEMM's launch at M = 128 for sm_90, with a bf16 output and re-quantized (min_block_n = 128
widens the table's first candidate, [128, 64, 4, 4], to 128 x 128 on 4 warps).

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round9/tiled_spill.py N K
"""
import re, subprocess, tempfile, sys
from pathlib import Path
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource
from triton.runtime.jit import mangle_type
from quantcore.backends.triton import launch
from quantcore.backends.triton.direct import _kernel_view
from quantcore.capability import simulated_profile

class Offline:
    def __init__(self, fn, grid, constants, device, descriptors=None):
        self.fn, self.constants = fn, dict(constants)
    def __call__(self, *args):
        opts = {k: self.constants.pop(k) for k in ("num_warps", "num_stages") if k in self.constants}
        sig, const = {}, {}
        for name, arg in zip(self.fn.arg_names, map(_kernel_view, args)):
            sig[name] = "constexpr" if arg is None else mangle_type(arg)
            if arg is None: const[name] = None
        for name in self.fn.arg_names[len(args):]:
            sig[name], const[name] = "constexpr", self.constants[name]
        k = triton.compile(ASTSource(self.fn, sig, constexprs=const), target=GPUTarget("cuda", 90, 32), options=opts)
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "k.ptx").write_text(k.asm["ptx"])
            log = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name", "sm_90a", f"{tmp}/k.ptx", "-o", f"{tmp}/k.cubin"], capture_output=True, text=True)
        print(self.fn.__name__, {k: v for k, v in self.constants.items() if k in ("BLOCK_M", "BLOCK_N", "OUT")}, opts,
              re.findall(r"(\d+ bytes spill stores, \d+ bytes spill loads|Used \d+ registers)", log.stdout + log.stderr))
launch.Launcher = Offline
p = simulated_profile("sm90")
M, N, K = 128, int(sys.argv[1]), int(sys.argv[2])
a = torch.zeros(M, K, dtype=torch.int8).view(torch.float8_e4m3fn); b = torch.zeros(N, K, dtype=torch.int8).view(torch.float8_e4m3fn)
for oq in (None, torch.float8_e4m3fn):
    launch._gemm(a, torch.ones(M, K // 128), b, torch.ones(N // 128, K // 128), None,
                 torch.empty(M, N, dtype=oq or torch.bfloat16), torch.empty(M, N // 128) if oq else None,
                 block_n=128, block_k=128, activation=None, out_group=128, ue8m0_out=False, eps=1e-4, profile=p, mma="fp8")(
        a, torch.ones(M, K // 128), b, torch.ones(N // 128, K // 128), None, torch.empty(M, N, dtype=oq or torch.bfloat16), torch.empty(M, N // 128) if oq else None)
