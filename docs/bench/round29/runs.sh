#!/bin/bash
# How round 29's run files were made on the H100 (OUT=dir; each line one device call's work, run from the repo root).
# The A/B trees: BASE29 = `git archive e8c2b2c quantcore | tar -x -C $BASE29`; FULL29 the same with
# prefetch_full.diff applied; the working tree with prefetch_a_only.diff (prefetch_ab) or lead.diff (lead_probe).
set -e
cd "$(dirname "$0")/../../.."
R=docs/bench/round29
# yield_probe.txt / .jsonl: the four hint variants in turn, then again in reverse order, 4096 and 16384 rows (the
# probe then held a copy of round 23's loop; it now runs that file itself)
PROBE_MS=4096,16384 OUT=$OUT PAIRS=1 bash $R/yield_probe.sh
for v in alt all dg none; do PROBE_MS=4096,16384 python3 $R/yield_probe.py $v >> $OUT/yield_probe.jsonl; done
python3 $R/yield_probe.py --table $OUT/yield_probe.jsonl > $OUT/yield_probe.txt
# yield_probe_m512.txt / .jsonl
PROBE_MS=512 OUT=$OUT PAIRS=2 VARIANTS="none dg" bash $R/yield_probe.sh
# yield_sustained.txt, tiles_sustained.txt
python3 $R/yield_sustained.py $OUT dg > $OUT/yield_sustained.txt
python3 $R/tiles_sustained.py $OUT > $OUT/tiles_sustained.txt
# long_k_ncu.txt, long_k_stalls.txt
OUT=$OUT bash $R/long_k_ncu.sh
# long_k_ncu_tiles.txt, long_k_stalls_w128.txt: long_k_ncu.sh's first two commands with IMPL
#   "gluon:block_n=256,sub_n=128,producer_regs=64,pipeline=0", "gluon:block_n=128",
#   "gluon:block_n=256,sub_n=64,producer_regs=24,pipeline=0"
# prefetch_ab.txt / .jsonl: round 23's probe in the three trees alternately, two rounds
for i in 1 2; do
  PYTHONPATH=$BASE29:$PYTHONPATH PROBE_MS=4096,16384 python3 docs/bench/round23/cublas_ab.py base >> $OUT/prefetch_ab.jsonl
  PYTHONPATH=$FULL29:$PYTHONPATH PROBE_MS=4096,16384 python3 docs/bench/round23/cublas_ab.py full >> $OUT/prefetch_ab.jsonl
  PROBE_MS=4096,16384 python3 docs/bench/round23/cublas_ab.py aonly >> $OUT/prefetch_ab.jsonl
done
python3 $R/yield_probe.py --table $OUT/prefetch_ab.jsonl > $OUT/prefetch_ab.txt
# lead_probe.txt / .jsonl (lead.diff applied): compiled in ten processes, then two timing processes
for i in $(seq 0 9); do python3 $R/lead_probe.py --warm $i 10 & done; wait
for r in 1 2; do python3 $R/lead_probe.py run$r >> $OUT/lead_probe.jsonl; done
python3 $R/yield_probe.py --table $OUT/lead_probe.jsonl > $OUT/lead_probe.txt
