"""The Triton routing kernels on the CPU under TRITON_INTERPRET=1, bit for bit the torch reference: the
permutes (both layouts, both formats, ue8m0, int32 and int64 ids, a tail group, an expert with no token,
chunks of the sort forced small so that ranks carry across chunks, ids the GPU drops), the un-permute
(both layouts, a poisoned workspace), and a QuantExperts forward through the Triton ops in both layouts.
Outputs and workspaces start poisoned, so rows the kernels do not own must come back as the contract says."""

from __future__ import annotations

import torch

import pytest  # noqa: E402

triton = pytest.importorskip("triton")

import quantcore  # noqa: E402
from helpers import INTERPRETER_ONLY, randn  # noqa: E402
from quantcore.backends.torch import routing as ref  # noqa: E402
from quantcore.backends.triton import routing  # noqa: E402
from quantcore.capability import profile_for  # noqa: E402
from quantcore.definitions.tolerances import rel_error  # noqa: E402
from quantcore.nn import QuantExperts  # noqa: E402

pytestmark = INTERPRETER_ONLY

FP8, I8 = torch.float8_e4m3fn, torch.int8
E, T, TOP = 4, 5, 2
IDS = torch.tensor([[0, 2], [2, 1], [0, 2], [1, 0], [2, 0]])  # expert 3 gets no token
CPU = profile_for(torch.device("cpu"))


@pytest.fixture(autouse=True)
def poisoned(monkeypatch):
    """Every output and workspace of a routing launch starts poisoned: int32 ones with 1, a row index that
    exists (a -1 left unwritten, a pair's source not found by the un-permute's round trip would show), the
    others with 0x7F bytes (NaN codes, 127, huge scales)."""
    fresh = routing.allocator

    def poison(shape, dtype, device):
        new = fresh(shape, dtype, device)

        def made():
            t = new()
            t.fill_(1) if dtype == torch.int32 else t.view(torch.uint8).fill_(0x7F)
            return t
        return made
    monkeypatch.setattr(routing, "allocator", poison)


def _bits(t):
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def _permute_options(qdtype=FP8, ue8m0=False):
    return dict(num_experts=E, qdtype=qdtype, group_size=128, ue8m0=ue8m0, eps=1e-4)


def _check_permute(got, want, masked):
    """Bounds and rows equal; codes and scales equal in every row holding a pair."""
    (q, s, bounds, rows), (eq, es, ebounds, erows) = got, want
    assert torch.equal(bounds, ebounds) and torch.equal(rows, erows)
    held = rows >= 0
    assert torch.equal(_bits(q[held]), _bits(eq[held])) and torch.equal(_bits(s[held]), _bits(es[held]))


@pytest.mark.parametrize("qdtype,ue8m0,id_dtype,x_dtype", [
    (FP8, False, torch.int64, torch.bfloat16), (I8, True, torch.int32, torch.float32), (FP8, True, torch.int32,
                                                                                        torch.float16)])
@pytest.mark.parametrize("max_m", [None, 5, 3])  # 3: experts 0 and 2 drop their fourth pair
def test_permutes_are_the_reference(gen, qdtype, ue8m0, id_dtype, x_dtype, max_m):
    x = randn((T, 300), gen=gen, dtype=x_dtype)
    ids = IDS.to(id_dtype)
    options = _permute_options(qdtype, ue8m0)
    if max_m is None:
        got = routing.moe_permute(x, ids, profile=CPU, **options)
        want = ref.moe_permute(x, ids, **options)
    else:
        got = routing.moe_permute_masked(x, ids, max_m=max_m, profile=CPU, **options)
        want = ref.moe_permute_masked(x, ids, max_m=max_m, **options)
    _check_permute(got, want, max_m is not None)


@pytest.mark.parametrize("max_m", [None, 2])
def test_ranks_carry_across_chunks_and_invalid_ids_are_dropped(gen, monkeypatch, max_m):
    """Chunks of one token (the one-hot budget cut down), a strided ids tensor, and ids the CPU path refuses:
    -1 and E (their pairs get no row, the contiguous tail rows = -1)."""
    monkeypatch.setattr(routing, "_ONE_HOT", 4)
    ids = torch.tensor([[0, 2, 9], [2, -1, 9], [0, 2, 9], [1, 4, 9], [2, 0, 9]])[:, :2]  # a [5, 2] view, stride 3
    x = randn((T, 256), gen=gen)
    options = _permute_options(I8)
    if max_m is None:
        got, want = routing.moe_permute(x, ids, profile=CPU, **options), ref.moe_permute(x, ids, **options)
        assert got[2][-1] == T * TOP - 2 and (got[3][-2:] == -1).all()
    else:
        got = routing.moe_permute_masked(x, ids, max_m=max_m, profile=CPU, **options)
        want = ref.moe_permute_masked(x, ids, max_m=max_m, **options)
    _check_permute(got, want, max_m is not None)


@pytest.mark.parametrize("y_dtype,w_dtype,out_dtype", [(torch.bfloat16, torch.float32, torch.bfloat16),
                                                      (torch.float32, torch.bfloat16, torch.float32),
                                                      (torch.float16, torch.float16, torch.float32)])
def test_unpermute_is_the_reference(gen, y_dtype, w_dtype, out_dtype):
    """Both layouts (masked with dropped pairs: a token whose pair no row holds), over a workspace poisoned with
    a row index that exists (`poisoned`): the round trip through rows rejects it."""
    w = torch.rand(T, TOP, generator=gen).to(w_dtype)
    x = randn((T, 256), gen=gen)
    _, _, _, rows = ref.moe_permute(x, IDS, **_permute_options())
    _, _, _, slab_rows = ref.moe_permute_masked(x, IDS, max_m=3, **_permute_options())
    for y, r in ((randn((T * TOP, 96), gen=gen, dtype=y_dtype), rows),
                 (randn((E * 3, 96), gen=gen, dtype=y_dtype), slab_rows.reshape(-1))):
        got = routing.moe_unpermute(y, r, w, out_dtype=out_dtype, profile=CPU)
        assert torch.equal(_bits(got), _bits(ref.moe_unpermute(y, r, w, out_dtype=out_dtype)))


# The masked slabs' rows past their counts hold whatever the memory held (here the poison): the activation
# and its quantization run over them too, and numpy warns about the NaNs it meets there.
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_quant_experts_through_the_triton_ops(gen):
    """The six ops on Triton: within FP8's reach of the reference layer, and the two layouts bit for bit."""
    layer = QuantExperts.from_stacked(torch.randn(E, 192, 256, generator=gen) / 16,
                                      torch.randn(E, 256, 96, generator=gen) / 10)
    x, w = randn((T, 256), gen=gen, dtype=torch.bfloat16), torch.rand(T, TOP, generator=gen)
    with quantcore.priority("triton"):
        masked = layer(x, IDS, w)
        layer.masked_max_rows = 0
        contiguous = layer(x, IDS, w)
    assert torch.equal(masked, contiguous)
    assert rel_error(masked, layer(x, IDS, w)) <= 1e-2  # the reference's layer (CPU priority: torch first)


@pytest.mark.filterwarnings("ignore::quantcore.NumericsWarning")
@pytest.mark.parametrize("profile,mma", [("sm80", "fp16"), ("sm90", "fp8")])
def test_the_grouped_kernel_runs_the_variant_the_registry_names(monkeypatch, profile, mma):
    """FP8 experts through the dispatcher, CPU tensors given a simulated profile: the grouped kernel is compiled
    for the MMA of the Impl that explain() names (FP8 decoded to fp16 on sm_80, the w8a16 variant), both layouts,
    and computes the reference's values."""
    from binding import simulate_on_cpu
    from quantcore import definitions, ops
    from quantcore.backends.triton import grouped

    simulate_on_cpu(monkeypatch, profile)
    seen, real = [], grouped.Launcher

    def recording(kernel, grid, constants, *args, **kwargs):
        seen.append(constants)
        return real(kernel, grid, constants, *args, **kwargs)
    monkeypatch.setattr(grouped, "Launcher", recording)
    for op in ("grouped_mm", "grouped_mm_masked"):
        args, kwargs = definitions.get(op).example("fp8_e4m3", m=3, n=32, k=256)
        explained = quantcore.explain(op, *args, backend="triton", **kwargs)
        assert explained.selected == ("triton[w8a16]" if mma == "fp16" else "triton")
        seen.clear()
        out = ops.grouped_mm(*args, backend="triton") if op == "grouped_mm" else ops.grouped_mm_masked(
            *args, backend="triton")
        assert [c["USE_FP8_MMA"] for c in seen] == [mma == "fp8"] and explained.options["mma"] == mma
        expected = getattr(ops, op)(*args, backend="torch")
        assert rel_error(out, expected) <= 1e-2
