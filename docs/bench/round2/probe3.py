"""Device probe 3: L2 flush method (dirty vs clean) on decode GEMMs, split-K balance, CuPy host path."""
import cProfile, io, json, math, os, pstats, statistics, time
import torch, triton
import torch.nn.functional as F
import quantcore
from quantcore import ops
from quantcore.backends.triton import configs, launch
from quantcore.bench import timing

OUT = os.environ.get("OUT", "/tmp")
log = open(f"{OUT}/probe3.txt", "w")
def say(*a):
    s = " ".join(str(x) for x in a); print(s, flush=True); log.write(s + "\n"); log.flush()

dirty = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
clean = torch.ones(256 * 2**20, dtype=torch.uint8, device="cuda")
def t_us(fn, mode, reps=15):
    for _ in range(3): fn()
    torch.cuda.synchronize(); ts = []
    for _ in range(reps):
        if mode == "dirty": dirty.zero_()
        elif mode == "clean": dirty.zero_(); clean.sum(dtype=torch.int32)
        torch.cuda._sleep(2_000_000)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e) * 1e3)
    return statistics.median(ts)

bw = timing.copy_bandwidth_gbps()
say("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(), f"copy bw {bw:.0f} GB/s")
import triton.language as tl
@triton.jit
def _touch(x_ptr):
    pass
buf = torch.zeros(16, device="cuda")
src = torch.empty(16 * 2**20, dtype=torch.uint8, device="cuda"); dst = torch.empty_like(src)
rd = torch.ones(64 * 2**20, dtype=torch.uint8, device="cuda")
for name, fn in [("empty kernel", lambda: _touch[(1,)](buf)), ("copy 16MiB", lambda: dst.copy_(src)),
                 ("sum-read 64MiB", lambda: rd.sum(dtype=torch.int32))]:
    say(f"{name:<40} " + " ".join(f"{m}={t_us(fn, m):7.1f}" for m in ("dirty", "clean", "warm")))

SHAPES = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168), (7168, 16384), (32768, 512)]
prof = quantcore.profile_for("cuda")
orig = configs.decode_config
def floor(M, N, K, wbytes=1):
    return (wbytes * N * K + M * K + 2 * M * N + 4 * (math.ceil(N / 128) * math.ceil(K / 128) + M * math.ceil(K / 128))) / bw / 1e3
opts = dict(block_n=128, block_k=128, bias=None, activation=None, out_dtype=torch.bfloat16, out_quant=None,
            out_group=128, ue8m0_out=False, eps=1e-4, profile=prof)
rows = []
say("\n== A: flush method, M=1 (us; fraction of floor)")
weights = {}
for N, K in SHAPES:
    wv = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    bq, bs = ops.weight_quant(wv); biq, bis = ops.weight_quant(wv, dtype=torch.int8)
    weights[(N, K)] = (bq, bs, biq, bis)
    x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
    a, asc = ops.act_quant(x); ai, aisc = ops.act_quant(x, dtype=torch.int8)
    fl = floor(1, N, K); flb = floor(1, N, K, 2)
    for name, fn, f in [("fp8 scaled_mm", lambda: ops.scaled_mm(a, asc, bq, bs), fl),
                        ("int8 scaled_mm", lambda: ops.scaled_mm(ai, aisc, biq, bis), fl),
                        ("fp8 quant_linear", lambda: ops.quant_linear(x, bq, bs), fl),
                        ("bf16 F.linear", lambda: F.linear(x, wv), flb)]:
        r = {m: t_us(fn, m) for m in ("dirty", "clean", "warm")}
        say(f"{N:>6}x{K:<6} {name:<18} floor {f:6.1f} " + " ".join(f"{m}={v:6.1f}({f/v:.2f})" for m, v in r.items()))
        rows.append(dict(N=N, K=K, M=1, name=name, floor=f, **r))
    del wv

say("\n== B: decode split/tile sweep, clean flush")
def balance(kbs, tiles, split, sms):
    per = math.ceil(kbs / split); split = math.ceil(kbs / per); P = tiles * split
    return kbs * tiles / (math.ceil(P / sms) * sms * per), split, per
sweep = []
for N, K in SHAPES:
    bq, bs, biq, bis = weights[(N, K)]
    for M in (1, 16):
        a, asc = ops.act_quant(torch.randn(M, K, device="cuda", dtype=torch.bfloat16))
        fl = floor(M, N, K)
        base = orig(prof, M, N, K, mma="fp8", block_k=128, min_block_n=1)
        kbs = math.ceil(K / 128)
        cands = {(base.block_n, base.num_warps, base.num_stages, base.split_k)}
        for bn in (32, 64, 128):
            tiles = math.ceil(N / bn)
            opts_ = sorted({balance(kbs, tiles, s, prof.sm_count)[1:] for s in range(1, kbs // 2 + 1)},
                           key=lambda sp: -balance(kbs, tiles, sp[0], prof.sm_count)[0] + 0.002 * sp[0])
            for s, per in opts_[:2]:
                for st in (4, 8):
                    cands.add((bn, 4, st, s))
        res = {}
        for bn, w_, st, s in sorted(cands):
            per = math.ceil(kbs / s)
            cfg = configs.DecodeConfig(base.block_m, bn, w_, st, math.ceil(kbs / per), per)
            configs.decode_config = lambda *aa, cfg=cfg, **k: cfg
            try:
                run = launch.scaled_mm.prepare(a, asc, bq, bs, **opts)
                res[(bn, w_, st, cfg.split_k)] = t_us(lambda: run(a, asc, bq, bs), "clean", reps=10)
            except Exception as err:
                say("ERR", N, K, M, cfg, str(err)[:300])
            finally:
                configs.decode_config = orig
        b = (base.block_n, base.num_warps, base.num_stages, base.split_k)
        best = min(res, key=res.get)
        say(f"M={M:<3}{N:>6}x{K:<6} floor {fl:5.1f} default {b} {res.get(b, float('nan')):6.1f} ({fl/res.get(b, 1e9):.2f}) "
            f"best {best} {res[best]:6.1f} ({fl/res[best]:.2f}) | " + " ".join(f"{c[0]}/{c[2]}/{c[3]}:{v:.1f}" for c, v in sorted(res.items())))
        sweep.append(dict(N=N, K=K, M=M, floor=fl, default=str(b), res={str(k): v for k, v in res.items()}))
json.dump(dict(flush=rows, sweep=sweep), open(f"{OUT}/probe3.json", "w"), indent=1)

say("\n== C: CuPy host path, M=1 2112x7168")
bq, bs, biq, bis = weights[(2112, 7168)]
x = torch.randn(1, 7168, device="cuda", dtype=torch.bfloat16)
a, asc = ops.act_quant(x)
calls = {"act_quant": lambda: ops.act_quant(x, backend="cupy"),
         "scaled_mm": lambda: ops.scaled_mm(a, asc, bq, bs, backend="cupy"),
         "quant_linear": lambda: ops.quant_linear(x, bq, bs, backend="cupy"),
         "triton scaled_mm": lambda: ops.scaled_mm(a, asc, bq, bs, backend="triton")}
for name, fn in calls.items():
    try:
        say(f"cupy {name:<16} eager {timing.eager_time_us(fn):7.1f} us  gpu {timing.gpu_time_us(fn):7.1f} us")
    except Exception as err:
        say("ERR", name, str(err)[:300])
pr = cProfile.Profile(); fn = calls["scaled_mm"]; fn()
pr.enable()
for _ in range(2000): fn()
pr.disable(); torch.cuda.synchronize()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30); open(f"{OUT}/cupy_profile.txt", "w").write(s.getvalue())
