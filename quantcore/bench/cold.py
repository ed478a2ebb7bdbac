"""`python -m quantcore.bench.cold`: the seconds a process waits before its first quantized forward, and at
the first call of each new batch size, with empty caches (a fresh QUANTCORE_CACHE_DIR and TRITON_CACHE_DIR:
Triton compiles every kernel, quantcore's native launch path is built) and warm ones (the same folders,
a second process). Each measurement is a fresh subprocess; Python, torch, quantcore and Triton are
imported before the clock starts.

Printed per process: `quantize` (quantize_model of the model: the weight quantizer's compile), `first
forward` (its first forward, one row), each new batch size's first forward and `steady` (a forward of a
kept batch size), the Triton kernels in the cache after each step (in a cold process, those compiled so
far), then how kept plans are launched at its end (the native build runs beside these in a cold process).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

# The child: one process's timings as one JSON line.
_CHILD = r"""
import json, os, pathlib, sys, time
import torch, triton, quantcore
from quantcore.nn import quantize_model
from quantcore.runtime import native
hidden, layers, sizes = int(sys.argv[1]), int(sys.argv[2]), [int(m) for m in sys.argv[3].split(",")]

compiled = {}
def timed(fn, name=None):
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    if name:  # the Triton kernels in the cache after this step, new ones compiled by it
        compiled[name] = len(list(pathlib.Path(os.environ["TRITON_CACHE_DIR"]).glob("*/*.cubin")))
    return time.perf_counter() - start

torch.manual_seed(0)
mlp = torch.nn.Sequential(*[torch.nn.Linear(hidden, hidden) for _ in range(layers)]).cuda().to(torch.bfloat16)
out = {}
with torch.no_grad():
    out["quantize"] = timed(lambda: quantize_model(mlp, skip=()), "quantize")
    x = {m: torch.randn(m, hidden, device="cuda", dtype=torch.bfloat16) for m in sizes}
    out["first forward"] = timed(lambda: mlp(x[sizes[0]]), "first forward")
    for m in sizes[1:]:
        out[f"M={m} first"] = timed(lambda: mlp(x[m]), f"M={m} first")
    out["steady"] = min(timed(lambda: mlp(x[sizes[0]])) for _ in range(20))
out["launch path"] = native.status("cuda")
out["Triton kernels in the cache after each step"] = compiled
print(json.dumps(out))
"""


def measure(hidden: int, layers: int, sizes: list[int], cache: str) -> dict:
    """One fresh process's timings with quantcore's and Triton's caches under `cache`."""
    env = {**os.environ, "QUANTCORE_CACHE_DIR": os.path.join(cache, "quantcore"),
           "TRITON_CACHE_DIR": os.path.join(cache, "triton")}
    done = subprocess.run([sys.executable, "-c", _CHILD, str(hidden), str(layers), ",".join(map(str, sizes))],
                          env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"the measuring process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    """Entry point: a cold process, then a warm one on the caches it left; prints both, writes JSON."""
    parser = argparse.ArgumentParser(prog="python -m quantcore.bench.cold", description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32,64,128")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    sizes = [int(m) for m in args.batch_sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="quantcore-cold-") as cache:
        runs = {"cold": measure(args.hidden, args.layers, sizes, cache)}
        runs["warm"] = measure(args.hidden, args.layers, sizes, cache)
    keys = [k for k, v in runs["cold"].items() if isinstance(v, float)]
    print("| | " + " | ".join(keys) + " |\n|---|" + "---|" * len(keys))
    for name, r in runs.items():
        print(f"| {name} s | " + " | ".join(f"{r[k]:.3f}" for k in keys) + " |")
    for name, r in runs.items():
        print(f"{name}: Triton kernels in the cache after each step: {r['Triton kernels in the cache after each step']}")
        print(f"{name}: kept plans at the end: {r['launch path']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), **runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
