"""Mixture-of-experts checkpoints: folders storing experts per expert (DeepSeek-V3, Qwen3-MoE) or stacked,
loaded into `QuantExperts` (built so, or replacing transformers-style stacked float experts) bit for bit and
shard by shard; `save_checkpoint` writing them per expert; `quantize_model` converting stacked experts."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from torch import nn

from helpers import randn
from quantcore import InvalidInputError
from quantcore.nn import (QuantExperts, QuantLinear, load_checkpoint, quantize_from_config, quantize_model,
                          save_checkpoint)
from quantcore.nn.expert_files import ExpertsLoad
from test_checkpoint import DEEPSEEK, codes, compressed_tensors_config, write_folder

FP8 = torch.float8_e4m3fn
E, H, I, TOP = 4, 256, 128, 2
EXPERTS = "model.layers.0.mlp.experts"


class StackedExperts(nn.Module):
    """transformers (>= 5)'s experts module as Qwen3MoeExperts has it: stacked float parameters, act_fn."""

    def __init__(self, num_experts=E, hidden=H, inner=I):
        super().__init__()
        gen = torch.Generator().manual_seed(7)  # on the meta device the parameters stay empty
        self.gate_up_proj = nn.Parameter(torch.randn(num_experts, 2 * inner, hidden, generator=gen) * hidden ** -0.5)
        self.down_proj = nn.Parameter(torch.randn(num_experts, hidden, inner, generator=gen) * inner ** -0.5)
        self.act_fn = nn.SiLU()

    def forward(self, x, topk_ids, topk_weights):
        out = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for j in range(topk_ids.shape[1]):
                e = int(topk_ids[t, j])
                gate, up = (self.gate_up_proj[e] @ x[t]).chunk(2)
                out[t] += topk_weights[t, j] * (self.down_proj[e] @ (self.act_fn(gate) * up))
        return out


class MoE(nn.Module):
    """A DeepSeek-shaped decoder block's MLP: a float router, the experts, a quantizable shared expert."""

    def __init__(self, experts: nn.Module):
        super().__init__()
        self.model = nn.Module()
        self.model.layers = nn.ModuleList([nn.Module()])
        mlp = self.model.layers[0].mlp = nn.Module()
        mlp.gate = nn.Linear(H, E, bias=False)
        mlp.experts = experts
        mlp.shared = nn.Linear(H, H, bias=False)

    def forward(self, x):
        mlp = self.model.layers[0].mlp
        weights, ids = torch.topk(mlp.gate(x).float().softmax(-1), TOP)
        return mlp.experts(x, ids, weights.to(x.dtype)) + mlp.shared(x)


def expert_mlp(make=lambda n_in, n_out: nn.Linear(n_in, n_out, bias=False), inner=I) -> nn.Module:
    """One expert as DeepSeek-V3's modeling code keeps it: gate_proj, up_proj (H -> I), down_proj (I -> H)."""
    mlp = nn.Module()
    mlp.gate_proj, mlp.up_proj, mlp.down_proj = make(H, inner), make(H, inner), make(inner, H)
    return mlp


def float_weights(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return randn((E, 2 * I, H), gen=gen) * H ** -0.5, randn((E, H, I), gen=gen) * I ** -0.5


def quantized_moe(seed=0, **kwargs) -> MoE:
    gate_up, down = float_weights(seed)
    model = MoE(QuantExperts.from_stacked(gate_up, down, dtype=FP8, **kwargs))
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for linear in (model.model.layers[0].mlp.gate, model.model.layers[0].mlp.shared):
            linear.weight.copy_(randn(tuple(linear.weight.shape), gen=gen) * H ** -0.5)
    return quantize_model(model, dtype=FP8, skip=("gate",))


def per_expert_tensors(layer: QuantExperts, scale_leaf="weight_scale_inv", scale_dtype=torch.float32):
    """The experts as DeepSeek-V3's files store them: per expert, gate and up apart, a scale beside each."""
    out = {}
    blocks = I // layer.block_size[0]
    for e in range(E):
        for proj, (w, s) in {"gate_proj": (layer.gate_up_proj[e, :I], layer.gate_up_proj_scale_inv[e, :blocks]),
                             "up_proj": (layer.gate_up_proj[e, I:], layer.gate_up_proj_scale_inv[e, blocks:]),
                             "down_proj": (layer.down_proj[e], layer.down_proj_scale_inv[e])}.items():
            out[f"{EXPERTS}.{e}.{proj}.weight"] = w.clone()
            out[f"{EXPERTS}.{e}.{proj}.{scale_leaf}"] = s.to(scale_dtype).clone()
    return out


def source_tensors(model: MoE, experts=per_expert_tensors) -> dict[str, torch.Tensor]:
    state = {k: v for k, v in model.state_dict().items() if ".experts." not in k}
    return state | experts(model.model.layers[0].mlp.experts)


def assert_same_experts(loaded: nn.Module, source: QuantExperts):
    assert isinstance(loaded, QuantExperts)
    assert (loaded.num_experts, loaded.hidden_size, loaded.intermediate_size, loaded.block_size) == \
        (source.num_experts, source.hidden_size, source.intermediate_size, source.block_size)
    for name in loaded.quant_params():
        got, want = getattr(loaded, name), getattr(source, name)
        assert got.dtype == want.dtype and not got.is_meta and not got.requires_grad, name
        assert torch.equal(codes(got) if got.dtype == FP8 else got, codes(want) if want.dtype == FP8 else want), name


def meta_moe(experts=lambda: QuantExperts(E, H, I, dtype=FP8)) -> MoE:
    with torch.device("meta"):
        return MoE(experts())


@pytest.mark.parametrize("experts", [lambda: QuantExperts(E, H, I, dtype=FP8), StackedExperts],
                         ids=["quant-experts", "stacked-float-experts"])
def test_a_deepseek_style_folder_loads_per_expert_tensors_bit_for_bit(tmp_path, experts):
    """Per-expert tensors dealt over three shards (a projection's weight and scale in different ones) load
    into the QuantExperts, or into one replacing the stacked float experts; the forward is the source's."""
    source = quantized_moe()
    folder = write_folder(tmp_path, source_tensors(source), DEEPSEEK)
    model = meta_moe(experts)
    assert load_checkpoint(model, folder) == ([], [])
    assert_same_experts(model.model.layers[0].mlp.experts, source.model.layers[0].mlp.experts)
    assert isinstance(model.model.layers[0].mlp.shared, QuantLinear)
    x = randn((5, H), gen=torch.Generator().manual_seed(3))
    assert torch.equal(model(x), source(x))


def test_a_float_model_on_the_cpu_is_loaded_in_place(tmp_path):
    """Without the meta device the layer's existing parameters are written slice by slice."""
    source = quantized_moe()
    folder = write_folder(tmp_path, source_tensors(source), DEEPSEEK)
    model = MoE(StackedExperts())
    load_checkpoint(model, folder)
    assert_same_experts(model.model.layers[0].mlp.experts, source.model.layers[0].mlp.experts)


def test_compressed_tensors_scales_and_e8m0_scales_load(tmp_path):
    source = quantized_moe(scale_fmt="ue8m0")
    experts = source.model.layers[0].mlp.experts
    tensors = source_tensors(source, lambda layer: per_expert_tensors(layer, "weight_scale", torch.bfloat16))
    tensors = {k.replace("weight_scale_inv", "weight_scale"): v for k, v in tensors.items()}
    folder = write_folder(tmp_path / "ct", tensors, compressed_tensors_config(ignore=["re:.*gate$"]))
    model = meta_moe(lambda: QuantExperts(E, H, I, dtype=FP8))
    load_checkpoint(model, folder)
    assert_same_experts(model.model.layers[0].mlp.experts, experts)
    e8m0 = source_tensors(source, lambda layer: per_expert_tensors(layer, scale_dtype=torch.float8_e8m0fnu))
    folder = write_folder(tmp_path / "e8m0", e8m0, DEEPSEEK | {"scale_fmt": "ue8m0"})
    model = meta_moe(StackedExperts)
    load_checkpoint(model, folder)
    assert_same_experts(model.model.layers[0].mlp.experts, experts)
    assert model.model.layers[0].mlp.experts.scale_fmt == "ue8m0"


def test_stacked_expert_tensors_load(tmp_path):
    """A folder holding the stacked parameters (QuantExperts' and transformers' FP8 experts' names)."""
    source = quantized_moe()
    folder = write_folder(tmp_path, dict(source.state_dict()), DEEPSEEK, shards=2)
    model = meta_moe(StackedExperts)
    assert load_checkpoint(model, folder) == ([], [])
    assert_same_experts(model.model.layers[0].mlp.experts, source.model.layers[0].mlp.experts)
    state = load_checkpoint(None, folder)  # as a state dict: the layer's names and dtypes
    assert state.keys() == source.state_dict().keys()
    assert torch.equal(state[f"{EXPERTS}.down_proj_scale_inv"], source.model.layers[0].mlp.experts.down_proj_scale_inv)


def test_experts_are_read_one_shard_at_a_time(tmp_path, monkeypatch):
    """Each expert tensor is copied into the layer as its shard is read, shard after shard, once."""
    source = quantized_moe()
    tensors = source_tensors(source)
    folder = write_folder(tmp_path, tensors, DEEPSEEK, shards=4)
    shard_of = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    puts = []
    original = ExpertsLoad.put
    monkeypatch.setattr(ExpertsLoad, "put", lambda self, name, t: (puts.append(name), original(self, name, t)))
    load_checkpoint(meta_moe(), folder)
    assert sorted(puts) == sorted(n for n in tensors if ".experts." in n)
    order = [shard_of[n] for n in puts]
    assert order == sorted(order)


def test_a_model_whose_experts_are_separate_mlps_gets_a_quant_linear_per_projection(tmp_path):
    source = quantized_moe()
    folder = write_folder(tmp_path, source_tensors(source), DEEPSEEK)
    mlps = nn.ModuleList([expert_mlp() for _ in range(E)])
    model = MoE(mlps)
    load_checkpoint(model, folder)
    layer = source.model.layers[0].mlp.experts
    assert isinstance(mlps[3].up_proj, QuantLinear)
    assert torch.equal(codes(mlps[3].up_proj.weight), codes(layer.gate_up_proj[3, I:]))


def test_missing_and_surplus_experts_are_named(tmp_path):
    source = quantized_moe()
    tensors = source_tensors(source)
    del tensors[f"{EXPERTS}.2.up_proj.weight_scale_inv"]
    folder = write_folder(tmp_path / "missing", tensors, DEEPSEEK)
    with pytest.raises(InvalidInputError, match=r"missing model\.layers\.0\.mlp\.experts\.gate_up_proj"):
        load_checkpoint(meta_moe(), folder)
    loaded = load_checkpoint(meta_moe(), folder, strict=False)
    assert f"{EXPERTS}.gate_up_proj_scale_inv" in loaded.missing_keys
    assert f"{EXPERTS}.down_proj" not in loaded.missing_keys
    surplus = write_folder(tmp_path / "surplus", source_tensors(source), DEEPSEEK)
    with pytest.raises(InvalidInputError, match="experts up to 3 .* whose layer has 2; build it with num_experts=4"):
        load_checkpoint(meta_moe(lambda: QuantExperts(2, H, I, dtype=FP8)), surplus)


@pytest.mark.parametrize("experts,match", [
    (lambda: QuantExperts(E, H, 2 * I, dtype=FP8), r"gate_proj\.weight is float8_e4m3fn \(128, 256\); .* takes "
                                                   r"float8_e4m3fn \(256, 256\)"),
    (lambda: QuantExperts(E, H, I, dtype=FP8, block_size=(64, 128)), "build it so"),
    (lambda: QuantExperts(E, H, I, dtype=torch.int8), "float8_e4m3fn"),
])
def test_a_layer_that_does_not_match_the_checkpoint_is_named(tmp_path, experts, match):
    folder = write_folder(tmp_path, source_tensors(quantized_moe()), DEEPSEEK)
    with pytest.raises(InvalidInputError, match=match):
        load_checkpoint(meta_moe(experts), folder)


def test_a_non_finite_expert_scale_is_named(tmp_path):
    tensors = source_tensors(quantized_moe())
    tensors[f"{EXPERTS}.1.down_proj.weight_scale_inv"][1, 0] = float("nan")
    folder = write_folder(tmp_path, tensors, DEEPSEEK)
    with pytest.raises(InvalidInputError, match=r"experts\.1\.down_proj\.weight_scale_inv holds 1 value"):
        load_checkpoint(meta_moe(), folder)


def test_save_writes_experts_per_expert_and_loads_back(tmp_path):
    source = quantized_moe()
    folder = save_checkpoint(source, tmp_path / "out", max_shard_size="300KB")
    names = set(json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"])
    assert set(per_expert_tensors(source.model.layers[0].mlp.experts)) <= names
    assert not any(n.endswith(("gate_up_proj", "down_proj")) for n in names)
    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    assert config["weight_block_size"] == [128, 128]
    for file in folder.glob("*.safetensors"):
        with safe_open(str(file), "pt") as f:
            for name in f.keys():
                if name.endswith(".weight") and ".experts." in name:
                    assert f.get_tensor(name).dtype == FP8
    model = meta_moe(StackedExperts)
    assert load_checkpoint(model, folder) == ([], [])
    assert_same_experts(model.model.layers[0].mlp.experts, source.model.layers[0].mlp.experts)


def test_save_refuses_experts_whose_gate_and_up_share_blocks(tmp_path):
    gate_up, down = randn((2, 2 * 96, H)), randn((2, H, 96))
    model = MoE(QuantExperts.from_stacked(gate_up, down, dtype=FP8))
    with pytest.raises(InvalidInputError, match=r"I = 96.*share blocks"):
        save_checkpoint(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_quantize_model_converts_stacked_experts_and_keeps_their_forward():
    torch.manual_seed(0)  # the router's and the shared expert's initial weights
    gate_up, down = float_weights()
    experts = StackedExperts()
    with torch.no_grad():
        experts.gate_up_proj.copy_(gate_up)
        experts.down_proj.copy_(down)
    model = MoE(experts)
    x = randn((6, H), gen=torch.Generator().manual_seed(5))
    reference = model(x)
    quantize_model(model, dtype=FP8, skip=("gate",))
    layer = model.model.layers[0].mlp.experts
    assert isinstance(layer, QuantExperts) and layer.activation == "silu"
    assert torch.equal(layer.gate_up_proj, QuantExperts.from_stacked(gate_up, down, dtype=FP8).gate_up_proj)
    error = (model(x) - reference).norm() / reference.norm()
    assert error < 0.1  # FP8 weights and activations (3 mantissa bits) in two GEMMs against the float experts
    skipped = MoE(StackedExperts())
    quantize_model(skipped, dtype=FP8, skip=("experts",))
    assert isinstance(skipped.model.layers[0].mlp.experts, StackedExperts)


def test_experts_quantcore_cannot_compute_are_refused_by_name():
    clamped = StackedExperts()
    clamped.limit = 7.0
    with pytest.raises(InvalidInputError, match="StackedExperts has limit; .* keep it in floating point"):
        quantize_model(MoE(clamped), dtype=FP8)
    odd = StackedExperts()
    odd.act_fn = nn.ReLU()
    with pytest.raises(InvalidInputError, match="act_fn is ReLU"):
        QuantExperts.from_module(odd)
    gelu = StackedExperts()
    gelu.act_fn = nn.GELU(approximate="tanh")
    assert QuantExperts.from_module(gelu, dtype=FP8).activation == "gelu_tanh"


def test_transformers_reads_the_experts_quantcore_writes_and_quantcore_reads_them_back(tmp_path):
    """A transformers Qwen3-MoE model quantized by quantize_model (its stacked experts become QuantExperts)
    and saved: transformers loads the folder (on a CPU, dequantized to bf16) with each expert's weights
    equal to quantcore's dequantized ones; load_checkpoint into a fresh model gives the same logits."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # transformers' FP8 loader needs it
    if not hasattr(transformers, "Qwen3MoeConfig") or int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip("transformers >= 5 stacks the experts (4.x keeps a module per expert)")
    config = transformers.Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=I, intermediate_size=2 * H,
                                         num_experts=E, num_experts_per_tok=TOP, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=128, vocab_size=64,
                                         tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(config).to(torch.bfloat16).eval()
    quantize_model(model, dtype=FP8, skip=("lm_head", "gate"))
    experts = model.model.layers[0].mlp.experts
    assert isinstance(experts, QuantExperts)
    folder = save_checkpoint(model, tmp_path / "out", config=config.to_dict())
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).model.layers[0].mlp
    gate_up, down = experts.dequantized(torch.bfloat16)
    assert torch.equal(theirs.experts.gate_up_proj, gate_up) and torch.equal(theirs.experts.down_proj, down)
    torch.manual_seed(1)  # other weights, replaced by the load (on the meta device its rotary buffer stays empty)
    fresh = transformers.Qwen3MoeForCausalLM(config).to(torch.bfloat16).eval()
    load_checkpoint(fresh, folder)
    tokens = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        assert torch.equal(fresh(tokens).logits, model(tokens).logits)


def test_quantize_from_config_converts_the_experts_its_rules_quantize():
    model = MoE(StackedExperts())
    quantize_from_config(model, DEEPSEEK | {"weight_block_size": [128, 64], "modules_to_not_convert": ["gate"]})
    experts = model.model.layers[0].mlp.experts
    assert isinstance(experts, QuantExperts) and experts.block_size == (128, 64)
    assert isinstance(model.model.layers[0].mlp.shared, QuantLinear) and isinstance(model.model.layers[0].mlp.gate,
                                                                                    nn.Linear)
    kept = MoE(StackedExperts())
    quantize_from_config(kept, DEEPSEEK | {"modules_to_not_convert": ["gate", "model.layers.0.mlp.experts"]})
    assert isinstance(kept.model.layers[0].mlp.experts, StackedExperts)
    with torch.device("meta"):
        empty = MoE(StackedExperts())
    quantize_from_config(empty, DEEPSEEK)
    assert empty.model.layers[0].mlp.experts.gate_up_proj.is_meta


def test_mixtral_style_expert_names_load(tmp_path):
    """MiniMax-M2's and Mixtral's per-expert names: w1 the gate, w3 the up, w2 the down projection."""
    source = quantized_moe()
    renamed = {".gate_proj.": ".w1.", ".up_proj.": ".w3.", ".down_proj.": ".w2."}

    def mixtral(name: str) -> str:
        for old, new in renamed.items():
            name = name.replace(old, new)
        return name
    tensors = {mixtral(k) if ".experts." in k else k: v for k, v in source_tensors(source).items()}
    assert f"{EXPERTS}.3.w3.weight" in tensors
    model = meta_moe()
    assert load_checkpoint(model, write_folder(tmp_path / "w", tensors, DEEPSEEK)) == ([], [])
    assert_same_experts(model.model.layers[0].mlp.experts, source.model.layers[0].mlp.experts)
    mixed = dict(tensors)
    mixed[f"{EXPERTS}.0.up_proj.weight"] = mixed.pop(f"{EXPERTS}.0.w3.weight")
    mixed[f"{EXPERTS}.0.up_proj.weight_scale_inv"] = mixed.pop(f"{EXPERTS}.0.w3.weight_scale_inv")
    with pytest.raises(InvalidInputError, match="both gate_proj/up_proj/down_proj and w1/w3/w2 names"):
        load_checkpoint(meta_moe(), write_folder(tmp_path / "mixed", mixed, DEEPSEEK))


def test_from_experts_stacks_quant_linears_bit_for_bit(tmp_path):
    """A model that keeps a module per expert loads a per-expert checkpoint as QuantLinears; from_experts stacks
    them as they are: the same codes and scales as quantizing the float experts stacked (I = 128 is a whole
    number of blocks, so gate and up never share one)."""
    gate_up, down = float_weights()
    mlps = nn.ModuleList()
    for e in range(E):
        mlp = expert_mlp()
        with torch.no_grad():
            mlp.gate_proj.weight.copy_(gate_up[e, :I])
            mlp.up_proj.weight.copy_(gate_up[e, I:])
            mlp.down_proj.weight.copy_(down[e])
        mlps.append(mlp)
    expected = QuantExperts.from_experts(mlps, dtype=FP8)
    quantize_model(mlps, dtype=FP8)
    assert isinstance(mlps[0].up_proj, QuantLinear)
    assert_same_experts(QuantExperts.from_experts(mlps), expected)
    with pytest.raises(InvalidInputError, match="projections are of several kinds"):
        QuantExperts.from_experts([mlps[0], expert_mlp()])
    odd = expert_mlp(lambda n_in, n_out: QuantLinear(n_in, n_out, False, dtype=FP8), inner=96)
    with pytest.raises(InvalidInputError, match="I = 96 rows, not a whole number of their 128-row blocks"):
        QuantExperts.from_experts([odd])


def test_a_deepseek_v3_model_quantizes_saves_and_loads_back(tmp_path):
    """transformers' DeepSeek-V3 (a dense first layer, then routed experts + a shared expert), tiny: quantize_model
    gives its experts QuantExperts, save_checkpoint writes it, transformers reads it, and load_checkpoint into a
    fresh model gives the same logits bit for bit."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    if not hasattr(transformers, "DeepseekV3Config") or int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip("transformers >= 5 stacks the experts")
    config = transformers.DeepseekV3Config(
        hidden_size=H, intermediate_size=2 * H, moe_intermediate_size=I, n_routed_experts=8, num_experts_per_tok=2,
        n_shared_experts=1, num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=2, num_key_value_heads=2,
        q_lora_rank=128, kv_lora_rank=128, qk_nope_head_dim=64, qk_rope_head_dim=64, v_head_dim=64, vocab_size=64,
        n_group=2, topk_group=1, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(config).to(torch.bfloat16).eval()
    # kv_a_proj_with_mqa's 128 + 64 rows are no whole number of blocks, which transformers refuses to load
    quantize_model(model, dtype=FP8, skip=("lm_head", "gate", "kv_a_proj_with_mqa"))
    assert isinstance(model.model.layers[1].mlp.experts, QuantExperts)
    folder = save_checkpoint(model, tmp_path / "ds", config=config.to_dict())
    transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    torch.manual_seed(1)
    fresh = transformers.DeepseekV3ForCausalLM(config).to(torch.bfloat16).eval()
    assert load_checkpoint(fresh, folder) == ([], [])
    tokens = torch.tensor([[1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        assert torch.equal(fresh(tokens).logits, model(tokens).logits)
