"""The CuPy routing kernels without a GPU: routing.cu's instantiations compile through NVRTC for every target,
the un-permute's sum without fused multiply-adds, and the launch functions' packed parameters line up with
the kernels' signatures (read back through test_cupy_launch's fake driver). Their numbers are checked on a
GPU against the reference (tests/gpu/test_experts_gpu.py)."""

from __future__ import annotations

import gc
import math
import re
import weakref

import pytest
import torch

from quantcore.backends.cupy import compiler, routing

from test_cupy_launch import SM90, _randn, launches  # noqa: F401  (launches: the fake driver's fixture)
from test_cupy_grouped import _nvrtc

NAMES = ("qc::moe_count_kernel<int>", "qc::moe_count_kernel<long long>", "qc::moe_scan_kernel",
         "qc::moe_scatter_kernel<__nv_bfloat16, qc::Fp8E4M3, long long>",
         "qc::moe_scatter_kernel<float, qc::Int8, int>",
         "qc::moe_scatter_kernel<__half, qc::Fp8E4M3, int>", "qc::moe_invert_kernel",
         "qc::moe_gather_kernel<__nv_bfloat16, float, __nv_bfloat16>", "qc::moe_gather_kernel<float, __half, float>")


@pytest.mark.parametrize("arch", (75, 80, 86, 89, 90))
def test_routing_kernels_compile(arch):
    _nvrtc()
    ptx = compiler.compile_source("routing.cu", arch, NAMES).ptx.decode()
    gather = ptx[ptx.index(".entry _ZN2qc17moe_gather_kernel"):]
    gather = gather[:gather.index("\n}\n")]
    # The weighted sum's products are rounded before each add: no contraction into an FMA.
    assert "fma" not in gather and "mul.rn.f32" in gather and "add.rn.f32" in gather


def test_permute_parameters(launches):  # noqa: F811
    T, H, k, E = 40, 300, 3, 8
    x = _randn(T, H, dtype=torch.bfloat16)
    ids = torch.randint(0, E, (T, k + 1))[:, :k]  # strided: every fourth id skipped
    q, s, offsets, rows = routing.moe_permute(x, ids, num_experts=E, qdtype=torch.float8_e4m3fn, group_size=128,
                                              ue8m0=True, eps=1e-4, profile=SM90)
    assert (q.shape, s.shape, offsets.shape, rows.shape) == ((T * k, H), (T * k, 3), (E + 1,), (T * k,))
    count, scan, scatter = launches[-3:]
    tokens = routing._CHUNK_PAIRS // k
    chunks = math.ceil(T / tokens)
    assert [run.kernel for run in (count, scan, scatter)] == ["moe_count_kernel", "moe_scan_kernel",
                                                              "moe_scatter_kernel"]
    assert count.grid == (chunks, 1, 1) and scan.grid == (1, 1, 1) and scan.smem == 4 * E
    assert (count.params["ids"], count.params["st"], count.params["sj"], count.params["tokens"]) == (
        ids.data_ptr(), k + 1, 1, tokens)
    assert count.params["counts"] == scan.params["counts"] == scatter.params["firsts"]
    assert scan.params["bounds"] == scatter.params["bounds"] == offsets.data_ptr() and scan.params["masked"] == 0
    p = scatter.params
    assert (p["x"], p["q"], p["scale"], p["rows"]) == (x.data_ptr(), q.data_ptr(), s.data_ptr(), rows.data_ptr())
    assert (p["ldx"], p["T"], p["H"], p["K"], p["E"], p["slots"], p["G"], p["ue8m0"], p["masked"]) == (
        H, T, H, k, E, T * k, 128, 1, 0)
    assert scatter.grid == (T + math.ceil(T * k / 256), 1, 1) and scatter.smem == 8 * k
    assert re.fullmatch(r"qc::moe_scatter_kernel<__nv_bfloat16, qc::Fp8E4M3, long long>", scatter.expr)


def test_masked_permute_and_unpermute_parameters(launches):  # noqa: F811
    T, H, k, E, max_m = 3, 64, 2, 4, 3
    x, ids = _randn(T, H), torch.tensor([[0, 1], [1, 2], [3, 1]], dtype=torch.int32)
    q, s, masked_m, rows = routing.moe_permute_masked(x, ids, num_experts=E, max_m=max_m, qdtype=torch.int8,
                                                      group_size=32, ue8m0=False, eps=1e-4, profile=SM90)
    assert (q.shape, s.shape, masked_m.shape, rows.shape) == ((E, max_m, H), (E, max_m, 2), (E,), (E, max_m))
    scan, scatter = launches[-2:]
    assert (scan.params["masked"], scan.params["max_m"], scatter.params["masked"], scatter.params["slots"]) == (
        1, max_m, 1, E * max_m)
    assert "int>" in scatter.expr and scatter.params["bounds"] == masked_m.data_ptr()

    y, w = _randn(E * max_m, 96, dtype=torch.bfloat16), _randn(k + 1, T).t()[:, :k]  # weights [T, k], strided
    out = routing.moe_unpermute(y, rows.reshape(-1), w, out_dtype=torch.float32, profile=SM90)
    invert, gather = launches[-2:]
    assert out.shape == (T, 96) and invert.grid == (1, 1, 1) and gather.grid == (T, 1, 1)
    assert (invert.params["rows"], invert.params["slots"], invert.params["pairs"]) == (
        rows.data_ptr(), E * max_m, T * k)
    g = gather.params
    assert g["sources"] == invert.params["sources"] and (g["y"], g["w"], g["out"]) == (
        y.data_ptr(), w.data_ptr(), out.data_ptr())
    assert (g["ldy"], g["swt"], g["swj"], g["ldo"], g["N"], g["K"], g["slots"]) == (96, 1, T, 96, 96, k, E * max_m)
    assert gather.expr == "qc::moe_gather_kernel<__nv_bfloat16, float, float>"


def test_a_kept_run_binds_each_calls_tensors_and_holds_none_of_the_first(launches):  # noqa: F811
    def tensors(seed):
        ids = torch.randint(0, 4, (6, 2), generator=torch.Generator().manual_seed(seed))
        return dict(x=_randn(6, 128, seed=seed), topk_ids=ids)
    first = tensors(1)
    alive = [weakref.ref(t) for t in first.values()]
    run = routing.moe_permute_masked.prepare(**first, num_experts=4, max_m=6, qdtype=torch.int8, group_size=128,
                                             ue8m0=False, eps=1e-4, profile=SM90)
    del first
    gc.collect()
    assert all(ref() is None for ref in alive), "run keeps a tensor of the first call"
    compiled = launches.compiled
    for seed in (2, 3):
        given = tensors(seed)
        q, s, masked_m, rows = run(**given)
        count, scan, scatter = launches[-3:]
        assert launches.compiled == compiled
        assert count.params["ids"] == scatter.params["ids"] == given["topk_ids"].data_ptr()
        assert (scatter.params["x"], scatter.params["q"], scatter.params["scale"], scatter.params["rows"],
                scan.params["bounds"]) == (given["x"].data_ptr(), q.data_ptr(), s.data_ptr(), rows.data_ptr(),
                                           masked_m.data_ptr())
