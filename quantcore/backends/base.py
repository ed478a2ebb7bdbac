"""`Impl`: one implementation of one op, described by data, launched lazily.

The constraints are plain fields so that one function (`Constraints.reasons`) turns them into the
reason strings used by the dispatcher, the errors, the report and the tests' skips. They read a
`registry.Query`; an op with features of its own extends both beside its spec (the GEMM's
`specs.gemm_query.GemmConstraints`).
"""

from __future__ import annotations

import functools
import importlib
import inspect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import torch

from ..capability import module_available
from . import BACKEND_PACKAGES

if TYPE_CHECKING:  # the registry loads backends: a runtime import would go up a layer
    from ..capability import DeviceProfile
    from ..registry.query import Query


# Measured on the H100: Hopper's FP8 wgmma keeps the running sum of a K block at reduced precision,
# so the fp32-output error is ~1.2e-4 instead of the contract's 1e-5 for Triton's tl.dot and for
# cuBLAS's block-wise kernel alike (mma.sync, as in the CuPy backend, stays at ~1e-8). Implementations
# on that path declare it; the registry warns once and the tests judge them by their own tolerance.
REDUCED_FP8_ACCUMULATION = "FP8 tensor-core accumulation within each K block at reduced precision (~1e-4 relative)"
# Departures that the GPU's tensor cores cause: on the CPU (Triton's interpreter, whose tl.dot is an fp32
# numpy product) the same kernel computes the contract exactly.
TENSOR_CORE_NUMERICS = (REDUCED_FP8_ACCUMULATION,)


@dataclass(frozen=True)
class Constraints:
    """Where an implementation can run. Every field is checked by `reasons`."""

    devices: tuple[str, ...] = ("cuda",)
    min_cc: tuple[int, int] | None = None
    max_cc: tuple[int, int] | None = None  # exclusive: for paths that newer GPUs do better natively
    formats: tuple[str, ...] = ("fp8_e4m3", "int8")
    requires: tuple[str, ...] = ()  # importable Python modules
    fp8_mma: bool = False  # needs e4m3 tensor cores when the format is FP8
    int8_mma: bool = False  # needs s8 tensor cores when the format is INT8
    bf16_mma: bool = False
    interpreter: bool = False  # also runs on the CPU under TRITON_INTERPRET=1
    block_sizes: tuple[int, ...] | None = None  # the only block/group sizes supported

    def reasons(self, q: Query) -> list[str]:
        """Why this implementation cannot run `q` (empty when it can)."""
        p = q.profile
        out: list[str] = []
        missing = [m for m in self.requires if not module_available(m)]
        if missing:
            out.append(f"{', '.join(missing)} not installed")
        on_interpreter = self.interpreter and p.kind == "cpu" and p.triton_interpreter
        if p.kind not in self.devices and not on_interpreter:
            hint = " (or the CPU with TRITON_INTERPRET=1)" if self.interpreter else ""
            out.append(f"runs on {'/'.join(self.devices)}{hint}, not {p.kind}")
        elif p.kind == "cuda":
            cc = p.compute_capability or (0, 0)
            if self.min_cc and cc < self.min_cc:
                out.append(f"needs compute capability >= {_cc(self.min_cc)}, device is {_cc(cc)}")
            if self.max_cc and cc >= self.max_cc:
                out.append(f"only for compute capability < {_cc(self.max_cc)} (native path preferred), device is {_cc(cc)}")
            if self.fp8_mma and "fp8_e4m3" in (q.fmt, q.out_fmt) and not p.fp8_mma:
                out.append(f"needs FP8 tensor cores (sm_89+), {p.arch} has none")
            if self.int8_mma and q.fmt == "int8" and not p.int8_mma:
                out.append(f"needs INT8 tensor cores (sm_75+), {p.arch} has none")
            if self.bf16_mma and not p.bf16_mma:
                out.append(f"needs bf16 tensor cores (sm_80+), {p.arch} has none")
        for fmt in (q.fmt, q.out_fmt):
            if fmt is not None and fmt not in self.formats:
                out.append(f"format {fmt} not implemented (has {', '.join(self.formats)})")
        if self.block_sizes is not None and any(b not in self.block_sizes for b in q.blocks):
            out.append(f"block/group sizes must be {self.block_sizes}, got {q.blocks}")
        return out


def prepared(prepare: Callable[..., Callable[..., Any]]) -> Callable[..., Any]:
    """A launch function of the backend contract made of two stages: `prepare(*tensors, **options)`
    computes what depends only on the arguments' metadata and options and returns `run(**tensors)`,
    which allocates the outputs and launches. Called as the contract's function it runs both; the
    dispatcher keeps `run` (as `launch.prepare(...)`) with a plan and calls only it afterwards, so
    `run` must hold no reference to the first call's tensors and work for any tensors of the same
    dtypes, shapes, strides, device and address alignment (mod 16).

    A `prepare` with a keyword `lead` (`shapes_results`) allocates its results as [*lead, last dim]
    when given the caller's leading dims (the same memory as [M, last dim]): the dispatcher then
    skips the reshape that would restore them, a tensor made per call (~1.4 µs on the H100 host)."""
    signature = inspect.signature(prepare)

    @functools.wraps(prepare)
    def launch(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs).arguments
        run = prepare(**bound)
        return run(**{k: v for k, v in bound.items() if isinstance(v, torch.Tensor)})

    launch.prepare = prepare  # type: ignore[attr-defined]
    launch.shapes_results = "lead" in signature.parameters  # type: ignore[attr-defined]
    return launch


def allocator(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Callable[[], torch.Tensor]:
    """A function returning a fresh contiguous tensor of `shape` and `dtype` on `device`, for a prepared
    `run`'s outputs: `torch.empty_like` of a one-element template expanded to `shape` (an expanded
    tensor is not dense, so empty_like lays the new one out contiguously). On the H100 host it took
    2.3 µs a call where `torch.empty(shape, dtype=..., device=...)` took 4-6, which parses its
    keyword arguments on every call (docs/bench/round6)."""
    template = torch.empty((1,) * len(shape), dtype=dtype, device=device).expand(shape)
    new = functools.partial(torch.empty_like, template)
    new.native = (tuple(shape), _contiguous_strides(shape), dtype)  # type: ignore[attr-defined]
    return new


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _transposed(new: Callable[[], torch.Tensor]) -> torch.Tensor:
    return new().t()


def transposed(new: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """An allocator of the transpose of a fresh 2-D tensor from the allocator `new` (an M-major scale)."""
    t = functools.partial(_transposed, new)
    shape, strides, dtype = new.native  # type: ignore[attr-defined]
    t.native = (shape[::-1], strides[::-1], dtype)  # type: ignore[attr-defined]
    return t


def compose(params: str, outputs: dict[str, Callable[[], Any]], statement: str, namespace: dict[str, Any],
            result: str, launches: Callable[[], Any] | None = None) -> Callable[..., Any]:
    """A prepared `run` compiled from source, one Python frame between the op's function and the launch:
    `def run({params})` that binds each name of `outputs` to a call of its allocator, runs `statement`
    (source of one or more statements, indented by four spaces, using the names in `namespace`) and
    returns `result` (an expression of the names). `namespace` becomes the function's globals, so that
    whoever made it can rebind a name later (`triton.direct.Launcher.statement`). Written as closures, an
    op's run called a function that allocated its outputs, one that chose its launch's arguments and the
    launcher: three frames, ~0.4 µs a call on the CPU machine.

    `launches`, where given, says what `statement` launches, for the native path (`backends.native`):
    None while it cannot tell yet, False if never, else a list of `NativeLaunch`es whose parameters name
    the run's parameters and outputs; `run.native()` is then the run's description (`_described`)."""
    namespace.update({f"_new{o}": new for o, new in outputs.items()})
    allocations = "".join(f"    {o} = _new{o}()\n" for o in outputs)
    exec(f"def run({params}):\n{allocations}{statement}    return {result}\n", namespace)
    run = namespace.pop("run")
    if launches is not None:
        run.native = functools.partial(_described, params, outputs, result, launches)
    return run


class NativeLaunch(NamedTuple):
    """One kernel launch of a prepared run, for the native path: a CUfunction handle, grid, block,
    dynamic shared bytes and one entry per kernel parameter, in order: a parameter or output name of
    the run (its address), None (a null address) or an int (a constant's slot bits: `cupy.launcher`'s
    i32 / i64 / f32)."""

    function: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    params: tuple[str | int | None, ...]


def _names(params: str) -> list[str]:
    return [p.split("=")[0].strip() for p in params.split(",") if p.strip()]


def _variant(params: str, outputs: dict[str, Callable[[], Any]], result: str, launches: list[NativeLaunch]) -> Any:
    """(outputs, launches, results, as a tuple) of `backends.native.Replay`, or False where an output's
    allocator or the result is not one it can make."""
    names, outs = _names(params), list(outputs)
    specs = [getattr(outputs[o], "native", None) for o in outs]
    results = [r.strip() for r in result.split(",") if r.strip()]
    if any(s is None for s in specs) or any(r not in outs for r in results):
        return False
    resolved = []
    for launch in launches:
        entries = []
        for p in launch.params:
            if p is None:
                entries.append((0, 0))
            elif isinstance(p, str):
                if p in outs:
                    entries.append((2, outs.index(p)))
                elif p in names:
                    entries.append((1, names.index(p)))
                else:
                    return False
            else:
                entries.append((0, p & 0xFFFFFFFFFFFFFFFF))
        resolved.append((launch.function, launch.grid, launch.block, launch.smem, entries))
    return specs, resolved, [outs.index(r) for r in results], "," in result


def _described(params: str, outputs: dict[str, Callable[[], Any]], result: str, launches: Callable[[], Any]) -> Any:
    """A composed run's description for `backends.native.Replay`: (its parameter count, the variant,
    whether it runs in Python while a graph is captured), None while its launches cannot be told yet,
    False if never."""
    got = launches()
    if not got:
        return got
    variant = _variant(params, outputs, result, got)
    return variant and (len(_names(params)), variant, False)


def _native_of(*runs: Callable[..., Any]) -> list | bool | None:
    """The runs' descriptions (`_described`), or None while one cannot tell yet, or False if one never can
    or one runs in Python while a graph is captured."""
    got = [getattr(r, "native", lambda: False)() for r in runs]
    if any(g is False or (g and g[2]) for g in got):
        return False
    return None if any(g is None for g in got) else got


def _chained(quantize: Callable[..., Any], gemm: Callable[..., Any]) -> Any:
    """`prepared_quant_linear`'s run described: act_quant's launches on x (input 0), then the GEMM's on
    their results (its inputs 0 and 1) and w, w_scale, bias (the run's inputs 1-3)."""
    got = _native_of(quantize, gemm)
    if not got:
        return got
    (_, (q_outs, q_launches, q_results, _), _), (_, (g_outs, g_launches, g_results, as_tuple), _) = got
    shift = len(q_outs)

    def routed(kind: int, index: int) -> tuple[int, int]:
        if kind == 1:
            return (2, q_results[index]) if index < 2 else (1, index - 1)
        return (2, index + shift) if kind == 2 else (kind, index)
    launches = q_launches + [(*launch[:4], [routed(*p) for p in launch[4]]) for launch in g_launches]
    return 4, (q_outs + g_outs, launches, [r + shift for r in g_results], as_tuple), False


def _eager(one_launch: Callable[..., Any]) -> Any:
    """`eagerly`'s run described: `one_launch`, and the run itself (in Python) while a graph is captured."""
    got = _native_of(one_launch)
    return got and (got[0][0], got[0][1], True)


def by_address(run: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a prepared `run` as reading nothing of its tensor arguments but their addresses and dtypes
    (never shapes or strides, which its plan fixed): the dispatcher may then pass it an input itself
    where the spec gave a view of that input at the same address (a [B, S, K] activation flattened to
    [B·S, K]) instead of re-making the view on every call."""
    run.by_address = True  # type: ignore[attr-defined]
    return run


def composed_quant_linear(act_quant: Callable[..., Any], scaled_mm: Callable[..., Any]) -> Callable[..., Any]:
    """The contract's quant_linear as a backend's own act_quant followed by its scaled_mm (what the
    fused implementations must equal bit for bit)."""
    def quant_linear(x, w, w_scale, *, block_n, block_k, bias, activation, out_dtype, ue8m0, eps, profile=None):
        """x [M, K] float -> act_quant per 1×block_k into w's format -> scaled_mm with w [N, K] -> [M, N]."""
        a, a_scale = act_quant(x, qdtype=w.dtype, group_size=block_k, ue8m0=ue8m0, eps=eps, scale_m_major=False,
                               profile=profile)
        return scaled_mm(a, a_scale, w, w_scale, block_n=block_n, block_k=block_k, bias=bias, activation=activation,
                         out_dtype=out_dtype, out_quant=None, out_group=block_k, ue8m0_out=False, eps=eps,
                         profile=profile)
    return quant_linear


def prepared_quant_linear(act_quant: Any, scaled_mm: Any, x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, *,
                          block_n, block_k, bias, activation, out_dtype, ue8m0, eps, profile, lead=None,
                          **gemm_options):
    """`composed_quant_linear` for a backend whose act_quant and scaled_mm are `prepared`: both prepared
    once, the GEMM for act_quant's outputs as it returns them (fresh and contiguous); returns the
    `run(x, w, w_scale, bias=None)` of a prepared quant_linear. `lead`: the result's leading dims (see
    `prepared`), which the GEMM allocates where it takes them, else its [M, N] result is viewed so (a
    GEMM writing through a TMA descriptor of its [M, N] output takes none). `gemm_options`: the GEMM
    variant's own (e.g. `mma`)."""
    (M, K), device = x.shape, x.device
    quantize = act_quant.prepare(x, qdtype=w.dtype, group_size=block_k, ue8m0=ue8m0, eps=eps, scale_m_major=False,
                                 profile=profile)
    a = torch.empty((M, K), dtype=w.dtype, device=device)  # only the layout of act_quant's outputs matters
    a_scale = torch.empty((M, -(-K // block_k)), dtype=torch.float32, device=device)
    shapes = lead is not None and getattr(scaled_mm, "shapes_results", False)
    gemm = scaled_mm.prepare(a, a_scale, w, w_scale, block_n=block_n, block_k=block_k, bias=bias, activation=activation,
                             out_dtype=out_dtype, out_quant=None, out_group=block_k, ue8m0_out=False, eps=eps,
                             profile=profile, **gemm_options, **({"lead": lead} if shapes else {}))
    shape = None if lead is None or shapes else (*lead, w.shape[0])

    def run(x, w, w_scale, bias=None):
        out = gemm(*quantize(x), w, w_scale, bias)
        return out if shape is None else out.view(shape)
    if shape is None:
        run.native = functools.partial(_chained, quantize, gemm)
    # x reaches act_quant alone, and quant_linear's spec passes w, w_scale and bias on as the caller gave
    # them (it views none of them): the run takes the caller's tensors wherever act_quant's does, whatever
    # the GEMM reads of its own operands (a TMA descriptor reads their shapes).
    return by_address(run) if getattr(quantize, "by_address", False) else run


def eagerly(one_launch: Callable[..., Any], composed: Callable[..., Any], device: torch.device) -> Callable[..., Any]:
    """A prepared quant_linear's `run(x, w, w_scale, bias=None)`: `one_launch` (a GEMM that quantizes the
    activation once per launch, bit for bit `composed`) except while a CUDA graph is being captured,
    where it is `composed` (act_quant + scaled_mm): the one launch takes more GPU time than the two and
    saves a launch's host time, which a graph's replays do not have (docs/bench/round10)."""
    capturing = torch.cuda.is_current_stream_capturing if device.type == "cuda" else bool

    def run(x, w, w_scale, bias=None):
        if capturing():
            return composed(x, w, w_scale, bias)
        return one_launch(x, w, w_scale, bias)
    run.native = functools.partial(_eager, one_launch)
    both = getattr(one_launch, "by_address", False) and getattr(composed, "by_address", False)
    return by_address(run) if both else run


_resets: list[Callable[[], None]] = []


def on_reset(clear: Callable[[], None]) -> Callable[[], None]:
    """Have `registry.reset()` call `clear`: a backend's own caches (tuned or derived launch choices)
    register this way when their module is imported, so the registry never imports a backend for it."""
    _resets.append(clear)
    return clear


def reset_backends() -> None:
    """Clear every cache registered with `on_reset`."""
    for clear in _resets:
        clear()


@functools.lru_cache(maxsize=None)
def _resolve(launch: str) -> Callable[..., Any]:
    module, _, name = launch.partition(":")
    builtin = module.partition(".")[0] in BACKEND_PACKAGES
    return getattr(importlib.import_module(f"quantcore.backends.{module}" if builtin else module), name)


def _cc(cc: tuple[int, int]) -> str:
    return f"{cc[0]}.{cc[1]}"


@dataclass(frozen=True)
class Impl:
    """One (op, backend) implementation.

    `launch` names the function as "module:function", resolved on first use so that describing an
    implementation never imports Triton or CuPy: the module relative to `quantcore.backends` for the
    built-in backends ("triton.launch"), an absolute one for out-of-tree backends; or it is the
    function itself. `options` are fixed keyword arguments the dispatcher adds to the launch's: they
    carry the variant the registry chose (the GEMMs' `mma`), so that no launch re-derives it from the
    device profile. `numerics` is
    "exact" or a short description of how it departs from the contract's arithmetic (an emulated
    path); the registry makes any departure visible. `opt_in`: a variant that trades the contract's
    exactness for speed by choice (`torch[bf16_dequant]`), not by necessity; it runs only where its
    label is named (`backend=`, a priority list, `QUANTCORE_PRIORITY`), never by automatic selection,
    by its backend's name alone or through a measured table. `compared_alone`: a variant its backend's
    name never reaches (registered after one that takes every call it takes, `triton[gluon]`), so it
    is compared with the reference, timed by the bench and ranked by measured tables under its own label.
    `separate_epilogue`: a GEMM that runs a fused epilogue (bias, activation, re-quantization) as passes
    of its own after the plain product (`torch[cublas]`), so that a measured ranking of plain GEMMs does
    not speak for it where there is an epilogue.
    """

    op: str
    backend: str
    launch: str | Callable[..., Any]
    constraints: Constraints = field(default_factory=Constraints)
    variant: str = ""
    numerics: str = "exact"
    fallback: str = ""  # set on paths that stand in for a faster native one: what they do instead
    options: tuple[tuple[str, Any], ...] = ()  # fixed keyword arguments this variant passes to launch
    opt_in: bool = False  # runs only where its label is named
    compared_alone: bool = False  # in `registry.compared` under its own label
    separate_epilogue: bool = False  # a fused epilogue runs as extra passes

    @property
    def label(self) -> str:
        """"triton" or "triton[w8a16]": unique per op."""
        return f"{self.backend}[{self.variant}]" if self.variant else self.backend

    def not_supported_reasons(self, query: Query) -> list[str]:
        """Reasons this implementation cannot run `query`; empty when it can."""
        return self.constraints.reasons(query)

    def named_by(self, name: str) -> bool:
        """Whether `name` (a `backend=` or priority entry) names this implementation: its label, or
        its backend's name unless it is opt-in."""
        return name == self.label or (name == self.backend and not self.opt_in)

    def numerics_on(self, profile: DeviceProfile) -> str:
        """`numerics` where it runs on `profile`: "exact" on the CPU for a departure that only GPU
        tensor cores cause (`TENSOR_CORE_NUMERICS`)."""
        return "exact" if profile.kind == "cpu" and self.numerics in TENSOR_CORE_NUMERICS else self.numerics

    def function(self) -> Callable[..., Any]:
        """The launch function (imports the backend's kernels on first call)."""
        return self.launch if callable(self.launch) else _resolve(self.launch)

    def __call__(self, **kwargs: Any) -> Any:
        return self.function()(**kwargs, **dict(self.options))
