"""Every CuPy kernel compiles through NVRTC for sm_75, sm_80, sm_86, sm_89 and sm_90 without a GPU
(the memory-bound ones for sm_70 too, where NVRTC still has it),
and each architecture's PTX holds the instructions of its own path (FP8 MMA on sm_89+, the INT8
m16n8k32 MMA and cp.async on sm_80+, the m8n8k16 INT8 and m16n8k8 fp16 MMAs on sm_75)."""

from __future__ import annotations

import functools
import math

import pytest
import torch

nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc")
try:
    nvrtc.getVersion()
except Exception as exc:  # the binding imports, but libnvrtc itself is missing
    pytest.skip(f"NVRTC not loadable: {exc}", allow_module_level=True)

from quantcore import registry  # noqa: E402
from quantcore.definitions.query import GemmQuery  # noqa: E402
from quantcore.backends.cupy import compiler, launch, producers  # noqa: E402
from quantcore.capability import simulated_profile  # noqa: E402

ARCHS = (75, 80, 86, 89, 90)

QUANT = (
    "qc::quant_kernel<__nv_bfloat16, qc::Fp8E4M3, 8, 16, 1>",
    "qc::quant_kernel<float, qc::Int8, 4, 256, 16>",
    "qc::quant_kernel<__half, qc::Fp8E4M3, 1, 32, 8>",
    "qc::dequant_kernel<qc::Fp8E4M3, __nv_bfloat16, 16>",
    "qc::dequant_kernel<qc::Int8, float, 1>",
    "qc::dequant_kernel<qc::Int8, __half, 8>",
)
EPILOGUE = (
    "qc::quantized_gelu_kernel<qc::Fp8E4M3, qc::Int8, false, 16, 8, 1>",
    "qc::quantized_gelu_kernel<qc::Int8, qc::Fp8E4M3, true, 1, 32, 8>",
    "qc::dequant_bias_kernel<int, __nv_bfloat16, float, 4>",
    "qc::dequant_bias_kernel<__nv_bfloat16, float, __nv_bfloat16, 8>",
    "qc::dequant_bias_kernel<float, __half, __half, 1>",
)

MMA_E4M3 = "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"
MMA_S8 = "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32"
MMA_F16 = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
MMA_S8_SM75 = "mma.sync.aligned.m8n8k16.row.col.s32.s8.s8.s32"
MMA_F16_SM75 = "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32"
CP_ASYNC = "cp.async.cg.shared.global"


DECODE_BM = (16, 32, 64)  # the decode tiles, by rows


def _mma(fmt: str, profile) -> str:
    """The MMA kind of the CuPy GEMM the registry picks for `fmt` on `profile` (its `mma` option)."""
    query = GemmQuery("scaled_mm", profile, fmt, blocks=(128, 128), nk=(4096, 4096), block_k=128)
    return dict(registry.select(query, backend="cupy").options)["mma"]


def _gemm_variants(arch: int) -> dict[tuple[str, str], tuple[str, ...]]:
    """What the launcher instantiates on this architecture, by (MMA kind, path): every tile (the decode
    tiles with BN = 64, and BN = 128 for 128-wide re-quantize groups; the large tile) at the profile's
    stage count, FP8 and INT8 as the registry binds them; on quantized codes with the cp.async loader,
    and the byte loader for one decode and the large tile ("codes"); quant_linear's activation quantized
    in each program's prologue ("fused") or once per launch ("once"), on each activation dtype."""
    profile = simulated_profile(f"sm{arch}")
    variants = {}
    for fmt in ("fp8_e4m3", "int8"):
        kind = _mma(fmt, profile)
        codes = []
        for m, group, aligned in (*((m, g, True) for m in (*DECODE_BM, 4096) for g in (None, 128)),
                                  (1, None, False), (4096, None, False)):
            tile = launch.gemm_tile(m, group)
            stages, _ = launch.gemm_stages(tile, profile.smem_per_block)
            codes.append(launch.gemm_kernel_name(kind, tile, stages, aligned))
        # quant_linear's fused prologue, on each activation dtype (decode tiles only: M <= FUSED_M_MAX)
        tile = launch.gemm_tile(launch.FUSED_M_MAX)
        a_bytes = launch.fused_a_bytes(tile, 7 * 128, 128)
        stages, _ = launch.gemm_stages(tile, profile.smem_per_block, a_bytes)
        fused = [launch.gemm_kernel_name(kind, tile, stages, True, a_type) for a_type in launch._A_TYPE.values()]
        # quantized once per launch, on each decode tile (M <= ONCE_M_MAX) and activation dtype
        once = []
        for m in DECODE_BM:
            tile = launch.gemm_tile(m)
            stages, _ = launch.gemm_stages(tile, profile.smem_per_block)
            once += [launch.gemm_kernel_name(kind, tile, stages, aligned, a_type, once=True)
                     for a_type in launch._A_TYPE.values() for aligned in (True, False)]
        for path, names in (("codes", codes), ("fused", fused), ("once", once)):
            variants[kind, path] = tuple(dict.fromkeys(names))
    return variants


def _gemm_names(arch: int) -> tuple[str, ...]:
    """Every instantiation the launcher makes on this architecture."""
    return tuple(name for names in _gemm_variants(arch).values() for name in names)


def _switches(name: str) -> set[tuple]:
    """What a gemm_kernel instantiation selects: each template argument's value by position, and the
    activation type, loader alignment and ONCE together (the paths by which A reaches shared memory)."""
    args = name[name.index("<") + 1: -1].split(", ")
    return {*enumerate(args), ("A", args[1], args[8], args[9])}


@functools.cache
def _sampled() -> dict[int, tuple[str, ...]]:
    """Per architecture one instantiation of each (MMA kind, path), chosen across the architectures so
    that each of the launcher's switches (`_switches`: tiles, stage counts, loaders, activation dtypes) is
    compiled at least once (`test_the_sample_covers_every_switch`): every path on every architecture,
    not the cross product, whose compiles the GPU suite runs (`test_gemm_paths[every-*]`)."""
    seen, sample = set(), {}
    for arch in ARCHS:
        picked = []
        for names in _gemm_variants(arch).values():
            best = max(names, key=lambda n: len(_switches(n) - seen))  # the first of the best
            seen |= _switches(best)
            picked.append(best)
        sample[arch] = tuple(picked)
    return sample


def _sampled_names(arch: int) -> tuple[str, ...]:
    return _sampled()[arch]


EXPECTED = {
    75: ((MMA_S8_SM75, MMA_F16_SM75), (CP_ASYNC, MMA_S8, MMA_F16, "e4m3")),
    80: ((MMA_S8, MMA_F16, CP_ASYNC), (MMA_S8_SM75, MMA_F16_SM75, "e4m3")),
    86: ((MMA_S8, MMA_F16, CP_ASYNC), (MMA_S8_SM75, MMA_F16_SM75, "e4m3")),
    89: ((MMA_E4M3, MMA_S8, CP_ASYNC), (MMA_S8_SM75, MMA_F16)),
    90: ((MMA_E4M3, MMA_S8, CP_ASYNC), (MMA_S8_SM75, MMA_F16)),
}


def test_sources_and_headers_found():
    # routing.cu's instantiations compile in tests/backends/test_cupy_routing.py.
    assert set(compiler.kernel_files()) == {"epilogue.cu", "gemm.cu", "quant.cu", "producers.cu", "routing.cu"}
    assert compiler.include_dirs(), "no folder with cuda_fp16.h / cuda_bf16.h found"


@pytest.mark.parametrize("names", [_sampled_names, pytest.param(_gemm_names, marks=pytest.mark.gpu)],
                         ids=["sampled", "every"])
@pytest.mark.parametrize("arch", ARCHS)
def test_gemm_paths(arch, names):
    ptx = compiler.compile_source("gemm.cu", arch, names(arch)).ptx.decode()
    present, absent = EXPECTED[arch]
    for instr in present:
        assert instr in ptx, f"sm_{arch}: {instr} missing"
    for instr in absent:
        assert instr not in ptx, f"sm_{arch}: {instr} should not be there"
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx
    assert "atom.global.cas.b32" in ptx and "ld.volatile.global" in ptx  # quantize_once's flags


def test_the_sample_covers_every_switch():
    every = set().union(*(_switches(name) for arch in ARCHS for name in _gemm_names(arch)))
    assert set().union(*(_switches(name) for arch in ARCHS for name in _sampled_names(arch))) == every
    for arch in ARCHS:  # each architecture compiles each path of each MMA kind it runs
        assert len(_sampled_names(arch)) == len(_gemm_variants(arch)) == 2 * 3


@pytest.mark.parametrize("arch", (70, *ARCHS))
@pytest.mark.parametrize("source", ("quant.cu", "epilogue.cu"))
def test_memory_bound_kernels(arch, source):
    if arch not in compiler.supported_archs():
        pytest.skip(f"NVRTC {compiler.nvrtc_version()} has no sm_{arch} (CUDA 13 dropped Volta)")
    ptx = compiler.compile_source(source, arch, QUANT if source == "quant.cu" else EPILOGUE).ptx.decode()
    assert "ld.global.nc.v4.u32" in ptx or "ld.global.v4.u32" in ptx  # 16-byte vector loads
    assert "st.global.v4.u32" in ptx
    assert "div.rn.f32" in ptx and "div.approx" not in ptx and "div.full" not in ptx  # IEEE division only


def _producer_names() -> tuple[str, ...]:
    """The fused producers as their launches instantiate them: the norm for Llama's and DeepSeek's widths
    (bf16, a bf16 weight, FP8; fp32 x with a bf16 weight, INT8, the residual) and a 200-wide fp16 row with
    an fp32 weight (its sum over a narrower vector and one pass); SiLU-and-multiply on each input dtype."""
    names = []
    for x_dtype, w_dtype, qdtype, H, residual in ((torch.bfloat16, torch.bfloat16, torch.float8_e4m3fn, 7168, True),
                                                  (torch.bfloat16, torch.bfloat16, torch.int8, 4096, False),
                                                  (torch.float32, torch.bfloat16, torch.int8, 4096, True),
                                                  (torch.float16, torch.float32, torch.float8_e4m3fn, 200, False)):
        vec = 16 // torch.empty(0, dtype=x_dtype).element_size()
        lanes = producers.group_lanes(H, 128, vec)
        names.append(producers.rms_norm_kernel_name(x_dtype, w_dtype, qdtype, vec, producers.norm_passes(H, vec),
                                                    residual, lanes, 1, 1, 1))
        if H == 200:  # and the block quantizer's path, for groups the lanes do not tile
            team, cache = launch._team(128 // vec, vec)
            names.append(producers.rms_norm_kernel_name(x_dtype, w_dtype, qdtype, vec, producers.norm_passes(H, vec),
                                                        residual, 0, vec, team, cache))
    names += [f"qc::silu_mul_quant_kernel<{t}, {q}, {v}, 16, 1>" for t, v in (("__nv_bfloat16", 8), ("__half", 8),
                                                                              ("float", 4))
              for q in ("qc::Fp8E4M3", "qc::Int8")]
    return tuple(names)


@pytest.mark.parametrize("arch", ARCHS)
def test_producer_kernels(arch):
    """The fused producers compile for every architecture with IEEE square root and division only (their
    rstd is the contract's 1 / sqrt), the butterfly of the norm's sum, and 16-byte vector loads."""
    ptx = compiler.compile_source("producers.cu", arch, _producer_names()).ptx.decode()
    assert "sqrt.rn.f32" in ptx and "sqrt.approx" not in ptx and "rsqrt" not in ptx
    assert "div.rn.f32" in ptx and "div.approx" not in ptx and "div.full" not in ptx
    assert "shfl.sync.bfly.b32" in ptx
    assert "ld.global.nc.v4.u32" in ptx or "ld.global.v4.u32" in ptx


# Issue 11's decode targets (N, K).
DECODE_NK = ((2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168), (7168, 16384), (32768, 512))


@pytest.mark.parametrize("M", (1, 4, 16, 64))
def test_decode_schedule(M):
    """The H100 decode schedule: one row tile holds all M rows (the weight is read once), >= 32 KB
    of weight in flight per CTA with two CTAs in an SM's shared memory, and split-K over whole K
    blocks fills the SMs without a second wave (or there are enough N tiles without it)."""
    profile = simulated_profile("sm90")
    sms = profile.sm_count
    tile = launch.gemm_tile(M)
    stages, smem = launch.gemm_stages(tile, profile.smem_per_block)
    assert math.ceil(M / tile.bm) == 1 and tile.per_sm == 2
    assert (stages - 1) * tile.bn * tile.bk >= 32 * 1024
    assert 2 * (smem + 1024) <= profile.smem_per_block + 1024  # 1 KB reserved per CTA
    for N, K in DECODE_NK:
        kblocks = math.ceil(K / 128)
        per_split, splits = launch.gemm_splits(M, N, K, 128, tile, sms)
        assert (splits - 1) * per_split < kblocks <= splits * per_split
        ctas = math.ceil(N / tile.bn) * splits
        assert ctas >= sms
        assert splits == 1 or ctas <= 2 * sms


def test_requant_groups_fit_the_tile():
    """A re-quantize group never spans two programs: 128-wide groups get a 128-wide decode tile."""
    for M in (1, 16, 33, 64, 65):
        for group in (1, 8, 64, 128):
            assert launch.gemm_tile(M, group).bn >= group


def test_fp8_mma_refused_below_sm89():
    name = launch.gemm_kernel_name("fp8", launch.gemm_tile(4096), 2, True)
    with pytest.raises(compiler.KernelCompileError, match="sm_89"):
        compiler.compile_source("gemm.cu", 80, (name,))


def test_compile_is_cached():
    first = compiler.compile_source("quant.cu", 90, QUANT[:1])
    assert compiler.compile_source("quant.cu", (9, 0), QUANT[:1]) is first
    assert first.lowered[QUANT[0]].startswith("_Z")
