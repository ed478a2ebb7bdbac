#!/bin/bash
# Only on an H200: the GEMM bench behind the measured table's scaled_mm rankings (per M and per K bucket), then the
# end-to-end decode bench. On any other GPU it runs nothing.
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $OUT/device.txt
grep -q H200 $OUT/device.txt || { echo "not an H200: nothing run"; exit 0; }
t0=$(date +%s)
timeout 300 python3 -m quantcore bench --ops scaled_mm --ours-only --json $OUT/gemm_h200.json --no-progress \
    > $OUT/gemm_h200.txt 2> $OUT/gemm_h200.err
echo "gemm bench rc $? $(( $(date +%s) - t0 )) s"; tail -30 $OUT/gemm_h200.txt
timeout 240 python3 -m quantcore bench --e2e --json $OUT/e2e_h200.json > $OUT/e2e_h200.txt 2> $OUT/e2e_h200.err
echo "e2e rc $? $(( $(date +%s) - t0 )) s"; tail -30 $OUT/e2e_h200.txt
