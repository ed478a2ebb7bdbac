"""The Gluon GEMM (`triton[gluon]`, sm_90) forced on the GPU parity suite's shapes and epilogues, against
the torch reference with the contract's tolerances: DeepSeek-V3 shapes with tails in M, N and K (K
not a multiple of 16 included), weight scale blocks that are not one per tile, bias and activations,
the non-finite confinement, quant_linear bit for bit its two ops, and a re-quantized output bit for bit
act_quant of its fp32 result. Skips, with the registry's reasons, where the variant cannot run (not sm_90, or a
Triton without Gluon's Hopper API).

Run on a GPU machine: `python3 -m pytest -m gpu tests/gpu/test_gluon.py`.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from helpers import activation_inputs, check_activation, tail_gemm_operands
from quantcore import capability, ops
from quantcore.errors import InvalidInputError
from quantcore.definitions.tolerances import gemm_tolerance, rel_error

from test_parity import FMTS, GEMM_SHAPES, gemm_case, rand, run, same_q, same_scale

pytestmark = pytest.mark.gpu

GLUON = "triton[gluon]"


def gluon(fn, *args, **kwargs):
    """fn forced onto the Gluon variant on this GPU (skips with its reasons where it cannot run)."""
    return run(GLUON, None, fn, *args, **kwargs)


def tolerance(qdtype, out_dtype) -> float:
    # FP8 wgmma accumulates within a K block at reduced precision (the variant declares it); INT8 is exact.
    return gemm_tolerance(FMTS[qdtype], out_dtype, exact_accumulation=qdtype == torch.int8)


@pytest.mark.parametrize("qdtype", list(FMTS))
@pytest.mark.parametrize("mnk", GEMM_SHAPES + [(300, 1000, 1000)],
                         ids=lambda s: "x".join(map(str, s)))
def test_scaled_mm_parity_shapes(qdtype, mnk):
    a, a_s, b, b_s, ref = gemm_case(*mnk, qdtype)
    for out_dtype in (torch.float32, torch.bfloat16):
        out = gluon(ops.scaled_mm, a, a_s, b, b_s, out_dtype=out_dtype)
        assert out.dtype == out_dtype and out.shape == ref.shape
        assert not out.isnan().any()
        assert rel_error(out, ref) <= tolerance(qdtype, out_dtype), out_dtype
        # Later calls go through the direct launcher: the same kernel, the same result.
        assert torch.equal(gluon(ops.scaled_mm, a, a_s, b, b_s, out_dtype=out_dtype), out)


@pytest.mark.parametrize("qdtype", list(FMTS))
@pytest.mark.parametrize("block", [(64, 128), (96, 64), (128, 32), (256, 128)], ids=str)
def test_weight_scale_blocks_other_than_one_per_tile(qdtype, block):
    m, n, k = 600, 1000, 1040
    a, a_s = ops.act_quant(rand((m, k), seed=2), dtype=qdtype, group_size=block[1], backend="torch")
    b, b_s = ops.weight_quant(rand((n, k), seed=3), dtype=qdtype, block_size=block, backend="torch")
    ref = ops.scaled_mm(a, a_s, b, b_s, block_size=block, out_dtype=torch.float32, backend="torch")
    out = gluon(ops.scaled_mm, a, a_s, b, b_s, block_size=block, out_dtype=torch.float32)
    assert rel_error(out, ref) <= tolerance(qdtype, torch.float32)


@pytest.mark.parametrize("qdtype", list(FMTS))
@pytest.mark.parametrize("activation", [None, "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("mnk", [(64, 2112, 7168), (7, 129, 200), (4096, 7168, 2048)],
                         ids=lambda s: "x".join(map(str, s)))
def test_epilogues(qdtype, activation, mnk):
    a, a_s, b, b_s, _ = gemm_case(*mnk, qdtype)
    bias = rand((mnk[1],), seed=4)
    ref = ops.scaled_mm(a, a_s, b, b_s, bias=bias, activation=activation, out_dtype=torch.float32, backend="torch")
    for out_dtype in (torch.float32, torch.float16, torch.bfloat16):
        out = gluon(ops.scaled_mm, a, a_s, b, b_s, bias=bias, activation=activation, out_dtype=out_dtype)
        if out_dtype == torch.float16:
            # The data's per-row spread puts some large-shape outputs beyond fp16's 65504: there the
            # output is the reference's overflow (±inf), elsewhere within tolerance. A margin around
            # the limit, where rounding may go either way, is left out.
            big = ref.abs() > 70000
            assert torch.equal(out[big].float(), ref[big].sign() * torch.inf)
            out, ref_in = out[ref.abs() < 60000], ref[ref.abs() < 60000]
        else:
            ref_in = ref
        assert rel_error(out, ref_in) <= tolerance(qdtype, out_dtype), out_dtype
    fp32_bias = gluon(ops.scaled_mm, a, a_s, b, b_s, bias=bias.float(), activation=activation, out_dtype=torch.float32)
    assert rel_error(fp32_bias, ref) <= tolerance(qdtype, torch.float32)


@pytest.mark.parametrize("qdtype", list(FMTS))
@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "silu"])
def test_activation_negative_tail(qdtype, activation):
    """The activation's input is exactly the bias (a zero accumulator): every value within the
    contract's activation tolerance of the float64 oracle."""
    x = activation_inputs()
    x = x[x != 0][::3]
    x = x[: x.numel() // 16 * 16].contiguous().cuda()
    out = gluon(ops.scaled_mm, *tail_gemm_operands(x, qdtype, block=128), bias=x, activation=activation,
                out_dtype=torch.float32)
    assert not out.isnan().any()
    for row in out.cpu():
        check_activation(row, x.cpu(), activation)


@pytest.mark.parametrize("qdtype", list(FMTS))
def test_non_finite_blocks_stay_confined(qdtype):
    """A NaN in one activation block and an Inf in one weight block make exactly the reference's
    outputs non-finite; the others agree with it."""
    x, w = rand((300, 1000), torch.float32, seed=5), rand((1000, 1000), torch.float32, seed=6)
    x[17, 300], w[513, 900] = float("nan"), float("inf")
    a, a_s = ops.act_quant(x, dtype=qdtype, backend="torch")
    b, b_s = ops.weight_quant(w, dtype=qdtype, backend="torch")
    ref = ops.scaled_mm(a, a_s, b, b_s, out_dtype=torch.float32, backend="torch")
    out = gluon(ops.scaled_mm, a, a_s, b, b_s, out_dtype=torch.float32)
    finite = ref.isfinite()
    assert not finite.all() and torch.equal(out.isfinite(), finite)
    assert rel_error(out[finite], ref[finite]) <= tolerance(qdtype, torch.float32)


@pytest.mark.parametrize("qdtype", list(FMTS))
@pytest.mark.parametrize("m", [3, 1000])
def test_quant_linear_is_its_two_ops(qdtype, m):
    x = rand((m, 7168), seed=7)
    w, w_s = ops.weight_quant(rand((2112, 7168), seed=8), dtype=qdtype, backend="torch")
    bias = rand((2112,), seed=9)
    out = gluon(ops.quant_linear, x, w, w_s, bias, activation="silu")
    a, a_s = ops.act_quant(x, dtype=qdtype, backend="triton")
    assert torch.equal(out, gluon(ops.scaled_mm, a, a_s, w, w_s, bias=bias, activation="silu"))


@pytest.mark.parametrize("qdtype", list(FMTS))
@pytest.mark.parametrize("scale_fmt", ["fp32", "ue8m0"])
@pytest.mark.parametrize("mnk, group", [((4096, 2112, 7168), 128), ((300, 1000, 1040), 64), ((520, 264, 7296), 32),
                                        ((300, 1024, 1000), 64)],
                         ids=lambda c: "x".join(map(str, c)) if isinstance(c, tuple) else str(c))
def test_re_quantized_output_is_act_quant_of_the_fp32_result(qdtype, scale_fmt, mnk, group):
    """Codes and scales of a re-quantized output (bias and activation before it) equal act_quant's of the
    kernel's own fp32 result, on the Gluon kernel and on the tiled Triton kernel: the same formulas on the
    same fp32 values. Tails in M, N (masked stores where rows are not 16-byte aligned) and K, groups crossing N
    and not (then nothing is masked before the amax: rows past M hold their own groups). (The two
    kernels' fp32 results differ where the tiled one splits K: 300 and 520 rows on sm_90.)"""
    a, a_s, b, b_s, _ = gemm_case(*mnk, qdtype)
    epilogue = dict(bias=rand((mnk[1],), seed=4), activation="silu")
    requant = dict(out_quant=qdtype, out_group_size=group, out_scale_fmt=scale_fmt)
    for backend in (GLUON, "triton"):
        f32 = run(backend, None, ops.scaled_mm, a, a_s, b, b_s, out_dtype=torch.float32, **epilogue)
        q, s = run(backend, None, ops.scaled_mm, a, a_s, b, b_s, **epilogue, **requant)
        assert q.dtype == qdtype and q.shape == f32.shape and s.shape == (mnk[0], -(-mnk[1] // group))
        own_q, own_s = ops.act_quant(f32, dtype=qdtype, group_size=group, scale_fmt=scale_fmt, backend="triton")
        assert same_q(q, own_q) and same_scale(s, own_s), backend


@pytest.mark.parametrize("qdtype", list(FMTS))
def test_re_quantized_subnormal_scales_are_act_quant_of_the_fp32_result(qdtype):
    """With an eps that allows scales below 2^-64 (1e-40: the launches compile `quant.divide`'s rescaling in,
    TINY_SCALES) and activation scales times 2^-130, groups' scales are subnormal; the Gluon kernel's codes
    and scales (the wide tile, groups over two sub-tiles) and the tiled kernel's still equal act_quant's of
    their own fp32 result. Without the rescaling the reciprocals overflow."""
    a, a_s, b, b_s, _ = gemm_case(4096, 7168, 2048, qdtype)
    a_s = a_s * 2.0**-130
    for backend in (GLUON, "triton"):
        f32 = run(backend, None, ops.scaled_mm, a, a_s, b, b_s, out_dtype=torch.float32, eps=1e-40)
        q, s = run(backend, None, ops.scaled_mm, a, a_s, b, b_s, out_quant=qdtype, out_group_size=128, eps=1e-40)
        own_q, own_s = ops.act_quant(f32, dtype=qdtype, group_size=128, eps=1e-40, backend="triton")
        assert bool((own_s < 2.0**-126).any()), backend  # subnormal scales, whose reciprocals overflow fp32
        assert same_q(q, own_q) and same_scale(s, own_s), backend


@pytest.mark.parametrize("qdtype", list(FMTS))
def test_re_quantized_groups_over_sub_tiles_confine_non_finite_values(qdtype):
    """Where config_for picks a wide tile for a re-quantized output (4096 rows, N a multiple of 256: 128×256 in
    64-column sub-tiles, groups of 128 over two of them), codes and scales equal act_quant's of the
    kernel's fp32 result, with a NaN bias in one sub-tile's column, an infinite activation scale in one row
    and a NaN one in another: each group holding one is non-finite as a whole, the others not."""
    a, a_s, b, b_s, _ = gemm_case(4096, 4096, 2560, qdtype)
    a_s = a_s.clone()  # gemm_case's tensors are shared between tests
    a_s[5, 2], a_s[2000, 0] = float("inf"), float("nan")
    bias = rand((4096,), seed=4)
    bias[700] = float("nan")  # column 700: the first sub-tile (640-703) of the group of columns 640-767
    f32 = gluon(ops.scaled_mm, a, a_s, b, b_s, bias=bias, out_dtype=torch.float32)
    from quantcore.backends.triton import gluon_launch  # Gluon's Hopper API is there: the call above ran it
    assert gluon_launch.config_for(4096, 4096, 2560, 128, 128).block_n == 256
    for scale_fmt in ("fp32", "ue8m0"):
        q, s = gluon(ops.scaled_mm, a, a_s, b, b_s, bias=bias, out_quant=qdtype, out_group_size=128,
                     out_scale_fmt=scale_fmt)
        own_q, own_s = ops.act_quant(f32, dtype=qdtype, group_size=128, scale_fmt=scale_fmt, backend="triton")
        assert same_q(q, own_q) and same_scale(s, own_s), scale_fmt
        assert s[:, 5].isnan().all() and s[5].isinf().any() and s[2000].isnan().all()
        assert s[100, :5].isfinite().all() and s[100, 6:].isfinite().all()


# The wide-tile configurations (not the default; docs/bench/round4/gluon_probe2.py times them).
VARIANTS = {"128x128/64": dict(sub_n=64), "128x192/64": dict(block_n=192, sub_n=64),
            "128x256/64": dict(block_n=256, sub_n=64, producer_regs=24)}


@pytest.mark.parametrize("qdtype", list(FMTS))
@pytest.mark.parametrize("config", list(VARIANTS.values()), ids=list(VARIANTS))
@pytest.mark.parametrize("mnk", [(300, 1001, 1000), (520, 2112, 7168), (4096, 7168, 2048), (2000, 4096, 256)],
                         ids=lambda s: "x".join(map(str, s)))
def test_column_sub_tiles_compute_the_default_bit_for_bit(qdtype, config, mnk):
    """Column sub-tiles multiply the same K blocks with the same instructions per element and promote
    alike: outputs (bias and SiLU included, masked and TMA stores) and re-quantized codes and scales
    equal the default configuration's, on one tile per program and on several, with K blocks of many
    tiles in flight in the ring (K = 256); and the default's is within the contract of the reference."""
    a, a_s, b, b_s, _ = gemm_case(*mnk, qdtype)
    bias = rand((mnk[1],), seed=4)
    ref = ops.scaled_mm(a, a_s, b, b_s, bias=bias, activation="silu", out_dtype=torch.float32, backend="torch")
    default = gluon(ops.scaled_mm, a, a_s, b, b_s, bias=bias, activation="silu", out_dtype=torch.float32)
    assert rel_error(default, ref) <= tolerance(qdtype, torch.float32)
    from quantcore.backends.triton import gluon_launch  # Gluon's Hopper API is there: the call above ran it

    def launch(cfg, **kw):
        options = dict(out_dtype=torch.float32, out_quant=None, out_group=128, ue8m0_out=False,
                       activation="silu") | kw
        return gluon_launch.scaled_mm(a, a_s, b, b_s, block_n=128, block_k=128, bias=bias, eps=1e-4,
                                      profile=capability.profile_for(a.device), config=cfg, **options)
    wide = gluon_launch.GluonConfig(**config)
    assert torch.equal(launch(wide), default)
    requant = dict(out_quant=qdtype, out_group=64, ue8m0_out=True)
    (q, s), (q0, s0) = launch(wide, **requant), launch(gluon_launch.DEFAULT, **requant)
    assert same_q(q, q0) and same_scale(s, s0)
    # Groups of 128 over two 64-column sub-tiles (their amaxes combined in registers), with and without an
    # activation, against the default tile's groups within one sub-tile; a tile of 192 columns cannot hold them.
    requant = dict(out_quant=qdtype, out_group=128, ue8m0_out=False)
    for activation in (None, "silu"):
        regs = replace(wide, epi_rows=0)
        if not regs.holds_groups(128, staged=False):
            with pytest.raises(InvalidInputError, match="out_group_size 128"):
                launch(regs, **requant, activation=activation)
            continue
        (q, s), (q0, s0) = launch(regs, **requant, activation=activation), \
            launch(gluon_launch.DEFAULT, **requant, activation=activation)
        assert same_q(q, q0) and same_scale(s, s0), activation


@pytest.mark.parametrize("qdtype", list(FMTS))
@pytest.mark.parametrize("config", [dict(), dict(block_n=256, sub_n=64, producer_regs=24)],
                         ids=["128x128", "128x256/64"])
def test_a_bias_of_any_stride_and_dtype_reaches_every_tile(qdtype, config):
    """The producer stages each tile's bias in fp32 through shared memory for the register epilogue
    (`gluon_gemm._stage_bias`), in a ring of two tiles: over several tiles a program (K = 256) with an N tail,
    a bf16 bias at stride 2 gives its contiguous copy's outputs bit for bit, plain and re-quantized, and the
    same values as fp16 and fp32 biases give the fp32 bias's; within the contract of the reference."""
    a, a_s, b, b_s, _ = gemm_case(2000, 1000, 256, qdtype)
    gluon(ops.scaled_mm, a, a_s, b, b_s)  # skips where the variant cannot run
    from quantcore.backends.triton import gluon_launch
    cfg = gluon_launch.GluonConfig(**config)

    def launch(bias, **kw):
        options = dict(out_dtype=torch.float32, out_quant=None, out_group=128, ue8m0_out=False) | kw
        return gluon_launch.scaled_mm(a, a_s, b, b_s, block_n=128, block_k=128, bias=bias, activation=None,
                                      eps=1e-4, profile=capability.profile_for(a.device), config=cfg, **options)
    # Values fp16 holds exactly too: bf16 roundings of fp16 ones.
    strided = rand((1, 2 * 1000), torch.float16, seed=4).to(torch.bfloat16)[0, ::2]
    bias = strided.contiguous()
    assert strided.stride(0) == 2
    out = launch(bias)
    assert torch.equal(launch(strided), out)
    ref = ops.scaled_mm(a, a_s, b, b_s, bias=bias, out_dtype=torch.float32, backend="torch")
    assert rel_error(out, ref) <= tolerance(qdtype, torch.float32)
    (q, s), (q0, s0) = launch(strided, out_quant=qdtype), launch(bias, out_quant=qdtype)
    assert same_q(q, q0) and same_scale(s, s0)
    for dtype in (torch.float16, torch.float32):
        assert torch.equal(bias.to(dtype).to(torch.bfloat16), bias)
        assert torch.equal(launch(bias.to(dtype)), out), dtype


@pytest.mark.parametrize("qdtype", list(FMTS))
@pytest.mark.parametrize("config", [dict(), dict(block_n=256, sub_n=64, producer_regs=24)],
                         ids=["128x128", "128x256/64"])
@pytest.mark.parametrize("n", [1024, 1004], ids=["tma-store", "masked-store"])
def test_a_bf16_output_is_the_fp32_output_rounded_to_nearest_even(qdtype, config, n):
    """A bf16 output (`gluon_gemm._bf16_bits`: packed PTX, three instructions per two elements) is the kernel's
    own fp32 output rounded to nearest even bit for bit, every NaN as 0x7FC0 (NaN bias columns), ±inf (a row of
    infinite activation scale), through the TMA store and (rows of 2008 bytes) the masked one."""
    a, a_s, b, b_s, _ = gemm_case(300, n, 1024, qdtype)
    gluon(ops.scaled_mm, a, a_s, b, b_s)  # skips where the variant cannot run
    from quantcore.backends.triton import gluon_launch
    a_s = a_s.clone()
    a_s[7, 0], a_s[7, 1:] = torch.inf, 0.0  # K block 0's partials times inf, the others' times 0: ±inf
    bias = rand((n,), seed=4)
    bias[[5, 130, n - 1]] = float("nan")
    cfg = gluon_launch.GluonConfig(**config)

    def launch(out_dtype):
        return gluon_launch.scaled_mm(a, a_s, b, b_s, block_n=128, block_k=128, bias=bias, activation=None,
                                      out_dtype=out_dtype, out_quant=None, out_group=128, ue8m0_out=False, eps=1e-4,
                                      profile=capability.profile_for(a.device), config=cfg)
    f32, bf16 = launch(torch.float32).cpu(), launch(torch.bfloat16).cpu().view(torch.int16)
    nan = f32.isnan()
    assert nan.any() and f32.isinf().any()
    # Round to nearest even on the bits (`cast.bf16_encode`), NaN as 0x7FC0: torch's CPU cast gives 0x7FC0 in its
    # scalar path, but its vectorized one may give another NaN, so it is the reference for the numbers only.
    bits = f32.view(torch.int32).to(torch.int64)
    want = torch.where(nan, 0x7FC0, (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).to(torch.int16)
    assert torch.equal(bf16, want), [(hex(int(b)), hex(int(g)), hex(int(w))) for b, g, w in
                                     zip(bits[bf16 != want][:5], bf16[bf16 != want][:5], want[bf16 != want][:5])]
    assert torch.equal(bf16[~nan], f32[~nan].to(torch.bfloat16).view(torch.int16))


@pytest.mark.parametrize("qdtype", list(FMTS))
@pytest.mark.parametrize("mnk", [(300, 1001, 1000), (520, 264, 7296), (4096, 7168, 2048)],
                         ids=lambda s: "x".join(map(str, s)))
def test_staged_epilogue_is_the_register_epilogue_bit_for_bit(qdtype, mnk):
    """The epilogue staged through shared memory in steps of rows (`GluonConfig.epi_rows`: the default
    for activations) and run by the epilogue partition, each consumer keeping `own_rows` of its rows
    (none, some, all, or the rule's), applies the same fp32 operations to the same accumulators as
    the one from the MMA's registers: every output dtype, activation and re-quantized output equal bit
    for bit, in the default tile and in 64-column sub-tiles, with tails in M, N and K."""
    a, a_s, b, b_s, _ = gemm_case(*mnk, qdtype)
    bias = rand((mnk[1],), seed=4)
    gluon(ops.scaled_mm, a, a_s, b, b_s)  # skips where the variant cannot run
    from quantcore.backends.triton import gluon_launch

    def launch(epi_rows, activation, sub_n=None, own_rows=None, **kw):
        options = dict(out_dtype=torch.float32, out_quant=None, out_group=128, ue8m0_out=False) | kw
        config = gluon_launch.GluonConfig(sub_n=sub_n, epi_rows=epi_rows, own_rows=own_rows)
        return gluon_launch.scaled_mm(a, a_s, b, b_s, block_n=128, block_k=128, bias=bias, activation=activation,
                                      eps=1e-4, profile=capability.profile_for(a.device), config=config, **options)
    for activation in (None, "gelu", "gelu_tanh", "silu"):
        for out in (dict(out_dtype=torch.float32), dict(out_dtype=torch.bfloat16), dict(out_dtype=torch.float16)):
            want = launch(0, activation, **out)
            for rows, sub_n, own in ((8, None, None), (8, None, 0), (8, None, 64), (32, None, 32), (8, 64, 16)):
                got = launch(rows, activation, sub_n, own, **out)
                assert torch.equal(got, want), (activation, out, rows, sub_n, own)
        requant = dict(out_quant=qdtype, out_group=64, ue8m0_out=activation == "silu")
        q0, s0 = launch(0, activation, **requant)
        for rows, sub_n, own in ((8, None, None), (8, None, 24), (16, 64, 0)):
            q, s = launch(rows, activation, sub_n, own, **requant)
            assert same_q(q, q0) and same_scale(s, s0), (activation, rows, sub_n, own)


@pytest.mark.parametrize("qdtype", list(FMTS))
@pytest.mark.parametrize("config", [dict(), dict(block_n=256, sub_n=64, producer_regs=24)],
                         ids=["128x128", "128x256/64"])
@pytest.mark.parametrize("mnk", [(300, 1001, 100), (520, 264, 640), (4096, 7168, 512), (2000, 4096, 256)],
                         ids=lambda s: "x".join(map(str, s)))
def test_staggered_consumers_compute_the_same_bits(qdtype, config, mnk):
    """Consumer 1 started a main loop behind consumer 0 (`GluonConfig.stagger`: one K block at K = 100; at K = 640
    five, which the 128×256 tile's four stages cannot hold, so the launch starts them together there) takes the same
    slots and runs the same instructions on them: plain, bias, re-quantized and staged outputs equal the unstaggered
    ones bit for bit, on tiles with tails, one and several tiles a program."""
    a, a_s, b, b_s, _ = gemm_case(*mnk, qdtype)
    bias = rand((mnk[1],), seed=4)
    gluon(ops.scaled_mm, a, a_s, b, b_s)  # skips where the variant cannot run
    from quantcore.backends.triton import gluon_launch

    def launch(stagger, **kw):
        options = dict(out_dtype=torch.bfloat16, out_quant=None, out_group=128, ue8m0_out=False, bias=None,
                       activation=None) | kw
        cfg = gluon_launch.GluonConfig(**config, stagger=stagger)
        return gluon_launch.scaled_mm(a, a_s, b, b_s, block_n=128, block_k=128, eps=1e-4,
                                      profile=capability.profile_for(a.device), config=cfg, **options)
    for kw in (dict(), dict(bias=bias), dict(out_quant=qdtype), dict(bias=bias, activation="silu"),
               dict(bias=bias, out_quant=qdtype, ue8m0_out=True)):
        want, got = launch(False, **kw), launch(True, **kw)
        if isinstance(want, tuple):
            assert same_q(got[0], want[0]) and same_scale(got[1], want[1]), kw
        else:
            assert torch.equal(got, want), kw


@pytest.mark.parametrize("qdtype", list(FMTS))
@pytest.mark.parametrize("mnk", [(4096, 2112, 7168), (300, 576, 384), (520, 386, 256), (200, 100, 640),
                                 (1000, 2108, 1040), (12800, 386, 256)], ids=lambda s: "x".join(map(str, s)))
def test_a_last_column_tile_of_skipped_sub_tiles_computes_the_default_bit_for_bit(qdtype, mnk):
    """On 128×256 in 64-column sub-tiles, N's last column tile skips its sub-tiles past N (`TAIL_NSUB`: one of
    four at N = 2112 and 576, three at 386, two where N is 100 and every tile is a last one; masked stores
    everywhere at N = 2108) and is walked after the others (at 12800 rows and N = 386, 100 of them after 100 whole
    tiles on 132 programs): plain, fp32, bias, re-quantized (groups of 128 over two sub-tiles, the last one's second
    skipped; groups of 64) and staggered outputs equal the default tile's bit for bit, codes and scales alike, at
    one and several tiles a program; so do 128×192's, whose last column tile keeps one, two or all of its three
    sub-tiles, where its tile holds the groups."""
    a, a_s, b, b_s, _ = gemm_case(*mnk, qdtype)
    bias = rand((mnk[1],), seed=4)
    gluon(ops.scaled_mm, a, a_s, b, b_s)  # skips where the variant cannot run
    from quantcore.backends.triton import gluon_launch
    wide = gluon_launch.GluonConfig(block_n=256, sub_n=64, producer_regs=24)
    assert gluon_launch.tail_sub_tiles(wide, mnk[1], False) == -(-(mnk[1] % 256) // 64)
    assert gluon_launch.tail_sub_tiles(wide, mnk[1], True) == 0

    def launch(cfg, **kw):
        options = dict(out_dtype=torch.bfloat16, out_quant=None, out_group=128, ue8m0_out=False, bias=None,
                       activation=None) | kw
        return gluon_launch.scaled_mm(a, a_s, b, b_s, block_n=128, block_k=128, eps=1e-4,
                                      profile=capability.profile_for(a.device), config=cfg, **options)
    for kw in (dict(), dict(out_dtype=torch.float32), dict(bias=bias), dict(out_quant=qdtype),
               dict(bias=bias, out_quant=qdtype, ue8m0_out=True), dict(out_quant=qdtype, out_group=64)):
        want = launch(gluon_launch.DEFAULT, **kw)
        for cfg in (wide, replace(wide, stagger=True, group_m=32), gluon_launch.WIDE[1]):
            if not cfg.holds_groups(kw.get("out_group", 128) if "out_quant" in kw else None, False):
                continue
            got = launch(cfg, **kw)
            if isinstance(want, tuple):
                assert same_q(got[0], want[0]) and same_scale(got[1], want[1]), (kw, cfg)
            else:
                assert torch.equal(got, want), (kw, cfg)
