"""What several ops' definitions share: `torch.library` schema fragments (their defaults mirror the
public functions'), the fake kernels' block count and the operands of their example calls."""

from __future__ import annotations

import torch

from ..formats import DEFAULT_BLOCK, DEFAULT_EPS, DEFAULT_GROUP, FORMATS
from ..specs import checks

F32 = torch.float32
QUANT_FORMATS = tuple(f.name for f in FORMATS)

BLOCK = f"int[2] block_size=[{DEFAULT_BLOCK[0]}, {DEFAULT_BLOCK[1]}]"
GROUP = f"int group_size={DEFAULT_GROUP}"
EPS = f"float eps={DEFAULT_EPS!r}"
BACKEND = "str? backend=None"


def blocks(n, op: str, name: str, size) -> int:
    """ceil(n / size) after checking `size` as the real op does (a bad size would divide by zero here
    first). Integer arithmetic, so that it also works on a dynamic-shape trace's symbolic sizes."""
    return -(-n // checks.positive_int(op, name, size))


def same_shape_fake(t, *_tensors, out_dtype=torch.bfloat16, **_):
    """The fake kernel of an op whose output has its first input's shape, in `out_dtype`."""
    return t.new_empty(t.shape, dtype=out_dtype)


def example_operands(fmt: str, device, m: int, n: int, k: int):
    """Operands of the built-in ops' example calls (`OpDef.example`): x [m, k] and w [n, k] fp32 with a
    per-row spread (so that blocks get different scales), seeded, and both quantized to format `fmt`
    by the torch reference: (x, w, (q, q_scale), (wq, w_scale))."""
    from .. import ops  # the public functions are generated from these definitions

    gen = torch.Generator().manual_seed(0)
    x, w = (torch.randn(r, k, generator=gen) * torch.exp(torch.randn(r, 1, generator=gen)) for r in (m, n))
    x, w = x.to(device), w.to(device)
    qdtype = next(f.dtype for f in FORMATS if f.name == fmt)
    return (x, w, ops.act_quant(x, dtype=qdtype, backend="torch"), ops.weight_quant(w, dtype=qdtype, backend="torch"))


def example_of(*parts: str, quantize: bool = False):
    """An `OpDef.example` whose call takes `parts` of `example_operands`, in order: "x", "w" (float),
    "xq", "wq" (codes and scale); with `quantize`, the format's dtype as `dtype=`."""
    def example(fmt, device="cpu", m=2, n=32, k=512):
        x, w, xq, wq = example_operands(fmt, device, m, n, k)
        named = {"x": (x,), "w": (w,), "xq": xq, "wq": wq}
        return tuple(t for part in parts for t in named[part]), (dict(dtype=wq[0].dtype) if quantize else {})
    return example
