"""The example's dim-2048 model at batch 8 (examples/tiny_transformer.py): `generate` timed for the bf16
and FP8 models alternately (seven rounds, median), then one `generate` of each under cProfile."""

from __future__ import annotations

import copy
import cProfile
import pstats
import statistics
import sys
import time

import torch

sys.path.insert(0, "examples")
import tiny_transformer as tt  # noqa: E402

from quantcore.nn import quantize_model  # noqa: E402

cfg = tt.Config(dim=2048, max_batch=8)
dev = torch.device("cuda")
with torch.device(dev):
    reference = tt.Transformer(cfg, 0).to(device=dev, dtype=torch.bfloat16).eval()
quantized = quantize_model(copy.deepcopy(reference), dtype=torch.float8_e4m3fn)
prompts = torch.randint(0, cfg.vocab, (8, 32), generator=torch.Generator().manual_seed(1)).to(dev)
models = {"bf16": reference, "fp8": quantized}


def gen(model, tokens=32):
    tt.generate(model, prompts, tokens, 1.0, torch.Generator(dev).manual_seed(0))
    torch.cuda.synchronize()


for m in models.values():
    gen(m, 4)
times = {k: [] for k in models}
for _ in range(7):
    for name, m in models.items():
        t0 = time.perf_counter()
        gen(m)
        times[name].append(time.perf_counter() - t0)
for name, t in times.items():
    print(f"{name}: generate of 32 tokens {statistics.median(t) * 1e3:.2f} ms (min {min(t) * 1e3:.2f}), "
          f"{8 * 32 / statistics.median(t):.0f} tokens/s")
for name in ("prefill", "decode"):
    for mname, m in models.items():
        x = prompts if name == "prefill" else prompts[:, :1]
        with torch.inference_mode():
            m(x, 0 if name == "prefill" else 40)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(20):
                m(x, 0 if name == "prefill" else 40)
            torch.cuda.synchronize()
        print(f"{name} forward {mname}: {(time.perf_counter() - t0) / 20 * 1e6:.0f} us")
for name, m in models.items():
    pr = cProfile.Profile()
    pr.enable()
    gen(m)
    pr.disable()
    print(f"\n=== {name} ===")
    pstats.Stats(pr).sort_stats("tottime").print_stats(14)
