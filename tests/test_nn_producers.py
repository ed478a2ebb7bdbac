"""quantcore.nn's fused producers: QuantLinear fed a quantized pair computes, bit for bit, what it computes
from the float activation the pair quantizes; QuantRMSNorm and QuantSiLUMul from the modules they replace;
quantize_model(fuse_norms=..., fuse_silu_mul=...) on a Llama-style block, eagerly and compiled."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch import nn

from helpers import norm_inputs, randn
from quantcore import InvalidInputError, ops
from quantcore.backends.torch.producers import rms_norm, silu_mul
from quantcore.nn import QuantizedActivation, QuantLinear, QuantRMSNorm, QuantSiLUMul, quantize_model

FP8, I8 = torch.float8_e4m3fn, torch.int8


def quant_linear(K, N, qdtype, bias=True, scale_fmt="fp32", seed=0):
    gen = torch.Generator().manual_seed(seed)
    lin = nn.Linear(K, N, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(N, K, generator=gen) * K**-0.5)
    return QuantLinear.from_linear(lin.to(torch.bfloat16), dtype=qdtype, scale_fmt=scale_fmt)


@pytest.mark.parametrize("qdtype,scale_fmt,layout", [(FP8, "fp32", "row"), (I8, "ue8m0", "m_major")])
def test_quantized_input_is_the_float_input_bit_for_bit(qdtype, scale_fmt, layout):
    layer = quant_linear(300, 200, qdtype, scale_fmt=scale_fmt)
    x, w, r = norm_inputs((2, 3, 300), torch.bfloat16, residual=True)
    q, s, _ = ops.rms_norm_quant(x, w, r, dtype=qdtype, scale_fmt=scale_fmt, scale_layout=layout)
    y, _ = rms_norm(x.reshape(6, 300), w, r.reshape(6, 300), 1e-6)
    expected = layer(y.reshape(2, 3, 300))
    assert torch.equal(layer(QuantizedActivation(q, s, torch.bfloat16)), expected)
    assert torch.equal(layer((q, s)), expected)  # a bare pair: out_dtype None gives bf16
    assert layer(QuantizedActivation(q, s, torch.float32)).dtype == torch.float32
    assert torch.equal(layer(QuantizedActivation(q, s)), expected)  # again, from the layer's kept plan


def test_a_quantized_input_must_be_the_layers_format():
    layer = quant_linear(256, 64, FP8)
    q, s = ops.act_quant(torch.randn(2, 256), dtype=I8)
    with pytest.raises(InvalidInputError, match="the quantized input is int8 codes of shape \\(2, 256\\); this layer "
                                                 "expects float8_e4m3fn codes"):
        layer((q, s))
    q, s = ops.act_quant(torch.randn(2, 128))
    with pytest.raises(InvalidInputError, match="expects float8_e4m3fn codes \\[..., 256\\]"):
        layer((q, s))
    with pytest.raises(InvalidInputError, match="a pair \\(q, scale\\); got a tuple of 3"):
        layer((q, s, s))
    q, s = ops.act_quant(torch.randn(2, 256), group_size=64)
    with pytest.raises(InvalidInputError, match="quantize the activation with group_size=128"):
        layer((q, s))


class LlamaRMSNorm(nn.Module):
    """A Hugging Face-style RMSNorm (weight, variance_epsilon) computing the contract's norm."""

    def __init__(self, hidden, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(hidden, generator=torch.Generator().manual_seed(hidden)))
        self.variance_epsilon = eps

    def forward(self, x):
        return rms_norm(x.reshape(-1, x.shape[-1]), self.weight, None, self.variance_epsilon)[0].reshape(x.shape)


class SiLUMul(nn.Module):
    def forward(self, gate_up):
        return silu_mul(gate_up.reshape(-1, gate_up.shape[-1])).reshape(*gate_up.shape[:-1], -1)


class Block(nn.Module):
    """A Llama-style MLP block: norm, fused gate_up projection, SiLU-and-multiply, down projection."""

    def __init__(self, dim=256, hidden=384):
        super().__init__()
        self.norm = LlamaRMSNorm(dim)
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False)
        self.act = SiLUMul()
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return x + self.down(self.act(self.gate_up(self.norm(x))))


@pytest.mark.parametrize("qdtype", [FP8, I8])
def test_fused_producers_in_a_block_are_the_unfused_quantized_block(qdtype):
    torch.manual_seed(0)
    block = Block().to(torch.bfloat16).requires_grad_(False)
    # bf16 outputs for both: the unfused product is fp32, which a QuantLinear without out_dtype would follow,
    # where QuantSiLUMul's pair stands for the model's dtype.
    fused = quantize_model(Block().to(torch.bfloat16), dtype=qdtype, out_dtype=torch.bfloat16, fuse_norms="norm",
                           fuse_silu_mul=["act"])
    fused.load_state_dict(quantize_model(block, dtype=qdtype, out_dtype=torch.bfloat16).state_dict())
    assert isinstance(fused.norm, QuantRMSNorm) and isinstance(fused.act, QuantSiLUMul)
    assert fused.norm.qdtype == fused.act.qdtype == qdtype and fused.norm.weight.dtype == torch.bfloat16
    x = randn((2, 5, 256), dtype=torch.bfloat16, gen=torch.Generator().manual_seed(1))
    assert torch.equal(fused(x), block(x))


def test_quant_rms_norm_from_torch_and_hugging_face_norms():
    x, _, r = norm_inputs((4, 192), torch.bfloat16, residual=True)
    torch_norm = nn.RMSNorm(192, eps=1e-5, dtype=torch.bfloat16)
    for norm, eps in ((torch_norm, 1e-5), (LlamaRMSNorm(192, 1e-3), 1e-3), (nn.RMSNorm(192), None)):
        fused = QuantRMSNorm.from_norm(norm, dtype=I8, group_size=64)
        expected_eps = torch.finfo(x.dtype).eps if eps is None else eps
        act, new_residual = fused(x, r)
        q, s, expected_residual = ops.rms_norm_quant(x, norm.weight, r, eps=expected_eps, dtype=I8, group_size=64)
        assert torch.equal(act.q, q) and torch.equal(act.scale, s) and torch.equal(new_residual, expected_residual)
        assert act.dtype == torch.promote_types(x.dtype, norm.weight.dtype)
    with pytest.raises(InvalidInputError, match="is not an RMSNorm over the last dim"):
        QuantRMSNorm.from_norm(nn.RMSNorm((4, 192)))


def test_fuse_patterns_must_match_a_module():
    with pytest.raises(InvalidInputError, match="the fuse_norms pattern 'ffn_norm' matches no module"):
        quantize_model(Block(), fuse_norms="ffn_norm")
    with pytest.raises(InvalidInputError, match="fuse_silu_mul must be module-name patterns"):
        quantize_model(Block(), fuse_silu_mul=3)


def test_a_fused_block_compiles_into_the_custom_ops():
    torch._dynamo.reset()
    block = quantize_model(Block().to(torch.bfloat16).requires_grad_(False), dtype=I8, fuse_norms="norm",
                           fuse_silu_mul="act")
    x = randn((3, 256), dtype=torch.bfloat16, gen=torch.Generator().manual_seed(2))
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x), block(x))

    def residual_step(h, residual):
        act, new_residual = block.norm(h, residual)
        return block.gate_up(act), new_residual
    got, expected = torch.compile(residual_step, fullgraph=True, backend="aot_eager")(x, x), residual_step(x, x)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    torch._dynamo.reset()
