"""The CuPy backend's launch path without a GPU.

Kernels are neither compiled nor launched here: `compiler.get_function` and CuPy's driver binding are
replaced by fakes, and each launch is read back from the parameter array the launcher hands the
driver, named by the kernel's own signature in kernels/*.cu. Checked: every launch function is
prepared; the packed parameters line up with the kernel's (this call's addresses, strides, sizes,
options); a kept `run` holds no tensor of the first call and binds each call's own; a bias is
converted per call only where the kernel cannot read it as it is; split-K's workspace comes from
backends/workspace.py, and a plan that cannot have it runs unsplit; the GEMM runs the MMA kind it is
given; the launcher reads the stream per call and makes the kernel's device current when it is not.
Also the variants' `mma` options: which GPUs and formats each serves.
"""

from __future__ import annotations

import ctypes
import gc
import re
import struct
import weakref
from types import SimpleNamespace

import pytest
import torch

from quantcore import UnsupportedError, capability, registry
from quantcore.registry import impl as impl_module
from quantcore.runtime import launch as base, workspace
from quantcore.backends import cupy as cupy_backend
from quantcore.definitions.query import GemmQuery
from quantcore.backends.cupy import compiler, launch, launcher, producers

FP8, I8, BF16 = torch.float8_e4m3fn, torch.int8, torch.bfloat16
SM90 = capability.simulated_profile("sm90")


def _signature(filename: str, kernel: str) -> list[tuple[str, str]]:
    """(name, kind) of each parameter of `kernel` in kernels/`filename`: kind "ptr", "i64", "i32" or "f32"."""
    source = compiler.kernel_sources()[filename]
    params = re.search(rf"__global__[^;{{]*?\b{kernel}\(([^)]*)\)", source, re.S)[1]
    out = []
    for p in params.split(","):
        name = re.findall(r"\w+", p)[-1]
        kind = "ptr" if "*" in p else "i64" if "long long" in p else "f32" if "float" in p else "i32"
        out.append((name, kind))
    return out


_CTYPES = {"float": torch.float32, "__nv_bfloat16": torch.bfloat16, "__half": torch.float16}
_BIAS_KINDS = [torch.float32, torch.bfloat16, torch.float16]  # gemm.cu's BiasKind


def _decode(kind: str, raw: int):
    if kind == "i32":
        return struct.unpack("<i", struct.pack("<I", raw & 0xFFFFFFFF))[0]
    if kind == "f32":
        return struct.unpack("<f", struct.pack("<I", raw & 0xFFFFFFFF))[0]
    return struct.unpack("<q", struct.pack("<Q", raw))[0] if kind == "i64" else raw


class Launches(list):
    """What ran: one SimpleNamespace(file, kernel, expr, grid, block, smem, stream, params, bias) per launch."""

    def __init__(self):
        super().__init__()
        self.functions: dict[int, tuple[str, str]] = {}
        self.compiled = 0  # get_function calls
        self.stream = 11
        self.context = 7


@pytest.fixture
def launches(monkeypatch):
    """Fakes for compiling, loading and launching; the launches made, as the kernels would see them."""
    seen = Launches()

    def get_function(filename, expr, profile, index, smem=0):
        seen.compiled += 1
        ptr = 1000 + len(seen.functions)
        seen.functions[ptr] = (filename, expr)
        return SimpleNamespace(ptr=ptr)

    def launch_kernel(f, gx, gy, gz, bx, by, bz, smem, stream, kernel_params, extra):
        filename, expr = seen.functions[f]
        kernel = re.match(r"qc::(\w+)", expr)[1]  # a template's instantiation, or a plain kernel
        sig = _signature(filename, kernel)
        addresses = (ctypes.c_uint64 * len(sig)).from_address(kernel_params)
        params = {name: _decode(kind, ctypes.c_uint64.from_address(a).value) for (name, kind), a in zip(sig, addresses)}
        bias = None
        if params.get("bias"):  # the bias the kernel would read (as fp32), while the caller keeps it alive
            dtype = (_BIAS_KINDS[params["bias_kind"]] if "bias_kind" in params
                     else _CTYPES[re.findall(r"[\w:]+", expr.split("<", 1)[1])[2]])  # dequant_bias's BiasT
            n, step = params["N"], params["bias_s"]
            raw = (ctypes.c_uint8 * (((n - 1) * step + 1) * dtype.itemsize)).from_address(params["bias"])
            bias = torch.frombuffer(bytearray(raw), dtype=dtype)[::step].float()
        seen.append(SimpleNamespace(file=filename, kernel=kernel, expr=expr, grid=(gx, gy, gz), block=(bx, by, bz),
                                    smem=smem, stream=stream, params=params, bias=bias))
        assert extra == 0

    driver = SimpleNamespace(launchKernel=launch_kernel, ctxGetCurrent=lambda: seen.context)
    monkeypatch.setattr(compiler, "get_function", get_function)
    monkeypatch.setattr(launcher, "_driver", lambda: driver)
    monkeypatch.setattr(launcher, "_primary_context", lambda index: 7)
    monkeypatch.setattr(launcher, "_stream_reader", lambda: lambda index: seen.stream)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)  # CPU tensors stand in for the GPU's
    return seen


def _randn(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def _q(*shape, dtype=FP8, seed=0):
    return _randn(*shape, seed=seed).clamp(-100, 100).to(dtype)


def _padded(t: torch.Tensor, pad: int = 16) -> torch.Tensor:
    """`t`'s values in a view with a row stride `pad` elements longer than its rows."""
    buf = torch.empty(t.shape[0], t.shape[1] + pad, dtype=t.dtype)
    buf[:, : t.shape[1]] = t
    return buf[:, : t.shape[1]]


def _gemm_options(**kw):
    return dict(dict(block_n=128, block_k=128, bias=None, activation=None, out_dtype=BF16, out_quant=None,
                     out_group=128, ue8m0_out=False, eps=1e-4, mma="fp8", profile=SM90), **kw)


# Each op: (launch function, a function of a seed giving fresh tensor arguments, options).
CASES = {
    "act_quant": (launch.act_quant, lambda s: dict(x=_padded(_randn(5, 300, dtype=BF16, seed=s))),
                  dict(qdtype=FP8, group_size=128, ue8m0=True, eps=1e-4, scale_m_major=True, profile=SM90)),
    "weight_quant": (launch.weight_quant, lambda s: dict(w=_randn(300, 200, seed=s)),
                     dict(qdtype=I8, block_n=128, block_k=64, ue8m0=False, eps=1e-4, profile=SM90)),
    "act_dequant": (launch.act_dequant, lambda s: dict(q=_q(5, 300, seed=s), scale=_randn(3, 5, seed=s).t()),
                    dict(group_size=128, out_dtype=torch.float16, profile=SM90)),
    "weight_dequant": (launch.weight_dequant, lambda s: dict(q=_q(300, 200, dtype=I8, seed=s), scale=_randn(3, 2, seed=s)),
                       dict(block_n=128, block_k=128, out_dtype=BF16, profile=SM90)),
    "quantized_gelu": (launch.quantized_gelu, lambda s: dict(q=_q(5, 300, seed=s), scale=_randn(5, 3, seed=s)),
                       dict(group_size=128, approximate="tanh", out_qdtype=I8, ue8m0=False, eps=1e-4, profile=SM90)),
    "dequant_bias": (launch.dequant_bias,
                     lambda s: dict(g=_randn(5, 300, seed=s), scale_a=_randn(5, seed=s), scale_b=_randn(300, seed=s),
                                    bias=_randn(300, seed=s)),
                     dict(out_dtype=BF16, profile=SM90)),
    "scaled_mm": (launch.scaled_mm,
                  lambda s: dict(a=_q(3, 256, seed=s), a_scale=_randn(2, 3, seed=s).t(), b=_q(300, 256, seed=s),
                                 b_scale=_randn(3, 2, seed=s)),
                  _gemm_options(out_quant=I8, out_group=64)),
    "quant_linear": (launch.quant_linear,
                     lambda s: dict(x=_randn(3, 256, dtype=BF16, seed=s), w=_q(300, 256, dtype=I8, seed=s),
                                    w_scale=_randn(3, 2, seed=s)),
                     dict(block_n=128, block_k=128, bias=None, activation="silu", out_dtype=torch.float32,
                          ue8m0=True, eps=1e-4, mma="int8", profile=SM90)),
    "rms_norm_quant": (producers.rms_norm_quant,
                       lambda s: dict(x=_padded(_randn(5, 300, dtype=BF16, seed=s)), weight=_randn(300, seed=s),
                                      residual=_randn(5, 300, dtype=BF16, seed=s)),
                       dict(eps=1e-6, qdtype=FP8, group_size=128, ue8m0=True, quant_eps=1e-4, scale_m_major=True,
                            profile=SM90)),
    "silu_mul_quant": (producers.silu_mul_quant,
                       lambda s: dict(gate_up=_randn(6, 600, dtype=BF16, seed=s),
                                      masked_m=torch.tensor([1, s], dtype=torch.int32)),
                       dict(qdtype=I8, group_size=128, ue8m0=False, eps=1e-4, scale_m_major=False, profile=SM90)),
}


# Launches of several kernels, or of kernels taking their tensors in another order, checked in files of their own.
ELSEWHERE = {"grouped_mm", "grouped_mm_masked",  # test_cupy_grouped.py
             "moe_permute", "moe_permute_masked", "moe_unpermute"}  # test_cupy_routing.py


def test_every_cupy_launch_function_is_prepared():
    assert {impl.op for impl in cupy_backend.IMPLS} == set(CASES) | ELSEWHERE
    for impl in cupy_backend.IMPLS:
        assert hasattr(impl.function(), "prepare"), impl.op


def test_act_quant_parameters(launches):
    fn, make, options = CASES["act_quant"]
    x = make(0)["x"]
    q, s = fn(x, **options)
    (run,) = launches
    assert run.kernel == "quant_kernel" and run.expr == "qc::quant_kernel<__nv_bfloat16, qc::Fp8E4M3, 4, 32, 1>"
    assert run.block == (256, 1, 1) and run.stream == launches.stream
    assert run.params == dict(x=x.data_ptr(), ldx=316, q=q.data_ptr(), ldq=300, scale=s.data_ptr(), ss_r=1, ss_c=5,
                              R=5, C=300, BR=1, BC=128, eps=pytest.approx(1e-4, rel=1e-7), ue8m0=1)
    assert s.shape == (5, 3) and s.stride() == (1, 5)  # the M-major layout the strides above write


def test_rms_norm_quant_parameters(launches):
    """One thread block of 256 per row; the sum's vector (4 bf16: 300 and the row strides have no 8) and its
    passes (a 512-wide power of two over 256 × 4: one); a 128-wide group is 32 threads' chunks, quantized
    from the registers the sum read."""
    fn, make, options = CASES["rms_norm_quant"]
    tensors = make(0)
    q, s, new_residual = fn(**tensors, **options)
    (run,) = launches
    assert run.expr == "qc::rms_norm_quant_kernel<__nv_bfloat16, float, float, qc::Fp8E4M3, 4, 1, true, 32, 1, 1, 1>"
    assert run.grid == (5, 1, 1) and run.block == (256, 1, 1)
    assert run.params == dict(x=tensors["x"].data_ptr(), ldx=316, w=tensors["weight"].data_ptr(),
                              res=tensors["residual"].data_ptr(), ldr=300, q=q.data_ptr(), scale=s.data_ptr(), ss_r=1,
                              ss_c=5, new_res=new_residual.data_ptr(), H=300, G=128,
                              eps=pytest.approx(1e-6, rel=1e-7), quant_eps=pytest.approx(1e-4, rel=1e-7), ue8m0=1)
    assert s.shape == (5, 3) and s.stride() == (1, 5) and new_residual.shape == (5, 300)


def test_silu_mul_quant_parameters(launches):
    fn, make, options = CASES["silu_mul_quant"]
    tensors = make(4)
    q, s = fn(**tensors, **options)
    (run,) = launches
    assert run.expr == "qc::silu_mul_quant_kernel<__nv_bfloat16, qc::Int8, 4, 32, 1>"
    assert run.params == dict(x=tensors["gate_up"].data_ptr(), ld=600, counts=tensors["masked_m"].data_ptr(),
                              rows_per_expert=3, q=q.data_ptr(), ldq=300, scale=s.data_ptr(), ss_r=3, ss_c=1, R=6,
                              C=300, BR=1, BC=128, eps=pytest.approx(1e-4, rel=1e-7), ue8m0=0)
    fn(tensors["gate_up"], None, **options)
    assert launches[-1].params["counts"] == 0 and launches[-1].params["rows_per_expert"] == 1


def test_gemm_parameters(launches):
    a, b = _padded(_q(3, 256), 32), _q(300, 256)
    a_s, b_s = _randn(2, 3).t(), _randn(3, 2)
    bias = _randn(300)
    out = launch.scaled_mm(a, a_s, b, b_s, **_gemm_options(bias=bias, activation="gelu_tanh", out_dtype=torch.float16,
                                                           block_n=96, profile=capability.simulated_profile("sm90")))
    (run,) = launches
    p = run.params
    assert run.kernel == "gemm_kernel"
    assert {k: p[k] for k in ("a", "lda", "as", "as_m", "as_k", "b", "ldb", "bs", "bs_n", "bs_k", "bias", "out", "ldo")} == dict(
        a=a.data_ptr(), lda=288, **{"as": a_s.data_ptr()}, as_m=1, as_k=3, b=b.data_ptr(), ldb=256,
        bs=b_s.data_ptr(), bs_n=2, bs_k=1, bias=bias.data_ptr(), out=out.data_ptr(), ldo=300)
    assert (p["out_scale"], p["M"], p["N"], p["K"], p["block_n"], p["block_k"]) == (0, 3, 300, 256, 96, 128)
    assert (p["act"], p["out_kind"], p["ue8m0_out"]) == (2, 2, 0)  # gelu_tanh, fp16
    assert p["eps"] == pytest.approx(1e-4, rel=1e-7)
    tile = launch.gemm_tile(3)
    assert run.grid[:2] == (1, 5) and run.block == (tile.wm * tile.wn * 32, 1, 1)
    assert run.smem == launch.gemm_stages(tile, SM90.smem_per_block)[1]


@pytest.mark.parametrize("op", list(CASES))
def test_a_kept_run_binds_each_calls_tensors_and_holds_none_of_the_first(launches, op):
    fn, make, options = CASES[op]
    first = make(1)
    alive = [weakref.ref(t) for t in first.values()]
    run = fn.prepare(**first, **options)
    compiled = launches.compiled
    del first
    gc.collect()
    assert all(ref() is None for ref in alive), "run keeps a tensor of the first call"
    for seed in (2, 3):
        tensors = make(seed)
        result = run(**tensors)
        assert launches.compiled == compiled, "run looked a kernel up again"
        inputs = [t.data_ptr() for t in tensors.values()]
        outputs = [o.data_ptr() for o in (result if isinstance(result, tuple) else (result,))]
        assert _addresses(launches[-1]) == inputs + outputs  # quant_linear of 3 rows: one launch


def _addresses(run) -> list[int]:
    """The tensor addresses a launch passed (absent tensors, 0, left out), in parameter order."""
    return [run.params[name] for name, kind in _signature(run.file, run.kernel)
            if kind == "ptr" and name not in ("ws", "counters") and run.params[name]]


@pytest.mark.parametrize("bias_of", [
    lambda n, s: _randn(n, seed=s),  # fp32: read as it is
    lambda n, s: _randn(n, dtype=BF16, seed=s),  # bf16: read as it is
    lambda n, s: _randn(2 * n, dtype=torch.float16, seed=s)[::2],  # fp16 with a stride: read as it is
    lambda n, s: _randn(n, dtype=torch.float64, seed=s),  # converted per call
], ids=["fp32", "bf16", "strided fp16", "fp64"])
@pytest.mark.parametrize("op", ["scaled_mm", "dequant_bias"])
def test_bias_is_converted_per_call_only_when_needed(launches, op, bias_of):
    N = 300
    if op == "scaled_mm":
        tensors = dict(a=_q(3, 256), a_scale=_randn(3, 2), b=_q(N, 256), b_scale=_randn(3, 2))
        run = launch.scaled_mm.prepare(**tensors, **_gemm_options(bias=bias_of(N, 0)))
    else:
        tensors = dict(g=_randn(5, N), scale_a=_randn(5), scale_b=_randn(N))
        run = launch.dequant_bias.prepare(**tensors, bias=bias_of(N, 0), out_dtype=BF16, profile=SM90)
    for seed in (1, 2):
        bias = bias_of(N, seed)
        run(**tensors, bias=bias)
        as_is = bias.dtype != torch.float64
        assert (launches[-1].params["bias"] == bias.data_ptr()) == as_is
        assert torch.equal(launches[-1].bias, bias.float())  # this call's bias, never a kept copy


@pytest.mark.parametrize("mma,dtype", [("fp8", FP8), ("int8", I8), ("fp16", FP8)])
def test_the_gemm_runs_the_mma_kind_it_is_given(launches, mma, dtype):
    a, b = _q(16, 256, dtype=dtype), _q(64, 256, dtype=dtype)
    launch.scaled_mm(a, _randn(16, 2), b, _randn(1, 2), **_gemm_options(mma=mma))
    assert launches[-1].expr.startswith(f"qc::gemm_kernel<{launch.MMA_KIND[mma]}, ")
    other = "int8" if mma != "int8" else "fp8"
    with pytest.raises(UnsupportedError, match=f"the '{other}' MMA kernel reads"):
        launch.scaled_mm(a, _randn(16, 2), b, _randn(1, 2), **_gemm_options(mma=other))


@pytest.mark.parametrize("without", ["capture", "switch"])
def test_split_k_takes_the_shared_workspace_or_runs_unsplit(launches, monkeypatch, without):
    M, N, K = 1, 256, 7168
    tensors = dict(a=_q(M, K), a_scale=_randn(M, K // 128), b=_q(N, K), b_scale=_randn(2, K // 128))
    per_split, splits = launch.gemm_splits(M, N, K, 128, launch.gemm_tile(M), SM90.sm_count)
    assert splits > 1
    launch.scaled_mm(**tensors, **_gemm_options())
    ws, counters = workspace.buffers(torch.device("cpu"), 0, 0)
    p = launches[-1].params
    assert launches[-1].grid[2] == splits and p["k_split"] == per_split * 128
    assert (p["ws"], p["counters"]) == (ws.data_ptr(), counters.data_ptr())
    if without == "capture":
        monkeypatch.setattr(workspace, "buffers", lambda *args: None)  # as while a stream is being captured
    else:
        monkeypatch.setenv(workspace.SHARED_ENV, "0")  # for GEMMs launched from several streams at once
    run = launch.scaled_mm.prepare(**tensors, **_gemm_options())
    run(**tensors)
    p = launches[-1].params
    assert launches[-1].grid[2] == 1 and p["k_split"] == per_split * splits * 128 >= K
    assert (p["ws"], p["counters"]) == (0, 0)


def test_launcher_reads_the_stream_per_call_and_makes_its_device_current(launches, monkeypatch):
    cupy = pytest.importorskip("cupy")
    entered = []

    class Device:
        def __init__(self, index):
            self.index = index

        def __enter__(self):
            entered.append(self.index)

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(cupy.cuda, "Device", Device)
    fn, make, options = CASES["weight_dequant"]
    tensors = make(0)
    run = fn.prepare(**tensors, **options)
    run(**tensors)
    assert entered == [] and launches[-1].stream == 11
    launches.stream, launches.context = 12, 8  # another stream; another device's context is current
    run(**tensors)
    assert entered == [0] and launches[-1].stream == 12


def test_slot_encoders():
    assert launcher.i32(-1) == 0xFFFFFFFF and launcher.i32(7) == 7
    assert launcher.i64(-2) == 2**64 - 2
    assert launcher.f32(1e-4) == struct.unpack("<I", struct.pack("<f", 1e-4))[0]
    for bad in (2**31, -2**31 - 1):
        with pytest.raises(OverflowError):
            launcher.i32(bad)


# ---------------------------------------------------------------- the variants and their MMA kinds

PROFILES = ("cpu", "sm70", "sm75", "sm80", "sm86", "sm89", "sm90", "sm100")


def _served(profile: str, fmt: str, out_fmt: str | None) -> tuple[str, str] | None:
    """(label, mma) of the CuPy GEMM for this call, by the backend's rules: sm_75+; INT8 on s8 MMA;
    FP8 on e4m3 MMA from sm_89, else expanded to fp16 (w8a16, which re-quantizes to FP8 only); the
    native kernels re-quantize to either format, to FP8 only from sm_89."""
    p = capability.simulated_profile(profile)
    if p.kind != "cuda" or p.compute_capability < (7, 5):
        return None
    fp8_mma = p.compute_capability >= (8, 9)
    if fmt == "fp8_e4m3" and not fp8_mma:
        return ("cupy[w8a16]", "fp16") if out_fmt != "int8" else None
    if out_fmt == "fp8_e4m3" and not fp8_mma:
        return None
    return "cupy", "int8" if fmt == "int8" else "fp8"


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("op,out_fmt", [("scaled_mm", None), ("scaled_mm", "fp8_e4m3"), ("scaled_mm", "int8"),
                                        ("quant_linear", None)])
@pytest.mark.parametrize("fmt", ["fp8_e4m3", "int8"])
def test_each_gemm_variant_states_the_mma_kind_it_runs(monkeypatch, profile, op, fmt, out_fmt):
    monkeypatch.setattr(impl_module, "module_available", lambda name: True)
    blocks = (128, 128, 128) if out_fmt else (128, 128)
    q = GemmQuery(op, capability.simulated_profile(profile), fmt, out_fmt, blocks,
              nk=(256, 512), block_k=128, out_group=128 if out_fmt else 0)
    expected = _served(profile, fmt, out_fmt)
    try:
        impl = registry.select(q, backend="cupy")
    except UnsupportedError:
        impl = None
    assert (impl.label, dict(impl.options)["mma"]) == expected if impl else expected is None
    explained = registry.explain_query(q, backend="cupy")
    assert explained.selected == (expected[0] if expected else None)
    labels = [c.impl for c in explained.candidates]
    assert len(labels) == len(set(labels)), "one row per label"


def test_gemm_variants_pass_mma_to_a_launch_that_takes_it():
    gemms = [i for i in cupy_backend.IMPLS if i.op in ("scaled_mm", "quant_linear")]
    assert {dict(i.options)["mma"] for i in gemms} == {"fp8", "int8", "fp16"}
    assert all(set(dict(i.options)) == {"mma"} for i in gemms)


def test_quant_linear_fuses_its_quantization_where_it_fits(launches):
    """Up to FUSED_M_MAX rows, for groups of at most 128, and where the activation's codes fit beside the
    unfused kernel's weight stages, quant_linear is one gemm_kernel launch on the float activation,
    with act_quant's eps and ue8m0; otherwise act_quant then the GEMM on its codes."""
    opts = dict(block_n=128, block_k=128, bias=None, activation=None, out_dtype=BF16, ue8m0=True, eps=1e-3,
                mma="fp8", profile=SM90)
    w, w_s = _q(2112, 7168), _randn(17, 56)
    x = _padded(_randn(launch.FUSED_M_MAX, 7168, dtype=torch.float16), 64)
    out = launch.quant_linear(x, w, w_s, **opts)
    (run,) = launches
    p, tile = run.params, launch.gemm_tile(launch.FUSED_M_MAX)
    assert run.expr.startswith(f"qc::gemm_kernel<{launch.MMA_KIND['fp8']}, __half, ")
    assert (p["a"], p["lda"], p["as"], p["out"]) == (x.data_ptr(), 7232, 0, out.data_ptr())
    assert (p["a_eps"], p["a_ue8m0"]) == (pytest.approx(1e-3, rel=1e-7), 1)
    a_bytes = launch.fused_a_bytes(tile, p["k_split"], 128)
    assert run.smem == launch.gemm_stages(tile, SM90.smem_per_block, a_bytes)[1]
    assert launch.gemm_stages(tile, SM90.smem_per_block, a_bytes)[0] == launch.gemm_stages(tile, SM90.smem_per_block)[0]
    launches.clear()
    launch.quant_linear(_randn(launch.ONCE_M_MAX + 1, 7168, dtype=BF16), w, w_s, **opts)
    assert [r.kernel for r in launches] == ["quant_kernel", "gemm_kernel"]
    assert launches[1].expr.startswith(f"qc::gemm_kernel<{launch.MMA_KIND['fp8']}, qc::u8, ")
    launches.clear()  # groups of 256: more than the prologue keeps in registers
    launch.quant_linear(_randn(1, 7168, dtype=BF16), w, _randn(17, 28), **dict(opts, block_k=256))
    assert [r.kernel for r in launches] == ["quant_kernel", "gemm_kernel"]
    launches.clear()  # 7168 x 16384 at one row: 8192 bytes of K per split, codes too large to fuse
    launch.quant_linear(_randn(1, 16384, dtype=BF16), _q(7168, 16384), _randn(56, 128), **opts)
    assert [r.kernel for r in launches] == ["quant_kernel", "gemm_kernel"]


@pytest.mark.parametrize("M", [launch.FUSED_M_MAX + 1, 16, launch.ONCE_M_MAX])
def test_quant_linear_quantizes_once_per_launch_beyond_fused_m_max(launches, monkeypatch, M):
    """From FUSED_M_MAX + 1 to ONCE_M_MAX rows, for weights of at most ONCE_NK_MAX elements, quant_linear is
    one gemm_kernel launch (ONCE) on the float activation, whose codes, scales and flags are
    backends/workspace.py's: scales after the split-K partials (K-block-major, M rounded up to 32),
    codes after them, flags after the tiles' counters. A larger weight, or no workspace (as while a graph is captured), gets
    act_quant then the GEMM."""
    opts = dict(block_n=128, block_k=128, bias=None, activation="gelu", out_dtype=BF16, ue8m0=False, eps=1e-4,
                mma="int8", profile=SM90)
    w, w_s = _q(2112, 7168, dtype=I8), _randn(17, 56)
    x = _padded(_randn(M, 7168, dtype=BF16), 64)
    out = launch.quant_linear(x, w, w_s, **opts)
    (run,) = launches
    p, (gx, gy, splits) = run.params, run.grid
    tile = launch.gemm_tile(M)
    assert run.expr.startswith(f"qc::gemm_kernel<{launch.MMA_KIND['int8']}, __nv_bfloat16, {tile.bm}, ")
    assert run.expr.endswith(", true, true>") and gx == 1 and M <= tile.bm
    assert (p["a"], p["lda"], p["as"], p["out"], p["a_eps"]) == (x.data_ptr(), 7232, 0, out.data_ptr(),
                                                                 pytest.approx(1e-4, rel=1e-6))
    assert splits > 1 and p["k_split"] * splits >= 7168
    ws, counters = workspace.buffers(torch.device("cpu"), 0, 0)
    partials, tiles = gx * gy * splits * tile.bm * tile.bn, gx * gy
    assert (p["ws"], p["counters"]) == (ws.data_ptr(), counters.data_ptr())
    assert p["once_s"] == ws.data_ptr() + 4 * partials and p["once_flags"] == counters.data_ptr() + 4 * tiles
    mpad = -(-M // 32) * 32  # scales K-block-major, a K block's on whole 128-byte lines
    assert (p["once_s"] - ws.data_ptr()) % 128 == 0 and p["once_q"] == p["once_s"] + 4 * 56 * mpad
    assert (p["once_q"] - ws.data_ptr()) % 128 == 0
    assert not counters[tiles:tiles + 57].any()  # the flags and their count start at zero
    launches.clear()
    launch.quant_linear(_randn(M, 16384, dtype=BF16), _q(7168, 16384, dtype=I8), _randn(56, 128), **opts)
    assert 7168 * 16384 > launch.ONCE_NK_MAX and [r.kernel for r in launches] == ["quant_kernel", "gemm_kernel"]
    launches.clear()
    monkeypatch.setattr(workspace, "buffers", lambda *args: None)
    launch.quant_linear(x, w, w_s, **opts)
    assert [r.kernel for r in launches] == ["quant_kernel", "gemm_kernel"]


def test_fused_shared_memory_layout():
    """The launcher's size of the fused A (codes rows of whole stages plus 16 bytes, then scales in
    16-byte units) is gemm.cu's `fused_row_bytes` layout."""
    tile = launch.gemm_tile(1)
    assert launch.fused_a_bytes(tile, 7 * 128, 128) == 16 * (896 + 16) + 16 * 7 * 4
    assert launch.fused_a_bytes(tile, 3 * 64, 64) == 16 * (256 + 16) + 16 * 3 * 4
    assert "(k_split + bk - 1) / bk * bk + 16" in compiler.kernel_sources()["gemm.cu"]
