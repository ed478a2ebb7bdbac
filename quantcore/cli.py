"""`quantcore` command line: `quantcore report [--json] [--simulate PROFILE]`."""

from __future__ import annotations

import argparse
import sys

from . import capability
from .errors import InvalidInputError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quantcore", description="Block-wise FP8/INT8 quantization ops.")
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="which implementation runs each op on this machine, and why")
    rep.add_argument("--json", action="store_true", help="print the report as JSON")
    rep.add_argument("--simulate", metavar="PROFILE",
                     help=f"describe another device: cpu, {', '.join(capability.SIMULATED)}")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `quantcore` console script and `python -m quantcore`."""
    args = _parser().parse_args(argv)
    from . import report

    try:
        result = report.build(simulate=args.simulate)
    except InvalidInputError as err:
        print(f"quantcore: {err}", file=sys.stderr)
        return 2
    print(result.model_dump_json(indent=2) if args.json else report.render(result))
    return 0
