"""Round-27 probe (H100): the Gluon GEMM with the last round's tiles split over every program by K blocks
(`GluonConfig.stream_k`, `gluon_launch.split_tiles`: `stream_k.diff` in this folder, not shipped) against the same
configuration without. Runs in a tree with that diff applied.

`round24/stagger_probe.py` with FIELD stream_k: per format (FP8, INT8), PROBE_MS rows (default 4096,16384), the six
bench shapes and epilogue (PROBE_EPIS), config_for's configuration with stream_k off and on, timed interleaved
(CUDA events, L2 flushed, median of 15), the plain output beside cuBLAS block-wise (FP8) or `torch._int_mm`
(INT8). Its `same_bits` compares the two variants' bits, which differ where tiles are split (another summation
order, within the contract: the diff's test in tests/gpu/test_gluon.py checks it).

Usage: PYTHONPATH=<tree>:docs/bench/round24 python3 docs/bench/round27/stream_k_probe.py TAG >> out.jsonl
(`--parallel-warm` compiles every case and variant first, 12 processes); `round24/lead_table.py out.jsonl`
tabulates (its columns stagger0 / stagger1: stream_k off / on).
"""
import stagger_probe  # docs/bench/round24 on sys.path

stagger_probe.FIELD = "stream_k"
stagger_probe.VALUES = [False, True]

if __name__ == "__main__":
    stagger_probe.run(__file__)
