"""`quantcore bench`: every op and backend on this GPU, timed in one run beside the baselines."""

from __future__ import annotations

import datetime
import math
import sys
import time
from typing import Callable

import torch
from pydantic import BaseModel, Field, model_validator

from .. import capability, definitions, ops, registry
from ..registry import Constraints, Impl
from ..errors import InvalidInputError, UnsupportedError
from . import baselines, shapes, timing
from .shapes import DECODE_M, READ_CEILING

PRODUCERS = ("rms_norm_quant", "silu_mul_quant")

REFERENCE_GEMM_FLOPS = 1e12  # the reference GEMM computes in float64: beyond this it only wastes the run


class Record(BaseModel):
    """One op × format × shape × implementation measurement (or why there is none)."""

    op: str
    fmt: str
    shape: list[int]
    impl: str
    us: float | None = None  # GPU time per call (`timing.gpu_time_us`)
    eager_us: float | None = None  # back-to-back eager time per call (`timing.eager_time_us`); absent in older runs
    rate: float | None = None  # GB/s (memory-bound) or TFLOP/s (GEMM)
    unit: str
    fraction: float | None = None  # of the ceiling: copy bandwidth, or the vendor's dense rate
    vs_vendor: float | None = None  # vendor time / this time (GEMMs): > 1 means faster than the vendor kernel
    note: str = ""


class BenchResult(BaseModel):
    """Everything one `quantcore bench` run measured."""

    device: capability.DeviceProfile
    # Of the measuring process: the device's own `versions` describe whichever process reads it back.
    versions: dict[str, str | None] = Field(default_factory=capability.versions)
    date: str
    command: str
    copy_gbps: float
    dispatch_overhead_us: dict[str, float]
    records: list[Record]

    @model_validator(mode="before")
    @classmethod
    def _versions_of_older_files(cls, data):
        """Runs saved before `versions` existed carry them inside `device`."""
        if isinstance(data, dict) and "versions" not in data and isinstance(data.get("device"), dict):
            data = {**data, "versions": data["device"].get("versions", {})}
        return data


class Progress:
    """A run's progress on `stream` (stderr): a tqdm bar where `bar` is asked for, the stream is a
    terminal and tqdm is installed; one plain line per case otherwise (logs, pipes, CI)."""

    def __init__(self, total: int, bar: bool, stream=None):
        self.stream = sys.stderr if stream is None else stream
        self.total, self.done, self.start = total, 0, time.perf_counter()
        self.bar = None
        if bar and self.stream.isatty() and capability.module_available("tqdm"):
            from tqdm import tqdm

            self.bar = tqdm(total=total, file=self.stream, unit="case", dynamic_ncols=True)

    def step(self, label: str) -> None:
        """One more case done, `label` naming it."""
        self.done += 1
        if self.bar is None:
            print(f"[{time.perf_counter() - self.start:7.1f}s] {self.done}/{self.total} {label}", file=self.stream,
                  flush=True)
            return
        self.bar.set_postfix_str(label, refresh=False)
        self.bar.update(1)
        if self.done == self.total:
            self.bar.close()


def _rand(*shape, dtype=torch.bfloat16, device="cuda"):
    x = torch.randn(*shape, device=device, dtype=torch.float32)
    return x.mul_(torch.rand(*shape[:-1], 1, device=device).add_(0.1)).to(dtype)


def error_note(err: BaseException, limit: int = 160) -> str:
    """An error as one line for a result's note: its type and the first line of its message."""
    return f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:limit]}"


def time_interleaved(fns: list[Callable[[], object] | None]) -> list[tuple[float, float] | Exception | None]:
    """(GPU time, eager time) per call of each fn, timed interleaved (`timing.gpu_times_us`,
    `timing.eager_times_us`: implementations compared in one record set are timed alike); None where
    the fn is None, the error where one raises (the others are then timed one by one)."""
    live = [i for i, fn in enumerate(fns) if fn is not None]
    errors = (UnsupportedError, RuntimeError, ValueError)
    try:
        timed = dict(zip(live, zip(timing.gpu_times_us([fns[i] for i in live]),
                                   timing.eager_times_us([fns[i] for i in live]))))
    except errors:
        timed = {}
        for i in live:
            try:
                timed[i] = timing.gpu_time_us(fns[i]), timing.eager_time_us(fns[i])
            except errors as err:
                timed[i] = err
    return [timed.get(i) for i in range(len(fns))]


def make_record(rec: dict, timed: tuple[float, float] | Exception | None, work: float, unit: str,
            ceiling: float | None) -> Record:
    """A Record of one `_times` entry (work in bytes or FLOPs); errors and refusals become its note."""
    if timed is None:
        return Record(**rec, unit=unit)
    if isinstance(timed, Exception):
        return Record(**rec, unit=unit, note=error_note(timed))
    us, eager_us = timed
    rate = work / us / (1e3 if unit == "GB/s" else 1e6)
    return Record(**rec, us=us, eager_us=eager_us, rate=rate, unit=unit, fraction=rate / ceiling if ceiling else None)


def timed_records(entries: list[tuple[dict, Callable[[], object] | None]], work: float, unit: str,
           ceiling: float | None) -> list[Record]:
    """Records of (record fields, fn) entries doing the same work, timed interleaved with each other."""
    measured = time_interleaved([fn for _, fn in entries])
    return [make_record(rec, t, work, unit, ceiling) for (rec, _), t in zip(entries, measured)]


def attempt(make: Callable[[], Callable[[], object]]) -> tuple[Callable[[], object] | None, str]:
    try:
        return make(), ""
    except (UnsupportedError, RuntimeError, ValueError, TypeError, AttributeError) as err:
        return None, error_note(err)


def contenders(op: str, args: tuple, kwargs: dict, with_baselines: bool) -> dict[str, tuple[Callable | None, str]]:
    """quantcore's backends (forced one by one) and, with the baselines, the reference eager and
    torch.compile of it, for one call.

    The GEMM reference is not compiled: it loops over K blocks in float64, so torch.compile unrolls
    and recompiles it per K, and the vendor kernels are the GEMM's baselines."""
    out = {}
    ours = registry.compared(op)  # what measured priorities rank: all but the reference's plain path
    for backend in (*ours, registry.REFERENCE) if with_baselines else ours:
        def make(backend=backend):
            getattr(ops, op)(*args, backend=backend, **kwargs)  # compiles, and raises where it cannot run
            return lambda: getattr(ops, op)(*args, backend=backend, **kwargs)
        out[backend] = attempt(make)
    if op in PRODUCERS and with_baselines:
        # The fused producers against the unfused torch code they replace ("torch.compile" is that code
        # compiled, what the summary's ratios read), not against compilations of the reference.
        try:
            out.update({name: (fn, "") for name, fn in baselines.producer_baselines(op, args, kwargs).items()})
        except (RuntimeError, ValueError, TypeError, AttributeError) as err:
            out["torch.compile"] = None, error_note(err)
    elif op != "scaled_mm" and with_baselines:
        prepared = definitions.get(op).spec(*args, **kwargs)
        out["torch.compile"] = attempt(lambda: baselines.compiled_call(op, prepared.kwargs))
    return out


def _memory_cases(plan: dict) -> list[tuple[str, str, list[int], Callable[[], tuple[tuple, dict, int]]]]:
    cases = []
    for fmt, qdtype in (("fp8_e4m3", torch.float8_e4m3fn), ("int8", torch.int8)):
        for m, k in plan["act"]:
            kb = math.ceil(k / 128)
            cases.append(("act_quant", fmt, [m, k], lambda m=m, k=k, q=qdtype: (
                (_rand(m, k),), dict(dtype=q), baselines.act_bytes(m, k))))
            cases.append(("act_dequant", fmt, [m, k], lambda m=m, k=k, q=qdtype: (
                ops.act_quant(_rand(m, k), dtype=q), {}, baselines.act_bytes(m, k))))
            cases.append(("quantized_gelu", fmt, [m, k], lambda m=m, k=k, q=qdtype, kb=kb: (
                ops.act_quant(_rand(m, k), dtype=q), {}, 2 * (m * k + 4 * m * kb))))
        for n, k in plan["weight"]:
            nbytes = n * k * 3 + 4 * math.ceil(n / 128) * math.ceil(k / 128)
            cases.append(("weight_quant", fmt, [n, k], lambda n=n, k=k, q=qdtype, b=nbytes: (
                (_rand(n, k),), dict(dtype=q), b)))
            cases.append(("weight_dequant", fmt, [n, k], lambda n=n, k=k, q=qdtype, b=nbytes: (
                ops.weight_quant(_rand(n, k), dtype=q), {}, b)))
        for m, h in plan.get("norm", ()):
            cases.append(("rms_norm_quant", fmt, [m, h], lambda m=m, h=h, q=qdtype: (
                (_rand(m, h), _rand(h).add_(1)), dict(dtype=q), baselines.producer_bytes("rms_norm_quant", m, h))))
        for m, i in plan.get("gated", ()):
            cases.append(("silu_mul_quant", fmt, [m, 2 * i], lambda m=m, i=i, q=qdtype: (
                (_rand(m, 2 * i),), dict(dtype=q), baselines.producer_bytes("silu_mul_quant", m, 2 * i))))
    for g_name, g_dtype in (("bfloat16", torch.bfloat16), ("float32", torch.float32), ("int32", torch.int32)):
        for m, n in plan["epilogue"]:
            def make(m=m, n=n, g_dtype=g_dtype):
                g = (torch.randint(-2**20, 2**20, (m, n), device="cuda", dtype=torch.int32)
                     if g_dtype == torch.int32 else _rand(m, n, dtype=g_dtype))
                args = (g, _rand(m, dtype=torch.float32), _rand(n, dtype=torch.float32), _rand(n))
                return args, {}, m * n * (g.element_size() + 2) + 4 * m + 6 * n
            cases.append(("dequant_bias", g_name, [m, n], make))
    return cases


def _simulated_records(args: tuple, rec: dict, flops: float, ceiling: float | None,
                       simulate: tuple[str, ...]) -> list[Record]:
    """quantcore's GEMM backends under each simulated profile: the paths of GPUs without FP8 (or INT8)
    tensor cores, timed on this one. Rows are named "<backend>@<profile>" (outside what measured
    priorities rank) and note the implementation that ran."""
    records = []
    for profile in simulate:
        with capability.simulate(profile):
            entries = [({**rec, "impl": f"{name}@{profile}",
                         "note": note or f"ran {ops.explain('scaled_mm', *args, backend=name).selected}"}, fn)
                       for name, (fn, note) in contenders("scaled_mm", args, {}, False).items()]
            records += timed_records(entries, flops, "TFLOP/s", ceiling)
    return records


def _gemm_records(fmt: str, qdtype, m: int, n: int, k: int, with_baselines: bool,
                  simulate: tuple[str, ...] = ()) -> list[Record]:
    """Every quantcore implementation of one scaled_mm shape (and with the baselines, the vendor
    kernels and the reference), all timed interleaved; `vs_vendor` is the vendor's time over each."""
    a, a_s = ops.act_quant(_rand(m, k), dtype=qdtype)
    b, b_s = ops.weight_quant(_rand(n, k), dtype=qdtype)
    flops = baselines.gemm_flops(m, n, k)
    rec = dict(op="scaled_mm", fmt=fmt, shape=[m, n, k])
    ours = [({**rec, "impl": name, "note": note}, fn)
            for name, (fn, note) in contenders("scaled_mm", (a, a_s, b, b_s), {}, with_baselines).items()]
    if not with_baselines:
        return (timed_records(ours, flops, "TFLOP/s", None)
                + _simulated_records((a, a_s, b, b_s), rec, flops, None, simulate))
    if fmt == "fp8_e4m3":
        vendor, vendor_note = attempt(lambda: baselines.cublas_blockwise_fp8(a, a_s, b, b_s))
        dense, _ = attempt(lambda: baselines.cublas_tensorwise_fp8(a, b))
        vendor_name, dense_name = "cublas-blockwise", "cublas-fp8-tensorwise"
    else:
        vendor, vendor_note = attempt(lambda: baselines.int_mm(a, b))
        dense, vendor_name, dense_name = None, "torch._int_mm", None  # the vendor kernel is the dense one
    entries = [({**rec, "impl": vendor_name, "note": vendor_note}, vendor)]
    if dense_name:
        entries.append(({**rec, "impl": dense_name}, dense))
    dense_at = len(entries) - 1  # the rate ceiling's entry: FP8's tensor-wise kernel, or INT8's _int_mm itself
    if fmt == "int8" and vendor is not None:
        sa, sb = a_s[:, 0].contiguous(), b_s[:, 0].repeat_interleave(128)[:n].contiguous()
        entries.append(({**rec, "impl": "torch._int_mm+dequant_bias"}, lambda: ops.dequant_bias(vendor()[:m], sa, sb)))
    entries.append(({**rec, "impl": "cublas-bf16"}, baselines.bf16_mm(m, n, k)))
    for r, fn in ours:
        if r["impl"] == registry.REFERENCE and flops > REFERENCE_GEMM_FLOPS:
            r["note"], fn = f"skipped: the reference computes in float64 ({flops:.1e} FLOP)", None
        entries.append((r, fn))
    times = time_interleaved([fn for _, fn in entries])
    ceiling = flops / times[dense_at][0] / 1e6 if isinstance(times[dense_at], tuple) else None
    records = [make_record(r, t, flops, "TFLOP/s", ceiling) for (r, _), t in zip(entries, times)]
    if m <= DECODE_M:
        nbytes = baselines.gemm_floor_bytes(m, n, k)
        read_us = baselines.read_ceiling_us(nbytes)
        records.append(Record(**rec, impl=READ_CEILING, us=read_us, rate=nbytes / read_us / 1e3, unit="GB/s",
                              note="one kernel reading the GEMM's least bytes"))
    records += _simulated_records((a, a_s, b, b_s), rec, flops, ceiling, simulate)
    vendor_us = records[0].us
    for r in records:
        if vendor_us and r.us:
            r.vs_vendor = vendor_us / r.us
    return records


def _dispatch_overhead(device: str = "cuda") -> dict[str, float]:
    """quantcore.ops's own host time per call (plan lookup, binding, launch call, finishing), for
    act_quant and scaled_mm on DeepSeek-V3 decode shapes: an implementation that launches nothing is
    registered for the measurement and timed through the op and called directly. Timing a real
    launch both ways instead measured the host's noise (±15 µs on the lent VM) rather than ours."""
    x = _rand(4, 7168, device=device)
    a, a_s = ops.act_quant(x)
    b, b_s = ops.weight_quant(_rand(2112, 7168, device=device))
    out = {}
    for op, args in (("act_quant", (x,)), ("scaled_mm", (a, a_s, b, b_s))):
        result = getattr(ops, op)(*args)
        probe = Impl(op, "overhead-probe", lambda **kwargs: result, Constraints(devices=(torch.device(device).type,)))
        registry.register(probe)
        try:
            kwargs = definitions.get(op).spec(*args).kwargs
            out[op] = timing.host_overhead_us(lambda: getattr(ops, op)(*args, backend="overhead-probe"),
                                              lambda: probe(**kwargs))
        finally:
            registry.unregister(probe)
    return out


def run(*, quick: bool = False, only: tuple[str, ...] = (), progress: bool = True,
        command: str = "quantcore bench", checkpoint: Callable[[BenchResult], None] | None = None,
        resume: BenchResult | None = None, with_baselines: bool = True, simulate: tuple[str, ...] = ()) -> BenchResult:
    """Measure every op × backend × format on the current GPU beside the baselines (`only`: those of
    `shapes.OPS` to measure; `progress`: a bar where stderr is a terminal with tqdm, else plain lines).

    `checkpoint`, if given, receives the partial result after every case (a long run cut short
    still leaves its measurements); `resume`, such a partial result of the same GPU model, is
    continued: its ceilings are kept and the cases it holds are not measured again.
    `with_baselines=False` times quantcore's implementations only: what measured priorities need,
    without torch.compile's compilations and the vendor kernels. `simulate` ("sm80", "sm75", …) also
    times the GEMMs under those profiles, beside this GPU's baselines (`_simulated_records`)."""
    unknown = [op for op in only if op not in shapes.OPS]
    if unknown:
        raise InvalidInputError(f"bench: unknown op(s) {unknown}; the bench measures {', '.join(shapes.OPS)}")
    if not torch.cuda.is_available():
        raise UnsupportedError("bench: needs a CUDA GPU; run it on a GPU machine")
    device = capability.profile_for("cuda")
    if resume is not None and resume.device.name != device.name:
        raise InvalidInputError(f"bench: cannot resume a run of {resume.device.name} on {device.name}; "
                                "start a new run")
    plan = shapes.QUICK if quick else shapes.FULL
    done = {(r.op, r.fmt, tuple(r.shape)) for r in resume.records} if resume else set()
    mem = [c for c in _memory_cases(plan) if (not only or c[0] in only) and (c[0], c[1], tuple(c[2])) not in done]
    gemms = [] if only and "scaled_mm" not in only else [
        (fmt, qdtype, mnk) for fmt, qdtype in (("fp8_e4m3", torch.float8_e4m3fn), ("int8", torch.int8))
        for mnk in plan["gemm"] if ("scaled_mm", fmt, mnk) not in done]
    bar = Progress(len(mem) + len(gemms), progress)
    if resume is not None:
        result = resume.model_copy(update={"command": f"{resume.command}; resumed by {command}",
                                           "records": list(resume.records)})
    else:
        result = BenchResult(device=device, date=datetime.date.today().isoformat(), command=command,
                             copy_gbps=timing.copy_bandwidth_gbps(), dispatch_overhead_us=_dispatch_overhead(),
                             records=[])
    for op, fmt, shape, make in mem:
        args, kwargs, nbytes = make()
        entries = [(dict(op=op, fmt=fmt, shape=shape, impl=name, note=note), fn)
                   for name, (fn, note) in contenders(op, args, kwargs, with_baselines).items()]
        result.records += timed_records(entries, nbytes, "GB/s", result.copy_gbps)
        bar.step(f"{op} {fmt} {shape}")
        if checkpoint:
            checkpoint(result)
    for fmt, qdtype, (m, n, k) in gemms:
        result.records += _gemm_records(fmt, qdtype, m, n, k, with_baselines, simulate)
        bar.step(f"scaled_mm {fmt} {m}x{n}x{k}")
        torch.cuda.empty_cache()
        if checkpoint:
            checkpoint(result)
    return result
