"""`quantcore bench --stacks`: the linears of real models' layers (`stacks.STACKS`: Llama-3-8B, Qwen3-8B
and 14B, DeepSeek-V3's dense MLP and attention projections), `layers` layers of them per step, at
M = 1 to 128 rows, as bf16 `nn.Linear` and as FP8 and INT8 `QuantLinear` (`quantize_model`), eager
and replayed from a CUDA graph, each step against its memory floor (`steps.measure`).

A step calls the layer's linears in order, `layers` times over, each on an input of its own width
made once per M (M × in_features, bf16). The work between a real layer's linears (attention, SiLU·mul,
splitting the fused outputs) is left out, and without it one linear's output is not the next one's
input (qkv's 6144 columns feed an o of 4096 in Llama-3-8B); on one stream the linears still run one
after another as a model's do, and the inputs, a few MB at most, sit beside hundreds of MB of weights.

The floor of a step is its least bytes over the copy rate: the weights as stored (bf16, or 1-byte
codes and fp32 block scales) plus each linear's bf16 input read and output written.
"""

from __future__ import annotations

from typing import Callable, Literal

import torch
from pydantic import BaseModel, Field, PositiveInt, field_validator
from torch import nn

from . import decoder
from .stacks import STACKS, Stack
from .steps import (DTYPES, MODES, ROUNDS, Row, StepResult, cell, default_device, known, mb, measure, notes_cell,
                    progress)

STACK_MS = (1, 2, 4, 8, 16, 32, 64, 128)  # decode batches: one sequence up to 128 of them (issue 64)


class StacksConfig(BaseModel):
    """What `quantcore bench --stacks` times."""

    stacks: list[str] = Field(default_factory=lambda: list(STACKS), min_length=1)
    layers: int = Field(4, ge=1)
    ms: list[PositiveInt] = Field(default_factory=lambda: list(STACK_MS), min_length=1)
    # The stacks' floors on an H100 are 0.25-1 ms a step: 64 steps keep a loop at tens of ms, far above
    # the host clock's resolution, and put all the timing loops of a full run near 40 s by that estimate.
    tokens: int = Field(64, ge=1, description="timed steps per loop")
    warmup: int = Field(8, ge=1, description="untimed steps before timing (compiles the kernels)")
    scale: int = Field(1, ge=1, description="every feature size divided by this, rounded up (1: the models' own)")
    seed: int = 0

    @field_validator("stacks")
    @classmethod
    def _known(cls, names: list[str]) -> list[str]:
        return known(names, STACKS, "stack(s)")


class StackRun(BaseModel):
    """One stack as timed: its model, its linears (name, in_features, out_features; scaled), its rows."""

    name: str
    source: str
    linears: list[tuple[str, int, int]]
    rows: list[Row] = []


class StacksResult(StepResult):
    """Everything one `quantcore bench --stacks` run measured."""

    kind: Literal["stacks"] = "stacks"  # tells this file from an op bench's or an e2e one for --from-json
    config: StacksConfig
    stacks: list[StackRun] = []


def _make_step(module: nn.Module, m: int) -> tuple[Callable[[], None], dict[str, int]]:
    """The step of a stack's linears (`module` iterates over them) at M = m, and its activation bytes."""
    device = next(module.parameters()).device
    inputs = {k: torch.randn(m, k, device=device, dtype=decoder.DTYPE) for k in {lin.in_features for lin in module}}
    calls = [(lin, inputs[lin.in_features]) for lin in module]

    def step() -> None:
        for lin, x in calls:
            lin(x)
    nbytes = sum(decoder.DTYPE.itemsize * m * (lin.in_features + lin.out_features) for lin in module)
    return step, {"activation_bytes": nbytes}


def _build(stack: Stack, layers: int, device: torch.device) -> nn.ModuleList:
    """The stack's bf16 linears, `layers` times over, in the order a step calls them."""
    with torch.no_grad():
        shapes = [(lin.in_features, lin.out_features) for lin in stack.linears]
        return nn.ModuleList(decoder.linears(shapes * layers, device)).requires_grad_(False)


def run_stacks(cfg: StacksConfig | None = None, *, device: str | torch.device | None = None,
               copy_gbps: float | None = None, command: str = "quantcore bench --stacks",
               log: Callable[[str], None] = lambda line: None,
               checkpoint: Callable[[StacksResult], None] | None = None) -> StacksResult:
    """Time every stack of `cfg` × M × format × mode.

    device: the GPU by default, else the CPU (where graphs are skipped, with a note). copy_gbps: the
    memory-floor rate; measured on a GPU when None, no floor on the CPU. `log` receives a line per
    configuration; `checkpoint` the partial result after each."""
    cfg = cfg if cfg is not None else StacksConfig()
    dev = default_device(device)
    result = StacksResult.begin(dev, copy_gbps, command, config=cfg)
    done = progress(log, checkpoint and (lambda: checkpoint(result)))
    for name in cfg.stacks:
        stack = STACKS[name].scaled(cfg.scale)
        run = StackRun(name=name, source=stack.source,
                       linears=[(lin.name, lin.in_features, lin.out_features) for lin in stack.linears])
        result.stacks.append(run)
        torch.manual_seed(cfg.seed)
        base = _build(stack, cfg.layers, dev)
        measure(run.rows, base, cfg.ms, _make_step, tokens=cfg.tokens, warmup=cfg.warmup, copy_gbps=result.copy_gbps,
                done=done(name))
        del base  # the next stack's weights (up to 3 GB in bf16 at 4 layers) do not wait for the collector
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return result


def _cells(dtype: str, r: Row | None) -> str:
    """One format's cells of a table row: step time, floor, floor / step and (but for bf16) speed vs bf16."""
    out = [cell(r and r.step_us, ".1f"), cell(r and r.floor_us, ".1f"), cell(r and r.floor_fraction, ".2f")]
    return " | ".join(out if dtype == "bf16" else [*out, cell(r and r.vs_bf16, ".2f")])


def render(result: StacksResult) -> str:
    """The run as markdown: the device line, the method, then per stack its linears and a table of one
    row per M and mode with each format's step time, floor, floor / step and speed against bf16."""
    cfg = result.config
    formats = list(DTYPES)
    out = [*result.header(), "",
           f"Linear stacks: per model, the linears of one layer repeated for {cfg.layers} layers, called in order "
           "each on an input of its own width (M × in_features, bf16); nn.Linear in bf16 against QuantLinear "
           f"(quantize_model). {cfg.tokens} timed steps after {cfg.warmup} warm-up steps, host clock around the loop "
           f"with one synchronize, the fastest of {ROUNDS} loops run in turn with the other formats'; graph: the "
           "whole step captured once and replayed. Times in µs a step. Floor: (weights as stored + bf16 inputs "
           "read and outputs written) / copy rate; floor / step: the floor over the step time; vs bf16: bf16's "
           "step time over this one, same M and mode."
           + (f" Every size divided by {cfg.scale}, rounded up." if cfg.scale > 1 else "")]
    header = "| M | mode | " + " | ".join(
        f"{d} µs | floor µs | floor / step" + ("" if d == "bf16" else " | vs bf16") for d in formats) + " | note |"
    for run in result.stacks:
        rows = {(r.dtype, r.batch, r.mode): r for r in run.rows}
        weights = {d: next((r.weight_bytes for r in run.rows if r.dtype == d and r.weight_bytes), None)
                   for d in formats}
        out += ["", f"**{run.name}** ({run.source}): {cfg.layers} × ("
                + ", ".join(f"{n} {i}→{o}" for n, i, o in run.linears) + "); weights MB: "
                + ", ".join(f"{d} {mb(w)}" for d, w in weights.items()), "",
                header, "|---|---|" + "---|" * (4 * len(formats))]  # 3 cells for bf16, 4 for the others, the note
        for m in cfg.ms:
            for mode in MODES:
                cells = [rows.get((d, m, mode)) for d in formats]
                out.append(f"| {m} | {mode} | " + " | ".join(_cells(d, r) for d, r in zip(formats, cells))
                           + f" | {notes_cell(cells)} |")
    if result.notes:
        out += [""] + [f"- {n}" for n in result.notes]
    return "\n".join(out)
