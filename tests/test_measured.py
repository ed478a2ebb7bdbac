"""Measured priorities: built from bench records, looked up per GPU model, op, format and M bucket."""

from __future__ import annotations

from dataclasses import replace

import json

import pytest
import torch

from quantcore import registry

from quantcore.registry import measured
from quantcore.registry import m_bucket
from quantcore.definitions.query import GemmQuery
from quantcore.bench.run import Record
from quantcore.capability import simulated_profile

H100 = simulated_profile("sm90").model_copy(update={"name": "NVIDIA H100 80GB HBM3"})


def rec(impl, m, us, op="scaled_mm", fmt="fp8_e4m3", n=2112):
    return Record(op=op, fmt=fmt, shape=[m, n, 7168], impl=impl, us=us, unit="TFLOP/s")


def test_build_ranks_by_geometric_mean_and_penalises_missing_shapes():
    records = [rec("triton", 1, 10), rec("cupy", 1, 8), rec("triton", 1, 10, n=7168), rec("cupy", 1, 9, n=7168),
               rec("torch[cublas]", 4096, 100), rec("triton", 4096, 120), rec("cupy", 4096, 50, n=7168),
               rec("triton", 4096, 130, n=7168), rec("torch[cublas]", 4096, 110, n=7168)]
    table = measured.build(records, lambda r: m_bucket(r.shape[0]))
    assert table["scaled_mm/fp8_e4m3"]["1"] == ["cupy", "triton"]
    # cupy ran only one of the two M=4096 shapes, so it ranks after those that ran both
    assert table["scaled_mm/fp8_e4m3"]["4096"] == ["torch[cublas]", "triton", "cupy"]


def test_lookup_takes_the_nearest_bucket_below(monkeypatch, tmp_path):
    monkeypatch.setattr(measured, "load", lambda name: None)  # no table in force: the written one holds only these
    path = measured.write(H100.name, {"scaled_mm/fp8_e4m3": {"1": ["cupy"], "128": ["torch[cublas]", "triton"]}},
                          "test", tmp_path)
    assert path.name == "nvidia-h100-80gb-hbm3.json" and json.loads(path.read_text())["source"] == "test"
    data = json.loads(path.read_text())["priority"]
    monkeypatch.setattr(measured, "table", lambda name: {k: {int(m): tuple(v) for m, v in d.items()}
                                                         for k, d in data.items()} if name == H100.name else {})
    monkeypatch.setattr(measured, "table_by_k", lambda name: {})  # no per-K rankings: the ones over every K
    assert measured.lookup(H100.name, "scaled_mm", "fp8_e4m3", 64) == ("cupy",)
    assert measured.lookup(H100.name, "scaled_mm", "fp8_e4m3", 16384) == ("torch[cublas]", "triton")
    assert measured.lookup(H100.name, "act_quant", "fp8_e4m3", 64) is None
    # the registry puts measured entries first, then the defaults, the reference last
    q = GemmQuery("scaled_mm", H100, "fp8_e4m3", blocks=(128, 128), m_bucket=4096, nk=(2112, 7168))
    assert registry.current_priority(q) == ("torch[cublas]", "triton", "cupy", "torch")
    assert registry.table.ordered("scaled_mm", registry.current_priority(q))[0].label == "torch[cublas]"
    # a plain quant_linear (act_quant and the same GEMM) follows scaled_mm's ranking, skipping the
    # variants it has no implementation of
    ql = GemmQuery("quant_linear", H100, "fp8_e4m3", blocks=(128, 128), m_bucket=4096, nk=(2112, 7168))
    assert registry.current_priority(ql) == ("torch[cublas]", "triton", "cupy", "torch")
    assert registry.table.ordered("quant_linear", registry.current_priority(ql))[0].label == "triton"
    # a fused epilogue (bias, activation, re-quantization) ranks as the plain GEMM, among the
    # implementations that compute it in their kernel
    fused = GemmQuery("scaled_mm", H100, "fp8_e4m3", blocks=(128, 128), m_bucket=4096, nk=(2112, 7168), fused=True)
    assert registry.current_priority(replace(fused, m_bucket=64)) == ("cupy", "triton", "torch")
    assert registry.current_priority(fused) == ("triton", "cupy", "torch")  # cuBLAS adds it in passes of its own
    assert registry.table.ordered("scaled_mm", registry.current_priority(fused))[0].label == "triton"
    # a simulated profile never uses the real GPU's measurements
    sim = H100.model_copy(update={"simulated_from": "NVIDIA H100 80GB HBM3"})
    plain = GemmQuery("scaled_mm", sim, "fp8_e4m3", m_bucket=4096)
    assert registry.current_priority(plain) == ("triton", "cupy", "torch")


def test_cublas_variant_constraints_are_data():
    cublas = next(i for i in registry.impls("scaled_mm") if i.label == "torch[cublas]")
    ok = GemmQuery("scaled_mm", H100, "fp8_e4m3", blocks=(128, 128), m_bucket=1, nk=(2112, 7168))
    assert cublas.not_supported_reasons(ok) == []
    tail = GemmQuery("scaled_mm", H100, "fp8_e4m3", blocks=(128, 128), m_bucket=1, nk=(2112, 7000))
    assert cublas.not_supported_reasons(tail) == ["N must be a multiple of 16 and K of 512, got (N, K) = (2112, 7000)"]
    sm80 = GemmQuery("scaled_mm", simulated_profile("sm80"), "int8", blocks=(128, 128), nk=(128, 512))
    assert cublas.not_supported_reasons(sm80) == ["needs compute capability >= 9.0, device is 8.0",
                                                  "format int8 not implemented (has fp8_e4m3)"]


def test_written_tables_go_to_the_user_data_folder_and_take_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("QUANTCORE_DATA_DIR", str(tmp_path))
    shipped = measured.load(H100.name)
    # the shipped H100 table: the Gluon GEMM first at 4096 rows, cuBLAS at 16384 (docs/bench/round38/gemm/gemm_h100.txt)
    assert shipped.shipped and shipped.priority["scaled_mm/fp8_e4m3"][4096][0] == "triton[gluon]"
    assert shipped.priority["scaled_mm/fp8_e4m3"][16384][0] == "torch[cublas]"
    path = measured.write(H100.name, {"scaled_mm/fp8_e4m3": {"1": ["cupy", "triton"]}}, "test")
    assert path == tmp_path / "priority" / "nvidia-h100-80gb-hbm3.json"
    found = measured.load(H100.name)
    assert found.path == str(path) and not found.shipped
    q = GemmQuery("scaled_mm", H100, "fp8_e4m3", blocks=(128, 128), m_bucket=4096, nk=(2112, 7168))
    assert registry.current_priority(q) == ("cupy", "triton", "torch")
    monkeypatch.setenv("QUANTCORE_DATA_DIR", str(tmp_path / "elsewhere"))
    assert measured.load(H100.name) == shipped


def test_a_run_of_some_ops_keeps_the_other_entries_of_the_table_in_force(monkeypatch, tmp_path):
    """`bench --moe --write-priority` ranks the grouped GEMM alone: the shipped rankings of every other op stay, per-K
    ones included; a later run ranking scaled_mm replaces its entry whole and keeps the grouped GEMM's."""
    monkeypatch.setenv("QUANTCORE_DATA_DIR", str(tmp_path))
    shipped = measured.load(H100.name)
    grouped = {"4096": ["triton", "triton[gluon]"], "16384": ["triton[gluon]", "triton"]}
    measured.write(H100.name, {"grouped_mm/fp8_e4m3": grouped}, "moe run")
    table = measured.load(H100.name)
    assert not table.shipped and table.arch == shipped.arch == "sm_90"
    assert table.priority["grouped_mm/fp8_e4m3"] == {4096: ("triton", "triton[gluon]"), 16384: ("triton[gluon]", "triton")}
    assert {k: v for k, v in table.priority.items() if k != "grouped_mm/fp8_e4m3"} == shipped.priority
    assert table.by_k == shipped.by_k and shipped.by_k
    assert table.source == f"moe run; the other entries from: {shipped.source}"
    measured.write(H100.name, {"scaled_mm/fp8_e4m3": {"1": ["cupy"]}}, "ops run")
    again = measured.load(H100.name)
    assert again.priority["scaled_mm/fp8_e4m3"] == {1: ("cupy",)} and "scaled_mm/fp8_e4m3" not in again.by_k
    assert again.priority["grouped_mm/fp8_e4m3"] == table.priority["grouped_mm/fp8_e4m3"]
    assert again.by_k == {k: v for k, v in shipped.by_k.items() if k != "scaled_mm/fp8_e4m3"}


@pytest.mark.parametrize("op", ["scaled_mm", "quant_linear"])
def test_the_gemm_specs_mark_every_fused_epilogue(op):
    """What `GemmQuery.fuses_epilogue` reads: a bias, an activation or a re-quantized output is a fused
    epilogue; none is a plain GEMM."""
    from quantcore import definitions, ops

    x = torch.randn(4, 256)
    w, w_s = ops.weight_quant(torch.randn(128, 256), dtype=torch.int8)
    args = (*ops.act_quant(x, dtype=torch.int8), w, w_s) if op == "scaled_mm" else (x, w, w_s)
    bias = torch.randn(128)
    cases = [({}, False), (dict(bias=bias), True), (dict(activation="gelu"), True),
             (dict(bias=bias, activation="silu"), True)]
    if op == "scaled_mm":
        cases.append((dict(out_quant=torch.int8), True))
    for options, expected in cases:
        query = definitions.get(op).spec(*args, **options).query
        assert query.fused == query.fuses_epilogue == expected, options


def test_gemms_are_ranked_per_k_bucket_where_the_table_has_them(monkeypatch, tmp_path):
    monkeypatch.setenv("QUANTCORE_DATA_DIR", str(tmp_path))

    def gemm(impl, m, k, us):
        return Record(op="scaled_mm", fmt="fp8_e4m3", shape=[m, 4096, k], impl=impl, us=us, unit="TFLOP/s")

    # cuBLAS ahead at long K, the Gluon GEMM at short K: over every K the Gluon GEMM is first.
    records = [gemm("triton[gluon]", 4096, 512, 10), gemm("torch[cublas]", 4096, 512, 13),
               gemm("triton[gluon]", 4096, 7168, 100), gemm("torch[cublas]", 4096, 7168, 96),
               gemm("triton", 1, 7168, 5), gemm("triton[gluon]", 1, 7168, 9)]
    m_of = lambda r: m_bucket(r.shape[0])  # noqa: E731
    priority = measured.build(records, m_of)
    by_k = measured.build_by_k(records, m_of, lambda r: registry.k_bucket(r.shape[2]) if r.shape[0] >= 512 else None)
    assert priority["scaled_mm/fp8_e4m3"]["4096"] == ["triton[gluon]", "torch[cublas]"]
    assert by_k == {"scaled_mm/fp8_e4m3": {"512": {"4096": ["triton[gluon]", "torch[cublas]"]},
                                           "8192": {"4096": ["torch[cublas]", "triton[gluon]"]}}}
    measured.write(H100.name, priority, "test", by_k=by_k)
    assert measured.load(H100.name).by_k["scaled_mm/fp8_e4m3"][8192] == {4096: ("torch[cublas]", "triton[gluon]")}

    def first(m, k):
        return measured.lookup(H100.name, "scaled_mm", "fp8_e4m3", m_bucket(m), registry.k_bucket(k))[0]

    assert first(4096, 7168) == first(16384, 16384) == first(4096, 5000) == "torch[cublas]"  # K bucket 8192 and up
    assert first(4096, 4096) == first(4096, 512) == first(4096, 100) == "triton[gluon]"  # nearest K at or below
    assert first(1, 7168) == "triton"  # below the per-K rankings' first M: the one over every K
    assert measured.lookup(H100.name, "scaled_mm", "fp8_e4m3", 4096)[0] == "triton[gluon]"  # no K: over every K
    # the registry asks with the GEMM's K
    q = GemmQuery("scaled_mm", H100, "fp8_e4m3", blocks=(128, 128), m_bucket=4096, nk=(2112, 7168))
    assert q.k_bucket == 8192 and registry.current_priority(q)[0] == "torch[cublas]"
    assert registry.current_priority(replace(q, nk=(2112, 1536)))[0] == "triton[gluon]"
    assert registry.Query("scaled_mm", H100, "fp8_e4m3", m_bucket=4096).k_bucket is None


def test_the_shipped_h100_table_sends_long_k_fp8_gemms_to_cublas_and_short_k_to_the_gluon_gemm():
    """docs/bench/round38/gemm/gemm_h100.txt: at 4096 rows cuBLAS block-wise is 0.3-3.7 % faster from K = 7168, the
    Gluon GEMM 0.7-12 % faster at K <= 2048; at 16384 rows cuBLAS from K = 7168, the Gluon GEMM at K <= 1536."""
    def first(m, k):
        q = GemmQuery("scaled_mm", H100, "fp8_e4m3", blocks=(128, 128), m_bucket=m_bucket(m), nk=(4096, k))
        return registry.current_priority(q)[0]

    assert [first(4096, k) for k in (512, 2048, 7168, 16384)] == ["triton[gluon]"] * 2 + ["torch[cublas]"] * 2
    assert [first(16384, k) for k in (512, 1536, 7168)] == ["triton[gluon]"] * 2 + ["torch[cublas]"]
    assert first(1, 16384) == "triton"


@pytest.mark.parametrize("text", ["", '{"priority": {"scaled_mm/fp8_e4m3": {"1": ["cupy"]}', "not json", "[]",
                                  '{"device": "x"}', '{"priority": {"scaled_mm/fp8_e4m3": {"one": ["cupy"]}}}',
                                  '{"priority": {"scaled_mm/fp8_e4m3": {"1": "cupy"}}}',
                                  '{"priority": {}, "by_k": {"scaled_mm/fp8_e4m3": {"512": {}}}}'])
def test_a_malformed_user_table_is_ignored_with_one_warning_naming_it(text, monkeypatch, tmp_path):
    """Truncated, empty, non-JSON or schema-less: the shipped table applies, the op calls and the report go on."""
    from quantcore import report

    monkeypatch.setenv("QUANTCORE_DATA_DIR", str(tmp_path))
    path = tmp_path / "priority" / "nvidia-h100-80gb-hbm3.json"
    path.parent.mkdir()
    path.write_text(text)
    measured.forget()
    with pytest.warns(UserWarning, match=f"ignoring the measured priority table {path}") as caught:
        for _ in range(3):
            assert measured.lookup(H100.name, "scaled_mm", "fp8_e4m3", 4096)[0] == "triton[gluon]"
        assert measured.load(H100.name).shipped
        assert report.build(simulate="sm90").by_m  # the shipped tables of sm_90 GPUs, listed
    assert len([w for w in caught if str(path) in str(w.message)]) == 1
