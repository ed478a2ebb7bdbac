"""The kept-plan fast path of `quantcore.ops`: a repeated call must compute exactly what a fresh,
fully validated call computes, follow the priority and simulation in force, and never keep what it
cannot replay."""

from __future__ import annotations

import pytest
import torch

import quantcore
from quantcore import ops, registry
from quantcore.runtime import dispatch, plans
from quantcore.registry.impl import Constraints, Impl

from helpers import randn


def fresh(fn, *args, **kwargs):
    """`fn` with every kept plan forgotten first: the fully validated path."""
    registry.clear_caches()
    return fn(*args, **kwargs)


def same(a, b):
    if isinstance(a, tuple):
        return all(same(x, y) for x, y in zip(a, b, strict=True))
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.float().nan_to_num(7), b.float().nan_to_num(7))


def test_repeated_calls_reuse_the_plan_and_bind_the_new_tensors(gen):
    x1, x2 = randn((2, 3, 300), gen=gen), randn((2, 3, 300), gen=gen)
    ops.act_quant(x1)
    kept = len(plans.plans)
    assert kept >= 1
    got = ops.act_quant(x2)
    assert len(plans.plans) == kept  # same signature: no new plan
    assert same(got, fresh(ops.act_quant, x2)) and not same(got, fresh(ops.act_quant, x1))


def test_strided_views_are_rebound_at_their_own_offset(gen):
    buf = randn((9, 700), gen=gen)
    first, second = buf[1:5, 3:303], buf[4:8, 100:400]  # same shape and strides, other storage offsets
    q, s = ops.act_quant(first)
    assert same((q, s), fresh(ops.act_quant, first))
    assert same(ops.act_quant(second), fresh(ops.act_quant, second))


def test_gemm_with_bias_and_leading_dims(gen):
    w = randn((40, 256), gen=gen)
    b, b_s = ops.weight_quant(w)
    for _ in range(2):
        a, a_s = ops.act_quant(randn((2, 3, 256), gen=gen))
        bias = randn((40,), gen=gen)
        got = ops.scaled_mm(a, a_s, b, b_s, bias=bias, activation="silu")
        assert got.shape == (2, 3, 40)
        assert same(got, fresh(ops.scaled_mm, a, a_s, b, b_s, bias=bias, activation="silu"))


def test_a_new_signature_is_validated(gen):
    ops.act_dequant(*ops.act_quant(randn((4, 256), gen=gen)))
    q, s = ops.act_quant(randn((4, 256), gen=gen))
    with pytest.raises(quantcore.InvalidInputError, match="scale has shape"):
        ops.act_dequant(q, s[:, :1])


def test_check_finite_is_never_skipped(gen):
    x = randn((2, 128), gen=gen)
    ops.act_quant(x, check_finite=True)
    x[1, 5] = float("nan")
    with pytest.raises(quantcore.NonFiniteInputError):
        ops.act_quant(x, check_finite=True)


def test_priority_in_force_is_part_of_the_plan(gen):
    calls = []

    def launch(**kwargs):
        calls.append(kwargs["x"].shape)
        return torch.zeros_like(kwargs["x"], dtype=torch.float8_e4m3fn), torch.ones(kwargs["x"].shape[0], 1)

    impl = Impl("act_quant", "fake", launch, Constraints(devices=("cpu",)))
    registry.register(impl)
    try:
        x = randn((2, 128), gen=gen)
        reference = ops.act_quant(x)
        with quantcore.priority("fake"):
            assert torch.equal(ops.act_quant(x)[1], torch.ones(2, 1))
        assert same(ops.act_quant(x), reference) and len(calls) == 1
    finally:
        registry.unregister(impl)


def test_copies_made_by_the_spec_are_not_kept(gen):
    x = randn((256, 3), gen=gen).t()  # last dim not contiguous: the spec copies it
    before = len(plans.plans)
    got = ops.act_quant(x)
    assert len(plans.plans) == before
    assert same(got, fresh(ops.act_quant, x.contiguous()))


def test_aliased_inputs_are_not_kept(gen):
    """a is b in the first call: a plan kept then could bind a later call's b to its a."""
    x = randn((256, 256), gen=gen)
    a, a_s = ops.act_quant(x)
    _, b_s = ops.weight_quant(x)
    ops.scaled_mm(a, a_s, a, b_s)
    b, b_s = ops.weight_quant(randn((256, 256), gen=gen))
    assert same(ops.scaled_mm(a, a_s, b, b_s), fresh(ops.scaled_mm, a, a_s, b, b_s))


@pytest.mark.parametrize("option,value", [("group_size", 128.0), ("group_size", True), ("eps", True),
                                          ("group_size", "np.int64")])
def test_rejected_options_stay_rejected_after_a_warm_up(gen, option, value):
    """The plan key tells apart what validation tells apart: an equal-comparing value of another type
    is validated on its own, never served the plan of the accepted one."""
    import numpy as np

    value = np.int64(128) if value == "np.int64" else value
    x = randn((4, 256), gen=gen)
    ops.act_quant(x, **{option: 128 if option == "group_size" else 1e-4})
    for _ in range(2):
        with pytest.raises(quantcore.InvalidInputError, match=option):
            ops.act_quant(x, **{option: value})


@pytest.mark.parametrize("block", [(128.0, 128), (128, True), [128, 128.0], "np.int64"])
def test_rejected_block_sizes_stay_rejected_after_a_warm_up(gen, block):
    """The elements of a sequence option count too: (128.0, 128) equals (128, 128) but is refused."""
    import numpy as np

    block = (np.int64(128), 128) if block == "np.int64" else block
    warm = tuple(1 if b is True else 128 for b in block)  # the accepted block the refused one equals
    w = randn((256, 256), gen=gen)
    q, s = ops.weight_quant(w, block_size=warm)
    for _ in range(2):
        with pytest.raises(quantcore.InvalidInputError, match="block_size"):
            ops.weight_quant(w, block_size=block)
        with pytest.raises(quantcore.InvalidInputError, match="block_size"):
            ops.weight_dequant(q, s, block_size=block)
    ops.weight_dequant(q, s, block_size=warm)
    with pytest.raises(quantcore.InvalidInputError, match="block_size"):
        ops.weight_dequant(q, s, block_size=block)


def test_a_prepared_launch_is_prepared_once_per_plan(gen):
    """A launch function with a `prepare` stage keeps its per-call part with the plan."""
    from quantcore.runtime.launch import prepared

    prepares, runs = [], []

    @prepared
    def launch(x, *, qdtype, group_size, ue8m0, eps, scale_m_major, profile):
        prepares.append(x.shape)

        def run(x):
            runs.append(x.data_ptr())
            return torch.zeros_like(x, dtype=qdtype), torch.ones(x.shape[0], 2)
        return run

    impl = Impl("act_quant", "fake", launch, Constraints(devices=("cpu",)))
    registry.register(impl)
    try:
        xs = [randn((2, 256), gen=gen) for _ in range(3)]
        for x in xs:
            ops.act_quant(x, backend="fake")
        assert len(prepares) == 1 and runs == [x.data_ptr() for x in xs]
        assert launch(xs[0], qdtype=torch.int8, group_size=128, ue8m0=False, eps=1e-4, scale_m_major=False,
                      profile=None)[0].dtype == torch.int8  # both stages when called as a plain function
    finally:
        registry.unregister(impl)


def test_misaligned_views_get_their_own_plan(gen):
    """Kernels are specialised on 16-byte alignment: a view 2 bytes further on is another signature."""
    buf = randn((4, 400), gen=gen, dtype=torch.bfloat16)
    ops.act_quant(buf[:, :256])
    kept = len(plans.plans)
    got = ops.act_quant(buf[:, 1:257])
    assert len(plans.plans) == kept + 1
    assert same(got, fresh(ops.act_quant, buf[:, 1:257]))


def test_split_k_buffers_are_shared_grown_and_kept(monkeypatch):
    """One pair per device for every split-K launch: reused while big enough, grown at least twofold
    with the replaced pair kept alive (a captured graph may still use it), counters zero."""
    from quantcore.runtime import workspace

    # From no buffers, whatever other tests of this process allocated on the CPU.
    monkeypatch.setattr(workspace, "_current", {})
    monkeypatch.setattr(workspace, "_retired", [])
    device = torch.device("cpu")
    first = workspace.buffers(device, 100, 3)
    assert workspace.buffers(device, 50, 2) is first
    grown = workspace.buffers(device, 150, 3)
    assert grown[0].numel() >= 200 and grown[1].numel() >= 6
    assert any(c is first[1] for c in workspace.counters()) and not any(c.any() for c in workspace.counters())



def _register_fake(launch):
    impl = Impl("act_quant", "fake", launch, Constraints(devices=("cpu",)))
    registry.register(impl)
    return impl


def _outputs(x, qdtype, rows):
    """act_quant's results for x [M, K] as a fake launch makes them, with leading dims `rows`."""
    return torch.zeros((*rows, x.shape[-1]), dtype=qdtype), torch.ones((*rows, 2))


@pytest.mark.parametrize("reads_addresses", [True, False])
def test_a_launch_reading_only_addresses_is_given_the_input_itself(gen, reads_addresses):
    """[2, 3, K] is flattened to a [6, K] view at the same address: a `by_address` run is handed the
    caller's tensor on replays (no view made per call), any other run the view."""
    from quantcore.runtime.launch import by_address, prepared

    seen = []

    @prepared
    def launch(x, *, qdtype, group_size, ue8m0, eps, scale_m_major, profile):
        def run(x):
            seen.append((x.shape, x.data_ptr()))
            return _outputs(x, qdtype, (6,))
        return by_address(run) if reads_addresses else run

    impl = _register_fake(launch)
    try:
        xs = [randn((2, 3, 256), gen=gen) for _ in range(3)]
        for x in xs:
            q, s = ops.act_quant(x, backend="fake")
            assert q.shape == (2, 3, 256) and s.shape == (2, 3, 2)
        replayed = (2, 3, 256) if reads_addresses else (6, 256)
        assert seen[1:] == [(replayed, x.data_ptr()) for x in xs[1:]]
    finally:
        registry.unregister(impl)


@pytest.mark.parametrize("keyword_only", [False, True])
def test_a_launch_given_the_leading_dims_shapes_its_results(gen, keyword_only):
    """A prepare stage with a `lead` keyword is given the caller's leading dims and its results are
    returned as they are (no reshape); replays take the inputs positionally where the run's
    parameters allow it and by name where not, with the same results."""
    from quantcore.runtime.launch import by_address, prepared

    leads, results = [], []

    @prepared
    def launch(x, *, qdtype, group_size, ue8m0, eps, scale_m_major, profile, lead=None):
        leads.append(lead)

        def positional(x):
            results.append(_outputs(x, qdtype, lead or x.shape[:1]))
            return results[-1]

        def by_name(*, x):
            return positional(x)
        return by_address(by_name if keyword_only else positional)

    impl = _register_fake(launch)
    try:
        for _ in range(3):
            got = ops.act_quant(randn((2, 3, 256), gen=gen), backend="fake")
            assert got[0] is results[-1][0] and got[1] is results[-1][1]
            assert got[0].shape == (2, 3, 256)
        assert leads == [(2, 3)]
        assert launch(randn((6, 256), gen=gen), qdtype=torch.int8, group_size=128, ue8m0=False, eps=1e-4,
                      scale_m_major=False, profile=None)[0].shape == (6, 256)  # no lead: the contract's [M, K]
    finally:
        registry.unregister(impl)


def test_allocator_gives_fresh_contiguous_tensors():
    from quantcore.runtime.launch import allocator

    with torch.inference_mode():
        new = allocator((2, 1, 5), torch.bfloat16, torch.device("cpu"))
        inside = new()
    a, b = new(), new()
    for t in (a, b, inside):
        assert t.shape == (2, 1, 5) and t.dtype == torch.bfloat16 and t.is_contiguous()
        assert t.stride() == (5, 5, 1)
    assert a.data_ptr() != b.data_ptr()
    assert inside.is_inference() and not a.is_inference()  # the mode of each call, as torch.empty
    assert allocator((0, 7), torch.float32, torch.device("cpu"))().shape == (0, 7)



def test_a_composed_quant_linear_passes_the_leading_dims_on_only_when_given(gen):
    """`prepared_quant_linear` hands `lead` to its scaled_mm when the caller gives it and the scaled_mm
    takes it, prepares one whose prepare has no `lead` at all (the Gluon kernel's) without it and views
    its [M, N] result in the leading dims; its run takes the caller's tensors (`by_address`) wherever
    act_quant's does, whatever the GEMM's run does (x reaches act_quant alone)."""
    from quantcore.runtime.launch import by_address, prepared, prepared_quant_linear

    def quantizer(addresses):
        @prepared
        def act_quant(x, *, qdtype, group_size, ue8m0, eps, scale_m_major, profile):
            def run(x):
                return torch.zeros((6, 256), dtype=qdtype), torch.ones(6, 2)
            return by_address(run) if addresses else run
        return act_quant

    @prepared
    def scaled_mm(a, a_scale, b, b_scale, *, block_n, block_k, bias, activation, out_dtype, out_quant, out_group,
                  ue8m0_out, eps, profile):
        return lambda a, a_scale, b, b_scale, bias=None: torch.zeros((a.shape[0], b.shape[0]), dtype=out_dtype)

    @prepared
    def scaled_mm_with_lead(a, a_scale, b, b_scale, *, block_n, block_k, bias, activation, out_dtype, out_quant,
                            out_group, ue8m0_out, eps, profile, lead=None):
        rows = lead or (a.shape[0],)
        return lambda a, a_scale, b, b_scale, bias=None: torch.zeros((*rows, b.shape[0]), dtype=out_dtype)

    x, w, w_s = randn((6, 256), gen=gen), torch.zeros((40, 256), dtype=torch.int8), torch.ones(1, 2)
    kw = dict(block_n=128, block_k=128, bias=None, activation=None, out_dtype=torch.float32, ue8m0=False, eps=1e-4,
              profile=None)
    plain = prepared_quant_linear(quantizer(False), scaled_mm, x, w, w_s, **kw)
    assert plain(x, w, w_s).shape == (6, 40) and not getattr(plain, "by_address", False)
    with_lead = prepared_quant_linear(quantizer(True), scaled_mm_with_lead, x, w, w_s, lead=(2, 3), **kw)
    assert with_lead(x, w, w_s).shape == (2, 3, 40) and with_lead.by_address
    viewed = prepared_quant_linear(quantizer(True), scaled_mm, x, w, w_s, lead=(2, 3), **kw)
    assert viewed(x.view(2, 3, 256), w, w_s).shape == (2, 3, 40) and viewed.by_address


def _counting(monkeypatch):
    """Calls of the dispatcher's full path (`dispatch._plan`), counted: 0 for a call its op's public
    function replayed from a kept plan inline."""
    calls = []
    real = dispatch._plan

    def counted(*args):
        calls.append(args[0])
        return real(*args)
    monkeypatch.setattr(dispatch, "_plan", counted)
    return calls


@pytest.mark.parametrize("call", ["act_quant", "scaled_mm bias", "weight_dequant list", "quant_linear"])
def test_a_repeated_call_is_replayed_inline(gen, monkeypatch, call):
    """The key an op's public function computes inline (`dispatch.entry`) is the one its plan was kept
    under: a second call of the same signature never reaches the full path, and computes what a fresh
    one does. A list block_size (the custom ops' schema passes lists) is kept too."""
    w, w_s = ops.weight_quant(randn((40, 256), gen=gen))
    bias = randn((40,), gen=gen)

    def run(x):
        if call == "act_quant":
            return ops.act_quant(x)
        if call == "scaled_mm bias":
            return ops.scaled_mm(*ops.act_quant(x), w, w_s, bias=bias)
        if call == "weight_dequant list":
            return ops.weight_dequant(w, w_s, block_size=[128, 128])
        return ops.quant_linear(x, w, w_s)

    calls = _counting(monkeypatch)
    run(randn((3, 256), gen=gen))
    assert calls  # the first call takes the full path
    calls.clear()
    x = randn((3, 256), gen=gen)
    got = run(x)
    assert calls == []
    assert same(got, fresh(run, x))


@pytest.mark.parametrize("case", ["check_finite", "subclass", "backend list", "other dtype"])
def test_what_is_not_kept_or_differs_takes_the_full_path(gen, monkeypatch, case):
    """Calls that must be validated again reach the full path on every call: check_finite, tensor
    subclasses, a signature of its own; a priority list as `backend` is kept under its own key."""
    x = randn((2, 256), gen=gen)
    ops.act_quant(x)

    class Sub(torch.Tensor):
        pass

    calls = _counting(monkeypatch)
    for _ in range(2):
        if case == "check_finite":
            ops.act_quant(x, check_finite=True)
        elif case == "subclass":
            ops.act_quant(x.as_subclass(Sub))
        elif case == "backend list":
            ops.act_quant(x, backend=["torch"])
        else:
            ops.act_quant(x.half())
    assert len(calls) == (1 if case in ("backend list", "other dtype") else 2)
