"""Checkpoints and QuantLinear on the GPU: shards read straight onto the device into a meta-built
model, bit-identical to the CPU load, and the loaded model's forward (output dtype following the
input, casts leaving the FP8 codes and fp32 scales alone) against the same model on the CPU.

Run on a GPU machine: `python3 -m pytest -m gpu tests/gpu`.
"""

from __future__ import annotations

import pytest
import torch

from quantcore.nn import QuantLinear, load_checkpoint, quantize_model, save_checkpoint
from quantcore.definitions.tolerances import rel_error

from test_checkpoint import LINEARS, codes, float_model, meta_model

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("fmt", ["fp8", "compressed-tensors"])
def test_load_onto_the_gpu_from_meta(tmp_path, fmt):
    source = quantize_model(float_model(), dtype=torch.float8_e4m3fn)
    folder = save_checkpoint(source, tmp_path / fmt, format=fmt, max_shard_size="200KB")
    on_cpu, on_gpu = meta_model(), meta_model()
    load_checkpoint(on_cpu, folder)
    load_checkpoint(on_gpu, folder, device="cuda")
    assert all(p.is_cuda for p in on_gpu.parameters())
    for name in LINEARS:
        cpu, gpu = on_cpu.get_submodule(name), on_gpu.get_submodule(name)
        assert isinstance(gpu, QuantLinear) and not gpu.weight.requires_grad
        assert torch.equal(codes(gpu.weight).cpu(), codes(cpu.weight))
        assert torch.equal(gpu.weight_scale_inv.cpu(), cpu.weight_scale_inv)
    tokens = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    expected = on_cpu(tokens)
    out = on_gpu(tokens.cuda())
    assert out.dtype == torch.bfloat16 and rel_error(out.cpu(), expected) <= 2e-2
    on_gpu.float()  # the float tensors follow, the codes and scales stay
    layer = on_gpu.get_submodule(LINEARS[0])
    assert layer.weight.dtype == torch.float8_e4m3fn and layer.weight_scale_inv.dtype == torch.float32
    assert on_gpu(tokens.cuda()).dtype == torch.float32
