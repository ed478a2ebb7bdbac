"""Round-30 probe (H100): the CUDA C++ GEMMs of mc_gemm.cu (128x128 tiles) and mc_wide.cu (128x256) beside the Gluon
GEMM (config_for's tile and the 128x128 default) and cuBLAS block-wise FP8, timed interleaved (quantcore's
timing.gpu_times_us), plain bf16 output, on the bench shapes whose N is a multiple of 256; per shape one JSON line
(GPU µs of each), whether every 128x128 kernel's output has the Gluon 128x128 kernel's bits and every 128x256 one
the Gluon wide kernel's, and cuBLAS's largest difference from the first over its largest value; then a table of
cuBLAS time / each.

The cubins, built beside this file by nvcc as runs.sh says, are named in MC_CUBINS (mc_gemm.cu's kernel, CLUSTER 2
unless the name ends "c0" or "c1") and MC_WIDE (mc_wide.cu's); MC_CUBINS must name at least one.

Usage: MC_CUBINS=... MC_WIDE=... python3 mc.py [M,...]   (default 4096,16384)
"""
import ctypes
import json
import os
import sys

import cupy
import numpy as np
import torch

from quantcore import capability, ops
from quantcore.backends.triton import gluon_launch as gl
from quantcore.bench import baselines, timing
from quantcore.bench.shapes import DEEPSEEK_NK

HERE = os.path.dirname(os.path.abspath(__file__))
CUBINS = [c for c in os.environ.get("MC_CUBINS", "").split(",") if c]
WIDE = [c for c in os.environ.get("MC_WIDE", "").split(",") if c]
# Shared memory: the ring (6 slots of 32 KiB, or 4 of 48 KiB), 32 KiB of output boxes, the barriers and 1 KiB for
# aligning the ring to 1024 bytes.
SMEM = {"mc_gemm": 6 * 32768 + 32768 + 96 + 1024, "mc_wide": 4 * 48 * 1024 + 32 * 1024 + 64 + 1024}
FNS = {}
for c in CUBINS + WIDE:
    kernel = "mc_wide" if c in WIDE else "mc_gemm"
    FNS[c] = cupy.RawModule(path=os.path.join(HERE, c + ".cubin")).get_function(kernel)
    FNS[c].max_dynamic_shared_size_bytes = SMEM[kernel]
enc = ctypes.CDLL("libcuda.so.1").cuTensorMapEncodeTiled
enc.restype = ctypes.c_int
enc.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64),
                ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
PROFILE = capability.profile_for("cuda")
SMS = torch.cuda.get_device_properties(0).multi_processor_count
VOID = np.dtype((np.void, 128))


def tmap(t: torch.Tensor, rows: int, dtype: int = 0, cols: int = 128) -> np.void:
    """A TMA map over t [R, C] (C contiguous; dtype a CUtensorMapDataType, 0 uint8, 9 bf16), boxes of `cols` x
    `rows`, 128-byte swizzle, L2 promotion of 256 bytes; as a 128-byte kernel argument."""
    buf = (ctypes.c_uint8 * 256)()
    at = (ctypes.addressof(buf) + 63) & ~63
    r = enc(at, dtype, 2, t.data_ptr(), (ctypes.c_uint64 * 2)(t.shape[1], t.shape[0]),
            (ctypes.c_uint64 * 1)(t.stride(0) * t.element_size()),
            (ctypes.c_uint32 * 2)(cols, rows), (ctypes.c_uint32 * 2)(1, 1), 0, 3, 3, 0)
    assert r == 0, r
    return np.frombuffer(bytes((ctypes.c_uint8 * 128).from_address(at)), dtype=VOID)[0]


def mc(a, a_s, b, b_s, name):
    """The cubin `name` (of MC_CUBINS: mc_gemm.cu's kernel; of MC_WIDE: mc_wide.cu's) as a call returning its bf16
    output. mc_gemm's clusters of two read B's map in boxes of half a tile (64 rows): every other kernel, and
    mc_gemm built with CLUSTER 0 or 1 (a name ending "c0" or "c1"), whole ones."""
    M, K = a.shape
    N = b.shape[0]
    out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
    half_b = name in CUBINS and not name.endswith(("c0", "c1"))
    maps = (tmap(a.view(torch.uint8), 128), tmap(b.view(torch.uint8), 64 if half_b else 128), tmap(out, 64, 9, 64))
    # mc_gemm takes the output's pointer too (unused there: the output goes through its map).
    ptrs = (a_s, b_s) if name in WIDE else (a_s, b_s, out)
    args = maps + tuple(np.uint64(t.data_ptr()) for t in ptrs) + tuple(
        np.int32(v) for v in (M, N, K, a_s.stride(0), a_s.stride(1), b_s.stride(0), b_s.stride(1)))
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    smem = SMEM["mc_wide" if name in WIDE else "mc_gemm"]

    def run():
        with stream:
            FNS[name]((SMS // 2 * 2,), (384,), args, shared_mem=smem)
        return out
    return run


def gluon(a, a_s, b, b_s, cfg):
    run = gl.scaled_mm.prepare(a, a_s, b, b_s, block_n=128, block_k=128, bias=None, activation=None,
                               out_dtype=torch.bfloat16, out_quant=None, out_group=128, ue8m0_out=False, eps=1e-4,
                               profile=PROFILE, config=cfg)
    return lambda: run(a, a_s, b, b_s)


if __name__ == "__main__":
    ms = [int(m) for m in (sys.argv[1] if len(sys.argv) > 1 else "4096,16384").split(",")]
    rows = []
    for m in ms:
        for n, k in DEEPSEEK_NK:
            if n % 256:
                continue
            g = torch.Generator(device="cuda").manual_seed(m + n + k)
            a, a_s = ops.act_quant(torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g),
                                   dtype=torch.float8_e4m3fn)
            b, b_s = ops.weight_quant(torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g),
                                      dtype=torch.float8_e4m3fn)
            f_mcs = [mc(a, a_s, b, b_s, c) for c in CUBINS + WIDE]
            f_mc = f_mcs[0]
            f_wide = gluon(a, a_s, b, b_s, gl.config_for(m, n, k, 128, None))
            f_128 = gluon(a, a_s, b, b_s, gl.DEFAULT)
            f_cub = baselines.cublas_blockwise_fp8(a, a_s, b, b_s)
            o_mc = f_mc().clone()
            torch.cuda.synchronize()
            same = bool(torch.equal(o_mc.view(torch.int16), f_128().view(torch.int16)))
            ref = f_cub().float()
            err = float(((o_mc.float() - ref).abs().max() / ref.abs().max()))
            n_mc = len(CUBINS)
            same = same and all(torch.equal(f().view(torch.int16), o_mc.view(torch.int16)) for f in f_mcs[:n_mc])
            o_wide = f_wide().clone()
            same_wide = all(torch.equal(f().view(torch.int16), o_wide.view(torch.int16)) for f in f_mcs[n_mc:])
            us = timing.gpu_times_us([f_wide, f_128, f_cub] + f_mcs)
            row = dict(m=m, n=n, k=k, wide=us[0], d128=us[1], cublas=us[2], same_bits_128=same,
                       same_bits_wide=same_wide, rel_err=err,
                       **{c: u for c, u in zip(CUBINS + WIDE, us[3:])})
            print(json.dumps(row), flush=True)
            rows.append(row)
            del a, b
            torch.cuda.empty_cache()
    print("cuBLAS time / each: gluon config_for, gluon 128x128, then each cubin")
    for r in rows:
        print(f"{r['m']:6}{r['n']:7}{r['k']:7}  wide {r['cublas'] / r['wide']:.3f}  128 {r['cublas'] / r['d128']:.3f}  "
              + "  ".join(f"{c} {r['cublas'] / r[c]:.3f}" for c in CUBINS + WIDE)
              + f"  cublas {r['cublas']:.1f} us  bits {r['same_bits_128']}/{r['same_bits_wide']}  err {r['rel_err']:.1e}")
