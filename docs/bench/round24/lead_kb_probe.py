"""Round-24 probe (H100): the Gluon GEMM with consumer 1 started `lead_kb` K blocks behind consumer 0, so that the
two warpgroups' epilogues no longer coincide. It ran against an interim tree (`lead_kb.diff` on round 23's last
commit: a `GluonConfig.lead_kb`, and one set of `empty` barriers per consumer, on which consumer 1 waited for
consumer 0's release of K block lead_kb - 1), which `stagger_probe.py` replaced (lead_kb_*.txt).

Per format (FP8, INT8), PROBE_MS rows (default 4096,16384), the six bench shapes and epilogue (plain bf16, + a
bf16 bias, re-quantized per 1×128, bias + re-quantized; PROBE_EPIS picks), the configuration scaled_mm picks
(`gluon_launch.config_for`) with lead_kb 0 (as shipped before) to PROBE_LEADS (default 0,1,2,3; clamped below
the stage count by the launch), all timed interleaved (quantcore.bench.timing.gpu_times_us: CUDA events, L2
flushed, median of 15), the plain output beside cuBLAS block-wise (FP8) or `torch._int_mm` (INT8, no scaling),
with a checksum of every variant's output bits (codes and scales), which must agree.

`stagger_probe.py` with FIELD lead_kb (its runs were made by a copy of that code, since folded into it).

Usage: PYTHONPATH=<tree> python3 docs/bench/round24/lead_kb_probe.py TAG >> out.jsonl; `--parallel-warm` compiles
every case first (12 processes); PROBE_FMTS=fp8 (or int8) times one format only.
"""
import os

import stagger_probe  # this folder: the script's own, first on sys.path

stagger_probe.FIELD = "lead_kb"
stagger_probe.VALUES = [int(x) for x in os.environ.get("PROBE_LEADS", "0,1,2,3").split(",")]

if __name__ == "__main__":
    stagger_probe.run(__file__)
