#!/bin/bash
# How short_k_configs.txt was made: short_k_configs.py, every case compiled first by --warm in 14 processes, then
# PAIRS timed processes one after the other, then the table.
# Usage: OUT=dir [PAIRS=2] [PROBE_MS=4096] bash docs/bench/round32/short_k_configs.sh
cd "$(dirname "$0")/../../.." || exit
P=docs/bench/round32/short_k_configs.py
for i in $(seq 0 13); do python3 $P --warm $i 14 & done
wait
for i in $(seq 1 ${PAIRS:-2}); do python3 $P run$i >> $OUT/short_k_configs.jsonl; done
python3 $P --table $OUT/short_k_configs.jsonl
