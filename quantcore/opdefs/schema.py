"""What several ops' definitions share: `torch.library` schema fragments (their defaults mirror the
public functions') and the fake kernels' block count."""

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
