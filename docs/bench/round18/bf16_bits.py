"""The Gluon GEMM's bf16 outputs, saved (argv[1] "save" PATH) or compared bit for bit with saved ones (argv[1]
"check" PATH): round 18 replaced its integer fp32 -> bf16 rounding with the hardware conversion plus a NaN
select, which must give the same bits. FP8 and INT8, config_for's tiles and the 128x128 default, a bias and
GELU or none, shapes with N and K tails; the activation scales of three rows set to NaN, +Inf and 1e30 so
that NaN, Inf and overflowing outputs occur."""
import sys

import torch

from quantcore import capability, ops
from quantcore.backends.triton import gluon_launch as gl

mode, path = sys.argv[1], sys.argv[2]
profile = capability.profile_for("cuda")
outs = []
for m, n, k in ((4096, 4096, 512), (512, 7168, 2048), (300, 1001, 1000), (4096, 2112, 7168)):
    for qdtype in (torch.float8_e4m3fn, torch.int8):
        for activation in (None, "gelu"):
            g = torch.Generator(device="cuda").manual_seed(m + n + k)
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
            a, a_s = ops.act_quant(x, dtype=qdtype)
            a_s[0, 0], a_s[1, 0], a_s[2, 0] = float("nan"), float("inf"), 1e30
            b, b_s = ops.weight_quant(torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g), dtype=qdtype)
            bias = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=g) if activation else None
            for cfg in dict.fromkeys((gl.config_for(m, n, 128, None), gl.DEFAULT)):
                run = gl.scaled_mm.prepare(a, a_s, b, b_s, block_n=128, block_k=128, bias=bias, activation=activation,
                                           out_dtype=torch.bfloat16, out_quant=None, out_group=128, ue8m0_out=False,
                                           eps=1e-4, profile=profile, config=cfg)
                outs.append(run(a, a_s, b, b_s, bias).view(torch.int16).cpu())
if mode == "save":
    torch.save(outs, path)
else:
    old = torch.load(path)
    same = [torch.equal(o, n) for o, n in zip(old, outs, strict=True)]
    nan = sum(int((o == 0x7FC0).sum()) for o in outs)
    inf = sum(int((o == 0x7F80).sum() + (o == -128).sum()) for o in outs)
    print(f"{sum(same)} of {len(same)} outputs the same bits; NaN codes {nan}, Inf codes {inf} among them")
