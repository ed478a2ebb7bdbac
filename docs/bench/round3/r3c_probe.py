"""Round-3 probe c: decode kernel at M = 64..256 (native FP8 and simulated sm80 W8A16) against the
tiled kernel and cuBLAS; M = 64 decode config sweep."""
import os, sys, traceback
from dataclasses import replace
import torch
import quantcore
from quantcore import ops, registry, capability
from quantcore.bench.timing import gpu_time_us
from quantcore.bench import baselines
from quantcore.backends.triton import configs
dev = "cuda"
SHAPES = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168), (7168, 16384), (32768, 512)]
orig_m_max, orig_cfg = configs.decode_m_max, configs.decode_config
def data(M, N, K, fmt=torch.float8_e4m3fn):
    a, a_s = ops.act_quant(torch.randn(M, K, device=dev, dtype=torch.bfloat16), dtype=fmt)
    w, w_s = ops.weight_quant(torch.randn(N, K, device=dev, dtype=torch.bfloat16), dtype=fmt)
    return a, a_s, w, w_s
def timed(m_max, args, backend="triton"):
    configs.decode_m_max = lambda profile: m_max
    registry.reset()
    try:
        return gpu_time_us(lambda: ops.scaled_mm(*args, backend=backend))
    finally:
        configs.decode_m_max = orig_m_max
        registry.reset()
print("== decode (m_max 256) vs tiled (m_max 0), us", flush=True)
for sim, fmt in ((None, torch.float8_e4m3fn), ("sm80", torch.float8_e4m3fn), ("sm80", torch.int8)):
    for M in (64, 128, 256):
        for N, K in SHAPES:
            try:
                args = data(M, N, K, fmt)
                bf = gpu_time_us(baselines.bf16_mm(M, N, K))
                if sim:
                    with capability.simulate(sim):
                        d, t = timed(256, args), timed(0, args)
                    cub = None
                else:
                    d, t = timed(256, args), timed(0, args)
                    try:
                        cub = gpu_time_us(baselines.cublas_blockwise_fp8(*args))
                    except Exception:
                        cub = None
                print(f"{sim or 'sm90':5s} {str(fmt)[6:]:13s} M={M:3d} {N:6d}x{K:<6d} decode {d:7.1f} tiled {t:7.1f} cublas-blockwise {cub and round(cub,1)} bf16 {bf:6.1f}  decode/tiled {t/d:.2f} bf16/decode {bf/d:.2f}", flush=True)
            except Exception:
                traceback.print_exc()
print("\n== M=64 decode config sweep (FP8 and INT8), us", flush=True)
prof = capability.profile_for(dev)
for fmt in (torch.float8_e4m3fn,):
    for N, K in ((2112, 7168), (4096, 7168), (7168, 2048)):
        args = data(64, N, K, fmt)
        res = []
        base = gpu_time_us(lambda: ops.scaled_mm(*args, backend="triton"))
        for bn, w, st in ((64, 4, 4), (128, 4, 4), (128, 8, 3), (64, 8, 4)):
            kbs = -(-K // 128)
            for split in sorted({1, 2, 4, max(1, round(264 / -(-N // bn)))}):
                per = -(-kbs // split)
                cfg = configs.DecodeConfig(64, bn, w, st, -(-kbs // per), per)
                configs.decode_config = lambda *a, cfg=cfg, **k: cfg
                registry.reset()
                try:
                    t = gpu_time_us(lambda: ops.scaled_mm(*args, backend="triton"))
                    res.append((t, f"{bn}/{w}/{st}/s{cfg.split_k}"))
                except Exception as e:
                    res.append((float("inf"), f"{bn}/{w}/{st}/s{cfg.split_k}:ERR {type(e).__name__}"))
                finally:
                    configs.decode_config = orig_cfg
                    registry.reset()
        res.sort()
        print(f"{str(fmt)[6:]:14s} M=64 {N:6d}x{K:<6d} current {base:6.1f} best {res[0][1]} {res[0][0]:6.1f} | " + " ".join(f"{n}:{t:.1f}" for t, n in res), flush=True)
print("done")
