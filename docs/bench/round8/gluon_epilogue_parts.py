"""Round-8 probe (H100): which part of the Gluon GEMM's fused epilogue costs what, on 4096x24576x1536 and
4096x7168x2048 (FP8): bias alone, SiLU alone, both, GELU alone, each in the shipped tile (`config_for`:
128x256 in 64-column sub-tiles) and in the 128x128 default without sub-tiles; the tiled Triton kernel
beside them. GPU time (quantcore.bench.timing.gpu_time_us), and time over the plain GEMM of the same
configuration.

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round8/gluon_epilogue_parts.py
"""
import torch

from quantcore import capability, ops
from quantcore.backends.triton import gluon_launch as gll
from quantcore.bench.timing import gpu_time_us

profile = capability.profile_for(torch.device("cuda"))
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
for M, N, K in ((4096, 24576, 1536), (4096, 7168, 2048)):
    torch.manual_seed(0)
    a, a_s = ops.act_quant(torch.randn(M, K, device="cuda", dtype=torch.bfloat16), dtype=torch.float8_e4m3fn)
    w, w_s = ops.weight_quant(torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05, dtype=torch.float8_e4m3fn)
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    parts = {"plain": (None, None), "bias": (bias, None), "silu": (None, "silu"), "bias+silu": (bias, "silu"),
             "gelu": (None, "gelu")}
    for label, cfg in (("config_for", gll.config_for(M, N, 128, None)), ("128x128", gll.DEFAULT)):
        times = {}
        for part, (b, act) in parts.items():
            run = gll.scaled_mm.prepare(a, a_s, w, w_s, block_n=128, block_k=128, bias=b, activation=act,
                                        out_dtype=torch.bfloat16, out_quant=None, out_group=128, ue8m0_out=False,
                                        eps=1e-4, profile=profile, config=cfg)
            times[part] = gpu_time_us(lambda: run(a, a_s, w, w_s, b))
        print(f"gluon {label:10s} {M}x{N}x{K}: plain {times['plain']:.1f} us; " + ", ".join(
            f"{p} x{t / times['plain']:.2f}" for p, t in times.items() if p != "plain"), flush=True)
    times = {part: gpu_time_us(lambda: ops.scaled_mm(a, a_s, w, w_s, bias=b, activation=act, backend="triton"))
             for part, (b, act) in parts.items()}
    print(f"tiled triton     {M}x{N}x{K}: plain {times['plain']:.1f} us; " + ", ".join(
        f"{p} x{t / times['plain']:.2f}" for p, t in times.items() if p != "plain"), flush=True)
