"""PDL experiment: decode GEMMs launched as programmatic dependent launches (L2 prefetch of the first
weight tiles, then griddepcontrol.wait) against plain launches: bits, CUDA-graph and eager step times."""
import copy, statistics, time
import torch
import quantcore, quantcore.nn as qnn
from quantcore import registry, ops
from quantcore.backends.triton import configs
from quantcore.bench import decoder, timing
from quantcore.bench.timing import loop_us

dev = torch.device("cuda")
orig = configs.decode_pdl
def set_pdl(on):
    configs.decode_pdl = (lambda p: p.kind == "cuda") if on else (lambda p: False)
    registry.clear_caches()

def graph_of(fn):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3): fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g, out

def graph_us(g, n=50):
    g.replay(); torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n): g.replay()
    b.record(); torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / n

torch.manual_seed(0)
with torch.inference_mode():
    # 1. bits: every decode shape/dtype, eager and graph, PDL on == off
    x16 = torch.randn(16, 7168, device=dev, dtype=torch.bfloat16)
    for qd in (torch.float8_e4m3fn, torch.int8):
        for (n, k, m, bias) in ((2112, 7168, 1, False), (7168, 2048, 4, True), (24576, 1536, 16, False), (4096, 7168, 64, True), (32768, 512, 1, True)):
            lin = torch.nn.Linear(k, n, bias=bias, device=dev, dtype=torch.bfloat16)
            layer = qnn.QuantLinear.from_linear(lin, dtype=qd)
            x = torch.randn(m, 1, k, device=dev, dtype=torch.bfloat16)
            res = {}
            for on in (False, True):
                set_pdl(on)
                e = layer(x); e = layer(x)
                g, out = graph_of(lambda: layer(x))
                g.replay(); torch.cuda.synchronize()
                a, a_s = ops.act_quant(x.view(m, k), dtype=qd)
                sm = ops.scaled_mm(a, a_s, layer.weight, layer.weight_scale_inv, bias=layer.bias)
                res[on] = (e.clone(), out.clone(), sm.clone())
            ok = all(torch.equal(p, q) for p, q in zip(res[False], res[True]))
            print(f"bits {str(qd)[6:]} {m}x{n}x{k} bias={bias}: PDL == plain: {ok}", flush=True)
    # 2. linear stack and model in CUDA graphs and eagerly, interleaved
    stack = decoder.linear_stack(4096, 4, dev)
    base = decoder.DecodeModel(4096, 4, 32000, dev)
    for qd in (torch.float8_e4m3fn, torch.int8):
        qstack = qnn.quantize_model(copy.deepcopy(stack), dtype=qd)
        qmodel = qnn.quantize_model(copy.deepcopy(base), dtype=qd)
        for batch in (1, 8):
            x = torch.randn(batch, 4096, device=dev, dtype=torch.bfloat16)
            t = {k: [] for k in ("stack graph", "model graph", "model eager")}
            times = {(on, k): [] for on in (False, True) for k in t}
            graphs = {}
            for on in (False, True):
                set_pdl(on)
                st = decoder.DecodeState.new(qmodel, batch, 256)
                gs, _ = graph_of(lambda: qstack(x))
                gm, _ = graph_of(lambda: decoder.decode_step(qmodel, st))
                graphs[on] = (gs, gm, st)
            for r in range(7):
                for on in (False, True):
                    set_pdl(on)
                    gs, gm, st = graphs[on]
                    times[(on, "stack graph")].append(graph_us(gs))
                    times[(on, "model graph")].append(graph_us(gm))
                    step = lambda: decoder.decode_step(qmodel, st)
                    for _ in range(3): step()
                    times[(on, "model eager")].append(loop_us(step, 32))
            line = []
            for k in t:
                off, on_ = statistics.median(times[(False, k)]), statistics.median(times[(True, k)])
                line.append(f"{k} {off:7.1f} -> {on_:7.1f} us ({off / on_:.3f}x)")
            print(f"{str(qd)[6:]} batch {batch}: " + " | ".join(line), flush=True)
    # 3. single-kernel GPU time (bench timer) of the decode GEMMs, PDL off / on
    for qd in (torch.float8_e4m3fn,):
        for (n, k) in ((2112, 7168), (7168, 2048), (7168, 16384)):
            wq, ws = ops.weight_quant(torch.randn(n, k, device=dev, dtype=torch.bfloat16), dtype=qd)
            x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
            r = []
            for on in (False, True):
                set_pdl(on)
                f = lambda: ops.quant_linear(x, wq, ws)
                f()
                r.append(timing.gpu_time_us(f))
            print(f"gpu time 1x{n}x{k}: plain {r[0]:.1f} us, PDL {r[1]:.1f} us", flush=True)
