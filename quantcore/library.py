"""quantcore's ops as `torch.library` custom ops, for `torch.compile` and `torch.export`.

Importing this module registers `torch.ops.quantcore.<name>` for act_quant, act_dequant,
weight_quant, weight_dequant, scaled_mm, scaled_mm_quant (the re-quantized-output GEMM: one op per
return type, where `ops.scaled_mm` returns either), quant_linear, dequant_bias and quantized_gelu. `import
quantcore` does not import it, so plain use of `quantcore.ops` never pays for the registration;
`quantcore.nn` does.

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

import math
from typing import Any, Callable

import torch

from . import ops
from .formats import DEFAULT_BLOCK, DEFAULT_EPS, DEFAULT_GROUP
from .specs import checks

NAMESPACE = "quantcore"
_F32 = torch.float32

# Schema fragments shared by several ops (defaults mirror quantcore.ops).
_BLOCK = f"int[2] block_size=[{DEFAULT_BLOCK[0]}, {DEFAULT_BLOCK[1]}]"
_GROUP = f"int group_size={DEFAULT_GROUP}"
_EPS = f"float eps={DEFAULT_EPS!r}"
_BACKEND = "str? backend=None"
_GEMM_ARGS = "Tensor a, Tensor a_scale, Tensor b, Tensor b_scale, Tensor? bias=None"

SCHEMAS = {
    "act_quant": f'(Tensor x, *, ScalarType dtype=float8_e4m3fn, {_GROUP}, str scale_fmt="fp32", {_EPS}, '
                 f'str scale_layout="row", bool check_finite=False, {_BACKEND}) -> (Tensor, Tensor)',
    "act_dequant": f"(Tensor q, Tensor scale, *, {_GROUP}, ScalarType out_dtype=bfloat16, {_BACKEND}) -> Tensor",
    "weight_quant": f'(Tensor w, *, ScalarType dtype=float8_e4m3fn, {_BLOCK}, str scale_fmt="fp32", {_EPS}, '
                    f"bool check_finite=False, {_BACKEND}) -> (Tensor, Tensor)",
    "weight_dequant": f"(Tensor q, Tensor scale, *, {_BLOCK}, ScalarType out_dtype=bfloat16, {_BACKEND}) -> Tensor",
    "scaled_mm": f"({_GEMM_ARGS}, *, str? activation=None, ScalarType out_dtype=bfloat16, {_BLOCK}, "
                 f"{_BACKEND}) -> Tensor",
    "scaled_mm_quant": f'({_GEMM_ARGS}, *, ScalarType out_quant, str? activation=None, {_BLOCK}, '
                       f'int out_group_size={DEFAULT_GROUP}, str out_scale_fmt="fp32", {_EPS}, '
                       f"{_BACKEND}) -> (Tensor, Tensor)",
    "quant_linear": f'(Tensor x, Tensor w, Tensor w_scale, Tensor? bias=None, *, str? activation=None, '
                    f'ScalarType out_dtype=bfloat16, {_BLOCK}, str scale_fmt="fp32", {_EPS}, {_BACKEND}) -> Tensor',
    "dequant_bias": f"(Tensor g, Tensor scale_a, Tensor scale_b, Tensor? bias=None, *, "
                    f"ScalarType out_dtype=bfloat16, {_BACKEND}) -> Tensor",
    "quantized_gelu": f'(Tensor q, Tensor scale, *, {_GROUP}, str approximate="none", ScalarType? out_dtype=None, '
                      f'str scale_fmt="fp32", {_EPS}, {_BACKEND}) -> (Tensor, Tensor)',
}


def _backend(name: str | None):
    """The schema's `str?` backend as `quantcore.ops` takes it: "cupy,triton" becomes a priority tuple."""
    if name is not None and "," in name:
        return tuple(part.strip() for part in name.split(","))
    return name


def _blocks(n, op: str, name: str, size) -> int:
    """ceil(n / size) after checking `size` as the real op does (a bad size would divide by zero here
    first). Integer arithmetic, so that it also works on a dynamic-shape trace's symbolic sizes."""
    return -(-n // checks.positive_int(op, name, size))


# Fake kernels: the outputs' shapes, dtypes and strides from the inputs' shapes alone. They do not run
# the specs, which also build the selection query (its M bucket would specialise a dynamic M).
def _act_quant_fake(x, *, dtype=torch.float8_e4m3fn, group_size=DEFAULT_GROUP, scale_layout="row", **_):
    lead, K = x.shape[:-1], x.shape[-1]
    kb = _blocks(K, "act_quant", "group_size", group_size)
    if scale_layout == "m_major":  # as the real op builds it: [KB, M] contiguous, transposed, reshaped
        scale = x.new_empty(kb, math.prod(lead), dtype=_F32).t().reshape(*lead, kb)
    else:
        scale = x.new_empty(*lead, kb, dtype=_F32)
    return x.new_empty(x.shape, dtype=dtype), scale


def _dequant_fake(q, scale, *, out_dtype=torch.bfloat16, **_):
    return q.new_empty(q.shape, dtype=out_dtype)


def _weight_quant_fake(w, *, dtype=torch.float8_e4m3fn, block_size=DEFAULT_BLOCK, **_):
    N, K = w.shape
    return (w.new_empty(N, K, dtype=dtype),
            w.new_empty(_blocks(N, "weight_quant", "block_size[0]", block_size[0]),
                        _blocks(K, "weight_quant", "block_size[1]", block_size[1]), dtype=_F32))


def _scaled_mm_fake(a, a_scale, b, b_scale, bias=None, *, out_dtype=torch.bfloat16, **_):
    return a.new_empty(*a.shape[:-1], b.shape[0], dtype=out_dtype)


def _scaled_mm_quant_fake(a, a_scale, b, b_scale, bias=None, *, out_quant, out_group_size=DEFAULT_GROUP, **_):
    lead, N = a.shape[:-1], b.shape[0]
    groups = _blocks(N, "scaled_mm", "out_group_size", out_group_size)
    return a.new_empty(*lead, N, dtype=out_quant), a.new_empty(*lead, groups, dtype=_F32)


def _quant_linear_fake(x, w, w_scale, bias=None, *, out_dtype=torch.bfloat16, **_):
    return x.new_empty(*x.shape[:-1], w.shape[0], dtype=out_dtype)


def _dequant_bias_fake(g, scale_a, scale_b, bias=None, *, out_dtype=torch.bfloat16, **_):
    return g.new_empty(g.shape, dtype=out_dtype)


def _quantized_gelu_fake(q, scale, *, group_size=DEFAULT_GROUP, out_dtype=None, **_):
    lead, K = q.shape[:-1], q.shape[-1]
    return (q.new_empty(q.shape, dtype=q.dtype if out_dtype is None else out_dtype),
            q.new_empty(*lead, _blocks(K, "quantized_gelu", "group_size", group_size), dtype=_F32))


def _contiguous(out):
    """Outputs of the real kernel in the layout the fake promises (a no-op for conforming backends;
    the reference returns a strided view for fp32 dequantize outputs with a tail)."""
    if isinstance(out, tuple):
        return tuple(t.contiguous() for t in out)
    return out.contiguous()


def _act_quant(x, *, backend=None, **kwargs):
    q, scale = ops.act_quant(x, backend=_backend(backend), **kwargs)
    # The M-major scale is a transposed view by contract; everything else is contiguous.
    return q.contiguous(), scale if kwargs.get("scale_layout") == "m_major" else scale.contiguous()


def _real(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The real kernel of an op whose outputs are all contiguous: `fn` from quantcore.ops."""
    def kernel(*args, backend=None, **kwargs):
        return _contiguous(fn(*args, backend=_backend(backend), **kwargs))
    return kernel


def _scaled_mm(a, a_scale, b, b_scale, bias=None, *, backend=None, **kwargs):
    # The schema needs the optional bias tensor positional; quantcore.ops takes it by keyword.
    return _contiguous(ops.scaled_mm(a, a_scale, b, b_scale, bias=bias, backend=_backend(backend), **kwargs))


# name -> (real kernel, fake kernel)
_KERNELS = {
    "act_quant": (_act_quant, _act_quant_fake),
    "act_dequant": (_real(ops.act_dequant), _dequant_fake),
    "weight_quant": (_real(ops.weight_quant), _weight_quant_fake),
    "weight_dequant": (_real(ops.weight_dequant), _dequant_fake),
    "scaled_mm": (_scaled_mm, _scaled_mm_fake),
    "scaled_mm_quant": (_scaled_mm, _scaled_mm_quant_fake),
    "quant_linear": (_real(ops.quant_linear), _quant_linear_fake),
    "dequant_bias": (_real(ops.dequant_bias), _dequant_bias_fake),
    "quantized_gelu": (_real(ops.quantized_gelu), _quantized_gelu_fake),
}


def _register(name: str) -> torch.library.CustomOpDef:
    real, fake = _KERNELS[name]
    op = torch.library.custom_op(f"{NAMESPACE}::{name}", real, mutates_args=(), schema=SCHEMAS[name])
    op.register_fake(fake)
    return op


CUSTOM_OPS: dict[str, torch.library.CustomOpDef] = {name: _register(name) for name in SCHEMAS}
