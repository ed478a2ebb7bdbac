"""Whole steps of a bf16 module timed against its FP8 and INT8 `quantize_model` copies, each eager and
replayed from a CUDA graph: what `quantcore bench --e2e` (a decode model, a bare linear stack) and
`quantcore bench --stacks` (real models' linear shapes) share.

Timing: `warmup` steps (they compile the kernels), then `tokens` steps timed with the host clock
around the loop and one synchronize at its end, the fastest of `ROUNDS` such loops taken in turn with
the other formats' (`measure`); in graph mode one step is captured and the loop replays it. A
configuration that fails (quantization, a kernel, the capture) keeps its error as the row's note and
the run goes on.
"""

from __future__ import annotations

import copy
import datetime
import time
from typing import Callable

import torch
from pydantic import BaseModel, Field, computed_field
from torch import nn

from .. import capability
from .. import nn as qnn
from . import timing
from .run import error_note

DTYPES: dict[str, torch.dtype | None] = {"bf16": None, "fp8_e4m3": torch.float8_e4m3fn, "int8": torch.int8}
MODES = ("eager", "graph")
FUSED = "+fused"  # the suffix of a quantized model's rows with its producers fused (`quantize_model`'s fuse_*)


def variants(fused: dict | None) -> dict[str, tuple[torch.dtype | None, dict]]:
    """Row name -> (quantized dtype or None for bf16, quantize_model's fusion arguments): every format of
    DTYPES, and with `fused` (those arguments) each quantized format again, fused."""
    out = {name: (qdtype, {}) for name, qdtype in DTYPES.items()}
    if fused:
        out.update({name + FUSED: (qdtype, fused) for name, qdtype in DTYPES.items() if qdtype is not None})
    return out
GRAPH_WARMUP = 3  # steps on the capture's side stream before it, as torch's CUDA graph docs ask
ROUNDS = 3  # interleaved timing loops per configuration (`measure`)
GRAPHS_SKIPPED = "CUDA graphs skipped: the device is not a CUDA GPU"


class Row(BaseModel):
    """One weights format × batch × mode of a timed module (batch = M for a linear stack)."""

    dtype: str  # "bf16", "fp8_e4m3", "int8"
    batch: int
    mode: str  # "eager" or "graph"
    step_us: float | None = None  # per step: the per-token latency of a decode step
    tokens_per_s: float | None = None  # batch / step time
    vs_bf16: float | None = None  # bf16 step time / this step time, same batch and mode: > 1 is faster
    weight_bytes: int | None = None  # weights a step reads: linears (codes, scales, biases), norms
    cache_bytes: int = 0  # KV cache a step reads
    activation_bytes: int = 0  # activations a step's linears read and write, where counted (the --stacks rows)
    floor_us: float | None = None  # (weight + cache + activation bytes) / copy bandwidth
    note: str = ""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def floor_fraction(self) -> float | None:
        """The floor over the step time: 1 is a step moving its bytes at the copy rate."""
        return self.floor_us / self.step_us if self.floor_us and self.step_us else None


class StepResult(BaseModel):
    """What every run of timed steps records besides its rows: the machine, the command, the copy rate."""

    device: capability.DeviceProfile
    versions: dict[str, str | None] = Field(default_factory=capability.versions)
    date: str
    command: str
    copy_gbps: float | None
    notes: list[str] = []

    @classmethod
    def begin(cls, dev: torch.device, copy_gbps: float | None, command: str, **fields):
        """A result for a run on `dev`, the copy rate measured there when None and `dev` is a GPU (no
        floor on the CPU), with the note that graphs are skipped where it is not."""
        if copy_gbps is None and dev.type == "cuda":
            copy_gbps = timing.copy_bandwidth_gbps()
        return cls(device=capability.profile_for(dev), date=datetime.date.today().isoformat(), command=command,
                   copy_gbps=copy_gbps, notes=[] if dev.type == "cuda" else [GRAPHS_SKIPPED], **fields)

    def header(self) -> list[str]:
        """The first lines of a rendering: the device, the copy rate, the versions, the command."""
        d = self.device
        copy_rate = f"copy ceiling {self.copy_gbps:.0f} GB/s" if self.copy_gbps else "no copy ceiling measured"
        return [f"device: {d.name} ({d.arch}), {self.date}; {copy_rate}; "
                f"versions: {', '.join(f'{k} {v}' for k, v in self.versions.items())}",
                f"command: `{self.command}`"]


def known(names: list[str], table: dict, what: str) -> list[str]:
    """`names` where each is a key of `table`; a config validator's ValueError naming the others otherwise."""
    unknown = [n for n in names if n not in table]
    if unknown:
        raise ValueError(f"unknown {what} {unknown}; known: {', '.join(table)}")
    return names


def default_device(device: str | torch.device | None) -> torch.device:
    """`device`, by default the GPU where there is one, else the CPU."""
    return torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))


def progress(log: Callable[[str], None],
             checkpoint: Callable[[], None] | None) -> Callable[[str], Callable[[Row], None]]:
    """`done(label)` gives the `done` callback of `measure` for the rows of `label`: a log line per
    finished row (seconds since this call, the label, the row's time or note), then `checkpoint()`."""
    start = time.perf_counter()

    def done(label: str) -> Callable[[Row], None]:
        def report(row: Row) -> None:
            outcome = f"{row.step_us:.1f} µs/step" if row.step_us else row.note
            log(f"[{time.perf_counter() - start:7.1f}s] {label} {row.dtype} batch {row.batch} {row.mode}: {outcome}")
            if checkpoint:
                checkpoint()
        return report
    return done


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the weights one step reads: every module's own parameters and buffers, except the
    embedding table (a step gathers one row of it per sequence)."""
    return sum(t.nbytes for m in model.modules() if not isinstance(m, nn.Embedding)
               for t in (*m.parameters(recurse=False), *m.buffers(recurse=False)))


def _warm_eager(step: Callable[[], object], warmup: int) -> Callable[[], object]:
    for _ in range(warmup):
        step()
    return step


def _warm_graph(step: Callable[[], object], warmup: int) -> Callable[[], object]:
    for _ in range(warmup):  # the kernels compile outside the capture
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
    for _ in range(warmup):
        graph.replay()
    return graph.replay


def measure(rows: list[Row], base: nn.Module, batches: list[int],
            make_step: Callable[[nn.Module, int], tuple[Callable[[], object], dict[str, int]]], *, tokens: int,
            warmup: int, copy_gbps: float | None, done: Callable[[Row], None], fused: dict | None = None) -> None:
    """Append to `rows` every weights format × batch × mode of `base` (a bf16 module, quantized per
    format on a deep copy; with `fused`, quantize_model's fusion arguments, also each format fused),
    calling `done` with each finished row. `make_step(module, batch)` returns
    (step, the row's byte counts besides the weights: {"cache_bytes": n} or {"activation_bytes": n}).

    The formats of one batch and mode are timed together, in ROUNDS interleaved loops of `tokens`
    steps each after `warmup` steps, and each keeps its fastest loop: a slow moment of a shared host
    then lands on every format alike instead of on whichever ran during it (measured sequentially on
    the lent H100, the same bf16 eager step took 1.9 ms in one run and 2.5 in the next)."""
    graphs = torch.cuda.is_available() and next(base.parameters()).is_cuda
    modules: dict[str, nn.Module] = {}
    names = variants(fused)
    for name, (qdtype, fusion) in names.items():
        try:
            with torch.no_grad():
                modules[name] = base if qdtype is None else qnn.quantize_model(copy.deepcopy(base), dtype=qdtype,
                                                                                 **fusion)
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
                        step, counts = make_step(module, batch)
                        for field, nbytes in counts.items():
                            setattr(row, field, nbytes)
                        if mode == "graph" and not graphs:
                            row.note = "skipped: CUDA graphs need a CUDA device"
                        else:
                            timed[name] = row, (_warm_eager if mode == "eager" else _warm_graph)(step, warmup), step
                except Exception as err:  # a failed kernel or capture is this row's result
                    row.note = error_note(err, 300)
                if name not in timed:
                    _record(row, rows, copy_gbps, done)
            best: dict[str, float] = {}
            for _ in range(ROUNDS):
                for name, (row, run, _) in list(timed.items()):
                    try:
                        with torch.inference_mode():
                            best[name] = min(best.get(name, float("inf")), timing.loop_us(run, tokens))
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
    order = {(d, b, m): i for i, (d, b, m) in enumerate((d, b, m) for d in names for b in batches for m in MODES)}
    rows.sort(key=lambda r: order[(r.dtype, r.batch, r.mode)])


def _record(row: Row, rows: list[Row], copy_gbps: float | None, done: Callable[[Row], None]) -> None:
    rows.append(row)
    _finish(row, rows, copy_gbps)
    done(row)


def _finish(row: Row, rows: list[Row], copy_gbps: float | None) -> None:
    """Fill the row's derived numbers: tokens/s, the ratio to bf16 (measured before it), the floor."""
    if copy_gbps and row.weight_bytes is not None:
        row.floor_us = (row.weight_bytes + row.cache_bytes + row.activation_bytes) / copy_gbps / 1e3
    if not row.step_us:
        return
    row.tokens_per_s = row.batch / row.step_us * 1e6
    bf16 = next((r for r in rows if (r.dtype, r.batch, r.mode) == ("bf16", row.batch, row.mode)), None)
    if bf16 is not None and bf16.step_us:
        row.vs_bf16 = bf16.step_us / row.step_us


def cell(x: float | None, spec: str) -> str:
    """A table cell: `x` formatted, or a dash where there is no value."""
    return "—" if x is None else format(x, spec)


def mb(n: int | None) -> str:
    """Bytes as a table cell in MB (10^6)."""
    return "—" if n is None else f"{n / 1e6:.1f}"


def notes_cell(rows: list[Row | None]) -> str:
    """The notes of one M and mode's rows: once where every format has the same, else per format."""
    notes = [(r.dtype, r.note) for r in rows if r is not None and r.note]
    if len(notes) == len(rows) and len({n for _, n in notes}) == 1:
        return notes[0][1]
    return "; ".join(f"{d}: {n}" for d, n in notes)
