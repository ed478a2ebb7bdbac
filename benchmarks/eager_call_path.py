"""`python benchmarks/eager_call_path.py`: the host cost per call of `quantcore.ops.act_dequant`'s generated
function on tiny CPU tensors, its kept-plan path with the plan's launch replaced by a stub, so that only the
call path (its questions, the plan key, the lookup) is timed. `before` is the function generated without
the traced-call question (`entry.generate` without `as_custom_op`), `after` the public one. Rounds
alternate between the two in one process and count the process's CPU time, so that a shared machine's
load hits both alike."""

import statistics
import time

import torch

from quantcore import definitions, library, ops
from quantcore.runtime import entry, plans

x = torch.randn(1, 128)
q, s = ops.act_quant(x)
ops.act_dequant(q, s)
for key, plan in list(plans.plans.items()):
    plans.plans[key] = plan._replace(launch=lambda *args, **kwargs: None, finish=None)
before = entry.generate(definitions.get("act_dequant"), library.call_with_gradient).public
after = ops.act_dequant


def loop(fn, n=50000):
    start = time.process_time()
    for _ in range(n):
        fn(q, s)
    return (time.process_time() - start) / n * 1e6


times = {"before": [], "after": []}
for _ in range(40):
    for name, fn in (("before", before), ("after", after)):
        times[name].append(loop(fn))
for name, t in times.items():
    print(f"{name:6s} act_dequant call path: min {min(t):.3f} µs, median {statistics.median(t):.3f} µs per call")
