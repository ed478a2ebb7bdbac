"""The CuPy grouped (mixture-of-experts) GEMMs without a GPU: gemm.cu's grouped instantiations compile through
NVRTC for every target with each one's MMA path, and the launch functions' packed parameters line up with
gemm_kernel's signature (read back through test_cupy_launch's fake driver). Their numbers are checked on a GPU
(tests/gpu/test_grouped_gpu.py)."""

from __future__ import annotations

import math

import pytest
import torch

from quantcore import InvalidInputError, UnsupportedError
from quantcore.backends.cupy import compiler, grouped, launch
from quantcore.capability import simulated_profile

from test_cupy_launch import SM90, _q, _randn, launches  # noqa: F401  (launches: the fake driver's fixture)

FP8, I8 = torch.float8_e4m3fn, torch.int8


def _nvrtc():
    nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc")
    try:
        nvrtc.getVersion()
    except Exception as exc:  # the binding imports, but libnvrtc itself is missing
        pytest.skip(f"NVRTC not loadable: {exc}")


@pytest.mark.parametrize("arch", (75, 80, 86, 89, 90))
def test_grouped_instantiations_compile(arch):
    """Both layouts, on the decode tile (masked) and the large tile (contiguous), for INT8 and FP8 as this
    architecture multiplies them (e4m3 MMA from sm_89, FP8 decoded to fp16 below)."""
    _nvrtc()
    profile = simulated_profile(f"sm{arch}")
    names = []
    for mma in ("int8", "fp8" if arch >= 89 else "fp16"):
        for rows, grouping in ((16, 2), (4096, 1)):
            tile = launch.gemm_tile(rows)
            stages, _ = launch.gemm_stages(tile, profile.smem_per_block)
            names.append(launch.gemm_kernel_name(mma, tile, stages, True, grouping=grouping))
    ptx = compiler.compile_source("gemm.cu", arch, tuple(names)).ptx.decode()
    assert "shfl.sync.up" in ptx and "vote.sync.ballot" in ptx  # the contiguous layout's scan of the offsets
    assert ("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32" in ptx) == (arch >= 89)


def _options(**kw):
    return dict(dict(block_n=128, block_k=128, bias=None, activation=None, out_dtype=torch.bfloat16, out_quant=None,
                     out_group=128, ue8m0_out=False, eps=1e-4, mma="int8", profile=SM90), **kw)


def test_contiguous_parameters(launches):  # noqa: F811
    E, M, N, K = 4, 50, 96, 300
    a, a_s, b, b_s = _q(M, K, dtype=I8), _randn(M, 3), _q(E * N, K, dtype=I8).view(E, N, K), _randn(E, 1, 3)
    offsets = torch.tensor([0, 0, 1, 41, 48], dtype=torch.int32)
    bias = _randn(E, N, dtype=torch.bfloat16)
    out = grouped.grouped_mm(a, a_s, b, b_s, offsets, **_options(bias=bias))
    run = launches[-1]
    tile = launch.gemm_tile(math.ceil(M / E))
    assert run.expr.endswith(", 1>") and out.shape == (M, N)
    assert run.grid == (math.ceil(M / tile.bm) + E, math.ceil(N / tile.bn), 1)
    p = run.params
    assert (p["a"], p["as"], p["b"], p["bs"], p["out"], p["rows"]) == tuple(
        t.data_ptr() for t in (a, a_s, b, b_s, out, offsets))
    assert (p["experts"], p["a_e"], p["as_e"], p["b_e"], p["bs_e"], p["out_e"], p["os_e"]) == (E, 0, 0, N * K, 3, 0, 0)
    assert (p["bias_e"], p["bias_s"], p["lda"], p["as_m"], p["M"], p["k_split"]) == (N, 1, K, 3, M, 384)
    assert torch.equal(run.bias, bias[0].float())  # expert 0's row, as the kernel reads it before moving on


def test_masked_parameters(launches):  # noqa: F811
    E, max_m, N, K = 3, 20, 256, 256
    a, a_s = _q(E, max_m, K, dtype=FP8), _randn(E, max_m, 2)
    b, b_s, masked_m = _q(E * N, K).view(E, N, K), _randn(E, 2, 2), torch.tensor([0, 20, 3], dtype=torch.int32)
    q, s = grouped.grouped_mm_masked(a, a_s, b, b_s, masked_m, **_options(mma="fp8", out_quant=I8, out_group=64))
    run = launches[-1]
    tile = launch.gemm_tile(max_m, 64)
    assert run.expr.endswith(", 2>") and (q.shape, s.shape) == ((E, max_m, N), (E, max_m, 4))
    assert run.grid == (E * math.ceil(max_m / tile.bm), N // tile.bn, 1)
    p = run.params
    assert (p["rows"], p["out_scale"], p["M"], p["experts"]) == (masked_m.data_ptr(), s.data_ptr(), max_m, E)
    assert (p["a_e"], p["as_e"], p["out_e"], p["os_e"], p["os_m"]) == (max_m * K, max_m * 2, max_m * N, max_m * 4, 4)


def test_refusals(launches):  # noqa: F811
    a, b = _q(4, 128, dtype=I8), _q(2 * 64, 128, dtype=I8).view(2, 64, 128)
    offsets = torch.tensor([0, 1, 4], dtype=torch.int32)
    with pytest.raises(UnsupportedError, match="MMA kernel reads"):
        grouped.grouped_mm(a, _randn(4, 1), b, _randn(2, 1, 1), offsets, **_options(mma="fp8"))
    with pytest.raises(InvalidInputError, match="int32"):
        grouped.grouped_mm(a, _randn(4, 1), b, _randn(2, 1, 1), offsets.long(), **_options())
