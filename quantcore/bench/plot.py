"""A PNG of achieved rate as a fraction of the ceiling, by op and M, one line per implementation."""

from __future__ import annotations

from collections import defaultdict

from .run import BenchResult


def plot(result: BenchResult, path: str) -> None:
    """Write the plot to `path` (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r.op, r.fmt) for r in result.records})
    cols = 4
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, (op, fmt) in zip(axes.flat, panels):
        lines = defaultdict(list)
        for r in result.records:
            if (r.op, r.fmt) == (op, fmt) and r.fraction is not None:
                lines[r.impl].append((r.shape[0], r.fraction))
        for impl, pts in sorted(lines.items()):
            best = {}
            for m, f in pts:  # several N, K per M: plot the mean
                best.setdefault(m, []).append(f)
            xs = sorted(best)
            ax.plot(xs, [sum(best[x]) / len(best[x]) for x in xs], marker="o", label=impl)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{op} [{fmt}]", fontsize=9)
        ax.set_xlabel("M (rows)", fontsize=8)
        ax.set_ylabel("fraction of ceiling", fontsize=8)
        ax.axhline(1.0, color="grey", lw=0.5)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"quantcore bench — {result.device.name}, {result.date} (ceiling: copy {result.copy_gbps:.0f} GB/s; "
                 "GEMM: cuBLAS FP8 tensor-wise / _int_mm)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
