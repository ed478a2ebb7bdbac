#!/bin/bash
# Call 1 of round 36 (a_regs.diff's tree): the device, then the A-in-registers probe as probe_call.sh runs any set.
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $OUT/device.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/device.txt
bash docs/bench/round36/probe_call.sh aregs
