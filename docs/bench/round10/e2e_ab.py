"""Round-10 probe (H100): `quantcore bench --e2e` with the quantized linears of 9 to 64 rows in one launch
(this round) or, with `before` as the first argument, in two (act_quant + scaled_mm, as up to round 9:
the table's "once" rule dropped, every other rule kept). The remaining arguments are the bench's.

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round10/e2e_ab.py [before] --e2e ...
"""
import sys

from quantcore import cli
from quantcore.backends.triton import configs

args = sys.argv[1:]
if args[:1] == ["before"]:
    args = args[1:]
    table = configs.fused
    configs.fused = lambda profile, M, K: None if table(profile, M, K) == "once" else table(profile, M, K)
sys.exit(cli.main(args))
