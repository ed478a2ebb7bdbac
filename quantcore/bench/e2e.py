"""`quantcore bench --e2e`: decode tokens/s of a transformer the size of a real one, in bf16 and with
its linears quantized to FP8 and INT8 (`quantcore.nn.quantize_model`, output head kept in bf16), and
quantized with its norms and (SwiGLU) SiLU-and-multiply fused into the kernels that quantize their outputs
("+fused": `fuse_norms`, `fuse_silu_mul`), each eager and replayed from a CUDA graph; and the same
comparison on a bare stack of linears (which has nothing to fuse).

Timing and failures as `steps.measure` says: the fastest of interleaved loops of `tokens` steps,
eager and replaying one captured step; a failing configuration keeps its error as the row's note.
"""

from __future__ import annotations

import os
from typing import Callable, Literal

import torch
from pydantic import BaseModel, Field, PositiveInt, computed_field

from ..errors import InvalidInputError
from . import decoder
from .steps import FUSED, ROUNDS, Row, StepResult, cell, default_device, mb, measure, progress

STACK_M = 1  # the linear stack is timed at one row: the decode GEMM at its most memory-bound


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
    mlp: Literal["gelu", "swiglu"] = Field("gelu", description="the model's MLP: GELU with biases, or Llama's SwiGLU")

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


class E2EResult(StepResult):
    """Everything one `quantcore bench --e2e` run measured."""

    kind: Literal["e2e"] = "e2e"  # tells this file from an op bench's for --from-json
    config: Config
    model: list[Row] = []
    stack: list[Row] = []


def weights_needed(cfg: Config) -> int:
    """Bytes of the weights held at once while the model is timed: the bf16 model and its quantized copies
    (FP8 and INT8, each also fused: `steps.variants`), whose linears hold a byte per weight and whose
    embedding and output head stay bf16 (biases, norms, scales and the KV caches, a few percent at the sizes
    that come near a device's memory, left out)."""
    linears = cfg.layers * 12 * cfg.dim ** 2  # per layer q, k, v, o: 4·dim², up and down: 2·4·dim²
    tables = 2 * cfg.vocab * cfg.dim  # the embedding and the output head
    return 2 * (linears + tables) + 4 * (linears + 2 * tables)


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
                                f"{needed / 1e9:.3g} GB of weights for the bf16 model and its quantized copies, "
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
    dev = default_device(device)
    _check_fits(cfg, dev)
    result = E2EResult.begin(dev, copy_gbps, command, config=cfg)
    done = progress(log, checkpoint and (lambda: checkpoint(result)))
    timed = dict(tokens=cfg.tokens, warmup=cfg.warmup, copy_gbps=result.copy_gbps)
    torch.manual_seed(cfg.seed)
    with torch.no_grad():
        model = decoder.DecodeModel(cfg.dim, cfg.layers, cfg.vocab, dev, cfg.mlp)

    def model_step(module, batch):
        state = decoder.DecodeState.new(module, batch, cfg.context)
        return (lambda: decoder.decode_step(module, state)), {"cache_bytes": state.cache_bytes()}

    fused = dict(fuse_norms=decoder.FUSED_NORMS, fuse_silu_mul=decoder.FUSED_ACTS if cfg.mlp == "swiglu" else ())
    measure(result.model, model, cfg.batches, model_step, **timed, done=done("model"), fused=fused)
    del model
    with torch.no_grad():
        stack = decoder.linear_stack(cfg.dim, cfg.layers, dev)

    def stack_step(module, m):
        x = torch.randn(m, cfg.dim, device=dev, dtype=decoder.DTYPE)
        return (lambda: module(x)), {}

    measure(result.stack, stack, [STACK_M], stack_step, **timed, done=done("linear stack"))
    return result


def render(result: E2EResult) -> str:
    """The run as markdown: the device line, the decode table, the linear-stack table, the notes."""
    cfg = result.config
    out = [*result.header(), "",
           f"Decode: dim {cfg.dim}, MLP {cfg.hidden} "
           f"({'SwiGLU: gate_up, SiLU·up, down; no biases' if cfg.mlp == 'swiglu' else 'GELU, biases'}), "
           f"{cfg.layers} layers, {cfg.dim // cfg.head_dim} "
           f"heads of {cfg.head_dim}, vocab {cfg.vocab} (bf16 output head, not quantized), bf16 KV cache of "
           f"{cfg.context} positions read whole every step; greedy; {cfg.tokens} timed steps after {cfg.warmup} "
           f"warm-up steps, host clock around the loop with one synchronize, the fastest of {ROUNDS} loops run in turn "
           "with the other formats'; graph: one captured step replayed. "
           f"{FUSED}: the norms before attention and MLP{' and SiLU·up' if cfg.mlp == 'swiglu' else ''} write their "
           "output quantized (rms_norm_quant, the MLP's norm adding the residual; silu_mul_quant), which the "
           "linears read. Floor: (weights + KV cache bytes) / copy rate. Speed vs bf16: bf16 step time / this "
           "step time.", "",
           "| weights | batch | mode | ms / token | tokens/s | speed vs bf16 | weights MB | KV cache MB | floor ms "
           "| floor / step | note |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result.model:
        out.append(f"| {r.dtype} | {r.batch} | {r.mode} | {cell(r.step_us and r.step_us / 1e3, '.3f')} "
                   f"| {cell(r.tokens_per_s, '.1f')} | {cell(r.vs_bf16, '.2f')} | {mb(r.weight_bytes)} "
                   f"| {mb(r.cache_bytes)} | {cell(r.floor_us and r.floor_us / 1e3, '.3f')} "
                   f"| {cell(r.floor_fraction, '.2f')} | {r.note} |")
    out += ["", f"Linear stack: {cfg.layers} layers × 6 linears without bias or activation, applied in sequence — "
            f"4 of {cfg.dim}×{cfg.dim} (q, k, v, o), {cfg.dim}→{cfg.hidden} (up), {cfg.hidden}→{cfg.dim} (down): "
            f"{6 * cfg.layers} linears per step, M = {STACK_M}; nn.Linear in bf16 against QuantLinear.", "",
            "| weights | M | mode | µs / step | speed vs bf16 | weights MB | floor µs | floor / step | note |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in result.stack:
        out.append(f"| {r.dtype} | {r.batch} | {r.mode} | {cell(r.step_us, '.1f')} | {cell(r.vs_bf16, '.2f')} "
                   f"| {mb(r.weight_bytes)} | {cell(r.floor_us, '.1f')} "
                   f"| {cell(r.floor_fraction, '.2f')} | {r.note} |")
    if result.notes:
        out += [""] + [f"- {n}" for n in result.notes]
    return "\n".join(out)
