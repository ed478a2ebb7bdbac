"""Round-19 probe (H100): the quantizers whose division changed (`quant.divide` / `qc::Divisor`, one reciprocal
per group; INT8 codes from `cvt.rni`), in the tree on PYTHONPATH, so that two trees run alternately on one
machine (`quant_ops_ab.sh`) give a before/after: act_quant 16384×7168 (bf16 in), weight_quant 7168×16384
(bf16 in) and quantized_gelu 16384×7168, FP8 and INT8, on the Triton backend (PROBE_BACKEND=cupy: CuPy's).
GPU time (gpu_times_us: CUDA events, L2 flushed, median of 15, the three ops interleaved) and the bytes each
moves over the time of a device copy of 1 GiB, read and written (the ceiling quantcore bench uses); a
checksum of the outputs' bits, which the two trees must share.

Usage: PYTHONPATH=<tree> python3 docs/bench/round19/quant_ops_ab.py TAG >> out.jsonl
"""
import json
import os
import sys

import torch

from quantcore import capability, ops
from quantcore.bench.timing import gpu_times_us

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from epilogue_ab import checksum  # noqa: E402

M, K = 16384, 7168
tag = sys.argv[1]
backend = os.environ.get("PROBE_BACKEND", "triton")
src = torch.empty(2**29, dtype=torch.int16, device="cuda")
dst = torch.empty_like(src)
(copy_us,) = gpu_times_us([lambda: dst.copy_(src)])
copy_rate = 2 * src.numel() * 2 / copy_us  # bytes per µs, read and written
torch.manual_seed(0)
x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
w = torch.randn(7168, 16384, device="cuda", dtype=torch.bfloat16) * 0.05
for fname, fmt in (("fp8", torch.float8_e4m3fn), ("int8", torch.int8)):
    q, s = ops.act_quant(x, dtype=fmt, backend="torch")
    calls = {"act_quant": (lambda: ops.act_quant(x, dtype=fmt, backend=backend), 3 * M * K + 4 * M * K // 128),
             "weight_quant": (lambda: ops.weight_quant(w, dtype=fmt, backend=backend),
                              3 * w.numel() + 4 * w.numel() // 16384),
             "quantized_gelu": (lambda: ops.quantized_gelu(q, s, backend=backend), 2 * M * K + 8 * M * K // 128)}
    times = gpu_times_us([f for f, _ in calls.values()])
    for (op, (f, nbytes)), t in zip(calls.items(), times):
        print(json.dumps(dict(tag=tag, backend=backend, op=op, fmt=fname, us=t, of_copy=nbytes / t / copy_rate,
                              checksum=checksum(f()), device=torch.cuda.get_device_name(),
                              versions=capability.versions())), flush=True)
