"""The `triton[gluon]` GEMM variant in the registry: available on sm_90 with a Triton whose Gluon has
Hopper's API, its reasons elsewhere in explain() and the report, never chosen automatically unless a
measured priority lists it, and run where a call names it."""

from __future__ import annotations

import dataclasses
import importlib.machinery
import itertools
import re

import pytest

from quantcore import InvalidInputError, UnsupportedError, capability, registry, report

from quantcore.registry import measured
from quantcore.registry import impl as base
from quantcore.backends.triton import gluon
from quantcore.definitions.query import m_bucket
from quantcore.definitions.query import GemmQuery, GroupedGemmQuery

# Selecting an FP8 tensor-core GEMM warns of its numerics once; what is selected is what these tests judge.
pytestmark = pytest.mark.filterwarnings("ignore::quantcore.NumericsWarning")

GLUON = "triton[gluon]"
OPS_FMTS = [(op, fmt) for op in ("scaled_mm", "quant_linear") for fmt in ("fp8_e4m3", "int8")]


def gemm_query(profile="sm90", fmt="fp8_e4m3", op="scaled_mm", m=4096, block_k=128, out_fmt=None, fused=False,
               out_group=128, k=2048):
    p = capability.simulated_profile(profile) if isinstance(profile, str) else profile
    blocks = (128, block_k) + ((out_group,) if out_fmt else ())
    return GemmQuery(op, p, fmt, out_fmt, blocks, m_bucket(m), nk=(7168, k), block_k=block_k,
                     out_group=out_group if out_fmt else 0, fused=fused or out_fmt is not None)  # as specs.gemm


@pytest.fixture
def installed(monkeypatch):
    """Triton and CuPy importable, and a Triton whose version and files the Gluon kernel accepts."""
    monkeypatch.setattr(base, "module_available", lambda name: True)
    monkeypatch.setattr(gluon, "gluon_missing", lambda version: None)
    registry.clear_caches()


def reasons(q, backend=GLUON) -> list[str]:
    return next(c for c in registry.explain_query(q, backend=backend).candidates if c.impl == GLUON).reasons


@pytest.mark.parametrize("op, fmt", OPS_FMTS)
@pytest.mark.parametrize("m", [1, 128, 4096, 16384])
@pytest.mark.parametrize("fused", [False, True])
def test_it_can_run_on_sm90_but_automatic_selection_never_takes_it(installed, op, fmt, m, fused):
    q = gemm_query(fmt=fmt, op=op, m=m, fused=fused)
    assert reasons(q) == []
    assert registry.select(q).label != GLUON
    assert registry.select(q, backend="triton").label == "triton"  # the backend's name alone neither


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "int8"])
@pytest.mark.parametrize("m", [64, 4096, 32768])
def test_its_grouped_gemm_runs_where_named_and_never_automatically(installed, fmt, m):
    """The contiguous grouped GEMM has a Gluon form, reached only by name (no measured table ranks it yet); the
    masked layout (decode-sized rows) has none."""
    p = capability.simulated_profile("sm90")
    q = GroupedGemmQuery("grouped_mm", p, fmt, None, (128, 128), m_bucket(m), nk=(4096, 7168), block_k=128,
                         out_group=0, fused=False, experts=256)
    assert reasons(q) == []
    assert registry.select(q).label != GLUON
    assert registry.select(q, backend=GLUON).label == GLUON
    masked = dataclasses.replace(q, op="grouped_mm_masked")
    assert GLUON not in [c.impl for c in registry.explain_query(masked).candidates]
    with pytest.raises(UnsupportedError):
        registry.select(masked, backend=GLUON)


def test_a_gpu_with_the_shipped_tables_selects_it_exactly_where_they_rank_it_first(installed):
    ranked_first = []
    for table in (t for t in measured.tables() if t.arch == "sm_90"):
        gpu = capability.simulated_profile("sm90").model_copy(update={"name": table.device})
        for op, fmt in OPS_FMTS:
            for m, k in itertools.product((1, 64, 128, 512, 4096, 16384), (512, 2048, 7168, 16384)):
                # Both GEMM ops follow scaled_mm's ranking (per M, and per K where the table has it), each
                # from its first entry it has an implementation of (quant_linear has no cuBLAS variant).
                q = gemm_query(gpu, fmt, op, m, k=k)
                order = measured.lookup(table.device, "scaled_mm", fmt, q.m_bucket, q.k_bucket) or ()
                own = [name for name in order if any(i.named_by(name) for i in registry.impls(op))]
                first = own[:1] == [GLUON]
                ranked_first += [first]
                assert (registry.select(q).label == GLUON) == first, (table.device, op, fmt, m, k)
                # With an epilogue, the same ranking without cuBLAS, which would run it in passes of its own.
                fused = [name for name in own if name != "torch[cublas]"][:1] == [GLUON]
                selected = registry.select(gemm_query(gpu, fmt, op, m, fused=True, k=k)).label
                assert (selected == GLUON) == fused, (table.device, op, fmt, m, k, "epilogue")
    assert any(ranked_first)  # the H100's table ranks it first for FP8 at 512 rows, INT8 from 512


def test_a_measured_table_that_lists_it_selects_it(installed, monkeypatch):
    gpu = capability.simulated_profile("sm90").model_copy(update={"name": "NVIDIA H100 80GB HBM3"})
    monkeypatch.setattr(measured, "lookup",
                        lambda name, op, fmt, bucket, k_bucket=None: (GLUON, "triton") if bucket >= 4096 else None)
    registry.clear_caches()
    assert registry.select(gemm_query(gpu, m=4096)).label == GLUON
    assert registry.select(gemm_query(gpu, "int8", "quant_linear", m=16384)).label == GLUON
    assert registry.select(gemm_query(gpu, m=512)).label == "triton"
    # A re-quantized output is a fused epilogue, which ranks as the plain GEMM.
    assert registry.select(gemm_query(gpu, m=4096, out_fmt="fp8_e4m3")).label == GLUON
    assert registry.select(gemm_query(gpu, m=512, out_fmt="fp8_e4m3")).label == "triton"


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "int8"])
@pytest.mark.parametrize("out_group", [8, 32, 128])
def test_it_can_re_quantize_its_output_in_groups_within_its_tile(installed, fmt, out_group):
    q = gemm_query(fmt=fmt, out_fmt=fmt, out_group=out_group)
    assert reasons(q) == []
    assert registry.select(q, backend=GLUON).label == GLUON


@pytest.mark.parametrize("config, message", [
    (dict(block_n=64), "must divide the tile's N sub-tile (64) or, with the epilogue in registers (epi_rows 0), be "
                       "a multiple of it dividing block_n (64)"),
    (dict(block_n=192, sub_n=64), "dividing block_n (192)"),
    (dict(sub_n=64, epi_rows=8), "must divide the tile's N sub-tile (64)"),
])
def test_a_config_whose_tile_cannot_hold_whole_groups_is_refused(config, message):
    """An explicit GluonConfig (the probes') whose column sub-tile the re-quantization group does not divide,
    and which either stages its epilogue or has tiles that the group does not divide."""
    gluon_launch = pytest.importorskip("quantcore.backends.triton.gluon_launch")
    import torch

    a, b = torch.zeros(256, 256, dtype=torch.int8), torch.zeros(256, 256, dtype=torch.int8)
    scales = torch.ones(256, 2), torch.ones(2, 2)
    with pytest.raises(InvalidInputError, match="out_group_size 128 .*" + re.escape(message)):
        gluon_launch.scaled_mm(a, scales[0], b, scales[1], block_n=128, block_k=128, bias=None, activation=None,
                               out_dtype=torch.bfloat16, out_quant=torch.int8, out_group=128, ue8m0_out=False,
                               eps=1e-4, profile=capability.simulated_profile("sm90"),
                               config=gluon_launch.GluonConfig(**config))


def test_groups_over_whole_sub_tiles_of_one_tile_are_held_in_registers_only():
    gluon_launch = pytest.importorskip("quantcore.backends.triton.gluon_launch")
    wide = gluon_launch.GluonConfig(block_n=256, sub_n=64)
    assert all(wide.holds_groups(g, staged=False) for g in (None, 8, 64, 128, 256))
    assert [g for g in (None, 8, 64, 128, 256) if wide.holds_groups(g, staged=True)] == [None, 8, 64]
    assert not gluon_launch.GluonConfig(block_n=192, sub_n=64).holds_groups(128, staged=False)
    assert gluon_launch.DEFAULT.holds_groups(128, staged=True) and not gluon_launch.DEFAULT.holds_groups(256, False)


@pytest.mark.parametrize("fields, message", [
    (dict(block_n=192), "sub-tile 192 (sub_n, else block_n) must be a power of two from 8 dividing block_n 192"),
    (dict(block_n=192, sub_n=128), "sub-tile 128 (sub_n, else block_n) must be a power of two from 8 dividing"),
    (dict(block_n=512, sub_n=64), "dividing block_n 512, at most 256"),
    (dict(sub_n=48), "sub-tile 48 (sub_n, else block_n) must be a power of two"),
    (dict(producer_regs=20), "producer_regs must be a multiple of 8 from 24 to 64, got 20"),
    (dict(epi_rows=4), "epi_rows must be 0, None or a power of two from 8 dividing a consumer's 64 rows, got 4"),
    (dict(epi_rows=24), "epi_rows must be 0, None or a power of two from 8 dividing a consumer's 64 rows, got 24"),
    (dict(epi_rows=128), "dividing a consumer's 64 rows, got 128"),
    (dict(epilogue_regs=20), "epilogue_regs must be a multiple of 8 from 24 to 128, got 20"),
    (dict(own_rows=12), "own_rows must be None or a multiple of the epilogue's step (8 rows) from 0 to a "
                        "consumer's 64 rows, got 12"),
    (dict(epi_rows=16, own_rows=8), "multiple of the epilogue's step (16 rows)"),
    (dict(own_rows=72), "from 0 to a consumer's 64 rows, got 72"),
])
def test_a_config_the_kernel_cannot_take_is_refused(fields, message):
    gluon_launch = pytest.importorskip("quantcore.backends.triton.gluon_launch")
    with pytest.raises(InvalidInputError, match=re.escape(message)):
        gluon_launch.GluonConfig(**fields)


def test_a_staged_epilogue_trades_the_output_buffers_for_fp32_ones():
    """Staged, each consumer's fp32 sub-tile replaces the TMA store's output buffers in the shared-memory
    count: for the default tile a ring stage fewer than with a bf16 output."""
    gluon_launch = pytest.importorskip("quantcore.backends.triton.gluon_launch")
    cfg, sub_tiled = gluon_launch.DEFAULT, gluon_launch.GluonConfig(block_n=256, sub_n=64, producer_regs=24)
    assert cfg.smem_bytes(5, 128, 2, staged=True) - cfg.smem_bytes(5, 128, 2) == 128 * 128 * (4 - 2)
    assert sub_tiled.smem_bytes(4, 128, 2, staged=True) == 4 * 384 * 128 + 128 * 64 * 4 + 1024
    sm90 = capability.simulated_profile("sm90")
    assert gluon_launch._fitted(cfg, 128, 2, 128, sm90, staged=False)[0] == 6
    assert gluon_launch._fitted(cfg, 128, 2, 128, sm90, staged=True)[0] == 5


def test_a_bias_in_registers_counts_two_tiles_of_fp32_and_keeps_the_wide_tiles_stages():
    """The producer stages two tiles' bias in fp32 for an epilogue in the consumers' registers (none for a
    staged one, which loads its own); the 128×256 tile with a bf16 output keeps its four stages."""
    gluon_launch = pytest.importorskip("quantcore.backends.triton.gluon_launch")
    wide = gluon_launch.GluonConfig(block_n=256, sub_n=64, producer_regs=24)
    assert wide.smem_bytes(4, 128, 2, bias=True) - wide.smem_bytes(4, 128, 2) == 2 * 256 * 4
    assert wide.smem_bytes(4, 128, 2, staged=True, bias=True) == wide.smem_bytes(4, 128, 2, staged=True)
    sm90 = capability.simulated_profile("sm90")
    assert gluon_launch._fitted(wide, 128, 2, 128, sm90, staged=False, bias=True)[0] == 4
    assert gluon_launch._fitted(gluon_launch.DEFAULT, 128, 2, 128, sm90, staged=False, bias=True)[0] == 6


def test_the_consumers_share_what_the_producer_leaves():
    """Triton 3.6 launches the partitions at 3 × 168 registers a thread (4 × 128 with the epilogue
    partition) and gives the default one (consumer 0) what the workers leave; consumer 1 takes half of
    the rest, in setmaxnreg's steps of 8. The producer takes 40 unless set, 24 beside the epilogue."""
    gluon_launch = pytest.importorskip("quantcore.backends.triton.gluon_launch")
    regs = {p: gluon_launch.GluonConfig(producer_regs=p).consumer_regs(False) for p in (24, 32, 40)}
    assert regs == {24: 240, 32: 232, 40: 232}
    assert all(3 * 168 - p - c >= c for p, c in regs.items())
    assert gluon_launch.DEFAULT.producer(False) == 40 and gluon_launch.DEFAULT.consumer_regs(False) == 232
    assert gluon_launch.DEFAULT.producer(True) == 24 and gluon_launch.DEFAULT.consumer_regs(True) == 216
    staged = gluon_launch.GluonConfig(producer_regs=40, epilogue_regs=64)
    assert staged.consumer_regs(True) == 200 and 4 * 128 - 40 - 64 - 200 >= 200
    sub_tiled = gluon_launch.GluonConfig(block_n=192, sub_n=64)
    assert sub_tiled.sub == 64 and gluon_launch.DEFAULT.sub == 128


@pytest.mark.parametrize("M, N, block_n, out_group, wide", [
    (4096, 7168, 128, None, 256), (16384, 2112, 128, None, 192), (4096, 1000, 128, None, None),
    (2048, 7168, 128, None, None), (4096, 7168, 96, None, None), (4096, 7168, 128, 64, 256),
    (4096, 7168, 128, 128, 256), (4096, 2112, 128, 128, 256), (16384, 2112, 128, 64, 192),
])
def test_wide_tiles_only_where_n_fills_them_at_large_m(M, N, block_n, out_group, wide):
    """128x256 where N is a multiple of 256, else 128x192 where of 192, from M = 4096; never where a
    sub-tile would straddle a weight-scale block or a tile split a re-quantization group."""
    gluon_launch = pytest.importorskip("quantcore.backends.triton.gluon_launch")
    cfg = gluon_launch.config_for(M, N, 7168, block_n, out_group)
    assert cfg == (gluon_launch.DEFAULT if wide is None else next(c for c in gluon_launch.WIDE if c.block_n == wide))
    assert out_group is None or cfg.sub % out_group == 0 or cfg.block_n % out_group == 0


@pytest.mark.parametrize("M, N, K, wide", [(4096, 7168, 7168, True), (4096, 7168, 2048, True), (4096, 32768, 512, True),
                                            (16384, 7168, 1536, True), (2048, 7168, 2048, False),
                                            (4096, 2112, 2048, False)])
def test_groups_over_sub_tiles_take_the_wide_tile(M, N, K, wide):
    """Groups of 128 over two 64-column sub-tiles take the wide tile wherever the plain GEMM does (from
    WIDE_M_MIN rows, N a multiple of 256) at every K, as groups within one sub-tile do; N = 2112, which
    128×192 fills and no tile holding groups of 128 does, keeps the default tile at K = 2048."""
    gluon_launch = pytest.importorskip("quantcore.backends.triton.gluon_launch")
    assert (gluon_launch.config_for(M, N, K, 128, 128).block_n == 256) == wide
    assert (gluon_launch.config_for(M, N, K, 128, 64).block_n == 256) == wide
    assert gluon_launch.config_for(M, N, K, 128, None).block_n == (192 if N == 2112 else 256 if wide else 128)


@pytest.mark.parametrize("M, N, K, group_m", [(4096, 32768, 512, 32), (4096, 7168, 2048, 32), (16384, 2112, 1536, 32),
                                              (4096, 7168, 2049, 8), (4096, 4096, 7168, 8), (4096, 1000, 512, 8),
                                              (2048, 7168, 512, 8)])
def test_wide_tiles_walk_longer_groups_of_row_tiles_where_k_is_short(M, N, K, group_m):
    """At K <= 2048 a wide tile's walk takes 32 row tiles per L2 group (B's strips are most of the
    traffic there), else 8 as the default tile, which keeps its own."""
    gluon_launch = pytest.importorskip("quantcore.backends.triton.gluon_launch")
    cfg = gluon_launch.config_for(M, N, K, 128, None)
    assert cfg.group_m == group_m
    assert (cfg == gluon_launch.DEFAULT) == (N % 192 != 0 and N % 256 != 0 or M < gluon_launch.WIDE_M_MIN)


@pytest.mark.parametrize("M, K, out_group, block_n", [(16384, 7168, 128, 256), (8192, 7168, 128, 256),
                                                      (4096, 7168, 128, 256), (16384, 2048, 128, 128),
                                                      (2048, 7168, 128, 128), (16384, 7168, 64, 192),
                                                      (16384, 7168, None, 192)])
def test_a_re_quantized_output_takes_a_last_column_tile_of_skipped_sub_tiles_at_long_k(M, K, out_group, block_n):
    """N = 2112: the plain GEMM's 128×192 would split groups of 128, so a re-quantized output takes 128×256 where K
    is above SHORT_K, its last column tile one sub-tile of four within N and the other three skipped, else the default
    tile; groups of 64 fit 128×192's sub-tiles."""
    gluon_launch = pytest.importorskip("quantcore.backends.triton.gluon_launch")
    cfg = gluon_launch.config_for(M, 2112, K, 128, out_group)
    assert cfg.block_n == block_n and cfg.holds_groups(out_group, False)
    assert gluon_launch.tail_sub_tiles(cfg, 2112, False) == (1 if block_n == 256 else 0)


@pytest.mark.parametrize("M, N, K, stagger", [(4096, 32768, 512, True), (16384, 7168, 2048, True),
                                              (4096, 2112, 1536, True), (4096, 7168, 2049, False),
                                              (512, 7168, 512, False), (4096, 1000, 512, False)])
def test_consumer_1_starts_a_main_loop_behind_on_a_wide_tile_where_k_is_short(M, N, K, stagger):
    """A wide tile at K <= SHORT_K staggers its consumers (the launch only where a tile's K blocks fit the ring); the
    default tile, longer K and the staged epilogue do not."""
    gluon_launch = pytest.importorskip("quantcore.backends.triton.gluon_launch")
    assert gluon_launch.config_for(M, N, K, 128, None).stagger == stagger
    assert gluon_launch.config_for(M, N, K, 128, 128).stagger == (stagger and N != 2112)
    assert not gluon_launch.config_for(M, N, K, 128, None, staged=True).stagger


@pytest.mark.parametrize("requantized, preload, tail, fp8, told", [
    (True, "none", 0, True, True), (True, "none", 0, False, True), (True, "none", 1, False, True),
    (True, "none", 1, True, False), (True, "stores", 0, False, False), (False, "none", 0, False, False),
    (False, "loop", 0, True, False)])
def test_the_kernel_is_told_k_is_positive_where_that_measured_faster(requantized, preload, tail, fp8, told):
    """A re-quantized output on column sub-tiles without K block 0 ahead of the K loop tells the compiler that K >= 1
    (no zero-trip path, whose own zeroing of the accumulators ran every tile), but FP8 with N's last column in a loop of
    its own; a bf16 output never (ptxas spilled there); the default tile, without column sub-tiles, never."""
    gluon_launch = pytest.importorskip("quantcore.backends.triton.gluon_launch")
    wide = gluon_launch.WIDE[0]
    assert gluon_launch.k_positive(wide, requantized, preload, tail, fp8) == told
    assert not gluon_launch.k_positive(gluon_launch.DEFAULT, requantized, preload, tail, fp8)


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "int8"])
def test_naming_it_selects_it_with_its_numerics(installed, fmt):
    impl = registry.select(gemm_query(fmt=fmt), backend=GLUON)
    assert impl.label == GLUON and impl.launch == "triton.gluon_launch:scaled_mm"
    assert (impl.numerics == "exact") == (fmt == "int8")


@pytest.mark.parametrize("case, reason", [
    (dict(profile="sm100"), "wgmma and its warpgroup register budget are sm_90's; device is sm_100"),
    (dict(profile="sm89"), "needs compute capability >= 9.0, device is 8.9"),
    (dict(profile="cpu"), "runs on cuda, not cpu"),
    (dict(out_fmt="int8", out_group=256), "re-quantization groups must be powers of two <= 128, got 256"),
    (dict(out_fmt="fp8_e4m3", out_group=48), "re-quantization groups must be powers of two <= 128, got 48"),
    (dict(block_k=256), "the K block must be at most 128, got 256"),
    (dict(block_k=16), "the K block must be a power of two >= 32, got 16"),
])
def test_where_it_cannot_run_forcing_it_says_why(installed, case, reason):
    q = gemm_query(**case)
    assert reason in reasons(q)
    with pytest.raises(UnsupportedError) as err:
        registry.select(q, backend=GLUON)
    assert reason in err.value.reasons[GLUON]


def test_an_older_triton_is_a_reason_in_explain_and_the_report(monkeypatch):
    monkeypatch.setattr(base, "module_available", lambda name: True)
    monkeypatch.setattr(capability, "versions", lambda: {"triton": "3.5.1"})
    gluon.gluon_missing.cache_clear()
    registry.clear_caches()
    expected = "needs Triton >= 3.6 (Gluon's warp_specialize, warpgroup_mma and TMA as the kernel uses them), " \
               "installed 3.5.1"
    assert reasons(gemm_query()) == [expected]
    rows = {(r.impl, r.dtype): r for r in report.build(simulate="sm90").rows if r.op == "scaled_mm"}
    assert rows[(GLUON, "fp8_e4m3")].status == "unavailable" and rows[(GLUON, "fp8_e4m3")].reason == expected
    assert rows[("triton", "fp8_e4m3")].status == "selected"  # the rest of the backend is unaffected
    gluon.gluon_missing.cache_clear()


@pytest.mark.parametrize("version, files, missing", [
    (None, True, None),  # no Triton at all: the `requires` reason says so
    ("3.5.9", True, "needs Triton >= 3.6"),
    ("3.6.0", True, None),
    ("3.10.0+git1234", True, None),
    ("3.6.0", False, "the installed Triton 3.6.0 has no Gluon Hopper language"),
])
def test_gluon_missing_reads_the_version_and_the_files(monkeypatch, tmp_path, version, files, missing):
    if files:
        hopper = tmp_path.joinpath(*gluon._HOPPER_GLUON.parts)
        hopper.parent.mkdir(parents=True)
        hopper.write_text("")
    spec = importlib.machinery.ModuleSpec("triton", None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setattr(gluon.importlib.util, "find_spec", lambda name: spec)
    gluon.gluon_missing.cache_clear()
    found = gluon.gluon_missing(version)
    gluon.gluon_missing.cache_clear()
    assert (found is None) if missing is None else (missing in found)


@pytest.mark.parametrize("M, N, out_group", [(4096, 7168, None), (16384, 2112, None), (4096, 7168, 64)])
def test_a_staged_epilogue_keeps_the_default_tile(M, N, out_group):
    """The epilogue partition's buffer holds one column sub-tile per consumer: a staged epilogue never
    takes a wide tile, where the consumers would wait for it sub-tile after sub-tile."""
    gluon_launch = pytest.importorskip("quantcore.backends.triton.gluon_launch")
    assert gluon_launch.config_for(M, N, 7168, 128, out_group) != gluon_launch.DEFAULT
    assert gluon_launch.config_for(M, N, 7168, 128, out_group, staged=True) == gluon_launch.DEFAULT


@pytest.mark.parametrize("tiles, num_kb, own", [(14, 16, 32), (14, 56, 0), (2, 56, 48), (62, 4, 48), (3, 12, 32),
                                                (3, 48, 0), (3, 11, 48), (1, 128, 48)])
def test_the_consumers_keep_a_share_of_the_epilogue_where_the_main_loop_is_short(tiles, num_kb, own):
    """Each consumer runs the first rows of its staged sub-tiles itself where the next tile's main loop
    is too short to hide them all behind (few K blocks), or absent (two tiles a program or fewer)."""
    gluon_launch = pytest.importorskip("quantcore.backends.triton.gluon_launch")
    assert gluon_launch.own_rows_for(tiles, num_kb) == own
