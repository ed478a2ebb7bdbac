"""Running a test function on several processes joined by `torch.distributed` (gloo on the CPU, NCCL on
GPUs), each its own rank; an assertion failing on any rank fails the test with that rank's traceback."""

from __future__ import annotations

import os
import sys
import tempfile
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.multiprocessing as mp
from torch import distributed as dist


def run_ranks(world: int, fn: Callable[..., None], *args: Any, backend: str = "gloo") -> None:
    """`fn(rank, world, *args)` in `world` processes after `init_process_group(backend)` through a file
    store. gloo ranks are forked from this process, so they start with its imports (a spawned rank spends
    seconds importing torch and, at the first custom-op call, torch._dynamo); NCCL ranks are spawned (CUDA
    does not survive a fork; `fn` and `args` must pickle) and use GPU `rank`."""
    method = "spawn" if backend == "nccl" else "fork"
    if method == "fork":
        import torch._dynamo  # noqa: F401  (imported once here, not in every rank)
    with tempfile.TemporaryDirectory() as store:
        mp.start_processes(_rank_main, args=(world, os.path.join(store, "store"), backend, fn, args), nprocs=world,
                           join=True, start_method=method)


def _rank_main(rank: int, world: int, store: str, backend: str, fn: Callable[..., None], args: tuple) -> None:
    torch.set_num_threads(1)  # several ranks share this machine's cores
    if backend == "gloo" and sys.platform == "linux":
        # All ranks are on this host: loopback, so a CI container whose hostname does not resolve works too.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    fn(rank, world, *args)
    dist.barrier()  # a rank leaving early would tear its connections down under the others
    dist.destroy_process_group()


def assert_same_on_all_ranks(t: torch.Tensor) -> None:
    """Every rank of the default group holds `t` bit for bit."""
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    for rank, part in enumerate(parts):
        assert torch.equal(part, t), f"rank {rank} holds a different tensor than rank {dist.get_rank()}"
