"""The building blocks of prepared launches, which every backend's launch functions are made of.

A launch function of the backend contract (docs/backend-contract.md) is `prepared`: a first stage,
run once per kept plan, computes what depends only on the arguments' metadata (tiles, grids, compiled
kernels) and returns the per-call `run`, compiled from source (`compose`) so that one Python frame lies
between an op's function and the kernel launcher. `allocator` makes a run's outputs cheaply; a run
that describes its launches (`NativeLaunch`) can be replayed by `runtime.native` without Python.
`composed_quant_linear`, `prepared_quant_linear` and `eagerly` build a quantized linear out of a
backend's act_quant and scaled_mm.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, NamedTuple

import torch

from ..errors import GENERATED
from . import workspace


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
    keyword arguments on every call.

    The template allocates nothing: it views the device's `workspace.anchor`, which lives outside any
    CUDA graph's pool, so a plan prepared while CUDA-graph trees warm a graph up keeps no memory of that
    graph's pool. While a stream is being captured, where no anchor can be allocated, the function is
    `torch.empty` itself."""
    new: Callable[[], torch.Tensor]
    base = workspace.anchor(torch.device(device))
    if base is None:
        new = functools.partial(torch.empty, shape, dtype=dtype, device=device)
    else:
        template = base.view(dtype)[:1].reshape((1,) * len(shape)).expand(shape)
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


def quantized_outputs(M: int, K: int, group_size: int, qdtype: torch.dtype, scale_m_major: bool,
                      device: torch.device) -> dict[str, Callable[[], torch.Tensor]]:
    """The allocators `_q` and `_scale` of a quantizing launch's (q [M, K] qdtype, scale [M, ceil(K/G)] fp32),
    the scale M-major (act_quant's `scale_layout="m_major"`) when asked."""
    kb = -(-K // group_size)
    scale = allocator((kb, M) if scale_m_major else (M, kb), torch.float32, device)
    return {"_q": allocator((M, K), qdtype, device), "_scale": transposed(scale) if scale_m_major else scale}


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
    exec(compile(f"def run({params}):\n{allocations}{statement}    return {result}\n", GENERATED, "exec"), namespace)
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
    saves a launch's host time, which a graph's replays do not have."""
    capturing = torch.cuda.is_current_stream_capturing if device.type == "cuda" else bool

    def run(x, w, w_scale, bias=None):
        if capturing():
            return composed(x, w, w_scale, bias)
        return one_launch(x, w, w_scale, bias)
    run.native = functools.partial(_eager, one_launch)
    both = getattr(one_launch, "by_address", False) and getattr(composed, "by_address", False)
    return by_address(run) if both else run


