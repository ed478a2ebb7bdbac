"""Round-3 probe b: PDL variants of the decode GEMM in a 24-linear CUDA-graph stack; the bench's read ceiling."""
import os, statistics, sys, traceback
sys.path.insert(0, os.path.dirname(__file__))
import torch, triton
from quantcore import ops, registry
from quantcore.bench import stream
from quantcore.bench.baselines import gemm_floor_bytes
import r3_patch
import quantcore.backends.triton.launch as L
dev = "cuda"
FP8 = torch.float8_e4m3fn
orig_kernel, orig_launcher = L.decode_mm_kernel, L.Launcher
EXTRA = {}
class PatchedLauncher(orig_launcher):
    def __init__(self, fn, grid, constants, device):
        if fn is r3_patch.kernel:
            constants = dict(constants, **EXTRA)
        super().__init__(fn, grid, constants, device)
def use(extra):
    EXTRA.clear()
    if extra is None:
        L.decode_mm_kernel, L.Launcher = orig_kernel, orig_launcher
    else:
        EXTRA.update(dict(TIMER=0, PDL=0), **extra)
        L.decode_mm_kernel, L.Launcher = r3_patch.kernel, PatchedLauncher
    registry.reset()
def b2b(fns, reps=15):
    flush = torch.empty(256 * 2**20 // 4, device=dev)
    times = []
    for _ in range(reps):
        flush.sum(); torch.cuda._sleep(4_000_000)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for fn in fns: fn()
        e.record(); torch.cuda.synchronize()
        times.append(s.elapsed_time(e) * 1e3)
    return statistics.median(times)
def graph_of(fns):
    st = torch.cuda.Stream(); st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        for fn in fns: fn()
    torch.cuda.current_stream().wait_stream(st)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for fn in fns: fn()
    return g
print("torch", torch.__version__, "triton", triton.__version__, flush=True)
print("\n== read ceiling (bench.stream.read_us) for decode GEMM bytes")
for m, n, k in ((1, 2112, 7168), (1, 7168, 2048), (1, 4096, 7168), (1, 7168, 16384), (1, 32768, 512), (64, 2112, 7168)):
    nb = gemm_floor_bytes(m, n, k)
    print(f"{m}x{n}x{k}: {nb/1e6:.1f} MB read {stream.read_us(nb):.1f} us", flush=True)

print("\n== stack of linears, CUDA graph and stream, us per step (median of 15, L2 flushed before each)")
dims = [(4096, 4096)] * 4 + [(16384, 4096), (4096, 16384)]
for M in (1, 16):
    for fmt in (FP8, torch.int8):
        layers = [(ops.weight_quant(torch.randn(N, K, device=dev, dtype=torch.bfloat16), dtype=fmt), K) for _ in range(4) for N, K in dims]
        xs = {K: torch.randn(M, K, device=dev, dtype=torch.bfloat16) for K in (4096, 16384)}
        acts = {K: ops.act_quant(x, dtype=fmt) for K, x in xs.items()}
        floor = sum(gemm_floor_bytes(M, w[0].shape[0], K) for w, K in layers) / 3037 / 1e3
        base = None
        for name, extra in (("orig", None), ("PDL=1 wait, trigger at entry", dict(PDL=1, launch_pdl=True)),
                            ("PDL=2 prefetch, wait, trigger at entry", dict(PDL=2, launch_pdl=True)),
                            ("PDL=3 prefetch, wait, trigger after loop", dict(PDL=3, launch_pdl=True)),
                            ("PDL=4 wait, trigger after loop", dict(PDL=4, launch_pdl=True))):
            try:
                use(extra)
                for op in ("scaled_mm", "quant_linear"):
                    if op == "scaled_mm":
                        fns = [(lambda w=w, K=K: ops.scaled_mm(*acts[K], w[0], w[1], backend="triton")) for w, K in layers]
                    else:
                        fns = [(lambda w=w, K=K: ops.quant_linear(xs[K], w[0], w[1], backend="triton")) for w, K in layers]
                    ref = [fn() for fn in fns]
                    g = graph_of(fns)
                    t = b2b([g.replay])
                    ok = all(torch.equal(r, fn()) for r, fn in zip(ref, fns))
                    g.replay(); torch.cuda.synchronize()
                    tt = b2b(fns)
                    print(f"M={M:2d} {str(fmt)[6:]:14s} {op:12s} {name:42s} graph {t:6.1f} stream {tt:6.1f} floor {floor:5.1f} equal {ok}", flush=True)
                    del g
            except Exception:
                traceback.print_exc()
        use(None)
        del layers
print("done")
