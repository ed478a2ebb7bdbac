"""The harness of round 9's sweeps (decode_m.py, gluon_staged.py): compiling hundreds of kernel
variants one after another would take most of a device call, so worker processes first run each
launch once (filling Triton's on-disk cache) and the timed process then loads them."""
import json
import math
import subprocess
import sys

import torch

from quantcore import capability

WORKERS = 14


def main(script: str, measure, warm) -> None:
    """`python3 script [out.json]`: WORKERS processes run `warm(worker, WORKERS)` (`script --warm i n`),
    then `measure()` returns the rows, written to out.json with the device and versions."""
    if sys.argv[1:2] == ["--warm"]:
        warm(int(sys.argv[2]), int(sys.argv[3]))
        return
    for p in [subprocess.Popen([sys.executable, script, "--warm", str(i), str(WORKERS)]) for i in range(WORKERS)]:
        p.wait()
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    rows = measure()
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), versions=capability.versions(), rows=rows), f, indent=1)


def geomean(xs) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")
