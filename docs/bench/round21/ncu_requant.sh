#!/bin/bash
# How ncu_requant.txt was made (repository root, OUT a folder): metrics of the kernel's first version of groups
# over sub-tiles against groups within one, then warp stall samples through round 9's ncu_stalls.py.
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,smsp__inst_executed.sum,l1tex__t_bytes.sum,smsp__sass_inst_executed_op_global_st.sum,smsp__sass_inst_executed_op_local_ld.sum,smsp__sass_inst_executed_op_local_st.sum,lts__t_sectors_srcunit_tex_op_write.sum
for v in "128/64 128" "128/64 64" "wide 128" "wide 64"; do
  echo "== $v"
  ncu --clock-control none -k regex:block_scaled_mm_ws --launch-skip 3 --launch-count 1 --metrics $M python3 docs/bench/round21/ncu_requant.py $v 2>&1 | grep -v "Warning\|plan = \|==PROF==\|==WARNING==\|launch = " | tail -14
done
for v in "128/64 128" "128/64 64"; do
  n=$(echo $v | tr ' /' '__')
  ncu --clock-control none -k regex:block_scaled_mm_ws --launch-skip 3 --launch-count 1 --section SourceCounters --page source --print-source sass --csv python3 docs/bench/round21/ncu_requant.py $v > $OUT/src_$n.csv 2>/dev/null
  echo "== stalls $v"; python3 docs/bench/round9/ncu_stalls.py $OUT/src_$n.csv 25
done
