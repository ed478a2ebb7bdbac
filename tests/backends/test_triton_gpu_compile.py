"""Every Triton kernel that the selection launches on an H100 (sm_90) and an A100 (sm_80) compiles for that
GPU, without one.

Each case calls public ops (`quantcore.ops`) on CPU tensors in a child process where the CPU is described as
the GPU (`capability.cpu_profile` returns its simulated profile, so that validation, selection and the launch
plans are the GPU's: FP8 tensor cores and TMA on sm_90; FP8 decoded to fp16 and FP8 encoded on its bits on
sm_80) and the Triton launcher compiles each launch for it (`GPUTarget("cuda", 90 or 80, 32)`, the JIT's own
specialisation of the arguments) instead of running it. The interpreter tests run the same kernels' arithmetic but not the
compiler, which refuses what the interpreter accepts: a tl.dot of 8-bit operands over a K tile under 32, a
size of 1 that the JIT passes as a Python int; nor does it check a kernel's shared memory against the GPU's,
which this does. Outputs are never written here; correctness is the
interpreter tests' and the GPU suite's. The child runs without TRITON_INTERPRET, as in
test_gluon_compile.py.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]


def _quant(ops, torch):
    """The memory-bound ops and the fused producers, FP8 and INT8 (fp32 and ue8m0 scales, both layouts),
    with tails and a norm over one element."""
    x = torch.randn(5, 300, dtype=torch.bfloat16)
    w = torch.randn(200, 300, dtype=torch.bfloat16)
    for qdtype, fmt, layout in ((torch.float8_e4m3fn, "fp32", "row"), (torch.int8, "ue8m0", "m_major")):
        kw = dict(dtype=qdtype, scale_fmt=fmt)
        yield "act_quant", ops.act_quant(x, scale_layout=layout, **kw)
        q, s = yield "act_quant", ops.act_quant(x, **kw)
        yield "act_dequant", ops.act_dequant(q, s)
        yield "quantized_gelu", ops.quantized_gelu(q, s)
        wq, ws = yield "weight_quant", ops.weight_quant(w, **kw)
        yield "weight_dequant", ops.weight_dequant(wq, ws)
        r = torch.randn_like(x)
        yield "rms_norm_quant", ops.rms_norm_quant(x, torch.randn(300, dtype=torch.bfloat16), r, group_size=96,
                                                   scale_layout=layout, **kw)
        yield "rms_norm_quant H=1", ops.rms_norm_quant(x[:, :1], torch.ones(1, dtype=torch.bfloat16), **kw)
        yield "silu_mul_quant", ops.silu_mul_quant(torch.randn(5, 512, dtype=torch.bfloat16), scale_layout=layout, **kw)
        counts = torch.tensor([3, 0], dtype=torch.int32)
        yield "silu_mul_quant masked", ops.silu_mul_quant(torch.randn(2, 4, 512, dtype=torch.bfloat16), counts, **kw)
    i32 = torch.randint(-9, 9, (5, 200), dtype=torch.int32)
    yield "dequant_bias", ops.dequant_bias(i32, torch.rand(5), torch.rand(200), torch.randn(200))


def _gemm(ops, torch, fmt):
    """scaled_mm and quant_linear in `fmt` at the sizes that pick each kernel: decode (M = 1…64, its fused
    quantizing prologues), the tiled GEMM (M = 128, 512; TMA on sm_90) with a re-quantized output, K and N tails."""
    qdtype = getattr(torch, fmt)
    w = torch.randn(384, 1024, dtype=torch.bfloat16)
    wq, ws = ops.weight_quant(w, dtype=qdtype)
    bias = torch.randn(384, dtype=torch.bfloat16)
    for M in (1, 4, 16, 64, 128, 512):
        x = torch.randn(M, 1024, dtype=torch.bfloat16)
        q, s = ops.act_quant(x, dtype=qdtype)
        yield f"scaled_mm M={M}", ops.scaled_mm(q, s, wq, ws, bias=bias, activation="gelu")
        yield f"quant_linear M={M}", ops.quant_linear(x, wq, ws, bias)
    q, s = ops.act_quant(torch.randn(512, 1024, dtype=torch.bfloat16), dtype=qdtype)
    yield "scaled_mm requant", ops.scaled_mm(q, s, wq, ws, out_quant=qdtype)
    tail, tail_s = ops.weight_quant(torch.randn(200, 1000, dtype=torch.bfloat16), dtype=qdtype)
    for M in (3, 300):
        q, s = ops.act_quant(torch.randn(M, 1000, dtype=torch.bfloat16), dtype=qdtype)
        yield f"scaled_mm tails M={M}", ops.scaled_mm(q, s, tail, tail_s, out_dtype=torch.float32)


def _experts(ops, torch):
    """The routing ops and the grouped GEMMs of both layouts, FP8 and INT8. The GEMMs take the reference's
    routing (the compiled permutes write nothing, and routing data on the CPU is checked)."""
    E, H, N, T, k = 4, 512, 256, 6, 2
    x = torch.randn(T, H, dtype=torch.bfloat16)
    ids = torch.tensor([[0, 1], [1, 2], [3, 0], [2, 1], [0, 3], [1, 0]], dtype=torch.int32)
    weights = torch.rand(T, k)
    for qdtype in (torch.float8_e4m3fn, torch.int8):
        b = torch.stack([ops.weight_quant(torch.randn(N, H, dtype=torch.bfloat16), dtype=qdtype)[0] for _ in range(E)])
        b_s = torch.rand(E, N // 128, H // 128)
        yield "moe_permute", ops.moe_permute(x, ids, E, dtype=qdtype)
        a, a_s, offsets, rows = ops.moe_permute(x, ids, E, dtype=qdtype, backend="torch")
        yield "grouped_mm", ops.grouped_mm(a, a_s, b, b_s, offsets)
        yield "grouped_mm requant", ops.grouped_mm(a, a_s, b, b_s, offsets, out_quant=qdtype)
        yield "moe_unpermute", ops.moe_unpermute(torch.randn(T * k, N, dtype=torch.bfloat16), rows, weights)
        yield "moe_permute_masked", ops.moe_permute_masked(x, ids, E, 8, dtype=qdtype)
        ma, ma_s, counts, _ = ops.moe_permute_masked(x, ids, E, 8, dtype=qdtype, backend="torch")
        yield "grouped_mm_masked", ops.grouped_mm_masked(ma, ma_s, b, b_s, counts, activation="silu")


CASES = {"quant": _quant, "experts": _experts, **{f"gemm {fmt}": functools.partial(_gemm, fmt=fmt)
                                                  for fmt in ("float8_e4m3fn", "int8")}}


ARCHS = ("sm90", "sm80")


@pytest.mark.parametrize("case", list(CASES))
def test_every_kernel_the_selection_launches_compiles(case):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, __file__, case], env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-6000:]
    calls = json.loads(run.stdout.strip().splitlines()[-1])
    assert {c["call"].split()[0] for c in calls} == set(ARCHS)
    failed = {c["call"]: c["error"] for c in calls if c["error"]}
    assert not failed, "\n\n".join(f"{call}:\n{error}" for call, error in failed.items())
    # Every call reached Triton: no fallback, nothing selected elsewhere.
    assert all(c["kernels"] for c in calls), [c["call"] for c in calls if not c["kernels"]]


def _child(case: str) -> list[dict]:
    """Run CASES[case] with the CPU described as each simulated GPU of ARCHS in turn and each launch compiled
    for it; per call "<arch> <name>", the kernels compiled and the first compile error (None when all compiled)."""
    import traceback

    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    from quantcore import capability, ops, priority, registry
    from quantcore.backends.triton import direct

    gpu = {}  # the GPU described now: its profile, compile target and Triton backend
    capability.cpu_profile = lambda: gpu["profile"]
    kernels: list[str] = []
    errors: list[str] = []

    def compile_instead(self, *args):
        args = tuple(args) + self.fixed
        args = [direct._kernel_view(a) for a in (self._described(args) if self.descriptors else args)]
        try:
            binder = create_function_from_signature(self.fn.signature, self.fn.params, gpu["backend"])
            bound, spec, options = binder(*args, **self.constants)
            options, signature, constexprs, attrs = self.fn._pack_args(gpu["backend"], self.constants, bound, spec,
                                                                       options)
            k = triton.compile(ASTSource(self.fn, signature, constexprs, attrs), target=gpu["target"],
                               options=options.__dict__)
            # A launch asking for more shared memory than a block may have fails on the GPU, not here.
            limit = gpu["profile"].smem_per_block
            if k.metadata.shared > limit:
                raise RuntimeError(f"{k.metadata.shared} bytes of shared memory, over {gpu['profile'].name}'s {limit}")
            kernels.append(self.fn.__name__)
        except Exception as exc:  # noqa: BLE001 - reported per call by the test
            errors.append(f"{self.fn.__name__} {self.constants}:\n{''.join(traceback.format_exception(exc))[-3000:]}")

    direct.Launcher._launch = compile_instead
    calls = []
    for arch in ARCHS:
        target = GPUTarget("cuda", int(arch[2:]), 32)
        gpu.update(profile=capability.simulated_profile(arch), target=target, backend=make_backend(target))
        registry.reset()  # plans and selections made for the GPU described before
        torch.manual_seed(0)
        steps, result, first = CASES[case](ops, torch), None, True
        with priority("triton"):
            while True:
                try:
                    name, result = next(steps) if first else steps.send(result)
                except StopIteration:
                    break
                first = False
                calls.append(dict(call=f"{arch} {name}", kernels=list(kernels), error=errors[0] if errors else None))
                kernels.clear()
                errors.clear()
    return calls


if __name__ == "__main__":  # the child process of the test
    import warnings

    warnings.simplefilter("ignore")
    print(json.dumps(_child(sys.argv[1])))
