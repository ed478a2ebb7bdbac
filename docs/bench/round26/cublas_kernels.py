"""Round-26 probe (H100): the kernels cuBLAS runs for `torch._scaled_mm` block-wise FP8 (`bench.baselines`) on six
GEMMs of the bench shapes, from one profiled call each (torch.profiler).

Usage: PYTHONPATH=.:docs/bench/round24 python3 docs/bench/round26/cublas_kernels.py > cublas_kernels.txt
"""
import torch
from stagger_probe import operands, FMTS
from quantcore.bench import baselines
from torch.profiler import profile, ProfilerActivity
for M, N, K in [(4096, 4096, 7168), (16384, 4096, 7168), (16384, 7168, 16384), (4096, 7168, 16384),
                (16384, 2112, 7168), (16384, 7168, 2048)]:
    a, a_s, w, w_s, _ = operands(M, N, K, FMTS["fp8"])
    fn = baselines.cublas_blockwise_fp8(a, a_s, w, w_s)
    fn(); torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        fn(); torch.cuda.synchronize()
    names = {e.name for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA}
    print(M, N, K, sorted(names), flush=True)
