"""Round-3 probe: decode GEMM timeline, read-stream ceiling, back-to-back timing, PDL, launcher cost."""
import json, os, statistics, sys, time, traceback
sys.path.insert(0, os.path.join(os.path.dirname(__file__)))
import torch, triton, triton.language as tl
import quantcore
from quantcore import ops, registry
from quantcore.bench.timing import gpu_time_us, copy_bandwidth_gbps, loop_us

OUT = os.environ.get("OUT", "/tmp")
res = {}
dev = "cuda"
print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(), flush=True)
bw = copy_bandwidth_gbps()
print(f"copy bw {bw:.0f} GB/s", flush=True)
FP8 = torch.float8_e4m3fn

def weights(N, K, fmt=FP8):
    return ops.weight_quant(torch.randn(N, K, device=dev, dtype=torch.bfloat16), dtype=fmt)

def act(M, K, fmt=FP8):
    return ops.act_quant(torch.randn(M, K, device=dev, dtype=torch.bfloat16), dtype=fmt)

def floor_us(M, N, K):
    by = N * K + (N // 128 + 1) * (K // 128 + 1) * 4 + M * K * 1 + M * 2 * N
    return by / bw / 1e3

SHAPES = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168), (7168, 16384), (32768, 512), (4096, 4096)]

def section(name):
    print(f"\n== {name}", flush=True)

# ---------------------------------------------------------------- C: read-stream ceiling
section("C: pure read kernel (Triton), us and fraction of floor")
@triton.jit
def read_kernel(x_ptr, out_ptr, n_per_prog, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    base = x_ptr + pid.to(tl.int64) * n_per_prog
    acc = tl.zeros([BLOCK], tl.int32)
    for i in tl.range(0, n_per_prog, BLOCK, num_stages=STAGES):
        acc += tl.load(base + i + tl.arange(0, BLOCK))
    tl.store(out_ptr + pid, tl.sum(acc))
try:
    for mb in (15, 30, 117):
        nbytes = mb * 2**20
        x = torch.randint(0, 100, (nbytes // 4,), dtype=torch.int32, device=dev)
        out = torch.empty(4096, dtype=torch.int32, device=dev)
        fl = nbytes / bw / 1e3
        line = []
        best = 1e9
        for progs in (132, 264, 528, 1056):
            for BLOCK, warps in ((1024, 4), (2048, 8), (4096, 8)):
                n = nbytes // 4 // progs
                n -= n % BLOCK
                if n == 0:
                    continue
                for st in (2, 4):
                    t = gpu_time_us(lambda: read_kernel[(progs,)](x, out, n, BLOCK=BLOCK, STAGES=st, num_warps=warps))
                    t = t * nbytes / (n * progs * 4)
                    best = min(best, t)
                    line.append(f"{progs}/{BLOCK}/{warps}/{st}:{t:.1f}")
        tsum = gpu_time_us(lambda: x.sum())
        print(f"{mb:4d} MiB floor {fl:5.1f} best {best:5.1f} ({fl/best:.2f}) torch.sum {tsum:.1f} | " + " ".join(line), flush=True)
        res[f"read_{mb}"] = dict(floor=fl, best=best, sum=tsum)
        del x
except Exception:
    traceback.print_exc()

# ---------------------------------------------------------------- B: timeline of the decode kernel
section("B: decode kernel timeline (globaltimer per program), FP8 M=1 and M=16")
import r3_patch
import quantcore.backends.triton.launch as L
from quantcore.backends.triton import direct
orig_kernel, orig_launcher = L.decode_mm_kernel, L.Launcher
EXTRA = {}

class PatchedLauncher(orig_launcher):
    def __init__(self, fn, grid, constants, device):
        if fn is r3_patch.kernel:
            constants = dict(constants, **EXTRA)
        super().__init__(fn, grid, constants, device)
        self.grid_seen = grid
        LAUNCHERS.append(self)
LAUNCHERS = []

def use_patched(kernel=True, **extra):
    EXTRA.clear(); EXTRA.update(dict(TIMER=0, PDL=0), **extra)
    L.decode_mm_kernel, L.Launcher = (r3_patch.kernel if kernel else orig_kernel), PatchedLauncher
    registry.reset()

def use_orig():
    L.decode_mm_kernel, L.Launcher = orig_kernel, orig_launcher
    registry.reset()

try:
    tbuf = torch.zeros(4 * 8192, dtype=torch.int64, device=dev)
    use_patched(TIMER=tbuf.data_ptr())
    for M in (1, 16):
        for N, K in SHAPES:
            a, a_s = act(M, K)
            w, w_s = weights(N, K)
            LAUNCHERS.clear()
            f = lambda: ops.scaled_mm(a, a_s, w, w_s, backend="triton")
            t = gpu_time_us(f)
            lau = LAUNCHERS[-1]
            g = lau.grid_seen
            nprog = g[0] * (g[1] if len(g) > 1 else 1)
            tbuf.zero_()
            torch.cuda.synchronize()
            torch.cuda._sleep(2_000_000)
            flush = torch.empty(256 * 2**20 // 4, device=dev); flush.sum()
            f(); torch.cuda.synchronize()
            rec = tbuf[: 4 * nprog].view(nprog, 4).cpu()
            t0 = rec[:, 0].double(); t1 = rec[:, 1].double(); t2 = rec[:, 2].double()
            base = t0.min()
            st = (t0 - base) / 1e3; lp = (t1 - t0) / 1e3; tail = (t2 - t1) / 1e3
            span = (t2.max() - base) / 1e3
            sms = len(set(rec[:, 3].tolist()))
            q = lambda v: f"{v.quantile(0.5).item():.2f}/{v.quantile(0.9).item():.2f}/{v.max().item():.2f}"
            c = lau.constants
            print(f"M={M:3d} {N:6d}x{K:<6d} floor {floor_us(M,N,K):5.1f} event {t:5.1f} span {span:5.2f} grid {g} "
                  f"BN={c.get('BLOCK_N')} SK={c.get('SPLIT_K')} st={c.get('STAGES')} sms {sms} | start p50/p90/max {q(st)} "
                  f"loop {q(lp)} after-loop {q(tail)} last-end-minus-last-loop {(t2.max()-t1.max()).item()/1e3:.2f}", flush=True)
            res[f"timeline_{M}_{N}_{K}"] = dict(event=t, span=span.item(), start=st.tolist(), loop=lp.tolist(), tail=tail.tolist())
    use_orig()
except Exception:
    traceback.print_exc(); use_orig()

# ---------------------------------------------------------------- D: single vs back-to-back (rotating weights)
section("D: one call (cold) vs R back-to-back calls on R weight copies (cold, per call), stream and graph")
def b2b(fns):
    flush = torch.empty(256 * 2**20 // 4, device=dev)
    times = []
    for _ in range(10):
        flush.sum(); torch.cuda._sleep(4_000_000)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for fn in fns:
            fn()
        e.record(); torch.cuda.synchronize()
        times.append(s.elapsed_time(e) * 1e3 / len(fns))
    return statistics.median(times)

def graph_of(fns):
    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        for fn in fns: fn()
    torch.cuda.current_stream().wait_stream(st)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for fn in fns: fn()
    return g

try:
    for M in (1, 16):
        for N, K in SHAPES:
            R = max(4, min(24, int(400e6 // (N * K))))
            a, a_s = act(M, K)
            ws = [weights(N, K) for _ in range(R)]
            fns = [(lambda w=w: ops.scaled_mm(a, a_s, w[0], w[1], backend="triton")) for w in ws]
            one = gpu_time_us(fns[0])
            seq = b2b(fns)
            g = graph_of(fns)
            gt = b2b([g.replay])* 1 / R
            xb = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            wb = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) for _ in range(max(2, R // 2))]
            bfn = [(lambda w=w: torch.nn.functional.linear(xb, w)) for w in wb]
            bone = gpu_time_us(bfn[0]); bseq = b2b(bfn)
            gb = graph_of(bfn); bgt = b2b([gb.replay]) / len(bfn)
            fl = floor_us(M, N, K)
            print(f"M={M:3d} {N:6d}x{K:<6d} floor {fl:5.1f} | fp8 one {one:5.1f} ({fl/one:.2f}) b2b {seq:5.1f} ({fl/seq:.2f}) graph {gt:5.1f} ({fl/gt:.2f}) "
                  f"| bf16 one {bone:5.1f} b2b {bseq:5.1f} graph {bgt:5.1f} | fp8/bf16 graph {gt/bgt:.2f}", flush=True)
            res[f"b2b_{M}_{N}_{K}"] = dict(floor=fl, one=one, b2b=seq, graph=gt, bf16_one=bone, bf16_b2b=bseq, bf16_graph=bgt)
            del ws, wb, g, gb
except Exception:
    traceback.print_exc()

# ---------------------------------------------------------------- E: PDL in a graph of a 24-linear stack
section("E: 4-layer dim-4096 linear stack (24 decode GEMMs, M=1 FP8 scaled_mm), CUDA graph, us per step")
try:
    dims = [(4096, 4096)] * 4 + [(16384, 4096), (4096, 16384)]
    layers = [(weights(N, K), K) for _ in range(4) for N, K in dims]
    acts = {K: act(1, K) for K in (4096, 16384)}
    for name, extra in (("orig", None), ("patched PDL=0", dict(PDL=0)), ("PDL=1 wait first", dict(PDL=1, launch_pdl=True)),
                        ("PDL=2 L2 prefetch then wait", dict(PDL=2, launch_pdl=True))):
        if extra is None: use_orig()
        else: use_patched(**extra)
        fns = [(lambda w=w, K=K: ops.scaled_mm(*acts[K], w[0], w[1], backend="triton")) for w, K in layers]
        ref = [fn() for fn in fns]
        g = graph_of(fns)
        t = b2b([g.replay])
        outs_ok = all(torch.equal(r, fn()) for r, fn in zip(ref, fns))
        tt = b2b(fns)
        print(f"{name:30s} graph {t:7.1f} us/step   stream {tt * len(fns):7.1f} us/step  outputs equal: {outs_ok}", flush=True)
        res[f"pdl_{name}"] = dict(graph=t, stream=tt * len(fns))
        del g
    use_orig()
except Exception:
    traceback.print_exc(); use_orig()

# ---------------------------------------------------------------- A: launcher cost
section("A: host cost per call (best of 5 x 2000), us")
try:
    a, a_s = act(1, 7168); w, w_s = weights(2112, 7168)
    # Find the args of the last launch by wrapping
    captured = []
    orig_call = PatchedLauncher.__call__
    def cap(self, *args):
        captured.append(args); return orig_call(self, *args)
    PatchedLauncher.__call__ = cap
    LAUNCHERS.clear(); use_patched(kernel=False); ops.scaled_mm(a, a_s, w, w_s, backend="triton"); ops.scaled_mm(a, a_s, w, w_s, backend="triton")
    PatchedLauncher.__call__ = orig_call
    args = captured[-1]; lau = LAUNCHERS[-1]
    print("direct:", lau.direct, "nargs", len(args), "tensors", sum(isinstance(x, torch.Tensor) for x in args))
    run = lau._run
    cl = run.__self__ if hasattr(run, "__self__") else run
    launch_c = getattr(run, "launch", None)
    stream = torch._C._cuda_getCurrentRawStream(0)
    ints = tuple(x.data_ptr() if isinstance(x, torch.Tensor) else x for x in args)
    tidx = tuple(i for i, x in enumerate(args) if isinstance(x, torch.Tensor))
    def conv():
        l = list(args)
        for i in tidx:
            l[i] = l[i].data_ptr()
        return l
    def best(fn, n=2000):
        for _ in range(100): fn()
        return min(loop_us(fn, n) for _ in range(5))
    cases = {
        "Launcher(*args) direct": lambda: lau(*args),
        "compiled.run(tensors)": lambda: run(*lau.grid, stream, lau._function, lau._packed, None, None, None, *args, *lau._tail),
        "compiled.run(ints)": lambda: run(*lau.grid, stream, lau._function, lau._packed, None, None, None, *ints, *lau._tail),
        "getCurrentRawStream": lambda: torch._C._cuda_getCurrentRawStream(0),
        "data_ptr conversion": conv,
        "torch.empty((1,2112), bf16)": lambda: torch.empty((1, 2112), dtype=torch.bfloat16, device=a.device),
        "ops.scaled_mm": lambda: ops.scaled_mm(a, a_s, w, w_s),
        "ops.act_quant": lambda: ops.act_quant(a.to(torch.bfloat16) if False else xq),
        "F.linear bf16": lambda: torch.nn.functional.linear(xb, wb),
    }
    xq = torch.randn(1, 7168, device=dev, dtype=torch.bfloat16)
    xb = xq; wb = torch.randn(2112, 7168, device=dev, dtype=torch.bfloat16)
    if launch_c is not None:
        meta = lau._packed
        cases["C launch(ints)"] = lambda: launch_c(*lau.grid, stream, lau._function, cl.launch_cooperative_grid, cl.launch_pdl, None, None, meta, None, None, None, *ints, *lau._tail)
        cases["C launch(tensors)"] = lambda: launch_c(*lau.grid, stream, lau._function, cl.launch_cooperative_grid, cl.launch_pdl, None, None, meta, None, None, None, *args, *lau._tail)
        print("scratch sizes", cl.global_scratch_size, cl.profile_scratch_size)
    for k, fn in cases.items():
        try:
            print(f"{k:34s} {best(fn):6.2f}", flush=True)
        except Exception as e:
            print(k, "failed", repr(e))
    torch.cuda.synchronize()
    use_orig()
except Exception:
    traceback.print_exc(); use_orig()

json.dump(res, open(os.path.join(OUT, "r3_probe.json"), "w"))
print("done", flush=True)
