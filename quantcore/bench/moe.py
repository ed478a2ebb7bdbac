"""`quantcore bench --moe`: mixture-of-experts layers of real models, as grouped GEMMs and as decode steps.

**Grouped GEMM rows** (a GPU's): per model (`MOE_MODELS`: DeepSeek-V3's and Qwen3-30B-A3B's routed experts),
projection (gate_up: H → 2I; down: I → H), token count T and routing (uniform; Zipf, where a few experts
take most tokens), the T·k routed rows of random codes through quantcore's `grouped_mm` (every backend,
forced in turn) and, for T ≤ `MASKED_T`, `grouped_mm_masked` (slabs of max_m = T rows), timed interleaved
beside, in the same run: `torch._grouped_mm` in bf16 and `torch._scaled_grouped_mm` (FP8 with one scale
per row of a and of each expert's weight, a simpler format) where the installed torch has them, a Python
loop of cuBLAS block-FP8 `torch._scaled_mm` over the experts that have rows (what a model looping over its
experts does), and quantcore's dense `scaled_mm` on as many rows against one expert's weight (the rate a
grouped kernel should approach). Rates are TFLOP/s of the routed rows; at T ≤ `MASKED_T` a read-ceiling
row gives the floor: the bytes of the experts hit, their scales and the activations read once, at the
rate of a kernel that only reads them.

**Step rows**: `layers` MoE layers (a bf16 router, the experts, the residual add), a decode step of B
tokens, with the experts in bf16 (`TorchExperts`: `torch._grouped_mm` on rows sorted on the device) and
quantized by `quantize_model` (FP8 and INT8 `QuantExperts`), eager and replayed from a CUDA graph
(`steps.measure`); the floor counts the experts the step's routing hits.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Literal

import torch
from pydantic import BaseModel, Field, PositiveInt, field_validator
from torch import nn

from .. import ops, registry
from ..formats import DEFAULT_BLOCK
from ..nn.experts import QuantExperts
from ..registry import measured
from . import baselines
from .run import Record, attempt, contenders, timed_records
from .shapes import MOE_MODELS, MOE_TOKENS, READ_CEILING, ROUTINGS, MoEShape
from .steps import DTYPES, MODES, Row, StepResult, cell, default_device, known, mb, measure, notes_cell, progress

MASKED_T = 64  # tokens up to which the masked layout is timed too (QuantExperts' decode layout)
ZIPF_S = 1.2  # the Zipf routing's exponent: expert e (in a random order) is drawn with weight 1 / (e + 1)^s


def route(tokens: int, experts: int, top_k: int, routing: str, gen: torch.Generator) -> torch.Tensor:
    """topk_ids int32 [tokens, top_k], distinct experts per token: `routing` "uniform" (each token's top-k of
    random scores) or "zipf" (drawn without replacement with weight 1 / (rank + 1)^ZIPF_S, the ranks a
    random order of the experts: a few experts take most of the tokens)."""
    if routing == "uniform":
        return torch.rand(tokens, experts, generator=gen).topk(top_k, dim=1).indices.int()
    if routing != "zipf":
        raise ValueError(f"routing must be one of {ROUTINGS}, got {routing!r}")
    weights = (torch.arange(experts, dtype=torch.float64) + 1) ** -ZIPF_S
    ranked = torch.multinomial(weights.expand(tokens, experts), top_k, replacement=False, generator=gen)
    return torch.randperm(experts, generator=gen)[ranked].int()


def floor_bytes(ids: torch.Tensor, n: int, k: int, block: tuple[int, int] = DEFAULT_BLOCK) -> int:
    """The least bytes a grouped GEMM of these routed rows moves: each expert hit read once (1-byte codes
    [n, k] and fp32 scales per block), the rows' codes and scales read, their bf16 outputs written."""
    hit, rows = int(torch.unique(ids).numel()), ids.numel()
    scales = 4 * math.ceil(n / block[0]) * math.ceil(k / block[1])
    return hit * (n * k + scales) + rows * (k + 4 * math.ceil(k / block[1])) + 2 * rows * n


class TorchExperts(nn.Module):
    """bf16 experts as a PyTorch model without a MoE library runs them: the routed rows sorted by expert on
    the device and `torch._grouped_mm` for each projection (no host synchronization: a CUDA graph holds it).
    Its `gate_up_proj` [E, 2I, H] and `down_proj` [E, H, I] are transformers' stacked experts' layout, so
    `quantize_model` turns it into a `QuantExperts`."""

    def __init__(self, experts: int, hidden: int, inter: int, gen: torch.Generator):
        super().__init__()
        self.gate_up_proj = nn.Parameter(_weights((experts, 2 * inter, hidden), gen), requires_grad=False)
        self.down_proj = nn.Parameter(_weights((experts, hidden, inter), gen), requires_grad=False)
        self.act_fn = nn.SiLU()

    def forward(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        k, experts = topk_ids.shape[1], self.gate_up_proj.shape[0]
        flat = topk_ids.reshape(-1).long()
        order = torch.argsort(flat, stable=True)
        counts = torch.zeros(experts, dtype=torch.int32, device=x.device)
        ends = counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32)).cumsum(0, dtype=torch.int32)
        token = order // k
        h = torch._grouped_mm(x[token], self.gate_up_proj.transpose(-2, -1), offs=ends)
        inter = h.shape[-1] // 2
        y = torch._grouped_mm(self.act_fn(h[:, :inter]) * h[:, inter:], self.down_proj.transpose(-2, -1), offs=ends)
        weights = topk_weights.reshape(-1)[order, None].to(y.dtype)
        return torch.zeros_like(x).index_add_(0, token, y * weights)


def _weights(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """bf16 weights of `shape` with unit fan-in variance, drawn on `gen`'s device one expert at a time (no
    fp32 copy of them all)."""
    out = torch.empty(shape, dtype=torch.bfloat16, device=gen.device)
    for e in range(shape[0]):
        out[e] = torch.randn(shape[1:], generator=gen, device=gen.device) * shape[-1] ** -0.5
    return out


class MoEBlock(nn.Module):
    """One MoE layer of a decode step: a bf16 router (a parameter, not a linear: routers stay unquantized),
    softmax top-k, the experts, the residual add."""

    def __init__(self, shape: MoEShape, gen: torch.Generator):
        super().__init__()
        self.top_k = shape.top_k
        self.router = nn.Parameter(_weights((1, shape.experts, shape.hidden), gen)[0], requires_grad=False)
        self.experts = TorchExperts(shape.experts, shape.hidden, shape.inter, gen)
        self.last_ids: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = torch.nn.functional.linear(x, self.router).float().softmax(-1).topk(self.top_k)
        self.last_ids = ids
        return x + self.experts(x, ids, weights)


class MoEConfig(BaseModel):
    """What `quantcore bench --moe` times."""

    models: list[str] = Field(default_factory=lambda: list(MOE_MODELS), min_length=1)
    tokens: list[PositiveInt] = Field(default_factory=lambda: list(MOE_TOKENS), min_length=1)
    routings: list[Literal["uniform", "zipf"]] = Field(default_factory=lambda: list(ROUTINGS), min_length=1)
    ops: bool = Field(True, description="time the grouped GEMMs (a GPU's)")
    step_model: str = "qwen3-30b-a3b"
    layers: int = Field(4, ge=0, description="MoE layers a decode step runs (0: no step rows)")
    batches: list[PositiveInt] = Field(default_factory=lambda: [1, 8, 64], min_length=1)
    steps: int = Field(64, ge=1, description="timed steps per loop")
    warmup: int = Field(8, ge=1, description="untimed steps before timing (compiles the kernels)")
    scale: int = Field(1, ge=1, description="every size divided by this (1: the models' own)")
    masked_max_rows: int | None = Field(None, ge=0, description="the decode steps' QuantExperts layout bound: routed "
                                        "rows up to it run the masked layout (0: always contiguous; None: the default)")
    seed: int = 0

    @field_validator("models")
    @classmethod
    def _known(cls, names: list[str]) -> list[str]:
        return known(names, MOE_MODELS, "model(s)")

    @field_validator("step_model")
    @classmethod
    def _known_step(cls, name: str) -> str:
        return known([name], MOE_MODELS, "model")[0]


class MoEResult(StepResult):
    """Everything one `quantcore bench --moe` run measured."""

    kind: Literal["moe"] = "moe"  # tells this file from the other runs' for --from-json
    config: MoEConfig
    records: list[Record] = []  # the grouped GEMM rows: op "grouped_mm", fmt, shape [T, N, K, E, top_k]
    steps: list[Row] = []


def expert_codes(shape: MoEShape, proj: str, qdtype: torch.dtype, gen: torch.Generator
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Random stacked weights of one projection on `gen`'s device: codes [E, N, K] (drawn one expert at a
    time, so no float copy of all of them is made) and fp32 block scales [E, ceil(N/128), ceil(K/128)]."""
    n, k = (2 * shape.inter, shape.hidden) if proj == "gate_up" else (shape.hidden, shape.inter)
    device = gen.device
    codes = torch.empty((shape.experts, n, k), dtype=qdtype, device=device)
    for e in range(shape.experts):
        if qdtype == torch.int8:
            codes[e] = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8, device=device)
        else:
            codes[e] = (torch.randn((n, k), generator=gen, device=device) * 64).clamp(-448, 448)
    scales = torch.rand(shape.experts, math.ceil(n / 128), math.ceil(k / 128), generator=gen, device=device) + 0.5
    return codes, scales


def _expert_loop(a, a_s, b, b_s, offsets: list[int]) -> Callable[[], object]:
    """cuBLAS block FP8 `torch._scaled_mm` per expert with rows, from Python (the offsets read once)."""
    calls = [baselines.cublas_blockwise_fp8(a[lo:hi], a_s[lo:hi], b[e], b_s[e])
             for e, (lo, hi) in enumerate(zip(offsets, offsets[1:])) if hi > lo]

    def loop():
        for call in calls:
            call()
    return loop


def _grouped_records(shape: MoEShape, tokens: int, routing: str, fmt: str, b: torch.Tensor, b_s: torch.Tensor,
                     gen: torch.Generator) -> list[Record]:
    """The grouped GEMM rows of one model's projection (`expert_codes`: b [E, N, K], b_s) × T × routing ×
    format, timed interleaved; the routing and the activations drawn with `gen` (the CPU's)."""
    E, n, k = b.shape
    top, qdtype, device = shape.top_k, b.dtype, b.device
    ids = route(tokens, E, top, routing, gen).to(device)
    x = torch.randn(tokens, k, generator=gen).to(device, torch.bfloat16)
    a, a_s, offsets, rows = ops.moe_permute(x, ids, E, dtype=qdtype)
    rows_n = tokens * top
    flops = baselines.gemm_flops(rows_n, n, k)
    rec = dict(op="grouped_mm", fmt=fmt, shape=[tokens, n, k, E, top])

    def ours(op: str, args: tuple, prefix: str = "") -> list[tuple[dict, Callable[[], object] | None]]:
        return [({**rec, "impl": prefix + name, "note": f"{routing} routing" + (f"; {note}" if note else "")}, fn)
                for name, (fn, note) in contenders(op, args, {}, False).items()]
    entries = ours("grouped_mm", (a, a_s, b, b_s, offsets))
    if tokens <= MASKED_T:
        slab, slab_s, masked_m, _ = ops.moe_permute_masked(x, ids, E, tokens, dtype=qdtype)
        entries += ours("grouped_mm_masked", (slab, slab_s, b, b_s, masked_m), "masked:")
    bounds = offsets.tolist()
    dense, note = attempt(_ready(lambda: ops.scaled_mm(a, a_s, b[0], b_s[0])))
    entries.append(({**rec, "impl": "dense-scaled_mm", "note": note or f"quantcore's scaled_mm, {rows_n} rows, "
                     "one expert's weight"}, dense))
    entries += _torch_baselines(rec, x, rows, ids, b, b_s, a, a_s, bounds, qdtype, routing)
    records = timed_records(entries, flops, "TFLOP/s", None)
    if tokens <= MASKED_T:
        nbytes = floor_bytes(ids, n, k)
        read_us = baselines.read_ceiling_us(nbytes)
        records.append(Record(**rec, impl=READ_CEILING, us=read_us, rate=nbytes / read_us / 1e3, unit="GB/s",
                              note=f"one kernel reading the {int(torch.unique(ids).numel())} experts hit, their "
                                   "scales and the activations"))
        for r in records:
            if r.us and r.impl != READ_CEILING:
                r.fraction = read_us / r.us  # of the memory floor
    loop = next((r for r in records if r.impl == "cublas-blockwise-loop" and r.us), None)
    for r in records:
        if loop is not None and r.us:
            r.vs_vendor = loop.us / r.us
    return records


def _ready(fn: Callable[[], object]) -> Callable[[], Callable[[], object]]:
    """`attempt`'s make of `fn`: called once (it compiles, and raises where it cannot run), then returned."""
    def make():
        fn()
        return fn
    return make


def _torch_baselines(rec: dict, x, rows, ids, b, b_s, a, a_s, bounds: list[int], qdtype: torch.dtype,
                     routing: str) -> list[tuple[dict, Callable[[], object] | None]]:
    """torch's grouped GEMMs on the same routed rows and the per-expert cuBLAS block-FP8 loop, for FP8; each
    row's note says why it is missing where torch cannot run it. Their operands hold the same bytes in
    their formats (bf16 weights; e4m3 codes with one scale per row), not the same values: only time counts."""
    if qdtype != torch.float8_e4m3fn:
        return []
    ends = torch.tensor(bounds[1:], dtype=torch.int32, device=x.device)
    a_bf16, b_bf16 = x[rows.clamp(min=0).long() // ids.shape[1]], b.to(torch.bfloat16)
    row_scales, col_scales = torch.ones(a.shape[0], device=x.device), torch.ones(b.shape[:2], device=x.device)
    bf16, bf16_note = attempt(_ready(lambda: torch._grouped_mm(a_bf16, b_bf16.transpose(-2, -1), offs=ends)))
    fp8, fp8_note = attempt(_ready(lambda: torch._scaled_grouped_mm(a, b.transpose(-2, -1), row_scales, col_scales,
                                                                    offs=ends, out_dtype=torch.bfloat16)))
    loop, loop_note = attempt(lambda: _expert_loop(a, a_s, b, b_s, bounds))
    return [({**rec, "impl": "torch._grouped_mm-bf16", "note": bf16_note or f"{routing} routing"}, bf16),
            ({**rec, "impl": "torch._scaled_grouped_mm-rowwise", "note": fp8_note or f"{routing} routing"}, fp8),
            ({**rec, "impl": "cublas-blockwise-loop", "note": loop_note or "torch._scaled_mm per expert with rows"},
             loop)]


def _step_factory(shape: MoEShape, masked_max_rows: int | None = None
                  ) -> Callable[[nn.Module, int], tuple[Callable[[], object], dict[str, int]]]:
    """`measure`'s make_step: a decode step of `batch` tokens through the layers, and its floor's weight
    bytes (the routers, and each layer's experts that this step's routing hits, as the module stores them).
    `masked_max_rows` (not None): every QuantExperts' layout bound, so that one run times one layout."""
    def make(module: nn.Module, batch: int):
        if masked_max_rows is not None:
            for experts in module.modules():
                if isinstance(experts, QuantExperts):
                    experts.masked_max_rows = masked_max_rows
        device = next(module.parameters()).device
        x = torch.randn(batch, shape.hidden, generator=torch.Generator().manual_seed(batch)).to(device, torch.bfloat16)

        def step():
            return module(x)
        step()  # routes once: the floor counts the experts this x reaches in each layer
        nbytes = 0
        for block in module:
            per_expert = sum(p.nbytes for p in block.experts.parameters()) // shape.experts
            nbytes += block.router.nbytes + per_expert * int(torch.unique(block.last_ids).numel())
        return step, {"weight_bytes": nbytes}
    return make


def run_moe(cfg: MoEConfig | None = None, *, device: str | torch.device | None = None, copy_gbps: float | None = None,
            command: str = "quantcore bench --moe", log: Callable[[str], None] = lambda line: None,
            checkpoint: Callable[[MoEResult], None] | None = None) -> MoEResult:
    """Time `cfg`'s grouped GEMM rows (on a GPU; on the CPU a note says they were skipped) and its decode
    steps. `log` receives a line per configuration; `checkpoint` the partial result after each."""
    cfg = cfg if cfg is not None else MoEConfig()
    dev = default_device(device)
    result = MoEResult.begin(dev, copy_gbps, command, config=cfg)
    gen, weights_gen = torch.Generator().manual_seed(cfg.seed), torch.Generator(dev).manual_seed(cfg.seed)
    if cfg.ops and dev.type != "cuda":
        result.notes.append("grouped GEMM rows skipped: they are timed with CUDA events on a GPU")
    elif cfg.ops:
        for name in cfg.models:
            shape = MOE_MODELS[name].scaled(cfg.scale)
            for proj in ("gate_up", "down"):
                for fmt, qdtype in (("fp8_e4m3", torch.float8_e4m3fn), ("int8", torch.int8)):
                    b, b_s = expert_codes(shape, proj, qdtype, weights_gen)
                    for tokens in cfg.tokens:
                        for routing in cfg.routings:
                            result.records += _grouped_records(shape, tokens, routing, fmt, b, b_s, gen)
                            log(f"{name} {proj} T={tokens} {routing} {fmt}")
                            if checkpoint:
                                checkpoint(result)
                    del b, b_s  # DeepSeek-V3's gate_up codes are 7.5 GB: freed before the next are drawn
                    torch.cuda.empty_cache()
    if cfg.layers:
        shape = MOE_MODELS[cfg.step_model].scaled(cfg.scale)
        torch.manual_seed(cfg.seed)
        with torch.no_grad():
            base = nn.Sequential(*(MoEBlock(shape, weights_gen) for _ in range(cfg.layers)))
        done = progress(log, checkpoint and (lambda: checkpoint(result)))
        measure(result.steps, base, cfg.batches, _step_factory(shape, cfg.masked_max_rows), tokens=cfg.steps,
                warmup=cfg.warmup, copy_gbps=result.copy_gbps, done=done(f"{cfg.step_model} x{cfg.layers}"))
    return result


def render(result: MoEResult) -> str:
    """The run as markdown: the grouped GEMM table (µs and TFLOP/s per implementation; the floor's fraction
    at decode sizes; speed over the per-expert cuBLAS loop) and the decode-step table."""
    cfg = result.config
    out = [*result.header(), ""]
    if result.records:
        out += ["Grouped GEMMs: GPU time per call (CUDA events, L2 flushed), TFLOP/s of the T·k routed rows; "
                "floor: the read-ceiling's time over this one where T ≤ " + f"{MASKED_T}; vs loop: the per-expert "
                "cuBLAS block-FP8 loop's time over this one.", "",
                "| model shape [T, N, K, E, k] | fmt | impl | µs | TFLOP/s | floor | vs loop | note |",
                "|---|---|---|---|---|---|---|---|"]
        for r in result.records:
            out.append(f"| {r.shape} | {r.fmt} | {r.impl} | {cell(r.us, '.1f')} | "
                       f"{cell(r.rate if r.unit == 'TFLOP/s' else None, '.1f')} | {cell(r.fraction, '.2f')} | "
                       f"{cell(r.vs_vendor, '.2f')} | {r.note} |")
    if result.steps:
        shape = MOE_MODELS[cfg.step_model].scaled(cfg.scale)
        formats = list(DTYPES)
        out += ["", f"Decode steps: {cfg.layers} MoE layers of {cfg.step_model} (H {shape.hidden}, I {shape.inter}, "
                f"E {shape.experts}, top-{shape.top_k}; bf16 router, experts bf16 through torch._grouped_mm or "
                "quantized by quantize_model), µs a step; floor: the routers and the experts the step's routing "
                "hits, as stored, over the copy rate.", "",
                "| batch | mode | " + " | ".join(f"{d} µs | floor / step" + ("" if d == "bf16" else " | vs bf16")
                                                for d in formats) + " | note |",
                "|---|---|" + "---|" * (3 * len(formats))]
        rows = {(r.dtype, r.batch, r.mode): r for r in result.steps}
        for batch in cfg.batches:
            for mode in MODES:
                cells = [rows.get((d, batch, mode)) for d in formats]
                parts = []
                for d, r in zip(formats, cells):
                    parts += [cell(r and r.step_us, ".1f"), cell(r and r.floor_fraction, ".2f")]
                    if d != "bf16":
                        parts.append(cell(r and r.vs_bf16, ".2f"))
                out.append(f"| {batch} | {mode} | " + " | ".join(parts) + f" | {notes_cell(cells)} |")
        weights = {d: next((r.weight_bytes for r in result.steps if r.dtype == d and r.weight_bytes), None)
                   for d in formats}
        out += ["", "weights a step reads at the first batch, MB: "
                + ", ".join(f"{d} {mb(w)}" for d, w in weights.items())]
    if result.notes:
        out += [""] + [f"- {n}" for n in result.notes]
    return "\n".join(out)


def write_priority(result: MoEResult, root: Path | None = None) -> Path:
    """The grouped GEMM's measured ranking into the priority table of the run's GPU model (`measured.write`: its
    other entries stay): quantcore's implementations of the contiguous layout, per format and bucket of routed
    rows T·k (what a `grouped_mm` call's query buckets), by geometric-mean time over the models, projections and
    routings of the bucket."""
    records = [r for r in result.records if r.op == "grouped_mm" and r.impl in registry.compared("grouped_mm")]
    priority = measured.build(records, lambda r: registry.m_bucket(r.shape[0] * r.shape[4]))
    path = measured.write(result.device.name, priority, f"{result.command} on {result.date}", root, result.device.arch)
    registry.clear_caches()  # selections and kept plans made under the previous table
    return path
