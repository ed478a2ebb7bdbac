#!/bin/bash
# How round 36's files were made. H100 80GB HBM3 (device.txt), driver 580.159.04, power limit 700 W, torch
# 2.11.0+cu130, Triton 3.6.0; every call with QUANTCORE_NATIVE=0. Calls 1 and 2 measured 26bf583 with a_regs.diff
# applied (`git archive 26bf583 | tar -x -C <tree>; patch -p1 < a_regs.diff`): a GluonConfig field `a_regs` (the
# kernel's A_REGS) that loads each K block's A rows of a consumer into registers in wgmma's operand layout once
# (ldmatrix) and hands them to every column sub-tile's wgmma, which otherwise reads them from shared memory again.
# Off, it compiles to 26bf583's SASS byte for byte at 128x192 (N = 2112) and at 128x128 (512x7168x2048), and to the
# same instruction count with a few integer instructions different outside the K loop at 128x256 (offline, Triton
# 3.6's ptxas, sm_90a). Not shipped: the library is 26bf583's.
#
# aregs_call.sh (call 1; it then ran probe_call.sh's commands itself, with a 200 s timeout a process):
#   (first every variant compiled, in 12 processes: PROBE_WARM=1; its log came back empty)
#   aregs.jsonl   aregs_probe.py, two processes one after the other (run1, run2): per case the variants and cuBLAS
#                 block-wise FP8 (or torch._int_mm) timed interleaved (timing.gpu_times_us: L2 flushed, median of 15),
#                 bf16 output, 4096 and 16384 rows, the six bench shapes
#   aregs.txt     aregs_table.py aregs.jsonl: medians over the two processes, "=" where a variant's bits equal base's
#
# aregs_ncu.sh (call 2):
#   aregs_ncu.txt  Nsight Compute (--clock-control none; SpeedOfLight, ComputeWorkloadAnalysis, MemoryWorkloadAnalysis
#                  and shared-memory wavefronts) on round 29's long_k_ncu.py, FP8 16384x2112x7168, the 128x192 tile
#                  without and with a_regs
#
# rows16384_ncu.sh (call 3), 26bf583's quantcore (the library of this round):
#   rows16384_ncu.txt  Nsight Compute (--clock-control none; SpeedOfLight, MemoryWorkloadAnalysis, DRAM bytes read,
#                      L2 hit rate and read sectors) on round 29's long_k_ncu.py, gluon (config_for) and cublas, FP8
#                      16384x4096x7168 and 16384x7168x16384
#
# Calls 4-9 ran the tree of probe_variants.diff (applied to 26bf583): a GluonConfig field `depth` (the kernel's DEPTH,
# the sub-tile wgmmas a consumer keeps in flight, 2 as shipped) whose other values select a probe's schedule: 3 (a
# third wgmma in flight), 0 (no promotion: each K block's wgmmas accumulate into the accumulators themselves), 12 (K
# block 0's scales for every K block: no scale load in the K loop), 22 (each scale product tied to its waited partial)
# and 32 (each K block's scales loaded at the start of the K block before, their products formed at its end). 0 and 12
# are wrong by design. At depth 2 it compiles to 26bf583's SASS byte for byte (offline, Triton 3.6's ptxas, five
# cases: the plain 128x256 tile at K = 16384 in FP8 and INT8, bias + re-quantized INT8 at K = 512, N = 2112 and the
# 128x128 tile at 512 rows). aregs_table.py made each .txt from its .jsonl. What each call ran, as probe_call.sh and
# promote_ncu.sh do it now (the calls ran one script each with the same commands, timeouts of 200-250 s; call 7's ncu part used the stall and
# cycle metrics only):
#   call 4:  PROBE_SET=depth bash probe_call.sh depth                  depth.*    FP8 and INT8
#   call 5:  PROBE_SET=promote PROBE_FMTS=fp8 bash probe_call.sh promote  promote.*  (before depth 12 was added: base,
#            d0, cublas_tw)
#   call 6:  bash promote_ncu.sh promote_ncu base d0 cublas cublas_tw  promote_ncu.txt, promote_ncu_table.txt
#   call 7:  PROBE_SET=promote PROBE_FMTS=fp8 bash probe_call.sh loads; bash promote_ncu.sh loads_ncu base d12
#            loads.*, loads_ncu.txt
#   call 8:  PROBE_SET=late bash probe_call.sh late                    late.*     FP8 and INT8
#   call 9:  PROBE_SET=ahead bash probe_call.sh ahead                  ahead.*    FP8 and INT8
