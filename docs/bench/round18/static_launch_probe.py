"""Issue 10: is torch's own C++ launcher for Triton kernels (`torch._C._StaticCudaLauncher._launch_kernel`,
what Inductor launches compiled kernels with) cheaper per call than Triton 3.6's C launcher, which our
`direct.Launcher` calls? Both on prebuilt arguments, the same compiled kernels (act_dequant's
block_dequant_kernel and the decode GEMM's decode_mm_kernel at 1×512×1024, taken from kept plans), back to
back (`timing.loop_us` of 2000 calls), three rounds, the orders rotating; the static launch's outputs
checked against Triton's launcher's.

Usage: python3 static_launch_probe.py
"""

from __future__ import annotations

import gc
import statistics

import torch

from quantcore import ops
from quantcore.backends.triton import direct
from quantcore.bench import timing

dev = "cuda"
x = torch.randn(1, 7168, device=dev, dtype=torch.bfloat16)
q, s = ops.act_quant(x, backend="triton")
x1k = torch.randn(1, 1024, device=dev, dtype=torch.bfloat16)
qs, ss = ops.act_quant(x1k, backend="triton")
w, ws = ops.weight_quant(torch.randn(512, 1024, device=dev, dtype=torch.bfloat16), backend="triton")
for _ in range(3):
    ops.act_dequant(q, s, backend="triton")
    ops.scaled_mm(qs, ss, w, ws, backend="triton")
torch.cuda.synchronize()
launchers = {L.fn.fn.__name__: L for L in gc.get_objects() if isinstance(L, direct.Launcher) and L._raw is not None}
print("raw launchers:", sorted(launchers))
_TYPES = {"i1": "i", "i8": "b", "i16": "h", "i32": "i", "i64": "l", "u1": "I", "u8": "B", "u16": "H", "u32": "I",
          "u64": "K", "fp16": "f", "bf16": "f", "fp32": "f", "f32": "f", "fp64": "d"}
static = torch._C._StaticCudaLauncher
stream = torch._C._cuda_getCurrentRawStream(0)
cases = {}
for name, tensors in (("block_dequant_kernel", (q, s, torch.empty(1, 7168, device=dev, dtype=torch.bfloat16))),
                      ("decode_mm_kernel", None)):
    L = launchers[name]
    if tensors is None:  # the decode GEMM: a, a_scale, b, b_scale, bias (unused), out, out_scale (unused)
        out = torch.empty(1, 512, device=dev, dtype=torch.bfloat16)
        tensors = (qs, ss, w, ws, out, out, out)
    # The compiled kernel again, through the JIT (cached): its source signature gives the argument types.
    args = tuple(tensors) + L.fixed
    compiled = L.fn[L.grid](*map(direct._kernel_view, args), **L.constants)
    sig = {compiled.src.fn.arg_names.index(k) if isinstance(k, str) else k: v for k, v in compiled.src.signature.items()}
    consts = {compiled.src.fn.arg_names.index(k) if isinstance(k, str) else k for k in getattr(compiled.src, "constants", {})}
    kept = [i for i in sorted(sig) if sig[i] != "constexpr" and i not in consts]
    tys = "".join("O" if sig[i][0] == "*" else _TYPES[sig[i]] for i in kept)
    values = [args[i].data_ptr() if isinstance(args[i], torch.Tensor) else args[i] for i in kept]
    for extra in ("global_scratch_size", "profile_scratch_size"):  # Triton 3.6 kernels take both, unused here
        if hasattr(compiled.metadata, extra):
            tys += "O"
            values.append(None)
    prebuilt_static = (compiled.function, *L.grid, compiled.metadata.num_warps, compiled.metadata.shared, tys,
                       tuple(values), stream)
    prebuilt_triton = (*L.grid, stream, *L._head, *(t.data_ptr() for t in tensors), *L._rest)
    raw = L._raw
    out_t = tensors[-1] if name == "block_dequant_kernel" else tensors[4]
    out_t.zero_(); raw(*prebuilt_triton); torch.cuda.synchronize(); want = out_t.clone()
    out_t.zero_(); static._launch_kernel(*prebuilt_static); torch.cuda.synchronize()
    print(name, "argument types", tys, "same output:", torch.equal(out_t, want))
    cases[f"{name} triton C launcher"] = lambda raw=raw, a=prebuilt_triton: raw(*a)
    cases[f"{name} torch static launcher"] = lambda a=prebuilt_static: static._launch_kernel(*a)
res = {k: [] for k in cases}
for r in range(3):
    names = list(cases)
    for n in names[r % len(names):] + names[:r % len(names)]:
        res[n].append(timing.loop_us(cases[n], 2000))
for n, v in res.items():
    print(f"{n:45s} median {statistics.median(v):6.2f} us, min {min(v):6.2f}  {[round(t, 2) for t in v]}")
