"""quantcore's ops as `torch.library` custom ops, for `torch.compile` and `torch.export`.

Importing this module registers `torch.ops.quantcore.<name>` for act_quant, act_dequant,
weight_quant, weight_dequant, scaled_mm, scaled_mm_quant (the re-quantized-output GEMM: one op per
return type, where `ops.scaled_mm` returns either), quant_linear, dequant_bias and quantized_gelu.
`import quantcore` imports it, so a program saved with `torch.export.save` loads in a process that
imports quantcore alone; registering costs about 10 ms of the import, which torch's own second
dominates.

Each op takes the same arguments as its `quantcore.ops` function, with these differences, all forced
by the schema language: dtypes are `torch.dtype` values ("auto" is resolved by the caller, e.g.
`quantcore.nn`); `block_size` is a list of two ints; `backend` is None (automatic), one backend name
or a comma-separated priority ("cupy,triton"). The real kernel calls `quantcore.ops`, so validation
and backend selection happen at run time on the real tensors: a graph compiled for one M serves
every M, and selection may still depend on M. The fake kernel derives the outputs from the inputs'
shapes alone, as the backend contract (docs/backend-contract.md) defines them: every output is
contiguous except the M-major activation scale, the transpose view of a contiguous [ceil(K/G), M]
buffer. Invalid arguments are reported when the real kernel runs, with the error `quantcore.ops` raises.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .opdef import CustomOp, OpDef
from .opdefs import BUILTIN

NAMESPACE = "quantcore"


def _backend(name: str | None):
    """The schema's `str?` backend as `quantcore.ops` takes it: "cupy,triton" becomes a priority tuple."""
    if name is not None and "," in name:
        return tuple(part.strip() for part in name.split(","))
    return name


def _real(op: OpDef, custom: CustomOp) -> Callable[..., Any]:
    """The real kernel: the op's public function, its outputs in the fake's layout. Tensors arrive as
    the schema orders them (the optional bias positional) and go on by name."""
    def kernel(*tensors, backend=None, **options):
        out = op.function(**dict(zip(op.tensors, tensors)), backend=_backend(backend), **options)
        return custom.layout(out, options)
    return kernel


def _register(op: OpDef, custom: CustomOp) -> torch.library.CustomOpDef:
    registered = torch.library.custom_op(f"{NAMESPACE}::{custom.name}", _real(op, custom), mutates_args=(),
                                         schema=custom.schema)
    registered.register_fake(custom.fake)
    return registered


CUSTOM_OPS: dict[str, torch.library.CustomOpDef] = {
    custom.name: _register(op, custom) for op in BUILTIN for custom in op.custom_ops}
