"""How fast can one kernel read N bytes on the bench's timer (cold L2)? The bench's read ceiling
(bench/stream.py) against variants with more loads in flight, and an empty kernel's time."""
import itertools, sys
import torch, triton, triton.language as tl
from quantcore.bench import timing, stream
from quantcore.bench.baselines import gemm_floor_bytes

@triton.jit
def empty_kernel(x):
    pass

@triton.jit
def read_unrolled(x_ptr, out_ptr, n, per_program, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    start = tl.program_id(0).to(tl.int64) * per_program
    acc = tl.zeros([BLOCK], tl.int32)
    for i in range(0, per_program, BLOCK * UNROLL):
        for u in tl.static_range(UNROLL):
            offs = start + i + u * BLOCK + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + offs, mask=offs < n, other=0, cache_modifier=".cg")
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc))

dev = "cuda"
sms = torch.cuda.get_device_properties(0).multi_processor_count
copy = timing.copy_bandwidth_gbps()
x0 = torch.zeros(1, device=dev)
print(f"copy {copy:.0f} GB/s; empty kernel on the bench timer: {timing.gpu_time_us(lambda: empty_kernel[(1,)](x0)):.2f} us; "
      f"empty 264 programs: {timing.gpu_time_us(lambda: empty_kernel[(2*sms,)](x0)):.2f} us", flush=True)
shapes = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168), (7168, 16384), (32768, 512)]
for n_, k_ in shapes:
    nbytes = gemm_floor_bytes(1, n_, k_)
    floor = nbytes / copy / 1e3
    bench = stream.read_us(nbytes)
    n = nbytes // 4
    x = torch.ones(n, dtype=torch.int32, device=dev)
    out = torch.empty(16 * sms, dtype=torch.int32, device=dev)
    best, arg = float("inf"), None
    for per_sm, block, unroll, warps in itertools.product((1, 2, 4, 8), (512, 1024, 2048), (2, 4, 8), (4, 8)):
        programs = per_sm * sms
        per_program = triton.cdiv(triton.cdiv(n, programs), block * unroll) * block * unroll
        grid = (triton.cdiv(n, per_program),)
        t = timing.gpu_time_us(lambda: read_unrolled[grid](x, out, n, per_program, BLOCK=block, UNROLL=unroll, num_warps=warps), reps=9)
        if t < best:
            best, arg = t, (per_sm, block, unroll, warps)
    print(f"1x{n_}x{k_}: {nbytes/1e6:.1f} MB floor {floor:.1f} us | bench read ceiling {bench:.1f} us ({floor/bench:.2f} of floor) "
          f"| best unrolled {best:.1f} us ({floor/best:.2f}) at {arg}", flush=True)
