"""Tensor-parallel decoding of the example transformer: prefill time and decode tokens/s at TP=1 and TP=N,
bf16 and FP8, with the share of kernel time spent in collectives and in GEMMs (torch.profiler).

    torchrun --nproc-per-node 2 examples/tp_decode.py --device cuda --dim 8192 --out docs/bench/tp-h200x2

Every rank builds the same bf16 model (examples/tiny_transformer.py, seeded; head_dim 128). For each TP
size t in --tp (default 1 and the world size), ranks 0..t-1 form a group and shard a copy of the model
with `quantcore.parallel.shard_model` (attention q/k/v column, o row; MLP w1 column, w2 row; the
lm_head stays whole in bf16): float parallel layers for bf16, FP8 (128x128 weight blocks) for fp8, and
FP8 whose row-parallel layers sum fp32 partials for fp8-fp32reduce; the other ranks wait. Each run reports

- prefill: one forward over the batch of prompts (B x P tokens), best of --repeats, ms;
- decode: --tokens greedy steps against the KV cache after a prefill, best of --repeats, tokens/s (B per step);
- the profiler's kernel time of one prefill and of the decode steps, split into collectives (names
  with nccl/gloo/all_reduce...), GEMMs (cuBLAS, quantcore's Triton and CuPy GEMM kernels, aten mm on
  the CPU) and the rest: on a GPU the kernels' device time, on the CPU the ops' host time;
- the teacher-forced logits' relative error against TP=1 with the same weights (the split changes
  only the order of the reduction and, unless summed in fp32, the rounding of partial sums).

Times are the slowest rank's. Eager execution, no CUDA graphs. Rank 0 writes tp_decode.json and
tp_decode.md to --out. Without torchrun (one process) only TP=1 runs. On the CPU the ranks use gloo.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
from torch import distributed as dist
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_transformer import Config, Transformer  # noqa: E402

import quantcore  # noqa: E402
from quantcore.parallel import ColumnParallelQuantLinear, shard_model  # noqa: E402

# name -> (quantized format or None for bf16, the row-parallel layers' reduce_dtype)
FP8 = torch.float8_e4m3fn
WEIGHTS = {"bf16": (None, None), "fp8": (FP8, None), "fp8-fp32reduce": (FP8, torch.float32)}
# Lower-case substrings of profiler event names, per kind of work.
COMM = ("nccl", "gloo", "allreduce", "all_reduce", "allgather", "all_gather")
GEMM = ("gemm", "gemv", "_mm_kernel", "nvjet", "xmma", "cutlass", "splitkreduce", "aten::mm", "aten::addmm",
        "aten::bmm", "aten::baddbmm")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def localize_heads(model: Transformer, tp: int) -> None:
    """Give each attention module its n_heads / tp heads (column-parallel q/k/v hand each rank a
    contiguous run of heads) and a KV cache of that many heads."""
    for block in model.layers:
        attn = block.attn
        attn.n_heads //= tp
        attn.k_cache = attn.k_cache[:, :, : attn.n_heads].clone()
        attn.v_cache = attn.v_cache[:, :, : attn.n_heads].clone()


def slowest(seconds: float, group, device: torch.device) -> float:
    """The largest of the group's ranks' times."""
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    if group is not None:
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t)


def decode(model: Transformer, logits: torch.Tensor, start: int, steps: int) -> torch.Tensor:
    """`steps` greedy tokens from the last position's logits [B, V], the KV cache filled up to `start`."""
    for i in range(steps):
        logits = model(logits.argmax(-1, keepdim=True), start + i)[:, -1]
    return logits


def timed(fn, setup, group, device: torch.device, repeats: int) -> float:
    """Best of `repeats` of fn(setup()) (seconds, setup untimed), started together on the group's ranks."""
    best = math.inf
    for _ in range(repeats):
        state = setup()
        if group is not None:
            dist.barrier(group=group)
        _sync(device)
        start = time.perf_counter()
        fn(state)
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return slowest(best, group, device)


def kernel_shares(fn, setup, device: torch.device) -> dict[str, float]:
    """Profile fn(setup()) (setup not profiled): time in collectives, in GEMMs and in all (ms), and the
    two shares. GPU: kernels' device time; CPU: ops' self host time."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    state = setup()
    _sync(device)
    with profile(activities=activities) as prof:
        fn(state)
        _sync(device)
    found = {"comm": 0.0, "gemm": 0.0, "total": 0.0}
    for event in prof.events():
        if device.type == "cuda":
            if event.device_type != torch.autograd.DeviceType.CUDA:
                continue
            us = event.time_range.elapsed_us()
        else:
            us = event.self_cpu_time_total
        name = event.name.lower()
        found["total"] += us
        if any(p in name for p in COMM):
            found["comm"] += us
        elif any(p in name for p in GEMM):
            found["gemm"] += us
    total = max(found["total"], 1e-9)
    return {"comm_ms": found["comm"] / 1e3, "gemm_ms": found["gemm"] / 1e3, "total_ms": found["total"] / 1e3,
            "comm_share": found["comm"] / total, "gemm_share": found["gemm"] / total}


def run_one(base: Transformer, weights: str, tp: int, group, prompts: torch.Tensor, args) -> tuple[dict, torch.Tensor]:
    """Shard a copy of `base` over `group` and measure it; returns the run's row and its logits."""
    device = prompts.device
    dtype, reduce_dtype = WEIGHTS[weights]
    model = shard_model(copy.deepcopy(base), group, dtype=dtype, reduce_dtype=reduce_dtype)
    localize_heads(model, tp)
    batch = prompts.shape[0]
    logits = model(prompts, 0).float()  # teacher-forced logits, and the warm-up of every kernel
    decode(model, logits[:, -1], prompts.shape[1], 2)
    prefill = (lambda _: model(prompts, 0), lambda: None)
    steps = (lambda last: decode(model, last, prompts.shape[1], args.tokens), lambda: model(prompts, 0)[:, -1])
    row = {
        "tp": tp, "weights": weights,
        "prefill_ms": 1e3 * timed(*prefill, group, device, args.repeats),
        "decode_tokens_per_s": batch * args.tokens / timed(*steps, group, device, args.repeats),
        "profile": {"prefill": kernel_shares(*prefill, device), "decode": kernel_shares(*steps, device)},
    }
    layer = next((m for m in model.modules() if isinstance(m, ColumnParallelQuantLinear)), None)
    if layer is not None:
        row["implementation"] = {phase: quantcore.explain(
            "quant_linear", torch.randn(m, layer.in_features, dtype=torch.bfloat16, device=device), layer.weight,
            layer.weight_scale_inv, layer.bias, block_size=layer.block_size).selected
            for phase, m in (("prefill", prompts.numel()), ("decode", batch))}
    return row, logits


def render(result: dict) -> str:
    """The markdown table of the runs."""
    lines = [
        f"# Tensor-parallel decoding: {result['device']} x {result['world']}",
        "",
        f"torch {result['torch']}, quantcore {result['quantcore']}, backend {result['backend']}; model dim "
        f"{result['config']['dim']}, {result['config']['n_layers']} layers, {result['config']['n_heads']} heads, "
        f"batch {result['batch']}, prompt {result['prompt_len']}, {result['new_tokens']} new tokens, best of "
        f"{result['repeats']}. Command: `{result['command']}`",
        "",
        "| TP | weights | prefill ms | decode tokens/s | decode comm share | decode GEMM share | prefill comm share "
        "| prefill GEMM share | logits rel. error vs TP=1 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["runs"]:
        d, p = r["profile"]["decode"], r["profile"]["prefill"]
        lines.append(f"| {r['tp']} | {r['weights']} | {r['prefill_ms']:.2f} | {r['decode_tokens_per_s']:.1f} | "
                     f"{d['comm_share']:.3f} | {d['gemm_share']:.3f} | {p['comm_share']:.3f} | {p['gemm_share']:.3f} | "
                     f"{r['logits_rel_error_vs_tp1']:.2e} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict | None:
    """Run under torchrun (or in an initialised process group); returns the results on rank 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    parser.add_argument("--dim", type=int, default=8192, help="model width (MLP hidden = 4 x dim)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=None, help="attention heads (default: dim / 128)")
    parser.add_argument("--vocab", type=int, default=Config.vocab)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=32, help="decode steps timed (>= 1)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tp", default=None, help="comma-separated TP sizes (default: 1 and the world size)")
    parser.add_argument("--weights", default="bf16,fp8,fp8-fp32reduce",
                        help="comma-separated: bf16, fp8, fp8-fp32reduce (row-parallel sums in fp32)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=".", help="directory for tp_decode.json and tp_decode.md (rank 0)")
    args = parser.parse_args(argv)
    launched = not dist.is_initialized() and "RANK" in os.environ  # by torchrun, not inside a test's group
    if launched:
        if args.device == "cuda":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    try:
        return measure(args, " ".join(["examples/tp_decode.py", *(sys.argv[1:] if argv is None else argv)]))
    finally:
        if launched:
            dist.destroy_process_group()


@torch.inference_mode()
def measure(args: argparse.Namespace, command: str) -> dict | None:
    """Every run of the command line's TP sizes and weights; the results on rank 0 (None elsewhere)."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    device = torch.device(f"cuda:{torch.cuda.current_device()}" if args.device == "cuda" else "cpu")
    tps = sorted({1, world} if args.tp is None else {1, *(int(t) for t in args.tp.split(","))})  # 1: the reference
    weights = args.weights.split(",")
    if max(tps) > world or any(w not in WEIGHTS for w in weights) or args.tokens < 1:
        raise SystemExit(f"tp_decode: TP sizes {tps} need at most {world} ranks; weights among {list(WEIGHTS)}; "
                         "--tokens >= 1")

    cfg = Config(vocab=args.vocab, dim=args.dim, n_layers=args.layers, n_heads=args.heads or max(1, args.dim // 128),
                 max_batch=args.batch, max_seq_len=args.prompt_len + args.tokens + 2)
    with torch.device(device):
        base = Transformer(cfg, args.seed).to(torch.bfloat16).eval()
    prompts = torch.randint(0, cfg.vocab, (args.batch, args.prompt_len),
                            generator=torch.Generator().manual_seed(args.seed + 1)).to(device)
    runs, reference = [], {}
    for tp in tps:
        group = dist.new_group(list(range(tp))) if world > 1 else None  # every rank creates every group
        for w in weights:
            if rank < tp:
                row, logits = run_one(base, w, tp, group, prompts, args)
                if rank == 0:
                    first = reference.setdefault(WEIGHTS[w][0], logits)  # TP=1 with the same weights
                    row["logits_rel_error_vs_tp1"] = float((logits.double() - first.double()).norm()
                                                           / first.double().norm())
                    runs.append(row)
            if world > 1:
                dist.barrier()
    if rank != 0:
        return None
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "quantcore": quantcore.__version__, "python": platform.python_version(),
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if device.type == "cuda" else None,
        "world": world,
        "backend": dist.get_backend() if dist.is_initialized() else "none",
        "command": (f"torchrun --nproc-per-node {world} " if world > 1 else "python3 ") + command,
        "config": asdict(cfg), "batch": args.batch, "prompt_len": args.prompt_len, "new_tokens": args.tokens,
        "repeats": args.repeats, "patterns": {"comm": COMM, "gemm": GEMM}, "runs": runs,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tp_decode.json").write_text(json.dumps(result, indent=1))
    (out / "tp_decode.md").write_text(render(result))
    print(render(result))
    return result


if __name__ == "__main__":
    main()
