"""Round-7 probe (H100, as simulate("sm80")): decode-kernel launches for FP8 data without FP8 MMA at
M = 1, 4 and 16 on 7168x2048, the one decode shape where the W8A16 GEMM ran no faster than the bf16 GEMM
(0.95-0.99x): GPU time (`gpu_time_us`) beside the bf16 GEMM, and each launch's relative distance from
the table's output (another split sums in another order).

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round7/w8a16_decode_sweep.py
"""
import torch

import quantcore
from quantcore import dispatch, ops
from quantcore.backends.triton import configs
from quantcore.bench import baselines
from quantcore.bench.timing import gpu_time_us

table = configs.decode_config
CANDIDATES = [(64, 4, 4, 2), (64, 4, 4, 1), (64, 8, 4, 1), (64, 8, 4, 2), (32, 4, 4, 1), (32, 4, 6, 1),
              (32, 4, 4, 2), (128, 8, 4, 2), (128, 4, 4, 4), (128, 8, 4, 4), (64, 4, 6, 2), (64, 4, 3, 4)]


def timed(a, a_s, w, w_s, cfg=None):
    """GPU time and output of ops.scaled_mm as sm80, with the decode launch `cfg` (block_n, warps, stages,
    splits) or the table's."""
    def pick(profile, M, N, K, **kw):
        base = table(profile, M, N, K, **kw)
        if cfg is None:
            return base
        bn, warps, stages, split = cfg
        kbs = -(-K // 128)
        per = -(-kbs // split)
        return configs.DecodeConfig(base.block_m, bn, warps, stages, -(-kbs // per), per)
    configs.decode_config = pick
    dispatch._plans.clear()
    with quantcore.simulate("sm80"):
        out = ops.scaled_mm(a, a_s, w, w_s, out_dtype=torch.float32)
        return gpu_time_us(lambda: ops.scaled_mm(a, a_s, w, w_s, out_dtype=torch.float32)), out


print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
for N, K in [(7168, 2048)]:
    for M in (1, 4, 16):
        torch.manual_seed(0)
        a, a_s = ops.act_quant(torch.randn(M, K, device="cuda", dtype=torch.bfloat16))
        w, w_s = ops.weight_quant(torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05)
        bf = gpu_time_us(baselines.bf16_mm(M, N, K))
        t0, ref = timed(a, a_s, w, w_s)
        line = [f"M={M} {N}x{K}: bf16 {bf:.1f} | table {t0:.1f} ({bf / t0:.2f}x)"]
        for cfg in CANDIDATES:
            try:
                t, out = timed(a, a_s, w, w_s, cfg)
            except Exception as e:  # out of shared memory and the like
                line.append(f"{cfg} failed {type(e).__name__}")
                continue
            # Another split sums in another order: compare with the reference's tolerance instead of bits.
            rel = ((out - ref).norm() / ref.norm()).item()
            line.append(f"{cfg} {t:.1f} ({bf / t:.2f}x, {rel:.0e})")
        print(" | ".join(line), flush=True)
configs.decode_config = table
