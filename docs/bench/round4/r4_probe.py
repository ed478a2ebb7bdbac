"""Round-4 probe (prepared without a GPU): torch[bf16_dequant] alternatives at large M; M = 64 decode sweep."""
import functools, os, sys, traceback
import torch
import torch.nn.functional as F
from quantcore import ops, registry, capability
from quantcore.bench.timing import gpu_time_us
from quantcore.bench import baselines
from quantcore.backends.triton import configs
dev = "cuda"
SHAPES = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168), (7168, 16384), (32768, 512)]
print("== bf16_dequant alternatives, FP8 data, us (bf16 GEMM beside)", flush=True)
for M in (128, 4096):
    for N, K in SHAPES:
        try:
            a, a_s = ops.act_quant(torch.randn(M, K, device=dev, dtype=torch.bfloat16))
            w, w_s = ops.weight_quant(torch.randn(N, K, device=dev, dtype=torch.bfloat16))
            wb = ops.weight_dequant(w, w_s, out_dtype=torch.bfloat16)
            cur = gpu_time_us(lambda: ops.scaled_mm(a, a_s, w, w_s, backend="torch[bf16_dequant]"))
            ours32 = gpu_time_us(lambda: torch.mm(ops.act_dequant(a, a_s, out_dtype=torch.bfloat16),
                                                  ops.weight_dequant(w, w_s, out_dtype=torch.bfloat16).t(),
                                                  out_dtype=torch.float32).to(torch.bfloat16))
            ours16 = gpu_time_us(lambda: F.linear(ops.act_dequant(a, a_s, out_dtype=torch.bfloat16),
                                                  ops.weight_dequant(w, w_s, out_dtype=torch.bfloat16)))
            cached = gpu_time_us(lambda: F.linear(ops.act_dequant(a, a_s, out_dtype=torch.bfloat16), wb))
            mm32 = gpu_time_us(lambda: torch.mm(ops.act_dequant(a, a_s, out_dtype=torch.bfloat16), wb.t(),
                                                out_dtype=torch.float32))
            bf = gpu_time_us(baselines.bf16_mm(M, N, K))
            print(f"M={M:5d} {N:6d}x{K:<6d} current {cur:8.1f} | quantcore dequant + mm fp32-out {ours32:8.1f}, "
                  f"+ bf16-out {ours16:8.1f}, cached weight bf16-out {cached:8.1f}, cached fp32-out {mm32:8.1f} | "
                  f"bf16 {bf:8.1f}", flush=True)
        except Exception:
            traceback.print_exc()
print("\n== M = 64 decode config sweep, us", flush=True)
orig_cfg = configs.decode_config
for fmt in (torch.float8_e4m3fn, torch.int8):
    for N, K in SHAPES:
        a, a_s = ops.act_quant(torch.randn(64, K, device=dev, dtype=torch.bfloat16), dtype=fmt)
        w, w_s = ops.weight_quant(torch.randn(N, K, device=dev, dtype=torch.bfloat16), dtype=fmt)
        base = gpu_time_us(lambda: ops.scaled_mm(a, a_s, w, w_s, backend="triton"))
        res = []
        for bn, warps, st in ((64, 4, 4), (128, 4, 4), (128, 8, 3), (64, 8, 4), (128, 8, 4)):
            kbs = -(-K // 128)
            for split in sorted({1, 2, 4, max(1, round(264 / -(-N // bn)))}):
                per = -(-kbs // split)
                cfg = configs.DecodeConfig(64, bn, warps, st, -(-kbs // per), per)
                # lru_cache-wrapped: registry.reset() clears the cache of whatever decode_config is.
                configs.decode_config = functools.lru_cache(maxsize=None)(lambda *x, cfg=cfg, **k: cfg)
                registry.reset()
                try:
                    res.append((gpu_time_us(lambda: ops.scaled_mm(a, a_s, w, w_s, backend="triton")), f"{bn}/{warps}/{st}/s{cfg.split_k}"))
                except Exception as e:
                    res.append((float("inf"), f"{bn}/{warps}/{st}/s{cfg.split_k}:{type(e).__name__}"))
                finally:
                    configs.decode_config = orig_cfg
                    registry.reset()
        res.sort()
        print(f"{str(fmt)[6:]:14s} 64x{N}x{K} current {base:6.1f} best {res[0][1]} {res[0][0]:6.1f} | "
              + " ".join(f"{n}:{t:.1f}" for t, n in res), flush=True)
print("done")
