"""Shared fixtures: a seeded generator and random (never zero) inputs."""

from __future__ import annotations

import os

import torch

# On a machine without a GPU the Triton kernels run on Triton's interpreter, which reads TRITON_INTERPRET
# when Triton is first imported: set here, before any test module imports Triton (torch._dynamo does,
# for one), or a kernel decorated afterwards calls its helpers as compiled functions.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import quantcore.registry as registry  # noqa: E402


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
