"""The FP8 -> fp16 decode of the W8A16 GEMM on the CPU: the packed PTX routine run through a model of
its instructions for every code, the interpreter's choice of the integer route, and offline compiles
for sm_75 … sm_90 (ptxas accepts the routine; the GEMM decodes each operand tile once per K block).
The GPU suite (tests/gpu/test_w8a16.py) runs the routine itself."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

# As in test_triton_kernels: interpreted kernels in this process only where there is no GPU.
pytest.importorskip("triton")
from quantcore.backends.triton.kernels import fp8  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------
# the PTX routine, instruction by instruction, on numpy uint32 registers

def _prmt(a, b, selector):
    """PTX prmt.b32 (default mode): byte i of the result is byte (nibble i & 7) of {b, a}, or that
    byte's sign bit replicated when the nibble's bit 3 is set."""
    pool = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = np.zeros_like(a)
    for i in range(4):
        nibble = (selector >> (4 * i)) & 0xF
        byte = pool[nibble & 7]
        if nibble & 8:
            byte = np.where(byte & 0x80, 0xFF, 0).astype(np.uint32)
        out |= byte << np.uint32(8 * i)
    return out


def _lop3(a, b, c, lut):
    out = np.zeros_like(a)
    for k in range(8):
        if lut >> k & 1:
            out |= (a if k & 4 else ~a) & (b if k & 2 else ~b) & (c if k & 1 else ~c)
    return out


def _mul_f16x2(a, b):
    halves = [((x >> np.uint32(s)) & 0xFFFF).astype(np.uint16).view(np.float16) for x in (a, b) for s in (0, 16)]
    lo, hi = (halves[0] * halves[2]).view(np.uint16), (halves[1] * halves[3]).view(np.uint16)
    return lo.astype(np.uint32) | (hi.astype(np.uint32) << np.uint32(16))


def run_ptx(asm: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Execute the straight-line b32 PTX of `asm` (the instructions the routine uses) on uint32 arrays."""
    regs = dict(inputs)

    def val(token):
        token = token.strip()
        return regs[token] if token in regs else np.uint32(int(token, 0))

    ops = {
        "and.b32": lambda x, y: x & y,
        "add.u32": lambda x, y: x + y,
        "shr.b32": lambda x, y: x >> y,
        "shl.b32": lambda x, y: x << y,
        "mov.b32": lambda x: x + np.uint32(0) * x,
        "prmt.b32": lambda x, y, s: _prmt(x, y, int(s)),
        "lop3.b32": lambda x, y, z, lut: _lop3(x, y, z, int(lut)),
        "mul.rn.f16x2": _mul_f16x2,
    }
    for line in asm.splitlines():
        line = line.split("//")[0].strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        opcode, operands = line.split(None, 1)
        dst, *srcs = [t.strip() for t in operands.split(",")]
        assert opcode in ops, f"the model has no {opcode}: extend it with the routine"
        regs[dst] = np.asarray(ops[opcode](*map(val, srcs)), dtype=np.uint32)
    return regs


def test_packed_routine_decodes_every_code_in_every_byte_position():
    codes = np.arange(256, dtype=np.uint32)
    expected = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).to(torch.float16)
    expected = expected.view(torch.int16).numpy().astype(np.uint16)
    nan = (codes & 0x7F) == 0x7F
    for pos in range(4):
        # The other three bytes hold other codes (all ones, a NaN code), so no carry or shift leaks.
        word = (np.uint32(0xFFFFFFFF) & ~np.uint32(0xFF << (8 * pos))) | (codes << np.uint32(8 * pos))
        regs = run_ptx(fp8._PACKED_F16.value, {"$2": word})
        half = (regs["$0"] if pos < 2 else regs["$1"]) >> np.uint32(16 * (pos % 2)) & 0xFFFF
        got = half.astype(np.uint16)
        assert np.array_equal(got[~nan], expected[~nan]), f"byte {pos}: {np.flatnonzero(got != expected)}"
        assert np.isnan(got[nan].view(np.float16)).all()


def test_model_runs_the_integer_routes_known_answers():
    # The model itself: prmt's selectors and lop3's table on values worked out by hand.
    a, b = np.array([0x03020100], np.uint32), np.array([0x87868584], np.uint32)
    assert _prmt(a, b, 0x5140)[0] == 0x85018400
    assert _prmt(a, b, 0x000C)[0] == 0x000000FF  # byte 4 (0x84) has its sign bit set: replicated
    assert _lop3(np.array([0xF0], np.uint32), np.array([0xCC], np.uint32), np.array([0xAA], np.uint32), 0xF8)[0] \
        == 0xF0 | (0xCC & 0xAA)


def test_interpreter_takes_the_integer_route():
    # The interpreter runs no inline assembly; Triton and fp8.py decide it at import alike.
    assert bool(fp8.PACKED_DECODE) == (os.environ.get("TRITON_INTERPRET") != "1")


# ---------------------------------------------------------------------------------------------
# offline compiles: PTX and cubin for each architecture, the GEMM's TTGIR

_COMPILE = textwrap.dedent('''
    import json
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from quantcore.backends.triton.kernels import fp8
    from quantcore.backends.triton.kernels.gemm import block_scaled_mm_kernel

    @triton.jit
    def decode(src, dst, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(dst + offs, fp8.fp8e4m3_decode_f16(tl.load(src + offs)))

    def gemm_ttgir(cc):
        names = block_scaled_mm_kernel.arg_names
        consts = dict(QFMT="fp8", USE_FP8_MMA=False, TMA=False, SCALE_BN=128, BIAS="none", ACTIVATION="none",
                      OUT="bf16", OUT_GROUP=1, UE8M0_OUT=False, TINY_SCALES=True, HW_FP8=False, BLOCK_M=128,
                      BLOCK_N=128, BLOCK_K=128, K_STEP=1, BLOCK_KS=128, GROUP_M=8, SPLIT=False, a_desc=None,
                      b_desc=None)
        sig, attrs = {}, {}
        for i, n in enumerate(names):
            if n in consts:
                sig[n] = "constexpr"
            elif n.endswith("_ptr"):
                sig[n] = {"a_ptr": "*u8", "b_ptr": "*u8", "out_ptr": "*i16"}.get(n, "*fp32")
            else:
                sig[n] = "fp32" if n == "eps" else "i32"
            if n.endswith("_ptr") or n.startswith("stride") or n in ("N", "K"):
                attrs[(i,)] = [["tt.divisibility", 16]]  # as the launch specialises: loads then pipeline
        src = triton.compiler.ASTSource(block_scaled_mm_kernel, sig, {(names.index(k),): v for k, v in consts.items()},
                                        attrs)
        return triton.compile(src, target=GPUTarget("cuda", cc, 32), options=dict(num_warps=8, num_stages=3)).asm["ttgir"]

    out = {"packed": bool(fp8.PACKED_DECODE), "ptx": {}, "ttgir": {}}
    for cc in (75, 80, 86, 90):
        src = triton.compiler.ASTSource(decode, {"src": "*u8", "dst": "*fp16", "BLOCK": "constexpr"}, {(2,): 1024})
        k = triton.compile(src, target=GPUTarget("cuda", cc, 32), options=dict(num_warps=4))
        out["ptx"][cc] = [k.asm["ptx"].count("prmt.b32"), len(k.asm["cubin"])]
    for cc in (80, 90):
        out["ttgir"][cc] = gemm_ttgir(cc)
    print(json.dumps(out))
''')


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """Compile in a process of its own, without the interpreter (this one may run it)."""
    script = tmp_path_factory.mktemp("compile") / "compile_w8a16.py"
    script.write_text(_COMPILE)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0 and "ptxas" in done.stderr and "not found" in done.stderr.lower():
        pytest.skip("Triton's ptxas is not installed")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_compiled_kernels_take_the_packed_route_and_ptxas_accepts_it(compiled):
    assert compiled["packed"]
    for cc, (prmts, cubin_bytes) in compiled["ptx"].items():
        assert prmts >= 2 and cubin_bytes > 0, cc  # one routine is 2 prmt; ptxas built a cubin


def test_gemm_decodes_each_operand_tile_once_per_k_block(compiled):
    for cc, ttgir in compiled["ttgir"].items():
        loop = ttgir[ttgir.index("scf.for"):]
        loop = loop[:loop.index("scf.yield")]
        decodes = re.findall(r"elementwise_inline_asm .*: (tensor<\d+x\d+xi8, #\w+>) -> (tensor<\d+x\d+xf16, #\w+>)",
                             loop)
        # One per operand, on the layout it was loaded in (#blocked, not an MMA operand layout that
        # each warp would decode its own copies of), its result staged in shared memory.
        assert sorted(d[0].split(",")[0] for d in decodes) == ["tensor<128x128xi8", "tensor<128x128xi8"], cc
        assert all("#blocked" in src and "#blocked" in dst for src, dst in decodes), (cc, decodes)
        assert len(re.findall(r"ttg.local_alloc %\S+ : \(tensor<128x128xf16, #blocked\d*>\)", loop)) == 2, cc
