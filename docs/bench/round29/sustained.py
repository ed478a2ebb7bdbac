"""Round-29 helper of the sustained probes (`yield_sustained.py`, `tiles_sustained.py`): run callables back to back
for PHASE seconds each while `nvidia-smi` samples the SM clock, power draw and temperature every 50 ms, then one
line per phase: time per call (host clock over the loop), median clock and power of the samples inside it (its
first 0.5 s dropped) and energy per call. Round 18's clock_probe.py measured the same way."""
import os
import statistics
import subprocess
import time

import torch

PHASE = float(os.environ.get("PHASE", "2.5"))


class Phases:
    """`with Phases(csv_path) as p: p.run(case, name, fn)` ...; then `p.table(label)`."""

    def __init__(self, csv_path: str):
        self.csv_path, self.phases = csv_path, []

    def __enter__(self):
        self.smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu",
                                     "--format=csv,noheader,nounits", "-lms", "50", "-f", self.csv_path])
        return self

    def __exit__(self, *exc):
        time.sleep(0.2)
        self.smi.terminate()
        self.smi.wait()

    def run(self, case: str, name: str, fn) -> None:
        """fn back to back for PHASE seconds, synchronizing every ten calls."""
        start, calls = time.time(), 0
        while time.time() - start < PHASE:
            for _ in range(10):
                fn()
            calls += 10
            torch.cuda.synchronize()
        end = time.time()
        self.phases.append((case, name, start, end, (end - start) / calls * 1e6))

    def table(self, label: str) -> str:
        samples = []
        for line in open(self.csv_path):
            parts = [p.strip() for p in line.split(",")]
            try:
                samples.append((_stamp(parts[0]), float(parts[1]), float(parts[2]), float(parts[3])))
            except (ValueError, IndexError):
                continue
        lines = [f"{'case':24s} {label:10s} {'us/call':>8s} {'SM MHz':>7s} {'W':>6s} {'mJ/call':>8s} {'degC':>5s} samples"]
        for case, name, start, end, us in self.phases:
            inside = [s for s in samples if start + 0.5 <= s[0] <= end]
            if not inside:
                lines.append(f"{case:24s} {name:10s} {us:8.1f}  (no samples)")
                continue
            clock, power, temp = (statistics.median(s[i] for s in inside) for i in (1, 2, 3))
            lines.append(f"{case:24s} {name:10s} {us:8.1f} {clock:7.0f} {power:6.0f} {power * us / 1e3:8.2f} "
                         f"{temp:5.0f} {len(inside)}")
        return "\n".join(lines)


def _stamp(text: str) -> float:
    return time.mktime(time.strptime(text.split(".")[0], "%Y/%m/%d %H:%M:%S")) + float("0." + text.split(".")[1])
