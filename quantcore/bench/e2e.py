"""`quantcore bench --e2e`: decode tokens/s of a transformer the size of a real one, in bf16 and with
its linears quantized to FP8 and INT8 (`quantcore.nn.quantize_model`, output head kept in bf16),
each eager and replayed from a CUDA graph; and the same comparison on a bare stack of linears.

Timing: `warmup` steps (they compile the kernels), then `tokens` steps timed with the host clock
around the loop and one synchronize at its end, the fastest of `ROUNDS` such loops taken in turn with
the other formats' (`_measure`); in graph mode one step is captured and the loop replays it. A configuration that fails (quantization, a kernel, the capture) keeps its error as the
row's note and the run goes on.
"""

from __future__ import annotations

import copy
import datetime
import os
import time
from typing import Callable, Literal

import torch
from pydantic import BaseModel, Field, PositiveInt, computed_field
from torch import nn

from .. import capability
from .. import nn as qnn
from ..errors import InvalidInputError
from . import decoder, timing
from .run import error_note

DTYPES: dict[str, torch.dtype | None] = {"bf16": None, "fp8_e4m3": torch.float8_e4m3fn, "int8": torch.int8}
MODES = ("eager", "graph")
STACK_M = 1  # the linear stack is timed at one row: the decode GEMM at its most memory-bound
GRAPH_WARMUP = 3  # steps on the capture's side stream before it, as torch's CUDA graph docs ask
ROUNDS = 3  # interleaved timing loops per configuration (`_measure`)


class Config(BaseModel):
    """Sizes of the decode benchmark (the linear stack uses `dim` and `layers` too)."""

    dim: int = Field(4096, ge=1)
    layers: int = Field(4, ge=1)
    batches: list[PositiveInt] = Field(default_factory=lambda: [1, 8], min_length=1)
    tokens: int = Field(128, ge=1, description="timed decode steps per configuration")
    warmup: int = Field(8, ge=1, description="untimed steps before timing (compiles the kernels)")
    vocab: int = Field(32000, ge=1)
    context: int = Field(256, ge=1, description="KV-cache positions; attention reads all of them every step")
    seed: int = 0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def hidden(self) -> int:
        """The MLP's width."""
        return 4 * self.dim

    @computed_field  # type: ignore[prop-decorator]
    @property
    def head_dim(self) -> int:
        """The attention heads' size (`decoder.head_dim`)."""
        return decoder.head_dim(self.dim)


class Row(BaseModel):
    """One weights format × batch × mode of the model or the stack (batch = M for the stack)."""

    dtype: str  # "bf16", "fp8_e4m3", "int8"
    batch: int
    mode: str  # "eager" or "graph"
    step_us: float | None = None  # per decode step: the per-token latency
    tokens_per_s: float | None = None  # batch / step time
    vs_bf16: float | None = None  # bf16 step time / this step time, same batch and mode: > 1 is faster
    weight_bytes: int | None = None  # weights a step reads: linears (codes, scales, biases), norms
    cache_bytes: int = 0  # KV cache a step reads
    floor_us: float | None = None  # (weight + cache bytes) / copy bandwidth
    note: str = ""


class E2EResult(BaseModel):
    """Everything one `quantcore bench --e2e` run measured."""

    kind: Literal["e2e"] = "e2e"  # tells this file from an op bench's for --from-json
    device: capability.DeviceProfile
    versions: dict[str, str | None] = Field(default_factory=capability.versions)
    date: str
    command: str
    config: Config
    copy_gbps: float | None
    notes: list[str] = []
    model: list[Row] = []
    stack: list[Row] = []


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the weights one step reads: every module's own parameters and buffers, except the
    embedding table (a step gathers one row of it per sequence)."""
    return sum(t.nbytes for m in model.modules() if not isinstance(m, nn.Embedding)
               for t in (*m.parameters(recurse=False), *m.buffers(recurse=False)))


def _warm_eager(step: Callable[[], object], cfg: Config) -> Callable[[], object]:
    for _ in range(cfg.warmup):
        step()
    return step


def _warm_graph(step: Callable[[], object], cfg: Config) -> Callable[[], object]:
    for _ in range(cfg.warmup):  # the kernels compile outside the capture
        step()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    # The outer context restores the current stream even when the capture fails: torch.cuda.graph's
    # own exit skips that when ending the capture raises, and the next configuration would run on it.
    with torch.cuda.stream(side):
        for _ in range(GRAPH_WARMUP):
            step()
        with torch.cuda.graph(graph, stream=side):
            step()
    torch.cuda.current_stream().wait_stream(side)
    for _ in range(cfg.warmup):
        graph.replay()
    return graph.replay


def _measure(rows: list[Row], base: nn.Module, batches: list[int], make_step: Callable[[nn.Module, int], tuple],
             cfg: Config, copy_gbps: float | None, done: Callable[[Row], None]) -> None:
    """Append to `rows` every weights format × batch × mode of `base` (a bf16 module, quantized per
    format on a deep copy), calling `done` with each finished row. `make_step(module, batch)` returns
    (step, KV-cache bytes it reads).

    The formats of one batch and mode are timed together, in ROUNDS interleaved loops of `cfg.tokens`
    steps each, and each keeps its fastest loop: a slow moment of a shared host then lands on every
    format alike instead of on whichever ran during it (measured sequentially on the lent H100, the
    same bf16 eager step took 1.9 ms in one run and 2.5 in the next)."""
    graphs = torch.cuda.is_available() and next(base.parameters()).is_cuda
    modules: dict[str, nn.Module] = {}
    for name, qdtype in DTYPES.items():
        try:
            with torch.no_grad():
                modules[name] = base if qdtype is None else qnn.quantize_model(copy.deepcopy(base), dtype=qdtype)
        except Exception as err:  # any failure is this configuration's result, never the run's end
            for batch in batches:
                for mode in MODES:
                    rows.append(Row(dtype=name, batch=batch, mode=mode, note=f"quantize_model: {error_note(err, 300)}"))
                    done(rows[-1])
    for batch in batches:
        for mode in MODES:
            # Each entry keeps its step (and through it the decode state) alive: a captured graph replays
            # into the state's memory, which must not be freed and handed to the next format's state.
            timed: dict[str, tuple[Row, Callable[[], object], Callable[[], object]]] = {}
            for name, module in modules.items():
                row = Row(dtype=name, batch=batch, mode=mode, weight_bytes=weight_bytes(module))
                try:
                    with torch.inference_mode():
                        step, row.cache_bytes = make_step(module, batch)
                        if mode == "graph" and not graphs:
                            row.note = "skipped: CUDA graphs need a CUDA device"
                        else:
                            timed[name] = row, (_warm_eager if mode == "eager" else _warm_graph)(step, cfg), step
                except Exception as err:  # a failed kernel or capture is this row's result
                    row.note = error_note(err, 300)
                if name not in timed:
                    _record(row, rows, copy_gbps, done)
            best: dict[str, float] = {}
            for _ in range(ROUNDS):
                for name, (row, run, _) in list(timed.items()):
                    try:
                        with torch.inference_mode():
                            best[name] = min(best.get(name, float("inf")), timing.loop_us(run, cfg.tokens))
                    except Exception as err:
                        row.note = error_note(err, 300)
                        del timed[name]
                        best.pop(name, None)
                        _record(row, rows, copy_gbps, done)
            for name, (row, *_) in timed.items():  # bf16 first: the others' ratios need it
                row.step_us = best[name]
                _record(row, rows, copy_gbps, done)
            timed.clear()  # frees the states (and the graphs' memory pools) before the next configuration
            if graphs:
                torch.cuda.empty_cache()
    order = {(d, b, m): i for i, (d, b, m) in enumerate((d, b, m) for d in DTYPES for b in batches for m in MODES)}
    rows.sort(key=lambda r: order[(r.dtype, r.batch, r.mode)])


def _record(row: Row, rows: list[Row], copy_gbps: float | None, done: Callable[[Row], None]) -> None:
    rows.append(row)
    _finish(row, rows, copy_gbps)
    done(row)


def _finish(row: Row, rows: list[Row], copy_gbps: float | None) -> None:
    """Fill the row's derived numbers: tokens/s, the ratio to bf16 (measured before it), the floor."""
    if copy_gbps and row.weight_bytes is not None:
        row.floor_us = (row.weight_bytes + row.cache_bytes) / copy_gbps / 1e3
    if not row.step_us:
        return
    row.tokens_per_s = row.batch / row.step_us * 1e6
    bf16 = next((r for r in rows if (r.dtype, r.batch, r.mode) == ("bf16", row.batch, row.mode)), None)
    if bf16 is not None and bf16.step_us:
        row.vs_bf16 = bf16.step_us / row.step_us


def weights_needed(cfg: Config) -> int:
    """Bytes of the weights held at once while the model is timed: the bf16 model and its FP8 and INT8
    copies, whose linears hold a byte per weight and whose embedding and output head stay bf16 (biases,
    norms, scales and the KV caches, a few percent at the sizes that come near a device's memory, left out)."""
    linears = cfg.layers * 12 * cfg.dim ** 2  # per layer q, k, v, o: 4·dim², up and down: 2·4·dim²
    tables = 2 * cfg.vocab * cfg.dim  # the embedding and the output head
    return 2 * (linears + tables) + 2 * (linears + 2 * tables)


def _memory(device: torch.device) -> int | None:
    """The device's memory in bytes (the host's for the CPU), None where it cannot be told."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows), or the names are unknown
        return None


def _check_fits(cfg: Config, device: torch.device) -> None:
    """Refuse, before allocating anything, a model whose weights alone exceed the device's memory."""
    needed, memory = weights_needed(cfg), _memory(device)
    if memory is not None and needed > memory:
        raise InvalidInputError(f"bench --e2e: dim {cfg.dim} and {cfg.layers} layers (vocab {cfg.vocab}) need about "
                                f"{needed / 1e9:.3g} GB of weights for the bf16 model and its FP8 and INT8 copies, "
                                f"more than the {memory / 1e9:.3g} GB of {device}; pass a smaller --e2e-dim or "
                                "--e2e-layers")


def run_e2e(cfg: Config | None = None, *, device: str | torch.device | None = None, copy_gbps: float | None = None,
            command: str = "quantcore bench --e2e", log: Callable[[str], None] = lambda line: None,
            checkpoint: Callable[[E2EResult], None] | None = None) -> E2EResult:
    """Measure the decode model and the linear stack in bf16, FP8 and INT8, eager and CUDA graph.

    device: the GPU by default, else the CPU (where graphs are skipped, with a note). copy_gbps: the
    memory-floor rate; measured on a GPU when None (`timing.copy_bandwidth_gbps`), no floor on the
    CPU. `log` receives a line per configuration; `checkpoint` the partial result after each."""
    cfg = cfg if cfg is not None else Config()
    dev = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    _check_fits(cfg, dev)
    if copy_gbps is None and dev.type == "cuda":
        copy_gbps = timing.copy_bandwidth_gbps()
    result = E2EResult(device=capability.profile_for(dev), date=datetime.date.today().isoformat(), command=command,
                       config=cfg, copy_gbps=copy_gbps)
    if dev.type != "cuda":
        result.notes.append("CUDA graphs skipped: the device is not a CUDA GPU")
    start = time.perf_counter()

    def done(label: str) -> Callable[[Row], None]:
        def report(row: Row) -> None:
            outcome = f"{row.step_us:.1f} µs/step" if row.step_us else row.note
            log(f"[{time.perf_counter() - start:7.1f}s] {label} {row.dtype} batch {row.batch} {row.mode}: {outcome}")
            if checkpoint:
                checkpoint(result)
        return report

    torch.manual_seed(cfg.seed)
    with torch.no_grad():
        model = decoder.DecodeModel(cfg.dim, cfg.layers, cfg.vocab, dev)

    def model_step(module, batch):
        state = decoder.DecodeState.new(module, batch, cfg.context)
        return (lambda: decoder.decode_step(module, state)), state.cache_bytes()

    _measure(result.model, model, cfg.batches, model_step, cfg, copy_gbps, done("model"))
    del model
    with torch.no_grad():
        stack = decoder.linear_stack(cfg.dim, cfg.layers, dev)

    def stack_step(module, m):
        x = torch.randn(m, cfg.dim, device=dev, dtype=decoder.DTYPE)
        return (lambda: module(x)), 0

    _measure(result.stack, stack, [STACK_M], stack_step, cfg, copy_gbps, done("linear stack"))
    return result


def _cell(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def _mb(n: int | None) -> str:
    return "—" if n is None else f"{n / 1e6:.1f}"


def render(result: E2EResult) -> str:
    """The run as markdown: the device line, the decode table, the linear-stack table, the notes."""
    cfg, d = result.config, result.device
    copy = f"copy ceiling {result.copy_gbps:.0f} GB/s" if result.copy_gbps else "no copy ceiling measured"
    out = [f"device: {d.name} ({d.arch}), {result.date}; {copy}; "
           f"versions: {', '.join(f'{k} {v}' for k, v in result.versions.items())}",
           f"command: `{result.command}`", "",
           f"Decode: dim {cfg.dim}, MLP {cfg.hidden} (GELU, biases), {cfg.layers} layers, {cfg.dim // cfg.head_dim} "
           f"heads of {cfg.head_dim}, vocab {cfg.vocab} (bf16 output head, not quantized), bf16 KV cache of "
           f"{cfg.context} positions read whole every step; greedy; {cfg.tokens} timed steps after {cfg.warmup} "
           f"warm-up steps, host clock around the loop with one synchronize, the fastest of {ROUNDS} loops run in turn "
           "with the other formats'; graph: one captured step replayed. "
           "Floor: (weights + KV cache bytes) / copy rate. Speed vs bf16: bf16 step time / this step time.", "",
           "| weights | batch | mode | ms / token | tokens/s | speed vs bf16 | weights MB | KV cache MB | floor ms "
           "| floor / step | note |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result.model:
        out.append(f"| {r.dtype} | {r.batch} | {r.mode} | {_cell(r.step_us and r.step_us / 1e3, '.3f')} "
                   f"| {_cell(r.tokens_per_s, '.1f')} | {_cell(r.vs_bf16, '.2f')} | {_mb(r.weight_bytes)} "
                   f"| {_mb(r.cache_bytes)} | {_cell(r.floor_us and r.floor_us / 1e3, '.3f')} "
                   f"| {_cell(r.floor_us and r.step_us and r.floor_us / r.step_us, '.2f')} | {r.note} |")
    out += ["", f"Linear stack: {cfg.layers} layers × 6 linears without bias or activation, applied in sequence — "
            f"4 of {cfg.dim}×{cfg.dim} (q, k, v, o), {cfg.dim}→{cfg.hidden} (up), {cfg.hidden}→{cfg.dim} (down): "
            f"{6 * cfg.layers} linears per step, M = {STACK_M}; nn.Linear in bf16 against QuantLinear.", "",
            "| weights | M | mode | µs / step | speed vs bf16 | weights MB | floor µs | floor / step | note |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in result.stack:
        out.append(f"| {r.dtype} | {r.batch} | {r.mode} | {_cell(r.step_us, '.1f')} | {_cell(r.vs_bf16, '.2f')} "
                   f"| {_mb(r.weight_bytes)} | {_cell(r.floor_us, '.1f')} "
                   f"| {_cell(r.floor_us and r.step_us and r.floor_us / r.step_us, '.2f')} | {r.note} |")
    if result.notes:
        out += [""] + [f"- {n}" for n in result.notes]
    return "\n".join(out)
