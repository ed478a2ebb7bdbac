"""Round-19 probe (H100): where the FP8 bias + GELU re-quantized output of two trees differ (run in the base
tree with tag base, then in this one with tag new; OUT in the environment holds the base output): each
differing code with its fp32 value (the same GEMM with an fp32 output), its group's scale and the quotient.
It showed that the first version of quant.divide turned -0 into FP8 +0 (diffprobe.txt; run before this
script and epilogue_ab.py took round 9's operands and runner, the same calls).

Usage: PYTHONPATH=<tree> OUT=dir python3 docs/bench/round19/diffprobe.py base|new
"""
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import epilogue_ab as E  # noqa: E402

tag, out = sys.argv[1], os.environ["OUT"]
N, K = 2112, 7168
a, a_s, w, w_s, bias = E.operands(E.M, N, K, torch.float8_e4m3fn)
epi = dict(bias=True, activation="gelu", requant=True)
q, s = E.runner(None, a, a_s, w, w_s, bias, epi)()
torch.save(dict(q=q.view(torch.uint8).cpu(), s=s.cpu()), f"{out}/{tag}.pt")
if tag == "new":
    b = torch.load(f"{out}/base.pt")
    qn, sn = q.view(torch.uint8).cpu(), s.cpu()
    run = E.gll.scaled_mm.prepare(a, a_s, w, w_s, block_n=128, block_k=128, bias=bias, activation="gelu",
                                  out_dtype=torch.float32, out_quant=None, out_group=128, ue8m0_out=False, eps=1e-4,
                                  profile=E.profile, config=None)
    f = run(a, a_s, w, w_s, bias).cpu()
    dq = (qn != b["q"]).nonzero()
    ds = (sn != b["s"]).nonzero()
    print("code diffs", dq.shape[0], "scale diffs", ds.shape[0])
    for r, c in dq[:20].tolist():
        g = c // 128
        print(f"[{r},{c}] base {b['q'][r, c].item():#04x} new {qn[r, c].item():#04x} x {f[r, c].item()!r} "
              f"s {sn[r, g].item()!r} x/s {(f[r, c] / sn[r, g]).item()!r}")
