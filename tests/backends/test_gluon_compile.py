"""The Gluon GEMM (`backends/triton/kernels/gluon_gemm.py`) compiles for sm_90 without a GPU, through the
arguments its own launch builds (`gluon_launch.scaled_mm` on CPU tensors, its Launcher replaced by an
offline compile), and its PTX and ptxas report hold the schedule the module describes: wgmma on e4m3
or s8 operands, TMA loads (and TMA stores where the output's rows allow), the partitions' register
budgets, the promotion as FMAs, no spills on the main path and no wgmma serialized by ptxas. Runs
where the installed Triton has Gluon's Hopper API (3.6 on the GPU machine); correctness is the GPU
suite's.

The CPU suite compiles a sample of the configurations that lowers each of the kernel's paths at least
once; the others are marked `GPU` (the GPU suite, `pytest -m gpu`, compiles every one; tests/README.md
lists them). A test's compiles run in one child process without TRITON_INTERPRET: the
interpreter tests set it for the whole session, and the `@triton.jit` helpers the kernel calls are
then interpreter functions, which Gluon cannot compile.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU = pytest.mark.gpu  # compiled in the GPU suite only: a configuration whose paths the sample lowers already


def compile_launch(M, N, K, qdtype, out_dtype="bfloat16", bias=None, activation=None, block=(128, 128),
                   out_quant=None, out_group=128, ue8m0_out=False, config=None, experts=None) -> dict:
    """In this process: run the prepared launch on CPU tensors with its one kernel launch compiled for
    sm_90 instead; return the grid, constexprs, shared memory, PTX instruction counts and ptxas -v report.
    `config`: the fields of a `GluonConfig` (None: the default). `experts`: the grouped GEMM's launch
    (`gluon_launch.grouped_mm`) over that many experts of N×K weights, M rows spread evenly over them."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    from quantcore.backends.triton import gluon_launch
    from quantcore.backends.triton.direct import _kernel_view
    from quantcore.capability import simulated_profile

    compiled = []

    class OfflineLauncher:
        def __init__(self, fn, grid, constants, device, descriptors, fixed=()):
            self.fn, self.grid, self.constants, self.descriptors = fn, grid, dict(constants), descriptors
            self.fixed = tuple(fixed)

        def __call__(self, *args):
            # The tensors in the descriptors' places, described as `Launcher` describes them; the plan's
            # fixed arguments after the call's, as `Launcher` appends them.
            args = [self.descriptors[i](a) if a is not None and i in self.descriptors else a
                    for i, a in enumerate(args + self.fixed)]
            options = {k: self.constants.pop(k) for k in ("num_warps", "enable_fp_fusion")}
            signature, constants = {}, {}
            for name, arg in zip(self.fn.arg_names, map(_kernel_view, args)):  # typed as the JIT types them
                signature[name] = "constexpr" if arg is None else mangle_type(arg)
                if arg is None:
                    constants[name] = None
            for name in self.fn.arg_names[len(args):]:
                signature[name], constants[name] = "constexpr", self.constants[name]
            kernel = triton.compile(GluonASTSource(self.fn, signature, constexprs=constants),
                                    target=GPUTarget("cuda", 90, 32), options=options)
            ptx = kernel.asm["ptx"]
            with tempfile.TemporaryDirectory() as tmp:
                (Path(tmp) / "k.ptx").write_text(ptx)
                log = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name", "sm_90a", f"{tmp}/k.ptx", "-o",
                                      f"{tmp}/k.cubin"], capture_output=True, text=True, check=True)
            scalars = {name: a for name, a in zip(self.fn.arg_names, args) if isinstance(a, (int, float))}
            compiled.append(dict(grid=list(self.grid), constants={k: v for k, v in constants.items() if v is not None},
                                 scalars=scalars, shared=kernel.metadata.shared, ptx=ptx,
                                 ptxas=log.stdout + log.stderr))

    gluon_launch.Launcher = OfflineLauncher
    profile = simulated_profile("sm90")
    qdtype, out_dtype = getattr(torch, qdtype), getattr(torch, out_dtype)
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-100, 100, (M, K), generator=g, dtype=torch.int8)
    b = torch.randint(-100, 100, (N, K), generator=g, dtype=torch.int8)
    if qdtype == torch.float8_e4m3fn:
        a, b = a.view(qdtype), b.view(qdtype)
    kb = -(-K // block[1])
    options = dict(block_n=block[0], block_k=block[1], activation=activation, out_dtype=out_dtype,
                   out_quant=out_quant and getattr(torch, out_quant), out_group=out_group, ue8m0_out=ue8m0_out,
                   eps=1e-4, profile=profile, config=gluon_launch.GluonConfig(**(config or {})))
    a_scale, b_scale = torch.rand(M, kb, generator=g), torch.rand(-(-N // block[0]), kb, generator=g)
    bias = None if bias is None else torch.randn(N if experts is None else (experts, N)).to(getattr(torch, bias))
    if experts is None:
        out = gluon_launch.scaled_mm(a, a_scale, b, b_scale, bias=bias, **options)
    else:
        offsets = torch.tensor([e * M // experts for e in range(experts + 1)], dtype=torch.int32)
        out = gluon_launch.grouped_mm(a, a_scale, b.expand(experts, N, K).contiguous(),
                                      b_scale.expand(experts, *b_scale.shape).contiguous(), offsets, bias=bias,
                                      **options)
    out, scale = out if out_quant else (out, None)
    (launch,) = compiled
    return dict(launch, out_shape=list(out.shape), out_dtype=str(out.dtype), sm_count=profile.sm_count,
                smem_per_block=profile.smem_per_block, scale_shape=None if scale is None else list(scale.shape))


_compiled: dict[str, dict] = {}  # by case: a case that two tests compile in one process is compiled once


def compiled_all(*cases: dict) -> list[dict]:
    """`compile_launch(**case)` of each case not compiled yet in this process, all in one child process
    without TRITON_INTERPRET (one import of torch and Triton for them)."""
    keys = [json.dumps(case, sort_keys=True) for case in cases]
    todo = list(dict.fromkeys(key for key in keys if key not in _compiled))
    if todo:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
        run = subprocess.run([sys.executable, __file__, f"[{', '.join(todo)}]"], env=env, capture_output=True,
                             text=True, timeout=300 * len(todo))
        if run.returncode == 3:
            pytest.skip(run.stdout.strip().splitlines()[-1])
        assert run.returncode == 0, run.stderr[-4000:]
        _compiled.update(zip(todo, json.loads(run.stdout.strip().splitlines()[-1])))
    return [_compiled[key] for key in keys]


def compiled(**case) -> dict:
    return compiled_all(case)[0]


def count(k: dict, pattern: str) -> int:
    return len(re.findall(pattern, k["ptx"]))


def spill_bytes(k: dict) -> int:
    return sum(int(n) for n in re.findall(r"(\d+) bytes spill stores", k["ptxas"]))


def wide_tile(qdtype: str) -> dict:
    """config_for's wide tile at 4096 rows and N = 7168: 128x256 in 64-column sub-tiles."""
    return dict(M=4096, N=7168, qdtype=qdtype, config=dict(block_n=256, sub_n=64, producer_regs=24))


def test_fp8_main_path_lowers_to_the_warp_specialized_schedule():
    k = compiled(M=4096, N=7168, K=2048, qdtype="float8_e4m3fn")
    assert k["out_shape"] == [4096, 7168] and k["out_dtype"] == "torch.bfloat16"
    # Persistent: one program per SM; the pipelined pairs with as many stages as fit beside the TMA store.
    assert k["grid"] == [k["sm_count"]]
    c = k["constants"]
    assert c["PIPELINE"] and c["TMA_OUT"] and c["STAGES"] == 6 and c["OUT"] == "bf16"
    assert k["shared"] <= k["smem_per_block"]
    # Two consumer warpgroups, four m64n128k32 e4m3 wgmmas per K block, at three issue sites (the pair
    # and the odd last block).
    assert count(k, r"wgmma\.mma_async\.sync\.aligned\.m64n128k32\.f32\.e4m3\.e4m3") == 2 * 3 * 4
    assert count(k, r"cp\.async\.bulk\.tensor\.2d\.shared::\w+\.global") == 2  # the producer's A and B tiles
    assert count(k, r"cp\.async\.bulk\.tensor\.2d\.global\.shared") == 2  # each consumer's output tile
    regs = {int(n) for n in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", k["ptx"])}
    assert {232, 40} <= regs  # consumer and producer budgets
    assert count(k, r"fma\.rn\.f32") >= 2 * 3 * 64  # each promotion: one FMA per accumulator element
    # The bf16 output two elements at a time: per pair of a thread's 64, the conversion and its NaN mask.
    assert count(k, r"set\.nan\.u32\.bf16x2") == count(k, r"cvt\.rn\.bf16x2\.f32") == 2 * 64 // 2
    assert spill_bytes(k) == 0
    assert "C7514" not in k["ptxas"] and "C7515" not in k["ptxas"], k["ptxas"]  # no serialized wgmma


def test_int8_with_every_fallback_lowers():
    """INT8 (s8 wgmma into int32), a weight scale block that is not one per tile (no pipelining), a
    K tail that TMA cannot address (staged copies), an output row of 2002 bytes (masked stores instead
    of TMA), a bias and an activation."""
    k = compiled(M=300, N=1001, K=1000, qdtype="int8", out_dtype="float16", bias="bfloat16", activation="gelu",
                 block=[96, 64])
    assert k["out_shape"] == [300, 1001] and k["out_dtype"] == "torch.float16"
    assert k["grid"] == [3 * 8]  # fewer tiles than SMs
    c = k["constants"]
    assert not c["PIPELINE"] and not c["TMA_OUT"]
    assert c["SCALE_BN"] == 96 and c["BIAS"] == "bf16" and c["ACTIVATION"] == "gelu" and c["OUT"] == "fp16"
    assert count(k, r"wgmma\.mma_async\.sync\.aligned\.m64n128k32\.s32\.s8\.s8") == 2 * 2  # two k32 steps per 64
    assert count(k, r"cp\.async\.bulk\.tensor\.2d\.global\.shared") == 0
    assert k["shared"] <= k["smem_per_block"]


# Re-quantized outputs lower on the CPU in the tests below: on the default tile (test_int8_codes_come_two_at_a_time_...),
# on the wide tile without IEEE division (test_a_re_quantized_group_over_column_sub_tiles_lowers), with a group
# crossing N (test_a_last_column_tile_of_skipped_sub_tiles_lowers) and ue8m0 scales (..._with_masked_stores_lowers).
@pytest.mark.parametrize("qdtype, group, ue8m0, config", [pytest.param("float8_e4m3fn", 128, False, None, marks=GPU),
                                                           pytest.param("int8", 32, True, None, marks=GPU)])
def test_a_re_quantized_output_lowers_on_the_main_path(qdtype, group, ue8m0, config):
    """Codes per 1×group through the TMA store, scales with plain stores, from the MMA's registers (the
    default without an activation). (With a bias and SiLU too, Triton 3.6 spills nothing either; 3.9
    spills ~0.4 KiB there, as it does for a bf16 output.)"""
    k = compiled(M=4096, N=2112, K=7168, qdtype=qdtype, out_quant=qdtype, out_group=group, ue8m0_out=ue8m0,
                 config=config)
    assert k["out_shape"] == [4096, 2112] and k["out_dtype"] == f"torch.{qdtype}"
    assert k["scale_shape"] == [4096, -(-2112 // group)]
    c = k["constants"]
    assert c["OUT"] == ("fp8" if qdtype == "float8_e4m3fn" else "int8") and c["OUT_GROUP"] == group
    assert c["UE8M0_OUT"] == ue8m0 and c["PIPELINE"] and c["TMA_OUT"] and c["STAGES"] == 6
    # Where a group crosses N (2112 is not a multiple of 128), one select an element keeps its columns past N
    # out of the amax; else none (rows past M need none: their groups are their own and never stored).
    assert c["GROUP_TAIL"] == (2112 % group != 0)
    assert (count(k, r"selp\.f32") >= 2 * 64) == c["GROUP_TAIL"]
    assert k["shared"] <= k["smem_per_block"]
    assert count(k, r"wgmma\.mma_async\.sync\.aligned\.m64n128k32") == 2 * 3 * 4
    assert count(k, r"cp\.async\.bulk\.tensor\.2d\.global\.shared") == 2  # each consumer's codes
    # Each consumer thread divides its 64 elements by their group's scale through one reciprocal per group and
    # row (`quant.reciprocal`: an approximation refined by FMAs, with no IEEE division's range check and slow
    # path, nor one for the scale itself, `quant.block_scale`) and two FMAs per element (`quant.divide`), or, by
    # a power-of-two (ue8m0) scale, one product; FP8 codes come from the conversion instruction, two per
    # instruction.
    assert count(k, r"div\.rn\.f32") == 0
    assert count(k, r"rcp\.approx\.ftz\.f32") == 2 * (128 // group) * 2  # consumers × a tile's groups × rows
    assert (count(k, r"fma\.rn\.f32") >= 2 * 3 * 64 + 2 * 2 * 64) != ue8m0
    assert count(k, r"cvt\.rn\.satfinite\.e4m3x2\.f32") == (2 * 32 if qdtype == "float8_e4m3fn" else 0)
    assert count(k, r"st\.global\.b32") >= 2  # the scales (the codes leave through TMA)
    assert spill_bytes(k) == 0
    assert "C7514" not in k["ptxas"] and "C7515" not in k["ptxas"], k["ptxas"]


@pytest.mark.parametrize("qdtype", ["float8_e4m3fn", pytest.param("int8", marks=GPU)])  # INT8 codes: below
def test_a_re_quantized_group_over_column_sub_tiles_lowers(qdtype):
    """config_for's wide tile at 4096 rows for groups of 128 (128x256 in 64-column sub-tiles, two sub-tiles a
    group): codes through one TMA store per sub-tile and consumer; per group and row one scale and one
    reciprocal (no IEEE division: `quant.block_scale`'s by a known qmax and `quant.reciprocal`, two rows a
    thread); one scale store per group and row; spills as the plain wide tile's (`test_column_sub_tiles_lower`)."""
    k = compiled(**wide_tile(qdtype), K=2048, out_quant=qdtype, out_group=128)
    assert k["scale_shape"] == [4096, 56]
    c = k["constants"]
    assert c["OUT_GROUP"] == 128 and c["BLOCK_N"] == 256 and c["TMA_OUT"] and c["PIPELINE"]
    assert count(k, r"cp\.async\.bulk\.tensor\.2d\.global\.shared") == 2 * 4
    assert count(k, r"div\.rn\.f32") == 0
    assert count(k, r"rcp\.approx\.ftz\.f32") == 2 * 2 * 2  # consumers × groups × rows a thread
    assert count(k, r"st\.global\.b32") == 2 * 2 * 2
    assert count(k, r"cvt\.rn\.satfinite\.e4m3x2\.f32") == (2 * 4 * 16 if qdtype == "float8_e4m3fn" else 0)
    assert k["constants"]["PRELOAD"] == "stores"
    assert spill_bytes(k) <= 48
    assert "C7514" not in k["ptxas"] and "C7515" not in k["ptxas"], k["ptxas"]


# The wide tile with a bias lowers on the CPU in test_a_staggered_wide_tile_lowers_where_a_tile_fits_the_ring.
@pytest.mark.parametrize("out_quant", [pytest.param(None, marks=GPU), pytest.param("float8_e4m3fn", marks=GPU)])
def test_a_bias_on_the_wide_tile_is_staged_by_the_producer(out_quant):
    """The wide tile's bias comes through shared memory from the producer, which converts it to fp32: four
    stages still fit beside two tiles' of it, and the consumers spill no more than the plain wide tile's
    addresses (`test_column_sub_tiles_lower`). Loaded by the consumers at the tile's start and held through
    the main loop, it was spilled right after each load (56 bytes, docs/bench/round22/bias_spill.txt)."""
    k = compiled(M=4096, N=32768, K=512, qdtype="float8_e4m3fn", bias="bfloat16", out_quant=out_quant,
                 config=dict(block_n=256, sub_n=64, producer_regs=24))
    c = k["constants"]
    assert c["BIAS"] == "bf16" and c["BLOCK_N"] == 256 and c["TMA_OUT"] and c["STAGES"] == 4
    assert k["shared"] <= k["smem_per_block"]
    assert count(k, r"ld\.global(\.\w+)*\.b16") == 256 // 32  # the producer warp's: BLOCK_N over its 32 lanes
    assert spill_bytes(k) <= 32
    assert "C7514" not in k["ptxas"] and "C7515" not in k["ptxas"], k["ptxas"]


# The unstaggered wide tile (K = 1024) lowers on the CPU in test_a_last_column_tile_of_skipped_sub_tiles_lowers.
@pytest.mark.parametrize("K, stagger", [(512, True), pytest.param(1024, False, marks=GPU)])
def test_a_staggered_wide_tile_lowers_where_a_tile_fits_the_ring(K, stagger):
    """Asked for (as config_for does at short K), the consumers are staggered where a tile's K blocks fit the four
    stages (K = 512), with one more barrier and no more spilled than the unstaggered wide tile with a bias
    (`test_a_bias_on_the_wide_tile_is_staged_by_the_producer`); where they do not (K = 1024), the launch keeps the
    unstaggered kernel, in which consumer 1 would wait for consumer 0's whole first tile and it for consumer 1."""
    k = compiled(M=4096, N=32768, K=K, qdtype="int8", bias="bfloat16", out_quant="int8",
                 config=dict(block_n=256, sub_n=64, producer_regs=24, stagger=True))
    c = k["constants"]
    assert c["STAGES"] == 4 and c["STAGGER"] == stagger
    assert count(k, r"mbarrier\.init\.shared(::cta)?\.b64") == 4 + 4 + 2 * 4 + stagger
    assert spill_bytes(k) <= 32
    assert "C7514" not in k["ptxas"] and "C7515" not in k["ptxas"], k["ptxas"]


@pytest.mark.parametrize("qdtype, out_quant, bias, spills", [
    pytest.param("float8_e4m3fn", None, None, 48, marks=GPU),  # PRELOAD "loop"; the two below "none"
    # A second copy of the re-quantized epilogue, for the last column's loop, and ptxas keeps a few values on the
    # stack (20 and 36 bytes under Triton 3.9's ptxas; 204 and 184, a few pointers inside the main loop, before the
    # walk's tile counts came from one function, docs/bench/round26/walk_ab.txt): measured faster all the same than the
    # default tile at 4096 rows and than the tile computed whole at 16384 (docs/bench/round25/tail_probe.txt).
    pytest.param("float8_e4m3fn", "float8_e4m3fn", None, 256, marks=GPU),
    ("int8", "int8", "bfloat16", 256),
])
def test_a_last_column_tile_of_skipped_sub_tiles_lowers(qdtype, out_quant, bias, spills):
    """N = 2112 on 128×256 in 64-column sub-tiles: the last column's tiles in loops of their own (`TAIL_NSUB` 1), in
    which the producer loads A and one B box, each consumer runs one sub-tile's wgmmas (two K blocks a step, the
    pair and the odd last block, as a tile of one sub-tile does) and stores with masks; the whole tiles as before:
    A and four B boxes, four sub-tiles' wgmmas (twice where the plain output takes K block 0 out of the loop,
    `PRELOAD`), a TMA store per sub-tile and consumer."""
    k = compiled(M=4096, N=2112, K=7168, qdtype=qdtype, out_quant=out_quant, out_group=128, bias=bias,
                 config=dict(block_n=256, sub_n=64, producer_regs=24))
    c = k["constants"]
    # With N's last column loop only a plain output loads K block 0's scales ahead (`gluon_launch.preload`).
    assert c["TAIL_NSUB"] == 1 and c["TMA_OUT"] and c["PRELOAD"] == ("loop" if out_quant is None else "none")
    mma = "f32.e4m3.e4m3" if qdtype == "float8_e4m3fn" else "s32.s8.s8"
    assert count(k, r"cp\.async\.bulk\.tensor\.2d\.shared::\w+\.global") == (1 + 4) + (1 + 1)
    peeled = c["PRELOAD"] != "none"
    assert count(k, rf"wgmma\.mma_async\.sync\.aligned\.m64n64k32\.{mma}") == 2 * ((1 + peeled) * 4 * 4 + 3 * 4)
    assert count(k, r"cp\.async\.bulk\.tensor\.2d\.global\.shared") == 2 * 4
    assert spill_bytes(k) <= spills
    assert "C7514" not in k["ptxas"] and "C7515" not in k["ptxas"], k["ptxas"]


# Each PRELOAD lowers on the CPU: "loop" in test_column_sub_tiles_lower, "stores" in
# test_a_re_quantized_group_over_column_sub_tiles_lowers, "none" in test_a_last_column_tile_of_skipped_sub_tiles_lowers.
@pytest.mark.parametrize("qdtype", [pytest.param("float8_e4m3fn", marks=GPU), pytest.param("int8", marks=GPU)])
def test_k_block_0s_scales_are_loaded_during_the_tile_before_where_that_measured_faster(qdtype):
    """On the wide tile a plain output's K block 0 runs out of the K loop on scales loaded once the tile before's
    main loop was done, a re-quantized output's on scales loaded once its stores were issued (`PRELOAD`): the K
    loop's wgmmas once more, and its scale loads twice more (the first tile's and each next tile's). With a bias, or
    re-quantized where the consumers are staggered (K = 512), every K block in the loop
    (`gluon_launch.preload`)."""
    wide, rq = wide_tile(qdtype), dict(out_quant=qdtype, out_group=128)
    plain, requantized, *others = compiled_all(
        dict(wide, K=2048), dict(wide, K=2048, **rq), dict(wide, K=2048, bias="bfloat16"),
        dict(wide, K=2048, bias="bfloat16", **rq), dict(wide, K=512, config=dict(wide["config"], stagger=True), **rq))
    mma = r"wgmma\.mma_async\.sync\.aligned\.m64n64k32"
    scale_loads = r"ld\.global\.b32"  # the activation and weight scales: fp32 (a bf16 bias is 16-bit)
    assert plain["constants"]["PRELOAD"] == "loop" and requantized["constants"]["PRELOAD"] == "stores"
    assert others[-1]["constants"]["STAGGER"] and all(k["constants"]["PRELOAD"] == "none" for k in others)
    # Without K block 0 ahead of the loop, a re-quantized output's kernel is told that K >= 1 (`k_positive`).
    assert [k["constants"]["K_POSITIVE"] for k in (plain, requantized, *others)] == [False, False, False, True, True]
    for k in others:
        assert count(plain, mma) == count(requantized, mma) == 2 * count(k, mma) == 2 * 2 * 4 * 4
        assert count(plain, scale_loads) == count(requantized, scale_loads) == 3 * count(k, scale_loads)
        assert count(k, scale_loads) == 2 * (2 + 4)


def test_int8_codes_come_two_at_a_time_as_fp8_codes_do():
    """A re-quantized INT8 output on the wide tile encodes its codes a pair at a time (`quant._INT8X2`: cvt.rni and
    cvt.pack, one packed conversion under ptxas for sm_90a), as many conversions as the FP8 output's e4m3x2 ones,
    and none by the float route (1.5·2^23 added)."""
    fp8, int8 = compiled_all(*(dict(M=4096, N=7168, K=2048, qdtype=q, out_quant=q, out_group=128)
                               for q in ("float8_e4m3fn", "int8")))
    pairs = count(fp8, r"cvt\.rn\.satfinite\.e4m3x2\.f32")
    assert pairs >= 64 and count(int8, r"cvt\.pack\.sat\.s8\.s32\.b32") == pairs
    assert count(int8, r"cvt\.rni\.s32\.f32") == 2 * pairs
    assert count(int8, r"0f4B400000") == 0
    assert spill_bytes(int8) == 0


def test_a_re_quantized_output_staged_without_an_activation_lowers():
    """Asked for (epi_rows), INT8 codes without an activation go through the epilogue partition: the codes
    and scales with masked stores, no TMA store, a stage fewer, nothing spilled."""
    k = compiled(M=4096, N=2112, K=7168, qdtype="int8", out_quant="int8", out_group=128, config=dict(epi_rows=8))
    c = k["constants"]
    assert c["EPI_ROWS"] == 8 and c["ACTIVATION"] == "none" and not c["TMA_OUT"] and c["STAGES"] == 5
    assert c["CONSUMER_REGS"] == 216 and k["shared"] <= k["smem_per_block"]
    assert count(k, r"cp\.async\.bulk\.tensor\.2d\.global\.shared") == 0
    assert spill_bytes(k) == 0


def test_a_re_quantized_output_with_masked_stores_lowers():
    """Rows of 1000 codes (not 16-byte aligned: masked stores), tails in M, N and K, UE8M0 scales."""
    k = compiled(M=300, N=1000, K=1040, qdtype="int8", out_quant="int8", out_group=64, ue8m0_out=True)
    assert k["out_shape"] == [300, 1000] and k["scale_shape"] == [300, 16]
    assert not k["constants"]["TMA_OUT"] and k["constants"]["PIPELINE"]
    assert count(k, r"cp\.async\.bulk\.tensor\.2d\.global\.shared") == 0
    assert spill_bytes(k) == 0


# Each tile: (the format the CPU suite compiles it in, None: the GPU suite's only; it compiles both), config,
# stages, the consumers' registers, the spills allowed. The CPU's: three sub-tiles, no power of two; four lower
# on the CPU in test_a_re_quantized_group_over_column_sub_tiles_lowers.
SUB_TILES = {
    "128x128/64": (None, dict(sub_n=64), 6, 232, 0),
    "128x192/64": ("int8", dict(block_n=192, sub_n=64), 4, 232, 0),
    # ptxas keeps a few of the epilogue's shared-memory addresses and scale pointers on the stack, reloaded once per
    # tile (read in the SASS: nothing is spilled in the K loop; 48 bytes under Triton 3.9's ptxas, 28 under 3.6's).
    "128x256/64": (None, dict(block_n=256, sub_n=64, producer_regs=24), 4, 240, 48),
}


@pytest.mark.parametrize("qdtype, config, stages, regs, spills", [
    pytest.param(qdtype, *tile, id=f"{qdtype}-{name}", marks=() if qdtype == on_cpu else GPU)
    for name, (on_cpu, *tile) in SUB_TILES.items() for qdtype in ("float8_e4m3fn", "int8")])
def test_column_sub_tiles_lower(qdtype, config, stages, regs, spills):
    """Wide tiles in 64-column sub-tiles: B in one TMA box per sub-tile, one m64n64k32 wgmma per 32 of K,
    sub-tile and consumer (twice: K block 0, whose scales were loaded during the tile before, and the K loop),
    one promotion FMA per element, one TMA store per sub-tile and consumer."""
    k = compiled(M=4096, N=6144, K=2048, qdtype=qdtype, config=config)  # N a whole number of each tile
    nsub = config.get("block_n", 128) // 64
    c = k["constants"]
    assert c["BLOCK_N"] == 64 * nsub and c["PIPELINE"] and c["TMA_OUT"] and c["STAGES"] == stages
    assert c["PRELOAD"] == "loop"
    assert k["shared"] <= k["smem_per_block"]
    mma = "f32.e4m3.e4m3" if qdtype == "float8_e4m3fn" else "s32.s8.s8"
    assert count(k, rf"wgmma\.mma_async\.sync\.aligned\.m64n64k32\.{mma}") == 2 * 2 * nsub * 4
    assert count(k, r"cp\.async\.bulk\.tensor\.2d\.shared::\w+\.global") == 1 + nsub
    assert count(k, r"cp\.async\.bulk\.tensor\.2d\.global\.shared") == 2 * nsub
    assert count(k, r"fma\.rn\.f32") >= 2 * nsub * 32
    assert {regs, config.get("producer_regs", 40)} <= {
        int(n) for n in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", k["ptx"])}
    assert spill_bytes(k) <= spills
    assert "C7514" not in k["ptxas"] and "C7515" not in k["ptxas"], k["ptxas"]


@pytest.mark.parametrize("qdtype, out_quant, config", [pytest.param("float8_e4m3fn", None, None, marks=GPU),
                                                      ("int8", "int8", None),
                                                      pytest.param("float8_e4m3fn", None, dict(epi_rows=32), marks=GPU)])
def test_an_activation_lowers_to_the_staged_epilogue(qdtype, out_quant, config):
    """With an activation the epilogue goes through shared memory, EPI_ROWS rows at a time in a loop:
    each consumer's fp32 sub-tile stored once (st.shared.v2 from the MMA layout), handed over to the
    epilogue partition (4 more warps, 56 registers a thread; the producer 24, the consumers 216), read
    back as one step's rows (ld.shared.v4, four columns a thread) inside the loops of each consumer's
    own share and of the partition's (one per consumer: four copies of the loop), the activation's code
    there instead of unrolled over a thread's 64 elements; barriers of a partition's own 128 threads
    around them; masked stores; a stage fewer for the fp32 buffers. At 14 tiles a program of 16 K
    blocks each consumer keeps 32 rows (`own_rows_for`), in steps of `rows`."""
    k = compiled(M=4096, N=7168, K=2048, qdtype=qdtype, bias="bfloat16", activation="gelu", out_quant=out_quant,
                 config=config)
    c = k["constants"]
    rows = (config or {}).get("epi_rows", 8)
    assert c["EPI_ROWS"] == rows and not c["TMA_OUT"] and c["STAGES"] == 5 and c["PIPELINE"]
    assert k["scalars"]["own_steps"] == 32 // rows
    assert k["shared"] <= k["smem_per_block"]
    regs = {int(n) for n in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", k["ptx"])}
    assert c["CONSUMER_REGS"] == 216 and {216, 24, 56} <= regs
    assert count(k, r"st\.shared\.v2\.b32") >= 2 * 32
    assert count(k, r"ld\.shared\.v4\.b32") == 4 * rows // 4
    assert count(k, r"mbarrier\.arrive") >= 2 + 2 + 2  # the ring's releases, the hand-overs, the buffers freed
    assert count(k, r"cp\.async\.bulk\.tensor\.2d\.global\.shared") == 0
    assert count(k, r"bar\.sync\s+\d+, 128") >= 2 * 2 + 2
    # The erf's one exponential per element of one step (`rows` a thread), in each copy of the loop.
    assert count(k, r"ex2\.approx") == 4 * rows
    # 32 rows a step hold 32 elements a thread: the partition's 56 registers then spill a few words (128
    # bytes on Triton 3.6 since the activations negate as t · -1.0 for the sign of zero).
    assert spill_bytes(k) <= (0 if rows == 8 else 128)


# bf16's six stages: test_fp8_main_path_lowers_to_the_warp_specialized_schedule (at 4096 rows).
@pytest.mark.parametrize("out_dtype, stages", [pytest.param("bfloat16", 6, marks=GPU), ("float32", 5)])
def test_stages_fill_shared_memory(out_dtype, stages):
    k = compiled(M=512, N=2112, K=7168, qdtype="float8_e4m3fn", out_dtype=out_dtype)
    assert k["constants"]["STAGES"] == stages and k["shared"] <= k["smem_per_block"]


@pytest.mark.parametrize("qdtype, M, extra", [
    ("float8_e4m3fn", 2048, {}),  # the default tile
    pytest.param("int8", 4096, dict(bias="bfloat16", out_quant="int8"), marks=GPU),  # wide, bias staged, re-quantized
    pytest.param("float8_e4m3fn", 4096, dict(bias="bfloat16", activation="silu"), marks=GPU),  # the staged epilogue
])
def test_the_grouped_gemm_lowers_to_the_dense_schedule_with_masked_stores(qdtype, M, extra):
    """`gluon_launch.grouped_mm` over 256 experts: the dense kernel's tile and main loop (its TMA loads, one box of
    A and one of B a sub-tile, its wgmmas), the expert of each tile found by a scan whose reductions stay in each
    warp (shuffles and warp reductions: no more shared-memory stores or barriers than the dense kernel's), the output
    stored with masks instead of TMA (a box would cross into the next expert's rows). With the staged epilogue ptxas
    keeps one value a partition on the stack (16 bytes, Triton 3.6 and 3.9), reloaded once a tile, outside every K
    loop (read in the SASS); the wide tile of the bias and re-quantized output spills nothing."""
    grouped, dense = compiled_all(*(dict(M=M, N=4096, K=7168, qdtype=qdtype, experts=experts, **extra)
                                    for experts in (256, None)))
    c = grouped["constants"]
    assert c["E_PAD"] == 256 and not c["TMA_OUT"] and c["TAIL_NSUB"] == 0 and dense["constants"]["E_PAD"] == 0
    assert grouped["grid"] == [grouped["sm_count"]] and grouped["out_shape"] == [M, 4096]
    assert {k: v for k, v in c.items() if k not in ("E_PAD", "TMA_OUT", "STAGES")} == \
        {k: v for k, v in dense["constants"].items() if k not in ("E_PAD", "TMA_OUT", "STAGES")}
    wgmma = r"wgmma\.mma_async\.sync\.aligned"
    assert count(grouped, wgmma) == count(dense, wgmma) > 0
    tma_load, tma_store = r"cp\.async\.bulk\.tensor\.2d\.shared::\w+\.global", r"cp\.async\.bulk\.tensor\.2d\.global\.shared"
    assert count(grouped, tma_load) == count(dense, tma_load) and count(grouped, tma_store) == 0
    assert count(grouped, r"shfl\.sync|redux\.sync") > count(dense, r"shfl\.sync|redux\.sync")
    for pattern in (r"st\.shared", r"bar\.sync|barrier\.sync"):
        assert count(grouped, pattern) <= count(dense, pattern), pattern
    assert spill_bytes(grouped) <= (0 if not extra else 32)
    assert "C7514" not in grouped["ptxas"] and "C7515" not in grouped["ptxas"], grouped["ptxas"]


if __name__ == "__main__":  # the child process of `compiled`
    try:
        import triton.experimental.gluon.language.nvidia.hopper  # noqa: F401

        import quantcore.backends.triton.gluon_launch  # noqa: F401
    except (ImportError, AttributeError) as exc:  # no Gluon, or one without the pieces the kernel uses
        print(f"the Gluon GEMM does not import with this Triton: {exc!r}")
        sys.exit(3)
    print(json.dumps([compile_launch(**case) for case in json.loads(sys.argv[1])]))
