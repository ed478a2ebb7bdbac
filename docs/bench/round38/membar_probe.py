"""Where Triton 3.6 puts named barriers around mbarrier waits and arrivals in a warp-specialized partition.

A 4-warp consumer waits on ready[i % 4] and arrives on empty[i % 4]; a 1-warp producer does the reverse. Compiled
for sm_90 without a GPU, the consumer's PTX has a `bar.sync` (over its 128 threads) before each wait and before each
arrival, the producer's none. With `--no-arrive` the consumer only waits: the `bar.sync` before the wait remains,
the wait being counted as a read and a write of the barrier by Triton's shared-memory barrier analysis.
Usage: PYTHONPATH=<Triton 3.6> python3 membar_probe.py [--no-arrive]
"""
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

ARRIVE = gl.constexpr("--no-arrive" not in sys.argv)


@gluon.jit
def _consume(ready, empty, out, n):
    acc = gl.zeros([128], gl.float32, gl.BlockedLayout([1], [32], [4], [0]))
    for i in range(n):
        mbarrier.wait(ready.index(i % 4), (i // 4) & 1)
        acc += 1.0
        if ARRIVE:
            mbarrier.arrive(empty.index(i % 4), count=1)
    gl.store(out + gl.arange(0, 128, gl.BlockedLayout([1], [32], [4], [0])), acc)


@gluon.jit
def _produce(ready, empty, out, n):
    for i in range(n):
        mbarrier.wait(empty.index(i % 4), ((i // 4) & 1) ^ 1)
        mbarrier.arrive(ready.index(i % 4), count=1)


@gluon.jit
def kernel(out, n):
    ready = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(4):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    gl.warp_specialize([(_consume, (ready, empty, out, n)), (_produce, (ready, empty, out, n))], [1], [24])


compiled = triton.compile(GluonASTSource(kernel, {"out": "*fp32", "n": "i32"}, constexprs={}),
                          target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
for line in compiled.asm["ptx"].splitlines():
    if any(op in line for op in ("bar.sync", "try_wait", "mbarrier.arrive", "$L__BB")):
        print(line.strip())
