"""Column- and row-parallel linears over `torch.distributed`, quantized (`QuantLinear` storage, FP8 or
INT8) or in floating point (the baseline a quantized model is measured against).

A linear `y = x @ W^T + b` with W [N, K] is split over the ranks of a process group:

- **column-parallel** splits N: each rank holds rows [n0, n1) of W, of its block scales and of the
  bias, and computes y[..., n0:n1] from the whole x; `gather_output=True` all-gathers the full y.
- **row-parallel** splits K: each rank holds columns [k0, k1) of W and of its scales, takes x[..., k0:k1]
  (the column-parallel output, so no communication in between) and computes a partial y that an
  all-reduce sums; the bias is added once, by the group's rank 0, in its GEMM epilogue. The partials
  leave the GEMM and are summed in `reduce_dtype` (default: the output dtype, as vLLM and DeepSeek-V3
  do; float32 sums the unrounded fp32 partials and casts once, for one more cast kernel and twice the
  bytes on the wire).

Per rank the forward is one GEMM call (`quantcore.ops.quant_linear` for the quantized layers) and at most
one collective. Shards are equal and made of whole blocks: a boundary inside a Bn×Bk weight block would
split one scale between two ranks, and for row-parallel a boundary inside a 1×Bk activation group would
change that group's scale (its amax is over the whole group), so such splits raise `InvalidInputError`
(vLLM refuses the same ones). docs/integration.md states the numerics of the reduction.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import distributed as dist
from torch import nn

from ..errors import InvalidInputError
from ..formats import DEFAULT_BLOCK, dtype_name
from ..nn import QuantLinear
from ..nn.params import dense_shape
from ..definitions import checks

_DIM_NAMES = ("out_features N", "in_features K")
# torch 2.13 renamed all_gather_into_tensor (deprecated there, the only name in torch 2.11).
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def group_position(group: Any, layer: str) -> tuple[int, int]:
    """(rank, world size) of this process in `group` (None: the default group). Without an initialised
    default group a layer is alone: (0, 1), so a model written for tensor parallelism runs in one process."""
    if not (dist.is_available() and dist.is_initialized()):
        if group is not None:
            raise InvalidInputError(f"{layer}: given a process group but torch.distributed is not initialized; "
                                    "call torch.distributed.init_process_group first")
        return 0, 1
    rank = dist.get_rank(group)
    if rank < 0:
        raise InvalidInputError(f"{layer}: this process (global rank {dist.get_rank()}) is not a member of the "
                                "process group; build the layer only on the group's ranks")
    return rank, dist.get_world_size(group)


def shard_bounds(layer: str, dim: int, size: int, block: int, world: int, rank: int) -> tuple[int, int]:
    """[start, stop) of `rank`'s equal shard of a weight dimension of `size` (dim 0: N, 1: K) split over
    `world` ranks. With world > 1 the shard must be a whole number of `block`s (the weight's block along
    that dim, also the activation's group for K); otherwise raises `InvalidInputError` naming the layer."""
    what = _DIM_NAMES[dim]
    if size % world:
        raise InvalidInputError(f"{layer}: {what}={size} does not split into {world} equal shards (world size "
                                f"{world}); use a world size that divides {size}, or leave the layer out of the plan "
                                "(it is then replicated)")
    part = size // world
    if world > 1 and part % block:
        cut = (f"a {block}-wide weight block along K and its 1x{block} activation groups" if dim
               else f"a {block}-row weight block")
        raise InvalidInputError(
            f"{layer}: {what}={size} split over world size {world} gives shards of {part}, not a multiple of the "
            f"block size {block}: a shard boundary would cut {cut}, whose one scale cannot be split between ranks "
            f"exactly. Use a world size for which {size} / world is a multiple of {block}, or leave the layer out "
            "of the plan (it is then replicated)")
    return rank * part, (rank + 1) * part


class _Parallel(nn.Module):
    """What column- and row-parallel layers share: the group, this rank's shard, the slices of the full
    tensors it holds. `split_dim` is the weight's split dim (0: N, 1: K); the storage base class
    (`_QuantStorage` or `_FloatStorage`) provides `_blocks` and `_gemm`."""

    split_dim: int

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, group: Any = None,
                 name: str | None = None, **storage: Any):
        layer = f"{type(self).__name__} {name!r}" if name else type(self).__name__
        rank, world = group_position(group, layer)
        full = (checks.positive_int(layer, "out_features", out_features),
                checks.positive_int(layer, "in_features", in_features))
        block = self._blocks(layer, storage)[self.split_dim]
        start, stop = shard_bounds(layer, self.split_dim, full[self.split_dim], block, world, rank)
        local = list(full)
        local[self.split_dim] = stop - start
        super().__init__(local[1], local[0], bias, **storage)
        self.group, self.rank, self.world = group, rank, world
        self.full_out_features, self.full_in_features = full
        self.shard = (start, stop)
        self.layer_name = layer

    def shard_indices(self) -> dict[str, tuple[tuple[int, ...], tuple[slice, ...] | None]]:
        """Per state-dict entry of this layer: (the full tensor's shape, the index of this rank's part in
        it, or None for a tensor every rank holds whole)."""
        N, K = self.full_out_features, self.full_in_features
        start, stop = self.shard
        found = {"weight": ((N, K), self._slice(start, stop, 2))}
        if hasattr(self, "weight_scale_inv"):
            bn, bk = self.block_size
            b = (bn, bk)[self.split_dim]
            # A shard starts on a block boundary; it ends on one too, or at the tensor's end (unsplit).
            found["weight_scale_inv"] = ((math.ceil(N / bn), math.ceil(K / bk)),
                                         self._slice(start // b, math.ceil(stop / b), 2))
        if self.bias is not None:
            found["bias"] = ((N,), self._slice(start, stop, 1) if self.split_dim == 0 else None)
        return found

    def _slice(self, start: int, stop: int, ndim: int) -> tuple[slice, ...]:
        index = [slice(None)] * ndim
        index[self.split_dim] = slice(start, stop)
        return tuple(index)

    @classmethod
    def from_module(cls, module: nn.Module, group: Any = None, *, name: str | None = None, dtype: Any = "auto",
                    block_size: tuple[int, int] = DEFAULT_BLOCK, out_dtype: torch.dtype | None = None,
                    **style: Any) -> _Parallel:
        """This rank's part of an unsharded `module`: a `QuantLinear` (sliced as it is: its format, block
        and out_dtype are kept) or an `nn.Linear` (for the quantized classes only its slice of the weight
        is quantized, with `dtype`, `block_size` and `out_dtype` as in `QuantLinear.from_linear`; slicing
        whole blocks first gives the same codes and scales as slicing the quantized full weight).
        `style`: gather_output (column) or input_is_parallel (row). The tensors are copies, not views of
        the full ones."""
        layer = f"{cls.__name__}.from_module"
        if not isinstance(module, (nn.Linear, QuantLinear)) or isinstance(module, _Parallel):
            raise InvalidInputError(f"{layer}: expected an unsharded nn.Linear or QuantLinear, got "
                                    f"{type(module).__name__}")
        parallel = cls(module.in_features, module.out_features, module.bias is not None, group=group, name=name,
                       **style, **cls._storage_of(module, layer, dtype, block_size, out_dtype))
        index = parallel.shard_indices()
        tensors = {key: getattr(module, key).detach()[i] if i else getattr(module, key).detach()
                   for key, (_, i) in index.items() if hasattr(module, key)}
        if "weight_scale_inv" in index and "weight_scale_inv" not in tensors:  # an nn.Linear to quantize
            tensors["weight"], tensors["weight_scale_inv"] = torch.ops.quantcore.weight_quant(
                tensors["weight"], dtype=parallel.weight.dtype, block_size=list(parallel.block_size))
        # assign=True keeps each tensor's dtype (a bf16 bias stays bf16) and the clones free the full tensors.
        parallel.load_state_dict({key: t.clone(memory_format=torch.contiguous_format) for key, t in tensors.items()},
                                 strict=True, assign=True)
        return parallel

    def _check_input(self, x: torch.Tensor, features: int, what: str) -> None:
        shape = dense_shape(self.layer_name, x)
        if not shape or shape[-1] != features:  # a 0-d input has no last dim
            raise InvalidInputError(f"{self.layer_name}: input has {shape[-1] if shape else 'no'} features in its "
                                    f"last dim (shape {tuple(shape)}); this rank expects {features} ({what})")

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, full=({self.full_out_features}, {self.full_in_features}), "
                f"shard={self.shard}, rank={self.rank}/{self.world}")


class _Column(_Parallel):
    split_dim = 0

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, gather_output: bool = False,
                 **kwargs: Any):
        super().__init__(in_features, out_features, bias, **kwargs)
        self.gather_output = checks.flag(self.layer_name, "gather_output", gather_output)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., K] (every rank the same) -> [..., N/world], this rank's columns of the output, or
        [..., N] with gather_output."""
        self._check_input(x, self.in_features, "in_features: every rank takes the whole input")
        y = self._gemm(x, self.bias, self.out_dtype or x.dtype)
        if not self.gather_output or self.world == 1:
            return y
        rows = y.reshape(-1, y.shape[-1])
        parts = y.new_empty(self.world * rows.shape[0], rows.shape[1])  # rank-major, as every backend accepts
        _all_gather(parts, rows.contiguous(), group=self.group)
        return parts.view(self.world, *rows.shape).transpose(0, 1).reshape(*y.shape[:-1], self.full_out_features)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, gather_output={self.gather_output}"


class _Row(_Parallel):
    split_dim = 1

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, input_is_parallel: bool = True,
                 reduce_dtype: torch.dtype | None = None, **kwargs: Any):
        super().__init__(in_features, out_features, bias, **kwargs)
        self.input_is_parallel = checks.flag(self.layer_name, "input_is_parallel", input_is_parallel)
        # None: the output dtype (read at each call: a float layer's follows `.to(dtype)`).
        self.reduce_dtype = None if reduce_dtype is None else checks.out_float(self.layer_name, "reduce_dtype",
                                                                              reduce_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., K/world] (this rank's part, e.g. a column-parallel output) or, with
        input_is_parallel=False, the whole x [..., K] -> y [..., N], the same on every rank."""
        if not self.input_is_parallel:
            self._check_input(x, self.full_in_features, "the whole input: input_is_parallel=False")
            x = x[..., self.shard[0]:self.shard[1]]
        self._check_input(x, self.in_features, f"this rank's features [{self.shard[0]}, {self.shard[1]}) of "
                                               f"K={self.full_in_features}")
        # The bias once, in rank 0's epilogue: a sum of world copies would scale it by world.
        out_dtype = self.out_dtype or x.dtype  # None: the output follows the input, as QuantLinear's
        y = self._gemm(x, self.bias if self.rank == 0 else None, self.reduce_dtype or out_dtype)
        if self.world > 1:
            dist.all_reduce(y, group=self.group)
        return y.to(out_dtype)

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, input_is_parallel={self.input_is_parallel}, "
                f"reduce_dtype={dtype_name(self.reduce_dtype) if self.reduce_dtype else 'out_dtype'}")


class _QuantStorage(QuantLinear):
    """QuantLinear's storage and its one-call quantized GEMM (`QuantLinear._gemm`), for the parallel classes."""

    @staticmethod
    def _blocks(layer: str, storage: dict[str, Any]) -> tuple[int, int]:
        return checks.block_pair(layer, storage.get("block_size", DEFAULT_BLOCK))

    @staticmethod
    def _storage_of(module: nn.Module, layer: str, dtype: Any, block_size: tuple[int, int],
                    out_dtype: torch.dtype | None) -> dict[str, Any]:
        device = module.weight.device
        if isinstance(module, QuantLinear):
            return dict(dtype=module.weight.dtype, block_size=module.block_size, out_dtype=module.out_dtype,
                        scale_fmt=module.scale_fmt, device=device)
        return dict(dtype=dtype, block_size=block_size, out_dtype=out_dtype, device=device)


class _FloatStorage(nn.Module):
    """A floating-point linear's storage (`weight` [N, K], `bias` [N], frozen) and `F.linear`."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        make = dict(dtype=dtype, device=device)
        self.weight = nn.Parameter(torch.zeros(out_features, in_features, **make), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(out_features, **make), requires_grad=False) if bias else None

    @staticmethod
    def _blocks(layer: str, storage: dict[str, Any]) -> tuple[int, int]:
        return 1, 1  # no blocks: any equal split is exact

    @staticmethod
    def _storage_of(module: nn.Module, layer: str, dtype: Any, block_size: tuple[int, int],
                    out_dtype: torch.dtype | None) -> dict[str, Any]:
        if isinstance(module, QuantLinear):
            raise InvalidInputError(f"{layer}: a QuantLinear becomes a quantized parallel layer "
                                    "(ColumnParallelQuantLinear or RowParallelQuantLinear), not a float one")
        return dict(dtype=module.weight.dtype, device=module.weight.device)

    @property
    def out_dtype(self) -> torch.dtype:
        return self.weight.dtype

    def _gemm(self, x: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
        return F.linear(x, self.weight, bias).to(out_dtype)  # a float32 partial is the rounded product, upcast

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class ColumnParallelQuantLinear(_Column, _QuantStorage):
    """A `QuantLinear` whose N is split over `group`: `ColumnParallelQuantLinear(K, N, bias, *, group=None,
    gather_output=False, name=None, dtype="auto", block_size=(128, 128), out_dtype=None, device=None)`.

    K and N are the full layer's sizes; `weight` [N/world, K] and `weight_scale_inv` [N/(world·Bn),
    ceil(K/Bk)] hold this rank's rows, `bias` [N/world] its part (`in_features`, `out_features` are the
    local sizes, `full_in_features`, `full_out_features` the layer's). N/world must be a multiple of Bn.
    Forward: x [..., K] -> [..., N/world] (bit for bit the single-process layer's columns where the
    backend computes each output independently of N, as the reference does), or [..., N] with
    `gather_output` (one all-gather)."""


class RowParallelQuantLinear(_Row, _QuantStorage):
    """A `QuantLinear` whose K is split over `group`: `RowParallelQuantLinear(K, N, bias, *, group=None,
    input_is_parallel=True, name=None, dtype="auto", block_size=(128, 128), out_dtype=None, device=None)`.

    `weight` [N, K/world] and `weight_scale_inv` [ceil(N/Bn), K/(world·Bk)] hold this rank's columns; every
    rank holds the whole `bias` [N] and rank 0 adds it. K/world must be a multiple of Bk (the weight's K
    block and the activation's group). Forward: x [..., K/world] (or [..., K] with input_is_parallel=False)
    -> each rank's partial product, out of the GEMM's fp32 accumulator in `reduce_dtype` (None: out_dtype),
    all-reduced (summed) in that dtype -> [..., N] out_dtype on every rank. Keyword `reduce_dtype`."""


class ColumnParallelLinear(_Column, _FloatStorage):
    """The floating-point column-parallel linear (`weight` [N/world, K], `bias` [N/world]): the baseline
    and a home for layers kept in floating point. `ColumnParallelLinear(K, N, bias, *, group=None,
    gather_output=False, name=None, dtype=None, device=None)`."""


class RowParallelLinear(_Row, _FloatStorage):
    """The floating-point row-parallel linear (`weight` [N, K/world], `bias` [N] added by rank 0, partial
    products all-reduced in the layer's dtype, or in `reduce_dtype`: then the partials are the products
    rounded to the layer's dtype, upcast). `RowParallelLinear(K, N, bias, *, group=None,
    input_is_parallel=True, reduce_dtype=None, name=None, dtype=None, device=None)`."""


PARALLEL_LAYERS = (ColumnParallelQuantLinear, RowParallelQuantLinear, ColumnParallelLinear, RowParallelLinear)
