"""Round-7 probe (H100, simulating an A100 with quantcore.simulate("sm80")): where the exact W8A16 GEMM
loses at M = 4096, and which schedule of the per-K-block promotion wins.

Times (GPU, `quantcore.bench.timing.gpu_time_us`, L2 flushed) on FP8 data decoded to fp16 once:
  * bf16 and fp16 `torch.mm` (the baseline of issue 17), and `ops.scaled_mm` as the registry runs it
    under simulate("sm80") (predecode + the tiled kernel), and the predecode alone;
  * the tiled kernel (`block_scaled_mm_kernel`) on the fp16 buffers with several tiles;
  * `promo_mm` below: the K loop in steps of BK (64 or 128) with each 128-wide scale block's dot
    chained over 128 / BK steps and promoted at its end (the same products summed in the same
    order as one K = 128 dot), and the same loop without any promotion (a plain fp16 GEMM: the
    ceiling of this loop on pointer loads).
Shared memory is checked against the sm80 profile's 163 KiB (configs over it are marked "> sm80").

Ran on the code before the round (6e1a490: the template had no BLOCK_KS yet); its output is w8a16_probe.txt.
Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round7/w8a16_probe.py
"""
import math
import sys

import torch
import triton
import triton.language as tl

import quantcore
from quantcore import ops
from quantcore.bench.timing import gpu_time_us
from quantcore.backends.triton.kernels.gemm import block_scaled_mm_kernel

SM80_SMEM = 163 * 1024
SHAPES = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168), (7168, 16384), (32768, 512)]


@triton.jit
def promo_mm(a_ptr, b_ptr, as_ptr, bs_ptr, out_ptr, M, N, K, stride_am, stride_bn, stride_asm, stride_ask,
             stride_bsn, stride_bsk, stride_om, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BK: tl.constexpr,
             SUB: tl.constexpr, PROMOTE: tl.constexpr, GROUP_M: tl.constexpr):
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
    for i in range(0, K // BK):
        a = tl.load(a_ptrs + i * BK)
        b = tl.load(b_ptrs + i * BK)
        if PROMOTE:
            if SUB == 1:
                part = tl.dot(a, tl.trans(b))
                acc += part * (tl.load(as_ptrs + i * stride_ask) * tl.load(bs_ptrs + i * stride_bsk))[:, None]
            else:
                part = tl.dot(a, tl.trans(b), part)
                if i % SUB == SUB - 1:
                    kb = i // SUB
                    acc += part * (tl.load(as_ptrs + kb * stride_ask) * tl.load(bs_ptrs + kb * stride_bsk))[:, None]
                    part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        else:
            acc = tl.dot(a, tl.trans(b), acc)
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], acc.to(tl.bfloat16), mask=mask)


def smem(bm, bn, bk, stages):
    return stages * (bm + bn) * bk * 2


def log(*a):
    print(*a, flush=True)


def geo(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs))


def operands(M, N, K):
    torch.manual_seed(0)
    a, a_s = ops.act_quant(torch.randn(M, K, device="cuda", dtype=torch.bfloat16))
    w, w_s = ops.weight_quant(torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05)
    return a, a_s, w, w_s


def run_template(a16, a_s, w16, w_s, out, cfg):
    bm, bn, warps, stages, k_step = cfg
    M, K = a16.shape
    N = w16.shape[0]
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    return lambda: block_scaled_mm_kernel[grid](
        a16, w16, None, None, a_s, w_s, out, out, out, M, N, K, K, K, a_s.stride(0), a_s.stride(1),
        w_s.stride(0), w_s.stride(1), 0, out.stride(0), 0, 1e-12,
        QFMT="fp8", USE_FP8_MMA=False, TMA=False, SCALE_BN=128, BIAS="none", ACTIVATION="none", OUT="bf16",
        OUT_GROUP=1, UE8M0_OUT=False, HW_FP8=False, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=128, K_STEP=k_step,
        GROUP_M=8, num_warps=warps, num_stages=stages)


def run_promo(a16, a_s, w16, w_s, out, cfg, promote=True):
    bm, bn, warps, stages, bk = cfg
    M, K = a16.shape
    N = w16.shape[0]
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    return lambda: promo_mm[grid](a16, w16, a_s, w_s, out, M, N, K, K, K, a_s.stride(0), a_s.stride(1),
                                  w_s.stride(0), w_s.stride(1), out.stride(0), BLOCK_M=bm, BLOCK_N=bn, BK=bk,
                                  SUB=128 // bk, PROMOTE=promote, GROUP_M=8, num_warps=warps, num_stages=stages)


TEMPLATE = [(128, 128, 8, 2, 1), (128, 64, 4, 3, 1), (64, 128, 4, 3, 1), (128, 64, 8, 3, 1), (256, 64, 8, 2, 1),
            (128, 128, 8, 3, 1), (128, 128, 8, 1, 2)]
PROMO = [(128, 128, 8, 2, 128), (128, 128, 8, 3, 64), (128, 128, 8, 4, 64), (128, 128, 8, 5, 64),
         (128, 64, 4, 4, 64), (64, 128, 4, 4, 64), (128, 64, 4, 6, 64), (256, 128, 8, 3, 64), (128, 256, 8, 3, 64),
         (128, 128, 4, 4, 64)]
PLAIN = [(128, 128, 8, 4, 64), (128, 256, 8, 3, 64), (128, 128, 4, 4, 64)]


def main():
    log(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    M = 4096
    sweep_shapes = [(4096, 7168), (7168, 2048)] if "--all" not in sys.argv else SHAPES
    results = {}
    for N, K in SHAPES:
        a, a_s, w, w_s = operands(M, N, K)
        a16, w16 = a.to(torch.float16), w.to(torch.float16)
        ref = ops.scaled_mm(a, a_s, w, w_s, out_dtype=torch.float32, backend="torch")
        out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        ab, wb = a16.to(torch.bfloat16), w16.to(torch.bfloat16)
        bf = gpu_time_us(lambda: torch.mm(ab, wb.t()))
        f16 = gpu_time_us(lambda: torch.mm(a16, w16.t()))
        pre = gpu_time_us(lambda: (a.to(torch.float16), w.to(torch.float16)))
        with quantcore.simulate("sm80"):
            sel = quantcore.explain("scaled_mm", a, a_s, w, w_s).selected
            op = gpu_time_us(lambda: ops.scaled_mm(a, a_s, w, w_s))
        flops = 2 * M * N * K
        log(f"\n{M}x{N}x{K}: bf16 mm {bf:.1f} us ({flops / bf / 1e6:.0f} TF) | fp16 mm {f16:.1f} | "
            f"ops.scaled_mm as sm80 ({sel}) {op:.1f} ({bf / op:.2f}x bf16) | predecode a, b {pre:.1f}")
        row = {"bf16": bf, "op": op, "pre": pre}
        if (N, K) not in sweep_shapes and "--all" not in sys.argv:
            cands = [("template", c) for c in TEMPLATE[:1]] + [("promo", c) for c in PROMO[1:5]]
        else:
            cands = ([("template", c) for c in TEMPLATE] + [("promo", c) for c in PROMO]
                     + [("plain", c) for c in PLAIN])
        for kind, cfg in cands:
            bk = 128 if kind == "template" else cfg[4]
            steps = cfg[4] if kind == "template" else 1
            over = smem(cfg[0], cfg[1], bk, cfg[3]) * steps > SM80_SMEM
            fn = (run_template(a16, a_s, w16, w_s, out, cfg) if kind == "template"
                  else run_promo(a16, a_s, w16, w_s, out, cfg, promote=kind == "promo"))
            try:
                fn()
                torch.cuda.synchronize()
                t = gpu_time_us(fn)
            except Exception as e:  # out of resources and the like: say so, go on
                log(f"  {kind:8s} {cfg}: failed: {type(e).__name__}: {str(e)[:120]}")
                continue
            err = ""
            if kind != "plain":
                rel = ((out.float() - ref).norm() / ref.norm()).item()
                err = f" relerr {rel:.1e}"
            total = t + pre
            log(f"  {kind:8s} {cfg}{' > sm80' if over else ''}: {t:.1f} us ({flops / t / 1e6:.0f} TF, "
                f"{bf / t:.2f}x bf16; with predecode {bf / total:.2f}x){err}")
            row[(kind, cfg)] = t
        results[(N, K)] = row
    keys = set.intersection(*(set(k for k in r if isinstance(k, tuple)) for r in results.values()))
    log("\ngeomean over the six shapes, bf16 time / time (kernel alone | with predecode):")
    log(f"  ops.scaled_mm as sm80: {geo([r['bf16'] / r['op'] for r in results.values()]):.2f}")
    for k in sorted(keys, key=str):
        log(f"  {k}: {geo([r['bf16'] / r[k] for r in results.values()]):.2f} | "
            f"{geo([r['bf16'] / (r[k] + r['pre']) for r in results.values()]):.2f}")


main()
