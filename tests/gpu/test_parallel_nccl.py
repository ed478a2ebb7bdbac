"""Tensor parallelism on two GPUs with NCCL: the CPU suite's gloo workers (tests/test_parallel.py) run
on GPUs 0 and 1, and examples/tp_decode.py at a tiny size, checking that the profiler's NCCL and GEMM
kernels are recognised before the real run.

Run on a machine with two GPUs: `python3 -m pytest -m gpu tests/gpu/test_parallel_nccl.py`.
"""

from __future__ import annotations

import json

import pytest
import torch

import test_parallel as cpu
from ranks import run_ranks
from quantcore import registry

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs (NCCL between them)")]


def test_layers_match_single_process_nccl():
    run_ranks(2, cpu.check_layers, "cuda", backend="nccl")


def test_shard_model_matches_single_process_nccl():
    run_ranks(2, cpu.check_models, "cuda", backend="nccl")


def test_checkpoint_slices_equal_full_load_nccl(tmp_path):
    cpu.write_checkpoint(tmp_path)
    run_ranks(2, cpu.check_checkpoint, str(tmp_path), "cuda", backend="nccl")


def test_tp_decode_script_nccl(tmp_path):
    run_ranks(2, cpu.check_tp_decode, str(tmp_path), "cuda", backend="nccl")
    result = json.loads((tmp_path / "tp_decode.json").read_text())
    assert result["backend"] == "nccl" and result["world"] == 2
    for run in result["runs"]:
        for phase in ("prefill", "decode"):
            shares = run["profile"][phase]
            assert (shares["comm_ms"] > 0) == (run["tp"] > 1), (run["tp"], run["weights"], phase)  # NCCL kernels
            assert shares["gemm_ms"] > 0, (run["weights"], phase)  # cuBLAS and quantcore GEMM kernels
        if run["weights"] != "bf16":  # a GPU kernel, not the reference
            gpu_labels = {impl.label for impl in registry.impls("quant_linear")} - {"torch"}
            assert {run["implementation"]["decode"], run["implementation"]["prefill"]} <= gpu_labels
