"""The report CLI, as a user runs it."""

from __future__ import annotations

import importlib.machinery
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import quantcore
from quantcore import cli, registry, report
from quantcore.cli import main


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
    assert statuses <= set(report.STATUSES)
    assert data["simulated"] is True and data["schema_version"] == report.SCHEMA


def test_report_json_is_stable():
    a, b = report.build(simulate="sm90"), report.build(simulate="sm90")
    assert a.model_dump_json() == b.model_dump_json()
    assert list(json.loads(a.model_dump_json())) == ["schema_version", "device", "simulated", "python", "priority",
                                                     "priority_source", "measured_table", "rows", "plugins", "by_m",
                                                     "launch_path"]


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


def _saved_run(tmp_path):
    """A bench result as `quantcore bench --json` writes it (values are placeholders, not measurements)."""
    from quantcore.bench.run import BenchResult, Record

    records = [Record(op="act_quant", fmt="fp8_e4m3", shape=[4096, 7168], impl=impl, us=us, rate=rate, unit="GB/s",
                      fraction=rate / 3000.0) for impl, us, rate in (("triton", 10.0, 2700.0), ("cupy", 20.0, 1350.0),
                                                                     ("torch.compile", 12.0, 2250.0))]
    result = BenchResult(device=quantcore.capability.simulated_profile("sm90"), date="2026-01-01",
                         command="quantcore bench", copy_gbps=3000.0, dispatch_overhead_us={"triton": 3.0},
                         records=records)
    path = tmp_path / "run.json"
    path.write_text(result.model_dump_json())
    return path


def test_bench_summarizes_a_saved_run_without_a_gpu(tmp_path, capsys):
    assert main(["bench", "--from-json", str(_saved_run(tmp_path))]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| act_quant")]
    assert rows[0] == "| act_quant | fp8_e4m3 | 0.90 (4096x7168) | 1.20 (4096x7168) |"  # the targets
    assert "| 2700 | 1350 | 0.90 | 2250 | 1.20 |" in rows[1]  # the detailed table


def test_bench_refuses_to_measure_without_a_gpu(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the bench would run")
    assert main(["bench", "--json", str(tmp_path / "out.json")]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_dispatch_overhead_probe_measures_and_leaves_the_registry_as_it_was():
    import importlib

    from quantcore import registry

    bench_run = importlib.import_module("quantcore.bench.run")  # the module, not the function of that name

    before = {op: registry.impls(op) for op in ("act_quant", "scaled_mm")}
    overhead = bench_run._dispatch_overhead("cpu")
    assert set(overhead) == {"act_quant", "scaled_mm"}
    assert all(0 < v < 1000 for v in overhead.values()), overhead  # µs per call: positive, not absurd
    assert {op: registry.impls(op) for op in before} == before


def test_saved_runs_keep_the_versions_of_the_machine_that_measured(tmp_path):
    import json

    from quantcore.bench.run import BenchResult

    data = json.loads(_saved_run(tmp_path).read_text())
    data.pop("versions")
    data["device"]["versions"] = {"torch": "2.11.0+cu130", "triton": "3.6.0"}
    assert BenchResult.model_validate(data).versions == {"torch": "2.11.0+cu130", "triton": "3.6.0"}


def test_write_priority_from_a_saved_run_goes_to_the_user_data_folder(tmp_path, monkeypatch, capsys):
    from quantcore.registry import measured

    monkeypatch.setenv("QUANTCORE_DATA_DIR", str(tmp_path / "data"))
    package = Path(quantcore.__file__).parent
    before = sorted(package.rglob("*.json"))
    assert main(["bench", "--from-json", str(_saved_run(tmp_path)), "--write-priority"]) == 0
    written = tmp_path / "data" / "priority" / "h100-simulated.json"
    assert f"wrote {written}\n" in capsys.readouterr().out
    assert json.loads(written.read_text())["priority"]["act_quant/fp8_e4m3"] == {"4096": ["triton", "cupy"]}
    assert sorted(package.rglob("*.json")) == before  # nothing written into the installed package
    assert measured.load("H100 (simulated)").path == str(written)
    assert main(["bench", "--from-json", str(_saved_run(tmp_path)), "--write-priority", str(tmp_path / "out")]) == 0
    assert "the registry reads tables from" in capsys.readouterr().out
    assert (tmp_path / "out" / "h100-simulated.json").is_file()


def test_bench_ops_are_choices_listed_in_help(capsys):
    from quantcore.bench.shapes import OPS

    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = capsys.readouterr().out
    assert all(op in text for op in OPS)
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--ops", "quant_linaer"])
    assert exit_.value.code == 2 and "invalid choice: 'quant_linaer'" in capsys.readouterr().err


def test_plot_without_matplotlib_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys):
    real = quantcore.capability.module_available
    monkeypatch.setattr(quantcore.capability, "module_available", lambda name: name != "matplotlib" and real(name))
    for args in (["--from-json", str(_saved_run(tmp_path))], []):  # a saved run; a measurement (no GPU here)
        assert main(["bench", *args, "--plot", str(tmp_path / "run.png")]) == 2
        err = capsys.readouterr().err
        assert "--plot needs matplotlib" in err and "GPU" not in err
    assert not (tmp_path / "run.png").exists()


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_is_plain_lines_off_a_terminal_and_a_tqdm_bar_on_one(monkeypatch):
    from quantcore.bench.run import Progress

    updates = []

    class FakeTqdm:  # records what a bar would show
        def __init__(self, total, file, **kwargs):
            updates.append(("total", total))

        def set_postfix_str(self, label, refresh):
            updates.append(("label", label))

        def update(self, n):
            updates.append(("update", n))

        def close(self):
            updates.append(("close",))

    fake = type(sys)("tqdm")
    fake.__spec__, fake.tqdm = importlib.machinery.ModuleSpec("tqdm", None), FakeTqdm
    monkeypatch.setitem(sys.modules, "tqdm", fake)
    for stream, bar in ((io.StringIO(), True), (_Terminal(), False)):  # a pipe or a log; --no-progress
        progress = Progress(2, bar, stream)
        progress.step("act_quant fp8_e4m3 [1, 7168]")
        progress.step("scaled_mm int8 1x2112x7168")
        lines = stream.getvalue().splitlines()
        assert len(lines) == 2 and "\r" not in stream.getvalue()
        assert lines[1].endswith("] 2/2 scaled_mm int8 1x2112x7168")
    assert updates == []
    progress = Progress(2, True, _Terminal())
    progress.step("a")
    progress.step("b")
    assert updates == [("total", 2), ("label", "a"), ("update", 1), ("label", "b"), ("update", 1), ("close",)]


_WITHOUT_TORCH = """
import sys
sys.argv = ["quantcore", *sys.argv[1:]]  # as the console script runs it
from quantcore.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print("torch imported:", "torch" in sys.modules)
"""


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["bench", "--help"], ["report", "--help"]])
def test_version_and_help_answer_without_importing_torch(args):
    out = subprocess.run([sys.executable, "-c", _WITHOUT_TORCH, *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "torch imported: False" in out.stdout and ("quantcore 0.1.0" in out.stdout or "usage:" in out.stdout)


def test_numerics_warning_points_at_the_callers_line():
    x = torch.randn(2, 256)
    q, s = quantcore.ops.act_quant(x)
    wq, ws = quantcore.ops.weight_quant(torch.randn(64, 256))
    registry.clear_caches()
    with pytest.warns(quantcore.NumericsWarning) as caught:
        quantcore.ops.scaled_mm(q, s, wq, ws, backend="torch[bf16_dequant]")
    assert caught[0].filename == __file__


def test_numerics_warning_from_a_quantized_model_points_at_the_model_call():
    # Reached through nn.Module.__call__, the first frame outside quantcore is torch's: skipped too.
    from quantcore.nn import quantize_model
    model = quantize_model(torch.nn.Sequential(torch.nn.Linear(256, 64)), skip=())
    registry.clear_caches()
    with pytest.warns(quantcore.NumericsWarning) as caught, quantcore.priority("torch[bf16_dequant]"):
        model(torch.randn(2, 256))
    assert caught[0].filename == __file__


@pytest.mark.parametrize("text, problem", [("not json", "Invalid JSON"), ("", "Invalid JSON"),
                                           ("[1, 2]", "Input should be an object"), ("{}", "device: Field required"),
                                           ('{"kind": "e2e"}', "device: Field required")])
@pytest.mark.parametrize("option", ["--from-json", "--resume"])
def test_a_file_that_is_no_saved_run_is_named_without_a_traceback(tmp_path, capsys, option, text, problem):
    path = tmp_path / "run.json"
    path.write_text(text)
    assert main(["bench", option, str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"quantcore: bench {option} {path}: not a run saved by `quantcore bench") and problem in err
    assert "Traceback" not in err


def test_an_end_to_end_model_larger_than_the_device_is_refused_before_it_is_made(capsys):
    assert main(["bench", "--e2e", "--e2e-dim", str(10**8), "--e2e-layers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("quantcore: bench --e2e: dim 100000000 and 1 layers") and "pass a smaller --e2e-dim" in err
