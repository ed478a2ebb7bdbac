"""`python -m quantcore.bench.generate`: transformers' `generate` on a Llama built from a config (random
weights, nothing downloaded), in bf16 and with its linears quantized to FP8 (`quantcore.nn.quantize_model`,
the output head kept in bf16), each eagerly (dynamic cache) and compiled as transformers compiles it for a
static cache (`cache_implementation="static"`: the forward under torch.compile, CUDA-graph trees by
default). Prints tokens/s, the first call's seconds (compiles included) and how many greedy tokens agree
with the eager ones of the same weights before the first that differs (Inductor's kernels round bf16
attention and norms otherwise than eager torch, so bf16 may part from eager too: the bf16 row is the
yardstick); writes the rows as JSON with `--json`. Needs transformers
(`pip install transformers`) and, for the compiled rows, a GPU.

Timing: one untimed `generate` (it compiles), then `--reps` timed ones, each synchronized; tokens/s is
batch × new tokens over the fastest.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time

import torch

from .. import nn as qnn


def _model(args: argparse.Namespace, weights: str, device: str):
    import transformers

    torch.manual_seed(args.seed)
    config = transformers.LlamaConfig(hidden_size=args.hidden, intermediate_size=args.intermediate,
                                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                                      num_key_value_heads=args.kv_heads, vocab_size=args.vocab,
                                      max_position_embeddings=args.prompt + args.new, initializer_range=0.05)
    model = transformers.LlamaForCausalLM(config).to(device=device, dtype=torch.bfloat16).eval()
    if weights == "fp8":
        qnn.quantize_model(model, dtype=torch.float8_e4m3fn)
    return model


def _generate(model, prompt, args: argparse.Namespace, compiled: bool):
    import transformers

    options = dict(max_new_tokens=args.new, min_new_tokens=args.new, do_sample=False, pad_token_id=0)
    if compiled:
        options.update(cache_implementation="static",
                       compile_config=transformers.CompileConfig(fullgraph=True, mode=args.mode))
    else:
        options.update(disable_compile=True)
    with torch.no_grad():
        out = model.generate(prompt, **options)
    if prompt.is_cuda:
        torch.cuda.synchronize()
    return out


def run(args: argparse.Namespace) -> list[dict]:
    """One row per weights format × mode."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    prompt = torch.randint(0, args.vocab, (args.batch, args.prompt), generator=torch.Generator().manual_seed(1))
    prompt = prompt.to(device)
    rows = []
    for weights in ("bf16", "fp8"):
        model = _model(args, weights, device)
        eager_tokens = None
        for mode in ("eager", "compiled"):
            if mode == "compiled" and device != "cuda":
                continue  # transformers compiles a static-cache decode on GPUs only
            torch._dynamo.reset()
            start = time.perf_counter()
            tokens = _generate(model, prompt, args, mode == "compiled")
            first = time.perf_counter() - start
            times = []
            for _ in range(args.reps):
                start = time.perf_counter()
                _generate(model, prompt, args, mode == "compiled")
                times.append(time.perf_counter() - start)
            eager_tokens = tokens if mode == "eager" else eager_tokens
            rows.append({"weights": weights, "mode": mode, "tokens_per_s": args.batch * args.new / min(times),
                         "first_call_s": first, "tokens_equal_eager": bool(torch.equal(tokens, eager_tokens)),
                         "tokens_agreeing": _agreeing(tokens, eager_tokens, args.new), "new_tokens": args.new,
                         "device": torch.cuda.get_device_name() if device == "cuda" else "cpu"})
            print(f"{weights} {mode}: {rows[-1]['tokens_per_s']:.1f} tokens/s", file=sys.stderr, flush=True)
        del model
    return rows


def _agreeing(tokens: torch.Tensor, eager: torch.Tensor, new: int) -> int:
    """New tokens before the first that differs from eager's, the least over the batch's sequences."""
    differs = (tokens[:, -new:] != eager[:, -new:]).int()
    return int(torch.where(differs.any(1), differs.argmax(1), new).min())


def render(rows: list[dict]) -> str:
    """The rows as a Markdown table, with each mode's FP8 speed-up over bf16."""
    bf16 = {r["mode"]: r["tokens_per_s"] for r in rows if r["weights"] == "bf16"}
    lines = ["| weights | mode | tokens/s | vs bf16 | first call s | tokens as eager's |", "|---|---|---|---|---|---|"]
    for r in rows:
        speedup = r["tokens_per_s"] / bf16[r["mode"]]
        lines.append(f"| {r['weights']} | {r['mode']} | {r['tokens_per_s']:.1f} | {speedup:.2f}x | "
                     f"{r['first_call_s']:.1f} | {r['tokens_agreeing']} of {r['new_tokens']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse the sizes, run, print the table, write the JSON."""
    parser = argparse.ArgumentParser(prog="python -m quantcore.bench.generate", description=__doc__.split("\n\n")[0])
    for name, default in (("hidden", 2048), ("intermediate", 5632), ("layers", 8), ("heads", 16), ("kv-heads", 4),
                          ("vocab", 32000), ("batch", 1), ("prompt", 32), ("new", 64), ("reps", 3), ("seed", 0)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--mode", default="reduce-overhead", help="torch.compile mode of the compiled rows")
    parser.add_argument("--json", metavar="PATH", help="write the rows as JSON")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("transformers") is None:
        print("quantcore: the generate benchmark needs transformers: pip install transformers", file=sys.stderr)
        return 2
    rows = run(args)
    print(render(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
