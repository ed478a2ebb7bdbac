"""Round-26 probe (H100): the default 128×128 tile in 64-column sub-tiles at N = 2112, whose last column tile then
keeps one sub-tile of two (`TAIL_NSUB`), beside round 25's tiles (`tail_probe.py`): 128×128 whole (N = 2112 makes
16.5 column tiles of it: 544 tiles, 4.1 rounds of 132 programs), 128×192 (plain only: it splits groups of 128) and
128×256 with its last column tile's skip (round 25's choice for re-quantized outputs from 4096 rows).

Per format (FP8, INT8), PROBE_MS rows (default 4096,8192,16384), N = 2112, PROBE_KS (run with 7168,2048) and epilogue
(plain bf16, re-quantized per 1×128, bf16 bias + re-quantized), timed interleaved with a checksum of each tile's
output bits, as `tail_probe.py` times them.

Usage: PYTHONPATH=.:docs/bench/round24:docs/bench/round25 python3 docs/bench/round26/narrow_probe.py TAG >> out.jsonl
(`--warm`: compile every case and exit); `narrow_probe.py --table out.jsonl` prints the table.
"""
import sys

import tail_probe  # docs/bench/round25 on sys.path

TILES = ("128x128", "128x128/64", "128x192", "128x256")


def tiles(gll, K, epi):
    """`tail_probe.tiles` and the default tile in 64-column sub-tiles."""
    return tail_probe.tiles(gll, K, epi) | {"128x128/64": gll.GluonConfig(sub_n=64)}


if __name__ == "__main__":
    if sys.argv[1:2] == ["--table"]:
        tail_probe.table(sys.argv[2], TILES)
    else:
        tail_probe.main(tiles)
