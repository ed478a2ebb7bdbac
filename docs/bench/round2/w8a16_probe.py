#!/usr/bin/env python3
"""W8A16 probe (issue 17): FP8 `scaled_mm` under `quantcore.simulate("sm80")` on this GPU, three ways,
beside torch's bf16 GEMM (`a @ w.t()`) and `torch._int_mm` of the same shape, with bit-equality checks.

  old     the kernels before the packed decode: integer decode per MMA fragment, 128x64 tiles first, no
          predecode. Run in a child process: the decode route is a module constexpr fixed per process.
  new     this branch as shipped: packed PTX decode once per K block, 128x128 tiles, and from 2048 rows
          both operands decoded to fp16 once per call (configs.predecode).
  inkern  this branch with predecode off, timed only where `new` predecodes: the in-kernel decode alone.

Shapes: M in {1, 16, 128, 4096} x (N, K) in {(2112, 7168), (7168, 2048), (4096, 7168)}; bf16 output.
Times: `quantcore.bench.timing.gpu_time_us` (CUDA events, L2 flushed, median of 15 calls). Both processes
compile first, in parallel; then each times its calls while the other waits, so timings never overlap.
Bit-equality: SHA-256 of the bf16 outputs (old vs new; inkern vs new).

Run:  PYTHONPATH=<repo> python3 w8a16_probe.py     (writes only $OUT/w8a16_probe.json; OUT defaults to /tmp)
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time

MS = (1, 16, 128, 4096)
NKS = ((2112, 7168), (7168, 2048), (4096, 7168))
DEVICE = "cuda"
# W8A16_PROBE_SMOKE=1: a check of this script itself on a machine without a GPU (interpreted kernels, tiny
# shapes, host timers, predecode from 64 rows). Its numbers mean nothing.
SMOKE = os.environ.get("W8A16_PROBE_SMOKE") == "1"
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"
    MS, NKS, DEVICE = (1, 70), ((64, 256),), "cpu"
OLD_TILES = [[128, 64, 8, 3], [64, 128, 8, 3], [64, 64, 4, 3]]  # default.json's "fp16" rule before this branch


def configure(variant: str) -> None:
    """Before any kernel compiles: the old decode route and tiles (variant "old"), else this branch's."""
    import triton.language as tl

    import quantcore
    from quantcore.backends.triton import configs
    from quantcore.backends.triton.kernels import fp8

    # The tables as the launches read them: per architecture name ("sm_80" under simulate("sm80"); the
    # CPU's "default"), each a dict of its own loaded from default.json.
    tables = [configs._table(configs._arch(p)) for p in (quantcore.capability.simulated_profile("sm80"),
                                                          quantcore.capability.cpu_profile())]
    if variant == "old":
        fp8.PACKED_DECODE = tl.constexpr(False)
    for table in tables:
        if variant == "old":
            next(r for r in table["gemm"] if r["mma"] == "fp16")["configs"] = OLD_TILES
            table["predecode"] = None
        elif SMOKE:
            table["predecode"] = dict(table["predecode"], m_min=64)
    if SMOKE:
        from quantcore.bench import baselines, timing

        timing.gpu_time_us = lambda fn: min(_host_us(fn) for _ in range(3))
        baselines.bf16_mm = lambda m, n, k: (lambda x=torch_zeros(m, k), w=torch_zeros(n, k): x @ w.t())
        baselines.int_mm = lambda a, b: (lambda: a.float() @ b.float().t())


def _host_us(fn) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e6


def torch_zeros(*shape):
    import torch

    return torch.zeros(*shape, dtype=torch.bfloat16)


def cases():
    """(m, n, k, a8, a_s, w8, w_s, a_i8, w_i8): the same values in every process."""
    import torch

    from quantcore import ops

    for n, k in NKS:
        g = torch.Generator(device=DEVICE).manual_seed(n * 31 + k)
        w = torch.randn(n, k, generator=g, device=DEVICE, dtype=torch.bfloat16)
        w8, w_s = ops.weight_quant(w, backend="torch")
        wi, _ = ops.weight_quant(w, dtype=torch.int8, backend="torch")
        for m in MS:
            a = torch.randn(m, k, generator=g, device=DEVICE, dtype=torch.bfloat16)
            a8, a_s = ops.act_quant(a, backend="torch")
            ai, _ = ops.act_quant(a, dtype=torch.int8, backend="torch")
            yield m, n, k, a8, a_s, w8, w_s, ai, wi


class Runner:
    """quantcore's FP8 GEMM under simulate("sm80") on every case, for one variant: `compile()` makes
    the first call of each (compiling the kernels), `time()` times them all."""

    def __init__(self, variant: str):
        import quantcore
        from quantcore.backends.triton import configs

        self.calls, self.results = {}, {}
        sm80 = quantcore.capability.simulated_profile("sm80")
        for m, n, k, a8, a_s, w8, w_s, *_ in cases():
            labels = ["new", "inkern"] if variant == "new" and configs.predecode(sm80, m, n, k) else [variant]
            for label in labels:
                self.calls[f"{m}|{n}|{k}|{label}"] = (m, n, k, label, (a8, a_s, w8, w_s))

    def _run(self, key: str, timed: bool) -> None:
        import torch

        import quantcore
        from quantcore import ops, registry
        from quantcore.backends.triton import configs
        from quantcore.bench import timing

        m, n, k, label, args = self.calls[key]
        original = configs.predecode
        if label == "inkern":
            configs.predecode = lambda *_: False
        # Plans are kept per signature and decide predecode when made: make them afresh (not reset(),
        # which would also reload the configuration tables `configure` changed).
        registry.clear_caches()

        def call():
            with quantcore.simulate("sm80"):
                return ops.scaled_mm(*args, backend="triton")
        try:
            with quantcore.simulate("sm80"):
                ran = quantcore.explain("scaled_mm", *args, backend="triton").selected
            sm80 = quantcore.capability.simulated_profile("sm80")
            predecoded = configs.predecode(sm80, m, n, k)
            if m <= configs.decode_m_max(sm80):
                tiles = "the decode kernel"
            else:
                c = configs.gemm_candidates(sm80, m, n, k, mma="fp16_predecoded" if predecoded else "fp16", block_k=128,
                                            min_block_n=1)[0]
                tiles = f"{c.block_m}x{c.block_n} tiles, {c.num_warps} warps, {c.num_stages} stages"
            out = call()
            entry = {"ran": f"{ran}, {'predecoded' if predecoded else 'decoded in the kernel'}, {tiles}",
                     "digest": hashlib.sha256(out.view(torch.int16).cpu().numpy().tobytes()).hexdigest()}
            if timed:
                us = timing.gpu_time_us(call)
                entry.update(us=us, tflops=2.0 * m * n * k / us / 1e6)
        except Exception as err:  # a probe reports each failure and goes on
            entry = {"error": f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}"}
        finally:
            configs.predecode = original
        self.results[key] = entry

    def compile(self) -> None:
        for key in self.calls:
            self._run(key, timed=False)

    def time(self) -> dict:
        for key in self.calls:
            self._run(key, timed=True)
        return self.results


def child() -> None:
    """The old kernels: compile, say READY, wait for GO, time, print the results as one JSON line."""
    configure("old")
    runner = Runner("old")
    runner.compile()
    print("READY", flush=True)
    sys.stdin.readline()
    print(json.dumps(runner.time()), flush=True)


def main() -> None:
    import torch

    from quantcore.bench import baselines, timing

    start = time.perf_counter()
    old = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--old"], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)
    configure("new")
    runner = Runner("new")
    runner.compile()
    vendor = {}
    for m, n, k, *_, ai, wi in cases():
        vendor[(m, n, k, "bf16")] = baselines.bf16_mm(m, n, k)
        vendor[(m, n, k, "int_mm")] = baselines.int_mm(ai, wi)  # small M padded to 17 rows, as the bench does
    if old.stdout.readline().strip() != "READY":
        raise SystemExit(f"the old-kernel process failed (exit {old.wait()}); see its error above")
    compiled_s = time.perf_counter() - start
    new = runner.time()
    vendor_us = {key: timing.gpu_time_us(fn) for key, fn in vendor.items()}
    old.stdin.write("GO\n")
    old.stdin.flush()
    old_results = json.loads(old.stdout.readline())
    old.wait()

    dev = "CPU smoke test" if SMOKE else torch.cuda.get_device_name()
    print(f"device {dev}; torch {torch.__version__}; compiled in {compiled_s:.0f} s; "
          f"total {time.perf_counter() - start:.0f} s")
    print("FP8 scaled_mm under simulate('sm80'), bf16 out, TFLOP/s (GPU µs). old: integer decode per fragment, "
          "128x64 tiles; new: packed decode once per K block, 128x128, predecoded from 2048 rows; "
          "inkern: new without predecode.")
    print("| M×N×K | old | new | inkern | bf16 a@w.t() | torch._int_mm | new / old | new / bf16 | bits | new ran | old ran |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")

    def cell(e):
        return "—" if not e else e.get("error", "")[:48] or f"{e['tflops']:.1f} ({e['us']:.1f})"

    def speedup(slow, fast):
        return f"{slow['us'] / fast['us']:.2f}" if "us" in slow and "us" in fast else "—"

    rows = []
    for m in MS:
        for n, k in NKS:
            o = old_results.get(f"{m}|{n}|{k}|old", {})
            nw, ik = new.get(f"{m}|{n}|{k}|new", {}), new.get(f"{m}|{n}|{k}|inkern", {})
            bf, im = vendor_us[(m, n, k, "bf16")], vendor_us[(m, n, k, "int_mm")]
            flops = 2.0 * m * n * k
            bits = "—" if "digest" not in o or "digest" not in nw else ("equal" if o["digest"] == nw["digest"] else "DIFFER")
            if "digest" in ik:
                bits += ", inkern " + ("equal" if ik["digest"] == nw["digest"] else "DIFFERS")
            print(f"| {m}x{n}x{k} | {cell(o)} | {cell(nw)} | {cell(ik)} | {flops / bf / 1e6:.1f} ({bf:.1f}) "
                  f"| {flops / im / 1e6:.1f} ({im:.1f}) | {speedup(o, nw)} | {speedup({'us': bf}, nw)} | {bits} "
                  f"| {nw.get('ran', '—')} | {o.get('ran', '—')} |")
            rows.append(dict(m=m, n=n, k=k, old=o, new=nw, inkern=ik, bf16_us=bf, int_mm_us=im))
    os.makedirs(os.environ.get("OUT", "/tmp"), exist_ok=True)
    path = os.path.join(os.environ.get("OUT", "/tmp"), "w8a16_probe.json")
    with open(path, "w") as f:
        json.dump({"device": dev, "torch": torch.__version__, "command": " ".join(sys.argv), "rows": rows}, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    child() if "--old" in sys.argv else main()
