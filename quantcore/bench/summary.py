"""Markdown tables of a bench run: what docs/performance.md quotes."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from .. import registry
from ..registry import measured
from .baselines import gemm_floor_bytes
from .run import PRODUCERS, BenchResult
from .shapes import DECODE_M, READ_CEILING

K_FROM_M = 512  # the rows from which `write_priority` ranks GEMMs per K bucket as well


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "—" if x is None else format(x, spec)


def _cases(result: BenchResult) -> dict[tuple, dict]:
    by_case: dict[tuple, dict] = defaultdict(dict)
    for r in result.records:
        by_case[(r.op, r.fmt, tuple(r.shape))][r.impl] = r
    return by_case


def _ours(by_case: dict[tuple, dict], gemm: bool) -> list[str]:
    """quantcore's implementations measured in the GEMM cases (or in the others), in the registry's
    order (`registry.compared`): the tables' per-implementation columns."""
    found: list[str] = []
    for (op, _, _), recs in by_case.items():
        if (op == "scaled_mm") == gemm:
            found += [i for i in registry.compared(op) if i in recs and i not in found]
    return found


def _cells(recs: dict, impls: list[str], cell) -> str:
    """`cell(record or None)` for each of `impls`, as table cells each followed by its separator."""
    return "".join(f"{cell(recs.get(i))} | " for i in impls)


def _best(recs: dict, impls) -> object | None:
    return max((recs[i] for i in impls if i in recs and recs[i].rate), key=lambda r: r.rate, default=None)


def _times(r) -> str:
    """A record's GPU and eager time per call, "GPU / eager" in µs."""
    return "—" if r is None or r.us is None else f"{r.us:.1f} / {_fmt(r.eager_us, '.1f')}"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _span(values: list[float]) -> str:
    return f"{min(values):.2f}–{max(values):.2f}" if values else "—"


def targets(result: BenchResult) -> str:
    """The run against the performance targets: memory-bound ops' best fraction of copy bandwidth at
    their largest shape and their least ratio to torch.compile over all shapes; per GEMM format and M,
    the range over (N, K) of each quantcore implementation's and of the fastest one's (what measured
    priorities select) speed relative to the vendor kernel."""
    by_case = _cases(result)
    out = ["| op | fmt | best / copy at the largest shape | least best / torch.compile (shape) |", "|---|---|---|---|"]
    mem = defaultdict(list)
    for (op, fmt, shape), recs in by_case.items():
        if op != "scaled_mm":
            mem[(op, fmt)].append((shape, recs))
    for (op, fmt), cases in mem.items():
        largest = max(cases, key=lambda c: c[0][0] * c[0][1])
        best = _best(largest[1], registry.compared(op))
        ratios = [(b.rate / c.rate, shape) for shape, recs in cases
                  if (b := _best(recs, registry.compared(op))) and (c := recs.get("torch.compile")) and c.rate]
        least = min(ratios, default=None)
        out.append(f"| {op} | {fmt} | {_fmt(best and best.fraction)} ({'x'.join(map(str, largest[0]))}) | "
                   + (f"{least[0]:.2f} ({'x'.join(map(str, least[1]))}) |" if least else "— |"))
    impls = _ours(by_case, gemm=True)
    out += ["", f"| fmt | M | {''.join(f'{i} / vendor over (N, K) | ' for i in impls)}fastest of quantcore / vendor |",
            "|---|---|" + "---|" * (len(impls) + 1)]
    gemm: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (op, fmt, shape), recs in by_case.items():
        if op == "scaled_mm":
            ours = _best(recs, registry.compared(op))
            for name, r in [*((i, recs.get(i)) for i in impls), ("fastest", ours)]:
                gemm[(fmt, shape[0])][name] += [r.vs_vendor] if r and r.vs_vendor else []
    for (fmt, m), spans in sorted(gemm.items()):
        out.append(f"| {fmt} | {m} | {' | '.join(_span(spans[i]) for i in (*impls, 'fastest'))} |")
    return "\n".join(out)


def summarize(result: BenchResult) -> str:
    """The targets, then the memory-bound table (GB/s, fraction of copy, vs torch.compile), the GEMM
    table (TFLOP/s, vs vendor), both with GPU and eager times, and the decode GEMMs' table."""
    d = result.device
    out = [f"device: {d.name} ({d.arch}), {result.date}; copy ceiling {result.copy_gbps:.0f} GB/s; "
           f"versions: {', '.join(f'{k} {v}' for k, v in result.versions.items())}",
           f"command: `{result.command}`", "",
           "quantcore.ops host time over calling the implementation directly (µs): "
           + ", ".join(f"{k} {v:.1f}" for k, v in result.dispatch_overhead_us.items()), "", targets(result), ""]
    by_case = _cases(result)
    mem = _ours(by_case, gemm=False)
    out += ["Times are µs per call, GPU / eager (back-to-back calls, host included).", "",
            f"| op | fmt | shape | {''.join(f'{i} GB/s | ' for i in mem)}best / copy | torch.compile GB/s "
            f"| best / compile | torch ref. GB/s | {''.join(f'{i} µs | ' for i in mem)}torch.compile µs |",
            "|---|---|---|" + "---|" * (2 * len(mem) + 5)]
    for (op, fmt, shape), recs in by_case.items():
        if op == "scaled_mm":
            continue
        best = _best(recs, registry.compared(op))
        comp, ref = recs.get("torch.compile"), recs.get("torch")
        ratio = best.rate / comp.rate if best and comp and comp.rate else None
        out.append(f"| {op} | {fmt} | {'x'.join(map(str, shape))} | "
                   f"{_cells(recs, mem, lambda r: _fmt(r and r.rate, '.0f'))}{_fmt(best and best.fraction)} "
                   f"| {_fmt(comp and comp.rate, '.0f')} | {_fmt(ratio)} | {_fmt(ref and ref.rate, '.0f')} "
                   f"| {_cells(recs, mem, _times)}{_times(comp)} |")
    if any(op in PRODUCERS for op, _, _ in by_case):
        out += ["", producers(result)]
    gemm = _ours(by_case, gemm=True)
    out += ["", f"| fmt | M×N×K | {''.join(f'{i} TFLOP/s | ' for i in gemm)}vendor | vendor TFLOP/s "
            f"| {''.join(f'{i} / vendor | ' for i in gemm)}dense ceiling TFLOP/s "
            f"| {''.join(f'{i} µs | ' for i in gemm)}vendor µs |", "|---|---|" + "---|" * (3 * len(gemm) + 4)]
    for (op, fmt, shape), recs in by_case.items():
        if op != "scaled_mm":
            continue
        vendor_name = "cublas-blockwise" if fmt == "fp8_e4m3" else "torch._int_mm"
        vendor = recs.get(vendor_name)
        dense = recs.get("cublas-fp8-tensorwise") or vendor
        out.append(f"| {fmt} | {'x'.join(map(str, shape))} | {_cells(recs, gemm, lambda r: _fmt(r and r.rate, '.1f'))}"
                   f"{vendor_name} | {_fmt(vendor and vendor.rate, '.1f')} "
                   f"| {_cells(recs, gemm, lambda r: _fmt(r and r.vs_vendor))}{_fmt(dense and dense.rate, '.1f')} "
                   f"| {_cells(recs, gemm, _times)}{_times(vendor)} |")
    out += ["", decode_gemms(result)]
    if any("@" in r.impl for r in result.records):
        out += ["", simulated_gemms(result)]
    notes = sorted({f"{r.op} {r.impl}: {r.note}" for r in result.records if r.note and r.us is None})
    if notes:
        out += ["", "not measured:"] + [f"- {n}" for n in notes[:40]]
    return "\n".join(out)


def producers(result: BenchResult) -> str:
    """The fused producers against the unfused code they replace: the fastest quantcore implementation's rate,
    fraction of the copy rate and times, each baseline's times (eager torch, its torch.compile, the float part
    compiled beside quantcore's act_quant: two launches), the ratios of GPU times, and act_quant's eager time
    on the quantized tensor's shape where the run measured it (the decode target: within 2 µs of it)."""
    by_case = _cases(result)
    out = ["Fused producers against the unfused code (Llama's RMSNorm or act_fn(gate)·up in bf16, then act_quant); "
           "times µs, GPU / eager; ratios of GPU times.", "",
           "| op | fmt | shape | fastest of quantcore | GB/s | / copy | its µs | torch-unfused µs "
           "| torch.compile µs "
           "| compiled+act_quant µs | compile / ours | 2 launches / ours | act_quant µs (same q) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (op, fmt, shape), recs in by_case.items():
        if op not in PRODUCERS:
            continue
        best = _best(recs, registry.compared(op))
        comp, split = recs.get("torch.compile"), recs.get("compiled+act_quant")
        q_shape = (shape[0], shape[1] if op == "rms_norm_quant" else shape[1] // 2)
        act = _best(by_case.get(("act_quant", fmt, q_shape), {}), registry.compared("act_quant"))
        us = best and best.us
        out.append(f"| {op} | {fmt} | {'x'.join(map(str, shape))} | {best.impl if best else '—'} "
                   f"| {_fmt(best and best.rate, '.0f')} | {_fmt(best and best.fraction)} | {_times(best)} "
                   f"| {_times(recs.get('torch-unfused'))} | {_times(comp)} | {_times(split)} "
                   f"| {_fmt(_ratio(comp and comp.us, us))} | {_fmt(_ratio(split and split.us, us))} | {_times(act)} |")
    return "\n".join(out)


def decode_gemms(result: BenchResult) -> str:
    """GEMMs of at most DECODE_M rows against the memory floor (`gemm_floor_bytes` at the run's copy
    rate), against the read ceiling (one kernel reading as many bytes on the same timer, where the run
    measured it) and against torch's bf16 GEMM of the same shape, for the fastest quantcore
    implementation (by GPU time, the cuBLAS variant included)."""
    out = [f"Decode GEMMs (M ≤ {DECODE_M}): floor = least bytes moved / copy rate; read = GPU time of one kernel "
           "only reading those bytes; times µs, GPU / eager.", "",
           "| fmt | M×N×K | floor µs | read µs | fastest of quantcore | its µs | floor / GPU time "
           "| read / GPU time | cublas-bf16 µs | ours / bf16 GPU time | ours / bf16 eager time |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (op, fmt, shape), recs in _cases(result).items():
        if op != "scaled_mm" or shape[0] > DECODE_M:
            continue
        floor_us = gemm_floor_bytes(*shape) / result.copy_gbps / 1e3
        ours, bf16 = _best(recs, registry.compared(op)), recs.get("cublas-bf16")
        read_us = recs[READ_CEILING].us if READ_CEILING in recs else None
        us, eager = (ours.us, ours.eager_us) if ours else (None, None)
        out.append(f"| {fmt} | {'x'.join(map(str, shape))} | {floor_us:.1f} | {_fmt(read_us, '.1f')} "
                   f"| {ours.impl if ours else '—'} | {_times(ours)} | {_fmt(_ratio(floor_us, us))} "
                   f"| {_fmt(_ratio(read_us, us))} | {_times(bf16)} "
                   f"| {_fmt(_ratio(us, bf16 and bf16.us))} | {_fmt(_ratio(eager, bf16 and bf16.eager_us))} |")
    return "\n".join(out)


def simulated_gemms(result: BenchResult) -> str:
    """GEMMs timed under simulated profiles (`quantcore bench --simulate`, rows "<backend>@<profile>"),
    each beside this GPU's bf16 GEMM and torch._int_mm of the same shape."""
    out = ["GEMMs as other GPUs (`--simulate`: their kernels, timed on this GPU); times µs, GPU / eager.", "",
           "| fmt | M×N×K | as | backend | ran | TFLOP/s | its µs | bf16 GEMM / it | torch._int_mm / it |",
           "|---|---|---|---|---|---|---|---|---|"]
    cases = _cases(result)
    for (op, fmt, shape), recs in cases.items():
        bf16 = recs.get("cublas-bf16")
        int_mm = cases.get((op, "int8", shape), {}).get("torch._int_mm")
        for impl, r in recs.items():
            if "@" not in impl or r.us is None:
                continue
            backend, profile = impl.split("@")
            out.append(f"| {fmt} | {'x'.join(map(str, shape))} | {profile} | {backend} | {r.note.removeprefix('ran ')} "
                       f"| {_fmt(r.rate, '.1f')} | {_times(r)} | {_fmt(_ratio(bf16 and bf16.us, r.us))} "
                       f"| {_fmt(_ratio(int_mm and int_mm.us, r.us))} |")
    return "\n".join(out)


def write_priority(result: BenchResult, root: Path | None = None) -> Path:
    """Turn a run into the measured priority table of its GPU model, written into folder `root`
    (default: the user's data folder, which the registry reads; never the installed package)."""
    records = [r for r in result.records if r.impl in registry.compared(r.op)]

    def m_of(r):
        return 0 if r.op in ("weight_quant", "weight_dequant") else registry.m_bucket(r.shape[0])  # no M: one bucket

    def k_of(r):
        # GEMMs ([M, N, K]) from K_FROM_M rows are ranked per K bucket too: there the faster of the Gluon GEMM and
        # cuBLAS's changes with K; below, one or two shapes a bucket would rank
        # kernels a few % apart by the noise of single shapes.
        return registry.k_bucket(r.shape[2]) if r.op == "scaled_mm" and r.shape[0] >= K_FROM_M else None

    path = measured.write(result.device.name, measured.build(records, m_of), f"{result.command} on {result.date}",
                          root, result.device.arch, measured.build_by_k(records, m_of, k_of))
    registry.clear_caches()  # selections and kept plans made under the previous table
    return path
