"""Instrumented copy of the decode kernel for probes: TIMER (address of an int64 buffer, 0 = off)
records (t_start, t_after_loop, t_end, smid) per program; PDL 0 = none, 1 = launch_dependents + wait
at entry, 2 = L2-prefetch this program's weight slice, then launch_dependents + wait."""
import importlib, pathlib, sys
import quantcore.backends.triton.kernels.decode as dec

SRC = pathlib.Path(dec.__file__).read_text()
src = SRC.replace("QROWS: tl.constexpr):", "QROWS: tl.constexpr, TIMER: tl.constexpr = 0, PDL: tl.constexpr = 0):")
src = src.replace("""    pid_k = tl.program_id(1)
""", """    pid_k = tl.program_id(1)
    if TIMER != 0:
        t0 = _gtimer()
""", 1)
src = src.replace("""    kb_start = pid_k * kb_per_split
    kb_end = tl.minimum(kb_start + kb_per_split, tl.cdiv(K, BLOCK_K))
""", """    kb_start = pid_k * kb_per_split
    kb_end = tl.minimum(kb_start + kb_per_split, tl.cdiv(K, BLOCK_K))
    if PDL == 2 or PDL == 3:
        rows = b_ptr + tl.minimum(offs_n, N - 1).to(tl.int64) * stride_bn
        for kp in range(kb_start, kb_end):
            _prefetch(rows + kp * BLOCK_K)
    if PDL >= 1:
        tl.extra.cuda.gdc_wait()
    if PDL == 1 or PDL == 2:
        tl.extra.cuda.gdc_launch_dependents()
""", 1)
src = src.replace("""    if SPLIT_K == 1:
        finish_tile(""", """    if PDL >= 3:
        tl.extra.cuda.gdc_launch_dependents()
    if TIMER != 0:
        t1 = _gtimer()
    if SPLIT_K == 1:
        finish_tile(""", 1)
src = src.rstrip("\n") + """
    if TIMER != 0:
        t2 = _gtimer()
        p = tl.full([], TIMER, tl.int64).to(tl.pointer_type(tl.int64)) + (pid_n * tl.num_programs(1) + pid_k) * 4
        tl.store(p, t0)
        tl.store(p + 1, t1)
        tl.store(p + 2, t2)
        tl.store(p + 3, _smid().to(tl.int64))


@triton.jit
def _gtimer():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _smid():
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _prefetch(ptrs):
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)
"""
assert src.count("_gtimer()") == 4 and "gdc_wait" in src, "patch failed"
path = pathlib.Path(dec.__file__).with_name("_decode_probe.py")
path.write_text(src)
probe_mod = importlib.import_module("quantcore.backends.triton.kernels._decode_probe")
kernel = probe_mod.decode_mm_kernel
