"""quantcore.nn checkpoints: Hugging Face folders (config.json + safetensors shards + index) in the
DeepSeek-V3 / transformers `fp8` flavour and the compressed-tensors FP8_BLOCK flavour, written here with
safetensors directly and by `save_checkpoint`, loaded bit-exactly by `load_checkpoint`; the config's
skip rules; `SafetensorsFiles`; and, where transformers / compressed-tensors are installed, those
libraries reading quantcore's output."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from helpers import randn
from quantcore import InvalidInputError, ops
from quantcore.nn import (CompressedTensorsScheme, Fp8Scheme, LayerFormat, QuantLinear, SafetensorsFiles,
                          load_checkpoint, load_fp8_checkpoint, quantize_from_config, quantize_model, save_checkpoint,
                          scale_to_fp32, scheme_from_config)
from quantcore.nn.schemes import compressed_tensors_matches, transformers_skips

FP8, E8M0 = torch.float8_e4m3fn, torch.float8_e8m0fnu
LINEARS = ("model.layers.0.up", "model.layers.0.down", "model.layers.1.up", "model.layers.1.down")


class Tiny(nn.Module):
    """A decoder-shaped toy: embedding, two blocks of up/down linears (with biases), a norm and an
    output head; dims are whole 128-blocks unless `hidden` says otherwise."""

    def __init__(self, hidden=256, inner=384, vocab=64):
        super().__init__()
        self.model = nn.Module()
        self.model.embed = nn.Embedding(vocab, hidden)
        self.model.layers = nn.ModuleList()
        for _ in range(2):
            block = nn.Module()
            block.up, block.down = nn.Linear(hidden, inner), nn.Linear(inner, hidden)
            self.model.layers.append(block)
        self.model.norm = nn.Parameter(torch.ones(hidden))
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens):
        x = self.model.embed(tokens)
        for block in self.model.layers:
            x = x + block.down(torch.relu(block.up(x)))
        return self.lm_head(x * self.model.norm)


def float_model(seed=0, **dims) -> Tiny:
    gen = torch.Generator().manual_seed(seed)
    model = Tiny(**dims)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(randn(tuple(p.shape), gen=gen) * p.shape[-1] ** -0.5)
    return model.bfloat16().requires_grad_(False)


def meta_model(**dims) -> Tiny:
    with torch.device("meta"):
        return Tiny(**dims).bfloat16()


def quantized_tensors(model: Tiny, layers=LINEARS, scale_fmt="fp32") -> dict[str, torch.Tensor]:
    """The float model's state dict with `layers` quantized by ops.weight_quant (128x128, e4m3)."""
    state = dict(model.state_dict())
    for name in layers:
        state[f"{name}.weight"], state[f"{name}.weight_scale_inv"] = ops.weight_quant(
            state[f"{name}.weight"].float(), dtype=FP8, scale_fmt=scale_fmt)
    return state


def write_folder(folder: Path, tensors: dict[str, torch.Tensor], quantization_config: dict, shards=3) -> Path:
    """A checkpoint folder as the ecosystem writes it: tensors dealt round-robin over `shards` files (so a
    layer's weight and its scale land in different shards), the index, and config.json."""
    folder.mkdir(parents=True, exist_ok=True)
    files = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    parts: list[dict] = [{} for _ in files]
    weight_map = {}
    for i, (name, t) in enumerate(tensors.items()):
        parts[i % shards][name] = t.contiguous()
        weight_map[name] = files[i % shards]
    for file, part in zip(files, parts):
        save_file(part, str(folder / file), metadata={"format": "pt"})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps({"model_type": "tiny", "quantization_config": quantization_config}))
    return folder


DEEPSEEK = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]}


def compressed_tensors_config(ignore=("lm_head",), block=(128, 128), **overrides) -> dict:
    """What llm-compressor writes for the FP8_BLOCK scheme (`overrides`: top-level keys)."""
    group = {"targets": ["Linear"],
             "weights": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "block",
                         "block_structure": list(block), "dynamic": False, "group_size": None, "actorder": None,
                         "observer": "minmax", "observer_kwargs": {}},
             "input_activations": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "group",
                                   "group_size": block[1], "dynamic": True, "observer": None,
                                   "observer_kwargs": {}},
             "output_activations": None}
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": group}, "ignore": list(ignore), "kv_cache_scheme": None} | overrides


def codes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)  # compares FP8 codes bit for bit (NaN codes included)


def assert_loaded(model: Tiny, tensors: dict[str, torch.Tensor], quantized=LINEARS, scale_fmt="fp32"):
    """Every layer the checkpoint quantizes is a QuantLinear holding exactly its codes and scales; the
    rest equals the checkpoint; nothing is left on the meta device; quantized parameters are frozen."""
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, QuantLinear)) and name:
            assert isinstance(module, QuantLinear) == (name in quantized), name
    for name in quantized:
        layer = model.get_submodule(name)
        assert layer.block_size == (128, 128) and layer.scale_fmt == scale_fmt and layer.out_dtype is None
        assert torch.equal(codes(layer.weight), codes(tensors[f"{name}.weight"]))
        assert layer.weight_scale_inv.dtype == torch.float32
        assert torch.equal(layer.weight_scale_inv, scale_to_fp32(tensors[f"{name}.weight_scale_inv"]))
        assert not layer.weight.requires_grad and not layer.weight_scale_inv.requires_grad
    state = model.state_dict()
    for name, t in tensors.items():
        if not name.endswith(("weight_scale_inv", "weight_scale")) and t.dtype != FP8:
            assert torch.equal(state[name], t), name
    assert not any(t.is_meta for t in (*model.parameters(), *model.buffers()))


@pytest.mark.parametrize("scale_fmt", ["fp32", "ue8m0"])
def test_deepseek_fp8_folder_loads_bit_exactly_from_meta(tmp_path, scale_fmt):
    """A DeepSeek-V3-style folder: 128x128 e4m3 weights with fp32 `weight_scale_inv` (ue8m0 ones stored as
    float8_e8m0fnu, as V4-style checkpoints do), a bf16 output head the config does not name (transformers'
    default keeps lm_head in float), and weights split from their scales across three shards. A model
    built on the meta device is converted and materialised by assignment, and computes what quantize_model
    computes."""
    source = float_model()
    tensors = quantized_tensors(source, scale_fmt=scale_fmt)
    stored = dict(tensors)
    if scale_fmt == "ue8m0":
        stored = {k: v.to(E8M0) if k.endswith("weight_scale_inv") else v for k, v in tensors.items()}
    write_folder(tmp_path, stored, DEEPSEEK | ({"scale_fmt": "ue8m0"} if scale_fmt == "ue8m0" else {}))
    model = meta_model()
    assert load_checkpoint(model, tmp_path) == ([], [])
    assert_loaded(model, tensors, scale_fmt=scale_fmt)
    reference = quantize_model(float_model(), dtype=FP8, scale_fmt=scale_fmt)
    tokens = torch.tensor([[1, 5, 9, 63]])
    assert torch.equal(model(tokens), reference(tokens))


@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.bfloat16, E8M0])
def test_compressed_tensors_folder_loads_bit_exactly(tmp_path, scale_dtype):
    """llm-compressor's FP8_BLOCK layout: `weight_scale` in the model's dtype (bf16), fp32 or ue8m0; an
    `ignore` list with an exact name and a `re:` regex. Power-of-two scales, so every dtype holds them."""
    source = float_model()
    tensors = quantized_tensors(source, layers=LINEARS[:3], scale_fmt="ue8m0")
    stored = {(k[:-len("_inv")] if k.endswith("weight_scale_inv") else k): (v.to(scale_dtype) if "scale" in k else v)
              for k, v in tensors.items()}
    write_folder(tmp_path, stored, compressed_tensors_config(ignore=("lm_head", r"re:.*layers\.1\.down$")))
    model = meta_model()
    load_checkpoint(model, tmp_path)
    assert_loaded(model, tensors, quantized=LINEARS[:3])


def test_copy_into_an_existing_model_on_its_device(tmp_path):
    """A model with real tensors is loaded by copying (assign=False): converted QuantLinears keep the
    linears' bias dtype, and the float tensors take the model's dtype."""
    tensors = quantized_tensors(float_model())
    write_folder(tmp_path, tensors, DEEPSEEK)
    model = float_model(seed=5).float()
    load_checkpoint(model, tmp_path)
    assert model.model.layers[0].up.bias.dtype == torch.float32 and model.lm_head.weight.dtype == torch.float32
    assert torch.equal(model.lm_head.weight, tensors["lm_head.weight"].float())
    assert torch.equal(codes(model.model.layers[1].down.weight), codes(tensors["model.layers.1.down.weight"]))


def test_load_streams_one_shard_at_a_time(tmp_path, monkeypatch):
    """Each load_state_dict call holds one shard's tensors, plus a layer's weight or scale kept back
    until its partner's shard is read; every tensor is loaded once."""
    tensors = quantized_tensors(float_model())
    write_folder(tmp_path, tensors, DEEPSEEK, shards=3)
    shard_of = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    model = meta_model()
    chunks = []
    original = nn.Module.load_state_dict

    def record(self, state_dict, *args, **kwargs):
        chunks.append(set(state_dict))
        return original(self, state_dict, *args, **kwargs)

    monkeypatch.setattr(nn.Module, "load_state_dict", record)
    load_checkpoint(model, tmp_path)
    assert len(chunks) == 4  # three shards and the final flush
    assert sorted(k for c in chunks for k in c) == sorted(tensors)
    for chunk in chunks[:3]:
        kept_back = {k for k in chunk if k.endswith(("weight", "weight_scale_inv")) and k.rsplit(".", 1)[0] in LINEARS}
        assert len({shard_of[k] for k in chunk - kept_back}) <= 1


def test_state_dict_without_a_model(tmp_path):
    tensors = quantized_tensors(float_model(), layers=LINEARS[:1])
    stored = {k.replace("weight_scale_inv", "weight_scale"): v for k, v in tensors.items()}
    write_folder(tmp_path, stored, compressed_tensors_config(ignore=LINEARS[1:] + ("lm_head",)))
    state = load_checkpoint(None, tmp_path)
    assert set(state) == set(tensors)
    assert all(torch.equal(codes(state[k]) if v.dtype == FP8 else state[k], codes(v) if v.dtype == FP8 else v)
               for k, v in tensors.items())


@pytest.mark.parametrize("pattern,name,skipped", [
    ("lm_head", "lm_head", True),
    ("lm_head", "model.lm_head", True),                  # a suffix
    ("model.layers.1", "model.layers.1.up", True),       # a prefix up to a module boundary
    ("model.layers.1", "model.layers.11.up", False),
    ("mlp.gate", "model.layers.0.mlp.gate_proj", False),
    (r"model\.layers\.\d+\.down", "model.layers.7.down", True),  # a regex from the start
    ("layers.1", "model.layers.1.up", False),            # neither from the start nor a suffix
])
def test_transformers_skip_rules(pattern, name, skipped):
    assert transformers_skips(name, (pattern,)) == skipped


def test_compressed_tensors_target_rules():
    assert compressed_tensors_matches("model.layers.0.up", "Linear")
    assert compressed_tensors_matches("model.layers.0.up", "model.layers.0.up")
    assert not compressed_tensors_matches("model.layers.0.up", "layers.0.up")  # exact names only
    assert compressed_tensors_matches("model.layers.0.up", r"re:.*\.up$")
    assert not compressed_tensors_matches("model.layers.0.up", "re:up")  # re.match anchors at the start


def test_modules_to_not_convert_and_a_disagreeing_config(tmp_path):
    """Layers the config keeps in float stay nn.Linear; a layer the files store quantized but the config
    excludes is an error naming it."""
    float_layers = ("model.layers.1.up", "model.layers.1.down")
    tensors = quantized_tensors(float_model(), layers=LINEARS[:2])
    write_folder(tmp_path / "ok", tensors, DEEPSEEK | {"modules_to_not_convert": ["model.layers.1", "lm_head"]})
    model = meta_model()
    load_checkpoint(model, tmp_path / "ok")
    assert_loaded(model, tensors, quantized=LINEARS[:2])
    assert all(type(model.get_submodule(n)) is nn.Linear for n in float_layers)
    write_folder(tmp_path / "bad", tensors, DEEPSEEK | {"modules_to_not_convert": ["model.layers.0.down"]})
    with pytest.raises(InvalidInputError, match=r"model\.layers\.0\.down\.weight is stored block-quantized .* "
                                                "disagree"):
        load_checkpoint(meta_model(), tmp_path / "bad")


@pytest.mark.parametrize("fmt", ["fp8", "compressed-tensors"])
def test_save_and_load_round_trip(tmp_path, fmt):
    """save_checkpoint writes size-limited shards, the index and config.json; load_checkpoint reads them
    back into a meta model bit for bit, the output head (kept in float) included."""
    model = quantize_model(float_model(), dtype=FP8)
    folder = save_checkpoint(model, tmp_path / "out", format=fmt, config={"model_type": "tiny"},
                             max_shard_size="200KB")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) >= 3 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    scale = "weight_scale_inv" if fmt == "fp8" else "weight_scale"
    assert set(index["weight_map"]) == {k.replace("weight_scale_inv", scale) for k in model.state_dict()}
    total = 0
    for file in files:
        with safe_open(str(folder / file), "pt") as f:
            assert f.metadata() == {"format": "pt"}
            sizes = [f.get_tensor(k).nbytes for k in f.keys()]
        assert sum(sizes) <= 200_000 or len(sizes) == 1
        total += sum(sizes)
    assert index["metadata"]["total_size"] == total
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "tiny"
    qc = config["quantization_config"]
    assert qc["quant_method"] == fmt
    assert scheme_from_config(qc).layer("model.layers.0.up") == LayerFormat((128, 128))
    assert scheme_from_config(qc).layer("lm_head") is None
    if fmt == "fp8":
        assert qc["weight_block_size"] == [128, 128] and qc["modules_to_not_convert"] == ["lm_head"]
        assert qc["ignored_layers"] == ["lm_head"] and qc["activation_scheme"] == "dynamic"
    else:
        group = qc["config_groups"]["group_0"]
        assert group["targets"] == ["Linear"] and qc["ignore"] == ["lm_head"]
        assert group["weights"]["block_structure"] == [128, 128] and group["weights"]["strategy"] == "block"
        assert group["input_activations"]["group_size"] == 128 and group["input_activations"]["dynamic"] is True
    again = meta_model()
    load_checkpoint(again, folder)
    assert_loaded(again, model.state_dict())
    tokens = torch.tensor([[3, 1, 4, 1, 5]])
    assert torch.equal(again(tokens), model(tokens))
    # Layers made from the folder's own config (empty, on meta) load the same way.
    prepared = quantize_from_config(meta_model(), folder)
    assert load_checkpoint(prepared, folder) == ([], [])
    assert torch.equal(prepared(tokens), model(tokens))


def test_single_shard_has_no_index_and_model_config_is_used(tmp_path):
    model = quantize_model(float_model(), dtype=FP8)
    model.config = type("Config", (), {"to_dict": lambda self: {"model_type": "tiny", "hidden_size": 256}})()
    folder = save_checkpoint(model, tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    assert json.loads((folder / "config.json").read_text())["hidden_size"] == 256
    with pytest.raises(InvalidInputError, match="already holds a checkpoint"):
        save_checkpoint(model, tmp_path)


def test_save_ue8m0_scales_as_e8m0(tmp_path):
    model = quantize_model(float_model(), dtype=FP8, scale_fmt="ue8m0")
    folder = save_checkpoint(model, tmp_path / "out", scale_dtype=E8M0)
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        assert f.get_tensor("model.layers.0.up.weight_scale_inv").dtype == E8M0
    assert json.loads((folder / "config.json").read_text())["quantization_config"]["scale_fmt"] == "ue8m0"
    again = meta_model()
    load_checkpoint(again, folder)
    assert_loaded(again, model.state_dict(), scale_fmt="ue8m0")
    with pytest.raises(InvalidInputError, match="not all finite powers of two"):
        save_checkpoint(quantize_model(float_model(), dtype=FP8), tmp_path / "fp32", scale_dtype=E8M0)


def test_partial_blocks_are_refused_before_writing(tmp_path):
    """N = 320 is two and a half 128-row blocks: transformers and vLLM refuse it, so saving raises
    naming the layers and writes nothing, unless allow_partial_blocks=True (quantcore reads it back)."""
    model = quantize_model(float_model(inner=320), dtype=FP8)
    with pytest.raises(InvalidInputError, match=r"model\.layers\.0\.up \[320, 256\].*not a whole number of "
                                                r"128x128 blocks.*allow_partial_blocks=True"):
        save_checkpoint(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    folder = save_checkpoint(model, tmp_path / "out", allow_partial_blocks=True)
    again = meta_model(inner=320)
    load_checkpoint(again, folder)
    assert_loaded(again, model.state_dict())


def test_shared_layer_is_written_once_and_loads_into_both_names(tmp_path):
    model = quantize_model(float_model(), dtype=FP8)
    model.model.layers[1].up = model.model.layers[0].up
    folder = save_checkpoint(model, tmp_path / "out")
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.layers.0.up.weight" in names and "model.layers.1.up.weight" not in names
    again = meta_model()
    again.model.layers[1].up = again.model.layers[0].up
    assert load_checkpoint(again, folder) == ([], [])
    assert again.model.layers[1].up is again.model.layers[0].up
    tokens = torch.tensor([[7, 8, 9]])
    assert torch.equal(again(tokens), model(tokens))


@pytest.mark.parametrize("make,kwargs,match", [
    (lambda: quantize_model(float_model(), dtype=torch.int8), {}, "float8_e4m3fn only"),
    (lambda: quantize_model(float_model(), dtype=FP8, scale_fmt="ue8m0"), dict(format="compressed-tensors"),
     "no ue8m0 activation scales"),
    (float_model, {}, "no QuantLinear"),
    (lambda: quantize_model(float_model(), dtype=FP8), dict(format="gguf"), "format must be one of"),
    (lambda: quantize_model(float_model(), dtype=FP8), dict(max_shard_size="lots"), "max_shard_size"),
    (lambda: quantize_model(quantize_model(float_model(), dtype=FP8, skip=("lm_head", "model.layers.0.*")), dtype=FP8,
                            skip=("lm_head",), block_size=(128, 64)), {}, "mix block sizes"),
])
def test_save_errors(tmp_path, make, kwargs, match):
    with pytest.raises(InvalidInputError, match=f"save_checkpoint: .*{match}"):
        save_checkpoint(make(), tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()


def test_save_refuses_a_config_that_is_no_mapping_and_a_file_for_a_folder(tmp_path):
    model = quantize_model(float_model(), dtype=FP8)
    with pytest.raises(InvalidInputError, match="save_checkpoint: config must be a mapping"):
        save_checkpoint(model, tmp_path / "out", config=5)
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidInputError, match="save_checkpoint: .*file' is a file"):
        save_checkpoint(model, tmp_path / "file")
    assert not (tmp_path / "out").exists() and (tmp_path / "file").read_text() == "x"


@pytest.mark.parametrize("damage,match", [
    (lambda folder: (folder / "config.json").write_text("{not json"), r"config\.json is not valid JSON"),
    (lambda folder: (folder / "config.json").write_text("[1, 2]"), r"config\.json holds a JSON list"),
    (lambda folder: (folder / "model.safetensors.index.json").write_text("{not json"),
     r"model\.safetensors\.index\.json is not valid JSON"),
    (lambda folder: (folder / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes()[:100]),
     r"cannot read .*model\.safetensors as safetensors"),
])
def test_damaged_files_are_named(tmp_path, damage, match):
    folder = save_checkpoint(quantize_model(float_model(), dtype=FP8), tmp_path / "out")
    damage(folder)
    with pytest.raises(InvalidInputError, match=match):
        load_checkpoint(meta_model(), folder)


def test_load_fp8_checkpoint_refuses_what_is_no_path_or_state_dict():
    with pytest.raises(InvalidInputError, match="load_fp8_checkpoint: checkpoint must be a path .* got int"):
        load_fp8_checkpoint(quantize_model(float_model(), dtype=FP8), 5)


def test_save_refuses_a_skip_list_that_would_catch_a_quantized_layer(tmp_path):
    """transformers skips by suffix: a float layer named "up" would keep every "*.up" in float."""
    model = quantize_model(float_model(), dtype=FP8)
    model.up = nn.Linear(4, 4)
    with pytest.raises(InvalidInputError, match=r"float linears' names \('lm_head', 'up'\) also match quantized "
                                                r"layer\(s\) \['model\.layers\.0\.up'"):
        save_checkpoint(model, tmp_path / "out")


@pytest.mark.parametrize("change,match", [
    (dict(weight_scale_inv=torch.ones(())), r"weight_scale_inv has shape \(\), .* is \(3, 2\)"),
    (dict(weight=torch.zeros(384, 256, dtype=torch.bfloat16)), "has a block scale but dtype bfloat16"),
    (dict(weight_scale_inv=None), r"float8_e4m3fn without a block scale"),
    (dict(weight_scale=torch.ones(3, 2)), "has both"),
    (dict(weight_scale_inv=torch.ones(3, 2, dtype=torch.float64)), "block scale .* has dtype float64"),
    (dict(weight=torch.zeros(2, 384, 256, dtype=FP8)), r"has shape \(2, 384, 256\); .* 2-D"),
])
def test_bad_tensors_name_the_key(tmp_path, change, match):
    tensors = quantized_tensors(float_model())
    for leaf, t in change.items():
        key = f"model.layers.0.up.{leaf}"
        tensors.pop(key) if t is None else tensors.__setitem__(key, t)
    write_folder(tmp_path, tensors, DEEPSEEK)
    with pytest.raises(InvalidInputError, match=f"load_checkpoint: .*{match}"):
        load_checkpoint(meta_model(), tmp_path)


@pytest.mark.parametrize("config,match", [
    ({"quant_method": "gptq"}, "quant_method 'gptq' is not one quantcore loads"),
    ({"quant_method": "fp8"}, "per-tensor FP8"),
    (DEEPSEEK | {"activation_scheme": "static"}, "static activation scales"),
    (DEEPSEEK | {"scale_fmt": "e4m3"}, "scale_fmt must be"),
    (DEEPSEEK | {"weight_block_size": [128]}, "weight_block_size must be two positive ints"),
    (compressed_tensors_config(quantization_status="frozen"), "not stored quantized"),
    (compressed_tensors_config(format="pack-quantized"), "format 'pack-quantized'"),
])
def test_unsupported_configs(tmp_path, config, match):
    write_folder(tmp_path, quantized_tensors(float_model()), config)
    with pytest.raises(InvalidInputError, match=f"quantization_config: .*{match}"):
        load_checkpoint(meta_model(), tmp_path)


def compressed_tensors_config_with(**changes):
    config = compressed_tensors_config()
    config["config_groups"]["group_0"] = config["config_groups"]["group_0"] | changes
    return config


@pytest.mark.parametrize("changes,match", [
    (dict(input_activations=None), "weight-only"),
    (dict(weights={"num_bits": 8, "type": "int", "strategy": "channel"}), "type=int, num_bits=8, strategy=channel"),
    (dict(input_activations={"num_bits": 8, "type": "float", "dynamic": True, "strategy": "token"}),
     "strategy=token"),
])
def test_unsupported_compressed_tensors_groups_name_the_group(tmp_path, changes, match):
    tensors = quantized_tensors(float_model())
    stored = {k.replace("weight_scale_inv", "weight_scale"): v for k, v in tensors.items()}
    write_folder(tmp_path, stored, compressed_tensors_config_with(**changes))
    with pytest.raises(InvalidInputError, match=rf"config group 'group_0' covers 'model\.layers\.\d\.\w+', but .*{match}"):
        load_checkpoint(meta_model(), tmp_path)


def test_existing_quant_linear_must_match_the_checkpoint(tmp_path):
    write_folder(tmp_path, quantized_tensors(float_model()), DEEPSEEK)
    model = quantize_model(float_model(), dtype=FP8, block_size=(128, 64))
    with pytest.raises(InvalidInputError, match=r"is a QuantLinear with block_size=\(128, 64\).*block_size=\(128, "
                                                r"128\)"):
        load_checkpoint(model, tmp_path)
    with_head = quantize_model(float_model(), dtype=FP8, skip=())
    with pytest.raises(InvalidInputError, match=r"has lm_head\.weight but not lm_head\.weight_scale_inv"):
        load_checkpoint(with_head, tmp_path)


def test_strict_names_missing_and_unexpected_keys(tmp_path):
    tensors = quantized_tensors(float_model())
    tensors["extra.weight"] = torch.ones(2)
    del tensors["model.norm"]
    write_folder(tmp_path, tensors, DEEPSEEK)
    with pytest.raises(InvalidInputError, match=r"missing model\.norm; unexpected extra\.weight"):
        load_checkpoint(meta_model(), tmp_path)
    model = float_model()
    assert load_checkpoint(model, tmp_path, strict=False) == (["model.norm"], ["extra.weight"])


def test_quantize_from_config(tmp_path):
    """A float model quantized the way a config says: its block, its skip rules, its scale format; on
    the meta device, empty layers. What it makes, save_checkpoint writes with the same config."""
    # An explicit list replaces transformers' default skip of lm_head, as in transformers.
    model = quantize_from_config(float_model(), DEEPSEEK | {"modules_to_not_convert": ["model.layers.1", "lm_head"],
                                                            "scale_fmt": "ue8m0"})
    quantized = [n for n, m in model.named_modules() if isinstance(m, QuantLinear)]
    assert quantized == list(LINEARS[:2])
    reference = ops.weight_quant(float_model().model.layers[0].up.weight.float(), dtype=FP8, scale_fmt="ue8m0")
    assert torch.equal(codes(model.model.layers[0].up.weight), codes(reference[0]))
    assert model.model.layers[0].up.scale_fmt == "ue8m0"
    preset = {"quant_method": "compressed-tensors", "config_groups": {"FP8_BLOCK": ["Linear"]}, "ignore": ["lm_head"]}
    meta = quantize_from_config(meta_model(), preset)
    assert all(meta.get_submodule(n).weight.is_meta and meta.get_submodule(n).weight.dtype == FP8 for n in LINEARS)
    folder = save_checkpoint(model, tmp_path / "out")
    qc = json.loads((folder / "config.json").read_text())["quantization_config"]
    assert Fp8Scheme.from_config(qc) == Fp8Scheme((128, 128), "ue8m0", ("model.layers.1.up", "model.layers.1.down",
                                                                         "lm_head"))


def test_schemes_write_what_they_read():
    for scheme in (Fp8Scheme((128, 64), "ue8m0", ("lm_head",)), Fp8Scheme((64, 128)),
                   CompressedTensorsScheme.fp8_block((128, 128), ("lm_head", "re:.*gate$"))):
        assert scheme_from_config(scheme.to_config()) == scheme
    assert Fp8Scheme((128, 128)).layer("lm_head") is None  # transformers' default skip


def test_safetensors_files_reads_slices_by_name(tmp_path):
    w = torch.arange(12 * 10, dtype=torch.float32).reshape(12, 10)
    save_file({"a.weight": w}, str(tmp_path / "one.safetensors"))
    save_file({"b.weight": w.bfloat16()}, str(tmp_path / "two.safetensors"))
    with SafetensorsFiles(tmp_path) as files:
        assert files.names() == ["a.weight", "b.weight"] and "b.weight" in files
        assert files.shape("a.weight") == (12, 10) and files.shard_of("b.weight").name == "two.safetensors"
        assert torch.equal(files.get("a.weight", (slice(4, 8),)), w[4:8])
        assert torch.equal(files.get("b.weight", (slice(None), slice(2, 5))), w[:, 2:5].bfloat16())
        with pytest.raises(InvalidInputError, match="no tensor named 'c'"):
            files.get("c")
    save_file({"a.weight": w}, str(tmp_path / "three.safetensors"))
    with pytest.raises(InvalidInputError, match="'a.weight' is in both one.safetensors and three.safetensors"):
        SafetensorsFiles(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a.weight": "absent.safetensors"}}))
    with pytest.raises(InvalidInputError, match="names shard.* that do not exist"):
        SafetensorsFiles(tmp_path)


def test_e8m0_scales_convert_exactly():
    exponents = torch.arange(0, 256, dtype=torch.uint8)
    scales = scale_to_fp32(exponents.view(E8M0))
    finite = exponents < 255
    assert torch.equal(scales[finite], torch.exp2(exponents[finite].double() - 127).float())
    assert scales[~finite].isnan().all()


# The ecosystem's own loaders, where installed (not a CI dependency).


def tiny_llama(tmp_path, fmt):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, head_dim=128,
                                      tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
    quantize_model(model, dtype=FP8, skip=("lm_head",))
    folder = save_checkpoint(model, tmp_path / fmt, format=fmt, config=config.to_dict())
    return transformers, model, folder


@pytest.mark.parametrize("fmt", ["fp8", "compressed-tensors"])
def test_transformers_loads_quantcore_output(tmp_path, fmt):
    """transformers reads the folder (on a CPU it dequantizes to bf16): each linear's weight equals
    quantcore's dequantized weight, and the float tensors are unchanged."""
    if fmt == "compressed-tensors":
        pytest.importorskip("compressed_tensors")
    transformers, model, folder = tiny_llama(tmp_path, fmt)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    theirs = dict(loaded.named_modules())
    for name, layer in model.named_modules():
        if isinstance(layer, QuantLinear):
            weight = theirs[name].weight
            if weight.dtype == FP8:  # kept quantized (a GPU, or compressed-tensors' own FP8 layer)
                scale = getattr(theirs[name], "weight_scale_inv", None)
                scale = theirs[name].weight_scale if scale is None else scale
                assert torch.equal(codes(weight), codes(layer.weight)), name
                # transformers holds compressed-tensors scales in the model's dtype (bf16 here)
                assert torch.equal(scale, layer.weight_scale_inv.to(scale.dtype)), name
            else:
                assert torch.equal(weight.float(), layer.dequantized_weight().bfloat16().float()), name
    assert torch.equal(theirs["lm_head"].weight, model.lm_head.weight)


def test_compressed_tensors_validates_the_config(tmp_path):
    ct = pytest.importorskip("compressed_tensors.quantization")
    model = quantize_model(float_model(), dtype=FP8)
    folder = save_checkpoint(model, tmp_path / "out", format="compressed-tensors")
    config = ct.QuantizationConfig.model_validate(json.loads((folder / "config.json").read_text())
                                                  ["quantization_config"])
    scheme = config.config_groups["group_0"]
    assert scheme.weights.strategy == "block" and scheme.weights.block_structure == [128, 128]
    assert scheme.input_activations.group_size == 128 and config.ignore == ["lm_head"]
    assert math.prod(scheme.weights.block_structure) == 128 * 128
