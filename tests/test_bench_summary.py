"""The bench's markdown tables from a saved run: eager times beside GPU times, decode GEMMs against
the memory floor and torch's bf16 GEMM (values are placeholders, not measurements)."""

from __future__ import annotations

import json

import quantcore
from quantcore.bench.run import BenchResult, Record
from quantcore.bench.baselines import gemm_floor_bytes
from quantcore.bench.shapes import READ_CEILING
from quantcore.bench.summary import decode_gemms, summarize


def _gemm(shape, impl, us, eager_us):
    return Record(op="scaled_mm", fmt="fp8_e4m3", shape=shape, impl=impl, us=us, eager_us=eager_us, unit="TFLOP/s",
                  rate=2 * shape[0] * shape[1] * shape[2] / us / 1e6)


def _result() -> BenchResult:
    records = [_gemm([m, 4096, 4096], impl, us, eager) for m in (1, 4096)
               for impl, us, eager in (("triton", 11.2, 30.0), ("cupy", 40.0, 45.0), ("cublas-bf16", 14.0, 20.0))]
    records.append(Record(op="scaled_mm", fmt="fp8_e4m3", shape=[1, 4096, 4096], impl=READ_CEILING, us=8.4,
                          rate=2.0, unit="GB/s"))
    records.append(Record(op="act_quant", fmt="int8", shape=[1, 7168], impl="triton", us=4.0, eager_us=21.5,
                          rate=5.0, unit="GB/s", fraction=0.002))
    return BenchResult(device=quantcore.capability.simulated_profile("sm90"), date="2026-01-01",
                       command="quantcore bench", copy_gbps=3000.0, dispatch_overhead_us={}, records=records)


def test_floor_bytes_count_weight_activation_output_and_scales():
    # 4096² 1-byte weight, 4096 1-byte activations, 4096 bf16 outputs, 32 + 32·32 fp32 scales
    assert gemm_floor_bytes(1, 4096, 4096) == 16_777_216 + 4096 + 8192 + 4 * 1056


def test_decode_table_has_decode_rows_only_with_floor_and_read_fractions_and_bf16_ratios():
    rows = [line for line in decode_gemms(_result()).splitlines() if line.startswith("| fp8_e4m3")]
    assert len(rows) == 1  # M = 4096 is not a decode GEMM
    floor_us = gemm_floor_bytes(1, 4096, 4096) / 3000.0 / 1e3
    assert rows[0] == (f"| fp8_e4m3 | 1x4096x4096 | {floor_us:.1f} | 8.4 | triton | 11.2 / 30.0 | {floor_us / 11.2:.2f} "
                       f"| {8.4 / 11.2:.2f} | 14.0 / 20.0 | 0.80 | 1.50 |")


def test_decode_table_of_a_run_without_read_ceiling_shows_none():
    result = _result()
    result.records = [r for r in result.records if r.impl != READ_CEILING]
    row = next(line for line in decode_gemms(result).splitlines() if line.startswith("| fp8_e4m3"))
    assert row.split(" | ")[3] == "—" and row.split(" | ")[7] == "—"  # read µs, read / GPU time


def test_summary_shows_gpu_and_eager_times():
    out = summarize(_result())
    assert "| act_quant | int8 | 1x7168 |" in out and "| 4.0 / 21.5 |" in out
    assert "| 11.2 / 30.0 | 40.0 / 45.0 |" in out  # the GEMM table: triton, then cupy


def test_runs_saved_before_eager_times_still_load_and_summarize():
    data = json.loads(_result().model_dump_json())
    for r in data["records"]:
        del r["eager_us"]
    old = BenchResult.model_validate(data)
    assert all(r.eager_us is None for r in old.records)
    assert "| 11.2 / — | 40.0 / — |" in summarize(old)
