"""Round-5 A/B probe (H100): eager decode step time with QuantLinear's kept call site
(`dispatch.Site`, this round) against the same layers calling `ops.quant_linear` as before it, on the
e2e benchmark's model (dim 4096, 4 layers, GELU MLP with biases, batch 1 and 8) and on its linear
stack (24 linears, M = 1). The variants are timed in turn, ROUNDS loops of STEPS steps each, so that
the host's slow moments (this VM's eager times move by up to 30 % between runs) land on all of them;
min and median per variant are printed.

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round5/r5_ab.py
"""
import copy
import statistics

import torch

import quantcore.nn as qnn
from quantcore import ops
from quantcore.bench import decoder
from quantcore.bench.timing import loop_us

ROUNDS, STEPS = 9, 64
dev = torch.device("cuda")
site_gemm = qnn.QuantLinear._gemm


def ops_gemm(self, x, bias, out_dtype):
    """QuantLinear's eager call before this round: the public op, through the dispatcher's key."""
    return ops.quant_linear(x, self.weight, self.weight_scale_inv, bias, out_dtype=out_dtype,
                            block_size=self.block_size, scale_fmt=self.scale_fmt)


def measure(name, steps):
    """steps: {variant: (step function, QuantLinear._gemm to install or None)}."""
    times = {v: [] for v in steps}
    with torch.inference_mode():
        for _ in range(ROUNDS):
            for variant, (step, gemm) in steps.items():
                qnn.QuantLinear._gemm = gemm or site_gemm
                for _ in range(4):
                    step()
                times[variant].append(loop_us(step, STEPS))
    qnn.QuantLinear._gemm = site_gemm
    bf16 = statistics.median(times["bf16"])
    for variant, t in times.items():
        med = statistics.median(t)
        print(f"   {name:16s} {variant:14s} min {min(t):7.1f}  median {med:7.1f} us/step  "
              f"(median bf16 / it: {bf16 / med:.2f})", flush=True)


def main():
    torch.manual_seed(0)
    base = decoder.DecodeModel(4096, 4, 32000, dev)
    with torch.no_grad():
        fp8 = qnn.quantize_model(copy.deepcopy(base), dtype=torch.float8_e4m3fn)
        int8 = qnn.quantize_model(copy.deepcopy(base), dtype=torch.int8)
    print(f"== eager decode step, {ROUNDS} rounds of {STEPS} steps", flush=True)
    for batch in (1, 8):
        states = {k: decoder.DecodeState.new(m, batch, 256) for k, m in (("bf16", base), ("fp8", fp8), ("int8", int8))}
        step = lambda m, k: (lambda: decoder.decode_step(m, states[k]))
        measure(f"model batch {batch}", {
            "bf16": (step(base, "bf16"), None),
            "fp8 site": (step(fp8, "fp8"), site_gemm), "fp8 ops": (step(fp8, "fp8"), ops_gemm),
            "int8 site": (step(int8, "int8"), site_gemm), "int8 ops": (step(int8, "int8"), ops_gemm)})
        del states
    del base, fp8, int8
    torch.cuda.empty_cache()
    stack = decoder.linear_stack(4096, 4, dev)
    with torch.no_grad():
        qstack = qnn.quantize_model(copy.deepcopy(stack), dtype=torch.float8_e4m3fn)
    x = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)
    measure("linear stack", {"bf16": (lambda: stack(x), None), "fp8 site": (lambda: qstack(x), site_gemm),
                             "fp8 ops": (lambda: qstack(x), ops_gemm)})


if __name__ == "__main__":
    main()
