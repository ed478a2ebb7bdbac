"""The report CLI, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from quantcore import cli, report


def run(*args):
    return subprocess.run([sys.executable, "-m", "quantcore", *args], capture_output=True, text=True, timeout=120)


def test_report_runs_and_lists_every_op():
    out = run("report")
    assert out.returncode == 0, out.stderr
    for op in report.REPORTED_FORMATS:
        assert op in out.stdout
    assert "device:" in out.stdout and "priority:" in out.stdout


def test_report_json_simulating_sm80():
    out = run("report", "--json", "--simulate", "sm80")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["device"]["compute_capability"] == [8, 0] and data["device"]["fp8_mma"] is False
    rows = {(r["op"], r["impl"], r["dtype"]): r for r in data["rows"]}
    assert rows[("scaled_mm", "triton", "fp8_e4m3")]["status"] == "unavailable"
    assert "FP8 tensor cores" in rows[("scaled_mm", "triton", "fp8_e4m3")]["reason"]
    assert rows[("scaled_mm", "torch", "int8")]["status"] in ("available", "selected", "fallback")
    statuses = {r["status"] for r in data["rows"]}
    assert statuses <= {"selected", "available", "fallback", "unavailable"}


def test_report_json_is_stable():
    a, b = report.build(simulate="sm90"), report.build(simulate="sm90")
    assert a.model_dump_json() == b.model_dump_json()
    assert list(json.loads(a.model_dump_json())) == ["device", "python", "priority", "measured_priority", "rows"]


@pytest.mark.parametrize("profile", ["cpu", "sm70", "sm75", "sm80", "sm86", "sm89", "sm90", "sm100"])
def test_report_every_profile_has_one_choice_per_op_and_dtype(profile):
    rep = report.build(simulate=profile)
    chosen = {}
    for r in rep.rows:
        if r.status in ("selected", "fallback"):
            assert (r.op, r.dtype) not in chosen, f"two choices for {r.op} {r.dtype}"
            chosen[(r.op, r.dtype)] = r.impl
    expected = {(op, f) for op, fmts in report.REPORTED_FORMATS.items() for f in fmts}
    assert set(chosen) == expected


def test_report_without_triton_or_cupy_still_works():
    code = ("import sys; sys.modules['triton'] = None; sys.modules['cupy'] = None; sys.modules['cupy_backends'] = None;"
            "import importlib.util as u; real = u.find_spec;"
            "u.find_spec = lambda n, *a: None if n.split('.')[0] in ('triton', 'cupy', 'cupy_backends') else real(n, *a);"
            "from quantcore.cli import main; sys.exit(main(['report']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "triton not installed" in out.stdout and "cupy not installed" in out.stdout


def test_bad_simulate_profile_exits_2(capsys):
    assert cli.main(["report", "--simulate", "sm42"]) == 2
    assert "unknown profile 'sm42'" in capsys.readouterr().err
