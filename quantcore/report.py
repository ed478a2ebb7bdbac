"""The capability report: for this machine (or a simulated profile), every op × backend × dtype with
its status and a one-line reason. Built from the registry's own reasons; never imports a backend's
kernels, so a missing Triton or CuPy shows up as a reason rather than a crash."""

from __future__ import annotations

import platform

from pydantic import BaseModel

from . import capability, measured, opdef, registry
from .opdefs import BUILTIN

# The input formats each built-in op is reported for (`OpDef.formats`; dequant_bias reads the GEMM's
# output dtype). `build` reports every defined op, those added with `opdef.register_op` too.
REPORTED_FORMATS: dict[str, tuple[str, ...]] = {op.name: op.formats for op in BUILTIN}


class Row(BaseModel):
    """One op × implementation × dtype cell."""

    op: str
    impl: str
    dtype: str
    status: str
    numerics: str
    reason: str


class Report(BaseModel):
    """Everything `quantcore report` prints; `--json` dumps this model."""

    device: capability.DeviceProfile  # includes the library versions
    python: str
    priority: list[str]  # the default order; a shipped measured table refines it per op and M
    measured_priority: bool
    rows: list[Row]
    plugins: list[registry.Plugin]  # out-of-tree backends found through entry points, loaded or not


def build(simulate: str | None = None) -> Report:
    """The report for the current machine, or for the simulated profile `simulate` ("sm80", "cpu", ...)."""
    if simulate is not None:
        with capability.simulate(simulate):
            return build()
    profile = capability.report_profile()
    rows = []
    for op in opdef.all_ops():
        for fmt in op.formats:
            explanation = registry.explain_query(registry.Query(op.name, profile, fmt, blocks=op.report_blocks))
            rows += [Row(op=op.name, impl=c.impl, dtype=fmt, status=c.status, numerics=c.numerics,
                         reason="; ".join(c.reasons)) for c in explanation.candidates]
    return Report(device=profile, python=platform.python_version(),
                  priority=list(registry.DEFAULT_PRIORITY.get(profile.kind, (registry.REFERENCE,))),
                  measured_priority=bool(profile.kind == "cuda" and not profile.simulated_from
                                         and measured.table(profile.name)),
                  rows=rows, plugins=list(registry.plugin_status()))


def render(report: Report) -> str:
    """The report as aligned text."""
    d = report.device
    title = f"device: {d.name} ({d.arch})" + (f", simulated on {d.simulated_from}" if d.simulated_from else "")
    caps = f"fp8 MMA: {'yes' if d.fp8_mma else 'no'}, int8 MMA: {'yes' if d.int8_mma else 'no'}, " \
           f"bf16 MMA: {'yes' if d.bf16_mma else 'no'}, smem/block: {d.smem_per_block // 1024} KiB"
    vers = ", ".join(f"{k} {v or 'none'}" for k, v in d.versions.items())
    lines = [title, caps, f"python {report.python}, {vers}", f"priority: {' > '.join(report.priority)}"
             + (" (refined per op and M by this GPU's measured table)" if report.measured_priority else "")]
    lines += [f"plugin {p.name} ({p.value}): "
              + (f"failed to load: {p.error}" if p.error else f"{p.impls} implementations") for p in report.plugins]
    lines.append("")
    widths = (15, 15, 9, 12)
    lines.append(f"{'op':<{widths[0]}} {'impl':<{widths[1]}} {'dtype':<{widths[2]}} {'status':<{widths[3]}} reason")
    for r in report.rows:
        numerics = f" [numerics: {r.numerics}]" if r.numerics != "exact" else ""
        lines.append(f"{r.op:<{widths[0]}} {r.impl:<{widths[1]}} {r.dtype:<{widths[2]}} {r.status:<{widths[3]}} "
                     f"{r.reason}{numerics}")
    return "\n".join(lines)
