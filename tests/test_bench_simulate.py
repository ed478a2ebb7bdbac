"""`quantcore bench --simulate sm80,sm75`: the option's parsing, and the table of the rows it adds, from a
saved run (values are placeholders, not measurements); the rows stay out of measured priorities.
The GPU suite times such rows for real (tests/gpu/test_w8a16.py)."""

from __future__ import annotations

import pytest

import quantcore
from quantcore import cli, registry
from quantcore.bench.run import BenchResult, Record
from quantcore.bench.summary import simulated_gemms, summarize


def _gemm(fmt, impl, us, note=""):
    return Record(op="scaled_mm", fmt=fmt, shape=[4096, 4096, 7168], impl=impl, us=us, eager_us=us + 20,
                  unit="TFLOP/s", rate=2 * 4096 * 4096 * 7168 / us / 1e6, note=note)


def _result() -> BenchResult:
    records = [_gemm("fp8_e4m3", "triton", 200.0), _gemm("fp8_e4m3", "cublas-bf16", 300.0),
               _gemm("fp8_e4m3", "triton@sm80", 400.0, "ran triton[w8a16]"),
               _gemm("fp8_e4m3", "cupy@sm75", 600.0, "ran cupy[w8a16]"),
               _gemm("int8", "torch._int_mm", 150.0), _gemm("int8", "triton@sm80", 160.0, "ran triton"),
               Record(op="scaled_mm", fmt="fp8_e4m3", shape=[4096, 4096, 7168], impl="torch[cublas]@sm80",
                      unit="TFLOP/s", note="UnsupportedError: needs sm_90")]
    return BenchResult(device=quantcore.capability.simulated_profile("sm90"), date="2026-01-01",
                       command="quantcore bench --simulate sm80,sm75", copy_gbps=3000.0, dispatch_overhead_us={},
                       records=records)


def test_simulate_takes_comma_separated_gpu_profiles():
    assert cli._parser().parse_args(["bench", "--simulate", "sm80,sm_75"]).simulate == ("sm80", "sm_75")
    assert cli._parser().parse_args(["bench"]).simulate == ()


@pytest.mark.parametrize("value, message", [("sm42", "unknown profile 'sm42'"), ("cpu", "expected GPU profiles"),
                                            (",", "expected GPU profiles")])
def test_simulate_refuses_what_is_not_a_gpu_profile(capsys, value, message):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", "--simulate", value])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_end_to_end_runs_refuse_simulate(capsys):
    assert cli.main(["bench", "--e2e", "--simulate", "sm80"]) == 2
    assert "--simulate: options of the op bench" in capsys.readouterr().err


def test_simulated_rows_beside_bf16_and_int_mm():
    rows = [line for line in simulated_gemms(_result()).splitlines() if line.startswith("| ")][1:]
    rate = {us: f"{2 * 4096 * 4096 * 7168 / us / 1e6:.1f}" for us in (400.0, 600.0, 160.0)}
    assert rows == [  # the bf16 GEMM took 300 µs, torch._int_mm 150; the unmeasured row is left out
        f"| fp8_e4m3 | 4096x4096x7168 | sm80 | triton | triton[w8a16] | {rate[400.0]} | 400.0 / 420.0 | 0.75 | 0.38 |",
        f"| fp8_e4m3 | 4096x4096x7168 | sm75 | cupy | cupy[w8a16] | {rate[600.0]} | 600.0 / 620.0 | 0.50 | 0.25 |",
        f"| int8 | 4096x4096x7168 | sm80 | triton | triton | {rate[160.0]} | 160.0 / 180.0 | — | 0.94 |"]
    assert "GEMMs as other GPUs" in summarize(_result())


def test_simulated_rows_are_not_ranked_by_measured_priorities():
    assert not any("@" in name for name in registry.compared("scaled_mm"))
