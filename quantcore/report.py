"""The capability report: for this machine (or a simulated profile), every op × backend × dtype with
its status and a one-line reason, the priority in force and where it comes from, and, where a
measured table refines the priority, which implementation runs each op per range of M (rows). Built
from the registry's own reasons; never imports a backend's kernels, so a missing Triton or CuPy
shows up as a reason rather than a crash."""

from __future__ import annotations

import platform
import textwrap

from pydantic import BaseModel

from . import capability, definitions, registry
from .definitions import BUILTIN
from .definitions.query import GemmQuery
from .registry import measured
from .report_schema import NUMERICS_HELP, SCHEMA, STATUS_HELP, STATUSES  # noqa: F401  (the report's vocabulary)
from .runtime import native


# The input formats each built-in op is reported for (`OpDef.formats`; dequant_bias reads the GEMM's
# output dtype). `build` reports every defined op, those added with `library.define` too.
REPORTED_FORMATS: dict[str, tuple[str, ...]] = {op.name: op.formats for op in BUILTIN}

class Row(BaseModel):
    """One op × implementation × dtype cell, for the smallest M where a measured table applies."""

    op: str
    impl: str
    dtype: str
    status: str  # one of STATUSES
    numerics: str
    reason: str


class MRange(BaseModel):
    """What runs an op and dtype for calls of `m_min` to `m_max` rows (None: no upper end) on GPU
    model `device`, whose measured table `table` refines the priority; for a GEMM whose table ranks it per
    K as well, `k_min` to `k_max` its K (None and None: rows for any K), at 128×128 blocks, N as K, K a
    multiple of 512 (where cuBLAS's block-wise GEMM can run)."""

    device: str
    table: str
    op: str
    dtype: str
    m_min: int
    m_max: int | None
    selected: str | None
    k_min: int | None = None
    k_max: int | None = None


class Report(BaseModel):
    """Everything `quantcore report` prints; `--json` dumps this model."""

    schema_version: int = SCHEMA
    device: capability.DeviceProfile  # includes the library versions
    simulated: bool  # a simulated profile (--simulate, QUANTCORE_SIMULATE), not the hardware itself
    python: str
    priority: list[str]  # the priority in force before measured tables (reference last)
    priority_source: str  # where it comes from: "QUANTCORE_PRIORITY", "quantcore.priority()" or the default
    measured_table: str | None  # the table refining the priority on this device, or None
    rows: list[Row]
    plugins: list[registry.Plugin]  # out-of-tree backends found through entry points, loaded or not
    by_m: list[MRange]  # per M, from the measured tables (for a simulated GPU: real GPUs of its architecture)
    launch_path: str  # how kept plans are launched here (`backends.native.status`)


def build(simulate: str | None = None) -> Report:
    """The report for the current machine, or for the simulated profile `simulate` ("sm80", "cpu", ...)."""
    if simulate is not None:
        with capability.simulate(simulate):
            return build()
    profile = capability.report_profile()
    simulated = capability.active_simulation() is not None
    priority, source = _priority_in_force(profile)
    refined = profile.kind == "cuda" and source == "default"  # an explicit priority overrides measured tables
    own = measured.load(profile.name) if refined and not simulated else None
    # A simulated GPU is never refined: show what real GPUs of its architecture with a table select.
    tables = [own] if own else [t for t in measured.tables() if t.arch == profile.arch] if refined and simulated else []
    rows = []
    for op in definitions.all_ops():
        for fmt in op.formats:
            candidates = registry.explain_query(registry.Query(op.name, profile, fmt, blocks=op.report_blocks)).candidates
            rows += [Row(op=op.name, impl=c.impl, dtype=fmt, status=c.status, numerics=c.numerics,
                         reason=_reason(c, candidates, priority)) for c in candidates]
    return Report(device=profile, simulated=simulated, python=platform.python_version(), priority=list(priority),
                  priority_source=source, measured_table=own.path if own else None, rows=rows,
                  by_m=[r for table in tables for r in _by_m(profile, table)],
                  plugins=list(registry.plugin_status()),
                  launch_path=native.status("cuda" if capability.cuda_available() else "cpu"))


def _priority_in_force(profile: capability.DeviceProfile) -> tuple[tuple[str, ...], str]:
    """(the priority before measured tables, reference last; where it comes from)."""
    order, source = registry.explicit_priority() or (registry.DEFAULT_PRIORITY.get(profile.kind, (registry.REFERENCE,)),
                                                     "default")
    return registry.with_reference(order), source


def _by_m(profile: capability.DeviceProfile, table: measured.Table) -> list[MRange]:
    """Per op and dtype of `table`, the M ranges over which one implementation runs (merged where the
    selection does not change), as the registry selects on a GPU named as the table's; then per K range
    those of the GEMMs ranked per K too (`Table.by_k`)."""
    gpu = profile.model_copy(update={"name": table.device, "simulated_from": None})
    out: list[MRange] = []
    for op in definitions.all_ops():
        for fmt in op.formats:
            for m_min, m_max, bucket in _spans(table.priority.get(f"{op.name}/{fmt}", ()), 1):
                query = registry.Query(op.name, gpu, fmt, blocks=op.report_blocks, m_bucket=bucket)
                _extend(out, MRange(device=table.device, table=table.path, op=op.name, dtype=fmt, m_min=m_min,
                                    m_max=m_max, selected=registry.explain_query(query).selected))
    for key, per_k in table.by_k.items():
        op_name, fmt = key.split("/")
        for k_min, k_max, k in _spans(per_k, 1):
            by_m = per_k[k]
            # Below the per-K rankings' first M bucket the ranking over every K applies (`measured.lookup`).
            for m_min, m_max, bucket in _spans(by_m, min(by_m) // 2 + 1):
                query = GemmQuery(op_name, gpu, fmt, None, (128, 128), bucket, (k, k), block_k=128)
                _extend(out, MRange(device=table.device, table=table.path, op=op_name, dtype=fmt, m_min=m_min,
                                    m_max=m_max, selected=registry.explain_query(query).selected, k_min=k_min,
                                    k_max=k_max))
    return out


def _spans(buckets, first: int) -> list[tuple[int, int | None, int]]:
    """(least, greatest or None, bucket) of the values each bucket serves: a bucket b holds the values that round
    up to b..(next bucket)/2, the first from `first` (the registry's lookup takes the nearest bucket at or below)."""
    ordered = sorted(buckets)
    return [(first if i == 0 else b // 2 + 1, ordered[i + 1] // 2 if i + 1 < len(ordered) else None, b)
            for i, b in enumerate(ordered)]


def _extend(out: list[MRange], r: MRange) -> None:
    """Append `r`, or widen the last range where it selects the same for the same op, dtype and K range."""
    last = out[-1] if out else None
    if last and (last.op, last.dtype, last.selected, last.k_min, last.k_max) == (r.op, r.dtype, r.selected, r.k_min,
                                                                                 r.k_max):
        last.m_max = r.m_max
    else:
        out.append(r)


def _reason(c: registry.Candidate, candidates: list[registry.Candidate], priority: tuple[str, ...]) -> str:
    """The candidate's reasons, or for one that runs with none given, why it is the one."""
    if c.reasons:
        return "; ".join(c.reasons)
    if c.status == "fallback":
        before = [d.impl for d in candidates[:candidates.index(c)] if d.status == "unavailable"]
        return f"runs because {', '.join(before)} cannot run here (see {'its' if len(before) == 1 else 'their'} reasons)"
    return f"first of {' > '.join(priority)} that can run here"


def _span(r: MRange) -> str:
    return f"M {r.m_min}+" if r.m_max is None else f"M {r.m_min}-{r.m_max}"


def render(report: Report) -> str:
    """The report as aligned text."""
    d = report.device
    title = f"device: {d.name} ({d.arch})" + (f", simulated on {d.simulated_from}" if d.simulated_from else
                                              ", a simulated profile" if report.simulated else "")
    caps = f"fp8 MMA: {'yes' if d.fp8_mma else 'no'}, int8 MMA: {'yes' if d.int8_mma else 'no'}, " \
           f"bf16 MMA: {'yes' if d.bf16_mma else 'no'}, smem/block: {d.smem_per_block // 1024} KiB"
    vers = ", ".join(f"{k} {v or 'none'}" for k, v in d.versions.items())
    source = {"default": f"default for {d.kind}"}.get(report.priority_source, f"from {report.priority_source}")
    lines = [title, caps, f"python {report.python}, {vers}", f"priority: {' > '.join(report.priority)} ({source})",
             f"launch path: {report.launch_path}"]
    if report.measured_table:
        lines.append(f"measured table: {report.measured_table} (refines the priority per op and M: below; the "
                     "rows show the smallest M)")
    elif report.priority_source != "default" and d.kind == "cuda":
        lines.append(f"measured tables: not used, {report.priority_source} sets the order")
    elif report.simulated and report.by_m:
        lines.append(f"measured tables: not used for a simulated {d.arch}; below, what real {d.arch} GPUs with one "
                     "select per M")
    lines += [f"plugin {p.name} ({p.value}): "
              + (f"failed to load: {p.error}" if p.error else f"{p.impls} implementations") for p in report.plugins]
    widths = (15, max([15, *(len(r.impl) for r in report.rows)]), 9, 12)
    lines += ["", f"{'op':<{widths[0]}} {'impl':<{widths[1]}} {'dtype':<{widths[2]}} {'status':<{widths[3]}} reason"]
    for r in report.rows:
        numerics = f" [numerics: {r.numerics}]" if r.numerics != "exact" else ""
        lines.append(f"{r.op:<{widths[0]}} {r.impl:<{widths[1]}} {r.dtype:<{widths[2]}} {r.status:<{widths[3]}} "
                     f"{r.reason}{numerics}")
    for table in dict.fromkeys((r.device, r.table) for r in report.by_m):
        lines += ["", f"per M on {table[0]} (measured table {table[1]}):"]
        per_op: dict[tuple[str, str, int | None], list[MRange]] = {}
        for r in report.by_m:
            if (r.device, r.table) == table:
                per_op.setdefault((r.op, r.dtype, r.k_min), []).append(r)
        shown: list[tuple[str, str, int | None, int | None, str]] = []  # K ranges of the same spans merged
        for (op, dtype, k_min), ranges in per_op.items():
            spans = "; ".join(f"{_span(r)}: {r.selected or 'nothing'}" for r in ranges)
            if len(ranges) == 1 and k_min is None:
                spans = ranges[0].selected or "nothing"
            if shown and shown[-1][0:2] == (op, dtype) and shown[-1][2] is not None and shown[-1][4] == spans:
                shown[-1] = (op, dtype, shown[-1][2], ranges[-1].k_max, spans)
            else:
                shown.append((op, dtype, k_min, ranges[-1].k_max, spans))
        for op, dtype, k_min, k_max, spans in shown:
            k_span = "" if k_min is None else f" K {k_min}+" if k_max is None else f" K {k_min}-{k_max}"
            lines.append(f"{op:<{widths[0]}} {dtype:<{widths[2]}}{k_span}{':' if k_span else ''} {spans}")
    return "\n".join(lines)
