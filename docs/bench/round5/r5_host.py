"""Round-5 host probe (H100): what one Triton launch costs by each route into the driver, for the
decode kernel of a quantized Linear (M = 1, 4096x4096 FP8, bf16 in and out), and what a whole eager
QuantLinear call costs beside nn.Linear.

Routes: Triton's `CompiledKernel.run` (a Python wrapper), its C launcher called directly (what
`direct.Launcher` does on Triton 3.6), and `cuLaunchKernel` with a parameter array packed once per
plan, called through ctypes and through CuPy's Cython binding. Each route's output is checked bit for
bit against the JIT launch's. Writes Triton's nvidia driver source to $OUT for reading offline.

Run from the repository root: PYTHONPATH=$PWD OUT=<dir> python3 docs/bench/round5/r5_host.py
Host times: best of 5 rounds of 2000 back-to-back calls (quantcore.bench.timing.loop_us).
"""
import ctypes
import inspect
import os
import struct
import traceback

import torch
import torch.nn.functional as F
import triton

import quantcore.nn
from quantcore import dispatch, ops
from quantcore.backends.triton.direct import Launcher
from quantcore.bench.timing import loop_us

OUT = os.environ.get("OUT", "/tmp")
dev = "cuda"


def host_us(fn, n=2000, rounds=5):
    for _ in range(50):
        fn()
    return min(loop_us(fn, n) for _ in range(rounds))


def launchers(obj):
    found, stack, seen = [], [obj], set()
    while stack:
        f = stack.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        if isinstance(f, Launcher):
            found.append(f)
            continue
        for cell in getattr(f, "__closure__", None) or ():
            try:
                stack.append(cell.cell_contents)
            except ValueError:
                pass
    return found


def main():
    import triton.backends.nvidia.driver as drv
    with open(f"{OUT}/triton_driver_src.py", "w") as f:
        f.write(inspect.getsource(drv))
    print("triton", triton.__version__, "torch", torch.__version__, flush=True)
    torch.manual_seed(0)
    x = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)
    w, ws = ops.weight_quant(torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16) * 0.05)
    rows = []
    with torch.no_grad():
        call = lambda: ops.quant_linear(x, w, ws, out_dtype=torch.bfloat16)
        ref = call()
        captured = {}
        original = dispatch.call

        def spy(op, args, options, backend):
            captured["c"] = (op, args, options, backend)
            return original(op, args, options, backend)
        ops.quant_linear.__globals__["_call"] = spy
        call()
        ops.quant_linear.__globals__["_call"] = original
        op, args, options, backend = captured["c"]
        plan = dispatch._plans[dispatch._key(op, args, options, backend)]
        (launcher,) = launchers(plan.launch)
        seen = []
        orig_call = Launcher.__call__

        def spy_launch(self, *a):
            seen.append(a)
            return orig_call(self, *a)
        Launcher.__call__ = spy_launch
        kwargs = dict(plan.static)
        for name, index, view in plan.bindings:
            kwargs[name] = args[index]
        plan.launch(**kwargs)
        Launcher.__call__ = orig_call
        largs = seen[0]
        out_index = 5  # decode_mm_kernel(a, a_scale, b, b_scale, bias, out, ...)
        out = largs[out_index]
        run = launcher._run
        print("run type", type(run).__name__, "raw", launcher.raw, flush=True)
        for attr in ("global_scratch_size", "profile_scratch_size", "launch_cooperative_grid", "launch_pdl", "num_ctas"):
            print("  run.", attr, getattr(run, attr, "?"))
        from quantcore.backends.triton.direct import _kernel_view
        compiled = launcher.fn[launcher.grid](*map(_kernel_view, largs), **launcher.constants)
        print("same function as the Launcher's:", compiled.function == launcher._function, flush=True)
        md = compiled.metadata
        print("metadata:", {k: getattr(md, k) for k in ("num_warps", "num_ctas", "shared", "cluster_dims", "launch_pdl",
                                                       "launch_cooperative_grid", "global_scratch_size")
                            if hasattr(md, k)}, flush=True)
        sig = compiled.src.signature
        print("signature:", sig, flush=True)
        print("constants:", getattr(compiled.src, "constants", None), flush=True)
        names = list(sig)
        fullargs = list(largs) + list(launcher._tail)
        kinds, values = [], []
        for name, a in zip(names, fullargs):
            ty = sig[name]
            if ty == "constexpr":
                continue
            if ty.startswith("*"):
                kinds.append("Q")
                values.append(a)
            elif ty in ("i32", "i1", "i8", "i16"):
                kinds.append("i4x")
                values.append(a)
            elif ty in ("u32",):
                kinds.append("I4x")
                values.append(a)
            elif ty in ("i64", "u64"):
                kinds.append("q")
                values.append(a)
            elif ty == "fp32":
                kinds.append("f4x")
                values.append(a)
            else:
                raise SystemExit(f"unknown param type {ty}")
        kinds += ["Q", "Q"]  # global_scratch, profile_scratch (null)
        values += [0, 0]
        print("params:", len(kinds), kinds, flush=True)
        libcuda = ctypes.CDLL("libcuda.so.1")
        # The function's own parameter list, as the driver sees it (CUDA >= 12.4).
        info = libcuda.cuFuncGetParamInfo
        info.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
        params_seen = []
        for i in range(64):
            off, size = ctypes.c_size_t(), ctypes.c_size_t()
            if info(ctypes.c_void_p(compiled.function), i, ctypes.byref(off), ctypes.byref(size)) != 0:
                break
            params_seen.append((off.value, size.value))
        print("cuFuncGetParamInfo:", len(params_seen), params_seen, flush=True)
        fmt = "<" + "".join(kinds)
        buf = ctypes.create_string_buffer(8 * len(kinds))
        base = ctypes.addressof(buf)
        ptrs = (ctypes.c_void_p * len(kinds))(*[base + 8 * i for i in range(len(kinds))])
        pack = struct.Struct(fmt).pack_into
        launch = libcuda.cuLaunchKernel
        launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        launch.restype = ctypes.c_int
        gx, gy, gz = launcher.grid
        block = 32 * md.num_warps
        head = (compiled.function, gx, gy, gz, block, 1, 1, md.shared)
        pidx = [i for i, k in enumerate(kinds) if k == "Q"][:-2]
        tensor_pos = [i for i, v in enumerate(values) if isinstance(v, torch.Tensor)]
        stream_of = torch._C._cuda_getCurrentRawStream
        params_addr = ctypes.addressof(ptrs)

        def ctypes_launch(*targs):
            vals = list(values)
            for i, t in zip(tensor_pos, targs):
                vals[i] = t.data_ptr()
            pack(buf, 0, *vals)
            rc = launch(*head, stream_of(0), params_addr, None)
            if rc:
                raise RuntimeError(f"cuLaunchKernel {rc}")

        tensors = [values[i] for i in tensor_pos]
        # Per call only the tensors' addresses change: a second packer over just those slots.
        slot_fmt = struct.Struct("<" + "Q" * len(tensor_pos))
        slot_offsets = [8 * i for i in tensor_pos]
        contiguous = slot_offsets == list(range(slot_offsets[0], slot_offsets[0] + 8 * len(slot_offsets), 8))
        pack(buf, 0, *[v.data_ptr() if isinstance(v, torch.Tensor) else v for v in values])
        first = slot_offsets[0]
        ptr_pack = slot_fmt.pack_into

        def ctypes_launch_slots(*targs):
            ptr_pack(buf, first, *[t.data_ptr() for t in targs])
            launch(*head, stream_of(0), params_addr, None)

        def check(name, fn):
            out.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            same = torch.equal(out, ref)
            print(f"   {name}: output {'bit for bit' if same else 'DIFFERS'}", flush=True)
            return same

        check("Launcher (current path)", lambda: launcher(*largs))
        ok_ctypes = check("ctypes cuLaunchKernel", lambda: ctypes_launch(*tensors))
        rows.append(("Launcher(*args) (current)", lambda: launcher(*largs)))
        if launcher.raw:
            raw, rhead, tail = launcher._raw, launcher._head, launcher._tail
            rows.append(("raw C launcher, direct", lambda: raw(*launcher.grid, stream_of(0), *rhead, *largs, *tail)))
        rows.append(("compiled.run, direct", lambda: run(*launcher.grid, stream_of(0), launcher._function,
                                                        launcher._packed, None, None, None, *largs, *launcher._tail)))
        if ok_ctypes:
            rows.append(("ctypes cuLaunchKernel, full pack", lambda: ctypes_launch(*tensors)))
            if contiguous:
                check("ctypes cuLaunchKernel, address slots", lambda: ctypes_launch_slots(*tensors))
                rows.append(("ctypes cuLaunchKernel, address slots", lambda: ctypes_launch_slots(*tensors)))
        try:
            from cupy_backends.cuda.api import driver as cdrv

            def cupy_launch(*targs):
                ptr_pack(buf, first, *[t.data_ptr() for t in targs])
                cdrv.launchKernel(*head, stream_of(0), params_addr, 0)
            if contiguous and check("cupy driver.launchKernel", lambda: cupy_launch(*tensors)):
                rows.append(("cupy driver.launchKernel, address slots", lambda: cupy_launch(*tensors)))
        except Exception:
            traceback.print_exc()
        rows += [
            ("[t.data_ptr() for t in 7 tensors]", lambda: [t.data_ptr() for t in tensors]),
            ("stream handle", lambda: stream_of(0)),
            ("torch.empty((1,4096), bf16, device obj)", lambda: torch.empty((1, 4096), dtype=torch.bfloat16, device=x.device)),
            ("plan.launch(**kwargs)", lambda: plan.launch(**kwargs)),
            ("ops.quant_linear", call),
        ]
        layer = quantcore.nn.QuantLinear.from_linear(torch.nn.Linear(4096, 4096, bias=False).to(dev, torch.bfloat16),
                                                     dtype=torch.float8_e4m3fn)
        lin = torch.nn.Linear(4096, 4096, bias=False).to(dev, torch.bfloat16)
        rows += [("QuantLinear module call", lambda: layer(x)), ("nn.Linear bf16 module call", lambda: lin(x)),
                 ("F.linear bf16", lambda: F.linear(x, lin.weight))]
        results = []
        for name, fn in rows:
            try:
                results.append((name, host_us(fn)))
            except Exception:
                traceback.print_exc()
        # Second pass, reversed order, to see the host's drift.
        for name, fn in reversed(rows):
            try:
                t = host_us(fn)
                results = [(n, min(v, t) if n == name else v) for n, v in results]
            except Exception:
                pass
        for name, t in results:
            print(f"   {name:50s} {t:7.2f} us", flush=True)


if __name__ == "__main__":
    main()
