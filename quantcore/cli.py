"""`quantcore` command line: `quantcore report [--json] [--simulate PROFILE]`, `quantcore bench [...]`
(the ops beside their baselines), `quantcore bench --e2e [...]` (decode tokens/s of a model),
`quantcore bench --stacks [...]` (real models' layer linears, M = 1-128), `quantcore bench --moe [...]`
(mixture-of-experts layers: grouped GEMMs and decode steps) and `quantcore native` (compile the native
launch path ahead of its first use)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from . import __version__, capability
from .bench.shapes import MOE_MODELS, OPS, ROUTINGS
from .bench.stacks import STACKS
from .errors import InvalidInputError, QuantcoreError
from .report_schema import SCHEMA, STATUS_HELP

SIGPIPE_EXIT = 141  # 128 + SIGPIPE: what a command killed by a closed pipe returns


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quantcore", description="Block-wise FP8/INT8 quantization ops.")
    parser.add_argument("--version", action="version", version=f"quantcore {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="which implementation runs each op on this machine, and why",
                         formatter_class=argparse.RawDescriptionHelpFormatter,
                         epilog=f"status of each implementation (per op and dtype):\n{STATUS_HELP}\n\n"
                                "Where a measured priority table refines the order (real GPUs; for a simulated "
                                "GPU, the real GPUs of its\narchitecture that have one), the report also lists "
                                "which implementation runs per range of M (rows).")
    rep.add_argument("--json", action="store_true",
                     help=f"print the report as JSON (schema_version {SCHEMA}; \"simulated\": true for a simulated "
                          "profile)")
    rep.add_argument("--simulate", metavar="PROFILE",
                     help=f"describe another device: cpu, {', '.join(capability.SIMULATED)}")
    sub.add_parser("native", help="compile the native launch path now (else done on the first CUDA call; no GPU "
                                  "needed) and say how kept plans are launched here")
    bench = sub.add_parser("bench", help="time every op and backend on this GPU beside the baselines")
    bench.add_argument("--quick", action="store_true", help="a small shape set")
    bench.add_argument("--ops", nargs="+", default=(), choices=OPS, metavar="OP",
                       help=f"only these ops, among: {', '.join(OPS)}")
    bench.add_argument("--json", metavar="PATH", help="write the results as JSON (also after every case)")
    bench.add_argument("--resume", metavar="PATH", help="continue the partial JSON of an interrupted run")
    bench.add_argument("--ours-only", action="store_true",
                       help="time quantcore's implementations only, no baselines (enough for --write-priority)")
    bench.add_argument("--from-json", metavar="PATH",
                       help="measure nothing: summarize, plot or --write-priority a saved run")
    bench.add_argument("--plot", metavar="PATH", help="write a PNG of achieved vs ceiling")
    bench.add_argument("--no-progress", action="store_true",
                       help="one plain line per case on stderr instead of a tqdm bar (plain lines are also what "
                            "a run prints where stderr is no terminal or tqdm is not installed)")
    bench.add_argument("--write-priority", nargs="?", const="", metavar="DIR",
                       help="write the run's measured priority table for its GPU model into DIR, by default "
                            "the user data folder the registry reads ($QUANTCORE_DATA_DIR/priority, else "
                            "e.g. ~/.local/share/quantcore/priority); never into the installed package. With "
                            "--moe, the grouped GEMM's ranking; the ops a run did not time keep theirs")
    bench.add_argument("--simulate", metavar="PROFILES", type=_gpu_profiles, default=(),
                       help="also time the GEMMs as these older (or newer) GPUs, comma-separated, e.g. sm80,sm75: "
                            f"their fallback paths beside this GPU's baselines ({', '.join(capability.SIMULATED)})")
    e2e = bench.add_argument_group("end-to-end decode (--e2e)")
    e2e.add_argument("--e2e", action="store_true",
                     help="instead of the ops: decode tokens/s of a transformer in bf16, FP8 and INT8, eager and "
                          "with CUDA graphs, and a stack of linears (on the CPU, at small sizes, graphs are skipped)")
    e2e.add_argument("--e2e-dim", type=_positive, metavar="N", help="model width, MLP 4×N (default 4096)")
    e2e.add_argument("--e2e-layers", type=_positive, metavar="N", help="transformer layers (default 4)")
    e2e.add_argument("--e2e-batch", type=_positive, nargs="+", metavar="B", help="batch sizes (default 1 8)")
    e2e.add_argument("--e2e-tokens", type=_positive, metavar="N",
                     help="timed decode steps per configuration (default 128)")
    e2e.add_argument("--e2e-mlp", choices=("gelu", "swiglu"),
                     help="the model's MLP: GELU with biases (default) or Llama's SwiGLU, whose SiLU·up the fused "
                          "rows also fuse")
    stacks = bench.add_argument_group("linear stacks of real models (--stacks)")
    stacks.add_argument("--stacks", nargs="*", choices=STACKS, metavar="NAME",
                        help="instead of the ops: the linears of these models' layers (all when none is named: "
                             f"{', '.join(STACKS)}) in bf16, FP8 and INT8, eager and with CUDA graphs, against "
                             "their memory floor (on the CPU, graphs are skipped: shrink them with --stacks-scale)")
    stacks.add_argument("--stacks-m", type=_positive, nargs="+", metavar="M",
                        help="rows (default 1 2 4 8 16 32 64 128)")
    stacks.add_argument("--stacks-layers", type=_positive, metavar="N", help="layers a step (default 4)")
    stacks.add_argument("--stacks-tokens", type=_positive, metavar="N", help="timed steps per loop (default 64)")
    stacks.add_argument("--stacks-scale", type=_positive, metavar="D",
                        help="divide every size by D, rounded up (default 1: the models' own)")
    moe = bench.add_argument_group("mixture-of-experts layers (--moe)")
    moe.add_argument("--moe", nargs="*", choices=MOE_MODELS, metavar="MODEL",
                     help="instead of the ops: these models' routed experts (all when none is named: "
                          f"{', '.join(MOE_MODELS)}) as grouped GEMMs beside torch's grouped GEMMs, a per-expert "
                          "cuBLAS loop and the dense GEMM, and decode steps of MoE layers in bf16, FP8 and INT8, "
                          "eager and with CUDA graphs (on the CPU the GEMM rows and graphs are skipped)")
    moe.add_argument("--moe-tokens", type=_positive, nargs="+", metavar="T",
                     help="tokens of the grouped GEMM rows (default 1 8 64 512 4096 16384)")
    moe.add_argument("--moe-routing", nargs="+", choices=ROUTINGS, help="routings (default both)")
    moe.add_argument("--moe-no-ops", action="store_true", help="the decode steps only")
    moe.add_argument("--moe-no-steps", action="store_true", help="the grouped GEMM rows only")
    moe.add_argument("--moe-step-model", choices=MOE_MODELS, help="the decode steps' model (default qwen3-30b-a3b)")
    moe.add_argument("--moe-layers", type=_positive, metavar="N", help="MoE layers a decode step (default 4)")
    moe.add_argument("--moe-batch", type=_positive, nargs="+", metavar="B", help="decode batches (default 1 8 64)")
    moe.add_argument("--moe-steps", type=_positive, metavar="N", help="timed decode steps per loop (default 64)")
    moe.add_argument("--moe-scale", type=_positive, metavar="D",
                     help="divide every size by D (default 1: the models' own)")
    moe.add_argument("--moe-masked-max-rows", type=_non_negative, metavar="R",
                     help="the decode steps' QuantExperts run the masked layout up to R routed rows (tokens x "
                          "top-k), the contiguous one above (0: always contiguous; default: "
                          "quantcore.nn.experts.MASKED_MAX_ROWS): one run per layout compares them")
    return parser


# Options that belong to one kind of run (flag: argparse attribute), refused by the others.
_OP_FLAGS = {"--quick": "quick", "--ops": "ops", "--resume": "resume", "--ours-only": "ours_only", "--plot": "plot",
             "--write-priority": "write_priority", "--simulate": "simulate"}
_E2E_FLAGS = {"--e2e-dim": "e2e_dim", "--e2e-layers": "e2e_layers", "--e2e-batch": "e2e_batch",
              "--e2e-tokens": "e2e_tokens", "--e2e-mlp": "e2e_mlp"}
_STACKS_FLAGS = {"--stacks-m": "stacks_m", "--stacks-layers": "stacks_layers", "--stacks-tokens": "stacks_tokens",
                 "--stacks-scale": "stacks_scale"}
_MOE_FLAGS = {"--moe-tokens": "moe_tokens", "--moe-routing": "moe_routing", "--moe-no-ops": "moe_no_ops",
              "--moe-no-steps": "moe_no_steps",
              "--moe-step-model": "moe_step_model", "--moe-layers": "moe_layers", "--moe-batch": "moe_batch",
              "--moe-steps": "moe_steps", "--moe-scale": "moe_scale", "--moe-masked-max-rows": "moe_masked_max_rows"}
_STEP_FLAGS = {"e2e": ("--e2e", _E2E_FLAGS), "stacks": ("--stacks", _STACKS_FLAGS), "moe": ("--moe", _MOE_FLAGS)}


def _refused(args: argparse.Namespace, run: str, others: dict[str, dict[str, str]]) -> bool:
    """Print an error and say True where the command line sets options of `others` (owner: flags) for a
    `run` they do not belong to; `--write-priority` without a folder counts as set."""
    for owner, flags in others.items():
        given = [flag for flag, attr in flags.items() if getattr(args, attr) not in (None, False, (), [])]
        if given:
            print(f"quantcore: {', '.join(given)}: options of {owner}, not of {run}", file=sys.stderr)
            return True
    return False


def _gpu_profiles(text: str) -> tuple[str, ...]:
    """`bench --simulate`: comma-separated GPU profiles, as `quantcore.simulate` names them."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    try:
        kinds = {capability.simulated_profile(name).kind for name in names}
    except InvalidInputError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    if kinds != {"cuda"}:
        raise argparse.ArgumentTypeError(f"expected GPU profiles, comma-separated ({', '.join(capability.SIMULATED)}), "
                                         f"got {text!r}")
    return names


def _at_least(low: int, what: str):
    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"expected a {what} integer, got {text}")
        return value
    parse.__name__ = f"{what} integer"  # argparse's "invalid positive integer value: 'x'"
    return parse


_positive, _non_negative = _at_least(1, "positive"), _at_least(0, "non-negative")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `quantcore` console script and `python -m quantcore`."""
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader went away (`quantcore report | head -1`): stop quietly, and keep Python's exit-time
        # flush of stdout from raising again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return SIGPIPE_EXIT
    except QuantcoreError as err:  # a bad argument or setting (e.g. a relative QUANTCORE_CACHE_DIR): said, not traced
        print(f"quantcore: {err}", file=sys.stderr)
        return 2


def _main(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "bench":
        return _bench(args, argv)
    if args.command == "native":
        return _native()
    from . import report

    result = report.build(simulate=args.simulate)
    print(result.model_dump_json(indent=2) if args.json else report.render(result))
    return 0


def _native() -> int:
    from .runtime import native

    if not native.enabled():
        print(f"quantcore: {native.NATIVE_ENV}=0 turns the native launch path off", file=sys.stderr)
        return 2
    try:
        path = native.build()
    except Exception as err:  # the compiler's or the loader's error, whatever it is
        print(f"quantcore: the native launch path could not be built: {err}", file=sys.stderr)
        return 1
    print(f"built {path}\nlaunch path: {native.status('cuda' if capability.cuda_available() else 'cpu')}")
    return 0


def _bench(args: argparse.Namespace, argv: list[str] | None) -> int:
    from .bench.run import BenchResult, run
    from .bench.summary import summarize, write_priority
    from .errors import UnsupportedError

    command = "quantcore " + " ".join(argv if argv is not None else sys.argv[1:])

    def load(path: str, option: str) -> BenchResult:
        return _saved(path, BenchResult, option, "quantcore bench --json")

    def save(partial) -> None:
        with open(args.json, "w") as f:
            f.write(partial.model_dump_json(indent=1))

    try:
        asked = [kind for kind, flag in (("e2e", args.e2e), ("stacks", args.stacks is not None),
                                         ("moe", args.moe is not None)) if flag]
        saved = _saved_kind(args.from_json) if args.from_json else None
        kind = asked[0] if asked else saved
        if len(asked) > 1:
            print(f"quantcore: {' and '.join('--' + k for k in asked)} are separate runs: ask for one", file=sys.stderr)
            return 2
        if asked and args.from_json and saved != kind:
            print(f"quantcore: {args.from_json} holds no --{kind} run", file=sys.stderr)
            return 2
        if kind in _STEP_FLAGS:
            return _step_run(args, command, save, kind)
        if _refused(args, "the op bench", dict(_STEP_FLAGS.values())):
            return 2
        if args.plot and not capability.module_available("matplotlib"):  # before a run that would end without it
            print("quantcore: --plot needs matplotlib: pip install 'quantcore[bench]' (or matplotlib)", file=sys.stderr)
            return 2
        if args.from_json:
            result = load(args.from_json, "--from-json")
        else:
            result = run(quick=args.quick, only=tuple(args.ops), progress=not args.no_progress, command=command,
                         checkpoint=save if args.json else None, with_baselines=not args.ours_only,
                         resume=load(args.resume, "--resume") if args.resume else None, simulate=args.simulate)
    except (UnsupportedError, InvalidInputError, OSError) as err:
        print(f"quantcore: {err}", file=sys.stderr)
        return 2
    if args.json:
        save(result)
    if args.plot:
        from .bench.plot import plot

        plot(result, args.plot)
    if args.write_priority is not None:
        _wrote(write_priority(result, Path(args.write_priority) if args.write_priority else None))
    print(summarize(result))
    return 0


def _wrote(path: Path) -> None:
    """Say where `--write-priority` wrote the table, and that the registry reads it elsewhere where it does."""
    from .registry import measured

    read = measured.user_folder()
    print(f"wrote {path}" + ("" if path.parent == read else f" (the registry reads tables from {read}: copy it "
                                                             "there to use it)"))


def _saved_kind(path: str) -> str | None:
    """What run a saved file holds: its "kind" ("e2e", "stacks", "moe"); op bench files have none."""
    import json

    with open(path) as f:
        try:
            data = json.load(f)
        except ValueError:  # no JSON at all: reading it as an op bench run says what is wrong with it
            return None
    return data.get("kind") if isinstance(data, dict) else None


def _saved(path: str, model, option: str, writer: str):
    """The run saved at `path`, read as the pydantic `model`; `InvalidInputError` naming the option, the file
    and its first problem where it is not one (not JSON, another kind of file, a field missing or wrong)."""
    from pydantic import ValidationError

    with open(path) as f:
        text = f.read()
    try:
        return model.model_validate_json(text)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(map(str, first["loc"]))
        raise InvalidInputError(f"bench {option} {path}: not a run saved by `{writer}` ({err.error_count()} "
                                f"problem(s); the first: {where + ': ' if where else ''}{first['msg']}); pass a "
                                "file that command wrote") from None


def _step_run(args: argparse.Namespace, command: str, save, kind: str) -> int:
    """`bench --e2e`, `--stacks` or `--moe` (`kind` "e2e", "stacks" or "moe"): measure, or read back the
    saved run of --from-json, then print its tables."""
    from .bench import e2e, moe, stack_run

    if kind == "e2e":
        run, name = e2e.run_e2e, "an end-to-end run"
        result_type, config_type, render = e2e.E2EResult, e2e.Config, e2e.render
        sizes = {"dim": args.e2e_dim, "layers": args.e2e_layers, "batches": args.e2e_batch, "tokens": args.e2e_tokens,
                 "mlp": args.e2e_mlp}
    elif kind == "stacks":
        run, name = stack_run.run_stacks, "a --stacks run"
        result_type, config_type, render = stack_run.StacksResult, stack_run.StacksConfig, stack_run.render
        sizes = {"stacks": args.stacks or None, "ms": args.stacks_m, "layers": args.stacks_layers,
                 "tokens": args.stacks_tokens, "scale": args.stacks_scale}  # no name given: every stack
    else:
        run, name = moe.run_moe, "a --moe run"
        result_type, config_type, render = moe.MoEResult, moe.MoEConfig, moe.render
        sizes = {"models": args.moe or None, "tokens": args.moe_tokens, "routings": args.moe_routing,
                 "ops": False if args.moe_no_ops else None, "step_model": args.moe_step_model,
                 "layers": 0 if args.moe_no_steps else args.moe_layers, "batches": args.moe_batch,
                 "steps": args.moe_steps, "scale": args.moe_scale, "masked_max_rows": args.moe_masked_max_rows}
    others = {flag: flags for k, (flag, flags) in _STEP_FLAGS.items() if k != kind}
    # A --moe run ranks the grouped GEMM's implementations, as the op bench ranks the other ops'.
    op_flags = {flag: name for flag, name in _OP_FLAGS.items() if kind != "moe" or flag != "--write-priority"}
    if _refused(args, name, {"the op bench": op_flags, **others}):
        return 2
    if args.from_json:
        result = _saved(args.from_json, result_type, "--from-json", f"quantcore bench --{kind} --json")
    else:
        result = run(config_type(**{k: v for k, v in sizes.items() if v is not None}), command=command,
                     log=lambda line: print(line, file=sys.stderr, flush=True),
                     checkpoint=save if args.json else None)
    if args.json:
        save(result)
    if kind == "moe" and args.write_priority is not None:
        _wrote(moe.write_priority(result, Path(args.write_priority) if args.write_priority else None))
    print(render(result))
    return 0
