"""Round-8 probe (H100): where the eager time of a GEMM whose kernel takes TMA descriptors goes, before
descriptors were kept per address: Triton 3.6's descriptor wrapper and launcher (printed), GPU / eager
time per call of the tiled, Gluon and automatic GEMMs at M = 128 and 512 beside torch's bf16 linear, a
cProfile of 400 Gluon and tiled calls, and the cost of building one descriptor.

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round8/host_probe.py
"""
import cProfile
import inspect
import io
import pstats
import time

import torch
import triton

from quantcore import ops
from quantcore.bench.timing import eager_time_us, gpu_time_us

print(triton.__version__, torch.__version__, torch.cuda.get_device_name())
import triton.backends.nvidia.driver as drv
for name in ("make_tensordesc_arg", "wrap_handle_tensordesc"):
    f = getattr(drv, name, None)
    print("=====", name); print(inspect.getsource(f) if f else "missing")
import triton.backends.driver as bdrv
for name in ("wrap_handle_tensordesc_impl", "make_tensordesc_args", "expand_signature"):
    f = getattr(bdrv, name, None)
    print("=====", name); print(inspect.getsource(f) if f else "missing")
print("===== CudaLauncher.__call__"); print(inspect.getsource(drv.CudaLauncher.__call__))
print("===== CudaLauncher.__init__"); print(inspect.getsource(drv.CudaLauncher.__init__))
print([n for n in dir(triton.runtime.driver.active.utils) if not n.startswith("_")])

dev = "cuda"
for fmt in (torch.float8_e4m3fn, torch.int8):
    for M, N, K in ((128, 4096, 7168), (128, 7168, 2048), (512, 4096, 7168)):
        torch.manual_seed(0)
        a, a_s = ops.act_quant(torch.randn(M, K, device=dev, dtype=torch.bfloat16), dtype=fmt)
        w, w_s = ops.weight_quant(torch.randn(N, K, device=dev, dtype=torch.bfloat16), dtype=fmt)
        x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        wb = torch.randn(N, K, device=dev, dtype=torch.bfloat16)
        cells = []
        for label, call in (("tiled", lambda: ops.scaled_mm(a, a_s, w, w_s, backend="triton")),
                            ("gluon", lambda: ops.scaled_mm(a, a_s, w, w_s, backend="triton[gluon]")),
                            ("auto", lambda: ops.scaled_mm(a, a_s, w, w_s)),
                            ("ql-auto", lambda: ops.quant_linear(x, w, w_s)),
                            ("bf16", lambda: torch.nn.functional.linear(x, wb))):
            call()
            cells.append(f"{label} {gpu_time_us(call):6.1f}/{eager_time_us(call):6.1f}")
        print(f"{str(fmt)[6:]} {M}x{N}x{K} GPU/eager us: " + " | ".join(cells), flush=True)

torch.manual_seed(0)
M, N, K = 128, 4096, 7168
a, a_s = ops.act_quant(torch.randn(M, K, device=dev, dtype=torch.bfloat16), dtype=torch.float8_e4m3fn)
w, w_s = ops.weight_quant(torch.randn(N, K, device=dev, dtype=torch.bfloat16), dtype=torch.float8_e4m3fn)
for backend in ("triton[gluon]", "triton"):
    call = lambda: ops.scaled_mm(a, a_s, w, w_s, backend=backend)
    for _ in range(50): call()
    torch.cuda.synchronize()
    pr = cProfile.Profile(); pr.enable()
    for _ in range(400): call()
    pr.disable(); torch.cuda.synchronize()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22); print("=====", backend); print(s.getvalue()[:6000])
# pieces
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GD
from triton.experimental.gluon import language as gl
lay = gl.NVMMASharedLayout.get_default_for([128, 128], gl.float8e4nv)
for _ in range(100): GD.from_tensor(w, [128, 128], lay)
t = time.perf_counter(); [GD.from_tensor(w, [128, 128], lay) for _ in range(2000)]; print("gluon from_tensor us", (time.perf_counter() - t) / 2000 * 1e6)
from triton.tools.tensor_descriptor import TensorDescriptor as TD
t = time.perf_counter(); [TD.from_tensor(w, [128, 128]) for _ in range(2000)]; print("tools from_tensor us", (time.perf_counter() - t) / 2000 * 1e6)
t = time.perf_counter(); [torch.empty((128, 4096), dtype=torch.bfloat16, device=dev) for _ in range(2000)]; print("empty us", (time.perf_counter() - t) / 2000 * 1e6)
