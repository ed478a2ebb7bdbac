"""Round-3 probe d: torch[bf16_dequant] speed at large M (native and simulated sm80); eager batch-8 decode
step: per-linear eager time of QuantLinear against nn.Linear, and the whole step."""
import copy, os, statistics, sys, time, traceback
import torch
from quantcore import ops, capability, registry
import quantcore.nn as qnn
from quantcore.bench import baselines, decoder
from quantcore.bench.timing import gpu_time_us, loop_us
dev = "cuda"
SHAPES = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168), (7168, 16384), (32768, 512)]
print("== torch[bf16_dequant] vs bf16 GEMM vs the exact default, FP8 data, us", flush=True)
for sim in (None, "sm80"):
    for M in (128, 4096):
        for N, K in SHAPES:
            try:
                a, a_s = ops.act_quant(torch.randn(M, K, device=dev, dtype=torch.bfloat16))
                w, w_s = ops.weight_quant(torch.randn(N, K, device=dev, dtype=torch.bfloat16))
                bf = gpu_time_us(baselines.bf16_mm(M, N, K))
                ctx = capability.simulate(sim) if sim else __import__("contextlib").nullcontext()
                with ctx:
                    opt = gpu_time_us(lambda: ops.scaled_mm(a, a_s, w, w_s, backend="torch[bf16_dequant]"))
                    auto = gpu_time_us(lambda: ops.scaled_mm(a, a_s, w, w_s))
                    sel = ops.explain("scaled_mm", a, a_s, w, w_s).selected
                print(f"{sim or 'sm90':5s} M={M:5d} {N:6d}x{K:<6d} bf16_dequant {opt:8.1f} default({sel}) {auto:8.1f} bf16 {bf:8.1f} | bf16/opt {bf/opt:.2f} bf16/default {bf/auto:.2f}", flush=True)
            except Exception:
                traceback.print_exc()
print("\n== eager decode step, dim 4096, 4 layers: per-linear eager us (back-to-back, best of 5x300), step ms", flush=True)
torch.manual_seed(0)
with torch.no_grad():
    model = decoder.DecodeModel(4096, 4, 32000, torch.device(dev))
    for fmt in (None, torch.float8_e4m3fn):
        m = model if fmt is None else qnn.quantize_model(copy.deepcopy(model), dtype=fmt)
        for batch in (1, 8):
            state = decoder.DecodeState.new(m, batch, 256)
            step = lambda: decoder.decode_step(m, state)
            for _ in range(8): step()
            st = min(loop_us(step, 50) for _ in range(3))
            lin = [(n, mod) for n, mod in m.named_modules() if isinstance(mod, (torch.nn.Linear, qnn.QuantLinear)) and "lm_head" not in n][:6]
            per = []
            for n, mod in lin:
                x = torch.randn(batch, 1, mod.in_features, device=dev, dtype=torch.bfloat16)
                f = lambda: mod(x)
                for _ in range(50): f()
                per.append((n, min(loop_us(f, 300) for _ in range(5))))
            print(f"{'bf16' if fmt is None else 'fp8':5s} batch {batch}: step {st/1e3:.3f} ms | " + " ".join(f"{n.split('.')[-1]}:{u:.1f}" for n, u in per), flush=True)
print("done")
