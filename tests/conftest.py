"""Shared fixtures: a seeded generator and random (never zero) inputs, and quantcore's cache folder for
the run."""

from __future__ import annotations

import os

import pytest
import torch

# Triton decides when it is imported whether its kernels (the standard library's too) are interpreted, for the
# whole process: where there is no GPU the interpreter tests (tests/backends) need it on, set here, before
# anything imports Triton (quantcore's imports may, through torch's).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import quantcore.registry as registry  # noqa: E402
from quantcore import userdirs  # noqa: E402


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pyproject's addopts): a worker per CPU core, where the tests run on the CPU; on a
    machine with a GPU one process, the GPU tests sharing the device as they always did (`-n N` or
    PYTEST_XDIST_AUTO_NUM_WORKERS choose otherwise)."""
    if torch.cuda.is_available() and not os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return 0
    return None  # xdist's own count


def pytest_collection_modifyitems(config, items):
    """GPU tests skip cleanly where torch sees no GPU."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest -m gpu` on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def gen():
    """A seeded CPU generator so failures reproduce."""
    return torch.Generator().manual_seed(1234)


@pytest.fixture(autouse=True)
def _clean_registry_state(monkeypatch):
    """Selection caches and warn-once state must not leak between tests."""
    monkeypatch.delenv("QUANTCORE_SIMULATE", raising=False)
    monkeypatch.delenv("QUANTCORE_PRIORITY", raising=False)
    registry.clear_caches()
    yield


@pytest.fixture(autouse=True)
def _release_gpu_memory(request):
    """After each GPU test, the blocks torch's caching allocator keeps are handed back: the GPU suite runs on
    16 xdist workers sharing one device (`pytest -m gpu -n 16`), and memory one worker cached for a large
    test is otherwise out of the others' reach (cuBLAS and the allocator then fail with out of memory)."""
    yield
    if "gpu" in request.keywords and torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


@pytest.fixture(scope="session", autouse=True)
def quantcore_cache(tmp_path_factory):
    """quantcore's cache folder (NVRTC's compiles, the native extension) for this run, shared by its
    xdist workers: each compile is made once per run, none is read from or left in the user's cache."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's folder, above each worker's own
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(userdirs.CACHE_ENV, str(base / "quantcore-cache"))
        yield base / "quantcore-cache"
