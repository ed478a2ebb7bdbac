#!/bin/bash
# Call 1 of round 36: compile every variant in parallel, then two timed processes of the A-in-registers probe.
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $OUT/device.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/device.txt
time (PROBE_WARM=1 PROBE_JOBS=12 python3 docs/bench/round36/aregs_probe.py warm > $OUT/warm.log 2>&1); echo "warm rc $?"; tail -3 $OUT/warm.log
for i in 1 2; do
  timeout 200 python3 docs/bench/round36/aregs_probe.py run$i >> $OUT/aregs.jsonl 2> $OUT/aregs_err$i.log; echo "run$i rc $?"; tail -2 $OUT/aregs_err$i.log
done
python3 docs/bench/round36/aregs_table.py $OUT/aregs.jsonl | tee $OUT/aregs.txt
