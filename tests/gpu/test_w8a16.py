"""The W8A16 GEMM (FP8 decoded to fp16 where the GPU has no FP8 MMA) on the GPU: the packed PTX decode
against the integer decode for every code, and scaled_mm / quant_linear under simulate("sm80") bit for
bit what the kernels computed before the packed decode (integer decode per MMA fragment, 128x64 tiles, no
predecode), run in a process of their own since the decode route is fixed per process (kernels/fp8.py).

Run on a GPU machine: `python3 -m pytest -m gpu tests/gpu/test_w8a16.py`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import quantcore
from quantcore import ops

from test_parity import rand

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from quantcore.backends.triton.kernels.fp8 import fp8e4m3_decode_f16_lanes, fp8e4m3_decode_f16_packed  # noqa: E402

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]


@triton.jit
def _decode_both(src, packed, lanes, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(src + offs)
    tl.store(packed + offs, fp8e4m3_decode_f16_packed(x))
    tl.store(lanes + offs, fp8e4m3_decode_f16_lanes(x))


def test_packed_decode_equals_the_integer_decode_for_every_code():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    # Each code at each of the 4 byte positions of a register, whatever the layout groups together.
    src = torch.cat([torch.roll(codes, s) for s in range(4)] * 4).cuda()
    packed, lanes = (torch.empty(src.shape, dtype=torch.float16, device="cuda") for _ in range(2))
    _decode_both[(1,)](src, packed, lanes, BLOCK=src.numel())
    expected = src.view(torch.float8_e4m3fn).to(torch.float16)
    nan = expected.isnan()
    assert torch.equal(packed.isnan(), nan) and torch.equal(lanes.isnan(), nan)
    for got in (packed, lanes):  # signed zeros and subnormals included: compare bits
        assert torch.equal(got.view(torch.int16)[~nan], expected.view(torch.int16)[~nan])


# M <= 64 runs the decode kernel (quant_linear at M <= 4 quantizes in its prologue), the rest the tiled kernel,
# M = 4096 on operands predecoded to fp16 (configs.predecode); tails in every dimension.
SHAPES = [(1, 2112, 7168), (16, 7168, 2048), (4, 129, 576), (128, 4096, 7168), (300, 1000, 1040),
          (65, 200, 7296), (4096, 2112, 7168)]

_BEFORE = textwrap.dedent('''
    import sys
    import torch
    import triton.language as tl
    import quantcore
    from quantcore import ops
    from quantcore.backends.triton import configs
    from quantcore.backends.triton.kernels import fp8

    # The kernels before the packed decode: the integer route (decoded per MMA fragment), their tiles,
    # no predecode; in the table the launches read under simulate("sm80").
    fp8.PACKED_DECODE = tl.constexpr(False)
    table = configs._table(configs._arch(quantcore.capability.simulated_profile("sm80")))
    next(r for r in table["gemm"] if r["mma"] == "fp16")["configs"] = [[128, 64, 8, 3], [64, 128, 8, 3], [64, 64, 4, 3]]
    table["predecode"] = None
    cases = torch.load(sys.argv[1])
    with quantcore.simulate("sm80"):
        out = [getattr(ops, op)(*args, backend="triton", **kwargs) for op, args, kwargs in cases]
    torch.save(out, sys.argv[2])
''')


def _cases():
    cases = []
    for i, (m, n, k) in enumerate(SHAPES):
        x = rand((m, k), seed=10 + i)
        w, w_s = ops.weight_quant(rand((n, k), seed=50 + i), backend="torch")
        a, a_s = ops.act_quant(x, backend="torch")
        bias = rand((n,), seed=90 + i)
        cases += [("scaled_mm", (a, a_s, w, w_s), dict(out_dtype=torch.float32)),
                  ("scaled_mm", (a, a_s, w, w_s), dict(bias=bias, activation="silu")),
                  ("quant_linear", (x, w, w_s), dict(out_dtype=torch.float32))]
    return cases


def test_scaled_mm_under_sm80_is_bit_identical_to_the_integer_decode(tmp_path):
    cases = _cases()
    torch.save(cases, tmp_path / "cases.pt")
    (tmp_path / "before.py").write_text(_BEFORE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(tmp_path / "before.py"), str(tmp_path / "cases.pt"),
                           str(tmp_path / "before.pt")], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    before = torch.load(tmp_path / "before.pt")
    with quantcore.simulate("sm80"):
        for (op, args, kwargs), old in zip(cases, before):
            assert quantcore.explain(op, *args, backend="triton", **kwargs).selected == "triton[w8a16]"
            new = getattr(ops, op)(*args, backend="triton", **kwargs)
            shape = "x".join(map(str, (args[0].shape[0], args[-2].shape[0], args[0].shape[1])))
            assert new.dtype == old.dtype and not new.isnan().any(), (op, shape)
            assert torch.equal(new.view(torch.int16 if new.element_size() == 2 else torch.int32),
                               old.view(torch.int16 if old.element_size() == 2 else torch.int32)), (op, shape, kwargs)


def test_bench_times_the_fallback_rows_beside_the_baselines():
    import importlib

    bench_run = importlib.import_module("quantcore.bench.run")  # the module, not the function of that name
    records = bench_run._gemm_records("fp8_e4m3", torch.float8_e4m3fn, 128, 2112, 7168, True, ("sm80", "sm75"))
    rows = {r.impl: r for r in records}
    assert rows["cublas-bf16"].us > 0 and rows["triton"].us > 0  # this GPU's own rows are still there
    assert rows["triton@sm80"].note == "ran triton[w8a16]" and rows["triton@sm80"].us > 0
    assert rows["cupy@sm75"].note == "ran cupy[w8a16]" and rows["cupy@sm75"].us > 0
    assert rows["triton@sm75"].us is None and "cannot run" in rows["triton@sm75"].note  # Triton needs sm_80+
