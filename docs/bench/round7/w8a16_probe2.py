"""Round-7 probe 2 (H100, as simulate("sm80")): the W8A16 GEMM after stepping each K block in two 64-wide
MMA steps (`BLOCK_KS`) and decoding the operands with quantcore's own kernel (`fp8_decode_kernel`).

1. Bit for bit: the template with BLOCK_KS = 64 against BLOCK_KS = 128 (the previous schedule) on the
   same fp16 operands, and on 8-bit codes decoded in the kernel, at every shape below.
2. Times at M = 4096 on the six DeepSeek-V3 shapes: bf16 `torch.mm`, `ops.scaled_mm` as sm80 (what the
   registry runs now), the predecode by torch's cast and by the kernel, the GEMM kernel alone with
   candidate tiles, and `lag_mm` (each block's promotion issued after the next block's MMAs).
3. The in-kernel decode path (FP8 codes read by the GEMM, mma "fp16") at M = 512 and 2048 with
   BLOCK_KS = 128 and 64, beside the predecoded path, to place the predecode threshold.

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round7/w8a16_probe2.py
"""
import math

import torch
import triton
import triton.language as tl

import quantcore
from quantcore import ops
from quantcore.backends.triton.kernels.gemm import block_scaled_mm_kernel
from quantcore.bench.timing import gpu_time_us

SHAPES = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168), (7168, 16384), (32768, 512)]


@triton.jit
def lag_mm(a_ptr, b_ptr, as_ptr, bs_ptr, out_ptr, M, N, K, stride_am, stride_bn, stride_asm, stride_ask,
           stride_bsn, stride_bsk, stride_om, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BK: tl.constexpr,
           GROUP_M: tl.constexpr):
    SUB: tl.constexpr = 128 // BK
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BK)
    a_ptrs = a_ptr + (offs_m % M)[:, None] * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + (offs_n % N)[:, None] * stride_bn + offs_k[None, :]
    as_ptrs = as_ptr + (offs_m % M) * stride_asm
    bs_ptrs = bs_ptr + (pid_n * BLOCK_N // 128) * stride_bsn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    prev = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    sp = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for i in range(0, K // BK):
        a = tl.load(a_ptrs + i * BK)
        b = tl.load(b_ptrs + i * BK)
        part = tl.dot(a, tl.trans(b), part)
        if i % SUB == SUB - 1:
            acc += prev * sp[:, None]
            kb = i // SUB
            sp = tl.load(as_ptrs + kb * stride_ask) * tl.load(bs_ptrs + kb * stride_bsk)
            prev = part
            part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc += prev * sp[:, None]
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], acc, mask=mask)


def log(*a):
    print(*a, flush=True)


def geo(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs))


def operands(M, N, K):
    torch.manual_seed(0)
    a, a_s = ops.act_quant(torch.randn(M, K, device="cuda", dtype=torch.bfloat16))
    w, w_s = ops.weight_quant(torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05)
    return a, a_s, w, w_s


def template(a, a_s, w, w_s, out, cfg):
    """The repo's kernel on a, w (fp16 values, or uint8 e4m3 codes decoded in the kernel), fp32 out."""
    bm, bn, warps, stages, ks = cfg
    M, K = a.shape
    N = w.shape[0]
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    return lambda: block_scaled_mm_kernel[grid](
        a, w, None, None, a_s, w_s, out, out, out, M, N, K, a.stride(0), w.stride(0), a_s.stride(0), a_s.stride(1),
        w_s.stride(0), w_s.stride(1), 0, out.stride(0), 0, 1e-12,
        QFMT="fp8", USE_FP8_MMA=False, TMA=False, SCALE_BN=128, BIAS="none", ACTIVATION="none", OUT="fp32",
        OUT_GROUP=1, UE8M0_OUT=False, HW_FP8=False, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=128, K_STEP=1, BLOCK_KS=ks,
        GROUP_M=8, num_warps=warps, num_stages=stages)


def lag(a16, a_s, w16, w_s, out, cfg):
    bm, bn, warps, stages, bk = cfg
    M, K = a16.shape
    N = w16.shape[0]
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    return lambda: lag_mm[grid](a16, w16, a_s, w_s, out, M, N, K, K, K, a_s.stride(0), a_s.stride(1),
                                w_s.stride(0), w_s.stride(1), out.stride(0), BLOCK_M=bm, BLOCK_N=bn, BK=bk,
                                GROUP_M=8, num_warps=warps, num_stages=stages)


def timed(fn):
    try:
        fn()
        torch.cuda.synchronize()
        return gpu_time_us(fn)
    except Exception as e:
        log(f"    failed: {type(e).__name__}: {str(e)[:160]}")
        return float("nan")


KERNEL = [(128, 128, 8, 2, 128), (128, 128, 8, 3, 64), (128, 128, 8, 4, 64), (128, 64, 4, 4, 64),
          (128, 128, 8, 6, 32)]
LAG = [(128, 128, 8, 3, 64), (128, 64, 4, 4, 64)]
INKERNEL = [(128, 128, 8, 3, 128), (128, 128, 8, 4, 64), (128, 128, 8, 5, 64), (128, 64, 4, 4, 64), (64, 128, 4, 4, 64)]


def main():
    log(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    M = 4096
    ratios = {}
    for N, K in SHAPES:
        a, a_s, w, w_s = operands(M, N, K)
        a16, w16 = a.to(torch.float16), w.to(torch.float16)
        au, wu = a.view(torch.uint8), w.view(torch.uint8)
        out = torch.empty(M, N, device="cuda", dtype=torch.float32)
        base = torch.empty_like(out)
        template(a16, a_s, w16, w_s, base, (128, 128, 8, 2, 128))()
        same = []
        for cfg in [(128, 128, 8, 3, 64), (128, 64, 4, 4, 64), (128, 128, 8, 6, 32)]:
            template(a16, a_s, w16, w_s, out, cfg)()
            same.append(torch.equal(out, base))
        template(au, a_s, wu, w_s, out, (128, 64, 4, 4, 64))()
        same.append(torch.equal(out, base))
        lag(a16, a_s, w16, w_s, out, LAG[0])()
        same.append(torch.equal(out, base))
        ab, wb = a16.to(torch.bfloat16), w16.to(torch.bfloat16)
        bf = gpu_time_us(lambda: torch.mm(ab, wb.t()))
        torch_cast = gpu_time_us(lambda: (a.to(torch.float16), w.to(torch.float16)))
        with quantcore.simulate("sm80"):
            ref = ops.scaled_mm(a, a_s, w, w_s, out_dtype=torch.float32, backend="torch")
            got = ops.scaled_mm(a, a_s, w, w_s, out_dtype=torch.float32)
            exact = torch.equal(got, base)
            rel = ((got - ref).norm() / ref.norm()).item()
            op = gpu_time_us(lambda: ops.scaled_mm(a, a_s, w, w_s))
            from quantcore.backends.triton import launch as L
            da, db = L._fp8_decoder(a, quantcore.capability.simulated_profile("sm80")), L._fp8_decoder(
                w, quantcore.capability.simulated_profile("sm80"))
            dec = gpu_time_us(lambda: (da(a), db(w)))
            dec_exact = torch.equal(da(a), a16) and torch.equal(db(w), w16)
        flops = 2 * M * N * K
        log(f"\n{M}x{N}x{K}: bf16 {bf:.1f} us ({flops / bf / 1e6:.0f} TF) | ops.scaled_mm as sm80 {op:.1f} "
            f"({bf / op:.2f}x bf16; equal to the BLOCK_KS=128 kernel: {exact}, rel err {rel:.1e}) | predecode: torch "
            f"{torch_cast:.1f}, kernel {dec:.1f} (equal: {dec_exact}) | BLOCK_KS 64/64/32, in-kernel decode, lag "
            f"bit-equal to 128: {same}")
        ratios.setdefault("op", []).append(bf / op)
        for cfg in KERNEL:
            t = timed(template(a16, a_s, w16, w_s, out, cfg))
            log(f"  kernel {cfg}: {t:.1f} us ({flops / t / 1e6:.0f} TF, {bf / t:.2f}x bf16; with kernel predecode "
                f"{bf / (t + dec):.2f}x)")
            ratios.setdefault(("kernel", cfg), []).append(bf / t)
        for cfg in LAG:
            t = timed(lag(a16, a_s, w16, w_s, out, cfg))
            log(f"  lag    {cfg}: {t:.1f} us ({flops / t / 1e6:.0f} TF, {bf / t:.2f}x bf16)")
            ratios.setdefault(("lag", cfg), []).append(bf / t)
    log("\ngeomean over the six shapes at M = 4096, bf16 time / time:")
    for k, v in ratios.items():
        log(f"  {k}: {geo(v):.2f}")

    log("\nin-kernel decode (8-bit operands) vs predecoded, M = 512 and 2048:")
    for M in (512, 2048):
        r = {}
        for N, K in SHAPES:
            a, a_s, w, w_s = operands(M, N, K)
            au, wu = a.view(torch.uint8), w.view(torch.uint8)
            a16, w16 = a.to(torch.float16), w.to(torch.float16)
            out = torch.empty(M, N, device="cuda", dtype=torch.float32)
            ab, wb = a16.to(torch.bfloat16), w16.to(torch.bfloat16)
            bf = gpu_time_us(lambda: torch.mm(ab, wb.t()))
            with quantcore.simulate("sm80"):
                op = gpu_time_us(lambda: ops.scaled_mm(a, a_s, w, w_s))
                from quantcore.backends.triton import launch as L
                p = quantcore.capability.simulated_profile("sm80")
                da, db = L._fp8_decoder(a, p), L._fp8_decoder(w, p)
                dec = gpu_time_us(lambda: (da(a), db(w)))
            line = [f"  M={M} {N}x{K}: bf16 {bf:.1f} | op {op:.1f} ({bf / op:.2f}x) | predecode {dec:.1f}"]
            r.setdefault("op", []).append(bf / op)
            for cfg in INKERNEL:
                t = timed(template(au, a_s, wu, w_s, out, cfg))
                line.append(f"in {cfg[:4]}/{cfg[4]} {t:.1f} ({bf / t:.2f}x)")
                r.setdefault(("in", cfg), []).append(bf / t)
            t = timed(template(a16, a_s, w16, w_s, out, (128, 128, 8, 3, 64)))
            line.append(f"predecoded kernel {t:.1f} + {dec:.1f} ({bf / (t + dec):.2f}x)")
            r.setdefault("pre", []).append(bf / (t + dec))
            log(" | ".join(line))
        log(f"  M={M} geomean bf16/time: " + ", ".join(f"{k}: {geo(v):.2f}" for k, v in r.items()))


main()
