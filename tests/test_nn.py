"""quantcore.nn: QuantLinear against nn.Linear, quantize_model, state_dict and safetensors checkpoints
in the DeepSeek-V3 / Hugging Face FP8 layout, and the tiny-transformer example on the CPU."""

from __future__ import annotations

import importlib.util
import io
import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from helpers import randn
import quantcore
from quantcore import InvalidInputError, capability, ops
from quantcore.capability import SIMULATED
from quantcore.nn import QuantLinear, load_fp8_checkpoint, quantize_model
from quantcore.definitions.tolerances import rel_error

FP8, INT8 = torch.float8_e4m3fn, torch.int8
# Relative Frobenius error of a quantized linear (weights per 128×128, activations per 1×128) against
# the float one, on this file's random inputs: measured 0.030-0.035 (FP8) and 0.007-0.012 (INT8).
LINEAR_ERROR = {FP8: 0.05, INT8: 0.015}


def linear(K, N, gen, bias=True, dtype=torch.bfloat16):
    """An inference-only nn.Linear with N(0, 1/K) weights (activations carry the per-row spread)."""
    lin = nn.Linear(K, N, bias=bias).requires_grad_(False)
    lin.weight.copy_(torch.randn(N, K, generator=gen) * K**-0.5)
    if bias:
        lin.bias.copy_(torch.randn(N, generator=gen))
    return lin.to(dtype)


@pytest.mark.parametrize("qdtype", [FP8, INT8])
@pytest.mark.parametrize("lead", [(), (7,), (2, 3)])
@pytest.mark.parametrize("bias", [True, False])
def test_quant_linear_close_to_linear(gen, qdtype, lead, bias):
    lin = linear(300, 200, gen, bias)  # both dims have tails
    q = QuantLinear.from_linear(lin, dtype=qdtype)
    x = randn((*lead, 300), gen=gen, dtype=torch.bfloat16)
    y = q(x)
    assert y.shape == (*lead, 200) and y.dtype == torch.bfloat16
    assert rel_error(y, lin(x)) <= LINEAR_ERROR[qdtype]
    # Exactly the composition it stands for: quantized x times the dequantized weight, plus bias.
    xq = ops.act_dequant(*ops.act_quant(x, dtype=qdtype), out_dtype=torch.float32)
    expected = xq @ q.dequantized_weight().t() + (lin.bias.float() if bias else 0)
    assert rel_error(y, expected) <= 1e-2  # bf16 output


def test_out_dtype_and_block_size(gen):
    lin = linear(96, 70, gen, dtype=torch.float32)
    q = QuantLinear.from_linear(lin, dtype=INT8, block_size=(32, 64))
    assert q.out_dtype is None  # the output follows the input, as the linear's did
    assert q.weight_scale_inv.shape == (3, 2)
    x = randn((5, 96), gen=gen)
    assert q(x).dtype == torch.float32 and rel_error(q(x), lin(x)) <= LINEAR_ERROR[INT8]
    half = QuantLinear.from_linear(lin, dtype=INT8, out_dtype=torch.float16)
    assert half(x).dtype == torch.float16


def test_dtype_auto(monkeypatch):
    assert QuantLinear(64, 32).weight.dtype == FP8  # the CPU: the reference computes FP8
    monkeypatch.setattr(capability, "profile_for", lambda device: SIMULATED["sm80"])
    assert QuantLinear(64, 32).weight.dtype == INT8  # a GPU without FP8 tensor cores
    assert QuantLinear(64, 32, dtype="fp8").weight.dtype == FP8


@pytest.mark.parametrize("cast", [lambda m: m.to(torch.float16), lambda m: m.half(), lambda m: m.bfloat16(),
                                  lambda m: m.float(), lambda m: m.to("cpu", torch.float64)])
def test_module_casts_keep_quantized_params(gen, cast):
    q = QuantLinear.from_linear(linear(130, 40, gen), dtype=FP8)
    codes, scale = q.weight.view(torch.uint8).clone(), q.weight_scale_inv.clone()
    before = dict(q.named_parameters())
    assert cast(q) is q
    assert q.weight.dtype == FP8 and torch.equal(q.weight.view(torch.uint8), codes)
    assert q.weight_scale_inv.dtype == torch.float32 and torch.equal(q.weight_scale_inv, scale)
    assert q.bias.dtype == cast(nn.Linear(1, 1)).weight.dtype  # the bias is an ordinary float parameter
    # The same Parameter objects: optimizers, FSDP and tied references keep pointing at them.
    assert all(p is before[name] for name, p in q.named_parameters())


def test_output_dtype_follows_the_input(gen):
    """out_dtype None: a model cast to bf16 computes in bf16 end to end; a fixed out_dtype stays fixed."""
    model = quantize_model(Net(gen).float(), dtype=FP8, skip=())
    x = randn((4, 160), gen=gen)
    assert model(x).dtype == torch.float32
    model.to(torch.bfloat16)
    assert model(x.bfloat16()).dtype == torch.bfloat16
    assert model.blocks[0][0](x.half()).dtype == torch.float16
    fixed = QuantLinear.from_linear(linear(160, 32, gen), dtype=FP8, out_dtype=torch.float32).to(torch.bfloat16)
    assert fixed(x.bfloat16()).dtype == torch.float32


def test_weights_are_frozen_parameters(gen):
    """model.parameters() lists the codes and scales (FSDP, accelerate and PEFT walk parameters), frozen;
    the state dict keeps its keys."""
    model = quantize_model(Net(gen), dtype=INT8)
    layer = model.blocks[0][0]
    assert dict(layer.named_parameters()) == {"weight": layer.weight, "weight_scale_inv": layer.weight_scale_inv,
                                              "bias": layer.bias}
    assert all(isinstance(p, nn.Parameter) and not p.requires_grad for p in layer.parameters())
    assert list(layer.buffers()) == []
    assert list(layer.state_dict()) == ["weight", "weight_scale_inv", "bias"]
    assert sum(p.numel() for p in model.parameters()) == sum(t.numel() for t in model.state_dict().values())
    unbiased = QuantLinear(64, 32, bias=False)
    assert unbiased.bias is None and [n for n, _ in unbiased.named_parameters()] == ["weight", "weight_scale_inv"]


def test_meta_device_layer_loads_with_assign(gen):
    """A layer built on the meta device allocates nothing; load_state_dict(assign=True) takes the
    checkpoint's tensors as frozen parameters, still checking their dtype and shape."""
    source = QuantLinear.from_linear(linear(300, 200, gen), dtype=FP8)
    with torch.device("meta"):
        layer = QuantLinear(300, 200, dtype=FP8)
    assert layer.weight.is_meta and layer.weight_scale_inv.is_meta and layer.bias.is_meta
    layer.load_state_dict(source.state_dict(), assign=True)
    assert not any(p.is_meta or p.requires_grad for p in layer.parameters())
    x = randn((3, 300), gen=gen, dtype=torch.bfloat16)
    assert torch.equal(layer(x), source(x))
    with torch.device("meta"):
        again = QuantLinear(300, 200, dtype=FP8)
    state = source.state_dict() | {"weight_scale_inv": source.weight_scale_inv.bfloat16()}
    with pytest.raises(InvalidInputError, match="weight_scale_inv has dtype bfloat16"):
        again.load_state_dict(state, assign=True)


def test_extra_repr():
    assert repr(QuantLinear(300, 200, bias=False, dtype=INT8)) == (
        "QuantLinear(in_features=300, out_features=200, bias=False, dtype=int8, block_size=(128, 128))")
    assert repr(QuantLinear(64, 32, dtype=FP8, out_dtype=torch.float16, scale_fmt="ue8m0")) == (
        "QuantLinear(in_features=64, out_features=32, bias=True, dtype=float8_e4m3fn, block_size=(128, 128), "
        "out_dtype=float16, scale_fmt=ue8m0)")


@pytest.mark.parametrize("kwargs,match", [
    (dict(dtype=torch.float16), "dtype must be"),
    (dict(block_size=(128,)), "block_size"),
    (dict(out_dtype=torch.int8), "out_dtype"),
    (dict(scale_fmt="e8m0"), "scale_fmt"),
    (dict(bias="no"), "bias must be True or False, got 'no'"),
    (dict(bias=1), "bias must be True or False, got 1"),
    (dict(device="gpu0"), "'gpu0' is not a device"),
    (dict(device="cuda:abc"), "'cuda:abc' is not a device"),
    (dict(device=1.5), "1.5 is not a device"),
    (dict(device="cuda:64", dtype=INT8), "no CUDA device cuda:64 here"),
])
def test_constructor_errors(kwargs, match):
    with pytest.raises(InvalidInputError, match=f"QuantLinear: {match}"):
        QuantLinear(64, 32, **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU-only torch")
def test_a_cuda_layer_without_a_gpu_says_so():
    with pytest.raises(InvalidInputError, match=r"QuantLinear: no CUDA device cuda here \(0 visible\)"):
        QuantLinear(64, 32, dtype=INT8, device="cuda")


def test_what_the_forward_computes_with_is_checked_and_followed(gen):
    """block_size is the scale grid's, fixed; scale_fmt and out_dtype may change, checked, and the next call
    follows them (the layer's call site keeps a plan per signature)."""
    layer = QuantLinear.from_linear(linear(256, 40, gen), dtype=INT8)
    x = randn((3, 256), gen=gen, dtype=torch.bfloat16)
    layer(x)
    with pytest.raises(InvalidInputError, match=r"QuantLinear: block_size is fixed when the layer is made.*128x128"
                                                r".*to \(64, 64\)"):
        layer.block_size = (64, 64)
    for name, bad in (("scale_fmt", "e8m0"), ("out_dtype", torch.int8)):
        with pytest.raises(InvalidInputError, match=f"QuantLinear: {name} must be one of"):
            setattr(layer, name, bad)
    assert layer.block_size == (128, 128) and layer.scale_fmt == "fp32" and layer.out_dtype is None
    layer.scale_fmt, layer.out_dtype = "ue8m0", torch.float32
    expected = ops.quant_linear(x, layer.weight, layer.weight_scale_inv, layer.bias, scale_fmt="ue8m0",
                                out_dtype=torch.float32)
    assert torch.equal(layer(x), expected)
    assert not torch.equal(expected, ops.quant_linear(x, layer.weight, layer.weight_scale_inv, layer.bias,
                                                      out_dtype=torch.float32))  # ue8m0 scales changed numerics


@pytest.mark.parametrize("change", ["rows", "transposed", "reshaped"])
def test_a_parameter_given_another_view_of_its_memory_is_planned_again(gen, change):
    """`.data = view` at the same address keeps the parameters' addresses: the call site's signature
    has their shapes and strides too, so the next call is validated (here refused, the scale grid no longer
    matching the weight) instead of replaying the kept plan on the old metadata."""
    layer = QuantLinear.from_linear(linear(256, 256, gen), dtype=INT8)
    x = randn((3, 256), gen=gen, dtype=torch.bfloat16)
    layer(x)
    scale = layer.weight_scale_inv
    scale.data = {"rows": scale.data[:1], "transposed": scale.data.t(), "reshaped": scale.data.reshape(4, 1)}[change]
    assert scale.data_ptr() == scale.data.data_ptr()
    if change == "transposed":  # a square grid: valid, and computed with the new view
        assert torch.equal(layer(x), ops.quant_linear(x, layer.weight, scale.contiguous(), layer.bias))
    else:
        with pytest.raises(InvalidInputError, match="quant_linear: w_scale has shape"):
            layer(x)


def test_forward_error_names_the_layer(gen):
    with pytest.raises(InvalidInputError, match="QuantLinear: input has 65 features.*in_features=64"):
        QuantLinear(64, 32)(randn((2, 65), gen=gen))
    with pytest.raises(InvalidInputError, match=r"QuantLinear: input has no features.*shape \(\)"):
        QuantLinear(64, 32)(torch.tensor(1.0))
    with pytest.raises(InvalidInputError, match=r"QuantLinear: input must be a dense torch.Tensor "
                                                r"\[..., in_features\], got list"):
        QuantLinear(64, 32)([1.0] * 64)
    with pytest.raises(InvalidInputError, match="QuantLinear: input must be a dense torch.Tensor .* got a nested"):
        QuantLinear(64, 32)(torch.nested.nested_tensor([randn((2, 64), gen=gen)] * 2))
    with pytest.raises(InvalidInputError, match=r"QuantLinear: input must be a dense .* got a torch.sparse_csr tensor; "
                                                r"call \.to_dense\(\) first"):
        QuantLinear(64, 32)(randn((2, 64), gen=gen).to_sparse_csr())


@pytest.mark.parametrize("kwargs,match", [
    (dict(skip=5), "skip must be module-name patterns"),
    (dict(skip=["lm_head", 1]), "skip must be module-name patterns"),
    (dict(skip=None), "skip must be module-name patterns"),
    (dict(scale_fmt="e8m0"), "scale_fmt"),
    (dict(out_dtype=torch.int8), "out_dtype"),
])
def test_quantize_model_checks_its_options_even_without_linears(kwargs, match):
    """Refused up front, not only by the layers it makes: a model without linears would take them silently."""
    with pytest.raises(InvalidInputError, match=f"quantize_model: {match}"):
        quantize_model(nn.Sequential(nn.ReLU()), **kwargs)


class Net(nn.Module):
    """Linears at several depths, one named like an output head."""

    def __init__(self, gen):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(linear(160, 160, gen), nn.GELU(), linear(160, 160, gen))
                                    for _ in range(2))
        self.lm_head = linear(160, 50, gen, bias=False)

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return self.lm_head(x)


def test_quantize_model_with_skip_list(gen):
    model = Net(gen)
    x = randn((4, 160), gen=gen, dtype=torch.bfloat16)
    expected = model(x)
    assert quantize_model(model, dtype=FP8, skip=("lm_head", "blocks.1.2")) is model
    kinds = {name: type(m).__name__ for name, m in model.named_modules() if isinstance(m, (nn.Linear, QuantLinear))}
    assert kinds == {"blocks.0.0": "QuantLinear", "blocks.0.2": "QuantLinear", "blocks.1.0": "QuantLinear",
                     "blocks.1.2": "Linear", "lm_head": "Linear"}
    assert rel_error(model(x), expected) <= 2 * LINEAR_ERROR[FP8]  # three quantized layers in a row


def test_quantize_model_glob_patterns(gen):
    model = quantize_model(Net(gen), dtype=INT8, skip=("blocks.0.*",))
    assert [n for n, m in model.named_modules() if isinstance(m, QuantLinear)] == ["blocks.1.0", "blocks.1.2",
                                                                                  "lm_head"]


def test_quantize_model_keeps_shared_linears_shared(gen):
    shared = linear(64, 64, gen)
    model = nn.ModuleDict({"a": nn.Sequential(shared), "b": nn.Sequential(shared)})
    quantize_model(model, dtype=INT8)
    assert isinstance(model["a"][0], QuantLinear) and model["a"][0] is model["b"][0]


def test_state_dict_round_trip(gen):
    model = quantize_model(Net(gen), dtype=FP8)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    assert {"blocks.0.0.weight", "blocks.0.0.weight_scale_inv", "blocks.0.0.bias"} <= set(model.state_dict())
    fresh = quantize_model(Net(torch.Generator().manual_seed(99)), dtype=FP8)
    buf.seek(0)
    fresh.load_state_dict(torch.load(buf))
    x = randn((3, 160), gen=gen, dtype=torch.bfloat16)
    assert torch.equal(fresh(x), model(x))


class Wrapper(nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer


def hf_checkpoint(path: Path, gen, N=200, K=300, **overrides) -> dict[str, torch.Tensor]:
    """A safetensors file in the DeepSeek-V3 / Hugging Face FP8 layout: e4m3 weight, fp32 scale per 128×128."""
    w, s = ops.weight_quant(randn((N, K), gen=gen) * K**-0.5, dtype=FP8)
    tensors = {"layer.weight": w, "layer.weight_scale_inv": s, "layer.bias": randn((N,), gen=gen).bfloat16()}
    tensors.update(overrides)
    save_file({k: v for k, v in tensors.items() if v is not None}, str(path))
    return tensors


def test_safetensors_checkpoint_in_hf_layout(tmp_path, gen):
    tensors = hf_checkpoint(tmp_path / "model.safetensors", gen)
    model = Wrapper(QuantLinear(300, 200, dtype=FP8))
    assert tuple(load_fp8_checkpoint(model, tmp_path / "model.safetensors")) == ([], [])
    assert torch.equal(model.layer.weight, tensors["layer.weight"])
    assert torch.equal(model.layer.weight_scale_inv, tensors["layer.weight_scale_inv"])
    x = randn((4, 300), gen=gen, dtype=torch.bfloat16)
    expected = ops.act_dequant(*ops.act_quant(x), out_dtype=torch.float32) @ ops.weight_dequant(
        tensors["layer.weight"], tensors["layer.weight_scale_inv"], out_dtype=torch.float32).t()
    assert rel_error(model.layer(x), expected + tensors["layer.bias"].float()) <= 1e-2
    # A directory of shards loads the same way.
    shards = tmp_path / "shards"
    shards.mkdir()
    save_file({"layer.weight": tensors["layer.weight"], "layer.weight_scale_inv": tensors["layer.weight_scale_inv"]},
              str(shards / "model-00001-of-00002.safetensors"))
    save_file({"layer.bias": tensors["layer.bias"]}, str(shards / "model-00002-of-00002.safetensors"))
    again = Wrapper(QuantLinear(300, 200, dtype=FP8))
    load_fp8_checkpoint(again, shards)
    assert torch.equal(again.layer(x), model.layer(x))


@pytest.mark.parametrize("overrides,match", [
    (dict(weight=torch.zeros(200, 300, dtype=torch.bfloat16)),
     r"layer\.weight has dtype bfloat16.*load it into the float model"),
    (dict(weight=torch.zeros(200, 300, dtype=INT8)), r"layer\.weight has dtype int8.*dtype=torch\.int8"),
    (dict(weight=torch.zeros(300, 200, dtype=FP8)), r"layer\.weight has shape \(300, 200\); .*\(200, 300\)"),
    (dict(weight_scale_inv=torch.ones(3, 2)), r"layer\.weight_scale_inv has shape \(3, 2\); .*\(2, 3\)"),
    (dict(weight_scale_inv=torch.ones(2, 3, dtype=torch.bfloat16)), r"layer\.weight_scale_inv has dtype bfloat16"),
    (dict(weight_scale_inv=None), r"has layer\.weight but not layer\.weight_scale_inv"),
])
def test_bad_checkpoint_names_the_key(tmp_path, gen, overrides, match):
    path = tmp_path / "bad.safetensors"
    hf_checkpoint(path, gen, **{f"layer.{k}": v for k, v in overrides.items()})
    with pytest.raises(InvalidInputError, match=match):
        load_fp8_checkpoint(Wrapper(QuantLinear(300, 200, dtype=FP8)), path)


def test_missing_checkpoint_file(tmp_path):
    with pytest.raises(InvalidInputError, match="no safetensors file"):
        load_fp8_checkpoint(Wrapper(QuantLinear(300, 200)), tmp_path / "absent.safetensors")


def test_compiled_with_inductor(gen):
    """A quantized model compiles with the default backend (Inductor's C++ codegen on the CPU) without
    graph breaks; the custom ops stay opaque calls, so the result equals eager."""
    torch._dynamo.reset()
    model = quantize_model(Net(gen), dtype=INT8, skip=())
    x = randn((6, 160), gen=gen, dtype=torch.bfloat16)
    out = torch.compile(model, fullgraph=True)(x)
    assert torch.allclose(out, model(x), rtol=1e-2, atol=1e-2)  # Inductor may fuse the float parts
    torch._dynamo.reset()


def load_example():
    path = Path(__file__).resolve().parents[1] / "examples" / "tiny_transformer.py"
    spec = importlib.util.spec_from_file_location("tiny_transformer", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def example():
    return load_example()


def test_kv_cache_decoding_matches_full_forward(example):
    """Greedy tokens generated step by step against the KV cache are the argmax of a full forward over
    the whole sequence (fp32, where the two computations agree closely)."""
    model = example.Transformer(example.Config(n_layers=2, max_seq_len=64), seed=3).eval()
    prompts = torch.randint(0, 512, (2, 9), generator=torch.Generator().manual_seed(0))
    new = example.generate(model, prompts, 6, temperature=0)
    with torch.inference_mode():
        logits = model(torch.cat([prompts, new[:, :-1]], dim=1))
    assert torch.equal(logits[:, 8:].argmax(-1), new)


def test_gumbel_sampling_is_seeded(example):
    logits = torch.randn(3, 512, generator=torch.Generator().manual_seed(0))
    draw = [example.sample(logits, 1.0, torch.Generator().manual_seed(5)) for _ in range(2)]
    assert torch.equal(*draw)
    assert torch.equal(example.sample(logits, 0.0), logits.argmax(-1))
    # Gumbel-max samples the softmax: a dominant token wins nearly always at temperature 1.
    peaked = torch.zeros(1000, 4)
    peaked[:, 2] = 6.0
    hits = (example.sample(peaked, 1.0, torch.Generator().manual_seed(1)) == 2).float().mean()
    assert abs(hits - torch.softmax(peaked[0], -1)[2]) < 0.02


# Measured on this CPU with these settings (seed 0): FP8 error 0.030, top-1 0.953 (0.92-0.97 over seeds
# 0-5); INT8 error 0.011, top-1 0.984 (0.97-1.0). A random model's logits are flat, so near-ties flip.
EXAMPLE_BOUNDS = {"fp8": (0.04, 0.90), "int8": (0.015, 0.95)}


@pytest.mark.parametrize("dtype", ["fp8", "int8"])
def test_example_runs_on_cpu(example, tmp_path, dtype, capsys):
    out = tmp_path / "tiny.json"
    result = example.main(["--dtype", dtype, "--tokens", "4", "--batch", "4", "--prompt-len", "32",
                           "--layers", "2", "--json", str(out)])
    assert json.loads(out.read_text()) == result
    max_error, min_top1 = EXAMPLE_BOUNDS[dtype]
    assert result["logits_rel_error"] <= max_error and result["top1_agreement"] >= min_top1
    assert result["dtype"] == {"fp8": "float8_e4m3fn", "int8": "int8"}[dtype]
    assert result["implementation"]["decode"]["scaled_mm"] == "torch"
    assert min(result["tokens_per_s"].values()) > 0
    assert "top-1 agreement" in capsys.readouterr().out


def test_layer_keeps_its_plan_and_follows_what_changes(gen, monkeypatch):
    """QuantLinear's own call site (`dispatch.Site`): a repeated call skips validation and selection;
    a new input shape, new parameters (replaced, or loaded with assign=True), an output dtype or a
    priority in force each get a plan of their own; every result is ops.quant_linear's."""
    from quantcore.runtime import dispatch, plans

    layer = QuantLinear.from_linear(linear(256, 40, gen), dtype=FP8)
    planned = []  # the calls that went through the dispatcher's key
    real = dispatch._plan
    monkeypatch.setattr(dispatch, "_plan", lambda *a: planned.append(a[0]) or real(*a))

    def check(x):
        expected = ops.quant_linear(x, layer.weight, layer.weight_scale_inv, layer.bias, out_dtype=x.dtype)
        assert torch.equal(layer(x), expected)

    x = randn((2, 1, 256), gen=gen, dtype=torch.bfloat16)
    layer(x)
    planned.clear()
    for _ in range(3):
        layer(randn((2, 1, 256), gen=gen, dtype=torch.bfloat16))
    assert planned == []  # the site's plan, without the dispatcher's key
    check(randn((2, 1, 256), gen=gen, dtype=torch.bfloat16))
    check(randn((5, 256), gen=gen, dtype=torch.bfloat16))  # new shape
    check(randn((5, 256), gen=gen, dtype=torch.float32))  # new dtype, so a new output dtype
    other = QuantLinear.from_linear(linear(256, 40, torch.Generator().manual_seed(5)), dtype=FP8)
    layer.load_state_dict(other.state_dict(), assign=True)  # new parameters in the same module
    check(x)
    assert torch.equal(layer(x), other(x))
    layer.weight = other.weight  # a parameter replaced by hand
    check(x)
    with quantcore.priority("torch"):
        check(x)
    planned.clear()
    layer(x)
    layer(x)
    assert planned == ["quant_linear"]  # back to the default priority: planned once more, then kept


def test_layer_with_its_kept_plan_copies_and_pickles(gen):
    import copy
    import pickle

    layer = QuantLinear.from_linear(linear(256, 40, gen), dtype=INT8)
    x = randn((3, 256), gen=gen, dtype=torch.bfloat16)
    y = layer(x)
    for twin in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert torch.equal(twin(x), y)
