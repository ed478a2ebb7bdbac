"""What the report tells: the priority in force and its source, the selection per range of M where a
measured table refines it (and which table), simulated profiles marked, a reason on every row, its
status labels explained, quiet on a closed pipe; and numerics judged where the kernel really runs."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

import quantcore
from quantcore import capability, registry, report
from quantcore.registry import measured
from quantcore.registry.impl import REDUCED_FP8_ACCUMULATION
from quantcore.definitions.query import Query, m_bucket
from quantcore.definitions.query import GemmQuery
from quantcore.cli import main

PROFILES = ["cpu", "sm70", "sm75", "sm80", "sm86", "sm89", "sm90", "sm100"]
H100 = "NVIDIA H100 80GB HBM3"


def selected_at(table: measured.Table, profile, op: str, fmt: str, m: int) -> str:
    """What the registry runs for `m` rows on a GPU named as the table's."""
    gpu = profile.model_copy(update={"name": table.device, "simulated_from": None})
    blocks = quantcore.definitions.get(op).report_blocks
    return registry.explain_query(Query(op, gpu, fmt, blocks=blocks, m_bucket=m_bucket(m))).selected


def check_ranges(rep: report.Report, table: measured.Table) -> None:
    """The report's M ranges for `table` tile every M from 1 up and each says what the registry runs; so do its
    per-K ranges of the GEMMs ranked per K (`Table.by_k`), every K from 1 up, from their first M."""
    check_k_ranges(rep, table)
    ranges = [r for r in rep.by_m if r.table == table.path and r.k_min is None]
    assert {(r.op, f"{r.dtype}") for r in ranges} == {tuple(key.split("/")) for key in table.priority}
    for key in table.priority:
        op, fmt = key.split("/")
        mine = [r for r in ranges if (r.op, r.dtype) == (op, fmt)]
        assert mine[0].m_min == 1 and mine[-1].m_max is None
        assert all(a.m_max + 1 == b.m_min and a.selected != b.selected for a, b in zip(mine, mine[1:]))
        for r in mine:
            for m in {r.m_min, r.m_max or 65536}:
                assert selected_at(table, rep.device, op, fmt, m) == r.selected, (key, m)


def check_k_ranges(rep: report.Report, table: measured.Table) -> None:
    ranges = [r for r in rep.by_m if r.table == table.path and r.k_min is not None]
    assert {f"{r.op}/{r.dtype}" for r in ranges} == set(table.by_k)
    gpu = rep.device.model_copy(update={"name": table.device, "simulated_from": None})
    for key, per_k in table.by_k.items():
        op, fmt = key.split("/")
        mine = [r for r in ranges if (r.op, r.dtype) == (op, fmt)]
        spans = sorted({(r.k_min, r.k_max) for r in mine}, key=lambda s: s[0])
        assert spans[0][0] == 1 and spans[-1][1] is None and all(a[1] + 1 == b[0] for a, b in zip(spans, spans[1:]))
        for r in mine:
            for m in {r.m_min, r.m_max or 65536}:
                for k in {-(-r.k_min // 512) * 512, r.k_max or 65536}:  # K in whole cuBLAS K tiles
                    query = GemmQuery(op, gpu, fmt, None, (128, 128), m_bucket(m), (k, k), block_k=128)
                    assert registry.explain_query(query).selected == r.selected, (key, m, k)


def test_a_simulated_gpu_shows_what_real_gpus_of_its_architecture_select_per_m():
    rep = report.build(simulate="sm90")
    assert rep.simulated and rep.measured_table is None and rep.schema_version == report.SCHEMA
    tables = [t for t in measured.tables() if t.arch == "sm_90"]
    assert {t.device for t in tables} >= {H100, "NVIDIA H200"}
    for table in tables:
        check_ranges(rep, table)
    # The case: the shipped H100 table sends large FP8 GEMMs to cuBLAS.
    h100 = measured.load(H100)
    at_4096 = next(r for r in rep.by_m if r.device == H100 and r.op == "scaled_mm" and r.dtype == "fp8_e4m3"
                   and r.m_min <= 4096 <= (r.m_max or 4096))
    assert at_4096.selected == h100.priority["scaled_mm/fp8_e4m3"][4096][0] != "triton"
    text = report.render(rep)
    assert f"per M on {H100} (measured table {h100.path})" in text and "a simulated profile" in text


def test_a_real_gpu_names_its_table(monkeypatch):
    real = capability.simulated_profile("sm90").model_copy(update={"name": H100})
    monkeypatch.setattr(capability, "report_profile", lambda: real)
    rep = report.build()
    assert not rep.simulated and rep.measured_table == measured.load(H100).path
    assert {r.table for r in rep.by_m} == {rep.measured_table}
    check_ranges(rep, measured.load(H100))
    row = next(r for r in rep.rows if (r.op, r.dtype, r.status) == ("scaled_mm", "fp8_e4m3", "selected"))
    assert row.impl == selected_at(measured.load(H100), real, "scaled_mm", "fp8_e4m3", 1)


def test_the_priority_printed_is_the_one_in_force(monkeypatch):
    assert report.build(simulate="sm90").priority == ["triton", "cupy", "torch"]
    monkeypatch.setenv("QUANTCORE_PRIORITY", "cupy,triton")
    rep = report.build(simulate="sm90")
    assert (rep.priority, rep.priority_source, rep.by_m) == (["cupy", "triton", "torch"], "QUANTCORE_PRIORITY", [])
    assert "priority: cupy > triton > torch (from QUANTCORE_PRIORITY)" in report.render(rep)
    with quantcore.priority("torch"):
        rep = report.build(simulate="sm80")
    assert (rep.priority, rep.priority_source) == (["torch"], "quantcore.priority()")
    assert {r.impl for r in rep.rows if r.status == "selected"} == {"torch"}


@pytest.mark.parametrize("profile", PROFILES)
def test_every_row_has_a_reason_and_a_documented_status(profile):
    rep = report.build(simulate=profile)
    assert all(r.reason for r in rep.rows)
    assert {r.status for r in rep.rows} <= set(report.STATUSES)


def test_status_labels_are_explained_in_help(capsys):
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    text = capsys.readouterr().out
    assert all(f"  {status}  " in text for status in report.STATUSES) and "[numerics: …]" in text


def test_a_closed_pipe_ends_the_report_quietly():
    proc = subprocess.Popen([sys.executable, "-m", "quantcore", "report"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the report is written
    assert proc.wait(timeout=120) == 141
    assert proc.stderr.read() == b""


def test_interpreted_fp8_gemm_is_exact_and_warns_nothing(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    query = dict(op="scaled_mm", fmt="fp8_e4m3", blocks=(128, 128), block_k=128)
    with warnings.catch_warnings():
        warnings.simplefilter("error", quantcore.NumericsWarning)
        impl = registry.select(GemmQuery(profile=capability.cpu_profile(), **query), "triton")
    assert impl.numerics == REDUCED_FP8_ACCUMULATION and impl.numerics_on(capability.cpu_profile()) == "exact"
    sm90 = registry.explain_query(GemmQuery(profile=capability.simulated_profile("sm90"), **query), "triton")
    assert sm90.numerics == REDUCED_FP8_ACCUMULATION
